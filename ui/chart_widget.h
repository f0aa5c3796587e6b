// One QCustomPlot chart with a small toolbar (fit, save PNG/PDF). Data are appended freely; the
// plot redraws only when replotIfDirty() is called by the owner's coalescing timer (~25 Hz), as a
// queued replot. Once the user zooms or pans, automatic rescaling stops until "Fit" is pressed.
#pragma once

#include <QColor>
#include <QString>
#include <QWidget>
#include <vector>

class QCustomPlot;
class QCPGraph;
class QLabel;

namespace td::ui {

class ChartWidget : public QWidget {
    Q_OBJECT
  public:
    explicit ChartWidget(const QString& title, const QString& xLabel, const QString& yLabel,
                         QWidget* parent = nullptr);

    enum class Style { Line, Dots, LineAndDots, Dashed };
    int addSeries(const QString& name, const QColor& color, Style style = Style::Line);
    int seriesCount() const { return static_cast<int>(graphs_.size()); }
    // x must not decrease within a series (sorted appends are O(1)).
    void append(int series, double x, double y);
    void append(int series, const QVector<double>& xs, const QVector<double>& ys);
    int pointCount(int series) const;
    void clearData();    // keeps series
    void clearSeries();  // removes series
    void setLogY(bool on);
    void setLegendCorner(Qt::Alignment corner);

    void replotIfDirty();  // no-op while hidden (showEvent catches up)
    bool autoFit() const { return autoFit_; }
    void fit();  // rescale to the data and resume automatic rescaling

    bool savePng(const QString& path);
    bool savePdf(const QString& path);
    QCustomPlot* plot() const { return plot_; }
    QString title() const { return title_; }

  signals:
    void userInteracted();

  protected:
    void showEvent(QShowEvent* event) override;

  private:
    void saveDialog();

    QString title_;
    QCustomPlot* plot_;
    std::vector<QCPGraph*> graphs_;
    bool dirty_ = false;
    bool autoFit_ = true;
};

QColor seriesColor(int i);  // a readable palette for overlays and replicas

}  // namespace td::ui

// One QCustomPlot chart with a small toolbar (fit, save PNG/PDF). Data are appended freely; the
// plot redraws only when replotIfDirty() is called by the owner's coalescing timer (~25 Hz), as a
// queued replot. Once the user zooms or pans, automatic rescaling stops until "Fit" is pressed.
#pragma once

#include <QColor>
#include <QString>
#include <QStringList>
#include <QWidget>
#include <vector>

class QCustomPlot;
class QHBoxLayout;
class QCPGraph;
class QCPItemText;
class QLabel;

namespace td::ui {

class ChartWidget : public QWidget {
    Q_OBJECT
  public:
    explicit ChartWidget(const QString& title, const QString& xLabel, const QString& yLabel,
                         QWidget* parent = nullptr);

    enum class Style { Line, Dots, LineAndDots, Dashed, Dotted };
    // `smoothable`: a per-step series the smoothing control draws as an exponential moving
    // average (TensorBoard's, debiased), its raw line faint behind it.
    int addSeries(const QString& name, const QColor& color, Style style = Style::Line,
                  bool smoothable = false);
    // Dots drawn with marker shape `shape` (0, 1, ...: circle, cross, plus, triangle, square,
    // diamond, star), so series whose points coincide stay apart.
    void setSeriesMarker(int series, int shape);
    // The smoothing of smoothable series, in [0, 1): 0 draws them raw.
    void setSmoothing(double weight);
    double smoothing() const { return smoothing_; }
    // A "Smoothing" box in the header row that sets it (TensorBoard's default 0.6).
    void addSmoothingControl(double initial = 0.6);
    // The smoothed value of a smoothable series at a point index (NaN when none).
    double smoothedValue(int series, int index) const;
    int seriesCount() const { return static_cast<int>(graphs_.size()); }
    QString seriesName(int series) const;
    // A hidden series keeps its data and takes new points, but is neither drawn, nor in the
    // legend, nor counted when the axes follow the data. The legend (under the axes) lists the
    // visible series with data; without any, the chart says "no data yet".
    void setSeriesVisible(int series, bool visible);
    bool seriesVisible(int series) const;
    // x must not decrease within a series (sorted appends are O(1)).
    void append(int series, double x, double y);
    void append(int series, const QVector<double>& xs, const QVector<double>& ys);
    int pointCount(int series) const;
    QPointF point(int series, int index) const;  // (x, y) of a point; (NaN, NaN) when none
    void clearData();                            // keeps series
    void clearSeries();                          // removes series
    void setLogY(bool on);
    void setYLabel(const QString& label);
    QString yLabel() const;
    // A control shown in the title row, left of Fit (e.g. a selector of what the chart shows).
    void addHeaderWidget(QWidget* widget);

    void replotIfDirty();  // no-op while hidden (showEvent catches up)
    bool autoFit() const { return autoFit_; }
    void fit();  // rescale to the data and resume automatic rescaling

    bool savePng(const QString& path);
    bool savePdf(const QString& path);
    QCustomPlot* plot() const { return plot_; }
    QString title() const { return title_; }
    // What the legend lists now (after the last replot) and whether "no data yet" shows.
    QStringList legendNames() const;
    bool showsNoData() const;

  signals:
    void userInteracted();

  protected:
    void showEvent(QShowEvent* event) override;

  private:
    void saveDialog();

    QString title_;
    QHBoxLayout* header_;
    QCustomPlot* plot_;
    std::vector<QCPGraph*> graphs_;
    std::vector<QCPGraph*> smooth_;  // per series: its smoothed companion, or null
    double smoothing_ = 0;
    QCPItemText* empty_ = nullptr;
    bool dirty_ = false;
    bool autoFit_ = true;
};

QColor seriesColor(int i);  // a readable palette for overlays and replicas

}  // namespace td::ui

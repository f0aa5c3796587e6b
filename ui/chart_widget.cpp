#include "ui/chart_widget.h"

#include <algorithm>
#include <cmath>
#include <iterator>

#include <qcustomplot.h>

#include <QDoubleSpinBox>
#include <QFileDialog>
#include <QHBoxLayout>
#include <QLabel>
#include <QMessageBox>
#include <QToolButton>
#include <QVBoxLayout>

namespace td::ui {

QColor seriesColor(int i) {
    static const QColor colors[] = {
        QColor(31, 119, 180),  QColor(255, 127, 14), QColor(44, 160, 44),   QColor(214, 39, 40),
        QColor(148, 103, 189), QColor(140, 86, 75),  QColor(227, 119, 194), QColor(127, 127, 127),
        QColor(188, 189, 34),  QColor(23, 190, 207)};
    return colors[static_cast<size_t>(i) % std::size(colors)];
}

ChartWidget::ChartWidget(const QString& title, const QString& xLabel, const QString& yLabel,
                         QWidget* parent)
    : QWidget(parent), title_(title), plot_(new QCustomPlot) {
    setObjectName("chart_" + title);
    auto* header = new QHBoxLayout;
    header_ = header;
    auto* label = new QLabel("<b>" + title.toHtmlEscaped() + "</b>");
    header->addWidget(label);
    header->addStretch(1);
    auto* fitButton = new QToolButton;
    fitButton->setText(tr("Fit"));
    fitButton->setObjectName("fitButton");
    fitButton->setToolTip(tr("Rescale to all data and follow new data again"));
    connect(fitButton, &QToolButton::clicked, this, &ChartWidget::fit);
    auto* saveButton = new QToolButton;
    saveButton->setText(tr("Save…"));
    saveButton->setToolTip(tr("Save this chart as PNG or PDF"));
    connect(saveButton, &QToolButton::clicked, this, &ChartWidget::saveDialog);
    header->addWidget(fitButton);
    header->addWidget(saveButton);

    plot_->setMinimumSize(240, 160);
    plot_->setInteractions(QCP::iRangeDrag | QCP::iRangeZoom);
    plot_->xAxis->setLabel(xLabel);
    plot_->yAxis->setLabel(yLabel);
    // The legend sits in a row of its own under the axes, so it never covers data, and lists
    // only the series drawn with data (replotIfDirty).
    QFont lf = font();
    lf.setPointSizeF(lf.pointSizeF() * 0.85);
    plot_->legend->setFont(lf);
    plot_->legend->setBorderPen(Qt::NoPen);
    plot_->legend->setBrush(Qt::NoBrush);
    plot_->legend->setFillOrder(QCPLegend::foColumnsFirst);
    plot_->legend->setWrap(4);
    plot_->axisRect()->insetLayout()->take(plot_->legend);
    plot_->plotLayout()->addElement(1, 0, plot_->legend);
    plot_->plotLayout()->setRowStretchFactor(1, 0.001);
    plot_->legend->setMargins(QMargins(4, 0, 4, 2));
    plot_->legend->setVisible(false);
    // Said over the axes while no series has a point (rather than empty 0-5 axes).
    empty_ = new QCPItemText(plot_);
    empty_->setPositionAlignment(Qt::AlignCenter);
    empty_->position->setType(QCPItemPosition::ptAxisRectRatio);
    empty_->position->setCoords(0.5, 0.5);
    empty_->setText(tr("no data yet"));
    empty_->setColor(QColor(128, 128, 128));
    empty_->setClipToAxisRect(false);
    plot_->setNoAntialiasingOnDrag(true);
    // Antialiased polylines cost most of a replot; live charts replot 25 times a second.
    plot_->setNotAntialiasedElements(QCP::aePlottables | QCP::aeGrid | QCP::aeAxes);
    plot_->setPlottingHint(QCP::phFastPolylines, true);
    // Any zoom or pan by the user freezes the view they chose.
    auto interacted = [this] {
        if (autoFit_) {
            autoFit_ = false;
            emit userInteracted();
        }
    };
    connect(plot_, &QCustomPlot::mousePress, this, interacted);
    connect(plot_, &QCustomPlot::mouseWheel, this, interacted);

    auto* layout = new QVBoxLayout(this);
    layout->setContentsMargins(2, 2, 2, 2);
    layout->setSpacing(0);
    layout->addLayout(header);
    layout->addWidget(plot_, 1);
}

int ChartWidget::addSeries(const QString& name, const QColor& color, Style style, bool smoothable) {
    QCPGraph* smooth = nullptr;
    if (smoothable) {
        smooth = plot_->addGraph();
        smooth->setName(name);
        QPen pen(color);
        pen.setWidthF(1.8);
        smooth->setPen(pen);
        smooth->removeFromLegend();
        smooth->setVisible(false);
    }
    smooth_.push_back(smooth);
    QCPGraph* g = plot_->addGraph();
    g->setName(name);
    g->removeFromLegend();  // listed once it has data
    QPen pen(color);
    pen.setWidthF(1.5);
    if (style == Style::Dashed) pen.setStyle(Qt::DashLine);
    if (style == Style::Dotted) pen.setStyle(Qt::DotLine);
    g->setPen(pen);
    if (style == Style::Dots) {
        g->setLineStyle(QCPGraph::lsNone);
        g->setScatterStyle(QCPScatterStyle(QCPScatterStyle::ssDisc, color, 6));
    } else if (style == Style::LineAndDots) {
        g->setScatterStyle(QCPScatterStyle(QCPScatterStyle::ssDisc, color, 6));
    }
    graphs_.push_back(g);
    dirty_ = true;
    return static_cast<int>(graphs_.size()) - 1;
}

void ChartWidget::setSeriesMarker(int series, int shape) {
    if (series < 0 || series >= seriesCount()) return;
    static const QCPScatterStyle::ScatterShape shapes[] = {
        QCPScatterStyle::ssCircle,   QCPScatterStyle::ssCross,  QCPScatterStyle::ssPlus,
        QCPScatterStyle::ssTriangle, QCPScatterStyle::ssSquare, QCPScatterStyle::ssDiamond,
        QCPScatterStyle::ssStar};
    QCPGraph* g = graphs_[series];
    g->setScatterStyle(
        QCPScatterStyle(shapes[std::abs(shape) % std::size(shapes)], g->pen().color(), 7));
    dirty_ = true;
}

void ChartWidget::setSmoothing(double weight) {
    const double w = std::clamp(weight, 0.0, 0.999);
    if (w == smoothing_) return;
    smoothing_ = w;
    dirty_ = true;
    replotIfDirty();
}

void ChartWidget::addSmoothingControl(double initial) {
    auto* box = new QDoubleSpinBox;
    box->setObjectName("smoothing");
    box->setPrefix(tr("Smoothing "));
    box->setRange(0.0, 0.99);
    box->setSingleStep(0.1);
    box->setDecimals(2);
    box->setToolTip(
        tr("Exponential moving average of the per-step values (0: raw); the raw "
           "line stays faint behind"));
    box->setValue(initial);
    setSmoothing(initial);
    connect(box, &QDoubleSpinBox::valueChanged, this, &ChartWidget::setSmoothing);
    addHeaderWidget(box);
}

double ChartWidget::smoothedValue(int series, int index) const {
    if (series < 0 || series >= seriesCount() || !smooth_[series] ||
        index >= smooth_[series]->dataCount() || index < 0)
        return qQNaN();
    return smooth_[series]->data()->at(index)->value;
}

void ChartWidget::append(int series, double x, double y) {
    if (series < 0 || series >= seriesCount()) return;
    graphs_[series]->addData(x, y);
    dirty_ = true;
}

void ChartWidget::append(int series, const QVector<double>& xs, const QVector<double>& ys) {
    if (series < 0 || series >= seriesCount() || xs.isEmpty()) return;
    graphs_[series]->addData(xs, ys, /*alreadySorted=*/true);
    dirty_ = true;
}

int ChartWidget::pointCount(int series) const {
    if (series < 0 || series >= seriesCount()) return 0;
    return graphs_[series]->dataCount();
}

QPointF ChartWidget::point(int series, int index) const {
    if (index < 0 || index >= pointCount(series)) return {qQNaN(), qQNaN()};
    auto it = graphs_[series]->data()->at(index);
    return {it->key, it->value};
}

QString ChartWidget::seriesName(int series) const {
    if (series < 0 || series >= seriesCount()) return {};
    return graphs_[series]->name();
}

void ChartWidget::setSeriesVisible(int series, bool visible) {
    if (series < 0 || series >= seriesCount()) return;
    QCPGraph* g = graphs_[series];
    if (g->visible() == visible) return;
    g->setVisible(visible);
    dirty_ = true;
}

bool ChartWidget::seriesVisible(int series) const {
    return series >= 0 && series < seriesCount() && graphs_[series]->visible();
}

void ChartWidget::clearData() {
    for (QCPGraph* g : graphs_) g->data()->clear();
    autoFit_ = true;
    dirty_ = true;
}

void ChartWidget::clearSeries() {
    plot_->clearGraphs();
    graphs_.clear();
    smooth_.clear();
    autoFit_ = true;
    dirty_ = true;
}

void ChartWidget::setYLabel(const QString& label) {
    plot_->yAxis->setLabel(label);
    dirty_ = true;
}

QString ChartWidget::yLabel() const {
    return plot_->yAxis->label();
}

void ChartWidget::setLogY(bool on) {
    plot_->yAxis->setScaleType(on ? QCPAxis::stLogarithmic : QCPAxis::stLinear);
    if (on) {
        plot_->yAxis->setTicker(QSharedPointer<QCPAxisTickerLog>(new QCPAxisTickerLog));
    } else {
        plot_->yAxis->setTicker(QSharedPointer<QCPAxisTicker>(new QCPAxisTicker));
    }
    dirty_ = true;
}

void ChartWidget::replotIfDirty() {
    if (!dirty_ || !isVisible()) return;
    dirty_ = false;
    // Smoothable series: the debiased exponential moving average over the raw points (as
    // TensorBoard draws it), the raw line faint behind; the legend names the smoothed one.
    for (size_t i = 0; i < graphs_.size(); ++i) {
        QCPGraph* raw = graphs_[i];
        QCPGraph* sm = smooth_[i];
        if (!sm) continue;
        const bool on = smoothing_ > 0 && raw->visible();
        QPen pen = raw->pen();
        QColor c = pen.color();
        c.setAlpha(on ? 70 : 255);
        pen.setColor(c);
        raw->setPen(pen);
        sm->setVisible(on);
        if (!on) continue;
        QVector<QCPGraphData> points;
        points.reserve(raw->dataCount());
        double ema = 0, weight = 0;
        for (auto it = raw->data()->constBegin(); it != raw->data()->constEnd(); ++it) {
            ema = ema * smoothing_ + (1 - smoothing_) * it->value;
            weight = weight * smoothing_ + (1 - smoothing_);
            points.push_back(QCPGraphData(it->key, ema / weight));
        }
        sm->data()->set(points, true);
    }
    int listed = 0;
    for (size_t i = 0; i < graphs_.size(); ++i) {
        QCPGraph* raw = graphs_[i];
        QCPGraph* sm = smooth_[i];
        const bool show = raw->visible() && raw->dataCount() > 0;
        QCPGraph* named = sm && sm->visible() ? sm : raw;
        QCPGraph* other = named == raw ? sm : raw;
        if (show && !plot_->legend->hasItemWithPlottable(named)) named->addToLegend();
        if (other && plot_->legend->hasItemWithPlottable(other)) other->removeFromLegend();
        if (!show && plot_->legend->hasItemWithPlottable(named)) named->removeFromLegend();
        listed += show ? 1 : 0;
    }
    plot_->legend->setVisible(listed > 0);
    empty_->setVisible(listed == 0);
    if (listed == 0) {
        // No data: neutral axes, not the last run's.
        plot_->xAxis->setRange(0, 1);
        plot_->yAxis->setRange(plot_->yAxis->scaleType() == QCPAxis::stLogarithmic ? 0.1 : 0, 1);
        plot_->replot(QCustomPlot::rpQueuedReplot);
        return;
    }
    if (autoFit_) {
        plot_->xAxis->rescale(/*onlyVisiblePlottables=*/true);
        // The value range of the data themselves: QCPAxis::rescale keeps the old span for a
        // constant series (e.g. a constant learning rate), so pad it here.
        const bool log = plot_->yAxis->scaleType() == QCPAxis::stLogarithmic;
        bool any = false;
        QCPRange y;
        for (QCPGraph* g : graphs_) {
            if (!g->visible()) continue;
            bool found = false;
            QCPRange r = g->getValueRange(found, log ? QCP::sdPositive : QCP::sdBoth);
            if (!found) continue;
            y = any ? QCPRange(std::min(y.lower, r.lower), std::max(y.upper, r.upper)) : r;
            any = true;
        }
        if (any) {
            if (!log) {
                double pad = 0.05 * y.size();
                if (pad <= 1e-12 * std::max(1.0, std::abs(y.center())))
                    pad = std::max(std::abs(y.center()) * 0.5, 1e-9);
                plot_->yAxis->setRange(y.lower - pad, y.upper + pad);
            } else {
                plot_->yAxis->setRange(y.lower / 2, y.upper * 2);
            }
        }
    }
    plot_->replot(QCustomPlot::rpQueuedReplot);
}

QStringList ChartWidget::legendNames() const {
    QStringList names;
    for (int i = 0; i < plot_->legend->itemCount(); ++i)
        if (auto* item = qobject_cast<QCPPlottableLegendItem*>(plot_->legend->item(i)))
            names << item->plottable()->name();
    return names;
}

bool ChartWidget::showsNoData() const {
    return empty_->visible();
}

void ChartWidget::showEvent(QShowEvent* event) {
    QWidget::showEvent(event);
    replotIfDirty();  // hidden charts skip replots and catch up here
}

void ChartWidget::fit() {
    autoFit_ = true;
    dirty_ = true;
    replotIfDirty();
}

void ChartWidget::addHeaderWidget(QWidget* widget) {
    header_->insertWidget(header_->count() - 2, widget);  // before Fit and Save…
}

bool ChartWidget::savePng(const QString& path) {
    return plot_->savePng(path, 0, 0, 2.0);  // 2x for crisp documents
}

bool ChartWidget::savePdf(const QString& path) {
    return plot_->savePdf(path);
}

void ChartWidget::saveDialog() {
    QString selected;
    QString path =
        QFileDialog::getSaveFileName(this, tr("Save chart"), title_ + ".png",
                                     tr("PNG image (*.png);;PDF document (*.pdf)"), &selected);
    if (path.isEmpty()) return;
    bool pdf = path.endsWith(".pdf", Qt::CaseInsensitive) || selected.contains("pdf");
    if (pdf && !path.endsWith(".pdf", Qt::CaseInsensitive)) path += ".pdf";
    if (!pdf && !path.endsWith(".png", Qt::CaseInsensitive)) path += ".png";
    bool ok = pdf ? savePdf(path) : savePng(path);
    if (!ok) {
        QMessageBox::warning(this, tr("Save chart"),
                             tr("Could not write %1: check that the folder exists and is "
                                "writable.")
                                 .arg(path));
    }
}

}  // namespace td::ui

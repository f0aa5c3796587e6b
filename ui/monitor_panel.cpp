#include "ui/monitor_panel.h"

#include <QComboBox>
#include <QDateTime>
#include <QFontDatabase>
#include <QGridLayout>
#include <QHBoxLayout>
#include <QLabel>
#include <QLocale>
#include <QPlainTextEdit>
#include <QProgressBar>
#include <QSplitter>
#include <QToolButton>
#include <QVBoxLayout>

#include "ui/chart_widget.h"
#include "ui/run_controller.h"
#include "ui/settings.h"

namespace td::ui {

namespace {

QString hms(qint64 seconds) {
    if (seconds < 0) return "--:--";
    qint64 h = seconds / 3600, m = (seconds / 60) % 60, s = seconds % 60;
    return h > 0 ? QString("%1:%2:%3").arg(h).arg(m, 2, 10, QChar('0')).arg(s, 2, 10, QChar('0'))
                 : QString("%1:%2").arg(m, 2, 10, QChar('0')).arg(s, 2, 10, QChar('0'));
}

// The step-time parts, in legend order: (key, label).
const std::pair<const char*, const char*> kStepParts[] = {
    {"compute", QT_TRANSLATE_NOOP("td::ui::MonitorPanel", "compute")},
    {"allreduce", QT_TRANSLATE_NOOP("td::ui::MonitorPanel", "all-reduce")},
    {"wait", QT_TRANSLATE_NOOP("td::ui::MonitorPanel", "input wait")}};

QColor stepPartColor(int part) {
    return seriesColor(part == 0 ? 2 : part == 1 ? 4 : 3);
}

// The chart slot of a replica's figures: its global index when the run announced that many
// devices, else its position in the list.
int replicaSlot(const td::ReplicaStats& r, size_t position, size_t replicas) {
    if (r.replica >= 0 && static_cast<size_t>(r.replica) < replicas) return r.replica;
    return static_cast<int>(position);
}

QToolButton* actionButton(QAction* a) {
    auto* b = new QToolButton;
    b->setDefaultAction(a);
    b->setToolButtonStyle(Qt::ToolButtonTextBesideIcon);
    b->setMinimumWidth(90);
    return b;
}

}  // namespace

MonitorPanel::MonitorPanel(RunController* runs, QWidget* parent) : QWidget(parent), runs_(runs) {
    auto* controls = new QHBoxLayout;
    controls->addWidget(actionButton(runs->startAction()));
    controls->addWidget(actionButton(runs->pauseAction()));
    controls->addWidget(actionButton(runs->stopAction()));
    progress_ = new QProgressBar;
    progress_->setObjectName("runProgress");
    progress_->setRange(0, 1);
    progress_->setValue(0);
    progress_->setTextVisible(true);
    // A fixed width: the label beside it grows and shrinks with its text, the bar does not.
    progress_->setFixedWidth(240);
    controls->addWidget(progress_);
    progressLabel_ = new QLabel(tr("Idle"));
    progressLabel_->setObjectName("progressLabel");
    progressLabel_->setMinimumWidth(200);
    controls->addWidget(progressLabel_, 1);
    blocker_ = new QLabel;
    blocker_->setObjectName("startBlocker");
    blocker_->setWordWrap(true);
    blocker_->setStyleSheet("color: #b00020;");

    loss_ = new ChartWidget(tr("Loss"), tr("epoch"), tr("loss"));
    accuracy_ = new ChartWidget(tr("Accuracy"), tr("epoch"), tr("accuracy"));
    loss_->addSmoothingControl();
    accuracy_->addSmoothingControl();
    throughput_ = new ChartWidget(tr("Throughput"), tr("epoch"), tr("samples/s"));
    stepTime_ = new ChartWidget(tr("Step time"), tr("epoch"), tr("ms per step"));
    replicaSelector_ = new QComboBox;
    replicaSelector_->setObjectName("stepTimeReplica");
    replicaSelector_->setToolTip(
        tr("Step time of one replica, or the mean over all of them: a replica whose compute or "
           "input wait stands out makes the others wait in the all-reduce."));
    replicaSelector_->setSizeAdjustPolicy(QComboBox::AdjustToContents);
    replicaSelector_->setVisible(false);
    stepTime_->addHeaderWidget(replicaSelector_);
    connect(replicaSelector_, &QComboBox::currentIndexChanged, this, &MonitorPanel::showStepTimeOf);
    learningRate_ = new ChartWidget(tr("Learning rate"), tr("epoch"), tr("learning rate"));
    lossScale_ = new ChartWidget(tr("Loss scale"), tr("epoch"), tr("loss scale"));
    lossScale_->setLogY(true);
    gpuMemory_ = new ChartWidget(tr("GPU memory"), tr("epoch"), tr("GiB used"));
    gpuMemory_->setObjectName("gpuMemoryChart");
    gpuMemory_->setToolTip(
        tr("Device memory in use on each GPU, as its driver reports it (NVML): "
           "every process on the GPU, the caching allocator's reserve "
           "included."));
    gpuUtilization_ = new ChartWidget(tr("GPU utilisation"), tr("epoch"), tr("%"));
    gpuUtilization_->setObjectName("gpuUtilizationChart");
    gpuUtilization_->setToolTip(
        tr("Share of the driver's last sample period in which a kernel "
           "ran on each GPU (NVML)."));
    gpuMemory_->setVisible(false);
    gpuUtilization_->setVisible(false);
    auto* grid = new QGridLayout;
    grid->addWidget(loss_, 0, 0);
    grid->addWidget(accuracy_, 0, 1);
    grid->addWidget(throughput_, 0, 2);
    grid->addWidget(stepTime_, 1, 0);
    grid->addWidget(learningRate_, 1, 1);
    grid->addWidget(lossScale_, 1, 2);
    grid->addWidget(gpuMemory_, 2, 0);
    grid->addWidget(gpuUtilization_, 2, 1);
    auto* chartsHost = new QWidget;
    chartsHost->setLayout(grid);

    log_ = new QPlainTextEdit;
    log_->setObjectName("runLog");
    log_->setReadOnly(true);
    log_->setMaximumBlockCount(20000);
    log_->setFont(QFontDatabase::systemFont(QFontDatabase::FixedFont));
    auto* split = new QSplitter(Qt::Vertical);
    split->addWidget(chartsHost);
    split->addWidget(log_);
    split->setStretchFactor(0, 4);
    split->setStretchFactor(1, 1);
    rememberSplitter(split, "monitor");

    inputBound_ = new QLabel;
    inputBound_->setObjectName("inputBound");
    inputBound_->setWordWrap(true);
    inputBound_->setStyleSheet("color: #8a5a00;");
    inputBound_->setVisible(false);

    auto* layout = new QVBoxLayout(this);
    layout->addLayout(controls);
    layout->addWidget(blocker_);
    layout->addWidget(inputBound_);
    layout->addWidget(split, 1);

    connect(runs, &RunController::runStarted, this, &MonitorPanel::onRunStarted);
    connect(runs, &RunController::eventsArrived, this, &MonitorPanel::onEvents);
    connect(runs, &RunController::runFinished, this, &MonitorPanel::onFinished);
    connect(runs, &RunController::message, this, [this](const QString& text, bool error) {
        appendLog(text, error ? td::LogLine::Level::Error : td::LogLine::Level::Info);
    });
    connect(runs, &RunController::stateChanged, this, [this] {
        updateBlocker();
        if (runs_->busy()) progressLabel_->setText(progressText());
    });
    connect(runs->startAction(), &QAction::changed, this, &MonitorPanel::updateBlocker);
    updateBlocker();
}

int MonitorPanel::seriesIndex(const QString& key) const {
    auto it = series_.find(key);
    return it == series_.end() ? -1 : it->second;
}

// Milliseconds per step of each part: the event's seconds cover every step since the previous
// event.
void MonitorPanel::appendStepTimes(const td::StepMetrics& s, double x) {
    const double msPerStep =
        1000.0 / static_cast<double>(std::max<int64_t>(1, s.globalStep - lastGlobalStep_));
    auto put = [&](const QString& group, double compute, double allReduce, double wait) {
        const double parts[] = {compute, allReduce, wait};
        for (int p = 0; p < 3; ++p) {
            auto it = series_.find(QString("st/%1/%2").arg(group, kStepParts[p].first));
            if (it != series_.end()) stepTime_->append(it->second, x, msPerStep * parts[p]);
        }
    };
    if (s.replicas.empty()) {  // a trainer that reports no replicas: the step loop's own split
        put("all", s.computeSeconds, 0.0, s.inputWaitSeconds);
        return;
    }
    double compute = 0, allReduce = 0, wait = 0;
    for (size_t i = 0; i < s.replicas.size(); ++i) {
        const td::ReplicaStats& r = s.replicas[i];
        compute += r.computeSeconds;
        allReduce += r.allReduceSeconds;
        wait += r.inputWaitSeconds;
        put(QString::number(replicaSlot(r, i, info_.devices.size())), r.computeSeconds,
            r.allReduceSeconds, r.inputWaitSeconds);
    }
    const double n = static_cast<double>(s.replicas.size());
    put("all", compute / n, allReduce / n, wait / n);
}

void MonitorPanel::showStepTimeOf(int selectorIndex) {
    const QString group = selectorIndex <= 0 ? QString("all") : QString::number(selectorIndex - 1);
    for (const auto& [key, index] : series_)
        if (key.startsWith("st/")) stepTime_->setSeriesVisible(index, false);
    // One replica has no all-reduce: its (zero) series is kept but neither drawn nor listed.
    const bool oneReplica = info_.devices.size() <= 1 && info_.workers <= 1;
    for (const auto& part : kStepParts)  // legend in part order
        stepTime_->setSeriesVisible(seriesIndex(QString("st/%1/%2").arg(group, part.first)),
                                    !(oneReplica && QString(part.first) == "allreduce"));
    stepTime_->replotIfDirty();
}

QList<ChartWidget*> MonitorPanel::charts() const {
    return {loss_,         accuracy_,  throughput_, stepTime_,
            learningRate_, lossScale_, gpuMemory_,  gpuUtilization_};
}

// One series per device in each GPU chart, made when its first figure arrives.
void MonitorPanel::appendDeviceStats(const td::DeviceStats& d, double x) {
    const QString device = QString::fromStdString(d.device);
    auto seriesOf = [&](ChartWidget* chart, const QString& prefix) {
        const QString key = prefix + device;
        auto it = series_.find(key);
        if (it != series_.end()) return it->second;
        auto color = gpuColors_.try_emplace(device, static_cast<int>(gpuColors_.size()) + 2);
        const int index = chart->addSeries(device, seriesColor(color.first->second));
        series_[key] = index;
        return index;
    };
    if (d.memoryUsedBytes >= 0) {
        gpuMemory_->append(seriesOf(gpuMemory_, "mem/"), x,
                           static_cast<double>(d.memoryUsedBytes) / (1024.0 * 1024.0 * 1024.0));
        if (gpuMemory_->isHidden()) gpuMemory_->show();
    }
    if (d.gpuUtilization >= 0) {
        gpuUtilization_->append(seriesOf(gpuUtilization_, "util/"), x, 100.0 * d.gpuUtilization);
        if (gpuUtilization_->isHidden()) gpuUtilization_->show();
    }
}

void MonitorPanel::setLossScaleVisible(bool on) {
    lossScale_->setVisible(on);
}

void MonitorPanel::updateBlocker() {
    QString reason = runs_->startBlocker();
    blocker_->setVisible(!reason.isEmpty() && !runs_->busy());
    blocker_->setText(tr("⚠ Start is disabled: %1").arg(reason));
}

void MonitorPanel::appendLog(const QString& text, td::LogLine::Level level) {
    const char* tag = level == td::LogLine::Level::Error     ? "ERROR "
                      : level == td::LogLine::Level::Warning ? "WARN  "
                                                             : "";
    log_->appendPlainText(
        QString("%1 %2%3").arg(QTime::currentTime().toString("HH:mm:ss"), tag, text));
}

void MonitorPanel::onRunStarted(const td::RunStarted& info) {
    info_ = info;
    inputBound_->setVisible(false);
    elapsed_.start();
    lastGlobalStep_ = 0;
    lastEpoch_ = info.initialEpoch;
    lastStep_ = 0;
    lastSamplesPerSecond_ = 0;
    lastX_ = info.initialEpoch;
    gpuColors_.clear();
    gpuMemory_->setVisible(false);
    gpuUtilization_->setVisible(false);
    accuracyKey_.clear();
    series_.clear();
    for (ChartWidget* c : charts()) c->clearSeries();
    series_["loss/step"] = loss_->addSeries(tr("train (per step)"), seriesColor(0),
                                            ChartWidget::Style::Line, /*smoothable=*/true);
    series_["loss/epoch"] =
        loss_->addSeries(tr("train (per epoch)"), seriesColor(0), ChartWidget::Style::Dots);
    series_["loss/val"] =
        loss_->addSeries(tr("validation"), seriesColor(1), ChartWidget::Style::LineAndDots);
    series_["acc/step"] = accuracy_->addSeries(tr("train (per step)"), seriesColor(0),
                                               ChartWidget::Style::Line, /*smoothable=*/true);
    series_["acc/epoch"] =
        accuracy_->addSeries(tr("train (per epoch)"), seriesColor(0), ChartWidget::Style::Dots);
    series_["acc/val"] =
        accuracy_->addSeries(tr("validation"), seriesColor(1), ChartWidget::Style::LineAndDots);
    // Throughput: the total, and with several replicas each replica's as markers of its own
    // shape (replicas of one model draw the same values, so lines would hide one another). One
    // replica's line would be the total again: it is kept but not drawn.
    const size_t replicaCount = info.devices.size();
    series_["tp/total"] = throughput_->addSeries(
        replicaCount > 1 ? tr("total (%1 replicas)").arg(replicaCount) : tr("total"),
        QColor(40, 40, 40));
    for (size_t i = 0; i < replicaCount; ++i) {
        const int s =
            throughput_->addSeries(QString::fromStdString(info.devices[i]),
                                   seriesColor(static_cast<int>(i) + 2), ChartWidget::Style::Dots);
        throughput_->setSeriesMarker(s, static_cast<int>(i));
        throughput_->setSeriesVisible(s, replicaCount > 1);
        series_["tp/" + QString::number(i)] = s;
    }
    // Step time: one group of parts for the mean over the replicas and one per replica; the
    // selector shows one group at a time.
    const QSignalBlocker block(replicaSelector_);
    replicaSelector_->clear();
    const size_t replicas = info.devices.size();
    replicaSelector_->addItem(replicas > 1 ? tr("all %1 replicas (mean)").arg(replicas)
                                           : tr("all replicas"));
    for (int p = 0; p < 3; ++p) {
        series_[QString("st/all/") + kStepParts[p].first] =
            stepTime_->addSeries(tr(kStepParts[p].second), stepPartColor(p));
    }
    if (replicas > 1) {
        for (size_t i = 0; i < replicas; ++i) {
            const QString device = QString::fromStdString(info.devices[i]);
            replicaSelector_->addItem(tr("replica %1 (%2)").arg(i).arg(device));
            for (int p = 0; p < 3; ++p) {
                series_[QString("st/%1/%2").arg(i).arg(kStepParts[p].first)] = stepTime_->addSeries(
                    QString("%1 %2").arg(device, tr(kStepParts[p].second)), stepPartColor(p));
            }
        }
    }
    replicaSelector_->setCurrentIndex(0);
    replicaSelector_->setVisible(replicas > 1);
    showStepTimeOf(0);
    series_["lr"] = learningRate_->addSeries(tr("learning rate"), seriesColor(4));
    series_["ls"] = lossScale_->addSeries(tr("loss scale"), seriesColor(5));
    // Steps skipped so far (non-finite gradients), on the same log axis: each skip halves the
    // scale, so the two curves move together.
    series_["skip"] = lossScale_->addSeries(tr("skipped steps"), seriesColor(1));
    const int64_t total = std::max<int64_t>(
        1, static_cast<int64_t>(info.epochs - info.initialEpoch) * info.stepsPerEpoch);
    progress_->setRange(0, static_cast<int>(std::min<int64_t>(total, INT32_MAX)));
    progress_->setValue(0);
    QStringList devices;
    for (const auto& d : info.devices) devices << QString::fromStdString(d);
    appendLog(tr("Run %1 \"%2\" started: %3 epochs × %4 steps, batch %5, %6 training / %7 "
                 "validation samples, %8 parameters, devices %9")
                  .arg(info.runId)
                  .arg(QString::fromStdString(info.runName))
                  .arg(info.epochs - info.initialEpoch)
                  .arg(info.stepsPerEpoch)
                  .arg(info.batchSize)
                  .arg(info.trainSamples)
                  .arg(info.validationSamples)
                  .arg(info.params)
                  .arg(devices.join(", ")));
    updateProgress(nullptr);
    replotAll();
}

void MonitorPanel::onEvents(const EventBatch& batch) {
    const double spe = std::max<double>(1.0, static_cast<double>(info_.stepsPerEpoch));
    for (const td::StepMetrics& s : batch.steps) {
        const double x = s.epoch + static_cast<double>(s.step) / spe;
        if (accuracyKey_.isEmpty()) {
            for (const auto& [k, v] : s.metrics) {
                if (k != "loss" && QString::fromStdString(k).contains("acc")) {
                    accuracyKey_ = QString::fromStdString(k);
                    break;
                }
            }
        }
        if (auto it = s.metrics.find("loss"); it != s.metrics.end())
            loss_->append(series_["loss/step"], x, it->second);
        if (!accuracyKey_.isEmpty()) {
            if (auto it = s.metrics.find(accuracyKey_.toStdString()); it != s.metrics.end())
                accuracy_->append(series_["acc/step"], x, it->second);
        }
        throughput_->append(series_["tp/total"], x, s.samplesPerSecond);
        for (size_t i = 0; i < s.replicas.size(); ++i) {
            const int slot = replicaSlot(s.replicas[i], i, info_.devices.size());
            auto it = series_.find("tp/" + QString::number(slot));
            if (it != series_.end())
                throughput_->append(it->second, x, s.replicas[i].samplesPerSecond);
        }
        appendStepTimes(s, x);
        learningRate_->append(series_["lr"], x, s.learningRate);
        if (s.lossScale > 0) {
            lossScale_->append(series_["ls"], x, s.lossScale);
            if (s.skippedSteps > 0)
                lossScale_->append(series_["skip"], x, static_cast<double>(s.skippedSteps));
            if (lossScale_->isHidden()) lossScale_->show();
        }
        lastGlobalStep_ = s.globalStep;
        lastSamplesPerSecond_ = s.samplesPerSecond;
        lastX_ = x;
    }
    for (const td::DeviceStats& d : batch.devices) appendDeviceStats(d, lastX_);
    for (const td::EpochMetrics& e : batch.epochs) {
        const double x = e.epoch + 1.0;
        auto get = [&](const std::string& k) -> std::optional<double> {
            auto it = e.metrics.find(k);
            if (it == e.metrics.end()) return std::nullopt;
            return it->second;
        };
        if (auto v = get("loss")) loss_->append(series_["loss/epoch"], x, *v);
        if (auto v = get("val_loss")) loss_->append(series_["loss/val"], x, *v);
        if (!accuracyKey_.isEmpty()) {
            if (auto v = get(accuracyKey_.toStdString()))
                accuracy_->append(series_["acc/epoch"], x, *v);
            if (auto v = get("val_" + accuracyKey_.toStdString()))
                accuracy_->append(series_["acc/val"], x, *v);
        }
        if (batch.history) continue;  // a resumed run's earlier epochs: drawn, said once below
        // Input-bound: said where the eye is, until an epoch that is not.
        const double share = e.inputWaitSeconds / std::max(1e-9, e.seconds);
        inputBound_->setVisible(!e.inputBoundAdvice.empty());
        if (!e.inputBoundAdvice.empty())
            inputBound_->setText(
                tr("⏳ Input-bound: epoch %1 spent %2% of its step time waiting for data. Try %3.")
                    .arg(e.epoch + 1)
                    .arg(100.0 * share, 0, 'f', 0)
                    .arg(QString::fromStdString(e.inputBoundAdvice)));
        QStringList parts;
        for (const auto& [k, v] : e.metrics)
            parts << QString("%1=%2").arg(QString::fromStdString(k)).arg(v, 0, 'g', 5);
        appendLog((e.resumedSamples > 0
                       ? tr("Epoch %1/%2 done, its last part in %3 s after the resume (%4 "
                            "samples/s): %5")
                       : tr("Epoch %1/%2 done in %3 s (%4 samples/s): %5"))
                      .arg(e.epoch + 1)
                      .arg(info_.epochs)
                      .arg(e.seconds, 0, 'f', 2)
                      .arg(e.samplesPerSecond, 0, 'f', 0)
                      .arg(parts.join("  ")));
    }
    for (const td::LogLine& l : batch.logs) appendLog(QString::fromStdString(l.text), l.level);
    if (batch.history) {
        if (!batch.steps.empty())
            appendLog(tr("Resumed: the curves up to step %1 are the run's stored rows")
                          .arg(batch.steps.back().globalStep));
        replotAll();
        return;
    }
    updateProgress(batch.steps.empty() ? nullptr : &batch.steps.back());
    replotAll();
}

void MonitorPanel::onFinished(const td::RunFinished& result) {
    QString msg = tr("Run %1 after %2 s")
                      .arg(td::runStatusName(result.status))
                      .arg(result.seconds, 0, 'f', 1);
    if (!result.message.empty()) msg += ": " + QString::fromStdString(result.message);
    QStringList parts;
    for (const auto& [k, v] : result.finalMetrics)
        parts << QString("%1=%2").arg(QString::fromStdString(k)).arg(v, 0, 'g', 5);
    if (!parts.isEmpty()) msg += tr(". Final: %1").arg(parts.join("  "));
    appendLog(msg, result.status == td::RunStatus::Failed ? td::LogLine::Level::Error
                                                          : td::LogLine::Level::Info);
    if (result.status == td::RunStatus::Completed) progress_->setValue(progress_->maximum());
    progressLabel_->setText(progressText() + " · " + td::runStatusName(result.status));
    replotAll();
    updateBlocker();
}

void MonitorPanel::updateProgress(const td::StepMetrics* last) {
    if (last) {
        lastEpoch_ = last->epoch;
        lastStep_ = last->step;
        const int64_t done =
            static_cast<int64_t>(last->epoch - info_.initialEpoch) * info_.stepsPerEpoch +
            last->step;
        progress_->setValue(static_cast<int>(std::min<int64_t>(done, progress_->maximum())));
    }
    progressLabel_->setText(progressText());
}

QString MonitorPanel::progressText() const {
    if (info_.stepsPerEpoch == 0) return tr("Idle");
    const qint64 elapsedS = elapsed_.isValid() ? elapsed_.elapsed() / 1000 : 0;
    const double done = std::max(1, progress_->value());
    const double total = progress_->maximum();
    const qint64 leftS =
        progress_->value() > 0 ? static_cast<qint64>(elapsedS * (total - done) / done) : -1;
    const QString paused =
        runs_->state() == RunController::State::Paused ? tr("Paused · ") : QString();
    return paused + tr("Epoch %1/%2 · step %3/%4 · %5 elapsed · %6 left · %7 samples/s")
                        .arg(lastEpoch_ + 1)
                        .arg(info_.epochs)
                        .arg(lastStep_)
                        .arg(info_.stepsPerEpoch)
                        .arg(hms(elapsedS))
                        .arg(hms(leftS))
                        .arg(QLocale::c().toString(lastSamplesPerSecond_, 'f', 0));
}

void MonitorPanel::replotAll() {
    for (ChartWidget* c : charts()) c->replotIfDirty();
}

}  // namespace td::ui

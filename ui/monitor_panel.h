// Monitor panel: run controls, progress with time left, live charts (loss, accuracy, throughput
// in total and per replica, step time split into compute, all-reduce and input wait for all
// replicas or one, learning rate, loss scale) and the run log. Fed by RunController's coalesced
// batches; each batch appends to the charts and replots them once.
#pragma once

#include <QElapsedTimer>
#include <QWidget>
#include <map>

#include "engine/core/events.h"

class QComboBox;
class QLabel;
class QPlainTextEdit;
class QProgressBar;

namespace td::ui {

class ChartWidget;
class RunController;
struct EventBatch;

class MonitorPanel : public QWidget {
    Q_OBJECT
  public:
    explicit MonitorPanel(RunController* runs, QWidget* parent = nullptr);

    ChartWidget* lossChart() const { return loss_; }
    ChartWidget* accuracyChart() const { return accuracy_; }
    ChartWidget* throughputChart() const { return throughput_; }
    ChartWidget* stepTimeChart() const { return stepTime_; }
    ChartWidget* lossScaleChart() const { return lossScale_; }
    // What the GPUs report of themselves (DeviceStats' NVML figures): one series per device,
    // "mem/<device>" (GiB used) and "util/<device>" (percent); each chart shows once a figure
    // arrives, so CPU runs and machines without NVML never see them.
    ChartWidget* gpuMemoryChart() const { return gpuMemory_; }
    ChartWidget* gpuUtilizationChart() const { return gpuUtilization_; }
    // Which replica the step-time chart shows: item 0 is the mean over all replicas, item i + 1
    // replica i (hidden with one replica).
    QComboBox* replicaSelector() const { return replicaSelector_; }
    // Series index in its chart, -1 when absent: "tp/total", "tp/<replica>" (throughput);
    // "st/all/<part>", "st/<replica>/<part>" with part compute, allreduce or wait (step time);
    // "mem/<device>", "util/<device>" (GPU memory and utilisation, by DeviceStats::device).
    int seriesIndex(const QString& key) const;
    QList<ChartWidget*> charts() const;
    QPlainTextEdit* logView() const { return log_; }
    QProgressBar* progressBar() const { return progress_; }
    QString progressText() const;
    double lastSamplesPerSecond() const { return lastSamplesPerSecond_; }

    void appendLog(const QString& text, td::LogLine::Level level = td::LogLine::Level::Info);
    // Whether the loss-scale chart is shown (mixed_float16 projects).
    void setLossScaleVisible(bool on);

  private:
    void onRunStarted(const td::RunStarted& info);
    void onEvents(const EventBatch& batch);
    void onFinished(const td::RunFinished& result);
    void updateBlocker();
    void updateProgress(const td::StepMetrics* last);
    void replotAll();
    void showStepTimeOf(int selectorIndex);
    void appendStepTimes(const td::StepMetrics& s, double x);
    void appendDeviceStats(const td::DeviceStats& d, double x);

    RunController* runs_;
    QLabel* blocker_;
    QLabel* inputBound_;  // the last epoch waited for data: how much, and what would help
    QProgressBar* progress_;
    QLabel* progressLabel_;
    QPlainTextEdit* log_;
    ChartWidget* loss_;
    ChartWidget* accuracy_;
    ChartWidget* throughput_;
    ChartWidget* stepTime_;
    ChartWidget* learningRate_;
    ChartWidget* lossScale_;
    ChartWidget* gpuMemory_;
    ChartWidget* gpuUtilization_;
    QComboBox* replicaSelector_;

    td::RunStarted info_;
    QElapsedTimer elapsed_;
    int64_t lastGlobalStep_ = 0;
    int lastEpoch_ = 0;
    int64_t lastStep_ = 0;
    double lastSamplesPerSecond_ = 0;
    double lastX_ = 0;  // x of the last step shown: device figures come at log points, after it
    std::map<QString, int> gpuColors_;  // device -> colour of its GPU series, in arrival order
    QString accuracyKey_;
    std::map<QString, int> series_;  // "<chart>/<name>" -> series index
};

}  // namespace td::ui

// Monitor panel: run controls, progress with time left, live charts (loss, accuracy, throughput
// per replica, step time split, learning rate, loss scale) and the run log. Fed by RunController's
// coalesced batches; each batch appends to the charts and replots them once.
#pragma once

#include <QElapsedTimer>
#include <QWidget>
#include <map>

#include "engine/core/events.h"

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

    RunController* runs_;
    QLabel* blocker_;
    QProgressBar* progress_;
    QLabel* progressLabel_;
    QPlainTextEdit* log_;
    ChartWidget* loss_;
    ChartWidget* accuracy_;
    ChartWidget* throughput_;
    ChartWidget* stepTime_;
    ChartWidget* learningRate_;
    ChartWidget* lossScale_;

    td::RunStarted info_;
    QElapsedTimer elapsed_;
    int64_t lastGlobalStep_ = 0;
    int lastEpoch_ = 0;
    int64_t lastStep_ = 0;
    double lastSamplesPerSecond_ = 0;
    QString accuracyKey_;
    std::map<QString, int> series_;  // "<chart>/<name>" -> series index
};

}  // namespace td::ui

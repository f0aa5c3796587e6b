// Runs one training session at a time on the engine's thread and turns its event stream into
// coalesced batches for the GUI: a 40 ms timer drains the subscriber queue and emits everything
// that arrived as one EventBatch (PlotJuggler-style), so views update at most ~25 times a second
// however fast the trainer publishes. Owns the Start / Pause / Stop actions.
#pragma once

#include <QAction>
#include <QObject>
#include <QString>
#include <QTimer>
#include <functional>
#include <memory>
#include <vector>

#include "engine/api/session.h"

namespace td::ui {

class LatencyProbe;

struct EventBatch {
    std::vector<td::StepMetrics> steps;
    std::vector<td::EpochMetrics> epochs;
    std::vector<td::DeviceStats> devices;
    std::vector<td::LogLine> logs;
    // A resumed run's rows from the store, up to the checkpoint it continues from (delivered
    // right after its RunStarted, so the charts show the whole run); not live events.
    bool history = false;
    bool empty() const {
        return steps.empty() && epochs.empty() && devices.empty() && logs.empty();
    }
};

class RunController : public QObject {
    Q_OBJECT
  public:
    enum class State { Idle, Preparing, Running, Paused, Stopping };
    Q_ENUM(State)
    static constexpr int kDrainIntervalMs = 40;

    explicit RunController(QObject* parent = nullptr);
    ~RunController() override;  // stops and joins a run still going

    QAction* startAction() const { return start_; }
    QAction* pauseAction() const { return pause_; }
    QAction* stopAction() const { return stop_; }
    State state() const { return state_; }
    bool busy() const { return state_ != State::Idle; }
    int64_t runId() const { return runId_; }
    LatencyProbe* latencyProbe() const { return probe_; }

    // Why Start is disabled (empty when a run can start). Shown as the action's tooltip.
    void setStartBlocker(const QString& reason);
    QString startBlocker() const { return blocker_; }

    // Compiles off the GUI thread, then starts the engine thread. Returns false (and says why in
    // *error) only when a run cannot even be attempted.
    bool start(const td::Project& project, const QString& storePath, QString* error = nullptr);
    // Continues stored run `runId` of the store from its last good checkpoint (findResumePoint),
    // off the GUI thread like start(); its rows go on in the same stored run.
    bool resume(int64_t runId, const QString& storePath, QString* error = nullptr);
    void togglePause();
    // How Pause and Stop reach a run this controller did not start (a run on a server: they
    // send `traindeck pause|continue|stop RUN` there). Empty functions: the actions stay off.
    struct Steering {
        std::function<void(bool pause)> pause;  // true: pause, false: continue
        std::function<void()> stop;
    };
    // Shows a run this controller did not start (a replay, a remote run, a test): drains `queue`
    // on the same 40 ms timer and emits the same signals as for its own runs, until a RunFinished
    // arrives. Returns false when a run is in progress. Pause and Stop act through `steering`.
    bool follow(std::shared_ptr<td::EventQueue> queue, Steering steering = {});
    // Whether the run shown is one this controller follows (follow()) rather than trains.
    bool following() const { return queue_ && !session_; }
    void stop();      // asynchronous: the run ends at the next step boundary
    void shutdown();  // blocking: stop, join and deliver the final events (window closing)

  signals:
    void startRequested();  // the Start action was triggered (the owner supplies the project)
    void stateChanged(td::ui::RunController::State state);
    void runStarted(const td::RunStarted& info);
    void eventsArrived(const td::ui::EventBatch& batch);
    void runFinished(const td::RunFinished& result);
    void message(const QString& text, bool error);

  private:
    void setState(State s);
    struct Prepared {
        std::unique_ptr<td::Session> session;  // null on error
        std::string error;
        EventBatch history;  // resume: the stored rows before the checkpoint
    };
    // Runs `make` off the GUI thread, then starts the session it returns.
    bool prepare(const QString& what, std::function<Prepared()> make, QString* error);
    void onPrepared(Prepared prepared);
    void drain();
    void finish(const td::RunFinished& result);
    void updateActions();

    QAction* start_;
    QAction* pause_;
    QAction* stop_;
    QTimer drainTimer_;
    LatencyProbe* probe_;
    State state_ = State::Idle;
    QString blocker_;
    bool stopWhilePreparing_ = false;
    std::unique_ptr<td::Session> session_;
    std::shared_ptr<td::EventQueue> queue_;
    Steering steering_;  // a followed run's Pause and Stop
    int64_t runId_ = 0;
    EventBatch history_;  // delivered after the next RunStarted
};

}  // namespace td::ui

#include "ui/run_controller.h"

#include <QApplication>
#include <QStyle>

#include "engine/api/runs.h"
#include "ui/async.h"
#include "ui/latency_probe.h"

namespace td::ui {

RunController::RunController(QObject* parent) : QObject(parent), probe_(new LatencyProbe(this)) {
    QStyle* style = QApplication::style();
    start_ = new QAction(style->standardIcon(QStyle::SP_MediaPlay), tr("&Start"), this);
    start_->setObjectName("startAction");
    start_->setShortcut(QKeySequence(Qt::Key_F5));
    pause_ = new QAction(style->standardIcon(QStyle::SP_MediaPause), tr("&Pause"), this);
    pause_->setObjectName("pauseAction");
    pause_->setShortcut(QKeySequence(Qt::Key_F6));
    stop_ = new QAction(style->standardIcon(QStyle::SP_MediaStop), tr("S&top"), this);
    stop_->setObjectName("stopAction");
    stop_->setShortcut(QKeySequence(Qt::SHIFT | Qt::Key_F5));
    connect(start_, &QAction::triggered, this, &RunController::startRequested);
    connect(pause_, &QAction::triggered, this, &RunController::togglePause);
    connect(stop_, &QAction::triggered, this, &RunController::stop);
    drainTimer_.setInterval(kDrainIntervalMs);
    connect(&drainTimer_, &QTimer::timeout, this, &RunController::drain);
    updateActions();
}

RunController::~RunController() {
    shutdown();
}

void RunController::setStartBlocker(const QString& reason) {
    blocker_ = reason;
    updateActions();
}

void RunController::setState(State s) {
    if (s == state_) return;
    state_ = s;
    updateActions();
    emit stateChanged(s);
}

void RunController::updateActions() {
    start_->setEnabled(state_ == State::Idle && blocker_.isEmpty());
    start_->setToolTip(blocker_.isEmpty() ? tr("Start training (F5)")
                                          : tr("Cannot start: %1").arg(blocker_));
    const bool steerable = session_ || steering_.pause;
    pause_->setEnabled(steerable && (state_ == State::Running || state_ == State::Paused));
    pause_->setText(state_ == State::Paused ? tr("&Resume") : tr("&Pause"));
    pause_->setIcon(QApplication::style()->standardIcon(
        state_ == State::Paused ? QStyle::SP_MediaPlay : QStyle::SP_MediaPause));
    stop_->setEnabled(state_ == State::Preparing ||
                      ((session_ || steering_.stop) &&
                       (state_ == State::Running || state_ == State::Paused)));
}

bool RunController::start(const td::Project& project, const QString& storePath, QString* error) {
    auto fail = [&](const QString& why) {
        if (error) *error = why;
        emit message(why, true);
        return false;
    };
    if (state_ != State::Idle) return fail(tr("A run is already in progress."));
    if (!blocker_.isEmpty()) return fail(tr("Cannot start: %1").arg(blocker_));
    td::SessionOptions options;
    options.storePath = storePath.toStdString();
    return prepare(
        QString::fromStdString(project.name),
        [project, options] {
            Prepared out;
            auto created = td::Session::create(project, options);
            if (created.ok()) {
                out.session.reset(created->release());
            } else {
                out.error = created.error();
            }
            return out;
        },
        error);
}

namespace {

// A stored run's rows up to the checkpoint a resume continues from, as the events they were: the
// logged steps to its global step and the epochs before its epoch.
EventBatch storedHistory(const std::string& store, int64_t runId, int64_t globalStep, int epoch) {
    EventBatch out;
    out.history = true;
    auto catalog = td::api::RunCatalog::open(store);
    if (!catalog.ok()) return out;
    if (auto steps = (*catalog)->steps(runId); steps.ok()) {
        for (const td::StepRow& r : *steps) {
            if (r.globalStep > globalStep) break;
            out.steps.push_back(td::api::stepEvent(r));
        }
    }
    if (auto epochs = (*catalog)->epochs(runId); epochs.ok()) {
        for (const td::EpochRow& r : *epochs) {
            if (r.epoch >= epoch) break;
            out.epochs.push_back(td::api::epochEvent(r));
        }
    }
    return out;
}

}  // namespace

bool RunController::resume(int64_t runId, const QString& storePath, QString* error) {
    if (state_ != State::Idle) {
        const QString why = tr("A run is already in progress.");
        if (error) *error = why;
        emit message(why, true);
        return false;
    }
    const std::string store = storePath.toStdString();
    return prepare(
        tr("run #%1").arg(runId),
        [runId, store] {
            Prepared out;
            auto point = td::findResumePoint(store, std::to_string(runId));
            if (!point.ok()) {
                out.error = point.error();
                return out;
            }
            out.history = storedHistory(store, runId, point->globalStep, point->epoch);
            td::SessionOptions options;
            options.storePath = store;
            const td::Project project = point->project;
            options.resume = std::move(point).value();
            auto created = td::Session::create(project, options);
            if (created.ok()) {
                out.session.reset(created->release());
            } else {
                out.error = created.error();
            }
            return out;
        },
        error);
}

bool RunController::prepare(const QString& what, std::function<Prepared()> make, QString*) {
    stopWhilePreparing_ = false;
    runId_ = 0;
    setState(State::Preparing);
    emit message(tr("Preparing \"%1\": loading data and compiling the model…").arg(what), false);
    // Loading data and compiling can take seconds: keep it off the GUI thread.
    runAsync(this, std::move(make), [this](Prepared p) { onPrepared(std::move(p)); });
    return true;
}

void RunController::onPrepared(Prepared prepared) {
    if (!prepared.session) {
        td::RunFinished failed;
        failed.status = td::RunStatus::Failed;
        failed.message = prepared.error;
        emit message(tr("Could not start: %1").arg(QString::fromStdString(prepared.error)), true);
        setState(State::Idle);
        emit runFinished(failed);
        return;
    }
    if (stopWhilePreparing_) {
        td::RunFinished stopped;
        stopped.status = td::RunStatus::Stopped;
        stopped.message = "stopped before training began";
        emit message(tr("Stopped before training began."), false);
        setState(State::Idle);
        emit runFinished(stopped);
        return;
    }
    session_ = std::move(prepared.session);
    history_ = std::move(prepared.history);
    queue_ = session_->events().subscribe();  // before start(): see every event
    session_->start();
    probe_->start();
    drainTimer_.start();
    setState(State::Running);
}

bool RunController::follow(std::shared_ptr<td::EventQueue> queue, Steering steering) {
    if (state_ != State::Idle || !queue) return false;
    runId_ = 0;
    queue_ = std::move(queue);
    steering_ = std::move(steering);
    probe_->start();
    drainTimer_.start();
    setState(State::Running);
    return true;
}

void RunController::togglePause() {
    if (!session_ && steering_.pause && (state_ == State::Running || state_ == State::Paused)) {
        const bool pause = state_ == State::Running;
        steering_.pause(pause);
        setState(pause ? State::Paused : State::Running);
        emit message(
            pause ? tr("Pausing the run on the server…") : tr("Continuing the run on the server…"),
            false);
        return;
    }
    if (!session_) return;
    if (state_ == State::Running) {
        session_->pause();
        setState(State::Paused);
        emit message(tr("Paused."), false);
    } else if (state_ == State::Paused) {
        session_->resume();
        setState(State::Running);
        emit message(tr("Resumed."), false);
    }
}

void RunController::stop() {
    if (state_ == State::Preparing) {
        stopWhilePreparing_ = true;
        setState(State::Stopping);
        return;
    }
    if (!session_ && steering_.stop && state_ != State::Stopping && state_ != State::Idle) {
        steering_.stop();
        setState(State::Stopping);
        emit message(tr("Stopping the run on the server at its next step…"), false);
        return;
    }
    if (!session_ || state_ == State::Stopping) return;
    if (state_ == State::Paused) session_->resume();
    session_->requestStop();
    setState(State::Stopping);
    emit message(tr("Stopping at the next step…"), false);
}

void RunController::shutdown() {
    if (!session_) return;
    session_->requestStop();
    session_->join();
    drain();  // delivers RunFinished and releases the session
    if (session_) {
        td::RunFinished stopped;
        stopped.status = td::RunStatus::Stopped;
        finish(stopped);
    }
}

void RunController::drain() {
    if (!queue_) return;
    EventBatch batch;
    std::optional<td::RunFinished> finished;
    for (td::Event& e : queue_->drain()) {
        if (auto* s = std::get_if<td::StepMetrics>(&e)) {
            batch.steps.push_back(std::move(*s));
        } else if (auto* ep = std::get_if<td::EpochMetrics>(&e)) {
            batch.epochs.push_back(std::move(*ep));
        } else if (auto* d = std::get_if<td::DeviceStats>(&e)) {
            batch.devices.push_back(std::move(*d));
        } else if (auto* l = std::get_if<td::LogLine>(&e)) {
            batch.logs.push_back(std::move(*l));
        } else if (auto* rs = std::get_if<td::RunStarted>(&e)) {
            // Deliver what came before so the views see events in order.
            if (!batch.empty()) emit eventsArrived(batch);
            batch = {};
            runId_ = rs->runId;
            emit runStarted(*rs);
            if (history_.history) {  // a resumed run's curves so far, before its live events
                EventBatch history = std::move(history_);
                history_ = {};
                emit eventsArrived(history);
            }
        } else if (auto* f = std::get_if<td::RunFinished>(&e)) {
            finished = std::move(*f);
        }
    }
    if (!batch.empty()) emit eventsArrived(batch);
    if (finished) {
        finish(*finished);
    } else if (session_ && !session_->running() && queue_->closed()) {
        td::RunFinished lost;
        lost.status = td::RunStatus::Failed;
        lost.message = "the engine thread ended without reporting a result";
        finish(lost);
    }
}

void RunController::finish(const td::RunFinished& result) {
    drainTimer_.stop();
    probe_->stop();
    if (session_) session_->join();
    session_.reset();
    queue_.reset();
    steering_ = {};
    emit message(probe_->report(), false);
    setState(State::Idle);
    emit runFinished(result);
}

}  // namespace td::ui

// RunRecorder: drains one EventQueue on its own thread and writes the events to the run store in
// batches, so the training thread never waits on SQLite and a viewer sees a live run.
#include <unistd.h>

#include <chrono>
#include <mutex>
#include <type_traits>
#include <utility>

#include "engine/store/run_store.h"

namespace td {
namespace {

constexpr auto kPopTimeout = std::chrono::milliseconds(100);
constexpr auto kFlushInterval = std::chrono::milliseconds(250);
constexpr size_t kFlushRows = 256;

int64_t nowMs() {
    using namespace std::chrono;
    return duration_cast<milliseconds>(system_clock::now().time_since_epoch()).count();
}

const char* levelName(LogLine::Level l) {
    switch (l) {
        case LogLine::Level::Info:
            return "info";
        case LogLine::Level::Warning:
            return "warning";
        case LogLine::Level::Error:
            return "error";
    }
    return "info";
}

}  // namespace

struct RunRecorder::Impl {
    std::unique_ptr<RunStore> store;
    int64_t runId = 0;
    std::shared_ptr<EventQueue> queue;
    ErrorHandler onWriteError;
    std::thread thread;

    mutable std::mutex errorMu;
    std::optional<std::string> error;

    // Owned by the recorder thread.
    std::vector<StepRow> steps;
    std::vector<ReplicaRow> replicas;
    std::vector<EpochRow> epochs;
    std::vector<DeviceRow> devices;
    std::vector<LogRow> logs;
    std::vector<CheckpointRow> checkpoints;
    std::vector<std::string> superseded;  // checkpoint files to forget, then delete
    std::chrono::steady_clock::time_point lastFlush = std::chrono::steady_clock::now();
    bool finished = false;

    // Events waiting to be written; a logged step counts once, with its replicas' rows.
    size_t pending() const {
        return steps.size() + epochs.size() + devices.size() + logs.size() + checkpoints.size() +
               superseded.size();
    }

    void report(const Status& st) {
        if (st.ok()) return;
        {
            std::lock_guard<std::mutex> lock(errorMu);
            if (error) return;  // the first error is the one that explains the rest
            error = st.error();
        }
        if (onWriteError) onWriteError(st.error());
    }

    // A failed batch is rolled back and dropped, and so is every row after it: the stored run
    // stays a gapless prefix of what happened (then marked failed), and memory stays bounded.
    void flush() {
        if (!firstError()) {
            report(store->appendSteps(runId, steps, replicas));
            if (!firstError()) report(store->appendEpochs(runId, epochs));
            if (!firstError()) report(store->appendDeviceStats(runId, devices));
            if (!firstError()) report(store->appendLogs(runId, logs));
            // Checkpoints after the rows of their steps; a superseded file is deleted only once
            // its successor is registered, so a run always keeps one to resume from.
            if (!firstError()) report(store->addCheckpoints(runId, checkpoints, superseded));
            if (!firstError())
                for (const std::string& f : superseded) (void)::unlink(f.c_str());
        }
        checkpoints.clear();
        superseded.clear();
        steps.clear();
        replicas.clear();
        epochs.clear();
        devices.clear();
        logs.clear();
        lastFlush = std::chrono::steady_clock::now();
    }

    // A run with rows missing is not stored as a success, whatever the trainer reported.
    void finish(RunStatus status, const MetricMap& finalMetrics, std::string message) {
        finished = true;  // first: an exception below must still end the loop
        flush();
        if (std::optional<std::string> e = firstError(); e && status != RunStatus::Failed) {
            message = "run store: " + *e + " (rows written before the failure are kept)";
            status = RunStatus::Failed;
        }
        report(store->finishRun(runId, status, finalMetrics, message));
    }

    std::optional<std::string> firstError() const {
        std::lock_guard<std::mutex> lock(errorMu);
        return error;
    }

    void handle(Event& event) {
        if (finished) return;
        const int64_t t = nowMs();
        std::visit(
            [&](auto& e) {
                using T = std::decay_t<decltype(e)>;
                if constexpr (std::is_same_v<T, RunStarted>) {
                    std::string devs;
                    for (const auto& d : e.devices) devs += (devs.empty() ? "" : ",") + d;
                    if (!devs.empty() || e.params > 0)
                        report(store->updateRunInfo(runId, devs, e.params));
                } else if constexpr (std::is_same_v<T, StepMetrics>) {
                    StepRow r;
                    r.globalStep = e.globalStep;
                    r.epoch = e.epoch;
                    r.step = e.step;
                    r.timeMs = t;
                    r.metrics = std::move(e.metrics);
                    r.metrics["lr"] = e.learningRate;
                    if (e.lossScale > 0) {
                        r.metrics["loss_scale"] = e.lossScale;
                        r.metrics["skipped_steps"] = static_cast<double>(e.skippedSteps);
                    }
                    r.metrics["input_wait_s"] = e.inputWaitSeconds;
                    r.metrics["compute_s"] = e.computeSeconds;
                    r.metrics["samples_per_s"] = e.samplesPerSecond;
                    steps.push_back(std::move(r));
                    for (ReplicaStats& rs : e.replicas)
                        replicas.push_back(ReplicaRow{e.globalStep, t, std::move(rs)});
                } else if constexpr (std::is_same_v<T, EpochMetrics>) {
                    EpochRow r;
                    r.epoch = e.epoch;
                    r.timeMs = t;
                    r.seconds = e.seconds;
                    r.metrics = std::move(e.metrics);
                    if (e.learningRate > 0) r.metrics["lr"] = e.learningRate;
                    if (e.samplesPerSecond > 0) r.metrics["samples_per_s"] = e.samplesPerSecond;
                    if (e.seconds > 0)  // the share of the epoch spent waiting for data
                        r.metrics["input_wait_share"] = e.inputWaitSeconds / e.seconds;
                    epochs.push_back(std::move(r));
                } else if constexpr (std::is_same_v<T, DeviceStats>) {
                    devices.push_back(DeviceRow{t, e.device, e.utilization, e.memoryBytes,
                                                e.samplesPerSecond, e.memoryUsedBytes,
                                                e.memoryTotalBytes, e.gpuUtilization});
                } else if constexpr (std::is_same_v<T, LogLine>) {
                    logs.push_back(LogRow{t, levelName(e.level), std::move(e.text)});
                } else if constexpr (std::is_same_v<T, CheckpointSaved>) {
                    if (!e.path.empty())
                        checkpoints.push_back(CheckpointRow{e.path, e.kind, e.globalStep, e.epoch,
                                                            e.stepInEpoch, e.monitorValue, e.bytes,
                                                            t});
                    superseded.insert(superseded.end(), e.superseded.begin(), e.superseded.end());
                } else if constexpr (std::is_same_v<T, RunFinished>) {
                    finish(e.status, e.finalMetrics, e.message);
                }
            },
            event);
    }

    void loop() {
        while (!finished) {
            // Nothing may escape the thread (std::terminate) or end it before the run is finished
            // (finish() and join() would wait forever): an exception is a write error.
            try {
                step();
            } catch (const std::exception& ex) {
                report(err(store->path() + ": recording the run: " + ex.what()));
            } catch (...) {
                report(err(store->path() + ": recording the run: unknown exception"));
            }
        }
    }

    void step() {
        // In batches: the step and device figures do not wake this thread (EventQueue::waitBatch).
        // A transaction holds at most kFlushRows rows however many events the batch brings.
        std::vector<Event> batch = queue->waitBatch(kPopTimeout);
        for (Event& e : batch) {
            handle(e);
            if (!finished && pending() >= kFlushRows) flush();
        }
        if (batch.empty() && queue->closed()) {
            finish(RunStatus::Failed, {}, "run ended without a final status");
            return;
        }
        if (!finished && pending() > 0 &&
            (pending() >= kFlushRows ||
             std::chrono::steady_clock::now() - lastFlush >= kFlushInterval))
            flush();
    }
};

Result<std::unique_ptr<RunRecorder>> RunRecorder::start(const std::string& storePath, int64_t runId,
                                                        std::shared_ptr<EventQueue> events,
                                                        ErrorHandler onWriteError) {
    TD_ASSERT_MSG(events != nullptr, "RunRecorder::start needs an event queue");
    TD_ASSIGN_OR_RETURN(std::unique_ptr<RunStore> store, RunStore::open(storePath));
    TD_RETURN_IF_ERROR(store->getRun(runId));
    std::unique_ptr<RunRecorder> rec(new RunRecorder());
    rec->impl_ = std::make_unique<Impl>();
    Impl* impl = rec->impl_.get();
    impl->store = std::move(store);
    impl->runId = runId;
    impl->queue = std::move(events);
    impl->onWriteError = std::move(onWriteError);
    impl->thread = std::thread([impl] { impl->loop(); });
    return rec;
}

RunRecorder::~RunRecorder() {
    if (!impl_) return;
    // Whatever is queued is still written; a run that never sent RunFinished is marked failed
    // instead of blocking here forever.
    if (impl_->thread.joinable()) impl_->queue->close();
    join();
}

void RunRecorder::join() {
    if (impl_ && impl_->thread.joinable()) impl_->thread.join();
}

Status RunRecorder::finish(const RunFinished& result) {
    if (!impl_) return Status::success();
    if (impl_->thread.joinable()) impl_->queue->push(result);
    join();
    if (std::optional<std::string> e = impl_->firstError()) return err(*e);
    return Status::success();
}

std::optional<std::string> RunRecorder::lastError() const {
    if (!impl_) return std::nullopt;
    return impl_->firstError();
}

}  // namespace td

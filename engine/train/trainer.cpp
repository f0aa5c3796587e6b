// The trainer's step and fit loop. Read trainStep() and fit() first: the step, then the loop
// that calls it and then its observers (callbacks, the log point's telemetry, checkpoints). The
// strategy's replicas are set up in replicas.cpp, their programs in programs.cpp.
#include <csignal>
#include <cstdlib>

#include "engine/backend/host_threads.h"
#include "engine/graph/lower.h"
#include "engine/train/trainer_impl.h"

namespace td {

// ---- RunControl ---------------------------------------------------------------------------------

void RunControl::requestStop() {
    stopRequested = true;
    std::lock_guard<std::mutex> lk(mu);
    cv.notify_all();
}

void RunControl::setPaused(bool p) {
    {
        std::lock_guard<std::mutex> lk(mu);
        paused = p;
    }
    cv.notify_all();
}

bool RunControl::isPaused() {
    std::lock_guard<std::mutex> lk(mu);
    return paused;
}

void RunControl::abortRun(const std::string& reason) {
    {
        std::lock_guard<std::mutex> lk(mu);
        if (abortReason.empty()) abortReason = reason;
    }
    aborted = true;
    cv.notify_all();  // wakes a paused run: it ends too
}

std::string RunControl::abortMessage() {
    std::lock_guard<std::mutex> lk(mu);
    return abortReason;
}

// ---- WorkerFault --------------------------------------------------------------------------------

WorkerFault WorkerFault::fromEnv() {
    WorkerFault f;
    const char* v = std::getenv("TRAINDECK_FAULT_WORKER");
    if (!v) return f;
    const std::string text = v;
    const size_t a = text.find(':'), b = text.rfind(':');
    if (a == std::string::npos || b == a) return f;
    const std::string kind = text.substr(0, a);
    f.kind = kind == "kill" ? Kind::Kill : kind == "hang" ? Kind::Hang : Kind::None;
    f.rank = std::atoi(text.substr(a + 1, b - a - 1).c_str());
    f.step = std::atoll(text.substr(b + 1).c_str());
    return f;
}

void WorkerFault::atStep(int workerRank, int64_t gstep) const {
    if (kind == Kind::None || workerRank != rank || gstep != step) return;
    if (kind == Kind::Kill) std::raise(SIGKILL);
    for (;;) std::this_thread::sleep_for(std::chrono::hours(1));
}

namespace {

// Runs fn on a thread of its own and returns its status once that thread has ended. For work
// that opens OpenMP teams on behalf of a thread that will not run the steps: libgomp keeps a
// thread's team workers for as long as that thread lives, and once it counts more of its threads
// than the machine has cores it stops spinning between parallel regions, in every team. Each
// region of every step then waits for a worker woken from a futex. Measured on a 2-core machine,
// the 784-1024-1024-10 MLP at batch 256 with the training program compiled on the CLI's main
// thread: the step's OpenMP worker slept and woke about 4,000 times in 5 s, where the same
// program alone in a process never slept (see the README's results for the step times).
template <class Fn>
Status compileOnPassingThread(Fn&& fn) {
    Status result = Status::success();
    std::thread t([&] {
        try {
            result = fn();
        } catch (const std::exception& e) {
            result = err(std::string("compiling the training program: ") + e.what());
        }
    });
    t.join();
    return result;
}

}  // namespace

// The training input of a run: the pipeline, the steps of an epoch, and the next batch when a
// helper of the device forms it during the step. A pipeline forming its batches inline
// (AUTOTUNE: the step holds every core) has the next step's batch formed by a helper thread of
// the device that would otherwise wait (HostThreads::startAside): off the step's critical path, on
// a core no other thread competes for. The batches are the same; the current one stays valid while
// the next is formed (Pipeline::next).
struct TrainInput {
    std::unique_ptr<Pipeline> pipe;
    int64_t steps = 0;      // steps of an epoch
    int64_t remainder = 0;  // samples of a short last batch (0: none)
    bool dropTail = false;  // that batch is skipped: it cannot give each replica a sample
    bool formsAside = false;
    std::optional<Result<const Batch*>> next;  // formed aside during the last step

    static void formNext(void* self) {
        auto* in = static_cast<TrainInput*>(self);
        try {
            in->next.emplace(in->pipe->next());
        } catch (const std::exception& e) {
            in->next.emplace(err(std::string("input pipeline: ") + e.what()));
        }
    }
    // The batch of this step: formed during the last one, or now.
    Result<const Batch*> take() {
        Result<const Batch*> got = next ? std::move(*next) : pipe->next();
        next.reset();
        return got;
    }
};

// ---- the step -----------------------------------------------------------------------------------

// One training step over the global batch `b`, on every replica at once: each takes its rows of
// the batch and runs its program (forward, loss and metric sums, backward, the all-reduce of the
// gradients bucket by bucket, the optimizer update), then the replicas' moving statistics are
// averaged. Nothing is read back: the log point (telemetry.cpp) reads the sums.
Status Trainer::Impl::trainStep(FitState& st, const Batch& b, int64_t sampleOrigin,
                                double inputWait) {
    const auto t0 = Clock::now();
    StepArgs args;
    args.step = st.globalStep + 1;
    args.update = optimizer->nextStep();
    Status stepped = forEachReplica([&](Replica& r) -> Status {
        const auto r0 = Clock::now();
        const auto [begin, end] = sliceOf(r.global, b.size);
        TD_ASSIGN_OR_RETURN(Program * p,
                            program(r, GraphMode::Train, end - begin, globalRows(b.size)));
        TD_RETURN_IF_ERROR(uploadSlice(r, *p, b, begin, end));
        const auto r1 = Clock::now();
        StepArgs mine = args;
        mine.sampleBase = sampleOrigin + b.firstIndex + begin;
        mine.refreshShadows = r.weightsDirty;
        r.weightsDirty = false;
        const double reduceBefore = r.timed ? r.timed->seconds : 0;
        TD_RETURN_IF_ERROR(p->exe->run(mine));
        const double reduce = r.timed ? r.timed->seconds - reduceBefore : 0;
        r.timing.inputWait += inputWait + std::chrono::duration<double>(r1 - r0).count();
        r.timing.compute += secondsSince(r1) - reduce;
        r.timing.allReduce += reduce;
        r.timing.samples += end - begin;
        return Status::success();
    });
    TD_RETURN_IF_ERROR(stepped);
    TD_RETURN_IF_ERROR(syncMovingStats());
    ++st.globalStep;
    ++st.step;
    st.batchRows = b.size;
    st.seen += globalRows(b.size);
    st.seenSinceLog += globalRows(b.size);
    st.logWait += inputWait;
    st.epochWait += inputWait;
    st.logCompute += secondsSince(t0);
    return Status::success();
}

// A paused run waits here; the pause counts as neither epoch nor throughput time.
Status Trainer::Impl::waitWhilePaused(FitState& st) {
    std::unique_lock<std::mutex> lk(control->mu);
    if (!control->paused) return Status::success();
    const auto p0 = Clock::now();
    control->cv.wait(
        lk, [&] { return !control->paused || control->stopRequested || control->aborted; });
    const auto paused = Clock::now() - p0;
    st.logT0 += paused;
    st.epochT0 += paused;
    return Status::success();
}

// An abort (the store failed) or an interruption (the MPI launcher's SIGTERM) ends the run.
Status Trainer::Impl::checkAbort() {
    if (control->aborted) return err(control->abortMessage());
    if (!s.interrupted) return Status::success();
    if (std::string why = s.interrupted(); !why.empty()) {
        abortGroup(why);
        if (s.workers) s.workers->abort(why);
        return err("worker rank " + std::to_string(workerRank) + ": " + why);
    }
    return Status::success();
}

// ---- the fit loop -------------------------------------------------------------------------------

Result<RunFinished> Trainer::Impl::fit() {
    const TrainConfig& tc = s.project.training;
    TD_ASSIGN_OR_RETURN(TrainInput in, openTrainInput());
    std::vector<std::unique_ptr<FitObserver>> observers;
    observers.push_back(makeCallbackObserver(*this));
    observers.push_back(makeTelemetryObserver(*this));
    observers.push_back(makeCheckpointObserver(*this));
    auto notify = [&](auto hook, auto&... args) -> Status {
        for (auto& o : observers) TD_RETURN_IF_ERROR(((*o).*hook)(args...));
        return Status::success();
    };

    FitState st;
    st.steps = in.steps;
    st.globalStep = static_cast<int64_t>(tc.initialEpoch) * in.steps;
    int firstEpoch = tc.initialEpoch;
    if (resume) {
        st.globalStep = resume->globalStep;
        st.lastEpoch = resume->lastEpochMetrics;
        firstEpoch = resume->epoch;
    }
    if (!deviceSumNote.empty()) log(LogLine::Level::Info, deviceSumNote);
    TD_RETURN_IF_ERROR(notify(&FitObserver::trainBegin, st));
    if (resume) TD_RETURN_IF_ERROR(checkResumePoint(in.steps));
    // With workers, a stop request acts at log points only, where every worker learns of it
    // (telemetry.cpp), so that all stop after the same step.
    const bool stopBetweenSteps = s.workers == nullptr;
    HostThreads* aside = replicas.size() == 1 ? replicas[0]->device->hostThreads() : nullptr;

    for (int epoch = firstEpoch; epoch < tc.epochs && !st.stopNow; ++epoch) {
        TD_RETURN_IF_ERROR(beginEpoch(st, in, epoch));
        const bool formAside = in.formsAside && in.pipe->stats().formingInline;
        // Samples of the epoch's batches, keyed by (epoch, worker) for dropout's masks.
        const int64_t origin =
            shardOff()
                ? (static_cast<int64_t>(epoch) * workerCount + workerRank) * s.trainSet.size()
                : static_cast<int64_t>(epoch) * s.trainSet.size();
        while (st.step < st.steps) {
            if (stopBetweenSteps && control->stopRequested) {
                st.stopNow = true;
                TD_RETURN_IF_ERROR(notify(&FitObserver::stopBeforeStep, st));
                break;
            }
            TD_RETURN_IF_ERROR(waitWhilePaused(st));
            TD_RETURN_IF_ERROR(checkAbort());
            const auto t0 = Clock::now();
            TD_ASSIGN_OR_RETURN(const Batch* b, in.take());
            if (!b) break;
            const double wait = secondsSince(t0);
            const bool asideStarted = formAside && aside && st.step + 1 < st.steps &&
                                      aside->startAside(&TrainInput::formNext, &in);
            Status stepped = trainStep(st, *b, origin, wait);
            if (asideStarted) aside->finishAside();
            TD_RETURN_IF_ERROR(std::move(stepped));
            fault.atStep(workerRank, st.globalStep);
            TD_RETURN_IF_ERROR(notify(&FitObserver::afterStep, st));
            if (st.stopNow) break;
        }
        // The skipped short batch still leaves the pipeline, which completes a cache it fills.
        if (in.dropTail && !st.stopNow) TD_RETURN_IF_ERROR(statusOf(in.pipe->next()));
        if (st.seen == 0) break;
        TD_ASSIGN_OR_RETURN(EpochMetrics em, endEpoch(st, in));
        if (st.status != RunStatus::Stopped && st.stopNow) {
            st.status = RunStatus::Stopped;
            st.message = "stopped by request";
        }
        TD_RETURN_IF_ERROR(notify(&FitObserver::afterEpoch, st, em));
        if (st.ctl.stopTraining && st.status == RunStatus::Completed) {
            st.status = RunStatus::Stopped;
            st.message = st.ctl.stopReason.empty() ? "stopped by a callback" : st.ctl.stopReason;
            break;
        }
    }
    if ((st.stopNow || control->stopRequested) && st.status == RunStatus::Completed) {
        st.status = RunStatus::Stopped;
        st.message = "stopped by request";
    }
    TD_RETURN_IF_ERROR(notify(&FitObserver::trainEnd, st));
    if (control->aborted) return err(control->abortMessage());
    resume.reset();
    RunFinished fin;
    fin.status = st.status;
    fin.message = st.message;
    fin.finalMetrics = st.lastEpoch;
    return fin;
}

// The pipeline of the training set (this worker's share, its seed), the steps of an epoch, and
// every program an epoch needs, compiled before the loop on each replica's thread.
Result<TrainInput> Trainer::Impl::openTrainInput() {
    const TrainConfig& tc = s.project.training;
    prepareThreadFor(*replicas[0]->device, replicas[0]->workerThreads);
    const int64_t batch = pipeBatch();
    const uint64_t seed =
        shardOff() ? tc.seed + 1000003ull * static_cast<uint64_t>(workerRank) : tc.seed;
    // The cores the replicas' steps keep busy: a CPU device's threads (its OpenMP team, or the
    // step's thread and its WorkShare helpers), one host thread per GPU.
    PipelineOptions options;
    for (const auto& r : replicas) {
        const DeviceDesc& d = r->device->desc();
        options.consumerThreads += d.kind == DeviceKind::Cpu ? d.threads : 1;
    }
    HostThreads* host = replicas[0]->device->hostThreads();
    options.formsAside = replicas.size() == 1 && host && host->runsAside();
    TrainInput in;
    in.formsAside = options.formsAside;
    TD_ASSIGN_OR_RETURN(
        in.pipe, Pipeline::create(s.trainSet, s.project.data.pipeline, batch, true, seed, options));
    for (const std::string& m : in.pipe->messages()) log(LogLine::Level::Warning, m);
    const int64_t pipeSteps = in.pipe->batchesPerEpoch();
    if (pipeSteps == 0)
        return err("the training data has " + std::to_string(s.trainSet.size()) +
                   " samples: not one batch of " + std::to_string(globalBatch()) +
                   (s.project.data.pipeline.dropRemainder ? " with drop_remainder" : ""));
    const bool dropRemainder = s.project.data.pipeline.dropRemainder;
    in.remainder = dropRemainder ? 0 : s.trainSet.size() % batch;
    const int64_t replicasPerBatch =
        shardOff() ? static_cast<int64_t>(replicas.size()) : totalReplicas;
    in.dropTail = in.remainder != 0 && in.remainder < replicasPerBatch;
    in.steps = in.dropTail ? pipeSteps - 1 : pipeSteps;
    if (in.dropTail)
        log(LogLine::Level::Warning, "the last batch of each epoch (" +
                                         std::to_string(in.remainder) +
                                         " samples) is skipped: it cannot give each of the " +
                                         std::to_string(totalReplicas) + " replicas a sample");
    Status compiled = forEachReplica([&](Replica& r) -> Status {
        prepareThreadFor(*r.device, r.workerThreads);
        auto [b0, b1] = sliceOf(r.global, batch);
        TD_RETURN_IF_ERROR(statusOf(program(r, GraphMode::Train, b1 - b0, globalRows(batch))));
        if (in.remainder && !in.dropTail) {
            auto [t0, t1] = sliceOf(r.global, in.remainder);
            TD_RETURN_IF_ERROR(
                statusOf(program(r, GraphMode::Train, t1 - t0, globalRows(in.remainder))));
        }
        return Status::success();
    });
    TD_RETURN_IF_ERROR(compiled);
    return in;
}

Status Trainer::Impl::checkResumePoint(int64_t steps) {
    if (resume->stepInEpoch > steps)
        return err(resume->path + ": the checkpoint is at step " +
                   std::to_string(resume->stepInEpoch) + " of epoch " +
                   std::to_string(resume->epoch + 1) + ", which has " + std::to_string(steps) +
                   " steps in this run");
    log(LogLine::Level::Info, "resuming from " + resume->path + " at global step " +
                                  std::to_string(resume->globalStep) + " (epoch " +
                                  std::to_string(resume->epoch + 1) + ", step " +
                                  std::to_string(resume->stepInEpoch) + ")");
    return Status::success();
}

// An epoch's start: the pipeline's order for it, the sums at zero, the clocks. A resumed run's
// first epoch continues where its checkpoint is: the pipeline's batches are keyed by (seed,
// epoch), so the ones already trained are formed again and passed over, and the sums go on from
// the saved ones.
Status Trainer::Impl::beginEpoch(FitState& st, TrainInput& in, int epoch) {
    TD_RETURN_IF_ERROR(in.pipe->beginEpoch(epoch));
    in.next.reset();
    TD_RETURN_IF_ERROR(zeroAccumulators(true));
    st.epoch = epoch;
    st.step = 0;
    st.seen = st.seenBefore = st.seenSinceLog = 0;
    st.logWait = st.logCompute = 0;
    st.epochWait = 0;
    st.sums.clear();
    st.epochT0 = st.logT0 = Clock::now();
    if (!resume || epoch != resume->epoch || resume->stepInEpoch == 0) return Status::success();
    for (int64_t k = 0; k < resume->stepInEpoch; ++k) {
        TD_ASSIGN_OR_RETURN(const Batch* skipped, in.pipe->next());
        if (!skipped)
            return err(resume->path + ": the pipeline ended after " + std::to_string(k) +
                       " batches of epoch " + std::to_string(epoch + 1) +
                       ", the checkpoint is at step " + std::to_string(resume->stepInEpoch));
    }
    for (size_t i = 0; i < replicas.size(); ++i) {
        const auto& a = resume->accumulators[i];
        TD_RETURN_IF_ERROR(replicas[i]->device->copyToDevice(replicas[i]->trainAccum, 0, a.data(),
                                                             a.size() * sizeof(double)));
    }
    st.seen = st.seenBefore = resume->epochSamples;
    st.step = resume->stepInEpoch;
    return Status::success();
}

// An epoch's end: its metrics from the sums (read again when steps went unread since the last
// log point: a stop between log points, or a run resumed at its epoch's last step), validation,
// and the events.
Result<EpochMetrics> Trainer::Impl::endEpoch(FitState& st, TrainInput& in) {
    if (st.seenSinceLog > 0 || st.sums.empty()) {
        TD_ASSIGN_OR_RETURN(st.sums, readAccumulators(true));
    }
    EpochMetrics em;
    em.epoch = st.epoch;
    em.metrics["loss"] = st.sums[0] / static_cast<double>(st.seen);
    for (size_t m = 0; m < s.metrics.size(); ++m)
        em.metrics[s.metrics[m].key] = st.sums[1 + m] / static_cast<double>(st.seen);
    // A resumed epoch's time is this process's part of it, and so are its samples.
    em.seconds = secondsSince(st.epochT0);
    em.samplesPerSecond = static_cast<double>(st.seen - st.seenBefore) / std::max(1e-9, em.seconds);
    em.resumedSamples = st.seenBefore;
    em.learningRate = optimizer->currentLearningRate();
    em.inputWaitSeconds = st.epochWait;
    if (s.valSet && !st.stopNow) {
        TD_ASSIGN_OR_RETURN(EvalResult vr, evaluate(*s.valSet));
        for (const auto& [k, val] : vr.metrics) em.metrics["val_" + k] = val;
    }
    // Did training wait for data? Steady waits only: the start of a prefetching pipeline (its
    // first batches of the epoch) is not a bound, nor a wait of milliseconds in a short epoch;
    // without prefetch every batch forms while the step waits. Input-bound, the epoch carries the
    // change that would help, a warning says it, and the pipeline's line is for everyone;
    // otherwise that line is a detail (the store, the app's log, --verbose).
    const PipelineStats ps = in.pipe->stats();
    const double share = em.inputWaitSeconds / std::max(1e-9, em.seconds);
    const bool steady = ps.prefetchDepth == 0 || ps.formingInline ||
                        ps.consumerWaits >= std::max<int64_t>(2, st.step / 10);
    const bool bound =
        share >= kInputBoundShare && em.inputWaitSeconds >= kInputBoundMinSeconds && steady;
    if (bound) {
        const Dataset& d = s.trainSet;
        const double cacheBytes =
            static_cast<double>(d.size()) * static_cast<double>(d.sampleValues()) * 4.0 +
            static_cast<double>(d.y.size()) * 4.0;
        em.inputBoundAdvice = inputBoundAdvice(ps, s.project.data.pipeline, cacheBytes);
    }
    bus->publish(em);
    bus->publish(LogLine{LogLine::Level::Info,
                         "epoch " + std::to_string(st.epoch + 1) + ": " + describePipeline(ps),
                         /*detail=*/!bound});
    if (bound) {
        char pct[16];
        std::snprintf(pct, sizeof pct, "%.0f%%", 100.0 * share);
        bus->publish(LogLine{LogLine::Level::Warning,
                             "epoch " + std::to_string(st.epoch + 1) + " was input-bound: " + pct +
                                 " of the step loop's time waited for data; " +
                                 em.inputBoundAdvice});
    }
    st.lastEpoch = em.metrics;
    return em;
}

// ---- evaluation and prediction (first replica) --------------------------------------------------

Result<EvalResult> Trainer::Impl::evaluate(const Dataset& d) {
    Replica& r = *replicas[0];
    prepareThreadFor(*r.device, r.workerThreads);
    PipelineConfig pc = s.project.data.pipeline;
    pc.shuffleBuffer = 0;
    if (pc.cache.rfind("file:", 0) == 0) pc.cache = "memory";
    TD_ASSIGN_OR_RETURN(auto pipe, Pipeline::create(d, pc, globalBatch(), false, 0));
    TD_RETURN_IF_ERROR(pipe->beginEpoch(0));
    TD_RETURN_IF_ERROR(r.device->fillZero(r.evalAccum, 0, r.evalAccum.bytes));
    int64_t seen = 0;
    while (true) {
        TD_ASSIGN_OR_RETURN(const Batch* b, pipe->next());
        if (!b) break;
        TD_ASSIGN_OR_RETURN(Program * p, program(r, GraphMode::Eval, b->size, b->size));
        TD_RETURN_IF_ERROR(uploadSlice(r, *p, *b, 0, b->size));
        TD_RETURN_IF_ERROR(p->exe->run(StepArgs{}));
        seen += b->size;
    }
    EvalResult out;
    out.samples = seen;
    if (seen == 0) return out;
    std::vector<double> v(static_cast<size_t>(accumCount()));
    TD_RETURN_IF_ERROR(r.device->synchronize());
    TD_RETURN_IF_ERROR(r.device->copyToHost(v.data(), r.evalAccum, 0, v.size() * sizeof(double)));
    out.metrics["loss"] = v[0] / static_cast<double>(seen);
    for (size_t m = 0; m < s.metrics.size(); ++m)
        out.metrics[s.metrics[m].key] = v[1 + m] / static_cast<double>(seen);
    return out;
}

// ---- Trainer ------------------------------------------------------------------------------------

// ---- Trainer ------------------------------------------------------------------------------------

Trainer::Trainer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Trainer::~Trainer() = default;

Result<std::unique_ptr<Trainer>> Trainer::create(TrainerSetup setup, EventBus& bus,
                                                 RunControl& control) {
    auto im = std::make_unique<Impl>();
    im->s = std::move(setup);
    im->bus = &bus;
    im->control = &control;
    if (!im->s.openDevice)
        im->s.openDevice = [](const std::string& id,
                              int threads) -> Result<std::unique_ptr<Device>> {
            if (id.rfind("cpu", 0) == 0 && threads > 0) return makeCpuDevice(threads);
            return openDevice(id);
        };
    for (const auto& cb : im->s.callbacks)
        im->wantBatchLoss = im->wantBatchLoss || cb->wantsBatchLogs();
    TD_ASSIGN_OR_RETURN(im->optimizer, Optimizer::create(im->s.project.training.optimizer));
    TD_RETURN_IF_ERROR(im->openReplicas());
    // The parameters come from the full-batch training graph; every replica compiles its
    // training program now, on its own thread, so model errors surface before a run starts.
    Impl& m = *im;
    const int64_t perReplica = m.globalBatch() / m.totalReplicas;
    TD_ASSIGN_OR_RETURN(Graph g, m.buildPlanned(GraphMode::Train, perReplica, m.globalBatch()));
    TD_RETURN_IF_ERROR(m.initParams(g));
    // The first replica's compile runs on a thread that ends here, not on the caller's, which
    // lives on (the app's or the CLI's main thread) while another thread trains: see
    // compileOnPassingThread.
    TD_RETURN_IF_ERROR(compileOnPassingThread([&] {
        return m.forEachReplica([&](Impl::Replica& r) -> Status {
            prepareThreadFor(*r.device, r.workerThreads);
            auto [b0, b1] = m.sliceOf(r.global, m.pipeBatch());
            return statusOf(m.program(r, GraphMode::Train, b1 - b0, m.globalBatch()));
        });
    }));
    return std::unique_ptr<Trainer>(new Trainer(std::move(im)));
}

Result<RunFinished> Trainer::fit() {
    return impl_->fit();
}

void Trainer::setCheckpointing(CheckpointPlan plan) {
    impl_->ckpt = std::move(plan);
}

Status Trainer::restore(const std::string& path, const CheckpointState& state) {
    return impl_->restore(path, state);
}

Result<EvalResult> Trainer::evaluate(const Dataset& d) {
    return impl_->evaluate(d);
}

Result<std::map<std::string, Tensor>> Trainer::parameters() {
    Impl::Replica& r = *impl_->replicas[0];
    TD_RETURN_IF_ERROR(r.device->synchronize());
    std::map<std::string, Tensor> out;
    for (size_t i = 0; i < r.params.size(); ++i) {
        Tensor t(DType::F32, impl_->paramShapes[i]);
        TD_RETURN_IF_ERROR(r.device->copyToHost(t.raw(), r.params[i], 0, t.bytes()));
        out.emplace(impl_->paramNames[i], std::move(t));
    }
    return out;
}

Result<Tensor> Trainer::predict(const Tensor& xIn) {
    Impl& im = *impl_;
    Impl::Replica& r = *im.replicas[0];
    const ModelInfo& info = im.s.info;
    if (xIn.rank() < 1 || numElements(info.inputShape) * xIn.dim(0) != xIn.size())
        return err("predict: expected samples of shape " + shapeToString(info.inputShape) +
                   ", got " + shapeToString(xIn.shape()));
    Dataset d;
    d.x = xIn;
    d.y = Tensor(DType::I32, {xIn.dim(0)});
    PipelineConfig pc = im.s.project.data.pipeline;
    pc.shuffleBuffer = 0;
    pc.cache = "none";
    std::vector<MapStep> featureSteps;
    for (const MapStep& m : pc.map)
        if (m.op != "one_hot" && m.op != "cache") featureSteps.push_back(m);
    pc.map = featureSteps;
    TD_ASSIGN_OR_RETURN(auto pipe, Pipeline::create(d, pc, im.globalBatch(), false, 0));
    TD_RETURN_IF_ERROR(pipe->beginEpoch(0));
    prepareThreadFor(*r.device, r.workerThreads);
    Shape outShape{xIn.dim(0)};
    outShape.insert(outShape.end(), info.outputShape.begin(), info.outputShape.end());
    Tensor out(DType::F32, outShape);
    const int64_t row = numElements(info.outputShape);
    int64_t done = 0;
    while (true) {
        TD_ASSIGN_OR_RETURN(const Batch* b, pipe->next());
        if (!b) break;
        TD_ASSIGN_OR_RETURN(Program * p, im.program(r, GraphMode::Predict, b->size, b->size));
        TD_RETURN_IF_ERROR(im.uploadSlice(r, *p, *b, 0, b->size));
        TD_RETURN_IF_ERROR(p->exe->run(StepArgs{}));
        Buffer pb{const_cast<void*>(p->exe->valuePtr(p->predId)),
                  static_cast<size_t>(b->size * row) * 4};
        TD_RETURN_IF_ERROR(r.device->synchronize());
        TD_RETURN_IF_ERROR(r.device->copyToHost(out.data<float>() + done * row, pb, 0, pb.bytes));
        done += b->size;
    }
    return out;
}

std::vector<std::string> Trainer::replicaDevices() const {
    std::vector<std::string> out;
    const auto& reps = impl_->replicas;
    const int local = static_cast<int>(reps.size());
    for (int w = 0; w < impl_->workerCount; ++w)
        for (int i = 0; i < local; ++i) {
            const std::string id = reps[static_cast<size_t>(i)]->device->desc().id;
            if (impl_->totalReplicas == 1) {
                out.push_back(id);
            } else if (impl_->workerCount == 1) {
                out.push_back(id + "/replica " + std::to_string(i));
            } else {
                out.push_back("worker " + std::to_string(w) + " " + id + "/replica " +
                              std::to_string(w * local + i));
            }
        }
    return out;
}

int Trainer::replicas() const {
    return impl_->totalReplicas;
}
int Trainer::localReplicas() const {
    return static_cast<int>(impl_->replicas.size());
}
int Trainer::workerRank() const {
    return impl_->workerRank;
}

int64_t Trainer::deviceBytes() const {
    return impl_->deviceBytes();
}

bool Trainer::halfConvolutions() const {
    return impl_->halfConvolutions();
}

Result<std::string> Trainer::loweredTrainProgram() const {
    const Impl& im = *impl_;
    const Impl::Replica& r = *im.replicas[0];
    const auto [b0, b1] = im.sliceOf(r.global, im.pipeBatch());
    auto it = r.programs.find({static_cast<int>(GraphMode::Train), b1 - b0});
    if (it == r.programs.end()) return err("internal: the training program was not compiled");
    LowerOptions lo;
    lo.accumulate = true;
    if (im.totalReplicas > 1) {
        lo.buckets = im.gradPlan.buckets;
        lo.gradOffsets = im.gradPlan.offsets;
    }
    lo.update = &im.updateSpec;
    TD_ASSIGN_OR_RETURN(LoweredProgram lp, lower(it->second->graph, lo));
    return "# replica 0 of " + std::to_string(im.totalReplicas) + ", " + std::to_string(b1 - b0) +
           " of " + std::to_string(im.globalBatch()) + " samples per step\n" + printProgram(lp);
}

int64_t Trainer::allReduceBytesPerStep() const {
    return impl_->totalReplicas > 1 ? impl_->gradPlan.elements * 4 : 0;
}

int64_t Trainer::stepsPerEpoch(int64_t samples) const {
    const Impl& im = *impl_;
    const int64_t b = im.pipeBatch();
    const int64_t rem = samples % b;
    const int64_t perBatch =
        im.shardOff() ? static_cast<int64_t>(im.replicas.size()) : im.totalReplicas;
    const bool tail = rem != 0 && !im.s.project.data.pipeline.dropRemainder && rem >= perBatch;
    return samples / b + (tail ? 1 : 0);
}

int64_t Trainer::pipelineBatch() const {
    return impl_->pipeBatch();
}

int Trainer::gradientBuckets() const {
    return impl_->totalReplicas > 1 ? static_cast<int>(impl_->gradPlan.buckets.size()) : 0;
}

}  // namespace td

// The trainer's inside, shared by its files (not a public header):
//   trainer.cpp         the step and the fit loop, evaluation, prediction, Trainer's methods
//   replicas.cpp        the strategy's replicas: devices, threads, collectives, slices, sums
//   programs.cpp        parameters, the compiled programs of each replica, batch uploads
//   fit_callbacks.cpp   the observer that runs the Keras callbacks
//   telemetry.cpp       the observer that reads back and publishes at log points
//   fit_checkpoints.cpp the observer that writes checkpoints; restore and capture
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include "engine/distribute/collectives.h"
#include "engine/distribute/replica_group.h"
#include "engine/train/checkpoint.h"
#include "engine/train/optimizer.h"
#include "engine/train/trainer.h"

namespace td {

using Clock = std::chrono::steady_clock;
inline double secondsSince(Clock::time_point t0) {
    return std::chrono::duration<double>(Clock::now() - t0).count();
}

// A compiled program for one (mode, per-replica batch) with its own input and label buffers.
struct Program {
    GraphMode mode = GraphMode::Train;
    int64_t batch = 0;
    Graph graph;
    std::unique_ptr<Executable> exe;
    Buffer input, label;
    int lossId = -1;
    int predId = -1;
};

// Time and samples of one replica since the last log point.
struct ReplicaTiming {
    double compute = 0, allReduce = 0, inputWait = 0;
    int64_t samples = 0;
};

// The collectives a replica's program calls, timed: the wait is the replica's all-reduce time.
class TimedCollectives final : public Collectives {
  public:
    explicit TimedCollectives(Collectives& inner) : inner_(inner) {}
    int size() const override { return inner_.size(); }
    int rank() const override { return inner_.rank(); }
    Status allReduceStart(int bucket, float* data, int64_t count) override {
        const auto t0 = Clock::now();
        Status s = inner_.allReduceStart(bucket, data, count);
        seconds += secondsSince(t0);
        return s;
    }
    Status allReduceWait(int bucket) override {
        const auto t0 = Clock::now();
        Status s = inner_.allReduceWait(bucket);
        seconds += secondsSince(t0);
        return s;
    }
    bool reducesDeviceMemory() const override { return inner_.reducesDeviceMemory(); }
    Status deviceSumsUsable() override { return inner_.deviceSumsUsable(); }
    bool capturable() const override { return inner_.capturable(); }
    Status allReduceHost(double* v, int64_t n) override { return inner_.allReduceHost(v, n); }
    Status allGatherHost(const double* v, int64_t n, double* out) override {
        return inner_.allGatherHost(v, n, out);
    }
    Status barrier() override { return inner_.barrier(); }
    void abort(const std::string& reason) override { inner_.abort(reason); }

    double seconds = 0;  // in start + wait since the last reset

  private:
    Collectives& inner_;
};

// Test hook: TRAINDECK_FAULT_WORKER="kill:RANK:STEP" or "hang:RANK:STEP" makes worker RANK
// kill itself (SIGKILL) or stop answering for good after global step STEP: how the multi-worker
// tests make a worker die or hang at a known moment.
struct WorkerFault {
    enum class Kind { None, Kill, Hang } kind = Kind::None;
    int rank = -1;
    int64_t step = -1;

    static WorkerFault fromEnv();
    void atStep(int workerRank, int64_t gstep) const;
};

struct TrainInput;  // the training pipeline of a fit (trainer.cpp)

// Where the fit loop is, what it has measured since the last log point, and how the run is to
// end: what the loop hands its observers.
struct FitState {
    int epoch = 0;
    int64_t steps = 0;       // steps of an epoch
    int64_t step = 0;        // steps done in this epoch
    int64_t globalStep = 0;  // steps done in the run
    int64_t batchRows = 0;   // rows of the last batch of this worker's pipeline
    int64_t seen = 0;        // samples of this epoch so far, over all workers
    int64_t seenBefore = 0;  // of those, the ones trained before a resume
    int64_t seenSinceLog = 0;
    double logWait = 0, logCompute = 0;  // input wait and step time since the last log point
    double epochWait = 0;                // input wait of this epoch
    Clock::time_point epochT0, logT0;
    std::vector<double> sums;  // the epoch's loss and metric sums, as last read
    MetricMap lastLogged;      // the latest step metrics
    MetricMap lastEpoch;       // the latest epoch's metrics
    bool stopNow = false;      // the run ends after this step
    RunStatus status = RunStatus::Completed;
    std::string message;
    TrainControl ctl;  // what callbacks see and set
};

// What the fit loop calls after its own work, in the order given: the callbacks, the log point
// (telemetry), the checkpoints. Each hook may end the run with an error.
class FitObserver {
  public:
    virtual ~FitObserver() = default;
    // Before the first step (a resumed run: after the trainer's state was restored).
    virtual Status trainBegin(FitState&) { return Status::success(); }
    // After each step.
    virtual Status afterStep(FitState&) { return Status::success(); }
    // A stop request seen before the next step: the run ends after st.step.
    virtual Status stopBeforeStep(FitState&) { return Status::success(); }
    // After an epoch's metrics (validation included) were published.
    virtual Status afterEpoch(FitState&, const EpochMetrics&) { return Status::success(); }
    virtual Status trainEnd(FitState&) { return Status::success(); }
};

struct Trainer::Impl {
    // One replica: a device, its copy of the parameters, gradients and optimizer slots, its
    // programs, and (except replica 0, which runs on the engine thread) a thread.
    struct Replica {
        int local = 0;   // index in this process
        int global = 0;  // index over all workers
        std::string label;
        std::unique_ptr<Device> device;
        int workerThreads = 1;
        std::vector<Buffer> params;  // owned, Graph::params() order
        Buffer flatGrads;            // owned
        std::vector<Buffer> gradViews;
        std::vector<Buffer> slots;  // owned
        Buffer trainAccum, evalAccum;
        // Mixed precision: the 16-bit shadows of the parameters (Graph::params() order; empty
        // where none) and the loss-scale state (mixed_float16), owned.
        std::vector<Buffer> shadows;
        Buffer lossScale;
        // The parameters were written from the host since the last training step: the step
        // refreshes the shadows first.
        bool weightsDirty = true;
        // Pinned host staging for devices that are not host-addressable, double-buffered: the
        // stream marker after the last copy out of each, and which one the next upload fills.
        Buffer staging[2];
        int64_t stagingEvent[2] = {0, 0};
        int stagingNext = 0;
        std::map<std::pair<int, int64_t>, std::unique_ptr<Program>> programs;
        // GPU replicas of one process: NCCL for the gradient buckets (deviceCollectives in
        // backend.h), host reductions through the replica group; null: the group alone.
        std::unique_ptr<Collectives> deviceCollectives;
        std::unique_ptr<TimedCollectives> timed;
        ReplicaTiming timing;
        // The replica's thread (local > 0) and its work: the engine thread sets `job`, then bumps
        // `posted`; the replica runs it, sets `jobResult`, then sets `finished` to that number.
        std::thread thread;
        std::mutex mu;
        std::condition_variable cv;
        Status (*job)(void* fn, Replica& r) = nullptr;  // calls the engine's callable `jobFn`
        void* jobFn = nullptr;
        std::atomic<uint64_t> posted{0}, finished{0};
        std::atomic<bool> quit{false};
        Status jobResult = Status::success();
    };

    TrainerSetup s;
    EventBus* bus = nullptr;
    RunControl* control = nullptr;
    std::vector<std::unique_ptr<Replica>> replicas;  // local replicas
    std::unique_ptr<ReplicaGroup> group;             // null with one replica in all
    int workerRank = 0, workerCount = 1;
    std::string deviceSumNote;  // how GPU replicas sum when not with NCCL, and why
    int totalReplicas = 1;
    std::unique_ptr<Optimizer> optimizer;
    UpdateSpec updateSpec;
    GradientPlan gradPlan;
    std::vector<size_t> trainableIndex;  // Graph::params() indices of the trainable parameters
    // BatchNormalization's moving statistics (Graph::params() indices): updated by the training
    // step itself, averaged over the replicas after it (syncMovingStats).
    std::vector<size_t> movingIndex;
    std::vector<Shape> paramShapes;
    std::vector<std::string> paramNames;  // "dense/kernel", in Graph::params() order
    bool wantBatchLoss = false;
    // Checkpoints: the writers, their best value and files, and where a resumed run continues.
    CheckpointPlan ckpt;
    struct WriterRuntime {
        std::optional<double> best;
        std::vector<std::string> kept;  // oldest first
        int64_t lastStep = -1;          // global step of its last file
        bool warned = false;
    };
    std::vector<WriterRuntime> writerRuntime;
    struct ResumePoint {
        std::string path;
        int epoch = 0;
        int64_t stepInEpoch = 0, globalStep = 0, epochSamples = 0;
        std::vector<std::vector<double>> accumulators;
        MetricMap lastEpochMetrics;
        std::vector<CallbackState> callbacks;
        std::vector<CheckpointWriterState> writers;
    };
    std::optional<ResumePoint> resume;
    // mixed_float16: the loss scale of the checkpoint a run resumes from, the start value of
    // the replicas' loss-scale buffers; and the skipped steps already reported.
    std::optional<LossScaleState> restoredLossScale;
    int64_t skippedSeen = 0;
    // With workers, before a mid-epoch checkpoint: every worker's local sums, rank-major
    // (gatherSums).
    std::vector<std::vector<double>> gatheredSums;
    WorkerFault fault = WorkerFault::fromEnv();

    ~Impl();

    int64_t globalBatch() const { return s.project.training.batchSize; }
    int64_t accumCount() const { return 1 + static_cast<int64_t>(s.metrics.size()); }
    void log(LogLine::Level lvl, const std::string& text) { bus->publish(LogLine{lvl, text}); }

    // ---- replicas.cpp: the strategy's replicas --------------------------------------------------
    Status resolveStrategy(std::vector<std::string>& localDevices, int& threadsEach);
    Status openReplicas();
    // Breaks the replica group (and the GPUs' NCCL communicators): every replica's collectives
    // fail from now.
    void abortGroup(const std::string& why);
    void replicaLoop(Replica* r);
    // Waits until pred() holds: spinning first (the replicas run on their own cores, and at
    // small steps a wake-up through the kernel costs more than the wait), then on the replica's
    // condition variable. Whoever makes pred() true calls wake() afterwards.
    template <typename Pred>
    static void await(Replica& r, Pred pred) {
        const auto t0 = Clock::now();
        for (int i = 0; !pred(); ++i) {
            if ((i & 63) == 63 && Clock::now() - t0 > std::chrono::microseconds(50)) {
                std::unique_lock<std::mutex> lk(r.mu);
                r.cv.wait(lk, pred);
                return;
            }
#if defined(__x86_64__)
            __builtin_ia32_pause();
#endif
        }
    }
    static void wake(Replica& r) {
        { std::lock_guard<std::mutex> lk(r.mu); }  // a waiter is either before its check or asleep
        r.cv.notify_all();
    }
    // Runs fn(replica) on every local replica at once (replica 0 on this thread) and waits for
    // all; the first failure's own error is returned. No allocation in the step loop: the
    // replicas call `fn` through a plain function pointer and its address.
    template <typename Fn>
    Status forEachReplica(Fn&& fn) {
        if (replicas.size() == 1) return fn(*replicas[0]);
        using F = std::remove_reference_t<Fn>;
        for (size_t i = 1; i < replicas.size(); ++i) {
            Replica& r = *replicas[i];
            r.job = [](void* f, Replica& rep) -> Status { return (*static_cast<F*>(f))(rep); };
            r.jobFn = const_cast<void*>(static_cast<const void*>(&fn));
            r.posted.fetch_add(1, std::memory_order_release);
            wake(r);
        }
        Status first = fn(*replicas[0]);
        if (!first.ok()) abortGroup(first.error());
        for (size_t i = 1; i < replicas.size(); ++i) {
            Replica& r = *replicas[i];
            const uint64_t want = r.posted.load(std::memory_order_relaxed);
            await(r, [&] { return r.finished.load(std::memory_order_acquire) == want; });
            if (first.ok() && !r.jobResult.ok()) first = r.jobResult;
        }
        return first;
    }
    // MultiWorkerMirrored with shard_policy "off": every worker reads everything in its own
    // order, with a batch of global batch / workers.
    bool shardOff() const {
        return s.workers && s.project.strategy.shardPolicy == "off";
    }
    // Samples of a batch from this worker's pipeline over all workers.
    int64_t globalRows(int64_t rows) const {
        return shardOff() ? rows * workerCount : rows;
    }
    // The batch this worker's pipeline forms.
    int64_t pipeBatch() const {
        return shardOff() ? globalBatch() / workerCount : globalBatch();
    }
    // Rows [begin, end) of a batch of `rows` from this worker's pipeline that global replica g
    // takes.
    std::pair<int64_t, int64_t> sliceOf(int global, int64_t rows) const;
    // The sums in every local replica's accumulators (and, with workers, every worker's), after
    // the devices finished what was enqueued: the one host read of a log point. `extra` rides
    // along in the last element (a stop request, summed over the workers).
    Result<std::vector<double>> readAccumulators(bool train, double extra = 0);
    Result<std::vector<std::vector<double>>> localSums();
    Status gatherSums();
    Status zeroAccumulators(bool train);
    Status syncMovingStats();
    std::vector<Tensor> weights();
    void setWeights(const std::vector<Tensor>& w);

    // ---- programs.cpp: parameters, programs, batches
    // ---------------------------------------------
    Result<Graph> buildPlanned(GraphMode mode, int64_t batch, int64_t global) const;
    bool halfConvolutions() const;  // BuildOptions::halfConv of this run's programs
    Status initParams(const Graph& g);
    Result<Program*> program(Replica& r, GraphMode mode, int64_t batch, int64_t global);
    Status bindShadows(Replica& r, const Graph& g, ProgramBindings& bind);
    Status uploadSlice(Replica& r, Program& p, const Batch& b, int64_t begin, int64_t end);

    // ---- trainer.cpp: the step and the loop -----------------------------------------------------
    Status trainStep(FitState& st, const Batch& b, int64_t sampleOrigin, double inputWait);
    Status waitWhilePaused(FitState& st);
    Status checkAbort();
    Result<RunFinished> fit();
    Result<TrainInput> openTrainInput();
    Status checkResumePoint(int64_t steps);
    Status beginEpoch(FitState& st, TrainInput& in, int epoch);
    Result<EpochMetrics> endEpoch(FitState& st, TrainInput& in);
    Result<EvalResult> evaluate(const Dataset& d);

    // ---- telemetry.cpp --------------------------------------------------------------------------
    Result<std::vector<ReplicaStats>> replicaStats(double wall);
    Result<std::optional<LossScaleState>> readLossScale();
    int64_t deviceBytes() const;

    // ---- fit_checkpoints.cpp --------------------------------------------------------------------
    Status restore(const std::string& path, const CheckpointState& st);
    // Everything but the writers' state, at this moment of the loop: `epoch`/`stepInEpoch` say
    // where the run continues, `seen` the samples of that epoch so far.
    Result<CheckpointState> captureState(int epoch, int64_t stepInEpoch, int64_t gstep,
                                         int64_t seen, const MetricMap& lastEpoch);
    // Writer w's checkpoint now (when due: keep-best compares `monitored` first). Publishes
    // CheckpointSaved; an error (a full disk) ends the run.
    Status saveCheckpoint(size_t w, int epoch, int64_t stepInEpoch, int64_t gstep, int64_t seen,
                          const MetricMap& lastEpoch, const MetricMap& monitored);
    // BackupAndRestore: a completed run's backups are deleted.
    void dropCompletedBackups();
};

// The fit loop's observers, in the order it calls them.
std::unique_ptr<FitObserver> makeCallbackObserver(Trainer::Impl& im);
std::unique_ptr<FitObserver> makeTelemetryObserver(Trainer::Impl& im);
std::unique_ptr<FitObserver> makeCheckpointObserver(Trainer::Impl& im);

}  // namespace td

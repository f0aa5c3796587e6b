// Typed events the trainer publishes, and the bus that delivers them. Subscribers (CLI progress
// bar, GUI charts, the SQLite recorder) each own a queue and drain it on their own thread, so
// none of them can stall the step loop: publish() only locks each queue briefly and never waits
// for a consumer.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <variant>
#include <vector>

namespace td {

using MetricMap = std::map<std::string, double>;  // "loss", "accuracy", "val_loss", ...

struct RunStarted {
    int64_t runId = 0;  // id in the run store (0 when no store)
    std::string runName;
    std::vector<std::string> devices;  // one entry per replica, e.g. "cpu:0"
    int initialEpoch = 0;
    int epochs = 0;  // total epochs requested (final epoch index + 1)
    int64_t stepsPerEpoch = 0;
    int64_t batchSize = 0;  // global batch size
    int64_t trainSamples = 0;
    int64_t validationSamples = 0;
    int64_t params = 0;
    std::string strategy = "one_device";  // "one_device", "mirrored", "multi_worker_mirrored"
    int workers = 1;                      // processes (MultiWorkerMirrored)
    // Gradient all-reduce per step (0 with one replica): bytes each replica contributes, and the
    // buckets they are sent in.
    int64_t allReduceBytesPerStep = 0;
    int gradientBuckets = 0;
};

// One replica's share of a log interval (the time since the previous StepMetrics).
struct ReplicaStats {
    int replica = 0;              // global replica index (0 = the chief's first replica)
    int worker = 0;               // process rank (0 without MultiWorkerMirrored)
    std::string device;           // "cpu:0", "cuda:1"
    double samplesPerSecond = 0;  // this replica's own samples (its slice of each global batch)
    double computeSeconds = 0;    // forward, backward and update
    double allReduceSeconds = 0;  // waiting for the gradient all-reduce
    double inputWaitSeconds = 0;  // waiting for its batch slice (pipeline and upload)
};

struct StepMetrics {
    int epoch = 0;           // 0-based
    int64_t step = 0;        // 1-based step within the epoch
    int64_t globalStep = 0;  // 1-based step since the start of training
    MetricMap metrics;       // running means over the epoch so far: loss, accuracy, ...
    double learningRate = 0;
    double lossScale = 0;         // 0 when loss scaling is off
    int64_t skippedSteps = 0;     // loss scaling: steps skipped so far (non-finite gradients)
    double inputWaitSeconds = 0;  // time the step loop waited for the pipeline, since last event
    double computeSeconds = 0;    // time spent in forward/backward/update, since last event
    double samplesPerSecond = 0;  // global throughput since the last event
    std::vector<ReplicaStats> replicas;  // one entry per replica of the whole strategy
};

// Loss and metrics over a dataset (evaluate, validation at epoch ends).
struct EvalResult {
    MetricMap metrics;  // loss, accuracy, ...
    int64_t samples = 0;
};

struct EpochMetrics {
    int epoch = 0;
    MetricMap metrics;  // train metrics plus val_* when validation ran
    // A resumed epoch: seconds and samplesPerSecond cover only the part after the resume, and
    // resumedSamples counts the samples trained before it (0 for a whole epoch).
    double seconds = 0;
    double samplesPerSecond = 0;
    int64_t resumedSamples = 0;
    double learningRate = 0;
    // The step loop's time waiting for batches this epoch (input-bound when a large share of
    // `seconds`: kInputBoundShare, engine/data/pipeline.h).
    double inputWaitSeconds = 0;
    // For an input-bound epoch, the change that would help (inputBoundAdvice); empty otherwise.
    std::string inputBoundAdvice;
};

struct DeviceStats {
    std::string device;      // "cpu:0"
    double utilization = 0;  // 0..1, compute time / wall time since last sample
    int64_t memoryBytes = 0;
    double samplesPerSecond = 0;
    // What the GPU itself reports (NVML, deviceTelemetry in engine/backend/telemetry.h) for CUDA
    // replicas where the driver's NVML is present; -1: unknown (CPUs, no NVML).
    int64_t memoryUsedBytes = -1;   // device memory in use (every process on the GPU)
    int64_t memoryTotalBytes = -1;  // the GPU's memory
    double gpuUtilization = -1;     // 0..1: time a kernel ran over NVML's last sample period
};

struct LogLine {
    enum class Level { Info, Warning, Error } level = Level::Info;
    std::string text;
    // A figure for those who tune the engine (how the input pipeline ran each epoch): stored with
    // the run and shown in the app's log; the CLI prints it with --verbose only.
    bool detail = false;
};

enum class RunStatus { Running, Completed, Stopped, Failed, Interrupted };
const char* runStatusName(RunStatus s);  // "running", "completed", ...

struct RunFinished {
    RunStatus status = RunStatus::Completed;
    std::string message;     // error text for Failed, reason for early stop
    MetricMap finalMetrics;  // last epoch's metrics plus test_* when a test set was evaluated
    double seconds = 0;
    // Set when the run store failed (it could not be opened, or rows could not be written): the
    // stored run is incomplete or missing, and status is Failed. Names the database and the error.
    std::string storeError;
};

// A checkpoint file was written (engine/train/checkpoint.h). The run store registers it after the
// rows of the steps before it, then forgets and deletes the files it supersedes (keep-best,
// keep-last-K): a registered checkpoint always has its steps stored, and a run killed at any
// moment keeps a registered, existing checkpoint to resume from.
struct CheckpointSaved {
    std::string path;  // empty: no new file, only `superseded` to forget and delete
    std::string kind;  // "run", "model_checkpoint", "backup"
    int64_t globalStep = 0;
    int epoch = 0;            // the epoch to continue
    int64_t stepInEpoch = 0;  // its steps done
    std::optional<double> monitorValue;
    int64_t bytes = 0;
    std::vector<std::string> superseded;  // files this one replaces: forget, then delete them
};

using Event = std::variant<RunStarted, StepMetrics, EpochMetrics, DeviceStats, LogLine, RunFinished,
                           CheckpointSaved>;

// One subscriber's queue. Thread-safe.
class EventQueue {
  public:
    void push(Event e);
    // Non-blocking: everything queued so far.
    std::vector<Event> drain();
    // Blocks until an event arrives, the queue is closed, or the timeout passes.
    std::optional<Event> pop(std::chrono::milliseconds timeout);
    // For a consumer that takes events in batches on its own schedule (the CLI's progress, the
    // run recorder): blocks until an event that starts or ends a run arrives, kBatchWake events
    // are queued, the queue is closed, or the timeout passes; then returns everything queued, in
    // order. The routine events (steps, epochs, devices, log lines, checkpoints) wake no one below
    // kBatchWake, so a run publishing two events every log_every_steps does not put a woken
    // thread on a core of the step's every few hundred microseconds; and a short fast run still
    // wakes its recorder every kBatchWake events (a store that fails mid-run stops it early).
    static constexpr size_t kBatchWake = 256;
    std::vector<Event> waitBatch(std::chrono::milliseconds timeout);
    void close();
    bool closed() const;

  private:
    mutable std::mutex mu_;
    std::condition_variable cv_;
    std::deque<Event> q_;
    bool closed_ = false;
    int popWaiters_ = 0;  // threads in pop(): woken by every event
    bool edge_ = false;   // a RunStarted or RunFinished is queued (wakes waitBatch)
};

class EventBus {
  public:
    // Subscribe before the run starts to see every event.
    std::shared_ptr<EventQueue> subscribe();
    // The queue gets no further events (it is not closed).
    void unsubscribe(const std::shared_ptr<EventQueue>& queue);
    void publish(const Event& e);
    // Closes every queue (after RunFinished).
    void closeAll();

  private:
    std::mutex mu_;
    std::vector<std::shared_ptr<EventQueue>> subs_;
};

}  // namespace td

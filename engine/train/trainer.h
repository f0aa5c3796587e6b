// The trainer: a strategy's replicas, their compiled programs, and the Keras-style fit loop.
//
// A strategy is a set of replicas, one device each, plus collectives (engine/distribute):
// OneDevice is one replica on the engine thread; Mirrored is N local replicas (GPUs, or N
// logical CPU replicas with a share of the cores each) on their own threads; MultiWorkerMirrored
// adds the processes of an MPI launch. Every replica holds the same parameters, runs the same
// program on its slice of the global batch, and the program sums the gradients across replicas
// (bucket by bucket, as backward produces them) before it applies the same update everywhere.
// Loss and metric sums stay on the devices; the loop reads them only at log points and epoch ends.
#pragma once

#include <atomic>
#include <condition_variable>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "engine/backend/backend.h"
#include "engine/core/events.h"
#include "engine/data/pipeline.h"
#include "engine/graph/builder.h"
#include "engine/graph/passes.h"
#include "engine/io/project.h"
#include "engine/train/callbacks.h"

namespace td {

class Collectives;
struct CheckpointState;

// One writer of checkpoint files (engine/train/checkpoint.h): the run's own (every epoch's end
// and a stop), a ModelCheckpoint or a BackupAndRestore callback. Files are named
// <directory>/<prefix>-<global step>.tdckpt.
struct CheckpointWriter {
    std::string id;    // "run", "training.callbacks[2] (model_checkpoint)": names it in messages
    std::string kind;  // "run", "model_checkpoint", "backup"
    std::string directory;
    std::string prefix;
    int64_t everySteps = 0;  // 0: at each epoch's end
    bool atStop = false;     // also when a stop request ends the run between epoch ends
    bool saveBestOnly = false;
    std::string monitor = "val_loss";
    std::string mode = "auto";
    int keepLast = 1;                  // without saveBestOnly: the newest files kept
    bool deleteWhenCompleted = false;  // BackupAndRestore: its files go when the run completes
};

struct CheckpointPlan {
    std::vector<CheckpointWriter> writers;
    int64_t runId = 0;
    std::string projectJson;  // stored in every checkpoint
    // The identity every checkpoint carries (CheckpointState): the store's id (empty without one)
    // and modelFingerprint(projectJson).
    std::string storeId;
    uint64_t modelFingerprint = 0;
    // true: the run store registers each file and deletes the ones it supersedes once the new
    // one is registered (CheckpointSaved); false (no store): the trainer deletes them at once.
    bool storeDeletes = false;
};

// The threads a replica's step runs on, of a device with `deviceThreads`: steps under 512 MFLOP
// on one thread, larger ones on all (train/replicas.cpp says why). `batch` is the replica's.
int chooseWorkerThreads(const ModelInfo& info, int64_t batch, int deviceThreads);

// What the compiler is asked for by a project: the compute dtype of its precision policy, the
// passes it turns off (`disabled_passes`, and every fusing pass with `fusion: false`), and
// parameter shadows for training programs.
CompileOptions compileOptions(const Project& project, bool train);

// The graph builder's options for a project's programs of one mode, as the trainer builds them:
// the project's batch size (the trainer sets its per-replica batch), loss, metrics, seed, the
// compute dtype and softmax-cross-entropy fusion of compileOptions, and predictions only for
// Predict (training and evaluation programs never read them).
BuildOptions buildOptions(const Project& project, GraphMode mode);

// Stop, pause and abort requests from other threads (the GUI, the store recorder). The loop acts
// on them between steps.
struct RunControl {
    std::atomic<bool> stopRequested{false};
    std::mutex mu;
    std::condition_variable cv;
    bool paused = false;  // guarded by mu
    // Set (once) by abortRun: the loop ends the run as failed with this reason.
    std::atomic<bool> aborted{false};
    std::string abortReason;  // guarded by mu

    void requestStop();
    void setPaused(bool p);
    bool isPaused();
    void abortRun(const std::string& reason);
    std::string abortMessage();
};

using DeviceOpener =
    std::function<Result<std::unique_ptr<Device>>(const std::string& id, int threads)>;

struct TrainerSetup {
    Project project;  // with the session's overrides applied
    ModelInfo info;
    LabelSpec labelSpec;
    std::vector<MetricSpec> metrics;
    Dataset trainSet;
    std::optional<Dataset> valSet;
    std::vector<std::shared_ptr<Callback>> callbacks;
    std::vector<std::string> callbackNames;  // for errors: "training.callbacks[0] (early_stopping)"
    // Opens a replica's device with `threads` kernel threads (0 = all); default openDevice.
    DeviceOpener openDevice;
    // MultiWorkerMirrored: the process group (one member per process); null otherwise.
    Collectives* workers = nullptr;
    // Checked between steps: a non-empty answer ends the run as failed with that reason (the
    // MPI launcher's SIGTERM, for instance).
    std::function<std::string()> interrupted;
    // Gradient bucket size for the all-reduce (bytes).
    size_t bucketBytes = size_t{4} << 20;
    // Start values of parameters by name ("dense/kernel"), f32 of the parameter's shape, used
    // instead of the initializer (the project's initial_weights); others are initialized.
    std::map<std::string, Tensor> initialParams;
};

class Trainer {
  public:
    // Opens the strategy's devices, builds the parameters and compiles the training program.
    // Errors name the field ("strategy.replicas: ...", "training.batch_size: ...").
    static Result<std::unique_ptr<Trainer>> create(TrainerSetup setup, EventBus& bus,
                                                   RunControl& control);
    ~Trainer();

    // The fit loop. Publishes StepMetrics, DeviceStats, EpochMetrics and LogLines (not RunStarted
    // or RunFinished, which belong to the caller). Returns the outcome, or the error that ended it.
    Result<RunFinished> fit();
    // Checkpoints the next fit() writes. With MultiWorkerMirrored only the chief writes; with
    // several local replicas the parameters and slots are replica 0's (all replicas hold the same).
    void setCheckpointing(CheckpointPlan plan);
    // Makes the next fit() continue from `state` (read from `path`): parameters and optimizer
    // slots on every replica, the optimizer's iterations and learning-rate override, the position
    // (epoch, step, global step; the pipeline skips the batches already trained), the epoch's
    // running sums, callbacks' and checkpoint writers' state. Errors name the file and what does
    // not fit this run (parameters, slots, replicas, callbacks, a position past the run's end).
    Status restore(const std::string& path, const CheckpointState& state);
    // Evaluation and prediction on the first replica's device.
    Result<EvalResult> evaluate(const Dataset& d);
    Result<Tensor> predict(const Tensor& x);
    // The first replica's parameters by name ("dense/kernel"), copied to the host.
    Result<std::map<std::string, Tensor>> parameters();

    // "cpu:0" once per replica of the whole strategy (every worker's), in replica order.
    std::vector<std::string> replicaDevices() const;
    int replicas() const;  // over all workers
    int localReplicas() const;
    int workerRank() const;  // 0 without MultiWorkerMirrored
    bool isChief() const { return workerRank() == 0; }
    // Device memory the run holds on the first replica: parameters, gradients, optimizer slots,
    // program arenas, batch buffers.
    int64_t deviceBytes() const;
    // The first replica's full-batch training program, lowered, as text (printProgram).
    Result<std::string> loweredTrainProgram() const;
    // Whether this run's programs compute convolutions in the 16-bit dtype of mixed precision
    // (BuildOptions::halfConv: the device runs them so).
    bool halfConvolutions() const;
    // The gradient all-reduce of one step: bytes per replica and buckets (0 with one replica).
    int64_t allReduceBytesPerStep() const;
    int gradientBuckets() const;
    // The batch this process's pipeline forms: the global batch, or global / workers with the
    // "off" shard policy.
    int64_t pipelineBatch() const;
    // Steps of an epoch over `samples` training samples (a short last batch that cannot give
    // every replica a sample is skipped).
    int64_t stepsPerEpoch(int64_t samples) const;
    struct Impl;

  private:
    explicit Trainer(std::unique_ptr<Impl> impl);
    std::unique_ptr<Impl> impl_;
};

}  // namespace td

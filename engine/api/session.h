// The engine's public face: project -> compiled model -> fit / evaluate / predict, with an event
// stream. The CLI and the GUI use only this header (plus the plain structs it includes).
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "engine/core/events.h"
#include "engine/core/result.h"
#include "engine/io/project.h"

namespace td {

struct DeviceInfo {
    std::string id;    // "cpu:0", "cuda:1"
    std::string kind;  // "cpu", "cuda"
    std::string name;  // "Intel(R) Xeon(R) ... (2 threads)", "NVIDIA H200"
    int64_t memoryBytes = 0;
    // GPUs only (empty / -1 for the CPU):
    std::string computeCapability;  // "9.0"
    int64_t memoryFreeBytes = -1;   // free device memory when listed
    std::string driverVersion;      // CUDA version the driver supports, "13.0"
    std::string runtimeVersion;     // CUDA runtime of this build, "13.0"
};

// Every device the engine can use on this machine (CPU always; CUDA devices when the CUDA backend
// is built and a driver reports GPUs).
std::vector<DeviceInfo> listDevices();

// Whether an option can run on this machine; when not, why (for disabled UI controls).
struct Capability {
    bool available = true;
    std::string reason;
};
// On this machine's CPU. mixed_bfloat16 needs AMX-BF16 or AVX512-BF16 there (else emulation).
Capability precisionCapability(PrecisionPolicy p);
// On the devices a strategy names ("cpu:0", "cuda:1", ...; empty: the CPU): when every one is a
// GPU, mixed_bfloat16 needs compute capability 8.0 or later on each (cuBLASLt's bf16 products),
// whatever the CPU has; otherwise as on the CPU. A GPU that is not there is left to the strategy's
// own check, which names it.
Capability precisionCapability(PrecisionPolicy p, const std::vector<std::string>& devices);
// Whether a GPU of this machine runs mixed_bfloat16 (compute capability 8.0 or later).
bool bf16GpuPresent();
// What a precision policy does on this machine that a user should know (emulation, conversions);
// a run logs them at its start.
std::vector<std::string> precisionNotes(PrecisionPolicy p);
Capability strategyCapability(const std::string& strategyType);

class Callback;
class Device;
struct CheckpointState;

// Where a resumed run continues (findResumePoint): the checkpoint chosen, the project it was
// trained with, and the checkpoints refused on the way (newest first, with the reason).
struct ResumePoint {
    std::string checkpointPath;
    int64_t runId = 0;  // the stored run whose rows continue; 0: a new run
    Project project;
    std::vector<std::string> notes;  // "run-40.tdckpt: ... checksum mismatch ...; using ..."
    std::shared_ptr<const CheckpointState> state;
    // Where the checkpoint is (state's position, for a front end): the global step trained and
    // the epoch to continue.
    int64_t globalStep = 0;
    int epoch = 0;
};

// The last good checkpoint of stored run `runIdOrName` (an id, or the newest run with that name):
// the store's checkpoints of the run, newest first; one that is missing, damaged (magic, size,
// checksum) or does not fit its project is refused and the previous one is tried. Errors name the
// run and the store, and why no checkpoint can be used.
Result<ResumePoint> findResumePoint(const std::string& storePath, const std::string& runIdOrName);

struct SessionOptions {
    std::string storePath;  // SQLite run store; empty = do not record
    std::string runName;    // empty = project name + timestamp
    std::optional<int> epochs;
    std::optional<int64_t> batchSize;
    std::optional<uint64_t> seed;
    // Run after the project's callbacks, as Keras' fit(callbacks=...). A callback that throws ends
    // the run as failed with its message.
    std::vector<std::shared_ptr<Callback>> callbacks;
    // Opens each replica's device ("cpu:0", "cuda:1") with a number of kernel threads (0 = all)
    // instead of the default; tests pass a device that counts its host reads.
    std::function<Result<std::unique_ptr<Device>>(const std::string& id, int threads)> openDevice;
    // Continue a run from a checkpoint (findResumePoint): create() restores it, fit() goes on
    // from its step, in the stored run it names. The project passed to create() should be the
    // resume point's (epochs may be raised to train longer).
    std::optional<ResumePoint> resume;
    // Start values of parameters by name ("dense/kernel"), instead of the project's
    // initial_weights (prediction from a model file: engine/api/export.h).
    std::map<std::string, Tensor> initialParams;
};

class Session {
  public:
    // Loads data, validates and compiles the model. Errors name the field, layer or file.
    static Result<std::unique_ptr<Session>> create(const Project& project,
                                                   const SessionOptions& options);
    ~Session();  // requests stop and joins the engine thread

    const Project& project() const;
    EventBus& events();
    int64_t runId() const;  // 0 until fit starts, or without a store
    // MultiWorkerMirrored: this process's rank (0 = the chief, which alone writes the store and
    // reports progress); 0 otherwise.
    int workerRank() const;

    // Blocking fit on the calling thread. Whatever fails (store, data, a callback, an exception),
    // fit publishes exactly one RunFinished as the last event and then closes every subscriber's
    // queue; the returned Status is an error when that RunFinished says Failed.
    Status fit();
    // fit() on a background engine thread.
    void start();
    void join();
    bool running() const;

    // Cooperative control, safe from any thread; acts between steps.
    void requestStop();
    void pause();
    void resume();
    bool paused() const;

    Result<EvalResult> evaluateTest();
    // Class probabilities (or outputs) for x (f32 or u8 [N, ...], u8 goes through the map steps).
    Result<Tensor> predict(const Tensor& x);
    // The parameters by name ("dense/kernel": the layer's name and Keras' variable name), as
    // they are now (after fit: the trained weights). Refused while a run is in progress.
    Result<std::map<std::string, Tensor>> parameters();

    // Textual IR after a pass ("build", "autodiff", "fusion", "dce", "memory", "final").
    Result<std::string> dumpIr(const std::string& afterPass);

    struct Impl;

  private:
    explicit Session(std::unique_ptr<Impl> impl);
    std::unique_ptr<Impl> impl_;
};

}  // namespace td

// The device contract: what a device is and how it runs a lowered Program. Callers ask a device
// what it supports (supportsOp) instead of #ifdef-ing on backends. One implementation per folder:
// cpu/ (oneDNN + the project's own vectorised kernels, the reference every other backend is
// tested against) and cuda/ (built when the CUDA toolkit is found).
//
// Collectives in device memory (device_collectives.h) and device telemetry (telemetry.h) are
// interfaces of their own.
//
// Threading: a Device and its Executables are used from one engine thread at a time.
// Asynchrony: run() enqueues work on the device's stream; synchronize() is the explicit host
// sync point. The CPU device executes synchronously (its stream is the calling thread).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "engine/core/result.h"
#include "engine/graph/ir.h"
#include "engine/graph/lower.h"
#include "engine/graph/update_spec.h"

namespace td {

enum class DeviceKind { Cpu, Cuda };

struct DeviceDesc {
    DeviceKind kind = DeviceKind::Cpu;
    int index = 0;
    std::string id;           // "cpu:0", "cuda:0"
    std::string name;         // human-readable model name
    int64_t memoryBytes = 0;  // total device memory (host RAM for the CPU)
    int threads = 1;          // CPU: worker threads used by kernels
    // GPUs only (empty / -1 where not known or not applicable):
    std::string computeCapability;  // "9.0" (major.minor)
    int64_t memoryFreeBytes = -1;   // free device memory when enumerated
    std::string driverVersion;      // CUDA version the driver supports, "13.0"
    std::string runtimeVersion;     // CUDA runtime the engine was built with, "13.0"
    // The GPU's UUID (32 hex digits): the same physical GPU in every process, however
    // CUDA_VISIBLE_DEVICES numbers it.
    std::string uuid;
};

// A device allocation. Owned by the device that made it; release with Device::release.
struct Buffer {
    void* ptr = nullptr;
    size_t bytes = 0;
};

// Per-step values a Program reads (keyed randomness, batch bookkeeping, the optimizer's
// per-step scalars). Computed on the host without reading anything back from the device.
struct StepArgs {
    int64_t step = 0;        // global optimizer step (dropout mask key)
    int64_t sampleBase = 0;  // global index of row 0 of this replica's batch slice
    UpdateScalars update;    // this step's learning rate and bias corrections (train programs)
    // Mixed precision: the parameters were written outside the program since its last run (set-up,
    // restored weights), so the casts into their 16-bit shadows run again before use. Otherwise
    // the previous step's update has written the shadows.
    bool refreshShadows = false;
};

class Collectives;  // engine/distribute/collectives.h

// Where a Program finds the values that live outside its arena. Every Buffer here may be a view
// into a larger allocation (ptr + offset); only the owner releases it.
struct ProgramBindings {
    Buffer input;                // features [B, ...] f32
    Buffer label;                // labels
    std::vector<Buffer> params;  // in Graph::params() order
    std::vector<Buffer> grads;   // in Graph::params() order: views into one flat gradient buffer
                                 // (empty Buffer for a frozen parameter)
    // Running sums the program adds into on every run (never overwrites), f64: [0] the loss summed
    // over the global batch's samples (loss output x global batch), [1 + m] metric m's correct
    // count (LoweredProgram::accumulators names them). The trainer zeroes it at an epoch's start
    // and reads it at log points only. Empty: no accumulation.
    Buffer accumulators;
    // Train programs of a replica group: the gradients are summed across replicas in these
    // buckets (ranges of the flat gradient buffer, planGradients in graph/lower.h) through
    // `collectives`; null = one replica. An error of a collective fails run() with its message.
    Collectives* collectives = nullptr;
    std::vector<GradBucket> buckets;
    Buffer flatGrads;  // the flat gradient buffer the buckets index (and `grads` view)
    // Train programs: the optimizer update that ends the step (null: no update, e.g. a test that
    // checks gradients); read when the program is compiled. Trainable parameters (frozen ones
    // excepted) need a grads entry even when the loss does not depend on them. `optimizerSlots`
    // holds spec->slotsPerParam() zero-initialised buffers per trainable parameter,
    // parameter-major, in Graph::params() order of the trainable ones (the optimizer's slot
    // order: SGD momentum; Adam m, v[, vhat]; RMSprop velocity[, momentum][, average_gradient]).
    // Every buffer here is named after its field in compile errors ("optimizerSlots[3]: ...").
    const UpdateSpec* update = nullptr;
    std::vector<Buffer> optimizerSlots;
    // Mixed precision with fold_casts: per Graph::params() entry, the 16-bit copy of that
    // parameter the program's products read and its update writes (empty Buffer: none).
    std::vector<Buffer> shadows;
    // mixed_float16: the LossScaleState (graph/update_spec.h) the loss gradient and the update read
    // and write; kept across runs by its owner. Empty: no loss scaling.
    Buffer lossScale;
    // Compile option: one multi-tensor update pass (the fuse_update fusion) or one per parameter.
    bool fuseUpdate = true;
};

// What one of a device's own passes (the CPU's: backend/cpu/cpu_passes.h) did when it compiled a
// program. The names are those a project's "disabled_passes" turns off (cpuPassNames, passes.h).
struct BackendPassRecord {
    std::string name;
    std::string what;       // one line
    bool disabled = false;  // turned off by name
    int64_t changed = 0;    // the places it applied (0: nothing here for it)
};

class Executable {
  public:
    virtual ~Executable() = default;
    // Enqueues one execution of the program on the device's stream: forward, loss, backward,
    // the all-reduce of the gradient buckets, the accumulators, the optimizer update.
    virtual Status run(const StepArgs& args) = 0;
    // Host-addressable devices: the next runs read the batch features and labels at these
    // addresses (which must stay valid and unchanged until those runs finished) instead of the
    // bound input and label buffers, so a batch needs no copy. Null keeps a binding as it is.
    // False: the device cannot; copy into the bound buffers.
    virtual bool rebindBatch(const void* input, const void* label) {
        (void)input;
        (void)label;
        return false;
    }
    // Device address of a value of the graph (outputs: loss, metrics, predictions).
    virtual const void* valuePtr(int nodeId) const = 0;
    virtual size_t arenaBytes() const = 0;
    // The device's own passes over this program, in the order they act (empty: a device
    // without such passes).
    virtual std::vector<BackendPassRecord> passRecords() const { return {}; }
};

// Answer of supportsOp: yes, or no with the reason.
struct Support {
    bool ok = true;
    std::string reason;
};

class HostThreads;  // backend/host_threads.h

// A device: memory, copies, a stream with events, compile(program) to an Executable, and which
// ops it supports. Nothing else; collectives, telemetry and host threads are interfaces of their
// own.
class Device {
  public:
    virtual ~Device() = default;
    virtual const DeviceDesc& desc() const = 0;
    virtual Result<Buffer> allocate(size_t bytes) = 0;
    virtual void release(Buffer& b) = 0;
    // Host memory the device copies from fastest (page-locked on CUDA; aligned memory on the
    // CPU). Batches are staged here, double-buffered, so the next upload overlaps this step.
    virtual Result<Buffer> allocateHost(size_t bytes) = 0;
    virtual void releaseHost(Buffer& b) = 0;
    // Blocking copies (set-up, checkpoints, tests).
    virtual Status copyToDevice(const Buffer& dst, size_t offset, const void* src,
                                size_t bytes) = 0;
    virtual Status copyToHost(void* dst, const Buffer& src, size_t offset, size_t bytes) = 0;
    // Asynchronous copies, ordered on the device's stream with the programs it runs: they return
    // once enqueued; `src` (or `dst`) must stay untouched until synchronize() (or the next
    // synchronize after a later run). The CPU device completes them before returning.
    virtual Status copyToDeviceAsync(const Buffer& dst, size_t offset, const void* src,
                                     size_t bytes) = 0;
    virtual Status copyToHostAsync(void* dst, const Buffer& src, size_t offset, size_t bytes) = 0;
    // Sets bytes [offset, offset + bytes) of a buffer to zero, on the stream.
    virtual Status fillZero(const Buffer& dst, size_t offset, size_t bytes) = 0;
    virtual Support supportsOp(const Graph& g, const Node& n) const = 0;
    // Whether convolutions run here in `compute` (bf16 or f16) at a speed that pays for the
    // casts around them, as Keras' mixed policies run them (BuildOptions::halfConv). False: the
    // graph computes them in f32.
    virtual bool halfConvolutions(DType compute) const {
        (void)compute;
        return false;
    }
    // Compiles a lowered program (graph/lower.h) bound to buffers. Callers go through
    // compileProgram, which lowers a planned graph and checks the bindings first.
    virtual Result<std::unique_ptr<Executable>> compile(const LoweredProgram& program,
                                                        const ProgramBindings& bindings) = 0;
    // Waits until everything enqueued on the stream has finished: the explicit host sync point.
    virtual Status synchronize() = 0;
    // A marker in the stream: recordEvent() returns its number; waitEvent(n) returns once
    // everything enqueued before marker n has finished (the host may then reuse a staging buffer
    // an earlier async copy read). The CPU device's stream is the calling thread: both are free.
    virtual Result<int64_t> recordEvent() = 0;
    virtual Status waitEvent(int64_t event) = 0;
    // Host-addressable memory (CPU): buffers can be read and written directly.
    virtual bool hostAddressable() const = 0;
    // A device whose kernels run on host threads (the CPU) answers with that interface
    // (backend/host_threads.h): thread counts, weight placement, work beside a run. Null for a
    // device with processors of its own.
    virtual HostThreads* hostThreads() { return nullptr; }
};

// Lowers a planned graph (MemoryPlanPass ran) with what the bindings ask for (accumulators,
// gradient all-reduce, the optimizer update), checks every op with supportsOp and every binding
// against the sizes the program needs, and compiles it on `device`.
Result<std::unique_ptr<Executable>> compileProgram(Device& device, const Graph& planned,
                                                   const ProgramBindings& bindings);
// The checks compileProgram makes: a bound, large enough buffer for every operand the program
// reads or writes. Errors name the binding ("params[2]: 64 bytes bound, 128 needed").
Status checkBindings(const LoweredProgram& program, const ProgramBindings& bindings);

// Where an operand of a compiled program lives: its binding's (or the program's arena's) address
// plus the operand's offset; null for Space::None or an empty binding. Every device resolves its
// operands through this one mapping of the Space enum (graph/lower.h).
void* operandAddress(const ProgramBindings& bindings, void* arena, const Operand& o);

// Devices on this machine: the CPU, then CUDA devices when the CUDA backend is built and a
// driver reports GPUs (errors from the driver mean zero GPUs). For listings (CLI, GUI): reading a
// GPU's free memory makes its primary CUDA context, so this is not for hot paths or processes
// that must leave other GPUs untouched.
std::vector<DeviceDesc> enumerateDevices();
// Creates a device by id ("cpu:0", "cuda:1"). Errors name the id and what exists.
Result<std::unique_ptr<Device>> openDevice(const std::string& id);

// Backend-specific entry points (each backend's folder implements its own).
std::unique_ptr<Device> makeCpuDevice(int threads);
DeviceDesc cpuDeviceDesc();
// The CPU device's halfConvolutions: bf16 where the CPU has AVX512-BF16 or AMX-BF16 and oneDNN
// has a native (not reference) bf16 convolution for it, forward and both gradients.
bool cpuHalfConvolutions(DType compute);
std::vector<DeviceDesc> cudaDevices();  // empty without the CUDA backend or GPUs
Result<std::unique_ptr<Device>> makeCudaDevice(int index);
}  // namespace td

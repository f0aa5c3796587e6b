// The trainer. Read fitEpoch() first: it is the step, top to bottom. Everything above it sets up
// replicas (devices, parameters, programs); everything below evaluates and predicts.
#include "engine/train/trainer.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <optional>
#include <sstream>
#include <thread>
#include <type_traits>

#include "engine/distribute/collectives.h"
#include "engine/distribute/replica_group.h"
#include "engine/graph/initializers.h"
#include "engine/graph/lower.h"
#include "engine/graph/passes.h"
#include "engine/train/checkpoint.h"
#include "engine/train/optimizer.h"

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

namespace {

using Clock = std::chrono::steady_clock;
double secondsSince(Clock::time_point t0) {
    return std::chrono::duration<double>(Clock::now() - t0).count();
}

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

// Threads per step: forking a team costs a few microseconds per kernel and a barrier stalls
// whenever another process holds a core. Measured on a 2-core AVX-512 machine, the seed MLP
// trains faster on one thread at batch 32 (20 MFLOP per step) and batch 256 (156 MFLOP), breaks
// even at batch 1024 (625 MFLOP), and the 784-1024-1024-10 MLP at batch 256 (2.9 GFLOP) gains 1.5x
// from two threads. So steps under 512 MFLOP run on one thread. A step's multiply-adds: each
// weight of a layer once per output position in the forward pass (one position for Dense on a
// vector, H x W for Conv2D), and twice that backward.
int chooseWorkerThreads(const ModelInfo& info, int64_t batch, int deviceThreads) {
    double flops = 0;
    for (const LayerInfo& l : info.layers) {
        double positions = 1;
        for (size_t d = 0; d + 1 < l.outputShape.size(); ++d)
            positions *= static_cast<double>(l.outputShape[d]);
        flops += 6.0 * static_cast<double>(batch) * static_cast<double>(l.params) * positions;
    }
    return flops < 512e6 ? 1 : deviceThreads;
}

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

// A replica's work item, handed from the engine thread to the replica's thread.
struct Job {
    std::function<Status()> fn;
};

}  // namespace

// Test hook: TRAINDECK_FAULT_WORKER="kill:RANK:STEP" or "hang:RANK:STEP" makes worker RANK
// kill itself (SIGKILL) or stop answering for good after global step STEP: how the multi-worker
// tests make a worker die or hang at a known moment.
struct WorkerFault {
    enum class Kind { None, Kill, Hang } kind = Kind::None;
    int rank = -1;
    int64_t step = -1;

    static WorkerFault fromEnv() {
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

    void atStep(int workerRank, int64_t gstep) const {
        if (kind == Kind::None || workerRank != rank || gstep != step) return;
        if (kind == Kind::Kill) std::raise(SIGKILL);
        for (;;) std::this_thread::sleep_for(std::chrono::hours(1));
    }
};

CompileOptions compileOptions(const Project& project, bool train) {
    CompileOptions co;
    co.compute = project.precision == PrecisionPolicy::MixedBfloat16  ? DType::BF16
                 : project.precision == PrecisionPolicy::MixedFloat16 ? DType::F16
                                                                      : DType::F32;
    co.disabled.insert(project.disabledPasses.begin(), project.disabledPasses.end());
    if (!project.fusion) co.disabled.insert(fusionPassNames().begin(), fusionPassNames().end());
    co.paramShadows = train;
    return co;
}

BuildOptions buildOptions(const Project& project, GraphMode mode) {
    const CompileOptions co = compileOptions(project, mode == GraphMode::Train);
    BuildOptions bo;
    bo.compute = co.compute;
    bo.fuseSoftmaxXent = co.enabled("fuse_softmax_xent");
    bo.batch = project.training.batchSize;
    bo.globalBatch = project.training.batchSize;
    bo.mode = mode;
    bo.loss = project.training.loss;
    bo.metrics = project.training.metrics;
    bo.seed = project.training.seed;
    bo.predictions = mode == GraphMode::Predict;
    return bo;
}

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
    std::string deviceSumNote;  // why GPU replicas of several workers do not sum with NCCL
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
    WorkerFault fault = WorkerFault::fromEnv();

    ~Impl() {
        for (auto& r : replicas)
            if (r->thread.joinable()) {
                r->quit = true;
                wake(*r);
                r->thread.join();
            }
        for (auto& r : replicas) {
            if (!r->device) continue;
            Device& d = *r->device;
            for (auto& [key, p] : r->programs) {
                p->exe.reset();
                if (p->input.ptr) d.release(p->input);
                if (p->label.ptr) d.release(p->label);
            }
            for (Buffer& b : r->params) d.release(b);
            for (Buffer& b : r->shadows)
                if (b.ptr) d.release(b);
            if (r->lossScale.ptr) d.release(r->lossScale);
            if (r->flatGrads.ptr) d.release(r->flatGrads);
            for (Buffer& b : r->slots) d.release(b);
            (void)d.synchronize();
            for (Buffer& b : r->staging)
                if (b.ptr) d.releaseHost(b);
            if (r->trainAccum.ptr) d.release(r->trainAccum);
            if (r->evalAccum.ptr) d.release(r->evalAccum);
        }
    }

    // Breaks the replica group (and the GPUs' NCCL communicators, which would otherwise keep a
    // stream waiting for a peer that never joins): every replica's collectives fail from now.
    void abortGroup(const std::string& why) {
        if (group) group->abort(why);
        for (auto& r : replicas)
            if (r->deviceCollectives) r->deviceCollectives->abort(why);
    }

    int64_t globalBatch() const { return s.project.training.batchSize; }
    int64_t accumCount() const { return 1 + static_cast<int64_t>(s.metrics.size()); }

    // ---- replica threads ------------------------------------------------------------------

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

    void replicaLoop(Replica* r) {
        uint64_t done = 0;
        for (;;) {
            await(*r, [&] { return r->posted.load(std::memory_order_acquire) > done || r->quit; });
            if (r->quit) return;
            ++done;
            Status st = r->job(r->jobFn, *r);
            // A replica that fails breaks the group so that no other waits for it.
            if (!st.ok()) abortGroup(st.error());
            r->jobResult = std::move(st);
            r->finished.store(done, std::memory_order_release);
            wake(*r);
        }
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

    // ---- set-up -----------------------------------------------------------------------------

    Status resolveStrategy(std::vector<std::string>& localDevices, int& threadsEach) {
        const StrategyConfig& st = s.project.strategy;
        const DeviceDesc cpu = cpuDeviceDesc();
        threadsEach = 0;
        if (s.workers) {
            workerRank = s.workers->rank();
            workerCount = s.workers->size();
        }
        if (st.type == "one_device") {
            localDevices = {st.devices.empty() ? std::string("cpu:0") : st.devices[0]};
        } else {
            std::vector<std::string> gpus, cpus;
            for (const std::string& d : st.devices)
                (d.rfind("cpu", 0) == 0 ? cpus : gpus).push_back(d);
            if (!gpus.empty() && !cpus.empty())
                return err(
                    "strategy.devices: mix CPU and GPU replicas in one strategy is not "
                    "supported (got " +
                    cpus[0] + " and " + gpus[0] + ")");
            if (!gpus.empty()) {
                localDevices = gpus;
            } else {
                // N logical CPU replicas, each with its share of the cores.
                int n = st.replicas;
                if (n == 0) n = st.type == "mirrored" ? std::max(1, cpu.threads) : 1;
                // More replicas than cores is allowed (they share cores), for tests of the
                // semantics; each replica then runs its kernels on one thread.
                localDevices.assign(static_cast<size_t>(n), "cpu:0");
                threadsEach = std::max(1, cpu.threads / n);
            }
        }
        totalReplicas = static_cast<int>(localDevices.size()) * workerCount;
        if (globalBatch() % totalReplicas != 0)
            return err("training.batch_size: the global batch of " + std::to_string(globalBatch()) +
                       " does not split evenly across " + std::to_string(totalReplicas) +
                       " replicas" +
                       (workerCount > 1 ? " (" + std::to_string(workerCount) + " workers x " +
                                              std::to_string(localDevices.size()) + ")"
                                        : std::string()) +
                       "; use a multiple of " + std::to_string(totalReplicas));
        return Status::success();
    }

    Status openReplicas() {
        std::vector<std::string> ids;
        int threadsEach = 0;
        TD_RETURN_IF_ERROR(resolveStrategy(ids, threadsEach));
        const int local = static_cast<int>(ids.size());
        if (totalReplicas > 1)
            group =
                std::make_unique<ReplicaGroup>(local, s.project.strategy.timeoutSeconds, s.workers);
        for (int i = 0; i < local; ++i) {
            auto r = std::make_unique<Replica>();
            r->local = i;
            r->global = workerRank * local + i;
            auto dev = s.openDevice(ids[static_cast<size_t>(i)], threadsEach);
            if (!dev.ok()) return err("strategy.devices: " + dev.error());
            r->device = std::move(dev).value();
            r->label = ids[static_cast<size_t>(i)];
            if (totalReplicas > 1) r->label += "/replica " + std::to_string(r->global);
            const int64_t perReplica = globalBatch() / totalReplicas;
            r->workerThreads = chooseWorkerThreads(s.info, perReplica, r->device->desc().threads);
            if (group) r->timed = std::make_unique<TimedCollectives>(group->replica(i));
            replicas.push_back(std::move(r));
        }
        if (group && workerCount == 1 && local > 1) {
            // Replicas on GPUs of this process sum their gradient buckets on the GPUs (NCCL);
            // anything else (CPU replicas, no NCCL) keeps the replica group for them.
            std::vector<Device*> devices;
            std::vector<Collectives*> host;
            for (int i = 0; i < local; ++i) {
                devices.push_back(replicas[static_cast<size_t>(i)]->device.get());
                host.push_back(&group->replica(i));
            }
            auto dc = deviceCollectives(devices, host);
            if (dc.ok())
                for (int i = 0; i < local; ++i) {
                    Replica& r = *replicas[static_cast<size_t>(i)];
                    r.deviceCollectives = std::move((*dc)[static_cast<size_t>(i)]);
                    r.timed = std::make_unique<TimedCollectives>(*r.deviceCollectives);
                }
        }
        if (group && workerCount > 1) {
            // MultiWorkerMirrored with GPUs in every worker: NCCL over all of them, bootstrapped
            // through the workers' MPI group; metric sums, barriers and aborts stay on the host
            // path. Every worker takes part in the agreement, whatever its devices.
            std::vector<Device*> devices;
            std::vector<Collectives*> host;
            for (int i = 0; i < local; ++i) {
                devices.push_back(replicas[static_cast<size_t>(i)]->device.get());
                host.push_back(&group->replica(i));
            }
            TD_ASSIGN_OR_RETURN(WorkerDeviceCollectives wdc,
                                workerDeviceCollectives(devices, host, *s.workers,
                                                        s.project.strategy.timeoutSeconds));
            if (!wdc.whyNot.empty())
                deviceSumNote =
                    "gradient sums between workers go through MPI (host memory), not "
                    "NCCL: " +
                    wdc.whyNot;
            for (size_t i = 0; i < wdc.collectives.size(); ++i) {
                Replica& r = *replicas[i];
                r.deviceCollectives = std::move(wdc.collectives[i]);
                r.timed = std::make_unique<TimedCollectives>(*r.deviceCollectives);
            }
        }
        for (size_t i = 1; i < replicas.size(); ++i)
            replicas[i]->thread = std::thread([this, r = replicas[i].get()] { replicaLoop(r); });
        return Status::success();
    }

    Result<Graph> buildPlanned(GraphMode mode, int64_t batch, int64_t global) const {
        const CompileOptions co = compileOptions(s.project, mode == GraphMode::Train);
        BuildOptions bo = buildOptions(s.project, mode);
        bo.batch = batch;
        bo.globalBatch = global;
        bo.replicas = mode == GraphMode::Train ? totalReplicas : 1;
        TD_ASSIGN_OR_RETURN(Graph g, buildGraph(s.project.model, s.info, bo));
        if (mode == GraphMode::Train)
            TD_RETURN_IF_ERROR(autodiff(g, s.project.precision == PrecisionPolicy::MixedFloat16));
        PassManager pm;
        addStandardPasses(pm, co);
        TD_RETURN_IF_ERROR(pm.run(g));
        return g;
    }

    // Parameters on the host, initialized once with the project's seed, copied to every replica:
    // every replica starts from the same bits.
    Status initParams(const Graph& g) {
        std::map<std::string, const LayerSpec*> byName;
        for (const LayerSpec& L : s.project.model.layers) byName[L.name] = &L;
        std::vector<std::vector<float>> host;
        uint64_t index = 0;
        const std::vector<int> pids = g.params();
        for (size_t i = 0; i < pids.size(); ++i) {
            const Node& n = g.node(pids[i]);
            const std::string name = n.attrs.name.value_or("");
            paramShapes.push_back(n.shape);
            paramNames.push_back(name);
            if (n.attrs.trainableOr()) trainableIndex.push_back(i);
            if (name.ends_with("/moving_mean") || name.ends_with("/moving_variance"))
                movingIndex.push_back(i);
            const std::string layer = name.substr(0, name.rfind('/'));
            const std::string suffix = name.substr(name.rfind('/') + 1);
            const LayerSpec* L = byName.at(layer);
            host.emplace_back(static_cast<size_t>(numElements(n.shape)));
            const uint64_t seed = s.project.training.seed * 7919ull + 1000003ull * ++index;
            Status st =
                initializeParam(host.back().data(), n.shape, initializerFor(*L, suffix), seed);
            if (!st.ok()) return err("layer '" + layer + "': " + st.error());
            if (auto it = s.initialParams.find(name); it != s.initialParams.end()) {
                if (it->second.dtype() != DType::F32 || it->second.shape() != n.shape)
                    return err("initial_weights: '" + name + "' has shape " +
                               shapeToString(it->second.shape()) + ", expected " +
                               shapeToString(n.shape));
                std::memcpy(host.back().data(), it->second.raw(), it->second.bytes());
            }
        }
        gradPlan = planGradients(g, s.bucketBytes);
        updateSpec = optimizer->spec();
        const int slotsEach = updateSpec.slotsPerParam();
        for (auto& rp : replicas) {
            Replica& r = *rp;
            Device& d = *r.device;
            for (size_t i = 0; i < pids.size(); ++i) {
                const size_t bytes = host[i].size() * sizeof(float);
                const Shape& shape = paramShapes[i];
                const size_t rowBytes =
                    shape.size() >= 2 ? static_cast<size_t>(shape.back()) * sizeof(float) : 0;
                TD_ASSIGN_OR_RETURN(Buffer b, d.allocateWeights(bytes, rowBytes));
                r.params.push_back(b);
                TD_RETURN_IF_ERROR(d.copyToDevice(b, 0, host[i].data(), bytes));
            }
            const size_t gradBytes = static_cast<size_t>(gradPlan.elements) * sizeof(float);
            TD_ASSIGN_OR_RETURN(r.flatGrads, d.allocate(std::max<size_t>(gradBytes, 4)));
            for (size_t i = 0; i < pids.size(); ++i) {
                const int64_t off = gradPlan.offsets[i];
                if (off < 0) {
                    r.gradViews.push_back(Buffer{});
                    continue;
                }
                r.gradViews.push_back(
                    Buffer{static_cast<char*>(r.flatGrads.ptr) + off * 4,
                           static_cast<size_t>(numElements(paramShapes[i])) * sizeof(float)});
            }
            for (size_t t : trainableIndex)
                for (int k = 0; k < slotsEach; ++k) {
                    const size_t bytes =
                        static_cast<size_t>(numElements(paramShapes[t])) * sizeof(float);
                    TD_ASSIGN_OR_RETURN(Buffer b, d.allocate(bytes));
                    TD_RETURN_IF_ERROR(d.fillZero(b, 0, bytes));
                    r.slots.push_back(b);
                }
            const size_t accBytes = static_cast<size_t>(accumCount()) * sizeof(double);
            TD_ASSIGN_OR_RETURN(r.trainAccum, d.allocate(accBytes));
            TD_ASSIGN_OR_RETURN(r.evalAccum, d.allocate(accBytes));
            TD_RETURN_IF_ERROR(d.fillZero(r.trainAccum, 0, accBytes));
            TD_RETURN_IF_ERROR(d.fillZero(r.evalAccum, 0, accBytes));
        }
        return Status::success();
    }

    // The program of replica r for (mode, its batch), compiled on first use on the calling
    // thread (which must be the replica's own: the CPU device sizes its thread teams there).
    Result<Program*> program(Replica& r, GraphMode mode, int64_t batch, int64_t global) {
        auto key = std::make_pair(static_cast<int>(mode), batch);
        if (auto it = r.programs.find(key); it != r.programs.end()) return it->second.get();
        auto p = std::make_unique<Program>();
        p->mode = mode;
        p->batch = batch;
        TD_ASSIGN_OR_RETURN(p->graph, buildPlanned(mode, batch, global));
        const Graph& g = p->graph;
        if (g.params().size() != r.params.size())
            return err("internal: parameter count differs between programs");
        Device& d = *r.device;
        for (const Node& n : g.nodes) {
            const size_t bytes = static_cast<size_t>(numElements(n.shape)) * dtypeSize(n.dtype);
            if (n.op == Op::Input) {
                TD_ASSIGN_OR_RETURN(p->input, d.allocate(bytes));
            } else if (n.op == Op::Label) {
                TD_ASSIGN_OR_RETURN(p->label, d.allocate(bytes));
            }
        }
        if (!d.hostAddressable()) {
            // Both staging buffers sized for this program's slices now, not in the step loop.
            const size_t need = (p->input.bytes + 63) / 64 * 64 + p->label.bytes;
            for (Buffer& st : r.staging)
                if (st.bytes < need) {
                    if (st.ptr) {
                        TD_RETURN_IF_ERROR(d.synchronize());
                        d.releaseHost(st);
                    }
                    TD_ASSIGN_OR_RETURN(st, d.allocateHost(need));
                }
        }
        ProgramBindings bind;
        bind.input = p->input;
        bind.label = p->label.ptr ? p->label : p->input;
        bind.params = r.params;
        bind.grads = r.gradViews;
        bind.gradsRead = false;
        bind.flatGrads = r.flatGrads;
        if (mode == GraphMode::Train) {
            bind.accumulators = r.trainAccum;
            bind.update = &updateSpec;
            bind.optimizerSlots = r.slots;
            bind.fuseUpdate = compileOptions(s.project, true).enabled("fuse_update");
            TD_RETURN_IF_ERROR(bindShadows(r, g, bind));
            if (s.project.precision == PrecisionPolicy::MixedFloat16) {
                if (!r.lossScale.ptr) {
                    TD_ASSIGN_OR_RETURN(r.lossScale, d.allocate(sizeof(LossScaleState)));
                    // A resumed run goes on with its checkpoint's scale.
                    LossScaleState fresh;
                    fresh.scale = static_cast<float>(s.project.lossScaleInitial);
                    fresh.growthSteps = static_cast<int32_t>(s.project.lossScaleGrowthSteps);
                    const LossScaleState initial = restoredLossScale.value_or(fresh);
                    TD_RETURN_IF_ERROR(
                        d.copyToDevice(r.lossScale, 0, &initial, sizeof(LossScaleState)));
                }
                bind.lossScale = r.lossScale;
            }
            if (r.timed) {
                bind.collectives = r.timed.get();
                bind.buckets = gradPlan.buckets;
            }
        } else {
            bind.accumulators = r.evalAccum;
        }
        TD_ASSIGN_OR_RETURN(p->exe, compileProgram(d, g, bind));
        p->lossId = g.output("loss");
        p->predId = g.output("predictions");  // Predict programs only (-1 otherwise)
        Program* raw = p.get();
        r.programs[key] = std::move(p);
        return raw;
    }

    // The 16-bit shadows a training program's products read (fold_casts made them): allocated
    // once per replica and parameter, shared by the replica's training programs.
    Status bindShadows(Replica& r, const Graph& g, ProgramBindings& bind) {
        const std::vector<int> pids = g.params();
        r.shadows.resize(pids.size());
        for (const Node& n : g.nodes) {
            if (n.attrs.buf != BufKind::Shadow) continue;
            const auto it = std::find(pids.begin(), pids.end(), n.inputs.at(0));
            if (it == pids.end()) return err("internal: a shadow of a value that is no param");
            Buffer& b = r.shadows[static_cast<size_t>(it - pids.begin())];
            if (!b.ptr) {
                TD_ASSIGN_OR_RETURN(b, r.device->allocate(n.bytes()));
                r.weightsDirty = true;
            }
        }
        bind.shadows = r.shadows;
        return Status::success();
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
    // takes: with the "data" policy every worker holds the global batch and g indexes all
    // replicas; with "off" the worker's batch is split among its local replicas.
    std::pair<int64_t, int64_t> sliceOf(int global, int64_t rows) const {
        if (shardOff()) {
            const int64_t local = static_cast<int64_t>(replicas.size());
            const int64_t l = global % local;
            return {rows * l / local, rows * (l + 1) / local};
        }
        return {rows * global / totalReplicas, rows * (global + 1) / totalReplicas};
    }

    // Copies rows [begin, end) of a batch into a program's input and label buffers, on the
    // device's stream, checking labels against the model as it goes. A host-addressable device
    // (the CPU) copies from the batch itself. Any other goes through one of the replica's two
    // pinned staging buffers: the host fills one while the device may still be copying from
    // the other (a marker in the stream says when a buffer is free again), so the next batch is
    // staged while this step runs.
    Status uploadSlice(Replica& r, Program& p, const Batch& b, int64_t begin, int64_t end) {
        Device& d = *r.device;
        const int64_t rows = end - begin;
        if (b.x.dtype() != DType::F32) return err("internal: pipeline produced non-f32 features");
        const int64_t rowValues = b.x.size() / std::max<int64_t>(1, b.size);
        const size_t xRow = static_cast<size_t>(rowValues) * sizeof(float);
        const char* x = static_cast<const char*>(b.x.raw()) + static_cast<size_t>(begin) * xRow;
        const size_t xBytes = static_cast<size_t>(rows) * xRow;

        // The labels as the program reads them: a range of the batch, or converted values.
        const void* y = nullptr;
        size_t yBytes = 0;
        bool convertI32 = false;  // i32 0/1 labels for a single-unit output, as f32
        if (p.label.ptr) {
            const LabelSpec& ls = s.labelSpec;
            const int64_t perRow = numElements(ls.shape);
            const std::string& lossName = s.project.training.loss.name;
            if (ls.dtype == DType::I32) {
                if (b.y.dtype() != DType::I32)
                    return err("loss " + lossName +
                               " expects integer class labels, but the pipeline produced " +
                               dtypeName(b.y.dtype()) + " labels " + shapeToString(b.y.shape()) +
                               " (remove the one_hot map step, or use categorical_crossentropy)");
                const int32_t* yi = b.y.data<int32_t>() + begin;
                const int64_t units = s.info.outputShape[0];
                for (int64_t i = 0; i < rows; ++i)
                    if (yi[i] < 0 || yi[i] >= units)
                        return err("label " + std::to_string(yi[i]) + " is outside the " +
                                   std::to_string(units) + " output units of the last layer");
                y = yi;
                yBytes = static_cast<size_t>(rows) * 4;
            } else if (b.y.dtype() == DType::F32 && b.y.size() == b.size * perRow) {
                y = b.y.data<float>() + begin * perRow;
                yBytes = static_cast<size_t>(rows * perRow) * 4;
            } else if (b.y.dtype() == DType::I32 && perRow == 1) {
                y = b.y.data<int32_t>() + begin;
                yBytes = static_cast<size_t>(rows) * 4;
                convertI32 = true;
            } else {
                return err("loss " + lossName + " expects targets of shape " +
                           shapeToString(ls.shape) + " per sample, but the pipeline produced " +
                           dtypeName(b.y.dtype()) + " labels " + shapeToString(b.y.shape()) +
                           (ls.shape.size() == 1 && ls.shape[0] > 1 && b.y.dtype() == DType::I32
                                ? " (add a one_hot map step with depth " +
                                      std::to_string(ls.shape[0]) + ")"
                                : std::string()));
            }
        }
        auto convert = [&](float* dst) {
            const int32_t* yi = static_cast<const int32_t*>(y);
            for (int64_t i = 0; i < rows; ++i) dst[i] = static_cast<float>(yi[i]);
        };

        if (d.hostAddressable()) {
            if (convertI32) {
                convert(static_cast<float*>(p.label.ptr));
                y = p.label.ptr;
            }
            // The program reads the batch where it is (the batch stays valid until the next
            // pipe->next(), after this step); a device that cannot gets copies.
            if (p.exe->rebindBatch(x, y)) return Status::success();
            TD_RETURN_IF_ERROR(d.copyToDeviceAsync(p.input, 0, x, xBytes));
            if (!y || y == p.label.ptr) return Status::success();
            return d.copyToDeviceAsync(p.label, 0, y, yBytes);
        }
        const size_t yOffset = (xBytes + 63) / 64 * 64;
        const size_t need = yOffset + yBytes;
        const int slot = r.stagingNext;
        r.stagingNext ^= 1;
        Buffer& st = r.staging[slot];
        if (st.bytes < need) {
            // Sized for the largest slice when its program was compiled; this only runs then.
            if (st.ptr) {
                TD_RETURN_IF_ERROR(d.synchronize());
                d.releaseHost(st);
            }
            TD_ASSIGN_OR_RETURN(st, d.allocateHost(need));
        } else if (r.stagingEvent[slot] > 0) {
            TD_RETURN_IF_ERROR(d.waitEvent(r.stagingEvent[slot]));
        }
        char* host = static_cast<char*>(st.ptr);
        std::memcpy(host, x, xBytes);
        TD_RETURN_IF_ERROR(d.copyToDeviceAsync(p.input, 0, host, xBytes));
        if (y) {
            if (convertI32)
                convert(reinterpret_cast<float*>(host + yOffset));
            else
                std::memcpy(host + yOffset, y, yBytes);
            TD_RETURN_IF_ERROR(d.copyToDeviceAsync(p.label, 0, host + yOffset, yBytes));
        }
        TD_ASSIGN_OR_RETURN(r.stagingEvent[slot], d.recordEvent());
        return Status::success();
    }

    // The sums in every local replica's accumulators (and, with workers, every worker's), after
    // the devices finished what was enqueued: the one host read of a log point.
    Result<std::vector<double>> readAccumulators(bool train, double extra = 0) {
        std::vector<double> sums(static_cast<size_t>(accumCount()) + 1, 0.0);
        std::vector<double> v(static_cast<size_t>(accumCount()));
        for (auto& rp : replicas) {
            Device& d = *rp->device;
            TD_RETURN_IF_ERROR(d.synchronize());
            TD_RETURN_IF_ERROR(d.copyToHost(v.data(), train ? rp->trainAccum : rp->evalAccum, 0,
                                            v.size() * sizeof(double)));
            for (size_t i = 0; i < v.size(); ++i) sums[i] += v[i];
        }
        sums.back() = extra;
        if (s.workers && train)
            TD_RETURN_IF_ERROR(
                s.workers->allReduceHost(sums.data(), static_cast<int64_t>(sums.size())));
        return sums;
    }

    // Each local replica's training sums of the epoch so far (a host read).
    Result<std::vector<std::vector<double>>> localSums() {
        std::vector<std::vector<double>> out;
        for (auto& rp : replicas) {
            std::vector<double> v(static_cast<size_t>(accumCount()));
            TD_RETURN_IF_ERROR(rp->device->synchronize());
            TD_RETURN_IF_ERROR(
                rp->device->copyToHost(v.data(), rp->trainAccum, 0, v.size() * sizeof(double)));
            out.push_back(std::move(v));
        }
        return out;
    }
    // With workers, before a mid-epoch checkpoint: every worker's local sums, rank-major, in
    // gatheredSums (every worker takes part, the chief writes them). The checkpoint then holds
    // the whole epoch's sums, and each worker of a resumed run goes on from its own.
    std::vector<std::vector<double>> gatheredSums;
    Status gatherSums() {
        TD_ASSIGN_OR_RETURN(auto mine, localSums());
        const size_t n = static_cast<size_t>(accumCount());
        std::vector<double> flat;
        for (const auto& v : mine) flat.insert(flat.end(), v.begin(), v.end());
        std::vector<double> all(flat.size() * static_cast<size_t>(workerCount));
        TD_RETURN_IF_ERROR(
            s.workers->allGatherHost(flat.data(), static_cast<int64_t>(flat.size()), all.data()));
        gatheredSums.clear();
        for (size_t i = 0; i + n <= all.size(); i += n)
            gatheredSums.emplace_back(all.begin() + static_cast<std::ptrdiff_t>(i),
                                      all.begin() + static_cast<std::ptrdiff_t>(i + n));
        return Status::success();
    }

    Status zeroAccumulators(bool train) {
        for (auto& rp : replicas) {
            Buffer& a = train ? rp->trainAccum : rp->evalAccum;
            TD_RETURN_IF_ERROR(rp->device->fillZero(a, 0, a.bytes));
        }
        return Status::success();
    }

    // Per-replica figures of the interval, every worker's, for the chief's StepMetrics.
    Result<std::vector<ReplicaStats>> replicaStats(double wall) {
        constexpr int64_t kFields = 5;
        std::vector<double> mine;
        for (auto& rp : replicas) {
            const ReplicaTiming& t = rp->timing;
            mine.insert(mine.end(),
                        {wall > 0 ? static_cast<double>(t.samples) / wall : 0.0, t.compute,
                         t.allReduce, t.inputWait, static_cast<double>(rp->global)});
        }
        std::vector<double> all = mine;
        if (s.workers) {
            all.resize(mine.size() * static_cast<size_t>(workerCount));
            TD_RETURN_IF_ERROR(s.workers->allGatherHost(
                mine.data(), static_cast<int64_t>(mine.size()), all.data()));
        }
        std::vector<ReplicaStats> out;
        const int local = static_cast<int>(replicas.size());
        for (size_t i = 0; i + kFields <= all.size(); i += kFields) {
            ReplicaStats rs;
            rs.replica = static_cast<int>(all[i + 4]);
            rs.worker = rs.replica / local;
            rs.device = replicas[static_cast<size_t>(rs.replica % local)]->label;
            if (workerCount > 1)
                rs.device = "worker " + std::to_string(rs.worker) + " " + rs.device;
            rs.samplesPerSecond = all[i];
            rs.computeSeconds = all[i + 1];
            rs.allReduceSeconds = all[i + 2];
            rs.inputWaitSeconds = all[i + 3];
            out.push_back(rs);
        }
        for (auto& rp : replicas) rp->timing = {};
        return out;
    }

    // ---- the step ---------------------------------------------------------------------------

    // One training step over the global batch `b`: every replica takes its slice, uploads it and
    // runs its program (forward, loss, backward, the bucketed all-reduce of the gradients, the
    // optimizer update, the loss and metric sums), all replicas at once.
    Status trainStep(const Batch& b, int64_t gstep, int64_t sampleOrigin, double inputWait) {
        StepArgs args;
        args.step = gstep;
        args.update = optimizer->nextStep();
        const Status stepped = forEachReplica([&](Replica& r) -> Status {
            const auto t0 = Clock::now();
            const auto [begin, end] = sliceOf(r.global, b.size);
            TD_ASSIGN_OR_RETURN(Program * p,
                                program(r, GraphMode::Train, end - begin, globalRows(b.size)));
            TD_RETURN_IF_ERROR(uploadSlice(r, *p, b, begin, end));
            const auto t1 = Clock::now();
            StepArgs mine = args;
            mine.sampleBase = sampleOrigin + b.firstIndex + begin;
            mine.refreshShadows = r.weightsDirty;
            r.weightsDirty = false;
            const double reduceBefore = r.timed ? r.timed->seconds : 0;
            TD_RETURN_IF_ERROR(p->exe->run(mine));
            const double reduce = r.timed ? r.timed->seconds - reduceBefore : 0;
            r.timing.inputWait += inputWait + std::chrono::duration<double>(t1 - t0).count();
            r.timing.compute += secondsSince(t1) - reduce;
            r.timing.allReduce += reduce;
            r.timing.samples += end - begin;
            return Status::success();
        });
        if (!stepped.ok()) return stepped;
        return syncMovingStats();
    }

    // Each replica normalizes with its own rows' statistics and moves its moving statistics
    // towards them (tf.distribute without synchronized BatchNorm); the replicas' moving
    // statistics are then averaged (Keras' ON_READ variables with MEAN aggregation), so every
    // replica holds the same bits again. The update is linear, so this equals moving once
    // towards the mean of the replicas' batch statistics. A few values per layer: one host
    // read and write per step and replica, and one host all-reduce across workers.
    Status syncMovingStats() {
        if (movingIndex.empty() || totalReplicas < 2) return Status::success();
        size_t total = 0;
        for (size_t i : movingIndex) total += static_cast<size_t>(numElements(paramShapes[i]));
        std::vector<double> sum(total, 0.0);
        std::vector<float> host;
        for (auto& rp : replicas) {
            TD_RETURN_IF_ERROR(rp->device->synchronize());
            size_t at = 0;
            for (size_t i : movingIndex) {
                host.resize(static_cast<size_t>(numElements(paramShapes[i])));
                TD_RETURN_IF_ERROR(rp->device->copyToHost(host.data(), rp->params[i], 0,
                                                          host.size() * sizeof(float)));
                for (float v : host) sum[at++] += v;
            }
        }
        if (s.workers)
            TD_RETURN_IF_ERROR(
                s.workers->allReduceHost(sum.data(), static_cast<int64_t>(sum.size())));
        size_t at = 0;
        for (size_t i : movingIndex) {
            host.resize(static_cast<size_t>(numElements(paramShapes[i])));
            for (float& v : host) v = static_cast<float>(sum[at++] / totalReplicas);
            for (auto& rp : replicas)
                TD_RETURN_IF_ERROR(rp->device->copyToDevice(rp->params[i], 0, host.data(),
                                                            host.size() * sizeof(float)));
        }
        return Status::success();
    }

    // The loss of the last step, summed over the replicas' shares (callbacks that want batch
    // logs): a host read every step, made only when such a callback is present.
    Result<double> lastStepLoss(int64_t rows) {
        double total = 0;
        for (auto& rp : replicas) {
            const auto [b0, b1] = sliceOf(rp->global, rows);
            Program* p = rp->programs.at({static_cast<int>(GraphMode::Train), b1 - b0}).get();
            float v = 0;
            TD_RETURN_IF_ERROR(rp->device->synchronize());
            TD_RETURN_IF_ERROR(rp->device->copyToHost(
                &v, Buffer{const_cast<void*>(p->exe->valuePtr(p->lossId)), 4}, 0, 4));
            total += v;
        }
        if (s.workers) TD_RETURN_IF_ERROR(s.workers->allReduceHost(&total, 1));
        return total;
    }

    template <typename Hook>
    Status runCallbacks(const char* hookName, Hook hook) {
        for (size_t i = 0; i < s.callbacks.size(); ++i) {
            try {
                hook(*s.callbacks[i]);
            } catch (const std::exception& e) {
                return err(s.callbackNames[i] + " failed in " + hookName + ": " + e.what());
            } catch (...) {
                return err(s.callbackNames[i] + " failed in " + hookName + ": unknown exception");
            }
        }
        return Status::success();
    }

    void log(LogLine::Level lvl, const std::string& text) {
        bus->publish(LogLine{lvl, text});
    }

    std::vector<Tensor> weights() {
        std::vector<Tensor> w;
        Replica& r = *replicas[0];
        (void)r.device->synchronize();
        for (size_t i = 0; i < r.params.size(); ++i) {
            Tensor t(DType::F32, paramShapes[i]);
            (void)r.device->copyToHost(t.raw(), r.params[i], 0, t.bytes());
            w.push_back(std::move(t));
        }
        return w;
    }

    void setWeights(const std::vector<Tensor>& w) {
        for (auto& rp : replicas) {
            for (size_t i = 0; i < rp->params.size() && i < w.size(); ++i)
                (void)rp->device->copyToDevice(rp->params[i], 0, w[i].raw(), w[i].bytes());
            rp->weightsDirty = true;
        }
    }

    // mixed_float16: the first replica's loss-scale state (every replica holds the same: they
    // apply the same all-reduced gradients). One more read at a log point, only with loss
    // scaling.
    Result<std::optional<LossScaleState>> readLossScale() {
        Replica& r = *replicas[0];
        if (!r.lossScale.ptr) return std::optional<LossScaleState>{};
        LossScaleState st;
        TD_RETURN_IF_ERROR(r.device->synchronize());
        TD_RETURN_IF_ERROR(r.device->copyToHost(&st, r.lossScale, 0, sizeof st));
        return std::optional<LossScaleState>(st);
    }
    int64_t skippedSeen = 0;  // skipped steps already reported

    // Device memory the first replica holds: parameters, gradients, optimizer slots, and each
    // compiled program's arena and batch buffers.
    int64_t deviceBytes() const {
        int64_t bytes = 0;
        const Replica& r = *replicas[0];
        for (const Buffer& b : r.params) bytes += static_cast<int64_t>(b.bytes);
        bytes += static_cast<int64_t>(r.flatGrads.bytes);
        for (const Buffer& b : r.slots) bytes += static_cast<int64_t>(b.bytes);
        for (const auto& [key, p] : r.programs)
            bytes += static_cast<int64_t>(p->exe->arenaBytes() + p->input.bytes + p->label.bytes);
        return bytes;
    }

    // ---- checkpoints ------------------------------------------------------------------------

    Status restore(const std::string& path, const CheckpointState& st);
    // mixed_float16: the loss scale of the checkpoint a run resumes from, the start value of
    // the replicas' loss-scale buffers.
    std::optional<LossScaleState> restoredLossScale;
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

    Result<RunFinished> fit();
    Result<EvalResult> evaluate(const Dataset& d);
};

// ---- checkpoints --------------------------------------------------------------------------------

Status Trainer::Impl::restore(const std::string& path, const CheckpointState& st) {
    const TrainConfig& tc = s.project.training;
    TD_RETURN_IF_ERROR(checkCheckpointParams(path, st, paramNames, paramShapes));
    const size_t slotsEach = static_cast<size_t>(updateSpec.slotsPerParam());
    if (st.optimizerSlots.size() != trainableIndex.size() * slotsEach)
        return err(path + ": the checkpoint holds " + std::to_string(st.optimizerSlots.size()) +
                   " optimizer slots, this run's " + optimizer->name() + " optimizer has " +
                   std::to_string(trainableIndex.size() * slotsEach));
    for (size_t i = 0; i < st.optimizerSlots.size(); ++i) {
        const Shape& want = paramShapes[trainableIndex[i / std::max<size_t>(1, slotsEach)]];
        const Tensor& t = st.optimizerSlots[i];
        if (t.dtype() != DType::F32 || t.shape() != want)
            return err(path + ": optimizer slot " + std::to_string(i) + " is " +
                       dtypeName(t.dtype()) + " " + shapeToString(t.shape()) + ", expected f32 " +
                       shapeToString(want));
    }
    if (st.callbacks.size() != s.callbacks.size())
        return err(path + ": the checkpoint holds the state of " +
                   std::to_string(st.callbacks.size()) + " callbacks, this run has " +
                   std::to_string(s.callbacks.size()));
    if (st.seed != tc.seed)
        return err(path + ": the checkpoint was trained with seed " + std::to_string(st.seed) +
                   ", this run has training.seed " + std::to_string(tc.seed));
    if (st.epoch >= tc.epochs)
        return err(path + ": the checkpoint is at the end of epoch " + std::to_string(st.epoch) +
                   " and the run has " + std::to_string(tc.epochs) +
                   " epochs: nothing is left to train");
    // Mid-epoch: the epoch's sums of every replica of every worker, rank-major; this worker
    // goes on from its own.
    std::vector<std::vector<double>> ownSums;
    if (st.stepInEpoch > 0) {
        const size_t local = replicas.size();
        const size_t all = local * static_cast<size_t>(std::max(1, workerCount));
        if (st.accumulators.size() != all)
            return err(path + ": the checkpoint holds the sums of " +
                       std::to_string(st.accumulators.size()) + " replicas, this run has " +
                       std::to_string(all) +
                       (workerCount > 1 ? " (" + std::to_string(workerCount) + " workers x " +
                                              std::to_string(local) + ")"
                                        : std::string()) +
                       " (resume with the strategy it was trained with)");
        const size_t first = local * static_cast<size_t>(std::max(0, workerRank));
        ownSums.assign(st.accumulators.begin() + static_cast<std::ptrdiff_t>(first),
                       st.accumulators.begin() + static_cast<std::ptrdiff_t>(first + local));
        for (const auto& a : st.accumulators)
            if (static_cast<int64_t>(a.size()) != accumCount())
                return err(path + ": the checkpoint's loss and metric sums hold " +
                           std::to_string(a.size()) + " values, expected " +
                           std::to_string(accumCount()));
    }
    for (auto& rp : replicas) {
        Device& d = *rp->device;
        for (size_t i = 0; i < rp->params.size(); ++i)
            TD_RETURN_IF_ERROR(d.copyToDevice(rp->params[i], 0, st.params[i].value.raw(),
                                              st.params[i].value.bytes()));
        for (size_t i = 0; i < rp->slots.size(); ++i)
            TD_RETURN_IF_ERROR(d.copyToDevice(rp->slots[i], 0, st.optimizerSlots[i].raw(),
                                              st.optimizerSlots[i].bytes()));
        TD_RETURN_IF_ERROR(d.synchronize());
        rp->weightsDirty = true;  // mixed precision: the shadows follow the restored weights
    }
    restoredLossScale = st.lossScale;
    skippedSeen = st.lossScale ? st.lossScaleSkipsReported : 0;
    if (st.lossScale)
        for (auto& rp : replicas)
            if (rp->lossScale.ptr) {
                TD_RETURN_IF_ERROR(rp->device->copyToDevice(rp->lossScale, 0, &*st.lossScale,
                                                            sizeof(LossScaleState)));
            }
    optimizer->setIterations(st.optimizerIterations);
    optimizer->restoreLearningRateOverride(st.learningRateOverride);
    ResumePoint rp;
    rp.path = path;
    rp.epoch = st.epoch;
    rp.stepInEpoch = st.stepInEpoch;
    rp.globalStep = st.globalStep;
    rp.epochSamples = st.epochSamples;
    rp.accumulators = std::move(ownSums);
    rp.lastEpochMetrics = st.lastEpochMetrics;
    rp.callbacks = st.callbacks;
    rp.writers = st.writers;
    resume = std::move(rp);
    return Status::success();
}

Result<CheckpointState> Trainer::Impl::captureState(int epoch, int64_t stepInEpoch, int64_t gstep,
                                                    int64_t seen, const MetricMap& lastEpoch) {
    CheckpointState st;
    st.projectJson = ckpt.projectJson;
    st.runId = ckpt.runId;
    st.storeId = ckpt.storeId;
    st.modelFingerprint = ckpt.modelFingerprint;
    st.globalStep = gstep;
    st.epoch = epoch;
    st.stepInEpoch = stepInEpoch;
    st.seed = s.project.training.seed;
    st.epochSamples = stepInEpoch > 0 ? seen : 0;
    st.lastEpochMetrics = lastEpoch;
    Replica& r0 = *replicas[0];
    for (auto& rp : replicas) TD_RETURN_IF_ERROR(rp->device->synchronize());
    for (size_t i = 0; i < r0.params.size(); ++i) {
        Tensor t(DType::F32, paramShapes[i]);
        TD_RETURN_IF_ERROR(r0.device->copyToHost(t.raw(), r0.params[i], 0, t.bytes()));
        st.params.push_back(NamedTensor{paramNames[i], std::move(t)});
    }
    const size_t slotsEach = static_cast<size_t>(updateSpec.slotsPerParam());
    for (size_t i = 0; i < r0.slots.size(); ++i) {
        Tensor t(DType::F32, paramShapes[trainableIndex[i / std::max<size_t>(1, slotsEach)]]);
        TD_RETURN_IF_ERROR(r0.device->copyToHost(t.raw(), r0.slots[i], 0, t.bytes()));
        st.optimizerSlots.push_back(std::move(t));
    }
    if (stepInEpoch > 0) {
        if (s.workers) {
            st.accumulators = gatheredSums;  // every worker's, gathered by saveDue
        } else {
            TD_ASSIGN_OR_RETURN(st.accumulators, localSums());
        }
    }
    TD_ASSIGN_OR_RETURN(st.lossScale, readLossScale());
    st.lossScaleSkipsReported = skippedSeen;
    st.optimizerIterations = optimizer->iterations();
    st.learningRateOverride = optimizer->learningRateOverride();
    for (const auto& cb : s.callbacks) st.callbacks.push_back(cb->saveState());
    return st;
}

Status Trainer::Impl::saveCheckpoint(size_t w, int epoch, int64_t stepInEpoch, int64_t gstep,
                                     int64_t seen, const MetricMap& lastEpoch,
                                     const MetricMap& monitored) {
    const CheckpointWriter& cw = ckpt.writers[w];
    WriterRuntime& rt = writerRuntime[w];
    if (workerRank != 0 || rt.lastStep == gstep) return Status::success();
    std::optional<double> value;
    if (auto it = monitored.find(cw.monitor); it != monitored.end()) value = it->second;
    if (cw.saveBestOnly) {
        if (!value) {
            if (!rt.warned) {
                std::string available;
                for (const auto& [k, v] : monitored)
                    available += (available.empty() ? "" : ", ") + k;
                log(LogLine::Level::Warning,
                    cw.id + ": can save the best model only with " + cw.monitor +
                        " available, skipping (available: " +
                        (available.empty() ? std::string("none") : available) + ")");
            }
            rt.warned = true;
            return Status::success();
        }
        const bool up = monitorMaximizes(cw.mode, cw.monitor);
        if (rt.best && !(up ? *value > *rt.best : *value < *rt.best)) return Status::success();
    }
    const std::string path = (std::filesystem::path(cw.directory) /
                              (cw.prefix + "-" + std::to_string(gstep) + ".tdckpt"))
                                 .string();
    WriterRuntime next = rt;
    std::vector<std::string> superseded;
    if (cw.saveBestOnly) {
        next.best = value;
        for (const std::string& k : next.kept)
            if (k != path) superseded.push_back(k);
        next.kept = {path};
    } else {
        std::erase(next.kept, path);
        next.kept.push_back(path);
        while (static_cast<int>(next.kept.size()) > std::max(1, cw.keepLast)) {
            superseded.push_back(next.kept.front());
            next.kept.erase(next.kept.begin());
        }
    }
    TD_ASSIGN_OR_RETURN(CheckpointState st,
                        captureState(epoch, stepInEpoch, gstep, seen, lastEpoch));
    st.kind = cw.kind;
    st.monitorValue = value;
    for (size_t i = 0; i < ckpt.writers.size(); ++i) {
        const WriterRuntime& x = i == w ? next : writerRuntime[i];
        st.writers.push_back(CheckpointWriterState{ckpt.writers[i].id, x.best, x.kept});
    }
    Status written = writeCheckpoint(path, st);
    if (!written.ok()) return err(cw.id + ": " + written.error());
    next.lastStep = gstep;
    rt = std::move(next);
    std::error_code ec;
    const auto bytes = std::filesystem::file_size(path, ec);
    CheckpointSaved ev;
    ev.path = path;
    ev.kind = cw.kind;
    ev.globalStep = gstep;
    ev.epoch = epoch;
    ev.stepInEpoch = stepInEpoch;
    ev.monitorValue = value;
    ev.bytes = ec ? 0 : static_cast<int64_t>(bytes);
    ev.superseded = superseded;
    if (!ckpt.storeDeletes)
        for (const std::string& f : superseded) std::filesystem::remove(f, ec);
    bus->publish(std::move(ev));
    return Status::success();
}

void Trainer::Impl::dropCompletedBackups() {
    if (workerRank != 0) return;
    for (size_t w = 0; w < ckpt.writers.size(); ++w) {
        if (!ckpt.writers[w].deleteWhenCompleted || writerRuntime[w].kept.empty()) continue;
        CheckpointSaved ev;  // no new file: only the superseded ones, forgotten and deleted
        ev.kind = ckpt.writers[w].kind;
        ev.superseded = std::move(writerRuntime[w].kept);
        writerRuntime[w].kept.clear();
        std::error_code ec;
        if (!ckpt.storeDeletes)
            for (const std::string& f : ev.superseded) std::filesystem::remove(f, ec);
        log(LogLine::Level::Info,
            ckpt.writers[w].id + ": the run completed; its backup files are deleted");
        bus->publish(std::move(ev));
    }
}

// ---- the fit loop -------------------------------------------------------------------------------

Result<RunFinished> Trainer::Impl::fit() {
    const TrainConfig& tc = s.project.training;
    replicas[0]->device->prepareThread(replicas[0]->workerThreads);
    const int64_t pipeBatch = this->pipeBatch();
    const uint64_t pipeSeed =
        shardOff() ? tc.seed + 1000003ull * static_cast<uint64_t>(workerRank) : tc.seed;
    // The cores the replicas' steps keep busy: a CPU device's threads (its OpenMP team, or the
    // step's thread and its WorkShare helpers), one host thread per GPU.
    PipelineOptions pipeOptions;
    for (const auto& r : replicas) {
        const DeviceDesc& d = r->device->desc();
        pipeOptions.consumerThreads += d.kind == DeviceKind::Cpu ? d.threads : 1;
    }
    // One replica whose device has helpers: an inline epoch's batches form during the step on
    // a helper's idle moments (see AsideNext below; TRAINDECK_NO_ASIDE=1 forms them before it).
    pipeOptions.formsAside = replicas.size() == 1 && replicas[0]->device->runsAside() &&
                             !std::getenv("TRAINDECK_NO_ASIDE");
    TD_ASSIGN_OR_RETURN(auto pipe, Pipeline::create(s.trainSet, s.project.data.pipeline, pipeBatch,
                                                    true, pipeSeed, pipeOptions));
    for (const std::string& m : pipe->messages()) log(LogLine::Level::Warning, m);
    const int64_t pipeSteps = pipe->batchesPerEpoch();
    if (pipeSteps == 0)
        return err("the training data has " + std::to_string(s.trainSet.size()) +
                   " samples: not one batch of " + std::to_string(globalBatch()) +
                   (s.project.data.pipeline.dropRemainder ? " with drop_remainder" : ""));
    const int64_t rem = s.trainSet.size() % pipeBatch;
    const int64_t replicasPerBatch =
        shardOff() ? static_cast<int64_t>(replicas.size()) : totalReplicas;
    const bool dropTail =
        rem != 0 && !s.project.data.pipeline.dropRemainder && rem < replicasPerBatch;
    // The steps of an epoch: the pipeline's batches, less a short last one that is skipped.
    const int64_t steps = dropTail ? pipeSteps - 1 : pipeSteps;
    if (dropTail)
        log(LogLine::Level::Warning, "the last batch of each epoch (" + std::to_string(rem) +
                                         " samples) is skipped: it cannot give each of the " +
                                         std::to_string(totalReplicas) + " replicas a sample");
    // Compile every program the epoch needs before the loop, each on its replica's thread.
    auto compileEpochPrograms = [&](Replica& r) -> Status {
        r.device->prepareThread(r.workerThreads);
        auto [b0, b1] = sliceOf(r.global, pipeBatch);
        TD_RETURN_IF_ERROR(statusOf(program(r, GraphMode::Train, b1 - b0, globalRows(pipeBatch))));
        if (rem && !s.project.data.pipeline.dropRemainder && !dropTail) {
            auto [t0, t1] = sliceOf(r.global, rem);
            TD_RETURN_IF_ERROR(statusOf(program(r, GraphMode::Train, t1 - t0, globalRows(rem))));
        }
        return Status::success();
    };
    TD_RETURN_IF_ERROR(forEachReplica(compileEpochPrograms));

    TrainControl ctl;
    ctl.getLearningRate = [&] { return optimizer->currentLearningRate(); };
    ctl.setLearningRate = [&](double lr) { optimizer->setLearningRateOverride(lr); };
    ctl.getWeights = [&] { return weights(); };
    ctl.setWeights = [&](const std::vector<Tensor>& w) { setWeights(w); };
    ctl.log = [&](const std::string& text) { log(LogLine::Level::Info, text); };
    if (!deviceSumNote.empty()) log(LogLine::Level::Info, deviceSumNote);
    TD_RETURN_IF_ERROR(runCallbacks("on_train_begin", [&](Callback& cb) { cb.onTrainBegin(ctl); }));
    writerRuntime.assign(ckpt.writers.size(), WriterRuntime{});
    if (resume) {
        // A resumed run: callbacks and checkpoint writers go on from their saved state.
        for (size_t i = 0; i < s.callbacks.size(); ++i) {
            Status st = s.callbacks[i]->restoreState(resume->callbacks[i]);
            if (!st.ok()) return err(resume->path + ": " + s.callbackNames[i] + ": " + st.error());
        }
        for (size_t w = 0; w < ckpt.writers.size(); ++w)
            for (const CheckpointWriterState& ws : resume->writers)
                if (ws.id == ckpt.writers[w].id) {
                    writerRuntime[w].best = ws.best;
                    writerRuntime[w].kept = ws.kept;
                }
        if (resume->stepInEpoch > steps)
            return err(resume->path + ": the checkpoint is at step " +
                       std::to_string(resume->stepInEpoch) + " of epoch " +
                       std::to_string(resume->epoch + 1) + ", which has " + std::to_string(steps) +
                       " steps in this run");
        log(LogLine::Level::Info, "resuming from " + resume->path + " at global step " +
                                      std::to_string(resume->globalStep) + " (epoch " +
                                      std::to_string(resume->epoch + 1) + ", step " +
                                      std::to_string(resume->stepInEpoch) + ")");
    }

    const int64_t memory = deviceBytes();
    MetricMap last;
    RunStatus status = RunStatus::Completed;
    std::string message;
    const int64_t logEvery = std::max<int64_t>(1, tc.logEverySteps);
    MetricMap batchLogs{{"loss", 0.0}};
    auto batchLoss = batchLogs.find("loss");
    int64_t gstep = static_cast<int64_t>(tc.initialEpoch) * steps;
    const int firstEpoch = resume ? resume->epoch : tc.initialEpoch;
    if (resume) {
        gstep = resume->globalStep;
        last = resume->lastEpochMetrics;
    }
    // Checkpoints due after a step (every N steps), at an epoch's end, or at a stop.
    // Every worker has the same writers (the session plans them alike), so all of them find the
    // same checkpoints due and take part in gathering the epoch's sums for a mid-epoch one.
    auto saveDue = [&](bool epochEnd, bool stopping, int ep, int64_t stepIn, int64_t seenNow,
                       const MetricMap& monitored) -> Status {
        bool gathered = false;
        for (size_t w = 0; w < ckpt.writers.size(); ++w) {
            const CheckpointWriter& cw = ckpt.writers[w];
            const bool due = stopping   ? cw.atStop
                             : epochEnd ? cw.everySteps == 0
                                        : cw.everySteps > 0 && gstep % cw.everySteps == 0;
            if (!due) continue;
            if (s.workers && stepIn > 0 && !gathered) {
                TD_RETURN_IF_ERROR(gatherSums());
                gathered = true;
            }
            TD_RETURN_IF_ERROR(saveCheckpoint(w, ep, stepIn, gstep, seenNow, last, monitored));
        }
        return Status::success();
    };
    MetricMap lastLogged;  // the latest step metrics: what a keep-best writer saving every N
                           // steps compares
    // With workers, a stop request is honoured at the next log point, where every worker learns
    // of it through the metric all-reduce, so that all stop after the same step.
    const bool stopAtLogPoints = s.workers != nullptr;
    bool stopNow = false;

    // A pipeline forming its batches inline (AUTOTUNE: the step holds every core) has the next
    // step's batch formed during this step by a helper thread of the device that would
    // otherwise wait (Device::startAside): off the step's critical path, on a core no other
    // thread competes for. The batches are the same; the current one stays valid while the next
    // is formed (Pipeline::next). Measured on a 2-core machine, seed MLP at batch 32, epochs 2-3
    // of `traindeck train`, 6 alternating pairs: 91.5-97.5 us a step against 99.5-101.5 with
    // TRAINDECK_NO_ASIDE=1 (which turns it off, for such comparisons).
    struct AsideNext {
        Pipeline* pipe = nullptr;
        std::optional<Result<const Batch*>> got;
        static void run(void* self) {
            auto* a = static_cast<AsideNext*>(self);
            try {
                a->got.emplace(a->pipe->next());
            } catch (const std::exception& e) {
                a->got.emplace(err(std::string("input pipeline: ") + e.what()));
            }
        }
    } aside{pipe.get(), std::nullopt};
    Device& firstDevice = *replicas[0]->device;

    for (int epoch = firstEpoch; epoch < tc.epochs && !stopNow; ++epoch) {
        TD_RETURN_IF_ERROR(pipe->beginEpoch(epoch));
        aside.got.reset();
        const bool formAside = pipeOptions.formsAside && pipe->stats().formingInline;
        TD_RETURN_IF_ERROR(zeroAccumulators(true));
        auto epochT0 = Clock::now();
        auto logT0 = Clock::now();
        int64_t seen = 0, seenSinceLog = 0;
        int64_t seenBefore = 0;  // a resumed epoch's samples trained before the resume
        double logWait = 0, logCompute = 0;
        std::vector<double> sums;
        int64_t firstStep = 1;
        if (resume && epoch == resume->epoch && resume->stepInEpoch > 0) {
            // The pipeline's position: its batches are keyed by (seed, epoch), so the ones already
            // trained are formed again and passed over. The epoch's sums go on from the saved ones.
            for (int64_t k = 0; k < resume->stepInEpoch; ++k) {
                TD_ASSIGN_OR_RETURN(const Batch* skipped, pipe->next());
                if (!skipped)
                    return err(resume->path + ": the pipeline ended after " + std::to_string(k) +
                               " batches of epoch " + std::to_string(epoch + 1) +
                               ", the checkpoint is at step " +
                               std::to_string(resume->stepInEpoch));
            }
            for (size_t i = 0; i < replicas.size(); ++i) {
                const auto& a = resume->accumulators[i];
                TD_RETURN_IF_ERROR(replicas[i]->device->copyToDevice(
                    replicas[i]->trainAccum, 0, a.data(), a.size() * sizeof(double)));
            }
            seen = resume->epochSamples;
            seenBefore = seen;
            firstStep = resume->stepInEpoch + 1;
        }
        for (int64_t step = firstStep; step <= steps; ++step) {
            // Between steps: stop, pause, a failed store.
            if (!stopAtLogPoints && control->stopRequested) {
                stopNow = true;
                // Before the partial epoch's end: a resumed run continues with this step.
                TD_RETURN_IF_ERROR(saveDue(false, true, epoch, step - 1, seen, lastLogged));
                break;
            }
            {
                std::unique_lock<std::mutex> lk(control->mu);
                if (control->paused) {
                    const auto p0 = Clock::now();
                    control->cv.wait(lk, [&] {
                        return !control->paused || control->stopRequested || control->aborted;
                    });
                    const auto paused = Clock::now() - p0;  // neither epoch nor throughput time
                    logT0 += paused;
                    epochT0 += paused;
                }
            }
            if (control->aborted) return err(control->abortMessage());
            if (s.interrupted) {
                if (std::string why = s.interrupted(); !why.empty()) {
                    abortGroup(why);
                    if (s.workers) s.workers->abort(why);
                    return err("worker rank " + std::to_string(workerRank) + ": " + why);
                }
            }

            // Take the global batch (formed during the last step, or now).
            const auto t0 = Clock::now();
            Result<const Batch*> got = aside.got ? std::move(*aside.got) : pipe->next();
            aside.got.reset();
            TD_ASSIGN_OR_RETURN(const Batch* b, std::move(got));
            if (!b) break;
            const double wait = secondsSince(t0);

            // Slice, upload, forward, backward, all-reduce, update: on every replica.
            const auto t1 = Clock::now();
            ++gstep;
            const int64_t origin =
                shardOff()
                    ? (static_cast<int64_t>(epoch) * workerCount + workerRank) * s.trainSet.size()
                    : static_cast<int64_t>(epoch) * s.trainSet.size();
            const bool asideStarted =
                formAside && step < steps && firstDevice.startAside(&AsideNext::run, &aside);
            Status stepped = trainStep(*b, gstep, origin, wait);
            if (asideStarted) firstDevice.finishAside();
            TD_RETURN_IF_ERROR(std::move(stepped));
            seen += globalRows(b->size);
            seenSinceLog += globalRows(b->size);
            fault.atStep(workerRank, gstep);
            logWait += wait;
            logCompute += secondsSince(t1);

            if (!s.callbacks.empty()) {
                if (wantBatchLoss) {
                    TD_ASSIGN_OR_RETURN(batchLoss->second, lastStepLoss(b->size));
                }
                TD_RETURN_IF_ERROR(runCallbacks(
                    "on_batch_end", [&](Callback& cb) { cb.onBatchEnd(gstep, batchLogs, ctl); }));
            }
            if (ctl.stopTraining) {
                stopNow = true;
                status = RunStatus::Stopped;
                message = ctl.stopReason;
            }

            // Every log_every_steps (and at the epoch's end): read the sums back and publish.
            if (step % logEvery == 0 || step == steps || stopNow) {
                const double wall = secondsSince(logT0);
                TD_ASSIGN_OR_RETURN(sums,
                                    readAccumulators(true, control->stopRequested ? 1.0 : 0.0));
                if (stopAtLogPoints && sums.back() > 0) stopNow = true;
                TD_ASSIGN_OR_RETURN(std::vector<ReplicaStats> per, replicaStats(wall));
                StepMetrics sm;
                sm.epoch = epoch;
                sm.step = step;
                sm.globalStep = gstep;
                sm.metrics["loss"] = sums[0] / static_cast<double>(seen);
                for (size_t m = 0; m < s.metrics.size(); ++m)
                    sm.metrics[s.metrics[m].key] = sums[1 + m] / static_cast<double>(seen);
                TD_ASSIGN_OR_RETURN(std::optional<LossScaleState> ls, readLossScale());
                if (ls) {
                    sm.lossScale = ls->scale;
                    sm.skippedSteps = ls->skippedSteps;
                    if (ls->skippedSteps > skippedSeen) {
                        // Skipped steps applied no update: the optimizer's count goes back.
                        optimizer->rewindIterations(ls->skippedSteps - skippedSeen);
                        log(LogLine::Level::Warning,
                            "loss scaling: " + std::to_string(ls->skippedSteps - skippedSeen) +
                                " step(s) up to step " + std::to_string(gstep) +
                                " skipped (non-finite gradients); loss scale now " +
                                fmtNum(ls->scale));
                        skippedSeen = ls->skippedSteps;
                    }
                }
                sm.learningRate = optimizer->currentLearningRate();
                sm.inputWaitSeconds = logWait;
                sm.computeSeconds = logCompute;
                sm.samplesPerSecond = wall > 0 ? static_cast<double>(seenSinceLog) / wall : 0;
                sm.replicas = std::move(per);
                lastLogged = sm.metrics;
                bus->publish(sm);
                for (auto& rp : replicas) {
                    DeviceStats ds;
                    ds.device = rp->label;
                    ds.utilization = wall > 0 ? std::min(1.0, logCompute / wall) : 0;
                    ds.memoryBytes = memory;
                    ds.samplesPerSecond =
                        wall > 0 ? static_cast<double>(seenSinceLog) / totalReplicas / wall : 0;
                    // GPUs: what the GPU reports of itself (NVML), where the driver has it.
                    if (rp->device->desc().kind == DeviceKind::Cuda)
                        if (auto t = deviceTelemetry(rp->device->desc().id)) {
                            ds.memoryUsedBytes = t->memoryUsedBytes;
                            ds.memoryTotalBytes = t->memoryTotalBytes;
                            ds.gpuUtilization = t->gpuUtilization;
                        }
                    bus->publish(std::move(ds));
                }
                logT0 = Clock::now();
                logWait = logCompute = 0;
                seenSinceLog = 0;
            }
            TD_RETURN_IF_ERROR(saveDue(false, false, epoch, step, seen, lastLogged));
            // A stop after this step (a request, a callback): saved before the partial epoch's
            // end, as above.
            if (stopNow) TD_RETURN_IF_ERROR(saveDue(false, true, epoch, step, seen, lastLogged));
            if (stopNow) break;
        }
        // The skipped short batch still leaves the pipeline, which completes a cache it fills.
        if (dropTail && !stopNow) TD_RETURN_IF_ERROR(statusOf(pipe->next()));
        if (seen == 0) break;
        // A stop between log points leaves steps the last read did not see: read them now. (Every
        // worker gets here at the same step: across workers a stop acts at log points only.)
        // A run resumed at its epoch's last step has read nothing yet.
        if (seenSinceLog > 0 || sums.empty()) {
            TD_ASSIGN_OR_RETURN(sums, readAccumulators(true));
        }
        EpochMetrics em;
        em.epoch = epoch;
        em.metrics["loss"] = sums[0] / static_cast<double>(seen);
        for (size_t m = 0; m < s.metrics.size(); ++m)
            em.metrics[s.metrics[m].key] = sums[1 + m] / static_cast<double>(seen);
        // A resumed epoch's time is this process's part of it, and so are its samples.
        em.seconds = secondsSince(epochT0);
        em.samplesPerSecond = static_cast<double>(seen - seenBefore) / std::max(1e-9, em.seconds);
        em.resumedSamples = seenBefore;
        em.learningRate = optimizer->currentLearningRate();
        if (s.valSet && !stopNow) {
            TD_ASSIGN_OR_RETURN(EvalResult vr, evaluate(*s.valSet));
            for (const auto& [k, val] : vr.metrics) em.metrics["val_" + k] = val;
        }
        bus->publish(em);
        bus->publish(
            LogLine{LogLine::Level::Info,
                    "epoch " + std::to_string(epoch + 1) + ": " + describePipeline(pipe->stats()),
                    /*detail=*/true});
        last = em.metrics;
        if (status != RunStatus::Stopped && stopNow) {
            status = RunStatus::Stopped;
            message = "stopped by request";
        }
        TD_RETURN_IF_ERROR(runCallbacks(
            "on_epoch_end", [&](Callback& cb) { cb.onEpochEnd(epoch, em.metrics, ctl); }));
        if (!stopNow) TD_RETURN_IF_ERROR(saveDue(true, false, epoch + 1, 0, 0, em.metrics));
        if (ctl.stopTraining && status == RunStatus::Completed) {
            status = RunStatus::Stopped;
            message = ctl.stopReason.empty() ? "stopped by a callback" : ctl.stopReason;
            break;
        }
    }
    if ((stopNow || control->stopRequested) && status == RunStatus::Completed) {
        status = RunStatus::Stopped;
        message = "stopped by request";
    }
    TD_RETURN_IF_ERROR(runCallbacks("on_train_end", [&](Callback& cb) { cb.onTrainEnd(ctl); }));
    if (control->aborted) return err(control->abortMessage());
    if (status == RunStatus::Completed) dropCompletedBackups();
    resume.reset();

    RunFinished fin;
    fin.status = status;
    fin.message = message;
    fin.finalMetrics = last;
    return fin;
}

// ---- evaluation and prediction (first replica) --------------------------------------------------

Result<EvalResult> Trainer::Impl::evaluate(const Dataset& d) {
    Replica& r = *replicas[0];
    r.device->prepareThread(r.workerThreads);
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
            r.device->prepareThread(r.workerThreads);
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
    r.device->prepareThread(r.workerThreads);
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

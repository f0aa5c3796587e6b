// Session: compiles a project once (forward, autodiff, passes, lowering per batch size) and runs
// the Keras-style fit loop on the calling thread or an engine thread. The step loop does no
// allocation and no I/O: it copies the batch into the program's input buffer and runs the program,
// which also updates the weights and adds loss and metrics into its accumulators; those are read
// back at log points only. Everything else (progress bar, charts, SQLite) consumes events from
// the bus on its own thread.
#include "engine/api/session.h"

#include <unistd.h>

#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstring>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <sstream>

#include "engine/backend/backend.h"
#include "engine/core/text_limits.h"
#include "engine/data/pipeline.h"
#include "engine/data/sources.h"
#include "engine/graph/builder.h"
#include "engine/graph/initializers.h"
#include "engine/graph/passes.h"
#include "engine/store/run_store.h"
#include "engine/train/callbacks.h"
#include "engine/train/optimizer.h"

namespace td {

namespace {

using Clock = std::chrono::steady_clock;
double secondsSince(Clock::time_point t0) {
    return std::chrono::duration<double>(Clock::now() - t0).count();
}

int64_t unixMs() {
    return std::chrono::duration_cast<std::chrono::milliseconds>(
               std::chrono::system_clock::now().time_since_epoch())
        .count();
}

std::string hostName() {
    char buf[256] = {0};
    if (gethostname(buf, sizeof buf - 1) != 0) return "localhost";
    return buf;
}

// Threads per step: forking a team costs a few microseconds per kernel and a barrier stalls
// whenever another process holds a core. Measured on a 2-core AVX-512 machine, the seed MLP
// trains faster on one thread at batch 32 (20 MFLOP per step) and batch 256 (156 MFLOP), breaks
// even at batch 1024 (625 MFLOP), and the 784-1024-1024-10 MLP at batch 256 (2.9 GFLOP) gains 1.5x
// from two threads. So steps under 512 MFLOP run on one thread.
int chooseWorkerThreads(const ModelInfo& info, int64_t batch, int deviceThreads) {
    double flops = 0;
    for (const LayerInfo& l : info.layers)
        flops += 6.0 * static_cast<double>(batch) * static_cast<double>(l.params);
    return flops < 512e6 ? 1 : deviceThreads;
}

// A compiled program for one (mode, batch size) with its own input and label buffers.
struct Compiled {
    GraphMode mode = GraphMode::Train;
    int64_t batch = 0;
    Graph graph;
    std::unique_ptr<Executable> exe;
    Buffer input, label;
    int lossId = -1;
    std::vector<std::pair<std::string, int>> metricIds;
    int predId = -1;
    std::vector<FusionDecision> fusion;
    std::vector<PassTiming> timings;
};

}  // namespace

struct Session::Impl {
    Project project;
    SessionOptions options;
    EventBus bus;
    ModelInfo info;
    LabelSpec labelSpec;
    std::vector<MetricSpec> metrics;
    DataSplits splits;
    Dataset trainSet;
    std::optional<Dataset> valSet;
    std::unique_ptr<Device> device;

    // Parameters, shared by every program.
    struct Param {
        std::string name;
        Shape shape;
        bool trainable = true;
        Buffer value;
        Buffer grad;  // a view into flatGrads (trainable parameters)
    };
    std::vector<Param> params;
    std::map<std::pair<int, int64_t>, std::unique_ptr<Compiled>> programs;  // (mode, batch)
    Buffer flatGrads;                    // every gradient, laid out by planGradients
    std::vector<Buffer> optimizerSlots;  // on the device, as ProgramBindings::optimizerSlots
    UpdateSpec updateSpec;
    // Running sums of loss and metrics (f64: loss, then each metric), one for the training
    // programs and one for the evaluation programs.
    Buffer trainAcc, evalAcc;

    std::unique_ptr<Optimizer> optimizer;
    std::vector<std::shared_ptr<Callback>> callbacks;
    std::vector<std::string> callbackNames;  // for errors: "training.callbacks[0] (early_stopping)"

    int workerThreads = 0;  // threads the device may use per step (see chooseWorkerThreads)
    int64_t runId = 0;
    std::thread thread;
    std::atomic<bool> stopRequested{false};
    std::atomic<bool> isRunning{false};
    std::mutex pauseMu;
    std::condition_variable pauseCv;
    bool pausedFlag = false;
    std::atomic<int64_t> globalStep{0};

    // Set from the recorder's thread on the first failed write; the step loop checks it.
    std::atomic<bool> storeFailed{false};
    std::mutex storeErrorMu;
    std::string storeError;

    ~Impl() {
        if (device)
            for (auto& [key, c] : programs) {
                if (c->input.ptr) device->release(c->input);
                if (c->label.ptr) device->release(c->label);
            }
        programs.clear();
        if (device) {
            for (auto& p : params) device->release(p.value);
            for (auto& b : optimizerSlots) device->release(b);
            for (Buffer* b : {&flatGrads, &trainAcc, &evalAcc})
                if (b->ptr) device->release(*b);
        }
    }

    int64_t batchSize() const { return project.training.batchSize; }

    Status initParams(const Graph& g);
    Status allocateTrainState(const Graph& g);
    // Reads an accumulator buffer into `sums` (loss, then each metric).
    Status readAccumulators(const Buffer& acc, std::vector<double>& sums);
    Result<Compiled*> program(GraphMode mode, int64_t batch);
    Status uploadBatch(Compiled& c, const Batch& b);
    Result<EvalResult> evaluate(const Dataset& d);
    Status openStore(std::unique_ptr<RunStore>& store, std::unique_ptr<RunRecorder>& recorder,
                     std::shared_ptr<EventQueue>& recorderQueue);
    RunStarted runStarted() const;
    // The run up to its result; publishes every event but RunFinished, which fit() publishes once
    // the store has written everything.
    Result<RunFinished> fitLoop();
    void log(LogLine::Level lvl, const std::string& text) { bus.publish(LogLine{lvl, text}); }

    void noteStoreError(const std::string& error) {
        {
            std::lock_guard<std::mutex> lk(storeErrorMu);
            if (storeError.empty()) storeError = error;
        }
        storeFailed = true;
        std::lock_guard<std::mutex> lk(pauseMu);  // wakes a paused run: it ends too
        pauseCv.notify_all();
    }
    Error storeFailure() {
        std::lock_guard<std::mutex> lk(storeErrorMu);
        return err("run store: " + storeError +
                   "; training stopped (rows written before the failure are kept)");
    }

    // Runs one hook of every callback. A callback that throws fails the run, as in Keras.
    template <typename Hook>
    Status runCallbacks(const char* hookName, Hook hook) {
        for (size_t i = 0; i < callbacks.size(); ++i) {
            try {
                hook(*callbacks[i]);
            } catch (const std::exception& e) {
                return err(callbackNames[i] + " failed in " + hookName + ": " + e.what());
            } catch (...) {
                return err(callbackNames[i] + " failed in " + hookName + ": unknown exception");
            }
        }
        return Status::success();
    }
};

Status Session::Impl::initParams(const Graph& g) {
    // Layer specs by parameter name prefix.
    std::map<std::string, const LayerSpec*> byName;
    for (const LayerSpec& L : project.model.layers) byName[L.name] = &L;
    uint64_t index = 0;
    for (int id : g.params()) {
        const Node& n = g.node(id);
        Param p;
        p.name = n.attrs.name.value_or("");
        p.shape = n.shape;
        p.trainable = n.attrs.trainableOr();
        const size_t bytes = n.bytes();
        TD_ASSIGN_OR_RETURN(p.value, device->allocate(bytes));
        const std::string layer = p.name.substr(0, p.name.rfind('/'));
        const bool isKernel = p.name.size() > 7 && p.name.substr(p.name.size() - 7) == "/kernel";
        const LayerSpec* L = byName.at(layer);
        std::vector<float> host(static_cast<size_t>(numElements(n.shape)));
        const uint64_t seed = project.training.seed * 7919ull + 1000003ull * ++index;
        Status s = initializeParam(host.data(), n.shape,
                                   isKernel ? L->kernelInitializer : L->biasInitializer, seed);
        if (!s.ok()) return err("layer '" + layer + "': " + s.error());
        TD_RETURN_IF_ERROR(device->copyToDevice(p.value, 0, host.data(), bytes));
        params.push_back(std::move(p));
    }
    return Status::success();
}

// The gradients (one flat buffer, a view per trainable parameter), the optimizer's slots and the
// accumulators: allocated once, from the first training graph.
Status Session::Impl::allocateTrainState(const Graph& g) {
    // One replica: the buckets are not used.
    const GradientPlan plan = planGradients(g, 0);
    TD_ASSIGN_OR_RETURN(flatGrads, device->allocate(std::max<size_t>(plan.bytes(), 1)));
    TD_RETURN_IF_ERROR(device->fillZero(flatGrads, 0, flatGrads.bytes));
    updateSpec = optimizer->spec();
    const int per = updateSpec.slotsPerParam();
    for (size_t i = 0; i < params.size(); ++i) {
        if (!params[i].trainable) continue;
        const size_t bytes = static_cast<size_t>(numElements(params[i].shape)) * sizeof(float);
        params[i].grad = Buffer{static_cast<char*>(flatGrads.ptr) +
                                    static_cast<size_t>(plan.offsets[i]) * sizeof(float),
                                bytes};
        for (int k = 0; k < per; ++k) {
            TD_ASSIGN_OR_RETURN(Buffer b, device->allocate(bytes));
            TD_RETURN_IF_ERROR(device->fillZero(b, 0, b.bytes));
            optimizerSlots.push_back(b);
        }
    }
    return Status::success();
}

Status Session::Impl::readAccumulators(const Buffer& acc, std::vector<double>& sums) {
    sums.assign(1 + metrics.size(), 0.0);
    return device->copyToHost(sums.data(), acc, 0, sums.size() * sizeof(double));
}

Result<Compiled*> Session::Impl::program(GraphMode mode, int64_t batch) {
    auto key = std::make_pair(static_cast<int>(mode), batch);
    auto it = programs.find(key);
    if (it != programs.end()) return it->second.get();

    auto c = std::make_unique<Compiled>();
    c->mode = mode;
    c->batch = batch;
    BuildOptions bo;
    bo.batch = batch;
    bo.mode = mode;
    bo.loss = project.training.loss;
    bo.metrics = project.training.metrics;
    bo.seed = project.training.seed;
    TD_ASSIGN_OR_RETURN(c->graph, buildGraph(project.model, info, bo));
    if (mode == GraphMode::Train) TD_RETURN_IF_ERROR(autodiff(c->graph));
    PassManager pm;
    addStandardPasses(pm);
    if (!project.fusion) pm.disable("fusion");
    TD_RETURN_IF_ERROR(pm.run(c->graph));
    c->fusion = static_cast<FusionPass*>(pm.find("fusion"))->decisions();
    c->timings = pm.timings();

    if (params.empty()) TD_RETURN_IF_ERROR(initParams(c->graph));
    const Graph& g = c->graph;
    if (mode == GraphMode::Train && !flatGrads.ptr) TD_RETURN_IF_ERROR(allocateTrainState(g));
    const size_t accBytes = (1 + metrics.size()) * sizeof(double);
    if (mode != GraphMode::Predict) {
        Buffer& acc = mode == GraphMode::Train ? trainAcc : evalAcc;
        if (!acc.ptr) {
            TD_ASSIGN_OR_RETURN(acc, device->allocate(accBytes));
            TD_RETURN_IF_ERROR(device->fillZero(acc, 0, acc.bytes));
        }
    }
    ProgramBindings bind;
    for (const Node& n : g.nodes) {
        const size_t bytes = n.bytes();
        if (n.op == Op::Input) {
            TD_ASSIGN_OR_RETURN(c->input, device->allocate(bytes));
        } else if (n.op == Op::Label) {
            TD_ASSIGN_OR_RETURN(c->label, device->allocate(bytes));
        }
    }
    bind.input = c->input;
    bind.label = c->label.ptr ? c->label : c->input;
    std::vector<int> pids = g.params();
    if (pids.size() != params.size())
        return err("internal: parameter count differs between programs");
    for (size_t i = 0; i < pids.size(); ++i) {
        bind.params.push_back(params[i].value);
        bind.grads.push_back(mode == GraphMode::Train ? params[i].grad : Buffer{});
    }
    if (mode == GraphMode::Train) {
        bind.flatGrads = flatGrads;
        bind.update = &updateSpec;
        bind.optimizerSlots = optimizerSlots;
        bind.accumulators = trainAcc;
    } else if (mode == GraphMode::Eval) {
        bind.accumulators = evalAcc;
    }
    TD_ASSIGN_OR_RETURN(c->exe, compileProgram(*device, g, bind));
    c->lossId = g.output("loss");
    c->predId = g.output("predictions");
    for (const auto& m : metrics) c->metricIds.emplace_back(m.key, g.output(m.key));
    Compiled* raw = c.get();
    programs[key] = std::move(c);
    return raw;
}

Status Session::Impl::uploadBatch(Compiled& c, const Batch& b) {
    const size_t xBytes = b.x.bytes();
    if (b.x.dtype() != DType::F32) return err("internal: pipeline produced non-f32 features");
    TD_RETURN_IF_ERROR(
        device->copyToDevice(c.input, 0, b.x.raw(), std::min(xBytes, c.input.bytes)));
    if (!c.label.ptr) return Status::success();
    const Shape ls = labelSpec.shape;
    const int64_t perRow = numElements(ls);
    if (labelSpec.dtype == DType::I32) {
        if (b.y.dtype() != DType::I32)
            return err("loss " + project.training.loss.name +
                       " expects integer class labels, but the pipeline produced " +
                       dtypeName(b.y.dtype()) + " labels " + shapeToString(b.y.shape()) +
                       " (remove the one_hot map step, or use categorical_crossentropy)");
        const int32_t* y = b.y.data<int32_t>();
        const int64_t units = info.outputShape[0];
        for (int64_t i = 0; i < b.size; ++i)
            if (y[i] < 0 || y[i] >= units)
                return err("label " + std::to_string(y[i]) + " is outside the " +
                           std::to_string(units) + " output units of the last layer");
        return device->copyToDevice(c.label, 0, y, b.y.bytes());
    }
    // f32 targets [B, perRow]
    if (b.y.dtype() == DType::F32 && b.y.size() == b.size * perRow)
        return device->copyToDevice(c.label, 0, b.y.raw(), b.y.bytes());
    if (b.y.dtype() == DType::I32 && perRow == 1) {
        // Integer 0/1 labels for a single-unit binary or regression output: convert in the input
        // buffer itself (host-addressable devices) or through a bounce copy.
        float* dst = static_cast<float*>(c.label.ptr);
        const int32_t* y = b.y.data<int32_t>();
        if (device->hostAddressable()) {
            for (int64_t i = 0; i < b.size; ++i) dst[i] = static_cast<float>(y[i]);
            return Status::success();
        }
    }
    return err("loss " + project.training.loss.name + " expects targets of shape " +
               shapeToString(ls) + " per sample, but the pipeline produced " +
               dtypeName(b.y.dtype()) + " labels " + shapeToString(b.y.shape()) +
               (labelSpec.shape.size() == 1 && labelSpec.shape[0] > 1 && b.y.dtype() == DType::I32
                    ? " (add a one_hot map step with depth " + std::to_string(ls[0]) + ")"
                    : std::string()));
}

Result<EvalResult> Session::Impl::evaluate(const Dataset& d) {
    device->prepareThread(workerThreads);
    PipelineConfig pc = project.data.pipeline;
    pc.shuffleBuffer = 0;
    if (pc.cache.rfind("file:", 0) == 0) pc.cache = "memory";
    TD_ASSIGN_OR_RETURN(auto pipe, Pipeline::create(d, pc, batchSize(), false, 0));
    TD_RETURN_IF_ERROR(pipe->beginEpoch(0));
    int64_t seen = 0;
    bool zeroed = false;
    while (true) {
        TD_ASSIGN_OR_RETURN(const Batch* b, pipe->next());
        if (!b) break;
        TD_ASSIGN_OR_RETURN(Compiled * c, program(GraphMode::Eval, b->size));
        if (!zeroed) {
            TD_RETURN_IF_ERROR(device->fillZero(evalAcc, 0, evalAcc.bytes));
            zeroed = true;
        }
        TD_RETURN_IF_ERROR(uploadBatch(*c, *b));
        TD_RETURN_IF_ERROR(c->exe->run(StepArgs{}));
        seen += b->size;
    }
    EvalResult r;
    r.samples = seen;
    if (seen == 0) return r;
    std::vector<double> sums;
    TD_RETURN_IF_ERROR(device->synchronize());
    TD_RETURN_IF_ERROR(readAccumulators(evalAcc, sums));
    r.metrics["loss"] = sums[0] / static_cast<double>(seen);
    for (size_t m = 0; m < metrics.size(); ++m)
        r.metrics[metrics[m].key] = sums[1 + m] / static_cast<double>(seen);
    return r;
}

Result<RunFinished> Session::Impl::fitLoop() {
    const TrainConfig& tc = project.training;
    device->prepareThread(workerThreads);
    TD_ASSIGN_OR_RETURN(
        auto pipe, Pipeline::create(trainSet, project.data.pipeline, batchSize(), true, tc.seed));
    for (const std::string& m : pipe->messages()) log(LogLine::Level::Warning, m);
    const int64_t steps = pipe->batchesPerEpoch();
    if (steps == 0)
        return err("the training data has " + std::to_string(trainSet.size()) +
                   " samples: not one batch of " + std::to_string(batchSize()) +
                   (project.data.pipeline.dropRemainder ? " with drop_remainder" : ""));
    // Compile every program the epoch needs before the loop.
    TD_ASSIGN_OR_RETURN(Compiled * full, program(GraphMode::Train, batchSize()));
    const int64_t rem = trainSet.size() % batchSize();
    Compiled* tail = nullptr;
    if (rem && !project.data.pipeline.dropRemainder) {
        TD_ASSIGN_OR_RETURN(tail, program(GraphMode::Train, rem));
    }

    TrainControl ctl;
    ctl.getLearningRate = [&] { return optimizer->currentLearningRate(); };
    ctl.setLearningRate = [&](double lr) { optimizer->setLearningRateOverride(lr); };
    ctl.getWeights = [&] {
        std::vector<Tensor> w;
        for (auto& p : params) {
            Tensor t(DType::F32, p.shape);
            (void)device->copyToHost(t.raw(), p.value, 0, t.bytes());
            w.push_back(std::move(t));
        }
        return w;
    };
    ctl.setWeights = [&](const std::vector<Tensor>& w) {
        for (size_t i = 0; i < params.size() && i < w.size(); ++i)
            (void)device->copyToDevice(params[i].value, 0, w[i].raw(), w[i].bytes());
    };
    ctl.log = [&](const std::string& s) { log(LogLine::Level::Info, s); };
    TD_RETURN_IF_ERROR(runCallbacks("on_train_begin", [&](Callback& cb) { cb.onTrainBegin(ctl); }));

    // Device memory the run holds: parameters, gradients, optimizer slots, program arenas and
    // batch buffers (all allocated before the loop).
    int64_t deviceBytes = 0;
    for (const auto& prm : params) deviceBytes += static_cast<int64_t>(prm.value.bytes);
    deviceBytes += static_cast<int64_t>(flatGrads.bytes + trainAcc.bytes + evalAcc.bytes);
    for (const Buffer& b : optimizerSlots) deviceBytes += static_cast<int64_t>(b.bytes);
    for (const auto& [key, c] : programs)
        deviceBytes += static_cast<int64_t>(c->exe->arenaBytes() + c->input.bytes + c->label.bytes);
    MetricMap last;
    RunStatus status = RunStatus::Completed;
    std::string message;
    const int64_t logEvery = std::max<int64_t>(1, tc.logEverySteps);
    MetricMap batchLogs{{"loss", 0.0}};
    auto batchLoss = batchLogs.find("loss");
    int64_t gstep = static_cast<int64_t>(tc.initialEpoch) * steps;

    for (int epoch = tc.initialEpoch; epoch < tc.epochs && !stopRequested; ++epoch) {
        TD_RETURN_IF_ERROR(pipe->beginEpoch(epoch));
        auto epochT0 = Clock::now();
        TD_RETURN_IF_ERROR(device->fillZero(trainAcc, 0, trainAcc.bytes));
        std::vector<double> sums;  // the accumulators as last read: loss, then each metric
        int64_t seen = 0, seenSinceLog = 0;
        auto logT0 = Clock::now();
        double logWait = 0, logCompute = 0;
        for (int64_t s = 1; s <= steps; ++s) {
            if (stopRequested) break;
            {
                std::unique_lock<std::mutex> lk(pauseMu);
                if (pausedFlag) {
                    const auto p0 = Clock::now();
                    pauseCv.wait(lk, [&] { return !pausedFlag || stopRequested || storeFailed; });
                    // Paused time is neither epoch time nor throughput time.
                    const auto paused = Clock::now() - p0;
                    logT0 += paused;
                    epochT0 += paused;
                }
            }
            if (storeFailed) return storeFailure();
            const auto t0 = Clock::now();
            TD_ASSIGN_OR_RETURN(const Batch* b, pipe->next());
            if (!b) break;
            const auto t1 = Clock::now();
            Compiled* c = b->size == batchSize() ? full : tail;
            if (!c) return err("internal: no program for a batch of " + std::to_string(b->size));
            TD_RETURN_IF_ERROR(uploadBatch(*c, *b));
            ++gstep;
            TD_RETURN_IF_ERROR(c->exe->run(
                StepArgs{gstep, static_cast<int64_t>(epoch) * trainSet.size() + b->firstIndex,
                         optimizer->nextStep()}));
            seen += b->size;
            seenSinceLog += b->size;
            const auto t2 = Clock::now();
            const double w = std::chrono::duration<double>(t1 - t0).count();
            const double cpt = std::chrono::duration<double>(t2 - t1).count();
            logWait += w;
            logCompute += cpt;
            globalStep = gstep;

            if (!callbacks.empty()) {
                // Batch-level hooks see this step's loss: a read of one value per step, made
                // only when a callback listens.
                float v = 0;
                TD_RETURN_IF_ERROR(device->copyToHost(
                    &v, Buffer{const_cast<void*>(c->exe->valuePtr(c->lossId)), sizeof(float)}, 0,
                    sizeof(float)));
                batchLoss->second = v;  // reuses the node: no allocation per step
                TD_RETURN_IF_ERROR(runCallbacks(
                    "on_batch_end", [&](Callback& cb) { cb.onBatchEnd(gstep, batchLogs, ctl); }));
            }
            if (ctl.stopTraining) {
                stopRequested = true;
                status = RunStatus::Stopped;
                message = ctl.stopReason;
            }
            if (s % logEvery == 0 || s == steps || stopRequested) {
                TD_RETURN_IF_ERROR(readAccumulators(trainAcc, sums));
                const double wall = secondsSince(logT0);
                MetricMap running;
                running["loss"] = sums[0] / static_cast<double>(seen);
                for (size_t m = 0; m < metrics.size(); ++m)
                    running[metrics[m].key] = sums[1 + m] / static_cast<double>(seen);
                StepMetrics sm;
                sm.epoch = epoch;
                sm.step = s;
                sm.globalStep = gstep;
                sm.metrics = running;
                sm.learningRate = optimizer->currentLearningRate();
                sm.inputWaitSeconds = logWait;
                sm.computeSeconds = logCompute;
                sm.samplesPerSecond = wall > 0 ? static_cast<double>(seenSinceLog) / wall : 0;
                ReplicaStats rs;
                rs.device = device->desc().id;
                rs.samplesPerSecond = sm.samplesPerSecond;
                rs.computeSeconds = logCompute;
                rs.inputWaitSeconds = logWait;
                sm.replicas = {rs};
                bus.publish(sm);
                bus.publish(DeviceStats{device->desc().id,
                                        wall > 0 ? std::min(1.0, logCompute / wall) : 0,
                                        deviceBytes, sm.samplesPerSecond});
                logT0 = Clock::now();
                logWait = logCompute = 0;
                seenSinceLog = 0;
            }
        }
        if (seen == 0) break;
        TD_RETURN_IF_ERROR(device->synchronize());
        TD_RETURN_IF_ERROR(readAccumulators(trainAcc, sums));
        EpochMetrics em;
        em.epoch = epoch;
        em.metrics["loss"] = sums[0] / static_cast<double>(seen);
        for (size_t m = 0; m < metrics.size(); ++m)
            em.metrics[metrics[m].key] = sums[1 + m] / static_cast<double>(seen);
        em.seconds = secondsSince(epochT0);
        em.samplesPerSecond = static_cast<double>(seen) / std::max(1e-9, em.seconds);
        em.learningRate = optimizer->currentLearningRate();
        if (valSet && !stopRequested) {
            TD_ASSIGN_OR_RETURN(EvalResult vr, evaluate(*valSet));
            for (const auto& [k, val] : vr.metrics) em.metrics["val_" + k] = val;
        }
        bus.publish(em);
        log(LogLine::Level::Info,
            "epoch " + std::to_string(epoch + 1) + ": " + describePipeline(pipe->stats()));
        last = em.metrics;
        if (status != RunStatus::Stopped && stopRequested) {
            status = RunStatus::Stopped;
            message = "stopped by request";
        }
        TD_RETURN_IF_ERROR(runCallbacks(
            "on_epoch_end", [&](Callback& cb) { cb.onEpochEnd(epoch, em.metrics, ctl); }));
        if (ctl.stopTraining && status == RunStatus::Completed) {
            status = RunStatus::Stopped;
            message = ctl.stopReason.empty() ? "stopped by a callback" : ctl.stopReason;
            break;
        }
    }
    if (stopRequested && status == RunStatus::Completed) {
        status = RunStatus::Stopped;
        message = "stopped by request";
    }
    TD_RETURN_IF_ERROR(runCallbacks("on_train_end", [&](Callback& cb) { cb.onTrainEnd(ctl); }));
    if (storeFailed) return storeFailure();

    RunFinished fin;
    fin.status = status;
    fin.message = message;
    fin.finalMetrics = last;
    if (tc.evaluateTest && splits.test && status != RunStatus::Failed && !stopRequested) {
        TD_ASSIGN_OR_RETURN(EvalResult tr, evaluate(*splits.test));
        for (const auto& [k, val] : tr.metrics) fin.finalMetrics["test_" + k] = val;
    }
    return fin;
}

// ---- Session
// -------------------------------------------------------------------------------------

Session::Session(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Session::~Session() {
    if (impl_) {
        requestStop();
        join();
    }
}

Result<std::unique_ptr<Session>> Session::create(const Project& projectIn,
                                                 const SessionOptions& opt) {
    auto im = std::make_unique<Impl>();
    im->project = projectIn;
    im->options = opt;
    Project& p = im->project;
    if (opt.epochs) p.training.epochs = *opt.epochs;
    if (opt.batchSize) p.training.batchSize = *opt.batchSize;
    if (opt.seed) p.training.seed = *opt.seed;
    if (p.training.batchSize <= 0)
        return err("training.batch_size: expected a positive integer, got " +
                   std::to_string(p.training.batchSize));
    if (p.training.epochs <= 0 || p.training.initialEpoch < 0 ||
        p.training.initialEpoch >= p.training.epochs)
        return err("training.epochs: expected epochs > initial_epoch >= 0, got epochs " +
                   std::to_string(p.training.epochs) + ", initial_epoch " +
                   std::to_string(p.training.initialEpoch));
    if (p.precision != PrecisionPolicy::Float32) {
        Capability cap = precisionCapability(p.precision);
        return err(std::string("precision: ") + precisionName(p.precision) + ": " + cap.reason);
    }
    if (p.strategy.type != "one_device") {
        Capability cap = strategyCapability(p.strategy.type);
        if (!cap.available) return err("strategy.type: " + p.strategy.type + ": " + cap.reason);
    }
    const std::string devId = p.strategy.devices.empty() ? "cpu:0" : p.strategy.devices[0];
    TD_ASSIGN_OR_RETURN(im->device, openDevice(devId));

    TD_ASSIGN_OR_RETURN(im->info, inferShapes(p.model));
    if (std::string e = textProblem(opt.runName, TextKind::Name); !e.empty())
        return err("run name: " + e);
    TD_RETURN_IF_ERROR(checkProjectResources(p, im->info));
    TD_ASSIGN_OR_RETURN(im->labelSpec, labelSpecFor(p.training.loss, im->info.outputShape));
    TD_ASSIGN_OR_RETURN(im->metrics, resolveMetrics(p.training.metrics, p.training.loss));
    for (size_t i = 0; i < p.training.callbacks.size(); ++i) {
        auto cb = Callback::create(p.training.callbacks[i]);
        if (!cb.ok()) return err("training.callbacks: " + cb.error());
        im->callbacks.push_back(std::move(cb).value());
        im->callbackNames.push_back("training.callbacks[" + std::to_string(i) + "] (" +
                                    p.training.callbacks[i].type + ")");
    }
    for (size_t i = 0; i < opt.callbacks.size(); ++i) {
        if (!opt.callbacks[i]) return err("callbacks[" + std::to_string(i) + "]: null callback");
        im->callbacks.push_back(opt.callbacks[i]);
        im->callbackNames.push_back("callback " + std::to_string(i) + " of the session");
    }
    {
        auto opt0 = Optimizer::create(p.training.optimizer);
        if (!opt0.ok()) return err("training." + opt0.error());
        im->optimizer = std::move(opt0).value();
    }

    auto data = loadSource(p.data.source);
    if (!data.ok()) return err("data.source: " + data.error());
    im->splits = std::move(data).value();
    if (p.data.validationData == "test") {
        if (!im->splits.test)
            return err("data.validation_data: \"test\" needs a source with a test split");
        im->trainSet = im->splits.train;
        im->valSet = *im->splits.test;
    } else if (p.data.validationSplit > 0) {
        auto [tr, va] = splitTail(im->splits.train, p.data.validationSplit);
        // Keras refuses a split that leaves either side empty; skipping validation silently
        // would hide that the monitored val_* metrics never exist.
        if (tr.size() == 0 || va.size() == 0) {
            std::ostringstream split;
            split << p.data.validationSplit;
            return err(
                "data.validation_split: " + split.str() + " of " +
                std::to_string(im->splits.train.size()) + " training samples leaves " +
                std::to_string(tr.size()) + " for training and " + std::to_string(va.size()) +
                " for validation (the split is at int(samples * (1 - validation_split)))"
                "; expected at least one sample on each side: use " +
                (va.size() == 0 ? "a larger" : "a smaller") + " validation_split or more data");
        }
        im->trainSet = tr;
        im->valSet = va;
    } else {
        im->trainSet = im->splits.train;
    }
    const Shape sample = im->trainSet.sampleShape();
    if (numElements(sample) != numElements(im->info.inputShape))
        return err("the model's input shape " + shapeToString(im->info.inputShape) +
                   " does not match the data's samples " + shapeToString(sample) + " (" +
                   std::to_string(numElements(sample)) + " values)");
    if (im->labelSpec.dtype == DType::I32)
        TD_RETURN_IF_ERROR(checkLabelsFit(p.data.source, im->splits, im->info.outputShape[0]));
    im->workerThreads =
        chooseWorkerThreads(im->info, p.training.batchSize, im->device->desc().threads);
    im->device->prepareThread(im->workerThreads);
    // Compile the training program now so model and pipeline errors surface before a run starts.
    TD_ASSIGN_OR_RETURN(Compiled * c, im->program(GraphMode::Train, p.training.batchSize));
    (void)c;
    return std::unique_ptr<Session>(new Session(std::move(im)));
}

const Project& Session::project() const {
    return impl_->project;
}
EventBus& Session::events() {
    return impl_->bus;
}
int64_t Session::runId() const {
    return impl_->runId;
}

Status Session::Impl::openStore(std::unique_ptr<RunStore>& store,
                                std::unique_ptr<RunRecorder>& recorder,
                                std::shared_ptr<EventQueue>& recorderQueue) {
    if (options.storePath.empty()) return Status::success();
    TD_ASSIGN_OR_RETURN(store, RunStore::open(options.storePath));
    const Project& p = project;
    RunRecord r;
    r.name = options.runName.empty() ? p.name : options.runName;
    r.projectJson = projectToJson(p);
    nlohmann::json cfg = {{"epochs", p.training.epochs},
                          {"batch_size", p.training.batchSize},
                          {"seed", p.training.seed},
                          {"precision", precisionName(p.precision)},
                          {"fusion", p.fusion},
                          {"strategy", p.strategy.type},
                          {"optimizer", p.training.optimizer.name},
                          {"learning_rate", p.training.optimizer.learningRate}};
    r.configJson = cfg.dump();
    r.startedAtMs = unixMs();
    r.host = hostName();
    r.pid = getpid();
    r.devices = device->desc().id;
    r.modelName = p.model.name;
    r.params = info.totalParams;
    TD_ASSIGN_OR_RETURN(runId, store->createRun(r));
    recorderQueue = bus.subscribe();
    auto rec = RunRecorder::start(options.storePath, runId, recorderQueue,
                                  [this](const std::string& e) { noteStoreError(e); });
    if (!rec.ok()) {
        bus.unsubscribe(recorderQueue);
        recorderQueue.reset();
        return std::move(rec).takeError();
    }
    recorder = std::move(rec).value();
    return Status::success();
}

RunStarted Session::Impl::runStarted() const {
    const Project& p = project;
    RunStarted rs;
    rs.runId = runId;
    rs.runName = options.runName.empty() ? p.name : options.runName;
    rs.devices = {device->desc().id};
    rs.initialEpoch = p.training.initialEpoch;
    rs.epochs = p.training.epochs;
    const int64_t n = trainSet.size(), b = p.training.batchSize;
    rs.stepsPerEpoch = p.data.pipeline.dropRemainder ? n / b : (n + b - 1) / b;
    rs.trainSamples = n;
    rs.batchSize = b;
    rs.validationSamples = valSet ? valSet->size() : 0;
    rs.params = info.totalParams;
    return rs;
}

namespace {

// f(), with an exception that escapes it turned into an error: the engine thread must always get
// as far as publishing the end of the run and closing the queues.
template <typename F>
auto guarded(const char* what, F&& f) -> decltype(f()) {
    try {
        return f();
    } catch (const std::exception& e) {
        return err(std::string(what) + ": " + e.what());
    } catch (...) {
        return err(std::string(what) + ": unknown exception");
    }
}

}  // namespace

// Every way out of here publishes one RunFinished and closes the queues: a subscriber waiting in
// EventQueue::pop (the CLI, the GUI's controller) always learns how the run ended.
Status Session::fit() {
    Impl& im = *impl_;
    im.isRunning = true;
    im.runId = 0;
    im.storeFailed = false;
    {
        std::lock_guard<std::mutex> lk(im.storeErrorMu);
        im.storeError.clear();
    }
    const auto t0 = Clock::now();
    std::unique_ptr<RunStore> store;
    std::unique_ptr<RunRecorder> recorder;
    std::shared_ptr<EventQueue> recorderQueue;
    RunFinished fin;
    Status opened =
        guarded("internal error", [&] { return im.openStore(store, recorder, recorderQueue); });
    if (!opened.ok()) {
        fin.status = RunStatus::Failed;
        fin.message = "run store: " + opened.error();
        fin.storeError = fin.message;
    } else {
        im.bus.publish(im.runStarted());
        Result<RunFinished> r = guarded("internal error", [&] { return im.fitLoop(); });
        if (r.ok()) {
            fin = std::move(r).value();
        } else {
            fin.status = RunStatus::Failed;
            fin.message = r.error();
        }
    }
    fin.seconds = secondsSince(t0);

    if (recorder) {
        // The recorder writes what is queued and the final status before anyone hears the end,
        // so a store that fails at the very end still turns the result into a failure.
        im.bus.unsubscribe(recorderQueue);
        Status written = recorder->finish(fin);
        if (!written.ok()) {
            fin.storeError = "run store: " + written.error();
            if (fin.status != RunStatus::Failed) {
                fin.message = fin.storeError + " (training " + runStatusName(fin.status) +
                              "; rows written before the failure are kept)";
                fin.status = RunStatus::Failed;
            }
        }
    } else if (store && im.runId > 0) {
        // The run's row exists but its recorder never started: record the outcome directly.
        (void)store->finishRun(im.runId, RunStatus::Failed, fin.finalMetrics, fin.message);
    }
    if (fin.status == RunStatus::Failed) im.log(LogLine::Level::Error, fin.message);
    im.bus.publish(fin);
    im.bus.closeAll();
    im.isRunning = false;
    if (fin.status == RunStatus::Failed) return err(fin.message);
    return Status::success();
}

void Session::start() {
    impl_->isRunning = true;
    impl_->thread = std::thread([this] { (void)fit(); });
}

void Session::join() {
    if (impl_->thread.joinable()) impl_->thread.join();
}

bool Session::running() const {
    return impl_->isRunning;
}

void Session::requestStop() {
    impl_->stopRequested = true;
    std::lock_guard<std::mutex> lk(impl_->pauseMu);
    impl_->pauseCv.notify_all();
}

void Session::pause() {
    std::lock_guard<std::mutex> lk(impl_->pauseMu);
    impl_->pausedFlag = true;
}

void Session::resume() {
    {
        std::lock_guard<std::mutex> lk(impl_->pauseMu);
        impl_->pausedFlag = false;
    }
    impl_->pauseCv.notify_all();
}

bool Session::paused() const {
    std::lock_guard<std::mutex> lk(impl_->pauseMu);
    return impl_->pausedFlag;
}

Result<EvalResult> Session::evaluateTest() {
    if (running()) return err("evaluate: a run is in progress");
    if (!impl_->splits.test) return err("evaluate: the data source has no test split");
    return impl_->evaluate(*impl_->splits.test);
}

Result<Tensor> Session::predict(const Tensor& xIn) {
    Impl& im = *impl_;
    if (running()) return err("predict: a run is in progress");
    if (xIn.rank() < 1 || numElements(im.info.inputShape) * xIn.dim(0) != xIn.size())
        return err("predict: expected samples of shape " + shapeToString(im.info.inputShape) +
                   ", got " + shapeToString(xIn.shape()));
    Dataset d;
    d.x = xIn;
    d.y = Tensor(DType::I32, {xIn.dim(0)});
    PipelineConfig pc = im.project.data.pipeline;
    pc.shuffleBuffer = 0;
    pc.cache = "none";
    std::vector<MapStep> featureSteps;
    for (const MapStep& m : pc.map)
        if (m.op != "one_hot") featureSteps.push_back(m);
    pc.map = featureSteps;
    TD_ASSIGN_OR_RETURN(auto pipe, Pipeline::create(d, pc, im.batchSize(), false, 0));
    TD_RETURN_IF_ERROR(pipe->beginEpoch(0));
    im.device->prepareThread(im.workerThreads);
    Shape outShape{xIn.dim(0)};
    outShape.insert(outShape.end(), im.info.outputShape.begin(), im.info.outputShape.end());
    Tensor out(DType::F32, outShape);
    const int64_t row = numElements(im.info.outputShape);
    int64_t done = 0;
    while (true) {
        TD_ASSIGN_OR_RETURN(const Batch* b, pipe->next());
        if (!b) break;
        TD_ASSIGN_OR_RETURN(Compiled * c, im.program(GraphMode::Predict, b->size));
        TD_RETURN_IF_ERROR(im.uploadBatch(*c, *b));
        TD_RETURN_IF_ERROR(c->exe->run(StepArgs{}));
        Buffer pb{const_cast<void*>(c->exe->valuePtr(c->predId)), c->graph.node(c->predId).bytes()};
        TD_RETURN_IF_ERROR(im.device->copyToHost(out.data<float>() + done * row, pb, 0, pb.bytes));
        done += b->size;
    }
    return out;
}

Result<std::string> Session::dumpIr(const std::string& afterPass) {
    Impl& im = *impl_;
    BuildOptions bo;
    bo.batch = im.batchSize();
    bo.mode = GraphMode::Train;
    bo.loss = im.project.training.loss;
    bo.metrics = im.project.training.metrics;
    bo.seed = im.project.training.seed;
    TD_ASSIGN_OR_RETURN(Graph g, buildGraph(im.project.model, im.info, bo));
    if (afterPass == "forward") return printGraph(g);
    TD_RETURN_IF_ERROR(autodiff(g));
    if (afterPass == "build" || afterPass == "autodiff") return printGraph(g);
    PassManager pm;
    addStandardPasses(pm);
    if (!im.project.fusion) pm.disable("fusion");
    std::string dump;
    std::vector<std::string> names{"forward", "autodiff"};
    for (auto& n : pm.passNames()) names.push_back(n);
    names.push_back("final");
    bool known = false;
    for (auto& n : names) known = known || n == afterPass;
    if (!known) {
        std::string list;
        for (auto& n : names) list += (list.empty() ? "" : ", ") + n;
        return err("unknown pass '" + afterPass + "' (expected one of: " + list + ")");
    }
    pm.setDumpHook([&](const std::string& pass, const Graph& gg) {
        if (pass == afterPass) dump = printGraph(gg);
    });
    TD_RETURN_IF_ERROR(pm.run(g));
    if (afterPass == "final") dump = printGraph(g);
    if (dump.empty())
        dump = "# pass " + afterPass + " is disabled for this project\n" + printGraph(g);
    std::string notes = "# passes:";
    for (const auto& t : pm.timings())
        notes += " " + t.pass + (t.skipped ? "(off)" : t.changed ? "(changed)" : "(unchanged)");
    notes += "\n";
    if (auto* fp = static_cast<FusionPass*>(pm.find("fusion")))
        for (const auto& d : fp->decisions())
            notes += std::string("# fusion: ") +
                     (d.fused ? "fused " + d.what : "kept apart: " + d.reason) + "\n";
    if (auto* mp = static_cast<MemoryPlanPass*>(pm.find("memory")); mp && !pm.isDisabled("memory"))
        notes += "# memory: arena " + std::to_string(mp->arenaBytes()) + " bytes (" +
                 std::to_string(mp->naiveBytes()) + " without reuse)\n";
    return notes + dump;
}

// ---- devices and capabilities
// --------------------------------------------------------------------

std::vector<DeviceInfo> listDevices() {
    std::vector<DeviceInfo> out;
    for (const DeviceDesc& d : enumerateDevices())
        out.push_back(
            DeviceInfo{d.id, d.kind == DeviceKind::Cpu ? "cpu" : "cuda", d.name, d.memoryBytes});
    return out;
}

Capability precisionCapability(PrecisionPolicy p) {
    if (p == PrecisionPolicy::Float32) return {};
    return {false, std::string(precisionName(p)) +
                       " needs the mixed-precision compiler passes (16-bit compute with loss "
                       "scaling), which this version does not have yet; use float32"};
}

Capability strategyCapability(const std::string& type) {
    if (type == "one_device") return {};
    if (type == "mirrored" || type == "multi_worker_mirrored")
        return {false, type +
                           " needs the replica and all-reduce runtime, which this version "
                           "does not have yet; use one_device"};
    return {false, "unknown strategy '" + type +
                       "' (expected one_device, mirrored or multi_worker_mirrored)"};
}

}  // namespace td

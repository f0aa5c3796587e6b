// What each replica runs: the parameters (initialized once, the same bits on every replica),
// the compiled programs per (mode, batch), and the upload of a replica's rows of a batch.
#include <algorithm>
#include <cstring>

#include "engine/backend/host_threads.h"
#include "engine/graph/initializers.h"
#include "engine/graph/lower.h"
#include "engine/train/trainer_impl.h"

namespace td {

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

// The graph of one program: built, differentiated (training), through the compiler passes.
Result<Graph> Trainer::Impl::buildPlanned(GraphMode mode, int64_t batch, int64_t global) const {
    const CompileOptions co = compileOptions(s.project, mode == GraphMode::Train);
    BuildOptions bo = buildOptions(s.project, mode);
    bo.halfConv = halfConvolutions();
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

// Every replica of a run computes one graph: convolutions in the 16-bit dtype where the first
// replica's device (every replica's kind) runs them so.
bool Trainer::Impl::halfConvolutions() const {
    const CompileOptions co = compileOptions(s.project, true);
    if (co.compute == DType::F32 || replicas.empty()) return false;
    Device& d = *replicas.front()->device;
    if (d.desc().kind != DeviceKind::Cpu && !co.enabled("cuda_half_conv")) return false;
    return d.halfConvolutions(co.compute);
}

// Parameters on the host, initialized once with the project's seed, copied to every replica:
// every replica starts from the same bits.
Status Trainer::Impl::initParams(const Graph& g) {
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
        Status st = initializeParam(host.back().data(), n.shape, initializerFor(*L, suffix), seed);
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
            TD_ASSIGN_OR_RETURN(Buffer b, allocateWeightsOn(d, bytes, rowBytes));
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
Result<Program*> Trainer::Impl::program(Replica& r, GraphMode mode, int64_t batch, int64_t global) {
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
Status Trainer::Impl::bindShadows(Replica& r, const Graph& g, ProgramBindings& bind) {
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

// Copies rows [begin, end) of a batch into a program's input and label buffers, on the
// device's stream, checking labels against the model as it goes. A host-addressable device
// (the CPU) copies from the batch itself. Any other goes through one of the replica's two
// pinned staging buffers: the host fills one while the device may still be copying from
// the other (a marker in the stream says when a buffer is free again), so the next batch is
// staged while this step runs.
Status Trainer::Impl::uploadSlice(Replica& r, Program& p, const Batch& b, int64_t begin,
                                  int64_t end) {
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
            return err(
                "loss " + lossName + " expects targets of shape " + shapeToString(ls.shape) +
                " per sample, but the pipeline produced " + dtypeName(b.y.dtype()) + " labels " +
                shapeToString(b.y.shape()) +
                (ls.shape.size() == 1 && ls.shape[0] > 1 && b.y.dtype() == DType::I32
                     ? " (add a one_hot map step with depth " + std::to_string(ls.shape[0]) + ")"
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

}  // namespace td

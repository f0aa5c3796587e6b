// The op tests over every backend, against the CPU reference (as ggml's test-backend-ops):
// whole models (MLPs with every activation, dropout, regularizers; every loss and metric kernel;
// an image stack with strided, dilated and grouped convolutions, pooling, padding, rescaling,
// batch and layer normalization (on a GPU also with cuDNN's fused convolution-bias-ReLU turned
// off, with the direct kernels instead of cuDNN, and with bf16 convolutions); every image
// preprocessing and augmentation op; the example projects, an augmented one included) in f32, bf16
// and f16 (with dynamic loss scaling), with each optimizer, fused and per-parameter updates, and a
// gradient all-reduce through the Collectives interface. Each case is compiled from the same
// planned graph on cpu:0 and on each backend under test, bound to the same parameters, batch and
// zeroed optimizer state, and run for a few steps; the loss, metrics, predictions, gradients,
// parameters, accumulators and loss-scale state are compared with a tolerance per dtype.
//
// Backends under test: every CUDA device this machine lists (the GPU check, tests/gpu/check.sh,
// runs this test there), the CPU device on one thread (its single-thread kernels against the
// reference's team), and the CPU device as a plain executor with every CPU pass off (the
// reference runs them all). Without a GPU it says so and tests the CPU configurations alone.
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "engine/backend/backend.h"
#include "engine/backend/device_collectives.h"
#include "engine/distribute/collectives.h"
#include "engine/graph/builder.h"
#include "engine/graph/passes.h"
#include "engine/io/project.h"
#include "engine/model/layers.h"
#include "tests/source_dir.h"

using namespace td;

namespace {

// One replica's collectives: the sum over one replica is the data itself. Exercises the
// device's all-reduce path (bucket out to host memory and back).
class SoloCollectives final : public Collectives {
  public:
    int size() const override { return 1; }
    int rank() const override { return 0; }
    Status allReduceStart(int, float* data, int64_t count) override {
        // Touch the data as a real sum would (x + 0), so a wrong pointer faults here.
        for (int64_t i = 0; i < count; ++i) data[i] += 0.0f;
        ++started;
        return Status::success();
    }
    Status allReduceWait(int) override {
        ++waited;
        return Status::success();
    }
    Status allReduceHost(double*, int64_t) override { return Status::success(); }
    Status allGatherHost(const double* v, int64_t n, double* out) override {
        std::memcpy(out, v, static_cast<size_t>(n) * sizeof(double));
        return Status::success();
    }
    Status barrier() override { return Status::success(); }
    void abort(const std::string&) override {}
    int started = 0, waited = 0;
};

struct Setup {
    const UpdateSpec* update = nullptr;
    bool fuseUpdate = true;
    bool lossScale = false;
    bool allReduce = false;
    int steps = 3;
    bool directConv = false;    // the direct convolution kernels, not cuDNN
    bool deviceReduce = false;  // allReduce on a GPU: NCCL (deviceCollectives), not host memory
};

// Everything a run leaves behind, as host values keyed by name.
struct Outcome {
    std::map<std::string, std::vector<double>> values;
    std::string error;
};

// Host inputs shared by both devices.
struct HostData {
    std::vector<std::vector<float>> params;
    std::vector<char> input, label;
};

HostData makeData(const Graph& g, uint32_t seed) {
    HostData d;
    std::mt19937 rng(seed);
    std::normal_distribution<float> nd(0.f, 0.5f);
    for (int pid : g.params()) {
        const Node& p = g.node(pid);
        const std::string name = p.attrs.name.value_or("");
        std::vector<float> v(static_cast<size_t>(numElements(p.shape)));
        const int64_t fanIn = p.shape.size() >= 2 ? numElements(p.shape) / p.shape.back() : 0;
        for (float& x : v) {
            if (name.ends_with("moving_variance") || name.ends_with("gamma"))
                x = 1.0f + 0.1f * nd(rng);
            else if (fanIn > 0)
                x = nd(rng) * 2.0f / std::sqrt(static_cast<float>(fanIn));
            else
                x = 0.2f * nd(rng);
        }
        d.params.push_back(std::move(v));
    }
    for (const Node& n : g.nodes) {
        if (n.op == Op::Input) {
            d.input.resize(n.bytes());
            auto* x = reinterpret_cast<float*>(d.input.data());
            for (int64_t i = 0; i < numElements(n.shape); ++i) x[i] = nd(rng);
        }
        if (n.op == Op::Label) {
            d.label.resize(n.bytes());
            const int64_t rows = n.shape.empty() ? 1 : n.shape[0];
            if (n.dtype == DType::I32) {
                int64_t classes = 2;
                for (const Node& m : g.nodes)
                    if (m.op == Op::Loss) classes = g.node(m.inputs[0]).shape.back();
                auto* y = reinterpret_cast<int32_t*>(d.label.data());
                for (int64_t r = 0; r < rows; ++r)
                    y[r] = static_cast<int32_t>((r * 7 + 3) % classes);
            } else {
                auto* y = reinterpret_cast<float*>(d.label.data());
                const int64_t per = numElements(n.shape) / std::max<int64_t>(1, rows);
                for (int64_t r = 0; r < rows; ++r)
                    for (int64_t j = 0; j < per; ++j)
                        y[r * per + j] = (r + j) % per == 0 ? 1.f : 0.f;
            }
        }
    }
    return d;
}

#define CHECK_OK(expr, what)                                   \
    do {                                                       \
        auto&& r_ = (expr);                                    \
        if (!r_.ok()) {                                        \
            out.error = std::string(what) + ": " + r_.error(); \
            return out;                                        \
        }                                                      \
    } while (0)

Outcome runOn(Device& dev, const Graph& planned, const HostData& data, const Setup& setup) {
    Outcome out;
    std::vector<Buffer> owned;  // released at the end (the grads are views into `flat`)
    struct Releaser {
        Device& dev;
        std::vector<Buffer>& bufs;
        ~Releaser() {
            (void)dev.synchronize();
            for (Buffer& b : bufs) dev.release(b);
        }
    } releaser{dev, owned};
    auto alloc = [&](size_t bytes) -> Result<Buffer> {
        auto b = dev.allocate(std::max<size_t>(bytes, 64));
        if (b.ok()) owned.push_back(*b);
        return b;
    };
    const GradientPlan plan = planGradients(planned, setup.allReduce ? 256 : 0);
    ProgramBindings bind;
    auto flat = alloc(plan.bytes());
    CHECK_OK(flat, "flat gradients");
    bind.flatGrads = *flat;
    const std::vector<int> pids = planned.params();
    std::vector<Buffer> params;
    for (size_t i = 0; i < pids.size(); ++i) {
        const Node& p = planned.node(pids[i]);
        auto b = alloc(p.bytes());
        CHECK_OK(b, "param");
        CHECK_OK(dev.copyToDevice(*b, 0, data.params[i].data(), p.bytes()), "param upload");
        params.push_back(*b);
        if (plan.offsets[i] >= 0)
            bind.grads.push_back(
                Buffer{static_cast<char*>(flat->ptr) + plan.offsets[i] * 4, p.bytes()});
        else
            bind.grads.push_back(Buffer{});
        if (setup.update && p.attrs.trainableOr())
            for (int k = 0; k < setup.update->slotsPerParam(); ++k) {
                auto s = alloc(p.bytes());
                CHECK_OK(s, "slot");
                bind.optimizerSlots.push_back(*s);
            }
    }
    bind.params = params;
    bind.shadows.assign(pids.size(), Buffer{});
    for (const Node& n : planned.nodes)
        if (n.attrs.buf == BufKind::Shadow)
            for (size_t i = 0; i < pids.size(); ++i)
                if (pids[i] == n.inputs[0]) {
                    auto s = alloc(n.bytes());
                    CHECK_OK(s, "shadow");
                    bind.shadows[i] = *s;
                }
    auto input = alloc(data.input.size());
    CHECK_OK(input, "input");
    CHECK_OK(dev.copyToDevice(*input, 0, data.input.data(), data.input.size()), "input upload");
    bind.input = *input;
    if (!data.label.empty()) {
        auto label = alloc(data.label.size());
        CHECK_OK(label, "label");
        CHECK_OK(dev.copyToDevice(*label, 0, data.label.data(), data.label.size()), "label");
        bind.label = *label;
    } else {
        bind.label = *input;
    }
    auto acc = alloc(16 * sizeof(double));
    CHECK_OK(acc, "accumulators");
    bind.accumulators = *acc;
    bind.update = setup.update;
    bind.fuseUpdate = setup.fuseUpdate;
    SoloCollectives solo;
    std::unique_ptr<Collectives> nccl;
    if (setup.allReduce) {
        bind.collectives = &solo;
        bind.buckets = plan.buckets;
        if (setup.deviceReduce && dev.desc().kind == DeviceKind::Cuda) {
            auto dc = deviceCollectives({&dev}, {&solo}, 30);
            CHECK_OK(dc, "NCCL collectives");
            nccl = std::move((*dc)[0]);
            bind.collectives = nccl.get();
        }
    }
    if (setup.lossScale) {
        auto ls = alloc(sizeof(LossScaleState));
        CHECK_OK(ls, "loss scale");
        LossScaleState initial;
        initial.growthSteps = 2;  // the scale grows within the run
        CHECK_OK(dev.copyToDevice(*ls, 0, &initial, sizeof initial), "loss scale");
        bind.lossScale = *ls;
    }
    if (setup.directConv) setenv("TRAINDECK_CUDA_CUDNN", "0", 1);
    auto exe = compileProgram(dev, planned, bind);
    if (setup.directConv) unsetenv("TRAINDECK_CUDA_CUDNN");
    CHECK_OK(exe, "compile");
    for (int s = 1; s <= setup.steps; ++s) {
        StepArgs args;
        args.step = s;
        args.sampleBase = 100 * s;
        args.update = UpdateScalars{0.01f / static_cast<float>(s), 0.003f * s, 0.0001f};
        args.refreshShadows = s == 1;
        CHECK_OK((*exe)->run(args), "run step " + std::to_string(s));
    }
    CHECK_OK(dev.synchronize(), "synchronize");
    auto read = [&](const std::string& key, const void* ptr, size_t count, DType dt) -> Status {
        std::vector<char> host(count * dtypeSize(dt));
        TD_RETURN_IF_ERROR(dev.copyToHost(host.data(), Buffer{const_cast<void*>(ptr), host.size()},
                                          0, host.size()));
        std::vector<double>& v = out.values[key];
        for (size_t i = 0; i < count; ++i) {
            if (dt == DType::F32)
                v.push_back(reinterpret_cast<const float*>(host.data())[i]);
            else if (dt == DType::F64)
                v.push_back(reinterpret_cast<const double*>(host.data())[i]);
            else if (dt == DType::BF16)
                v.push_back(bf16ToFloat(reinterpret_cast<const uint16_t*>(host.data())[i]));
            else if (dt == DType::F16)
                v.push_back(f16ToFloat(reinterpret_cast<const uint16_t*>(host.data())[i]));
        }
        return Status::success();
    };
    for (const auto& [name, id] : planned.outputs) {
        const Node& n = planned.node(id);
        CHECK_OK(read("output " + name, (*exe)->valuePtr(id),
                      static_cast<size_t>(numElements(n.shape)), n.dtype),
                 "read " + name);
    }
    for (size_t i = 0; i < pids.size(); ++i) {
        const std::string pname = planned.node(pids[i]).attrs.name.value_or(std::to_string(i));
        CHECK_OK(read("param " + pname, params[i].ptr, params[i].bytes / 4, DType::F32), "read");
        if (bind.grads[i].ptr)
            CHECK_OK(read("grad " + pname, bind.grads[i].ptr, bind.grads[i].bytes / 4, DType::F32),
                     "read");
    }
    CHECK_OK(read("accumulators", acc->ptr, 4, DType::F64), "read accumulators");
    if (setup.lossScale) {
        LossScaleState ls;
        CHECK_OK(dev.copyToHost(&ls, bind.lossScale, 0, sizeof ls), "read loss scale");
        out.values["loss scale"] = {ls.scale, static_cast<double>(ls.goodSteps),
                                    static_cast<double>(ls.skippedSteps)};
    }
    if (setup.allReduce && !nccl && (solo.started == 0 || solo.started != solo.waited))
        out.error = "all-reduce: " + std::to_string(solo.started) + " buckets started, " +
                    std::to_string(solo.waited) + " waited";
    return out;
}

// The batch of a planned graph: the first dimension of its input.
int64_t batchOf(const Graph& g) {
    for (const Node& n : g.nodes)
        if (n.op == Op::Input && !n.shape.empty()) return n.shape[0];
    return 0;
}

// ||a - b|| / max(||a||, floor).
double relDiff(const std::vector<double>& a, const std::vector<double>& b) {
    double d = 0, n = 0;
    for (size_t i = 0; i < a.size(); ++i) {
        d += (a[i] - b[i]) * (a[i] - b[i]);
        n += a[i] * a[i];
    }
    return std::sqrt(d) / std::max(std::sqrt(n), 1e-6);
}

struct Case {
    std::string name;
    Graph planned;
    Setup setup;
    double tol = 1e-4;
    bool halfConv = false;  // built with bf16 convolutions: for devices that run them
};

ModelSpec mlp(ActivationKind hidden, double dropout, bool regularized,
              ActivationKind output = ActivationKind::Softmax, int64_t outputs = 10,
              bool hiddenBias = true) {
    ModelSpec m;
    LayerSpec flat;
    flat.type = LayerType::Flatten;
    flat.name = "flatten";
    flat.inputShape = {4, 5};
    m.layers.push_back(flat);
    auto dense = [](const std::string& name, int64_t units, ActivationKind act) {
        LayerSpec d;
        d.type = LayerType::Dense;
        d.name = name;
        d.units = units;
        d.activation = act;
        return d;
    };
    LayerSpec h = dense("dense", 48, hidden);
    h.useBias = hiddenBias;
    if (regularized) h.kernelRegularizer = RegularizerSpec{0.001, 0.01};
    m.layers.push_back(h);
    if (dropout > 0) {
        LayerSpec d;
        d.type = LayerType::Dropout;
        d.name = "dropout";
        d.rate = dropout;
        m.layers.push_back(d);
    }
    m.layers.push_back(dense("dense_1", 40, ActivationKind::Tanh));
    m.layers.push_back(dense("dense_2", outputs, output));
    return m;
}

// Conv2D (strides, dilation, groups, same padding), pooling, padding, rescaling, batch and layer
// normalization, global average pooling.
// `width` 2: twice the channels, so that every convolution sums 64 terms or more (computed in
// bf16 under halfConv).
ModelSpec imageStack(int64_t width = 1) {
    ModelSpec m;
    auto layer = [](LayerType t, const std::string& name) {
        LayerSpec l;
        l.type = t;
        l.name = name;
        return l;
    };
    LayerSpec in = layer(LayerType::Rescaling, "rescale");
    in.inputShape = {11, 10, 4 * width};
    in.rescale = 0.5;
    in.offset = 0.1;
    m.layers.push_back(in);
    LayerSpec c1 = layer(LayerType::Conv2D, "conv_same");
    c1.filters = 8 * width;
    c1.samePadding = true;
    c1.activation = ActivationKind::Relu;
    m.layers.push_back(c1);
    m.layers.push_back(layer(LayerType::BatchNormalization, "bn"));
    LayerSpec c2 = layer(LayerType::Conv2D, "conv_grouped");
    c2.filters = 8 * width;
    c2.groups = 2;
    c2.dilationRate = {2, 1};
    c2.activation = ActivationKind::Elu;
    m.layers.push_back(c2);
    LayerSpec pad = layer(LayerType::ZeroPadding2D, "pad");
    pad.zeroPadding = {1, 0, 2, 1};
    m.layers.push_back(pad);
    LayerSpec mp = layer(LayerType::MaxPooling2D, "maxpool");
    mp.poolSize = {3, 3};
    mp.strides = {2, 2};
    m.layers.push_back(mp);
    LayerSpec c3 = layer(LayerType::Conv2D, "conv_strided");
    c3.filters = 6;
    c3.kernelSize = {2, 3};
    c3.strides = {1, 2};
    c3.samePadding = true;
    m.layers.push_back(c3);
    m.layers.push_back(layer(LayerType::LayerNormalization, "ln"));
    LayerSpec ap = layer(LayerType::AveragePooling2D, "avgpool");
    ap.poolSize = {2, 2};
    ap.strides = {1, 1};
    ap.samePadding = true;
    m.layers.push_back(ap);
    m.layers.push_back(layer(LayerType::GlobalAveragePooling2D, "gap"));
    LayerSpec d = layer(LayerType::Dense, "out");
    d.units = 5;
    d.activation = ActivationKind::Softmax;
    m.layers.push_back(d);
    return m;
}

// Every image preprocessing and augmentation op: Resizing (cropped and padded to the aspect
// ratio, bilinear and nearest), a random crop, flips, rotation, zoom and translation with each of
// their fill modes and both interpolations, contrast and brightness, then a convolution followed
// by a RandomFlip and a CenterCrop that crops (both pass the gradient back), and a small head.
ModelSpec augmentStack() {
    ModelSpec m;
    auto layer = [](LayerType t, const std::string& name) {
        LayerSpec l;
        l.type = t;
        l.name = name;
        return l;
    };
    auto sized = [&](LayerType t, const std::string& name, int64_t h, int64_t w) {
        LayerSpec l = layer(t, name);
        l.targetHeight = h;
        l.targetWidth = w;
        return l;
    };
    LayerSpec in = layer(LayerType::Input, "input");
    in.inputShape = {13, 12, 3};
    m.layers.push_back(in);
    LayerSpec crop = sized(LayerType::Resizing, "resize_crop", 11, 10);
    crop.cropToAspectRatio = true;
    m.layers.push_back(crop);
    m.layers.push_back(sized(LayerType::RandomCrop, "random_crop", 9, 9));
    m.layers.push_back(layer(LayerType::RandomFlip, "flip"));
    LayerSpec rot = layer(LayerType::RandomRotation, "rotation");
    rot.factor = {-0.2, 0.2};
    m.layers.push_back(rot);
    LayerSpec zoom = layer(LayerType::RandomZoom, "zoom");
    zoom.heightFactor = {-0.2, 0.2};
    zoom.widthFactor = FactorRange{-0.1, 0.3};
    zoom.fillMode = FillModeKind::Wrap;
    zoom.interpolation = InterpolationKind::Nearest;
    m.layers.push_back(zoom);
    LayerSpec shift = layer(LayerType::RandomTranslation, "translation");
    shift.heightFactor = {-0.2, 0.2};
    shift.widthFactor = FactorRange{-0.2, 0.1};
    shift.fillMode = FillModeKind::Constant;
    shift.fillValue = 0.5;
    m.layers.push_back(shift);
    LayerSpec near = layer(LayerType::RandomRotation, "rotation_nearest");
    near.factor = {-0.1, 0.1};
    near.fillMode = FillModeKind::Nearest;
    near.interpolation = InterpolationKind::Nearest;
    m.layers.push_back(near);
    LayerSpec contrast = layer(LayerType::RandomContrast, "contrast");
    contrast.factor = {0.0, 0.4};
    contrast.valueLow = -3.0;
    contrast.valueHigh = 3.0;
    m.layers.push_back(contrast);
    LayerSpec bright = layer(LayerType::RandomBrightness, "brightness");
    bright.factor = {-0.2, 0.2};
    bright.valueLow = -1.0;
    bright.valueHigh = 1.0;
    m.layers.push_back(bright);
    LayerSpec pad = sized(LayerType::Resizing, "resize_pad", 8, 10);
    pad.padToAspectRatio = true;
    pad.fillValue = -0.25;
    pad.interpolation = InterpolationKind::Nearest;
    m.layers.push_back(pad);
    LayerSpec c = layer(LayerType::Conv2D, "conv");
    c.filters = 4;
    c.kernelSize = {2, 2};
    c.activation = ActivationKind::Tanh;
    m.layers.push_back(c);
    LayerSpec vflip = layer(LayerType::RandomFlip, "flip_after_conv");
    vflip.flipMode = FlipModeKind::Vertical;
    m.layers.push_back(vflip);
    m.layers.push_back(sized(LayerType::CenterCrop, "center_crop", 5, 6));
    m.layers.push_back(layer(LayerType::GlobalAveragePooling2D, "gap"));
    LayerSpec d = layer(LayerType::Dense, "out");
    d.units = 5;
    d.activation = ActivationKind::Softmax;
    m.layers.push_back(d);
    return m;
}

Result<Graph> plannedGraph(ModelSpec m, const LossConfig& loss,
                           const std::vector<std::string>& metrics, DType compute, int64_t batch,
                           bool lossScale, bool withUpdate, const std::set<std::string>& off = {},
                           GraphMode mode = GraphMode::Train, bool halfConv = false) {
    TD_ASSIGN_OR_RETURN(ModelInfo info, inferShapes(m));
    BuildOptions bo;
    bo.batch = batch;
    bo.seed = 11;
    bo.loss = loss;
    bo.metrics = metrics;
    bo.compute = compute;
    bo.halfConv = halfConv;
    bo.fuseSoftmaxXent = off.count("fuse_softmax_xent") == 0;
    bo.mode = mode;
    TD_ASSIGN_OR_RETURN(Graph g, buildGraph(m, info, bo));
    if (mode == GraphMode::Train) TD_RETURN_IF_ERROR(autodiff(g, lossScale));
    CompileOptions co;
    co.compute = compute;
    co.disabled = off;
    co.paramShadows = withUpdate;
    PassManager pm;
    addStandardPasses(pm, co);
    TD_RETURN_IF_ERROR(pm.run(g));
    return g;
}

double tolFor(DType compute) {
    return compute == DType::F32 ? 2e-4 : compute == DType::F16 ? 2e-2 : 6e-2;
}

UpdateSpec adam(bool amsgrad) {
    UpdateSpec s;
    s.kind = UpdateKind::Adam;
    s.oneMinusBeta1 = 0.1f;
    s.oneMinusBeta2 = 0.001f;
    s.amsgrad = amsgrad;
    s.epsilon = 1e-7f;
    return s;
}
UpdateSpec sgd() {
    UpdateSpec s;
    s.kind = UpdateKind::Sgd;
    s.momentum = 0.9f;
    s.nesterov = true;
    s.clip = ClipKind::Value;
    s.clipValue = 0.05;
    return s;
}
UpdateSpec rmsprop() {
    UpdateSpec s;
    s.kind = UpdateKind::RmsProp;
    s.rho = 0.9f;
    s.oneMinusRho = 0.1f;
    s.momentum = 0.5f;
    s.centered = true;
    s.epsilon = 1e-7f;
    s.clip = ClipKind::GlobalNorm;
    s.clipValue = 0.5;
    s.decay = true;
    return s;
}

// A backend under test: its name in the report, its device, and the device's own passes it
// turns off (Graph::passesOff).
struct Backend {
    std::string name;
    std::unique_ptr<Device> device;
    std::set<std::string> passesOff;
};

}  // namespace

int main() {
    auto cpu = openDevice("cpu:0");
    if (!cpu.ok()) {
        std::printf("FAIL: cpu:0: %s\n", cpu.error().c_str());
        return 1;
    }
    Device* reference = cpu->get();
    std::vector<Backend> backends;
    for (const DeviceDesc& g : cudaDevices()) {
        auto d = openDevice(g.id);
        if (!d.ok()) {
            std::printf("FAIL: %s is listed but does not open: %s\n", g.id.c_str(),
                        d.error().c_str());
            return 1;
        }
        backends.push_back({g.id + " (" + g.name + ")", std::move(d).value(), {}});
    }
    if (backends.empty()) {
        auto d = openDevice("cuda:0");
        std::printf("no CUDA device (%s): the CPU configurations alone are tested\n",
                    d.ok() ? "none enumerated" : d.error().c_str());
    }
    backends.push_back({"cpu:0 on one thread", makeCpuDevice(1), {}});
    // The CPU as a plain executor of the lowered program: every rewrite of its own off.
    const std::vector<std::string>& cpuPasses = cpuPassNames();
    backends.push_back({"cpu:0 with every CPU pass off", makeCpuDevice(0),
                        std::set<std::string>(cpuPasses.begin(), cpuPasses.end())});

    const UpdateSpec specAdam = adam(false), specAms = adam(true), specSgd = sgd(),
                     specRms = rmsprop();
    std::vector<Case> cases;
    std::vector<std::string> buildErrors;
    auto add = [&](const std::string& name, Result<Graph> g, Setup setup, double tol,
                   bool halfConv = false) {
        if (!g.ok()) {
            buildErrors.push_back(name + ": " + g.error());
            return;
        }
        cases.push_back(Case{name, std::move(g).value(), setup, tol, halfConv});
    };
    // bf16 convolutions (mixed_bfloat16 where the device runs them): cases of their own, where
    // the reference (this CPU) has them, or a GPU under test has them and this CPU can run them
    // at all (oneDNN's slower kernels serve where it has no native one, but below AVX-512 it has
    // none); a backend without them skips those cases.
    bool halfConv = reference->halfConvolutions(DType::BF16);
    for (const Backend& b : backends)
        if (!halfConv && b.name.starts_with("cuda:") && b.device->halfConvolutions(DType::BF16)) {
            Setup probe;
            probe.steps = 1;
            auto g = plannedGraph(imageStack(2), LossConfig{}, {}, DType::BF16, 6, false, true, {},
                                  GraphMode::Train, true);
            const Outcome o =
                g.ok() ? runOn(*reference, *g, makeData(*g, 1), probe) : Outcome{{}, g.error()};
            if (o.error.empty())
                halfConv = true;
            else
                std::printf(
                    "%s has bf16 convolutions, this CPU cannot run them (%s): no "
                    "bf16-convolution cases\n",
                    b.name.c_str(), o.error.c_str());
        }
    if (!halfConv) std::printf("no bf16 convolution here: no bf16-convolution cases\n");
    LossConfig sparse;  // the default: sparse categorical cross-entropy on probabilities
    const std::vector<std::string> acc{"accuracy"};
    const std::vector<std::pair<const char*, ActivationKind>> acts = {
        {"relu", ActivationKind::Relu},       {"gelu", ActivationKind::Gelu},
        {"elu", ActivationKind::Elu},         {"tanh", ActivationKind::Tanh},
        {"sigmoid", ActivationKind::Sigmoid}, {"leaky_relu", ActivationKind::LeakyRelu}};
    for (DType dt : {DType::F32, DType::BF16, DType::F16}) {
        const bool ls = dt == DType::F16;
        for (const auto& [an, ak] : acts) {
            Setup s;
            s.update = &specAdam;
            s.lossScale = ls;
            add(std::string("mlp ") + an + " " + dtypeName(dt),
                plannedGraph(mlp(ak, 0.25, true), sparse, acc, dt, 32, ls, true), s, tolFor(dt));
        }
        Setup s;
        s.update = &specSgd;
        s.fuseUpdate = false;
        s.lossScale = ls;
        add(std::string("mlp sgd per-parameter ") + dtypeName(dt),
            plannedGraph(mlp(ActivationKind::Relu, 0.0, false), sparse, acc, dt, 16, ls, true), s,
            tolFor(dt));
        s.update = &specRms;
        s.fuseUpdate = true;
        add(std::string("mlp rmsprop global clip, no fusion ") + dtypeName(dt),
            plannedGraph(mlp(ActivationKind::Relu, 0.1, false), sparse, acc, dt, 16, ls, true,
                         {"fusion", "fuse_softmax_xent"}),
            s, tolFor(dt));
    }
    {
        Setup s;
        s.update = &specAms;
        s.allReduce = true;
        add("mlp all-reduce buckets f32",
            plannedGraph(mlp(ActivationKind::Relu, 0.25, false), sparse, acc, DType::F32, 8, false,
                         true),
            s, 2e-4);
        s.deviceReduce = true;
        add("mlp all-reduce buckets NCCL f32",
            plannedGraph(mlp(ActivationKind::Relu, 0.25, false), sparse, acc, DType::F32, 8, false,
                         true),
            s, 2e-4);
        Setup noUpdate;
        add("mlp gradients only f32",
            plannedGraph(mlp(ActivationKind::Gelu, 0.0, false), sparse, acc, DType::F32, 8, false,
                         false),
            noUpdate, 2e-4);
    }
    // Every loss kernel (fused with its softmax / sigmoid and not) and every metric kernel.
    struct LossCase {
        const char* name;
        const char* loss;
        bool fromLogits;
        ActivationKind output;
        int64_t units;
        std::vector<std::string> metrics;
    };
    const std::vector<LossCase> losses = {
        {"categorical",
         "categorical_crossentropy",
         false,
         ActivationKind::Softmax,
         10,
         {"accuracy", "top_k_categorical_accuracy"}},
        {"sparse from logits",
         "sparse_categorical_crossentropy",
         true,
         ActivationKind::Linear,
         10,
         {"accuracy", "sparse_top_k_categorical_accuracy"}},
        {"binary", "binary_crossentropy", false, ActivationKind::Sigmoid, 3, {"accuracy"}},
        {"binary from logits",
         "binary_crossentropy",
         true,
         ActivationKind::Linear,
         3,
         {"accuracy"}},
        {"mse", "mean_squared_error", false, ActivationKind::Linear, 4, {}}};
    for (const LossCase& lc : losses)
        for (bool fused : {true, false}) {
            LossConfig loss;
            loss.name = lc.loss;
            loss.fromLogits = lc.fromLogits;
            Setup s;
            s.update = &specAdam;
            std::set<std::string> off;
            if (!fused) off = {"fuse_softmax_xent", "fusion"};
            add(std::string("loss ") + lc.name + (fused ? " fused" : " unfused") + " f32",
                plannedGraph(mlp(ActivationKind::Relu, 0.0, false, lc.output, lc.units, false),
                             loss, lc.metrics, DType::F32, 12, false, true, off),
                s, 2e-4);
        }
    {
        Setup s;
        s.update = &specAdam;
        add("image stack f32",
            plannedGraph(imageStack(), sparse, {"accuracy", "sparse_top_k_categorical_accuracy"},
                         DType::F32, 6, false, true),
            s, 5e-4);
        // cuDNN's convolution and the bias/ReLU kernel apart (the device pass off).
        auto apart = plannedGraph(imageStack(), sparse, {"accuracy"}, DType::F32, 6, false, true);
        if (apart.ok()) apart->passesOff.insert("cuda_fused_conv");
        add("image stack f32, convolution and bias/ReLU apart", std::move(apart), s, 5e-4);
        Setup eval;  // batch normalization with the moving statistics, no gradients
        add("image stack eval f32",
            plannedGraph(imageStack(), sparse, {"accuracy"}, DType::F32, 6, false, false, {},
                         GraphMode::Eval),
            eval, 5e-4);
        add("mlp predict bf16",
            plannedGraph(mlp(ActivationKind::Gelu, 0.25, false), sparse, {}, DType::BF16, 5, false,
                         false, {}, GraphMode::Predict),
            eval, tolFor(DType::BF16));
        add("augmentation stack f32",
            plannedGraph(augmentStack(), sparse, {"accuracy"}, DType::F32, 6, false, true), s,
            5e-4);
        add("augmentation stack eval f32",
            plannedGraph(augmentStack(), sparse, {"accuracy"}, DType::F32, 6, false, false, {},
                         GraphMode::Eval),
            eval, 5e-4);
        if (halfConv)
            add("image stack bf16, bf16 convolutions",
                plannedGraph(imageStack(2), sparse, {"accuracy"}, DType::BF16, 6, false, true, {},
                             GraphMode::Train, true),
                s, tolFor(DType::BF16), true);
        s.directConv = true;
        // A GPU's direct kernels are f32: its bf16 convolutions widen, convolve and narrow.
        if (halfConv)
            add("image stack bf16, bf16 convolutions by the direct kernels",
                plannedGraph(imageStack(2), sparse, {"accuracy"}, DType::BF16, 6, false, true, {},
                             GraphMode::Train, true),
                s, tolFor(DType::BF16), true);
        add("image stack, direct convolutions f32",
            plannedGraph(imageStack(), sparse, {"accuracy", "sparse_top_k_categorical_accuracy"},
                         DType::F32, 6, false, true),
            s, 5e-4);
    }
    for (const char* file :
         {"fashion_mnist_cnn.json", "fashion_mnist_mlp.json", "csv_iris_like.json",
          "synthetic_blobs.json", "fashion_mnist_folder_cnn_augmented.json"}) {
        auto project = loadProject(std::string(td::dev::kSourceDir) + "/projects/" + file);
        if (!project.ok()) {
            buildErrors.push_back(std::string(file) + ": " + project.error());
            continue;
        }
        for (DType dt : {DType::F32, DType::BF16}) {
            Setup s;
            s.update = &specAdam;
            s.steps = 2;
            add(std::string("project ") + file + " " + dtypeName(dt),
                plannedGraph(project->model, project->training.loss, project->training.metrics, dt,
                             8, false, true),
                s, tolFor(dt) * 2);
        }
        if (halfConv && std::string(file).find("cnn") != std::string::npos) {
            Setup s;
            s.update = &specAdam;
            s.steps = 2;
            add(std::string("project ") + file + " bf16, bf16 convolutions",
                plannedGraph(project->model, project->training.loss, project->training.metrics,
                             DType::BF16, 8, false, true, {}, GraphMode::Train, true),
                s, tolFor(DType::BF16) * 2, true);
        }
    }

    int failed = 0;
    for (const std::string& e : buildErrors) {
        std::printf("FAIL (build) %s\n", e.c_str());
        ++failed;
    }
    for (const Backend& b : backends)
        for (const Case& c : cases) {
            if (c.halfConv && !b.device->halfConvolutions(DType::BF16)) {
                std::printf("skip %s on %s: it runs convolutions in f32\n", c.name.c_str(),
                            b.name.c_str());
                continue;
            }
            const HostData data = makeData(c.planned, 3);
            const Outcome ref = runOn(*reference, c.planned, data, c.setup);
            Graph planned = c.planned;
            planned.passesOff.insert(b.passesOff.begin(), b.passesOff.end());
            const Outcome got = runOn(*b.device, planned, data, c.setup);
            if (!ref.error.empty() || !got.error.empty()) {
                std::printf("FAIL %s on %s: cpu:0: %s | %s: %s\n", c.name.c_str(), b.name.c_str(),
                            ref.error.empty() ? "ok" : ref.error.c_str(), b.name.c_str(),
                            got.error.empty() ? "ok" : got.error.c_str());
                ++failed;
                continue;
            }
            double worst = 0;
            std::string worstKey;
            const int64_t batch = batchOf(c.planned);
            std::string flips;
            for (const auto& [key, want] : ref.values) {
                auto it = got.values.find(key);
                if (it == got.values.end() || it->second.size() != want.size()) {
                    worst = INFINITY;
                    worstKey = key + " (missing)";
                    break;
                }
                // An accuracy output is the step's count of correct argmax decisions: in 16-bit
                // compute, a sample whose two best classes are closer than the dtype's rounding may
                // go either way, so the count may differ by up to tolerance x batch samples (an
                // untrained net's near-uniform outputs have several such samples; one flip of four
                // correct is 25% relative). In f32 it is compared as everything else. The
                // loss-scale state is exact; everything else within the case's tolerance.
                if (c.tol > 1e-3 && key.starts_with("output ") &&
                    key.find("accuracy") != key.npos && want.size() == 1 && batch > 0) {
                    const double samples = std::fabs(want[0] - it->second[0]);
                    const double allowed = std::ceil(c.tol * double(batch));
                    if (samples <= allowed + 1e-6) {
                        if (samples > 0.5)
                            flips += " (" + key + ": " + std::to_string(std::lround(samples)) +
                                     " of " + std::to_string(batch) +
                                     " samples decided otherwise, " +
                                     std::to_string(std::lround(allowed)) + " allowed)";
                        continue;
                    }
                }
                const double d = key == "loss scale" ? (want == it->second ? 0.0 : INFINITY)
                                                     : relDiff(want, it->second);
                if (!(d <= worst)) {
                    worst = d;
                    worstKey = key;
                }
            }
            const bool ok = worst <= c.tol;
            std::printf("%s %s on %s: worst relative difference %.3g (%s), tolerance %.3g%s\n",
                        ok ? "ok  " : "FAIL", c.name.c_str(), b.name.c_str(), worst,
                        worstKey.c_str(), c.tol, flips.c_str());
            if (!ok) ++failed;
        }
    std::printf("%d of %zu cases failed on %zu backends\n", failed,
                (cases.size() + buildErrors.size()) * backends.size(), backends.size());
    return failed == 0 ? 0 : 1;
}

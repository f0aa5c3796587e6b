// Mixed precision and the fusing passes: 16-bit conversions, cast insertion, whole models compiled
// with every pass on and with each pass off (loss and gradients equal: bit for bit in float32,
// within the 16-bit formats' tolerance otherwise), the update with and without fuse_update, and
// dynamic loss scaling (an overflow skips the step and halves the scale; the scale grows after
// its interval).
#include <xmmintrin.h>
#include <QtTest>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>

#include "engine/backend/backend.h"
#include "engine/backend/cpu/update.h"
#include "engine/core/half.h"
#include "engine/graph/lower.h"
#include "engine/io/project.h"
#include "harness.h"
#include "tests/source_dir.h"

using namespace td;
using tdtest::Harness;

namespace {

LayerSpec dense(const std::string& name, int64_t units, ActivationKind act) {
    LayerSpec d;
    d.type = LayerType::Dense;
    d.name = name;
    d.units = units;
    d.activation = act;
    return d;
}

// Flatten [4,5] -> dense(8, act) [-> activation layer] -> dropout -> dense(3, softmax).
ModelSpec mlp(ActivationKind hidden, bool separateActivation = false, double dropout = 0.25) {
    ModelSpec m;
    LayerSpec flat;
    flat.type = LayerType::Flatten;
    flat.name = "flatten";
    flat.inputShape = {4, 5};
    m.layers.push_back(flat);
    m.layers.push_back(dense("dense", 8, separateActivation ? ActivationKind::Linear : hidden));
    if (separateActivation) {
        LayerSpec a;
        a.type = LayerType::Activation;
        a.name = "activation";
        a.activation = hidden;
        m.layers.push_back(a);
    }
    if (dropout > 0) {
        LayerSpec drop;
        drop.type = LayerType::Dropout;
        drop.name = "dropout";
        drop.rate = dropout;
        m.layers.push_back(drop);
    }
    m.layers.push_back(dense("dense_1", 7, ActivationKind::Tanh));
    m.layers.push_back(dense("dense_2", 3, ActivationKind::Softmax));
    return m;
}

constexpr int64_t kBatch = 6;

struct StepResult {
    double loss = 0;
    std::vector<std::vector<float>> grads;
    std::vector<std::vector<float>> params;  // after the update, when there is one
    std::string error;
};

// A small CNN: [6,6,2] -> Conv2D(8, 3x3 same, act) (sums of 18 terms: f32 under halfConv) ->
// BatchNormalization -> Conv2D(8, 3x3 same, act) -> Conv2D(6, 3x3 valid, act) (72 terms each:
// 16-bit under halfConv) -> Flatten -> Dense(3, softmax).
ModelSpec cnn(ActivationKind act = ActivationKind::Relu) {
    ModelSpec m;
    LayerSpec in;
    in.type = LayerType::Input;
    in.name = "input";
    in.inputShape = {6, 6, 2};
    m.layers.push_back(in);
    auto conv = [act](const std::string& name, int64_t filters, bool same) {
        LayerSpec c;
        c.type = LayerType::Conv2D;
        c.name = name;
        c.filters = filters;
        c.kernelSize = {3, 3};
        c.samePadding = same;
        c.activation = act;
        return c;
    };
    m.layers.push_back(conv("conv_a", 8, true));
    LayerSpec bn;
    bn.type = LayerType::BatchNormalization;
    bn.name = "bn";
    m.layers.push_back(bn);
    m.layers.push_back(conv("conv_b", 8, true));
    m.layers.push_back(conv("conv_c", 6, false));  // [4,4,6]
    LayerSpec flat;
    flat.type = LayerType::Flatten;
    flat.name = "flatten";
    m.layers.push_back(flat);
    m.layers.push_back(dense("dense", 3, ActivationKind::Softmax));
    return m;
}

// The loss and metrics of a project's training (a small MLP's default otherwise), and whether
// convolutions compute in the 16-bit dtype (BuildOptions::halfConv).
struct Objective {
    LossConfig loss;
    std::vector<std::string> metrics{"accuracy"};
    bool halfConv = false;
};

const Objective& defaultObjective() {
    static const Objective o;
    return o;
}

Graph trainGraph(const ModelSpec& model, DType compute, bool pairLoss, bool lossScale,
                 const Objective& obj = defaultObjective()) {
    ModelSpec m = model;
    auto info = inferShapes(m);
    if (!info.ok()) qFatal("%s", info.error().c_str());
    BuildOptions bo;
    bo.batch = kBatch;
    bo.seed = 5;
    bo.loss = obj.loss;
    bo.metrics = obj.metrics;
    bo.compute = compute;
    bo.halfConv = obj.halfConv;
    bo.fuseSoftmaxXent = pairLoss;
    auto g = buildGraph(m, *info, bo);
    if (!g.ok()) qFatal("%s", g.error().c_str());
    if (!autodiff(*g, lossScale).ok()) qFatal("autodiff failed");
    return std::move(g).value();
}

// One training step of `model` with deterministic parameters and batch; with `update`, also the
// optimizer step (parameters read back after it).
StepResult runStep(const ModelSpec& model, DType compute, const std::set<std::string>& off,
                   const UpdateSpec* update = nullptr, float inputScale = 1.0f,
                   bool lossScale = false, Harness* keep = nullptr,
                   const Objective& obj = defaultObjective()) {
    StepResult r;
    CompileOptions co;
    co.compute = compute;
    co.disabled = off;
    co.paramShadows = true;
    Harness local;
    Harness& h = keep ? *keep : local;
    tdtest::HarnessOptions ho;
    ho.passes = &co;
    ho.update = update;
    ho.lossScale = lossScale;
    ho.fuseUpdate = off.count("fuse_update") == 0;
    Graph g = trainGraph(model, compute, off.count("fuse_softmax_xent") == 0, lossScale, obj);
    const Node* labelNode = nullptr;
    for (const Node& n : g.nodes)
        if (n.op == Op::Label) labelNode = &n;
    const DType labelType = labelNode ? labelNode->dtype : DType::I32;
    const Shape labelShape = labelNode ? labelNode->shape : Shape{kBatch};
    int64_t classes = 1;
    for (const Node& n : g.nodes)
        if (n.op == Op::Loss) classes = g.node(n.inputs[0]).shape.back();
    if (!h.compile(std::move(g), {}, &r.error, ho)) return r;
    std::mt19937 rng(7);
    std::normal_distribution<float> nd(0.f, 0.5f);
    // Kernels scaled by 1/sqrt(fan-in) (as initializers do), so activations stay in range.
    const std::vector<int> pids = h.g.params();
    for (size_t i = 0; i < h.params.size(); ++i) {
        const Shape& shape = h.g.node(pids[i]).shape;
        const int64_t fanIn = shape.size() == 2   ? shape[0]
                              : shape.size() == 4 ? shape[0] * shape[1] * shape[2]
                                                  : 0;
        const float scale = fanIn > 0 ? 2.0f / std::sqrt(static_cast<float>(fanIn)) : 0.2f;
        float* p = h.param(i);
        for (size_t k = 0; k < h.params[i].bytes / 4; ++k) p[k] = nd(rng) * scale;
    }
    for (size_t k = 0; k < h.input.bytes / 4; ++k) h.in()[k] = nd(rng) * inputScale;
    if (labelType == DType::I32) {
        auto* lab = static_cast<int32_t*>(h.lab());
        for (int64_t k = 0; k < kBatch; ++k) lab[k] = static_cast<int32_t>(k % classes);
    } else {  // one-hot or 0/1 targets
        auto* lab = static_cast<float*>(h.lab());
        const int64_t per = numElements(labelShape) / kBatch;
        for (int64_t k = 0; k < kBatch; ++k)
            for (int64_t j = 0; j < per; ++j) lab[k * per + j] = (k + j) % per == 0 ? 1.f : 0.f;
    }
    UpdateScalars us{0.01f, 0.01f, 0.0f};
    h.run(3, 0, us, true);
    r.loss = *h.output("loss");
    for (size_t i = 0; i < h.grads.size(); ++i) {
        const float* gp = h.grad(i);
        r.grads.emplace_back(gp, gp + h.grads[i].bytes / 4);
        const float* pp = h.param(i);
        r.params.emplace_back(pp, pp + h.params[i].bytes / 4);
    }
    return r;
}

// ||a - b|| / ||a|| over every gradient (a unit near relu's kink may flip between roundings;
// the norm weighs that by its size).
double relDiff(const std::vector<std::vector<float>>& a, const std::vector<std::vector<float>>& b) {
    double diff = 0, norm = 1e-24;
    for (size_t i = 0; i < a.size(); ++i)
        for (size_t k = 0; k < a[i].size(); ++k) {
            const double d = static_cast<double>(a[i][k]) - b[i][k];
            diff += d * d;
            norm += static_cast<double>(a[i][k]) * a[i][k];
        }
    return std::sqrt(diff / norm);
}

const std::vector<std::string> kPasses = {"fusion",           "fold_casts", "fuse_act_bias_grad",
                                          "fuse_elementwise", "dce",        "fuse_softmax_xent"};

}  // namespace

class TestPrecision : public QObject {
    Q_OBJECT
  private slots:
    void halfRoundTrips();
    void halfRounding();
    void castInsertion();
    void foldedCastsAndShadows();
    void passesOffEqualFloat32_data();
    void passesOffEqualFloat32();
    void passesOffEqualHalf_data();
    void passesOffEqualHalf();
    void halfCloseToFloat32();
    void halfConvolutionCasts();
    void halfConvolutionsCloseToFloat32();
    void wholeProjectsPassesOff_data();
    void wholeProjectsPassesOff();
    void updateFusedEqualsPerTensor();
    void lossScalingSkipsAndGrows();
    void lossScaledStepEqualsUnscaled();
};

void TestPrecision::halfRoundTrips() {
    // Every 16-bit value converts to float and back to itself (NaNs stay NaNs).
    for (uint32_t h = 0; h < 65536; ++h) {
        const auto v = static_cast<uint16_t>(h);
        const float fb = bf16ToFloat(v);
        if (std::isnan(fb))
            QVERIFY(std::isnan(bf16ToFloat(floatToBf16(fb))));
        else
            QCOMPARE(floatToBf16(fb), v);
        const float fh = f16ToFloat(v);
        if (std::isnan(fh))
            QVERIFY(std::isnan(f16ToFloat(floatToF16(fh))));
        else
            QCOMPARE(floatToF16(fh), v);
    }
    // The array forms (F16C where the CPU has it) give the scalar code's bits: every half, and
    // floats across the whole range (normals, float denormals, half subnormals, ties, overflow,
    // NaN), with flush-to-zero and denormals-are-zero on as training threads run.
    {
        std::vector<uint16_t> all(65536);
        for (uint32_t k = 0; k < 65536; ++k) all[k] = static_cast<uint16_t>(k);
        std::vector<float> a(65536), b(65536);
        castF16ToF32(all.data(), a.data(), 65536);
        castF16ToF32Portable(all.data(), b.data(), 65536);
        QVERIFY(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
        std::mt19937 rng(11);
        std::vector<float> f(1 << 20);
        for (size_t k = 0; k < f.size(); ++k) {
            uint32_t bits = static_cast<uint32_t>(rng());
            if (k % 4 == 1)
                bits = (bits & 0x807fffffu) | ((100u + bits % 60u) << 23);  // near halves
            if (k % 4 == 2) bits = (bits & 0x80001fffu) | 0x38000000u;      // ties around 2^-15
            f[k] = std::bit_cast<float>(bits);
        }
        std::vector<uint16_t> h1(f.size()), h2(f.size());
        const unsigned csr = _mm_getcsr();
        _mm_setcsr(csr | 0x8040);
        castF32ToF16(f.data(), h1.data(), static_cast<int64_t>(f.size()));
        castF32ToF16Portable(f.data(), h2.data(), static_cast<int64_t>(f.size()));
        castF16ToF32(all.data(), a.data(), 65536);
        _mm_setcsr(csr);
        for (size_t k = 0; k < f.size(); ++k)
            if (h1[k] != h2[k])
                QFAIL(qPrintable(QString("float %1 (0x%2): hardware 0x%3, portable 0x%4")
                                     .arg(static_cast<double>(f[k]))
                                     .arg(std::bit_cast<uint32_t>(f[k]), 0, 16)
                                     .arg(h1[k], 0, 16)
                                     .arg(h2[k], 0, 16)));
        QVERIFY(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
    }
    // The array forms agree with the scalar ones.
    std::vector<float> x{0.f, -0.f, 1.f, 65504.f, 65520.f, 1e-8f, -3.14159f, 1e30f};
    std::vector<uint16_t> h(x.size());
    castF32ToF16(x.data(), h.data(), static_cast<int64_t>(x.size()));
    for (size_t i = 0; i < x.size(); ++i) QCOMPARE(h[i], floatToF16(x[i]));
    castF32ToBf16(x.data(), h.data(), static_cast<int64_t>(x.size()));
    for (size_t i = 0; i < x.size(); ++i) QCOMPARE(h[i], floatToBf16(x[i]));
}

void TestPrecision::halfRounding() {
    QCOMPARE(f16ToFloat(floatToF16(65504.f)), 65504.f);
    QVERIFY(std::isinf(f16ToFloat(floatToF16(65520.f))));  // rounds up past the largest half
    QCOMPARE(f16ToFloat(floatToF16(65519.f)), 65504.f);
    QCOMPARE(f16ToFloat(floatToF16(5.9604645e-8f)), 5.9604645e-8f);  // smallest subnormal
    QCOMPARE(f16ToFloat(floatToF16(2.9802322e-8f)), 0.f);            // a tie rounds to even: 0
    QCOMPARE(f16ToFloat(floatToF16(1.f + 1.f / 2048)), 1.f);         // tie to even
    QCOMPARE(f16ToFloat(floatToF16(1.f + 3.f / 2048)), 1.f + 2.f / 1024);
    QCOMPARE(bf16ToFloat(floatToBf16(1.f + 1.f / 256)), 1.f);  // tie to even
    QCOMPARE(bf16ToFloat(floatToBf16(1.f + 3.f / 256)), 1.f + 2.f / 128);
    QVERIFY(std::isnan(bf16ToFloat(floatToBf16(std::numeric_limits<float>::quiet_NaN()))));
    QVERIFY(std::isinf(bf16ToFloat(floatToBf16(std::numeric_limits<float>::infinity()))));
}

void TestPrecision::castInsertion() {
    for (DType dt : {DType::BF16, DType::F16}) {
        Graph g = trainGraph(mlp(ActivationKind::Relu), dt, true, false);
        QVERIFY(verifyGraph(g).ok());
        int casts = 0;
        for (const Node& n : g.nodes) {
            if (n.op == Op::Cast) ++casts;
            if (n.op == Op::MatMul) {
                QCOMPARE(g.node(n.inputs[0]).dtype, dt);
                QCOMPARE(g.node(n.inputs[1]).dtype, dt);
            }
            if (n.op == Op::Loss || n.op == Op::Metric || n.op == Op::LossGrad)
                QCOMPARE(g.node(n.inputs[0]).dtype, DType::F32);
            if (n.op == Op::Param) QCOMPARE(n.dtype, DType::F32);
        }
        QVERIFY(casts >= 5);  // the input, three kernels, the logits (and their gradients)
        QCOMPARE(g.node(g.output("predictions")).dtype, DType::F32);
        for (const auto& [p, gr] : g.grads) QCOMPARE(g.node(gr).dtype, DType::F32);
        // The text form holds the casts and dtypes.
        auto back = parseGraph(printGraph(g));
        QVERIFY(back.ok());
        QCOMPARE(printGraph(*back), printGraph(g));
    }
}

void TestPrecision::foldedCastsAndShadows() {
    Graph g = trainGraph(mlp(ActivationKind::Relu), DType::BF16, true, false);
    CompileOptions co;
    co.compute = DType::BF16;
    co.paramShadows = true;
    PassManager pm;
    addStandardPasses(pm, co);
    QVERIFY(pm.run(g).ok());
    int shadows = 0, casts = 0;
    for (const Node& n : g.nodes) {
        if (n.op != Op::Cast) continue;
        ++casts;
        if (n.attrs.buf == BufKind::Shadow) ++shadows;
    }
    QCOMPARE(shadows, 3);    // one per kernel
    QCOMPARE(casts, 3 + 1);  // the shadows and the input's cast
    // Gradients come out of their products in f32: no cast between.
    for (const auto& [p, gr] : g.grads) QVERIFY(g.node(gr).op != Op::Cast);
    // The lowered training step refreshes shadows only on request, and its update writes them.
    UpdateSpec sgd;
    sgd.kind = UpdateKind::Sgd;
    LowerOptions lo;
    lo.update = &sgd;
    auto lp = lower(g, lo);
    QVERIFY2(lp.ok(), lp.ok() ? "" : lp.error().c_str());
    int refresh = 0;
    for (const Instr& i : lp->code) refresh += i.op == InstrOp::Cast && i.refreshOnly;
    QCOMPARE(refresh, 3);
    int written = 0;
    for (const auto& u : lp->updateTensors) written += u.shadow.space == Space::Shadow;
    QCOMPARE(written, 3);
    QVERIFY(printProgram(*lp).find("{shadows=3}") != std::string::npos);
}

void TestPrecision::passesOffEqualFloat32_data() {
    QTest::addColumn<int>("act");
    QTest::addColumn<bool>("separate");
    for (ActivationKind a : {ActivationKind::Relu, ActivationKind::Tanh, ActivationKind::Sigmoid,
                             ActivationKind::Elu, ActivationKind::Gelu, ActivationKind::LeakyRelu})
        for (bool sep : {false, true})
            QTest::newRow((std::to_string(static_cast<int>(a)) + (sep ? " act layer" : "")).c_str())
                << static_cast<int>(a) << sep;
}

// In float32 every fused kernel computes exactly what its chain computes: loss and gradients are
// equal bit for bit with each pass off and with all of them off.
void TestPrecision::passesOffEqualFloat32() {
    QFETCH(int, act);
    QFETCH(bool, separate);
    const ModelSpec m = mlp(static_cast<ActivationKind>(act), separate);
    const StepResult all = runStep(m, DType::F32, {});
    QVERIFY2(all.error.empty(), all.error.c_str());
    std::vector<std::set<std::string>> variants;
    for (const auto& p : kPasses) variants.push_back({p});
    variants.push_back(std::set<std::string>(fusionPassNames().begin(), fusionPassNames().end()));
    for (const auto& off : variants) {
        const StepResult r = runStep(m, DType::F32, off);
        QVERIFY2(r.error.empty(), r.error.c_str());
        const std::string what = *off.begin() + (off.size() > 1 ? " and the rest" : "");
        if (off.count("fuse_softmax_xent") || off.count("fusion")) {
            // The loss from probabilities differs from the one from logits in rounding only, and
            // oneDNN's bias and eltwise post-ops round as its own kernels do, not as ours.
            QVERIFY2(std::fabs(r.loss - all.loss) < 1e-5 * std::fabs(all.loss), what.c_str());
            QVERIFY2(relDiff(all.grads, r.grads) < 1e-5, what.c_str());
            continue;
        }
        QVERIFY2(r.loss == all.loss, what.c_str());
        for (size_t i = 0; i < all.grads.size(); ++i)
            QVERIFY2(all.grads[i] == r.grads[i],
                     (what + ", gradient " + std::to_string(i)).c_str());
    }
}

void TestPrecision::passesOffEqualHalf_data() {
    QTest::addColumn<int>("dtype");
    QTest::newRow("bf16") << static_cast<int>(DType::BF16);
    QTest::newRow("f16") << static_cast<int>(DType::F16);
}

// In 16 bits a folded cast rounds once instead of twice: equal within the format's tolerance.
void TestPrecision::passesOffEqualHalf() {
    QFETCH(int, dtype);
    const DType dt = static_cast<DType>(dtype);
    const double tol = dt == DType::BF16 ? 3e-2 : 4e-3;
    for (bool separate : {false, true}) {
        const ModelSpec m = mlp(ActivationKind::Gelu, separate);
        const StepResult all = runStep(m, dt, {});
        QVERIFY2(all.error.empty(), all.error.c_str());
        std::vector<std::set<std::string>> variants;
        for (const auto& p : kPasses) variants.push_back({p});
        variants.push_back(
            std::set<std::string>(fusionPassNames().begin(), fusionPassNames().end()));
        for (const auto& off : variants) {
            const StepResult r = runStep(m, dt, off);
            QVERIFY2(r.error.empty(), r.error.c_str());
            const std::string what = *off.begin() + (off.size() > 1 ? " and the rest" : "");
            QVERIFY2(std::fabs(r.loss - all.loss) < tol * std::fabs(all.loss), what.c_str());
            const double d = relDiff(all.grads, r.grads);
            QVERIFY2(d < tol, (what + ": relative difference " + std::to_string(d)).c_str());
        }
    }
}

void TestPrecision::wholeProjectsPassesOff_data() {
    QTest::addColumn<QString>("name");
    QTest::addColumn<int>("dtype");
    for (const char* n : {"fashion_mnist_mlp.json", "synthetic_blobs.json", "csv_iris_like.json",
                          "bench seed", "bench wide"})
        for (DType dt : {DType::F32, DType::BF16, DType::F16})
            QTest::newRow((std::string(n) + " " + dtypeName(dt)).c_str())
                << QString(n) << static_cast<int>(dt);
}

// The example projects and the benchmark's MLPs (784-128-10, 784-1024-1024-10, with dropout),
// compiled with every pass on and with each pass off: the same loss and gradients.
void TestPrecision::wholeProjectsPassesOff() {
    QFETCH(QString, name);
    QFETCH(int, dtype);
    const DType dt = static_cast<DType>(dtype);
    auto project = loadProject(
        std::string(td::dev::kSourceDir) + "/projects/" +
        (name.startsWith("bench") ? std::string("fashion_mnist_mlp.json") : name.toStdString()));
    QVERIFY2(project.ok(), project.ok() ? "" : project.error().c_str());
    ModelSpec m = project->model;
    if (name.startsWith("bench")) {
        // As bench/bench_mlp.cpp builds them: Dense(h, relu) + Dropout(0.2) per hidden layer.
        ModelSpec b;
        b.layers.push_back(m.layers.front());
        if (m.layers.front().type == LayerType::Input) b.layers.push_back(m.layers[1]);
        const std::vector<int64_t> hidden =
            name == "bench seed" ? std::vector<int64_t>{128} : std::vector<int64_t>{1024, 1024};
        for (size_t k = 0; k < hidden.size(); ++k) {
            b.layers.push_back(
                dense("dense_h" + std::to_string(k), hidden[k], ActivationKind::Relu));
            LayerSpec dr;
            dr.type = LayerType::Dropout;
            dr.name = "dropout_h" + std::to_string(k);
            dr.rate = 0.2;
            b.layers.push_back(dr);
        }
        b.layers.push_back(dense("logits", 10, ActivationKind::Softmax));
        m = b;
    }
    Objective obj;
    obj.loss = project->training.loss;
    obj.metrics = project->training.metrics;
    const StepResult all = runStep(m, dt, {}, nullptr, 1.f, false, nullptr, obj);
    QVERIFY2(all.error.empty(), all.error.c_str());
    QVERIFY(std::isfinite(all.loss));
    std::vector<std::set<std::string>> variants;
    for (const auto& p : kPasses) variants.push_back({p});
    variants.push_back(std::set<std::string>(fusionPassNames().begin(), fusionPassNames().end()));
    // 16 bits: a relu whose input lies within a rounding of zero may switch for a sample, which
    // moves that unit's gradients by the sample's share (batch 6 here): a few percent in norm.
    const double tol = dt == DType::F32 ? 1e-5 : dt == DType::BF16 ? 6e-2 : 3e-2;
    for (const auto& off : variants) {
        const StepResult r = runStep(m, dt, off, nullptr, 1.f, false, nullptr, obj);
        QVERIFY2(r.error.empty(), r.error.c_str());
        const std::string what = *off.begin() + (off.size() > 1 ? " and the rest" : "");
        QVERIFY2(std::fabs(r.loss - all.loss) <= tol * std::fabs(all.loss), what.c_str());
        const double d = relDiff(all.grads, r.grads);
        QVERIFY2(d <= tol, (what + ": relative difference " + std::to_string(d)).c_str());
    }
}

void TestPrecision::halfCloseToFloat32() {
    const ModelSpec m = mlp(ActivationKind::Relu);
    const StepResult f32 = runStep(m, DType::F32, {});
    for (DType dt : {DType::BF16, DType::F16}) {
        const StepResult r = runStep(m, dt, {});
        QVERIFY2(r.error.empty(), r.error.c_str());
        const double tol = dt == DType::BF16 ? 5e-2 : 5e-3;
        QVERIFY(std::fabs(r.loss - f32.loss) < tol * std::fabs(f32.loss));
        QVERIFY2(relDiff(f32.grads, r.grads) < tol, dtypeName(dt));
        QVERIFY(r.loss != f32.loss);  // it did compute in 16 bits
    }
}

// halfConv: a convolution with sums of 64 terms or more reads its image and kernel in bf16 and
// writes f32; a shorter one stays f32; the gradients read dy cast once to bf16; after the passes
// the gradients come out of their convolutions in f32 (the widening casts folded), and the bf16
// dy is written by the ReLU gradient with its bias gradient. Without halfConv every convolution
// is f32 under mixed_bfloat16.
void TestPrecision::halfConvolutionCasts() {
    for (bool half : {false, true}) {
        Objective obj;
        obj.halfConv = half;
        Graph g = trainGraph(cnn(), DType::BF16, true, false, obj);
        QVERIFY(verifyGraph(g).ok());
        std::map<std::string, DType> forward;  // layer -> its convolution's operand dtype
        int gradInputs = 0, gradFilters = 0;
        for (const Node& n : g.nodes) {
            if (n.op == Op::Conv2D) {
                forward[n.layer] = g.node(n.inputs[0]).dtype;
                QCOMPARE(g.node(n.inputs[1]).dtype, g.node(n.inputs[0]).dtype);
                QCOMPARE(n.dtype, DType::F32);
            }
            if (n.op == Op::Conv2DGradInput || n.op == Op::Conv2DGradFilter) {
                const int dy = n.inputs[n.op == Op::Conv2DGradInput ? 0 : 1];
                const int other = n.inputs[n.op == Op::Conv2DGradInput ? 1 : 0];
                QCOMPARE(g.node(dy).dtype, g.node(other).dtype);
                if (g.node(dy).dtype == DType::BF16) QCOMPARE(g.node(dy).op, Op::Cast);
                (n.op == Op::Conv2DGradInput ? gradInputs : gradFilters) += 1;
            }
        }
        QCOMPARE(forward.size(), size_t(3));
        QCOMPARE(forward["conv_a"], DType::F32);  // 3 * 3 * 2 = 18 terms
        QCOMPARE(forward["conv_b"], half ? DType::BF16 : DType::F32);
        QCOMPARE(forward["conv_c"], half ? DType::BF16 : DType::F32);
        QCOMPARE(gradFilters, 3);
        QCOMPARE(gradInputs, 2);  // not of the input
        // One cast of dy per 16-bit convolution, read by both of its gradients.
        std::set<int> dyCasts;
        for (const Node& n : g.nodes)
            if (n.op == Op::Conv2DGradFilter && g.node(n.inputs[1]).op == Op::Cast)
                dyCasts.insert(n.inputs[1]);
        QCOMPARE(dyCasts.size(), size_t(half ? 2 : 0));

        CompileOptions co;
        co.compute = DType::BF16;
        co.paramShadows = true;
        PassManager pm;
        addStandardPasses(pm, co);
        QVERIFY(pm.run(g).ok());
        QVERIFY(verifyGraph(g).ok());
        for (const auto& [p, gr] : g.grads) {
            QCOMPARE(g.node(gr).dtype, DType::F32);
            QVERIFY2(g.node(gr).op != Op::Cast, g.node(p).attrs.name.value_or("?").c_str());
        }
        // The bf16 dy of conv_b and conv_c is written by their ReLU gradient itself, with the bias
        // gradient, in one pass (fuse_act_bias_grad): no cast left between.
        std::set<int> dyWriters;
        for (const Node& n : g.nodes) {
            if (n.op == Op::Conv2DGradInput) QCOMPARE(n.dtype, DType::F32);
            if (n.op != Op::Conv2DGradInput && n.op != Op::Conv2DGradFilter) continue;
            const Node& dy = g.node(n.inputs[n.op == Op::Conv2DGradInput ? 0 : 1]);
            QVERIFY(dy.op != Op::Cast);
            if (dy.dtype != DType::BF16) continue;
            QCOMPARE(dy.op, Op::ActGrad);
            QVERIFY(dy.attrs.biasGrad.value_or(false));
            dyWriters.insert(dy.id);
        }
        QCOMPARE(dyWriters.size(), size_t(half ? 2 : 0));
    }
}

// A step of the CNN with its deep convolutions in bf16 on this CPU: loss and gradients within
// bf16's tolerance of float32 (tanh: with relu, a unit within a rounding of zero switches, which
// moves a gradient by a sample's share of batch 6), not the bits of bf16 with f32 convolutions;
// with relu, each pass off gives the same step within that tolerance.
void TestPrecision::halfConvolutionsCloseToFloat32() {
    if (!cpuHalfConvolutions(DType::BF16))
        QSKIP("this CPU has no native bf16 convolution (AVX512-BF16 or AMX-BF16)");
    Objective half;
    half.halfConv = true;
    const ModelSpec smooth = cnn(ActivationKind::Tanh);
    const StepResult f32 = runStep(smooth, DType::F32, {});
    QVERIFY2(f32.error.empty(), f32.error.c_str());
    const StepResult f32Conv = runStep(smooth, DType::BF16, {});
    QVERIFY2(f32Conv.error.empty(), f32Conv.error.c_str());
    const StepResult r = runStep(smooth, DType::BF16, {}, nullptr, 1.f, false, nullptr, half);
    QVERIFY2(r.error.empty(), r.error.c_str());
    QVERIFY(std::isfinite(r.loss));
    QVERIFY(std::fabs(r.loss - f32.loss) < 2e-2 * std::fabs(f32.loss));
    const double d = relDiff(f32.grads, r.grads);
    QVERIFY2(d < 3e-2, std::to_string(d).c_str());
    QVERIFY(r.loss != f32Conv.loss);  // the convolutions did compute in 16 bits
    const StepResult all = runStep(cnn(), DType::BF16, {}, nullptr, 1.f, false, nullptr, half);
    QVERIFY2(all.error.empty(), all.error.c_str());
    std::vector<std::set<std::string>> variants;
    for (const auto& p : kPasses) variants.push_back({p});
    variants.push_back(std::set<std::string>(fusionPassNames().begin(), fusionPassNames().end()));
    for (const auto& off : variants) {
        const StepResult v = runStep(cnn(), DType::BF16, off, nullptr, 1.f, false, nullptr, half);
        QVERIFY2(v.error.empty(), v.error.c_str());
        const std::string what = *off.begin() + (off.size() > 1 ? " and the rest" : "");
        QVERIFY2(std::fabs(v.loss - all.loss) <= 6e-2 * std::fabs(all.loss), what.c_str());
        const double dv = relDiff(all.grads, v.grads);
        QVERIFY2(dv <= 6e-2, (what + ": relative difference " + std::to_string(dv)).c_str());
    }
}

// One multi-tensor pass and one update per parameter give the same parameters, shadows included.
void TestPrecision::updateFusedEqualsPerTensor() {
    UpdateSpec adam;
    adam.kind = UpdateKind::Adam;
    adam.oneMinusBeta1 = 0.1f;
    adam.oneMinusBeta2 = 0.001f;
    adam.epsilon = 1e-7f;
    for (DType dt : {DType::F32, DType::BF16}) {
        Harness h1, h2;
        const StepResult a = runStep(mlp(ActivationKind::Relu), dt, {}, &adam, 1.f, false, &h1);
        const StepResult b =
            runStep(mlp(ActivationKind::Relu), dt, {"fuse_update"}, &adam, 1.f, false, &h2);
        QVERIFY2(a.error.empty() && b.error.empty(), (a.error + b.error).c_str());
        QVERIFY(a.params == b.params);
        for (size_t i = 0; i < h1.shadows.size(); ++i) {
            if (!h1.shadows[i].ptr) continue;
            QVERIFY(std::memcmp(h1.shadows[i].ptr, h2.shadows[i].ptr, h1.shadows[i].bytes) == 0);
            // The shadow is the updated parameter, rounded.
            const auto* s = static_cast<const uint16_t*>(h1.shadows[i].ptr);
            QCOMPARE(s[0], floatToBf16(h1.param(i)[0]));
        }
    }
}

// A step whose scaled gradients overflow float16 changes no parameter and halves the scale; finite
// steps after it apply, and the scale doubles after growthSteps of them.
void TestPrecision::lossScalingSkipsAndGrows() {
    UpdateSpec sgd;
    sgd.kind = UpdateKind::Sgd;
    Harness h;
    const StepResult r =
        runStep(mlp(ActivationKind::Relu, false, 0), DType::F16, {}, &sgd, 1.f, true, &h);
    QVERIFY2(r.error.empty(), r.error.c_str());
    auto* st = static_cast<LossScaleState*>(h.lossScale.ptr);
    QCOMPARE(st->skippedSteps, int64_t{0});  // 2^15 fits this model's gradients
    QCOMPARE(st->goodSteps, 1);
    QCOMPARE(st->scale, 32768.0f);
    // Force an overflow: a scale of 2^30 puts the loss gradient far beyond float16's 65504.
    st->scale = 1073741824.0f;
    std::vector<std::vector<float>> before;
    for (size_t i = 0; i < h.params.size(); ++i)
        before.emplace_back(h.param(i), h.param(i) + h.params[i].bytes / 4);
    UpdateScalars us{0.01f, 0.01f, 0.0f};
    h.run(4, 0, us, false);
    QCOMPARE(st->skippedSteps, int64_t{1});
    QCOMPARE(st->lastSkipped, 1);
    QCOMPARE(st->scale, 536870912.0f);
    QCOMPARE(st->goodSteps, 0);
    for (size_t i = 0; i < h.params.size(); ++i)
        QVERIFY(std::vector<float>(h.param(i), h.param(i) + h.params[i].bytes / 4) == before[i]);
    // Back to a scale that fits: finite steps apply; the scale doubles after growthSteps.
    st->scale = 1024.0f;
    st->growthSteps = 3;
    for (int s = 0; s < 3; ++s) {
        h.run(5 + s, 0, us, false);
        QCOMPARE(st->lastSkipped, 0);
    }
    QCOMPARE(st->skippedSteps, int64_t{1});
    QCOMPARE(st->scale, 2048.0f);
    QCOMPARE(st->goodSteps, 0);
    QVERIFY(std::vector<float>(h.param(0), h.param(0) + 4) !=
            std::vector<float>(before[0].begin(), before[0].begin() + 4));
}

// With the loss scaled by S and the update dividing by S (a power of two), the update is the one
// of unscaled gradients, bit for bit.
void TestPrecision::lossScaledStepEqualsUnscaled() {
    std::vector<float> w1(100), w2(100), g(100), gs(100), m1(100, 0.f), v1(100, 0.f), m2(100, 0.f),
        v2(100, 0.f);
    std::mt19937 rng(3);
    std::normal_distribution<float> nd(0.f, 1.f);
    for (int i = 0; i < 100; ++i) {
        w1[static_cast<size_t>(i)] = w2[static_cast<size_t>(i)] = nd(rng);
        g[static_cast<size_t>(i)] = nd(rng) * 1e-3f;
        gs[static_cast<size_t>(i)] = g[static_cast<size_t>(i)] * 1024.0f;
    }
    UpdateSpec adam;
    adam.kind = UpdateKind::Adam;
    adam.oneMinusBeta1 = 0.1f;
    adam.oneMinusBeta2 = 0.001f;
    adam.epsilon = 1e-7f;
    adam.clip = ClipKind::GlobalNorm;
    adam.clipValue = 0.01;
    UpdateTensor t1{w1.data(), g.data(), 100, {m1.data(), v1.data(), nullptr}};
    UpdateTensor t2{w2.data(), gs.data(), 100, {m2.data(), v2.data(), nullptr}};
    const UpdateScalars s{0.001f, 0.001f, 0.f};
    QVERIFY(applyUpdate(adam, s, std::span<const UpdateTensor>(&t1, 1), 1));
    LossScaleState ls;
    ls.scale = 1024.0f;
    QVERIFY(applyUpdate(adam, s, std::span<const UpdateTensor>(&t2, 1), 1, &ls));
    QVERIFY(w1 == w2);
    QCOMPARE(ls.goodSteps, 1);
    // A NaN anywhere: skipped, nothing written.
    gs[50] = std::numeric_limits<float>::quiet_NaN();
    const std::vector<float> keep = w2;
    QVERIFY(!applyUpdate(adam, s, std::span<const UpdateTensor>(&t2, 1), 1, &ls));
    QVERIFY(w2 == keep);
    QCOMPARE(ls.scale, 512.0f);
    QCOMPARE(ls.skippedSteps, int64_t{1});
}

QTEST_MAIN(TestPrecision)
#include "test_precision.moc"

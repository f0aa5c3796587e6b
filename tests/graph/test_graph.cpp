// The IR (text round trip, verifier), the builder and autodiff on whole models, and the passes
// (fusion decisions, dead code, memory planning, the pass manager), including whole models run
// with passes on and off.
#include <QtTest>
#include <random>
#include <sstream>

#include "engine/distribute/collectives.h"
#include "engine/graph/initializers.h"
#include "engine/graph/lower.h"
#include "harness.h"

using namespace td;
using tdtest::Harness;

namespace {

ModelSpec seedModel(ActivationKind hidden = ActivationKind::Relu) {
    ModelSpec m;
    LayerSpec flat;
    flat.type = LayerType::Flatten;
    flat.name = "flatten";
    flat.inputShape = {4, 5};
    LayerSpec d1;
    d1.type = LayerType::Dense;
    d1.name = "dense";
    d1.units = 8;
    d1.activation = hidden;
    LayerSpec drop;
    drop.type = LayerType::Dropout;
    drop.name = "dropout";
    drop.rate = 0.2;
    LayerSpec d2;
    d2.type = LayerType::Dense;
    d2.name = "dense_1";
    d2.units = 3;
    d2.activation = ActivationKind::Softmax;
    m.layers = {flat, d1, drop, d2};
    return m;
}

Graph trainGraph(const ModelSpec& model, int64_t batch, int64_t globalBatch = 0, int replicas = 1) {
    ModelSpec m = model;
    auto info = inferShapes(m);
    if (!info.ok()) qFatal("%s", info.error().c_str());
    BuildOptions bo;
    bo.batch = batch;
    bo.globalBatch = globalBatch;
    bo.replicas = replicas;
    bo.seed = 5;
    bo.metrics = {"accuracy"};
    auto g = buildGraph(m, *info, bo);
    if (!g.ok()) qFatal("%s", g.error().c_str());
    if (!autodiff(*g).ok()) qFatal("autodiff failed");
    return std::move(g).value();
}

// Fills every param, the input and the labels (classes of 3) of a harness from `seed`.
void fillInputs(Harness& h, uint32_t seed, int64_t rows, int64_t features) {
    std::mt19937 rng(seed);
    std::uniform_real_distribution<float> d(-1, 1);
    for (size_t i = 0; i < h.params.size(); ++i) {
        float* p = h.param(i);
        for (size_t j = 0; j < h.params[i].bytes / sizeof(float); ++j) p[j] = d(rng);
    }
    for (int64_t j = 0; j < rows * features; ++j) h.in()[j] = d(rng);
    auto* y = static_cast<int32_t*>(h.lab());
    for (int64_t r = 0; r < rows; ++r) y[r] = static_cast<int32_t>(rng() % 3);
}

// A Collectives that records what the program asks: the data of every bucket when it starts (so a
// test sees whether the gradients were written), which flat-buffer elements each bucket covers,
// and the order of starts and waits. The "sum" doubles the data at the wait, as two identical
// replicas would.
class RecordingCollectives final : public Collectives {
  public:
    struct Call {
        bool start;
        int bucket;
    };
    // The flat gradient buffer the program was bound to (known once it is compiled).
    void watch(const Buffer& flat) {
        flat_ = static_cast<float*>(flat.ptr);
        covered.assign(flat.bytes / sizeof(float), 0);
    }

    int size() const override { return 2; }
    int rank() const override { return 0; }
    Status allReduceStart(int bucket, float* data, int64_t count) override {
        calls.push_back({true, bucket});
        if (bucket == failBucket) return err(failMessage);
        if (seen.size() <= size_t(bucket)) seen.resize(size_t(bucket) + 1);
        seen[size_t(bucket)].assign(data, data + count);
        for (int64_t i = 0; i < count; ++i) ++covered[size_t(data - flat_ + i)];
        pending[bucket] = {data, count};
        return Status::success();
    }
    Status allReduceWait(int bucket) override {
        calls.push_back({false, bucket});
        auto it = pending.find(bucket);
        if (it == pending.end()) return err("wait for a bucket that never started");
        for (int64_t i = 0; i < it->second.second; ++i) it->second.first[i] *= 2;
        pending.erase(it);
        return Status::success();
    }
    Status allReduceHost(double*, int64_t) override { return Status::success(); }
    Status allGatherHost(const double* v, int64_t n, double* out) override {
        std::copy(v, v + n, out);
        std::copy(v, v + n, out + n);
        return Status::success();
    }
    Status barrier() override { return Status::success(); }
    void abort(const std::string&) override {}

    std::vector<Call> calls;
    std::vector<std::vector<float>> seen;  // per bucket: its data when it started
    std::vector<int> covered;              // per flat element: how many starts covered it
    int failBucket = -1;
    std::string failMessage;

  private:
    float* flat_ = nullptr;
    std::map<int, std::pair<float*, int64_t>> pending;
};

}  // namespace

class TestGraph : public QObject {
    Q_OBJECT
  private slots:
    void textRoundTrip();
    void imageGraphRoundTripAndLowering();
    void parseErrors_data();
    void parseErrors();
    void verifierRejects_data();
    void verifierRejects();
    void builderSeedModel();
    void softmaxPairsWithLoss();
    void lossAndMetricErrors();
    void fusionFusesAndExplains();
    void fusionKeepsApartWithReason();
    void deadCodeRemovesUnused();
    void memoryPlanReusesWithoutOverlap();
    void memoryPlanReportsNoChangeWhenPlanned();
    void passManagerDisableVerifyTime();
    void wholeModelPassesOnOffAgree();
    void initializers();
    void typedAttrsRoundTrip();
    void lowerSmallGraph();
    void accumulatorsSumStepLosses();
    void gradientBucketsAllReduce();
    void replicaSlicesSumToGlobalBatch();
};

void TestGraph::textRoundTrip() {
    Graph g = trainGraph(seedModel(), 6);
    const std::string text = printGraph(g);
    auto back = parseGraph(text);
    QVERIFY2(back.ok(), back.ok() ? "" : back.error().c_str());
    QCOMPARE(printGraph(*back), text);
    // Comments are allowed in the text form.
    QVERIFY(parseGraph("# a comment\n" + text).ok());
}

// A CNN's training graph with every image and normalization op: printed and parsed back equal,
// through the passes (fused conv2d with its post-ops) and lowered with its window parameters.
void TestGraph::imageGraphRoundTripAndLowering() {
    auto layer = [](LayerType t) {
        LayerSpec l;
        l.type = t;
        return l;
    };
    ModelSpec model;
    LayerSpec in = layer(LayerType::Input);
    in.inputShape = {6, 5, 2};
    LayerSpec rescale = layer(LayerType::Rescaling);
    rescale.rescale = 0.5;
    LayerSpec pad = layer(LayerType::ZeroPadding2D);
    pad.zeroPadding = {1, 0, 0, 1};
    LayerSpec conv = layer(LayerType::Conv2D);
    conv.filters = 4;
    conv.strides = {2, 2};
    conv.samePadding = true;
    conv.activation = ActivationKind::Relu;
    LayerSpec bn = layer(LayerType::BatchNormalization);
    bn.momentum = 0.9;
    LayerSpec pool = layer(LayerType::MaxPooling2D);
    pool.samePadding = true;
    LayerSpec conv1 = layer(LayerType::Conv2D);
    conv1.filters = 4;
    conv1.kernelSize = {1, 1};
    conv1.groups = 2;
    conv1.dilationRate = {2, 2};
    LayerSpec avg = layer(LayerType::AveragePooling2D);
    avg.poolSize = {1, 1};
    LayerSpec out = layer(LayerType::Dense);
    out.units = 3;
    out.activation = ActivationKind::Softmax;
    model.layers = {in,
                    rescale,
                    pad,
                    conv,
                    bn,
                    pool,
                    layer(LayerType::LayerNormalization),
                    conv1,
                    avg,
                    layer(LayerType::GlobalAveragePooling2D),
                    out};
    Graph g = trainGraph(model, 4);
    std::string text = printGraph(g);
    for (const char* op : {"conv2d(",
                           "conv2d_grad_input(",
                           "conv2d_grad_filter(",
                           "max_pool(",
                           "max_pool_grad(",
                           "avg_pool(",
                           "avg_pool_grad(",
                           "pad2d(",
                           "scale(",
                           "channel_mean(",
                           "channel_var(",
                           "batch_norm(",
                           "batch_norm_grad(",
                           "norm_gamma_grad(",
                           "moving_avg(",
                           "layer_norm(",
                           "layer_norm_grad(",
                           "layer_norm_gamma_grad(",
                           "strides=2x2",
                           "pads=1x1x0x1",
                           "groups=2",
                           "dilation=2x2",
                           "batch_stats=1",
                           "momentum=0.9"})
        QVERIFY2(text.find(op) != std::string::npos, op);
    // Node by node: op, operands, typed attributes, dtype, shape; outputs and gradient bindings.
    auto same = [](const Graph& a, const Graph& b) {
        if (a.nodes.size() != b.nodes.size() || a.outputs != b.outputs || a.grads != b.grads)
            return false;
        for (size_t i = 0; i < a.nodes.size(); ++i) {
            const Node &x = a.nodes[i], &y = b.nodes[i];
            if (x.op != y.op || x.inputs != y.inputs || !(x.attrs == y.attrs) ||
                x.dtype != y.dtype || x.shape != y.shape)
                return false;
        }
        return true;
    };
    auto back = parseGraph(text);
    QVERIFY2(back.ok(), back.ok() ? "" : back.error().c_str());
    QVERIFY(same(*back, g));
    QCOMPARE(printGraph(*back), text);

    PassManager pm;
    addStandardPasses(pm, CompileOptions{});
    QVERIFY(pm.run(g).ok());
    text = printGraph(g);
    bool fused = false;  // conv2d + bias_add + relu as one conv2d with post-ops
    std::istringstream lines(text);
    for (std::string line; std::getline(lines, line);)
        fused = fused || (line.find("= conv2d(") != std::string::npos &&
                          line.find("act=relu") != std::string::npos &&
                          line.find("has_bias=1") != std::string::npos);
    QVERIFY2(fused, text.c_str());
    back = parseGraph(text);
    QVERIFY2(back.ok(), back.ok() ? "" : (back.error() + "\n" + text).c_str());
    QVERIFY(same(*back, g));
    auto lp = lower(g);
    QVERIFY2(lp.ok(), lp.ok() ? "" : lp.error().c_str());
    const std::string program = printProgram(*lp);
    QVERIFY2(program.find("conv2d %") != std::string::npos &&
                 program.find("window=3x3, strides=2x2, dilation=1x1") != std::string::npos &&
                 program.find("act=relu, has_bias=1") != std::string::npos,
             program.c_str());
    // moving_avg writes its parameter: the same operand in and out.
    bool moving = false;
    for (const Instr& ins : lp->code)
        if (ins.op == InstrOp::MovingAvg) {
            moving = true;
            QCOMPARE(ins.out.space, Space::Param);
            QCOMPARE(ins.in[0].space, Space::Param);
            QCOMPARE(ins.out.index, ins.in[0].index);
        }
    QVERIFY(moving);
}

void TestGraph::parseErrors_data() {
    QTest::addColumn<QString>("ir");
    QTest::addColumn<QString>("expected");
    QTest::newRow("unknown op") << "graph t {\n %0 = frobnicate() : f32[1]\n}"
                                << "unknown op 'frobnicate'";
    QTest::newRow("numbering") << "graph t {\n %1 = input() : f32[1]\n}"
                               << "expected %0, got %1";
    QTest::newRow("bad dtype") << "graph t {\n %0 = input() : f128[1]\n}"
                               << "unknown dtype 'f128'";
    QTest::newRow("unterminated") << "graph t {\n %0 = input() : f32[1]\n"
                                  << "unexpected end";
    QTest::newRow("line number")
        << "graph t {\n %0 = input() : f32[2]\n %1 = act(%0) {act=relu : f32[2]\n}"
        << "IR line 3";
    // Typed attributes: errors name the node and the attribute.
    const QString in = "graph t {\n %0 = input() : f32[2]\n";
    QTest::newRow("unknown attribute") << in + " %1 = act(%0) {frob=1} : f32[2]\n}"
                                       << "%1 = act: unknown attribute 'frob'";
    QTest::newRow("bad activation") << in + " %1 = act(%0) {act=swish} : f32[2]\n}"
                                    << "%1 = act: attribute act: unknown activation 'swish'";
    QTest::newRow("bad number") << in + " %1 = act(%0) {act=elu, alpha=x1} : f32[2]\n}"
                                << "%1 = act: attribute alpha: expected a number, got 'x1'";
    QTest::newRow("bad flag") << in + " %1 = act_grad(%0, %0) {act=relu, uses_output=2} : f32[2]\n}"
                              << "%1 = act_grad: attribute uses_output: expected 0 or 1, got '2'";
    QTest::newRow("twice") << in + " %1 = act(%0) {act=relu, act=tanh} : f32[2]\n}"
                           << "%1 = act: attribute act given twice";
    QTest::newRow("negative seed") << in + " %1 = dropout(%0) {rate=0.5, seed=-1} : f32[2]\n}"
                                   << "%1 = dropout: attribute seed: expected an unsigned integer";
    QTest::newRow("bad buffer") << in + " %1 = act(%0) {act=relu, buf=heap} : f32[2]\n}"
                                << "%1 = act: attribute buf: unknown buffer 'heap'";
    QTest::newRow("bad loss") << in + " %1 = label() : f32[2]\n"
                                      " %2 = loss(%0, %1) {loss=hinge} : f32[1]\n}"
                              << "%2 = loss: attribute loss: unknown loss kernel 'hinge'";
    QTest::newRow("missing act") << in + " %1 = act(%0) : f32[2]\n}"
                                 << "%1 = act: missing attribute act";
    QTest::newRow("bad window") << in + " %1 = max_pool(%0) {window=3y3} : f32[2]\n}"
                                << "%1 = max_pool: attribute window: expected sizes like 3x3, "
                                   "got '3y3'";
}

void TestGraph::parseErrors() {
    QFETCH(QString, ir);
    QFETCH(QString, expected);
    auto r = parseGraph(ir.toStdString());
    QVERIFY(!r.ok());
    QVERIFY2(QString::fromStdString(r.error()).contains(expected), r.error().c_str());
}

void TestGraph::verifierRejects_data() {
    QTest::addColumn<QString>("ir");
    QTest::addColumn<QString>("expected");
    QTest::newRow("matmul inner")
        << "graph t {\n %0 = input() : f32[2,3]\n %1 = param() {name=w} : f32[4,5]\n"
           " %2 = matmul(%0, %1) {trans_a=0, trans_b=0} : f32[2,5]\n}"
        << "%2 = matmul: inner dimensions differ";
    QTest::newRow("bias shape")
        << "graph t {\n %0 = input() : f32[2,3]\n %1 = param() {name=b} : f32[4]\n"
           " %2 = bias_add(%0, %1) : f32[2,3]\n}"
        << "bias shape [4] does not match [2,3]";
    QTest::newRow("reshape count")
        << "graph t {\n %0 = input() : f32[2,3]\n %1 = reshape(%0) : f32[7]\n}"
        << "cannot reshape [2,3] into [7]";
    QTest::newRow("operand order")
        << "graph t {\n %0 = act(%1) {act=relu} : f32[2]\n %1 = input() : f32[2]\n}"
        << "not defined before it";
    const std::string img = "graph t {\n %0 = input() : f32[2,5,5,3]\n";
    QTest::newRow("conv kernel larger than the input")
        << QString::fromStdString(img +
                                  " %1 = param() {name=w} : f32[7,7,3,4]\n"
                                  " %2 = conv2d(%0, %1) : f32[2,1,1,4]\n}")
        << "%2 = conv2d: kernel [7,7,3,4] larger than the padded input";
    QTest::newRow("conv output shape")
        << QString::fromStdString(img +
                                  " %1 = param() {name=w} : f32[3,3,3,4]\n"
                                  " %2 = conv2d(%0, %1) {pads=1x1x1x1} : f32[2,3,3,4]\n}")
        << "%2 = conv2d: output shape [2,3,3,4], expected [2,5,5,4]";
    QTest::newRow("conv groups")
        << QString::fromStdString(img +
                                  " %1 = param() {name=w} : f32[3,3,3,4]\n"
                                  " %2 = conv2d(%0, %1) {groups=2} : f32[2,3,3,4]\n}")
        << "%2 = conv2d: kernel [3,3,3,4] does not fit 3 channels in 2 groups";
    QTest::newRow("pool without window")
        << QString::fromStdString(img + " %1 = max_pool(%0) : f32[2,5,5,3]\n}")
        << "%1 = max_pool: missing attribute window";
    QTest::newRow("moving_avg of a trainable param")
        << "graph t {\n %0 = param() {name=m} : f32[3]\n %1 = param() {name=s} : f32[3]\n"
           " %2 = moving_avg(%0, %1) {momentum=0.9} : f32[3]\n}"
        << "%2 = moving_avg: updates a trainable param";
    QTest::newRow("batch_norm operands")
        << QString::fromStdString(img +
                                  " %1 = param() {name=m, trainable=0} : f32[3]\n"
                                  " %2 = batch_norm(%0, %1, %1) {has_gamma=1} : f32[2,5,5,3]\n}")
        << "%2 = batch_norm: operands do not match has_gamma / has_beta";
    QTest::newRow("grad shape")
        << "graph t {\n %0 = param() {name=w} : f32[2]\n %1 = input() : f32[3]\n grad %0 = %1\n}"
        << "differs from param";
}

void TestGraph::verifierRejects() {
    QFETCH(QString, ir);
    QFETCH(QString, expected);
    auto r = parseGraph(ir.toStdString());
    QVERIFY(!r.ok());
    QVERIFY2(QString::fromStdString(r.error()).contains(expected), r.error().c_str());
}

void TestGraph::builderSeedModel() {
    Graph g = trainGraph(seedModel(), 6);
    QCOMPARE(g.params().size(), size_t(4));
    QCOMPARE(g.grads.size(), size_t(4));
    QVERIFY(g.output("loss") >= 0);
    QVERIFY(g.output("accuracy") >= 0);
    QVERIFY(g.output("predictions") >= 0);
    // No gradient flows into the input: nothing computes d(input).
    const int input = 0;
    for (const auto& n : g.nodes)
        if (n.op == Op::MatMul && n.attrs.transB.value_or(false))
            QVERIFY(g.node(n.inputs[1]).op != Op::Param || n.inputs[0] != input);
    int dropouts = 0;
    for (const auto& n : g.nodes) dropouts += n.op == Op::Dropout || n.op == Op::DropoutGrad;
    QCOMPARE(dropouts, 2);
    // Eval graphs have no dropout.
    ModelSpec m = seedModel();
    auto info = inferShapes(m);
    BuildOptions bo;
    bo.batch = 6;
    bo.mode = GraphMode::Eval;
    bo.metrics = {"accuracy"};
    auto eg = buildGraph(m, *info, bo);
    QVERIFY(eg.ok());
    for (const auto& n : eg->nodes) QVERIFY(n.op != Op::Dropout);
}

void TestGraph::softmaxPairsWithLoss() {
    Graph g = trainGraph(seedModel(), 6);
    const Node& loss = g.node(g.output("loss"));
    QVERIFY(loss.attrs.loss == LossKind::SparseSoftmaxXent);
    // The loss reads the logits (the bias_add), not the softmax output.
    QCOMPARE(g.node(loss.inputs[0]).op, Op::BiasAdd);
    QVERIFY(g.node(g.output("predictions")).attrs.act == ActKind::Softmax);
}

void TestGraph::lossAndMetricErrors() {
    LossConfig mse;
    mse.name = "mean_squared_error";
    auto r = resolveMetrics({"accuracy"}, mse);
    QVERIFY(!r.ok());
    QVERIFY(QString::fromStdString(r.error()).contains("classification loss"));
    LossConfig bad;
    bad.name = "hinge";
    QVERIFY(!labelSpecFor(bad, {3}).ok());
    LossConfig sparse;
    QVERIFY(!resolveMetrics({"frobnication"}, sparse).ok());
    auto top = resolveMetrics({"sparse_top_3_categorical_accuracy"}, sparse);
    QVERIFY(top.ok());
    QCOMPARE(top->at(0).k, int64_t(3));
}

void TestGraph::fusionFusesAndExplains() {
    Graph g = trainGraph(seedModel(), 6);
    FusionPass fp;
    auto changed = fp.run(g);
    QVERIFY(changed.ok() && *changed);
    QVERIFY(verifyGraph(g).ok());
    int dense = 0;
    for (const auto& n : g.nodes) dense += n.op == Op::Dense;
    QCOMPARE(dense, 2);  // hidden (relu post-op) and output logits (linear)
    bool sawRelu = false;
    for (const auto& d : fp.decisions())
        if (d.fused && d.what.find("act(relu)") != std::string::npos) sawRelu = true;
    QVERIFY(sawRelu);
}

void TestGraph::fusionKeepsApartWithReason() {
    // elu's gradient reads its input, so bias_add has two users and the act stays apart.
    Graph g = trainGraph(seedModel(ActivationKind::Elu), 6);
    FusionPass fp;
    QVERIFY(fp.run(g).ok());
    bool explained = false;
    for (const auto& d : fp.decisions())
        if (d.what.find("stays apart") != std::string::npos &&
            d.what.find("users") != std::string::npos)
            explained = true;
    QVERIFY(explained);
    int acts = 0;
    for (const auto& n : g.nodes) acts += n.op == Op::Act && n.attrs.act == ActKind::Elu;
    QCOMPARE(acts, 1);
}

void TestGraph::deadCodeRemovesUnused() {
    auto g = parseGraph(
        "graph t {\n %0 = input() : f32[2,3]\n %1 = act(%0) {act=relu} : f32[2,3]\n"
        " %2 = act(%0) {act=tanh} : f32[2,3]\n output y = %2\n}\n");
    QVERIFY(g.ok());
    DeadCodePass dce;
    auto r = dce.run(*g);
    QVERIFY(r.ok() && *r);
    QCOMPARE(g->nodes.size(), size_t(2));
    QVERIFY(g->node(g->output("y")).attrs.act == ActKind::Tanh);
    auto again = dce.run(*g);
    QVERIFY(again.ok() && !*again);  // nothing left to remove: reports no change
}

void TestGraph::memoryPlanReusesWithoutOverlap() {
    Graph g = trainGraph(seedModel(), 32);
    MemoryPlanPass mp;
    QVERIFY(mp.run(g).ok());
    QVERIFY(mp.arenaBytes() < mp.naiveBytes());
    // Live ranges of arena values never share bytes.
    const size_t n = g.nodes.size();
    std::vector<int> last(n, -1);
    for (size_t i = 0; i < n; ++i)
        for (int in : g.nodes[i].inputs) {
            int r = in;
            while (g.node(r).op == Op::Reshape) r = g.node(r).inputs[0];
            last[size_t(r)] = std::max(last[size_t(r)], int(i));
        }
    for (const auto& [name, id] : g.outputs) last[size_t(id)] = int(n);
    for (size_t a = 0; a < n; ++a) {
        if (g.nodes[a].attrs.buf != BufKind::Arena) continue;
        for (size_t b = a + 1; b < n; ++b) {
            if (g.nodes[b].attrs.buf != BufKind::Arena) continue;
            const bool overlapTime = int(b) <= std::max<int>(last[a], int(a));
            if (!overlapTime) continue;
            const int64_t a0 = *g.nodes[a].attrs.off, a1 = a0 + int64_t(g.nodes[a].bytes());
            const int64_t b0 = *g.nodes[b].attrs.off, b1 = b0 + int64_t(g.nodes[b].bytes());
            QVERIFY2(a1 <= b0 || b1 <= a0,
                     qPrintable(QString("%%1 and %%2 overlap").arg(a).arg(b)));
        }
    }
}

// A pass answers "did I change anything": planning an already planned graph changes nothing, and
// a plan that was edited (or is missing) is rewritten and reported.
void TestGraph::memoryPlanReportsNoChangeWhenPlanned() {
    Graph g = trainGraph(seedModel(), 32);
    MemoryPlanPass mp;
    auto first = mp.run(g);
    QVERIFY(first.ok());
    QVERIFY(*first);
    const std::string planned = printGraph(g);
    auto second = mp.run(g);
    QVERIFY(second.ok());
    QVERIFY(!*second);
    QCOMPARE(printGraph(g), planned);

    int arena = -1;
    for (const Node& n : g.nodes)
        if (n.attrs.buf == BufKind::Arena && n.attrs.off.value_or(0) > 0) arena = n.id;
    QVERIFY(arena >= 0);
    g.node(arena).attrs.off = 0;
    auto fixed = mp.run(g);
    QVERIFY(fixed.ok());
    QVERIFY(*fixed);
    QCOMPARE(printGraph(g), planned);

    g.node(arena).attrs.buf.reset();
    auto again = mp.run(g);
    QVERIFY(again.ok());
    QVERIFY(*again);
    QCOMPARE(printGraph(g), planned);
}

void TestGraph::passManagerDisableVerifyTime() {
    Graph g = trainGraph(seedModel(), 6);
    PassManager pm;
    addStandardPasses(pm);
    pm.disable("fusion");
    std::vector<std::string> seen;
    pm.setDumpHook([&](const std::string& p, const Graph&) { seen.push_back(p); });
    QVERIFY(pm.run(g).ok());
    QCOMPARE(seen, (std::vector<std::string>{"build", "fold_casts", "fuse_act_bias_grad",
                                             "fuse_elementwise", "dce", "memory"}));
    QCOMPARE(pm.timings().size(), size_t(6));
    QVERIFY(pm.timings()[0].skipped);
    for (const auto& n : g.nodes) QVERIFY(n.op != Op::Dense);

    // A pass that breaks the graph is caught by the verifier and named.
    struct Breaker : Pass {
        const char* name() const override { return "breaker"; }
        Result<bool> run(Graph& gg) override {
            gg.nodes.back().shape = {999};
            return true;
        }
    };
    Graph g2 = trainGraph(seedModel(), 6);
    PassManager pm2;
    pm2.add(std::make_unique<Breaker>());
    Status s = pm2.run(g2);
    QVERIFY(!s.ok());
    QVERIFY(QString::fromStdString(s.error()).contains("after pass breaker"));
}

void TestGraph::wholeModelPassesOnOffAgree() {
    // The same training step, fused and unfused: identical loss and gradients.
    Graph g = trainGraph(seedModel(), 6);
    Harness on, off;
    QVERIFY(on.compile(g, {"fusion", "dce"}));
    QVERIFY(off.compile(g, {}));
    QCOMPARE(on.g.params().size(), off.g.params().size());
    std::mt19937 rng(3);
    std::uniform_real_distribution<float> d(-1, 1);
    std::vector<std::vector<float>> p;
    for (size_t i = 0; i < on.params.size(); ++i) {
        std::vector<float> v(on.params[i].bytes / 4);
        for (auto& x : v) x = d(rng);
        p.push_back(v);
    }
    std::vector<float> x(6 * 20);
    for (auto& v : x) v = d(rng);
    std::vector<int32_t> y{0, 1, 2, 0, 1, 2};
    for (Harness* h : {&on, &off}) {
        for (size_t i = 0; i < p.size(); ++i) std::copy(p[i].begin(), p[i].end(), h->param(i));
        std::copy(x.begin(), x.end(), h->in());
        std::copy(y.begin(), y.end(), static_cast<int32_t*>(h->lab()));
        h->run(3, 100);
    }
    QVERIFY(std::fabs(on.output("loss")[0] - off.output("loss")[0]) < 1e-6);
    QCOMPARE(on.output("accuracy")[0], off.output("accuracy")[0]);
    for (size_t i = 0; i < p.size(); ++i)
        for (size_t j = 0; j < p[i].size(); ++j)
            QVERIFY(std::fabs(on.grad(i)[j] - off.grad(i)[j]) < 1e-5);
}

void TestGraph::initializers() {
    std::vector<float> w(784 * 128);
    InitializerSpec glorot;
    QVERIFY(initializeParam(w.data(), Shape{784, 128}, glorot, 1).ok());
    const float limit = std::sqrt(6.f / (784 + 128));
    float mx = 0;
    double mean = 0;
    for (float v : w) {
        mx = std::max(mx, std::fabs(v));
        mean += v;
    }
    QVERIFY(mx <= limit && mx > 0.99f * limit);
    QVERIFY(std::fabs(mean / double(w.size())) < 1e-3);
    std::vector<float> w2(w.size());
    QVERIFY(initializeParam(w2.data(), Shape{784, 128}, glorot, 1).ok());
    QCOMPARE(w, w2);  // seeded
    InitializerSpec he{.name = "he_normal"};
    QVERIFY(initializeParam(w.data(), Shape{784, 128}, he, 2).ok());
    double var = 0;
    for (float v : w) var += double(v) * v;
    var /= double(w.size());
    QVERIFY(std::fabs(var - 2.0 / 784) < 0.1 * 2.0 / 784);
    InitializerSpec bad{.name = "frobnicate"};
    auto s = initializeParam(w.data(), Shape{2, 2}, bad, 1);
    QVERIFY(!s.ok() && QString::fromStdString(s.error()).contains("glorot_uniform"));
}

// Every attribute prints as its text name with its typed value and reads back to the same value;
// unset attributes do not print.
void TestGraph::typedAttrsRoundTrip() {
    const std::string text =
        "graph t {\n"
        "  %0 = input() {buf=input} : f32[4,3]\n"
        "  %1 = param() {buf=param, name=\"d/kernel\", trainable=0} : f32[3,2]\n"
        "  %2 = matmul(%0, %1) {buf=arena, off=0, trans_a=0, trans_b=0} : f32[4,2]\n"
        "  %3 = act(%2) {act=leaky_relu, alpha=0.2, buf=arena, off=64} : f32[4,2]\n"
        "  %4 = dropout(%3) {buf=arena, off=0, rate=0.25, seed=18446744073709551615} : f32[4,2]\n"
        "  %5 = label() {buf=label} : i32[4]\n"
        "  %6 = loss(%4, %5) {buf=arena, loss=sparse_softmax_xent, off=128, scale=0.25} : f32[1]\n"
        "  %7 = metric(%4, %5) {buf=arena, k=2, metric=sparse_top_k, off=192, on_logits=1} : "
        "f32[1]\n"
        "  %8 = reg_loss(%1) {l1=0.001, l2=1e-05} : f32[1]\n"
        "  %9 = act_grad(%3, %2) {act=elu, alpha=1, uses_output=0} : f32[4,2]\n"
        "  %10 = param() {name=b} : f32[2]\n"
        "  %11 = dense(%0, %1, %10) {act=tanh, has_bias=1} : f32[4,2]\n"
        "  output loss = %6\n"
        "}\n";
    auto g = parseGraph(text);
    QVERIFY2(g.ok(), g.ok() ? "" : g.error().c_str());
    QCOMPARE(printGraph(*g), text);
    const NodeAttrs& p = g->node(1).attrs;
    QCOMPARE(*p.name, std::string("d/kernel"));
    QVERIFY(!p.trainableOr());
    QVERIFY(!g->node(10).attrs.trainable && g->node(10).attrs.trainableOr());
    QVERIFY(g->node(2).attrs.buf == BufKind::Arena && *g->node(2).attrs.off == 0);
    QVERIFY(g->node(3).attrs.act == ActKind::LeakyRelu);
    QCOMPARE(*g->node(3).attrs.alpha, 0.2);
    QCOMPARE(*g->node(4).attrs.seed, std::numeric_limits<uint64_t>::max());
    QCOMPARE(*g->node(4).attrs.rate, 0.25);
    QVERIFY(g->node(6).attrs.loss == LossKind::SparseSoftmaxXent);
    QCOMPARE(g->node(6).attrs.scaleOr(), 0.25);
    QVERIFY(g->node(7).attrs.metric == MetricKind::SparseTopK);
    QCOMPARE(g->node(7).attrs.kOr(), int64_t(2));
    QVERIFY(*g->node(7).attrs.onLogits);
    QCOMPARE(*g->node(8).attrs.l2, 1e-5);
    QVERIFY(!*g->node(9).attrs.usesOutput);
    QVERIFY(*g->node(11).attrs.hasBias && g->node(11).attrs.act == ActKind::Tanh);
    QVERIFY(g->node(0).attrs.buf == BufKind::Input && !g->node(0).attrs.off);
    QVERIFY(g->node(5).attrs.buf == BufKind::Label);
    // Unset attributes print nothing; defaults come from the accessors.
    QVERIFY(!g->node(11).attrs.alpha && g->node(11).attrs.alphaOr() == 0.0);
    QVERIFY(!g->node(11).attrs.scale && g->node(11).attrs.scaleOr() == 1.0);

    // A whole planned training graph round-trips too.
    Graph tg = trainGraph(seedModel(ActivationKind::LeakyRelu), 6);
    PassManager pm;
    addStandardPasses(pm);
    QVERIFY(pm.run(tg).ok());
    const std::string planned = printGraph(tg);
    auto back = parseGraph(planned);
    QVERIFY2(back.ok(), back.ok() ? "" : back.error().c_str());
    QCOMPARE(printGraph(*back), planned);
    for (size_t i = 0; i < tg.nodes.size(); ++i)
        QVERIFY2(tg.nodes[i].attrs == back->nodes[i].attrs, qPrintable(QString("%%1").arg(i)));
}

// Lowering a planned graph: the graph's ops in order with their operands' buffers, the all-reduce
// start of each bucket right after its last gradient is written, the accumulators, the waits and
// the update at the end.
void TestGraph::lowerSmallGraph() {
    Graph g = tdtest::parseOrDie(
        "graph t {\n"
        " %0 = input() : f32[4,3]\n"
        " %1 = param() {name=w} : f32[3,2]\n"
        " %2 = param() {name=b} : f32[2]\n"
        " %3 = matmul(%0, %1) {trans_a=0, trans_b=0} : f32[4,2]\n"
        " %4 = bias_add(%3, %2) : f32[4,2]\n"
        " %5 = label() : i32[4]\n"
        " %6 = loss(%4, %5) {loss=sparse_softmax_xent, scale=0.25} : f32[1]\n"
        " %7 = metric(%4, %5) {k=1, metric=sparse_categorical, on_logits=1} : f32[1]\n"
        " output loss = %6\n"
        " output accuracy = %7\n"
        "}\n");
    QVERIFY(autodiff(g).ok());
    // Unplanned: the error names the first node without a buffer.
    auto unplanned = lower(g);
    QVERIFY(!unplanned.ok());
    QVERIFY2(QString::fromStdString(unplanned.error()).contains("%0 = input: no buffer assigned"),
             unplanned.error().c_str());
    MemoryPlanPass mp;
    QVERIFY(mp.run(g).ok());

    // Readiness order: the bias gradient (bias_grad) is complete before the kernel's (matmul).
    const GradientPlan plan = planGradients(g, 0);
    QCOMPARE(plan.offsets, (std::vector<int64_t>{16, 0}));
    QCOMPARE(plan.buckets, (std::vector<GradBucket>{{0, 2}, {16, 6}}));
    QCOMPARE(plan.elements, int64_t(32));
    const GradientPlan one = planGradients(g, 1 << 20);
    QCOMPARE(one.buckets, (std::vector<GradBucket>{{0, 22}}));

    UpdateSpec sgd;
    sgd.kind = UpdateKind::Sgd;
    sgd.momentum = 0.9f;
    LowerOptions lo;
    lo.accumulate = true;
    lo.buckets = plan.buckets;
    lo.gradOffsets = plan.offsets;
    lo.update = &sgd;
    auto lp = lower(g, lo);
    QVERIFY2(lp.ok(), lp.ok() ? "" : lp.error().c_str());
    std::vector<std::string> ops;
    for (const Instr& i : lp->code) ops.push_back(instrOpName(i.op));
    QCOMPARE(ops, (std::vector<std::string>{"matmul", "bias_add", "loss", "metric", "loss_grad",
                                            "bias_grad", "all_reduce_start", "matmul",
                                            "all_reduce_start", "accumulate", "accumulate",
                                            "all_reduce_wait", "all_reduce_wait", "update"}));
    const auto& c = lp->code;
    QCOMPARE(c[0].node, 3);
    QVERIFY(c[0].in[0].space == Space::Input && c[0].in[1].space == Space::Param);
    QCOMPARE(c[0].in[1].index, 0);
    QVERIFY(c[0].out.space == Space::Arena);
    QCOMPARE(c[0].out.shape, (Shape{4, 2}));
    QVERIFY(c[2].loss == LossKind::SparseSoftmaxXent && c[2].scale == 0.25f);
    QVERIFY(c[2].in[1].space == Space::Label && c[2].in[1].dtype == DType::I32);
    QVERIFY(c[3].metric == MetricKind::SparseCategorical && c[3].onLogits && c[3].k == 1);
    QVERIFY(c[5].out.space == Space::Grad);
    QCOMPARE(c[5].out.index, 1);  // the bias
    QCOMPARE(c[6].bucket, 0);
    QVERIFY(c[6].out.space == Space::FlatGrad && c[6].out.offset == 0);
    QCOMPARE(c[6].out.shape, (Shape{2}));
    QVERIFY(c[7].transA && !c[7].transB && c[7].out.space == Space::Grad && c[7].out.index == 0);
    QCOMPARE(c[8].bucket, 1);
    QCOMPARE(c[8].out.offset, int64_t(16 * sizeof(float)));
    QCOMPARE(c[9].factor, 4.0);  // the global batch: 1 / scale
    QVERIFY(c[9].out.space == Space::Accumulator && c[9].out.index == 0);
    QVERIFY(c[10].in[0].space == Space::Arena && c[10].out.index == 1 && c[10].factor == 1.0);
    QCOMPARE(lp->accumulators, (std::vector<std::string>{"loss", "accuracy"}));
    QVERIFY(lp->update && lp->update->kind == UpdateKind::Sgd);
    QCOMPARE(lp->updateTensors.size(), size_t(2));
    QCOMPARE(lp->slotBuffers, 2);
    QVERIFY(lp->updateTensors[1].grad.space == Space::Grad && lp->updateTensors[1].grad.index == 1);
    QCOMPARE(lp->updateTensors[1].slot.at(0).index, 1);
    QCOMPARE(lp->values[size_t(g.output("loss"))].space, Space::Arena);
    QVERIFY(printProgram(*lp).find("all_reduce_start bucket 1 <- flat+64 f32[6]") !=
            std::string::npos);

    // Without options: only the graph's ops.
    auto plain = lower(g);
    QVERIFY(plain.ok());
    QCOMPARE(plain->code.size(), size_t(7));
    QVERIFY(plain->accumulators.empty() && !plain->update);
}

// The accumulators hold the running sums the trainer reads at log points: the loss times the
// global batch and the metric counts, added on every run.
void TestGraph::accumulatorsSumStepLosses() {
    Harness h;
    tdtest::HarnessOptions opt;
    opt.accumulators = 2;
    QVERIFY(h.compile(trainGraph(seedModel(), 6), {"fusion", "dce"}, nullptr, opt));
    QVERIFY(h.dev->fillZero(h.acc, 0, h.acc.bytes).ok());
    double loss = 0, correct = 0;
    for (int step = 1; step <= 4; ++step) {
        fillInputs(h, uint32_t(step), 6, 20);
        h.run(step, 6 * step);
        loss += double(h.output("loss")[0]) * 6.0;
        correct += h.output("accuracy")[0];
        QCOMPARE(h.accumulators()[0], loss);
        QCOMPARE(h.accumulators()[1], correct);
    }
    QVERIFY(loss > 0);
}

// Gradient buckets: each is started once, in order, after the backward pass wrote its gradients,
// covers every gradient element exactly once, and is waited for before the update reads it.
void TestGraph::gradientBucketsAllReduce() {
    const Graph graph = trainGraph(seedModel(), 6);
    Harness ref;
    QVERIFY(ref.compile(graph, {"fusion", "dce"}));
    fillInputs(ref, 11, 6, 20);
    ref.run(3, 100);

    RecordingCollectives coll;
    UpdateSpec sgd;  // plain SGD, lr 1: w1 = w0 - (the summed gradient)
    sgd.kind = UpdateKind::Sgd;
    tdtest::HarnessOptions opt;
    opt.flatGrads = true;
    opt.bucketBytes = 16;  // small: a bucket per parameter, but the 12-byte last bias shares
    opt.collectives = &coll;
    opt.update = &sgd;
    Harness h;
    std::string error;
    QVERIFY2(h.compile(graph, {"fusion", "dce"}, &error, opt), error.c_str());
    coll.watch(h.flat);
    fillInputs(h, 11, 6, 20);
    std::vector<std::vector<float>> w0;
    for (size_t i = 0; i < h.params.size(); ++i)
        w0.emplace_back(h.param(i), h.param(i) + h.params[i].bytes / sizeof(float));
    // Anything a bucket started before the backward pass wrote it would show as NaN.
    std::fill_n(static_cast<float*>(h.flat.ptr), h.flat.bytes / sizeof(float),
                std::numeric_limits<float>::quiet_NaN());
    h.run(3, 100, UpdateScalars{1.0f, 0.0f, 0.0f});

    const size_t nb = h.plan.buckets.size();
    QVERIFY2(nb >= 3, qPrintable(QString::number(nb)));
    // Starts in bucket order, each once; every wait after all starts, in order, before the end.
    QCOMPARE(coll.calls.size(), 2 * nb);
    for (size_t b = 0; b < nb; ++b) {
        QVERIFY(coll.calls[b].start && coll.calls[b].bucket == int(b));
        QVERIFY(!coll.calls[nb + b].start && coll.calls[nb + b].bucket == int(b));
    }
    // Every gradient element is all-reduced exactly once, padding aside.
    std::vector<int> isGrad(coll.covered.size(), 0);
    for (size_t i = 0; i < h.params.size(); ++i) {
        const int64_t n = int64_t(h.params[i].bytes / sizeof(float));
        for (int64_t j = 0; j < n; ++j) isGrad[size_t(h.plan.offsets[i] + j)] = 1;
    }
    for (size_t e = 0; e < isGrad.size(); ++e)
        if (isGrad[e]) QVERIFY2(coll.covered[e] == 1, qPrintable(QString::number(e)));
    // Each bucket saw the finished gradients when it started.
    for (size_t b = 0; b < nb; ++b) {
        const GradBucket& bk = h.plan.buckets[b];
        for (size_t i = 0; i < h.params.size(); ++i) {
            const int64_t n = int64_t(h.params[i].bytes / sizeof(float));
            const int64_t off = h.plan.offsets[i];
            if (off < bk.offset || off >= bk.offset + bk.count) continue;
            for (int64_t j = 0; j < n; ++j) {
                const float got = coll.seen[b][size_t(off - bk.offset + j)];
                const float want = ref.grad(i)[j];
                QVERIFY2(std::fabs(got - want) <= 1e-6f * (1 + std::fabs(want)),
                         qPrintable(QString("bucket %1 param %2 [%3]: %4 vs %5")
                                        .arg(b)
                                        .arg(i)
                                        .arg(j)
                                        .arg(got)
                                        .arg(want)));
            }
        }
    }
    // The update ran after the waits: it applied the summed (doubled) gradients.
    for (size_t i = 0; i < h.params.size(); ++i)
        for (size_t j = 0; j < w0[i].size(); ++j) {
            const float want = w0[i][j] - 2 * ref.grad(i)[j];
            QVERIFY(std::fabs(h.param(i)[j] - want) <= 1e-5f * (1 + std::fabs(want)));
        }

    // A collective that fails fails the step with its message.
    coll.failBucket = 1;
    coll.failMessage = "all-reduce: worker rank 1 did not answer within 30 s (it exited or hangs)";
    Status s = h.exe->run(StepArgs{4, 100, UpdateScalars{1.0f, 0.0f, 0.0f}});
    QVERIFY(!s.ok());
    QCOMPARE(s.error(), coll.failMessage);
}

// tf.distribute semantics: two replicas with half the batch each (loss over the global batch,
// regularization halved, dropout keyed by the global sample index) sum to one device's loss and
// gradients with the whole batch.
void TestGraph::replicaSlicesSumToGlobalBatch() {
    ModelSpec m = seedModel();
    m.layers[1].kernelRegularizer = RegularizerSpec{0.01, 0.02};
    m.layers[3].biasRegularizer = RegularizerSpec{0.0, 0.05};
    const int64_t B = 8, F = 20;
    tdtest::HarnessOptions opt;
    opt.accumulators = 2;
    Harness full, half;
    QVERIFY(full.compile(trainGraph(m, B), {"fusion", "dce"}, nullptr, opt));
    QVERIFY(half.compile(trainGraph(m, B / 2, B, 2), {"fusion", "dce"}, nullptr, opt));
    fillInputs(full, 21, B, F);
    const int64_t step = 7, base = 800;  // the batch's first global sample index
    full.run(step, base);

    QVERIFY(half.dev->fillZero(half.acc, 0, half.acc.bytes).ok());
    QVERIFY(full.dev->fillZero(full.acc, 0, full.acc.bytes).ok());
    full.run(step, base);  // again, into zeroed accumulators (same step: same result)
    double loss = 0;
    std::vector<std::vector<double>> sum(full.params.size());
    for (size_t i = 0; i < full.params.size(); ++i) {
        std::copy_n(full.param(i), full.params[i].bytes / sizeof(float), half.param(i));
        sum[i].assign(full.params[i].bytes / sizeof(float), 0.0);
    }
    for (int64_t r = 0; r < 2; ++r) {
        const int64_t rows = B / 2;
        std::copy_n(full.in() + r * rows * F, rows * F, half.in());
        std::copy_n(static_cast<const int32_t*>(full.lab()) + r * rows, rows,
                    static_cast<int32_t*>(half.lab()));
        half.run(step, base + r * rows);
        loss += half.output("loss")[0];
        for (size_t i = 0; i < sum.size(); ++i)
            for (size_t j = 0; j < sum[i].size(); ++j) sum[i][j] += half.grad(i)[j];
    }
    const float fullLoss = full.output("loss")[0];
    QVERIFY2(std::fabs(loss - fullLoss) <= 1e-5 * (1 + std::fabs(fullLoss)),
             qPrintable(QString("%1 vs %2").arg(loss).arg(fullLoss)));
    for (size_t i = 0; i < sum.size(); ++i)
        for (size_t j = 0; j < sum[i].size(); ++j) {
            const double want = full.grad(i)[j];
            QVERIFY2(
                std::fabs(sum[i][j] - want) <= 1e-5 * (1 + std::fabs(want)),
                qPrintable(
                    QString("param %1 [%2]: %3 vs %4").arg(i).arg(j).arg(sum[i][j]).arg(want)));
        }
    // The accumulators: summed over replicas and divided by the global batch, Keras' mean loss.
    QVERIFY(std::fabs(half.accumulators()[0] / B - full.accumulators()[0] / B) <=
            1e-5 * (1 + std::fabs(fullLoss)));
    QCOMPARE(half.accumulators()[1], full.accumulators()[1]);
    // Dropout really dropped something: the halves without it would not need the sample index.
    int zeros = 0;
    for (const Node& n : full.g.nodes)
        if (n.op == Op::Dropout) {
            const float* v = full.value(n.id);
            for (int64_t j = 0; j < numElements(n.shape); ++j) zeros += v[j] == 0.0f;
        }
    QVERIFY(zeros > 0);
}

QTEST_GUILESS_MAIN(TestGraph)
#include "test_graph.moc"

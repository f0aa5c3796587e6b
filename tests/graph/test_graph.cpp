// The IR (text round trip, verifier), the builder and autodiff on whole models, and the passes
// (fusion decisions, dead code, memory planning, the pass manager), including whole models run
// with passes on and off.
#include <QtTest>
#include <random>

#include "engine/graph/initializers.h"
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

Graph trainGraph(const ModelSpec& model, int64_t batch) {
    ModelSpec m = model;
    auto info = inferShapes(m);
    if (!info.ok()) qFatal("%s", info.error().c_str());
    BuildOptions bo;
    bo.batch = batch;
    bo.metrics = {"accuracy"};
    auto g = buildGraph(m, *info, bo);
    if (!g.ok()) qFatal("%s", g.error().c_str());
    if (!autodiff(*g).ok()) qFatal("autodiff failed");
    return std::move(g).value();
}

}  // namespace

class TestGraph : public QObject {
    Q_OBJECT
  private slots:
    void textRoundTrip();
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
    QCOMPARE(seen, (std::vector<std::string>{"build", "dce", "memory"}));
    QCOMPARE(pm.timings().size(), size_t(3));
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

QTEST_GUILESS_MAIN(TestGraph)
#include "test_graph.moc"

// Every op on the CPU backend against a plain double-precision reference, and a central
// finite-difference check of every gradient rule (forward op -> mse/loss -> autodiff).
#include <QtTest>
#include <cmath>
#include <functional>
#include <random>

#include "engine/backend/cpu/kernels.h"
#include "harness.h"

using namespace td;
using tdtest::Harness;

namespace {

std::vector<float> randomVec(size_t n, uint32_t seed, float lo = -1.f, float hi = 1.f) {
    std::mt19937 rng(seed);
    std::uniform_real_distribution<float> d(lo, hi);
    std::vector<float> v(n);
    for (auto& x : v) {
        do x = d(rng);
        while (std::fabs(x) < 0.05f);  // keep away from kinks of relu-like functions
    }
    return v;
}

double actRef(const std::string& a, double x, double alpha) {
    if (a == "relu") return x > 0 ? x : 0;
    if (a == "leaky_relu") return x > 0 ? x : alpha * x;
    if (a == "elu") return x > 0 ? x : alpha * (std::exp(x) - 1);
    if (a == "gelu") return 0.5 * x * (1 + std::erf(x / std::sqrt(2.0)));
    if (a == "sigmoid") return 1 / (1 + std::exp(-x));
    if (a == "tanh") return std::tanh(x);
    return x;
}

}  // namespace

class TestOps : public QObject {
    Q_OBJECT
  private slots:
    void activationForward_data();
    void activationForward();
    void softmaxForward();
    void matmulForward_data();
    void matmulForward();
    void denseFusedMatchesUnfused_data();
    void denseFusedMatchesUnfused();
    void biasAddAndGrad();
    void dropoutMaskIsKeyedAndScaled();
    void lossForward_data();
    void lossForward();
    void metrics();
    void regularizer();
    void gradientCheck_data();
    void gradientCheck();
};

void TestOps::activationForward_data() {
    QTest::addColumn<QString>("act");
    QTest::addColumn<double>("alpha");
    for (const char* a : {"relu", "leaky_relu", "elu", "gelu", "sigmoid", "tanh"})
        QTest::newRow(a) << QString(a) << (std::string(a) == "leaky_relu" ? 0.2 : 1.0);
}

void TestOps::activationForward() {
    QFETCH(QString, act);
    QFETCH(double, alpha);
    Harness h;
    std::string ir =
        "graph t {\n %0 = input() : f32[4,7]\n %1 = act(%0) {act=" + act.toStdString() +
        ", alpha=" + fmtNum(alpha) + "} : f32[4,7]\n output y = %1\n}\n";
    QVERIFY(h.compile(tdtest::parseOrDie(ir)));
    auto x = randomVec(28, 1, -3, 3);
    std::copy(x.begin(), x.end(), h.in());
    h.run();
    const float* y = h.output("y");
    for (size_t i = 0; i < x.size(); ++i)
        QVERIFY2(std::fabs(y[i] - actRef(act.toStdString(), x[i], alpha)) < 1e-5,
                 qPrintable(QString("element %1").arg(i)));
}

void TestOps::softmaxForward() {
    Harness h;
    QVERIFY(h.compile(tdtest::parseOrDie(
        "graph t {\n %0 = input() : f32[3,5]\n %1 = act(%0) {act=softmax} : f32[3,5]\n"
        " output y = %1\n}\n")));
    auto x = randomVec(15, 2, -30, 30);  // large logits: must not overflow
    std::copy(x.begin(), x.end(), h.in());
    h.run();
    const float* y = h.output("y");
    for (int r = 0; r < 3; ++r) {
        double m = -1e30, s = 0;
        for (int c = 0; c < 5; ++c) m = std::max(m, double(x[r * 5 + c]));
        for (int c = 0; c < 5; ++c) s += std::exp(x[r * 5 + c] - m);
        for (int c = 0; c < 5; ++c)
            QVERIFY(std::fabs(y[r * 5 + c] - std::exp(x[r * 5 + c] - m) / s) < 1e-6);
    }
}

void TestOps::matmulForward_data() {
    QTest::addColumn<int>("ta");
    QTest::addColumn<int>("tb");
    QTest::newRow("nn") << 0 << 0;
    QTest::newRow("tn") << 1 << 0;
    QTest::newRow("nt") << 0 << 1;
}

void TestOps::matmulForward() {
    QFETCH(int, ta);
    QFETCH(int, tb);
    const int M = 5, K = 7, N = 3;
    std::string as = ta ? "[7,5]" : "[5,7]", bs = tb ? "[3,7]" : "[7,3]";
    Harness h;
    QVERIFY(h.compile(tdtest::parseOrDie(
        "graph t {\n %0 = param() {name=a} : f32" + as + "\n %1 = param() {name=b} : f32" + bs +
        "\n %2 = matmul(%0, %1) {trans_a=" + std::to_string(ta) +
        ", trans_b=" + std::to_string(tb) + "} : f32[5,3]\n output c = %2\n}\n")));
    auto a = randomVec(M * K, 3), b = randomVec(K * N, 4);
    std::copy(a.begin(), a.end(), h.param(0));
    std::copy(b.begin(), b.end(), h.param(1));
    h.run();
    const float* c = h.output("c");
    for (int m = 0; m < M; ++m)
        for (int n = 0; n < N; ++n) {
            double s = 0;
            for (int k = 0; k < K; ++k)
                s += double(ta ? a[k * M + m] : a[m * K + k]) * (tb ? b[n * K + k] : b[k * N + n]);
            QVERIFY(std::fabs(c[m * N + n] - s) < 1e-5);
        }
}

void TestOps::denseFusedMatchesUnfused_data() {
    QTest::addColumn<QString>("act");
    for (const char* a : {"linear", "relu", "leaky_relu", "elu", "gelu", "sigmoid", "tanh"})
        QTest::newRow(a) << QString(a);
}

void TestOps::denseFusedMatchesUnfused() {
    QFETCH(QString, act);
    std::string ir =
        "graph t {\n %0 = input() : f32[6,9]\n %1 = param() {name=w} : f32[9,4]\n"
        " %2 = param() {name=b} : f32[4]\n"
        " %3 = matmul(%0, %1) {trans_a=0, trans_b=0} : f32[6,4]\n"
        " %4 = bias_add(%3, %2) : f32[6,4]\n";
    if (act == "linear") {
        ir += " output y = %4\n}\n";
    } else {
        ir += " %5 = act(%4) {act=" + act.toStdString() +
              ", alpha=0.3} : f32[6,4]\n output y = %5\n}\n";
    }
    Harness fused, plain;
    // For "linear" the fused node replaces the bias_add, which stays the graph output.
    QVERIFY(fused.compile(tdtest::parseOrDie(ir), {"fusion", "dce"}));
    QVERIFY(plain.compile(tdtest::parseOrDie(ir), {}));
    bool hasDense = false;
    for (const auto& n : fused.g.nodes) hasDense = hasDense || n.op == Op::Dense;
    QVERIFY(hasDense);
    auto x = randomVec(54, 5), w = randomVec(36, 6), b = randomVec(4, 7);
    for (Harness* h : {&fused, &plain}) {
        std::copy(x.begin(), x.end(), h->in());
        std::copy(w.begin(), w.end(), h->param(0));
        std::copy(b.begin(), b.end(), h->param(1));
        h->run();
    }
    const float* a = fused.output("y");
    const float* c = plain.output("y");
    for (int i = 0; i < 24; ++i) QVERIFY2(std::fabs(a[i] - c[i]) < 1e-5, qPrintable(act));
}

void TestOps::biasAddAndGrad() {
    std::vector<float> x = randomVec(12, 8), b = randomVec(4, 9), y(12), db(4);
    cpu::biasAdd(x.data(), b.data(), y.data(), 3, 4);
    for (int r = 0; r < 3; ++r)
        for (int c = 0; c < 4; ++c) QCOMPARE(y[r * 4 + c], x[r * 4 + c] + b[c]);
    cpu::biasGrad(x.data(), db.data(), 3, 4);
    for (int c = 0; c < 4; ++c) QVERIFY(std::fabs(db[c] - (x[c] + x[4 + c] + x[8 + c])) < 1e-6);
}

void TestOps::dropoutMaskIsKeyedAndScaled() {
    const int rows = 64, cols = 256;
    std::vector<float> x(rows * cols, 1.f), y(x.size()), y2(x.size()), y3(x.size());
    cpu::dropout(x.data(), y.data(), rows, cols, 0.25f, 42, 7, 1000);
    cpu::dropout(x.data(), y2.data(), rows, cols, 0.25f, 42, 7, 1000);
    cpu::dropout(x.data(), y3.data(), rows, cols, 0.25f, 42, 8, 1000);
    int dropped = 0, differ = 0;
    for (size_t i = 0; i < y.size(); ++i) {
        QVERIFY(y[i] == 0.f || std::fabs(y[i] - 1.f / 0.75f) < 1e-6);  // inverted scaling
        dropped += y[i] == 0.f;
        QCOMPARE(y[i], y2[i]);  // same key -> same mask (forward == backward)
        differ += (y[i] == 0.f) != (y3[i] == 0.f);
    }
    const double frac = double(dropped) / double(y.size());
    QVERIFY2(std::fabs(frac - 0.25) < 0.02, qPrintable(QString::number(frac)));
    QVERIFY(differ > 1000);  // another step -> another mask
    // Row r of a slice starting at sample 1032 equals row r+32 of the batch starting at 1000:
    // masks follow the global sample index, so N replicas equal one device.
    std::vector<float> part(32 * cols);
    cpu::dropout(x.data(), part.data(), 32, cols, 0.25f, 42, 7, 1032);
    for (int i = 0; i < 32 * cols; ++i) QCOMPARE(part[i], y[32 * cols + i]);
}

void TestOps::lossForward_data() {
    QTest::addColumn<QString>("loss");
    for (const char* l : {"sparse_softmax_xent", "softmax_xent", "sparse_xent", "xent",
                          "sigmoid_bce", "bce", "mse"})
        QTest::newRow(l) << QString(l);
}

void TestOps::lossForward() {
    QFETCH(QString, loss);
    const std::string L = loss.toStdString();
    const int R = 4, C = 5;
    const bool sparse = L.rfind("sparse", 0) == 0;
    const bool probs = L == "sparse_xent" || L == "xent" || L == "bce";
    auto p = randomVec(R * C, 10, probs ? 0.05f : -3.f, probs ? 0.95f : 3.f);
    std::vector<int32_t> yi{1, 4, 0, 2};
    auto yf = randomVec(R * C, 11, 0.05f, 0.95f);
    if (L == "softmax_xent" || L == "xent") {
        std::fill(yf.begin(), yf.end(), 0.f);
        for (int r = 0; r < R; ++r) yf[r * C + yi[r]] = 1.f;
    }
    float out = 0;
    cpu::loss(*parseLossKind(L), p.data(), sparse ? (const void*)yi.data() : yf.data(), &out, R, C,
              0.25f);
    double ref = 0;
    for (int r = 0; r < R; ++r) {
        const float* pr = &p[r * C];
        double rowLoss = 0, s = 0, m = -1e30;
        for (int c = 0; c < C; ++c) s += pr[c], m = std::max(m, double(pr[c]));
        if (L == "sparse_softmax_xent" || L == "softmax_xent") {
            double z = 0;
            for (int c = 0; c < C; ++c) z += std::exp(pr[c] - m);
            rowLoss = -(pr[yi[r]] - m - std::log(z));
        } else if (L == "sparse_xent" || L == "xent") {
            rowLoss = -std::log(std::clamp(pr[yi[r]] / s, 1e-7, 1 - 1e-7));
        } else if (L == "sigmoid_bce" || L == "bce") {
            for (int c = 0; c < C; ++c) {
                double q = L == "bce" ? pr[c] : 1 / (1 + std::exp(-pr[c]));
                double y = yf[r * C + c];
                rowLoss -= y * std::log(q) + (1 - y) * std::log(1 - q);
            }
            rowLoss /= C;
        } else {
            for (int c = 0; c < C; ++c) rowLoss += std::pow(pr[c] - yf[r * C + c], 2);
            rowLoss /= C;
        }
        ref += rowLoss;
    }
    ref *= 0.25;
    QVERIFY2(std::fabs(out - ref) < 1e-5 * std::max(1.0, std::fabs(ref)),
             qPrintable(QString("%1 vs %2").arg(out).arg(ref)));
}

void TestOps::metrics() {
    // 3 rows, 4 classes.
    std::vector<float> p{0.1f, 0.7f, 0.1f, 0.1f, 0.4f, 0.3f, 0.2f, 0.1f, 0.1f, 0.2f, 0.3f, 0.4f};
    std::vector<int32_t> y{1, 1, 0};
    float out = 0;
    cpu::metric(MetricKind::SparseCategorical, 1, false, p.data(), y.data(), &out, 3, 4);
    QCOMPARE(out, 1.f);
    cpu::metric(MetricKind::SparseTopK, 2, false, p.data(), y.data(), &out, 3, 4);
    QCOMPARE(out, 2.f);  // row 1: class 1 is second; row 2: class 0 is last
    std::vector<float> onehot{0, 1, 0, 0, 0, 1, 0, 0, 1, 0, 0, 0};
    cpu::metric(MetricKind::Categorical, 1, false, p.data(), onehot.data(), &out, 3, 4);
    QCOMPARE(out, 1.f);
    std::vector<float> logits{2.f, -1.f, 0.5f}, targets{1.f, 1.f, 0.f};
    cpu::metric(MetricKind::Binary, 1, true, logits.data(), targets.data(), &out, 3, 1);
    QCOMPARE(out, 1.f);  // thresholds logits at 0: row 0 right, rows 1 and 2 wrong
}

void TestOps::regularizer() {
    std::vector<float> w{1.f, -2.f, 0.5f}, g{0.1f, 0.1f, 0.1f}, out(3);
    float l = 0;
    cpu::regLoss(w.data(), 3, 0.01f, 0.1f, &l);
    QVERIFY(std::fabs(l - (0.01 * 3.5 + 0.1 * 5.25)) < 1e-6);
    cpu::regGrad(g.data(), w.data(), out.data(), 3, 0.01f, 0.1f);
    QVERIFY(std::fabs(out[1] - (0.1f - 0.01f - 0.4f)) < 1e-6);
}

// ---- gradient check
// ------------------------------------------------------------------------------

void TestOps::gradientCheck_data() {
    QTest::addColumn<QString>("ir");
    QTest::addColumn<bool>("sparseLabels");
    const std::string head = "graph t {\n %0 = param() {name=x} : f32[3,4]\n";
    auto actRow = [&](const char* act, const char* extra) {
        return head + " %1 = act(%0) {act=" + act + extra + "} : f32[3,4]\n" +
               " %2 = label() : f32[3,4]\n %3 = loss(%1, %2) {loss=mse, scale=0.333333333} : "
               "f32[1]\n"
               " output loss = %3\n}\n";
    };
    for (const char* a : {"relu", "sigmoid", "tanh", "softmax", "gelu"})
        QTest::newRow(a) << QString::fromStdString(actRow(a, "")) << false;
    QTest::newRow("leaky_relu") << QString::fromStdString(actRow("leaky_relu", ", alpha=0.2"))
                                << false;
    QTest::newRow("elu") << QString::fromStdString(actRow("elu", ", alpha=1")) << false;
    QTest::newRow("matmul+bias")
        << QString::fromStdString(
               head +
               " %1 = param() {name=w} : f32[4,2]\n %2 = param() {name=b} : f32[2]\n"
               " %3 = matmul(%0, %1) {trans_a=0, trans_b=0} : f32[3,2]\n %4 = bias_add(%3, %2) : "
               "f32[3,2]\n"
               " %5 = label() : f32[3,2]\n %6 = loss(%4, %5) {loss=mse, scale=0.333333333} : "
               "f32[1]\n"
               " output loss = %6\n}\n")
        << false;
    QTest::newRow("reshape")
        << QString::fromStdString(
               head +
               " %1 = reshape(%0) : f32[2,6]\n %2 = act(%1) {act=tanh} : f32[2,6]\n"
               " %3 = label() : f32[2,6]\n %4 = loss(%2, %3) {loss=mse, scale=0.5} : f32[1]\n"
               " output loss = %4\n}\n")
        << false;
    QTest::newRow("dropout")
        << QString::fromStdString(
               head +
               " %1 = dropout(%0) {rate=0.3, seed=5} : f32[3,4]\n %2 = label() : f32[3,4]\n"
               " %3 = loss(%1, %2) {loss=mse, scale=0.333333333} : f32[1]\n output loss = %3\n}\n")
        << false;
    for (const char* l : {"softmax_xent", "xent", "sigmoid_bce", "bce", "mse"})
        QTest::newRow(l) << QString::fromStdString(
                                head +
                                " %1 = act(%0) {act=sigmoid} : f32[3,4]\n %2 = label() : f32[3,4]\n"
                                " %3 = loss(%1, %2) {loss=" +
                                l + ", scale=0.333333333} : f32[1]\n output loss = %3\n}\n")
                         << false;
    for (const char* l : {"sparse_softmax_xent", "sparse_xent"})
        QTest::newRow(l) << QString::fromStdString(
                                head +
                                " %1 = act(%0) {act=sigmoid} : f32[3,4]\n %2 = label() : i32[3]\n"
                                " %3 = loss(%1, %2) {loss=" +
                                l + ", scale=0.333333333} : f32[1]\n output loss = %3\n}\n")
                         << true;
    QTest::newRow("reg_loss")
        << QString::fromStdString(
               head +
               " %1 = act(%0) {act=tanh} : f32[3,4]\n %2 = label() : f32[3,4]\n"
               " %3 = loss(%1, %2) {loss=mse, scale=0.333333333} : f32[1]\n"
               " %4 = reg_loss(%0) {l1=0.01, l2=0.05} : f32[1]\n %5 = add(%3, %4) : f32[1]\n"
               " output loss = %5\n}\n")
        << false;
}

void TestOps::gradientCheck() {
    QFETCH(QString, ir);
    QFETCH(bool, sparseLabels);
    Graph g = tdtest::parseOrDie(ir.toStdString());
    QVERIFY(autodiff(g).ok());
    Harness h;
    std::string e;
    QVERIFY2(h.compile(g, {"fusion", "dce"}, &e), e.c_str());
    // Inputs: the params, kept away from kinks; labels in (0,1) or class ids.
    std::vector<int> pids = h.g.params();
    for (size_t i = 0; i < pids.size(); ++i) {
        auto v = randomVec(static_cast<size_t>(numElements(h.g.node(pids[i]).shape)),
                           20 + uint32_t(i), -1.5f, 1.5f);
        std::copy(v.begin(), v.end(), h.param(i));
    }
    for (const auto& n : h.g.nodes)
        if (n.op == Op::Label) {
            const int64_t k = numElements(n.shape);
            if (sparseLabels) {
                for (int64_t i = 0; i < k; ++i)
                    static_cast<int32_t*>(h.lab())[i] = int32_t((i * 3 + 1) % 4);
            } else {
                auto v = randomVec(static_cast<size_t>(k), 30, 0.1f, 0.9f);
                std::copy(v.begin(), v.end(), static_cast<float*>(h.lab()));
            }
        }
    h.run();
    const int lossId = h.g.output("loss");
    for (size_t i = 0; i < pids.size(); ++i) {
        if (!h.g.grads.count(pids[i])) continue;
        const int64_t n = numElements(h.g.node(pids[i]).shape);
        std::vector<float> analytic(h.grad(i), h.grad(i) + n);
        for (int64_t j = 0; j < n; ++j) {
            float* w = h.param(i) + j;
            const float orig = *w;
            const float eps = 1e-2f;
            *w = orig + eps;
            h.run();
            const double lp = h.value(lossId)[0];
            *w = orig - eps;
            h.run();
            const double lm = h.value(lossId)[0];
            *w = orig;
            const double numeric = (lp - lm) / (2 * eps);
            const double tol = 2e-3 + 2e-2 * std::fabs(numeric);
            QVERIFY2(std::fabs(numeric - analytic[size_t(j)]) < tol,
                     qPrintable(QString("param %1[%2]: analytic %3 numeric %4")
                                    .arg(i)
                                    .arg(j)
                                    .arg(analytic[size_t(j)])
                                    .arg(numeric)));
        }
    }
}

QTEST_GUILESS_MAIN(TestOps)
#include "test_ops.moc"

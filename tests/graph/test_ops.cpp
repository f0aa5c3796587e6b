// Every op on the CPU backend against a plain double-precision reference, and a central
// finite-difference check of every gradient rule (forward op -> mse/loss -> autodiff).
#include <QtTest>
#include <algorithm>
#include <cmath>
#include <cstring>
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
    // Images and normalization.
    void conv2dForward_data();
    void conv2dForward();
    void conv2dFusedMatchesUnfused();
    void poolingForward_data();
    void poolingForward();
    void padAndScaleForward();
    void batchNormTrainingAndMovingStatistics();
    void batchNormInference();
    void layerNormForward();
    void imageGradientCheck_data();
    void imageGradientCheck();
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

// ---- images and normalization ------------------------------------------------------------------

namespace {

// A naive double-precision convolution over NHWC x and a Keras kernel [KH,KW,C/G,F].
std::vector<double> convRef(const std::vector<float>& x, const std::vector<float>& w,
                            const std::vector<float>* bias, int B, int H, int W, int C, int KH,
                            int KW, int F, int G, int sh, int sw, int dh, int dw, int pt, int pl,
                            int OH, int OW) {
    std::vector<double> y(size_t(B * OH * OW * F), 0.0);
    const int Cg = C / G, Fg = F / G;
    for (int b = 0; b < B; ++b)
        for (int oh = 0; oh < OH; ++oh)
            for (int ow = 0; ow < OW; ++ow)
                for (int f = 0; f < F; ++f) {
                    double s = bias ? (*bias)[size_t(f)] : 0.0;
                    const int g = f / Fg;
                    for (int kh = 0; kh < KH; ++kh)
                        for (int kw = 0; kw < KW; ++kw) {
                            const int h = oh * sh - pt + kh * dh, ww = ow * sw - pl + kw * dw;
                            if (h < 0 || h >= H || ww < 0 || ww >= W) continue;
                            for (int ci = 0; ci < Cg; ++ci)
                                s += double(x[size_t(((b * H + h) * W + ww) * C + g * Cg + ci)]) *
                                     w[size_t(((kh * KW + kw) * Cg + ci) * F + f)];
                        }
                    y[size_t(((b * OH + oh) * OW + ow) * F + f)] = s;
                }
    return y;
}

std::string shapeText(std::initializer_list<int> dims) {
    std::string s = "[";
    for (int d : dims) s += (s.size() > 1 ? "," : "") + std::to_string(d);
    return s + "]";
}

}  // namespace

void TestOps::conv2dForward_data() {
    // H, W, C, KH, KW, F, groups, strides, dilation, pads (top, bottom, left, right)
    QTest::addColumn<QVector<int>>("p");
    QTest::newRow("3x3 valid") << QVector<int>{6, 5, 3, 3, 3, 4, 1, 1, 1, 0, 0, 0, 0};
    QTest::newRow("3x3 same") << QVector<int>{6, 5, 3, 3, 3, 4, 1, 1, 1, 1, 1, 1, 1};
    QTest::newRow("stride 2, odd padding") << QVector<int>{7, 6, 2, 3, 2, 5, 1, 2, 1, 1, 1, 0, 1};
    QTest::newRow("dilation 2") << QVector<int>{7, 7, 2, 3, 3, 3, 1, 1, 2, 2, 2, 2, 2};
    QTest::newRow("groups 2") << QVector<int>{5, 5, 4, 3, 3, 6, 2, 1, 1, 1, 1, 1, 1};
    QTest::newRow("1x1") << QVector<int>{4, 4, 5, 1, 1, 3, 1, 1, 1, 0, 0, 0, 0};
}

void TestOps::conv2dForward() {
    QFETCH(QVector<int>, p);
    const int B = 2, H = p[0], W = p[1], C = p[2], KH = p[3], KW = p[4], F = p[5], G = p[6],
              S = p[7], D = p[8], pt = p[9], pb = p[10], pl = p[11], pr = p[12];
    const int OH = (H + pt + pb - ((KH - 1) * D + 1)) / S + 1;
    const int OW = (W + pl + pr - ((KW - 1) * D + 1)) / S + 1;
    std::string ir = "graph t {\n %0 = input() : f32" + shapeText({B, H, W, C}) +
                     "\n %1 = param() {name=w} : f32" + shapeText({KH, KW, C / G, F}) +
                     "\n %2 = conv2d(%0, %1) {dilation=" + std::to_string(D) + "x" +
                     std::to_string(D) + ", groups=" + std::to_string(G) +
                     ", pads=" + std::to_string(pt) + "x" + std::to_string(pb) + "x" +
                     std::to_string(pl) + "x" + std::to_string(pr) +
                     ", strides=" + std::to_string(S) + "x" + std::to_string(S) + "} : f32" +
                     shapeText({B, OH, OW, F}) + "\n output y = %2\n}\n";
    Harness h;
    std::string e;
    QVERIFY2(h.compile(tdtest::parseOrDie(ir), {}, &e), e.c_str());
    auto x = randomVec(size_t(B * H * W * C), 5), w = randomVec(size_t(KH * KW * C / G * F), 6);
    std::copy(x.begin(), x.end(), h.in());
    std::copy(w.begin(), w.end(), h.param(0));
    h.run();
    const auto ref = convRef(x, w, nullptr, B, H, W, C, KH, KW, F, G, S, S, D, D, pt, pl, OH, OW);
    const float* y = h.output("y");
    for (size_t i = 0; i < ref.size(); ++i)
        QVERIFY2(std::fabs(y[i] - ref[i]) < 1e-4,
                 qPrintable(QString("element %1: %2 vs %3").arg(i).arg(y[i]).arg(ref[i])));
}

void TestOps::conv2dFusedMatchesUnfused() {
    // conv2d -> bias_add -> relu: the fusion pass makes one conv2d with post-ops.
    const std::string ir =
        "graph t {\n %0 = input() : f32[2,6,6,3]\n %1 = param() {name=w} : f32[3,3,3,4]\n"
        " %2 = param() {name=b} : f32[4]\n"
        " %3 = conv2d(%0, %1) {pads=1x1x1x1} : f32[2,6,6,4]\n"
        " %4 = bias_add(%3, %2) : f32[2,6,6,4]\n %5 = act(%4) {act=relu} : f32[2,6,6,4]\n"
        " output y = %5\n}\n";
    std::vector<float> results[2];
    for (int fused = 0; fused < 2; ++fused) {
        Harness h;
        std::string e;
        QVERIFY2(
            h.compile(tdtest::parseOrDie(ir),
                      fused ? std::vector<std::string>{"fusion"} : std::vector<std::string>{}, &e),
            e.c_str());
        int convs = 0;
        for (const Node& n : h.g.nodes) convs += n.op == Op::Conv2D;
        QCOMPARE(convs, 1);
        QCOMPARE(h.g.nodes.size(), size_t(fused ? 4 : 6));  // bias_add and act folded in
        auto x = randomVec(216, 7), w = randomVec(108, 8), b = randomVec(4, 9);
        std::copy(x.begin(), x.end(), h.in());
        std::copy(w.begin(), w.end(), h.param(0));
        std::copy(b.begin(), b.end(), h.param(1));
        h.run();
        results[fused].assign(h.output("y"), h.output("y") + 288);
        if (!fused) {
            const auto ref = convRef(x, w, &b, 2, 6, 6, 3, 3, 3, 4, 1, 1, 1, 1, 1, 1, 1, 6, 6);
            for (size_t i = 0; i < ref.size(); ++i)
                QVERIFY(std::fabs(results[0][i] - std::max(0.0, ref[i])) < 1e-4);
        }
    }
    for (size_t i = 0; i < results[0].size(); ++i)
        QVERIFY(std::fabs(results[0][i] - results[1][i]) < 1e-5);
}

void TestOps::poolingForward_data() {
    QTest::addColumn<QString>("op");
    // H, W, window h, w, strides h, w, pads top, bottom, left, right
    QTest::addColumn<QVector<int>>("p");
    for (const char* op : {"max_pool", "avg_pool"}) {
        QTest::addRow("%s 2x2", op) << QString(op) << QVector<int>{6, 6, 2, 2, 2, 2, 0, 0, 0, 0};
        QTest::addRow("%s 3x3 same", op)
            << QString(op) << QVector<int>{5, 4, 3, 3, 1, 1, 1, 1, 1, 1};
        QTest::addRow("%s 2x3 odd padding", op)
            << QString(op) << QVector<int>{5, 7, 2, 3, 2, 2, 0, 1, 1, 1};
    }
}

void TestOps::poolingForward() {
    QFETCH(QString, op);
    QFETCH(QVector<int>, p);
    const int B = 2, C = 3, H = p[0], W = p[1], kh = p[2], kw = p[3], sh = p[4], sw = p[5],
              pt = p[6], pb = p[7], pl = p[8], pr = p[9];
    const int OH = (H + pt + pb - kh) / sh + 1, OW = (W + pl + pr - kw) / sw + 1;
    const std::string ir =
        "graph t {\n %0 = input() : f32" + shapeText({B, H, W, C}) + "\n %1 = " + op.toStdString() +
        "(%0) {pads=" + std::to_string(pt) + "x" + std::to_string(pb) + "x" + std::to_string(pl) +
        "x" + std::to_string(pr) + ", strides=" + std::to_string(sh) + "x" + std::to_string(sw) +
        ", window=" + std::to_string(kh) + "x" + std::to_string(kw) + "} : f32" +
        shapeText({B, OH, OW, C}) + "\n output y = %1\n}\n";
    Harness h;
    std::string e;
    QVERIFY2(h.compile(tdtest::parseOrDie(ir), {}, &e), e.c_str());
    auto x = randomVec(size_t(B * H * W * C), 10, -3, -0.5);  // all negative: padding must not win
    std::copy(x.begin(), x.end(), h.in());
    h.run();
    const float* y = h.output("y");
    for (int b = 0; b < B; ++b)
        for (int oh = 0; oh < OH; ++oh)
            for (int ow = 0; ow < OW; ++ow)
                for (int c = 0; c < C; ++c) {
                    double best = -1e30, sum = 0;
                    int count = 0;
                    for (int i = 0; i < kh; ++i)
                        for (int j = 0; j < kw; ++j) {
                            const int hh = oh * sh - pt + i, ww = ow * sw - pl + j;
                            if (hh < 0 || hh >= H || ww < 0 || ww >= W) continue;
                            const double v = x[size_t(((b * H + hh) * W + ww) * C + c)];
                            best = std::max(best, v);
                            sum += v;
                            ++count;
                        }
                    const double want = op == "max_pool" ? best : sum / count;
                    QVERIFY(std::fabs(y[((b * OH + oh) * OW + ow) * C + c] - want) < 1e-5);
                }
}

void TestOps::padAndScaleForward() {
    Harness h;
    QVERIFY(h.compile(tdtest::parseOrDie(
        "graph t {\n %0 = input() : f32[2,3,2,2]\n %1 = scale(%0) {offset=-1, scale=0.5} : "
        "f32[2,3,2,2]\n %2 = pad2d(%1) {pads=1x0x2x1} : f32[2,4,5,2]\n output y = %2\n}\n")));
    auto x = randomVec(24, 11);
    std::copy(x.begin(), x.end(), h.in());
    h.run();
    const float* y = h.output("y");
    for (int b = 0; b < 2; ++b)
        for (int i = 0; i < 4; ++i)
            for (int j = 0; j < 5; ++j)
                for (int c = 0; c < 2; ++c) {
                    const int hh = i - 1, ww = j - 2;
                    const bool inside = hh >= 0 && hh < 3 && ww >= 0 && ww < 2;
                    const double want =
                        inside ? x[size_t(((b * 3 + hh) * 2 + ww) * 2 + c)] * 0.5 - 1.0 : 0.0;
                    QVERIFY(std::fabs(y[((b * 4 + i) * 5 + j) * 2 + c] - want) < 1e-6);
                }
}

void TestOps::batchNormTrainingAndMovingStatistics() {
    // A training step: batch statistics normalize, the moving ones move towards them.
    const std::string ir =
        "graph t {\n %0 = input() : f32[4,3,2,5]\n %1 = param() {name=gamma} : f32[5]\n"
        " %2 = param() {name=beta} : f32[5]\n"
        " %3 = param() {name=moving_mean, trainable=0} : f32[5]\n"
        " %4 = param() {name=moving_variance, trainable=0} : f32[5]\n"
        " %5 = channel_mean(%0) : f32[5]\n %6 = channel_var(%0, %5) : f32[5]\n"
        " %7 = moving_avg(%3, %5) {momentum=0.99} : f32[5]\n"
        " %8 = moving_avg(%4, %6) {momentum=0.99} : f32[5]\n"
        " %9 = batch_norm(%0, %5, %6, %1, %2) {epsilon=0.001, has_beta=1, has_gamma=1} : "
        "f32[4,3,2,5]\n output y = %9\n output m = %7\n output v = %8\n}\n";
    Harness h;
    std::string e;
    QVERIFY2(h.compile(tdtest::parseOrDie(ir), {}, &e), e.c_str());
    auto x = randomVec(120, 12, -2, 3), gamma = randomVec(5, 13), beta = randomVec(5, 14);
    std::copy(x.begin(), x.end(), h.in());
    std::copy(gamma.begin(), gamma.end(), h.param(0));
    std::copy(beta.begin(), beta.end(), h.param(1));
    std::vector<double> mm(5, 0.0), mv(5, 1.0);
    std::fill(h.param(2), h.param(2) + 5, 0.f);
    std::fill(h.param(3), h.param(3) + 5, 1.f);
    for (int step = 0; step < 3; ++step) {
        h.run();
        const float* y = h.output("y");
        for (int c = 0; c < 5; ++c) {
            double m = 0, v = 0;
            for (int r = 0; r < 24; ++r) m += x[size_t(r * 5 + c)];
            m /= 24;
            for (int r = 0; r < 24; ++r)
                v += (x[size_t(r * 5 + c)] - m) * (x[size_t(r * 5 + c)] - m);
            v /= 24;  // biased, as Keras
            for (int r = 0; r < 24; ++r) {
                const double want =
                    (x[size_t(r * 5 + c)] - m) / std::sqrt(v + 1e-3) * gamma[size_t(c)] +
                    beta[size_t(c)];
                QVERIFY(std::fabs(y[r * 5 + c] - want) < 1e-5);
            }
            mm[size_t(c)] = mm[size_t(c)] * 0.99 + m * 0.01;
            mv[size_t(c)] = mv[size_t(c)] * 0.99 + v * 0.01;
            QVERIFY2(std::fabs(h.param(2)[c] - mm[size_t(c)]) < 1e-6,
                     qPrintable(QString("step %1 moving mean %2").arg(step).arg(c)));
            QVERIFY(std::fabs(h.param(3)[c] - mv[size_t(c)]) < 1e-6);
        }
        // moving_avg writes the parameter itself.
        QCOMPARE(h.output("m"), static_cast<const float*>(h.param(2)));
    }
}

void TestOps::batchNormInference() {
    // Inference: the moving statistics normalize; nothing moves.
    const std::string ir =
        "graph t {\n %0 = input() : f32[6,4]\n"
        " %1 = param() {name=moving_mean, trainable=0} : f32[4]\n"
        " %2 = param() {name=moving_variance, trainable=0} : f32[4]\n"
        " %3 = param() {name=beta} : f32[4]\n"
        " %4 = batch_norm(%0, %1, %2, %3) {epsilon=0.01, has_beta=1} : f32[6,4]\n"
        " output y = %4\n}\n";
    Harness h;
    QVERIFY(h.compile(tdtest::parseOrDie(ir)));
    auto x = randomVec(24, 15), m = randomVec(4, 16), v = randomVec(4, 17, 0.5, 2),
         b = randomVec(4, 18);
    std::copy(x.begin(), x.end(), h.in());
    std::copy(m.begin(), m.end(), h.param(0));
    std::copy(v.begin(), v.end(), h.param(1));
    std::copy(b.begin(), b.end(), h.param(2));
    h.run();
    for (int r = 0; r < 6; ++r)
        for (int c = 0; c < 4; ++c) {
            const double want =
                (x[size_t(r * 4 + c)] - m[size_t(c)]) / std::sqrt(v[size_t(c)] + 0.01) +
                b[size_t(c)];
            QVERIFY(std::fabs(h.output("y")[r * 4 + c] - want) < 1e-5);
        }
    QCOMPARE(h.param(0)[0], m[0]);
}

void TestOps::layerNormForward() {
    Harness h;
    QVERIFY(h.compile(tdtest::parseOrDie(
        "graph t {\n %0 = input() : f32[2,3,6]\n %1 = param() {name=gamma} : f32[6]\n"
        " %2 = layer_norm(%0, %1) {epsilon=0.001, has_gamma=1} : f32[2,3,6]\n output y = "
        "%2\n}\n")));
    auto x = randomVec(36, 19, -4, 4), g = randomVec(6, 20);
    std::copy(x.begin(), x.end(), h.in());
    std::copy(g.begin(), g.end(), h.param(0));
    h.run();
    for (int r = 0; r < 6; ++r) {
        double m = 0, v = 0;
        for (int c = 0; c < 6; ++c) m += x[size_t(r * 6 + c)];
        m /= 6;
        for (int c = 0; c < 6; ++c) v += (x[size_t(r * 6 + c)] - m) * (x[size_t(r * 6 + c)] - m);
        v /= 6;
        for (int c = 0; c < 6; ++c)
            QVERIFY(std::fabs(h.output("y")[r * 6 + c] -
                              (x[size_t(r * 6 + c)] - m) / std::sqrt(v + 1e-3) * g[size_t(c)]) <
                    1e-5);
    }
}

void TestOps::imageGradientCheck_data() {
    QTest::addColumn<QString>("ir");
    // x is a param [2,5,4,3] so its gradient is checked too; the loss is mse against a label.
    const std::string head = "graph t {\n %0 = param() {name=x} : f32[2,5,4,3]\n";
    // reshape the last value %id to [2, elems/2], mse against a label; `extra`: more outputs.
    auto tail = [](int id, const std::string& extra, int elems) {
        const int rows = 2;
        return " %" + std::to_string(id + 1) + " = reshape(%" + std::to_string(id) + ") : f32[" +
               std::to_string(rows) + "," + std::to_string(elems / rows) + "]\n %" +
               std::to_string(id + 2) + " = label() : f32[" + std::to_string(rows) + "," +
               std::to_string(elems / rows) + "]\n %" + std::to_string(id + 3) + " = loss(%" +
               std::to_string(id + 1) + ", %" + std::to_string(id + 2) +
               ") {loss=mse, scale=0.5} : f32[1]\n" + extra + " output loss = %" +
               std::to_string(id + 3) + "\n}\n";
    };
    QTest::newRow("conv2d same") << QString::fromStdString(
        head +
        " %1 = param() {name=w} : f32[3,3,3,2]\n"
        " %2 = conv2d(%0, %1) {pads=1x1x1x1} : f32[2,5,4,2]\n" +
        tail(2, "", 80));
    QTest::newRow("conv2d stride 2 + bias + relu (fused)") << QString::fromStdString(
        head +
        " %1 = param() {name=w} : f32[2,3,3,4]\n %2 = param() {name=b} : f32[4]\n"
        " %3 = conv2d(%0, %1) {pads=0x1x1x1, strides=2x2} : f32[2,3,2,4]\n"
        " %4 = bias_add(%3, %2) : f32[2,3,2,4]\n %5 = act(%4) {act=relu} : f32[2,3,2,4]\n" +
        tail(5, "", 48));
    QTest::newRow("conv2d dilation 2")
        << QString::fromStdString(head +
                                  " %1 = param() {name=w} : f32[2,2,3,2]\n"
                                  " %2 = conv2d(%0, %1) {dilation=2x2} : f32[2,3,2,2]\n" +
                                  tail(2, "", 24));
    QTest::newRow("conv2d groups 3")
        << QString::fromStdString(head +
                                  " %1 = param() {name=w} : f32[3,2,1,6]\n"
                                  " %2 = conv2d(%0, %1) {groups=3} : f32[2,3,3,6]\n" +
                                  tail(2, "", 108));
    QTest::newRow("max_pool") << QString::fromStdString(
        head + " %1 = max_pool(%0) {pads=0x1x0x0, strides=2x2, window=2x2} : f32[2,3,2,3]\n" +
        tail(1, "", 36));
    QTest::newRow("avg_pool same") << QString::fromStdString(
        head + " %1 = avg_pool(%0) {pads=1x1x1x1, window=3x3} : f32[2,5,4,3]\n" + tail(1, "", 120));
    QTest::newRow("global avg_pool") << QString::fromStdString(
        head + " %1 = avg_pool(%0) {window=5x4} : f32[2,1,1,3]\n" + tail(1, "", 6));
    QTest::newRow("pad2d") << QString::fromStdString(
        head +
        " %1 = pad2d(%0) {pads=1x2x0x1} : f32[2,8,5,3]\n %2 = act(%1) {act=tanh} : f32[2,8,5,3]\n" +
        tail(2, "", 240));
    QTest::newRow("scale") << QString::fromStdString(
        head +
        " %1 = scale(%0) {offset=0.5, scale=-2} : f32[2,5,4,3]\n %2 = act(%1) {act=tanh} : "
        "f32[2,5,4,3]\n" +
        tail(2, "", 120));
    QTest::newRow("batch_norm training") << QString::fromStdString(
        head +
        " %1 = param() {name=gamma} : f32[3]\n %2 = param() {name=beta} : f32[3]\n"
        " %3 = param() {name=mm, trainable=0} : f32[3]\n"
        " %4 = param() {name=mv, trainable=0} : f32[3]\n"
        " %5 = channel_mean(%0) : f32[3]\n %6 = channel_var(%0, %5) : f32[3]\n"
        " %7 = moving_avg(%3, %5) {momentum=0.9} : f32[3]\n"
        " %8 = batch_norm(%0, %5, %6, %1, %2) {epsilon=0.001, has_beta=1, has_gamma=1} : "
        "f32[2,5,4,3]\n %9 = act(%8) {act=tanh} : f32[2,5,4,3]\n" +
        tail(9, " output mm = %7\n", 120));
    QTest::newRow("batch_norm inference") << QString::fromStdString(
        head +
        " %1 = param() {name=gamma} : f32[3]\n"
        " %2 = param() {name=mm, trainable=0} : f32[3]\n"
        " %3 = param() {name=mv, trainable=0} : f32[3]\n"
        " %4 = batch_norm(%0, %2, %3, %1) {epsilon=0.5, has_gamma=1} : f32[2,5,4,3]\n" +
        tail(4, "", 120));
    QTest::newRow("layer_norm") << QString::fromStdString(
        head +
        " %1 = param() {name=gamma} : f32[3]\n %2 = param() {name=beta} : f32[3]\n"
        " %3 = layer_norm(%0, %1, %2) {epsilon=0.001, has_beta=1, has_gamma=1} : f32[2,5,4,3]\n"
        " %4 = act(%3) {act=tanh} : f32[2,5,4,3]\n" +
        tail(4, "", 120));
}

void TestOps::imageGradientCheck() {
    QFETCH(QString, ir);
    Graph g = tdtest::parseOrDie(ir.toStdString());
    QVERIFY(autodiff(g).ok());
    Harness h;
    std::string e;
    QVERIFY2(h.compile(g, {"fusion", "dce"}, &e), e.c_str());
    std::vector<int> pids = h.g.params();
    for (size_t i = 0; i < pids.size(); ++i) {
        const Node& p = h.g.node(pids[i]);
        auto v =
            randomVec(static_cast<size_t>(numElements(p.shape)), 40 + uint32_t(i), -1.5f, 1.5f);
        if (!p.attrs.trainableOr())  // moving statistics: a variance must be positive
            for (float& x : v) x = std::fabs(x);
        if (i == 0) {
            // x: distinct values at least 0.025 apart (more than the two steps of 0.01), so a
            // finite difference never changes which element of a window is the maximum.
            const size_t n = v.size();
            for (size_t k = 0; k < n; ++k) v[k] = -1.5f + 3.0f * float(k) / float(n);
            std::shuffle(v.begin(), v.end(), std::mt19937(7));
        }
        std::copy(v.begin(), v.end(), h.param(i));
    }
    for (const auto& n : h.g.nodes)
        if (n.op == Op::Label) {
            auto v = randomVec(static_cast<size_t>(numElements(n.shape)), 50, -0.9f, 0.9f);
            std::copy(v.begin(), v.end(), static_cast<float*>(h.lab()));
        }
    h.run();
    const int lossId = h.g.output("loss");
    int checked = 0;
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
            const double tol = 3e-3 + 3e-2 * std::fabs(numeric);
            QVERIFY2(std::fabs(numeric - analytic[size_t(j)]) < tol,
                     qPrintable(QString("param %1[%2]: analytic %3 numeric %4")
                                    .arg(i)
                                    .arg(j)
                                    .arg(analytic[size_t(j)])
                                    .arg(numeric)));
            ++checked;
        }
    }
    QVERIFY(checked >= 120);  // at least every element of x
}

QTEST_GUILESS_MAIN(TestOps)
#include "test_ops.moc"

// The kernels of every instruction-set level this CPU runs (optimizer updates, CPU dropout) give
// the same results as the generic level, bit for bit, and TRAINDECK_ISA chooses the level
// (engine/core/cpu_isa.h). The AVX-512 zero-skipping products equal a reference product.
#include <QtTest/QtTest>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "engine/backend/cpu/image_kernels.h"
#include "engine/backend/cpu/optim_kernels.h"
#include "engine/backend/cpu/simd_kernels.h"
#include "engine/backend/cpu/sparse_kernels.h"
#include "engine/core/cpu_isa.h"
#include "engine/core/half.h"

using namespace td;
using namespace td::optim_kernels;

Q_DECLARE_METATYPE(td::CpuIsa)

namespace {

// Not a multiple of any register width, so every level also runs its scalar tail.
constexpr int64_t kElements = 1000 + 13;
constexpr int kSteps = 4;

std::vector<float> randomValues(uint32_t seed, float scale) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> dist(0.0f, scale);
    std::vector<float> v(kElements);
    for (float& x : v) x = dist(rng);
    return v;
}

// Gradients with the values clipping and the square roots treat specially.
std::vector<float> gradients(uint32_t seed) {
    std::vector<float> g = randomValues(seed, 1.0f);
    g[3] = 0.0f;
    g[17] = -0.0f;
    g[40] = 1e-30f;
    g[41] = 1e30f;
    g[42] = -1e30f;
    g[kElements - 2] = std::numeric_limits<float>::quiet_NaN();
    g[kElements - 5] = std::numeric_limits<float>::infinity();
    return g;
}

// Same bits, or both NaN (the payload of a NaN is not part of the contract).
void requireSame(const std::vector<float>& got, const std::vector<float>& want, const char* what) {
    QCOMPARE(got.size(), want.size());
    for (size_t i = 0; i < got.size(); ++i) {
        if (std::isnan(got[i]) && std::isnan(want[i])) continue;
        if (std::memcmp(&got[i], &want[i], sizeof(float)) != 0)
            QFAIL(qPrintable(QString("%1[%2]: %3 vs generic %4")
                                 .arg(what)
                                 .arg(i)
                                 .arg(static_cast<double>(got[i]), 0, 'g', 9)
                                 .arg(static_cast<double>(want[i]), 0, 'g', 9)));
    }
}

// Parameter and slot arrays of one optimizer, updated by one level's kernel.
struct State {
    std::vector<float> w = randomValues(1, 0.5f);
    std::vector<float> s0 = randomValues(2, 0.1f);
    std::vector<float> s1 = randomValues(3, 0.1f);
    std::vector<float> s2 = randomValues(4, 0.1f);
    State() {
        // Second moments are non-negative in a real run; keep the square roots real.
        for (float& x : s1) x = x * x;
        for (float& x : s2) x = x * x;
    }
};

Operands operandsFor(State& st, const std::vector<float>& g, bool clip, bool decay) {
    Operands o;
    o.w = st.w.data();
    o.grad = g.data();
    o.gradScale = clip ? 0.75f : 1.0f;
    o.clip = clip ? 0.5f : std::numeric_limits<float>::infinity();
    o.decay = decay;
    o.wdLr = decay ? 4e-4f : 0.0f;
    return o;
}

// Runs `steps` updates with `kernels` and returns the final state. variant selects the options.
State runSgd(const Table& k, SgdMode mode, bool clip, bool decay) {
    State st;
    for (int s = 0; s < kSteps; ++s) {
        const std::vector<float> g = gradients(100 + static_cast<uint32_t>(s));
        SgdArgs a;
        a.p = operandsFor(st, g, clip, decay);
        a.mode = mode;
        a.m = st.s0.data();
        a.lr = 0.01f;
        a.momentum = 0.9f;
        // Two ranges, as two threads would split it, one starting at an odd offset.
        k.sgd(a, 0, 301);
        k.sgd(a, 301, kElements);
    }
    return st;
}

State runAdam(const Table& k, bool amsgrad, bool clip, bool decay) {
    State st;
    for (int s = 0; s < kSteps; ++s) {
        const std::vector<float> g = gradients(200 + static_cast<uint32_t>(s));
        AdamArgs a;
        a.p = operandsFor(st, g, clip, decay);
        a.m = st.s0.data();
        a.v = st.s1.data();
        a.vhat = amsgrad ? st.s2.data() : nullptr;
        a.alpha = 1e-3f * std::sqrt(1.0f - std::pow(0.999f, s + 1.0f)) /
                  (1.0f - std::pow(0.9f, s + 1.0f));
        a.oneMinusB1 = 0.1f;
        a.oneMinusB2 = 0.001f;
        a.eps = 1e-7f;
        k.adam(a, 0, 301);
        k.adam(a, 301, kElements);
    }
    return st;
}

State runRmsProp(const Table& k, bool centered, bool momentum, bool clip, bool decay) {
    State st;
    for (int s = 0; s < kSteps; ++s) {
        const std::vector<float> g = gradients(300 + static_cast<uint32_t>(s));
        RmsPropArgs a;
        a.p = operandsFor(st, g, clip, decay);
        a.velocity = st.s1.data();
        a.momentumSlot = momentum ? st.s0.data() : nullptr;
        // Centered keeps the running mean of g small against v, so v - mg^2 stays positive.
        a.averageGrad = centered ? st.s2.data() : nullptr;
        if (centered)
            for (float& x : st.s2) x = 0.0f;
        a.lr = 1e-3f;
        a.rho = 0.9f;
        a.oneMinusRho = 0.1f;
        a.eps = 1e-7f;
        a.momentum = 0.5f;
        k.rmsprop(a, 0, 301);
        k.rmsprop(a, 301, kElements);
    }
    return st;
}

void requireSameState(const State& got, const State& want) {
    requireSame(got.w, want.w, "w");
    requireSame(got.s0, want.s0, "slot 0");
    requireSame(got.s1, want.s1, "slot 1");
    requireSame(got.s2, want.s2, "slot 2");
}

}  // namespace

// One level's zero-skipping kernels against the reference (sparseProductsMatchReference).
void checkSparseKernels(const cpu::sparse::Kernels& kernels, const char* level) {
    const cpu::sparse::Kernels* k = &kernels;
    std::mt19937 rng(17);
    std::uniform_real_distribution<float> uni(-1.f, 1.f), unit(0.f, 1.f);
    int checked = 0;
    for (int64_t M : {1, 2, 3, 17, 32, 70})
        for (int64_t K : {1, 15, 16, 17, 100, 392})
            // 530: rows 2 KB apart (packed: w's blocks where the Isa packs, dy's in the weight
            // gradient on every level); 128: w's rows 512 bytes apart (blocks read in place,
            // at most 64 rows on AVX2: inPlaceBlockRows; K = 392, a multiple of 7, runs them all).
            for (int64_t N : {1, 10, 16, 128, 130, 300, 530})
                for (double density : {0.0, 0.3, 1.0}) {
                    if ((M * K * N) % 7 != 0 && !(M == 32 && K == 392 && N == 130))
                        continue;  // a spread of the combinations keeps this fast
                    const int64_t ldx = K + 5, ldw = N == 128 ? N : N + 3, ldy = N + 2;
                    std::vector<float> x(static_cast<size_t>(M * ldx));
                    for (float& v : x) v = unit(rng) < density ? uni(rng) : 0.f;
                    std::vector<float> w(static_cast<size_t>(K * ldw));
                    for (float& v : w) v = uni(rng);
                    // y = x . w, and dw = x^T . dy with x read as [M rows, K columns].
                    std::vector<float> y(static_cast<size_t>(M * ldy), 7.f);
                    const int64_t listed =
                        k->rowsTimesDense(x.data(), ldx, M, K, w.data(), ldw, N, y.data(), ldy);
                    std::vector<float> dy(static_cast<size_t>(M * ldy));
                    for (float& v : dy) v = uni(rng);
                    std::vector<float> dw(static_cast<size_t>(K * ldw), 7.f);
                    const int64_t listedT = k->transposedTimesDense(x.data(), ldx, M, K, dy.data(),
                                                                    ldy, N, dw.data(), ldw);
                    auto near = [](double got, double want, double scale) {
                        return std::fabs(got - want) <= 1e-5 * (1.0 + scale);
                    };
                    // got(r, c) against the sum over k of a(r, k) * b(k, c) in double precision,
                    // for r < rows, c < N. The message is built only on a failure (the check
                    // runs for every element, also under the sanitizers).
                    auto check = [&](const char* what, int64_t rows, int64_t inner, auto a, auto b,
                                     auto got) {
                        for (int64_t r = 0; r < rows; ++r)
                            for (int64_t c = 0; c < N; ++c) {
                                double want = 0, scale = 0;
                                for (int64_t e = 0; e < inner; ++e) {
                                    want += double{a(r, e)} * b(e, c);
                                    scale += std::fabs(double{a(r, e)} * b(e, c));
                                }
                                if (!near(got(r, c), want, scale))
                                    QFAIL(qPrintable(QString("%8: %9[%1,%2] of %3x%4x%5: %6 vs %7")
                                                         .arg(r)
                                                         .arg(c)
                                                         .arg(M)
                                                         .arg(K)
                                                         .arg(N)
                                                         .arg(got(r, c))
                                                         .arg(want)
                                                         .arg(level)
                                                         .arg(what)));
                            }
                    };
                    check(
                        "y", M, K, [&](int64_t i, int64_t j) { return x[i * ldx + j]; },
                        [&](int64_t j, int64_t c) { return w[j * ldw + c]; },
                        [&](int64_t i, int64_t c) { return y[i * ldy + c]; });
                    if (QTest::currentTestFailed()) return;
                    check(
                        "dw", K, M, [&](int64_t j, int64_t i) { return x[i * ldx + j]; },
                        [&](int64_t i, int64_t c) { return dy[i * ldy + c]; },
                        [&](int64_t j, int64_t c) { return dw[j * ldw + c]; });
                    if (QTest::currentTestFailed()) return;
                    // Past each row's N columns nothing is written.
                    bool untouched = true;
                    for (int64_t i = 0; i < M; ++i)
                        for (int64_t c = N; c < ldy; ++c)
                            untouched = untouched && y[i * ldy + c] == 7.f;
                    for (int64_t j = 0; j < K; ++j)
                        for (int64_t c = N; c < ldw; ++c)
                            untouched = untouched && dw[j * ldw + c] == 7.f;
                    QVERIFY(untouched);
                    // The positions listed: where any row (column) of a group is nonzero, the
                    // rows grouped in pairRows' order (a permutation).
                    std::vector<int32_t> order(static_cast<size_t>(M), -1);
                    k->pairRows(x.data(), ldx, M, K, order.data());
                    std::vector<int32_t> sorted = order;
                    std::sort(sorted.begin(), sorted.end());
                    for (int64_t i = 0; i < M; ++i) QCOMPARE(sorted[i], static_cast<int32_t>(i));
                    int64_t rowPairs = 0, colPairs = 0;
                    const int64_t gr = k->rowsGroup, gc = k->colsGroup;
                    for (int64_t i = 0; i < M; i += gr)
                        for (int64_t j = 0; j < K; ++j) {
                            bool any = false;
                            for (int64_t e = i; e < std::min(M, i + gr); ++e)
                                any = any || x[order[e] * ldx + j] != 0.f;
                            rowPairs += any;
                        }
                    for (int64_t j = 0; j < K; j += gc)
                        for (int64_t i = 0; i < M; ++i) {
                            bool any = false;
                            for (int64_t e = j; e < std::min(K, j + gc); ++e)
                                any = any || x[i * ldx + e] != 0.f;
                            colPairs += any;
                        }
                    QCOMPARE(listed, rowPairs);
                    QCOMPARE(listedT, colPairs);
                    if (density == 0.0) QCOMPARE(listed, int64_t{0});
                    ++checked;
                }
    QVERIFY2(checked > 40, qPrintable(QString::number(checked)));
}

// Runs check(kernels, isa) for each level of zero-skipping kernels this CPU has (AVX2 with FMA,
// AVX-512), stopping at a failure; false when it has none.
template <class F>
bool forEachSparseLevel(F&& check) {
    int levels = 0;
    for (CpuIsa isa : {CpuIsa::Avx2, CpuIsa::Avx512}) {
        const cpu::sparse::Kernels* k = cpu::sparse::forIsa(isa);
        if (!k) continue;
        ++levels;
        check(*k, isa);
        if (QTest::currentTestFailed()) break;
    }
    return levels > 0;
}

class TestIsa : public QObject {
    Q_OBJECT

  private slots:
    void chooseLevel_data() {
        QTest::addColumn<QString>("requested");
        QTest::addColumn<td::CpuIsa>("detected");
        QTest::addColumn<td::CpuIsa>("chosen");
        QTest::addColumn<QString>("error");
        QTest::newRow("unset") << QString() << CpuIsa::Avx512 << CpuIsa::Avx512 << QString();
        QTest::newRow("generic") << "generic" << CpuIsa::Avx512 << CpuIsa::Generic << QString();
        QTest::newRow("avx2 below avx512") << "avx2" << CpuIsa::Avx512 << CpuIsa::Avx2 << QString();
        QTest::newRow("same level") << "avx2" << CpuIsa::Avx2 << CpuIsa::Avx2 << QString();
        QTest::newRow("above the CPU")
            << "avx512" << CpuIsa::Avx2 << CpuIsa::Avx2
            << "TRAINDECK_ISA: avx512 is not available on this CPU (the highest level here is "
               "avx2)";
        QTest::newRow("not a level")
            << "sse9" << CpuIsa::Generic << CpuIsa::Generic
            << "TRAINDECK_ISA: expected generic, avx2 or avx512, got 'sse9'";
        QTest::newRow("case matters")
            << "AVX2" << CpuIsa::Avx2 << CpuIsa::Avx2
            << "TRAINDECK_ISA: expected generic, avx2 or avx512, got 'AVX2'";
    }
    void chooseLevel() {
        QFETCH(QString, requested);
        QFETCH(td::CpuIsa, detected);
        QFETCH(td::CpuIsa, chosen);
        QFETCH(QString, error);
        const std::string req = requested.toStdString();
        const CpuIsaChoice c = chooseCpuIsa(requested.isNull() ? nullptr : req.c_str(), detected);
        QCOMPARE(cpuIsaName(c.isa), cpuIsaName(chosen));
        QCOMPARE(QString::fromStdString(c.error), error);
    }

    // ctest runs this suite a second time with TRAINDECK_ISA=generic.
    void activeLevelFollowsEnvironment() {
        const char* env = std::getenv("TRAINDECK_ISA");
        const CpuIsaChoice want = chooseCpuIsa(env, detectedCpuIsa());
        QCOMPARE(cpuIsaName(activeCpuIsa().isa), cpuIsaName(want.isa));
        QCOMPARE(cpuIsaName(activeKernels().isa), cpuIsaName(want.isa));
        QCOMPARE(cpuIsaName(cpu::simd::activeKernels().isa), cpuIsaName(want.isa));
        if (env && std::string(env) == "generic") QCOMPARE(activeKernels().isa, CpuIsa::Generic);
    }

    void tablesAreTheirLevel() {
        for (CpuIsa isa : {CpuIsa::Generic, CpuIsa::Avx2, CpuIsa::Avx512}) {
            if (static_cast<int>(isa) > static_cast<int>(detectedCpuIsa())) continue;
            QCOMPARE(cpuIsaName(kernelsFor(isa).isa), cpuIsaName(isa));
            QCOMPARE(cpuIsaName(cpu::simd::kernelsFor(isa).isa), cpuIsaName(isa));
        }
    }

    void levelsMatchGeneric_data() {
        QTest::addColumn<td::CpuIsa>("isa");
        int rows = 0;
        for (CpuIsa isa : {CpuIsa::Avx2, CpuIsa::Avx512}) {
            if (static_cast<int>(isa) > static_cast<int>(detectedCpuIsa())) continue;
            QTest::newRow(cpuIsaName(isa)) << isa;
            ++rows;
        }
        if (rows == 0) QTest::newRow("generic only") << CpuIsa::Generic;
    }
    void levelsMatchGeneric() {
        QFETCH(td::CpuIsa, isa);
        if (isa == CpuIsa::Generic) QSKIP("this CPU has no AVX2: only the generic level runs here");
        const Table& k = kernelsFor(isa);
        const Table& g = kernelsFor(CpuIsa::Generic);
        QCOMPARE(k.isa, isa);
        for (bool clip : {false, true})
            for (bool decay : {false, true}) {
                for (SgdMode mode : {SgdMode::Plain, SgdMode::Momentum, SgdMode::Nesterov})
                    requireSameState(runSgd(k, mode, clip, decay), runSgd(g, mode, clip, decay));
                for (bool amsgrad : {false, true})
                    requireSameState(runAdam(k, amsgrad, clip, decay),
                                     runAdam(g, amsgrad, clip, decay));
                for (bool centered : {false, true})
                    for (bool momentum : {false, true})
                        requireSameState(runRmsProp(k, centered, momentum, clip, decay),
                                         runRmsProp(g, centered, momentum, clip, decay));
            }
    }

    // Dropout masks must not depend on the CPU: a run resumed elsewhere draws the same masks.
    void dropoutMatchesGeneric_data() { levelsMatchGeneric_data(); }
    void dropoutMatchesGeneric() {
        QFETCH(td::CpuIsa, isa);
        if (isa == CpuIsa::Generic) QSKIP("this CPU has no AVX2: only the generic level runs here");
        const auto& k = cpu::simd::kernelsFor(isa);
        const auto& g = cpu::simd::kernelsFor(CpuIsa::Generic);
        QCOMPARE(k.isa, isa);
        const std::vector<float> x = gradients(7);
        for (double rate : {0.0, 0.2, 0.5, 0.999}) {
            const auto threshold = static_cast<uint32_t>(rate * 16777216.0);
            const float keep = static_cast<float>(1.0 / (1.0 - rate));
            for (uint32_t base : {0u, 1u, 0x9e3779b9u, 0xffffffffu}) {
                for (int64_t cols : {int64_t{1}, int64_t{15}, int64_t{17}, kElements}) {
                    std::vector<float> got(cols, -1.0f), want(cols, -2.0f);
                    k.dropoutRow(x.data(), got.data(), cols, base, threshold, keep);
                    g.dropoutRow(x.data(), want.data(), cols, base, threshold, keep);
                    requireSame(got, want, "dropout");
                }
            }
        }
    }

    // ReLU's gradient: the same selection on every level, negative zero and NaN inputs included.
    void reluGradMatchesGeneric_data() { levelsMatchGeneric_data(); }
    void reluGradMatchesGeneric() {
        QFETCH(td::CpuIsa, isa);
        if (isa == CpuIsa::Generic) QSKIP("this CPU has no AVX2: only the generic level runs here");
        const auto& k = cpu::simd::kernelsFor(isa);
        const auto& g = cpu::simd::kernelsFor(CpuIsa::Generic);
        std::vector<float> dy = gradients(3), s = gradients(5);
        s[0] = -0.0f;
        s[1] = 0.0f;
        s[2] = std::numeric_limits<float>::quiet_NaN();
        dy[3] = -0.0f;
        for (int64_t n : {int64_t{1}, int64_t{15}, int64_t{17}, kElements}) {
            std::vector<float> got(n, -1.0f), want(n, -2.0f);
            k.reluGrad(dy.data(), s.data(), got.data(), n);
            g.reluGrad(dy.data(), s.data(), want.data(), n);
            requireSame(got, want, "relu gradient");
            for (int64_t i = 0; i < n; ++i) QCOMPARE(want[i], s[i] > 0.f ? dy[i] : 0.f);
        }
    }

    // The last pass of a product split along K, every case (bias or not, ReLU or not): the bits
    // of the scalar operations written out here, NaN and negative zero included (ReLU gives +0
    // for both), on every level, vector loop and tail.
    void lastPartialRowMatchesScalar_data() { levelsMatchGeneric_data(); }
    void lastPartialRowMatchesScalar() {
        QFETCH(td::CpuIsa, isa);
        const auto& k = cpu::simd::kernelsFor(isa);
        const std::vector<float> o0 = gradients(11), p = gradients(13), bias = gradients(17);
        for (int64_t cols : {int64_t{1}, int64_t{15}, int64_t{17}, kElements}) {
            for (int which = 0; which < 4; ++which) {
                const bool withBias = which & 2, relu = which & 1;
                std::vector<float> o(o0.begin(), o0.begin() + cols), wantO(cols);
                for (int64_t c = 0; c < cols; ++c) {
                    float v = o[c] + p[c];
                    if (withBias) v = v + bias[c];
                    if (relu) v = v > 0.f ? v : 0.f;
                    wantO[c] = v;
                }
                k.lastPartialRow(o.data(), p.data(), withBias ? bias.data() : nullptr, relu, cols);
                requireSame(o, wantO, "last partial row");
                if (QTest::currentTestFailed()) return;
            }
        }
    }

    // Softmax's exponentials: the same bits on every level, within 2 units in the last place of
    // std::exp over softmax's range (shifted values at or below 0, down to where std::exp goes
    // subnormal), 0 below it, NaN for NaN. A level's vector loop and tail both checked.
    void expShiftedMatchesGeneric_data() { levelsMatchGeneric_data(); }
    void expShiftedMatchesGeneric() {
        QFETCH(td::CpuIsa, isa);
        const auto& k = cpu::simd::kernelsFor(isa);
        const auto& g = cpu::simd::kernelsFor(CpuIsa::Generic);
        std::vector<float> x;
        for (float t = -90.0f; t <= 0.0f; t += 0.0137f) x.push_back(t);
        for (float t : {0.0f, -0.0f, -1e-30f, -87.33f, -87.34f, -88.0f, -1e30f, 5.0f, 88.0f})
            x.push_back(t);
        x.push_back(-std::numeric_limits<float>::infinity());
        x.push_back(std::numeric_limits<float>::quiet_NaN());
        const int64_t n = static_cast<int64_t>(x.size());
        for (float shift : {0.0f, 3.5f, -2.25f}) {
            std::vector<float> xs(x);
            for (float& v : xs) v += shift;  // so that v - shift is (close to) the value above
            std::vector<float> got(n, -1.0f), want(n, -2.0f);
            k.expShifted(xs.data(), shift, got.data(), n);
            g.expShifted(xs.data(), shift, want.data(), n);
            requireSame(got, want, "exp");
            for (int64_t len : {int64_t{1}, int64_t{7}, int64_t{17}}) {  // short rows: tails only
                std::vector<float> part(len, -3.0f);
                k.expShifted(xs.data() + 5, shift, part.data(), len);
                for (int64_t i = 0; i < len; ++i) QCOMPARE(part[i], got[5 + i]);
            }
            for (int64_t i = 0; i < n; ++i) {
                const float t = xs[i] - shift;
                const float ref = std::exp(t);
                if (std::isnan(t)) {
                    QVERIFY(std::isnan(got[i]));
                } else if (t < -87.3365479f) {
                    QCOMPARE(got[i], 0.0f);
                } else {
                    const float ulp =
                        std::nextafter(ref, std::numeric_limits<float>::infinity()) - ref;
                    if (std::fabs(got[i] - ref) > 2 * ulp)
                        QFAIL(qPrintable(QStringLiteral("exp(%1): %2, std::exp %3")
                                             .arg(double(t), 0, 'g', 9)
                                             .arg(double(got[i]), 0, 'g', 9)
                                             .arg(double(ref), 0, 'g', 9)));
                }
            }
        }
    }

    // Max pooling's argmax step: the same positions on every level, ties (the first wins) and
    // negative zero included.
    void maxArgStepMatchesGeneric_data() { levelsMatchGeneric_data(); }
    void maxArgStepMatchesGeneric() {
        QFETCH(td::CpuIsa, isa);
        if (isa == CpuIsa::Generic) QSKIP("this CPU has no AVX2: only the generic level runs here");
        const auto& k = cpu::simd::kernelsFor(isa);
        const auto& g = cpu::simd::kernelsFor(CpuIsa::Generic);
        for (int64_t n : {int64_t{1}, int64_t{15}, int64_t{17}, kElements}) {
            std::vector<float> bestK(n, 0.5f), bestG(n, 0.5f);
            std::vector<int32_t> atK(n, -1), atG(n, -1);
            for (int pos = 0; pos < 4; ++pos) {
                std::vector<float> x = gradients(11 + pos);
                x[0] = 0.5f;  // a tie: the earlier position stays
                if (n > 1) x[1] = -0.0f;
                k.maxArgStep(x.data(), bestK.data(), atK.data(), n, pos * 1000);
                g.maxArgStep(x.data(), bestG.data(), atG.data(), n, pos * 1000);
            }
            requireSame(bestK, bestG, "max pooling maximum");
            QCOMPARE(atK, atG);
            QCOMPARE(atG[0], -1);
        }
    }

    // ReLU's gradient with column sums, f32 and bf16 results: every level equals the generic one,
    // the values equal reluGrad's, the bf16 ones floatToBf16 of them, the sums the rows added in
    // order (of the values before rounding). Rows of 37 channels (a scalar tail on every level).
    void reluGradSumsMatchesGeneric_data() { levelsMatchGeneric_data(); }
    void reluGradSumsMatchesGeneric() {
        QFETCH(td::CpuIsa, isa);
        const auto& g = cpu::simd::kernelsFor(CpuIsa::Generic);
        const auto& k = isa == CpuIsa::Generic ? g : cpu::simd::kernelsFor(isa);
        const int64_t cols = 37, rows = kElements / cols, n = rows * cols;
        const std::vector<float> dy = gradients(41), s = gradients(42);
        for (bool bf16 : {false, true}) {
            std::vector<float> dxK(n, 7.f), dxG(n, 7.f), sumsK(cols, 0.5f), sumsG(cols, 0.5f);
            std::vector<uint16_t> hK(n, 7), hG(n, 7);
            k.reluGradSums(dy.data(), s.data(), bf16 ? nullptr : dxK.data(),
                           bf16 ? hK.data() : nullptr, sumsK.data(), rows, cols);
            g.reluGradSums(dy.data(), s.data(), bf16 ? nullptr : dxG.data(),
                           bf16 ? hG.data() : nullptr, sumsG.data(), rows, cols);
            requireSame(sumsK, sumsG, "ReLU gradient column sums");
            std::vector<float> ref(n);
            g.reluGrad(dy.data(), s.data(), ref.data(), n);
            std::vector<float> want(cols, 0.5f);
            for (int64_t r = 0; r < rows; ++r)
                for (int64_t c = 0; c < cols; ++c) want[size_t(c)] += ref[size_t(r * cols + c)];
            requireSame(sumsG, want, "ReLU gradient column sums, rows in order");
            if (!bf16) {
                requireSame(dxK, dxG, "ReLU gradient");
                requireSame(dxG, ref, "ReLU gradient against reluGrad");
                continue;
            }
            QCOMPARE(hK, hG);
            for (int64_t i = 0; i < n; ++i)
                if (hG[size_t(i)] != floatToBf16(ref[size_t(i)]))
                    QFAIL(qPrintable(QString("bf16 gradient %1: %2, floatToBf16 gives %3")
                                         .arg(i)
                                         .arg(hG[size_t(i)])
                                         .arg(floatToBf16(ref[size_t(i)]))));
        }
    }

    // A window of 2 x 3 positions over kElements channels (more than one chunk), with ties, -0,
    // NaN and infinities among the values; a row stride wider than the window's row.
    void maxWindowMatchesGeneric_data() { levelsMatchGeneric_data(); }
    void maxWindowMatchesGeneric() {
        QFETCH(td::CpuIsa, isa);
        if (isa == CpuIsa::Generic) QSKIP("this CPU has no AVX2: only the generic level runs here");
        const auto& k = cpu::simd::kernelsFor(isa);
        const auto& g = cpu::simd::kernelsFor(CpuIsa::Generic);
        const int64_t rows = 2, cols = 3, n = kElements, stride = 4 * n;
        std::vector<float> x(static_cast<size_t>(rows * stride));
        for (int64_t i = 0; i < rows; ++i)
            for (int64_t j = 0; j < cols; ++j) {
                const std::vector<float> v = gradients(static_cast<uint32_t>(20 + i * cols + j));
                std::copy(v.begin(), v.end(), x.begin() + i * stride + j * n);
            }
        x[size_t(stride + 5)] = x[5];  // a tie between the first and a later position
        const std::vector<float> dy = gradients(31);
        std::vector<float> yK(n), yG(n), dxK(x.size(), 7.f), dxG(x.size(), 7.f);
        k.maxWindow(x.data(), yK.data(), rows, cols, stride, n);
        g.maxWindow(x.data(), yG.data(), rows, cols, stride, n);
        requireSame(yK, yG, "max pooling window");
        k.maxWindowGrad(x.data(), dy.data(), dxK.data(), rows, cols, stride, n);
        g.maxWindowGrad(x.data(), dy.data(), dxG.data(), rows, cols, stride, n);
        requireSame(dxK, dxG, "max pooling window gradient");
        QCOMPARE(dxG[size_t(cols * n)], 7.f);  // beyond the window's row: untouched
    }

    // Max pooling and its gradient (the active level) against a scalar reference: overlapping
    // windows, windows as wide as their stride, strides wider than the window, padding on every
    // side, sizes that leave rows and columns in no window, and ties (the first maximum in
    // row-major order takes the gradient). dx is filled with garbage first: every position must
    // be written.
    void maxPoolingMatchesReference_data() {
        QTest::addColumn<QVector<int>>("p");  // H, W, C, kh, kw, sh, sw, top, bottom, left, right
        QTest::newRow("2x2 stride 2") << QVector<int>{26, 26, 32, 2, 2, 2, 2, 0, 0, 0, 0};
        QTest::newRow("2x2 stride 2, odd size") << QVector<int>{11, 9, 70, 2, 2, 2, 2, 0, 0, 0, 0};
        QTest::newRow("3x3 stride 2, overlapping")
            << QVector<int>{11, 10, 8, 3, 3, 2, 2, 0, 0, 0, 0};
        QTest::newRow("2x3 stride 3x4, gaps") << QVector<int>{10, 13, 5, 2, 3, 3, 4, 0, 0, 0, 0};
        QTest::newRow("2x2 stride 2, padded") << QVector<int>{5, 7, 3, 2, 2, 2, 2, 1, 0, 1, 0};
        QTest::newRow("3x2 stride 3x2, padded") << QVector<int>{8, 6, 17, 3, 2, 3, 2, 1, 0, 0, 1};
        QTest::newRow("global") << QVector<int>{5, 4, 3, 5, 4, 1, 1, 0, 0, 0, 0};
    }
    void maxPoolingMatchesReference() {
        QFETCH(QVector<int>, p);
        ConvGeometry g;
        g.B = 3;
        g.H = p[0], g.W = p[1], g.C = p[2], g.kh = p[3], g.kw = p[4], g.sh = p[5], g.sw = p[6];
        g.padTop = p[7], g.padBottom = p[8], g.padLeft = p[9], g.padRight = p[10];
        g.OH = (g.H + g.padTop + g.padBottom - g.kh) / g.sh + 1;
        g.OW = (g.W + g.padLeft + g.padRight - g.kw) / g.sw + 1;
        g.F = g.C;
        std::mt19937 rng(5);
        std::uniform_int_distribution<int> level(-6, 3);  // few levels: many ties
        std::vector<float> x(size_t(g.B * g.H * g.W * g.C));
        for (float& v : x) v = static_cast<float>(level(rng)) * 0.5f;
        std::vector<float> dy(size_t(g.B * g.OH * g.OW * g.C));
        for (size_t i = 0; i < dy.size(); ++i) dy[i] = static_cast<float>(i % 13) - 6.0f;
        std::vector<float> y(dy.size()), dx(x.size(), std::numeric_limits<float>::quiet_NaN());
        cpu::maxPool(g, x.data(), y.data());
        cpu::maxPoolGrad(g, dy.data(), x.data(), dx.data());
        std::vector<double> wantDx(x.size(), 0.0);
        auto at = [&](int64_t b, int64_t h, int64_t w, int64_t c) {
            return size_t(((b * g.H + h) * g.W + w) * g.C + c);
        };
        for (int64_t b = 0; b < g.B; ++b)
            for (int64_t oh = 0; oh < g.OH; ++oh)
                for (int64_t ow = 0; ow < g.OW; ++ow)
                    for (int64_t c = 0; c < g.C; ++c) {
                        size_t best = SIZE_MAX;
                        for (int64_t i = 0; i < g.kh; ++i)
                            for (int64_t j = 0; j < g.kw; ++j) {
                                const int64_t h = oh * g.sh - g.padTop + i;
                                const int64_t w = ow * g.sw - g.padLeft + j;
                                if (h < 0 || h >= g.H || w < 0 || w >= g.W) continue;
                                if (best == SIZE_MAX || x[at(b, h, w, c)] > x[best])
                                    best = at(b, h, w, c);
                            }
                        QVERIFY(best != SIZE_MAX);
                        const size_t o = size_t(((b * g.OH + oh) * g.OW + ow) * g.C + c);
                        QCOMPARE(y[o], x[best]);
                        wantDx[best] += dy[o];
                    }
        for (size_t i = 0; i < dx.size(); ++i)
            if (dx[i] != static_cast<float>(wantDx[i]))
                QFAIL(qPrintable(QString("dx[%1] = %2, want %3").arg(i).arg(dx[i]).arg(wantDx[i])));
    }

    // The generic dropout row is the keyed hash of the forward pass: about `rate` of the values
    // are zeroed and the others scaled by 1 / (1 - rate).
    void dropoutRowKeepsAboutOneMinusRate() {
        const std::vector<float> x(kElements * 8, 1.0f);
        std::vector<float> y(x.size());
        const float keep = 1.0f / 0.7f;
        cpu::simd::kernelsFor(CpuIsa::Generic)
            .dropoutRow(x.data(), y.data(), static_cast<int64_t>(x.size()), 12345u,
                        static_cast<uint32_t>(0.3 * 16777216.0), keep);
        int64_t zeros = 0;
        for (float v : y) {
            if (v == 0.0f) {
                ++zeros;
            } else {
                QCOMPARE(v, keep);
            }
        }
        const double zeroed = static_cast<double>(zeros) / static_cast<double>(y.size());
        QVERIFY2(std::abs(zeroed - 0.3) < 0.02, qPrintable(QString::number(zeroed)));
    }

    // The zero-skipping products (AVX2 and AVX-512) against a product in double precision, over
    // shapes with every tail: rows and columns not multiples of 16 or of the pairs, odd row
    // counts, outputs narrower than a vector and wider than a tile, inputs with a row stride
    // longer than their width, at densities 0 (the output is zero), 0.3 and 1; what they count
    // is the positions where any row (column) of a group is nonzero.
    // Every level this CPU has is checked.
    void sparseProductsMatchReference() {
        if (!forEachSparseLevel([](const cpu::sparse::Kernels& k, CpuIsa isa) {
                checkSparseKernels(k, cpuIsaName(isa));
            }))
            QSKIP("this CPU has neither AVX2 nor AVX-512: the products stay dense");
    }

    // The narrow product (an output of at most two vectors' width) against a product in double
    // precision: A row-major or read transposed, output rows at a stride longer than the width
    // and one after the other (where the kernel stores a row's last vector whole), rows not a
    // multiple of four, every width up to the kernel's limit, with a bias and without; nothing
    // written past the output's columns nor past its last row.
    void narrowProductMatchesReference() {
        if (!forEachSparseLevel([](const cpu::sparse::Kernels& k, CpuIsa isa) {
                QVERIFY(k.narrowMaxCols >= 16);
                std::mt19937 rng(17);
                std::uniform_real_distribution<float> uni(-1.f, 1.f);
                int checked = 0;
                for (int64_t M : {1, 3, 4, 7, 32})
                    for (int64_t K : {1, 5, 128})
                        for (int64_t N = 1; N <= k.narrowMaxCols; ++N)
                            for (bool transposed : {false, true})
                                for (int64_t ldc : {N + 5, N})
                                    for (bool withBias : {false, true}) {
                                        // A: [M, K] at row stride K + 3, or [K, M] at stride M + 2.
                                        const int64_t lda = transposed ? M + 2 : K + 3;
                                        std::vector<float> a((transposed ? K : M) * lda), b(K * N),
                                            bias(N), c(M * ldc + 16, 7.f);
                                        for (auto* v : {&a, &b, &bias})
                                            for (float& e : *v) e = uni(rng);
                                        const int64_t sr = transposed ? 1 : lda;
                                        const int64_t sk = transposed ? lda : 1;
                                        k.narrowProduct(a.data(), sr, sk, M, K, b.data(), N, N,
                                                        withBias ? bias.data() : nullptr, c.data(),
                                                        ldc);
                                        for (int64_t r = 0; r < M; ++r) {
                                            for (int64_t j = 0; j < N; ++j) {
                                                double want = withBias ? bias[j] : 0.0;
                                                for (int64_t q = 0; q < K; ++q)
                                                    want += double{a[r * sr + q * sk]} *
                                                            double{b[q * N + j]};
                                                const double got = c[r * ldc + j];
                                                if (std::fabs(got - want) >
                                                    1e-5 * (1 + std::fabs(want)))
                                                    QFAIL(qPrintable(
                                                        QStringLiteral(
                                                            "%1: M %2 K %3 N %4 (%5, %6): "
                                                            "[%7,%8] = %9, want %10")
                                                            .arg(cpuIsaName(isa))
                                                            .arg(M)
                                                            .arg(K)
                                                            .arg(N)
                                                            .arg(transposed ? "transposed" : "rows")
                                                            .arg(withBias ? "bias" : "no bias")
                                                            .arg(r)
                                                            .arg(j)
                                                            .arg(got)
                                                            .arg(want)));
                                            }
                                            for (int64_t j = N; j < ldc; ++j)
                                                QCOMPARE(c[r * ldc + j], 7.f);
                                        }
                                        for (int64_t e = M * ldc; e < M * ldc + 16; ++e)
                                            QCOMPARE(c[e], 7.f);
                                        ++checked;
                                    }
                QCOMPARE(checked, 5 * 3 * static_cast<int>(k.narrowMaxCols) * 8);
            }))
            QSKIP("this CPU has neither AVX2 nor AVX-512: products stay with oneDNN");
    }

    // The short kernel (a product with few terms in each sum, B transposed: a narrow layer's
    // input gradient) against the sum in double precision: every inner size up to the kernel's
    // limit, odd row counts, widths around the vector and tile sizes, row strides longer than
    // the rows; nothing written past the output's columns.
    void shortProductMatchesReference() {
        if (!forEachSparseLevel([](const cpu::sparse::Kernels& k, CpuIsa isa) {
                QVERIFY(k.shortMaxInner >= 10);
                std::mt19937 rng(23);
                std::uniform_real_distribution<float> uni(-1.f, 1.f);
                int checked = 0;
                for (int64_t M : {1, 2, 3, 32, 33})
                    for (int64_t K = 1; K <= k.shortMaxInner; ++K)
                        for (int64_t N : {1, 7, 8, 9, 48, 49, 128, 130}) {
                            const int64_t lda = K + 3, ldb = K + 2, ldc = N + 5;
                            std::vector<float> a(M * lda), b(N * ldb), c(M * ldc, 7.f);
                            for (auto* v : {&a, &b})
                                for (float& e : *v) e = uni(rng);
                            k.shortProduct(a.data(), lda, M, K, b.data(), ldb, N, c.data(), ldc);
                            for (int64_t r = 0; r < M; ++r) {
                                for (int64_t j = 0; j < N; ++j) {
                                    double want = 0;
                                    for (int64_t q = 0; q < K; ++q)
                                        want += double{a[r * lda + q]} * double{b[j * ldb + q]};
                                    const double got = c[r * ldc + j];
                                    if (std::fabs(got - want) > 1e-5 * (1 + std::fabs(want)))
                                        QFAIL(qPrintable(
                                            QStringLiteral("%1: M %2 K %3 N %4: [%5,%6] = %7, "
                                                           "want %8")
                                                .arg(cpuIsaName(isa))
                                                .arg(M)
                                                .arg(K)
                                                .arg(N)
                                                .arg(r)
                                                .arg(j)
                                                .arg(got)
                                                .arg(want)));
                                }
                                for (int64_t j = N; j < ldc; ++j) QCOMPARE(c[r * ldc + j], 7.f);
                            }
                            ++checked;
                        }
                QCOMPARE(checked, 5 * static_cast<int>(k.shortMaxInner) * 8);
            }))
            QSKIP("this CPU has neither AVX2 nor AVX-512: products stay with oneDNN");
    }

    // The forward kernel pairs rows whose zeros sit in the same places (pairRows): on images
    // whose background differs from one image to the next (the object at one of four places),
    // pairing rows with the same background lists less than pairing neighbouring rows, which here
    // never share one. The product stays the reference's (checked above for random zeros).
    void pairedRowsListLess() {
        if (!forEachSparseLevel([](const cpu::sparse::Kernels& k, CpuIsa) {
                const int64_t M = 32, K = 392, N = 64;
                std::mt19937 rng(5);
                std::uniform_real_distribution<float> uni(0.1f, 1.f);
                std::vector<float> x(static_cast<size_t>(M * K), 0.f), w(K * N, 0.5f), y(M * N);
                for (int64_t i = 0; i < M; ++i) {
                    const int64_t place = (i * 3) % 4;  // neighbours at different places
                    for (int64_t j = place * 98; j < place * 98 + 98; ++j) x[i * K + j] = uni(rng);
                }
                const int64_t listed =
                    k.rowsTimesDense(x.data(), K, M, K, w.data(), N, N, y.data(), N);
                // Pairs of rows with the same place list 98 positions each; neighbours 196.
                QCOMPARE(listed, int64_t{16 * 98});
                for (int64_t i = 0; i < M; ++i)
                    for (int64_t n = 0; n < N; ++n) {
                        double want = 0;
                        for (int64_t j = 0; j < K; ++j) want += double{x[i * K + j]} * 0.5;
                        QVERIFY(std::fabs(y[i * N + n] - want) < 1e-4 * (1 + want));
                    }
            }))
            QSKIP("this CPU has neither AVX2 nor AVX-512: the products stay dense");
    }

    // The comparison above is only worth something if the kernels move the state.
    void kernelsUpdate() {
        const State before;
        const State after = runAdam(kernelsFor(detectedCpuIsa()), false, false, false);
        int changed = 0;
        for (int64_t i = 0; i < kElements; ++i) changed += after.w[i] != before.w[i];
        QVERIFY2(changed > kElements - 10, qPrintable(QString("%1 changed").arg(changed)));
    }
};

QTEST_GUILESS_MAIN(TestIsa)
#include "test_isa.moc"

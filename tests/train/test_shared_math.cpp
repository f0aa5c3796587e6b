// The per-element math the CUDA kernels run (TD_HOST_DEVICE headers) against the CPU's kernels,
// on the CPU: the optimizer update of backend/update_math.h assembled as the CUDA update kernel
// assembles it (norms, clipping and loss-scale prologue, then one element at a time) against
// applyUpdate, bit for bit where no norm is involved; the activations, their gradients and the
// dropout mask of backend/kernel_math.h against cpu::activation, cpu::activationGrad and
// cpu::dropout; the 16-bit conversions of core/half.h against the array casts.
#include <QtTest>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "engine/backend/cpu/kernels.h"
#include "engine/backend/cpu/update.h"
#include "engine/backend/kernel_math.h"
#include "engine/backend/update_math.h"
#include "engine/core/half.h"

using namespace td;

namespace {

struct Tensors {
    std::vector<std::vector<float>> w, g, s0, s1, s2;
    std::vector<std::vector<uint16_t>> shadow;
};

Tensors makeTensors(uint32_t seed, bool nonFinite) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> nd(0.f, 1.f);
    Tensors t;
    for (int64_t size : {1, 17, 300, 4099}) {
        auto fill = [&](float scale, bool positive) {
            std::vector<float> v(static_cast<size_t>(size));
            for (float& x : v) x = positive ? std::fabs(nd(rng)) * scale : nd(rng) * scale;
            return v;
        };
        t.w.push_back(fill(0.5f, false));
        t.g.push_back(fill(0.3f, false));
        t.s0.push_back(fill(0.1f, false));
        t.s1.push_back(fill(0.01f, true));
        t.s2.push_back(fill(0.02f, true));
        t.shadow.emplace_back(static_cast<size_t>(size), 0);
    }
    if (nonFinite) t.g[2][5] = std::numeric_limits<float>::infinity();
    return t;
}

std::vector<UpdateTensor> views(Tensors& t) {
    std::vector<UpdateTensor> v;
    for (size_t i = 0; i < t.w.size(); ++i) {
        UpdateTensor u;
        u.value = t.w[i].data();
        u.grad = t.g[i].data();
        u.size = static_cast<int64_t>(t.w[i].size());
        u.slot[0] = t.s0[i].data();
        u.slot[1] = t.s1[i].data();
        u.slot[2] = t.s2[i].data();
        u.shadow = t.shadow[i].data();
        u.shadowF16 = i % 2 == 1;
        v.push_back(u);
    }
    return v;
}

// The CUDA update (engine/backend/cuda/cuda_update.cu) written out on the host: the prologue
// kernel's decisions, then the element kernel's body for every element.
bool deviceStyleUpdate(const UpdateSpec& spec, const UpdateScalars& sc, Tensors& t,
                       LossScaleState* ls) {
    const size_t n = t.w.size();
    std::vector<double> norms(n, 0.0);
    for (size_t i = 0; i < n; ++i)
        for (float g : t.g[i]) norms[i] += static_cast<double>(g) * g;
    float unscale = 1.0f;
    if (ls) {
        double total = 0;
        for (double x : norms) total += x;
        if (!std::isfinite(total)) {
            ls->scale *= 0.5f;
            ls->goodSteps = 0;
            ls->skippedSteps += 1;
            ls->lastSkipped = 1;
            return false;
        }
        unscale = 1.0f / ls->scale;
        ls->lastSkipped = 0;
        if (++ls->goodSteps >= ls->growthSteps) {
            ls->goodSteps = 0;
            ls->scale *= 2.0f;
        }
    }
    std::vector<float> scales(n, 1.0f);
    if (spec.clip == ClipKind::GlobalNorm) {
        double total = 0;
        for (double x : norms) total += x;
        const double norm = std::sqrt(total) * unscale;
        float global = 1.0f;
        if (!std::isfinite(norm))
            global = std::numeric_limits<float>::quiet_NaN();
        else if (norm > spec.clipValue)
            global = static_cast<float>(spec.clipValue / norm);
        std::fill(scales.begin(), scales.end(), global);
    } else if (spec.clip == ClipKind::Norm) {
        for (size_t i = 0; i < n; ++i) {
            const double norm = std::sqrt(norms[i]) * unscale;
            scales[i] = static_cast<float>(spec.clipValue / std::max(norm, spec.clipValue));
        }
    }
    if (unscale != 1.0f)
        for (float& s : scales) s *= unscale;
    const float clip = spec.clip == ClipKind::Value ? static_cast<float>(spec.clipValue)
                                                    : std::numeric_limits<float>::infinity();
    for (size_t ti = 0; ti < n; ++ti)
        for (size_t i = 0; i < t.w[ti].size(); ++i) {
            const float g = umath::clippedGrad(t.g[ti][i], scales[ti], clip);
            float w = umath::decayed(t.w[ti][i], spec.decay, sc.wdLr);
            switch (spec.kind) {
                case UpdateKind::Sgd:
                    umath::sgd(g, w, &t.s0[ti][i], sc.lr, spec.momentum, spec.nesterov);
                    break;
                case UpdateKind::Adam:
                    umath::adam(g, w, t.s0[ti][i], t.s1[ti][i],
                                spec.amsgrad ? &t.s2[ti][i] : nullptr, sc.alpha, spec.oneMinusBeta1,
                                spec.oneMinusBeta2, spec.epsilon);
                    break;
                case UpdateKind::RmsProp: {
                    const bool mom = spec.momentum > 0;
                    float* avg = spec.centered ? (mom ? &t.s2[ti][i] : &t.s1[ti][i]) : nullptr;
                    umath::rmsprop(g, w, t.s0[ti][i], mom ? &t.s1[ti][i] : nullptr, avg, sc.lr,
                                   spec.rho, spec.oneMinusRho, spec.epsilon, spec.momentum);
                    break;
                }
            }
            t.w[ti][i] = w;
            t.shadow[ti][i] = ti % 2 == 1 ? floatToF16(w) : floatToBf16(w);
        }
    return true;
}

// Largest |a - b| / max(1, |a|) over every array of the tensors.
double maxDiff(const Tensors& a, const Tensors& b) {
    double worst = 0;
    auto cmp = [&](const std::vector<std::vector<float>>& x,
                   const std::vector<std::vector<float>>& y) {
        for (size_t i = 0; i < x.size(); ++i)
            for (size_t k = 0; k < x[i].size(); ++k) {
                const double d = std::fabs(static_cast<double>(x[i][k]) - y[i][k]) /
                                 std::max(1.0, std::fabs(static_cast<double>(x[i][k])));
                worst = std::isnan(d) ? (std::isnan(x[i][k]) && std::isnan(y[i][k]) ? worst : 1e9)
                                      : std::max(worst, d);
            }
    };
    cmp(a.w, b.w);
    cmp(a.s0, b.s0);
    cmp(a.s1, b.s1);
    cmp(a.s2, b.s2);
    return worst;
}

bool identical(const Tensors& a, const Tensors& b) {
    auto same = [](const auto& x, const auto& y) {
        for (size_t i = 0; i < x.size(); ++i)
            if (std::memcmp(x[i].data(), y[i].data(), x[i].size() * sizeof(x[i][0])) != 0)
                return false;
        return true;
    };
    return same(a.w, b.w) && same(a.s0, b.s0) && same(a.s1, b.s1) && same(a.s2, b.s2) &&
           same(a.shadow, b.shadow);
}

}  // namespace

class TestSharedMath : public QObject {
    Q_OBJECT
  private slots:
    void updateMatchesApply_data();
    void updateMatchesApply();
    void activationsMatchCpuKernels();
    void dropoutMatchesCpuKernel();
    void halfConversionsMatchArrayCasts();
};

void TestSharedMath::updateMatchesApply_data() {
    QTest::addColumn<int>("kind");
    QTest::addColumn<int>("variant");
    QTest::addColumn<int>("clip");
    QTest::addColumn<bool>("lossScale");
    QTest::addColumn<bool>("nonFinite");
    const int none = static_cast<int>(ClipKind::None), value = static_cast<int>(ClipKind::Value),
              norm = static_cast<int>(ClipKind::Norm),
              global = static_cast<int>(ClipKind::GlobalNorm);
    const int sgd = static_cast<int>(UpdateKind::Sgd), adam = static_cast<int>(UpdateKind::Adam),
              rms = static_cast<int>(UpdateKind::RmsProp);
    QTest::newRow("sgd plain") << sgd << 0 << none << false << false;
    QTest::newRow("sgd momentum clipvalue") << sgd << 1 << value << false << false;
    QTest::newRow("sgd nesterov decay") << sgd << 2 << none << false << false;
    QTest::newRow("adam") << adam << 0 << none << false << false;
    QTest::newRow("adam amsgrad decay clipvalue") << adam << 1 << value << false << false;
    QTest::newRow("adam clipnorm") << adam << 0 << norm << false << false;
    QTest::newRow("adam global clipnorm") << adam << 0 << global << false << false;
    QTest::newRow("adam loss scale") << adam << 0 << none << true << false;
    QTest::newRow("adam loss scale, skipped step") << adam << 0 << none << true << true;
    QTest::newRow("rmsprop") << rms << 0 << none << false << false;
    QTest::newRow("rmsprop centered momentum") << rms << 1 << none << false << false;
    QTest::newRow("rmsprop centered global clip loss scale") << rms << 2 << global << true << false;
}

void TestSharedMath::updateMatchesApply() {
    QFETCH(int, kind);
    QFETCH(int, variant);
    QFETCH(int, clip);
    QFETCH(bool, lossScale);
    QFETCH(bool, nonFinite);
    UpdateSpec spec;
    spec.kind = static_cast<UpdateKind>(kind);
    spec.clip = static_cast<ClipKind>(clip);
    spec.clipValue = spec.clip == ClipKind::Value ? 0.2 : 1.5;
    spec.epsilon = 1e-7f;
    switch (spec.kind) {
        case UpdateKind::Sgd:
            spec.momentum = variant == 0 ? 0.f : 0.9f;
            spec.nesterov = variant == 2;
            spec.decay = variant == 2;
            break;
        case UpdateKind::Adam:
            spec.oneMinusBeta1 = 0.1f;
            spec.oneMinusBeta2 = 0.001f;
            spec.amsgrad = variant == 1;
            spec.decay = variant == 1;
            break;
        case UpdateKind::RmsProp:
            spec.rho = 0.9f;
            spec.oneMinusRho = 0.1f;
            spec.centered = variant >= 1;
            spec.momentum = variant >= 1 ? 0.5f : 0.f;
            break;
    }
    const UpdateScalars sc{0.01f, 0.003f, 0.0004f};
    Tensors ref = makeTensors(9, nonFinite), got = makeTensors(9, nonFinite);
    if (lossScale)  // gradients as a loss-scaled step has them
        for (Tensors* t : {&ref, &got})
            for (auto& g : t->g)
                for (float& x : g) x *= 1024.f;
    LossScaleState lsRef, lsGot;
    lsRef.scale = lsGot.scale = 1024.f;
    lsRef.growthSteps = lsGot.growthSteps = 1;
    auto refViews = views(ref);
    const bool appliedRef = applyUpdate(spec, sc, refViews, 0, lossScale ? &lsRef : nullptr);
    const bool appliedGot = deviceStyleUpdate(spec, sc, got, lossScale ? &lsGot : nullptr);
    QCOMPARE(appliedGot, appliedRef);
    if (lossScale) {
        QCOMPARE(lsGot.scale, lsRef.scale);
        QCOMPARE(lsGot.goodSteps, lsRef.goodSteps);
        QCOMPARE(lsGot.skippedSteps, lsRef.skippedSteps);
        QCOMPARE(lsGot.lastSkipped, lsRef.lastSkipped);
    }
    if (spec.clip == ClipKind::Norm || spec.clip == ClipKind::GlobalNorm) {
        // The norms are sums in another order: the scales may differ in their last bit.
        QVERIFY2(maxDiff(ref, got) < 1e-6, QByteArray::number(maxDiff(ref, got)));
    } else {
        QVERIFY(identical(ref, got));
    }
}

void TestSharedMath::activationsMatchCpuKernels() {
    std::mt19937 rng(4);
    std::normal_distribution<float> nd(0.f, 2.f);
    const int64_t rows = 7, cols = 33, n = rows * cols;
    std::vector<float> x(n), y(n), dy(n), dx(n);
    for (int64_t i = 0; i < n; ++i) {
        x[i] = nd(rng);
        dy[i] = nd(rng);
    }
    x[3] = 0.f;
    for (ActKind k : {ActKind::Linear, ActKind::Relu, ActKind::LeakyRelu, ActKind::Elu,
                      ActKind::Gelu, ActKind::Sigmoid, ActKind::Tanh}) {
        const float alpha = 0.3f;
        cpu::activation(k, alpha, x.data(), y.data(), rows, cols);
        for (int64_t i = 0; i < n; ++i) QCOMPARE(kmath::activate(k, alpha, x[i]), y[i]);
        for (bool usesOutput : {false, true}) {
            if (usesOutput && k == ActKind::Gelu) continue;
            const std::vector<float>& saved = usesOutput ? y : x;
            cpu::activationGrad(k, alpha, usesOutput, dy.data(), saved.data(), dx.data(), rows,
                                cols);
            for (int64_t i = 0; i < n; ++i)
                QCOMPARE(kmath::activateGrad(k, alpha, usesOutput, dy[i], saved[i]), dx[i]);
        }
    }
}

void TestSharedMath::dropoutMatchesCpuKernel() {
    const int64_t rows = 9, cols = 77;
    std::vector<float> x(rows * cols, 1.0f), y(rows * cols);
    const float rate = 0.3f;
    const uint64_t seed = 123;
    const int64_t step = 17, base = 1000;
    cpu::dropout(x.data(), y.data(), rows, cols, rate, seed, step, base);
    const uint32_t threshold = kmath::dropoutThreshold(rate);
    for (int64_t r = 0; r < rows; ++r) {
        const uint32_t rowBase = kmath::dropoutRowBase(seed, step, base + r);
        for (int64_t c = 0; c < cols; ++c) {
            const bool keep = kmath::dropoutHash24(rowBase, c) >= threshold;
            QCOMPARE(y[r * cols + c], keep ? 1.0f / (1.0f - rate) : 0.0f);
            QCOMPARE(cpu::keyedUniform(seed, step, base + r, c) >= rate, keep);
        }
    }
}

void TestSharedMath::halfConversionsMatchArrayCasts() {
    std::mt19937 rng(2);
    std::uniform_int_distribution<uint32_t> bits;
    std::vector<float> f(4096);
    for (float& v : f) {
        const uint32_t b = bits(rng);
        std::memcpy(&v, &b, 4);
    }
    f[0] = 65504.f;
    f[1] = 1e-8f;
    std::vector<uint16_t> h(f.size()), b(f.size());
    castF32ToF16(f.data(), h.data(), static_cast<int64_t>(f.size()));
    castF32ToBf16(f.data(), b.data(), static_cast<int64_t>(f.size()));
    for (size_t i = 0; i < f.size(); ++i) {
        QCOMPARE(floatToF16(f[i]), h[i]);
        QCOMPARE(floatToBf16(f[i]), b[i]);
    }
    std::vector<float> back(h.size());
    castF16ToF32(h.data(), back.data(), static_cast<int64_t>(h.size()));
    for (size_t i = 0; i < h.size(); ++i) {
        const float s = f16ToFloat(h[i]);
        QVERIFY(std::memcmp(&s, &back[i], 4) == 0);
    }
}

QTEST_APPLESS_MAIN(TestSharedMath)
#include "test_shared_math.moc"

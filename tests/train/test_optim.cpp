// Optimizers, learning-rate schedules and callbacks (engine/train) against what Keras itself
// computes (the weights after each step, dumped by tests/fixtures/keras/make_fixtures.py) and
// against straightforward double-precision transcriptions of the Keras 3 formulas.
#include <QtTest/QtTest>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <limits>
#include <numbers>
#include <random>
#include <string>
#include <vector>

#include "engine/train/callbacks.h"
#include "engine/train/optimizer.h"
#include "tests/fixtures/keras/keras_fixtures.h"
#include "tests/graph/harness.h"

using namespace td;

Q_DECLARE_METATYPE(td::OptimizerConfig)
Q_DECLARE_METATYPE(td::ScheduleConfig)
Q_DECLARE_METATYPE(td::CallbackConfig)

namespace {

using Vec = std::vector<double>;

// ---- reference optimizer (double precision, Keras 3 formulas) -----------------------------------

struct RefParam {
    Vec w;
    std::vector<Vec> state;  // slot arrays, in the optimizer's slot order
};

std::string kindOf(const OptimizerConfig& cfg) {
    std::string k;
    for (char c : cfg.name) k += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    return k;
}

int refSlotCount(const OptimizerConfig& cfg) {
    const std::string k = kindOf(cfg);
    if (k == "sgd") return cfg.momentum != 0 ? 1 : 0;
    if (k == "adam" || k == "adamw") return cfg.amsgrad ? 3 : 2;
    return 1 + (cfg.momentum > 0 ? 1 : 0) + (cfg.centered ? 1 : 0);
}

// keras BaseOptimizer._clip_gradients
std::vector<Vec> refClip(const OptimizerConfig& cfg, std::vector<Vec> grads) {
    if (cfg.clipnorm) {
        const double c = *cfg.clipnorm;
        for (Vec& g : grads) {
            double sum = 0;
            for (double x : g) sum += x * x;
            const double norm = std::sqrt(sum);
            for (double& x : g) x = x * c / std::max(norm, c);
        }
    } else if (cfg.globalClipnorm) {
        const double c = *cfg.globalClipnorm;
        double sum = 0;
        for (const Vec& g : grads)
            for (double x : g) sum += x * x;
        const double norm = std::sqrt(sum);
        const double scale = c * std::min(1.0 / norm, 1.0 / c);
        for (Vec& g : grads)
            for (double& x : g) x *= scale;
    } else if (cfg.clipvalue) {
        const double v = *cfg.clipvalue;
        for (Vec& g : grads)
            for (double& x : g) x = std::clamp(x, -v, v);
    }
    return grads;
}

// One keras optimizer.apply(): clip, weight decay, update_step, with `iterations` completed steps.
void refStep(const OptimizerConfig& cfg, double lr, int64_t iterations, std::vector<RefParam>& ps,
             const std::vector<Vec>& rawGrads) {
    const std::vector<Vec> grads = refClip(cfg, rawGrads);
    const std::string k = kindOf(cfg);
    for (size_t p = 0; p < ps.size(); ++p) {
        Vec& w = ps[p].w;
        const Vec& g = grads[p];
        if (cfg.weightDecay > 0)
            for (double& x : w) x = x - x * cfg.weightDecay * lr;
        if (k == "sgd") {
            if (cfg.momentum == 0) {
                for (size_t i = 0; i < w.size(); ++i) w[i] -= lr * g[i];
            } else {
                Vec& m = ps[p].state[0];
                for (size_t i = 0; i < w.size(); ++i) {
                    m[i] = cfg.momentum * m[i] - lr * g[i];
                    if (cfg.nesterov) {
                        w[i] += cfg.momentum * m[i] - lr * g[i];
                    } else {
                        w[i] += m[i];
                    }
                }
            }
        } else if (k == "adam" || k == "adamw") {
            const double t = static_cast<double>(iterations + 1);
            // Keras raises the betas cast to float32 (0.999f = 0.99900001) to the power t.
            const double b1 = static_cast<float>(cfg.beta1), b2 = static_cast<float>(cfg.beta2);
            const double alpha = lr * std::sqrt(1 - std::pow(b2, t)) / (1 - std::pow(b1, t));
            Vec& m = ps[p].state[0];
            Vec& v = ps[p].state[1];
            for (size_t i = 0; i < w.size(); ++i) {
                m[i] += (g[i] - m[i]) * (1 - cfg.beta1);
                v[i] += (g[i] * g[i] - v[i]) * (1 - cfg.beta2);
                double vv = v[i];
                if (cfg.amsgrad) {
                    Vec& vhat = ps[p].state[2];
                    vhat[i] = std::max(vhat[i], v[i]);
                    vv = vhat[i];
                }
                w[i] -= alpha * m[i] / (std::sqrt(vv) + cfg.epsilon);
            }
        } else {  // rmsprop
            Vec& vel = ps[p].state[0];
            const bool hasMomentum = cfg.momentum > 0;
            for (size_t i = 0; i < w.size(); ++i) {
                vel[i] = cfg.rho * vel[i] + (1 - cfg.rho) * g[i] * g[i];
                double denom;
                if (cfg.centered) {
                    Vec& avg = ps[p].state[hasMomentum ? 2 : 1];
                    avg[i] = cfg.rho * avg[i] + (1 - cfg.rho) * g[i];
                    denom = vel[i] - avg[i] * avg[i] + cfg.epsilon;
                } else {
                    denom = vel[i] + cfg.epsilon;
                }
                const double increment = lr * g[i] / std::sqrt(denom);
                if (hasMomentum) {
                    Vec& mom = ps[p].state[1];
                    mom[i] = cfg.momentum * mom[i] + increment;
                    w[i] -= mom[i];
                } else {
                    w[i] -= increment;
                }
            }
        }
    }
}

bool close(double actual, double expected, double rel = 1e-6, double abs = 1e-8) {
    return std::fabs(actual - expected) <= rel * std::fabs(expected) + abs;
}

// Parameters as the trainer holds them: flat float arrays.
struct Params {
    std::vector<std::vector<float>> w, g;
    std::vector<ParamRef> refs() {
        std::vector<ParamRef> out;
        for (size_t i = 0; i < w.size(); ++i) {
            out.push_back({w[i].data(), g[i].data(), static_cast<int64_t>(w[i].size())});
        }
        return out;
    }
    std::vector<int64_t> sizes() const {
        std::vector<int64_t> out;
        for (const auto& x : w) out.push_back(static_cast<int64_t>(x.size()));
        return out;
    }
};

std::unique_ptr<Optimizer> makeOptimizer(const OptimizerConfig& cfg) {
    auto r = Optimizer::create(cfg);
    if (!r.ok()) qFatal("Optimizer::create failed: %s", r.error().c_str());
    return std::move(r).value();
}

OptimizerConfig sgdConfig(double lr) {
    OptimizerConfig c;
    c.name = "sgd";
    c.learningRate = lr;
    return c;
}

// ---- a TrainControl backed by a vector<Tensor> --------------------------------------------------

struct FakeRun {
    std::vector<Tensor> weights;
    double lr = 0.1;
    std::vector<std::string> logs;
    TrainControl c;

    FakeRun() {
        weights.emplace_back(DType::F32, Shape{2, 3});
        weights.emplace_back(DType::F32, Shape{3});
        c.getLearningRate = [this] { return lr; };
        c.setLearningRate = [this](double v) { lr = v; };
        c.getWeights = [this] {
            std::vector<Tensor> out;
            for (const Tensor& t : weights) out.push_back(t.clone());
            return out;
        };
        c.setWeights = [this](const std::vector<Tensor>& ws) {
            QCOMPARE(ws.size(), weights.size());
            for (size_t i = 0; i < ws.size(); ++i) weights[i] = ws[i].clone();
        };
        c.log = [this](const std::string& s) { logs.push_back(s); };
    }
    FakeRun(const FakeRun&) = delete;
    FakeRun& operator=(const FakeRun&) = delete;

    void setWeightsTo(float v) {
        for (Tensor& t : weights)
            for (int64_t i = 0; i < t.size(); ++i) t.data<float>()[i] = v;
    }
    bool weightsAre(float v) const {
        for (const Tensor& t : weights)
            for (int64_t i = 0; i < t.size(); ++i)
                if (t.data<float>()[i] != v) return false;
        return true;
    }
    bool logged(const std::string& needle) const {
        for (const auto& l : logs)
            if (l.find(needle) != std::string::npos) return true;
        return false;
    }
};

std::unique_ptr<Callback> makeCallback(const CallbackConfig& cfg) {
    auto r = Callback::create(cfg);
    if (!r.ok()) qFatal("Callback::create failed: %s", r.error().c_str());
    return std::move(r).value();
}

CallbackConfig earlyStopping(const std::string& monitor, int patience) {
    CallbackConfig c;
    c.type = "early_stopping";
    c.monitor = monitor;
    c.patience = patience;
    return c;
}

CallbackConfig reduceLr(int patience, double factor) {
    CallbackConfig c;
    c.type = "reduce_lr_on_plateau";
    c.monitor = "val_loss";
    c.patience = patience;
    c.factor = factor;
    return c;
}

}  // namespace

class TestOptim : public QObject {
    Q_OBJECT

  private slots:
    // ---- optimizers vs reference ----------------------------------------------------------------
    void matchesKerasReference_data() {
        QTest::addColumn<OptimizerConfig>("cfg");
        QTest::addColumn<bool>("decaySchedule");  // exponential_decay: lr * 0.5^(step / 3)
        auto row = [](const char* name, OptimizerConfig c, bool decay = false) {
            QTest::newRow(name) << c << decay;
        };
        OptimizerConfig c;
        c = sgdConfig(0.05);
        row("sgd", c);
        c.momentum = 0.9;
        row("sgd_momentum", c);
        c.nesterov = true;
        row("sgd_nesterov", c);
        c.clipvalue = 0.5;
        row("sgd_nesterov_clipvalue", c);

        c = OptimizerConfig{};
        c.name = "adam";
        c.learningRate = 0.001;
        row("adam", c);
        c.beta1 = 0.8;
        c.beta2 = 0.99;
        c.epsilon = 1e-4;
        row("adam_betas", c);
        c = OptimizerConfig{};
        c.amsgrad = true;
        c.learningRate = 0.01;
        row("adam_amsgrad", c);
        c.amsgrad = false;
        c.clipnorm = 1.0;
        row("adam_clipnorm", c, true);
        c = OptimizerConfig{};
        c.name = "adamw";
        c.learningRate = 0.01;
        c.weightDecay = 0.004;
        row("adamw", c);
        c.amsgrad = true;
        c.globalClipnorm = 5.0;
        row("adamw_amsgrad_global_clipnorm", c, true);

        c = OptimizerConfig{};
        c.name = "rmsprop";
        c.learningRate = 0.001;
        row("rmsprop", c);
        c.momentum = 0.9;
        row("rmsprop_momentum", c);
        c.momentum = 0;
        c.centered = true;
        row("rmsprop_centered", c);
        c.momentum = 0.5;
        c.rho = 0.8;
        row("rmsprop_centered_momentum", c);
        c.weightDecay = 0.01;
        c.clipvalue = 0.3;
        row("rmsprop_centered_momentum_wd_clipvalue", c, true);
    }

    void matchesKerasReference() {
        QFETCH(OptimizerConfig, cfg);
        QFETCH(bool, decaySchedule);
        if (decaySchedule) {
            cfg.schedule.type = "exponential_decay";
            cfg.schedule.decaySteps = 3;
            cfg.schedule.decayRate = 0.5;
        }
        auto opt = makeOptimizer(cfg);

        // One small tensor and one large enough for the multi-threaded path.
        std::mt19937 rng(1234);
        std::uniform_real_distribution<float> uni(-1.0f, 1.0f);
        Params params;
        for (size_t n : {size_t{37}, size_t{40000}}) {
            params.w.emplace_back(n);
            params.g.emplace_back(n);
            for (float& x : params.w.back()) x = uni(rng);
        }
        opt->build(params.sizes());
        const int slotCount = refSlotCount(cfg);
        QCOMPARE(opt->slotTensors().size(), params.w.size() * static_cast<size_t>(slotCount));

        std::vector<Vec> initial;
        for (const auto& w : params.w) initial.emplace_back(w.begin(), w.end());
        std::vector<RefParam> ref(params.w.size());
        for (size_t p = 0; p < ref.size(); ++p) {
            ref[p].w.assign(params.w[p].begin(), params.w[p].end());
            ref[p].state.assign(static_cast<size_t>(slotCount), Vec(params.w[p].size(), 0.0));
        }

        for (int64_t step = 0; step < 6; ++step) {
            std::vector<Vec> grads;
            for (auto& g : params.g) {
                for (float& x : g) x = 3.0f * uni(rng);
                grads.emplace_back(g.begin(), g.end());
            }
            const double lr =
                decaySchedule ? cfg.learningRate * std::pow(0.5, step / 3.0) : cfg.learningRate;
            QVERIFY(close(opt->currentLearningRate(), lr, 1e-12, 0));
            auto refs = params.refs();
            opt->apply(refs);
            refStep(cfg, lr, step, ref, grads);
            QCOMPARE(opt->iterations(), step + 1);
        }

        // Normwise relative error: |actual - reference| <= 1e-6 * max |reference| over the array
        // (float rounding of sums of terms much larger than the result rules out elementwise).
        auto check = [](const char* what, size_t p, const float* actual, const Vec& expected,
                        double rel) {
            double scale = 0;
            for (double x : expected) scale = std::max(scale, std::fabs(x));
            for (size_t i = 0; i < expected.size(); ++i) {
                if (std::fabs(actual[i] - expected[i]) > rel * scale) {
                    qWarning("%s of param %zu [%zu]: got %.9g, reference %.9g (scale %.3g)", what,
                             p, i, double(actual[i]), expected[i], scale);
                    return false;
                }
            }
            return true;
        };
        const std::vector<Tensor*> slotList = opt->slotTensors();
        for (size_t p = 0; p < ref.size(); ++p) {
            QVERIFY(check("weights", p, params.w[p].data(), ref[p].w, 1e-6));
            // The total change of the weights, to 1e-4 of its size: weights near 1 hold the
            // small updates to float precision only.
            std::vector<float> delta(ref[p].w.size());
            Vec refDelta(ref[p].w.size());
            for (size_t i = 0; i < delta.size(); ++i) {
                delta[i] = static_cast<float>(double(params.w[p][i]) - initial[p][i]);
                refDelta[i] = ref[p].w[i] - initial[p][i];
            }
            QVERIFY(check("update", p, delta.data(), refDelta, 1e-4));
            for (int s = 0; s < slotCount; ++s) {
                const Tensor* t =
                    slotList[p * static_cast<size_t>(slotCount) + static_cast<size_t>(s)];
                QCOMPARE(t->size(), static_cast<int64_t>(ref[p].w.size()));
                QCOMPARE(t->dtype(), DType::F32);
                QVERIFY(
                    check("slot", p, t->data<float>(), ref[p].state[static_cast<size_t>(s)], 1e-6));
            }
        }
    }

    // ---- optimizers vs Keras ----------------------------------------------------------------
    // Each case: a Keras optimizer (with clipping or a schedule) applied six times to a kernel
    // [3, 2] and a bias [2] with fixed gradients; the weights Keras held after every step.
    void matchesKerasDump_data() {
        QTest::addColumn<int>("index");
        const auto fixture = keras_fixtures::load("optimizers_keras3.json");
        const auto& cases = fixture.at("cases");
        QVERIFY(cases.size() >= 20);
        for (size_t i = 0; i < cases.size(); ++i)
            QTest::newRow(cases[i].at("name").get<std::string>().c_str()) << int(i);
    }

    void matchesKerasDump() {
        QFETCH(int, index);
        const auto fixture = keras_fixtures::load("optimizers_keras3.json");
        const auto& kase = fixture.at("cases").at(size_t(index));
        const OptimizerConfig cfg = keras_fixtures::optimizerConfig(kase.at("optimizer"));
        auto opt = makeOptimizer(cfg);

        // The parameters flattened row-major, as Keras stores them.
        auto flatten = [](const keras_fixtures::Json& v) {
            std::vector<float> out;
            for (const auto& x : v) {
                if (x.is_array()) {
                    for (const auto& y : x) out.push_back(y.get<float>());
                } else {
                    out.push_back(x.get<float>());
                }
            }
            return out;
        };
        Params params;
        for (const auto& w : fixture.at("initial")) {
            params.w.push_back(flatten(w));
            params.g.emplace_back(params.w.back().size());
        }
        opt->build(params.sizes());
        const auto& grads = fixture.at("gradients");
        const auto& expected = kase.at("weights");
        QCOMPARE(expected.size(), grads.size());
        for (size_t step = 0; step < grads.size(); ++step) {
            for (size_t p = 0; p < params.g.size(); ++p) params.g[p] = flatten(grads[step][p]);
            auto refs = params.refs();
            opt->apply(refs);
            for (size_t p = 0; p < params.w.size(); ++p) {
                const std::vector<float> want = flatten(expected[step][p]);
                QCOMPARE(want.size(), params.w[p].size());
                for (size_t i = 0; i < want.size(); ++i) {
                    // Keras rounds every operation to float32 too, in its own order: a few ulp.
                    const double got = params.w[p][i], ref = want[i];
                    const double tol = 1e-6 * std::fabs(ref);
                    QVERIFY2(std::fabs(got - ref) <= tol,
                             qPrintable(QString("step %1 param %2 [%3]: got %4, Keras %5")
                                            .arg(step + 1)
                                            .arg(p)
                                            .arg(i)
                                            .arg(got, 0, 'g', 9)
                                            .arg(ref, 0, 'g', 9)));
                }
            }
        }
    }

    // Restoring slots and iterations into a fresh optimizer continues the run bit for bit.
    void slotsAndIterationsResume() {
        OptimizerConfig cfg;
        cfg.amsgrad = true;
        auto a = makeOptimizer(cfg);
        auto b = makeOptimizer(cfg);
        std::mt19937 rng(7);
        std::uniform_real_distribution<float> uni(-1.0f, 1.0f);
        Params pa;
        pa.w = {std::vector<float>(50), std::vector<float>(5)};
        pa.g = pa.w;
        for (auto& w : pa.w)
            for (float& x : w) x = uni(rng);
        a->build(pa.sizes());
        for (int s = 0; s < 3; ++s) {
            for (auto& g : pa.g)
                for (float& x : g) x = uni(rng);
            auto r = pa.refs();
            a->apply(r);
        }
        Params pb = pa;
        b->build(pb.sizes());
        auto sa = a->slotTensors(), sb = b->slotTensors();
        QCOMPARE(sa.size(), size_t{6});
        for (size_t i = 0; i < sa.size(); ++i) *sb[i] = sa[i]->clone();
        b->setIterations(a->iterations());
        QCOMPARE(b->iterations(), int64_t{3});
        for (auto& g : pa.g)
            for (float& x : g) x = uni(rng);
        pb.g = pa.g;
        auto ra = pa.refs(), rb = pb.refs();
        a->apply(ra);
        b->apply(rb);
        QVERIFY(pa.w == pb.w);
    }

    // Slot order: m0, v0, m1, v1 for Adam.
    void adamSlotOrder() {
        auto opt = makeOptimizer(OptimizerConfig{});
        Params p;
        p.w = {std::vector<float>(3, 0.0f), std::vector<float>(2, 0.0f)};
        p.g = {{1.0f, 2.0f, 3.0f}, {-4.0f, 5.0f}};
        opt->build(p.sizes());
        auto r = p.refs();
        opt->apply(r);
        auto s = opt->slotTensors();
        QCOMPARE(s.size(), size_t{4});
        QCOMPARE(s[0]->size(), int64_t{3});
        QCOMPARE(s[2]->size(), int64_t{2});
        QVERIFY(close(s[0]->data<float>()[2], 0.3));    // m0 = 0.1 * g
        QVERIFY(close(s[1]->data<float>()[2], 0.009));  // v0 = 0.001 * g^2
        QVERIFY(close(s[2]->data<float>()[0], -0.4));   // m1
        QVERIFY(close(s[3]->data<float>()[1], 0.025));  // v1
        QCOMPARE(QString(opt->name()), QString("adam"));
    }

    // ---- clipping (SGD, lr 1, w 0: the new weights are minus the clipped gradients) -------------
    void clipValue() {
        OptimizerConfig cfg = sgdConfig(1.0);
        cfg.clipvalue = 0.5;
        auto opt = makeOptimizer(cfg);
        Params p;
        p.w = {std::vector<float>(5, 0.0f)};
        p.g = {{-2.0f, -0.5f, 0.1f, 0.7f, 0.49f}};
        opt->build(p.sizes());
        auto r = p.refs();
        opt->apply(r);
        const std::vector<float> expected{0.5f, 0.5f, -0.1f, -0.5f, -0.49f};
        QVERIFY(p.w[0] == expected);
    }

    void clipNormPerTensor() {
        OptimizerConfig cfg = sgdConfig(1.0);
        cfg.clipnorm = 1.0;
        auto opt = makeOptimizer(cfg);
        Params p;
        p.w = {std::vector<float>(2, 0.0f), std::vector<float>(2, 0.0f),
               std::vector<float>(2, 0.0f)};
        p.g = {{3.0f, 4.0f}, {0.3f, 0.4f}, {0.0f, 0.0f}};  // norms 5, 0.5, 0
        opt->build(p.sizes());
        auto r = p.refs();
        opt->apply(r);
        QCOMPARE(p.w[0][0], -0.6f);  // scaled to norm 1
        QCOMPARE(p.w[0][1], -0.8f);
        QCOMPARE(p.w[1][0], -0.3f);  // under the limit: unchanged
        QCOMPARE(p.w[1][1], -0.4f);
        QCOMPARE(p.w[2][0], 0.0f);  // zero gradient stays zero (no NaN)
        const float n = std::hypot(p.w[0][0], p.w[0][1]);
        QVERIFY(std::fabs(n - 1.0f) < 1e-6f);
    }

    void clipGlobalNorm() {
        OptimizerConfig cfg = sgdConfig(1.0);
        cfg.globalClipnorm = 6.5;
        auto opt = makeOptimizer(cfg);
        Params p;
        p.w = {std::vector<float>(2, 0.0f), std::vector<float>(1, 0.0f)};
        p.g = {{3.0f, 4.0f}, {12.0f}};  // global norm 13: every gradient halves
        opt->build(p.sizes());
        auto r = p.refs();
        opt->apply(r);
        QCOMPARE(p.w[0][0], -1.5f);
        QCOMPARE(p.w[0][1], -2.0f);
        QCOMPARE(p.w[1][0], -6.0f);
        // Under the limit: unchanged.
        p.w = {std::vector<float>(2, 0.0f), std::vector<float>(1, 0.0f)};
        p.g = {{0.3f, 0.4f}, {1.2f}};
        r = p.refs();
        opt->apply(r);
        QCOMPARE(p.w[0][0], -0.3f);
        QCOMPARE(p.w[0][1], -0.4f);
        QCOMPARE(p.w[1][0], -1.2f);
        // A non-finite global norm makes every update NaN, as in Keras.
        p.g = {{std::numeric_limits<float>::quiet_NaN(), 1.0f}, {1.0f}};
        r = p.refs();
        opt->apply(r);
        QVERIFY(std::isnan(p.w[1][0]));
    }

    void clipGlobalNormLarge() {
        // The multi-threaded norm reduction: 3 tensors, one above the parallel threshold.
        OptimizerConfig cfg = sgdConfig(1.0);
        cfg.globalClipnorm = 1.0;
        auto opt = makeOptimizer(cfg);
        Params p;
        p.w = {std::vector<float>(100000, 0.0f), std::vector<float>(10, 0.0f)};
        p.g = {std::vector<float>(100000, 0.01f), std::vector<float>(10, 1.0f)};
        opt->build(p.sizes());
        auto r = p.refs();
        opt->apply(r);
        const double norm = std::sqrt(100000 * 1e-4 + 10.0);  // sqrt(20)
        QVERIFY(close(p.w[0][12345], -0.01 / norm, 1e-6, 0));
        QVERIFY(close(p.w[1][9], -1.0 / norm, 1e-6, 0));
    }

    // ---- schedules ------------------------------------------------------------------------------
    void schedules_data() {
        QTest::addColumn<double>("initial");
        QTest::addColumn<ScheduleConfig>("cfg");
        QTest::addColumn<qint64>("step");
        QTest::addColumn<double>("expected");
        ScheduleConfig c;
        QTest::newRow("constant") << 0.01 << c << qint64(12345) << 0.01;
        c.type = "exponential_decay";
        c.decaySteps = 10;
        c.decayRate = 0.5;
        QTest::newRow("exp_0") << 0.1 << c << qint64(0) << 0.1;
        QTest::newRow("exp_5") << 0.1 << c << qint64(5) << 0.07071067811865475;
        QTest::newRow("exp_20") << 0.1 << c << qint64(20) << 0.025;
        QTest::newRow("exp_25") << 0.1 << c << qint64(25) << 0.01767766952966369;
        c.staircase = true;
        QTest::newRow("exp_stair_9") << 0.1 << c << qint64(9) << 0.1;
        QTest::newRow("exp_stair_15") << 0.1 << c << qint64(15) << 0.05;
        QTest::newRow("exp_stair_20") << 0.1 << c << qint64(20) << 0.025;
        c = ScheduleConfig{};
        c.type = "ExponentialDecay";  // Keras class names are accepted too
        c.decaySteps = 1000;
        c.decayRate = 0.96;
        QTest::newRow("exp_keras_default") << 0.01 << c << qint64(2000) << 0.009216;

        c = ScheduleConfig{};
        c.type = "cosine_decay";
        c.decaySteps = 100;
        QTest::newRow("cos_0") << 1.0 << c << qint64(0) << 1.0;
        QTest::newRow("cos_25") << 1.0 << c << qint64(25) << 0.8535533905932737;
        QTest::newRow("cos_50") << 1.0 << c << qint64(50) << 0.5;
        QTest::newRow("cos_100") << 1.0 << c << qint64(100) << 0.0;
        QTest::newRow("cos_200") << 1.0 << c << qint64(200) << 0.0;
        c.alpha = 0.1;
        QTest::newRow("cos_alpha_50") << 2.0 << c << qint64(50) << 1.1;
        QTest::newRow("cos_alpha_1000") << 2.0 << c << qint64(1000) << 0.2;
        c.alpha = 0;
        c.warmupTarget = 0.1;
        c.warmupSteps = 10;
        QTest::newRow("warm_0") << 0.0 << c << qint64(0) << 0.0;
        QTest::newRow("warm_5") << 0.0 << c << qint64(5) << 0.05;
        QTest::newRow("warm_10") << 0.0 << c << qint64(10) << 0.1;
        QTest::newRow("warm_35") << 0.0 << c << qint64(35) << 0.08535533905932737;
        QTest::newRow("warm_60") << 0.0 << c << qint64(60) << 0.05;
        QTest::newRow("warm_110") << 0.0 << c << qint64(110) << 0.0;
        QTest::newRow("warm_999") << 0.0 << c << qint64(999) << 0.0;
        QTest::newRow("warm_from_001_5") << 0.01 << c << qint64(5) << 0.055;
        c.warmupSteps = 0;  // a target without warmup steps: decay starts from the target
        QTest::newRow("target_no_warmup_0") << 0.01 << c << qint64(0) << 0.1;
        QTest::newRow("target_no_warmup_50") << 0.01 << c << qint64(50) << 0.05;
    }

    void schedules() {
        QFETCH(double, initial);
        QFETCH(ScheduleConfig, cfg);
        QFETCH(qint64, step);
        QFETCH(double, expected);
        auto s = LearningRateSchedule::create(initial, cfg);
        QVERIFY2(s.ok(), s.ok() ? "" : s.error().c_str());
        const double got = (*s)->at(step);
        QVERIFY2(close(got, expected, 1e-12, 1e-15),
                 qPrintable(QString("got %1, expected %2").arg(got, 0, 'g', 17).arg(expected)));
    }

    // The optimizer evaluates its schedule at the number of completed updates.
    void optimizerFollowsSchedule() {
        OptimizerConfig cfg = sgdConfig(0.1);
        cfg.schedule.type = "exponential_decay";
        cfg.schedule.decaySteps = 1;
        cfg.schedule.decayRate = 0.5;
        cfg.schedule.staircase = true;
        auto opt = makeOptimizer(cfg);
        Params p;
        p.w = {std::vector<float>(1, 0.0f)};
        p.g = {std::vector<float>(1, 1.0f)};
        opt->build(p.sizes());
        QCOMPARE(opt->currentLearningRate(), 0.1);
        auto r = p.refs();
        opt->apply(r);  // lr 0.1
        QCOMPARE(opt->currentLearningRate(), 0.05);
        opt->apply(r);  // lr 0.05
        QCOMPARE(p.w[0][0], 0.0f - 0.1f - 0.05f);
        opt->setIterations(10);
        QVERIFY(close(opt->currentLearningRate(), 0.1 / 1024, 1e-12, 0));
    }

    void learningRateOverride() {
        OptimizerConfig cfg = sgdConfig(0.1);
        cfg.schedule.type = "cosine_decay";
        cfg.schedule.decaySteps = 10;
        auto opt = makeOptimizer(cfg);
        Params p;
        p.w = {std::vector<float>(1, 0.0f)};
        p.g = {std::vector<float>(1, 1.0f)};
        opt->build(p.sizes());
        auto r = p.refs();
        opt->apply(r);
        opt->apply(r);
        QVERIFY(opt->currentLearningRate() < 0.1);
        opt->setLearningRateOverride(0.5);
        QCOMPARE(opt->currentLearningRate(), 0.5);
        p.w[0][0] = 0.0f;
        opt->apply(r);
        QCOMPARE(p.w[0][0], -0.5f);
        QCOMPARE(opt->iterations(), int64_t{3});
        QCOMPARE(opt->currentLearningRate(), 0.5);  // the schedule no longer applies
    }

    // ---- convergence on a quadratic -------------------------------------------------------------
    void quadraticConverges_data() {
        QTest::addColumn<OptimizerConfig>("cfg");
        OptimizerConfig c = sgdConfig(0.1);
        QTest::newRow("sgd") << c;
        c.momentum = 0.9;
        c.learningRate = 0.02;
        QTest::newRow("sgd_momentum") << c;
        c.nesterov = true;
        QTest::newRow("sgd_nesterov") << c;
        c = OptimizerConfig{};
        c.learningRate = 0.02;
        QTest::newRow("adam") << c;
        c.amsgrad = true;
        QTest::newRow("adam_amsgrad") << c;
        c.amsgrad = false;
        c.name = "adamw";
        c.weightDecay = 0.004;
        QTest::newRow("adamw") << c;
        c = OptimizerConfig{};
        c.name = "rmsprop";
        c.learningRate = 0.01;
        c.schedule.type = "cosine_decay";  // decaying lr settles the sign-like steps
        c.schedule.decaySteps = 2000;
        QTest::newRow("rmsprop") << c;
        c.centered = true;
        c.momentum = 0.5;
        QTest::newRow("rmsprop_centered_momentum") << c;
    }

    void quadraticConverges() {
        QFETCH(OptimizerConfig, cfg);
        // f(w) = 0.5 * sum a_i (w_i - t_i)^2
        const int n = 64;
        std::mt19937 rng(99);
        std::uniform_real_distribution<float> uni(-1.0f, 1.0f);
        std::vector<float> a(n), t(n);
        Params p;
        p.w = {std::vector<float>(n)};
        p.g = {std::vector<float>(n)};
        for (int i = 0; i < n; ++i) {
            a[i] = 1.5f + uni(rng);
            t[i] = 2.0f * uni(rng);
            p.w[0][i] = 2.0f * uni(rng);
        }
        auto loss = [&] {
            double s = 0;
            for (int i = 0; i < n; ++i) s += 0.5 * a[i] * (p.w[0][i] - t[i]) * (p.w[0][i] - t[i]);
            return s;
        };
        const double initial = loss();
        auto opt = makeOptimizer(cfg);
        opt->build(p.sizes());
        auto r = p.refs();
        for (int step = 0; step < 2000; ++step) {
            for (int i = 0; i < n; ++i) p.g[0][i] = a[i] * (p.w[0][i] - t[i]);
            opt->apply(r);
        }
        double maxErr = 0;
        for (int i = 0; i < n; ++i) maxErr = std::max(maxErr, double(std::fabs(p.w[0][i] - t[i])));
        const double final = loss();
        QVERIFY2(final < 1e-4 * initial && maxErr < 0.02,
                 qPrintable(
                     QString("loss %1 -> %2, max |w - t| %3").arg(initial).arg(final).arg(maxErr)));
    }

    // ---- EarlyStopping --------------------------------------------------------------------------
    void earlyStoppingPatience() {
        auto cb = makeCallback(earlyStopping("val_loss", 2));
        FakeRun run;
        cb->onTrainBegin(run.c);
        const double losses[] = {1.0, 0.9, 0.95, 0.92, 0.91};
        int stoppedAt = -1;
        for (int e = 0; e < 5 && stoppedAt < 0; ++e) {
            cb->onEpochEnd(e, {{"loss", 1.0}, {"val_loss", losses[e]}}, run.c);
            if (run.c.stopTraining) stoppedAt = e;
        }
        QCOMPARE(stoppedAt, 3);  // two epochs without improving on 0.9
        QVERIFY(run.c.stopReason.find("Epoch 4") != std::string::npos);
        QVERIFY(run.c.stopReason.find("val_loss") != std::string::npos);
    }

    void earlyStoppingPatienceZero() {
        auto cb = makeCallback(earlyStopping("loss", 0));
        FakeRun run;
        cb->onTrainBegin(run.c);
        cb->onEpochEnd(0, {{"loss", 1.0}}, run.c);
        QVERIFY(!run.c.stopTraining);
        cb->onEpochEnd(1, {{"loss", 0.5}}, run.c);
        QVERIFY(!run.c.stopTraining);
        cb->onEpochEnd(2, {{"loss", 0.5}}, run.c);  // equal is not an improvement
        QVERIFY(run.c.stopTraining);
    }

    void earlyStoppingRestoresBestWeights() {
        CallbackConfig cfg = earlyStopping("val_loss", 2);
        cfg.restoreBestWeights = true;
        auto cb = makeCallback(cfg);
        FakeRun run;
        cb->onTrainBegin(run.c);
        const double losses[] = {1.0, 0.5, 0.7, 0.8, 0.9};
        int e = 0;
        for (; e < 5 && !run.c.stopTraining; ++e) {
            run.setWeightsTo(static_cast<float>(e + 10));  // the weights after epoch e
            cb->onEpochEnd(e, {{"val_loss", losses[e]}}, run.c);
        }
        QCOMPARE(e, 4);  // stopped at epoch index 3
        QVERIFY(run.weightsAre(13.0f));
        cb->onTrainEnd(run.c);
        QVERIFY(run.weightsAre(11.0f));  // epoch 1 had the best val_loss
        QVERIFY(run.logged("best epoch: 2"));
    }

    void earlyStoppingRestoresAtTrainEndWithoutStop() {
        // Keras 3 restores the best weights at the end of training even without an early stop.
        CallbackConfig cfg = earlyStopping("val_loss", 10);
        cfg.restoreBestWeights = true;
        auto cb = makeCallback(cfg);
        FakeRun run;
        cb->onTrainBegin(run.c);
        const double losses[] = {1.0, 0.4, 0.6};
        for (int e = 0; e < 3; ++e) {
            run.setWeightsTo(static_cast<float>(e));
            cb->onEpochEnd(e, {{"val_loss", losses[e]}}, run.c);
        }
        QVERIFY(!run.c.stopTraining);
        cb->onTrainEnd(run.c);
        QVERIFY(run.weightsAre(1.0f));
    }

    void earlyStoppingMinDelta() {
        CallbackConfig cfg = earlyStopping("val_loss", 2);
        cfg.minDelta = -0.05;  // the sign is ignored, as in Keras
        auto cb = makeCallback(cfg);
        FakeRun run;
        cb->onTrainBegin(run.c);
        cb->onEpochEnd(0, {{"val_loss", 1.0}}, run.c);
        cb->onEpochEnd(1, {{"val_loss", 0.97}}, run.c);  // improves by less than 0.05
        QVERIFY(!run.c.stopTraining);
        cb->onEpochEnd(2, {{"val_loss", 0.96}}, run.c);
        QVERIFY(run.c.stopTraining);

        // Without min_delta the same run keeps going.
        auto plain = makeCallback(earlyStopping("val_loss", 2));
        FakeRun run2;
        plain->onTrainBegin(run2.c);
        for (int e = 0; e < 3; ++e) {
            plain->onEpochEnd(e, {{"val_loss", std::vector{1.0, 0.97, 0.96}[size_t(e)]}}, run2.c);
        }
        QVERIFY(!run2.c.stopTraining);
    }

    void earlyStoppingAccuracyMaximises_data() {
        QTest::addColumn<QString>("monitor");
        QTest::addColumn<QString>("mode");
        QTest::newRow("auto_val_accuracy") << "val_accuracy"
                                           << "auto";
        QTest::newRow("auto_sparse_categorical_accuracy") << "sparse_categorical_accuracy"
                                                          << "auto";
        QTest::newRow("max_custom") << "val_score"
                                    << "max";
    }

    void earlyStoppingAccuracyMaximises() {
        QFETCH(QString, monitor);
        QFETCH(QString, mode);
        CallbackConfig cfg = earlyStopping(monitor.toStdString(), 1);
        cfg.mode = mode.toStdString();
        auto cb = makeCallback(cfg);
        FakeRun run;
        cb->onTrainBegin(run.c);
        const double rising[] = {0.5, 0.6, 0.7, 0.8};
        for (int e = 0; e < 4; ++e) {
            cb->onEpochEnd(e, {{monitor.toStdString(), rising[e]}}, run.c);
            QVERIFY(!run.c.stopTraining);
        }
        cb->onEpochEnd(4, {{monitor.toStdString(), 0.75}}, run.c);
        QVERIFY(run.c.stopTraining);
    }

    void earlyStoppingModeMinOnAccuracy() {
        CallbackConfig cfg = earlyStopping("val_accuracy", 1);
        cfg.mode = "min";
        auto cb = makeCallback(cfg);
        FakeRun run;
        cb->onTrainBegin(run.c);
        cb->onEpochEnd(0, {{"val_accuracy", 0.5}}, run.c);
        cb->onEpochEnd(1, {{"val_accuracy", 0.6}}, run.c);
        QVERIFY(run.c.stopTraining);
    }

    void earlyStoppingStartFromEpoch() {
        CallbackConfig cfg = earlyStopping("loss", 0);
        cfg.startFromEpoch = 2;
        auto cb = makeCallback(cfg);
        FakeRun run;
        cb->onTrainBegin(run.c);
        const double losses[] = {1.0, 2.0, 3.0, 4.0};
        int stoppedAt = -1;
        for (int e = 0; e < 4 && stoppedAt < 0; ++e) {
            cb->onEpochEnd(e, {{"loss", losses[e]}}, run.c);
            if (run.c.stopTraining) stoppedAt = e;
        }
        QCOMPARE(stoppedAt, 3);
    }

    void earlyStoppingMissingMetricWarns() {
        auto cb = makeCallback(earlyStopping("val_loss", 0));
        FakeRun run;
        cb->onTrainBegin(run.c);
        for (int e = 0; e < 3; ++e) cb->onEpochEnd(e, {{"loss", 1.0}, {"accuracy", 0.5}}, run.c);
        QVERIFY(!run.c.stopTraining);
        QCOMPARE(run.logs.size(), size_t{1});  // once per run
        QVERIFY(run.logged("val_loss"));
        QVERIFY(run.logged("accuracy,loss"));
    }

    void earlyStoppingReusable() {
        auto cb = makeCallback(earlyStopping("loss", 1));
        for (int round = 0; round < 2; ++round) {
            FakeRun run;
            cb->onTrainBegin(run.c);
            cb->onEpochEnd(0, {{"loss", 5.0 + round}}, run.c);
            cb->onEpochEnd(1, {{"loss", 4.0 + round}}, run.c);
            QVERIFY(!run.c.stopTraining);
            cb->onEpochEnd(2, {{"loss", 4.5 + round}}, run.c);
            QVERIFY(run.c.stopTraining);
        }
    }

    // ---- ReduceLROnPlateau ----------------------------------------------------------------------
    void reduceLrAfterPatience() {
        auto cb = makeCallback(reduceLr(2, 0.5));
        FakeRun run;
        run.lr = 0.1;
        cb->onTrainBegin(run.c);
        std::vector<double> lrs;
        for (int e = 0; e < 5; ++e) {
            cb->onEpochEnd(e, {{"val_loss", 1.0}}, run.c);
            lrs.push_back(run.lr);
        }
        QCOMPARE(lrs, (std::vector<double>{0.1, 0.1, 0.05, 0.05, 0.025}));
        QVERIFY(run.logged("Epoch 3: ReduceLROnPlateau reducing learning rate to 0.05."));
        QVERIFY(run.logged("Epoch 5: ReduceLROnPlateau reducing learning rate to 0.025."));
        QVERIFY(!run.c.stopTraining);
    }

    void reduceLrImprovementResetsWait() {
        auto cb = makeCallback(reduceLr(2, 0.5));
        FakeRun run;
        run.lr = 0.1;
        cb->onTrainBegin(run.c);
        const double losses[] = {1.0, 1.0, 0.9, 0.95, 0.8, 0.85};
        for (int e = 0; e < 6; ++e) cb->onEpochEnd(e, {{"val_loss", losses[e]}}, run.c);
        QCOMPARE(run.lr, 0.1);
        QVERIFY(run.logs.empty());
    }

    void reduceLrCooldown() {
        CallbackConfig cfg = reduceLr(1, 0.5);
        cfg.cooldown = 2;
        auto cb = makeCallback(cfg);
        FakeRun run;
        run.lr = 1.0;
        cb->onTrainBegin(run.c);
        std::vector<double> lrs;
        for (int e = 0; e < 7; ++e) {
            cb->onEpochEnd(e, {{"val_loss", 1.0}}, run.c);
            lrs.push_back(run.lr);
        }
        // Reductions at epochs 1, 3 and 5 (index): each followed by a cooldown epoch.
        QCOMPARE(lrs, (std::vector<double>{1.0, 0.5, 0.5, 0.25, 0.25, 0.125, 0.125}));
    }

    void reduceLrMinLr() {
        CallbackConfig cfg = reduceLr(1, 0.1);
        cfg.minLr = 0.005;
        auto cb = makeCallback(cfg);
        FakeRun run;
        run.lr = 0.1;
        cb->onTrainBegin(run.c);
        std::vector<double> lrs;
        for (int e = 0; e < 5; ++e) {
            cb->onEpochEnd(e, {{"val_loss", 2.0}}, run.c);
            lrs.push_back(run.lr);
        }
        QVERIFY(close(lrs[1], 0.01, 1e-12, 0));
        QCOMPARE(lrs[2], 0.005);
        QCOMPARE(lrs[3], 0.005);
        QCOMPARE(lrs[4], 0.005);
        QCOMPARE(run.logs.size(), size_t{2});  // nothing logged once at min_lr
    }

    void reduceLrModeMaxAndMinDelta() {
        CallbackConfig cfg = reduceLr(1, 0.5);
        cfg.monitor = "val_accuracy";  // auto: maximised
        cfg.minDelta = 0.01;
        auto cb = makeCallback(cfg);
        FakeRun run;
        run.lr = 0.2;
        cb->onTrainBegin(run.c);
        cb->onEpochEnd(0, {{"val_accuracy", 0.50}}, run.c);
        cb->onEpochEnd(1, {{"val_accuracy", 0.60}}, run.c);
        QCOMPARE(run.lr, 0.2);
        cb->onEpochEnd(2, {{"val_accuracy", 0.605}}, run.c);  // below min_delta
        QCOMPARE(run.lr, 0.1);
    }

    void reduceLrMissingMetricWarns() {
        auto cb = makeCallback(reduceLr(0, 0.5));
        FakeRun run;
        cb->onTrainBegin(run.c);
        cb->onEpochEnd(0, {{"loss", 1.0}}, run.c);
        cb->onEpochEnd(1, {{"loss", 1.0}}, run.c);
        QCOMPARE(run.lr, 0.1);
        QCOMPARE(run.logs.size(), size_t{1});
        QVERIFY(run.logged("val_loss"));
        QVERIFY(run.logged("Available metrics are: loss"));
    }

    // ---- TerminateOnNaN -------------------------------------------------------------------------
    void terminateOnNaN_data() {
        QTest::addColumn<double>("loss");
        QTest::addColumn<bool>("stops");
        QTest::newRow("finite") << 0.5 << false;
        QTest::newRow("nan") << std::numeric_limits<double>::quiet_NaN() << true;
        QTest::newRow("inf") << std::numeric_limits<double>::infinity() << true;
        QTest::newRow("-inf") << -std::numeric_limits<double>::infinity() << true;
    }

    void terminateOnNaN() {
        QFETCH(double, loss);
        QFETCH(bool, stops);
        CallbackConfig cfg;
        cfg.type = "terminate_on_nan";
        auto cb = makeCallback(cfg);
        FakeRun run;
        cb->onTrainBegin(run.c);
        cb->onBatchEnd(6, {{"loss", 0.7}}, run.c);
        cb->onBatchEnd(7, {{"accuracy", 0.7}}, run.c);  // no loss: nothing to check
        QVERIFY(!run.c.stopTraining);
        cb->onBatchEnd(8, {{"loss", loss}}, run.c);
        QCOMPARE(run.c.stopTraining, stops);
        if (stops) {
            QCOMPARE(run.c.stopReason, std::string("Batch 8: Invalid loss, terminating training"));
            QVERIFY(run.logged("Invalid loss"));
        }
    }

    // ---- validation -----------------------------------------------------------------------------
    void invalidOptimizer_data() {
        QTest::addColumn<OptimizerConfig>("cfg");
        QTest::addColumn<QString>("message");
        auto row = [](const char* name, OptimizerConfig c, const char* msg) {
            QTest::newRow(name) << c << QString(msg);
        };
        OptimizerConfig c;
        c.name = "adagrad";
        row("unknown", c, "optimizer.name: unknown optimizer 'adagrad' (expected sgd, adam");
        c = {};
        c.learningRate = 0;
        row("lr_zero", c, "optimizer.learning_rate: expected a value > 0, got 0");
        c.learningRate = -1;
        row("lr_negative", c, "optimizer.learning_rate: expected a value > 0, got -1");
        c.learningRate = std::numeric_limits<double>::quiet_NaN();
        row("lr_nan", c, "optimizer.learning_rate");
        c = {};
        c.beta1 = 1.5;
        row("beta_1", c, "optimizer.beta_1: expected a value in [0, 1), got 1.5");
        c = {};
        c.beta2 = 1.0;
        row("beta_2", c, "optimizer.beta_2: expected a value in [0, 1), got 1");
        c = {};
        c.name = "adamw";
        c.epsilon = -1e-7;
        row("epsilon", c, "optimizer.epsilon: expected a value >= 0, got -1e-07");
        c = {};
        c.weightDecay = -0.1;
        row("weight_decay", c, "optimizer.weight_decay: expected a value >= 0, got -0.1");
        c = sgdConfig(0.01);
        c.momentum = 1.5;
        row("sgd_momentum", c, "optimizer.momentum: expected a value in [0, 1], got 1.5");
        c = sgdConfig(0.01);
        c.momentum = -0.1;
        row("sgd_momentum_negative", c, "optimizer.momentum: expected a value in [0, 1]");
        c = {};
        c.name = "rmsprop";
        c.rho = 1.0;
        row("rho", c, "optimizer.rho: expected a value in [0, 1), got 1");
        c.rho = 0.9;
        c.momentum = 2;
        row("rmsprop_momentum", c, "optimizer.momentum");
        c = {};
        c.clipnorm = 1;
        c.globalClipnorm = 1;
        row("clipnorm_and_global", c,
            "optimizer.global_clipnorm: only one of clipnorm, clipvalue and global_clipnorm");
        c = {};
        c.clipnorm = 1;
        c.clipvalue = 1;
        row("clipnorm_and_clipvalue", c, "optimizer.clipvalue: only one of");
        c = {};
        c.clipnorm = -1;
        row("clipnorm_negative", c, "optimizer.clipnorm: expected a value > 0, got -1");
        c = {};
        c.clipvalue = 0;
        row("clipvalue_zero", c, "optimizer.clipvalue: expected a value > 0, got 0");
        c = {};
        c.schedule.type = "polynomial";
        row("schedule_type", c, "optimizer.schedule.type: unknown schedule 'polynomial'");
        c = {};
        c.schedule.type = "exponential_decay";
        c.schedule.decaySteps = 0;
        row("exp_decay_steps", c, "optimizer.schedule.decay_steps: expected a value > 0, got 0");
        c.schedule.decaySteps = 10;
        c.schedule.decayRate = 0;
        row("exp_decay_rate", c, "optimizer.schedule.decay_rate: expected a value > 0, got 0");
        c = {};
        c.schedule.type = "cosine_decay";
        c.schedule.decaySteps = -5;
        row("cos_decay_steps", c, "optimizer.schedule.decay_steps: expected a value > 0, got -5");
        c.schedule.decaySteps = 5;
        c.schedule.alpha = 2;
        row("cos_alpha", c, "optimizer.schedule.alpha: expected a value in [0, 1], got 2");
        c.schedule.alpha = 0;
        c.schedule.warmupSteps = -1;
        c.schedule.warmupTarget = 0.1;
        row("cos_warmup_steps", c, "optimizer.schedule.warmup_steps: expected a value >= 0");
        c.schedule.warmupSteps = 10;
        c.schedule.warmupTarget = -0.1;
        row("cos_warmup_target", c, "optimizer.schedule.warmup_target: expected a value >= 0");
    }

    void invalidOptimizer() {
        QFETCH(OptimizerConfig, cfg);
        QFETCH(QString, message);
        auto r = Optimizer::create(cfg);
        QVERIFY(!r.ok());
        QVERIFY2(QString::fromStdString(r.error()).startsWith(message), r.error().c_str());
    }

    void validOptimizerVariants() {
        OptimizerConfig c;
        c.name = "Adam";  // Keras class names
        QVERIFY(Optimizer::create(c).ok());
        c.name = "RMSprop";
        QVERIFY(Optimizer::create(c).ok());
        QCOMPARE(QString(makeOptimizer(c)->name()), QString("rmsprop"));
        c = sgdConfig(0.01);
        c.beta1 = 5;  // fields of other optimizers are not checked
        c.momentum = 1.0;
        QVERIFY(Optimizer::create(c).ok());
        c = {};
        c.learningRate = 0;  // a warmup may start from 0
        c.schedule.type = "cosine_decay";
        c.schedule.warmupTarget = 0.01;
        c.schedule.warmupSteps = 100;
        QVERIFY(Optimizer::create(c).ok());
        c.schedule.warmupSteps = 0;
        QVERIFY(!Optimizer::create(c).ok());
    }

    void invalidCallback_data() {
        QTest::addColumn<CallbackConfig>("cfg");
        QTest::addColumn<QString>("message");
        CallbackConfig c;
        c.type = "model_checkpoint";
        QTest::newRow("unknown") << c
                                 << "callback.type: unknown callback 'model_checkpoint' (expected "
                                    "early_stopping, reduce_lr_on_plateau or terminate_on_nan)";
        c = reduceLr(1, 2.0);
        QTest::newRow("factor_ge_1")
            << c << "ReduceLROnPlateau.factor: expected a value < 1, got 2";
        c = reduceLr(1, -0.5);
        QTest::newRow("factor_negative")
            << c << "ReduceLROnPlateau.factor: expected a value >= 0, got -0.5";
        c = reduceLr(-1, 0.5);
        QTest::newRow("rlr_patience")
            << c << "ReduceLROnPlateau.patience: expected a value >= 0, got -1";
        c = reduceLr(1, 0.5);
        c.cooldown = -2;
        QTest::newRow("cooldown") << c
                                  << "ReduceLROnPlateau.cooldown: expected a value >= 0, got -2";
        c = reduceLr(1, 0.5);
        c.minLr = -1e-3;
        QTest::newRow("min_lr") << c << "ReduceLROnPlateau.min_lr: expected a value >= 0";
        c = reduceLr(1, 0.5);
        c.mode = "up";
        QTest::newRow("rlr_mode") << c << "ReduceLROnPlateau.mode: expected auto, min or max";
        c = earlyStopping("val_loss", -3);
        QTest::newRow("es_patience")
            << c << "EarlyStopping.patience: expected a value >= 0, got -3";
        c = earlyStopping("", 1);
        QTest::newRow("es_monitor") << c << "EarlyStopping.monitor";
        c = earlyStopping("val_loss", 1);
        c.mode = "maximum";
        QTest::newRow("es_mode") << c
                                 << "EarlyStopping.mode: expected auto, min or max, got "
                                    "'maximum'";
        c = earlyStopping("val_loss", 1);
        c.startFromEpoch = -1;
        QTest::newRow("es_start") << c << "EarlyStopping.start_from_epoch: expected a value >= 0";
        c = earlyStopping("val_loss", 1);
        c.minDelta = std::numeric_limits<double>::infinity();
        QTest::newRow("es_min_delta") << c << "EarlyStopping.min_delta";
    }

    void invalidCallback() {
        QFETCH(CallbackConfig, cfg);
        QFETCH(QString, message);
        auto r = Callback::create(cfg);
        QVERIFY(!r.ok());
        QVERIFY2(QString::fromStdString(r.error()).startsWith(message), r.error().c_str());
    }

    void validCallbackNames() {
        CallbackConfig c;
        for (const char* t : {"early_stopping", "EarlyStopping", "reduce_lr_on_plateau",
                              "ReduceLROnPlateau", "terminate_on_nan", "TerminateOnNaN"}) {
            c.type = t;
            QVERIFY2(Callback::create(c).ok(), t);
        }
    }

    // ---- the update inside a compiled step
    // --------------------------------------------------------- A training program that ends with
    // the update instruction (device slots, the scalars of Optimizer::nextStep) gives, bit for bit,
    // the weights and slots Optimizer::apply computes on the host from the same gradients, for
    // every optimizer and clipping mode.
    void programUpdateMatchesApply_data() {
        QTest::addColumn<OptimizerConfig>("cfg");
        std::vector<std::pair<std::string, OptimizerConfig>> kinds;
        OptimizerConfig c = sgdConfig(0.05);
        kinds.emplace_back("sgd", c);
        c.momentum = 0.9;
        kinds.emplace_back("sgd_momentum", c);
        c.nesterov = true;
        kinds.emplace_back("sgd_nesterov", c);
        c = OptimizerConfig{};
        c.name = "adam";
        c.learningRate = 0.01;
        kinds.emplace_back("adam", c);
        c.amsgrad = true;
        kinds.emplace_back("adam_amsgrad", c);
        c = OptimizerConfig{};
        c.name = "adamw";
        c.learningRate = 0.01;
        c.weightDecay = 0.004;
        kinds.emplace_back("adamw", c);
        c = OptimizerConfig{};
        c.name = "rmsprop";
        c.learningRate = 0.001;
        kinds.emplace_back("rmsprop", c);
        c.centered = true;
        kinds.emplace_back("rmsprop_centered", c);
        c.centered = false;
        c.momentum = 0.9;
        kinds.emplace_back("rmsprop_momentum", c);
        c.centered = true;
        c.weightDecay = 0.01;
        c.schedule.type = "exponential_decay";
        c.schedule.decaySteps = 2;
        c.schedule.decayRate = 0.5;
        kinds.emplace_back("rmsprop_centered_momentum_wd_schedule", c);
        for (const auto& [name, cfg] : kinds) {
            for (const char* clip : {"", "clipvalue", "clipnorm", "global_clipnorm"}) {
                OptimizerConfig k = cfg;
                const std::string row = name + (*clip ? std::string("_") + clip : "");
                if (std::string(clip) == "clipvalue") k.clipvalue = 0.1;
                if (std::string(clip) == "clipnorm") k.clipnorm = 0.7;
                if (std::string(clip) == "global_clipnorm") k.globalClipnorm = 1.3;
                QTest::newRow(row.c_str()) << k;
            }
        }
    }

    void programUpdateMatchesApply() {
        QFETCH(OptimizerConfig, cfg);
        // A dense layer whose kernel (300 x 128) is above the threaded-update threshold.
        auto graph = td::parseGraph(
            "graph t {\n"
            " %0 = input() : f32[8,300]\n"
            " %1 = param() {name=w} : f32[300,128]\n"
            " %2 = param() {name=b} : f32[128]\n"
            " %3 = matmul(%0, %1) {trans_a=0, trans_b=0} : f32[8,128]\n"
            " %4 = bias_add(%3, %2) : f32[8,128]\n"
            " %5 = label() : f32[8,128]\n"
            " %6 = loss(%4, %5) {loss=mse, scale=0.125} : f32[1]\n"
            " output loss = %6\n"
            "}\n");
        QVERIFY(graph.ok());
        QVERIFY(td::autodiff(*graph).ok());
        auto device = makeOptimizer(cfg);  // runs inside the program
        auto host = makeOptimizer(cfg);    // Optimizer::apply on host arrays
        const UpdateSpec spec = device->spec();
        tdtest::HarnessOptions withUpdate;
        withUpdate.update = &spec;
        tdtest::Harness prog, grads;  // the same step with the update, and without
        std::string error;
        QVERIFY2(prog.compile(*graph, {}, &error, withUpdate), error.c_str());
        QVERIFY2(grads.compile(*graph, {}, &error), error.c_str());

        std::mt19937 rng(99);
        std::uniform_real_distribution<float> uni(-1.0f, 1.0f);
        Params ref;
        for (size_t i = 0; i < prog.params.size(); ++i) {
            const size_t n = prog.params[i].bytes / sizeof(float);
            for (size_t j = 0; j < n; ++j) prog.param(i)[j] = uni(rng);
            ref.w.emplace_back(prog.param(i), prog.param(i) + n);
            ref.g.emplace_back(n);
        }
        host->build(ref.sizes());
        for (int step = 1; step <= 4; ++step) {
            for (int j = 0; j < 8 * 300; ++j) prog.in()[j] = grads.in()[j] = uni(rng);
            for (int j = 0; j < 8 * 128; ++j)
                static_cast<float*>(prog.lab())[j] = static_cast<float*>(grads.lab())[j] =
                    3 * uni(rng);
            // The gradients at the current weights, then the host update with them.
            for (size_t i = 0; i < ref.w.size(); ++i)
                std::copy(ref.w[i].begin(), ref.w[i].end(), grads.param(i));
            grads.run(step);
            for (size_t i = 0; i < ref.g.size(); ++i)
                std::copy_n(grads.grad(i), ref.g[i].size(), ref.g[i].data());
            auto refs = ref.refs();
            host->apply(refs);
            // The compiled step: forward, backward and the update.
            prog.run(step, 0, device->nextStep());
            QCOMPARE(device->iterations(), host->iterations());
            for (size_t i = 0; i < ref.w.size(); ++i)
                QVERIFY2(std::memcmp(prog.param(i), ref.w[i].data(),
                                     ref.w[i].size() * sizeof(float)) == 0,
                         qPrintable(QString("step %1, param %2").arg(step).arg(i)));
        }
        const std::vector<Tensor*> hostSlots = host->slotTensors();
        QCOMPARE(hostSlots.size(), prog.optimizerSlots.size());
        for (size_t k = 0; k < hostSlots.size(); ++k)
            QVERIFY(std::memcmp(prog.optimizerSlots[k].ptr, hostSlots[k]->raw(),
                                hostSlots[k]->bytes()) == 0);
        // Clipping really clipped: the gradients exceed every threshold used above.
        double sq = 0;
        for (float x : ref.g[0]) sq += double(x) * x;
        QVERIFY(std::sqrt(sq) > 1.3);
    }

    // ---- performance (reported, not asserted) ---------------------------------------------------
    void adamApplyTiming() {
        // The seed model: Dense(784 -> 128) and Dense(128 -> 10), 101,770 parameters.
        Params p;
        for (size_t n : {size_t{784 * 128}, size_t{128}, size_t{128 * 10}, size_t{10}}) {
            p.w.emplace_back(n, 0.01f);
            p.g.emplace_back(n);
        }
        std::mt19937 rng(5);
        std::uniform_real_distribution<float> uni(-1.0f, 1.0f);
        for (auto& g : p.g)
            for (float& x : g) x = uni(rng);
        int64_t total = 0;
        for (auto s : p.sizes()) total += s;
        QCOMPARE(total, int64_t{101770});
        auto opt = makeOptimizer(OptimizerConfig{});
        opt->build(p.sizes());
        auto r = p.refs();
        for (int i = 0; i < 50; ++i) opt->apply(r);  // warm up caches and the thread team
        const int calls = 1000;
        const auto t0 = std::chrono::steady_clock::now();
        for (int i = 0; i < calls; ++i) opt->apply(r);
        const auto t1 = std::chrono::steady_clock::now();
        const double us = std::chrono::duration<double, std::micro>(t1 - t0).count() / calls;
        qInfo("Adam apply() over %lld params: %.2f us per call (average of %d calls)",
              static_cast<long long>(total), us, calls);
        QVERIFY(std::isfinite(p.w[0][0]));
    }
};

QTEST_APPLESS_MAIN(TestOptim)
#include "test_optim.moc"

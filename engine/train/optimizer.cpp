// Optimizers with Keras 3 semantics
// (keras/src/optimizers/{base_optimizer,sgd,adam,adamw,rmsprop}.py).
//
// One apply() is, per Keras' BaseOptimizer.apply():
//   1. lr = schedule(iterations) (or the override set by ReduceLROnPlateau);
//   2. clip the gradients: clipnorm (per tensor), global_clipnorm or clipvalue (one at most);
//   3. decoupled weight decay: w -= w * weight_decay * lr (when weight_decay > 0);
//   4. the optimizer's update_step for every parameter;
//   5. iterations += 1.
// Steps 2-4 are fused into one pass over each parameter: the clipping is a per-tensor scale and a
// clamp applied to the gradient as it is read, so apply() touches each array once and allocates
// nothing. Per-step scalars are computed once per step where Keras computes them: 1 - beta (a
// Python float) in double, rounded to float; Adam's bias correction in float32, from the betas
// cast to the variable dtype. Tensors of at least
// kParallelMinElements elements are split across the OpenMP threads; smaller ones run on the
// calling thread (a fork/join costs more than updating a few thousand floats).
//
// Adam and RMSprop need a square root per element. With the default -fmath-errno GCC cannot
// vectorise std::sqrt (it may set errno), so the kernels are written once as templates over the
// element type and instantiated for a SIMD register type (AVX-512, AVX or SSE: whatever the
// compiler targets) plus a scalar tail. Every operation is an IEEE single-precision operation,
// so the vector and scalar paths give the same results.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#if defined(__AVX512F__) || defined(__AVX__) || defined(__SSE2__)
#include <immintrin.h>
#endif

#include "engine/train/optim_common.h"
#include "engine/train/optimizer.h"

namespace td {
namespace {

using optim_detail::fmt;

constexpr int64_t kParallelMinElements = int64_t{1} << 15;
constexpr int64_t kChunkAlign = 16;  // 64 bytes of floats: threads never share a cache line

// Runs body(begin, end) over [0, n): split across the OpenMP team for large n, inline otherwise.
template <class Body>
inline void forRange(int64_t n, const Body& body) {
    if (n < kParallelMinElements || omp_get_max_threads() == 1 || omp_in_parallel()) {
        body(int64_t{0}, n);
        return;
    }
#pragma omp parallel
    {
        const int64_t threads = omp_get_num_threads();
        const int64_t t = omp_get_thread_num();
        int64_t chunk = (n + threads - 1) / threads;
        chunk = (chunk + kChunkAlign - 1) / kChunkAlign * kChunkAlign;
        const int64_t begin = std::min(n, t * chunk);
        const int64_t end = std::min(n, begin + chunk);
        if (begin < end) body(begin, end);
    }
}

double sumSquares(const float* g, int64_t n) {
    auto partial = [g](int64_t begin, int64_t end) {
        double acc = 0.0;
#pragma omp simd reduction(+ : acc)
        for (int64_t i = begin; i < end; ++i) acc += static_cast<double>(g[i]) * g[i];
        return acc;
    };
    if (n < kParallelMinElements || omp_get_max_threads() == 1 || omp_in_parallel()) {
        return partial(0, n);
    }
    double total = 0.0;
#pragma omp parallel reduction(+ : total)
    {
        const int64_t threads = omp_get_num_threads();
        const int64_t t = omp_get_thread_num();
        const int64_t chunk = (n + threads - 1) / threads;
        const int64_t begin = std::min(n, t * chunk);
        const int64_t end = std::min(n, begin + chunk);
        total += partial(begin, end);
    }
    return total;
}

// ---- element-type layer: float, and one SIMD register of floats where available -----------------

#if defined(__AVX512F__)
using VecF = float __attribute__((vector_size(64)));
inline VecF vsqrt(VecF x) {
    return reinterpret_cast<VecF>(_mm512_mask_sqrt_ps(
        reinterpret_cast<__m512>(x), static_cast<__mmask16>(0xFFFF), reinterpret_cast<__m512>(x)));
}
#define TD_OPTIM_SIMD 1
#elif defined(__AVX__)
using VecF = float __attribute__((vector_size(32)));
inline VecF vsqrt(VecF x) {
    return reinterpret_cast<VecF>(_mm256_sqrt_ps(reinterpret_cast<__m256>(x)));
}
#define TD_OPTIM_SIMD 1
#elif defined(__SSE2__)
using VecF = float __attribute__((vector_size(16)));
inline VecF vsqrt(VecF x) {
    return reinterpret_cast<VecF>(_mm_sqrt_ps(reinterpret_cast<__m128>(x)));
}
#define TD_OPTIM_SIMD 1
#else
#define TD_OPTIM_SIMD 0
#endif

template <class T>
struct Lane;

template <>
struct Lane<float> {
    static constexpr int64_t kWidth = 1;
    static float load(const float* p) { return *p; }
    static void store(float* p, float v) { *p = v; }
    static float splat(float x) { return x; }
    static float sqrt(float x) { return std::sqrt(x); }
    static float max(float a, float b) { return a < b ? b : a; }  // std::max(a, b)
    static float min(float a, float b) { return b < a ? b : a; }  // std::min(a, b)
};

#if TD_OPTIM_SIMD
template <>
struct Lane<VecF> {
    static constexpr int64_t kWidth = sizeof(VecF) / sizeof(float);
    static VecF load(const float* p) {
        VecF v;
        std::memcpy(&v, p, sizeof v);
        return v;
    }
    static void store(float* p, VecF v) { std::memcpy(p, &v, sizeof v); }
    static VecF splat(float x) { return VecF{} + x; }  // broadcast
    static VecF sqrt(VecF x) { return vsqrt(x); }
    static VecF max(VecF a, VecF b) { return a < b ? b : a; }
    static VecF min(VecF a, VecF b) { return b < a ? b : a; }
};
#endif

// Runs step<T>(i) over [begin, end): full SIMD registers first, then the scalar tail.
template <class Step>
inline void forElements(int64_t begin, int64_t end, const Step& step) {
    int64_t i = begin;
#if TD_OPTIM_SIMD
    constexpr int64_t w = Lane<VecF>::kWidth;
    for (; i + w <= end; i += w) step.template operator()<VecF>(i);
#endif
    for (; i < end; ++i) step.template operator()<float>(i);
}

// The gradient as the update sees it: scaled by the norm clipping, then clamped by clipvalue
// (clip = +inf when off). NaN passes through both, as in Keras.
template <class T>
inline T clippedGradT(const float* grad, int64_t i, float scale, float clip) {
    using L = Lane<T>;
    return L::min(L::max(L::load(grad + i) * L::splat(scale), L::splat(-clip)), L::splat(clip));
}

// Per-step values shared by every parameter of one apply().
struct StepScalars {
    float lr = 0;
    float wdLr = 0;      // weight_decay * lr
    bool decay = false;  // weight_decay > 0
    float clip = std::numeric_limits<float>::infinity();
};

class OptimizerBase : public Optimizer {
  public:
    OptimizerBase(const OptimizerConfig& cfg, std::unique_ptr<LearningRateSchedule> schedule)
        : cfg_(cfg), schedule_(std::move(schedule)) {}

    void build(const std::vector<int64_t>& paramSizes) override {
        sizes_ = paramSizes;
        slots_.clear();
        const int per = slotsPerParam();
        slots_.reserve(paramSizes.size() * static_cast<size_t>(per));
        for (int64_t size : paramSizes) {
            TD_ASSERT(size >= 0);
            for (int k = 0; k < per; ++k) slots_.emplace_back(DType::F32, Shape{size});
        }
        gradScale_.assign(paramSizes.size(), 1.0f);
        built_ = true;
    }

    void apply(std::span<const ParamRef> params) override {
        TD_ASSERT_MSG(built_, "Optimizer::apply() before build()");
        TD_ASSERT_MSG(params.size() == sizes_.size(), "Optimizer::apply(): parameter count");
        for (size_t i = 0; i < params.size(); ++i) {
            TD_ASSERT_MSG(params[i].size == sizes_[i], "Optimizer::apply(): parameter size");
        }
        const double lr = currentLearningRate();
        StepScalars s;
        s.lr = static_cast<float>(lr);
        s.decay = cfg_.weightDecay > 0;
        s.wdLr = static_cast<float>(cfg_.weightDecay * lr);
        if (cfg_.clipvalue) s.clip = static_cast<float>(*cfg_.clipvalue);
        computeGradScales(params);
        beginStep(lr);
        for (size_t i = 0; i < params.size(); ++i) {
            if (params[i].size > 0) update(i, params[i], gradScale_[i], s);
        }
        ++iterations_;
    }

    int64_t iterations() const override { return iterations_; }
    double currentLearningRate() const override {
        return override_ ? *override_ : schedule_->at(iterations_);
    }
    void setLearningRateOverride(double lr) override { override_ = lr; }
    std::vector<Tensor*> slotTensors() override {
        std::vector<Tensor*> out;
        out.reserve(slots_.size());
        for (Tensor& t : slots_) out.push_back(&t);
        return out;
    }
    void setIterations(int64_t it) override {
        TD_ASSERT(it >= 0);
        iterations_ = it;
    }

  protected:
    virtual int slotsPerParam() const = 0;
    // Per-step scalars that depend on lr and iterations (bias corrections, ...).
    virtual void beginStep(double /*lr*/) {}
    virtual void update(size_t index, const ParamRef& p, float gradScale, const StepScalars& s) = 0;

    float* slot(size_t param, int k) {
        return slots_[param * static_cast<size_t>(slotsPerParam()) + static_cast<size_t>(k)]
            .data<float>();
    }

    OptimizerConfig cfg_;
    int64_t iterations_ = 0;

  private:
    // Keras BaseOptimizer._clip_gradients: clipnorm scales each tensor by
    // clipnorm / max(||g||, clipnorm); global_clipnorm scales all of them by
    // min(1, global_clipnorm / ||all g||) (NaN when that norm is not finite).
    void computeGradScales(std::span<const ParamRef> params) {
        if (cfg_.clipnorm) {
            const double c = *cfg_.clipnorm;
            for (size_t i = 0; i < params.size(); ++i) {
                const double norm = std::sqrt(sumSquares(params[i].grad, params[i].size));
                gradScale_[i] = static_cast<float>(c / std::max(norm, c));
            }
        } else if (cfg_.globalClipnorm) {
            const double c = *cfg_.globalClipnorm;
            double total = 0.0;
            for (const ParamRef& p : params) total += sumSquares(p.grad, p.size);
            const double norm = std::sqrt(total);
            float scale = 1.0f;
            if (!std::isfinite(norm)) {
                scale = std::numeric_limits<float>::quiet_NaN();
            } else if (norm > c) {
                scale = static_cast<float>(c / norm);
            }
            std::fill(gradScale_.begin(), gradScale_.end(), scale);
        }
    }

    std::unique_ptr<LearningRateSchedule> schedule_;
    std::optional<double> override_;
    std::vector<int64_t> sizes_;
    std::vector<Tensor> slots_;  // slotsPerParam() per parameter, parameter-major
    std::vector<float> gradScale_;
    bool built_ = false;
};

// ---- SGD ----------------------------------------------------------------------------------------
// Keras 3: m = momentum * m - lr * g; w += m (nesterov: w += momentum * m - lr * g);
// without momentum w -= lr * g. Slots: momentum per parameter (only when momentum != 0).
class Sgd final : public OptimizerBase {
  public:
    using OptimizerBase::OptimizerBase;
    const char* name() const override { return "sgd"; }

  protected:
    int slotsPerParam() const override { return cfg_.momentum != 0 ? 1 : 0; }

    void update(size_t index, const ParamRef& p, float gs, const StepScalars& s) override {
        if (cfg_.momentum == 0) {
            run<0>(index, p, gs, s);
        } else if (!cfg_.nesterov) {
            run<1>(index, p, gs, s);
        } else {
            run<2>(index, p, gs, s);
        }
    }

  private:
    template <int kMode>  // 0: plain, 1: momentum, 2: nesterov momentum
    void run(size_t index, const ParamRef& p, float gs, const StepScalars& s) {
        float* w = p.value;
        const float* grad = p.grad;
        float* m = kMode ? slot(index, 0) : nullptr;
        const float lr = s.lr, clip = s.clip, wdLr = s.wdLr;
        const bool decay = s.decay;
        const float mom = static_cast<float>(cfg_.momentum);
        forRange(p.size, [=](int64_t b, int64_t e) {
            forElements(b, e, [=]<class T>(int64_t i) {
                using L = Lane<T>;
                const T g = clippedGradT<T>(grad, i, gs, clip);
                T wi = L::load(w + i);
                if (decay) wi = wi - wi * L::splat(wdLr);
                if constexpr (kMode == 0) {
                    L::store(w + i, wi - g * L::splat(lr));
                } else {
                    const T mi = L::load(m + i) * L::splat(mom) - g * L::splat(lr);
                    L::store(m + i, mi);
                    if constexpr (kMode == 2) {
                        L::store(w + i, wi + (mi * L::splat(mom) - g * L::splat(lr)));
                    } else {
                        L::store(w + i, wi + mi);
                    }
                }
            });
        });
    }
};

// ---- Adam / AdamW -------------------------------------------------------------------------------
// Keras 3: t = iterations + 1; alpha = lr * sqrt(1 - beta_2^t) / (1 - beta_1^t) (in float32);
// m += (g - m) * (1 - beta_1); v += (g^2 - v) * (1 - beta_2); amsgrad: vhat = max(vhat, v), v =
// vhat; w -= alpha * m / (sqrt(v) + epsilon). AdamW is the same update with the base optimizer's
// decoupled weight decay (w -= w * weight_decay * lr first). Slots per parameter: m, v[, vhat].
class Adam final : public OptimizerBase {
  public:
    Adam(const OptimizerConfig& cfg, std::unique_ptr<LearningRateSchedule> schedule, bool adamw)
        : OptimizerBase(cfg, std::move(schedule)), adamw_(adamw) {}
    const char* name() const override { return adamw_ ? "adamw" : "adam"; }

  protected:
    int slotsPerParam() const override { return cfg_.amsgrad ? 3 : 2; }

    void beginStep(double lr) override {
        // In float32, as Keras computes it in the variable dtype: 1 - beta_2^t cancels most of
        // its digits on the first steps, so the float rounding of beta_2 (0.999f = 0.99900001)
        // and of its power moves alpha by up to 1e-5 relative, and the weights with it.
        const float t = static_cast<float>(iterations_ + 1);
        const float b1Power = std::pow(static_cast<float>(cfg_.beta1), t);
        const float b2Power = std::pow(static_cast<float>(cfg_.beta2), t);
        alpha_ = static_cast<float>(lr) * std::sqrt(1.0f - b2Power) / (1.0f - b1Power);
    }

    void update(size_t index, const ParamRef& p, float gs, const StepScalars& s) override {
        if (cfg_.amsgrad) {
            run<true>(index, p, gs, s);
        } else {
            run<false>(index, p, gs, s);
        }
    }

  private:
    template <bool kAmsgrad>
    void run(size_t index, const ParamRef& p, float gs, const StepScalars& s) {
        float* w = p.value;
        const float* grad = p.grad;
        float* m = slot(index, 0);
        float* v = slot(index, 1);
        float* vhat = kAmsgrad ? slot(index, 2) : nullptr;
        const float clip = s.clip, wdLr = s.wdLr, alpha = alpha_;
        const bool decay = s.decay;
        const float oneMinusB1 = static_cast<float>(1.0 - cfg_.beta1);
        const float oneMinusB2 = static_cast<float>(1.0 - cfg_.beta2);
        const float eps = static_cast<float>(cfg_.epsilon);
        forRange(p.size, [=](int64_t b, int64_t e) {
            forElements(b, e, [=]<class T>(int64_t i) {
                using L = Lane<T>;
                const T g = clippedGradT<T>(grad, i, gs, clip);
                T wi = L::load(w + i);
                if (decay) wi = wi - wi * L::splat(wdLr);
                const T m0 = L::load(m + i), v0 = L::load(v + i);
                const T mi = m0 + (g - m0) * L::splat(oneMinusB1);
                const T vi = v0 + (g * g - v0) * L::splat(oneMinusB2);
                L::store(m + i, mi);
                L::store(v + i, vi);
                T denomV = vi;
                if constexpr (kAmsgrad) {
                    denomV = L::max(vi, L::load(vhat + i));
                    L::store(vhat + i, denomV);
                }
                L::store(w + i, wi - (mi * L::splat(alpha)) / (L::sqrt(denomV) + L::splat(eps)));
            });
        });
    }

    bool adamw_;
    float alpha_ = 0;
};

// ---- RMSprop ------------------------------------------------------------------------------------
// Keras 3: v = rho * v + (1 - rho) * g^2; centered: mg = rho * mg + (1 - rho) * g,
// denom = v - mg^2 + epsilon, else denom = v + epsilon; increment = lr * g / sqrt(denom);
// momentum > 0: m = momentum * m + increment, w -= m; else w -= increment.
// Slots per parameter: velocity[, momentum][, average_gradient].
class RmsProp final : public OptimizerBase {
  public:
    using OptimizerBase::OptimizerBase;
    const char* name() const override { return "rmsprop"; }

  protected:
    int slotsPerParam() const override {
        return 1 + (cfg_.momentum > 0 ? 1 : 0) + (cfg_.centered ? 1 : 0);
    }

    void update(size_t index, const ParamRef& p, float gs, const StepScalars& s) override {
        const bool hasMomentum = cfg_.momentum > 0;
        float* mom = hasMomentum ? slot(index, 1) : nullptr;
        float* avg = cfg_.centered ? slot(index, hasMomentum ? 2 : 1) : nullptr;
        if (cfg_.centered) {
            if (hasMomentum)
                run<true, true>(p, slot(index, 0), mom, avg, gs, s);
            else
                run<true, false>(p, slot(index, 0), mom, avg, gs, s);
        } else {
            if (hasMomentum)
                run<false, true>(p, slot(index, 0), mom, avg, gs, s);
            else
                run<false, false>(p, slot(index, 0), mom, avg, gs, s);
        }
    }

  private:
    template <bool kCentered, bool kMomentum>
    void run(const ParamRef& p, float* vel, float* mom, float* avg, float gs,
             const StepScalars& s) {
        float* w = p.value;
        const float* grad = p.grad;
        const float lr = s.lr, clip = s.clip, wdLr = s.wdLr;
        const bool decay = s.decay;
        const float rho = static_cast<float>(cfg_.rho);
        const float oneMinusRho = static_cast<float>(1.0 - cfg_.rho);
        const float eps = static_cast<float>(cfg_.epsilon);
        const float momentum = static_cast<float>(cfg_.momentum);
        forRange(p.size, [=](int64_t b, int64_t e) {
            forElements(b, e, [=]<class T>(int64_t i) {
                using L = Lane<T>;
                const T g = clippedGradT<T>(grad, i, gs, clip);
                T wi = L::load(w + i);
                if (decay) wi = wi - wi * L::splat(wdLr);
                const T vi = L::splat(rho) * L::load(vel + i) + L::splat(oneMinusRho) * (g * g);
                L::store(vel + i, vi);
                T denom;
                if constexpr (kCentered) {
                    const T ai = L::splat(rho) * L::load(avg + i) + L::splat(oneMinusRho) * g;
                    L::store(avg + i, ai);
                    denom = vi - ai * ai + L::splat(eps);
                } else {
                    denom = vi + L::splat(eps);
                }
                const T increment = (L::splat(lr) * g) / L::sqrt(denom);
                if constexpr (kMomentum) {
                    const T mi = L::splat(momentum) * L::load(mom + i) + increment;
                    L::store(mom + i, mi);
                    L::store(w + i, wi - mi);
                } else {
                    L::store(w + i, wi - increment);
                }
            });
        });
    }
};

// ---- validation ---------------------------------------------------------------------------------

Status checkInUnitInterval(const char* field, double v, bool includeOne) {
    if (v >= 0 && (includeOne ? v <= 1 : v < 1)) return Status::success();
    return err(std::string("optimizer.") + field + ": expected a value in [0, 1" +
               (includeOne ? "]" : ")") + ", got " + fmt(v));
}

Status checkNonNegative(const char* field, double v) {
    if (v >= 0 && std::isfinite(v)) return Status::success();
    return err(std::string("optimizer.") + field + ": expected a value >= 0, got " + fmt(v));
}

Status checkClip(const char* field, const std::optional<double>& v) {
    if (!v || *v > 0) return Status::success();
    return err(std::string("optimizer.") + field + ": expected a value > 0, got " + fmt(*v));
}

}  // namespace

Result<std::unique_ptr<Optimizer>> Optimizer::create(const OptimizerConfig& cfg) {
    const std::string kind = squashName(cfg.name);
    if (kind != "sgd" && kind != "adam" && kind != "adamw" && kind != "rmsprop") {
        return err("optimizer.name: unknown optimizer '" + cfg.name +
                   "' (expected sgd, adam, adamw or rmsprop)");
    }
    TD_ASSIGN_OR_RETURN(auto schedule,
                        LearningRateSchedule::create(cfg.learningRate, cfg.schedule));
    TD_RETURN_IF_ERROR(checkNonNegative("weight_decay", cfg.weightDecay));
    TD_RETURN_IF_ERROR(checkClip("clipnorm", cfg.clipnorm));
    TD_RETURN_IF_ERROR(checkClip("global_clipnorm", cfg.globalClipnorm));
    TD_RETURN_IF_ERROR(checkClip("clipvalue", cfg.clipvalue));
    // Keras: "Only one of `clipnorm`, `clipvalue` and `global_clipnorm` can be set."
    {
        std::vector<std::string> set;
        if (cfg.clipnorm) set.push_back("clipnorm");
        if (cfg.globalClipnorm) set.push_back("global_clipnorm");
        if (cfg.clipvalue) set.push_back("clipvalue");
        if (set.size() > 1) {
            return err("optimizer." + set[1] + ": only one of clipnorm, clipvalue and " +
                       "global_clipnorm can be set (" + set[0] + " is set too)");
        }
    }

    if (kind == "sgd") {
        TD_RETURN_IF_ERROR(checkInUnitInterval("momentum", cfg.momentum, true));
        return std::unique_ptr<Optimizer>(new Sgd(cfg, std::move(schedule)));
    }
    if (kind == "adam" || kind == "adamw") {
        TD_RETURN_IF_ERROR(checkInUnitInterval("beta_1", cfg.beta1, false));
        TD_RETURN_IF_ERROR(checkInUnitInterval("beta_2", cfg.beta2, false));
        TD_RETURN_IF_ERROR(checkNonNegative("epsilon", cfg.epsilon));
        return std::unique_ptr<Optimizer>(new Adam(cfg, std::move(schedule), kind == "adamw"));
    }
    TD_RETURN_IF_ERROR(checkInUnitInterval("rho", cfg.rho, false));
    TD_RETURN_IF_ERROR(checkInUnitInterval("momentum", cfg.momentum, true));
    TD_RETURN_IF_ERROR(checkNonNegative("epsilon", cfg.epsilon));
    return std::unique_ptr<Optimizer>(new RmsProp(cfg, std::move(schedule)));
}

}  // namespace td

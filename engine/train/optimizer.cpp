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
// The element loops live in optim_kernels_impl.h, compiled once per instruction-set level and
// chosen at run time (optim_kernels.h); this file splits each parameter across the threads and
// calls the active level's loop on each part.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "engine/train/optim_common.h"
#include "engine/train/optim_kernels.h"
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

    static optim_kernels::Operands operands(const ParamRef& p, float gradScale,
                                            const StepScalars& s) {
        optim_kernels::Operands o;
        o.w = p.value;
        o.grad = p.grad;
        o.gradScale = gradScale;
        o.clip = s.clip;
        o.decay = s.decay;
        o.wdLr = s.wdLr;
        return o;
    }

    float* slot(size_t param, int k) {
        return slots_[param * static_cast<size_t>(slotsPerParam()) + static_cast<size_t>(k)]
            .data<float>();
    }

    OptimizerConfig cfg_;
    int64_t iterations_ = 0;
    const optim_kernels::Table& kernels_ = optim_kernels::activeKernels();

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
        optim_kernels::SgdArgs a;
        a.p = operands(p, gs, s);
        a.mode = cfg_.momentum == 0 ? optim_kernels::SgdMode::Plain
                 : cfg_.nesterov    ? optim_kernels::SgdMode::Nesterov
                                    : optim_kernels::SgdMode::Momentum;
        a.m = cfg_.momentum != 0 ? slot(index, 0) : nullptr;
        a.lr = s.lr;
        a.momentum = static_cast<float>(cfg_.momentum);
        const auto kernel = kernels_.sgd;
        forRange(p.size, [&a, kernel](int64_t b, int64_t e) { kernel(a, b, e); });
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
        optim_kernels::AdamArgs a;
        a.p = operands(p, gs, s);
        a.m = slot(index, 0);
        a.v = slot(index, 1);
        a.vhat = cfg_.amsgrad ? slot(index, 2) : nullptr;
        a.alpha = alpha_;
        a.oneMinusB1 = static_cast<float>(1.0 - cfg_.beta1);
        a.oneMinusB2 = static_cast<float>(1.0 - cfg_.beta2);
        a.eps = static_cast<float>(cfg_.epsilon);
        const auto kernel = kernels_.adam;
        forRange(p.size, [&a, kernel](int64_t b, int64_t e) { kernel(a, b, e); });
    }

  private:
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
        optim_kernels::RmsPropArgs a;
        a.p = operands(p, gs, s);
        a.velocity = slot(index, 0);
        a.momentumSlot = hasMomentum ? slot(index, 1) : nullptr;
        a.averageGrad = cfg_.centered ? slot(index, hasMomentum ? 2 : 1) : nullptr;
        a.lr = s.lr;
        a.rho = static_cast<float>(cfg_.rho);
        a.oneMinusRho = static_cast<float>(1.0 - cfg_.rho);
        a.eps = static_cast<float>(cfg_.epsilon);
        a.momentum = static_cast<float>(cfg_.momentum);
        const auto kernel = kernels_.rmsprop;
        forRange(p.size, [&a, kernel](int64_t b, int64_t e) { kernel(a, b, e); });
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

namespace isa_generic {
const optim_kernels::Table& table();
}
#if defined(__x86_64__)
namespace isa_avx2 {
const optim_kernels::Table& table();
}
namespace isa_avx512 {
const optim_kernels::Table& table();
}
#endif

const optim_kernels::Table& optim_kernels::kernelsFor(CpuIsa isa) {
#if defined(__x86_64__)
    if (isa == CpuIsa::Avx512) return isa_avx512::table();
    if (isa == CpuIsa::Avx2) return isa_avx2::table();
#endif
    (void)isa;
    return isa_generic::table();
}

const optim_kernels::Table& optim_kernels::activeKernels() {
    static const Table& t = kernelsFor(activeCpuIsa().isa);
    return t;
}

}  // namespace td

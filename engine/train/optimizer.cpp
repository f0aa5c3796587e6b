// Optimizers with Keras 3 semantics
// (keras/src/optimizers/{base_optimizer,sgd,adam,adamw,rmsprop}.py): the configuration becomes an
// UpdateSpec, each step's scalars come from nextStep(), and the update itself is applyUpdate
// (update.cpp), which the CPU backend's update instruction runs too.
//
// One step is, per Keras' BaseOptimizer.apply():
//   1. lr = schedule(iterations) (or the override set by ReduceLROnPlateau);
//   2. clip the gradients, 3. decoupled weight decay, 4. update_step (applyUpdate);
//   5. iterations += 1.
// Per-step scalars are computed once per step where Keras computes them: 1 - beta (a Python
// float) in double, rounded to float; Adam's bias correction in float32, from the betas cast to
// the variable dtype.
#include "engine/train/optimizer.h"

#include <cmath>
#include <string>
#include <vector>

#include "engine/train/optim_common.h"

namespace td {
namespace {

using optim_detail::fmt;

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

Optimizer::Optimizer(const OptimizerConfig& cfg, const char* name, UpdateSpec spec,
                     std::unique_ptr<LearningRateSchedule> schedule)
    : cfg_(cfg), name_(name), spec_(spec), schedule_(std::move(schedule)) {}

double Optimizer::currentLearningRate() const {
    return override_ ? *override_ : schedule_->at(iterations_);
}

void Optimizer::setLearningRateOverride(double lr) {
    override_ = lr;
}

UpdateScalars Optimizer::nextStep() {
    const double lr = currentLearningRate();
    UpdateScalars s;
    s.lr = static_cast<float>(lr);
    s.wdLr = static_cast<float>(cfg_.weightDecay * lr);
    if (spec_.kind == UpdateKind::Adam) {
        // In float32, as Keras computes it in the variable dtype: 1 - beta_2^t cancels most of
        // its digits on the first steps, so the float rounding of beta_2 (0.999f = 0.99900001)
        // and of its power moves alpha by up to 1e-5 relative, and the weights with it.
        const float t = static_cast<float>(iterations_ + 1);
        const float b1Power = std::pow(static_cast<float>(cfg_.beta1), t);
        const float b2Power = std::pow(static_cast<float>(cfg_.beta2), t);
        s.alpha = static_cast<float>(lr) * std::sqrt(1.0f - b2Power) / (1.0f - b1Power);
    }
    ++iterations_;
    return s;
}

void Optimizer::build(const std::vector<int64_t>& paramSizes) {
    sizes_ = paramSizes;
    slots_.clear();
    const int per = spec_.slotsPerParam();
    slots_.reserve(paramSizes.size() * static_cast<size_t>(per));
    for (int64_t size : paramSizes) {
        TD_ASSERT(size >= 0);
        for (int k = 0; k < per; ++k) slots_.emplace_back(DType::F32, Shape{size});
    }
    tensors_.assign(paramSizes.size(), UpdateTensor{});
    built_ = true;
}

void Optimizer::apply(std::span<const ParamRef> params) {
    TD_ASSERT_MSG(built_, "Optimizer::apply() before build()");
    TD_ASSERT_MSG(params.size() == sizes_.size(), "Optimizer::apply(): parameter count");
    const size_t per = static_cast<size_t>(spec_.slotsPerParam());
    for (size_t i = 0; i < params.size(); ++i) {
        TD_ASSERT_MSG(params[i].size == sizes_[i], "Optimizer::apply(): parameter size");
        UpdateTensor& t = tensors_[i];
        t.value = params[i].value;
        t.grad = params[i].grad;
        t.size = params[i].size;
        // Looked up each step: a checkpoint restore may replace the slot tensors.
        for (size_t k = 0; k < per; ++k) t.slot[k] = slots_[i * per + k].data<float>();
    }
    applyUpdate(spec_, nextStep(), tensors_);
}

std::vector<Tensor*> Optimizer::slotTensors() {
    std::vector<Tensor*> out;
    out.reserve(slots_.size());
    for (Tensor& t : slots_) out.push_back(&t);
    return out;
}

void Optimizer::setIterations(int64_t it) {
    TD_ASSERT(it >= 0);
    iterations_ = it;
}

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

    UpdateSpec spec;
    spec.decay = cfg.weightDecay > 0;
    if (cfg.clipnorm) {
        spec.clip = ClipKind::Norm;
        spec.clipValue = *cfg.clipnorm;
    } else if (cfg.globalClipnorm) {
        spec.clip = ClipKind::GlobalNorm;
        spec.clipValue = *cfg.globalClipnorm;
    } else if (cfg.clipvalue) {
        spec.clip = ClipKind::Value;
        spec.clipValue = *cfg.clipvalue;
    }
    const char* name = nullptr;
    if (kind == "sgd") {
        TD_RETURN_IF_ERROR(checkInUnitInterval("momentum", cfg.momentum, true));
        name = "sgd";
        spec.kind = UpdateKind::Sgd;
        spec.momentum = static_cast<float>(cfg.momentum);
        spec.nesterov = cfg.nesterov;
    } else if (kind == "adam" || kind == "adamw") {
        TD_RETURN_IF_ERROR(checkInUnitInterval("beta_1", cfg.beta1, false));
        TD_RETURN_IF_ERROR(checkInUnitInterval("beta_2", cfg.beta2, false));
        TD_RETURN_IF_ERROR(checkNonNegative("epsilon", cfg.epsilon));
        // AdamW is Adam with the base optimizer's decoupled weight decay (its weight_decay).
        name = kind == "adamw" ? "adamw" : "adam";
        spec.kind = UpdateKind::Adam;
        // 1 - beta is a Python float in Keras: computed in double, then rounded to float.
        spec.oneMinusBeta1 = static_cast<float>(1.0 - cfg.beta1);
        spec.oneMinusBeta2 = static_cast<float>(1.0 - cfg.beta2);
        spec.amsgrad = cfg.amsgrad;
        spec.epsilon = static_cast<float>(cfg.epsilon);
    } else {
        TD_RETURN_IF_ERROR(checkInUnitInterval("rho", cfg.rho, false));
        TD_RETURN_IF_ERROR(checkInUnitInterval("momentum", cfg.momentum, true));
        TD_RETURN_IF_ERROR(checkNonNegative("epsilon", cfg.epsilon));
        name = "rmsprop";
        spec.kind = UpdateKind::RmsProp;
        spec.rho = static_cast<float>(cfg.rho);
        spec.oneMinusRho = static_cast<float>(1.0 - cfg.rho);
        spec.momentum = static_cast<float>(cfg.momentum);
        spec.centered = cfg.centered;
        spec.epsilon = static_cast<float>(cfg.epsilon);
    }
    return std::unique_ptr<Optimizer>(new Optimizer(cfg, name, spec, std::move(schedule)));
}

}  // namespace td

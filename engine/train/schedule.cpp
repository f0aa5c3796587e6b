// Learning-rate schedules with Keras 3 semantics (keras/src/optimizers/schedules/
// learning_rate_schedule.py): constant, ExponentialDecay and CosineDecay with optional linear
// warmup. Each schedule is evaluated once per optimizer step, in double precision.
#include <algorithm>
#include <cmath>
#include <numbers>
#include <optional>

#include "engine/train/optim_common.h"
#include "engine/train/optimizer.h"

namespace td {
namespace {

class ConstantSchedule final : public LearningRateSchedule {
  public:
    explicit ConstantSchedule(double lr) : lr_(lr) {}
    double at(int64_t /*iterations*/) const override { return lr_; }

  private:
    double lr_;
};

// lr * decay_rate ^ (step / decay_steps); staircase floors the exponent.
class ExponentialDecaySchedule final : public LearningRateSchedule {
  public:
    ExponentialDecaySchedule(double lr, int64_t decaySteps, double decayRate, bool staircase)
        : lr_(lr),
          decaySteps_(static_cast<double>(decaySteps)),
          decayRate_(decayRate),
          staircase_(staircase) {}
    double at(int64_t iterations) const override {
        double p = static_cast<double>(iterations) / decaySteps_;
        if (staircase_) p = std::floor(p);
        return lr_ * std::pow(decayRate_, p);
    }

  private:
    double lr_, decaySteps_, decayRate_;
    bool staircase_;
};

// Keras 3 CosineDecay. Without a warmup target: cosine decay from the initial rate over decay_steps
// to alpha * initial. With one: linear warmup from the initial rate to the target over
// warmup_steps, then cosine decay from the target over decay_steps (to alpha * target).
class CosineDecaySchedule final : public LearningRateSchedule {
  public:
    CosineDecaySchedule(double lr, int64_t decaySteps, double alpha,
                        std::optional<double> warmupTarget, int64_t warmupSteps)
        : lr_(lr),
          decaySteps_(static_cast<double>(decaySteps)),
          alpha_(alpha),
          warmupTarget_(warmupTarget),
          warmupSteps_(static_cast<double>(warmupSteps)) {}

    double at(int64_t iterations) const override {
        double step = static_cast<double>(iterations);
        if (!warmupTarget_) return decay(std::min(step, decaySteps_), lr_);
        step = std::min(step, decaySteps_ + warmupSteps_);
        if (step < warmupSteps_) {
            return (*warmupTarget_ - lr_) * (step / warmupSteps_) + lr_;
        }
        return decay(step - warmupSteps_, *warmupTarget_);
    }

  private:
    double decay(double step, double from) const {
        double cosine = 0.5 * (1.0 + std::cos(std::numbers::pi * (step / decaySteps_)));
        return from * ((1.0 - alpha_) * cosine + alpha_);
    }

    double lr_, decaySteps_, alpha_;
    std::optional<double> warmupTarget_;
    double warmupSteps_;
};

}  // namespace

Result<std::unique_ptr<LearningRateSchedule>> LearningRateSchedule::create(
    double initialLearningRate, const ScheduleConfig& cfg) {
    const std::string type = squashName(cfg.type);
    const bool warmupFromZero =
        type == "cosinedecay" && cfg.warmupTarget && *cfg.warmupTarget > 0 && cfg.warmupSteps > 0;
    // A linear warmup may start from 0 (the usual Keras warmup); otherwise the rate must be > 0.
    if (warmupFromZero ? !(initialLearningRate >= 0 && std::isfinite(initialLearningRate))
                       : !(initialLearningRate > 0 && std::isfinite(initialLearningRate))) {
        return err("optimizer.learning_rate: expected a value " +
                   std::string(warmupFromZero ? ">= 0" : "> 0") + ", got " +
                   optim_detail::fmt(initialLearningRate));
    }

    if (type.empty() || type == "constant") {
        return std::unique_ptr<LearningRateSchedule>(new ConstantSchedule(initialLearningRate));
    }
    if (type == "exponentialdecay") {
        if (cfg.decaySteps <= 0) {
            return err("optimizer.schedule.decay_steps: expected a value > 0, got " +
                       std::to_string(cfg.decaySteps));
        }
        if (!(cfg.decayRate > 0) || !std::isfinite(cfg.decayRate)) {
            return err("optimizer.schedule.decay_rate: expected a value > 0, got " +
                       optim_detail::fmt(cfg.decayRate));
        }
        return std::unique_ptr<LearningRateSchedule>(new ExponentialDecaySchedule(
            initialLearningRate, cfg.decaySteps, cfg.decayRate, cfg.staircase));
    }
    if (type == "cosinedecay") {
        if (cfg.decaySteps <= 0) {
            return err("optimizer.schedule.decay_steps: expected a value > 0, got " +
                       std::to_string(cfg.decaySteps));
        }
        if (!(cfg.alpha >= 0 && cfg.alpha <= 1)) {
            return err("optimizer.schedule.alpha: expected a value in [0, 1], got " +
                       optim_detail::fmt(cfg.alpha));
        }
        if (cfg.warmupSteps < 0) {
            return err("optimizer.schedule.warmup_steps: expected a value >= 0, got " +
                       std::to_string(cfg.warmupSteps));
        }
        if (cfg.warmupTarget && !(*cfg.warmupTarget >= 0 && std::isfinite(*cfg.warmupTarget))) {
            return err("optimizer.schedule.warmup_target: expected a value >= 0, got " +
                       optim_detail::fmt(*cfg.warmupTarget));
        }
        return std::unique_ptr<LearningRateSchedule>(new CosineDecaySchedule(
            initialLearningRate, cfg.decaySteps, cfg.alpha, cfg.warmupTarget, cfg.warmupSteps));
    }
    return err("optimizer.schedule.type: unknown schedule '" + cfg.type +
               "' (expected constant, exponential_decay or cosine_decay)");
}

}  // namespace td

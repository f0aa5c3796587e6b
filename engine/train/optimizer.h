// Optimizers and learning-rate schedules with Keras semantics and defaults (shared REFERENCE.md).
// An optimizer is an UpdateSpec (update.h) plus the per-step scalars; the update itself runs in
// the compiled training step (or, on host arrays, in apply(), with slots allocated once in
// build()).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "engine/backend/cpu/update.h"
#include "engine/core/result.h"
#include "engine/core/tensor.h"
#include "engine/core/train_config.h"

namespace td {

class LearningRateSchedule {
  public:
    static Result<std::unique_ptr<LearningRateSchedule>> create(double initialLearningRate,
                                                                const ScheduleConfig& cfg);
    virtual ~LearningRateSchedule() = default;
    // Learning rate for the update that follows `iterations` completed updates (Keras' call(step)).
    virtual double at(int64_t iterations) const = 0;
};

struct ParamRef {
    float* value;  // length size
    float* grad;   // length size
    int64_t size;
};

// One optimizer with Keras semantics. A training step runs its update on the device, inside the
// compiled program: spec() says what the update is (fixed for the run), nextStep() gives the
// scalars of each step, computed on the host from the iteration count and the schedule. apply()
// runs the same update on host arrays, with slots of its own (build()).
class Optimizer {
  public:
    // Errors name the field, e.g. "optimizer.beta_1: expected a value in [0, 1), got 1.5".
    static Result<std::unique_ptr<Optimizer>> create(const OptimizerConfig& cfg);

    // The update as a device runs it (kind, betas, clipping, weight decay).
    UpdateSpec spec() const { return spec_; }
    // The scalars of the update about to run: the learning rate from the schedule at the current
    // iteration (or the override set by ReduceLROnPlateau), Adam's bias-corrected rate in float32
    // as Keras computes it, weight_decay * lr. Then iterations += 1.
    UpdateScalars nextStep();

    // Allocates host slots (spec().slotsPerParam() per parameter) for apply().
    void build(const std::vector<int64_t>& paramSizes);
    // One update of every parameter on host arrays (params.size() == number built): applyUpdate
    // (update.h) with nextStep()'s scalars.
    void apply(std::span<const ParamRef> params);

    int64_t iterations() const { return iterations_; }
    // Loss scaling skipped `n` steps on the device: they applied no update, so they do not
    // count (Keras' LossScaleOptimizer leaves the inner optimizer's iterations alone).
    void rewindIterations(int64_t n) { iterations_ = n > iterations_ ? 0 : iterations_ - n; }
    double currentLearningRate() const;       // rate the next step will use
    void setLearningRateOverride(double lr);  // replaces the schedule from now on
    // Checkpoints: the override in force (none: the schedule decides), and its restoration.
    std::optional<double> learningRateOverride() const { return override_; }
    void restoreLearningRateOverride(std::optional<double> lr) { override_ = lr; }

    // Host slot state for checkpoints: one tensor per slot array, parameter-major, plus
    // iterations.
    std::vector<Tensor*> slotTensors();
    void setIterations(int64_t it);
    const char* name() const { return name_; }

  private:
    Optimizer(const OptimizerConfig& cfg, const char* name, UpdateSpec spec,
              std::unique_ptr<LearningRateSchedule> schedule);

    OptimizerConfig cfg_;
    const char* name_;
    UpdateSpec spec_;
    std::unique_ptr<LearningRateSchedule> schedule_;
    std::optional<double> override_;
    int64_t iterations_ = 0;
    std::vector<int64_t> sizes_;
    std::vector<Tensor> slots_;  // spec_.slotsPerParam() per parameter, parameter-major
    std::vector<UpdateTensor> tensors_;
    bool built_ = false;
};

}  // namespace td

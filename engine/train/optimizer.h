// Optimizers and learning-rate schedules with Keras semantics and defaults (shared REFERENCE.md).
// An optimizer updates flat f32 parameter arrays in place from their gradients; slot memory is
// allocated once in build(), never in apply().
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "engine/core/result.h"
#include "engine/core/tensor.h"
#include "engine/train/train_config.h"

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
    float* grad;   // length size; clipping may modify it
    int64_t size;
};

class Optimizer {
  public:
    // Errors name the field, e.g. "optimizer.beta_1: expected a value in [0, 1), got 1.5".
    static Result<std::unique_ptr<Optimizer>> create(const OptimizerConfig& cfg);
    virtual ~Optimizer() = default;

    // Allocates slots for these parameter sizes. Call once before apply().
    virtual void build(const std::vector<int64_t>& paramSizes) = 0;
    // One update of every parameter (params.size() == number built). Applies clipvalue, clipnorm
    // (per tensor) and global_clipnorm to the gradients first. Uses the schedule's rate for the
    // current iteration unless a learning-rate override is set (ReduceLROnPlateau).
    virtual void apply(std::span<const ParamRef> params) = 0;
    virtual int64_t iterations() const = 0;
    virtual double currentLearningRate() const = 0;       // rate the next apply() will use
    virtual void setLearningRateOverride(double lr) = 0;  // replaces the schedule from now on

    // Slot state for checkpoints: one tensor per slot array, in a fixed order, plus iterations.
    virtual std::vector<Tensor*> slotTensors() = 0;
    virtual void setIterations(int64_t it) = 0;
    virtual const char* name() const = 0;
};

}  // namespace td

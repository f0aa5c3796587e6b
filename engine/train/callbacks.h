// Keras callbacks the trainer runs at epoch ends: EarlyStopping, ReduceLROnPlateau,
// TerminateOnNaN. They decide; the trainer acts through TrainControl.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "engine/core/events.h"
#include "engine/core/result.h"
#include "engine/core/tensor.h"
#include "engine/core/train_config.h"

namespace td {

// What a callback may do to the run. Provided by the trainer.
struct TrainControl {
    bool stopTraining = false;
    std::string stopReason;
    std::function<double()> getLearningRate;
    std::function<void(double)> setLearningRate;
    std::function<std::vector<Tensor>()> getWeights;  // copies of all parameters
    std::function<void(const std::vector<Tensor>&)> setWeights;
    std::function<void(const std::string&)> log;  // a log line for the run
};

// What a callback carries from one epoch to the next (EarlyStopping's best and wait,
// ReduceLROnPlateau's wait and cooldown, ...), for checkpoints: numbers, and tensors (best
// weights).
struct CallbackState {
    std::vector<double> values;
    std::vector<Tensor> tensors;
};

// Whether a monitored quantity improves upwards: mode "max"/"min", or for "auto" what Keras
// infers from the name (accuracies up, losses down).
bool monitorMaximizes(const std::string& mode, const std::string& monitor);

class Callback {
  public:
    // Errors name the callback and field, e.g. "callbacks[0].patience: expected >= 0".
    static Result<std::unique_ptr<Callback>> create(const CallbackConfig& cfg);
    virtual ~Callback() = default;
    virtual void onTrainBegin(TrainControl&) {}
    virtual void onBatchEnd(int64_t /*globalStep*/, const MetricMap& /*logs*/, TrainControl&) {}
    // Whether onBatchEnd needs the batch's loss. Reading it is a host sync every step, so the
    // trainer reads it only when some callback says yes (the built-in epoch callbacks do not).
    virtual bool wantsBatchLogs() const { return true; }
    virtual void onEpochEnd(int /*epoch*/, const MetricMap& /*logs*/, TrainControl&) {}
    virtual void onTrainEnd(TrainControl&) {}
    // Checkpoints: the state later epochs depend on, and its restoration in a resumed run (after
    // onTrainBegin). A callback without such state keeps the defaults. Errors say what did not
    // fit ("expected 4 values, got 2").
    virtual CallbackState saveState() const { return {}; }
    virtual Status restoreState(const CallbackState& /*state*/) { return Status::success(); }
};

}  // namespace td

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
#include "engine/train/train_config.h"

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
};

}  // namespace td

// Keras 3 callbacks (keras/src/callbacks/{early_stopping,reduce_lr_on_plateau,terminate_on_nan,
// monitor_callback}.py). They only decide; the trainer acts through TrainControl.
#include <algorithm>
#include <cmath>
#include <limits>
#include <string>

#include "engine/train/callbacks.h"
#include "engine/train/optim_common.h"

namespace td {
namespace {

using optim_detail::fmt;

void logLine(TrainControl& c, const std::string& line) {
    if (c.log) c.log(line);
}

std::string availableMetrics(const MetricMap& logs) {
    std::string out;
    for (const auto& [name, value] : logs) {
        if (!out.empty()) out += ",";
        out += name;
    }
    return out.empty() ? "(none)" : out;
}

// mode "auto": the direction is inferred from the metric name (without "val_"): accuracies, AUC,
// precision, recall and top-k rates are maximised; losses and errors minimised (Keras infers it
// from the metric's direction; ReduceLROnPlateau from "acc" in the name).
bool maximizes(const std::string& mode, const std::string& monitor) {
    if (mode == "max") return true;
    if (mode == "min") return false;
    std::string name = monitor.rfind("val_", 0) == 0 ? monitor.substr(4) : monitor;
    if (name.find("loss") != std::string::npos) return false;
    return name.find("acc") != std::string::npos || name.find("auc") != std::string::npos ||
           name.find("precision") != std::string::npos ||
           name.find("recall") != std::string::npos || name.rfind("top", 0) == 0;
}

// Keras MonitorCallback: min_delta is taken as |min_delta| and counted against the direction;
// current improves on best when (current - delta) < best (min) or > best (max).
class Monitor {
  public:
    explicit Monitor(const CallbackConfig& cfg)
        : max_(maximizes(cfg.mode, cfg.monitor)),
          delta_(max_ ? std::fabs(cfg.minDelta) : -std::fabs(cfg.minDelta)) {}
    void reset() {
        best_ = max_ ? -std::numeric_limits<double>::infinity()
                     : std::numeric_limits<double>::infinity();
    }
    bool improves(double current) const {
        return max_ ? current - delta_ > best_ : current - delta_ < best_;
    }
    double best() const { return best_; }
    void setBest(double v) { best_ = v; }

  private:
    bool max_;
    double delta_;
    double best_ = 0;
};

class EarlyStopping final : public Callback {
  public:
    bool wantsBatchLogs() const override { return false; }
    explicit EarlyStopping(const CallbackConfig& cfg) : cfg_(cfg), monitor_(cfg) {
        monitor_.reset();
    }

    void onTrainBegin(TrainControl&) override {
        wait_ = 0;
        stoppedEpoch_ = 0;
        bestEpoch_ = 0;
        bestWeights_.clear();
        haveBestWeights_ = false;
        warned_ = false;
        monitor_.reset();
    }

    void onEpochEnd(int epoch, const MetricMap& logs, TrainControl& c) override {
        auto it = logs.find(cfg_.monitor);
        if (it == logs.end()) {
            if (!warned_) {
                logLine(c, "Warning: early stopping conditioned on metric `" + cfg_.monitor +
                               "` which is not available. Available metrics are: " +
                               availableMetrics(logs));
                warned_ = true;
            }
            return;
        }
        if (epoch < cfg_.startFromEpoch) return;
        const double current = it->second;
        const bool improved = monitor_.improves(current);
        // Keras keeps the first monitored epoch's weights when nothing improves on it.
        if (cfg_.restoreBestWeights && (improved || !haveBestWeights_) && c.getWeights) {
            bestWeights_ = c.getWeights();
            haveBestWeights_ = true;
            bestEpoch_ = epoch;
        }
        ++wait_;
        if (improved) {
            monitor_.setBest(current);
            bestEpoch_ = epoch;
            wait_ = 0;
            return;
        }
        if (wait_ >= cfg_.patience && epoch > 0) {
            stoppedEpoch_ = epoch;
            c.stopTraining = true;
            c.stopReason = "Epoch " + std::to_string(epoch + 1) + ": early stopping (" +
                           cfg_.monitor + " did not improve for " + std::to_string(wait_) +
                           (wait_ == 1 ? " epoch" : " epochs") + "; best " + fmt(monitor_.best()) +
                           " at epoch " + std::to_string(bestEpoch_ + 1) + ")";
            logLine(c, c.stopReason);
        }
    }

    void onTrainEnd(TrainControl& c) override {
        if (cfg_.restoreBestWeights && haveBestWeights_ && c.setWeights) {
            logLine(c, "Restoring model weights from the end of the best epoch: " +
                           std::to_string(bestEpoch_ + 1) + ".");
            c.setWeights(bestWeights_);
        }
    }

    // best, wait, best epoch, stopped epoch, warned; the best weights when restore_best_weights.
    CallbackState saveState() const override {
        CallbackState st;
        st.values = {monitor_.best(), static_cast<double>(wait_), static_cast<double>(bestEpoch_),
                     static_cast<double>(stoppedEpoch_), warned_ ? 1.0 : 0.0};
        if (haveBestWeights_) st.tensors = bestWeights_;
        return st;
    }
    Status restoreState(const CallbackState& st) override {
        if (st.values.size() != 5)
            return err("early_stopping: expected 5 saved values, got " +
                       std::to_string(st.values.size()));
        monitor_.setBest(st.values[0]);
        wait_ = static_cast<int>(st.values[1]);
        bestEpoch_ = static_cast<int>(st.values[2]);
        stoppedEpoch_ = static_cast<int>(st.values[3]);
        warned_ = st.values[4] != 0.0;
        bestWeights_ = st.tensors;
        haveBestWeights_ = !st.tensors.empty();
        return Status::success();
    }

  private:
    CallbackConfig cfg_;
    Monitor monitor_;
    int wait_ = 0;
    int stoppedEpoch_ = 0;
    int bestEpoch_ = 0;
    std::vector<Tensor> bestWeights_;
    bool haveBestWeights_ = false;
    bool warned_ = false;
};

class ReduceLROnPlateau final : public Callback {
  public:
    bool wantsBatchLogs() const override { return false; }
    explicit ReduceLROnPlateau(const CallbackConfig& cfg) : cfg_(cfg), monitor_(cfg) {
        monitor_.reset();
    }

    void onTrainBegin(TrainControl&) override {
        cooldownCounter_ = 0;
        wait_ = 0;
        warned_ = false;
        monitor_.reset();
    }

    void onEpochEnd(int epoch, const MetricMap& logs, TrainControl& c) override {
        double current;
        if (auto it = logs.find(cfg_.monitor); it != logs.end()) {
            current = it->second;
        } else if (cfg_.monitor == "learning_rate" && c.getLearningRate) {
            current = c.getLearningRate();  // Keras adds logs["learning_rate"] first
        } else {
            if (!warned_) {
                logLine(c, "Warning: learning rate reduction is conditioned on metric `" +
                               cfg_.monitor + "` which is not available. Available metrics are: " +
                               availableMetrics(logs));
                warned_ = true;
            }
            return;
        }
        if (cooldownCounter_ > 0) {
            --cooldownCounter_;
            wait_ = 0;
        }
        if (monitor_.improves(current)) {
            monitor_.setBest(current);
            wait_ = 0;
            return;
        }
        if (cooldownCounter_ > 0) return;
        ++wait_;
        if (wait_ < cfg_.patience || !c.getLearningRate || !c.setLearningRate) return;
        const double oldLr = c.getLearningRate();
        // Keras compares the float32 learning-rate variable with np.float32(min_lr), so a rate
        // already at min_lr is left alone.
        if (static_cast<float>(oldLr) > static_cast<float>(cfg_.minLr)) {
            const double newLr = std::max(oldLr * cfg_.factor, cfg_.minLr);
            c.setLearningRate(newLr);
            logLine(c, "Epoch " + std::to_string(epoch + 1) +
                           ": ReduceLROnPlateau reducing learning rate to " +
                           optim_detail::fmtFloat(newLr) + ".");
            cooldownCounter_ = cfg_.cooldown;
            wait_ = 0;
        }
    }

    // best, wait, cooldown counter, warned (the learning rate it set lives in the optimizer).
    CallbackState saveState() const override {
        CallbackState st;
        st.values = {monitor_.best(), static_cast<double>(wait_),
                     static_cast<double>(cooldownCounter_), warned_ ? 1.0 : 0.0};
        return st;
    }
    Status restoreState(const CallbackState& st) override {
        if (st.values.size() != 4 || !st.tensors.empty())
            return err("reduce_lr_on_plateau: expected 4 saved values, got " +
                       std::to_string(st.values.size()));
        monitor_.setBest(st.values[0]);
        wait_ = static_cast<int>(st.values[1]);
        cooldownCounter_ = static_cast<int>(st.values[2]);
        warned_ = st.values[3] != 0.0;
        return Status::success();
    }

  private:
    CallbackConfig cfg_;
    Monitor monitor_;
    int cooldownCounter_ = 0;
    int wait_ = 0;
    bool warned_ = false;
};

// Keras checks logs["loss"] after every batch. The epoch-end check catches a non-finite loss when
// the trainer reads the loss back only every few steps.
class TerminateOnNaN final : public Callback {
  public:
    void onBatchEnd(int64_t globalStep, const MetricMap& logs, TrainControl& c) override {
        check("Batch " + std::to_string(globalStep), logs, c);
    }
    void onEpochEnd(int epoch, const MetricMap& logs, TrainControl& c) override {
        check("Epoch " + std::to_string(epoch + 1), logs, c);
    }

  private:
    static void check(const std::string& where, const MetricMap& logs, TrainControl& c) {
        if (c.stopTraining) return;
        auto it = logs.find("loss");
        if (it == logs.end() || std::isfinite(it->second)) return;
        c.stopTraining = true;
        c.stopReason = where + ": Invalid loss, terminating training";
        logLine(c, c.stopReason);
    }
};

Status checkMonitor(const char* type, const CallbackConfig& cfg) {
    const std::string prefix = type;
    if (cfg.monitor.empty()) return err(prefix + ".monitor: expected a metric name");
    if (cfg.mode != "auto" && cfg.mode != "min" && cfg.mode != "max") {
        return err(prefix + ".mode: expected auto, min or max, got '" + cfg.mode + "'");
    }
    if (!std::isfinite(cfg.minDelta)) {
        return err(prefix + ".min_delta: expected a finite number, got " + fmt(cfg.minDelta));
    }
    if (cfg.patience < 0) {
        return err(prefix + ".patience: expected a value >= 0, got " +
                   std::to_string(cfg.patience));
    }
    return Status::success();
}

}  // namespace

bool monitorMaximizes(const std::string& mode, const std::string& monitor) {
    return maximizes(mode, monitor);
}

Result<std::unique_ptr<Callback>> Callback::create(const CallbackConfig& cfg) {
    const std::string type = squashName(cfg.type);
    if (type == "earlystopping") {
        TD_RETURN_IF_ERROR(checkMonitor("EarlyStopping", cfg));
        if (cfg.startFromEpoch < 0) {
            return err("EarlyStopping.start_from_epoch: expected a value >= 0, got " +
                       std::to_string(cfg.startFromEpoch));
        }
        return std::unique_ptr<Callback>(new EarlyStopping(cfg));
    }
    if (type == "reducelronplateau") {
        TD_RETURN_IF_ERROR(checkMonitor("ReduceLROnPlateau", cfg));
        if (!(cfg.factor < 1)) {
            return err("ReduceLROnPlateau.factor: expected a value < 1, got " + fmt(cfg.factor));
        }
        if (!(cfg.factor >= 0)) {
            return err("ReduceLROnPlateau.factor: expected a value >= 0, got " + fmt(cfg.factor));
        }
        if (cfg.cooldown < 0) {
            return err("ReduceLROnPlateau.cooldown: expected a value >= 0, got " +
                       std::to_string(cfg.cooldown));
        }
        if (!(cfg.minLr >= 0) || !std::isfinite(cfg.minLr)) {
            return err("ReduceLROnPlateau.min_lr: expected a value >= 0, got " + fmt(cfg.minLr));
        }
        return std::unique_ptr<Callback>(new ReduceLROnPlateau(cfg));
    }
    if (type == "terminateonnan") return std::unique_ptr<Callback>(new TerminateOnNaN());
    return err("callback.type: unknown callback '" + cfg.type +
               "' (expected early_stopping, reduce_lr_on_plateau or terminate_on_nan)");
}

}  // namespace td

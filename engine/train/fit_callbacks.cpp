// The fit loop's callback observer: Keras' callbacks (EarlyStopping, ReduceLROnPlateau, ...)
// at the train's begin and end, after each batch and each epoch, with the TrainControl through
// which they read and set the learning rate and the weights and ask the run to stop. A resumed
// run's callbacks go on from the state its checkpoint saved.
#include "engine/train/trainer_impl.h"

namespace td {
namespace {

class CallbackObserver final : public FitObserver {
  public:
    explicit CallbackObserver(Trainer::Impl& im) : im_(im) {}

    Status trainBegin(FitState& st) override {
        TrainControl& ctl = st.ctl;
        ctl.getLearningRate = [this] { return im_.optimizer->currentLearningRate(); };
        ctl.setLearningRate = [this](double lr) { im_.optimizer->setLearningRateOverride(lr); };
        ctl.getWeights = [this] { return im_.weights(); };
        ctl.setWeights = [this](const std::vector<Tensor>& w) { im_.setWeights(w); };
        ctl.log = [this](const std::string& text) { im_.log(LogLine::Level::Info, text); };
        TD_RETURN_IF_ERROR(run("on_train_begin", [&](Callback& cb) { cb.onTrainBegin(ctl); }));
        if (!im_.resume) return Status::success();
        for (size_t i = 0; i < im_.s.callbacks.size(); ++i) {
            Status restored = im_.s.callbacks[i]->restoreState(im_.resume->callbacks[i]);
            if (!restored.ok())
                return err(im_.resume->path + ": " + im_.s.callbackNames[i] + ": " +
                           restored.error());
        }
        return Status::success();
    }

    Status afterStep(FitState& st) override {
        if (im_.s.callbacks.empty()) return Status::success();
        if (im_.wantBatchLoss) {
            TD_ASSIGN_OR_RETURN(batchLogs_["loss"], lastStepLoss(st.batchRows));
        }
        TD_RETURN_IF_ERROR(run("on_batch_end", [&](Callback& cb) {
            cb.onBatchEnd(st.globalStep, batchLogs_, st.ctl);
        }));
        if (st.ctl.stopTraining) {
            st.stopNow = true;
            st.status = RunStatus::Stopped;
            st.message = st.ctl.stopReason;
        }
        return Status::success();
    }

    Status afterEpoch(FitState& st, const EpochMetrics& em) override {
        return run("on_epoch_end",
                   [&](Callback& cb) { cb.onEpochEnd(em.epoch, em.metrics, st.ctl); });
    }

    Status trainEnd(FitState& st) override {
        return run("on_train_end", [&](Callback& cb) { cb.onTrainEnd(st.ctl); });
    }

  private:
    template <typename Hook>
    Status run(const char* hookName, Hook hook) {
        for (size_t i = 0; i < im_.s.callbacks.size(); ++i) {
            try {
                hook(*im_.s.callbacks[i]);
            } catch (const std::exception& e) {
                return err(im_.s.callbackNames[i] + " failed in " + hookName + ": " + e.what());
            } catch (...) {
                return err(im_.s.callbackNames[i] + " failed in " + hookName +
                           ": unknown exception");
            }
        }
        return Status::success();
    }

    // The loss of the last step, summed over the replicas' shares (callbacks that want batch
    // logs): a host read every step, made only when such a callback is present.
    Result<double> lastStepLoss(int64_t rows) {
        double total = 0;
        for (auto& rp : im_.replicas) {
            const auto [b0, b1] = im_.sliceOf(rp->global, rows);
            Program* p = rp->programs.at({static_cast<int>(GraphMode::Train), b1 - b0}).get();
            float v = 0;
            TD_RETURN_IF_ERROR(rp->device->synchronize());
            TD_RETURN_IF_ERROR(rp->device->copyToHost(
                &v, Buffer{const_cast<void*>(p->exe->valuePtr(p->lossId)), 4}, 0, 4));
            total += v;
        }
        if (im_.s.workers) TD_RETURN_IF_ERROR(im_.s.workers->allReduceHost(&total, 1));
        return total;
    }

    Trainer::Impl& im_;
    MetricMap batchLogs_{{"loss", 0.0}};
};

}  // namespace

std::unique_ptr<FitObserver> makeCallbackObserver(Trainer::Impl& im) {
    return std::make_unique<CallbackObserver>(im);
}

}  // namespace td

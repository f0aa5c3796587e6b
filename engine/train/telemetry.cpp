// The log point: every training.log_every_steps steps, at an epoch's last step and at a stop,
// the fit loop's telemetry observer reads the devices' loss and metric sums back (the one host
// read of the loop), learns of skipped mixed_float16 steps, and publishes StepMetrics (with each
// replica's figures) and DeviceStats (with what a GPU reports of itself through NVML).
#include <algorithm>

#include "engine/backend/telemetry.h"
#include "engine/train/trainer_impl.h"

namespace td {

// Per-replica figures of the interval, every worker's, for the chief's StepMetrics.
Result<std::vector<ReplicaStats>> Trainer::Impl::replicaStats(double wall) {
    constexpr int64_t kFields = 5;
    std::vector<double> mine;
    for (auto& rp : replicas) {
        const ReplicaTiming& t = rp->timing;
        mine.insert(mine.end(), {wall > 0 ? static_cast<double>(t.samples) / wall : 0.0, t.compute,
                                 t.allReduce, t.inputWait, static_cast<double>(rp->global)});
    }
    std::vector<double> all = mine;
    if (s.workers) {
        all.resize(mine.size() * static_cast<size_t>(workerCount));
        TD_RETURN_IF_ERROR(
            s.workers->allGatherHost(mine.data(), static_cast<int64_t>(mine.size()), all.data()));
    }
    std::vector<ReplicaStats> out;
    const int local = static_cast<int>(replicas.size());
    for (size_t i = 0; i + kFields <= all.size(); i += kFields) {
        ReplicaStats rs;
        rs.replica = static_cast<int>(all[i + 4]);
        rs.worker = rs.replica / local;
        rs.device = replicas[static_cast<size_t>(rs.replica % local)]->label;
        if (workerCount > 1) rs.device = "worker " + std::to_string(rs.worker) + " " + rs.device;
        rs.samplesPerSecond = all[i];
        rs.computeSeconds = all[i + 1];
        rs.allReduceSeconds = all[i + 2];
        rs.inputWaitSeconds = all[i + 3];
        out.push_back(rs);
    }
    for (auto& rp : replicas) rp->timing = {};
    return out;
}

// mixed_float16: the first replica's loss-scale state (every replica holds the same: they
// apply the same all-reduced gradients). One more read at a log point, only with loss
// scaling.
Result<std::optional<LossScaleState>> Trainer::Impl::readLossScale() {
    Replica& r = *replicas[0];
    if (!r.lossScale.ptr) return std::optional<LossScaleState>{};
    LossScaleState st;
    TD_RETURN_IF_ERROR(r.device->synchronize());
    TD_RETURN_IF_ERROR(r.device->copyToHost(&st, r.lossScale, 0, sizeof st));
    return std::optional<LossScaleState>(st);
}

// Device memory the first replica holds: parameters, gradients, optimizer slots, and each
// compiled program's arena and batch buffers.
int64_t Trainer::Impl::deviceBytes() const {
    int64_t bytes = 0;
    const Replica& r = *replicas[0];
    for (const Buffer& b : r.params) bytes += static_cast<int64_t>(b.bytes);
    bytes += static_cast<int64_t>(r.flatGrads.bytes);
    for (const Buffer& b : r.slots) bytes += static_cast<int64_t>(b.bytes);
    for (const auto& [key, p] : r.programs)
        bytes += static_cast<int64_t>(p->exe->arenaBytes() + p->input.bytes + p->label.bytes);
    return bytes;
}

namespace {

class TelemetryObserver final : public FitObserver {
  public:
    explicit TelemetryObserver(Trainer::Impl& im)
        : im_(im),
          logEvery_(std::max<int64_t>(1, im.s.project.training.logEverySteps)),
          memory_(im.deviceBytes()) {}

    Status afterStep(FitState& st) override {
        if (st.step % logEvery_ != 0 && st.step != st.steps && !st.stopNow)
            return Status::success();
        const double wall = secondsSince(st.logT0);
        RunControl& control = *im_.control;
        // With workers, a stop request rides along in the sums, so every worker learns of it
        // at the same log point and all stop after the same step.
        TD_ASSIGN_OR_RETURN(st.sums, im_.readAccumulators(true, control.stopRequested ? 1.0 : 0.0));
        if (im_.s.workers && st.sums.back() > 0) st.stopNow = true;
        TD_ASSIGN_OR_RETURN(std::vector<ReplicaStats> per, im_.replicaStats(wall));
        StepMetrics sm;
        sm.epoch = st.epoch;
        sm.step = st.step;
        sm.globalStep = st.globalStep;
        sm.metrics["loss"] = st.sums[0] / static_cast<double>(st.seen);
        for (size_t m = 0; m < im_.s.metrics.size(); ++m)
            sm.metrics[im_.s.metrics[m].key] = st.sums[1 + m] / static_cast<double>(st.seen);
        TD_RETURN_IF_ERROR(noteSkippedSteps(st, sm));
        sm.learningRate = im_.optimizer->currentLearningRate();
        sm.inputWaitSeconds = st.logWait;
        sm.computeSeconds = st.logCompute;
        sm.samplesPerSecond = wall > 0 ? static_cast<double>(st.seenSinceLog) / wall : 0;
        sm.replicas = std::move(per);
        st.lastLogged = sm.metrics;
        im_.bus->publish(sm);
        publishDeviceStats(st, wall);
        st.logT0 = Clock::now();
        st.logWait = st.logCompute = 0;
        st.seenSinceLog = 0;
        return Status::success();
    }

  private:
    // mixed_float16: the loss scale, and the steps skipped since the last log point (they
    // applied no update, so the optimizer's count goes back by as many).
    Status noteSkippedSteps(const FitState& st, StepMetrics& sm) {
        TD_ASSIGN_OR_RETURN(std::optional<LossScaleState> ls, im_.readLossScale());
        if (!ls) return Status::success();
        sm.lossScale = ls->scale;
        sm.skippedSteps = ls->skippedSteps;
        if (ls->skippedSteps > im_.skippedSeen) {
            im_.optimizer->rewindIterations(ls->skippedSteps - im_.skippedSeen);
            im_.log(LogLine::Level::Warning,
                    "loss scaling: " + std::to_string(ls->skippedSteps - im_.skippedSeen) +
                        " step(s) up to step " + std::to_string(st.globalStep) +
                        " skipped (non-finite gradients); loss scale now " + fmtNum(ls->scale));
            im_.skippedSeen = ls->skippedSteps;
        }
        return Status::success();
    }

    void publishDeviceStats(const FitState& st, double wall) {
        for (auto& rp : im_.replicas) {
            DeviceStats ds;
            ds.device = rp->label;
            ds.utilization = wall > 0 ? std::min(1.0, st.logCompute / wall) : 0;
            ds.memoryBytes = memory_;
            ds.samplesPerSecond =
                wall > 0 ? static_cast<double>(st.seenSinceLog) / im_.totalReplicas / wall : 0;
            // GPUs: what the GPU reports of itself (NVML), where the driver has it.
            if (rp->device->desc().kind == DeviceKind::Cuda)
                if (auto t = deviceTelemetry(rp->device->desc().id)) {
                    ds.memoryUsedBytes = t->memoryUsedBytes;
                    ds.memoryTotalBytes = t->memoryTotalBytes;
                    ds.gpuUtilization = t->gpuUtilization;
                }
            im_.bus->publish(std::move(ds));
        }
    }

    Trainer::Impl& im_;
    const int64_t logEvery_;
    const int64_t memory_;
};

}  // namespace

std::unique_ptr<FitObserver> makeTelemetryObserver(Trainer::Impl& im) {
    return std::make_unique<TelemetryObserver>(im);
}

}  // namespace td

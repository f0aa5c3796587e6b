// Checkpoints in the fit loop: restoring a run from one (Trainer::restore), capturing the
// trainer's state, and the observer that writes each writer's files when they are due (every N
// steps, at an epoch's end, at a stop) and drops a completed run's backups.
#include <filesystem>

#include "engine/train/trainer_impl.h"

namespace td {

Status Trainer::Impl::restore(const std::string& path, const CheckpointState& st) {
    const TrainConfig& tc = s.project.training;
    TD_RETURN_IF_ERROR(checkCheckpointParams(path, st, paramNames, paramShapes));
    const size_t slotsEach = static_cast<size_t>(updateSpec.slotsPerParam());
    if (st.optimizerSlots.size() != trainableIndex.size() * slotsEach)
        return err(path + ": the checkpoint holds " + std::to_string(st.optimizerSlots.size()) +
                   " optimizer slots, this run's " + optimizer->name() + " optimizer has " +
                   std::to_string(trainableIndex.size() * slotsEach));
    for (size_t i = 0; i < st.optimizerSlots.size(); ++i) {
        const Shape& want = paramShapes[trainableIndex[i / std::max<size_t>(1, slotsEach)]];
        const Tensor& t = st.optimizerSlots[i];
        if (t.dtype() != DType::F32 || t.shape() != want)
            return err(path + ": optimizer slot " + std::to_string(i) + " is " +
                       dtypeName(t.dtype()) + " " + shapeToString(t.shape()) + ", expected f32 " +
                       shapeToString(want));
    }
    if (st.callbacks.size() != s.callbacks.size())
        return err(path + ": the checkpoint holds the state of " +
                   std::to_string(st.callbacks.size()) + " callbacks, this run has " +
                   std::to_string(s.callbacks.size()));
    if (st.seed != tc.seed)
        return err(path + ": the checkpoint was trained with seed " + std::to_string(st.seed) +
                   ", this run has training.seed " + std::to_string(tc.seed));
    if (st.epoch >= tc.epochs)
        return err(path + ": the checkpoint is at the end of epoch " + std::to_string(st.epoch) +
                   " and the run has " + std::to_string(tc.epochs) +
                   " epochs: nothing is left to train");
    // Mid-epoch: the epoch's sums of every replica of every worker, rank-major; this worker
    // goes on from its own.
    std::vector<std::vector<double>> ownSums;
    if (st.stepInEpoch > 0) {
        const size_t local = replicas.size();
        const size_t all = local * static_cast<size_t>(std::max(1, workerCount));
        if (st.accumulators.size() != all)
            return err(path + ": the checkpoint holds the sums of " +
                       std::to_string(st.accumulators.size()) + " replicas, this run has " +
                       std::to_string(all) +
                       (workerCount > 1 ? " (" + std::to_string(workerCount) + " workers x " +
                                              std::to_string(local) + ")"
                                        : std::string()) +
                       " (resume with the strategy it was trained with)");
        const size_t first = local * static_cast<size_t>(std::max(0, workerRank));
        ownSums.assign(st.accumulators.begin() + static_cast<std::ptrdiff_t>(first),
                       st.accumulators.begin() + static_cast<std::ptrdiff_t>(first + local));
        for (const auto& a : st.accumulators)
            if (static_cast<int64_t>(a.size()) != accumCount())
                return err(path + ": the checkpoint's loss and metric sums hold " +
                           std::to_string(a.size()) + " values, expected " +
                           std::to_string(accumCount()));
    }
    for (auto& rp : replicas) {
        Device& d = *rp->device;
        for (size_t i = 0; i < rp->params.size(); ++i)
            TD_RETURN_IF_ERROR(d.copyToDevice(rp->params[i], 0, st.params[i].value.raw(),
                                              st.params[i].value.bytes()));
        for (size_t i = 0; i < rp->slots.size(); ++i)
            TD_RETURN_IF_ERROR(d.copyToDevice(rp->slots[i], 0, st.optimizerSlots[i].raw(),
                                              st.optimizerSlots[i].bytes()));
        TD_RETURN_IF_ERROR(d.synchronize());
        rp->weightsDirty = true;  // mixed precision: the shadows follow the restored weights
    }
    restoredLossScale = st.lossScale;
    skippedSeen = st.lossScale ? st.lossScaleSkipsReported : 0;
    if (st.lossScale)
        for (auto& rp : replicas)
            if (rp->lossScale.ptr) {
                TD_RETURN_IF_ERROR(rp->device->copyToDevice(rp->lossScale, 0, &*st.lossScale,
                                                            sizeof(LossScaleState)));
            }
    optimizer->setIterations(st.optimizerIterations);
    optimizer->restoreLearningRateOverride(st.learningRateOverride);
    ResumePoint rp;
    rp.path = path;
    rp.epoch = st.epoch;
    rp.stepInEpoch = st.stepInEpoch;
    rp.globalStep = st.globalStep;
    rp.epochSamples = st.epochSamples;
    rp.accumulators = std::move(ownSums);
    rp.lastEpochMetrics = st.lastEpochMetrics;
    rp.callbacks = st.callbacks;
    rp.writers = st.writers;
    resume = std::move(rp);
    return Status::success();
}

Result<CheckpointState> Trainer::Impl::captureState(int epoch, int64_t stepInEpoch, int64_t gstep,
                                                    int64_t seen, const MetricMap& lastEpoch) {
    CheckpointState st;
    st.projectJson = ckpt.projectJson;
    st.runId = ckpt.runId;
    st.storeId = ckpt.storeId;
    st.modelFingerprint = ckpt.modelFingerprint;
    st.globalStep = gstep;
    st.epoch = epoch;
    st.stepInEpoch = stepInEpoch;
    st.seed = s.project.training.seed;
    st.epochSamples = stepInEpoch > 0 ? seen : 0;
    st.lastEpochMetrics = lastEpoch;
    Replica& r0 = *replicas[0];
    for (auto& rp : replicas) TD_RETURN_IF_ERROR(rp->device->synchronize());
    for (size_t i = 0; i < r0.params.size(); ++i) {
        Tensor t(DType::F32, paramShapes[i]);
        TD_RETURN_IF_ERROR(r0.device->copyToHost(t.raw(), r0.params[i], 0, t.bytes()));
        st.params.push_back(NamedTensor{paramNames[i], std::move(t)});
    }
    const size_t slotsEach = static_cast<size_t>(updateSpec.slotsPerParam());
    for (size_t i = 0; i < r0.slots.size(); ++i) {
        Tensor t(DType::F32, paramShapes[trainableIndex[i / std::max<size_t>(1, slotsEach)]]);
        TD_RETURN_IF_ERROR(r0.device->copyToHost(t.raw(), r0.slots[i], 0, t.bytes()));
        st.optimizerSlots.push_back(std::move(t));
    }
    if (stepInEpoch > 0) {
        if (s.workers) {
            st.accumulators = gatheredSums;  // every worker's, gathered by saveDue
        } else {
            TD_ASSIGN_OR_RETURN(st.accumulators, localSums());
        }
    }
    TD_ASSIGN_OR_RETURN(st.lossScale, readLossScale());
    st.lossScaleSkipsReported = skippedSeen;
    st.optimizerIterations = optimizer->iterations();
    st.learningRateOverride = optimizer->learningRateOverride();
    for (const auto& cb : s.callbacks) st.callbacks.push_back(cb->saveState());
    return st;
}

Status Trainer::Impl::saveCheckpoint(size_t w, int epoch, int64_t stepInEpoch, int64_t gstep,
                                     int64_t seen, const MetricMap& lastEpoch,
                                     const MetricMap& monitored) {
    const CheckpointWriter& cw = ckpt.writers[w];
    WriterRuntime& rt = writerRuntime[w];
    if (workerRank != 0 || rt.lastStep == gstep) return Status::success();
    std::optional<double> value;
    if (auto it = monitored.find(cw.monitor); it != monitored.end()) value = it->second;
    if (cw.saveBestOnly) {
        if (!value) {
            if (!rt.warned) {
                std::string available;
                for (const auto& [k, v] : monitored)
                    available += (available.empty() ? "" : ", ") + k;
                log(LogLine::Level::Warning,
                    cw.id + ": can save the best model only with " + cw.monitor +
                        " available, skipping (available: " +
                        (available.empty() ? std::string("none") : available) + ")");
            }
            rt.warned = true;
            return Status::success();
        }
        const bool up = monitorMaximizes(cw.mode, cw.monitor);
        if (rt.best && !(up ? *value > *rt.best : *value < *rt.best)) return Status::success();
    }
    const std::string path = (std::filesystem::path(cw.directory) /
                              (cw.prefix + "-" + std::to_string(gstep) + ".tdckpt"))
                                 .string();
    WriterRuntime next = rt;
    std::vector<std::string> superseded;
    if (cw.saveBestOnly) {
        next.best = value;
        for (const std::string& k : next.kept)
            if (k != path) superseded.push_back(k);
        next.kept = {path};
    } else {
        std::erase(next.kept, path);
        next.kept.push_back(path);
        while (static_cast<int>(next.kept.size()) > std::max(1, cw.keepLast)) {
            superseded.push_back(next.kept.front());
            next.kept.erase(next.kept.begin());
        }
    }
    TD_ASSIGN_OR_RETURN(CheckpointState st,
                        captureState(epoch, stepInEpoch, gstep, seen, lastEpoch));
    st.kind = cw.kind;
    st.monitorValue = value;
    for (size_t i = 0; i < ckpt.writers.size(); ++i) {
        const WriterRuntime& x = i == w ? next : writerRuntime[i];
        st.writers.push_back(CheckpointWriterState{ckpt.writers[i].id, x.best, x.kept});
    }
    Status written = writeCheckpoint(path, st);
    if (!written.ok()) return err(cw.id + ": " + written.error());
    next.lastStep = gstep;
    rt = std::move(next);
    std::error_code ec;
    const auto bytes = std::filesystem::file_size(path, ec);
    CheckpointSaved ev;
    ev.path = path;
    ev.kind = cw.kind;
    ev.globalStep = gstep;
    ev.epoch = epoch;
    ev.stepInEpoch = stepInEpoch;
    ev.monitorValue = value;
    ev.bytes = ec ? 0 : static_cast<int64_t>(bytes);
    ev.superseded = superseded;
    if (!ckpt.storeDeletes)
        for (const std::string& f : superseded) std::filesystem::remove(f, ec);
    bus->publish(std::move(ev));
    return Status::success();
}

void Trainer::Impl::dropCompletedBackups() {
    if (workerRank != 0) return;
    for (size_t w = 0; w < ckpt.writers.size(); ++w) {
        if (!ckpt.writers[w].deleteWhenCompleted || writerRuntime[w].kept.empty()) continue;
        CheckpointSaved ev;  // no new file: only the superseded ones, forgotten and deleted
        ev.kind = ckpt.writers[w].kind;
        ev.superseded = std::move(writerRuntime[w].kept);
        writerRuntime[w].kept.clear();
        std::error_code ec;
        if (!ckpt.storeDeletes)
            for (const std::string& f : ev.superseded) std::filesystem::remove(f, ec);
        log(LogLine::Level::Info,
            ckpt.writers[w].id + ": the run completed; its backup files are deleted");
        bus->publish(std::move(ev));
    }
}

// ---- the fit loop -------------------------------------------------------------------------------

namespace {

class CheckpointObserver final : public FitObserver {
  public:
    explicit CheckpointObserver(Trainer::Impl& im) : im_(im) {}

    // A resumed run's writers go on from their saved state.
    Status trainBegin(FitState&) override {
        im_.writerRuntime.assign(im_.ckpt.writers.size(), Trainer::Impl::WriterRuntime{});
        if (!im_.resume) return Status::success();
        for (size_t w = 0; w < im_.ckpt.writers.size(); ++w)
            for (const CheckpointWriterState& ws : im_.resume->writers)
                if (ws.id == im_.ckpt.writers[w].id) {
                    im_.writerRuntime[w].best = ws.best;
                    im_.writerRuntime[w].kept = ws.kept;
                }
        return Status::success();
    }

    // Every N steps; and at a stop after this step, before the partial epoch's end: a resumed
    // run continues with the next step.
    Status afterStep(FitState& st) override {
        TD_RETURN_IF_ERROR(saveDue(st, Due::AfterStep, st.epoch, st.step, st.lastLogged));
        if (st.stopNow)
            TD_RETURN_IF_ERROR(saveDue(st, Due::AtStop, st.epoch, st.step, st.lastLogged));
        return Status::success();
    }

    Status stopBeforeStep(FitState& st) override {
        return saveDue(st, Due::AtStop, st.epoch, st.step, st.lastLogged);
    }

    // At the epoch's end (not after a stop, which saved already): the run continues with the
    // next epoch's first step.
    Status afterEpoch(FitState& st, const EpochMetrics& em) override {
        if (st.stopNow) return Status::success();
        return saveDue(st, Due::EpochEnd, st.epoch + 1, 0, em.metrics);
    }

    Status trainEnd(FitState& st) override {
        if (st.status == RunStatus::Completed && !im_.control->aborted) im_.dropCompletedBackups();
        return Status::success();
    }

  private:
    enum class Due { AfterStep, EpochEnd, AtStop };

    // Every worker has the same writers (the session plans them alike), so all of them find the
    // same checkpoints due and take part in gathering the epoch's sums for a mid-epoch one.
    Status saveDue(const FitState& st, Due when, int epoch, int64_t stepIn,
                   const MetricMap& monitored) {
        bool gathered = false;
        const int64_t seen = when == Due::EpochEnd ? 0 : st.seen;
        for (size_t w = 0; w < im_.ckpt.writers.size(); ++w) {
            const CheckpointWriter& cw = im_.ckpt.writers[w];
            const bool due = when == Due::AtStop ? cw.atStop
                             : when == Due::EpochEnd
                                 ? cw.everySteps == 0
                                 : cw.everySteps > 0 && st.globalStep % cw.everySteps == 0;
            if (!due) continue;
            if (im_.s.workers && stepIn > 0 && !gathered) {
                TD_RETURN_IF_ERROR(im_.gatherSums());
                gathered = true;
            }
            TD_RETURN_IF_ERROR(
                im_.saveCheckpoint(w, epoch, stepIn, st.globalStep, seen, st.lastEpoch, monitored));
        }
        return Status::success();
    }

    Trainer::Impl& im_;
};

}  // namespace

std::unique_ptr<FitObserver> makeCheckpointObserver(Trainer::Impl& im) {
    return std::make_unique<CheckpointObserver>(im);
}

}  // namespace td

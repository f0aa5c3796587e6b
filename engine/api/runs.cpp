#include "engine/api/runs.h"

#include <filesystem>
#include <utility>

#include "engine/api/run_checkpoints.h"
#include "engine/store/run_queries.h"
#include "engine/store/run_store.h"
#include "engine/train/checkpoint.h"

namespace td::api {

struct RunCatalog::Impl {
    std::unique_ptr<RunStore> store;
};

RunCatalog::RunCatalog() : impl_(std::make_unique<Impl>()) {}
RunCatalog::~RunCatalog() = default;

Result<std::unique_ptr<RunCatalog>> RunCatalog::open(const std::string& path) {
    TD_ASSIGN_OR_RETURN(std::unique_ptr<RunStore> store, RunStore::open(path));
    std::unique_ptr<RunCatalog> catalog(new RunCatalog());
    catalog->impl_->store = std::move(store);
    return catalog;
}

const std::string& RunCatalog::path() const {
    return impl_->store->path();
}

Result<std::vector<RunRecord>> RunCatalog::runs() {
    return impl_->store->listRuns();
}

Result<RunRecord> RunCatalog::run(int64_t runId) {
    return impl_->store->getRun(runId);
}

Result<RunRecord> RunCatalog::findRun(const std::string& idOrName) {
    return impl_->store->findRun(idOrName);
}

Result<std::vector<StepRow>> RunCatalog::steps(int64_t runId, int64_t afterGlobalStep) {
    return impl_->store->steps(runId, afterGlobalStep);
}

Result<std::vector<EpochRow>> RunCatalog::epochs(int64_t runId) {
    return impl_->store->epochs(runId);
}

Result<std::vector<ReplicaRow>> RunCatalog::replicaStats(int64_t runId, int64_t afterGlobalStep) {
    return impl_->store->replicaStats(runId, afterGlobalStep);
}

Result<std::vector<DeviceRow>> RunCatalog::deviceStats(int64_t runId) {
    return impl_->store->deviceStats(runId);
}

Result<std::vector<LogRow>> RunCatalog::logs(int64_t runId) {
    return impl_->store->logs(runId);
}

Status RunCatalog::rename(int64_t runId, const std::string& name) {
    return impl_->store->renameRun(runId, name);
}

Status RunCatalog::setNotes(int64_t runId, const std::string& notes) {
    return impl_->store->setNotes(runId, notes);
}

Status RunCatalog::remove(int64_t runId) {
    return impl_->store->deleteRun(runId);
}

Status RunCatalog::remove(int64_t runId, bool deleteCheckpointFiles) {
    std::vector<CheckpointRow> files;
    if (deleteCheckpointFiles) {
        TD_ASSIGN_OR_RETURN(files, impl_->store->checkpoints(runId));
    }
    TD_RETURN_IF_ERROR(impl_->store->deleteRun(runId));
    if (!deleteCheckpointFiles) return Status::success();
    std::string failed;
    std::error_code ec;
    for (const CheckpointRow& f : files)
        if (!std::filesystem::remove(f.path, ec) && ec)
            failed += "\n  " + f.path + ": " + ec.message();
    const std::string dir = runCheckpointDir(impl_->store->path(), runId);
    std::filesystem::remove_all(dir, ec);
    if (ec) failed += "\n  " + dir + ": " + ec.message();
    if (!failed.empty())
        return err("run " + std::to_string(runId) +
                   " was deleted, but some of its checkpoint files could not be:" + failed);
    return Status::success();
}

Result<std::vector<CheckpointRow>> RunCatalog::checkpoints(int64_t runId) {
    return impl_->store->checkpoints(runId);
}

Result<std::string> latestCheckpointForRun(const std::string& storePath, int64_t runId) {
    TD_ASSIGN_OR_RETURN(std::unique_ptr<RunStore> store, RunStore::open(storePath));
    TD_ASSIGN_OR_RETURN(RunRecord run, store->getRun(runId));
    TD_ASSIGN_OR_RETURN(RunCheckpointChoice choice, chooseRunCheckpoint(*store, run));
    if (choice.chosen) return choice.chosen->path;
    if (choice.candidates == 0)
        return err("run " + std::to_string(runId) + " in " + storePath + " has no checkpoint");
    std::string why;
    for (const std::string& r : choice.refused) why += "\n  refused " + r;
    return err("run " + std::to_string(runId) + " in " + storePath +
               ": none of its checkpoints can be used:" + why);
}

Result<std::string> RunCatalog::exportCsv(int64_t runId) {
    return impl_->store->exportCsv(runId);
}

struct RunWatcher::Impl {
    std::unique_ptr<RunStoreReader> reader;
};

RunWatcher::RunWatcher() : impl_(std::make_unique<Impl>()) {}
RunWatcher::~RunWatcher() = default;

Result<std::unique_ptr<RunWatcher>> RunWatcher::open(const std::string& path) {
    TD_ASSIGN_OR_RETURN(std::unique_ptr<RunStoreReader> reader, RunStoreReader::open(path));
    std::unique_ptr<RunWatcher> watcher(new RunWatcher());
    watcher->impl_->reader = std::move(reader);
    return watcher;
}

const std::string& RunWatcher::path() const {
    return impl_->reader->path();
}

Result<RunListSnapshot> RunWatcher::allRuns(std::optional<int64_t> sinceDataVersion) {
    return impl_->reader->allRuns(sinceDataVersion);
}

Result<RunListSnapshot> RunWatcher::changedRuns(int64_t sinceDataVersion, int64_t afterId,
                                                const std::vector<int64_t>& ids) {
    return impl_->reader->changedRuns(sinceDataVersion, afterId, ids);
}

StepMetrics stepEvent(const StepRow& row) {
    StepMetrics m;
    m.epoch = row.epoch;
    m.step = row.step;
    m.globalStep = row.globalStep;
    for (const auto& [k, v] : row.metrics) {
        if (k == "lr")
            m.learningRate = v;
        else if (k == "loss_scale")
            m.lossScale = v;
        else if (k == "skipped_steps")
            m.skippedSteps = static_cast<int64_t>(v);
        else if (k == "samples_per_s")
            m.samplesPerSecond = v;
        else if (k == "input_wait_s")
            m.inputWaitSeconds = v;
        else if (k == "compute_s")
            m.computeSeconds = v;
        else
            m.metrics[k] = v;
    }
    return m;
}

EpochMetrics epochEvent(const EpochRow& row) {
    EpochMetrics e;
    e.epoch = row.epoch;
    e.seconds = row.seconds;
    for (const auto& [k, v] : row.metrics) {
        if (k == "lr")
            e.learningRate = v;
        else if (k == "samples_per_s")
            e.samplesPerSecond = v;
        else if (k == "input_wait_share")
            e.inputWaitSeconds = v * row.seconds;
        else
            e.metrics[k] = v;
    }
    return e;
}

}  // namespace td::api

// The run store as a front end sees it: browse, rename, annotate, delete and export stored runs,
// read a run's curves and per-replica figures, and watch a store that other processes are
// writing. Wraps engine/store (the GUI's Runs panel and the CLI's `runs`/`show` see the same
// data); the records are the plain structs of engine/core/run_records.h.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "engine/core/events.h"
#include "engine/core/result.h"
#include "engine/core/run_records.h"

namespace td::api {

// A run store opened for reading and editing. Creates the file and brings its schema up to date
// when needed; a store that cannot be written (full disk, a lock held elsewhere) still opens for
// reading. Every method may be called from any thread: calls are serialized on one connection.
class RunCatalog {
  public:
    // Errors name the path (a directory, a newer schema, not a database...).
    static Result<std::unique_ptr<RunCatalog>> open(const std::string& path);
    ~RunCatalog();
    RunCatalog(const RunCatalog&) = delete;
    RunCatalog& operator=(const RunCatalog&) = delete;

    const std::string& path() const;

    // Every run, newest first, with its documents (projectJson, configJson).
    Result<std::vector<RunRecord>> runs();
    // One run with its documents; by id, or by id or name as the CLI takes it ("12", "my run":
    // the newest run with that name).
    Result<RunRecord> run(int64_t runId);
    Result<RunRecord> findRun(const std::string& idOrName);

    // A run's rows. Steps and replica rows after `afterGlobalStep` only, so a viewer of a live
    // run reads just what is new.
    Result<std::vector<StepRow>> steps(int64_t runId, int64_t afterGlobalStep = 0);
    Result<std::vector<EpochRow>> epochs(int64_t runId);
    Result<std::vector<ReplicaRow>> replicaStats(int64_t runId, int64_t afterGlobalStep = 0);
    Result<std::vector<DeviceRow>> deviceStats(int64_t runId);
    Result<std::vector<LogRow>> logs(int64_t runId);

    // Edits. Names and notes go through the same text checks as a project's free text.
    Status rename(int64_t runId, const std::string& name);
    Status setNotes(int64_t runId, const std::string& notes);
    Status remove(int64_t runId);  // the run and all its rows
    // remove(), and with deleteCheckpointFiles also the checkpoint files the store knows the run
    // has and its own checkpoint folder (<store folder>/checkpoints/run-<id>). The run's rows go
    // first; errors name a file that could not be deleted.
    Status remove(int64_t runId, bool deleteCheckpointFiles);
    // The checkpoint files the store knows the run has, newest first.
    Result<std::vector<CheckpointRow>> checkpoints(int64_t runId);
    // CSV: one row per epoch, then one per logged step, then (runs with per-replica figures) one
    // per step and replica.
    Result<std::string> exportCsv(int64_t runId);

  private:
    RunCatalog();
    struct Impl;
    std::unique_ptr<Impl> impl_;
};

// Stable for exporters: the path of the newest checkpoint of stored run `runId` that reads back
// whole and fits its project (readCheckpointModel in engine/train/checkpoint.h reads it); older
// ones are tried when newer ones are missing or damaged. Errors name the run, the store and why no
// checkpoint can be used.
Result<std::string> latestCheckpointForRun(const std::string& storePath, int64_t runId);

// Change checks for a viewer that polls a store while other processes write to it. A look costs
// one PRAGMA when nothing was committed since the previous one; otherwise it reads run ids from an
// index and the summaries (RunRecord without the documents) of the runs asked for. Owns its own
// read connection to an existing store (RunCatalog::open creates one); use from one thread at a
// time.
class RunWatcher {
  public:
    static Result<std::unique_ptr<RunWatcher>> open(const std::string& path);
    ~RunWatcher();
    RunWatcher(const RunWatcher&) = delete;
    RunWatcher& operator=(const RunWatcher&) = delete;

    const std::string& path() const;

    // Every run's summary; when `sinceDataVersion` is given and nothing was committed since:
    // `unchanged`, and nothing else is read.
    Result<RunListSnapshot> allRuns(std::optional<int64_t> sinceDataVersion = std::nullopt);
    // Nothing committed since `sinceDataVersion`: `unchanged`. Otherwise every run id and the
    // summaries of the runs with an id above `afterId` or listed in `ids` (the runs that were
    // running: the only ones whose rows change, apart from renames and notes).
    Result<RunListSnapshot> changedRuns(int64_t sinceDataVersion, int64_t afterId,
                                        const std::vector<int64_t>& ids);

  private:
    RunWatcher();
    struct Impl;
    std::unique_ptr<Impl> impl_;
};

// A stored row as the event it was recorded from (the run recorder's inverse): a viewer shows a
// stored, resumed or remote run's rows with the code that shows a live run's events.
StepMetrics stepEvent(const StepRow& row);
EpochMetrics epochEvent(const EpochRow& row);

}  // namespace td::api

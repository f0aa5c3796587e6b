// SQLite run store: runs, per-step and per-epoch metrics, per-replica step figures, device
// statistics and log lines (record types: engine/core/run_records.h).
// One database file may be written by one trainer and read by any number of viewers at once (WAL).
// A run left 'running' by a process that died is marked 'interrupted' when the store is opened.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "engine/core/events.h"
#include "engine/core/result.h"
#include "engine/core/run_records.h"

struct sqlite3;

namespace td {

class RunStore {
  public:
    // Opens (creating if needed) and migrates the schema. Errors name the path. A store that
    // cannot be written (a read-only file, folder or mount: storeReadOnlyReason) opens read-only:
    // everything can be read, and every write fails with an error that says the store is
    // read-only.
    static Result<std::unique_ptr<RunStore>> open(const std::string& path);
    ~RunStore();
    RunStore(const RunStore&) = delete;
    RunStore& operator=(const RunStore&) = delete;

    const std::string& path() const { return path_; }
    static int schemaVersion();
    // Why the store was opened read-only; empty when it can be written.
    const std::string& readOnlyReason() const { return readOnlyReason_; }
    bool readOnly() const { return !readOnlyReason_.empty(); }
    // The store's identity (32 hex digits), written into every checkpoint of its runs; empty for
    // a read-only store from before identities (schema 5).
    const std::string& storeId() const { return storeId_; }

    Result<int64_t> createRun(const RunRecord& run);  // returns the new id
    Status finishRun(int64_t runId, RunStatus status, const MetricMap& finalMetrics,
                     const std::string& message);
    // The step rows and the per-replica rows of the same steps, in one transaction: a logged
    // step is stored with its replicas' figures or not at all.
    Status appendSteps(int64_t runId, const std::vector<StepRow>& rows,
                       const std::vector<ReplicaRow>& replicas = {});
    Status appendEpochs(int64_t runId, const std::vector<EpochRow>& rows);
    Status appendDeviceStats(int64_t runId, const std::vector<DeviceRow>& rows);
    // One row per (global step, replica); a row for a pair already stored replaces it.
    Status appendReplicaStats(int64_t runId, const std::vector<ReplicaRow>& rows);
    Status appendLogs(int64_t runId, const std::vector<LogRow>& rows);
    // What a worker of a multi-worker run (not the chief, which writes the run) learned when the
    // run failed under it, kept as an error log line of the run ("worker rank 1: ..."). A run
    // still 'running' under a process of this host that no longer exists (the chief was killed)
    // is marked 'interrupted' at once with this report as its message; a run whose chief lives on
    // another host gets that message when a process there opens the store.
    Status recordWorkerReport(int64_t runId, int rank, const std::string& message);
    // Fills in what is known once the run has started (RunStarted): empty devices and params 0
    // leave the stored values unchanged.
    Status updateRunInfo(int64_t runId, const std::string& devices, int64_t params);
    // A resumed run: status back to 'running' under this process (pid 0 / empty host: this
    // one's), end time and message cleared. Its rows stay.
    Status reopenRun(int64_t runId, int64_t pid = 0, const std::string& host = "");
    // Registers checkpoint files (a row for a path already registered replaces it) and forgets
    // `forget`, in one transaction. Files are not touched. Paths are stored relative to the
    // store's folder where the file lies under it (storedCheckpointPath).
    Status addCheckpoints(int64_t runId, const std::vector<CheckpointRow>& rows,
                          const std::vector<std::string>& forget = {});
    // Newest (highest global step) first; paths as this process opens them
    // (resolvedCheckpointPath).
    Result<std::vector<CheckpointRow>> checkpoints(int64_t runId);

    Result<std::vector<RunRecord>> listRuns();
    // By id ("12") or by name (the newest run with that name).
    Result<RunRecord> findRun(const std::string& idOrName);
    Result<RunRecord> getRun(int64_t runId);
    Result<std::vector<StepRow>> steps(int64_t runId, int64_t afterGlobalStep = 0);
    Result<std::vector<EpochRow>> epochs(int64_t runId);
    Result<std::vector<DeviceRow>> deviceStats(int64_t runId);
    // Ordered by global step, then replica; only the rows after `afterGlobalStep`.
    Result<std::vector<ReplicaRow>> replicaStats(int64_t runId, int64_t afterGlobalStep = 0);
    Result<std::vector<LogRow>> logs(int64_t runId);

    Status renameRun(int64_t runId, const std::string& name);
    Status setNotes(int64_t runId, const std::string& notes);
    Status deleteRun(int64_t runId);  // with all its rows (checkpoint files stay; see runs.h)
    // CSV with one row per epoch, a second section per step (columns from the metric names) and,
    // when the run has per-replica rows, a third section with one row per step and replica.
    Result<std::string> exportCsv(int64_t runId);

  private:
    RunStore() = default;
    // One connection; every public method holds this, so a RunStore may be shared by threads.
    mutable std::mutex mu_;
    sqlite3* db_ = nullptr;
    std::string path_;
    std::string readOnlyReason_;
    std::string storeId_;
    int schema_ = 0;  // the schema its queries may name (kSchemaVersion once migrated)
};

// Why a store file cannot be written ("the file is not writable", "it is on a read-only file
// system", "its folder X is not writable"), or "" when it can, or does not exist yet.
std::string storeReadOnlyReason(const std::string& path);

// The folder of a run's own checkpoints: <folder of the store>/checkpoints/<store file
// name>/run-<id>. Each store has its own, so two stores in one folder never share a file.
std::string runCheckpointDir(const std::string& storePath, int64_t runId);

// A checkpoint file's path as the store keeps it: relative to the store's folder when the file
// lies under it (so the store and its checkpoints can be used from any working folder, or moved
// together), absolute otherwise.
std::string storedCheckpointPath(const std::string& storePath, const std::string& file);
// A stored path as this process opens it: relative ones joined to the store's folder.
std::string resolvedCheckpointPath(const std::string& storePath, const std::string& stored);

// One SQLite connection to a store (for RunStore and RunStoreReader): read-write, creating the
// file when `create`, or read-only when `readOnlyReason` (storeReadOnlyReason) is not empty. A
// read-only WAL store whose shared-memory index cannot be created beside it is opened immutable
// (read as it is on disk). Errors name the path.
Result<sqlite3*> openStoreConnection(const std::string& path, const std::string& readOnlyReason,
                                     bool create);

// Subscribes to a run's events and writes them to the store in batches on its own thread.
// The training thread never touches SQLite. Stops after RunFinished (or when the queue closes).
// A batch that cannot be written (disk full, I/O error) is rolled back; it and every later row are
// dropped, so the store keeps a gapless prefix of the run, marked failed, and memory stays bounded.
class RunRecorder {
  public:
    using ErrorHandler = std::function<void(const std::string& error)>;
    // Opens its own connection to storePath. runId must exist already. onWriteError, when given,
    // is called once, on the recorder's thread, with the first write error (so the trainer can
    // stop instead of training on with nothing stored); it must not block.
    static Result<std::unique_ptr<RunRecorder>> start(const std::string& storePath, int64_t runId,
                                                      std::shared_ptr<EventQueue> events,
                                                      ErrorHandler onWriteError = {});
    ~RunRecorder();  // closes the queue (the run is stored as failed without a RunFinished), joins
    void join();
    // Ends the run with `result` after the events queued before it: writes the remaining rows and
    // the final status, joins, and returns the first write error of the whole run (success when
    // every row and the final status were stored). For a caller that does not publish RunFinished
    // to the recorder's queue itself.
    Status finish(const RunFinished& result);
    // First write error seen, if any.
    std::optional<std::string> lastError() const;

  private:
    RunRecorder() = default;
    struct Impl;
    std::unique_ptr<Impl> impl_;
};

}  // namespace td

// SQLite run store: runs, per-step and per-epoch metrics, device statistics and log lines.
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

struct sqlite3;

namespace td {

struct RunRecord {
    int64_t id = 0;
    std::string name;
    std::string projectJson;         // the project file as trained
    std::string configJson;          // effective settings after CLI overrides (JSON object)
    std::string status = "running";  // runStatusName()
    int64_t startedAtMs = 0;         // unix epoch milliseconds
    int64_t endedAtMs = 0;           // 0 while running
    std::string host;
    int64_t pid = 0;
    std::string devices;  // comma-separated, e.g. "cpu:0,cpu:1"
    std::string modelName;
    int64_t params = 0;
    std::string finalMetricsJson = "{}";
    std::string message;  // failure or stop reason
    std::string notes;
    std::optional<double> bestValAccuracy;  // derived from epoch metrics
    int64_t updatedAtMs = 0;  // last write for this run (create, append, finish); unix ms
};

struct StepRow {
    int64_t globalStep = 0;
    int epoch = 0;
    int64_t step = 0;
    int64_t timeMs = 0;
    MetricMap metrics;  // loss, accuracy, lr, loss_scale, input_wait_s, compute_s, samples_per_s
};

struct EpochRow {
    int epoch = 0;
    int64_t timeMs = 0;
    double seconds = 0;
    MetricMap metrics;  // includes val_* when present
};

struct DeviceRow {
    int64_t timeMs = 0;
    std::string device;
    double utilization = 0;
    int64_t memoryBytes = 0;
    double samplesPerSecond = 0;
};

struct LogRow {
    int64_t timeMs = 0;
    std::string level;  // "info", "warning", "error"
    std::string text;
};

class RunStore {
  public:
    // Opens (creating if needed) and migrates the schema. Errors name the path.
    static Result<std::unique_ptr<RunStore>> open(const std::string& path);
    ~RunStore();
    RunStore(const RunStore&) = delete;
    RunStore& operator=(const RunStore&) = delete;

    const std::string& path() const { return path_; }
    static int schemaVersion();

    Result<int64_t> createRun(const RunRecord& run);  // returns the new id
    Status finishRun(int64_t runId, RunStatus status, const MetricMap& finalMetrics,
                     const std::string& message);
    Status appendSteps(int64_t runId, const std::vector<StepRow>& rows);
    Status appendEpochs(int64_t runId, const std::vector<EpochRow>& rows);
    Status appendDeviceStats(int64_t runId, const std::vector<DeviceRow>& rows);
    Status appendLogs(int64_t runId, const std::vector<LogRow>& rows);
    // Fills in what is known once the run has started (RunStarted): empty devices and params 0
    // leave the stored values unchanged.
    Status updateRunInfo(int64_t runId, const std::string& devices, int64_t params);

    Result<std::vector<RunRecord>> listRuns();
    // By id ("12") or by name (the newest run with that name).
    Result<RunRecord> findRun(const std::string& idOrName);
    Result<RunRecord> getRun(int64_t runId);
    Result<std::vector<StepRow>> steps(int64_t runId, int64_t afterGlobalStep = 0);
    Result<std::vector<EpochRow>> epochs(int64_t runId);
    Result<std::vector<DeviceRow>> deviceStats(int64_t runId);
    Result<std::vector<LogRow>> logs(int64_t runId);

    Status renameRun(int64_t runId, const std::string& name);
    Status setNotes(int64_t runId, const std::string& notes);
    Status deleteRun(int64_t runId);  // with all its rows
    // CSV with one row per epoch (and a second section per step), columns from the metric names.
    Result<std::string> exportCsv(int64_t runId);

  private:
    RunStore() = default;
    // One connection; every public method holds this, so a RunStore may be shared by threads.
    mutable std::mutex mu_;
    sqlite3* db_ = nullptr;
    std::string path_;
};

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

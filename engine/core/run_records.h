// Plain records of the run store, as the store returns them and its readers (the CLI, the GUI
// through engine/api/runs.h) show them. No behaviour: the store (engine/store) reads and writes
// them.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "engine/core/events.h"

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
    // The last epoch's samples/s (RunStoreReader's summaries; not RunStore's).
    std::optional<double> lastEpochSamplesPerSecond;
    int64_t updatedAtMs = 0;  // last write for this run (create, append, finish); unix ms
    // How long the run stood stopped between its sessions (stopped or interrupted, then resumed);
    // 0 for a run never resumed and in stores before schema 7.
    int64_t idleMs = 0;
    // How long it has trained: start to end (to `nowMs` while running), less the idle time.
    int64_t activeMs(int64_t nowMs) const {
        const int64_t end = endedAtMs > 0 ? endedAtMs : nowMs;
        return end - startedAtMs - idleMs > 0 ? end - startedAtMs - idleMs : 0;
    }
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
    // DeviceStats' NVML figures; -1: unknown (stored as NULL; runs before schema 5 have none).
    int64_t memoryUsedBytes = -1;
    int64_t memoryTotalBytes = -1;
    double gpuUtilization = -1;
};

struct LogRow {
    int64_t timeMs = 0;
    std::string level;  // "info", "warning", "error"
    std::string text;
};

// One replica's share of the log interval that ends at `globalStep` (StepMetrics::replicas).
// Times are seconds over the whole interval, as in ReplicaStats; divide by the steps since the
// previous row for a per-step figure.
struct ReplicaRow {
    int64_t globalStep = 0;
    int64_t timeMs = 0;
    ReplicaStats stats;
};

// A checkpoint the store knows a run has (CheckpointSaved).
struct CheckpointRow {
    std::string path;
    std::string kind;  // "run", "model_checkpoint", "backup"
    int64_t globalStep = 0;
    int epoch = 0;
    int64_t stepInEpoch = 0;
    std::optional<double> monitorValue;
    int64_t bytes = 0;
    int64_t createdAtMs = 0;
};

// A consistent snapshot of what a viewer may show, taken in one read transaction.
struct RunListSnapshot {
    // Equal values mean no other connection committed in between (PRAGMA data_version).
    int64_t dataVersion = 0;
    bool unchanged = false;       // dataVersion equals the one passed in: nothing else was read
    std::vector<int64_t> runIds;  // every run, ascending (empty when unchanged)
    // Summaries (RunRecord with projectJson and configJson left empty) of the runs asked for.
    std::vector<RunRecord> runs;
};

}  // namespace td

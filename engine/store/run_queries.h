// Queries for a viewer that polls a run store while other processes write to it (the GUI's Runs
// panel): whether anything was committed since the last look, which runs exist, and run summaries
// without the project documents. The documents of one run come from RunStore::getRun, read only
// for the run that needs them.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "engine/core/result.h"
#include "engine/core/run_records.h"

struct sqlite3;

namespace td {

// Owns its own read connection to an existing store (RunStore::open creates and migrates it).
// Use from one thread at a time.
class RunStoreReader {
  public:
    static Result<std::unique_ptr<RunStoreReader>> open(const std::string& path);
    ~RunStoreReader();
    RunStoreReader(const RunStoreReader&) = delete;
    RunStoreReader& operator=(const RunStoreReader&) = delete;

    const std::string& path() const { return path_; }

    // Every run's summary; when `sinceDataVersion` is given and nothing was committed since then:
    // unchanged, and nothing else is read.
    Result<RunListSnapshot> allRuns(std::optional<int64_t> sinceDataVersion = std::nullopt);
    // When nothing was committed since `sinceDataVersion`: unchanged, and nothing else is read.
    // Otherwise every run id (from an index, not the rows) and the summaries of the runs with an
    // id above `afterId` or listed in `ids`.
    Result<RunListSnapshot> changedRuns(int64_t sinceDataVersion, int64_t afterId,
                                        const std::vector<int64_t>& ids);

  private:
    RunStoreReader() = default;
    Result<RunListSnapshot> snapshot(const int64_t* sinceDataVersion, int64_t afterId,
                                     const std::vector<int64_t>* ids);

    sqlite3* db_ = nullptr;
    std::string path_;
    int schema_ = 0;  // the store's schema when opened (which columns the summaries may name)
};

}  // namespace td

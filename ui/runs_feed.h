// What the Runs panel needs from a store between two looks, worked out off the GUI thread. A look
// costs one PRAGMA when nothing was committed; otherwise it reads the run ids (from an index) and
// the summaries of new runs and of runs that were running, never a project document. Renames and
// notes move no watermark, so every summary is read again now and then (only after a commit).
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "engine/api/runs.h"

namespace td::ui {

struct RunsDelta {
    bool full = false;                // `runs` holds every run; any other run is gone
    std::vector<td::RunRecord> runs;  // new or possibly changed (summaries, no documents)
    std::vector<int64_t> removed;     // ids that are no longer in the store
    std::string error;                // the look failed; nothing else is set
};

// Not thread-safe: one thread (the panel's worker) calls poll().
class RunsFeed {
  public:
    static constexpr std::chrono::seconds kFullReloadEvery{30};

    explicit RunsFeed(std::string path,
                      std::chrono::steady_clock::duration fullReloadEvery = kFullReloadEvery);
    RunsDelta poll();
    // Runs about to run again (a resume): read on every look until they are seen running (or
    // the next full reload), since a run that was not running is otherwise not read again.
    void watch(const std::vector<int64_t>& ids);

  private:
    std::string path_;
    std::chrono::steady_clock::duration fullReloadEvery_;
    std::unique_ptr<td::api::RunWatcher> watcher_;
    bool loaded_ = false;
    std::chrono::steady_clock::time_point lastFull_;
    int64_t dataVersion_ = 0;
    std::vector<int64_t> known_;    // ascending
    std::vector<int64_t> running_;  // runs whose row may still change
    std::vector<int64_t> watched_;  // ascending: resumed runs not yet seen running
};

}  // namespace td::ui

#include "ui/runs_feed.h"

#include <algorithm>
#include <iterator>
#include <utility>

namespace td::ui {

RunsFeed::RunsFeed(std::string path, std::chrono::steady_clock::duration fullReloadEvery)
    : path_(std::move(path)), fullReloadEvery_(fullReloadEvery) {}

RunsDelta RunsFeed::poll() {
    RunsDelta delta;
    if (!watcher_) {
        auto opened = td::api::RunWatcher::open(path_);
        if (!opened) {
            delta.error = opened.error();
            return delta;
        }
        watcher_ = std::move(opened).value();
    }
    const auto now = std::chrono::steady_clock::now();
    const bool full = !loaded_ || now - lastFull_ >= fullReloadEvery_;
    std::vector<int64_t> ids;
    std::set_union(running_.begin(), running_.end(), watched_.begin(), watched_.end(),
                   std::back_inserter(ids));
    auto snap = !loaded_ ? watcher_->allRuns()
                : full
                    ? watcher_->allRuns(dataVersion_)
                    : watcher_->changedRuns(dataVersion_, known_.empty() ? 0 : known_.back(), ids);
    if (!snap) {
        delta.error = snap.error();
        return delta;
    }
    td::RunListSnapshot& s = snap.value();
    if (s.unchanged) return delta;
    loaded_ = true;
    dataVersion_ = s.dataVersion;
    if (full) lastFull_ = now;
    delta.full = full;
    std::set_difference(known_.begin(), known_.end(), s.runIds.begin(), s.runIds.end(),
                        std::back_inserter(delta.removed));
    known_ = std::move(s.runIds);
    // A run that is not running now never runs again, so only these rows can change later (apart
    // from renames and notes, which the full reloads pick up).
    running_.clear();
    for (const td::RunRecord& r : s.runs)
        if (r.status == "running") {
            running_.push_back(r.id);
            std::erase(watched_, r.id);
        }
    std::sort(running_.begin(), running_.end());
    if (full) watched_.clear();
    delta.runs = std::move(s.runs);
    return delta;
}

void RunsFeed::watch(const std::vector<int64_t>& ids) {
    watched_.insert(watched_.end(), ids.begin(), ids.end());
    std::sort(watched_.begin(), watched_.end());
    watched_.erase(std::unique(watched_.begin(), watched_.end()), watched_.end());
}

}  // namespace td::ui

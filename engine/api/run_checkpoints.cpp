#include "engine/api/run_checkpoints.h"

#include <algorithm>
#include <filesystem>
#include <set>

#include "engine/store/run_store.h"

namespace td {

namespace {

std::string normalPath(const std::string& p) {
    std::error_code ec;
    const std::filesystem::path a = std::filesystem::absolute(p, ec);
    return (ec ? std::filesystem::path(p) : a).lexically_normal().string();
}

// Whether the store holds the run's rows up to a checkpoint: a logged step at or after its global
// step (rows are stored in order), and at an epoch boundary the epoch row before it.
Result<bool> rowsStoredUpTo(RunStore& store, int64_t runId, const CheckpointState& st) {
    TD_ASSIGN_OR_RETURN(std::vector<StepRow> after, store.steps(runId, st.globalStep - 1));
    if (after.empty()) return false;
    if (st.stepInEpoch == 0 && st.epoch > 0) {
        TD_ASSIGN_OR_RETURN(std::vector<EpochRow> epochs, store.epochs(runId));
        return std::any_of(epochs.begin(), epochs.end(),
                           [&](const EpochRow& e) { return e.epoch == st.epoch - 1; });
    }
    return true;
}

}  // namespace

CheckpointIdentity runCheckpointIdentity(const RunStore& store, const RunRecord& run) {
    CheckpointIdentity id;
    id.storeId = store.storeId();
    id.storePath = store.path();
    id.runId = run.id;
    id.modelFingerprint = modelFingerprint(run.projectJson);
    return id;
}

Result<RunCheckpointChoice> chooseRunCheckpoint(RunStore& store, const RunRecord& run) {
    TD_ASSIGN_OR_RETURN(std::vector<CheckpointRow> rows, store.checkpoints(run.id));
    const CheckpointIdentity identity = runCheckpointIdentity(store, run);
    RunCheckpointChoice out;

    struct Candidate {
        RunCheckpoint c;
        std::optional<CheckpointState> state;  // unregistered files: read to learn their step
        std::string readError;
    };
    std::vector<Candidate> candidates;
    std::set<std::string> known;
    for (const CheckpointRow& r : rows) {
        Candidate c;
        c.c.path = r.path;
        c.c.globalStep = r.globalStep;
        candidates.push_back(std::move(c));
        known.insert(normalPath(r.path));
    }
    for (const std::string& f : checkpointFilesIn(runCheckpointDir(store.path(), run.id))) {
        if (known.count(normalPath(f))) continue;
        Candidate c;
        c.c.path = f;
        c.c.registered = false;
        auto st = readCheckpoint(f);
        if (st.ok()) {
            c.c.globalStep = st->globalStep;
            c.state = std::move(st).value();
        } else {
            c.readError = st.error();
        }
        candidates.push_back(std::move(c));
    }
    // Newest first; of equal steps the registered one; then by path, so the order is fixed.
    std::stable_sort(candidates.begin(), candidates.end(),
                     [](const Candidate& a, const Candidate& b) {
                         if (a.c.globalStep != b.c.globalStep)
                             return a.c.globalStep > b.c.globalStep;
                         return a.c.registered > b.c.registered;
                     });
    out.candidates = candidates.size();

    for (Candidate& cand : candidates) {
        const std::string what =
            cand.c.registered ? "" : " (found in the run's folder, never registered)";
        if (!cand.readError.empty()) {
            out.refused.push_back(cand.readError + what);
            continue;
        }
        if (!cand.state) {
            auto st = readCheckpoint(cand.c.path);
            if (!st.ok()) {
                out.refused.push_back(st.error() + what);
                continue;
            }
            cand.state = std::move(st).value();
        }
        if (Status id = checkCheckpointIdentity(cand.c.path, *cand.state, identity); !id.ok()) {
            out.refused.push_back(id.error() + what);
            continue;
        }
        // A registered checkpoint always has its rows stored before it. An unregistered one is
        // used only when the store holds its rows too (the process died after storing them,
        // before registering the file); otherwise the resumed run's curves would have a gap.
        if (!cand.c.registered) {
            TD_ASSIGN_OR_RETURN(bool stored, rowsStoredUpTo(store, run.id, *cand.state));
            if (!stored) {
                out.refused.push_back(
                    cand.c.path + ": the store lacks the rows of the steps up to its global step " +
                    std::to_string(cand.state->globalStep) +
                    " (the process ended before it stored them), so continuing from it would "
                    "leave a gap in the run's curves" +
                    what);
                continue;
            }
        }
        // The weights must fit the checkpoint's own model (names and shapes).
        if (auto m = checkpointModel(cand.c.path, *cand.state); !m.ok()) {
            out.refused.push_back(m.error() + what);
            continue;
        }
        cand.c.state = std::make_shared<CheckpointState>(std::move(*cand.state));
        out.chosen = std::move(cand.c);
        break;
    }
    return out;
}

}  // namespace td

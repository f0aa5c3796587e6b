// Internal to engine/api: which checkpoint of a stored run may be used (to resume it, export it or
// predict with it). One choice for every reader, so none of them can be handed another run's,
// another store's or another model's weights.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "engine/core/result.h"
#include "engine/core/run_records.h"
#include "engine/train/checkpoint.h"

namespace td {

class RunStore;

struct RunCheckpoint {
    std::string path;
    int64_t globalStep = 0;
    // false: a file in the run's own folder that the store never registered (the process was
    // killed after writing it, before registering it). It is used only after the same checks.
    bool registered = true;
    std::shared_ptr<CheckpointState> state;
};

struct RunCheckpointChoice {
    std::optional<RunCheckpoint> chosen;  // the newest usable one; none when none is
    // Each newer checkpoint passed over and why ("<path>: <why>"), newest first.
    std::vector<std::string> refused;
    size_t candidates = 0;  // registered rows plus unregistered files looked at
};

// The identity a run's checkpoints must have: the store's id, the run's id and the fingerprint of
// the model the store says the run trained.
CheckpointIdentity runCheckpointIdentity(const RunStore& store, const RunRecord& run);

// The newest checkpoint of stored run `run` (with its documents) that reads back whole, fits its
// own project and has the run's identity (checkCheckpointIdentity): the registered ones and the
// unregistered checkpoint files in the run's own folder (runCheckpointDir), newest (highest global
// step) first, a registered one before an unregistered one of the same step.
Result<RunCheckpointChoice> chooseRunCheckpoint(RunStore& store, const RunRecord& run);

}  // namespace td

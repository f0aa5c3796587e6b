// What a run needs before its trainer, from a project whose overrides are applied: the model's
// shapes, the host resources checked, the initial weights, labels and metrics for the loss, the
// callbacks, the data loaded and split (validation_split, or validation_data "test") and checked
// against the model, and under an MPI launch the workers' process group. Errors name the field
// ("data.validation_split: ...", "training.callbacks[1].config.directory: ...").
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "engine/data/sources.h"
#include "engine/distribute/mpi_collectives.h"
#include "engine/train/trainer.h"

namespace td {

struct RunSetupOptions {
    bool stored = false;  // the run has a store (its checkpoint folder)
    // Run after the project's callbacks (Session's own).
    std::vector<std::shared_ptr<Callback>> callbacks;
    // Start values by parameter name, instead of the project's initial_weights.
    std::map<std::string, Tensor> initialParams;
    DeviceOpener openDevice;
};

struct RunSetup {
    TrainerSetup trainer;
    DataSplits splits;  // as the source gave them (the test split evaluates after fit)
    // MultiWorkerMirrored under an MPI launch: the process group trainer.workers points to; it
    // must outlive the trainer.
    std::unique_ptr<MpiCollectives> workers;
};

// Names the model's unnamed layers in `p` (inferShapes), as the trainer sees them.
Result<RunSetup> prepareRun(Project& p, const RunSetupOptions& opt);

// model_checkpoint and backup_and_restore: written by the trainer (it owns the state they save),
// not Callback objects.
bool isCheckpointCallback(const CallbackConfig& c);

}  // namespace td

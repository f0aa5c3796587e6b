// Checkpoints: everything a run needs to continue where it stopped, in one self-checking file.
//
// File layout (little-endian, as this machine writes it):
//   "TDCKPT\r\n"                 8 bytes of magic
//   u32 format version (3; versions 1 and 2 are read too: 1 has no loss scale, 1 and 2 have no
//   identity), u32 0
//   u64 payload bytes, u64 payload hash (hashBytes, engine/data/cache_file.h)
//   u64 hash of the 32 bytes above
//   payload: the fields of CheckpointState in declaration order (strings and arrays carry their
//   length; tensors their dtype, rank, shape and bytes)
// A file is written to a temporary in the same folder, fsync'd, renamed over its final name and
// the folder fsync'd: a reader sees a whole checkpoint under the final name or none.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "engine/core/events.h"
#include "engine/core/result.h"
#include "engine/core/tensor.h"
#include "engine/graph/update_spec.h"
#include "engine/model/layers.h"
#include "engine/train/callbacks.h"

namespace td {

struct Project;

// One parameter of the model: its graph name ("dense_1/kernel") and value (f32, host).
struct NamedTensor {
    std::string name;
    Tensor value;
};

// A checkpoint writer's own state: the best monitored value so far and the files it keeps, so
// keep-best and keep-last-K go on after a resume as if the run had never stopped.
struct CheckpointWriterState {
    std::string id;  // "run", "callbacks[2]"
    std::optional<double> best;
    std::vector<std::string> kept;  // oldest first, this checkpoint included when it keeps it
};

struct CheckpointState {
    std::string projectJson;  // the project as trained (projectToJson, overrides applied)
    int64_t runId = 0;        // in the run store; 0 without one
    std::string kind;         // "run", "model_checkpoint", "backup"
    // Position. `epoch` is the epoch to continue and `stepInEpoch` its steps already done (0 at
    // an epoch boundary: the epoch's callbacks have run). Randomness is keyed by (seed, global
    // step, sample index) and shuffle orders by (seed, epoch), so seed and position are the
    // whole RNG state and the pipeline's position.
    int64_t globalStep = 0;
    int epoch = 0;
    int64_t stepInEpoch = 0;
    uint64_t seed = 0;
    // The epoch's running sums so far: samples seen and every local replica's accumulators (loss
    // and metric sums, f64), so the averages logged after a resume equal an uninterrupted run's.
    int64_t epochSamples = 0;
    std::vector<std::vector<double>> accumulators;
    MetricMap lastEpochMetrics;  // the last finished epoch's metrics (the run's final metrics)
    std::optional<double> monitorValue;  // the monitored metric when a keep-best writer saved it
    // Every parameter, trainable or not, in Graph::params() order (the model's layers in order,
    // kernel before bias).
    std::vector<NamedTensor> params;
    // Optimizer: updates done (the schedule's step), ReduceLROnPlateau's rate when it set one,
    // and the slots (Optimizer spec's slotsPerParam per trainable parameter, parameter-major).
    int64_t optimizerIterations = 0;
    std::optional<double> learningRateOverride;
    std::vector<Tensor> optimizerSlots;
    std::vector<CallbackState> callbacks;  // one per Callback of the run, in its order
    std::vector<CheckpointWriterState> writers;
    // mixed_float16: the dynamic loss scale (scale, finite steps since its last change, steps
    // skipped); none for other precisions and in files of format version 1.
    std::optional<LossScaleState> lossScale;
    // Of lossScale->skippedSteps, those the trainer had reported (and taken back from the
    // optimizer's iterations) by the checkpoint; the rest are reported at the next log point.
    int64_t lossScaleSkipsReported = 0;
    // Identity (format version 3): the run store the run belongs to (RunStore::storeId; empty
    // without a store) and the fingerprint of the model trained (modelFingerprint of projectJson).
    // With runId they say whose checkpoint this is; every reader checks them
    // (checkCheckpointIdentity), so no store, run or model is ever handed another's weights.
    std::string storeId;
    uint64_t modelFingerprint = 0;
};

// A hash of the model part of a project document (its "model" member, keys sorted): equal for two
// projects whose models are the same layers with the same settings. 0 for text that is not a
// project document.
uint64_t modelFingerprint(const std::string& projectJson);

// What a checkpoint must belong to. Empty or zero fields are not checked.
struct CheckpointIdentity {
    std::string storeId;
    std::string storePath;  // for messages
    int64_t runId = 0;
    uint64_t modelFingerprint = 0;
};

// Checks that a checkpoint is whole in itself (its recorded model fingerprint is its project's)
// and belongs to `expected`: its run, its store, its model. Errors name the file and say whose
// checkpoint it is instead, e.g. "ckpt.tdckpt: belongs to run 1 of another run store (id
// 3f2a...), expected run 1 of a.db".
Status checkCheckpointIdentity(const std::string& path, const CheckpointState& state,
                               const CheckpointIdentity& expected);

// Serializes and writes atomically (temp file, fsync, rename, fsync of the folder); creates the
// folder. Errors name the path and the failing call.
Status writeCheckpoint(const std::string& path, const CheckpointState& state);

// Reads and checks magic, version, sizes and both hashes. Errors name the file and what was
// expected, e.g. "ckpt-40.tdckpt: checksum mismatch (the file is damaged): expected 0x..., got
// 0x...", "ckpt-40.tdckpt: truncated: expected 123456 payload bytes, found 1000".
Result<CheckpointState> readCheckpoint(const std::string& path);

// Checks that a checkpoint fits a model: the same parameters, by name and shape, in order.
// `names`/`shapes` are the model's (Graph::params() order). Errors name the file and the first
// parameter that differs.
Status checkCheckpointParams(const std::string& path, const CheckpointState& state,
                             const std::vector<std::string>& names,
                             const std::vector<Shape>& shapes);

// For exporters: a checkpoint's model and weights.
struct CheckpointModel {
    ModelSpec model;  // shapes inferred, every layer named
    // Every parameter, trainable or not, as host f32 tensors in the model's parameter order:
    // layers in ModelSpec order, each layer's kernel then bias ("dense_1/kernel",
    // "dense_1/bias"), non-trainable ones included.
    std::vector<NamedTensor> weights;
    int64_t runId = 0;
    int64_t globalStep = 0;
    int epoch = 0;  // epochs completed when stepInEpoch is 0
    int64_t stepInEpoch = 0;
    std::string projectJson;  // the project the weights were trained with (checkpointProject)
    std::string storeId;      // the identity it was written with (CheckpointState)
};

// Stable for exporters: reads a checkpoint (readCheckpoint's checks and checkCheckpointIdentity's
// own-consistency check), parses its project and checks that the weights are the model's
// parameters by name and shape. Errors name the file.
Result<CheckpointModel> readCheckpointModel(const std::string& path);
// The same for a checkpoint already read (its state is consumed).
Result<CheckpointModel> checkpointModel(const std::string& path, CheckpointState state);

// Whether a file's first bytes are a checkpoint's magic (at least 8 bytes), so a reader can tell
// a checkpoint by its content, whatever its name.
bool hasCheckpointMagic(std::string_view firstBytes);

// The project stored in a checkpoint, parsed (errors name the file).
Result<Project> checkpointProject(const std::string& path, const CheckpointState& state);

// Tests and tools: a file's bytes for a payload (the header with its sizes and hashes), so a
// fuzzer reaches the payload decoder past the checksums.
std::string checkpointFileBytes(std::string_view payload);

// Tests: the payload writeCheckpoint streams into a file for `state`, as one string.
std::string encodeCheckpointPayload(const CheckpointState& state);

// The checkpoint files in a folder (by content, not name; temporaries left out), in no order.
std::vector<std::string> checkpointFilesIn(const std::string& dir);

}  // namespace td

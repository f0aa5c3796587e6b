// Export, import and prediction from model files: what `traindeck export | import | predict` and
// the GUI's Export call. Formats live in engine/io (onnx_export.h, keras_archive.h); this facade
// says where a model and its weights come from and where they go.
//
// Where weights come from: a Session (its parameters after fit), a project plus a .keras weights
// file, a .keras file alone, or a TrainDeck checkpoint (loadModelFile: the run's project and its
// weights). A stored run's model is its newest good checkpoint (loadRunModel), so `export RUN` and
// the Runs panel's Export are exportRunModel: loadRunModel, then exportModel.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "engine/api/runs.h"
#include "engine/api/session.h"
#include "engine/core/result.h"
#include "engine/io/model_weights.h"
#include "engine/io/project.h"

namespace td {

enum class ExportFormat { Onnx, Keras };
// "onnx" or "keras"; errors list both.
Result<ExportFormat> parseExportFormat(const std::string& name);
const char* exportFormatName(ExportFormat f);

// The session's model with its parameters as they are now (after fit: the trained weights).
Result<ModelWeights> sessionModelWeights(Session& session);
// The project's model with the weights of `weightsPath` (a .keras file, matched by layer name).
Result<ModelWeights> projectModelWeights(const Project& project, const std::string& weightsPath);

// Writes `weights` as an ONNX model or a Keras 3 .keras file (atomically). Errors name the file
// and, for a layer that cannot be exported, the layer.
// `savedAtSeconds` (Unix time; 0: now) is the save time a .keras file records (kerasArchiveBytes):
// a checkpoint's model exported twice gives the same bytes.
Status exportModel(const ModelWeights& weights, ExportFormat format, const std::string& path,
                   int64_t savedAtSeconds = 0);

// A model file opened for prediction or export.
struct LoadedModel {
    ModelWeights weights;
    // The project the model was trained with (a checkpoint's), whose map steps (scaling, say)
    // prediction applies; none for a .keras file, whose model sees the input as it is.
    std::optional<Project> project;
    std::string kind;                   // "keras" or "checkpoint"
    std::vector<std::string> warnings;  // Keras keys accepted but not applied
    // A checkpoint's place: its run's id in the store (0 without one), the global step it was
    // written after, the epoch to continue and that epoch's steps done (0 at an epoch's end).
    int64_t runId = 0;
    int64_t globalStep = 0;
    int epoch = 0;
    int64_t stepInEpoch = 0;
    // When a checkpoint's weights were written (its file's modification time, Unix seconds); 0
    // for a .keras file.
    int64_t savedAtSeconds = 0;
};
// Opens a model file by its content, whatever its name: a Keras 3 .keras zip archive, or a
// TrainDeck checkpoint (.tdckpt: checked whole, its weights against its project's model). Errors
// name the file and what was expected.
Result<LoadedModel> loadModelFile(const std::string& path);

// Predictions of the model for x (f32 or u8, [N, ...input shape] or [N, values]): the model's
// outputs [N, ...output shape], computed by TrainDeck's compiled inference program.
Result<Tensor> predictWithModel(const LoadedModel& model, const Tensor& x);

// A project for a .keras file: its model, `initial_weights` pointing at the file, and the data,
// training and strategy sections of `like` when given (else the defaults, with the optimizer,
// loss and metrics of the file's compile_config when TrainDeck reads them, or a loss that fits
// the model's output: sparse categorical cross-entropy for k >= 2 outputs (from logits when the
// last layer has no softmax), binary cross-entropy for one sigmoid output, mean squared error
// otherwise, without the accuracy metric). The project is validated as parseProject does; errors
// name the field.
struct ImportedProject {
    Project project;
    std::vector<std::string> warnings;
};
Result<ImportedProject> importKerasModel(const std::string& kerasPath, const Project* like);

// A stored run's model: the newest of its checkpoints that reads back whole and fits the run's
// project (api::latestCheckpointForRun; newer damaged ones are skipped), opened by loadModelFile.
struct RunModel {
    int64_t runId = 0;
    std::string runName;
    std::string checkpointPath;
    LoadedModel model;
    std::vector<std::string> notes;  // newer checkpoints that were skipped, each with its reason
};
// Errors name the run and the store, and say why it has no usable checkpoint: its project had
// training.run_checkpoints off, it ended before its first checkpoint, its checkpoint files were
// deleted, or (with each file's reason) none of them reads back.
Result<RunModel> loadRunModel(api::RunCatalog& catalog, int64_t runId);
// Why stored run `runId` has no model to export, in words, from the store and the files' presence
// alone (no checkpoint is read, so a front end can ask whenever the selection changes); empty when
// it has a checkpoint file.
Result<std::string> runModelUnavailable(api::RunCatalog& catalog, int64_t runId);
// loadRunModel, then exportModel to `path`; returns what was exported.
Result<RunModel> exportRunModel(api::RunCatalog& catalog, int64_t runId, ExportFormat format,
                                const std::string& path);

}  // namespace td

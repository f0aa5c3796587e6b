#include "engine/api/export.h"

#include <sys/stat.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "engine/api/run_checkpoints.h"
#include "engine/core/json_text.h"
#include "engine/io/keras_archive.h"
#include "engine/io/onnx_export.h"
#include "engine/store/run_store.h"
#include "engine/train/checkpoint.h"

namespace td {

namespace fs = std::filesystem;

namespace {

// A loss that fits the model's output, for a model that arrives without a project.
LossConfig lossForOutput(const ModelSpec& model, const Shape& out) {
    ActivationKind last = ActivationKind::Linear;
    for (const LayerSpec& l : model.layers)
        if (l.type == LayerType::Dense || l.type == LayerType::Activation) last = l.activation;
    LossConfig loss;
    if (out.size() == 1 && out[0] >= 2) {
        loss.name = "sparse_categorical_crossentropy";
        loss.fromLogits = last != ActivationKind::Softmax;
    } else if (out.size() == 1 && out[0] == 1 && last == ActivationKind::Sigmoid) {
        loss.name = "binary_crossentropy";
    } else {
        loss.name = "mean_squared_error";
    }
    return loss;
}

// A checkpoint as a model: its weights, checked against its project's model, and that project.
Result<LoadedModel> checkpointAsModel(const std::string& path, CheckpointState state) {
    TD_ASSIGN_OR_RETURN(CheckpointModel c, checkpointModel(path, std::move(state)));
    TD_ASSIGN_OR_RETURN(Project project, parseProject(c.projectJson, path));
    LoadedModel m;
    m.weights.model = std::move(c.model);
    for (NamedTensor& t : c.weights) m.weights.params[t.name] = std::move(t.value);
    m.project = std::move(project);
    m.kind = "checkpoint";
    m.runId = c.runId;
    m.globalStep = c.globalStep;
    m.epoch = c.epoch;
    m.stepInEpoch = c.stepInEpoch;
    struct stat st {};
    if (::stat(path.c_str(), &st) == 0) m.savedAtSeconds = static_cast<int64_t>(st.st_mtime);
    return m;
}

Result<LoadedModel> loadCheckpointModel(const std::string& path) {
    TD_ASSIGN_OR_RETURN(CheckpointState state, readCheckpoint(path));
    return checkpointAsModel(path, std::move(state));
}

std::string runLabel(const api::RunCatalog& catalog, const RunRecord& run) {
    return "run " + std::to_string(run.id) + " ('" + run.name + "') in " + catalog.path();
}

// Why a run has no checkpoint to export, or empty when one of its registered files is there.
// `rows` are the run's registered checkpoints, newest first.
std::string noCheckpointReason(const api::RunCatalog& catalog, const RunRecord& run,
                               const std::vector<CheckpointRow>& rows) {
    if (rows.empty()) {
        if (run.status == "running")
            return runLabel(catalog, run) +
                   " has no checkpoint yet: it is running and writes its first one at the end of "
                   "its first epoch";
        const nlohmann::json p = jsonTextProblem(run.projectJson)
                                     ? nlohmann::json()
                                     : nlohmann::json::parse(run.projectJson, nullptr, false);
        const nlohmann::json* training =
            p.is_object() && p.contains("training") ? &p["training"] : nullptr;
        if (training && training->is_object() && training->contains("run_checkpoints") &&
            (*training)["run_checkpoints"] == false)
            return runLabel(catalog, run) +
                   " has no checkpoint: its project had training.run_checkpoints off";
        return runLabel(catalog, run) +
               " has no checkpoint: it ended before its first one (written at each epoch's end "
               "and when a run is stopped), or its checkpoints were deleted";
    }
    for (const CheckpointRow& r : rows) {
        std::error_code ec;
        if (fs::exists(r.path, ec) || ec) return "";
    }
    return runLabel(catalog, run) + " has no checkpoint file left: its " +
           std::to_string(rows.size()) + " registered checkpoint" +
           (rows.size() == 1 ? " was" : "s were") + " deleted (" + rows.front().path +
           " is missing)";
}

}  // namespace

Result<ExportFormat> parseExportFormat(const std::string& name) {
    if (name == "onnx") return ExportFormat::Onnx;
    if (name == "keras") return ExportFormat::Keras;
    return err("unknown export format '" + name + "' (expected onnx or keras)");
}

const char* exportFormatName(ExportFormat f) {
    return f == ExportFormat::Onnx ? "onnx" : "keras";
}

Result<ModelWeights> sessionModelWeights(Session& session) {
    ModelWeights w;
    w.model = session.project().model;
    TD_ASSIGN_OR_RETURN(std::vector<LayerWeights> layout, weightLayout(w.model));
    TD_ASSIGN_OR_RETURN(auto params, session.parameters());
    for (const LayerWeights& lw : layout)
        for (const WeightSlot& s : lw.variables) {
            auto it = params.find(s.param);
            if (it == params.end()) return err("the session has no parameter '" + s.param + "'");
            w.params[s.param] = it->second;
        }
    return w;
}

Result<ModelWeights> projectModelWeights(const Project& project, const std::string& weightsPath) {
    ModelWeights w;
    w.model = project.model;
    TD_ASSIGN_OR_RETURN(std::vector<LayerWeights> layout, weightLayout(w.model));
    TD_ASSIGN_OR_RETURN(w.params, loadWeightsFor(w.model, weightsPath));
    TD_RETURN_IF_ERROR(checkWeights(layout, w.params, weightsPath));
    return w;
}

Status exportModel(const ModelWeights& weights, ExportFormat format, const std::string& path,
                   int64_t savedAtSeconds) {
    switch (format) {
        case ExportFormat::Onnx:
            return saveOnnxModel(weights, path);
        case ExportFormat::Keras:
            return saveKerasArchive(weights, path, savedAtSeconds);
    }
    return err(path + ": unknown export format");
}

Result<LoadedModel> loadModelFile(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    if (!in) {
        std::error_code ec;
        return err(path + ": " + (fs::exists(path, ec) ? "cannot open" : "no such file"));
    }
    char magic[8] = {};
    in.read(magic, 8);
    const auto got = static_cast<size_t>(in.gcount());
    // A TrainDeck checkpoint: the model of the run's project with the checkpoint's weights.
    if (hasCheckpointMagic(std::string_view(magic, got))) return loadCheckpointModel(path);
    // A zip archive (local file header, or the end record of an empty one): a .keras file.
    if (got >= 4 && magic[0] == 'P' && magic[1] == 'K' &&
        ((magic[2] == 3 && magic[3] == 4) || (magic[2] == 5 && magic[3] == 6))) {
        TD_ASSIGN_OR_RETURN(KerasArchive a, loadKerasArchive(path));
        LoadedModel m;
        m.weights = std::move(a.weights);
        m.kind = "keras";
        m.warnings = std::move(a.warnings);
        return m;
    }
    return err(path +
               ": not a model file TrainDeck reads (expected a Keras 3 .keras archive or a "
               "TrainDeck checkpoint .tdckpt)");
}

Result<Tensor> predictWithModel(const LoadedModel& model, const Tensor& xIn) {
    // The model runs in a Session of its own: a project whose data is a tiny synthetic source of
    // the model's input shape (the pipeline needs one; it is never trained on), and whose
    // parameters start from the model's weights.
    Project p = model.project ? *model.project : Project{};
    p.model = model.weights.model;
    p.initialWeights.clear();
    TD_ASSIGN_OR_RETURN(ModelInfo info, inferShapes(p.model));
    if (info.outputShape.size() != 1)
        return err("predict: the model's output has shape " + shapeToString(info.outputShape) +
                   " (expected a vector per sample)");
    if (!model.project) p.training.loss = lossForOutput(p.model, info.outputShape);
    p.training.metrics.clear();
    p.training.callbacks.clear();
    p.training.epochs = 1;
    p.training.initialEpoch = 0;
    p.training.batchSize = 256;
    p.strategy = StrategyConfig{};
    p.precision = PrecisionPolicy::Float32;
    p.data.validationSplit = 0;
    p.data.validationData = "none";
    p.data.pipeline.cache = "none";
    p.data.pipeline.shuffleBuffer = 0;
    SourceConfig src;
    src.type = "synthetic";
    src.samples = p.training.batchSize;
    src.testSamples = 0;
    src.sampleShape = info.inputShape;
    src.classes = std::max<int64_t>(2, info.outputShape[0]);
    p.data.source = src;

    const int64_t values = numElements(info.inputShape);
    if (xIn.rank() < 1 || xIn.dim(0) == 0 || xIn.size() != xIn.dim(0) * values)
        return err("predict: the model expects samples of shape " + shapeToString(info.inputShape) +
                   " (" + std::to_string(values) + " values), got input of shape " +
                   shapeToString(xIn.shape()));
    SessionOptions opt;
    opt.initialParams = model.weights.params;
    auto session = Session::create(p, opt);
    if (!session.ok()) return err("predict: " + session.error());
    Shape shape{xIn.dim(0)};
    shape.insert(shape.end(), info.inputShape.begin(), info.inputShape.end());
    const Tensor x = xIn.dtype() == DType::F32 || xIn.dtype() == DType::U8
                         ? xIn.reshaped(shape)
                         : xIn.to(DType::F32).reshaped(shape);
    return (*session)->predict(x);
}

Result<ImportedProject> importKerasModel(const std::string& kerasPath, const Project* like) {
    TD_ASSIGN_OR_RETURN(KerasArchive a, loadKerasArchive(kerasPath));
    ImportedProject out;
    Project& p = out.project;
    if (like) p = *like;
    p.warnings.clear();
    std::error_code ec;
    const fs::path abs = fs::absolute(kerasPath, ec).lexically_normal();
    p.model = a.weights.model;
    p.initialWeights = ec ? kerasPath : abs.string();
    p.name = fs::path(kerasPath).stem().string();
    if (p.name.empty()) p.name = "imported";
    p.description = "Keras model imported from " + fs::path(kerasPath).filename().string() +
                    (a.kerasVersion.empty() ? "" : " (Keras " + a.kerasVersion + ")");
    TD_ASSIGN_OR_RETURN(ModelInfo info, inferShapes(p.model));
    out.warnings = a.warnings;
    if (!like) {
        p.training.loss = lossForOutput(p.model, info.outputShape);
        // Accuracy needs classes; a regression model is trained with its loss alone.
        if (p.training.loss.name == "mean_squared_error") p.training.metrics.clear();
    }
    // The project as parseProject sees it: every field validated, errors by field path.
    auto parsed = parseProject(projectToJson(p), kerasPath);
    if (!parsed.ok()) return err(parsed.error());
    out.project = std::move(parsed).value();
    if (!like && !a.compileConfigJson.empty()) {
        // What model.compile was given (optimizer, loss, metrics) becomes the training setup
        // when TrainDeck reads it; otherwise the defaults above stay, with a warning.
        const nlohmann::json cc = nlohmann::json::parse(a.compileConfigJson);
        nlohmann::json j = nlohmann::json::parse(projectToJson(out.project));
        for (const char* key : {"optimizer", "loss", "metrics"})
            if (cc.contains(key) && !cc[key].is_null()) j["training"][key] = cc[key];
        auto compiled = parseProject(j.dump(), "compile_config");
        if (compiled.ok()) {
            out.project = std::move(compiled).value();
        } else {
            out.warnings.push_back("compile_config not applied (" + compiled.error() +
                                   "); the project's optimizer, loss and metrics are defaults");
        }
    }
    return out;
}

Result<RunModel> loadRunModel(api::RunCatalog& catalog, int64_t runId) {
    TD_ASSIGN_OR_RETURN(RunRecord run, catalog.run(runId));
    TD_ASSIGN_OR_RETURN(std::unique_ptr<RunStore> store, RunStore::open(catalog.path()));
    // A running run replaces its checkpoints as it goes: a file listed a moment ago may be gone
    // by the time it is read, and the next look finds its successor.
    for (int attempt = 0;; ++attempt) {
        TD_ASSIGN_OR_RETURN(RunCheckpointChoice choice, chooseRunCheckpoint(*store, run));
        if (!choice.chosen) {
            TD_ASSIGN_OR_RETURN(std::vector<CheckpointRow> rows, catalog.checkpoints(runId));
            if (std::string why = noCheckpointReason(catalog, run, rows); !why.empty())
                if (choice.candidates == rows.size()) return err(why);
            if (attempt < 2 && run.status == "running") continue;
            std::string why;
            for (const std::string& r : choice.refused) why += "\n  refused " + r;
            return err("run " + std::to_string(run.id) + " in " + catalog.path() +
                       ": none of its checkpoints can be used:" + why);
        }
        const std::string path = choice.chosen->path;
        TD_ASSIGN_OR_RETURN(LoadedModel model, checkpointAsModel(path, *choice.chosen->state));
        RunModel out;
        out.runId = run.id;
        out.runName = run.name;
        out.checkpointPath = path;
        out.model = std::move(model);
        for (const std::string& r : choice.refused)
            out.notes.push_back("skipped the newer checkpoint " + r);
        if (!choice.chosen->registered)
            out.notes.push_back(path +
                                " was written but never registered in the store (the process "
                                "ended first); it is this run's (store, run and model checked)");
        return out;
    }
}

Result<std::string> runModelUnavailable(api::RunCatalog& catalog, int64_t runId) {
    TD_ASSIGN_OR_RETURN(std::vector<CheckpointRow> rows, catalog.checkpoints(runId));
    for (const CheckpointRow& r : rows) {
        std::error_code ec;
        if (fs::exists(r.path, ec) || ec) return std::string();
    }
    // The run's documents are read only to say why it has none.
    TD_ASSIGN_OR_RETURN(RunRecord run, catalog.run(runId));
    return noCheckpointReason(catalog, run, rows);
}

Result<RunModel> exportRunModel(api::RunCatalog& catalog, int64_t runId, ExportFormat format,
                                const std::string& path) {
    TD_ASSIGN_OR_RETURN(RunModel m, loadRunModel(catalog, runId));
    TD_RETURN_IF_ERROR(exportModel(m.model.weights, format, path, m.model.savedAtSeconds));
    return m;
}

}  // namespace td

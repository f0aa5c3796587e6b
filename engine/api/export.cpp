#include "engine/api/export.h"

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "engine/io/keras_archive.h"
#include "engine/io/onnx_export.h"

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

Status exportModel(const ModelWeights& weights, ExportFormat format, const std::string& path) {
    switch (format) {
        case ExportFormat::Onnx:
            return saveOnnxModel(weights, path);
        case ExportFormat::Keras:
            return saveKerasArchive(weights, path);
    }
    return err(path + ": unknown export format");
}

Result<LoadedModel> loadModelFile(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    if (!in) {
        std::error_code ec;
        return err(path + ": " + (fs::exists(path, ec) ? "cannot open" : "no such file"));
    }
    char magic[4] = {};
    in.read(magic, 4);
    // A zip archive (local file header, or the end record of an empty one): a .keras file.
    // A TrainDeck checkpoint reader variables in here: its own magic -> LoadedModel with the run's
    // project and weights (kind "checkpoint").
    if (in.gcount() == 4 && magic[0] == 'P' && magic[1] == 'K' &&
        ((magic[2] == 3 && magic[3] == 4) || (magic[2] == 5 && magic[3] == 6))) {
        TD_ASSIGN_OR_RETURN(KerasArchive a, loadKerasArchive(path));
        LoadedModel m;
        m.weights = std::move(a.weights);
        m.kind = "keras";
        m.warnings = std::move(a.warnings);
        return m;
    }
    return err(path + ": not a model file TrainDeck reads (expected a Keras 3 .keras archive)");
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

}  // namespace td

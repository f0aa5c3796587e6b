#include "engine/io/keras_archive.h"

#include <ctime>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>

#include "engine/core/json_text.h"
#include "engine/io/keras_weights_h5.h"
#include "engine/io/project.h"
#include "engine/io/zip_archive.h"

namespace td {

namespace {

// The Keras release whose file layout this writes; load_model reads it from any Keras 3.
constexpr const char* kKerasVersion = "3.15.1";

std::string dateSaved(int64_t savedAtSeconds) {
    const std::time_t when =
        savedAtSeconds > 0 ? static_cast<std::time_t>(savedAtSeconds) : std::time(nullptr);
    std::tm tm{};
    gmtime_r(&when, &tm);
    char buf[32];
    std::strftime(buf, sizeof buf, "%Y-%m-%d@%H:%M:%S", &tm);
    return buf;
}

// The weight group path of every layer after the InputLayer: Keras names a Sequential model's
// layers in the weights file by snake_case class name, numbered per class ("dense",
// "dense_1").
std::vector<std::string> groupPaths(const std::vector<LayerWeights>& layout) {
    std::map<std::string, int> used;
    std::vector<std::string> out;
    for (const LayerWeights& lw : layout) {
        const std::string base = kerasSnakeCase(lw.typeName);
        auto [it, fresh] = used.try_emplace(base, 0);
        if (!fresh) ++it->second;
        out.push_back("layers/" +
                      (it->second == 0 ? base : base + "_" + std::to_string(it->second)));
    }
    return out;
}

// serialize_keras_object marks objects that several layers share (the model's dtype policy) with
// a "shared_object_id" next to their full config; to_json() has no such key.
void dropSharedObjectIds(nlohmann::json& j) {
    if (j.is_object()) {
        j.erase("shared_object_id");
        for (auto& [k, v] : j.items()) dropSharedObjectIds(v);
    } else if (j.is_array()) {
        for (auto& v : j) dropSharedObjectIds(v);
    }
}

std::string slotList(const LayerWeights& lw) {
    std::string s;
    for (const WeightSlot& w : lw.variables)
        s += (s.empty() ? "" : ", ") + w.variable + " " + shapeToString(w.shape);
    return s;
}

}  // namespace

Result<std::string> kerasArchiveBytes(const ModelWeights& weights, int64_t savedAtSeconds) {
    TD_ASSIGN_OR_RETURN(std::vector<LayerWeights> layout, weightLayout(weights.model));
    TD_RETURN_IF_ERROR(checkWeights(layout, weights.params, "model weights"));
    // A Dense or Conv2D layer's activation goes out as Keras' activation name, which carries
    // Keras' defaults only (leaky_relu 0.2, elu 1.0).
    for (const LayerWeights& lw : layout) {
        const LayerSpec& l = weights.model.layers[lw.layerIndex];
        if (l.type != LayerType::Dense && l.type != LayerType::Conv2D) continue;
        std::ostringstream v;
        if (l.activation == ActivationKind::LeakyRelu && l.negativeSlope != 0.2)
            v << "leaky_relu with negative_slope " << l.negativeSlope;
        else if (l.activation == ActivationKind::Elu && l.eluAlpha != 1.0)
            v << "elu with alpha " << l.eluAlpha;
        if (!v.str().empty())
            return err("layer " + std::to_string(lw.layerIndex) + " '" + l.name + "' (" +
                       lw.typeName + "): activation " + v.str() + " cannot be written as a Keras " +
                       lw.typeName + " activation (Keras' name means its default); use a linear " +
                       lw.typeName + " layer followed by a LeakyReLU or ELU layer");
    }
    // Layer classes in the weights file follow the classes config.json names; an activation
    // layer written as LeakyReLU/ELU holds no variables, so its group name changes nothing.
    std::vector<H5Group> groups;
    groups.push_back(H5Group{"", weights.model.name, {}});
    const std::vector<std::string> paths = groupPaths(layout);
    for (size_t i = 0; i < layout.size(); ++i) {
        H5Group g{paths[i], layout[i].name, {}};
        for (const WeightSlot& s : layout[i].variables)
            g.vars.push_back(weights.params.at(s.param));
        groups.push_back(std::move(g));
    }
    TD_ASSIGN_OR_RETURN(std::string h5, kerasWeightsH5Bytes(groups));

    nlohmann::json config = nlohmann::json::parse(modelToKerasJson(weights.model));
    // load_model builds the model from its build_config before it reads the weights.
    ModelSpec named = weights.model;
    TD_ASSIGN_OR_RETURN(ModelInfo info, inferShapes(named));
    nlohmann::json batchShape = nlohmann::json::array({nullptr});
    for (int64_t d : info.inputShape) batchShape.push_back(d);
    config["build_config"] = {{"input_shape", batchShape}};
    config["compile_config"] = nullptr;
    const nlohmann::json metadata = {{"keras_version", kKerasVersion},
                                     {"date_saved", dateSaved(savedAtSeconds)}};
    return zipArchiveBytes({{"metadata.json", metadata.dump()},
                            {"config.json", config.dump()},
                            {"model.weights.h5", std::move(h5)}});
}

Status saveKerasArchive(const ModelWeights& weights, const std::string& path,
                        int64_t savedAtSeconds) {
    auto bytes = kerasArchiveBytes(weights, savedAtSeconds);
    if (!bytes.ok()) return err(path + ": " + bytes.error());
    return writeFileAtomic(path, *bytes);
}

Result<KerasArchive> parseKerasArchive(const std::string& bytes, const std::string& fileName) {
    TD_ASSIGN_OR_RETURN(std::vector<ZipMember> members, readZipArchive(bytes, fileName));
    auto member = [&](const std::string& name) -> const std::string* {
        for (const ZipMember& m : members)
            if (m.name == name) return &m.bytes;
        return nullptr;
    };
    const std::string f = fileName + ": ";
    const std::string* configText = member("config.json");
    if (!configText)
        return err(f +
                   "no config.json in the archive (expected a Keras 3 .keras file: "
                   "config.json, metadata.json, model.weights.h5)");
    KerasArchive out;
    if (const std::string* meta = member("metadata.json")) {
        if (const JsonTextProblem p = jsonTextProblem(*meta))
            return err(f + "metadata.json: " + describeJsonTextProblem(p));
        auto j = nlohmann::json::parse(*meta, nullptr, false);
        if (j.is_discarded() || !j.is_object())
            return err(f + "metadata.json: expected a JSON object");
        if (j.contains("keras_version") && j["keras_version"].is_string())
            out.kerasVersion = j["keras_version"].get<std::string>();
        if (!out.kerasVersion.empty() && out.kerasVersion[0] != '3')
            return err(f + "metadata.json: keras_version " + out.kerasVersion +
                       " (expected a file written by Keras 3)");
    }
    // config.json is serialize_keras_object(model): the to_json() object plus build_config and
    // compile_config, which TrainDeck does not need (shapes come from the layers, training
    // settings from the project).
    if (const JsonTextProblem p = jsonTextProblem(*configText))
        return err(f + "config.json: " + describeJsonTextProblem(p));
    auto config = nlohmann::json::parse(*configText, nullptr, false);
    if (config.is_discarded() || !config.is_object())
        return err(f + "config.json: invalid JSON (expected a Keras model object)");
    if (auto cc = config.find("compile_config");
        cc != config.end() && cc->is_object() && !cc->empty())
        out.compileConfigJson = cc->dump();
    config.erase("build_config");
    config.erase("compile_config");
    dropSharedObjectIds(config);
    auto model = modelFromKerasJson(config.dump(), &out.warnings);
    if (!model.ok()) return err(f + "config.json: " + model.error());
    out.weights.model = std::move(*model);
    auto info = inferShapes(out.weights.model);
    if (!info.ok()) return err(f + "config.json: " + info.error());
    auto layout = weightLayout(out.weights.model);
    if (!layout.ok()) return err(f + layout.error());

    const std::string* h5 = member("model.weights.h5");
    if (!h5) {
        if (member("model.weights.npz"))
            return err(f +
                       "weights saved as model.weights.npz; expected model.weights.h5 (save "
                       "with Keras' default weights format)");
        return err(f + "no model.weights.h5 in the archive");
    }
    const std::string h5What = f + "model.weights.h5";
    TD_ASSIGN_OR_RETURN(auto groups, readKerasWeightsH5(*h5, h5What));
    const std::vector<std::string> paths = groupPaths(*layout);
    for (size_t i = 0; i < layout->size(); ++i) {
        const LayerWeights& lw = (*layout)[i];
        const std::string layer =
            "layer " + std::to_string(lw.layerIndex) + " '" + lw.name + "' (" + lw.typeName + ")";
        auto it = groups.find(paths[i]);
        const size_t have = it == groups.end() ? 0 : it->second.size();
        if (have != lw.variables.size())
            return err(h5What + ": " + paths[i] + "/vars: " + std::to_string(have) + " variable" +
                       (have == 1 ? "" : "s") + ", expected " +
                       std::to_string(lw.variables.size()) +
                       (lw.variables.empty() ? "" : " (" + slotList(lw) + ")") + " for " + layer);
        for (size_t k = 0; k < lw.variables.size(); ++k) {
            const WeightSlot& s = lw.variables[k];
            Tensor& t = it->second[k];
            if (t.shape() != s.shape)
                return err(h5What + ": " + paths[i] + "/vars/" + std::to_string(k) + ": shape " +
                           shapeToString(t.shape()) + ", expected " + shapeToString(s.shape) +
                           " (" + s.variable + " of " + layer + ")");
            out.weights.params[s.param] = std::move(t);
        }
    }
    return out;
}

Result<KerasArchive> loadKerasArchive(const std::string& path) {
    TD_ASSIGN_OR_RETURN(std::string bytes, readWholeFile(path, uint64_t{1} << 32));
    return parseKerasArchive(bytes, path);
}

Result<ModelParams> loadWeightsFor(const ModelSpec& model, const std::string& path) {
    TD_ASSIGN_OR_RETURN(std::vector<LayerWeights> layout, weightLayout(model));
    TD_ASSIGN_OR_RETURN(KerasArchive archive, loadKerasArchive(path));
    TD_ASSIGN_OR_RETURN(std::vector<LayerWeights> fileLayout, weightLayout(archive.weights.model));
    ModelParams out;
    for (const LayerWeights& lw : layout) {
        if (lw.variables.empty()) continue;
        const std::string layer = path + ": layer " + std::to_string(lw.layerIndex) + " '" +
                                  lw.name + "' (" + lw.typeName + "): ";
        const LayerWeights* match = nullptr;
        std::string withWeights;
        for (const LayerWeights& f : fileLayout) {
            if (f.name == lw.name) match = &f;
            if (!f.variables.empty()) withWeights += (withWeights.empty() ? "" : ", ") + f.name;
        }
        if (!match)
            return err(layer + "no layer of that name in the file (its layers with weights: " +
                       (withWeights.empty() ? "none" : withWeights) + ")");
        if (match->typeName != lw.typeName)
            return err(layer + "the file's layer of that name is a " + match->typeName);
        for (const WeightSlot& s : lw.variables) {
            auto it = archive.weights.params.find(s.param);
            if (it == archive.weights.params.end())
                return err(layer + "the file's layer has no " + s.variable + " (expected shape " +
                           shapeToString(s.shape) + ")");
            if (it->second.shape() != s.shape)
                return err(layer + s.variable + " has shape " + shapeToString(it->second.shape()) +
                           " in the file, expected " + shapeToString(s.shape));
            out[s.param] = it->second;
        }
    }
    return out;
}

}  // namespace td

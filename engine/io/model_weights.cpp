#include "engine/io/model_weights.h"

#include <algorithm>
#include <cctype>

namespace td {

Result<std::vector<LayerWeights>> weightLayout(const ModelSpec& model) {
    ModelSpec named = model;
    TD_ASSIGN_OR_RETURN(ModelInfo info, inferShapes(named));
    std::vector<LayerWeights> out;
    Shape shape = info.inputShape;
    size_t k = 0;
    for (size_t i = 0; i < named.layers.size(); ++i) {
        const LayerSpec& l = named.layers[i];
        if (l.type == LayerType::Input) continue;
        LayerWeights lw;
        lw.layerIndex = i;
        lw.name = l.name;
        lw.typeName = layerTypeName(l.type);
        lw.inputShape = shape;
        lw.outputShape = info.layers[k++].outputShape;
        shape = lw.outputShape;
        auto slot = [&](const char* variable, Shape s) {
            lw.variables.push_back(WeightSlot{l.name + "/" + variable, variable, std::move(s)});
        };
        switch (l.type) {
            case LayerType::Dense: {
                if (lw.inputShape.size() != 1)
                    return err("layer " + std::to_string(i) + " '" + l.name +
                               "' (Dense): input of shape " + shapeToString(lw.inputShape) +
                               " cannot be exported (expected a vector)");
                slot("kernel", {lw.inputShape[0], l.units});
                if (l.useBias) slot("bias", {l.units});
                break;
            }
            case LayerType::Conv2D:
                // Keras' layout: [kernel h, kernel w, input channels / groups, filters].
                slot("kernel", {l.kernelSize[0], l.kernelSize[1],
                                lw.inputShape.back() / std::max<int64_t>(1, l.groups), l.filters});
                if (l.useBias) slot("bias", {l.filters});
                break;
            case LayerType::BatchNormalization:
                // Keras' order: the trainable gamma and beta, then the moving statistics.
                if (l.scale) slot("gamma", {lw.inputShape.back()});
                if (l.center) slot("beta", {lw.inputShape.back()});
                slot("moving_mean", {lw.inputShape.back()});
                slot("moving_variance", {lw.inputShape.back()});
                break;
            case LayerType::LayerNormalization:
                if (l.scale) slot("gamma", {lw.inputShape.back()});
                if (l.center) slot("beta", {lw.inputShape.back()});
                break;
            case LayerType::Flatten:
            case LayerType::Reshape:
            case LayerType::Dropout:
            case LayerType::Activation:
            case LayerType::MaxPooling2D:
            case LayerType::AveragePooling2D:
            case LayerType::GlobalAveragePooling2D:
            case LayerType::ZeroPadding2D:
            case LayerType::Rescaling:
            case LayerType::Resizing:
            case LayerType::CenterCrop:
            case LayerType::RandomCrop:
            case LayerType::RandomFlip:
            case LayerType::RandomRotation:
            case LayerType::RandomZoom:
            case LayerType::RandomTranslation:
            case LayerType::RandomContrast:
            case LayerType::RandomBrightness:
                break;
            default:
                return err("layer " + std::to_string(i) + " '" + l.name + "' (" + lw.typeName +
                           "): layer type " + lw.typeName + " cannot be exported or imported yet");
        }
        out.push_back(std::move(lw));
    }
    return out;
}

Status checkWeights(const std::vector<LayerWeights>& layout, const ModelParams& params,
                    const std::string& source) {
    size_t expected = 0;
    for (const LayerWeights& lw : layout) {
        const std::string where = source + ": layer " + std::to_string(lw.layerIndex) + " '" +
                                  lw.name + "' (" + lw.typeName + "): ";
        for (const WeightSlot& s : lw.variables) {
            ++expected;
            auto it = params.find(s.param);
            if (it == params.end())
                return err(where + "no " + s.variable + " (expected shape " +
                           shapeToString(s.shape) + ")");
            if (it->second.dtype() != DType::F32)
                return err(where + s.variable + " is not float32");
            if (it->second.shape() != s.shape)
                return err(where + s.variable + " has shape " + shapeToString(it->second.shape()) +
                           ", expected " + shapeToString(s.shape));
        }
    }
    if (params.size() != expected)
        for (const auto& [name, t] : params) {
            bool known = false;
            for (const LayerWeights& lw : layout)
                for (const WeightSlot& s : lw.variables) known = known || s.param == name;
            if (!known)
                return err(source + ": weights '" + name + "' belong to no layer of the model");
        }
    return Status::success();
}

std::string kerasSnakeCase(const std::string& className) {
    // Keras: drop non-word characters, '_' before an upper-case letter that starts a
    // capitalized word ("(.)([A-Z][a-z]+)"), then between a lower-case letter and an upper-case
    // one ("([a-z])([A-Z])"), then lower-case everything.
    std::string s;
    for (char c : className)
        if (std::isalnum(static_cast<unsigned char>(c)) || c == '_') s.push_back(c);
    std::string a;
    for (size_t i = 0; i < s.size(); ++i) {
        const bool upper = std::isupper(static_cast<unsigned char>(s[i]));
        if (i > 0 && upper && i + 1 < s.size() &&
            std::islower(static_cast<unsigned char>(s[i + 1])))
            a.push_back('_');
        a.push_back(s[i]);
    }
    std::string b;
    for (size_t i = 0; i < a.size(); ++i) {
        if (i > 0 && std::isupper(static_cast<unsigned char>(a[i])) &&
            std::islower(static_cast<unsigned char>(a[i - 1])))
            b.push_back('_');
        b.push_back(static_cast<char>(std::tolower(static_cast<unsigned char>(a[i]))));
    }
    return b;
}

}  // namespace td

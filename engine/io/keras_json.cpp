// Keras model.to_json() of a Sequential model, in (Keras 2 and Keras 3 forms) and out (Keras 3).
//
// Read: class_name "Sequential"; config.name; config.layers[] each {class_name, config} plus
// whatever else Keras writes next to them (module, registered_name, build_config: ignored).
// Layer classes: InputLayer, Flatten, Reshape, Dense, Dropout, Activation, Conv2D, MaxPooling2D,
// AveragePooling2D, GlobalAveragePooling2D, BatchNormalization, LayerNormalization,
// ZeroPadding2D, Rescaling, the image preprocessing layers Resizing, CenterCrop, RandomCrop,
// RandomFlip, RandomRotation, RandomZoom, RandomTranslation, RandomContrast, RandomBrightness,
// and the activation layers ReLU (defaults only), LeakyReLU, ELU and Softmax (read as Activation
// layers). Images are channels_last only.
//
// Every key Keras 2.x and 3.x write into these configs is known here. A key that does not change
// the computation is accepted: silently when it holds Keras' default (sparse false, null
// constraints, a float32 dtype policy), with a warning when it holds something TrainDeck does not
// apply but that leaves the model's function unchanged (a mixed-precision dtype policy, a
// non-empty compile_config). A value that would change the computation and that TrainDeck does
// not implement (a constraint, an activity regularizer, a LoRA rank, a quantized policy, ...) is
// an error naming the key. A key this reader does not know (a newer Keras) is accepted with a
// warning when null, and refused by name otherwise: TrainDeck cannot tell what it would change.
#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>

#include "engine/core/names.h"
#include "engine/io/json_fields.h"
#include "engine/io/project.h"

namespace td {

namespace jsonio {

namespace {

const std::vector<std::string>& supportedClasses() {
    static const std::vector<std::string> v{"InputLayer",
                                            "Flatten",
                                            "Reshape",
                                            "Dense",
                                            "Dropout",
                                            "Activation",
                                            "Conv2D",
                                            "MaxPooling2D",
                                            "AveragePooling2D",
                                            "GlobalAveragePooling2D",
                                            "BatchNormalization",
                                            "LayerNormalization",
                                            "ZeroPadding2D",
                                            "Rescaling",
                                            "Resizing",
                                            "CenterCrop",
                                            "RandomCrop",
                                            "RandomFlip",
                                            "RandomRotation",
                                            "RandomZoom",
                                            "RandomTranslation",
                                            "RandomContrast",
                                            "RandomBrightness",
                                            "ReLU",
                                            "LeakyReLU",
                                            "ELU",
                                            "Softmax"};
    return v;
}

// Warnings collected while reading ("<path>: <message>"); the caller decides where they show.
struct Notes {
    std::vector<std::string>* out = nullptr;
    void warn(const std::string& path, const std::string& message) const {
        if (out) out->push_back(path.empty() ? message : path + ": " + message);
    }
};

// Keys of obj outside `known`: a null one is what a newer Keras writes for an option left unset,
// so it is accepted with a warning; any other value is refused naming the key (with checkKeys'
// did-you-mean), since TrainDeck cannot tell what it would change.
void checkKnownKeys(const Json& obj, const std::string& path, const std::vector<std::string>& known,
                    const Notes& notes) {
    for (auto it = obj.begin(); it != obj.end(); ++it) {
        if (std::find(known.begin(), known.end(), it.key()) != known.end()) continue;
        if (it.value().is_null()) {
            notes.warn(child(path, it.key()), "unknown key (null) ignored");
            continue;
        }
        checkKeys(Json{{it.key(), it.value()}}, path, known);
    }
}

std::vector<std::string> concat(std::vector<std::string> a, const std::vector<std::string>& b) {
    a.insert(a.end(), b.begin(), b.end());
    return a;
}

// A dtype or dtype policy: "float32", or {"class_name": "DTypePolicy" (Keras 3), "Policy" (Keras
// 2 mixed precision) or "FloatDTypePolicy", "config": {"name": ...}}. float32 is what TrainDeck
// computes in. Other floating-point policies (mixed_float16, float64, ...) leave the function
// unchanged and are accepted with a warning (the project's precision decides); quantized
// policies change the weights and are refused. An InputLayer may also declare an integer dtype:
// its values reach the first layer as floats, as Keras casts them.
void readDtype(const Json& v, const std::string& path, bool isInput, const Notes& notes) {
    if (v.is_null()) return;
    std::string name;
    std::string namePath = path;
    if (v.is_string()) {
        name = v.get<std::string>();
    } else {
        const KerasRef ref = readKerasRef(v, path, "a dtype name");
        if (ref.name == "QuantizedDTypePolicy" || ref.name == "QuantizedFloat8DTypePolicy")
            fail(ref.namePath, "quantized layers are not supported, got " + squote(ref.name));
        if (ref.name != "DTypePolicy" && ref.name != "FloatDTypePolicy" && ref.name != "Policy")
            fail(ref.namePath,
                 "expected a dtype policy (DTypePolicy, FloatDTypePolicy or Policy), "
                 "got " +
                     squote(ref.name));
        if (!ref.config) return;
        const std::string cpath = child(path, "config");
        checkKnownKeys(*ref.config, cpath, {"name"}, notes);
        const Json* n = member(*ref.config, "name");
        if (!n || n->is_null()) return;
        namePath = child(cpath, "name");
        name = getString(*n, namePath);
    }
    if (name == "float32" || name == "_infer") return;  // Keras 2 _infer: the input's dtype
    static const std::vector<std::string> floats{"mixed_float16", "mixed_bfloat16", "float16",
                                                 "bfloat16", "float64"};
    static const std::vector<std::string> ints{"uint8", "int8",  "uint16", "int16",
                                               "int32", "int64", "uint32", "uint64"};
    const bool isFloat = std::find(floats.begin(), floats.end(), name) != floats.end();
    const bool isInt = std::find(ints.begin(), ints.end(), name) != ints.end();
    if (name.find("_from_") != std::string::npos)  // int8_from_float32, float8_from_mixed_...
        fail(namePath, "quantized layers are not supported, got " + squote(name));
    if (isFloat || (isInput && isInt)) {
        notes.warn(namePath, "dtype " + squote(name) +
                                 " is not applied per layer; TrainDeck computes in float32 "
                                 "unless the project's precision says otherwise");
        return;
    }
    fail(namePath,
         "expected a floating-point dtype (float32, mixed_float16, ...), got " + squote(name));
}

// Fields that must be null (or absent) because TrainDeck has no such feature.
void requireNull(const Json& cfg, const std::string& path, const char* key, const char* what) {
    const Json* v = member(cfg, key);
    if (v && !v->is_null())
        fail(child(path, key),
             std::string(what) + " is not supported (expected null), got " + describe(*v));
}

// A shape without the batch dimension: [28, 28]. Every dimension must be a positive integer.
Shape readShape(const Json& v, const std::string& path) {
    requireArray(v, path);
    Shape s;
    for (size_t i = 0; i < v.size(); ++i) {
        if (v[i].is_null())
            fail(child(path, i), "unknown (null) dimensions are not supported; give a size");
        s.push_back(getPositiveInteger(v[i], child(path, i)));
    }
    if (s.empty()) fail(path, "expected at least one dimension, got []");
    return s;
}

// A shape with the batch dimension first: [null, 28, 28] (the batch size is ignored).
Shape readBatchShape(const Json& v, const std::string& path) {
    requireArray(v, path);
    if (v.empty() || !(v[0].is_null() || v[0].is_number_integer()))
        fail(path,
             "expected [batch, dims...] with the batch size first (null or an integer), got " +
                 v.dump());
    Json rest = Json::array();
    for (size_t i = 1; i < v.size(); ++i) rest.push_back(v[i]);
    try {
        return readShape(rest, path);
    } catch (FieldError& e) {
        // Re-number the element index to its position in the batch shape.
        if (e.path.size() > path.size() && e.path.compare(0, path.size() + 1, path + "[") == 0) {
            size_t idx = std::stoul(e.path.substr(path.size() + 1));
            e.path = child(path, idx + 1);
        }
        throw;
    }
}

// The input shape a layer config may carry: batch_shape / batch_input_shape (with the batch
// dimension), shape / input_shape (without), input_dim (Dense, legacy).
Shape readLayerInputShape(const Json& cfg, const std::string& path) {
    if (const Json* v = member(cfg, "batch_shape"); v && !v->is_null())
        return readBatchShape(*v, child(path, "batch_shape"));
    if (const Json* v = member(cfg, "batch_input_shape"); v && !v->is_null())
        return readBatchShape(*v, child(path, "batch_input_shape"));
    if (const Json* v = member(cfg, "shape"); v && !v->is_null())
        return readShape(*v, child(path, "shape"));
    if (const Json* v = member(cfg, "input_shape"); v && !v->is_null())
        return readShape(*v, child(path, "input_shape"));
    if (const Json* v = member(cfg, "input_dim"); v && !v->is_null())
        return Shape{getPositiveInteger(*v, child(path, "input_dim"))};
    return {};
}

ActivationKind readActivation(const Json& v, const std::string& path) {
    if (v.is_null()) return ActivationKind::Linear;
    std::string name;
    if (v.is_string()) {
        name = v.get<std::string>();
    } else if (v.is_object() && member(v, "config") && (*member(v, "config")).is_string()) {
        // Keras 3 may serialize a built-in activation function as an object whose config is
        // the function's name.
        name = (*member(v, "config")).get<std::string>();
    } else {
        fail(path, "expected an activation name (a string), got " + describe(v));
    }
    if (name == "leaky_relu" || name == "LeakyReLU") name = "leaky_relu";
    auto a = parseActivation(name);
    if (!a) fail(path, a.error());
    return *a;
}

// Keras 3.15 input_axes / output_axes: null or a list of axes.
std::vector<int64_t> readAxes(const Json& v, const std::string& path) {
    std::vector<int64_t> axes;
    if (v.is_null()) return axes;
    requireArray(v, path);
    if (v.empty()) fail(path, "expected null or at least one axis, got []");
    for (size_t i = 0; i < v.size(); ++i) axes.push_back(getInteger(v[i], child(path, i)));
    return axes;
}

// What Keras' from_config accepts for each initializer, with its defaults (InitializerSpec).
InitializerSpec readInitializer(const Json& v, const std::string& path, const char* fallback,
                                const Notes& notes) {
    InitializerSpec spec;
    spec.name = fallback;
    if (v.is_null()) return spec;
    const KerasRef ref = readKerasRef(v, path, "an initializer name");
    const Json* cfg = ref.config;
    auto name = canonicalInitializerName(ref.name);
    if (!name) fail(ref.namePath, name.error());
    spec.name = *name;
    const std::string& n = spec.name;
    if (!cfg) return spec;
    const std::string cpath = child(path, "config");
    const bool scaled = n == "glorot_uniform" || n == "glorot_normal" || n == "he_uniform" ||
                        n == "he_normal" || n == "lecun_uniform" || n == "lecun_normal";
    std::vector<std::string> known;
    if (n == "constant") known = {"value"};
    if (n == "random_uniform") known = {"seed", "minval", "maxval"};
    if (n == "random_normal" || n == "truncated_normal") known = {"seed", "mean", "stddev"};
    if (scaled) known = {"seed", "input_axes", "output_axes"};
    if (n == "variance_scaling")
        known = {"seed", "scale", "mode", "distribution", "input_axes", "output_axes"};
    if (n == "orthogonal") known = {"seed", "gain"};
    if (n == "identity") known = {"gain"};
    // Keras 2's v1 initializers write a dtype; it does not change the values.
    known.push_back("dtype");
    checkKnownKeys(*cfg, cpath, known, notes);
    if (const Json* s = member(*cfg, "seed")) spec.seed = getOptionalSeed(*s, child(cpath, "seed"));
    if (const Json* x = member(*cfg, "value")) spec.value = getNumber(*x, child(cpath, "value"));
    if (const Json* x = member(*cfg, "minval")) spec.minval = getNumber(*x, child(cpath, "minval"));
    if (const Json* x = member(*cfg, "maxval")) spec.maxval = getNumber(*x, child(cpath, "maxval"));
    if (const Json* x = member(*cfg, "mean")) spec.mean = getNumber(*x, child(cpath, "mean"));
    if (const Json* x = member(*cfg, "stddev"))
        spec.stddev = getPositiveNumber(*x, child(cpath, "stddev"));
    if (const Json* x = member(*cfg, "gain")) spec.gain = getNumber(*x, child(cpath, "gain"));
    if (const Json* x = member(*cfg, "scale"))
        spec.scale = getPositiveNumber(*x, child(cpath, "scale"));
    if (const Json* x = member(*cfg, "mode"))
        spec.mode = getOneOf(*x, child(cpath, "mode"), {"fan_in", "fan_out", "fan_avg"});
    if (const Json* x = member(*cfg, "distribution")) {
        // Keras lower-cases the distribution and reads "normal" as "truncated_normal".
        const std::string dpath = child(cpath, "distribution");
        std::string d = getString(*x, dpath);
        for (char& c : d) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
        if (d == "normal") d = "truncated_normal";
        spec.distribution =
            getOneOf(Json(d), dpath, {"truncated_normal", "untruncated_normal", "uniform"});
    }
    if (const Json* x = member(*cfg, "input_axes"))
        spec.inputAxes = readAxes(*x, child(cpath, "input_axes"));
    if (const Json* x = member(*cfg, "output_axes"))
        spec.outputAxes = readAxes(*x, child(cpath, "output_axes"));
    if (spec.inputAxes.empty() != spec.outputAxes.empty()) {
        // Keras uses the axes only when both are given.
        notes.warn(child(cpath, spec.inputAxes.empty() ? "output_axes" : "input_axes"),
                   "ignored without " +
                       std::string(spec.inputAxes.empty() ? "input_axes" : "output_axes") +
                       " (Keras uses them only together)");
        spec.inputAxes.clear();
        spec.outputAxes.clear();
    }
    if (n == "random_uniform" && !(spec.minval < spec.maxval))
        fail(cpath, "expected minval < maxval, got minval " + Json(spec.minval).dump() +
                        " and maxval " + Json(spec.maxval).dump());
    return spec;
}

RegularizerSpec readRegularizer(const Json& v, const std::string& path) {
    RegularizerSpec spec;
    if (v.is_null()) return spec;
    const KerasRef ref = readKerasRef(v, path, "null, a regularizer name");
    const Json* cfg = ref.config;
    const std::string& className = ref.name;
    const std::string key = squashName(className);
    // Keras defaults: L1(l1=0.01), L2(l2=0.01), L1L2(l1=0.0, l2=0.0).
    std::vector<std::string> valid;
    if (key == "l1") {
        spec.l1 = 0.01;
        valid = {"l1"};
    } else if (key == "l2") {
        spec.l2 = 0.01;
        valid = {"l2"};
    } else if (key == "l1l2") {
        valid = {"l1", "l2"};
    } else {
        fail(v.is_object() ? child(path, "class_name") : path,
             "unsupported regularizer " + squote(className) + " (supported: L1, L2, L1L2)");
    }
    if (cfg) {
        const std::string cpath = child(path, "config");
        checkKeys(*cfg, cpath, valid);
        if (const Json* x = member(*cfg, "l1"))
            spec.l1 = getNonNegativeNumber(*x, child(cpath, "l1"));
        if (const Json* x = member(*cfg, "l2"))
            spec.l2 = getNonNegativeNumber(*x, child(cpath, "l2"));
    }
    return spec;
}

// Keys Keras writes into every layer config (Keras 2 and 3), plus the input shape keys a first
// layer may carry.
const std::vector<std::string>& commonLayerKeys() {
    static const std::vector<std::string> v{
        "name",        "trainable", "dtype",      "batch_shape",          "batch_input_shape",
        "input_shape", "input_dim", "batch_size", "activity_regularizer", "autocast"};
    return v;
}

// Keys of each class beyond the common ones.
std::vector<std::string> classKeys(const std::string& className) {
    if (className == "InputLayer")
        return {"shape", "sparse", "ragged", "optional", "batch_size", "input_tensor"};
    if (className == "Flatten") return {"data_format"};
    if (className == "Reshape") return {"target_shape"};
    if (className == "Dense")
        return {"units",
                "activation",
                "use_bias",
                "kernel_initializer",
                "bias_initializer",
                "kernel_regularizer",
                "bias_regularizer",
                "kernel_constraint",
                "bias_constraint",
                "lora_rank",
                "lora_alpha",
                "quantization_config"};
    if (className == "Dropout") return {"rate", "seed", "noise_shape"};
    if (className == "Activation") return {"activation"};
    if (className == "ReLU") return {"max_value", "negative_slope", "threshold"};
    if (className == "LeakyReLU") return {"negative_slope", "alpha"};
    if (className == "ELU") return {"alpha"};
    if (className == "Softmax") return {"axis"};
    if (className == "Conv2D")
        return {"filters",          "kernel_size",        "strides",          "padding",
                "data_format",      "dilation_rate",      "groups",           "activation",
                "use_bias",         "kernel_initializer", "bias_initializer", "kernel_regularizer",
                "bias_regularizer", "kernel_constraint",  "bias_constraint",  "lora_rank",
                "lora_alpha"};
    if (className == "MaxPooling2D" || className == "AveragePooling2D")
        return {"pool_size", "strides", "padding", "data_format"};
    if (className == "GlobalAveragePooling2D") return {"data_format", "keepdims"};
    if (className == "BatchNormalization")
        return {"axis",
                "momentum",
                "epsilon",
                "center",
                "scale",
                "beta_initializer",
                "gamma_initializer",
                "moving_mean_initializer",
                "moving_variance_initializer",
                "beta_regularizer",
                "gamma_regularizer",
                "beta_constraint",
                "gamma_constraint",
                "synchronized",
                "renorm",
                "renorm_clipping",
                "renorm_momentum",
                "fused",
                "virtual_batch_size",
                "adjustment"};
    if (className == "LayerNormalization")
        return {"axis",
                "epsilon",
                "center",
                "scale",
                "rms_scaling",
                "beta_initializer",
                "gamma_initializer",
                "beta_regularizer",
                "gamma_regularizer",
                "beta_constraint",
                "gamma_constraint"};
    if (className == "ZeroPadding2D") return {"padding", "data_format"};
    if (className == "Rescaling") return {"scale", "offset"};
    // The image preprocessing layers (Keras 3's get_config; bounding_box_format only when set).
    const std::vector<std::string> image{"data_format", "bounding_box_format"};
    if (className == "Resizing")
        return concat(image, {"height", "width", "interpolation", "crop_to_aspect_ratio",
                              "pad_to_aspect_ratio", "fill_mode", "fill_value", "antialias"});
    if (className == "CenterCrop") return concat(image, {"height", "width"});
    if (className == "RandomCrop") return concat(image, {"height", "width", "seed"});
    if (className == "RandomFlip") return concat(image, {"mode", "seed"});
    if (className == "RandomRotation")
        return concat(image, {"factor", "fill_mode", "fill_value", "interpolation", "seed"});
    if (className == "RandomZoom" || className == "RandomTranslation")
        return concat(image, {"height_factor", "width_factor", "fill_mode", "interpolation", "seed",
                              "fill_value"});
    if (className == "RandomContrast" || className == "RandomBrightness")
        return concat(image, {"factor", "value_range", "seed"});
    return {};
}

// kernel_size, strides, pool_size, dilation_rate: an integer or two integers [h, w].
Shape readPair(const Json& v, const std::string& path) {
    if (v.is_number()) {
        const int64_t n = getPositiveInteger(v, path);
        return {n, n};
    }
    requireArray(v, path);
    if (v.size() != 2) fail(path, "expected an integer or two integers [h, w], got " + describe(v));
    return {getPositiveInteger(v[0], child(path, 0)), getPositiveInteger(v[1], child(path, 1))};
}

void readChannelsLast(const Json& cfg, const std::string& cpath) {
    if (const Json* x = member(cfg, "data_format");
        x && !x->is_null() && !(x->is_string() && x->get<std::string>() == "channels_last"))
        fail(child(cpath, "data_format"),
             "only \"channels_last\" is supported, got " + describe(*x));
}

// padding "valid" or "same" -> samePadding.
bool readSamePadding(const Json& cfg, const std::string& cpath) {
    const Json* x = member(cfg, "padding");
    if (!x) return false;
    std::string p = getString(*x, child(cpath, "padding"));
    std::transform(p.begin(), p.end(), p.begin(),
                   [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
    if (p != "valid" && p != "same")
        fail(child(cpath, "padding"), "expected \"valid\" or \"same\", got " + describe(*x));
    return p == "same";
}

// ZeroPadding2D padding: n, [h, w] or [[top, bottom], [left, right]] -> [top, bottom, left, right].
Shape readZeroPadding(const Json& v, const std::string& path) {
    if (v.is_number()) {
        const int64_t n = getNonNegativeInteger(v, path);
        return {n, n, n, n};
    }
    requireArray(v, path);
    if (v.size() != 2)
        fail(path,
             "expected an integer, [h, w] or [[top, bottom], [left, right]], got " + describe(v));
    Shape out;
    for (size_t a = 0; a < 2; ++a) {
        if (v[a].is_array()) {
            if (v[a].size() != 2)
                fail(child(path, a), "expected two integers, got " + describe(v[a]));
            out.push_back(getNonNegativeInteger(v[a][0], child(child(path, a), 0)));
            out.push_back(getNonNegativeInteger(v[a][1], child(child(path, a), 1)));
        } else {
            const int64_t n = getNonNegativeInteger(v[a], child(path, a));
            out.push_back(n);
            out.push_back(n);
        }
    }
    return out;
}

// BatchNormalization / LayerNormalization axis: the last one only (-1, or [-1]).
void readLastAxis(const Json& cfg, const std::string& cpath) {
    const Json* x = member(cfg, "axis");
    if (!x) return;
    const bool last = (x->is_number_integer() && x->get<int64_t>() == -1) ||
                      (x->is_array() && x->size() == 1 && (*x)[0].is_number_integer() &&
                       (*x)[0].get<int64_t>() == -1);
    if (!last)
        fail(child(cpath, "axis"),
             "only the last axis (-1, channels_last) is supported, got " + describe(*x));
}

// The normalization layers' shared keys.
void readNormalization(const Json& cfg, const std::string& cpath, LayerSpec& layer,
                       const Notes& notes) {
    readLastAxis(cfg, cpath);
    if (const Json* x = member(cfg, "epsilon"))
        layer.epsilon = getPositiveNumber(*x, child(cpath, "epsilon"));
    if (const Json* x = member(cfg, "center")) layer.center = getBool(*x, child(cpath, "center"));
    if (const Json* x = member(cfg, "scale")) layer.scale = getBool(*x, child(cpath, "scale"));
    if (const Json* x = member(cfg, "beta_initializer"))
        layer.betaInitializer =
            readInitializer(*x, child(cpath, "beta_initializer"), "zeros", notes);
    if (const Json* x = member(cfg, "gamma_initializer"))
        layer.gammaInitializer =
            readInitializer(*x, child(cpath, "gamma_initializer"), "ones", notes);
    for (const char* key : {"beta_regularizer", "gamma_regularizer"})
        if (const Json* x = member(cfg, key); x && readRegularizer(*x, child(cpath, key)).active())
            fail(child(cpath, key), "a regularizer on a normalization layer is not supported");
    requireNull(cfg, cpath, "beta_constraint", "a beta constraint");
    requireNull(cfg, cpath, "gamma_constraint", "a gamma constraint");
}

// A random factor as Keras 3 normalizes it into (lower, upper). `lo`..`hi`: the bounds Keras
// checks (each value of RandomZoom's must exceed -1: `loOpen`). The base image layers
// (RandomRotation, RandomContrast, RandomBrightness; `perValue` false) check a pair loosely (its
// first value at most hi, its second at least lo) and map a number f to (max(-|f|, lo), |f|);
// RandomZoom and RandomTranslation (`perValue`) check every value and map f to (-|f|, |f|).
FactorRange readFactor(const Json& v, const std::string& path, double lo, double hi, bool perValue,
                       bool loOpen = false) {
    char bounds[64];
    std::snprintf(bounds, sizeof bounds, "%s%g, %g]", loOpen ? "(" : "[", lo, hi);
    auto inBounds = [&](double d) { return (loOpen ? d > lo : d >= lo) && d <= hi; };
    if (v.is_array()) {
        if (v.size() != 2 || !v[0].is_number() || !v[1].is_number())
            fail(path, "expected a number or two numbers [lower, upper] in " + std::string(bounds) +
                           ", got " + describe(v));
        const double a = v[0].get<double>(), b = v[1].get<double>();
        if (perValue ? !(inBounds(a) && inBounds(b)) : (a > hi || b < lo))
            fail(path, "expected values in " + std::string(bounds) + ", got " + describe(v));
        return FactorRange{std::min(a, b), std::max(a, b)};
    }
    if (!v.is_number() || !inBounds(v.get<double>()))
        fail(path, "expected a number or two numbers [lower, upper] in " + std::string(bounds) +
                       ", got " + describe(v));
    const double f = std::fabs(v.get<double>());
    return FactorRange{perValue ? -f : std::max(-f, lo), f};
}

// value_range: two numbers [low, high] (RandomBrightness sorts them, as Keras does).
void readValueRange(const Json& cfg, const std::string& cpath, LayerSpec& layer, bool sort) {
    const Json* v = member(cfg, "value_range");
    if (!v || v->is_null()) return;
    const std::string path = child(cpath, "value_range");
    if (!v->is_array() || v->size() != 2 || !(*v)[0].is_number() || !(*v)[1].is_number())
        fail(path, "expected two numbers [low, high], got " + describe(*v));
    layer.valueLow = (*v)[0].get<double>();
    layer.valueHigh = (*v)[1].get<double>();
    if (sort && layer.valueLow > layer.valueHigh) std::swap(layer.valueLow, layer.valueHigh);
    if (!(layer.valueLow < layer.valueHigh))
        fail(path, "expected two numbers [low, high] with low < high, got " + describe(*v));
}

// interpolation "bilinear" or "nearest" (Keras' other methods are refused by name).
InterpolationKind readInterpolation(const Json& cfg, const std::string& cpath) {
    const Json* v = member(cfg, "interpolation");
    if (!v || v->is_null()) return InterpolationKind::Bilinear;
    return *parseInterpolation(
        getOneOf(*v, child(cpath, "interpolation"), {"bilinear", "nearest"}));
}

FillModeKind readFillMode(const Json& cfg, const std::string& cpath) {
    const Json* v = member(cfg, "fill_mode");
    if (!v || v->is_null()) return FillModeKind::Reflect;
    return *parseFillMode(
        getOneOf(*v, child(cpath, "fill_mode"), {"reflect", "wrap", "constant", "nearest"}));
}

// The keys every image preprocessing layer shares: channels_last images; bounding boxes are not
// part of a TrainDeck model's inputs, so a bounding_box_format changes nothing here.
void readImagePreprocessing(const Json& cfg, const std::string& cpath, LayerSpec& layer,
                            const Notes& notes) {
    if (const Json* x = member(cfg, "data_format");
        x && !x->is_null() && !(x->is_string() && x->get<std::string>() == "channels_last"))
        fail(child(cpath, "data_format"),
             "only \"channels_last\" images ([height, width, channels]) are supported, got " +
                 describe(*x));
    if (const Json* x = member(cfg, "bounding_box_format"); x && !x->is_null())
        notes.warn(child(cpath, "bounding_box_format"),
                   "ignored: the model's inputs are images, without bounding boxes");
    if (const Json* x = member(cfg, "seed")) layer.seed = getOptionalSeed(*x, child(cpath, "seed"));
    if (const Json* x = member(cfg, "fill_value"); x && !x->is_null())
        layer.fillValue = getNumber(*x, child(cpath, "fill_value"));
}

LayerSpec readLayer(const Json& entry, const std::string& path, size_t index, const Notes& notes) {
    requireObject(entry, path);
    const std::string className =
        getString(requireMember(entry, path, "class_name"), child(path, "class_name"));
    const Json emptyConfig = Json::object();
    const Json* cfgPtr = member(entry, "config");
    if (cfgPtr && cfgPtr->is_null()) cfgPtr = nullptr;
    const Json& cfg = cfgPtr ? *cfgPtr : emptyConfig;
    const std::string cpath = child(path, "config");
    requireObject(cfg, cpath);

    LayerSpec layer;
    bool isActivationLayer = false;
    if (className == "ReLU" || className == "LeakyReLU" || className == "ELU" ||
        className == "Softmax") {
        isActivationLayer = true;
        layer.type = LayerType::Activation;
    } else {
        auto t = parseLayerType(className);
        if (!t)
            fail(child(path, "class_name"),
                 "layer " + std::to_string(index) + " has unsupported class " + squote(className) +
                     " (supported: " + joinPlain(supportedClasses()) + ")");
        layer.type = *t;
    }

    if (const Json* n = member(cfg, "name"); n && !n->is_null())
        layer.name = getString(*n, child(cpath, "name"));
    else if (const Json* n2 = member(entry, "name"); n2 && n2->is_string())
        layer.name = n2->get<std::string>();
    checkKnownKeys(cfg, cpath, concat(commonLayerKeys(), classKeys(className)), notes);
    if (const Json* t = member(cfg, "trainable"); t && !t->is_null())
        layer.trainable = getBool(*t, child(cpath, "trainable"));
    if (const Json* d = member(cfg, "dtype"))
        readDtype(*d, child(cpath, "dtype"), layer.type == LayerType::Input, notes);
    layer.inputShape = readLayerInputShape(cfg, cpath);
    requireNull(cfg, cpath, "activity_regularizer", "an activity regularizer");
    // Keras 2's autocast: whether inputs are cast to the compute dtype, float32 either way here.
    if (const Json* x = member(cfg, "autocast"); x && !x->is_null())
        getBool(*x, child(cpath, "autocast"));
    if (const Json* x = member(cfg, "batch_size"); x && !x->is_null())
        getPositiveInteger(*x, child(cpath, "batch_size"));  // the project's batch_size decides

    if (isActivationLayer) {
        if (className == "ReLU") {
            layer.activation = ActivationKind::Relu;
            requireNull(cfg, cpath, "max_value", "a ReLU max_value");
            for (const char* key : {"negative_slope", "threshold"})
                if (const Json* x = member(cfg, key);
                    x && !(x->is_number() && x->get<double>() == 0.0))
                    fail(child(cpath, key), "only 0 is supported, got " + describe(*x));
        } else if (className == "LeakyReLU") {
            layer.activation = ActivationKind::LeakyRelu;
            layer.negativeSlope = 0.3;  // Keras' LeakyReLU layer default (Keras 2 and 3)
            if (const Json* x = member(cfg, "negative_slope"))
                layer.negativeSlope = getNonNegativeNumber(*x, child(cpath, "negative_slope"));
            else if (const Json* a = member(cfg, "alpha"))
                layer.negativeSlope = getNonNegativeNumber(*a, child(cpath, "alpha"));
        } else if (className == "ELU") {
            layer.activation = ActivationKind::Elu;
            if (const Json* x = member(cfg, "alpha"))
                layer.eluAlpha = getPositiveNumber(*x, child(cpath, "alpha"));
        } else {  // Softmax
            layer.activation = ActivationKind::Softmax;
            if (const Json* x = member(cfg, "axis");
                x && !(x->is_number_integer() && x->get<int64_t>() == -1))
                fail(child(cpath, "axis"),
                     "only the last axis (-1) is supported, got " + describe(*x));
        }
        return layer;
    }

    switch (layer.type) {
        case LayerType::Input:
            if (layer.inputShape.empty())
                fail(cpath,
                     "an InputLayer needs batch_shape (Keras 3), batch_input_shape "
                     "(Keras 2) or shape");
            for (const char* key : {"sparse", "ragged", "optional"})
                if (const Json* x = member(cfg, key); x && !x->is_null())
                    if (getBool(*x, child(cpath, key)))
                        fail(child(cpath, key), std::string(key) + " inputs are not supported");
            requireNull(cfg, cpath, "input_tensor", "an input tensor");
            break;
        case LayerType::Flatten:
            if (const Json* x = member(cfg, "data_format");
                x && !x->is_null() && !(x->is_string() && x->get<std::string>() == "channels_last"))
                fail(child(cpath, "data_format"),
                     "only \"channels_last\" is supported, got " + describe(*x));
            break;
        case LayerType::Reshape: {
            const Json& ts = requireMember(cfg, cpath, "target_shape");
            const std::string tpath = child(cpath, "target_shape");
            requireArray(ts, tpath);
            if (ts.empty()) fail(tpath, "expected at least one dimension, got []");
            for (size_t i = 0; i < ts.size(); ++i) {
                int64_t d = getInteger(ts[i], child(tpath, i));
                if (d == 0 || d < -1)
                    fail(child(tpath, i),
                         "expected a positive integer or -1, got " + describe(ts[i]));
                layer.targetShape.push_back(d);
            }
            break;
        }
        case LayerType::Dense:
            layer.units =
                getPositiveInteger(requireMember(cfg, cpath, "units"), child(cpath, "units"));
            if (const Json* x = member(cfg, "activation"))
                layer.activation = readActivation(*x, child(cpath, "activation"));
            if (const Json* x = member(cfg, "use_bias"))
                layer.useBias = getBool(*x, child(cpath, "use_bias"));
            if (const Json* x = member(cfg, "kernel_initializer"))
                layer.kernelInitializer = readInitializer(*x, child(cpath, "kernel_initializer"),
                                                          "glorot_uniform", notes);
            if (const Json* x = member(cfg, "bias_initializer"))
                layer.biasInitializer =
                    readInitializer(*x, child(cpath, "bias_initializer"), "zeros", notes);
            if (const Json* x = member(cfg, "kernel_regularizer"))
                layer.kernelRegularizer = readRegularizer(*x, child(cpath, "kernel_regularizer"));
            if (const Json* x = member(cfg, "bias_regularizer"))
                layer.biasRegularizer = readRegularizer(*x, child(cpath, "bias_regularizer"));
            requireNull(cfg, cpath, "kernel_constraint", "a kernel constraint");
            requireNull(cfg, cpath, "bias_constraint", "a bias constraint");
            requireNull(cfg, cpath, "lora_rank", "LoRA");
            requireNull(cfg, cpath, "quantization_config", "quantization");
            break;
        case LayerType::Dropout:
            layer.rate = getNumberInRange(requireMember(cfg, cpath, "rate"), child(cpath, "rate"),
                                          0.0, 1.0, false);
            if (const Json* x = member(cfg, "seed"))
                layer.seed = getOptionalSeed(*x, child(cpath, "seed"));
            requireNull(cfg, cpath, "noise_shape", "a Dropout noise_shape");
            break;
        case LayerType::Activation:
            layer.activation =
                readActivation(requireMember(cfg, cpath, "activation"), child(cpath, "activation"));
            break;
        case LayerType::Conv2D:
            layer.filters =
                getPositiveInteger(requireMember(cfg, cpath, "filters"), child(cpath, "filters"));
            layer.kernelSize =
                readPair(requireMember(cfg, cpath, "kernel_size"), child(cpath, "kernel_size"));
            if (const Json* x = member(cfg, "strides"); x && !x->is_null())
                layer.strides = readPair(*x, child(cpath, "strides"));
            if (const Json* x = member(cfg, "dilation_rate"); x && !x->is_null())
                layer.dilationRate = readPair(*x, child(cpath, "dilation_rate"));
            if (const Json* x = member(cfg, "groups"))
                layer.groups = getPositiveInteger(*x, child(cpath, "groups"));
            layer.samePadding = readSamePadding(cfg, cpath);
            readChannelsLast(cfg, cpath);
            if (const Json* x = member(cfg, "activation"))
                layer.activation = readActivation(*x, child(cpath, "activation"));
            if (const Json* x = member(cfg, "use_bias"))
                layer.useBias = getBool(*x, child(cpath, "use_bias"));
            if (const Json* x = member(cfg, "kernel_initializer"))
                layer.kernelInitializer = readInitializer(*x, child(cpath, "kernel_initializer"),
                                                          "glorot_uniform", notes);
            if (const Json* x = member(cfg, "bias_initializer"))
                layer.biasInitializer =
                    readInitializer(*x, child(cpath, "bias_initializer"), "zeros", notes);
            if (const Json* x = member(cfg, "kernel_regularizer"))
                layer.kernelRegularizer = readRegularizer(*x, child(cpath, "kernel_regularizer"));
            if (const Json* x = member(cfg, "bias_regularizer"))
                layer.biasRegularizer = readRegularizer(*x, child(cpath, "bias_regularizer"));
            requireNull(cfg, cpath, "kernel_constraint", "a kernel constraint");
            requireNull(cfg, cpath, "bias_constraint", "a bias constraint");
            requireNull(cfg, cpath, "lora_rank", "LoRA");
            if (layer.strides.empty()) layer.strides = Shape{1, 1};
            break;
        case LayerType::MaxPooling2D:
        case LayerType::AveragePooling2D:
            if (const Json* x = member(cfg, "pool_size"); x && !x->is_null())
                layer.poolSize = readPair(*x, child(cpath, "pool_size"));
            if (const Json* x = member(cfg, "strides"); x && !x->is_null())
                layer.strides = readPair(*x, child(cpath, "strides"));
            layer.samePadding = readSamePadding(cfg, cpath);
            readChannelsLast(cfg, cpath);
            if (layer.strides.empty()) layer.strides = layer.poolSize;  // Keras: strides=None
            break;
        case LayerType::GlobalAveragePooling2D:
            readChannelsLast(cfg, cpath);
            if (const Json* x = member(cfg, "keepdims");
                x && !x->is_null() && getBool(*x, child(cpath, "keepdims")))
                fail(child(cpath, "keepdims"), "keepdims true is not supported (expected false)");
            break;
        case LayerType::BatchNormalization:
            readNormalization(cfg, cpath, layer, notes);
            if (const Json* x = member(cfg, "momentum"))
                layer.momentum = getNumberInRange(*x, child(cpath, "momentum"), 0.0, 1.0, true);
            if (const Json* x = member(cfg, "moving_mean_initializer"))
                layer.movingMeanInitializer =
                    readInitializer(*x, child(cpath, "moving_mean_initializer"), "zeros", notes);
            if (const Json* x = member(cfg, "moving_variance_initializer"))
                layer.movingVarianceInitializer =
                    readInitializer(*x, child(cpath, "moving_variance_initializer"), "ones", notes);
            for (const char* key : {"synchronized", "renorm"})
                if (const Json* x = member(cfg, key);
                    x && !x->is_null() && getBool(*x, child(cpath, key)))
                    fail(child(cpath, key), std::string(key) +
                                                " batch normalization is not supported (expected "
                                                "false)");
            if (const Json* x = member(cfg, "renorm_momentum"); x && !x->is_null())
                getNumber(*x, child(cpath, "renorm_momentum"));  // unused without renorm
            if (const Json* x = member(cfg, "fused"); x && !x->is_null())
                getBool(*x, child(cpath, "fused"));  // an implementation choice of Keras 2
            requireNull(cfg, cpath, "renorm_clipping", "renorm clipping");
            requireNull(cfg, cpath, "virtual_batch_size", "a virtual batch size");
            requireNull(cfg, cpath, "adjustment", "an adjustment function");
            break;
        case LayerType::LayerNormalization:
            readNormalization(cfg, cpath, layer, notes);
            if (const Json* x = member(cfg, "rms_scaling");
                x && !x->is_null() && getBool(*x, child(cpath, "rms_scaling")))
                fail(child(cpath, "rms_scaling"), "rms_scaling is not supported (expected false)");
            break;
        case LayerType::ZeroPadding2D:
            if (const Json* x = member(cfg, "padding"); x && !x->is_null())
                layer.zeroPadding = readZeroPadding(*x, child(cpath, "padding"));
            readChannelsLast(cfg, cpath);
            break;
        case LayerType::Rescaling:
            layer.rescale = getNumber(requireMember(cfg, cpath, "scale"), child(cpath, "scale"));
            if (const Json* x = member(cfg, "offset"))
                layer.offset = getNumber(*x, child(cpath, "offset"));
            break;
        case LayerType::Resizing:
        case LayerType::CenterCrop:
        case LayerType::RandomCrop:
            readImagePreprocessing(cfg, cpath, layer, notes);
            layer.targetHeight =
                getPositiveInteger(requireMember(cfg, cpath, "height"), child(cpath, "height"));
            layer.targetWidth =
                getPositiveInteger(requireMember(cfg, cpath, "width"), child(cpath, "width"));
            if (layer.type != LayerType::Resizing) break;
            layer.interpolation = readInterpolation(cfg, cpath);
            for (auto [key, field] : {std::pair{"crop_to_aspect_ratio", &layer.cropToAspectRatio},
                                      std::pair{"pad_to_aspect_ratio", &layer.padToAspectRatio}})
                if (const Json* x = member(cfg, key); x && !x->is_null())
                    *field = getBool(*x, child(cpath, key));
            if (layer.cropToAspectRatio && layer.padToAspectRatio)
                fail(cpath, "crop_to_aspect_ratio and pad_to_aspect_ratio cannot both be true");
            if (const Json* x = member(cfg, "fill_mode"); x && !x->is_null())
                getOneOf(*x, child(cpath, "fill_mode"), {"constant"});  // Keras' only one here
            if (const Json* x = member(cfg, "antialias");
                x && !x->is_null() && getBool(*x, child(cpath, "antialias")))
                fail(child(cpath, "antialias"), "antialias true is not supported (expected false)");
            break;
        case LayerType::RandomFlip:
            readImagePreprocessing(cfg, cpath, layer, notes);
            if (const Json* x = member(cfg, "mode"); x && !x->is_null())
                layer.flipMode =
                    *parseFlipMode(getOneOf(*x, child(cpath, "mode"),
                                            {"horizontal_and_vertical", "horizontal", "vertical"}));
            break;
        case LayerType::RandomRotation:
        case LayerType::RandomZoom:
        case LayerType::RandomTranslation:
            readImagePreprocessing(cfg, cpath, layer, notes);
            layer.fillMode = readFillMode(cfg, cpath);
            layer.interpolation = readInterpolation(cfg, cpath);
            if (layer.type == LayerType::RandomRotation) {
                layer.factor = readFactor(requireMember(cfg, cpath, "factor"),
                                          child(cpath, "factor"), -1.0, 1.0, false);
            } else {
                const bool zoom = layer.type == LayerType::RandomZoom;
                layer.heightFactor =
                    readFactor(requireMember(cfg, cpath, "height_factor"),
                               child(cpath, "height_factor"), -1.0, 1.0, true, zoom);
                const Json* w =
                    zoom ? member(cfg, "width_factor") : &requireMember(cfg, cpath, "width_factor");
                if (w && !w->is_null())
                    layer.widthFactor =
                        readFactor(*w, child(cpath, "width_factor"), -1.0, 1.0, true, zoom);
                else if (!zoom)
                    fail(child(cpath, "width_factor"),
                         "RandomTranslation needs a width_factor (a number or [lower, upper])");
            }
            break;
        case LayerType::RandomContrast:
        case LayerType::RandomBrightness: {
            readImagePreprocessing(cfg, cpath, layer, notes);
            const bool contrast = layer.type == LayerType::RandomContrast;
            layer.factor = readFactor(requireMember(cfg, cpath, "factor"), child(cpath, "factor"),
                                      contrast ? 0.0 : -1.0, 1.0, false);
            readValueRange(cfg, cpath, layer, !contrast);
            break;
        }
    }
    return layer;
}

Json dtypePolicy() {
    return Json{{"module", "keras"},
                {"class_name", "DTypePolicy"},
                {"config", {{"name", "float32"}}},
                {"registered_name", nullptr}};
}

Json batchShapeJson(const Shape& s) {
    Json out = Json::array({nullptr});
    for (int64_t d : s) out.push_back(d);
    return out;
}

Json shapeJson(const Shape& s) {
    Json out = Json::array();
    for (int64_t d : s) out.push_back(d);
    return out;
}

Json seedJson(const std::optional<uint64_t>& seed) {
    return seed ? Json(*seed) : Json(nullptr);
}

// A factor as Keras writes it: RandomRotation, RandomContrast and RandomBrightness their
// normalized [lower, upper]; RandomZoom and RandomTranslation the number they were given when the
// range is symmetric (`asGiven`), else the pair.
Json factorJson(const FactorRange& r, bool asGiven) {
    if (asGiven && r.lower == -r.upper) return r.upper;
    return Json::array({r.lower, r.upper});
}

Json axesJson(const std::vector<int64_t>& axes) {
    Json out = Json::array();
    for (int64_t a : axes) out.push_back(a);
    return out;
}

// Config keys in Keras 3's order. input_axes / output_axes go out only when set, so that Keras
// releases before 3.15 (whose from_config does not take them) read the file too.
Json initializerJson(const InitializerSpec& init) {
    Json cfg = Json::object();
    const std::string& n = init.name;
    if (n == "constant") {
        cfg["value"] = init.value;
    } else if (n == "zeros" || n == "ones") {
        // no config
    } else if (n == "random_uniform") {
        cfg["seed"] = seedJson(init.seed);
        cfg["minval"] = init.minval;
        cfg["maxval"] = init.maxval;
    } else if (n == "random_normal" || n == "truncated_normal") {
        cfg["seed"] = seedJson(init.seed);
        cfg["mean"] = init.mean;
        cfg["stddev"] = init.stddev;
    } else if (n == "orthogonal") {
        cfg["seed"] = seedJson(init.seed);
        cfg["gain"] = init.gain;
    } else if (n == "identity") {
        if (init.gain != 1.0) cfg["gain"] = init.gain;  // Keras 3 writes {} (and reads gain)
    } else {
        cfg["seed"] = seedJson(init.seed);
        if (n == "variance_scaling") {
            cfg["scale"] = init.scale;
            cfg["mode"] = init.mode;
            cfg["distribution"] = init.distribution;
        }
        if (!init.inputAxes.empty() && !init.outputAxes.empty()) {
            cfg["input_axes"] = axesJson(init.inputAxes);
            cfg["output_axes"] = axesJson(init.outputAxes);
        }
    }
    return Json{{"module", "keras.initializers"},
                {"class_name", initializerClassName(n)},
                {"config", cfg},
                {"registered_name", nullptr}};
}

Json regularizerJson(const RegularizerSpec& r) {
    if (!r.active()) return nullptr;
    Json cfg = Json::object();
    std::string cls;
    if (r.l1 != 0.0 && r.l2 != 0.0) {
        cls = "L1L2";
        cfg["l1"] = r.l1;
        cfg["l2"] = r.l2;
    } else if (r.l1 != 0.0) {
        cls = "L1";
        cfg["l1"] = r.l1;
    } else {
        cls = "L2";
        cfg["l2"] = r.l2;
    }
    return Json{{"module", "keras.regularizers"},
                {"class_name", cls},
                {"config", cfg},
                {"registered_name", nullptr}};
}

}  // namespace

ModelSpec parseKerasModel(const Json& rootIn, const std::string& path,
                          std::vector<std::string>* warnings) {
    const Notes notes{warnings};
    Json parsed;
    const Json* root = &rootIn;
    if (rootIn.is_string()) {
        parsed = parseText(rootIn.get<std::string>(), path);
        root = &parsed;
    }
    requireObject(*root, path);
    const Json& cls = requireMember(*root, path, "class_name");
    const std::string className = getString(cls, child(path, "class_name"));
    if (className != "Sequential")
        fail(child(path, "class_name"),
             "expected \"Sequential\" (TrainDeck models are Sequential "
             "stacks of layers), got " +
                 describe(cls));
    const Json& config = requireMember(*root, path, "config");
    const std::string cpath = child(path, "config");

    ModelSpec model;
    bool modelTrainable = true;
    const Json* layers = nullptr;
    std::string lpath;
    Shape buildShape;
    if (config.is_array()) {  // early Keras 2: config is the layer list itself
        layers = &config;
        lpath = cpath;
    } else {
        requireObject(config, cpath);
        checkKnownKeys(config, cpath, {"name", "trainable", "dtype", "layers", "build_input_shape"},
                       notes);
        if (const Json* n = member(config, "name"); n && !n->is_null())
            model.name = getNonEmptyString(*n, child(cpath, "name"));
        if (const Json* t = member(config, "trainable"); t && !t->is_null())
            modelTrainable = getBool(*t, child(cpath, "trainable"));
        if (const Json* d = member(config, "dtype"))
            readDtype(*d, child(cpath, "dtype"), false, notes);
        layers = &requireMember(config, cpath, "layers");
        lpath = child(cpath, "layers");
        if (const Json* b = member(config, "build_input_shape"); b && b->is_array())
            buildShape = readBatchShape(*b, child(cpath, "build_input_shape"));
    }
    if (buildShape.empty())
        if (const Json* bc = member(*root, "build_config"); bc && bc->is_object())
            if (const Json* b = member(*bc, "input_shape"); b && b->is_array())
                buildShape = readBatchShape(*b, child(child(path, "build_config"), "input_shape"));

    requireArray(*layers, lpath);
    if (layers->empty()) fail(lpath, "expected at least one layer, got []");
    for (size_t i = 0; i < layers->size(); ++i)
        model.layers.push_back(readLayer((*layers)[i], child(lpath, i), i, notes));
    // A model that is not trainable has no trainable weights, whatever its layers say (an
    // InputLayer has none to begin with).
    if (!modelTrainable)
        for (LayerSpec& l : model.layers)
            if (l.type != LayerType::Input) l.trainable = false;
    if (const Json* cc = member(*root, "compile_config"); cc && cc->is_object() && !cc->empty())
        notes.warn(child(path, "compile_config"),
                   "not read: the project's training section sets the optimizer, loss and "
                   "metrics");

    // Keras 2 repeats the InputLayer's shape as batch_input_shape on the next layer: drop it.
    if (model.layers.size() > 1 && model.layers[0].type == LayerType::Input &&
        model.layers[1].inputShape == model.layers[0].inputShape)
        model.layers[1].inputShape.clear();
    // A Sequential built from build_input_shape without an InputLayer in the list.
    if (model.layers[0].inputShape.empty() && !buildShape.empty())
        model.layers[0].inputShape = buildShape;
    return model;
}

Json kerasModelToJson(const ModelSpec& model) {
    // Shapes for build_config, when the model is valid (names are not taken from the copy: an
    // empty name stays empty so that the text parses back to the same spec).
    ModelSpec copy = model;
    auto info = inferShapes(copy);
    std::vector<Shape> inputShapes;  // per layer of `model.layers`, when known
    if (info) {
        Shape shape = info->inputShape;
        size_t k = 0;
        for (const LayerSpec& l : model.layers) {
            inputShapes.push_back(shape);
            if (l.type != LayerType::Input) shape = info->layers[k++].outputShape;
        }
    }

    Json layers = Json::array();
    for (size_t i = 0; i < model.layers.size(); ++i) {
        const LayerSpec& l = model.layers[i];
        Json cfg = Json::object();
        std::string cls = layerTypeName(l.type);
        if (l.type == LayerType::Input) {
            cfg["batch_shape"] = batchShapeJson(l.inputShape);
            cfg["dtype"] = "float32";
            cfg["sparse"] = false;
            cfg["ragged"] = false;
            if (!l.name.empty()) cfg["name"] = l.name;
            layers.push_back(Json{{"module", "keras.layers"},
                                  {"class_name", cls},
                                  {"config", cfg},
                                  {"registered_name", nullptr}});
            continue;
        }
        if (!l.name.empty()) cfg["name"] = l.name;
        cfg["trainable"] = l.trainable;
        cfg["dtype"] = dtypePolicy();
        if (!l.inputShape.empty()) cfg["input_shape"] = shapeJson(l.inputShape);
        switch (l.type) {
            case LayerType::Input:
                break;
            case LayerType::Flatten:
                cfg["data_format"] = "channels_last";
                break;
            case LayerType::Reshape:
                cfg["target_shape"] = shapeJson(l.targetShape);
                break;
            case LayerType::Dense:
                cfg["units"] = l.units;
                cfg["activation"] = activationName(l.activation);
                cfg["use_bias"] = l.useBias;
                cfg["kernel_initializer"] = initializerJson(l.kernelInitializer);
                cfg["bias_initializer"] = initializerJson(l.biasInitializer);
                cfg["kernel_regularizer"] = regularizerJson(l.kernelRegularizer);
                cfg["bias_regularizer"] = regularizerJson(l.biasRegularizer);
                cfg["kernel_constraint"] = nullptr;
                cfg["bias_constraint"] = nullptr;
                break;
            case LayerType::Dropout:
                cfg["rate"] = l.rate;
                cfg["seed"] = seedJson(l.seed);
                cfg["noise_shape"] = nullptr;
                break;
            case LayerType::Activation:
                // Parameters an activation string cannot carry go out as the Keras layer class.
                if (l.activation == ActivationKind::LeakyRelu && l.negativeSlope != 0.2) {
                    cls = "LeakyReLU";
                    cfg["negative_slope"] = l.negativeSlope;
                } else if (l.activation == ActivationKind::Elu && l.eluAlpha != 1.0) {
                    cls = "ELU";
                    cfg["alpha"] = l.eluAlpha;
                } else {
                    cfg["activation"] = activationName(l.activation);
                }
                break;
            case LayerType::Conv2D:
                cfg["filters"] = l.filters;
                cfg["kernel_size"] = shapeJson(l.kernelSize);
                cfg["strides"] = shapeJson(effectiveStrides(l));
                cfg["padding"] = l.samePadding ? "same" : "valid";
                cfg["data_format"] = "channels_last";
                cfg["dilation_rate"] = shapeJson(l.dilationRate);
                cfg["groups"] = l.groups;
                cfg["activation"] = activationName(l.activation);
                cfg["use_bias"] = l.useBias;
                cfg["kernel_initializer"] = initializerJson(l.kernelInitializer);
                cfg["bias_initializer"] = initializerJson(l.biasInitializer);
                cfg["kernel_regularizer"] = regularizerJson(l.kernelRegularizer);
                cfg["bias_regularizer"] = regularizerJson(l.biasRegularizer);
                cfg["kernel_constraint"] = nullptr;
                cfg["bias_constraint"] = nullptr;
                break;
            case LayerType::MaxPooling2D:
            case LayerType::AveragePooling2D:
                cfg["pool_size"] = shapeJson(l.poolSize);
                cfg["padding"] = l.samePadding ? "same" : "valid";
                cfg["strides"] = shapeJson(effectiveStrides(l));
                cfg["data_format"] = "channels_last";
                break;
            case LayerType::GlobalAveragePooling2D:
                cfg["data_format"] = "channels_last";
                cfg["keepdims"] = false;
                break;
            case LayerType::BatchNormalization:
            case LayerType::LayerNormalization: {
                const bool bn = l.type == LayerType::BatchNormalization;
                cfg["axis"] = bn ? Json(-1) : Json::array({-1});
                if (bn) cfg["momentum"] = l.momentum;
                cfg["epsilon"] = l.epsilon;
                cfg["center"] = l.center;
                cfg["scale"] = l.scale;
                if (!bn) cfg["rms_scaling"] = false;
                cfg["beta_initializer"] = initializerJson(l.betaInitializer);
                cfg["gamma_initializer"] = initializerJson(l.gammaInitializer);
                if (bn) {
                    cfg["moving_mean_initializer"] = initializerJson(l.movingMeanInitializer);
                    cfg["moving_variance_initializer"] =
                        initializerJson(l.movingVarianceInitializer);
                }
                cfg["beta_regularizer"] = nullptr;
                cfg["gamma_regularizer"] = nullptr;
                cfg["beta_constraint"] = nullptr;
                cfg["gamma_constraint"] = nullptr;
                if (bn) {
                    cfg["synchronized"] = false;
                    cfg["renorm"] = false;
                    cfg["renorm_clipping"] = nullptr;
                    cfg["renorm_momentum"] = 0.99;
                }
                break;
            }
            case LayerType::ZeroPadding2D:
                cfg["padding"] =
                    l.zeroPadding.size() == 4
                        ? Json::array({Json::array({l.zeroPadding[0], l.zeroPadding[1]}),
                                       Json::array({l.zeroPadding[2], l.zeroPadding[3]})})
                        : shapeJson(l.zeroPadding);
                cfg["data_format"] = "channels_last";
                break;
            case LayerType::Rescaling:
                cfg["scale"] = l.rescale;
                cfg["offset"] = l.offset;
                break;
            case LayerType::Resizing:
            case LayerType::CenterCrop:
            case LayerType::RandomCrop:
                cfg["data_format"] = "channels_last";
                cfg["height"] = l.targetHeight;
                cfg["width"] = l.targetWidth;
                if (l.type == LayerType::RandomCrop) cfg["seed"] = seedJson(l.seed);
                if (l.type != LayerType::Resizing) break;
                cfg["interpolation"] = interpolationName(l.interpolation);
                cfg["crop_to_aspect_ratio"] = l.cropToAspectRatio;
                cfg["pad_to_aspect_ratio"] = l.padToAspectRatio;
                cfg["fill_mode"] = "constant";
                cfg["fill_value"] = l.fillValue;
                cfg["antialias"] = false;
                break;
            case LayerType::RandomFlip:
                cfg["data_format"] = "channels_last";
                cfg["seed"] = seedJson(l.seed);
                cfg["mode"] = flipModeName(l.flipMode);
                break;
            case LayerType::RandomRotation:
                cfg["data_format"] = "channels_last";
                cfg["factor"] = factorJson(l.factor, false);
                cfg["fill_mode"] = fillModeName(l.fillMode);
                cfg["fill_value"] = l.fillValue;
                cfg["interpolation"] = interpolationName(l.interpolation);
                cfg["seed"] = seedJson(l.seed);
                break;
            case LayerType::RandomZoom:
            case LayerType::RandomTranslation:
                cfg["data_format"] = "channels_last";
                cfg["height_factor"] = factorJson(l.heightFactor, true);
                cfg["width_factor"] = l.widthFactor ? factorJson(*l.widthFactor, true) : Json();
                cfg["fill_mode"] = fillModeName(l.fillMode);
                cfg["interpolation"] = interpolationName(l.interpolation);
                cfg["seed"] = seedJson(l.seed);
                cfg["fill_value"] = l.fillValue;
                break;
            case LayerType::RandomContrast:
            case LayerType::RandomBrightness:
                cfg["data_format"] = "channels_last";
                cfg["factor"] = factorJson(l.factor, false);
                cfg["value_range"] = Json::array({l.valueLow, l.valueHigh});
                cfg["seed"] = seedJson(l.seed);
                break;
        }
        Json entry{{"module", "keras.layers"},
                   {"class_name", cls},
                   {"config", cfg},
                   {"registered_name", nullptr}};
        if (i < inputShapes.size())
            entry["build_config"] = Json{{"input_shape", batchShapeJson(inputShapes[i])}};
        layers.push_back(entry);
    }

    Json config = Json::object();
    config["name"] = model.name;
    config["trainable"] = true;
    config["dtype"] = dtypePolicy();
    config["layers"] = layers;
    if (info) config["build_input_shape"] = batchShapeJson(info->inputShape);
    Json out{{"module", "keras"},
             {"class_name", "Sequential"},
             {"config", config},
             {"registered_name", nullptr}};
    // Keras writes build_config for a built model and compile_config only for a compiled one.
    if (info) out["build_config"] = Json{{"input_shape", batchShapeJson(info->inputShape)}};
    return out;
}

}  // namespace jsonio

Result<ModelSpec> modelFromKerasJson(const std::string& jsonText,
                                     std::vector<std::string>* warnings) {
    try {
        jsonio::Json root = jsonio::parseText(jsonText, "");
        return jsonio::parseKerasModel(root, "", warnings);
    } catch (const jsonio::FieldError& e) {
        return err(jsonio::formatError("Keras model JSON", e));
    } catch (const std::exception& e) {
        return err(std::string("Keras model JSON: ") + e.what());
    }
}

std::string modelToKerasJson(const ModelSpec& model) {
    return jsonio::kerasModelToJson(model).dump();
}

}  // namespace td

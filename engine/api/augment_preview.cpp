#include "engine/api/augment_preview.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <set>
#include <thread>

#include "engine/backend/backend.h"
#include "engine/backend/host_threads.h"
#include "engine/data/pipeline.h"
#include "engine/graph/builder.h"
#include "engine/graph/passes.h"
#include "engine/train/trainer.h"

namespace td::api {
namespace {

bool previewed(LayerType t) {
    return t == LayerType::Rescaling || isImagePreprocessingLayer(t);
}

bool pictureShape(const Shape& s) {
    return (s.size() == 2 || (s.size() == 3 && (s[2] == 1 || s[2] == 3))) && s[0] >= 1 && s[1] >= 1;
}

std::string layerText(const LayerSpec& L) {
    return "'" + L.name + "' (" + layerTypeName(L.type) + ")";
}

// The leading layers as indices into `model.layers` (after inferShapes named them), with their
// output shape; `stop` is the first layer that ends them (none: model.layers.size()).
struct Leading {
    std::vector<size_t> layers;
    Shape output;
    size_t stop = 0;
};

Leading leadingLayers(const ModelSpec& model, const ModelInfo& info) {
    Leading r;
    std::vector<size_t> run;
    std::vector<Shape> shapes;
    size_t counted = 0;  // run's length up to its last Rescaling or preprocessing layer
    size_t li = 0;
    r.stop = model.layers.size();
    for (size_t i = 0; i < model.layers.size(); ++i) {
        const LayerSpec& L = model.layers[i];
        if (L.type == LayerType::Input) continue;
        const Shape& out = info.layers.at(li++).outputShape;
        if (!previewed(L.type) && L.type != LayerType::Reshape) {
            r.stop = i;
            break;
        }
        run.push_back(i);
        shapes.push_back(out);
        if (previewed(L.type)) counted = run.size();
    }
    r.layers.assign(run.begin(), run.begin() + static_cast<std::ptrdiff_t>(counted));
    r.output = counted > 0 ? shapes[counted - 1] : info.inputShape;
    return r;
}

// x * a + b of the map steps that touch the features (as the pipeline composes them).
void mapAffine(const std::vector<MapStep>& steps, double& a, double& b) {
    a = 1.0;
    b = 0.0;
    for (const MapStep& s : steps) {
        if (s.op == "scale") {
            a *= s.factor;
            b *= s.factor;
        } else if (s.op == "normalize" && s.stddev != 0) {
            a /= s.stddev;
            b = (b - s.mean) / s.stddev;
        }
    }
}

// [lo, hi] through x * a + b.
void throughAffine(double a, double b, double& lo, double& hi) {
    const double l = lo * a + b, h = hi * a + b;
    lo = std::min(l, h);
    hi = std::max(l, h);
}

// Runs the planned program `g` (its output "augmented") on the CPU device as step `step`, rows
// from sample 0, and returns the output's values. On a thread of its own, as the trainer compiles
// and runs: the OpenMP team it opens ends with it.
Result<std::vector<float>> runProgram(const Graph& g, const std::vector<float>& x, int64_t step) {
    Result<std::vector<float>> result = err("not run");
    std::thread t([&] {
        std::unique_ptr<Device> dev = makeCpuDevice(1);
        prepareThreadFor(*dev, 1);
        auto input = dev->allocate(std::max<size_t>(x.size() * sizeof(float), 64));
        if (!input.ok()) {
            result = err(input.error());
            return;
        }
        Buffer in = *input;
        auto run = [&]() -> Result<std::vector<float>> {
            TD_RETURN_IF_ERROR(dev->copyToDevice(in, 0, x.data(), x.size() * sizeof(float)));
            ProgramBindings bind;
            bind.input = in;
            bind.label = in;  // the program reads no labels
            TD_ASSIGN_OR_RETURN(std::unique_ptr<Executable> exe, compileProgram(*dev, g, bind));
            StepArgs args;
            args.step = step;
            args.sampleBase = 0;
            TD_RETURN_IF_ERROR(exe->run(args));
            TD_RETURN_IF_ERROR(dev->synchronize());
            const Node& out = g.node(g.output("augmented"));
            std::vector<float> y(static_cast<size_t>(numElements(out.shape)));
            std::memcpy(y.data(), exe->valuePtr(out.id), y.size() * sizeof(float));
            return y;
        };
        result = run();
        dev->release(in);
    });
    t.join();
    return result;
}

}  // namespace

AugmentLayers augmentLayers(const Project& project) {
    AugmentLayers r;
    ModelSpec model = project.model;
    auto info = inferShapes(model);
    if (!info.ok()) {
        r.unavailable = "the model does not check: " + info.error();
        return r;
    }
    r.inputShape = info->inputShape;
    const Leading lead = leadingLayers(model, *info);
    if (lead.layers.empty()) {
        r.unavailable =
            "the model has no preprocessing or augmentation layers (Rescaling, "
            "Resizing, CenterCrop, RandomCrop, RandomFlip, RandomRotation, RandomZoom, "
            "RandomTranslation, RandomContrast, RandomBrightness) at its start";
        if (lead.stop < model.layers.size())
            r.unavailable += ": its first layer is " + layerText(model.layers[lead.stop]);
        return r;
    }
    for (size_t i : lead.layers) r.names.push_back(model.layers[i].name);
    r.outputShape = lead.output;
    if (!pictureShape(lead.output)) {
        r.unavailable = "the result of the model's first layers (" +
                        layerText(model.layers[lead.layers.back()]) + ": " +
                        shapeToString(lead.output) +
                        ") is not an image ([height, width] or [height, width, 1 or 3])";
        r.names.clear();
    }
    return r;
}

Result<AugmentInput> augmentInput(const Project& project, int maxSamples) {
    ModelSpec model = project.model;
    TD_ASSIGN_OR_RETURN(ModelInfo info, inferShapes(model));
    TD_ASSIGN_OR_RETURN(DataSplits splits, loadSource(project.data.source, /*stream=*/true));
    const Dataset& d = splits.train;
    const int64_t n = std::clamp<int64_t>(maxSamples, 0, d.size());
    if (n == 0) return err("the training split has no samples");
    if (d.sampleValues() != numElements(info.inputShape))
        return err("the model's input shape " + shapeToString(info.inputShape) +
                   " does not match the data's samples " + shapeToString(d.sampleShape()) + " (" +
                   std::to_string(d.sampleValues()) + " values)");

    // The first n samples, through the pipeline's own map stage (unshuffled, formed inline).
    Dataset head = d;
    head.epochOrder = nullptr;
    if (d.reader) {
        head.reader = sliceReader(d.reader, 0, n);
    } else {
        head.x = d.x.slice(0, n);
    }
    if (!d.y.empty()) head.y = d.y.slice(0, n);
    PipelineConfig cfg;
    for (const MapStep& s : project.data.pipeline.map)
        if (s.op == "scale" || s.op == "normalize" || s.op == "cast") cfg.map.push_back(s);
    cfg.cache = "none";
    cfg.shuffleBuffer = 0;
    cfg.prefetch = 0;
    cfg.parallelCalls = 1;
    TD_ASSIGN_OR_RETURN(std::unique_ptr<Pipeline> pipe,
                        Pipeline::create(head, cfg, n, /*shuffle=*/false, 0));
    TD_RETURN_IF_ERROR(pipe->beginEpoch(0));
    TD_ASSIGN_OR_RETURN(const Batch* batch, pipe->next());
    if (!batch || batch->size != n || batch->x.dtype() != DType::F32)
        return err("the input pipeline did not form a batch of the first " + std::to_string(n) +
                   " samples");

    AugmentInput in;
    in.sampleShape = info.inputShape;
    const int64_t per = numElements(info.inputShape);
    const float* x = batch->x.data<float>();
    for (int64_t i = 0; i < n; ++i) in.samples.emplace_back(x + i * per, x + (i + 1) * per);
    if (d.xType() == DType::U8) {
        double a = 1, b = 0;
        mapAffine(cfg.map, a, b);
        in.displayLow = 0;
        in.displayHigh = 255;
        throughAffine(a, b, in.displayLow, in.displayHigh);
    } else {
        const auto [lo, hi] = std::minmax_element(x, x + n * per);
        in.displayLow = *lo;
        in.displayHigh = *hi;
    }
    return in;
}

Result<AugmentedPreview> previewAugmented(const Project& project, const AugmentInput& input,
                                          uint64_t draw) {
    const AugmentLayers layers = augmentLayers(project);
    if (!layers.available()) return err(layers.unavailable);
    const int64_t n = static_cast<int64_t>(input.samples.size());
    const int64_t per = numElements(layers.inputShape);
    if (n == 0) return err("no samples to preview");
    for (const std::vector<float>& s : input.samples)
        if (static_cast<int64_t>(s.size()) != per)
            return err("a sample of " + std::to_string(s.size()) +
                       " values does not fit the model's input shape " +
                       shapeToString(layers.inputShape));

    // The model up to its last leading layer, with a head that gives the training graph its loss
    // (the graph is cut before the head): each leading layer keeps its place, so it draws with
    // the seed training gives it.
    ModelSpec model = project.model;
    if (auto named = inferShapes(model); !named.ok()) return err(named.error());  // names them
    const std::set<std::string> names(layers.names.begin(), layers.names.end());
    size_t last = 0;
    for (size_t i = 0; i < model.layers.size(); ++i)
        if (names.count(model.layers[i].name)) last = i;
    ModelSpec cut;
    cut.name = model.name;
    cut.layers.assign(model.layers.begin(),
                      model.layers.begin() + static_cast<ptrdiff_t>(last) + 1);
    std::set<std::string> taken;
    for (const LayerSpec& L : cut.layers) taken.insert(L.name);
    auto freeName = [&](std::string name) {
        while (taken.count(name)) name += "_";
        taken.insert(name);
        return name;
    };
    LayerSpec flatten;
    flatten.type = LayerType::Flatten;
    flatten.name = freeName("augment_preview_flatten");
    LayerSpec dense;
    dense.type = LayerType::Dense;
    dense.name = freeName("augment_preview_dense");
    dense.units = 1;
    cut.layers.push_back(flatten);
    cut.layers.push_back(dense);
    TD_ASSIGN_OR_RETURN(ModelInfo info, inferShapes(cut));

    BuildOptions bo = buildOptions(project, GraphMode::Train);
    bo.batch = n;
    bo.globalBatch = n;
    bo.replicas = 1;
    bo.compute = DType::F32;  // the image ops compute in f32 under every precision policy
    bo.loss = LossConfig{"mean_squared_error", false};
    bo.metrics.clear();
    bo.predictions = false;
    TD_ASSIGN_OR_RETURN(Graph full, buildGraph(cut, info, bo));

    // The graph's nodes up to the leading layers' last one: the input and their nodes only.
    int y = 0;
    for (const Node& node : full.nodes)
        if (names.count(node.layer)) y = node.id;
    bool computes = false;
    Graph g;
    g.name = "augment_preview";
    g.nodes.assign(full.nodes.begin(), full.nodes.begin() + y + 1);
    for (const Node& node : g.nodes) {
        if (node.op != Op::Input && !names.count(node.layer))
            return err("the preview's program reaches node %" + std::to_string(node.id) +
                       " of layer '" + node.layer + "'");
        computes = computes || (node.op != Op::Input && node.op != Op::Reshape);
    }
    g.outputs.emplace_back("augmented", y);

    std::vector<float> x;
    x.reserve(static_cast<size_t>(n * per));
    for (const std::vector<float>& s : input.samples) x.insert(x.end(), s.begin(), s.end());
    std::vector<float> values;
    if (computes) {
        TD_RETURN_IF_ERROR(verifyGraph(g));
        PassManager pm;
        pm.add(std::make_unique<MemoryPlanPass>());
        TD_RETURN_IF_ERROR(pm.run(g));
        TD_ASSIGN_OR_RETURN(values, runProgram(g, x, static_cast<int64_t>(draw) + 1));
    } else {
        values = std::move(x);  // reshapes only: the samples as they came
    }

    AugmentedPreview r;
    r.layers = layers.names;
    r.draw = draw;
    r.step = static_cast<int64_t>(draw) + 1;
    const Shape& out = layers.outputShape;
    r.imageHeight = static_cast<int>(out[0]);
    r.imageWidth = static_cast<int>(out[1]);
    r.imageChannels = out.size() == 3 ? static_cast<int>(out[2]) : 1;
    const int64_t outPer = numElements(out);
    if (static_cast<int64_t>(values.size()) != n * outPer)
        return err("the preview's program gave " + std::to_string(values.size()) +
                   " values, expected " + std::to_string(n * outPer));
    // The display range: the input's, through the leading Rescaling layers.
    r.displayLow = input.displayLow;
    r.displayHigh = input.displayHigh;
    for (const LayerSpec& L : model.layers)
        if (names.count(L.name) && L.type == LayerType::Rescaling)
            throughAffine(L.rescale, L.offset, r.displayLow, r.displayHigh);
    const double span = r.displayHigh - r.displayLow;
    const double scale = span > 0 ? 255.0 / span : 0.0;
    for (int64_t i = 0; i < n; ++i) {
        const float* v = values.data() + i * outPer;
        r.values.emplace_back(v, v + outPer);
        std::vector<uint8_t> px(static_cast<size_t>(outPer));
        for (int64_t k = 0; k < outPer; ++k) {
            const double p = std::isfinite(v[k]) ? (v[k] - r.displayLow) * scale : 0.0;
            px[static_cast<size_t>(k)] =
                static_cast<uint8_t>(std::lround(std::clamp(p, 0.0, 255.0)));
        }
        r.pixels.push_back(std::move(px));
    }
    return r;
}

Result<AugmentedPreview> previewAugmented(const Project& project, int maxSamples, uint64_t draw) {
    const AugmentLayers layers = augmentLayers(project);
    if (!layers.available()) return err(layers.unavailable);
    TD_ASSIGN_OR_RETURN(AugmentInput input, augmentInput(project, maxSamples));
    return previewAugmented(project, input, draw);
}

}  // namespace td::api

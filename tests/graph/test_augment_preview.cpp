// The data panel's preview after augmentation (engine/api/augment_preview.h): the model's leading
// preprocessing and augmentation layers on the first samples, in training mode, on the CPU device.
//
// - RandomFlip mirrors some samples and leaves the others exactly as they were (u8 samples show
//   their own bytes), the same draw repeats, another draw or seed draws anew;
// - Resizing and CenterCrop give pictures of their size (a halving is the 2x2 mean);
// - the pipeline's map steps and the model's Rescaling apply, a Reshape in front runs with them;
// - a model without such layers (or whose layers give no image) says why;
// - the preview is what the training program's nodes of those layers hold for the same samples
//   and step, under float32 and mixed_bfloat16.
#include <QTemporaryDir>
#include <QtTest>
#include <cmath>
#include <cstring>
#include <fstream>

#include "engine/api/augment_preview.h"
#include "engine/data/pipeline.h"
#include "engine/train/trainer.h"
#include "harness.h"

using namespace td;

namespace {

// A project of `layers` (Keras JSON layer objects after the InputLayer of `inputShape`) ending in
// Flatten and a Dense of 3 classes, on `source`, with `map` steps and training seed `seed`.
std::string projectJson(const std::string& inputShape, const std::string& layers,
                        const std::string& source, const std::string& map = "[]", int seed = 7,
                        const std::string& precision = "float32") {
    return R"({"format": "traindeck-project", "version": 1, "name": "augment preview",
  "model": {"class_name": "Sequential", "config": {"name": "m", "layers": [
    {"class_name": "InputLayer", "config": {"name": "input_layer", "batch_shape": [null, )" +
           inputShape + R"(]}},
    )" + layers +
           R"(
    {"class_name": "Flatten", "config": {"name": "flatten"}},
    {"class_name": "Dense", "config": {"name": "dense", "units": 3, "activation": "softmax"}}]}},
  "data": {"source": )" +
           source + R"(, "pipeline": {"map": )" + map + R"(, "shuffle_buffer": 16}},
  "training": {"epochs": 1, "batch_size": 8, "seed": )" +
           std::to_string(seed) + R"(,
               "optimizer": {"class_name": "SGD", "config": {"learning_rate": 0.01}},
               "loss": {"class_name": "SparseCategoricalCrossentropy", "config": {}}},
  "precision": ")" +
           precision + R"("})";
}

std::string synthetic(const std::string& shape, int samples = 24) {
    return R"({"type": "synthetic", "samples": )" + std::to_string(samples) +
           R"(, "test_samples": 4, "shape": [)" + shape + R"(], "classes": 3, "seed": 5})";
}

Project parse(const std::string& json) {
    auto p = parseProject(json, "augment_preview.json");
    if (!p.ok()) qFatal("project: %s", p.error().c_str());
    return std::move(p).value();
}

// A NumPy .npy file of `dtype` ('|u1', '<i4') values with the given shape.
void writeNpy(const std::string& path, const std::string& dtype, const std::vector<int>& shape,
              const void* data, size_t bytes) {
    std::string dims;
    for (size_t i = 0; i < shape.size(); ++i)
        dims += std::to_string(shape[i]) + (shape.size() == 1 || i + 1 < shape.size() ? "," : "");
    std::string header =
        "{'descr': '" + dtype + "', 'fortran_order': False, 'shape': (" + dims + "), }";
    header.append((64 - (10 + header.size() + 1) % 64) % 64, ' ');
    header += '\n';
    std::string out = "\x93NUMPY\x01";
    out += '\0';
    out += static_cast<char>(header.size() & 0xff);
    out += static_cast<char>(header.size() >> 8);
    out += header;
    out.append(static_cast<const char*>(data), bytes);
    std::ofstream(path, std::ios::binary) << out;
}

template <class T>
std::string why(const Result<T>& r) {
    return r.ok() ? std::string() : r.error();
}

// Sample `s` of an H x W x C picture, mirrored left-right.
template <class T>
std::vector<T> mirrored(const std::vector<T>& s, int h, int w, int c) {
    std::vector<T> out(s.size());
    for (int y = 0; y < h; ++y)
        for (int x = 0; x < w; ++x)
            for (int k = 0; k < c; ++k)
                out[static_cast<size_t>((y * w + x) * c + k)] =
                    s[static_cast<size_t>((y * w + (w - 1 - x)) * c + k)];
    return out;
}

}  // namespace

class TestAugmentPreview : public QObject {
    Q_OBJECT

  private slots:
    void flipMirrorsSomeSamplesExactly();
    void resizingAndCropGiveTheirSize();
    void mapStepsAndRescalingApply();
    void withoutSuchLayersSaysWhy();
    void equalsTheTrainingProgram_data();
    void equalsTheTrainingProgram();

  private:
    QTemporaryDir dir_;
};

// u8 pictures 6 x 8 x 1 scaled by 1/255: a sample RandomFlip left alone shows its own bytes, a
// flipped one its bytes mirrored row by row; both happen among 16 samples.
void TestAugmentPreview::flipMirrorsSomeSamplesExactly() {
    QVERIFY(dir_.isValid());
    constexpr int n = 16, h = 6, w = 8;
    std::vector<uint8_t> x(n * h * w);
    for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<uint8_t>((i * 37 + i / 7) % 256);
    std::vector<int32_t> y(n);
    for (int i = 0; i < n; ++i) y[static_cast<size_t>(i)] = i % 3;
    const std::string xs = dir_.filePath("x.npy").toStdString();
    const std::string ys = dir_.filePath("y.npy").toStdString();
    writeNpy(xs, "|u1", {n, h, w, 1}, x.data(), x.size());
    writeNpy(ys, "<i4", {n}, y.data(), y.size() * sizeof(int32_t));
    auto project = [&](int seed) {
        return parse(projectJson(
            "6, 8, 1",
            R"({"class_name": "RandomFlip", "config": {"name": "flip", "mode": "horizontal"}},)",
            R"({"type": "npy", "train_x": ")" + xs + R"(", "train_y": ")" + ys + R"("})",
            R"([{"op": "scale", "factor": 0.00392156862745098}])", seed));
    };
    const Project p = project(7);
    const api::AugmentLayers layers = api::augmentLayers(p);
    QVERIFY2(layers.available(), layers.unavailable.c_str());
    QCOMPARE(layers.names, std::vector<std::string>{"flip"});
    QCOMPARE(layers.outputShape, (Shape{6, 8, 1}));

    auto input = api::augmentInput(p, n);
    QVERIFY2(input.ok(), why(input).c_str());
    QCOMPARE(static_cast<int>(input->samples.size()), n);
    QCOMPARE(input->displayLow, 0.0);
    QVERIFY(std::fabs(input->displayHigh - 1.0) < 1e-12);
    auto r = api::previewAugmented(p, *input, 0);
    QVERIFY2(r.ok(), why(r).c_str());
    QCOMPARE(r->step, int64_t{1});
    QCOMPARE(r->imageHeight, h);
    QCOMPARE(r->imageWidth, w);
    QCOMPARE(r->imageChannels, 1);
    QCOMPARE(static_cast<int>(r->pixels.size()), n);
    int flipped = 0;
    for (int i = 0; i < n; ++i) {
        const std::vector<uint8_t> raw(x.begin() + i * h * w, x.begin() + (i + 1) * h * w);
        const std::vector<uint8_t>& px = r->pixels[static_cast<size_t>(i)];
        const std::vector<float>& in = input->samples[static_cast<size_t>(i)];
        const std::vector<float>& out = r->values[static_cast<size_t>(i)];
        const bool same = px == raw && out == in;
        const bool mirror = px == mirrored(raw, h, w, 1) && out == mirrored(in, h, w, 1);
        QVERIFY2(same != mirror, qPrintable(QString("sample %1: neither itself nor its mirror "
                                                    "image (or both)")
                                                .arg(i)));
        flipped += mirror ? 1 : 0;
    }
    QVERIFY2(flipped > 0 && flipped < n,
             qPrintable(QString("%1 of %2 flipped").arg(flipped).arg(n)));

    // The same draw repeats (also when the samples are read again); another draw, another seed
    // draw anew.
    auto again = api::previewAugmented(p, n, 0);
    QVERIFY2(again.ok(), why(again).c_str());
    QCOMPARE(again->values, r->values);
    auto next = api::previewAugmented(p, *input, 1);
    QVERIFY2(next.ok(), why(next).c_str());
    QCOMPARE(next->step, int64_t{2});
    QVERIFY(next->values != r->values);
    auto reseeded = api::previewAugmented(project(8), *input, 0);
    QVERIFY2(reseeded.ok(), why(reseeded).c_str());
    QVERIFY(reseeded->values != r->values);
}

// Resizing 12 x 16 -> 6 x 8 is the mean of each 2 x 2 block (half-pixel centres); CenterCrop
// 4 x 6 after it keeps the middle; the pictures have the new size.
void TestAugmentPreview::resizingAndCropGiveTheirSize() {
    const Project p = parse(projectJson(
        "12, 16, 3",
        R"({"class_name": "Resizing", "config": {"name": "resize", "height": 6, "width": 8}},)",
        synthetic("12, 16, 3", 10)));
    auto input = api::augmentInput(p, 5);
    QVERIFY2(input.ok(), why(input).c_str());
    QCOMPARE(static_cast<int>(input->samples.size()), 5);
    auto r = api::previewAugmented(p, *input, 0);
    QVERIFY2(r.ok(), why(r).c_str());
    QCOMPARE(r->imageHeight, 6);
    QCOMPARE(r->imageWidth, 8);
    QCOMPARE(r->imageChannels, 3);
    for (size_t i = 0; i < 5; ++i) {
        QCOMPARE(r->values[i].size(), size_t{6 * 8 * 3});
        QCOMPARE(r->pixels[i].size(), size_t{6 * 8 * 3});
        const std::vector<float>& in = input->samples[i];
        for (int y = 0; y < 6; ++y)
            for (int x = 0; x < 8; ++x)
                for (int c = 0; c < 3; ++c) {
                    auto at = [&](int yy, int xx) {
                        return double(in[static_cast<size_t>((yy * 16 + xx) * 3 + c)]);
                    };
                    const double mean = (at(2 * y, 2 * x) + at(2 * y, 2 * x + 1) +
                                         at(2 * y + 1, 2 * x) + at(2 * y + 1, 2 * x + 1)) /
                                        4;
                    QVERIFY(std::fabs(r->values[i][static_cast<size_t>((y * 8 + x) * 3 + c)] -
                                      mean) < 1e-5);
                }
    }

    const Project cropped = parse(projectJson(
        "12, 16, 1",
        R"({"class_name": "CenterCrop", "config": {"name": "crop", "height": 4, "width": 6}},
    {"class_name": "RandomFlip", "config": {"name": "flip", "mode": "vertical"}},)",
        synthetic("12, 16, 1", 10)));
    auto c = api::previewAugmented(cropped, 3, 0);
    QVERIFY2(c.ok(), why(c).c_str());
    QCOMPARE(c->layers, (std::vector<std::string>{"crop", "flip"}));
    QCOMPARE(c->imageHeight, 4);
    QCOMPARE(c->imageWidth, 6);
    QCOMPARE(c->imageChannels, 1);
    QCOMPARE(c->pixels.size(), size_t{3});
    QCOMPARE(c->pixels[0].size(), size_t{24});
}

// normalize (x - 1) / 2, then Rescaling x * 3 + 0.5 after a Reshape of flat samples: each value
// is ((x - 1) / 2) * 3 + 0.5 of the source's; the display range is the samples' own through both.
void TestAugmentPreview::mapStepsAndRescalingApply() {
    const Project p = parse(projectJson(
        "48",
        R"({"class_name": "Reshape", "config": {"name": "reshape", "target_shape": [6, 8, 1]}},
    {"class_name": "Rescaling", "config": {"name": "rescale", "scale": 3.0, "offset": 0.5}},
    {"class_name": "RandomBrightness", "config": {"name": "bright", "factor": 0.0,
                                                  "value_range": [-100, 100]}},)",
        synthetic("48", 12), R"([{"op": "normalize", "mean": 1.0, "std": 2.0}])"));
    const api::AugmentLayers layers = api::augmentLayers(p);
    QVERIFY2(layers.available(), layers.unavailable.c_str());
    QCOMPARE(layers.names, (std::vector<std::string>{"reshape", "rescale", "bright"}));
    QCOMPARE(layers.inputShape, Shape{48});
    QCOMPARE(layers.outputShape, (Shape{6, 8, 1}));

    auto source = loadSource(p.data.source);
    QVERIFY2(source.ok(), why(source).c_str());
    const float* raw = source->train.x.data<float>();
    auto r = api::previewAugmented(p, 6, 3);
    QVERIFY2(r.ok(), why(r).c_str());
    QCOMPARE(r->values.size(), size_t{6});
    float lo = INFINITY, hi = -INFINITY;
    for (int k = 0; k < 6 * 48; ++k) {
        lo = std::min(lo, (raw[k] - 1.f) / 2.f);
        hi = std::max(hi, (raw[k] - 1.f) / 2.f);
    }
    QVERIFY(std::fabs(r->displayLow - (lo * 3.0 + 0.5)) < 1e-5);
    QVERIFY(std::fabs(r->displayHigh - (hi * 3.0 + 0.5)) < 1e-5);
    bool sawBlack = false, sawWhite = false;
    for (size_t i = 0; i < 6; ++i)
        for (size_t k = 0; k < 48; ++k) {
            const double want = ((double(raw[i * 48 + k]) - 1) / 2) * 3 + 0.5;
            QVERIFY2(std::fabs(r->values[i][k] - want) < 1e-4,
                     qPrintable(QString("sample %1 value %2: %3, expected %4")
                                    .arg(i)
                                    .arg(k)
                                    .arg(r->values[i][k])
                                    .arg(want)));
            sawBlack = sawBlack || r->pixels[i][k] == 0;
            sawWhite = sawWhite || r->pixels[i][k] == 255;
        }
    QVERIFY(sawBlack && sawWhite);  // the range spans the samples exactly
}

// Nothing to preview: a model that starts with a trainable layer (a Reshape alone does not count)
// or whose leading layers give no image says why, and the preview returns that reason.
void TestAugmentPreview::withoutSuchLayersSaysWhy() {
    const Project plain = parse(projectJson(
        "6, 8, 1",
        R"({"class_name": "Conv2D", "config": {"name": "conv", "filters": 2, "kernel_size": [3, 3]}},)",
        synthetic("6, 8, 1")));
    const api::AugmentLayers none = api::augmentLayers(plain);
    QVERIFY(!none.available());
    QVERIFY(none.names.empty());
    QVERIFY2(none.unavailable.find("no preprocessing or augmentation layers") != std::string::npos,
             none.unavailable.c_str());
    QVERIFY2(none.unavailable.find("'conv' (Conv2D)") != std::string::npos,
             none.unavailable.c_str());
    auto r = api::previewAugmented(plain, 4, 0);
    QVERIFY(!r.ok());
    QCOMPARE(r.error(), none.unavailable);

    const Project reshaped = parse(projectJson(
        "48",
        R"({"class_name": "Reshape", "config": {"name": "reshape", "target_shape": [6, 8, 1]}},
    {"class_name": "Conv2D", "config": {"name": "conv", "filters": 2, "kernel_size": [3, 3]}},)",
        synthetic("48")));
    QVERIFY(!api::augmentLayers(reshaped).available());

    const Project flat = parse(projectJson(
        "48", R"({"class_name": "Rescaling", "config": {"name": "rescale", "scale": 0.5}},)",
        synthetic("48")));
    const api::AugmentLayers notImage = api::augmentLayers(flat);
    QVERIFY(!notImage.available());
    QVERIFY2(notImage.unavailable.find("is not an image") != std::string::npos,
             notImage.unavailable.c_str());
    QVERIFY(!api::previewAugmented(flat, 4, 0).ok());
}

void TestAugmentPreview::equalsTheTrainingProgram_data() {
    QTest::addColumn<QString>("precision");
    QTest::newRow("float32") << "float32";
    QTest::newRow("mixed_bfloat16") << "mixed_bfloat16";
}

// The training step's graph (the trainer's build options, autodiff and standard passes), with the
// last augmentation node kept as an output, run as step draw + 1 on the same samples: its values
// are the preview's, bit for bit.
void TestAugmentPreview::equalsTheTrainingProgram() {
    QFETCH(QString, precision);
    const Project p = parse(projectJson("10, 12, 3",
                                        R"({"class_name": "RandomFlip", "config": {"name": "flip"}},
    {"class_name": "RandomRotation", "config": {"name": "rotate", "factor": 0.1}},
    {"class_name": "RandomZoom", "config": {"name": "zoom", "height_factor": 0.2}},
    {"class_name": "RandomContrast", "config": {"name": "contrast", "factor": 0.4,
                                                "value_range": [-4, 4]}},
    {"class_name": "RandomCrop", "config": {"name": "crop", "height": 8, "width": 9}},
    {"class_name": "Conv2D", "config": {"name": "conv", "filters": 2, "kernel_size": [3, 3]}},)",
                                        synthetic("10, 12, 3"), "[]", 11, precision.toStdString()));
    constexpr int n = 8;
    constexpr uint64_t draw = 4;
    auto input = api::augmentInput(p, n);
    QVERIFY2(input.ok(), why(input).c_str());
    auto r = api::previewAugmented(p, *input, draw);
    QVERIFY2(r.ok(), why(r).c_str());
    QCOMPARE(r->layers, (std::vector<std::string>{"flip", "rotate", "zoom", "contrast", "crop"}));
    QCOMPARE(r->imageHeight, 8);
    QCOMPARE(r->imageWidth, 9);
    QCOMPARE(r->imageChannels, 3);

    ModelSpec model = p.model;
    auto info = inferShapes(model);
    QVERIFY2(info.ok(), why(info).c_str());
    BuildOptions bo = buildOptions(p, GraphMode::Train);
    bo.batch = n;
    bo.globalBatch = n;
    auto g = buildGraph(model, *info, bo);
    QVERIFY2(g.ok(), why(g).c_str());
    int last = -1;
    for (const Node& node : g->nodes)
        if (node.layer == "crop") last = node.id;
    QVERIFY(last > 0);
    QCOMPARE(g->node(last).op, Op::RandomCrop);
    g->outputs.emplace_back("augmented", last);
    const Status diff = autodiff(*g);
    QVERIFY2(diff.ok(), diff.ok() ? "" : diff.error().c_str());
    const CompileOptions co = compileOptions(p, true);
    tdtest::HarnessOptions ho;
    ho.passes = &co;
    tdtest::Harness h;
    std::string error;
    QVERIFY2(h.compile(std::move(g).value(), {}, &error, ho), error.c_str());
    for (int i = 0; i < n; ++i)
        std::memcpy(h.in() + i * 360, input->samples[static_cast<size_t>(i)].data(),
                    360 * sizeof(float));
    h.run(static_cast<int64_t>(draw) + 1, 0);
    const float* trained = h.output("augmented");
    for (int i = 0; i < n; ++i) {
        const std::vector<float>& v = r->values[static_cast<size_t>(i)];
        QCOMPARE(v.size(), size_t{8 * 9 * 3});
        QVERIFY2(std::memcmp(v.data(), trained + i * 216, 216 * sizeof(float)) == 0,
                 qPrintable(QString("sample %1 differs from the training program's").arg(i)));
    }
    // ... and not the identity: the layers did draw.
    QVERIFY(r->values[0] !=
            std::vector<float>(input->samples[0].begin(), input->samples[0].begin() + 216));
}

QTEST_GUILESS_MAIN(TestAugmentPreview)
#include "test_augment_preview.moc"

// The image preprocessing and augmentation layers (Resizing, CenterCrop, RandomCrop, RandomFlip,
// RandomRotation, RandomZoom, RandomTranslation, RandomContrast, RandomBrightness) end to end on
// the CPU device: through the builder and the compiler from their LayerSpecs, and as IR ops.
//
// - Resizing and CenterCrop (and RandomCrop at inference) against Keras 3 itself and against
//   exact cases worked out here (a 2x2 mean, a plain crop);
// - the random layers are the identity at inference; in training each sample draws its own
//   transform from (seed, step, global sample index): samples and steps differ, the same key
//   repeats, and rows of a batch equal the same rows run as a replica's slice;
// - flips are exact mirror images; rotation, zoom and translation by zero are the identity; the
//   fill modes on a row worked out by hand, and fixed transforms (both ends of each range equal)
//   against Keras' own layers in training mode; contrast and brightness follow Keras' formula
//   with the factor each sample drew;
// - a project with RandomFlip, RandomRotation and RandomZoom trains through `traindeck train`.
// Keras runs in the Python that installer/bench.sh sets up (or $TRAINDECK_KERAS_PYTHON); without
// it those comparisons are skipped, saying why.
#include <QDir>
#include <QFile>
#include <QProcess>
#include <QRegularExpression>
#include <QTemporaryDir>
#include <QtTest>
#include <cmath>
#include <cstring>
#include <fstream>
#include <random>

#include "harness.h"
#include "tests/engine/cli_process.h"

using namespace td;
using tdtest::Harness;

namespace {

std::vector<float> pattern(size_t n, uint32_t seed, float lo = 0.f, float hi = 1.f) {
    std::mt19937 rng(seed);
    std::uniform_real_distribution<float> d(lo, hi);
    std::vector<float> v(n);
    for (float& x : v) x = d(rng);
    return v;
}

LayerSpec layerOf(LayerType t, const std::string& name = "aug") {
    LayerSpec l;
    l.type = t;
    l.name = name;
    return l;
}

std::string shapeText(const Shape& s) {
    std::string out = "[";
    for (size_t i = 0; i < s.size(); ++i) out += (i ? "," : "") + std::to_string(s[i]);
    return out + "]";
}

// Runs `layer` on the images x [batch, image...] through inferShapes, buildGraph (in `mode`; a
// training graph gets a Flatten and a Dense after the layer for its loss), the memory pass and
// the CPU device, as step `step` whose row 0 is global sample `base`. The layer's result, and
// its shape in `shape`.
Result<std::vector<float>> runLayer(LayerSpec layer, const Shape& image,
                                    const std::vector<float>& x, int64_t batch, GraphMode mode,
                                    int64_t step = 1, int64_t base = 0, Shape* shape = nullptr) {
    ModelSpec m;
    LayerSpec in = layerOf(LayerType::Input, "input");
    in.inputShape = image;
    m.layers = {in, layer};
    if (mode == GraphMode::Train) {
        m.layers.push_back(layerOf(LayerType::Flatten, "flatten"));
        LayerSpec d = layerOf(LayerType::Dense, "dense");
        d.units = 2;
        m.layers.push_back(d);
    }
    TD_ASSIGN_OR_RETURN(ModelInfo info, inferShapes(m));
    BuildOptions bo;
    bo.batch = batch;
    bo.mode = mode;
    bo.seed = 5;
    TD_ASSIGN_OR_RETURN(Graph g, buildGraph(m, info, bo));
    int y = 0;  // the layer's last node (the input itself when the layer adds none)
    for (const Node& n : g.nodes)
        if (n.layer == layer.name) y = n.id;
    g.outputs.emplace_back("y", y);
    Harness h;
    std::string error;
    if (!h.compile(std::move(g), {}, &error)) return err("compile: " + error);
    if (x.size() != static_cast<size_t>(numElements(h.g.node(0).shape)))
        return err("the input has " + std::to_string(x.size()) + " values, the graph's " +
                   shapeToString(h.g.node(0).shape));
    std::memcpy(h.in(), x.data(), x.size() * sizeof(float));
    TD_RETURN_IF_ERROR(h.exe->run(StepArgs{step, base, {}, true}));
    const Node& out = h.g.node(h.g.output("y"));
    if (shape) *shape = out.shape;
    const float* p = h.output("y");
    return std::vector<float>(p, p + numElements(out.shape));
}

// One op of the IR on x [in], as step `step` whose row 0 is global sample `base`.
Result<std::vector<float>> runOp(const std::string& op, const std::string& attrs, const Shape& in,
                                 const Shape& out, const std::vector<float>& x, int64_t step,
                                 int64_t base) {
    auto g = parseGraph("graph t {\n  %0 = input() : f32" + shapeText(in) + "\n  %1 = " + op +
                        "(%0) {" + attrs + "} : f32" + shapeText(out) + "\n  output y = %1\n}\n");
    if (!g.ok()) return err(g.error());
    Harness h;
    std::string error;
    if (!h.compile(std::move(g).value(), {}, &error)) return err("compile: " + error);
    std::memcpy(h.in(), x.data(), x.size() * sizeof(float));
    TD_RETURN_IF_ERROR(h.exe->run(StepArgs{step, base, {}, true}));
    const float* p = h.output("y");
    return std::vector<float>(p, p + numElements(out));
}

// Sample b of a batch of images of `per` values.
std::vector<float> sampleOf(const std::vector<float>& v, int64_t b, int64_t per) {
    return std::vector<float>(v.begin() + b * per, v.begin() + (b + 1) * per);
}

// A result's error, or nothing (QVERIFY2 reads its message even when the check passes).
template <class T>
std::string why(const Result<T>& r) {
    return r.ok() ? std::string() : r.error();
}

double maxAbsDiff(const std::vector<float>& a, const std::vector<float>& b) {
    if (a.size() != b.size()) return INFINITY;
    double m = 0;
    for (size_t i = 0; i < a.size(); ++i) m = std::max(m, std::fabs(double(a[i]) - b[i]));
    return m;
}

// ---- Keras -----------------------------------------------------------------------------------

QString kerasPython() {
    const QByteArray env = qgetenv("TRAINDECK_KERAS_PYTHON");
    if (!env.isEmpty()) return QString::fromLocal8Bit(env);
    const QString venv = QDir::homePath() + "/.cache/traindeck/bench-venv/bin/python";
    return QFile::exists(venv) ? venv : QString();
}

struct PyRun {
    int code = -1;
    QString out, err;
};
PyRun runPython(const QString& python, const QString& script) {
    QProcess p;
    QProcessEnvironment env = QProcessEnvironment::systemEnvironment();
    env.insert("TF_CPP_MIN_LOG_LEVEL", "3");
    env.insert("CUDA_VISIBLE_DEVICES", "");
    p.setProcessEnvironment(env);
    p.start(python, {"-c", script});
    p.waitForFinished(300000);
    return {p.exitStatus() == QProcess::NormalExit ? p.exitCode() : -1,
            QString::fromUtf8(p.readAllStandardOutput()),
            QString::fromUtf8(p.readAllStandardError())};
}

void writeFloats(const QString& path, const std::vector<float>& v) {
    std::ofstream(path.toStdString(), std::ios::binary)
        .write(reinterpret_cast<const char*>(v.data()), std::streamsize(v.size() * sizeof(float)));
}

std::vector<float> readFloats(const QString& path) {
    std::ifstream f(path.toStdString(), std::ios::binary | std::ios::ate);
    std::vector<float> v(static_cast<size_t>(f.tellg()) / sizeof(float));
    f.seekg(0);
    f.read(reinterpret_cast<char*>(v.data()), std::streamsize(v.size() * sizeof(float)));
    return v;
}

// One comparison with Keras: `call` is a Python expression of the input `x` (a float32 array
// [batch, image...]) whose value is compared with `layer` run here in `mode`.
struct KerasCase {
    QString what;
    QString call;
    LayerSpec layer;
    Shape image;
    GraphMode mode = GraphMode::Predict;
    double tol = 1e-5;
};

// Runs every case in one Python process; fails naming the case and the largest difference.
void compareWithKeras(const std::vector<KerasCase>& cases) {
    const QString python = kerasPython();
    if (python.isEmpty())
        QSKIP(
            "no Python with Keras (installer/bench.sh sets one up, or set TRAINDECK_KERAS_PYTHON)");
    if (runPython(python, "import keras, tensorflow").code != 0)
        QSKIP("the Python found has no Keras with TensorFlow");
    QTemporaryDir dir;
    const int64_t batch = 3;
    QString script = "import numpy as np, keras\n";
    std::vector<std::vector<float>> inputs;
    for (size_t k = 0; k < cases.size(); ++k) {
        const KerasCase& c = cases[k];
        std::vector<float> x =
            pattern(static_cast<size_t>(batch * numElements(c.image)), 100 + uint32_t(k));
        const QString in = dir.filePath(QString("in%1.f32").arg(k));
        writeFloats(in, x);
        inputs.push_back(std::move(x));
        QString shape = QString::number(batch);
        for (int64_t d : c.image) shape += "," + QString::number(d);
        script += QString("x = np.fromfile('%1', np.float32).reshape(%2)\n").arg(in, shape);
        script += QString("np.asarray(%1, np.float32).tofile('%2')\n")
                      .arg(c.call, dir.filePath(QString("out%1.f32").arg(k)));
    }
    const PyRun r = runPython(python, script);
    QVERIFY2(r.code == 0, qPrintable(r.err.right(3000)));
    for (size_t k = 0; k < cases.size(); ++k) {
        const KerasCase& c = cases[k];
        Shape shape;
        auto got = runLayer(c.layer, c.image, inputs[k], batch, c.mode, 3, 40, &shape);
        QVERIFY2(got.ok(), qPrintable(c.what + ": " + QString::fromStdString(why(got))));
        const std::vector<float> want = readFloats(dir.filePath(QString("out%1.f32").arg(k)));
        const double d = maxAbsDiff(*got, want);
        QVERIFY2(d <= c.tol, qPrintable(QString("%1 (%2): %3 values here, %4 from Keras, largest "
                                                "difference %5")
                                            .arg(c.what, c.call)
                                            .arg(got->size())
                                            .arg(want.size())
                                            .arg(d)));
    }
}

LayerSpec resizing(int64_t h, int64_t w, InterpolationKind interp = InterpolationKind::Bilinear,
                   bool crop = false, bool pad = false, double fill = 0.0) {
    LayerSpec l = layerOf(LayerType::Resizing);
    l.targetHeight = h;
    l.targetWidth = w;
    l.interpolation = interp;
    l.cropToAspectRatio = crop;
    l.padToAspectRatio = pad;
    l.fillValue = fill;
    return l;
}

LayerSpec sized(LayerType t, int64_t h, int64_t w) {
    LayerSpec l = layerOf(t);
    l.targetHeight = h;
    l.targetWidth = w;
    return l;
}

// A fixed transform: both ends of every range equal.
LayerSpec translation(double dy, double dx, FillModeKind fill, InterpolationKind interp) {
    LayerSpec l = layerOf(LayerType::RandomTranslation);
    l.heightFactor = {dy, dy};
    l.widthFactor = FactorRange{dx, dx};
    l.fillMode = fill;
    l.interpolation = interp;
    l.fillValue = 0.5;
    return l;
}

const char* fillName(FillModeKind f) {
    return fillModeName(f);
}

}  // namespace

class TestAugment : public QObject {
    Q_OBJECT
  private slots:
    void resizeWorkedOutCases();
    void irTextAndVerifier();
    void resizeLayersMatchKeras();
    void randomLayersAreIdentityAtInference();
    void drawsDifferPerSampleAndStepAndRepeat_data();
    void drawsDifferPerSampleAndStepAndRepeat();
    void flipsAreExactMirrors();
    void zeroTransformsAreIdentity();
    void fillModesOnAWorkedOutRow_data();
    void fillModesOnAWorkedOutRow();
    void fixedTransformsMatchKeras();
    void randomCropIsAWindow();
    void contrastAndBrightnessFollowKerasFormula();
    void flipAndCropPassGradients();
    void augmentedCnnTrainsThroughTheCli();
};

// Half-pixel bilinear resize to half the size averages each 2x2 block; a CenterCrop of a larger
// image is its centre, exactly; Resizing to the same size is the image itself.
void TestAugment::resizeWorkedOutCases() {
    const Shape image{6, 8, 2};
    const std::vector<float> x = pattern(2 * 6 * 8 * 2, 1);
    auto half = runLayer(resizing(3, 4), image, x, 2, GraphMode::Predict);
    QVERIFY2(half.ok(), why(half).c_str());
    for (int b = 0; b < 2; ++b)
        for (int i = 0; i < 3; ++i)
            for (int j = 0; j < 4; ++j)
                for (int c = 0; c < 2; ++c) {
                    double mean = 0;
                    for (int di = 0; di < 2; ++di)
                        for (int dj = 0; dj < 2; ++dj)
                            mean += x[size_t(((b * 6 + 2 * i + di) * 8 + 2 * j + dj) * 2 + c)];
                    QVERIFY(std::fabs((*half)[size_t(((b * 3 + i) * 4 + j) * 2 + c)] - mean / 4) <
                            1e-6);
                }
    auto crop = runLayer(sized(LayerType::CenterCrop, 3, 5), image, x, 2, GraphMode::Train);
    QVERIFY2(crop.ok(), why(crop).c_str());
    for (int b = 0; b < 2; ++b)
        for (int i = 0; i < 3; ++i)
            for (int j = 0; j < 5; ++j)
                for (int c = 0; c < 2; ++c)  // Keras: offsets (6 - 3) // 2 = 1 and (8 - 5) // 2 = 1
                    QCOMPARE((*crop)[size_t(((b * 3 + i) * 5 + j) * 2 + c)],
                             x[size_t(((b * 6 + 1 + i) * 8 + 1 + j) * 2 + c)]);
    auto same = runLayer(resizing(6, 8), image, x, 2, GraphMode::Predict);
    QVERIFY2(same.ok(), why(same).c_str());
    QCOMPARE(*same, x);
    // A wide strip padded to a square: 18 rows of fill above and below its 4 (Keras:
    // int((40 - 4) / 2)), so the top and bottom of the result are the fill value, its middle not.
    auto strip = runLayer(resizing(20, 20, InterpolationKind::Bilinear, false, true, -7.0),
                          {4, 40, 1}, pattern(2 * 4 * 40, 2), 2, GraphMode::Predict);
    QVERIFY2(strip.ok(), why(strip).c_str());
    for (int j = 0; j < 20; ++j) {
        QCOMPARE((*strip)[size_t(j)], -7.f);
        QCOMPARE((*strip)[size_t(19 * 20 + j)], -7.f);
        QVERIFY((*strip)[size_t(10 * 20 + j)] >= 0.f);
    }
    // Nearest, three times as large: each pixel repeated 3x3.
    auto big =
        runLayer(resizing(18, 24, InterpolationKind::Nearest), image, x, 2, GraphMode::Predict);
    QVERIFY2(big.ok(), why(big).c_str());
    for (int i = 0; i < 18; ++i)
        for (int j = 0; j < 24; ++j)
            QCOMPARE((*big)[size_t((i * 24 + j) * 2)], x[size_t(((i / 3) * 8 + j / 3) * 2)]);
}

// The ops' attributes print and parse back (a padded box reaches outside: negative offsets), and
// the verifier names what is wrong with a node.
void TestAugment::irTextAndVerifier() {
    ModelSpec m;
    LayerSpec in = layerOf(LayerType::Input, "input");
    in.inputShape = {7, 13, 1};
    LayerSpec zoom = layerOf(LayerType::RandomZoom, "zoom");
    zoom.heightFactor = {-0.2, 0.3};
    zoom.fillMode = FillModeKind::Wrap;
    zoom.fillValue = 0.25;
    m.layers = {in, zoom, resizing(10, 10, InterpolationKind::Nearest, false, true, -1.5),
                layerOf(LayerType::Flatten, "flatten"), layerOf(LayerType::Dense, "dense")};
    m.layers.back().units = 2;
    auto info = inferShapes(m);
    QVERIFY2(info.ok(), why(info).c_str());
    BuildOptions bo;
    auto g = buildGraph(m, *info, bo);
    QVERIFY2(g.ok(), why(g).c_str());
    const std::string text = printGraph(*g);
    QVERIFY2(text.find("resize(%1) {box=-3x0x13x13, fill_value=-1.5, interp=nearest}") !=
                 std::string::npos,
             text.c_str());
    QVERIFY2(text.find("random_zoom(%0) {factor_hi=0.3, factor_lo=-0.2, fill=wrap, "
                       "fill_value=0.25, interp=bilinear, seed=") != std::string::npos,
             text.c_str());
    auto back = parseGraph(text);
    QVERIFY2(back.ok(), why(back).c_str());
    QCOMPARE(printGraph(*back), text);
    for (size_t i = 0; i < g->nodes.size(); ++i) QVERIFY(back->nodes[i].attrs == g->nodes[i].attrs);

    auto refused = [](const std::string& node, const std::string& out) {
        return parseGraph("graph t {\n  %0 = input() : f32[2,6,5,3]\n  %1 = " + node + " : f32" +
                          out + "\n  output y = %1\n}\n");
    };
    const std::pair<std::string, std::string> bad[] = {
        {"random_rotation(%0) {factor_hi=0.1, factor_lo=0, interp=bilinear}",
         "missing attribute fill"},
        {"random_translation(%0) {factor_hi=0.1, factor_lo=0.2, fill=wrap, interp=nearest, "
         "width_hi=0, width_lo=0}",
         "factor_lo 0.2 > factor_hi 0.1"},
        {"random_flip(%0) {}", "missing attribute flip"},
        {"resize(%0) {box=0x0x6, interp=bilinear}", "box must be four sizes"},
        {"resize(%0) {box=7x0x2x2, interp=bilinear}", "does not fit the image 6x5"},
    };
    for (const auto& [node, message] : bad) {
        auto r = refused(node, "[2,6,5,3]");
        QVERIFY2(!r.ok() && r.error().find(message) != std::string::npos,
                 qPrintable(QString::fromStdString(node + " -> " + why(r))));
    }
    auto crop = refused("random_crop(%0) {seed=1}", "[2,7,5,3]");
    QVERIFY2(!crop.ok() &&
                 crop.error().find("crops 7x5 out of a smaller image 6x5") != std::string::npos,
             why(crop).c_str());
}

void TestAugment::resizeLayersMatchKeras() {
    LayerSpec randomCrop = sized(LayerType::RandomCrop, 6, 6);
    compareWithKeras({
        {"bilinear, down one way and up the other",
         "keras.layers.Resizing(7, 15)(x)",
         resizing(7, 15),
         {10, 13, 2}},
        {"nearest",
         "keras.layers.Resizing(12, 5, interpolation='nearest')(x)",
         resizing(12, 5, InterpolationKind::Nearest),
         {9, 7, 1}},
        {"cropped to the aspect ratio",
         "keras.layers.Resizing(8, 8, crop_to_aspect_ratio=True)(x)",
         resizing(8, 8, InterpolationKind::Bilinear, true),
         {16, 9, 3}},
        {"padded to the aspect ratio (rows)",
         "keras.layers.Resizing(10, 10, pad_to_aspect_ratio=True, fill_value=-1.5)(x)",
         resizing(10, 10, InterpolationKind::Bilinear, false, true, -1.5),
         {7, 13, 1}},
        {"padded to the aspect ratio (columns), nearest",
         "keras.layers.Resizing(9, 12, interpolation='nearest', pad_to_aspect_ratio=True)(x)",
         resizing(9, 12, InterpolationKind::Nearest, false, true),
         {12, 9, 2}},
        {"CenterCrop of a larger image",
         "keras.layers.CenterCrop(5, 6)(x)",
         sized(LayerType::CenterCrop, 5, 6),
         {10, 11, 2}},
        {"CenterCrop of a smaller image (smart_resize)",
         "keras.layers.CenterCrop(12, 10)(x)",
         sized(LayerType::CenterCrop, 12, 10),
         {9, 14, 1}},
        // Keras documents RandomCrop at inference as smart_resize to the target; Keras 3.15's
        // layer returns the image uncropped there (of another shape than it declares), so the
        // documented function is the reference.
        {"RandomCrop at inference (smart_resize)",
         "keras.preprocessing.image.smart_resize(x, (6, 6))",
         randomCrop,
         {10, 12, 2}},
    });
}

void TestAugment::randomLayersAreIdentityAtInference() {
    const Shape image{7, 9, 3};
    const std::vector<float> x = pattern(4 * 7 * 9 * 3, 2, 0.f, 200.f);
    std::vector<LayerSpec> layers;
    LayerSpec flip = layerOf(LayerType::RandomFlip);
    layers.push_back(flip);
    LayerSpec rot = layerOf(LayerType::RandomRotation);
    rot.factor = {-0.3, 0.3};
    layers.push_back(rot);
    LayerSpec zoom = layerOf(LayerType::RandomZoom);
    zoom.heightFactor = {-0.3, 0.3};
    layers.push_back(zoom);
    layers.push_back(translation(0.2, -0.2, FillModeKind::Wrap, InterpolationKind::Nearest));
    LayerSpec contrast = layerOf(LayerType::RandomContrast);
    contrast.factor = {0.0, 0.5};
    layers.push_back(contrast);
    LayerSpec brightness = layerOf(LayerType::RandomBrightness);
    brightness.factor = {-0.3, 0.3};
    layers.push_back(brightness);
    for (const LayerSpec& l : layers) {
        auto y = runLayer(l, image, x, 4, GraphMode::Predict);
        QVERIFY2(y.ok(), why(y).c_str());
        QVERIFY2(*y == x, layerTypeName(l.type));
        // ... and active in training (the same input changes).
        auto t = runLayer(l, image, x, 4, GraphMode::Train);
        QVERIFY2(t.ok(), why(t).c_str());
        QVERIFY2(*t != x, layerTypeName(l.type));
    }
    // The evaluation and prediction programs have no augmentation node at all.
    ModelSpec m;
    LayerSpec in = layerOf(LayerType::Input, "input");
    in.inputShape = image;
    m.layers = {in};
    for (size_t i = 0; i < layers.size(); ++i) {
        layers[i].name = "aug_" + std::to_string(i);
        m.layers.push_back(layers[i]);
    }
    m.layers.push_back(layerOf(LayerType::Flatten, "flatten"));
    LayerSpec d = layerOf(LayerType::Dense, "dense");
    d.units = 3;
    m.layers.push_back(d);
    auto info = inferShapes(m);
    QVERIFY2(info.ok(), why(info).c_str());
    for (GraphMode mode : {GraphMode::Eval, GraphMode::Predict, GraphMode::Train}) {
        BuildOptions bo;
        bo.mode = mode;
        auto g = buildGraph(m, *info, bo);
        QVERIFY2(g.ok(), why(g).c_str());
        int augment = 0;
        for (const Node& n : g->nodes) augment += isRandomAugment(n.op);
        QCOMPARE(augment, mode == GraphMode::Train ? int(layers.size()) : 0);
    }
}

void TestAugment::drawsDifferPerSampleAndStepAndRepeat_data() {
    QTest::addColumn<QString>("op");
    QTest::addColumn<QString>("attrs");
    QTest::newRow("random_flip") << "random_flip"
                                 << "flip=horizontal_and_vertical, seed=7";
    QTest::newRow("random_rotation")
        << "random_rotation"
        << "factor_hi=0.2, factor_lo=-0.2, fill=reflect, interp=bilinear, seed=7";
    QTest::newRow("random_zoom") << "random_zoom"
                                 << "factor_hi=0.3, factor_lo=-0.3, fill=wrap, interp=bilinear, "
                                    "seed=7, width_hi=0.2, width_lo=-0.1";
    QTest::newRow("random_translation")
        << "random_translation"
        << "factor_hi=0.2, factor_lo=-0.2, fill=constant, fill_value=0.5, interp=nearest, "
           "seed=7, width_hi=0.3, width_lo=-0.3";
    QTest::newRow("random_contrast")
        << "random_contrast"
        << "factor_hi=0.5, factor_lo=0.5, seed=7, value_hi=1, value_lo=0";
    QTest::newRow("random_brightness")
        << "random_brightness"
        << "factor_hi=0.2, factor_lo=-0.2, seed=7, value_hi=1, value_lo=0";
    QTest::newRow("random_crop") << "random_crop"
                                 << "seed=7";
}

// Every sample of a batch holds the same image: each draws its own transform, another step draws
// others, the same (step, sample) draws the same, and rows 4..7 of a batch at global sample 100
// equal a batch of those rows at global sample 104 (a replica's slice).
void TestAugment::drawsDifferPerSampleAndStepAndRepeat() {
    QFETCH(QString, op);
    QFETCH(QString, attrs);
    const Shape in{8, 9, 10, 2};
    const Shape out = op == "random_crop" ? Shape{8, 6, 7, 2} : in;
    const int64_t per = numElements(in) / 8, outPer = numElements(out) / 8;
    const std::vector<float> one = pattern(size_t(per), 3, 0.1f, 0.9f);
    std::vector<float> x;
    for (int b = 0; b < 8; ++b) x.insert(x.end(), one.begin(), one.end());
    auto a = runOp(op.toStdString(), attrs.toStdString(), in, out, x, 5, 100);
    QVERIFY2(a.ok(), why(a).c_str());
    auto again = runOp(op.toStdString(), attrs.toStdString(), in, out, x, 5, 100);
    QVERIFY2(again.ok(), why(again).c_str());
    QCOMPARE(*again, *a);
    auto next = runOp(op.toStdString(), attrs.toStdString(), in, out, x, 6, 100);
    QVERIFY2(next.ok(), why(next).c_str());
    QVERIFY(*next != *a);
    std::set<std::vector<float>> distinct;
    for (int b = 0; b < 8; ++b) distinct.insert(sampleOf(*a, b, outPer));
    // A flip has two outcomes; every other draw is continuous (or has many crop positions).
    QVERIFY2(distinct.size() >= (op == "random_flip" ? 2u : 6u),
             qPrintable(QString("%1 distinct samples of 8").arg(distinct.size())));
    const Shape halfIn{4, in[1], in[2], in[3]}, halfOut{4, out[1], out[2], out[3]};
    auto slice = runOp(op.toStdString(), attrs.toStdString(), halfIn, halfOut,
                       std::vector<float>(x.begin() + 4 * per, x.end()), 5, 104);
    QVERIFY2(slice.ok(), why(slice).c_str());
    QCOMPARE(*slice, std::vector<float>(a->begin() + 4 * outPer, a->end()));
}

void TestAugment::flipsAreExactMirrors() {
    const int64_t B = 32, H = 5, W = 6, C = 2, per = H * W * C;
    const std::vector<float> x = pattern(size_t(B * per), 4);
    auto at = [&](const std::vector<float>& v, int64_t b, int64_t i, int64_t j, int64_t c) {
        return v[size_t(((b * H + i) * W + j) * C + c)];
    };
    for (const char* mode : {"horizontal", "vertical", "horizontal_and_vertical"}) {
        auto y = runOp("random_flip", std::string("flip=") + mode + ", seed=3", {B, H, W, C},
                       {B, H, W, C}, x, 2, 0);
        QVERIFY2(y.ok(), why(y).c_str());
        int flipped = 0;
        for (int64_t b = 0; b < B; ++b) {
            const bool same = sampleOf(*y, b, per) == sampleOf(x, b, per);
            bool mirror = true;
            for (int64_t i = 0; i < H; ++i)
                for (int64_t j = 0; j < W; ++j)
                    for (int64_t c = 0; c < C; ++c) {
                        const int64_t si = std::strcmp(mode, "horizontal") ? H - 1 - i : i;
                        const int64_t sj = std::strcmp(mode, "vertical") ? W - 1 - j : j;
                        mirror = mirror && at(*y, b, i, j, c) == at(x, b, si, sj, c);
                    }
            QVERIFY2(same != mirror, qPrintable(QString("%1: sample %2").arg(mode).arg(b)));
            flipped += mirror;
        }
        QVERIFY2(flipped > 4 && flipped < 28, qPrintable(QString("%1 of 32 flipped").arg(flipped)));
    }
}

// A range of zero is no transform at all, whatever the fill mode and interpolation.
void TestAugment::zeroTransformsAreIdentity() {
    const Shape image{7, 8, 3};
    const std::vector<float> x = pattern(4 * 7 * 8 * 3, 5);
    for (FillModeKind fill :
         {FillModeKind::Reflect, FillModeKind::Wrap, FillModeKind::Constant, FillModeKind::Nearest})
        for (InterpolationKind interp : {InterpolationKind::Bilinear, InterpolationKind::Nearest}) {
            LayerSpec rot = layerOf(LayerType::RandomRotation);
            LayerSpec zoom = layerOf(LayerType::RandomZoom);
            zoom.widthFactor = FactorRange{};
            for (LayerSpec l : {rot, zoom, translation(0, 0, fill, interp)}) {
                l.fillMode = fill;
                l.interpolation = interp;
                auto y = runLayer(l, image, x, 4, GraphMode::Train);
                QVERIFY2(y.ok(), why(y).c_str());
                QVERIFY2(*y == x, qPrintable(QString("%1, %2, %3")
                                                 .arg(layerTypeName(l.type), fillName(fill),
                                                      interpolationName(interp))));
            }
        }
}

void TestAugment::fillModesOnAWorkedOutRow_data() {
    QTest::addColumn<QString>("fill");
    QTest::addColumn<std::vector<float>>("want");
    // The row [a b c d] = [1 2 3 4] shifted right by 2 (a translation of width factor 0.5): the
    // output's columns 0 and 1 read the input's -2 and -1. reflect: dcba|abcd -> b a; wrap:
    // abcd|abcd -> c d; constant: the fill value 9; nearest: the edge a a.
    QTest::newRow("reflect") << "reflect" << std::vector<float>{2, 1, 1, 2};
    QTest::newRow("wrap") << "wrap" << std::vector<float>{3, 4, 1, 2};
    QTest::newRow("constant") << "constant" << std::vector<float>{9, 9, 1, 2};
    QTest::newRow("nearest") << "nearest" << std::vector<float>{1, 1, 1, 2};
}

void TestAugment::fillModesOnAWorkedOutRow() {
    QFETCH(QString, fill);
    QFETCH(std::vector<float>, want);
    for (const char* interp : {"nearest", "bilinear"}) {
        auto y =
            runOp("random_translation",
                  "factor_hi=0, factor_lo=0, fill=" + fill.toStdString() +
                      ", fill_value=9, interp=" + interp + ", seed=1, width_hi=0.5, width_lo=0.5",
                  {1, 1, 4, 1}, {1, 1, 4, 1}, {1, 2, 3, 4}, 1, 0);
        QVERIFY2(y.ok(), why(y).c_str());
        QCOMPARE(*y, want);
    }
}

// Keras' own layers in training mode with both ends of each range equal, so that its draw is
// known: every fill mode with nearest and bilinear sampling, whole and fractional shifts,
// a rotation and zooms (in, out, the width on its own), and a brightness shift.
void TestAugment::fixedTransformsMatchKeras() {
    std::vector<KerasCase> cases;
    const std::vector<std::pair<FillModeKind, QString>> fills = {
        {FillModeKind::Reflect, "reflect"},
        {FillModeKind::Wrap, "wrap"},
        {FillModeKind::Constant, "constant"},
        {FillModeKind::Nearest, "nearest"}};
    for (const auto& [fill, name] : fills) {
        cases.push_back({"translation by whole pixels, nearest, " + name,
                         "keras.layers.RandomTranslation((0.25, 0.25), (-0.25, -0.25), "
                         "fill_mode='" +
                             name + "', interpolation='nearest', fill_value=0.5)(x, training=True)",
                         translation(0.25, -0.25, fill, InterpolationKind::Nearest),
                         {8, 8, 2},
                         GraphMode::Train});
        cases.push_back({"translation by fractions of a pixel, nearest, " + name,
                         "keras.layers.RandomTranslation((0.1, 0.1), (0.3, 0.3), fill_mode='" +
                             name + "', interpolation='nearest', fill_value=0.5)(x, training=True)",
                         translation(0.1, 0.3, fill, InterpolationKind::Nearest),
                         {7, 9, 1},
                         GraphMode::Train});
        cases.push_back({"translation by fractions of a pixel, bilinear, " + name,
                         "keras.layers.RandomTranslation((0.1, 0.1), (0.3, 0.3), fill_mode='" +
                             name + "', fill_value=0.5)(x, training=True)",
                         translation(0.1, 0.3, fill, InterpolationKind::Bilinear),
                         {7, 9, 1},
                         GraphMode::Train,
                         1e-5});
        LayerSpec rot = layerOf(LayerType::RandomRotation);
        rot.factor = {0.125, 0.125};
        rot.fillMode = fill;
        cases.push_back({"rotation by 45 degrees, " + name,
                         "keras.layers.RandomRotation((0.125, 0.125), fill_mode='" + name +
                             "')(x, training=True)",
                         rot,
                         {9, 9, 1},
                         GraphMode::Train,
                         1e-4});
        LayerSpec zoom = layerOf(LayerType::RandomZoom);
        zoom.heightFactor = {0.3, 0.3};
        zoom.widthFactor = FactorRange{-0.2, -0.2};
        zoom.fillMode = fill;
        cases.push_back({"zoom, each axis its own, " + name,
                         "keras.layers.RandomZoom((0.3, 0.3), (-0.2, -0.2), fill_mode='" + name +
                             "')(x, training=True)",
                         zoom,
                         {8, 10, 2},
                         GraphMode::Train,
                         1e-5});
    }
    LayerSpec zoomIn = layerOf(LayerType::RandomZoom);
    zoomIn.heightFactor = {-0.25, -0.25};
    cases.push_back({"zoom in, the width as the height",
                     "keras.layers.RandomZoom((-0.25, -0.25))(x, training=True)",
                     zoomIn,
                     {9, 7, 3},
                     GraphMode::Train,
                     1e-5});
    LayerSpec brightness = layerOf(LayerType::RandomBrightness);
    brightness.factor = {0.3, 0.3};
    brightness.valueLow = 0.0;
    brightness.valueHigh = 1.0;
    cases.push_back({"brightness, clipped",
                     "keras.layers.RandomBrightness((0.3, 0.3), value_range=(0, 1))(x, "
                     "training=True)",
                     brightness,
                     {5, 6, 3},
                     GraphMode::Train,
                     1e-6});
    compareWithKeras(cases);
}

// A random crop is a window of the image that fits, each sample its own.
void TestAugment::randomCropIsAWindow() {
    const int64_t B = 16, H = 9, W = 11, C = 2, OH = 5, OW = 4;
    std::vector<float> x(size_t(B * H * W * C));
    for (size_t i = 0; i < x.size(); ++i) x[i] = float(i);  // every value tells its position
    LayerSpec crop = sized(LayerType::RandomCrop, OH, OW);
    auto y = runLayer(crop, {H, W, C}, x, B, GraphMode::Train, 4, 8);
    QVERIFY2(y.ok(), why(y).c_str());
    std::set<std::pair<int64_t, int64_t>> corners;
    for (int64_t b = 0; b < B; ++b) {
        const auto first = int64_t((*y)[size_t(b * OH * OW * C)]) - b * H * W * C;
        const int64_t top = first / C / W, left = first / C % W;
        QVERIFY(top >= 0 && top + OH <= H && left >= 0 && left + OW <= W);
        for (int64_t i = 0; i < OH; ++i)
            for (int64_t j = 0; j < OW; ++j)
                for (int64_t c = 0; c < C; ++c)
                    QCOMPARE((*y)[size_t(((b * OH + i) * OW + j) * C + c)],
                             x[size_t(((b * H + top + i) * W + left + j) * C + c)]);
        corners.insert({top, left});
    }
    QVERIFY2(corners.size() >= 8, qPrintable(QString("%1 distinct windows").arg(corners.size())));
    // An image not larger both ways (9 x 4 for a 5 x 4 crop): Keras' smart_resize crop, rows
    // 2..6, the same for every sample.
    const std::vector<float> one = pattern(size_t(H * OW * C), 6);
    std::vector<float> same;
    for (int64_t b = 0; b < B; ++b) same.insert(same.end(), one.begin(), one.end());
    auto narrow = runLayer(crop, {H, OW, C}, same, B, GraphMode::Train);
    QVERIFY2(narrow.ok(), why(narrow).c_str());
    const std::vector<float> centre(one.begin() + 2 * OW * C, one.begin() + 7 * OW * C);
    for (int64_t b = 0; b < B; ++b) QCOMPARE(sampleOf(*narrow, b, OH * OW * C), centre);
}

// RandomContrast: (x - mean) * f + mean per channel, clipped, with one f in [1 - lower,
// 1 + upper] per sample; RandomBrightness: x + d clipped, with one d in [lower, upper] x the
// range's width per sample. The factor is read back from each sample's unclipped values.
void TestAugment::contrastAndBrightnessFollowKerasFormula() {
    const int64_t B = 12, H = 6, W = 5, C = 3, pixels = H * W, per = pixels * C;
    const std::vector<float> x = pattern(size_t(B * per), 7, 0.3f, 0.7f);
    LayerSpec contrast = layerOf(LayerType::RandomContrast);
    contrast.factor = {0.2, 0.6};
    contrast.valueLow = 0.0;
    contrast.valueHigh = 1.0;
    auto y = runLayer(contrast, {H, W, C}, x, B, GraphMode::Train, 9, 3);
    QVERIFY2(y.ok(), why(y).c_str());
    std::set<float> factors;
    for (int64_t b = 0; b < B; ++b) {
        std::vector<double> mean(C, 0.0);
        for (int64_t p = 0; p < pixels; ++p)
            for (int64_t c = 0; c < C; ++c) mean[size_t(c)] += x[size_t(b * per + p * C + c)];
        for (double& m : mean) m /= double(pixels);
        // The factor from the value farthest from its mean (never clipped: 0.3..0.7 stays in
        // 0..1 for factors up to 1.6 around means near 0.5).
        double f = 0, far = 0;
        for (int64_t i = 0; i < per; ++i) {
            const double dev = x[size_t(b * per + i)] - mean[size_t(i % C)];
            if (std::fabs(dev) > far) {
                far = std::fabs(dev);
                f = ((*y)[size_t(b * per + i)] - mean[size_t(i % C)]) / dev;
            }
        }
        QVERIFY2(f >= 0.8 - 1e-4 && f <= 1.6 + 1e-4, qPrintable(QString::number(f)));
        for (int64_t i = 0; i < per; ++i) {
            const double m = mean[size_t(i % C)];
            const double want = std::clamp((x[size_t(b * per + i)] - m) * f + m, 0.0, 1.0);
            QVERIFY2(std::fabs((*y)[size_t(b * per + i)] - want) < 1e-5,
                     qPrintable(QString("sample %1 value %2").arg(b).arg(i)));
        }
        factors.insert(float(f));
    }
    QVERIFY(factors.size() >= size_t(B - 1));

    LayerSpec brightness = layerOf(LayerType::RandomBrightness);
    brightness.factor = {0.1, 0.4};
    brightness.valueLow = 0.0;
    brightness.valueHigh = 1.0;  // d in [0.1, 0.4]: values clip at 1, never all
    auto z = runLayer(brightness, {H, W, C}, x, B, GraphMode::Train, 9, 3);
    QVERIFY2(z.ok(), why(z).c_str());
    std::set<float> deltas;
    int clipped = 0;
    for (int64_t b = 0; b < B; ++b) {
        double d = NAN;
        for (int64_t i = 0; i < per && std::isnan(d); ++i) {
            const float v = (*z)[size_t(b * per + i)];
            if (v > 0.f && v < 1.f) d = double(v) - x[size_t(b * per + i)];
        }
        QVERIFY2(!std::isnan(d) && d >= 0.1 - 1e-6 && d <= 0.4 + 1e-6,
                 qPrintable(QString("sample %1: shift %2").arg(b).arg(d)));
        for (int64_t i = 0; i < per; ++i) {
            const double want = std::clamp(x[size_t(b * per + i)] + d, 0.0, 1.0);
            clipped += want == 1.0;
            QVERIFY(std::fabs((*z)[size_t(b * per + i)] - want) < 1e-6);
        }
        deltas.insert(float(d));
    }
    QVERIFY(deltas.size() >= size_t(B - 1));
    QVERIFY(clipped > 0);
}

// RandomFlip and a CenterCrop that only crops may follow a layer with weights: the gradient of a
// flip is the same flip, that of a crop the gradient padded with zeros. Checked against central
// differences of the loss through Conv2D -> RandomFlip -> CenterCrop -> Flatten -> Dense.
void TestAugment::flipAndCropPassGradients() {
    ModelSpec m;
    LayerSpec in = layerOf(LayerType::Input, "input");
    in.inputShape = {6, 6, 1};
    LayerSpec conv = layerOf(LayerType::Conv2D, "conv");
    conv.filters = 2;
    conv.kernelSize = {2, 2};
    conv.activation = ActivationKind::Tanh;
    LayerSpec flip = layerOf(LayerType::RandomFlip, "flip");
    LayerSpec crop = sized(LayerType::CenterCrop, 3, 4);
    crop.name = "crop";
    LayerSpec dense = layerOf(LayerType::Dense, "dense");
    dense.units = 3;
    dense.activation = ActivationKind::Softmax;
    m.layers = {in, conv, flip, crop, layerOf(LayerType::Flatten, "flatten"), dense};
    auto info = inferShapes(m);
    QVERIFY2(info.ok(), why(info).c_str());
    BuildOptions bo;
    bo.batch = 6;
    auto g = buildGraph(m, *info, bo);
    QVERIFY2(g.ok(), why(g).c_str());
    QVERIFY(autodiff(*g).ok());
    Harness h;
    std::string error;
    QVERIFY2(h.compile(*g, {}, &error), error.c_str());
    const std::vector<float> x = pattern(6 * 36, 8, -1.f, 1.f);
    std::memcpy(h.in(), x.data(), x.size() * sizeof(float));
    for (int i = 0; i < 6; ++i) static_cast<int32_t*>(h.lab())[i] = i % 3;
    const std::vector<int> params = h.g.params();
    for (size_t p = 0; p < params.size(); ++p) {
        const std::vector<float> init =
            pattern(size_t(numElements(h.g.node(params[p]).shape)), 9 + uint32_t(p), -0.5f, 0.5f);
        std::memcpy(h.param(p), init.data(), init.size() * sizeof(float));
    }
    auto loss = [&] {
        h.run(4, 20);
        return double(*h.output("loss"));
    };
    loss();
    const std::vector<float> grad(h.grad(0), h.grad(0) + 8);  // the conv kernel's gradient
    for (int k = 0; k < 8; ++k) {
        const float keep = h.param(0)[k];
        const float eps = 1e-2f;
        h.param(0)[k] = keep + eps;
        const double up = loss();
        h.param(0)[k] = keep - eps;
        const double down = loss();
        h.param(0)[k] = keep;
        const double numeric = (up - down) / (2.0 * eps);
        QVERIFY2(std::fabs(numeric - grad[size_t(k)]) < 2e-3 + 2e-2 * std::fabs(numeric),
                 qPrintable(QString("kernel[%1]: analytic %2, numeric %3")
                                .arg(k)
                                .arg(grad[size_t(k)])
                                .arg(numeric)));
    }
    // A layer without an input gradient after one with weights is refused, naming both.
    m.layers[2] = layerOf(LayerType::RandomRotation, "rotation");
    auto refused = inferShapes(m);
    QVERIFY(!refused.ok());
    QVERIFY2(refused.error().find("layer 2 'rotation': RandomRotation has no input gradient") !=
                     std::string::npos &&
                 refused.error().find("layer 1 'conv' has 10") != std::string::npos,
             why(refused).c_str());
}

// A small CNN on the synthetic source with RandomFlip, RandomRotation and RandomZoom after its
// input trains through the CLI, and its test accuracy is well above chance (1 in 4).
void TestAugment::augmentedCnnTrainsThroughTheCli() {
    QTemporaryDir dir;
    const QString project = dir.filePath("augmented.json");
    QFile f(project);
    QVERIFY(f.open(QIODevice::WriteOnly));
    f.write(R"({"format": "traindeck-project", "version": 1, "name": "augmented CNN",
 "model": {"class_name": "Sequential", "config": {"name": "cnn", "layers": [
   {"class_name": "InputLayer", "config": {"batch_shape": [null, 12, 12, 1]}},
   {"class_name": "RandomFlip", "config": {"mode": "horizontal"}},
   {"class_name": "RandomRotation", "config": {"factor": 0.05}},
   {"class_name": "RandomZoom", "config": {"height_factor": 0.1}},
   {"class_name": "Conv2D", "config": {"filters": 8, "kernel_size": 3, "activation": "relu"}},
   {"class_name": "MaxPooling2D", "config": {}},
   {"class_name": "Flatten", "config": {}},
   {"class_name": "Dense", "config": {"units": 4, "activation": "softmax"}}]}},
 "data": {"source": {"type": "synthetic", "samples": 2048, "test_samples": 512,
                     "shape": [12, 12, 1], "classes": 4, "seed": 1},
          "pipeline": {"map": [], "cache": "memory", "shuffle_buffer": 2048}},
 "training": {"epochs": 3, "batch_size": 64, "seed": 3}})");
    f.close();
    const td::test::Run r =
        td::test::traindeck({"train", project, "--db", dir.filePath("runs.db"), "--plain"});
    QVERIFY2(r.code == 0, qPrintable(r.out + r.err));
    const QRegularExpressionMatch m = QRegularExpression("test_accuracy: ([0-9.]+)").match(r.out);
    QVERIFY2(m.hasMatch(), qPrintable(r.out));
    QVERIFY2(m.captured(1).toDouble() > 0.6, qPrintable(r.out));
}

QTEST_GUILESS_MAIN(TestAugment)
#include "test_augment.moc"

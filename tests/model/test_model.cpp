// engine/model: name tables, shape inference, parameter counts, generated names, summary text.
#include <QtTest>

#include "engine/model/layers.h"

using namespace td;

namespace {

LayerSpec input(Shape shape, std::string name = "") {
    LayerSpec l;
    l.type = LayerType::Input;
    l.inputShape = std::move(shape);
    l.name = std::move(name);
    return l;
}

LayerSpec flatten(Shape inputShape = {}) {
    LayerSpec l;
    l.type = LayerType::Flatten;
    l.inputShape = std::move(inputShape);
    return l;
}

LayerSpec dense(int64_t units, ActivationKind a = ActivationKind::Linear, std::string name = "") {
    LayerSpec l;
    l.type = LayerType::Dense;
    l.units = units;
    l.activation = a;
    l.name = std::move(name);
    return l;
}

LayerSpec dropout(double rate) {
    LayerSpec l;
    l.type = LayerType::Dropout;
    l.rate = rate;
    return l;
}

LayerSpec reshape(Shape target) {
    LayerSpec l;
    l.type = LayerType::Reshape;
    l.targetShape = std::move(target);
    return l;
}

// The seed model: Flatten (28,28) -> Dense 128 relu -> Dropout 0.2 -> Dense 10.
ModelSpec seedModel(bool withInputLayer) {
    ModelSpec m;
    if (withInputLayer) {
        m.layers.push_back(input({28, 28}));
        m.layers.push_back(flatten());
    } else {
        m.layers.push_back(flatten({28, 28}));
    }
    m.layers.push_back(dense(128, ActivationKind::Relu));
    m.layers.push_back(dropout(0.2));
    m.layers.push_back(dense(10));
    return m;
}

LayerSpec conv(int64_t filters, Shape kernel, bool same = false, Shape strides = {}) {
    LayerSpec l;
    l.type = LayerType::Conv2D;
    l.filters = filters;
    l.kernelSize = std::move(kernel);
    l.samePadding = same;
    l.strides = std::move(strides);
    l.activation = ActivationKind::Relu;
    return l;
}

LayerSpec layerOf(LayerType t) {
    LayerSpec l;
    l.type = t;
    return l;
}

QStringList lines(const std::string& text) {
    return QString::fromStdString(text).split('\n');
}

}  // namespace

class TestModel : public QObject {
    Q_OBJECT

  private slots:
    void layerTypeNames_data() {
        QTest::addColumn<int>("type");
        QTest::addColumn<QString>("className");
        QTest::addColumn<QString>("prefix");
        QTest::newRow("input") << int(LayerType::Input) << "InputLayer"
                               << "input_layer";
        QTest::newRow("flatten") << int(LayerType::Flatten) << "Flatten"
                                 << "flatten";
        QTest::newRow("reshape") << int(LayerType::Reshape) << "Reshape"
                                 << "reshape";
        QTest::newRow("dense") << int(LayerType::Dense) << "Dense"
                               << "dense";
        QTest::newRow("dropout") << int(LayerType::Dropout) << "Dropout"
                                 << "dropout";
        QTest::newRow("activation") << int(LayerType::Activation) << "Activation"
                                    << "activation";
    }
    void layerTypeNames() {
        QFETCH(int, type);
        QFETCH(QString, className);
        QFETCH(QString, prefix);
        const auto t = static_cast<LayerType>(type);
        QCOMPARE(QString(layerTypeName(t)), className);
        QCOMPARE(QString(defaultLayerNamePrefix(t)), prefix);
        auto parsed = parseLayerType(className.toStdString());
        QVERIFY(parsed.ok());
        QCOMPARE(int(*parsed), type);
    }

    void unknownLayerClass() {
        auto r = parseLayerType("LSTM");
        QVERIFY(!r.ok());
        QCOMPARE(QString::fromStdString(r.error()),
                 "unsupported layer class 'LSTM' (supported: InputLayer, Flatten, Reshape, "
                 "Dense, Dropout, Activation, Conv2D, MaxPooling2D, AveragePooling2D, "
                 "GlobalAveragePooling2D, BatchNormalization, LayerNormalization, ZeroPadding2D, "
                 "Rescaling, Resizing, CenterCrop, RandomCrop, RandomFlip, RandomRotation, "
                 "RandomZoom, RandomTranslation, RandomContrast, RandomBrightness)");
    }

    void activationNames_data() {
        QTest::addColumn<int>("kind");
        QTest::addColumn<QString>("name");
        QTest::newRow("linear") << int(ActivationKind::Linear) << "linear";
        QTest::newRow("relu") << int(ActivationKind::Relu) << "relu";
        QTest::newRow("leaky_relu") << int(ActivationKind::LeakyRelu) << "leaky_relu";
        QTest::newRow("elu") << int(ActivationKind::Elu) << "elu";
        QTest::newRow("gelu") << int(ActivationKind::Gelu) << "gelu";
        QTest::newRow("sigmoid") << int(ActivationKind::Sigmoid) << "sigmoid";
        QTest::newRow("tanh") << int(ActivationKind::Tanh) << "tanh";
        QTest::newRow("softmax") << int(ActivationKind::Softmax) << "softmax";
    }
    void activationNames() {
        QFETCH(int, kind);
        QFETCH(QString, name);
        QCOMPARE(QString(activationName(static_cast<ActivationKind>(kind))), name);
        auto parsed = parseActivation(name.toStdString());
        QVERIFY(parsed.ok());
        QCOMPARE(int(*parsed), kind);
    }

    void unknownActivation() {
        auto r = parseActivation("swish");
        QVERIFY(!r.ok());
        QCOMPARE(QString::fromStdString(r.error()),
                 "unknown activation 'swish' (valid: linear, relu, leaky_relu, elu, gelu, "
                 "sigmoid, tanh, softmax)");
    }

    void initializerNames_data() {
        QTest::addColumn<QString>("given");
        QTest::addColumn<QString>("canonical");
        QTest::addColumn<QString>("className");
        QTest::newRow("GlorotUniform") << "GlorotUniform"
                                       << "glorot_uniform"
                                       << "GlorotUniform";
        QTest::newRow("glorot_normal") << "glorot_normal"
                                       << "glorot_normal"
                                       << "GlorotNormal";
        QTest::newRow("HeNormal") << "HeNormal"
                                  << "he_normal"
                                  << "HeNormal";
        QTest::newRow("he_uniform") << "he_uniform"
                                    << "he_uniform"
                                    << "HeUniform";
        QTest::newRow("LecunNormal") << "LecunNormal"
                                     << "lecun_normal"
                                     << "LecunNormal";
        QTest::newRow("lecun_uniform") << "lecun_uniform"
                                       << "lecun_uniform"
                                       << "LecunUniform";
        QTest::newRow("Zeros") << "Zeros"
                               << "zeros"
                               << "Zeros";
        QTest::newRow("zero") << "zero"
                              << "zeros"
                              << "Zeros";
        QTest::newRow("Ones") << "Ones"
                              << "ones"
                              << "Ones";
        QTest::newRow("Constant") << "Constant"
                                  << "constant"
                                  << "Constant";
        QTest::newRow("RandomUniform") << "RandomUniform"
                                       << "random_uniform"
                                       << "RandomUniform";
        QTest::newRow("uniform") << "uniform"
                                 << "random_uniform"
                                 << "RandomUniform";
        QTest::newRow("RandomNormal") << "RandomNormal"
                                      << "random_normal"
                                      << "RandomNormal";
        QTest::newRow("TruncatedNormal") << "TruncatedNormal"
                                         << "truncated_normal"
                                         << "TruncatedNormal";
    }
    void initializerNames() {
        QFETCH(QString, given);
        QFETCH(QString, canonical);
        QFETCH(QString, className);
        auto r = canonicalInitializerName(given.toStdString());
        QVERIFY2(r.ok(), r.ok() ? "" : r.error().c_str());
        QCOMPARE(QString::fromStdString(*r), canonical);
        QCOMPARE(QString(initializerClassName(*r)), className);
    }

    void unknownInitializer() {
        auto r = canonicalInitializerName("STFT");
        QVERIFY(!r.ok());
        QVERIFY(QString::fromStdString(r.error()).startsWith("unknown initializer 'STFT'"));
        QVERIFY(r.error().find("glorot_uniform") != std::string::npos);
    }

    void seedModelParams_data() {
        QTest::addColumn<bool>("withInputLayer");
        QTest::newRow("InputLayer") << true;
        QTest::newRow("input shape on Flatten") << false;
    }
    void seedModelParams() {
        QFETCH(bool, withInputLayer);
        ModelSpec m = seedModel(withInputLayer);
        auto info = inferShapes(m);
        QVERIFY2(info.ok(), info.ok() ? "" : info.error().c_str());
        QCOMPARE(info->totalParams, int64_t(101770));
        QCOMPARE(info->trainableParams, int64_t(101770));
        QCOMPARE(info->nonTrainableParams, int64_t(0));
        QCOMPARE(info->inputShape, (Shape{28, 28}));
        QCOMPARE(info->outputShape, (Shape{10}));
        QCOMPARE(info->layers.size(), size_t(4));  // the InputLayer is not listed
        const int64_t params[] = {0, 100480, 0, 1290};
        const Shape shapes[] = {{784}, {128}, {128}, {10}};
        const char* names[] = {"flatten", "dense", "dropout", "dense_1"};
        const char* types[] = {"Flatten", "Dense", "Dropout", "Dense"};
        for (size_t i = 0; i < 4; ++i) {
            QCOMPARE(info->layers[i].params, params[i]);
            QCOMPARE(info->layers[i].outputShape, shapes[i]);
            QCOMPARE(QString::fromStdString(info->layers[i].name), QString(names[i]));
            QCOMPARE(QString::fromStdString(info->layers[i].typeName), QString(types[i]));
        }
        QCOMPARE(info->activationBytesPerSample, int64_t((784 + 128 + 128 + 10) * 4));
        if (withInputLayer) QCOMPARE(QString::fromStdString(m.layers[0].name), "input_layer");
    }

    void summaryText() {
        ModelSpec m = seedModel(true);
        auto info = inferShapes(m);
        QVERIFY(info.ok());
        const QStringList expected{
            "Model: \"sequential\"",
            "_________________________________________________________________",
            "Layer (type)                 Output Shape              Param #",
            "=================================================================",
            "flatten (Flatten)            (None, 784)               0",
            "_________________________________________________________________",
            "dense (Dense)                (None, 128)               100,480",
            "_________________________________________________________________",
            "dropout (Dropout)            (None, 128)               0",
            "_________________________________________________________________",
            "dense_1 (Dense)              (None, 10)                1,290",
            "=================================================================",
            "Total params: 101,770",
            "Trainable params: 101,770",
            "Non-trainable params: 0",
            "_________________________________________________________________",
            "",
        };
        QCOMPARE(lines(summaryTable(m, *info)), expected);
    }

    void summaryWidensForLongNames() {
        ModelSpec m;
        m.layers.push_back(input({3}));
        m.layers.push_back(
            dense(2, ActivationKind::Linear, "a_really_long_layer_name_for_the_test"));
        auto info = inferShapes(m);
        QVERIFY(info.ok());
        const QStringList out = lines(summaryTable(m, *info));
        const QString row = out[4];
        QVERIFY(row.startsWith("a_really_long_layer_name_for_the_test (Dense) (None, 2)"));
        QVERIFY(row.endsWith(" 8"));
        QCOMPARE(out[1].size(), out[3].size());
        QVERIFY(out[1].size() > 65);
    }

    void nonTrainableParams() {
        ModelSpec m = seedModel(true);
        m.layers[2].trainable = false;  // dense 784 -> 128
        auto info = inferShapes(m);
        QVERIFY(info.ok());
        QCOMPARE(info->totalParams, int64_t(101770));
        QCOMPARE(info->trainableParams, int64_t(1290));
        QCOMPARE(info->nonTrainableParams, int64_t(100480));
        QCOMPARE(info->layers[1].trainableParams, int64_t(0));
        QVERIFY(summaryTable(m, *info).find("Non-trainable params: 100,480\n") !=
                std::string::npos);
    }

    void noBias() {
        ModelSpec m;
        m.layers.push_back(input({5}));
        m.layers.push_back(dense(3));
        m.layers.back().useBias = false;
        auto info = inferShapes(m);
        QVERIFY(info.ok());
        QCOMPARE(info->totalParams, int64_t(15));
    }

    void reshapeInference_data() {
        QTest::addColumn<QString>("target");
        QTest::addColumn<QString>("expected");
        QTest::newRow("explicit") << "[28,28]"
                                  << "[28,28]";
        QTest::newRow("one -1 first") << "[-1,28]"
                                      << "[28,28]";
        QTest::newRow("one -1 last") << "[4,-1]"
                                     << "[4,196]";
        QTest::newRow("flat") << "[-1]"
                              << "[784]";
        QTest::newRow("rank 3") << "[7,4,28]"
                                << "[7,4,28]";
    }
    void reshapeInference() {
        QFETCH(QString, target);
        QFETCH(QString, expected);
        Shape t;
        for (const QString& part : target.mid(1, target.size() - 2).split(','))
            t.push_back(part.toLongLong());
        ModelSpec m;
        m.layers.push_back(input({784}));
        m.layers.push_back(reshape(t));
        auto info = inferShapes(m);
        QVERIFY2(info.ok(), info.ok() ? "" : info.error().c_str());
        QCOMPARE(QString::fromStdString(shapeToString(info->outputShape)), expected);
    }

    void generatedNames() {
        ModelSpec m;
        m.layers.push_back(input({28, 28}));
        m.layers.push_back(flatten());
        m.layers.push_back(dense(64));
        m.layers.push_back(dense(32, ActivationKind::Linear, "dense_1"));  // explicit, taken
        m.layers.push_back(dense(16));
        m.layers.push_back(dropout(0.1));
        m.layers.push_back(dense(10));
        LayerSpec act;
        act.type = LayerType::Activation;
        act.activation = ActivationKind::Softmax;
        m.layers.push_back(act);
        auto info = inferShapes(m);
        QVERIFY(info.ok());
        QStringList names;
        for (const auto& l : m.layers) names << QString::fromStdString(l.name);
        QCOMPARE(names, (QStringList{"input_layer", "flatten", "dense", "dense_1", "dense_2",
                                     "dropout", "dense_3", "activation"}));
        // Running again changes nothing.
        ModelSpec again = m;
        QVERIFY(inferShapes(again).ok());
        QVERIFY(again == m);
    }

    // The Fashion-MNIST CNN: Keras' summary counts (Conv2D(32,3) on 28x28x1 = 320 parameters,
    // BatchNormalization over 32 channels = 128 of which 64 are moving statistics).
    void imageLayersAsKerasCountsThem() {
        ModelSpec m;
        m.layers = {input({28, 28}),
                    reshape({28, 28, 1}),
                    conv(32, {3, 3}),
                    layerOf(LayerType::BatchNormalization),
                    layerOf(LayerType::MaxPooling2D),
                    conv(64, {3, 3}),
                    layerOf(LayerType::MaxPooling2D),
                    flatten(),
                    dense(128, ActivationKind::Relu),
                    dense(10)};
        auto info = inferShapes(m);
        QVERIFY2(info.ok(), info.ok() ? "" : info.error().c_str());
        const std::vector<std::pair<Shape, int64_t>> want{
            {{28, 28, 1}, 0},  {{26, 26, 32}, 320},   {{26, 26, 32}, 128},
            {{13, 13, 32}, 0}, {{11, 11, 64}, 18496}, {{5, 5, 64}, 0},
            {{1600}, 0},       {{128}, 204928},       {{10}, 1290}};
        QCOMPARE(info->layers.size(), want.size());
        for (size_t i = 0; i < want.size(); ++i) {
            QCOMPARE(info->layers[i].outputShape, want[i].first);
            QCOMPARE(info->layers[i].params, want[i].second);
        }
        QCOMPARE(info->layers[2].trainableParams, int64_t(64));
        QCOMPARE(info->totalParams, int64_t(225162));
        QCOMPARE(info->trainableParams, int64_t(225098));
        QCOMPARE(info->nonTrainableParams, int64_t(64));
        QCOMPARE(info->layers[1].name, std::string("conv2d"));
        QCOMPARE(info->layers[2].name, std::string("batch_normalization"));
        QCOMPARE(info->layers[3].name, std::string("max_pooling2d"));
        // Kept for backward: both convolutions' inputs and relu outputs, the normalization's
        // and the first pooling's input, the first Dense's input and relu output; the second
        // pooling's input is also the second conv's relu output (counted once more: the
        // pooling's gradient reads it), the last Dense's input.
        const int64_t kept =
            (784 + 21632) + (5408 + 7744) + 21632 + 21632 + 7744 + (1600 + 128) + 128;
        QCOMPARE(info->keptForBackwardBytesPerSample, kept * 4);
        const std::string table = summaryTable(m, *info);
        QVERIFY(table.find("conv2d (Conv2D)") != std::string::npos);
        QVERIFY(table.find("(None, 26, 26, 32)") != std::string::npos);
        QVERIFY(table.find("Non-trainable params: 64") != std::string::npos);
    }

    void windowGeometryAsTensorFlow_data() {
        QTest::addColumn<int>("in");
        QTest::addColumn<int>("k");
        QTest::addColumn<int>("stride");
        QTest::addColumn<int>("dilation");
        QTest::addColumn<bool>("same");
        QTest::addColumn<int>("out");
        QTest::addColumn<int>("padLo");
        QTest::addColumn<int>("padHi");
        QTest::newRow("valid 3") << 28 << 3 << 1 << 1 << false << 26 << 0 << 0;
        QTest::newRow("same 3") << 28 << 3 << 1 << 1 << true << 28 << 1 << 1;
        QTest::newRow("same 2 stride 2 odd") << 29 << 2 << 2 << 1 << true << 15 << 0 << 1;
        QTest::newRow("same 4 (odd pad at the end)") << 10 << 4 << 1 << 1 << true << 10 << 1 << 2;
        QTest::newRow("valid stride 2") << 7 << 3 << 2 << 1 << false << 3 << 0 << 0;
        QTest::newRow("valid dilated") << 17 << 3 << 1 << 2 << false << 13 << 0 << 0;
        QTest::newRow("same stride 3") << 11 << 3 << 3 << 1 << true << 4 << 0 << 1;
    }
    void windowGeometryAsTensorFlow() {
        QFETCH(int, in);
        QFETCH(int, k);
        QFETCH(int, stride);
        QFETCH(int, dilation);
        QFETCH(bool, same);
        QFETCH(int, out);
        QFETCH(int, padLo);
        QFETCH(int, padHi);
        auto g = windowGeometry(in, in, Shape{k, k}, Shape{stride, stride},
                                Shape{dilation, dilation}, same, "kernel");
        QVERIFY(g.ok());
        QCOMPARE(g->outH, int64_t(out));
        QCOMPARE(g->pads, (Shape{padLo, padHi, padLo, padHi}));
    }

    void imageLayerErrors_data() {
        QTest::addColumn<int>("which");
        QTest::addColumn<QString>("message");
        QTest::newRow("kernel larger than input")
            << 0 << "layer 1 'conv2d': kernel 5x5 is larger than the input 4x4 with padding valid";
        QTest::newRow("conv on a flat input")
            << 1
            << "layer 1 'conv2d': Conv2D expects an image [height, width, channels] (rank 3), got "
               "[784]; add a Reshape layer with a channel axis first";
        QTest::newRow("negative filters")
            << 2 << "layer 1 'conv2d': filters must be a positive integer, got -3";
        QTest::newRow("zero kernel")
            << 3 << "layer 1 'conv2d': kernel_size [0,3] must hold sizes >= 1";
        QTest::newRow("groups") << 4
                                << "layer 1 'conv2d': groups 2 must divide both the 3 input "
                                   "channels and the 4 filters";
        QTest::newRow("strides and dilation")
            << 5
            << "layer 1 'conv2d': strides > 1 and dilation_rate > 1 cannot be combined (as in "
               "Keras)";
        QTest::newRow("pool larger than input")
            << 6
            << "layer 1 'max_pooling2d': pool_size 5x5 is larger than the input 4x4 with padding "
               "valid";
        QTest::newRow("negative padding")
            << 7 << "layer 1 'zero_padding2d': padding [1,-1,0,0] must hold sizes >= 0";
        QTest::newRow("batch norm epsilon")
            << 8 << "layer 1 'batch_normalization': epsilon must be positive, got 0";
        QTest::newRow("batch norm momentum")
            << 9 << "layer 1 'batch_normalization': momentum must be in [0, 1], got 1.5";
        QTest::newRow("absurd kernel")
            << 11
            << "layer 1 'conv2d': kernel_size [1099511627776,1] is too large (at most 1048576)";
        QTest::newRow("absurd filters") << 12 << "layer 1 'conv2d': the kernel is too large";
        QTest::newRow("global pooling on a flat input")
            << 10
            << "layer 1 'global_average_pooling2d': GlobalAveragePooling2D expects an image "
               "[height, width, channels] (rank 3), got [784]; add a Reshape layer with a channel "
               "axis first";
    }
    void imageLayerErrors() {
        QFETCH(int, which);
        QFETCH(QString, message);
        ModelSpec m;
        LayerSpec l;
        Shape in{4, 4, 3};
        switch (which) {
            case 0:
                l = conv(4, {5, 5});
                break;
            case 1:
                l = conv(4, {3, 3});
                in = {784};
                break;
            case 2:
                l = conv(-3, {3, 3});
                break;
            case 3:
                l = conv(4, {0, 3});
                break;
            case 4:
                l = conv(4, {3, 3});
                l.groups = 2;
                break;
            case 5:
                l = conv(4, {2, 2}, false, {2, 2});
                l.dilationRate = {2, 2};
                break;
            case 6:
                l = layerOf(LayerType::MaxPooling2D);
                l.poolSize = {5, 5};
                break;
            case 7:
                l = layerOf(LayerType::ZeroPadding2D);
                l.zeroPadding = {1, -1, 0, 0};
                break;
            case 8:
                l = layerOf(LayerType::BatchNormalization);
                l.epsilon = 0;
                break;
            case 9:
                l = layerOf(LayerType::BatchNormalization);
                l.momentum = 1.5;
                break;
            case 10:
                l = layerOf(LayerType::GlobalAveragePooling2D);
                in = {784};
                break;
            case 11:
                l = conv(4, {int64_t(1) << 40, 1}, true);
                break;
            case 12:
                l = conv(int64_t(1) << 62, {3, 3}, true);
                break;
        }
        m.layers = {input(in), l};
        auto r = inferShapes(m);
        QVERIFY(!r.ok());
        QCOMPARE(QString::fromStdString(r.error()), message);
    }

    void shapeErrors_data() {
        QTest::addColumn<int>("which");
        QTest::addColumn<QString>("message");
        QTest::newRow("Dense on rank 2")
            << 0
            << "layer 1 'dense': Dense expects a flat input (rank 1), got [28,28]; add a Flatten "
               "layer first";
        QTest::newRow("reshape mismatch")
            << 1
            << "layer 2 'reshape': cannot reshape [784] (784 elements) into [30,30] (900 "
               "elements)";
        QTest::newRow("reshape -1 mismatch")
            << 2 << "layer 2 'reshape': cannot reshape [784] (784 elements) into [-1,5]";
        QTest::newRow("reshape two -1")
            << 3 << "layer 2 'reshape': target_shape [-1,-1] may hold at most one -1";
        QTest::newRow("missing input shape")
            << 4
            << "the model needs an input shape: add an InputLayer or set batch_input_shape on "
               "the first layer";
        QTest::newRow("dropout rate 1.5")
            << 5 << "layer 3 'drop': Dropout rate must be in [0, 1), got 1.5";
        QTest::newRow("duplicate names")
            << 6
            << "layer 3 'dense': duplicate layer name (layer 2 has the same name); layer names "
               "must be unique";
        QTest::newRow("units 0") << 7 << "layer 2 'out': units must be a positive integer, got 0";
        QTest::newRow("InputLayer not first")
            << 8
            << "layer 2 'input_layer': an InputLayer can only be the first layer of a Sequential "
               "model";
        QTest::newRow("declared input shape mismatch")
            << 9
            << "layer 2 'dense': declared input shape [100] does not match the incoming shape "
               "[784]";
        QTest::newRow("empty model") << 10 << "the model has no layers";
        QTest::newRow("non-positive input dim")
            << 11 << "layer 0 'input_layer': input shape [0,28] must have positive dimensions";
        QTest::newRow("too large")
            << 12 << "layer 2 'dense': 1125899906842624 units on 784 inputs is too large";
    }
    void shapeErrors() {
        QFETCH(int, which);
        QFETCH(QString, message);
        ModelSpec m;
        switch (which) {
            case 0:
                m.layers = {input({28, 28}), dense(128)};
                break;
            case 1:
                m.layers = {input({28, 28}), flatten(), reshape({30, 30})};
                break;
            case 2:
                m.layers = {input({28, 28}), flatten(), reshape({-1, 5})};
                break;
            case 3:
                m.layers = {input({28, 28}), flatten(), reshape({-1, -1})};
                break;
            case 4:
                m.layers = {flatten(), dense(10)};
                break;
            case 5:
                m.layers = {input({28, 28}), flatten(), dense(10), dropout(1.5)};
                m.layers[3].name = "drop";
                break;
            case 6:
                m.layers = {input({28, 28}), flatten(), dense(10, ActivationKind::Linear, "dense"),
                            dense(10, ActivationKind::Linear, "dense")};
                break;
            case 7:
                m.layers = {input({28, 28}), flatten(), dense(0, ActivationKind::Linear, "out")};
                break;
            case 8:
                m.layers = {input({28, 28}), flatten(), input({784})};
                m.layers[0].name = "in";
                break;
            case 9:
                m.layers = {input({28, 28}), flatten(), dense(10)};
                m.layers[2].inputShape = {100};
                break;
            case 10:
                break;
            case 11:
                m.layers = {input({0, 28}), flatten()};
                break;
            case 12:
                m.layers = {input({28, 28}), flatten(), dense(int64_t(1) << 50)};
                break;
        }
        auto info = inferShapes(m);
        QVERIFY(!info.ok());
        QCOMPARE(QString::fromStdString(info.error()), message);
    }

    // The image preprocessing layers: Keras' names, shapes (Resizing and the crops change height
    // and width, the others keep the shape), no parameters, the summary's type names.
    void preprocessingLayerShapes() {
        auto sized = [](LayerType t, int64_t h, int64_t w) {
            LayerSpec l = layerOf(t);
            l.targetHeight = h;
            l.targetWidth = w;
            return l;
        };
        LayerSpec translation = layerOf(LayerType::RandomTranslation);
        translation.widthFactor = FactorRange{-0.1, 0.1};
        ModelSpec m;
        m.layers = {input({28, 30, 3}),
                    layerOf(LayerType::RandomFlip),
                    layerOf(LayerType::RandomRotation),
                    layerOf(LayerType::RandomZoom),
                    translation,
                    layerOf(LayerType::RandomContrast),
                    layerOf(LayerType::RandomBrightness),
                    sized(LayerType::Resizing, 20, 24),
                    sized(LayerType::CenterCrop, 16, 18),
                    sized(LayerType::RandomCrop, 12, 12),
                    conv(4, {3, 3})};
        auto info = inferShapes(m);
        QVERIFY2(info.ok(), info.ok() ? "" : info.error().c_str());
        const std::vector<Shape> want{{28, 30, 3}, {28, 30, 3}, {28, 30, 3}, {28, 30, 3},
                                      {28, 30, 3}, {28, 30, 3}, {20, 24, 3}, {16, 18, 3},
                                      {12, 12, 3}, {10, 10, 4}};
        QCOMPARE(info->layers.size(), want.size());
        for (size_t i = 0; i < want.size(); ++i) QCOMPARE(info->layers[i].outputShape, want[i]);
        QCOMPARE(info->totalParams, int64_t(3 * 3 * 3 * 4 + 4));
        const std::vector<std::string> names{
            "random_flip",        "random_rotation", "random_zoom",
            "random_translation", "random_contrast", "random_brightness",
            "resizing",           "center_crop",     "random_crop"};
        for (size_t i = 0; i < names.size(); ++i) QCOMPARE(m.layers[i + 1].name, names[i]);
        const std::string summary = summaryTable(m, *info);
        QVERIFY(summary.find("random_translation (RandomTranslation)") != std::string::npos);
        QVERIFY(summary.find("center_crop (CenterCrop)") != std::string::npos);
        for (const char* cls :
             {"Resizing", "CenterCrop", "RandomCrop", "RandomFlip", "RandomRotation", "RandomZoom",
              "RandomTranslation", "RandomContrast", "RandomBrightness"}) {
            auto t = parseLayerType(cls);
            QVERIFY2(t.ok(), cls);
            QCOMPARE(QString(layerTypeName(*t)), QString(cls));
            QVERIFY(isImagePreprocessingLayer(*t));
            QCOMPARE(isRandomImageLayer(*t),
                     std::string(cls) != "Resizing" && std::string(cls) != "CenterCrop");
        }
    }

    // The part of the image each resizing layer resizes, as Keras 3 computes it.
    void resizeBoxesAsKeras() {
        auto sized = [](LayerType t, int64_t h, int64_t w) {
            LayerSpec l = layerOf(t);
            l.targetHeight = h;
            l.targetWidth = w;
            return l;
        };
        LayerSpec resize = sized(LayerType::Resizing, 8, 8);
        QCOMPARE(resizeBoxFor(resize, 16, 9), (ResizeBox{0, 0, 16, 9, false}));
        resize.cropToAspectRatio = true;  // the largest centred square: 9 x 9 from row 3
        QCOMPARE(resizeBoxFor(resize, 16, 9), (ResizeBox{3, 0, 9, 9, false}));
        resize = sized(LayerType::Resizing, 10, 10);
        resize.padToAspectRatio = true;  // 7 x 13 padded by int((13 - 7) / 2) = 3 rows each side
        QCOMPARE(resizeBoxFor(resize, 7, 13), (ResizeBox{-3, 0, 13, 13, false}));
        resize = sized(LayerType::Resizing, 9, 12);
        resize.padToAspectRatio = true;  // 12 x 9 to 3:4: 16 columns, 3 each side (int(7 / 2))
        QCOMPARE(resizeBoxFor(resize, 12, 9), (ResizeBox{0, -3, 12, 15, false}));
        resize = sized(LayerType::Resizing, 20, 20);
        resize.padToAspectRatio = true;  // a strip 10 times as wide: 18 rows each side
        QCOMPARE(resizeBoxFor(resize, 4, 40), (ResizeBox{-18, 0, 40, 40, false}));
        // CenterCrop: a plain crop with Keras' (size - target) // 2 offsets, else smart_resize.
        QCOMPARE(resizeBoxFor(sized(LayerType::CenterCrop, 5, 6), 10, 11),
                 (ResizeBox{2, 2, 5, 6, true}));
        QCOMPARE(resizeBoxFor(sized(LayerType::CenterCrop, 12, 10), 9, 14),
                 (ResizeBox{0, 3, 9, 7, false}));  // int(9 * 10 / 12) = 7 columns
        // RandomCrop at inference: smart_resize even where a plain crop would fit.
        QCOMPARE(resizeBoxFor(sized(LayerType::RandomCrop, 6, 6), 10, 12),
                 (ResizeBox{0, 1, 10, 10, false}));
        QCOMPARE(resizeBoxFor(layerOf(LayerType::RandomFlip), 10, 12), ResizeBox{});
    }

    void preprocessingLayerErrors_data() {
        QTest::addColumn<int>("which");
        QTest::addColumn<QString>("message");
        QTest::newRow("resizing a flat input")
            << 0
            << "layer 1 'resizing': Resizing expects an image [height, width, channels] (rank "
               "3), got [784]; add a Reshape layer with a channel axis first";
        QTest::newRow("no target size")
            << 1 << "layer 1 'center_crop': height and width [0,5] must hold sizes >= 1";
        QTest::newRow("crop and pad")
            << 2
            << "layer 1 'resizing': crop_to_aspect_ratio and pad_to_aspect_ratio cannot both be "
               "true (as in Keras)";
        QTest::newRow("reversed factor")
            << 3
            << "layer 1 'random_rotation': factor [0.3, 0.1] must be two finite numbers, "
               "the lower one first";
        QTest::newRow("zoom to nothing")
            << 4 << "layer 1 'random_zoom': height_factor [-1, 0.2] must lie in (-1, 1]";
        QTest::newRow("translation without width")
            << 5 << "layer 1 'random_translation': RandomTranslation needs a width_factor";
        QTest::newRow("empty value range")
            << 6
            << "layer 1 'random_brightness': value_range [1, 1] must be two finite numbers, "
               "the lower one first";
        QTest::newRow("augmentation after weights")
            << 7
            << "layer 2 'random_zoom': RandomZoom has no input gradient, so it must come before "
               "any layer with trainable weights (layer 1 'conv2d' has 112); place the "
               "preprocessing and augmentation layers right after the input (only RandomFlip, "
               "and a CenterCrop that crops, may follow such layers)";
        QTest::newRow("resizing after weights")
            << 8
            << "layer 2 'center_crop': CenterCrop has no input gradient, so it must come before "
               "any layer with trainable weights (layer 1 'conv2d' has 112); place the "
               "preprocessing and augmentation layers right after the input (only RandomFlip, "
               "and a CenterCrop that crops, may follow such layers)";
    }
    void preprocessingLayerErrors() {
        QFETCH(int, which);
        QFETCH(QString, message);
        Shape in{4, 4, 3};
        std::vector<LayerSpec> layers;
        LayerSpec l;
        switch (which) {
            case 0:
                l = layerOf(LayerType::Resizing);
                l.targetHeight = l.targetWidth = 4;
                in = {784};
                break;
            case 1:
                l = layerOf(LayerType::CenterCrop);
                l.targetWidth = 5;
                break;
            case 2:
                l = layerOf(LayerType::Resizing);
                l.targetHeight = l.targetWidth = 4;
                l.cropToAspectRatio = l.padToAspectRatio = true;
                break;
            case 3:
                l = layerOf(LayerType::RandomRotation);
                l.factor = {0.3, 0.1};
                break;
            case 4:
                l = layerOf(LayerType::RandomZoom);
                l.heightFactor = {-1.0, 0.2};
                break;
            case 5:
                l = layerOf(LayerType::RandomTranslation);
                break;
            case 6:
                l = layerOf(LayerType::RandomBrightness);
                l.valueLow = l.valueHigh = 1.0;
                break;
            case 7:
            case 8:
                layers.push_back(conv(4, {3, 3}, true));
                l = layerOf(which == 7 ? LayerType::RandomZoom : LayerType::CenterCrop);
                l.targetHeight = l.targetWidth = 6;  // larger than the image: smart_resize
                break;
        }
        layers.push_back(l);
        ModelSpec m;
        m.layers = {input(in)};
        m.layers.insert(m.layers.end(), layers.begin(), layers.end());
        auto r = inferShapes(m);
        QVERIFY(!r.ok());
        QCOMPARE(QString::fromStdString(r.error()), message);
    }

    // RandomFlip and a CenterCrop that only crops pass the gradient back: allowed anywhere.
    void flipAndCropMayFollowWeights() {
        LayerSpec crop = layerOf(LayerType::CenterCrop);
        crop.targetHeight = crop.targetWidth = 2;
        ModelSpec m;
        m.layers = {input({6, 6, 1}), conv(4, {3, 3}), layerOf(LayerType::RandomFlip), crop};
        auto info = inferShapes(m);
        QVERIFY2(info.ok(), info.ok() ? "" : info.error().c_str());
        QCOMPARE(info->outputShape, (Shape{2, 2, 4}));
        // A frozen layer before an augmentation needs no gradient either.
        m.layers = {input({6, 6, 1}), conv(4, {3, 3}), layerOf(LayerType::RandomZoom)};
        m.layers[1].trainable = false;
        QVERIFY(inferShapes(m).ok());
    }

    void formatThousands_data() {
        QTest::addColumn<qlonglong>("n");
        QTest::addColumn<QString>("text");
        QTest::newRow("0") << 0LL << "0";
        QTest::newRow("999") << 999LL << "999";
        QTest::newRow("1000") << 1000LL << "1,000";
        QTest::newRow("101770") << 101770LL << "101,770";
        QTest::newRow("1234567") << 1234567LL << "1,234,567";
        QTest::newRow("-45000") << -45000LL << "-45,000";
    }
    void formatThousands() {
        QFETCH(qlonglong, n);
        QFETCH(QString, text);
        QCOMPARE(QString::fromStdString(td::formatThousands(n)), text);
    }
};

QTEST_APPLESS_MAIN(TestModel)
#include "test_model.moc"

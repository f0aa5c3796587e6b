// engine/io: Keras model JSON (Keras 2 and 3 forms, round trip), project files (examples, errors
// with exact field paths, round trips, atomic save).
#include <QtTest>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "engine/io/project.h"
#include "tests/source_dir.h"

using namespace td;
using Json = nlohmann::ordered_json;

namespace {

const std::string kSourceDir = td::dev::kSourceDir;

std::string readText(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    std::ostringstream s;
    s << in.rdbuf();
    return s.str();
}

QString q(const std::string& s) {
    return QString::fromStdString(s);
}

// The seed model as a Keras 3 user builds it.
ModelSpec seedSpec() {
    ModelSpec m;
    LayerSpec in;
    in.type = LayerType::Input;
    in.name = "input_layer";
    in.inputShape = {28, 28};
    LayerSpec fl;
    fl.type = LayerType::Flatten;
    fl.name = "flatten";
    LayerSpec d1;
    d1.type = LayerType::Dense;
    d1.name = "dense";
    d1.units = 128;
    d1.activation = ActivationKind::Relu;
    LayerSpec dr;
    dr.type = LayerType::Dropout;
    dr.name = "dropout";
    dr.rate = 0.2;
    LayerSpec d2 = d1;
    d2.name = "dense_1";
    d2.units = 10;
    d2.activation = ActivationKind::Softmax;
    m.layers = {in, fl, d1, dr, d2};
    return m;
}

// A model that uses every spec field the Keras JSON can carry.
ModelSpec richSpec() {
    ModelSpec m;
    m.name = "rich";
    LayerSpec fl;
    fl.type = LayerType::Flatten;
    fl.inputShape = {4, 6};  // no InputLayer: the first layer carries the input shape
    LayerSpec d1;
    d1.type = LayerType::Dense;
    d1.name = "hidden";
    d1.units = 12;
    d1.activation = ActivationKind::Gelu;
    d1.useBias = false;
    d1.trainable = false;
    d1.kernelInitializer = InitializerSpec{.name = "he_normal", .seed = 7};
    d1.kernelRegularizer = RegularizerSpec{.l1 = 0.001, .l2 = 0.0};
    LayerSpec d2;
    d2.type = LayerType::Dense;
    d2.units = 8;
    d2.activation = ActivationKind::Tanh;
    d2.kernelInitializer = InitializerSpec{.name = "random_uniform", .minval = -0.1, .maxval = 0.3};
    d2.biasInitializer = InitializerSpec{.name = "constant", .value = 0.25};
    d2.kernelRegularizer = RegularizerSpec{.l1 = 0.01, .l2 = 0.02};
    d2.biasRegularizer = RegularizerSpec{.l1 = 0.0, .l2 = 0.5};
    LayerSpec act;
    act.type = LayerType::Activation;
    act.activation = ActivationKind::LeakyRelu;
    act.negativeSlope = 0.1;  // not the default: goes out as a LeakyReLU layer
    LayerSpec elu;
    elu.type = LayerType::Activation;
    elu.name = "elu_layer";
    elu.activation = ActivationKind::Elu;
    elu.eluAlpha = 0.5;
    LayerSpec rs;
    rs.type = LayerType::Reshape;
    rs.targetShape = {-1, 4};
    LayerSpec fl2;
    fl2.type = LayerType::Flatten;
    LayerSpec dr;
    dr.type = LayerType::Dropout;
    dr.rate = 0.5;
    dr.seed = 1234;
    LayerSpec d3;
    d3.type = LayerType::Dense;
    d3.units = 3;
    d3.kernelInitializer = InitializerSpec{.name = "truncated_normal", .mean = 0.1, .stddev = 0.2};
    d3.biasInitializer = InitializerSpec{.name = "ones"};
    LayerSpec sm;
    sm.type = LayerType::Activation;
    sm.activation = ActivationKind::Softmax;
    m.layers = {fl, d1, d2, act, elu, rs, fl2, dr, d3, sm};
    return m;
}

std::string projectPath(const char* name) {
    return kSourceDir + "/projects/" + name;
}

Json fashionJson() {
    return Json::parse(readText(projectPath("fashion_mnist_mlp.json")));
}

}  // namespace

class TestIo : public QObject {
    Q_OBJECT

  private slots:
    // ---- Keras model JSON -------------------------------------------------------------------

    void kerasFixtures_data() {
        QTest::addColumn<QString>("file");
        QTest::addColumn<QString>("inputName");
        QTest::newRow("Keras 3") << "keras3_mlp.json"
                                 << "input_layer";
        QTest::newRow("Keras 2") << "keras2_mlp.json"
                                 << "flatten_input";
    }
    void kerasFixtures() {
        QFETCH(QString, file);
        QFETCH(QString, inputName);
        auto m = modelFromKerasJson(readText(kSourceDir + "/tests/io/" + file.toStdString()));
        QVERIFY2(m.ok(), m.ok() ? "" : m.error().c_str());
        ModelSpec expected = seedSpec();
        expected.layers[0].name = inputName.toStdString();
        QCOMPARE(m->layers.size(), expected.layers.size());
        for (size_t i = 0; i < expected.layers.size(); ++i)
            QVERIFY2(m->layers[i] == expected.layers[i], std::to_string(i).c_str());
        QVERIFY(*m == expected);
        auto info = inferShapes(*m);
        QVERIFY(info.ok());
        QCOMPARE(info->totalParams, int64_t(101770));
    }

    void kerasRoundTrip_data() {
        QTest::addColumn<int>("which");
        QTest::newRow("seed") << 0;
        QTest::newRow("every field") << 1;
        QTest::newRow("empty names") << 2;
    }
    void kerasRoundTrip() {
        QFETCH(int, which);
        ModelSpec m = which == 1 ? richSpec() : seedSpec();
        if (which == 2)
            for (auto& l : m.layers) l.name.clear();
        const std::string text = modelToKerasJson(m);
        auto back = modelFromKerasJson(text);
        QVERIFY2(back.ok(), back.ok() ? "" : back.error().c_str());
        for (size_t i = 0; i < m.layers.size(); ++i)
            QVERIFY2(back->layers[i] == m.layers[i], std::to_string(i).c_str());
        QVERIFY(*back == m);
        QCOMPARE(q(modelToKerasJson(*back)), q(text));
    }

    void kerasWriterIsKeras3() {
        Json j = Json::parse(modelToKerasJson(seedSpec()));
        QCOMPARE(q(j["module"].get<std::string>()), "keras");
        QCOMPARE(q(j["class_name"].get<std::string>()), "Sequential");
        const Json& layers = j["config"]["layers"];
        QCOMPARE(layers[0]["config"]["batch_shape"].dump(), std::string("[null,28,28]"));
        QCOMPARE(q(layers[2]["config"]["kernel_initializer"].dump()),
                 q(R"({"module":"keras.initializers","class_name":"GlorotUniform",)"
                   R"("config":{"seed":null},"registered_name":null})"));
        QVERIFY(layers[2]["config"]["kernel_regularizer"].is_null());
        QCOMPARE(layers[2]["build_config"]["input_shape"].dump(), std::string("[null,784]"));
        QCOMPARE(j["config"]["build_input_shape"].dump(), std::string("[null,28,28]"));
        Json rich = Json::parse(modelToKerasJson(richSpec()));
        QCOMPARE(q(rich["config"]["layers"][2]["config"]["kernel_regularizer"].dump()),
                 q(R"({"module":"keras.regularizers","class_name":"L1L2",)"
                   R"("config":{"l1":0.01,"l2":0.02},"registered_name":null})"));
        QCOMPARE(q(rich["config"]["layers"][3]["class_name"].get<std::string>()), "LeakyReLU");
    }

    void kerasWriterMatchesKeras3Fixture() {
        // What Keras 3 writes for the seed model is exactly what TrainDeck writes for it.
        const Json fixture = Json::parse(readText(kSourceDir + "/tests/io/keras3_mlp.json"));
        const Json written = Json::parse(modelToKerasJson(seedSpec()));
        QCOMPARE(q(written.dump(1)), q(fixture.dump(1)));
    }

    void kerasVariants_data() {
        QTest::addColumn<QString>("json");
        QTest::addColumn<QString>("check");
        // Each row: a Keras JSON and "layerIndex:field=value" facts about the parsed spec.
        QTest::newRow("initializer and regularizer as strings")
            << R"({"class_name":"Sequential","config":{"layers":[
                 {"class_name":"Dense","config":{"units":4,"batch_input_shape":[null,3],
                  "kernel_initializer":"he_normal","bias_initializer":"ones",
                  "kernel_regularizer":"l2"}}]}})"
            << "0:kernel=he_normal;0:bias=ones;0:l2=0.01;0:input=[3]";
        QTest::newRow("Keras 2 L1L2 and RandomNormal")
            << R"({"class_name":"Sequential","config":{"name":"m","layers":[
                 {"class_name":"InputLayer","config":{"batch_input_shape":[null,3]}},
                 {"class_name":"Dense","config":{"units":2,
                  "kernel_initializer":{"class_name":"RandomNormal","config":{"mean":0.5,"stddev":0.1,"seed":3}},
                  "kernel_regularizer":{"class_name":"L1L2","config":{"l1":0.0,"l2":0.25}}}}]}})"
            << "1:kernel=random_normal;1:l2=0.25;1:l1=0;1:seed=3;1:stddev=0.1";
        QTest::newRow("Keras 2 LeakyReLU alpha")
            << R"({"class_name":"Sequential","config":{"layers":[
                 {"class_name":"InputLayer","config":{"batch_input_shape":[null,3]}},
                 {"class_name":"LeakyReLU","config":{"alpha":0.3}}]}})"
            << "1:type=Activation;1:activation=leaky_relu;1:slope=0.3";
        QTest::newRow("leaky_relu activation string")
            << R"({"class_name":"Sequential","config":{"layers":[
                 {"class_name":"InputLayer","config":{"shape":[3]}},
                 {"class_name":"Dense","config":{"units":2,"activation":"leaky_relu"}}]}})"
            << "1:activation=leaky_relu;1:slope=0.2";
        QTest::newRow("input_dim legacy") << R"({"class_name":"Sequential","config":{"layers":[
                 {"class_name":"Dense","config":{"units":2,"input_dim":5}}]}})"
                                          << "0:input=[5]";
        QTest::newRow("early Keras 2 list config") << R"({"class_name":"Sequential","config":[
                 {"class_name":"Dense","config":{"units":2,"batch_input_shape":[null,5]}}]})"
                                                   << "0:input=[5]";
        QTest::newRow("build_input_shape without InputLayer")
            << R"({"module":"keras","class_name":"Sequential","config":{"layers":[
                 {"module":"keras.layers","class_name":"Dense","config":{"units":2}}],
                 "build_input_shape":[null,6]}})"
            << "0:input=[6]";
        QTest::newRow("trainable false and activation null")
            << R"({"class_name":"Sequential","config":{"layers":[
                 {"class_name":"InputLayer","config":{"batch_shape":[32,3]}},
                 {"class_name":"Dense","config":{"units":2,"trainable":false,"activation":null}}]}})"
            << "1:trainable=false;1:activation=linear;0:input=[3]";
        QTest::newRow("Keras 2 VarianceScaling, normal is truncated_normal")
            << R"({"class_name":"Sequential","config":{"layers":[
                 {"class_name":"InputLayer","config":{"batch_input_shape":[null,3]}},
                 {"class_name":"Dense","config":{"units":2,"kernel_initializer":{
                  "class_name":"VarianceScaling","config":{"scale":2.0,"mode":"fan_avg",
                  "distribution":"Normal","seed":5}}}}]}})"
            << "1:kernel=variance_scaling;1:scale=2;1:mode=fan_avg;1:distribution=truncated_normal;"
               "1:seed=5";
        QTest::newRow("Keras 2 Identity and Orthogonal gain")
            << R"({"class_name":"Sequential","config":{"layers":[
                 {"class_name":"InputLayer","config":{"batch_input_shape":[null,3]}},
                 {"class_name":"Dense","config":{"units":3,"kernel_initializer":{
                  "class_name":"Identity","config":{"gain":0.5}}}},
                 {"class_name":"Dense","config":{"units":3,"kernel_initializer":{
                  "class_name":"Orthogonal","config":{"gain":1.5,"seed":null}}}}]}})"
            << "1:kernel=identity;1:gain=0.5;2:kernel=orthogonal;2:gain=1.5";
        QTest::newRow("Keras 3.15 input_axes and output_axes")
            << R"({"class_name":"Sequential","config":{"layers":[
                 {"class_name":"InputLayer","config":{"batch_shape":[null,3],"optional":false}},
                 {"class_name":"Dense","config":{"units":2,"kernel_initializer":{
                  "module":"keras.initializers","class_name":"HeUniform",
                  "config":{"seed":null,"input_axes":[-1],"output_axes":[0]},
                  "registered_name":null},"quantization_config":null}}]}})"
            << "1:kernel=he_uniform;1:axes=-1/0";
        QTest::newRow("model not trainable")
            << R"({"class_name":"Sequential","config":{"trainable":false,"layers":[
                 {"class_name":"InputLayer","config":{"batch_shape":[null,3]}},
                 {"class_name":"Dense","config":{"units":2,"trainable":true}}]}})"
            << "1:trainable=false;0:trainable=true";
        QTest::newRow("mixed precision dtype policy ignored")
            << R"({"class_name":"Sequential","config":{"layers":[
                 {"class_name":"InputLayer","config":{"batch_shape":[null,3]}},
                 {"class_name":"Dense","config":{"units":2,"dtype":{"module":"keras",
                  "class_name":"DTypePolicy","config":{"name":"mixed_float16"},
                  "registered_name":null}}}]}})"
            << "1:units=2";
    }
    void kerasVariants() {
        QFETCH(QString, json);
        QFETCH(QString, check);
        auto m = modelFromKerasJson(json.toStdString());
        QVERIFY2(m.ok(), m.ok() ? "" : m.error().c_str());
        for (const QString& fact : check.split(';')) {
            const int colon = fact.indexOf(':');
            const int eq = fact.indexOf('=');
            const LayerSpec& l = m->layers.at(fact.left(colon).toInt());
            const QString field = fact.mid(colon + 1, eq - colon - 1);
            const QString want = fact.mid(eq + 1);
            QString got;
            if (field == "kernel") got = q(l.kernelInitializer.name);
            if (field == "bias") got = q(l.biasInitializer.name);
            if (field == "l1") got = QString::number(l.kernelRegularizer.l1);
            if (field == "l2") got = QString::number(l.kernelRegularizer.l2);
            if (field == "seed")
                got = l.kernelInitializer.seed ? QString::number(*l.kernelInitializer.seed) : "";
            if (field == "stddev") got = QString::number(l.kernelInitializer.stddev);
            if (field == "input") got = q(shapeToString(l.inputShape));
            if (field == "type") got = layerTypeName(l.type);
            if (field == "activation") got = activationName(l.activation);
            if (field == "slope") got = QString::number(l.negativeSlope);
            if (field == "trainable") got = l.trainable ? "true" : "false";
            if (field == "units") got = QString::number(l.units);
            if (field == "scale") got = QString::number(l.kernelInitializer.scale);
            if (field == "mode") got = q(l.kernelInitializer.mode);
            if (field == "distribution") got = q(l.kernelInitializer.distribution);
            if (field == "gain") got = QString::number(l.kernelInitializer.gain);
            if (field == "axes") {
                auto join = [](const std::vector<int64_t>& v) {
                    QStringList parts;
                    for (int64_t x : v) parts << QString::number(x);
                    return parts.join(',');
                };
                got = join(l.kernelInitializer.inputAxes) + "/" +
                      join(l.kernelInitializer.outputAxes);
            }
            QVERIFY2(got == want, qPrintable(fact + " got " + got));
        }
    }

    void kerasErrors_data() {
        QTest::addColumn<QString>("json");
        QTest::addColumn<QString>("message");
        const QString head = R"({"class_name":"Sequential","config":{"layers":[
            {"class_name":"InputLayer","config":{"batch_shape":[null,28,28]}},
            {"class_name":"Flatten","config":{}},)";
        QTest::newRow("unsupported class")
            << head + R"({"class_name":"LSTM","config":{"units":8}}]}})"
            << "Keras model JSON: config.layers[2].class_name: layer 2 has unsupported class "
               "'LSTM' (supported: InputLayer, Flatten, Reshape, Dense, Dropout, Activation, "
               "Conv2D, MaxPooling2D, AveragePooling2D, GlobalAveragePooling2D, "
               "BatchNormalization, LayerNormalization, ZeroPadding2D, Rescaling, Resizing, "
               "CenterCrop, RandomCrop, RandomFlip, RandomRotation, RandomZoom, "
               "RandomTranslation, RandomContrast, RandomBrightness, ReLU, LeakyReLU, ELU, "
               "Softmax)";
        QTest::newRow("functional")
            << R"({"class_name":"Functional","config":{"layers":[]}})"
            << "Keras model JSON: class_name: expected \"Sequential\" (TrainDeck models are "
               "Sequential stacks of layers), got \"Functional\"";
        QTest::newRow("units 0") << head + R"({"class_name":"Dense","config":{"units":0}}]}})"
                                 << "Keras model JSON: config.layers[2].config.units: expected a "
                                    "positive integer, got 0";
        QTest::newRow("dropout rate")
            << head + R"({"class_name":"Dropout","config":{"rate":1.5}}]}})"
            << "Keras model JSON: config.layers[2].config.rate: expected a number in [0, 1), got "
               "1.5";
        QTest::newRow("unknown activation")
            << head + R"({"class_name":"Dense","config":{"units":3,"activation":"swish"}}]}})"
            << "Keras model JSON: config.layers[2].config.activation: unknown activation 'swish' "
               "(valid: linear, relu, leaky_relu, elu, gelu, sigmoid, tanh, softmax)";
        QTest::newRow("constraint")
            << head + R"({"class_name":"Dense","config":{"units":3,
                "kernel_constraint":{"class_name":"MaxNorm","config":{"max_value":2}}}}]}})"
            << "Keras model JSON: config.layers[2].config.kernel_constraint: a kernel constraint "
               "is not supported (expected null), got an object";
        QTest::newRow("unknown initializer")
            << head + R"({"class_name":"Dense","config":{"units":3,
                "kernel_initializer":{"class_name":"STFT","config":{"side":"real"}}}}]}})"
            << "Keras model JSON: config.layers[2].config.kernel_initializer.class_name: unknown "
               "initializer 'STFT' (valid: glorot_uniform, glorot_normal, he_uniform, "
               "he_normal, lecun_uniform, lecun_normal, variance_scaling, zeros, ones, constant, "
               "random_uniform, random_normal, truncated_normal, orthogonal, identity)";
        QTest::newRow("unknown key with a value")
            << head + R"({"class_name":"Dense","config":{"units":3,"unitz":4}}]}})"
            << "Keras model JSON: config.layers[2].config: unknown key 'unitz'; did you mean "
               "'units'? (valid keys: name, trainable, dtype, batch_shape, batch_input_shape, "
               "input_shape, input_dim, batch_size, activity_regularizer, autocast, units, "
               "activation, use_bias, kernel_initializer, bias_initializer, kernel_regularizer, "
               "bias_regularizer, kernel_constraint, bias_constraint, lora_rank, lora_alpha, "
               "quantization_config)";
        QTest::newRow("initializer key that changes the values")
            << head + R"({"class_name":"Dense","config":{"units":3,
                "kernel_initializer":{"class_name":"GlorotUniform","config":{"scale":2.0}}}}]}})"
            << "Keras model JSON: config.layers[2].config.kernel_initializer.config: unknown key "
               "'scale' (valid keys: seed, input_axes, output_axes, dtype)";
        QTest::newRow("variance scaling mode")
            << head + R"({"class_name":"Dense","config":{"units":3,
                "kernel_initializer":{"class_name":"VarianceScaling","config":{"mode":"FAN_IN"}}}}]}})"
            << "Keras model JSON: config.layers[2].config.kernel_initializer.config.mode: expected "
               "one of \"fan_in\", \"fan_out\", \"fan_avg\", got \"FAN_IN\"";
        QTest::newRow("variance scaling distribution")
            << head + R"({"class_name":"Dense","config":{"units":3,
                "kernel_initializer":{"class_name":"VarianceScaling","config":{"distribution":"gamma"}}}}]}})"
            << "Keras model JSON: config.layers[2].config.kernel_initializer.config.distribution: "
               "expected one of \"truncated_normal\", \"untruncated_normal\", \"uniform\", got "
               "\"gamma\"";
        QTest::newRow("quantized dtype policy")
            << head + R"({"class_name":"Dense","config":{"units":3,"dtype":{"module":"keras",
                "class_name":"DTypePolicy","config":{"name":"int8_from_float32"}}}}]}})"
            << "Keras model JSON: config.layers[2].config.dtype.config.name: quantized layers are "
               "not supported, got 'int8_from_float32'";
        QTest::newRow("integer dtype on a Dense")
            << head + R"({"class_name":"Dense","config":{"units":3,"dtype":"int32"}}]}})"
            << "Keras model JSON: config.layers[2].config.dtype: expected a floating-point dtype "
               "(float32, mixed_float16, ...), got 'int32'";
        QTest::newRow("quantization config")
            << head + R"({"class_name":"Dense","config":{"units":3,
                "quantization_config":{"mode":"int8"}}}]}})"
            << "Keras model JSON: config.layers[2].config.quantization_config: quantization is "
               "not supported (expected null), got an object";
        QTest::newRow("optional input")
            << R"({"class_name":"Sequential","config":{"layers":[
                {"class_name":"InputLayer","config":{"batch_shape":[null,3],"optional":true}}]}})"
            << "Keras model JSON: config.layers[0].config.optional: optional inputs are not "
               "supported";
        QTest::newRow("axes that are not a list")
            << head + R"({"class_name":"Dense","config":{"units":3,
                "kernel_initializer":{"class_name":"HeNormal","config":{"input_axes":0,
                "output_axes":[1]}}}}]}})"
            << "Keras model JSON: config.layers[2].config.kernel_initializer.config.input_axes: "
               "expected an array, got 0";
        QTest::newRow("null dimension")
            << R"({"class_name":"Sequential","config":{"layers":[
                {"class_name":"InputLayer","config":{"batch_shape":[null,null,28]}}]}})"
            << "Keras model JSON: config.layers[0].config.batch_shape[1]: unknown (null) "
               "dimensions are not supported; give a size";
        QTest::newRow("invalid JSON") << "{\"class_name\": \"Sequential\",\n  \"config\": {,}}"
                                      << "Keras model JSON: invalid JSON at line 2, column 14: "
                                         "syntax error while parsing object key - unexpected ','; "
                                         "expected string literal";
    }
    void kerasErrors() {
        QFETCH(QString, json);
        QFETCH(QString, message);
        auto m = modelFromKerasJson(json.toStdString());
        QVERIFY(!m.ok());
        QCOMPARE(q(m.error()), message);
    }

    void kerasWarnings_data() {
        QTest::addColumn<QString>("json");
        QTest::addColumn<QString>("warning");  // the one warning expected
        const QString head = R"({"class_name":"Sequential","config":{"layers":[
            {"class_name":"InputLayer","config":{"batch_shape":[null,4]}},)";
        QTest::newRow("mixed precision layer")
            << head + R"({"class_name":"Dense","config":{"units":2,"dtype":{"module":"keras",
                 "class_name":"DTypePolicy","config":{"name":"mixed_bfloat16"}}}}]}})"
            << "config.layers[1].config.dtype.config.name: dtype 'mixed_bfloat16' is not applied "
               "per layer; TrainDeck computes in float32 unless the project's precision says "
               "otherwise";
        QTest::newRow("Keras 2 mixed precision policy")
            << head + R"({"class_name":"Dense","config":{"units":2,"dtype":{
                 "class_name":"Policy","config":{"name":"mixed_float16"}}}}]}})"
            << "config.layers[1].config.dtype.config.name: dtype 'mixed_float16' is not applied "
               "per layer; TrainDeck computes in float32 unless the project's precision says "
               "otherwise";
        QTest::newRow("uint8 input")
            << R"({"class_name":"Sequential","config":{"layers":[
                 {"class_name":"InputLayer","config":{"batch_shape":[null,4],"dtype":"uint8"}},
                 {"class_name":"Dense","config":{"units":2}}]}})"
            << "config.layers[0].config.dtype: dtype 'uint8' is not applied per layer; TrainDeck "
               "computes in float32 unless the project's precision says otherwise";
        QTest::newRow("unknown key set to null")
            << head + R"({"class_name":"Dense","config":{"units":2,"lora_dropout":null}}]}})"
            << "config.layers[1].config.lora_dropout: unknown key (null) ignored";
        QTest::newRow("unknown initializer key set to null")
            << head + R"({"class_name":"Dense","config":{"units":2,"kernel_initializer":{
                 "class_name":"GlorotUniform","config":{"seed":null,"fan_axes":null}}}}]}})"
            << "config.layers[1].config.kernel_initializer.config.fan_axes: unknown key (null) "
               "ignored";
        QTest::newRow("input_axes alone")
            << head + R"({"class_name":"Dense","config":{"units":2,"kernel_initializer":{
                 "class_name":"GlorotUniform","config":{"input_axes":[0],"output_axes":null}}}}]}})"
            << "config.layers[1].config.kernel_initializer.config.input_axes: ignored without "
               "output_axes (Keras uses them only together)";
        QTest::newRow("compiled model")
            << R"({"class_name":"Sequential","config":{"layers":[
                 {"class_name":"InputLayer","config":{"batch_shape":[null,4]}}]},
                 "compile_config":{"optimizer":"rmsprop","loss":"mse"}})"
            << "compile_config: not read: the project's training section sets the optimizer, "
               "loss and metrics";
    }
    void kerasWarnings() {
        QFETCH(QString, json);
        QFETCH(QString, warning);
        std::vector<std::string> warnings;
        auto m = modelFromKerasJson(json.toStdString(), &warnings);
        QVERIFY2(m.ok(), m.ok() ? "" : m.error().c_str());
        QCOMPARE(warnings.size(), size_t(1));
        QCOMPARE(q(warnings[0]), warning);
    }

    // Keras refuses Orthogonal and Identity for a bias (a vector); so does shape inference.
    void kerasMatrixInitializerOnBias() {
        auto m = modelFromKerasJson(R"({"class_name":"Sequential","config":{"layers":[
            {"class_name":"InputLayer","config":{"batch_shape":[null,4]}},
            {"class_name":"Dense","config":{"name":"d","units":2,"bias_initializer":"Identity"}}]}})");
        QVERIFY2(m.ok(), m.ok() ? "" : m.error().c_str());
        auto info = inferShapes(*m);
        QVERIFY(!info.ok());
        QCOMPARE(q(info.error()),
                 "layer 1 'd': the bias initializer 'identity' needs a matrix "
                 "(rank 2) and a bias is a vector");
        m->layers[1].useBias = false;  // no bias, nothing to initialize
        QVERIFY(inferShapes(*m).ok());
        // Fan axes must be dimensions of the kernel [in, out].
        m->layers[1].kernelInitializer.inputAxes = {0};
        m->layers[1].kernelInitializer.outputAxes = {2};
        info = inferShapes(*m);
        QVERIFY(!info.ok());
        QCOMPARE(q(info.error()),
                 "layer 1 'd': kernel initializer: output_axes has axis 2, but "
                 "the parameter has 2 dimensions");
        m->layers[1].kernelInitializer.outputAxes = {-1};
        QVERIFY(inferShapes(*m).ok());
    }

    // ---- projects ---------------------------------------------------------------------------

    void exampleProjects_data() {
        QTest::addColumn<QString>("file");
        QTest::addColumn<qlonglong>("params");
        QTest::addColumn<QString>("source");
        QTest::newRow("fashion_mnist_mlp")
            << "fashion_mnist_mlp.json" << 101770LL << "fashion_mnist";
        QTest::newRow("csv_iris_like")
            << "csv_iris_like.json" << qlonglong(4 * 16 + 16 + 16 * 3 + 3) << "csv";
        QTest::newRow("synthetic_blobs")
            << "synthetic_blobs.json" << qlonglong(16 * 32 + 32 + 32 * 4 + 4) << "synthetic";
    }
    void exampleProjects() {
        QFETCH(QString, file);
        QFETCH(qlonglong, params);
        QFETCH(QString, source);
        auto p = loadProject(projectPath(file.toLatin1().constData()));
        QVERIFY2(p.ok(), p.ok() ? "" : p.error().c_str());
        ModelSpec m = p->model;
        auto info = inferShapes(m);
        QVERIFY(info.ok());
        QCOMPARE(qlonglong(info->totalParams), params);
        QCOMPARE(q(p->data.source.type), source);
        if (source == "csv") {
            for (const std::string& f : {p->data.source.trainPath, p->data.source.testPath}) {
                QVERIFY2(std::filesystem::path(f).is_absolute(), f.c_str());
                QVERIFY2(std::filesystem::exists(f), f.c_str());
            }
        }
        // Every example parses back from its own projectToJson unchanged.
        auto back = parseProject(projectToJson(*p));
        QVERIFY2(back.ok(), back.ok() ? "" : back.error().c_str());
        QCOMPARE(q(projectDifference(*p, *back)), QString());
    }

    void fashionProjectValues() {
        auto p = loadProject(projectPath("fashion_mnist_mlp.json"));
        QVERIFY(p.ok());
        QCOMPARE(p->training.epochs, 10);
        QCOMPARE(p->training.batchSize, int64_t(32));
        QCOMPARE(q(p->training.optimizer.name), "adam");
        QCOMPARE(p->training.optimizer.learningRate, 0.001);
        QCOMPARE(p->training.optimizer.epsilon, 1e-7);
        QCOMPARE(q(p->training.loss.name), "sparse_categorical_crossentropy");
        QCOMPARE(p->training.loss.fromLogits, false);
        QCOMPARE(p->training.metrics, std::vector<std::string>{"accuracy"});
        QCOMPARE(p->data.pipeline.map.size(), size_t(1));
        QCOMPARE(q(p->data.pipeline.map[0].op), "scale");
        QCOMPARE(p->data.pipeline.map[0].factor, 1.0 / 255.0);
        QCOMPARE(p->data.pipeline.shuffleBuffer, int64_t(60000));
        QCOMPARE(p->data.pipeline.prefetch, kAutotune);
        QCOMPARE(p->data.validationSplit, 0.0);
        QCOMPARE(int(p->precision), int(PrecisionPolicy::Float32));
        QVERIFY(p->fusion);
        QCOMPARE(q(p->strategy.type), "one_device");
        QCOMPARE(p->strategy.timeoutSeconds, 60.0);  // the default when the key is absent
        QCOMPARE(p->model.layers.back().activation, ActivationKind::Softmax);
    }

    void projectErrors_data() {
        // Each row patches the Fashion-MNIST example at a JSON pointer (value "DELETE" removes
        // the member) and expects this exact message after "p.json: ".
        QTest::addColumn<QString>("pointer");
        QTest::addColumn<QString>("value");
        QTest::addColumn<QString>("message");
        QTest::newRow("negative learning rate")
            << "/training/optimizer/config/learning_rate"
            << "-0.1"
            << "training.optimizer.config.learning_rate: expected a positive number, got -0.1";
        QTest::newRow("unknown optimizer")
            << "/training/optimizer"
            << R"({"class_name":"Adagrad"})"
            << "training.optimizer.class_name: unknown optimizer 'Adagrad' (supported: SGD, "
               "Adam, AdamW, RMSprop)";
        QTest::newRow("batch_size 0") << "/training/batch_size"
                                      << "0"
                                      << "training.batch_size: expected a positive integer, got 0";
        QTest::newRow("validation_split 1.2")
            << "/data/validation_split"
            << "1.2"
            << "data.validation_split: expected a number in [0, 1), got 1.2";
        QTest::newRow("unknown key epocs")
            << "/training/epocs"
            << "3"
            << "training: unknown key 'epocs'; did you mean 'epochs'? (valid keys: epochs, "
               "initial_epoch, batch_size, seed, optimizer, loss, metrics, callbacks, "
               "log_every_steps, evaluate_test, run_checkpoints)";
        QTest::newRow("unknown top-level key")
            << "/colour"
            << "\"blue\""
            << "unknown key 'colour' (valid keys: format, version, name, description, model, "
               "data, training, precision, loss_scale, fusion, disabled_passes, strategy, "
               "initial_weights)";
        QTest::newRow("loss scale 0") << "/loss_scale"
                                      << "{\"initial_scale\": 0}"
                                      << "loss_scale.initial_scale: expected a positive number, "
                                         "got 0";
        QTest::newRow("loss scale growth 1.5")
            << "/loss_scale"
            << "{\"dynamic_growth_steps\": 1.5}"
            << "loss_scale.dynamic_growth_steps: expected a positive integer, got 1.5";
        QTest::newRow("loss scale unknown key")
            << "/loss_scale"
            << "{\"growth\": 3}"
            << "loss_scale: unknown key 'growth' (valid keys: initial_scale, "
               "dynamic_growth_steps)";
        QTest::newRow("bad precision")
            << "/precision"
            << "\"float64\""
            << "precision: expected one of \"float32\", \"mixed_float16\", \"mixed_bfloat16\", "
               "got \"float64\"";
        QTest::newRow("unknown layer class")
            << "/model/config/layers/2/class_name"
            << "\"LSTM\""
            << "model.config.layers[2].class_name: layer 2 has unsupported class 'LSTM' "
               "(supported: InputLayer, Flatten, Reshape, Dense, Dropout, Activation, Conv2D, "
               "MaxPooling2D, AveragePooling2D, GlobalAveragePooling2D, BatchNormalization, "
               "LayerNormalization, ZeroPadding2D, Rescaling, Resizing, CenterCrop, RandomCrop, "
               "RandomFlip, RandomRotation, RandomZoom, RandomTranslation, RandomContrast, "
               "RandomBrightness, ReLU, LeakyReLU, ELU, Softmax)";
        QTest::newRow("units 0") << "/model/config/layers/4/config/units"
                                 << "0"
                                 << "model.config.layers[4].config.units: expected a positive "
                                    "integer, got 0";
        QTest::newRow("dropout 1.5")
            << "/model/config/layers/3/config/rate"
            << "1.5"
            << "model.config.layers[3].config.rate: expected a number in [0, 1), got 1.5";
        QTest::newRow("Dense without Flatten")
            << "/model/config/layers/1"
            << "DELETE"
            << "model: layer 1 'dense': Dense expects a flat input (rank 1), got [28,28]; add a "
               "Flatten layer first";
        QTest::newRow("duplicate layer name")
            << "/model/config/layers/4/config/name"
            << "\"dense\""
            << "model: layer 4 'dense': duplicate layer name (layer 2 has the same name); layer "
               "names must be unique";
        QTest::newRow("unknown loss")
            << "/training/loss"
            << "\"hinge\""
            << "training.loss: unknown loss 'hinge' (supported: sparse_categorical_crossentropy, "
               "categorical_crossentropy, binary_crossentropy, mean_squared_error, mse; or the "
               "class names SparseCategoricalCrossentropy, CategoricalCrossentropy, "
               "BinaryCrossentropy, MeanSquaredError)";
        QTest::newRow("unknown metric")
            << "/training/metrics"
            << R"(["accuracy","f1"])"
            << "training.metrics[1]: unknown metric 'f1' (valid: accuracy, acc, "
               "sparse_categorical_accuracy, categorical_accuracy, binary_accuracy, "
               "top_k_categorical_accuracy, sparse_top_k_categorical_accuracy, "
               "top_<k>_categorical_accuracy, sparse_top_<k>_categorical_accuracy)";
        QTest::newRow("bad strategy")
            << "/strategy/type"
            << "\"parameter_server\""
            << "strategy.type: expected one of \"one_device\", \"mirrored\", "
               "\"multi_worker_mirrored\", got \"parameter_server\"";
        QTest::newRow("beta_1 on SGD")
            << "/training/optimizer/class_name"
            << "\"SGD\""
            << "training.optimizer.config: unknown key 'beta_1' (valid keys: learning_rate, "
               "weight_decay, clipnorm, global_clipnorm, clipvalue, momentum, nesterov, name, "
               "use_ema, ema_momentum, ema_overwrite_frequency, loss_scale_factor, "
               "gradient_accumulation_steps, jit_compile, is_legacy_optimizer)";
        QTest::newRow("monitor not logged")
            << "/training/callbacks"
            << R"([{"class_name":"EarlyStopping","config":{"monitor":"val_acc"}}])"
            << "training.callbacks[0].config.monitor: monitor 'val_acc' is not a logged quantity "
               "(logged: loss, accuracy, val_loss, val_accuracy)";
        QTest::newRow("csv without train")
            << "/data/source"
            << R"({"type":"csv","test":"t.csv"})"
            << "data.source.train: missing (required for a csv source)";
        QTest::newRow("prefetch negative")
            << "/data/pipeline/prefetch"
            << "-3"
            << "data.pipeline.prefetch: expected \"autotune\" or an integer >= 0, got -3";
        QTest::newRow("initial_epoch past epochs")
            << "/training/initial_epoch"
            << "10"
            << "training.initial_epoch: expected an epoch before training.epochs (10), got 10";
        QTest::newRow("wrong format") << "/format"
                                      << "\"keras\""
                                      << "format: expected one of \"traindeck-project\", got "
                                         "\"keras\"";
        QTest::newRow("missing model") << "/model"
                                       << "DELETE"
                                       << "model: missing (required)";
        QTest::newRow("one_device with two replicas")
            << "/strategy/replicas"
            << "2"
            << "strategy.replicas: a one_device strategy has one replica, got 2 (use \"mirrored\" "
               "for more)";
        QTest::newRow("schedule without decay_steps")
            << "/training/optimizer/config/learning_rate"
            << R"({"class_name":"ExponentialDecay","config":{"initial_learning_rate":0.1,"decay_rate":0.9}})"
            << "training.optimizer.config.learning_rate.config.decay_steps: missing (required)";
        QTest::newRow("normalize std 0")
            << "/data/pipeline/map/0"
            << R"({"op":"normalize","mean":0.5,"std":0})"
            << "data.pipeline.map[0].std: expected a positive number, got 0";
        QTest::newRow("bad device id")
            << "/strategy/devices"
            << R"(["gpu0"])"
            << "strategy.devices[0]: expected a device id like \"cpu:0\" or \"cuda:1\", got "
               "\"gpu0\"";
        QTest::newRow("timeout 0") << "/strategy/timeout_seconds"
                                   << "0"
                                   << "strategy.timeout_seconds: expected a positive number, got 0";
        QTest::newRow("timeout over a day")
            << "/strategy/timeout_seconds"
            << "86400.5"
            << "strategy.timeout_seconds: expected at most 86400 (one day), got 86400.5";
        QTest::newRow("timeout not a number")
            << "/strategy/timeout_seconds"
            << "\"1m\""
            << "strategy.timeout_seconds: expected a positive number, got \"1m\"";
        QTest::newRow("fusion not bool") << "/fusion"
                                         << "\"yes\""
                                         << "fusion: expected true or false, got \"yes\"";
    }
    void projectErrors() {
        QFETCH(QString, pointer);
        QFETCH(QString, value);
        QFETCH(QString, message);
        Json j = fashionJson();
        const Json::json_pointer ptr(pointer.toStdString());
        if (value == "DELETE") {
            Json& parent = j[ptr.parent_pointer()];
            const std::string last = ptr.back();
            if (parent.is_array())
                parent.erase(std::stoul(last));
            else
                parent.erase(last);
        } else {
            j[ptr] = Json::parse(value.toStdString());
        }
        auto p = parseProject(j.dump(2), "p.json");
        QVERIFY2(!p.ok(), "expected an error");
        QCOMPARE(q(p.error()), "p.json: " + message);
    }

    void invalidJson_data() {
        QTest::addColumn<QString>("text");
        QTest::addColumn<QString>("message");
        QTest::newRow("missing value")
            << "{\n  \"format\": \"traindeck-project\",\n  \"name\": ,\n}"
            << "bad.json: invalid JSON at line 3, column 11: syntax error while parsing value - "
               "unexpected ','; expected '[', '{', or a literal";
        QTest::newRow("trailing comma")
            << "{\n  \"a\": 1,\n}"
            << "bad.json: invalid JSON at line 3, column 1: syntax error while parsing object key "
               "- unexpected '}'; expected string literal";
        QTest::newRow("truncated")
            << "{\n  \"a\": [1, 2"
            << "bad.json: invalid JSON at line 2, column 13: syntax error while parsing array - "
               "unexpected end of input; expected ']'";
        QTest::newRow("empty") << ""
                               << "bad.json: invalid JSON at line 1, column 1: syntax error while "
                                  "parsing value - unexpected end of input; expected '[', '{', or "
                                  "a literal";
        QTest::newRow("not an object") << "[1]"
                                       << "bad.json: expected an object, got an array";
        QTest::newRow("Keras JSON opened as a project")
            << R"({"class_name":"Sequential","config":{"layers":[]}})"
            << "bad.json: this is a Keras model JSON, not a TrainDeck project (import it as the "
               "model of a project instead)";
    }
    void invalidJson() {
        QFETCH(QString, text);
        QFETCH(QString, message);
        auto p = parseProject(text.toStdString(), "bad.json");
        QVERIFY(!p.ok());
        QCOMPARE(q(p.error()), message);
    }

    void missingFile() {
        const std::string path = kSourceDir + "/projects/no_such_project.json";
        auto p = loadProject(path);
        QVERIFY(!p.ok());
        QCOMPARE(q(p.error()),
                 q("cannot open project file '" + path + "': No such file or directory"));
        auto d = loadProject(kSourceDir + "/projects");
        QVERIFY(!d.ok());
        QVERIFY(q(d.error()).endsWith("it is a directory"));
    }

    void modelAsString() {
        Json j = fashionJson();
        j["model"] = readText(kSourceDir + "/tests/io/keras3_mlp.json");
        auto p = parseProject(j.dump(), "p.json");
        QVERIFY2(p.ok(), p.ok() ? "" : p.error().c_str());
        QCOMPARE(p->model.layers.size(), size_t(5));
        j["model"] = "{\"class_name\": \"Sequential\", \"config\": {";
        auto bad = parseProject(j.dump(), "p.json");
        QVERIFY(!bad.ok());
        QVERIFY2(q(bad.error()).startsWith("p.json: model: invalid JSON at line 1, column 41"),
                 bad.error().c_str());
    }

    void parsedDefaultsAndForms() {
        Json j = fashionJson();
        j["training"]["optimizer"] = "AdamW";
        j["training"]["loss"] = "mse";
        j["training"]["metrics"] = Json::parse(
            R"(["acc", {"class_name":"SparseTopKCategoricalAccuracy","config":{"k":3,"name":"top3"}},
                {"class_name":"TopKCategoricalAccuracy"}, "sparse_top_k_categorical_accuracy",
                "top_7_categorical_accuracy"])");
        j["training"]["callbacks"] = Json::parse(
            R"([{"class_name":"ReduceLROnPlateau","config":{"monitor":"val_sparse_top_3_categorical_accuracy","mode":"max"}},
                "TerminateOnNaN"])");
        auto p = parseProject(j.dump(), "p.json");
        QVERIFY2(p.ok(), p.ok() ? "" : p.error().c_str());
        QCOMPARE(q(p->training.optimizer.name), "adamw");
        QCOMPARE(p->training.optimizer.weightDecay, 0.004);
        QCOMPARE(q(p->training.loss.name), "mean_squared_error");
        QCOMPARE(p->training.metrics,
                 (std::vector<std::string>{
                     "acc", "sparse_top_3_categorical_accuracy", "top_5_categorical_accuracy",
                     "sparse_top_k_categorical_accuracy", "top_7_categorical_accuracy"}));
        QCOMPARE(p->training.callbacks.size(), size_t(2));
        QCOMPARE(q(p->training.callbacks[0].type), "reduce_lr_on_plateau");
        QCOMPARE(p->training.callbacks[0].patience, 10);
        QCOMPARE(p->training.callbacks[0].minDelta, 1e-4);
        QCOMPARE(p->training.callbacks[0].factor, 0.1);
        QCOMPARE(q(p->training.callbacks[1].type), "terminate_on_nan");

        j["training"]["optimizer"] = Json::parse(R"({"class_name":"sgd"})");
        auto s = parseProject(j.dump(), "p.json");
        QVERIFY(s.ok());
        QCOMPARE(q(s->training.optimizer.name), "sgd");
        QCOMPARE(s->training.optimizer.learningRate, 0.01);

        // A Keras 3 optimizer get_config() is accepted as it is.
        j["training"]["optimizer"] =
            Json::parse(R"({"module":"keras.optimizers","class_name":"Adam",
            "config":{"name":"adam","learning_rate":0.0005,"weight_decay":null,"clipnorm":null,
            "global_clipnorm":null,"clipvalue":null,"use_ema":false,"ema_momentum":0.99,
            "ema_overwrite_frequency":null,"loss_scale_factor":null,
            "gradient_accumulation_steps":null,"beta_1":0.9,"beta_2":0.999,"epsilon":1e-07,
            "amsgrad":false},"registered_name":null})");
        auto k = parseProject(j.dump(), "p.json");
        QVERIFY2(k.ok(), k.ok() ? "" : k.error().c_str());
        QCOMPARE(k->training.optimizer.learningRate, 0.0005);
    }

    void relativePaths() {
        Json j = fashionJson();
        j["data"]["source"] = Json::parse(
            R"({"type":"idx","train_images":"d/train-images.gz","train_labels":"d/../d/train-labels.gz",
                "test_images":"/abs/t10k-images.gz","test_labels":"d/t10k-labels.gz"})");
        j["data"]["pipeline"]["cache"] = "file:cache/fm.bin";
        auto p = parseProject(j.dump(), "/home/u/projects/p.json");
        QVERIFY2(p.ok(), p.ok() ? "" : p.error().c_str());
        QCOMPARE(q(p->data.source.trainImages), "/home/u/projects/d/train-images.gz");
        QCOMPARE(q(p->data.source.trainLabels), "/home/u/projects/d/train-labels.gz");
        QCOMPARE(q(p->data.source.testImages), "/abs/t10k-images.gz");
        QCOMPARE(q(p->data.pipeline.cache), "file:/home/u/projects/cache/fm.bin");
        // Without a folder in the file name, relative paths stay as written.
        auto r = parseProject(j.dump(), "p.json");
        QVERIFY(r.ok());
        QCOMPARE(q(r->data.source.trainImages), "d/train-images.gz");
    }

    void fullProjectRoundTrip() {
        auto base = loadProject(projectPath("fashion_mnist_mlp.json"));
        QVERIFY(base.ok());
        Project p = *base;
        p.name = "everything";
        p.description = "a project with \"quotes\" and unicode \xc3\xa9";
        p.model = richSpec();
        p.model.layers.pop_back();
        p.model.layers.back().units = 5;  // synthetic classes
        p.data.source.type = "synthetic";
        p.data.source.samples = 100;
        p.data.source.testSamples = 0;
        p.data.source.sampleShape = {4, 6};
        p.data.source.classes = 5;
        p.data.source.seed = 99;
        p.data.pipeline.map = {MapStep{.op = "cast"},
                               MapStep{.op = "normalize", .mean = 0.5, .stddev = 2.0},
                               MapStep{.op = "one_hot", .depth = 5}};
        p.data.pipeline.cache = "file:/tmp/cache.bin";
        p.data.pipeline.shuffleSeed = 17;
        p.data.pipeline.reshuffleEachIteration = false;
        p.data.pipeline.dropRemainder = true;
        p.data.pipeline.prefetch = 4;
        p.data.pipeline.parallelCalls = 2;
        p.data.validationSplit = 0.25;
        p.training.epochs = 7;
        p.training.initialEpoch = 2;
        p.training.batchSize = 128;
        p.training.seed = 18446744073709551615ull;
        p.training.optimizer = OptimizerConfig{};
        p.training.optimizer.name = "adamw";
        p.training.optimizer.learningRate = 0.003;
        p.training.optimizer.weightDecay = 0.01;
        p.training.optimizer.amsgrad = true;
        p.training.optimizer.schedule.type = "cosine_decay";
        p.training.optimizer.schedule.decaySteps = 500;
        p.training.optimizer.schedule.alpha = 0.1;
        p.training.optimizer.schedule.warmupSteps = 50;
        p.training.optimizer.schedule.warmupTarget = 0.01;
        p.training.optimizer.globalClipnorm = 1.0;
        p.training.optimizer.clipvalue = 0.5;
        p.training.loss = LossConfig{.name = "categorical_crossentropy", .fromLogits = true};
        p.training.metrics = {"categorical_accuracy", "top_3_categorical_accuracy"};
        CallbackConfig es{.type = "early_stopping",
                          .monitor = "val_categorical_accuracy",
                          .mode = "max",
                          .minDelta = 0.001,
                          .patience = 4,
                          .restoreBestWeights = true,
                          .startFromEpoch = 1};
        CallbackConfig rl{.type = "reduce_lr_on_plateau",
                          .minDelta = 1e-4,
                          .patience = 2,
                          .factor = 0.5,
                          .cooldown = 1,
                          .minLr = 1e-6};
        CallbackConfig nan{.type = "terminate_on_nan"};
        p.training.callbacks = {es, rl, nan};
        p.training.logEverySteps = 3;
        p.training.evaluateTest = false;
        p.precision = PrecisionPolicy::MixedBfloat16;
        p.lossScaleInitial = 1024;
        p.lossScaleGrowthSteps = 50;
        p.fusion = false;
        p.strategy =
            StrategyConfig{.type = "mirrored", .devices = {"cpu:0", "cpu:1"}, .replicas = 2};
        p.strategy.timeoutSeconds = 12.5;
        {
            ModelSpec named = p.model;
            QVERIFY(inferShapes(named).ok());
            p.model = named;  // parseProject fills generated names
        }

        const std::string text = projectToJson(p);
        auto back = parseProject(text, "roundtrip.json");
        QVERIFY2(back.ok(), back.ok() ? "" : back.error().c_str());
        QCOMPARE(q(projectDifference(p, *back)), QString());
        QCOMPARE(q(projectToJson(*back)), q(text));
        QVERIFY(text.find("\"dynamic_growth_steps\": 50") != std::string::npos);

        // Other optimizers and schedules, and an idx source.
        p.training.optimizer = OptimizerConfig{.name = "rmsprop", .learningRate = 0.002};
        p.training.optimizer.rho = 0.8;
        p.training.optimizer.momentum = 0.5;
        p.training.optimizer.centered = true;
        p.training.optimizer.schedule = ScheduleConfig{
            .type = "exponential_decay", .decaySteps = 100, .decayRate = 0.5, .staircase = true};
        p.training.optimizer.clipnorm = 2.0;
        p.data.source =
            SourceConfig{.type = "idx", .trainImages = "/d/a.gz", .trainLabels = "/d/b.gz"};
        p.training.loss = LossConfig{.name = "mean_squared_error"};
        auto back2 = parseProject(projectToJson(p), "roundtrip.json");
        QVERIFY2(back2.ok(), back2.ok() ? "" : back2.error().c_str());
        QCOMPARE(q(projectDifference(p, *back2)), QString());

        p.training.optimizer = OptimizerConfig{.name = "sgd", .learningRate = 0.1};
        p.training.optimizer.momentum = 0.9;
        p.training.optimizer.nesterov = true;
        p.data.source = SourceConfig{.type = "npy",
                                     .trainImages = "/x.npy",
                                     .trainLabels = "/y.npy",
                                     .testImages = "/tx.npy",
                                     .testLabels = "/ty.npy"};
        auto back3 = parseProject(projectToJson(p), "roundtrip.json");
        QVERIFY2(back3.ok(), back3.ok() ? "" : back3.error().c_str());
        QCOMPARE(q(projectDifference(p, *back3)), QString());
    }

    void projectDifferenceNamesTheField() {
        auto a = loadProject(projectPath("synthetic_blobs.json"));
        QVERIFY(a.ok());
        Project b = *a;
        QCOMPARE(q(projectDifference(*a, b)), QString());
        b.training.optimizer.momentum = 0.8;
        QCOMPARE(q(projectDifference(*a, b)), "training.optimizer.config.momentum");
        b = *a;
        b.model.layers[1].units = 33;
        QCOMPARE(q(projectDifference(*a, b)), "model.config.layers[1]");
    }

    void saveLoadRoundTrip() {
        QTemporaryDir dir;
        QVERIFY(dir.isValid());
        const std::string folder = dir.path().toStdString();
        std::filesystem::create_directories(folder + "/data");
        std::filesystem::copy_file(kSourceDir + "/projects/data/iris_like_train.csv",
                                   folder + "/data/iris_like_train.csv");
        std::filesystem::copy_file(kSourceDir + "/projects/data/iris_like_test.csv",
                                   folder + "/data/iris_like_test.csv");
        auto original = loadProject(projectPath("csv_iris_like.json"));
        QVERIFY(original.ok());
        Project p = *original;
        p.data.source.trainPath = folder + "/data/iris_like_train.csv";
        p.data.source.testPath = folder + "/data/iris_like_test.csv";

        const std::string path = folder + "/saved.json";
        Status s = saveProject(p, path);
        QVERIFY2(s.ok(), s.ok() ? "" : s.error().c_str());
        // Paths inside the project folder are stored relative to it.
        Json saved = Json::parse(readText(path));
        QCOMPARE(q(saved["data"]["source"]["train"].get<std::string>()),
                 "data/iris_like_train.csv");
        auto loaded = loadProject(path);
        QVERIFY2(loaded.ok(), loaded.ok() ? "" : loaded.error().c_str());
        QCOMPARE(q(projectDifference(p, *loaded)), QString());

        // Saving again over the file leaves it unchanged and no temporary files behind.
        QVERIFY(saveProject(*loaded, path).ok());
        QCOMPARE(q(readText(path)),
                 q(projectToJson(*loaded)).replace(q(folder + "/data/"), "data/"));
        int files = 0;
        for (const auto& e : std::filesystem::directory_iterator(folder)) {
            (void)e;
            ++files;
        }
        QCOMPARE(files, 2);  // saved.json and data/

        // A folder that does not exist is an error value, not a crash.
        Status bad = saveProject(p, folder + "/missing/dir/p.json");
        QVERIFY(!bad.ok());
        QVERIFY2(q(bad.error()).contains("No such file or directory"), bad.error().c_str());
    }

    void precisionNames() {
        QCOMPARE(QString(precisionName(PrecisionPolicy::Float32)), "float32");
        QCOMPARE(QString(precisionName(PrecisionPolicy::MixedFloat16)), "mixed_float16");
        QCOMPARE(QString(precisionName(PrecisionPolicy::MixedBfloat16)), "mixed_bfloat16");
    }
};

QTEST_APPLESS_MAIN(TestIo)
#include "test_io.moc"

// What real Keras writes and computes (tests/fixtures/keras, written by make_fixtures.py with Keras
// 3.15 and 2.15) against TrainDeck: every fixture model parses, with Keras' per-layer output
// shapes and parameter counts; the models Keras writes with a feature TrainDeck lacks are refused
// naming the key; every initializer draws from Keras' distribution for Keras' fans; every Keras
// optimizer config reads as the optimizer it is.
#include <QtTest>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <sstream>

#include "engine/graph/builder.h"
#include "engine/graph/initializers.h"
#include "engine/io/project.h"
#include "tests/fixtures/keras/keras_fixtures.h"
#include "tests/graph/harness.h"
#include "tests/source_dir.h"

using namespace td;
using keras_fixtures::Json;

namespace {

QString q(const std::string& s) {
    return QString::fromStdString(s);
}

std::string readText(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    std::ostringstream s;
    s << in.rdbuf();
    return s.str();
}

const Json& fixtureModel(const QString& file, int index, const char* list = "models") {
    static std::map<QString, Json> cache;
    auto it = cache.find(file);
    if (it == cache.end()) it = cache.emplace(file, keras_fixtures::load(file.toStdString())).first;
    return it->second.at(list).at(size_t(index));
}

void addModelRows(const char* list) {
    QTest::addColumn<QString>("file");
    QTest::addColumn<int>("index");
    for (const char* file : {"models_keras3.json", "models_keras2.json"}) {
        const Json fixture = keras_fixtures::load(file);
        const Json& models = fixture.at(list);
        for (size_t i = 0; i < models.size(); ++i) {
            const std::string row =
                std::string(file).substr(7, 6) + "/" + models[i].at("name").get<std::string>();
            QTest::newRow(row.c_str()) << QString(file) << int(i);
        }
    }
}

// The spec of a Keras initializer config, read the way a Dense layer reads it.
InitializerSpec initializerFromKeras(const Json& serialized) {
    Json model = {{"class_name", "Sequential"},
                  {"config",
                   {{"layers",
                     {{{"class_name", "InputLayer"}, {"config", {{"batch_shape", {nullptr, 1}}}}},
                      {{"class_name", "Dense"},
                       {"config", {{"units", 1}, {"kernel_initializer", serialized}}}}}}}}};
    auto m = modelFromKerasJson(model.dump());
    if (!m.ok()) qFatal("initializer config refused: %s", m.error().c_str());
    return m->layers[1].kernelInitializer;
}

// Canonical TrainDeck name of each Keras initializer class (the fixtures use these).
std::string canonicalOf(const std::string& kerasClass) {
    static const std::map<std::string, std::string> names{
        {"Zeros", "zeros"},
        {"Ones", "ones"},
        {"Constant", "constant"},
        {"RandomNormal", "random_normal"},
        {"RandomUniform", "random_uniform"},
        {"TruncatedNormal", "truncated_normal"},
        {"GlorotUniform", "glorot_uniform"},
        {"GlorotNormal", "glorot_normal"},
        {"HeUniform", "he_uniform"},
        {"HeNormal", "he_normal"},
        {"LecunUniform", "lecun_uniform"},
        {"LecunNormal", "lecun_normal"},
        {"VarianceScaling", "variance_scaling"},
        {"Orthogonal", "orthogonal"},
        {"Identity", "identity"},
        {"he_uniform", "he_uniform"},
        {"zeros", "zeros"},
        {"glorot_uniform", "glorot_uniform"},
    };
    auto it = names.find(kerasClass);
    return it == names.end() ? "?" + kerasClass : it->second;
}

// Every value the Keras config states is the value in the spec.
QString initializerMismatch(const Json& keras, const InitializerSpec& spec) {
    const std::string cls =
        keras.is_string() ? keras.get<std::string>() : keras.at("class_name").get<std::string>();
    if (spec.name != canonicalOf(cls)) return q("name " + spec.name + " for " + cls);
    if (keras.is_string()) return {};
    const Json& cfg = keras.at("config");
    auto number = [&](const char* key, double value) -> QString {
        if (!cfg.contains(key)) return {};
        if (cfg.at(key).get<double>() != value)
            return QString("%1: %2 for %3").arg(key).arg(value).arg(cfg.at(key).get<double>());
        return {};
    };
    QString bad;
    for (auto [key, value] : {std::pair{"value", spec.value},
                              {"minval", spec.minval},
                              {"maxval", spec.maxval},
                              {"mean", spec.mean},
                              {"stddev", spec.stddev},
                              {"scale", spec.scale},
                              {"gain", spec.gain}})
        if (bad.isEmpty()) bad = number(key, value);
    if (!bad.isEmpty()) return bad;
    if (cfg.contains("mode") && cfg.at("mode").get<std::string>() != spec.mode) return "mode";
    if (cfg.contains("distribution") &&
        cfg.at("distribution").get<std::string>() != spec.distribution)
        return "distribution";
    if (cfg.contains("seed")) {
        const bool same = cfg.at("seed").is_null()
                              ? !spec.seed
                              : spec.seed && *spec.seed == cfg.at("seed").get<uint64_t>();
        if (!same) return "seed";
    }
    return {};
}

}  // namespace

class TestKerasFixtures : public QObject {
    Q_OBJECT

  private slots:
    // ---- models -----------------------------------------------------------------------------

    void modelsAsKerasCountsThem_data() { addModelRows("models"); }
    void modelsAsKerasCountsThem() {
        QFETCH(QString, file);
        QFETCH(int, index);
        const Json& fixture = fixtureModel(file, index);
        const std::string name = fixture.at("name").get<std::string>();
        std::vector<std::string> warnings;
        auto parsed = modelFromKerasJson(fixture.at("json").dump(), &warnings);
        QVERIFY2(parsed.ok(), parsed.ok() ? "" : parsed.error().c_str());
        ModelSpec model = *parsed;
        auto info = inferShapes(model);
        QVERIFY2(info.ok(), info.ok() ? "" : info.error().c_str());

        // Keras' model.layers, like TrainDeck's summary, leaves the InputLayer out.
        const Json& layers = fixture.at("layers");
        QCOMPARE(info->layers.size(), layers.size());
        for (size_t i = 0; i < layers.size(); ++i) {
            const Json& k = layers[i];
            const LayerInfo& l = info->layers[i];
            const QString where = QString("layer %1 '%2'").arg(i).arg(q(l.name));
            QVERIFY2(l.name == k.at("name").get<std::string>(), qPrintable(where));
            Shape shape;
            for (const Json& d : k.at("output_shape")) shape.push_back(d.get<int64_t>());
            QVERIFY2(l.outputShape == shape, qPrintable(where + ": " + q(shapeToString(shape))));
            QVERIFY2(l.params == k.at("params").get<int64_t>(), qPrintable(where));
            QVERIFY2(l.trainableParams == k.at("trainable_params").get<int64_t>(),
                     qPrintable(where));
        }
        QCOMPARE(info->totalParams, fixture.at("total_params").get<int64_t>());
        QCOMPARE(info->trainableParams, fixture.at("trainable_params").get<int64_t>());

        // Every Dense initializer carries the values of its Keras config.
        const Json& jsonLayers = fixture.at("json").at("config").at("layers");
        for (size_t i = 0; i < jsonLayers.size(); ++i) {
            const Json& cfg = jsonLayers[i].at("config");
            if (jsonLayers[i].at("class_name") != "Dense") continue;
            for (auto [key, spec] :
                 {std::pair{"kernel_initializer", &model.layers[i].kernelInitializer},
                  {"bias_initializer", &model.layers[i].biasInitializer}}) {
                const QString bad = initializerMismatch(cfg.at(key), *spec);
                QVERIFY2(bad.isEmpty(),
                         qPrintable(QString("layers[%1].%2: ").arg(i).arg(key) + bad));
            }
        }

        // Only the mixed-precision policy is accepted with a warning.
        if (name == "mixed_precision_layer") {
            QCOMPARE(warnings.size(), size_t(1));
            QVERIFY2(q(warnings[0]).startsWith("config.layers[1].config.dtype") &&
                         q(warnings[0]).contains("'mixed_float16' is not applied"),
                     warnings[0].c_str());
        } else {
            QVERIFY2(warnings.empty(), warnings.empty() ? "" : warnings[0].c_str());
        }

        // TrainDeck's Keras 3 form of it reads back as the same model.
        auto back = modelFromKerasJson(modelToKerasJson(*parsed));
        QVERIFY2(back.ok(), back.ok() ? "" : back.error().c_str());
        QVERIFY(*back == *parsed);
    }

    // ---- a CNN's forward pass ------------------------------------------------------------------

    // Every image and normalization layer with Keras' weights and input: TrainDeck's inference
    // output, training-mode output (batch statistics) and moving statistics after that step
    // equal what Keras computed (cnn_forward_keras3.json).
    void cnnForwardAsKeras_data() {
        QTest::addColumn<bool>("training");
        QTest::newRow("inference") << false;
        QTest::newRow("training") << true;
    }
    void cnnForwardAsKeras() {
        QFETCH(bool, training);
        const Json f = keras_fixtures::load("cnn_forward_keras3.json");
        auto parsed = modelFromKerasJson(f.at("json").dump());
        QVERIFY2(parsed.ok(), parsed.ok() ? "" : parsed.error().c_str());
        ModelSpec model = *parsed;
        auto info = inferShapes(model);
        QVERIFY2(info.ok(), info.ok() ? "" : info.error().c_str());
        const int64_t batch = f.at("x").at("shape").at(0).get<int64_t>();
        BuildOptions bo;
        bo.batch = batch;
        bo.mode = training ? GraphMode::Train : GraphMode::Predict;
        bo.loss.name = "mean_squared_error";
        auto g = buildGraph(model, *info, bo);
        QVERIFY2(g.ok(), g.ok() ? "" : g.error().c_str());
        tdtest::Harness h;
        std::string e;
        QVERIFY2(h.compile(*g, {"fusion", "dce"}, &e), e.c_str());
        // Parameters in Keras' model.weights order, with Keras' shapes (kernels [kh,kw,in,out]).
        const std::vector<int> pids = h.g.params();
        const Json& weights = f.at("weights");
        QCOMPARE(pids.size(), weights.size());
        std::vector<size_t> moving;
        for (size_t i = 0; i < pids.size(); ++i) {
            Shape shape;
            for (const Json& d : weights[i].at("shape")) shape.push_back(d.get<int64_t>());
            const Node& p = h.g.node(pids[i]);
            QVERIFY2(p.shape == shape, qPrintable(q(*p.attrs.name + " " + shapeToString(p.shape) +
                                                    " vs " + shapeToString(shape))));
            const auto values = weights[i].at("values").get<std::vector<float>>();
            std::copy(values.begin(), values.end(), h.param(i));
            if (p.attrs.name->find("/moving_") != std::string::npos) moving.push_back(i);
        }
        QCOMPARE(moving.size(), size_t(2));
        const auto x = f.at("x").at("values").get<std::vector<float>>();
        std::copy(x.begin(), x.end(), h.in());
        h.run();
        const auto want = f.at(training ? "training" : "inference").get<std::vector<float>>();
        const float* y = h.output("predictions");
        QCOMPARE(int64_t(want.size()), batch * 5);
        for (size_t i = 0; i < want.size(); ++i)
            QVERIFY2(
                std::fabs(y[i] - want[i]) <= 1e-4f + 1e-4f * std::fabs(want[i]),
                qPrintable(QString("output %1: %2 vs Keras %3").arg(i).arg(y[i]).arg(want[i])));
        const Json& after = f.at("moving_after_training");
        for (size_t k = 0; k < moving.size(); ++k) {
            const auto keras = after.at(k).get<std::vector<float>>();
            const auto initial = weights[moving[k]].at("values").get<std::vector<float>>();
            const float* ours = h.param(moving[k]);
            for (size_t c = 0; c < keras.size(); ++c) {
                // Training moves them as Keras does; inference leaves them alone.
                const float expect = training ? keras[c] : initial[c];
                QVERIFY2(
                    std::fabs(ours[c] - expect) <= 1e-5f + 1e-5f * std::fabs(expect),
                    qPrintable(
                        QString("moving %1[%2]: %3 vs %4").arg(k).arg(c).arg(ours[c]).arg(expect)));
            }
        }
    }

    void refusedNamingTheKey_data() { addModelRows("refused"); }
    void refusedNamingTheKey() {
        QFETCH(QString, file);
        QFETCH(int, index);
        const Json& fixture = fixtureModel(file, index, "refused");
        auto parsed = modelFromKerasJson(fixture.at("json").dump());
        QVERIFY(!parsed.ok());
        const QString want =
            q("Keras model JSON: " + fixture.at("error_path").get<std::string>() + ": ");
        QVERIFY2(q(parsed.error()).startsWith(want), parsed.error().c_str());
    }

    // The reproduction, inside a project: accepted, no warning, Keras' 105 parameters.
    void kerasModelInProject() {
        Json project = Json::parse(
            readText(std::string(td::dev::kSourceDir) + "/projects/synthetic_blobs.json"));
        const Json fixture = keras_fixtures::load("models_keras3.json");
        for (const Json& m : fixture.at("models"))
            if (m.at("name") == "keras_issue_example") project["model"] = m.at("json");
        project["data"]["source"]["shape"] = {20};
        project["data"]["source"]["classes"] = 5;
        auto p = parseProject(project.dump(), "p.json");
        QVERIFY2(p.ok(), p.ok() ? "" : p.error().c_str());
        QVERIFY(p->warnings.empty());
        auto info = inferShapes(p->model);
        QVERIFY(info.ok());
        QCOMPARE(info->totalParams, int64_t(105));
        // A mixed-precision layer: the project keeps the warning for the front ends.
        for (const Json& m : fixture.at("models"))
            if (m.at("name") == "mixed_precision_layer") project["model"] = m.at("json");
        project["data"]["source"]["shape"] = {4};
        project["data"]["source"]["classes"] = 2;
        p = parseProject(project.dump(), "p.json");
        QVERIFY2(p.ok(), p.ok() ? "" : p.error().c_str());
        QCOMPARE(p->warnings.size(), size_t(1));
        QVERIFY2(q(p->warnings[0]).startsWith("model.config.layers[1].config.dtype"),
                 p->warnings[0].c_str());
    }

    // ---- initializers -----------------------------------------------------------------------

    void initializersDrawAsKeras_data() {
        QTest::addColumn<int>("index");
        const Json fixture = keras_fixtures::load("initializers_keras3.json");
        const Json& cases = fixture.at("cases");
        for (size_t i = 0; i < cases.size(); ++i) {
            std::string shape;
            for (const Json& d : cases[i].at("shape"))
                shape += (shape.empty() ? "" : "x") + std::to_string(d.get<int64_t>());
            QTest::newRow((cases[i].at("name").get<std::string>() + " " + shape).c_str()) << int(i);
        }
    }
    void initializersDrawAsKeras() {
        QFETCH(int, index);
        const Json fixture = keras_fixtures::load("initializers_keras3.json");
        const Json& k = fixture.at("cases").at(size_t(index));
        const InitializerSpec spec = initializerFromKeras(k.at("initializer"));
        Shape shape;
        for (const Json& d : k.at("shape")) shape.push_back(d.get<int64_t>());
        std::vector<float> w(static_cast<size_t>(numElements(shape)));
        const Status s = initializeParam(w.data(), shape, spec, 99);
        if (k.contains("error")) {  // Keras refuses this shape: so does TrainDeck
            QVERIFY(!s.ok());
            QVERIFY2(q(s.error()).contains(q(spec.name)) && q(s.error()).contains("[1000]"),
                     s.error().c_str());
            return;
        }
        QVERIFY2(s.ok(), s.ok() ? "" : s.error().c_str());

        const double n = double(w.size());
        double mean = 0, sq = 0, lo = w[0], hi = w[0];
        for (float x : w) {
            mean += x;
            lo = std::min(lo, double(x));
            hi = std::max(hi, double(x));
        }
        mean /= n;
        for (float x : w) sq += (x - mean) * (x - mean);
        const double stddev = std::sqrt(sq / n);
        const double kMean = k.at("mean").get<double>(), kStd = k.at("std").get<double>();
        const double kMin = k.at("min").get<double>(), kMax = k.at("max").get<double>();
        const QString got = QString("mean %1 std %2 min %3 max %4; Keras %5 %6 %7 %8")
                                .arg(mean)
                                .arg(stddev)
                                .arg(lo)
                                .arg(hi)
                                .arg(kMean)
                                .arg(kStd)
                                .arg(kMin)
                                .arg(kMax);

        const std::string& name = spec.name;
        if (name == "zeros" || name == "ones" || name == "constant" || name == "identity") {
            // Deterministic: the same values.
            if (k.contains("values")) {
                const Json& values = k.at("values");
                for (size_t i = 0; i < w.size(); ++i)
                    QCOMPARE(double(w[i]), values[i].get<double>());
            }
            QVERIFY2(std::fabs(mean - kMean) < 1e-6 && std::fabs(stddev - kStd) < 1e-6 &&
                         lo == kMin && hi == kMax,
                     qPrintable(got));
            return;
        }
        if (name == "orthogonal") {
            // Orthonormal rows or columns (whichever are fewer), times the gain.
            const int64_t rows = shape[0], cols = shape[1];
            const bool byColumn = rows >= cols;
            const int64_t count = byColumn ? cols : rows, len = byColumn ? rows : cols;
            auto at = [&](int64_t vec, int64_t i) {
                return double(byColumn ? w[size_t(i * cols + vec)] : w[size_t(vec * cols + i)]);
            };
            for (int64_t a = 0; a < count; ++a)
                for (int64_t b = 0; b <= a; ++b) {
                    double dot = 0;
                    for (int64_t i = 0; i < len; ++i) dot += at(a, i) * at(b, i);
                    const double want = a == b ? spec.gain * spec.gain : 0.0;
                    QVERIFY2(std::fabs(dot - want) < 1e-5,
                             qPrintable(QString("<%1,%2> = %3").arg(a).arg(b).arg(dot)));
                }
        }
        if (n < 1000) return;  // too few values for the statistics below
        // Random: the same distribution. Bounds are ~4 standard errors of each statistic for
        // n = 1000 and 3600; a wrong fan (vector fans, fan_in for fan_avg) or a missed
        // truncation moves the spread by 12% or more.
        const double stdTol = n >= 3000 ? 0.06 : 0.10;
        QVERIFY2(std::fabs(stddev / kStd - 1) < stdTol, qPrintable(got));
        QVERIFY2(std::fabs(mean - kMean) < 6 * kStd / std::sqrt(n), qPrintable(got));
        const bool bounded =
            name.find("uniform") != std::string::npos ||
            name.find("truncated") != std::string::npos || name == "glorot_normal" ||
            name == "he_normal" || name == "lecun_normal" ||
            (name == "variance_scaling" && spec.distribution != "untruncated_normal");
        if (bounded) {
            const double range = kMax - kMin;
            QVERIFY2(std::fabs(lo - kMin) < 0.03 * range && std::fabs(hi - kMax) < 0.03 * range,
                     qPrintable(got));
        }
    }

    // ---- optimizers -------------------------------------------------------------------------

    // Keras' optimizer.get_config() (as serialize() writes it) inside a project reads as the
    // optimizer the test_optim comparison runs.
    void optimizerConfigsRead_data() {
        QTest::addColumn<int>("index");
        const Json fixture = keras_fixtures::load("optimizers_keras3.json");
        const Json& cases = fixture.at("cases");
        for (size_t i = 0; i < cases.size(); ++i)
            QTest::newRow(cases[i].at("name").get<std::string>().c_str()) << int(i);
    }
    void optimizerConfigsRead() {
        QFETCH(int, index);
        const Json fixture = keras_fixtures::load("optimizers_keras3.json");
        const Json& serialized = fixture.at("cases").at(size_t(index)).at("optimizer");
        Json project = Json::parse(
            readText(std::string(td::dev::kSourceDir) + "/projects/synthetic_blobs.json"));
        project["training"]["optimizer"] = serialized;
        auto p = parseProject(project.dump(), "p.json");
        QVERIFY2(p.ok(), p.ok() ? "" : p.error().c_str());
        const OptimizerConfig& got = p->training.optimizer;
        const OptimizerConfig want = keras_fixtures::optimizerConfig(serialized);
        QCOMPARE(q(got.name), q(want.name));
        QCOMPARE(got.learningRate, want.learningRate);
        QCOMPARE(q(got.schedule.type), q(want.schedule.type));
        if (want.schedule.type != "constant") {
            QCOMPARE(got.schedule.decaySteps, want.schedule.decaySteps);
            QCOMPARE(got.schedule.decayRate, want.schedule.decayRate);
            QCOMPARE(got.schedule.staircase, want.schedule.staircase);
            QCOMPARE(got.schedule.alpha, want.schedule.alpha);
            QCOMPARE(got.schedule.warmupSteps, want.schedule.warmupSteps);
            QCOMPARE(got.schedule.warmupTarget, want.schedule.warmupTarget);
        }
        QCOMPARE(got.beta1, want.beta1);
        QCOMPARE(got.beta2, want.beta2);
        QCOMPARE(got.epsilon, want.epsilon);
        QCOMPARE(got.amsgrad, want.amsgrad);
        QCOMPARE(got.weightDecay, want.weightDecay);
        QCOMPARE(got.momentum, want.momentum);
        QCOMPARE(got.nesterov, want.nesterov);
        QCOMPARE(got.rho, want.rho);
        QCOMPARE(got.centered, want.centered);
        QCOMPARE(got.clipnorm, want.clipnorm);
        QCOMPARE(got.globalClipnorm, want.globalClipnorm);
        QCOMPARE(got.clipvalue, want.clipvalue);
    }
};

QTEST_GUILESS_MAIN(TestKerasFixtures)
#include "test_keras_fixtures.moc"

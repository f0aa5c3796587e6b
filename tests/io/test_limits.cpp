// Every size and text a project (or the command line) can set, pushed to an absurd value and run
// through the binary as a user would (`traindeck compile`: project loader, session, compile;
// `traindeck train` for the command-line overrides): each ends in a clear error naming the field,
// exit code 2, no crash (134 is an abort), nothing allocated for it first. The memory budget is
// fixed by TRAINDECK_MEMORY_BUDGET so the results do not depend on the machine, except where a row
// checks the default budget.
#include <QProcess>
#include <QTemporaryDir>
#include <QtTest>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "engine/core/json_text.h"
#include "engine/core/text_limits.h"
#include "engine/io/project.h"
#include "engine/store/run_store.h"
#include "tests/source_dir.h"

using Json = nlohmann::ordered_json;

namespace {

struct Run {
    int code = -1;
    bool crashed = false;
    QString out, err;
};

Run traindeck(const QStringList& args, const QString& budget) {
    QProcess p;
    QProcessEnvironment env = QProcessEnvironment::systemEnvironment();
    env.insert("OMP_NUM_THREADS", "1");
    if (budget.isEmpty())
        env.remove("TRAINDECK_MEMORY_BUDGET");
    else
        env.insert("TRAINDECK_MEMORY_BUDGET", budget);
    p.setProcessEnvironment(env);
    p.start(td::dev::kBinary, args);
    if (!p.waitForFinished(120000)) {
        p.kill();
        p.waitForFinished();
    }
    return {p.exitStatus() == QProcess::NormalExit ? p.exitCode() : -1,
            p.exitStatus() != QProcess::NormalExit, QString::fromUtf8(p.readAllStandardOutput()),
            QString::fromUtf8(p.readAllStandardError())};
}

// A small synthetic project that compiles in well under a second.
Json baseProject() {
    return Json::parse(R"({
      "format": "traindeck-project", "version": 1, "name": "limits",
      "model": {"class_name": "Sequential", "config": {"name": "mlp", "layers": [
        {"class_name": "InputLayer", "config": {"batch_shape": [null, 16]}},
        {"class_name": "Dense", "config": {"units": 8, "activation": "relu"}},
        {"class_name": "Dense", "config": {"units": 4, "activation": "softmax"}}]}},
      "data": {"source": {"type": "synthetic", "samples": 256, "test_samples": 64, "shape": [16],
                          "classes": 4},
               "pipeline": {"map": [], "shuffle_buffer": 256}},
      "training": {"epochs": 1, "batch_size": 32, "optimizer": "adam",
                   "loss": "sparse_categorical_crossentropy", "metrics": ["accuracy"]}
    })");
}

void writeText(const QString& path, const std::string& text) {
    std::ofstream out(path.toStdString(), std::ios::binary);
    out << text;
}

std::string idxU8(const std::vector<uint32_t>& dims, const std::string& payload) {
    std::string s = {0, 0, 8, static_cast<char>(dims.size())};
    for (uint32_t d : dims)
        for (int shift = 24; shift >= 0; shift -= 8) s += static_cast<char>((d >> shift) & 0xff);
    return s + payload;
}

std::string npy(const std::string& descr, const std::string& shape, const std::string& data) {
    std::string header =
        "{'descr': '" + descr + "', 'fortran_order': False, 'shape': " + shape + ", }";
    while ((10 + header.size() + 1) % 64 != 0) header += ' ';
    header += '\n';
    std::string s = "\x93NUMPY\x01";
    s += '\0';
    s += static_cast<char>(header.size() & 0xff);
    s += static_cast<char>((header.size() >> 8) & 0xff);
    return s + header + data;
}

// Data files for the rows that read a file source: 4 samples of 16 features, labels 0..3.
void writeDataFiles(const QTemporaryDir& dir) {
    const auto csv = [](std::vector<std::pair<std::string, int>> rows) {
        std::string text;
        for (int c = 0; c < 16; ++c) text += "f" + std::to_string(c) + ",";
        text += "label\n";
        for (const auto& [second, label] : rows) {
            text += "1," + second;
            for (int c = 2; c < 16; ++c) text += "," + std::to_string(c);
            text += "," + std::to_string(label) + "\n";
        }
        return text;
    };
    writeText(dir.filePath("nan.csv"), csv({{"2", 0}, {"nan", 1}, {"3", 2}, {"4", 3}}));
    writeText(dir.filePath("cls.csv"), csv({{"2", 0}, {"3", 1}, {"4", 7}}));
    writeText(dir.filePath("labels.idx"), idxU8({4}, std::string("\0\1\2\3", 4)));
    writeText(dir.filePath("zero-images.idx"), idxU8({4, 0}, ""));
    writeText(dir.filePath("labels200.idx"), idxU8({4}, std::string("\0\1\310\3", 4)));
    writeText(dir.filePath("images.idx"), idxU8({4, 16}, std::string(64, '\1')));
    std::vector<float> x(64, 1.0f);
    x[2 * 16 + 1] = std::numeric_limits<float>::quiet_NaN();
    writeText(dir.filePath("nan-x.npy"),
              npy("<f4", "(4, 16)", std::string(reinterpret_cast<const char*>(x.data()), 256)));
    const std::vector<int32_t> y{0, 1, 2, 3};
    writeText(dir.filePath("y.npy"),
              npy("<i4", "(4,)", std::string(reinterpret_cast<const char*>(y.data()), 16)));
}

}  // namespace

class TestLimits : public QObject {
    Q_OBJECT
  private slots:
    void absurdValues_data();
    void absurdValues();
    void defaultBudgetRefusesPrefetch();
    void commandLineOverrides_data();
    void commandLineOverrides();
    void oversizedProjectFile();
    void jsonTextLimits();
    void textProblems_data();
    void textProblems();
    void storeRefusesOversizedText();
};

void TestLimits::absurdValues_data() {
    QTest::addColumn<QString>("pointer");  // JSON pointer into baseProject()
    QTest::addColumn<QString>("value");    // JSON text
    QTest::addColumn<int>("code");
    QTest::addColumn<QString>("expected");  // on stderr (empty: success)

    auto row = [](const char* name, const char* pointer, const std::string& value, int code,
                  const QString& expected) {
        QTest::newRow(name) << pointer << QString::fromStdString(value) << code << expected;
    };
    // data.pipeline
    row("prefetch 1e12", "/data/pipeline/prefetch", "1000000000000", 2,
        "data.pipeline.prefetch: needs about");
    row("prefetch -1", "/data/pipeline/prefetch", "-1", 2, "data.pipeline.prefetch: expected");
    row("parallel_calls 1e6", "/data/pipeline/parallel_calls", "1000000", 2,
        "data.pipeline.parallel_calls: 1000000 map workers is more than this machine");
    row("parallel_calls 1e30", "/data/pipeline/parallel_calls", "1e30", 2,
        "data.pipeline.parallel_calls: expected");
    row("one_hot depth 1e10", "/data/pipeline/map", R"([{"op": "one_hot", "depth": 1e10}])", 2,
        "data.pipeline.map[0].depth: expected at most 2147483647");
    row("one_hot depth 2e9", "/data/pipeline/map", R"([{"op": "one_hot", "depth": 2000000000}])", 2,
        "data.pipeline.map[0].depth: needs about");
    row("shuffle_buffer 1e15 (bounded by the data)", "/data/pipeline/shuffle_buffer",
        "1000000000000000", 0, "");
    row("shuffle_buffer 1e300", "/data/pipeline/shuffle_buffer", "1e300", 2,
        "data.pipeline.shuffle_buffer: expected");
    row("scale factor 1e308", "/data/pipeline/map", R"([{"op": "scale", "factor": 1e308}])", 0, "");
    // data.source (synthetic)
    row("samples 1e12", "/data/source/samples", "1000000000000", 2,
        "data.source.samples: expected at most 2147483647");
    row("samples 2e9", "/data/source/samples", "2000000000", 2, "data.source.samples: needs about");
    row("test_samples 1e9", "/data/source/test_samples", "1000000000", 2,
        "data.source.test_samples: needs about");
    row("samples + test_samples beyond 2^31", "/data/source/test_samples", "2147483600", 2,
        "data.source.test_samples: samples + test_samples must be at most 2147483647");
    row("shape overflows", "/data/source/shape", "[100000000, 100000000, 100000000]", 2,
        "data.source.shape[1]: the shape holds more than 2^40 values");
    row("shape 1e8 values", "/data/source/shape", "[100000, 1000]", 2,
        "data.source.samples: needs about");
    row("classes 1e10", "/data/source/classes", "10000000000", 2,
        "data.source.classes: expected at most 2147483647");
    // data.source (files): a NaN and a label beyond the last layer, named by file, row, column.
    row("csv nan", "/data/source", R"({"type": "csv", "train": "@DIR@/nan.csv"})", 2,
        "nan.csv:3: row 2, column 2 'f1': 'nan' is not a finite number");
    row("csv nan dropped", "/data/source",
        R"({"type": "csv", "train": "@DIR@/nan.csv", "non_finite": "drop_rows"})", 0, "");
    row("non_finite unknown", "/data/source",
        R"({"type": "csv", "train": "@DIR@/nan.csv", "non_finite": "ignore"})", 2,
        "data.source.non_finite: expected one of \"error\", \"drop_rows\"");
    row("csv label 7 for 4 units", "/data/source", R"({"type": "csv", "train": "@DIR@/cls.csv"})",
        2,
        "cls.csv (column 'label'): sample 2 has label 7: the data has 8 classes but the last "
        "layer has 4 units (class ids 0..3)");
    row("idx zero dimension", "/data/source",
        R"({"type": "idx", "train_images": "@DIR@/zero-images.idx",
            "train_labels": "@DIR@/labels.idx"})",
        2, "zero-images.idx: header dimension 2 of 2 is 0 (dimensions 4x0)");
    row("idx label 200 for 4 units", "/data/source",
        R"({"type": "idx", "train_images": "@DIR@/images.idx",
            "train_labels": "@DIR@/labels200.idx"})",
        2,
        "labels200.idx: sample 2 has label 200: the data has 201 classes but the last layer "
        "has 4 units (class ids 0..3)");
    row("npy nan", "/data/source",
        R"({"type": "npy", "train_x": "@DIR@/nan-x.npy", "train_y": "@DIR@/y.npy"})", 2,
        "nan-x.npy: sample 2, feature 1 (flat index 33): value nan is not a finite float32");
    row("npy nan dropped", "/data/source",
        R"({"type": "npy", "train_x": "@DIR@/nan-x.npy", "train_y": "@DIR@/y.npy",
            "non_finite": "drop_rows"})",
        0, "");
    // training
    row("batch_size 1e12", "/training/batch_size", "1000000000000", 2,
        "training.batch_size: expected at most 2147483647");
    row("batch_size 1e9", "/training/batch_size", "1000000000", 2,
        "training.batch_size: needs about");
    row("epochs 1e12", "/training/epochs", "1000000000000", 2,
        "training.epochs: expected at most 100000000");
    row("initial_epoch 1e12", "/training/initial_epoch", "1000000000000", 2,
        "training.initial_epoch: expected at most 100000000");
    row("log_every_steps 1e30", "/training/log_every_steps", "1e30", 2,
        "training.log_every_steps: expected a positive integer");
    row("log_every_steps 1e15 (no allocation)", "/training/log_every_steps", "1000000000000000", 0,
        "");
    row("seed 1e30", "/training/seed", "1e30", 2, "training.seed");
    row("decay_steps 1e30", "/training/optimizer",
        R"({"class_name": "Adam", "config": {"learning_rate": {"class_name": "ExponentialDecay",
            "config": {"initial_learning_rate": 0.1, "decay_steps": 1e30, "decay_rate": 0.9}}}})",
        2, "training.optimizer.config.learning_rate.config.decay_steps: expected a positive");
    row("warmup_steps 1e15 (no allocation)", "/training/optimizer",
        R"({"class_name": "Adam", "config": {"learning_rate": {"class_name": "CosineDecay",
            "config": {"initial_learning_rate": 0.1, "decay_steps": 1000000000000000,
                       "warmup_steps": 1000000000000000, "warmup_target": 0.2}}}})",
        0, "");
    row("patience 1e12", "/training/callbacks",
        R"([{"class_name": "EarlyStopping", "config": {"patience": 1000000000000}}])", 2,
        "training.callbacks[0].config.patience: expected at most 1000000");
    row("top_k k in a name", "/training/metrics",
        R"(["sparse_top_99999999999999999999999_categorical_accuracy"])", 2,
        "training.metrics[0]: k in");
    row("top_k k 1e12", "/training/metrics",
        R"([{"class_name": "SparseTopKCategoricalAccuracy", "config": {"k": 1000000000000}}])", 2,
        "training.metrics[0].config.k: expected at most 2147483647");
    row("learning_rate 1e308", "/training/optimizer",
        R"({"class_name": "SGD", "config": {"learning_rate": 1e308}})", 0, "");
    // strategy
    row("replicas 1e9", "/strategy", R"({"type": "mirrored", "replicas": 1000000000})", 2,
        "strategy.replicas: expected at most 4096");
    row("device index 2^32 + 1", "/strategy/devices", R"(["cuda:4294967297"])", 2,
        "strategy.devices[0]: expected a device index of at most 4 digits");
    row("timeout 1e308", "/strategy",
        R"({"type": "multi_worker_mirrored", "timeout_seconds": 1e308})", 2,
        "strategy.timeout_seconds: expected at most 86400");
    // model
    row("Dense 1e9 units", "/model/config/layers/1/config/units", "1000000000", 2,
        "model.config.layers[1]: needs about");
    row("Dense 1e9 units, parameters", "/model/config/layers/1/config/units", "1000000000", 2,
        "for model.config.layers[1] (21000000004 parameters with their gradients and 2 adam "
        "slots each (largest: layer 1 'dense', 17000000000 parameters)");
    row("Dense 1e9 units, activations", "/model/config/layers/1/config/units", "1000000000", 2,
        "for model.config.layers[1] (activations and their gradients for batches of 32 samples, "
        "3.7 GiB per sample (largest: layer 1 'dense', 1000000000 values))");
    row("Dense 1e13 units", "/model/config/layers/1/config/units", "10000000000000", 2,
        "layer 1 'dense': 10000000000000 units on 16 inputs is too large");
    row("input shape 1e7 x 1e7", "/model/config/layers/0/config/batch_shape",
        "[null, 10000000, 10000000]", 2, "input shape [10000000,10000000] is too large");
    row("units 1e30", "/model/config/layers/1/config/units", "1e30", 2,
        "model.config.layers[1].config.units: expected a positive integer");
    // image layers: the blobs as 4x4x1 images; `conv` is layer 2's config
    auto cnn = [](const std::string& layer2) {
        return R"([{"class_name": "InputLayer", "config": {"batch_shape": [null, 16]}},
                   {"class_name": "Reshape", "config": {"target_shape": [4, 4, 1]}}, )" +
               layer2 + R"(, {"class_name": "Flatten", "config": {}},
                   {"class_name": "Dense", "config": {"units": 4, "activation": "softmax"}}])";
    };
    auto conv = [&](const std::string& config) {
        return cnn(R"({"class_name": "Conv2D", "config": )" + config + "}");
    };
    row("Conv2D kernel 1e12", "/model/config/layers",
        conv(R"({"filters": 2, "kernel_size": 1000000000000, "padding": "same"})"), 2,
        "layer 2 'conv2d': kernel_size [1000000000000,1000000000000] is too large (at most "
        "1048576)");
    row("Conv2D filters 1e12", "/model/config/layers",
        conv(R"({"filters": 1000000000000, "kernel_size": 3, "padding": "same"})"), 2,
        "layer 2 'conv2d': the kernel is too large");
    row("Conv2D filters 1e9", "/model/config/layers",
        conv(R"({"filters": 1000000000, "kernel_size": 3, "padding": "same"})"), 2,
        "model.config.layers[2]: needs about");
    row("Conv2D kernel larger than the image", "/model/config/layers",
        conv(R"({"filters": 2, "kernel_size": 5})"), 2,
        "layer 2 'conv2d': kernel 5x5 is larger than the input 4x4 with padding valid");
    row("Conv2D strides 1e30", "/model/config/layers",
        conv(R"({"filters": 2, "kernel_size": 3, "strides": 1e30})"), 2,
        "model.config.layers[2].config.strides: expected a positive integer");
    row("Conv2D groups 0", "/model/config/layers",
        conv(R"({"filters": 2, "kernel_size": 3, "groups": 0})"), 2,
        "model.config.layers[2].config.groups: expected a positive integer");
    row("ZeroPadding2D 1e12", "/model/config/layers",
        cnn(R"({"class_name": "ZeroPadding2D", "config": {"padding": 1000000000000}})"), 2,
        "layer 2 'zero_padding2d': the output is too large");
    row("MaxPooling2D pool 1e30", "/model/config/layers",
        cnn(R"({"class_name": "MaxPooling2D", "config": {"pool_size": 1e30}})"), 2,
        "model.config.layers[2].config.pool_size: expected a positive integer");
    row("BatchNormalization momentum 2", "/model/config/layers",
        cnn(R"({"class_name": "BatchNormalization", "config": {"momentum": 2}})"), 2,
        "model.config.layers[2].config.momentum: expected a number in [0, 1]");
    row("BatchNormalization epsilon -1", "/model/config/layers",
        cnn(R"({"class_name": "BatchNormalization", "config": {"epsilon": -1}})"), 2,
        "model.config.layers[2].config.epsilon: expected a positive number");
    row("small CNN compiles", "/model/config/layers",
        conv(R"({"filters": 2, "kernel_size": 3, "padding": "same", "activation": "relu"})"), 0,
        "");
    // free text
    row("name of 300 characters", "/name", Json(std::string(300, 'n')).dump(), 2,
        "name: is 300 characters long; at most 200 are allowed");
    row("name with NUL", "/name", R"("ab\u0000cd")", 2, "name: contains a NUL character at byte 2");
    row("name with a line break", "/name", R"("two\nlines")", 2, "name: contains a line break");
    row("name of 200 characters", "/name", Json(std::string(200, 'n')).dump(), 0, "");
    row("description of 70 KiB", "/description", Json(std::string(70 << 10, 'd')).dump(), 2,
        "description: is 71680 bytes long; at most 65536 (64 KiB) are allowed");
    row("description with NUL", "/description", R"("a\u0000")", 2,
        "description: contains a NUL character at byte 1");
    row("description of 64 KiB, multi-line", "/description",
        Json(std::string(32 << 10, 'd') + "\n" + std::string((32 << 10) - 1, 'e')).dump(), 0, "");
    row("version 1e30", "/version", "1e30", 2, "version: expected a positive integer");
}

void TestLimits::absurdValues() {
    QFETCH(QString, pointer);
    QFETCH(QString, value);
    QFETCH(int, code);
    QFETCH(QString, expected);
    QTemporaryDir dir;
    writeDataFiles(dir);
    Json project = baseProject();
    project[Json::json_pointer(pointer.toStdString())] =
        Json::parse(value.replace("@DIR@", dir.path()).toStdString());
    const QString path = dir.filePath("p.json");
    writeText(path, project.dump());

    Run r = traindeck({"compile", path}, "2G");
    QVERIFY2(!r.crashed, qPrintable(r.err));
    QVERIFY2(!r.err.contains("internal error"), qPrintable(r.err));
    QVERIFY2(r.code == code, qPrintable(QString("exit %1: %2").arg(r.code).arg(r.err.left(2000))));
    if (code != 0) {
        QVERIFY2(r.err.contains(expected), qPrintable(r.err.left(2000)));
        QVERIFY2(r.err.contains("p.json"), qPrintable(r.err.left(2000)));
        // A refusal for memory gives the estimate and the budget.
        if (expected.endsWith("needs about"))
            QVERIFY2(r.err.contains("over the budget of 2.0 GiB (TRAINDECK_MEMORY_BUDGET=2G"),
                     qPrintable(r.err));
    }
}

void TestLimits::defaultBudgetRefusesPrefetch() {
    // Without an override the budget is this machine's memory; 1e12 batches exceed any.
    QTemporaryDir dir;
    Json project = baseProject();
    project["data"]["pipeline"]["prefetch"] = int64_t{1000000000000};
    const QString path = dir.filePath("p.json");
    writeText(path, project.dump());
    Run r = traindeck({"compile", path}, QString());
    QVERIFY2(!r.crashed, qPrintable(r.err));
    QCOMPARE(r.code, 2);
    QVERIFY2(r.err.contains("data.pipeline.prefetch: needs about"), qPrintable(r.err));
    QVERIFY2(r.err.contains("(physical memory;") || r.err.contains("(cgroup memory.max;"),
             qPrintable(r.err));
}

void TestLimits::commandLineOverrides_data() {
    QTest::addColumn<QStringList>("args");
    QTest::addColumn<QString>("expected");
    QTest::newRow("--batch-size 1e9")
        << QStringList{"--batch-size", "1000000000"} << "training.batch_size: needs about";
    QTest::newRow("--run-name of 300 characters")
        << QStringList{"--run-name", QString(300, 'r')}
        << "--run-name: is 300 characters long; at most 200 are allowed";
}

void TestLimits::commandLineOverrides() {
    QFETCH(QStringList, args);
    QFETCH(QString, expected);
    QTemporaryDir dir;
    const QString path = dir.filePath("p.json");
    writeText(path, baseProject().dump());
    Run r = traindeck(QStringList{"train", path, "--plain", "--db", dir.filePath("runs.db")} + args,
                      "2G");
    QVERIFY2(!r.crashed, qPrintable(r.err));
    QCOMPARE(r.code, 2);
    QVERIFY2(r.err.contains(expected), qPrintable(r.err));
    QVERIFY2(!QFile::exists(dir.filePath("runs.db")), "the store was created for a refused run");
}

void TestLimits::oversizedProjectFile() {
    QTemporaryDir dir;
    Json project = baseProject();
    project["description"] = std::string(20 << 20, 'd');
    const QString path = dir.filePath("big.json");
    writeText(path, project.dump());
    Run r = traindeck({"compile", path}, "2G");
    QCOMPARE(r.code, 2);
    QVERIFY2(
        r.err.contains("big.json: 20.0 MiB is too large for a project file (at most 16.0 MiB)"),
        qPrintable(r.err));
}

// JSON nested deeper than kMaxJsonDepth, or a number beyond a double, is found before parsing,
// with the field path of the value; brackets and quotes inside strings do not count.
void TestLimits::jsonTextLimits() {
    const auto nested = [](int depth) {
        return std::string(static_cast<size_t>(depth), '[') +
               std::string(static_cast<size_t>(depth), ']');
    };
    QVERIFY(!td::jsonTextProblem(nested(td::kMaxJsonDepth)));
    const td::JsonTextProblem deep = td::jsonTextProblem(nested(td::kMaxJsonDepth + 1));
    QVERIFY(deep);
    QCOMPARE(deep.offset, size_t(td::kMaxJsonDepth));
    QVERIFY2(deep.message.find("nested deeper than 256 levels") != std::string::npos,
             deep.message.c_str());
    QCOMPARE(deep.path.substr(0, 9), std::string("[0][0][0]"));
    QVERIFY(!td::jsonTextProblem(R"({"s": "[[[[\"{{", "t": [1, 2.5e300, -3]})", 3));

    const td::JsonTextProblem big = td::jsonTextProblem(R"({"a": {"b": [1, 2, {"c": 1e999}]}})");
    QVERIFY(big);
    QCOMPARE(big.path, std::string("a.b[2].c"));
    QVERIFY2(big.message.find("the number 1e999 is out of range (at line 1, column 26)") !=
                 std::string::npos,
             big.message.c_str());
    QCOMPARE(td::describeJsonTextProblem(big).substr(0, 10), std::string("a.b[2].c: "));
    QVERIFY(td::jsonTextProblem("[-1e999]"));

    nlohmann::json p = baseProject();
    p["training"]["optimizer"] = {{"class_name", "Adam"}, {"config", {{"learning_rate", "LR"}}}};
    std::string text = p.dump();
    text.replace(text.find("\"LR\""), 4, "1e999");
    auto parsed = td::parseProject(text, "p.json");
    QVERIFY(!parsed.ok());
    QVERIFY2(parsed.error().rfind("p.json: training.optimizer.config.learning_rate: the number "
                                  "1e999 is out of range",
                                  0) == 0,
             parsed.error().c_str());
    p["description"] = "x";
    text = p.dump();
    text.replace(text.find("\"x\""), 3, nested(100000));
    parsed = td::parseProject(text, "p.json");
    QVERIFY(!parsed.ok());
    QVERIFY2(parsed.error().rfind("p.json: description[0][0]", 0) == 0, parsed.error().c_str());
}

void TestLimits::textProblems_data() {
    QTest::addColumn<QByteArray>("text");
    QTest::addColumn<bool>("longText");
    QTest::addColumn<QString>("expected");  // empty: accepted
    QTest::newRow("plain") << QByteArray("run 1") << false << "";
    QTest::newRow("accents and emoji") << QByteArray("caf\xc3\xa9 \xf0\x9f\x9a\x80") << false << "";
    QTest::newRow("200 two-byte characters") << QByteArray("\xc3\xa9").repeated(200) << false << "";
    QTest::newRow("201 two-byte characters")
        << QByteArray("\xc3\xa9").repeated(201) << false << "is 201 characters long";
    QTest::newRow("Latin-1 byte") << QByteArray("caf\xe9") << false
                                  << "is not valid UTF-8 (byte 3)";
    QTest::newRow("truncated sequence")
        << QByteArray("ab\xe2\x82") << true << "is not valid UTF-8 (byte 2)";
    QTest::newRow("overlong slash")
        << QByteArray("\xc0\xaf") << true << "is not valid UTF-8 (byte 0)";
    QTest::newRow("surrogate") << QByteArray("\xed\xa0\x80") << true
                               << "is not valid UTF-8 (byte 0)";
    QTest::newRow("beyond U+10FFFF")
        << QByteArray("\xf4\x90\x80\x80") << true << "is not valid UTF-8 (byte 0)";
    QTest::newRow("NUL") << QByteArray("a\0b", 3) << true << "contains a NUL character at byte 1";
    QTest::newRow("line break in a name") << QByteArray("a\r\nb") << false << "line break";
    QTest::newRow("line break in notes") << QByteArray("a\r\nb") << true << "";
    QTest::newRow("64 KiB + 1 of notes")
        << QByteArray((64 << 10) + 1, 'x') << true << "is 65537 bytes long";
}

void TestLimits::textProblems() {
    QFETCH(QByteArray, text);
    QFETCH(bool, longText);
    QFETCH(QString, expected);
    const std::string problem =
        td::textProblem(std::string_view(text.constData(), static_cast<size_t>(text.size())),
                        longText ? td::TextKind::LongText : td::TextKind::Name);
    if (expected.isEmpty())
        QCOMPARE(QString::fromStdString(problem), QString());
    else
        QVERIFY2(QString::fromStdString(problem).contains(expected), problem.c_str());
}

// Renaming a run and its notes go through the same limits as the project's text.
void TestLimits::storeRefusesOversizedText() {
    QTemporaryDir dir;
    auto store = td::RunStore::open(dir.filePath("runs.db").toStdString());
    QVERIFY2(store.ok(), store.ok() ? "" : store.error().c_str());
    td::RunRecord run;
    run.name = "run";
    run.projectJson = "{}";
    run.configJson = "{}";
    auto id = (*store)->createRun(run);
    QVERIFY(id.ok());
    td::Status s = (*store)->renameRun(*id, std::string(300, 'r'));
    QVERIFY(!s.ok());
    QVERIFY2(QString::fromStdString(s.error()).startsWith("run name: is 300 characters long"),
             s.error().c_str());
    s = (*store)->setNotes(*id, std::string("a\0b", 3));
    QVERIFY(!s.ok());
    QVERIFY2(QString::fromStdString(s.error()).startsWith("notes: contains a NUL character"),
             s.error().c_str());
    s = (*store)->setNotes(*id, std::string(100 << 20, 'n'));
    QVERIFY(!s.ok());
    QVERIFY2(QString::fromStdString(s.error()).contains("at most 65536"), s.error().c_str());
    QCOMPARE(QString::fromStdString((*store)->getRun(*id)->name), QString("run"));
    run.name = std::string(100 << 20, 'n');
    QVERIFY(!(*store)->createRun(run).ok());
    QVERIFY((*store)->setNotes(*id, "fine").ok());
}

QTEST_GUILESS_MAIN(TestLimits)
#include "test_limits.moc"

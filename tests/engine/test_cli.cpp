// The headless CLI as a user runs it: exit codes, messages on stderr, JSON output.
#include <QJsonArray>
#include <QJsonDocument>
#include <QJsonObject>
#include <QRegularExpression>
#include <QtTest>
#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>

#include "engine/api/runs.h"
#include "engine/graph/passes.h"
#include "engine/store/run_store.h"
#include "engine/train/checkpoint.h"
#include "tests/engine/cli_process.h"
#include "tests/source_dir.h"

namespace {

using td::test::project;
using td::test::Run;
using td::test::traindeck;

// The status of each run in a store, as `traindeck runs --json` lists them.
QStringList storedStatuses(const QString& db) {
    Run list = traindeck({"runs", "--db", db, "--json"});
    QStringList out;
    for (const auto& run : QJsonDocument::fromJson(list.out.toUtf8()).array())
        out << run.toObject().value("status").toString();
    return out;
}

}  // namespace

class TestCli : public QObject {
    Q_OBJECT
  private slots:
    void cleanupTestCase() {
        for (const char* suffix : {"", "-wal", "-shm"})
            QFile::remove(QDir::temp().filePath(QString("traindeck-cli-test-%1.db%2")
                                                    .arg(QCoreApplication::applicationPid())
                                                    .arg(suffix)));
    }
    void summaryPrintsKerasTable();
    void kerasWarningsOnStderr();
    void devicesListsCpu();
    void devicesPlainFormat();
    void compileDumpsAfterPass();
    void trainStoresRunAndListsIt();
    void badInput_data();
    void badInput();
    void trainWithBadStore_data();
    void trainWithBadStore();
    void profileTimesEveryInstruction();
    void diskFillsDuringRun();
    void killedRunResumes();
    void resumeAndDeleteErrors();
    void headlessLoadsNoGuiLibrary();
    void kerasFilesNeedTheH5Module();
    void desktopAppLoadsAsModule();
    void desktopAppModuleErrors();
};

void TestCli::summaryPrintsKerasTable() {
    Run r = traindeck({"summary", project("fashion_mnist_mlp.json")});
    QCOMPARE(r.code, 0);
    QVERIFY(r.out.contains("Total params: 101,770"));
    QVERIFY(r.out.contains("(None, 128)"));
}

// A model Keras wrote with a mixed-precision layer: accepted, and the CLI says what it ignores.
void TestCli::kerasWarningsOnStderr() {
    QFile base(project("synthetic_blobs.json"));
    QVERIFY(base.open(QIODevice::ReadOnly));
    QJsonObject p = QJsonDocument::fromJson(base.readAll()).object();
    QFile fixtures(QString(td::dev::kSourceDir) + "/tests/fixtures/keras/models_keras3.json");
    QVERIFY(fixtures.open(QIODevice::ReadOnly));
    for (const QJsonValue m : QJsonDocument::fromJson(fixtures.readAll())["models"].toArray())
        if (m["name"] == "mixed_precision_layer") p["model"] = m["json"];
    QJsonObject data = p["data"].toObject(), source = data["source"].toObject();
    source["shape"] = QJsonArray{4};
    source["classes"] = 2;
    data["source"] = source;
    p["data"] = data;
    QTemporaryDir dir;
    const QString path = dir.filePath("mixed.json");
    QFile out(path);
    QVERIFY(out.open(QIODevice::WriteOnly));
    out.write(QJsonDocument(p).toJson());
    out.close();
    Run r = traindeck({"summary", path});
    QCOMPARE(r.code, 0);
    QVERIFY(r.out.contains("Total params: 23"));
    QVERIFY2(r.err.contains("traindeck: warning: " + path +
                            ": model.config.layers[1].config.dtype.config.name: dtype "
                            "'mixed_float16' is not applied per layer"),
             qPrintable(r.err));
}

void TestCli::devicesListsCpu() {
    Run r = traindeck({"devices", "--json"});
    QCOMPARE(r.code, 0);
    auto doc = QJsonDocument::fromJson(r.out.toUtf8());
    QVERIFY(doc.isArray());
    QCOMPARE(doc.array().at(0).toObject().value("id").toString(), QString("cpu:0"));
}

// `traindeck devices`: one line per device (id, kind, memory, name; GPUs add compute capability,
// free memory, driver and runtime versions), then the strategies; exit 0 on every machine. A
// machine without an NVIDIA driver lists no cuda: device, without an error; with one, as many as
// nvidia-smi when TRAINDECK_EXPECT_GPUS says how many (tests/gpu/check.sh compares the two).
void TestCli::devicesPlainFormat() {
    Run r = traindeck({"devices"});
    QCOMPARE(r.code, 0);
    QVERIFY2(r.err.isEmpty(), qPrintable(r.err));
    const QStringList lines = r.out.split('\n', Qt::SkipEmptyParts);
    QVERIFY(!lines.isEmpty());
    static const QRegularExpression cpu(R"(^cpu:0\s+cpu\s+[0-9]+\.[0-9] GiB  \S.*$)");
    QVERIFY2(cpu.match(lines.first()).hasMatch(), qPrintable(lines.first()));
    static const QRegularExpression gpu(
        R"(^cuda:[0-9]+\s+cuda\s+[0-9]+\.[0-9] GiB  .+, compute [0-9]+\.[0-9]+, [0-9]+\.[0-9] GiB )"
        R"(free, driver CUDA [0-9]+\.[0-9]+, runtime CUDA [0-9]+\.[0-9]+$)");
    int gpus = 0;
    for (const QString& line : lines) {
        if (!line.startsWith("cuda:")) continue;
        ++gpus;
        QVERIFY2(gpu.match(line).hasMatch(), qPrintable(line));
    }
    if (!std::filesystem::exists("/dev/nvidiactl")) QCOMPARE(gpus, 0);
    if (qEnvironmentVariableIsSet("TRAINDECK_EXPECT_GPUS"))
        QCOMPARE(gpus, qEnvironmentVariableIntValue("TRAINDECK_EXPECT_GPUS"));
    QVERIFY2(lines.last().startsWith("strategy "), qPrintable(lines.last()));
    // JSON: the GPU fields only on GPUs.
    Run j = traindeck({"devices", "--json"});
    QCOMPARE(j.code, 0);
    const QJsonArray arr = QJsonDocument::fromJson(j.out.toUtf8()).array();
    QCOMPARE(arr.size(), 1 + gpus);
    QVERIFY(!arr.at(0).toObject().contains("compute_capability"));
    for (int i = 1; i < arr.size(); ++i)
        for (const char* key :
             {"compute_capability", "memory_free_bytes", "driver_version", "runtime_version"})
            QVERIFY2(arr.at(i).toObject().contains(key), key);
}

void TestCli::compileDumpsAfterPass() {
    Run fused = traindeck({"compile", project("synthetic_blobs.json"), "--dump-after=fusion"});
    QCOMPARE(fused.code, 0);
    QVERIFY2(fused.out.contains("= dense("), qPrintable(fused.out));
    QVERIFY(fused.out.contains("# fusion: fused"));
    Run built = traindeck({"compile", project("synthetic_blobs.json"), "--dump-after=autodiff"});
    QCOMPARE(built.code, 0);
    QVERIFY(!built.out.contains("= dense("));
    QVERIFY(built.out.contains("loss_grad"));
    Run mem = traindeck({"compile", project("synthetic_blobs.json"), "--dump-after=memory"});
    QVERIFY(mem.out.contains("buf=arena"));
    Run bad = traindeck({"compile", project("synthetic_blobs.json"), "--dump-after=frobnicate"});
    QCOMPARE(bad.code, 2);
    QVERIFY(bad.err.contains("unknown pass 'frobnicate'"));
    QVERIFY(bad.err.contains("lowered"));
    // The lowered step: one device has no all-reduce; two replicas sum every gradient bucket
    // before the one update instruction.
    Run one = traindeck({"compile", project("synthetic_blobs.json"), "--dump-after=lowered"});
    QCOMPARE(one.code, 0);
    QVERIFY2(one.out.contains("# replica 0 of 1, 64 of 64 samples"), qPrintable(one.out));
    QVERIFY(!one.out.contains("all_reduce"));
    QVERIFY(one.out.contains("accumulate acc[0]"));
    QVERIFY(one.out.contains("update sgd"));
    QTemporaryDir dir;
    QFile in(project("synthetic_blobs.json"));
    QVERIFY(in.open(QIODevice::ReadOnly));
    QString text = QString::fromUtf8(in.readAll());
    text.replace(QString(R"("strategy": {"type": "one_device"})"),
                 QString(R"("strategy": {"type": "mirrored", "replicas": 2})"));
    const QString mirrored = dir.filePath("mirrored.json");
    QFile out(mirrored);
    QVERIFY(out.open(QIODevice::WriteOnly));
    out.write(text.toUtf8());
    out.close();
    Run two = traindeck({"compile", mirrored, "--dump-after=lowered"});
    QCOMPARE(two.code, 0);
    QVERIFY2(two.out.contains("# replica 0 of 2, 32 of 64 samples"), qPrintable(two.out));
    const qsizetype start = two.out.indexOf("all_reduce_start bucket 0");
    const qsizetype wait = two.out.indexOf("all_reduce_wait bucket 0");
    const qsizetype update = two.out.indexOf("update sgd");
    QVERIFY(start > 0 && wait > start && update > wait);

    // The fusion report: fewer kernels and bytes with fusion, groups and refusals named.
    Run report = traindeck({"compile", project("fashion_mnist_mlp.json"), "--report"});
    QCOMPARE(report.code, 0);
    QVERIFY2(report.out.contains("kernels per step"), qPrintable(report.out));
    QVERIFY(report.out.contains("fuse_act_bias_grad: act_grad(relu)"));
    QVERIFY(report.out.contains("fuse_elementwise: dropout_grad"));
    QVERIFY(report.out.contains("kept apart"));
    // Each group led by the model's layer names, the IR's node ids below.
    for (const char* line :
         {"  dense: matmul + bias_add + act(relu) -> dense (fusion)\n",
          "  dense: act_grad(relu) + bias_grad -> one pass (fuse_act_bias_grad)\n",
          "  dropout, dense: dropout_grad + act_grad(relu) -> one pass (fuse_elementwise)\n",
          "  dense_1, the loss: the output activation + sparse_categorical_crossentropy",
          "  dense, dropout: dropout after dense stays apart"})
        QVERIFY2(report.out.contains(line), qPrintable(line + ("\nnot in\n" + report.out)));
    QVERIFY(report.out.indexOf("  dense: matmul + bias_add") <
            report.out.indexOf("  fusion: matmul %"));
    const QRegularExpression kernels(R"(kernels per step\s+(\d+)\s+(\d+))");
    const auto m = kernels.match(report.out);
    QVERIFY(m.hasMatch());
    QVERIFY(m.captured(2).toInt() < m.captured(1).toInt());
    // It leads with what fusion saves: the kernels' difference of the table below.
    const int saved = m.captured(1).toInt() - m.captured(2).toInt();
    QVERIFY2(
        report.out.section('\n', 1, 1)
            .startsWith(QString("fusion saves %1 of %2 kernels").arg(saved).arg(m.captured(1))),
        qPrintable(report.out));
    // The CPU device's own passes over the step: each by name, with the places it applied, or
    // off.
    QVERIFY2(report.out.contains("cpu:0 passes (one device, the step on"), qPrintable(report.out));
    for (const std::string& name : td::cpuPassNames())
        QVERIFY2(report.out.contains(QString::fromStdString(name)), name.c_str());
    QVERIFY2(QRegularExpression(R"(cpu_narrow_kernel\s+\d+\s)").match(report.out).hasMatch(),
             qPrintable(report.out));
    Run off = traindeck({"compile", project("fashion_mnist_mlp.json"), "--report", "--disable-pass",
                         "cpu_narrow_kernel"});
    QCOMPARE(off.code, 0);
    QVERIFY2(QRegularExpression(R"(cpu_narrow_kernel\s+off\s)").match(off.out).hasMatch(),
             qPrintable(off.out));
    QVERIFY2(off.out.contains("passes off: cpu_narrow_kernel"), qPrintable(off.out));
}

void TestCli::trainStoresRunAndListsIt() {
    QTemporaryDir dir;
    const QString db = dir.filePath("runs.db");
    Run r = traindeck({"train", project("synthetic_blobs.json"), "--epochs", "2", "--db", db,
                       "--run-name", "cli-run", "--plain"});
    QCOMPARE(r.code, 0);
    QVERIFY2(r.out.contains("Epoch 2/2"), qPrintable(r.out));
    QVERIFY(r.out.contains("Run completed"));
    QVERIFY(r.out.contains("test_accuracy"));
    Run list = traindeck({"runs", "--db", db, "--json"});
    QCOMPARE(list.code, 0);
    auto arr = QJsonDocument::fromJson(list.out.toUtf8()).array();
    QCOMPARE(arr.size(), 1);
    QCOMPARE(arr.at(0).toObject().value("name").toString(), QString("cli-run"));
    QCOMPARE(arr.at(0).toObject().value("status").toString(), QString("completed"));
    Run show = traindeck({"show", "cli-run", "--db", db, "--json"});
    QCOMPARE(show.code, 0);
    auto obj = QJsonDocument::fromJson(show.out.toUtf8()).object();
    QCOMPARE(obj.value("epochs").toArray().size(), 2);
    Run table = traindeck({"runs", "--db", db});
    QVERIFY(table.out.contains("cli-run"));
    // How the input pipeline ran each epoch speaks to those who tune the engine: stored with the
    // run, printed with --verbose only.
    QVERIFY2(!r.out.contains("input pipeline:"), qPrintable(r.out));
    {
        auto store = td::RunStore::open(db.toStdString());
        QVERIFY(store.ok());
        auto logs = (*store)->logs(1);
        QVERIFY(logs.ok());
        QVERIFY(std::any_of(logs->begin(), logs->end(), [](const td::LogRow& l) {
            return l.text.rfind("epoch 2: input pipeline:", 0) == 0;
        }));
    }
    Run verbose = traindeck({"train", project("synthetic_blobs.json"), "--epochs", "1", "--db", db,
                             "--plain", "--verbose"});
    QCOMPARE(verbose.code, 0);
    QVERIFY2(verbose.out.contains("epoch 1: input pipeline:"), qPrintable(verbose.out));
}

void TestCli::badInput_data() {
    QTest::addColumn<QStringList>("args");
    QTest::addColumn<QString>("expected");
    QTest::newRow("missing project")
        << QStringList{"train", "/nonexistent/p.json"} << "/nonexistent/p.json";
    QTest::newRow("not json") << QStringList{"summary", QString(td::dev::kSourceDir) + "/README.md"}
                              << "README.md";
    // A store of this process's own: builds that run their suites at once must not share one.
    const QString db = QDir::temp().filePath(
        QString("traindeck-cli-test-%1.db").arg(QCoreApplication::applicationPid()));
    QTest::newRow("unknown run") << QStringList{"show", "no-such-run", "--db", db} << "no-such-run";
    // A mistyped store is not made into a new empty one by a command that only reads.
    QTest::newRow("no store") << QStringList{"runs", "--db", db + ".typo"} << "no run store at";
    QTest::newRow("no store to show")
        << QStringList{"show", "1", "--db", db + ".typo"} << ".typo (a store is created by";
    QTest::newRow("bad flag") << QStringList{"train", project("synthetic_blobs.json"), "--epochs",
                                             "-3"}
                              << "epochs";
    QTest::newRow("corrupt db") << QStringList{"runs", "--db", project("synthetic_blobs.json")}
                                << "synthetic_blobs.json";
    QTest::newRow("unknown pass") << QStringList{"train",          project("synthetic_blobs.json"),
                                                 "--disable-pass", "fuse_all",
                                                 "--db",           db}
                                  << "disabled_passes[0]: unknown pass 'fuse_all'";
    QTest::newRow("unknown cpu pass") << QStringList{"compile", project("synthetic_blobs.json"),
                                                     "--report", "--disable-pass", "cpu_everything"}
                                      << "unknown pass 'cpu_everything'";
    QTest::newRow("memory pass") << QStringList{"compile", project("synthetic_blobs.json"),
                                                "--report", "--disable-pass", "memory"}
                                 << "pass 'memory' cannot be turned off";
}

void TestCli::badInput() {
    QFETCH(QStringList, args);
    QFETCH(QString, expected);
    Run r = traindeck(args);
    QVERIFY2(r.code > 0, qPrintable(QString::number(r.code)));  // an error exit, not a crash
    QVERIFY2(r.err.contains(expected), qPrintable(r.err));
}

// A store that cannot be opened or written ends `train` at once with an error naming the store
// and the problem (it used to wait forever with no output).
void TestCli::trainWithBadStore_data() {
    QTest::addColumn<QString>("kind");
    QTest::addColumn<QString>("expected");
    QTest::newRow("not a database") << "garbage"
                                    << "file is not a database";
    QTest::newRow("a directory") << "directory"
                                 << "is a directory";
    QTest::newRow("parent is a file") << "under-file"
                                      << "cannot create directory";
    QTest::newRow("full") << "full"
                          << "database or disk is full";
}

// TRAINDECK_PROFILE=1: each program prints one line per instruction with its mean time, and
// the instructions' shares add up to the whole; without it nothing is printed.
void TestCli::profileTimesEveryInstruction() {
    QTemporaryDir dir;
    const QString db = dir.filePath("r.db");
    const QStringList args{"train", project("synthetic_blobs.json"), "--db", db, "--plain"};
    Run plain = traindeck(args, {}, {}, 120000);
    QCOMPARE(plain.code, 0);
    QVERIFY2(!plain.err.contains("profile:"), qPrintable(plain.err));
    Run r = traindeck(args, {}, {"TRAINDECK_PROFILE=1"}, 120000);
    QVERIFY2(r.code == 0, qPrintable(r.err));
    // The first program ended: "profile: N instructions, R runs, T us per run", then N lines.
    const QStringList lines = r.err.split('\n');
    int header = -1;
    for (int k = 0; k < lines.size() && header < 0; ++k)
        if (lines[k].startsWith("profile: ")) header = k;
    QVERIFY2(header >= 0, qPrintable(r.err));
    const QRegularExpression head(
        R"(^profile: (\d+) instructions, (\d+) runs, ([0-9.]+) us per run)");
    const auto hm = head.match(lines[header]);
    QVERIFY2(hm.hasMatch(), qPrintable(lines[header]));
    const int n = hm.captured(1).toInt();
    QVERIFY(n >= 5);
    QVERIFY(hm.captured(2).toInt() >= 10);
    const QRegularExpression row(R"(^\s+(\d+)\s+(\S+) .*\s([0-9.]+) us\s+([0-9.]+)%$)");
    double share = 0;
    bool sawProduct = false;
    for (int k = 0; k < n; ++k) {
        const auto m = row.match(lines[header + 1 + k]);
        QVERIFY2(m.hasMatch(), qPrintable(lines[header + 1 + k]));
        QCOMPARE(m.captured(1).toInt(), k);
        share += m.captured(4).toDouble();
        if (m.captured(2) == "dense" || m.captured(2) == "matmul") sawProduct = true;
    }
    QVERIFY(sawProduct);
    QVERIFY2(std::abs(share - 100.0) < 1.0, qPrintable(QString::number(share)));
    // The training program (softmax with sparse cross-entropy): no softmax of the predictions
    // is left (nothing in training reads them).
    QVERIFY2(!r.err.contains(QRegularExpression(R"(\n\s+\d+\s+act %)")), qPrintable(r.err));
}

void TestCli::trainWithBadStore() {
    QFETCH(QString, kind);
    QFETCH(QString, expected);
    QTemporaryDir dir;
    QString db = dir.filePath("r.db");
    QStringList env;
    if (kind == "garbage") {
        QFile f(db);
        QVERIFY(f.open(QIODevice::WriteOnly));
        QByteArray noise(65536, '\0');
        for (int i = 0; i < noise.size(); ++i) noise[i] = char((i * 2654435761u) >> 13);
        f.write(noise);
    } else if (kind == "directory") {
        QVERIFY(QDir().mkpath(db));
    } else if (kind == "under-file") {
        QFile f(dir.filePath("plain"));
        QVERIFY(f.open(QIODevice::WriteOnly));
        f.write("x");
        db = dir.filePath("plain/r.db");
    } else {
        // A store (made by a first run) with no room for the next run.
        QCOMPARE(traindeck({"train", project("synthetic_blobs.json"), "--epochs", "1", "--db", db,
                            "--plain"})
                     .code,
                 0);
        env << "TRAINDECK_FAULT_STORE_PAGES=0";
    }
    Run r = traindeck({"train", project("synthetic_blobs.json"), "--db", db, "--plain"}, {}, env,
                      60000);
    QVERIFY2(r.code > 0, qPrintable(QString::number(r.code) + " " + r.err));
    QVERIFY2(r.err.contains(db), qPrintable(r.err));
    QVERIFY2(r.err.contains(expected), qPrintable(r.err));
    QVERIFY2(!r.out.contains("Stored in"), qPrintable(r.out));
}

// The disk fills part-way through a run: a non-zero exit naming the store and the problem, no
// "Stored in", and afterwards the store still lists the run (as failed) and trains again.
void TestCli::diskFillsDuringRun() {
    QTemporaryDir dir;
    const QString db = dir.filePath("r.db");
    Run r = traindeck({"train", project("synthetic_blobs.json"), "--db", db, "--plain", "--epochs",
                       "40", "--batch-size", "16", "--run-name", "filled"},
                      {}, {"TRAINDECK_FAULT_STORE_PAGES=12"}, 120000);
    QVERIFY2(r.code == 1, qPrintable(QString::number(r.code) + " " + r.err));
    QVERIFY2(r.err.contains(db), qPrintable(r.err));
    QVERIFY2(r.err.contains("database or disk is full"), qPrintable(r.err));
    QVERIFY2(!r.out.contains("Stored in"), qPrintable(r.out));
    QVERIFY2(!r.out.contains("Epoch 40/40"), qPrintable(r.out));  // it stopped early

    Run list = traindeck({"runs", "--db", db, "--json"});
    QCOMPARE(list.code, 0);
    auto arr = QJsonDocument::fromJson(list.out.toUtf8()).array();
    QCOMPARE(arr.size(), 1);
    QCOMPARE(arr.at(0).toObject().value("status").toString(), QString("failed"));
    QVERIFY(arr.at(0).toObject().value("message").toString().contains("database or disk is full"));
    Run show = traindeck({"show", "filled", "--db", db, "--json"});
    QCOMPARE(show.code, 0);
    Run again = traindeck(
        {"train", project("synthetic_blobs.json"), "--db", db, "--plain", "--epochs", "1"}, {}, {},
        60000);
    QCOMPARE(again.code, 0);
    QVERIFY(again.out.contains("Stored in"));
}

QTEST_GUILESS_MAIN(TestCli)
// Per logged step: loss, accuracy and learning rate as stored.
static std::map<int64_t, td::MetricMap> storedSteps(const QString& db, int64_t runId) {
    auto store = td::RunStore::open(db.toStdString());
    std::map<int64_t, td::MetricMap> out;
    if (!store.ok()) return out;
    auto rows = (*store)->steps(runId);
    if (!rows.ok()) return out;
    for (const td::StepRow& r : *rows)
        for (const char* k : {"loss", "accuracy", "lr"}) out[r.globalStep][k] = r.metrics.at(k);
    return out;
}

// A real kill -9 of the binary mid-run (after it registered a checkpoint), then train --resume:
// the run finishes in the same stored run, and every logged step and the final weights equal an
// uninterrupted run's bit for bit.
void TestCli::killedRunResumes() {
    QTemporaryDir dir;
    QFile in(project("synthetic_blobs.json"));
    QVERIFY(in.open(QIODevice::ReadOnly));
    QJsonObject p = QJsonDocument::fromJson(in.readAll()).object();
    QJsonObject data = p["data"].toObject(), source = data["source"].toObject();
    source["samples"] = 4096;
    data["source"] = source;
    p["data"] = data;
    QJsonObject training = p["training"].toObject();
    training["epochs"] = 60;
    training["evaluate_test"] = false;
    training["callbacks"] =
        QJsonArray{QJsonObject{{"class_name", "ModelCheckpoint"},
                               {"config", QJsonObject{{"save_freq", 16}, {"keep_last", 2}}}}};
    p["training"] = training;
    const QString path = dir.filePath("long.json");
    QFile out(path);
    QVERIFY(out.open(QIODevice::WriteOnly));
    out.write(QJsonDocument(p).toJson());
    out.close();
    const QString killedDb = dir.filePath("killed/runs.db");
    const QString straightDb = dir.filePath("straight/runs.db");
    QVERIFY(QDir().mkpath(dir.filePath("killed")) && QDir().mkpath(dir.filePath("straight")));

    QProcess victim;
    QProcessEnvironment env = QProcessEnvironment::systemEnvironment();
    env.insert("OMP_NUM_THREADS", "1");
    victim.setProcessEnvironment(env);
    victim.start(td::dev::kBinary, {"train", path, "--db", killedDb, "--plain"});
    QVERIFY(victim.waitForStarted());
    // Wait until the store has registered a checkpoint well into the run, then kill -9.
    int64_t registered = 0;
    for (int i = 0; i < 6000 && registered < 600; ++i) {
        QThread::msleep(5);
        if (victim.state() == QProcess::NotRunning) break;
        auto store = td::RunStore::open(killedDb.toStdString());
        if (!store.ok()) continue;
        auto rows = (*store)->checkpoints(1);
        if (rows.ok() && !rows->empty()) registered = rows->front().globalStep;
    }
    QVERIFY2(victim.state() == QProcess::Running,
             "the run ended before it could be killed: make it longer");
    victim.kill();  // SIGKILL
    QVERIFY(victim.waitForFinished(10000));
    QCOMPARE(victim.exitStatus(), QProcess::CrashExit);
    {
        auto store = td::RunStore::open(killedDb.toStdString());
        QVERIFY(store.ok());
        QCOMPARE((*store)->getRun(1)->status, std::string("interrupted"));
        QVERIFY((*store)->steps(1)->size() < 60 * 8);
    }

    Run resumed = traindeck({"train", "--resume", "1", "--db", killedDb, "--plain"});
    QVERIFY2(resumed.code == 0, qPrintable(resumed.err + resumed.out));
    QVERIFY2(resumed.out.contains("resuming from"), qPrintable(resumed.out));
    QVERIFY(resumed.out.contains("Run completed"));
    Run straight = traindeck({"train", path, "--db", straightDb, "--plain"});
    QCOMPARE(straight.code, 0);

    const auto want = storedSteps(straightDb, 1);
    const auto got = storedSteps(killedDb, 1);
    QCOMPARE(want.size(), size_t(60 * 8));  // 64 steps an epoch, a log point every 8
    QVERIFY(got == want);
    auto a = td::api::latestCheckpointForRun(straightDb.toStdString(), 1);
    auto b = td::api::latestCheckpointForRun(killedDb.toStdString(), 1);
    QVERIFY(a.ok() && b.ok());
    auto ma = td::readCheckpointModel(*a);
    auto mb = td::readCheckpointModel(*b);
    QVERIFY(ma.ok() && mb.ok());
    QCOMPARE(mb->globalStep, int64_t(60 * 64));
    QCOMPARE(mb->globalStep, ma->globalStep);
    for (size_t i = 0; i < ma->weights.size(); ++i)
        QVERIFY(std::memcmp(ma->weights[i].value.raw(), mb->weights[i].value.raw(),
                            ma->weights[i].value.bytes()) == 0);
    auto store = td::RunStore::open(killedDb.toStdString());
    QCOMPARE((*store)->getRun(1)->status, std::string("completed"));
    QCOMPARE((*store)->listRuns()->size(), size_t(1));
}

void TestCli::resumeAndDeleteErrors() {
    QTemporaryDir dir;
    const QString db = dir.filePath("runs.db");
    Run none = traindeck({"train", "--resume", "7", "--db", db});
    QCOMPARE(none.code, 2);
    QVERIFY2(none.err.contains("no run '7'"), qPrintable(none.err));
    Run both = traindeck({"train", project("synthetic_blobs.json"), "--resume", "7", "--db", db});
    QCOMPARE(both.code, 2);
    QVERIFY2(both.err.contains("--resume: a resumed run keeps its project"), qPrintable(both.err));
    Run neither = traindeck({"train", "--db", db});
    QCOMPARE(neither.code, 2);
    QVERIFY(neither.err.contains("expected a project file, or --resume RUN"));
    // A completed run has nothing left to train.
    Run done = traindeck({"train", project("synthetic_blobs.json"), "--epochs", "1", "--db", db});
    QCOMPARE(done.code, 0);
    Run again = traindeck({"train", "--resume", "1", "--db", db});
    QCOMPARE(again.code, 2);
    QVERIFY2(again.err.contains("nothing is left to train"), qPrintable(again.err));
    Run longer = traindeck({"train", "--resume", "1", "--epochs", "2", "--db", db, "--plain"});
    QVERIFY2(longer.code == 0, qPrintable(longer.err));
    QVERIFY(longer.out.contains("Epoch 2/2"));
    // Delete keeps the files unless asked.
    const QString ckdir = dir.filePath("checkpoints/" + QFileInfo(db).fileName() + "/run-1");
    QVERIFY(QDir(ckdir).exists());
    Run kept = traindeck({"runs", "delete", "1", "--db", db});
    QCOMPARE(kept.code, 0);
    QVERIFY2(kept.out.contains("checkpoint files stay"), qPrintable(kept.out));
    QVERIFY(QDir(ckdir).exists());
    // A deleted run's id is never given out again: the next run is run 2, in a folder of its own,
    // and the kept files of run 1 are neither overwritten nor inherited.
    Run second = traindeck(
        {"train", project("synthetic_blobs.json"), "--epochs", "1", "--db", db, "--plain"});
    QCOMPARE(second.code, 0);
    QVERIFY2(second.out.contains("Run 2\n"), qPrintable(second.out));
    const QString ckdir2 = dir.filePath("checkpoints/" + QFileInfo(db).fileName() + "/run-2");
    QVERIFY(QDir(ckdir2).exists());
    Run gone = traindeck({"runs", "delete", "2", "--db", db, "--delete-checkpoints"});
    QCOMPARE(gone.code, 0);
    QVERIFY2(gone.out.contains("and its 1 checkpoint file"), qPrintable(gone.out));
    QVERIFY(!QDir(ckdir2).exists());
    QVERIFY(QDir(ckdir).exists());
    Run missing = traindeck({"runs", "delete", "2", "--db", db});
    QCOMPARE(missing.code, 2);
    // A run still running (this test process holds it) is neither resumed nor deleted.
    int64_t live = 0;
    {
        auto store = td::RunStore::open(db.toStdString());
        QVERIFY(store.ok());
        td::RunRecord rec;
        rec.name = "live";
        rec.pid = QCoreApplication::applicationPid();
        auto id = (*store)->createRun(rec);
        QVERIFY(id.ok());
        live = *id;
    }
    Run busy = traindeck({"train", "--resume", QString::number(live), "--db", db});
    QCOMPARE(busy.code, 2);
    QVERIFY2(busy.err.contains("is still running"), qPrintable(busy.err));
    Run held = traindeck({"runs", "delete", QString::number(live), "--db", db});
    QCOMPARE(held.code, 2);
    QVERIFY2(held.err.contains("is running"), qPrintable(held.err));
}

// The headless commands run on a server without Qt's GUI libraries: nothing the executable loads
// (its whole dependency closure, as the dynamic loader resolves it) is a GUI or display library,
// nor HDF5 with the network and crypto libraries it brings (those load with the Keras module).
void TestCli::headlessLoadsNoGuiLibrary() {
    QProcess ldd;
    ldd.start("ldd", {td::dev::kBinary});
    if (!ldd.waitForStarted()) QSKIP("ldd is not installed");
    QVERIFY(ldd.waitForFinished());
    const QString libs = QString::fromUtf8(ldd.readAllStandardOutput());
    QVERIFY2(libs.contains("libc.so"), qPrintable(libs));
    for (const char* gui : {"libQt6Gui", "libQt6Widgets", "libQCustomPlot", "libGL", "libX11",
                            "libxcb", "libfontconfig", "libhdf5", "libcurl", "libcrypto"})
        QVERIFY2(!libs.contains(gui), qPrintable(QString("%1 in\n%2").arg(gui, libs)));
    // ... and a headless command still works with the module out of reach.
    Run r = traindeck({"devices"}, QString(), {"TRAINDECK_GUI_MODULE=/nonexistent/gui.so"});
    QCOMPARE(r.code, 0);
    QVERIFY(r.out.contains("cpu"));
}

// .keras files go through libtraindeck_h5.so, loaded on first use: with it out of reach, saving
// the trained model fails with a message that names the module and where it was looked for, and
// the run itself stays stored as completed.
void TestCli::kerasFilesNeedTheH5Module() {
    QTemporaryDir dir;
    const QString db = dir.filePath("runs.db");
    const QString out = dir.filePath("m.keras");
    Run r =
        traindeck({"train", project("synthetic_blobs.json"), "--epochs", "1", "--db", db, "--plain",
                   "--save-model", out},
                  dir.path(), {"TRAINDECK_H5_MODULE=" + dir.filePath("none/libtraindeck_h5.so")});
    QVERIFY2(r.code != 0, qPrintable(r.out));
    QVERIFY2(r.err.contains("model.weights.h5") && r.err.contains("libtraindeck_h5.so") &&
                 r.err.contains(dir.filePath("none/libtraindeck_h5.so") + ": no such file"),
             qPrintable(r.err));
    QVERIFY(!QFile::exists(out));
    QCOMPARE(storedStatuses(db), QStringList{"completed"});
    // Found next to the executable, the same command writes the file, and the model reads back.
    r = traindeck({"train", project("synthetic_blobs.json"), "--epochs", "1", "--db", db, "--plain",
                   "--save-model", out},
                  dir.path());
    QVERIFY2(r.code == 0, qPrintable(r.err));
    QVERIFY(QFile::exists(out));
    Run imported = traindeck({"import", out, "-o", dir.filePath("imported.json")});
    QVERIFY2(imported.code == 0, qPrintable(imported.err));
    Run summary = traindeck({"summary", dir.filePath("imported.json")});
    QVERIFY2(summary.code == 0 && summary.out.contains("Dense"),
             qPrintable(summary.out + summary.err));
}

// `traindeck PROJECT --start --quit-when-done` opens the desktop app from its module, trains the
// project there and stores the run (offscreen: QT_QPA_PLATFORM is set by the test's environment).
void TestCli::desktopAppLoadsAsModule() {
#ifndef TRAINDECK_HAVE_GUI
    QSKIP("built without the desktop app (TRAINDECK_BUILD_GUI=OFF or no Qt Widgets)");
#else
    QTemporaryDir dir;
    const QString db = dir.filePath("gui.db");
    Run r = traindeck({"--db", db, project("synthetic_blobs.json"), "--start", "--quit-when-done"},
                      dir.path(), {"QT_QPA_PLATFORM=offscreen"});
    QVERIFY2(r.code == 0, qPrintable(r.out + r.err));
    QVERIFY2(r.out.contains("run completed"), qPrintable(r.out + r.err));
    QCOMPARE(storedStatuses(db), QStringList{"completed"});
#endif
}

// A module that is missing or is not TrainDeck's: exit code 1 and a message that names it, says
// why, and points at the headless commands; never a crash.
void TestCli::desktopAppModuleErrors() {
#ifndef TRAINDECK_HAVE_GUI
    QSKIP("built without the desktop app (TRAINDECK_BUILD_GUI=OFF or no Qt Widgets)");
#else
    QTemporaryDir dir;
    const QString missing = dir.filePath("missing/libtraindeck_gui.so");
    Run r = traindeck({"--db", dir.filePath("a.db")}, dir.path(),
                      {"TRAINDECK_GUI_MODULE=" + missing, "QT_QPA_PLATFORM=offscreen"});
    QCOMPARE(r.code, 1);
    QVERIFY2(r.err.contains(missing + ": no such file"), qPrintable(r.err));
    QVERIFY2(r.err.contains("traindeck train PROJECT"), qPrintable(r.err));

    const QString notElf = dir.filePath("libtraindeck_gui.so");
    QFile f(notElf);
    QVERIFY(f.open(QIODevice::WriteOnly));
    f.write("not a shared object\n");
    f.close();
    r = traindeck({"--db", dir.filePath("a.db")}, dir.path(),
                  {"TRAINDECK_GUI_MODULE=" + notElf, "QT_QPA_PLATFORM=offscreen"});
    QCOMPARE(r.code, 1);
    QVERIFY2(r.err.contains(notElf + ": "), qPrintable(r.err));
    QVERIFY2(!r.err.contains("no such file"), qPrintable(r.err));
    QVERIFY(!QFile::exists(dir.filePath("a.db")));  // nothing was started

    // A shared object that is not the GUI module (the C library): named as such.
    QProcess ldd;
    ldd.start("ldd", {td::dev::kBinary});
    if (!ldd.waitForStarted() || !ldd.waitForFinished()) QSKIP("ldd is not installed");
    const auto m = QRegularExpression(R"(libc\.so\.6 => (\S+))")
                       .match(QString::fromUtf8(ldd.readAllStandardOutput()));
    QVERIFY(m.hasMatch());
    r = traindeck({"--db", dir.filePath("a.db")}, dir.path(),
                  {"TRAINDECK_GUI_MODULE=" + m.captured(1), "QT_QPA_PLATFORM=offscreen"});
    QCOMPARE(r.code, 1);
    QVERIFY2(r.err.contains(m.captured(1) + ": not the TrainDeck module (no traindeck_gui_main)"),
             qPrintable(r.err));
#endif
}

#include "test_cli.moc"

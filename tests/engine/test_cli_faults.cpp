// Store safety through the CLI with real processes: stores that share a folder keep their own
// checkpoints, every checkpoint read is checked to be the run's, paths work from any folder,
// schema-5 stores migrate, signals stop a run cleanly, a checkpoint the store never registered
// is found, read-only stores can be browsed, deep JSON is refused, and the messages of refused
// input name the thing and what was expected.
#include <signal.h>
#include <sqlite3.h>
#include <unistd.h>

#include <QJsonArray>
#include <QJsonDocument>
#include <QJsonObject>
#include <QProcess>
#include <QSet>
#include <QStandardPaths>
#include <QtTest>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>

#include "engine/io/zip_archive.h"
#include "engine/store/run_store.h"
#include "engine/train/checkpoint.h"
#include "tests/engine/cli_process.h"

namespace fs = std::filesystem;
using td::test::LiveRun;
using td::test::project;
using td::test::Run;
using td::test::traindeck;

namespace {

// The synthetic-blobs project with changes, written to `path`.
void writeBlobs(const QString& path, const std::function<void(QJsonObject&)>& change) {
    QFile in(project("synthetic_blobs.json"));
    QVERIFY(in.open(QIODevice::ReadOnly));
    QJsonObject p = QJsonDocument::fromJson(in.readAll()).object();
    change(p);
    QFile out(path);
    QVERIFY(out.open(QIODevice::WriteOnly));
    out.write(QJsonDocument(p).toJson());
}

void setHidden(QJsonObject& p, int units) {
    QJsonObject model = p["model"].toObject(), config = model["config"].toObject();
    QJsonArray layers = config["layers"].toArray();
    QJsonObject dense = layers[1].toObject(), dc = dense["config"].toObject();
    dc["units"] = units;
    dense["config"] = dc;
    layers[1] = dense;
    config["layers"] = layers;
    model["config"] = config;
    p["model"] = model;
}

void setTraining(QJsonObject& p, const char* key, const QJsonValue& v) {
    QJsonObject t = p["training"].toObject();
    t[key] = v;
    p["training"] = t;
}

void setSamples(QJsonObject& p, int samples) {
    QJsonObject data = p["data"].toObject(), source = data["source"].toObject();
    source["samples"] = samples;
    data["source"] = source;
    p["data"] = data;
}

// The hidden layer's width of a model file, from its summary ("(None, 64)").
bool summaryHasWidth(const QString& model, int units) {
    Run r = traindeck({"summary", model});
    return r.code == 0 && r.out.contains(QString("(None, %1)").arg(units));
}

void sql(const std::string& db, const std::string& statement) {
    sqlite3* h = nullptr;
    QCOMPARE(sqlite3_open(db.c_str(), &h), SQLITE_OK);
    char* msg = nullptr;
    const int rc = sqlite3_exec(h, statement.c_str(), nullptr, nullptr, &msg);
    const std::string error = msg ? msg : "";
    sqlite3_free(msg);
    sqlite3_close(h);
    QVERIFY2(rc == SQLITE_OK, error.c_str());
}

// A NumPy .npy file of float32 values with the given shape.
void writeNpy(const QString& path, const std::vector<int>& shape, const std::vector<float>& v) {
    std::string dims;
    for (size_t i = 0; i < shape.size(); ++i)
        dims += std::to_string(shape[i]) + (shape.size() == 1 || i + 1 < shape.size() ? "," : "");
    std::string header = "{'descr': '<f4', 'fortran_order': False, 'shape': (" + dims + "), }";
    header.append((64 - (10 + header.size() + 1) % 64) % 64, ' ');
    header += '\n';
    std::string bytes = "\x93NUMPY\x01";
    bytes += '\0';
    bytes += static_cast<char>(header.size() & 0xff);
    bytes += static_cast<char>(header.size() >> 8);
    bytes += header;
    bytes.append(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(float));
    std::ofstream(path.toStdString(), std::ios::binary) << bytes;
}

std::string runStatus(const QString& db, int64_t id) {
    auto store = td::RunStore::open(db.toStdString());
    if (!store.ok()) return store.error();
    auto run = (*store)->getRun(id);
    return run.ok() ? run->status : run.error();
}

}  // namespace

class TestCliFaults : public QObject {
    Q_OBJECT
  private slots:
    void twoStoresInOneFolder();
    void exportToStandardOutput();
    void detachAndStandardInput();
    void steerHeadlessRun();
    void followLiveRun();
    void relativeStoreFromAnotherFolder();
    void legacyStoresMigrate();
    void signalStopsRun_data();
    void signalStopsRun();
    void secondSignalEndsAtOnce();
    void unregisteredCheckpointResumes();
    void deepJsonRefused();
    void readOnlyStore();
    void messages_data();
    void messages();
};

// `export RUN -o -` (how a model is fetched over SSH): the bytes of the file export on standard
// output, the report on standard error; without --format it is refused, writing nothing.
void TestCliFaults::exportToStandardOutput() {
    QTemporaryDir dir;
    writeBlobs(dir.filePath("a.json"), [](QJsonObject& p) { setTraining(p, "epochs", 1); });
    const QString db = dir.filePath("a.db");
    QCOMPARE(traindeck({"train", dir.filePath("a.json"), "--db", db, "--run-name", "A"}).code, 0);
    for (const QString format : {"onnx", "keras"}) {
        const QString file = dir.filePath("A." + format);
        QCOMPARE(traindeck({"export", "A", "--db", db, "-o", file}).code, 0);
        QProcess p;
        p.start(td::dev::kBinary, {"export", "A", "--db", db, "-o", "-", "--format", format});
        QVERIFY(p.waitForFinished(120000));
        QCOMPARE(p.exitCode(), 0);
        QFile f(file);
        QVERIFY(f.open(QIODevice::ReadOnly));
        const QByteArray want = f.readAll();
        QVERIFY(want.size() > 1000);
        QVERIFY(p.readAllStandardOutput() == want);
        QVERIFY(QString::fromUtf8(p.readAllStandardError()).contains("to standard output"));
    }
    QProcess p;
    p.start(td::dev::kBinary, {"export", "A", "--db", db, "-o", "-"});
    QVERIFY(p.waitForFinished(120000));
    QCOMPARE(p.exitCode(), 2);
    QVERIFY(p.readAllStandardOutput().isEmpty());
    QVERIFY(QString::fromUtf8(p.readAllStandardError()).contains("give --format onnx"));
}

// `train --detach` prints the run's id at once and the run completes in a process of its own
// session, its output in a log beside the store; one that cannot start says why with that log.
// `train -` reads the project from standard input (relative paths against the working folder).
void TestCliFaults::detachAndStandardInput() {
    QTemporaryDir dir;
    writeBlobs(dir.filePath("a.json"), [](QJsonObject& p) { setTraining(p, "epochs", 2); });
    const QString db = dir.filePath("runs.db");
    Run d = traindeck({"train", dir.filePath("a.json"), "--db", db, "--detach"});
    QVERIFY2(d.code == 0, qPrintable(d.err));
    QCOMPARE(d.out.trimmed(), QString("1"));
    QVERIFY2(d.err.contains("trains detached") && d.err.contains(dir.filePath("logs/train-")),
             qPrintable(d.err));
    bool done = false;
    for (int i = 0; i < 600 && !done; ++i) {
        QTest::qWait(100);
        done = traindeck({"runs", "--db", db}).out.contains("completed");
    }
    QVERIFY(done);
    const QStringList logs = QDir(dir.filePath("logs")).entryList({"train-*.log"});
    QCOMPARE(logs.size(), 1);
    QFile log(dir.filePath("logs/" + logs[0]));
    QVERIFY(log.open(QIODevice::ReadOnly));
    QVERIFY(QString::fromUtf8(log.readAll()).contains("Stored in " + db));

    QFile bad(dir.filePath("bad.json"));
    QVERIFY(bad.open(QIODevice::WriteOnly));
    QFile good(dir.filePath("a.json"));
    QVERIFY(good.open(QIODevice::ReadOnly));
    QJsonObject p = QJsonDocument::fromJson(good.readAll()).object();
    QJsonObject data = p["data"].toObject();
    data["source"] = QJsonObject{{"type", "image_directory"}, {"directory", "/nowhere/x"}};
    p["data"] = data;
    bad.write(QJsonDocument(p).toJson());
    bad.close();
    Run f = traindeck({"train", dir.filePath("bad.json"), "--db", db, "--detach"});
    QCOMPARE(f.code, 2);
    QVERIFY2(f.err.contains("the run did not start") && f.err.contains("/nowhere/x does not exist"),
             qPrintable(f.err));

    QProcess s;
    s.setWorkingDirectory(dir.path());
    s.start(td::dev::kBinary, {"train", "-", "--db", db, "--run-name", "from stdin", "--plain"});
    QVERIFY(s.waitForStarted());
    good.seek(0);
    s.write(good.readAll());
    s.closeWriteChannel();
    QVERIFY(s.waitForFinished(120000));
    QVERIFY2(s.exitCode() == 0, s.readAllStandardError().constData());
    QVERIFY(traindeck({"runs", "--db", db}).out.contains("from stdin"));
    QProcess e;
    e.start(td::dev::kBinary, {"train", "-", "--db", db});
    QVERIFY(e.waitForStarted());
    e.write("{\"format\": 1");
    e.closeWriteChannel();
    QVERIFY(e.waitForFinished(60000));
    QCOMPARE(e.exitCode(), 2);
    QVERIFY(QString::fromUtf8(e.readAllStandardError()).contains("standard input: "));
}

// stop / pause / continue from another process: the run's control file names its process
// (pid, start time, boot id); pause holds the epochs, continue lets them go on, stop ends the run
// as stopped with a checkpoint and removes the file. A control file whose process is gone (a
// pid that is free, or another process's) signals nothing.
void TestCliFaults::steerHeadlessRun() {
    QTemporaryDir dir;
    writeBlobs(dir.filePath("long.json"), [](QJsonObject& p) { setTraining(p, "epochs", 100000); });
    const QString db = dir.filePath("runs.db");
    Run d = traindeck({"train", dir.filePath("long.json"), "--db", db, "--detach"});
    QVERIFY2(d.code == 0, qPrintable(d.err));
    const QString id = d.out.trimmed();
    const QString control = dir.filePath("logs/runs.db-run-" + id + ".control");
    QTRY_VERIFY_WITH_TIMEOUT(QFile::exists(control), 30000);
    // A failing check must not leave the detached run training (or paused) behind.
    struct EndRun {
        QString control;
        ~EndRun() {
            QFile f(control);
            if (f.open(QIODevice::ReadOnly)) ::kill(f.readLine().trimmed().toInt(), SIGKILL);
        }
    } endRun{control};
    auto epochs = [&] {
        const Run s = traindeck({"show", id, "--db", db, "--json"});
        return QJsonDocument::fromJson(s.out.toUtf8()).object()["epochs"].toArray().size();
    };
    QTRY_VERIFY_WITH_TIMEOUT(epochs() > 2, 30000);
    Run p = traindeck({"pause", id, "--db", db});
    QVERIFY2(p.code == 0 && p.out.contains("Pausing run " + id), qPrintable(p.out + p.err));
    // The step in progress ends and the recorder stores what it has: then nothing moves.
    int held = epochs();
    for (int i = 0; i < 20; ++i) {
        QTest::qWait(1000);
        const int now = epochs();
        if (now == held) break;
        held = now;
    }
    QTest::qWait(1500);
    QCOMPARE(epochs(), held);
    QCOMPARE(traindeck({"continue", id, "--db", db}).code, 0);
    QTRY_VERIFY_WITH_TIMEOUT(epochs() > held, 30000);
    Run st = traindeck({"stop", id, "--db", db});
    QVERIFY2(st.code == 0, qPrintable(st.err));
    QTRY_VERIFY_WITH_TIMEOUT(traindeck({"runs", "--db", db}).out.contains("stopped"), 30000);
    QTRY_VERIFY_WITH_TIMEOUT(!QFile::exists(control), 10000);
    Run again = traindeck({"stop", id, "--db", db});
    QCOMPARE(again.code, 2);
    QVERIFY2(again.err.contains("is stopped, not running"), qPrintable(again.err));

    // A run left 'running' whose control file names a process that is not its own: nothing is
    // signalled. (This test's own pid with a start time it does not have.)
    auto store = td::RunStore::open(db.toStdString());
    QVERIFY(store.ok());
    td::RunRecord rec;
    rec.name = "orphan";
    auto orphan = (*store)->createRun(rec);
    QVERIFY(orphan.ok());
    QFile f(dir.filePath("logs/runs.db-run-" + QString::number(*orphan) + ".control"));
    QVERIFY(f.open(QIODevice::WriteOnly));
    char host[256] = {};
    ::gethostname(host, sizeof host - 1);
    f.write(QByteArray::number(static_cast<qint64>(::getpid())) + "\n1 not-this-boot\n" + host +
            "\n");
    f.close();
    Run gone = traindeck({"stop", QString::number(*orphan), "--db", db});
    QCOMPARE(gone.code, 2);
    QVERIFY2(gone.err.contains("is gone") && gone.err.contains("nothing was signalled"),
             qPrintable(gone.err));
}

// `follow` of a run another process is training: the stored rows, then live ones, ending with
// the final status; the rows are the store's, row by row. A follow cut off mid-way and continued
// from its last line's cursor gives the same rows as one uncut, nothing missing or twice.
void TestCliFaults::followLiveRun() {
    QTemporaryDir dir;
    writeBlobs(dir.filePath("long.json"), [](QJsonObject& p) { setTraining(p, "epochs", 400); });
    const QString db = dir.filePath("runs.db");
    Run d = traindeck({"train", dir.filePath("long.json"), "--db", db, "--detach"});
    QVERIFY2(d.code == 0, qPrintable(d.err));
    const QString id = d.out.trimmed();
    // Cut off: the first 300 lines of a live follow.
    QProcess cut;
    cut.start(td::dev::kBinary, {"follow", id, "--db", db, "--poll-ms", "50"});
    QVERIFY(cut.waitForStarted());
    QByteArray first;
    while (first.count('\n') < 300 && cut.waitForReadyRead(30000)) first += cut.readAll();
    cut.kill();
    cut.waitForFinished();
    QList<QByteArray> firstLines = first.split('\n');
    firstLines = firstLines.mid(0, 300);
    QVERIFY(firstLines[0].contains("\"protocol\":1"));
    const QJsonObject last = QJsonDocument::fromJson(firstLines.last()).object();
    const QString cursor = last["cursor"].toString();
    QVERIFY2(!cursor.isEmpty(), firstLines.last().constData());
    // The rest, from the cursor; and everything, in one go, once the run has ended.
    Run rest = traindeck({"follow", id, "--db", db, "--from", cursor, "--poll-ms", "50"});
    QVERIFY2(rest.code == 0, qPrintable(rest.err));
    QVERIFY(rest.out.trimmed().endsWith("}"));
    Run whole = traindeck({"follow", id, "--db", db});
    QCOMPARE(whole.code, 0);
    // Checkpoint rows are compared apart: a live follower also sees the checkpoints the run
    // rotated out later.
    auto rows = [](const QList<QByteArray>& lines, bool checkpoints = false) {
        QStringList out;
        for (const QByteArray& l : lines) {
            QJsonObject o = QJsonDocument::fromJson(l).object();
            const QString type = o["type"].toString();
            if (type.isEmpty() || type == "hello" || type == "status") continue;
            if ((type == "checkpoint") != checkpoints) continue;
            o.remove("cursor");
            out << QString::fromUtf8(QJsonDocument(o).toJson(QJsonDocument::Compact));
        }
        return out;
    };
    // The same rows (each kind in its order; the kinds interleave as the looks fell).
    QStringList joined = rows(firstLines) + rows(rest.out.toUtf8().split('\n'));
    QStringList all = rows(whole.out.toUtf8().split('\n'));
    joined.sort();
    all.sort();
    QVERIFY(all.size() > 300);
    QCOMPARE(joined.size(), all.size());
    QCOMPARE(joined, all);
    const QStringList seen = rows(firstLines, true) + rows(rest.out.toUtf8().split('\n'), true);
    QCOMPARE(QSet<QString>(seen.begin(), seen.end()).size(), seen.size());
    for (const QString& kept : rows(whole.out.toUtf8().split('\n'), true))
        QVERIFY2(seen.contains(kept), qPrintable(kept));
    const QJsonObject status =
        QJsonDocument::fromJson(rest.out.trimmed().split('\n').last().toUtf8()).object();
    QCOMPARE(status["type"].toString(), QString("status"));
    QCOMPARE(status["status"].toString(), QString("completed"));
    // The step rows are the store's.
    auto store = td::RunStore::open(db.toStdString());
    QVERIFY(store.ok());
    auto steps = (*store)->steps(id.toLongLong());
    QVERIFY(steps.ok());
    int followed = 0;
    for (const QString& r : all) followed += r.contains("\"type\":\"step\"") ? 1 : 0;
    QCOMPARE(followed, static_cast<int>(steps->size()));
    // --from-step: only what came after that step.
    Run after = traindeck(
        {"follow", id, "--db", db, "--from-step", QString::number(steps->back().globalStep - 1)});
    QCOMPARE(after.code, 0);
    QCOMPARE(after.out.count("\"type\":\"step\""), 1);
    QCOMPARE(traindeck({"follow", id, "--db", db, "--from", "nonsense"}).code, 2);

    // A writer killed mid-run: the follower notices its process is gone and ends the stream with
    // the status the store then gives the run, interrupted.
    Run k = traindeck(
        {"train", dir.filePath("long.json"), "--db", db, "--detach", "--epochs", "100000"});
    QVERIFY2(k.code == 0, qPrintable(k.err));
    const QString killed = k.out.trimmed();
    const QString control = dir.filePath("logs/runs.db-run-" + killed + ".control");
    QTRY_VERIFY_WITH_TIMEOUT(QFile::exists(control), 30000);
    QProcess live;
    live.start(td::dev::kBinary, {"follow", killed, "--db", db, "--poll-ms", "50"});
    QVERIFY(live.waitForReadyRead(30000));
    QFile c(control);
    QVERIFY(c.open(QIODevice::ReadOnly));
    QCOMPARE(::kill(c.readLine().trimmed().toInt(), SIGKILL), 0);
    QVERIFY(live.waitForFinished(30000));
    QCOMPARE(live.exitCode(), 0);
    const QList<QByteArray> lines = live.readAllStandardOutput().trimmed().split('\n');
    const QJsonObject end = QJsonDocument::fromJson(lines.last()).object();
    QCOMPARE(end["type"].toString(), QString("status"));
    QCOMPARE(end["status"].toString(), QString("interrupted"));
}

// The issue's case: a.db and b.db in one folder, each with a run 1, of models that differ. Each
// store has its own checkpoints; export and resume give each run its own model; a checkpoint of
// the other store, registered or planted in the folder, is refused by name and never used.
void TestCliFaults::twoStoresInOneFolder() {
    QTemporaryDir dir;
    writeBlobs(dir.filePath("a.json"), [](QJsonObject& p) { setTraining(p, "epochs", 1); });
    writeBlobs(dir.filePath("b.json"), [](QJsonObject& p) {
        setTraining(p, "epochs", 3);
        setHidden(p, 64);
    });
    const QString a = dir.filePath("a.db"), b = dir.filePath("b.db");
    QCOMPARE(traindeck({"train", dir.filePath("a.json"), "--db", a, "--run-name", "A"}).code, 0);
    Run tb = traindeck({"train", dir.filePath("b.json"), "--db", b, "--run-name", "B"});
    QCOMPARE(tb.code, 0);
    QVERIFY2(!tb.out.contains("moved to"), qPrintable(tb.out));  // nothing of A's touched
    QVERIFY(QDir(dir.filePath("checkpoints/a.db/run-1")).exists());
    QVERIFY(QDir(dir.filePath("checkpoints/b.db/run-1")).exists());

    Run ea = traindeck({"export", "A", "--db", a, "-o", dir.filePath("A.keras")});
    QVERIFY2(ea.code == 0, qPrintable(ea.err));
    QVERIFY(summaryHasWidth(dir.filePath("A.keras"), 32));
    Run eb = traindeck({"export", "B", "--db", b, "-o", dir.filePath("B.keras")});
    QVERIFY2(eb.code == 0, qPrintable(eb.err));
    QVERIFY(summaryHasWidth(dir.filePath("B.keras"), 64));

    // B's newest checkpoint (step 96, newer than A's 32) planted in A's run folder: found, refused.
    auto bRows = (*td::RunStore::open(b.toStdString()))->checkpoints(1);
    QVERIFY(bRows.ok() && !bRows->empty());
    const QString planted = dir.filePath("checkpoints/a.db/run-1/run-96.tdckpt");
    QVERIFY(QFile::copy(QString::fromStdString(bRows->front().path), planted));
    Run ep = traindeck({"export", "A", "--db", a, "-o", dir.filePath("A2.keras")});
    QVERIFY2(ep.code == 0, qPrintable(ep.err));
    QVERIFY2(ep.err.contains("skipped the newer checkpoint " + planted +
                             ": belongs to run 1 of "
                             "another run store"),
             qPrintable(ep.err));
    QVERIFY(summaryHasWidth(dir.filePath("A2.keras"), 32));
    QVERIFY(QFile::remove(planted));

    // Registered in A's store by a hand or a bug: refused the same way, by every reader.
    {
        auto store = td::RunStore::open(a.toStdString());
        QVERIFY(store.ok());
        td::CheckpointRow row = bRows->front();
        QVERIFY((*store)->addCheckpoints(1, {row}).ok());
    }
    Run er = traindeck({"export", "A", "--db", a, "-o", dir.filePath("A3.keras")});
    QVERIFY2(er.code == 0, qPrintable(er.err));
    QVERIFY2(er.err.contains("another run store"), qPrintable(er.err));
    QVERIFY(summaryHasWidth(dir.filePath("A3.keras"), 32));
    Run resumed = traindeck({"train", "--resume", "A", "--db", a, "--epochs", "2", "--plain"});
    QVERIFY2(resumed.code == 0, qPrintable(resumed.err + resumed.out));
    QVERIFY2(resumed.out.contains("refused " + QString::fromStdString(bRows->front().path)),
             qPrintable(resumed.out));
    QVERIFY(resumed.out.contains("Epoch 2/2"));
}

// A store named relative to one folder, used from another: its checkpoints are found.
void TestCliFaults::relativeStoreFromAnotherFolder() {
    for (const QString store : {"rel/r.db", "r.db"}) {
        QTemporaryDir dir;
        QVERIFY(QDir(dir.path()).mkpath("x/rel") && QDir(dir.path()).mkpath("y"));
        writeBlobs(dir.filePath("a.json"), [](QJsonObject& p) { setTraining(p, "epochs", 1); });
        Run t = traindeck({"train", "../a.json", "--db", store, "--run-name", "R"}, {}, {}, 300000,
                          dir.filePath("x"));
        QVERIFY2(t.code == 0, qPrintable(t.err));
        const QString there = "../x/" + store;
        Run e = traindeck({"export", "R", "--db", there, "-o", "R.keras"}, {}, {}, 300000,
                          dir.filePath("y"));
        QVERIFY2(e.code == 0, qPrintable(e.err));
        QVERIFY(QFile::exists(dir.filePath("y/R.keras")));
        Run r = traindeck({"train", "--resume", "R", "--db", there, "--epochs", "2"}, {}, {},
                          300000, dir.filePath("y"));
        QVERIFY2(r.code == 0, qPrintable(r.err));
    }
}

// Two stores of schema 5 beside each other, as the old layout left them: one shared folder
// checkpoints/run-1/ whose file B's run overwrote, named relative to the folder the commands ran
// in. Opened from another folder, B's run exports; A's run is refused with the reason (the file
// holds another store's run), never handed B's model; no file is deleted.
void TestCliFaults::legacyStoresMigrate() {
    QTemporaryDir dir;
    QVERIFY(QDir(dir.path()).mkpath("elsewhere"));
    writeBlobs(dir.filePath("a.json"), [](QJsonObject& p) { setTraining(p, "epochs", 1); });
    writeBlobs(dir.filePath("b.json"), [](QJsonObject& p) {
        setTraining(p, "epochs", 1);
        setHidden(p, 64);
    });
    for (const char* s : {"a", "b"}) {
        const QString db = QString("%1.db").arg(s);
        Run t =
            traindeck({"train", QString("%1.json").arg(s), "--db", db}, {}, {}, 300000, dir.path());
        QVERIFY2(t.code == 0, qPrintable(t.err));
        // Back to schema 5: the file in the shared folder (b's replaces a's), the path as the old
        // code stored it, no identity table.
        const fs::path own =
            dir.filePath(QString("checkpoints/%1/run-1/run-32.tdckpt").arg(db)).toStdString();
        fs::create_directories(dir.filePath("checkpoints/run-1").toStdString());
        const fs::path shared = dir.filePath("checkpoints/run-1/run-32.tdckpt").toStdString();
        auto state = td::readCheckpoint(own.string());
        QVERIFY(state.ok());
        state->storeId.clear();  // files of those stores carry no store identity
        QVERIFY(td::writeCheckpoint(shared.string(), *state).ok());
        fs::remove_all(own.parent_path().parent_path());
        sql(dir.filePath(db).toStdString(),
            "DROP TABLE store_meta; ALTER TABLE runs DROP COLUMN idle_ms; UPDATE checkpoints "
            "SET path = './checkpoints/run-1/run-32.tdckpt'; PRAGMA user_version = 5;");
    }
    Run eb = traindeck({"export", "1", "--db", "../b.db", "-o", "B.keras"}, {}, {}, 300000,
                       dir.filePath("elsewhere"));
    QVERIFY2(eb.code == 0, qPrintable(eb.err));
    QVERIFY(summaryHasWidth(dir.filePath("elsewhere/B.keras"), 64));
    Run ea = traindeck({"export", "1", "--db", "../a.db", "-o", "A.keras"}, {}, {}, 300000,
                       dir.filePath("elsewhere"));
    QCOMPARE(ea.code, 2);
    QVERIFY2(ea.err.contains("none of its checkpoints can be used") &&
                 ea.err.contains("holds another model than run 1 of"),
             qPrintable(ea.err));
    QVERIFY(!QFile::exists(dir.filePath("elsewhere/A.keras")));
    QVERIFY(QFile::exists(dir.filePath("checkpoints/run-1/run-32.tdckpt")));
    QVERIFY(QFile::exists(dir.filePath("checkpoints/b.db/run-1/run-32.tdckpt")));
}

void TestCliFaults::signalStopsRun_data() {
    QTest::addColumn<int>("sig");
    QTest::newRow("SIGTERM") << int(SIGTERM);
    QTest::newRow("SIGINT") << int(SIGINT);
    QTest::newRow("SIGHUP") << int(SIGHUP);
}

// A signal stops a headless run as the Stop button does: the step finishes, a checkpoint is
// written and registered, the run is stored as stopped, the CLI says so and exits 128 + signal;
// the run then resumes from that checkpoint.
void TestCliFaults::signalStopsRun() {
    QFETCH(int, sig);
    QTemporaryDir dir;
    const QString path = dir.filePath("long.json"), db = dir.filePath("runs.db");
    writeBlobs(path, [](QJsonObject& p) {
        setTraining(p, "epochs", 2000);
        setSamples(p, 16384);
        setTraining(p, "evaluate_test", false);
    });
    LiveRun run({"train", path, "--db", db, "--plain"});
    QVERIFY2(run.waitFor("Epoch 3/"), qPrintable(run.out));
    QCOMPARE(::kill(static_cast<pid_t>(run.p.processId()), sig), 0);
    QVERIFY(run.p.waitForFinished(60000));
    const QString err = QString::fromUtf8(run.p.readAllStandardError());
    QCOMPARE(run.p.exitStatus(), QProcess::NormalExit);
    QCOMPARE(run.p.exitCode(), 128 + sig);
    const QString name = sig == SIGTERM ? "SIGTERM" : sig == SIGINT ? "SIGINT" : "SIGHUP";
    QVERIFY2(err.contains(name + " received: stopping after the current step"), qPrintable(err));
    QVERIFY2(err.contains("run 1 stopped by " + name + ", checkpoint "), qPrintable(err));
    QCOMPARE(runStatus(db, 1), std::string("stopped"));
    auto store = td::RunStore::open(db.toStdString());
    auto rows = (*store)->checkpoints(1);
    QVERIFY(rows.ok() && !rows->empty());
    auto steps = (*store)->steps(1);
    QVERIFY(steps.ok() && !steps->empty());
    // The stop's own checkpoint: at the step the run stopped, at or after the last logged one.
    QCOMPARE(rows->front().kind, std::string("run"));
    QVERIFY(rows->front().globalStep >= steps->back().globalStep &&
            rows->front().globalStep < steps->back().globalStep + 8);
    QVERIFY2(err.contains(QString::fromStdString(rows->front().path)), qPrintable(err));
    if (sig != SIGTERM) return;
    const int more = rows->front().epoch + 2;
    Run resumed = traindeck(
        {"train", "--resume", "1", "--db", db, "--epochs", QString::number(more), "--plain"});
    QVERIFY2(resumed.code == 0, qPrintable(resumed.err + resumed.out));
    QVERIFY(resumed.out.contains("resuming from"));
    QCOMPARE(runStatus(db, 1), std::string("completed"));
}

// A second signal does not wait for the step: the process ends at once, by the signal. Steps of
// about a second; the second signal follows the first by 20 ms, well before the run can have
// stopped on its own (the CLI looks for the first every 100 ms, then the step finishes). Should
// the run still have stopped cleanly in between (its step ending just then), it is tried again.
void TestCliFaults::secondSignalEndsAtOnce() {
    QTemporaryDir dir;
    const QString path = dir.filePath("slow.json"), db = dir.filePath("runs.db");
    writeBlobs(path, [](QJsonObject& p) {
        setTraining(p, "epochs", 50);
        setTraining(p, "batch_size", 16384);
        setSamples(p, 16384);
        setHidden(p, 8192);
    });
    for (int attempt = 0; attempt < 3; ++attempt) {
        LiveRun run({"train", path, "--db", db, "--plain"});
        QVERIFY2(run.waitFor("Epoch 2/"), qPrintable(run.out));
        const auto pid = static_cast<pid_t>(run.p.processId());
        QCOMPARE(::kill(pid, SIGTERM), 0);
        QThread::msleep(20);
        QCOMPARE(::kill(pid, SIGTERM), 0);
        QVERIFY(run.p.waitForFinished(10000));
        if (run.p.exitStatus() == QProcess::CrashExit) return;  // ended by the second signal
        QCOMPARE(run.p.exitCode(), 128 + SIGTERM);  // stopped by the first before the second
    }
    QFAIL("three runs stopped cleanly before their second signal arrived");
}

// A checkpoint the trainer wrote but the store never registered (the process was killed in
// between): --resume finds it in the run's folder, checks that it is the run's, and goes on from
// it; one of another store planted there is refused. Without its rows stored it is not used.
void TestCliFaults::unregisteredCheckpointResumes() {
    for (const bool rowsStored : {true, false}) {
        QTemporaryDir dir;
        const QString path = dir.filePath("p.json"), db = dir.filePath("runs.db");
        writeBlobs(path, [](QJsonObject& p) { setTraining(p, "evaluate_test", false); });
        Run t = traindeck({"train", path, "--db", db, "--plain", "--epochs", "3"});
        QVERIFY2(t.code == 0, qPrintable(t.err));
        std::string newest;
        {
            auto store = td::RunStore::open(db.toStdString());
            auto rows = (*store)->checkpoints(1);
            QVERIFY(rows.ok() && rows->size() == 2);  // after epochs 2 and 3
            newest = rows->front().path;
            QCOMPARE(rows->front().globalStep, int64_t(96));
            QVERIFY((*store)->addCheckpoints(1, {}, {newest}).ok());  // the row lost, file kept
            QVERIFY((*store)->reopenRun(1).ok());
            QVERIFY((*store)->finishRun(1, td::RunStatus::Interrupted, {}, "killed").ok());
        }
        QVERIFY(fs::exists(newest));
        if (!rowsStored)  // killed before the rows of the last epoch were stored, too
            sql(db.toStdString(),
                "DELETE FROM steps WHERE global_step > 64; DELETE FROM epochs WHERE epoch > 1;");
        // Another store's run 1, trained longer (its checkpoint is newer), planted beside it.
        const QString other = dir.filePath("other.db");
        QCOMPARE(traindeck({"train", path, "--db", other, "--epochs", "4"}).code, 0);
        auto otherRows = (*td::RunStore::open(other.toStdString()))->checkpoints(1);
        QVERIFY(otherRows.ok() && !otherRows->empty());
        const std::string planted = (fs::path(newest).parent_path() / "run-128.tdckpt").string();
        fs::copy_file(otherRows->front().path, planted);

        Run r = traindeck({"train", "--resume", "1", "--db", db, "--epochs", "4", "--plain"});
        QVERIFY2(r.code == 0, qPrintable(r.err + r.out));
        QVERIFY2(r.out.contains("refused " + QString::fromStdString(planted) +
                                ": belongs to run 1 of another run store"),
                 qPrintable(r.out));
        if (rowsStored) {
            QVERIFY2(r.out.contains("using " + QString::fromStdString(newest) +
                                    " (global step 96): written, but the process ended before "
                                    "the store registered it"),
                     qPrintable(r.out));
            QVERIFY2(r.out.contains("Epoch 4/4") && !r.out.contains("Epoch 3/4"),
                     qPrintable(r.out));
        } else {
            QVERIFY2(r.out.contains("refused " + QString::fromStdString(newest) +
                                    ": the store lacks the rows of the steps up to its global "
                                    "step 96"),
                     qPrintable(r.out));
            QVERIFY2(r.out.contains("Epoch 3/4"), qPrintable(r.out));
        }
        QCOMPARE(runStatus(db, 1), std::string("completed"));
    }
}

// JSON nested 100,000 deep crashed every reader; now each says where and what the limit is.
void TestCliFaults::deepJsonRefused() {
    QTemporaryDir dir;
    const std::string deep = std::string(100000, '[') + std::string(100000, ']');
    const QString json = dir.filePath("deep.json");
    std::ofstream(json.toStdString())
        << "{\"description\":" << deep << ",\"format\":\"traindeck-project\",\"name\":\"x\"}";
    Run s = traindeck({"summary", json});
    QCOMPARE(s.code, 2);
    QVERIFY2(s.err.contains("deep.json: description[0][0]") &&
                 s.err.contains("nested deeper than 256 levels"),
             qPrintable(s.err));
    Run t = traindeck({"train", json, "--db", dir.filePath("r.db")});
    QCOMPARE(t.code, 2);
    QVERIFY2(t.err.contains("nested deeper than 256 levels"), qPrintable(t.err));

    auto zip = td::zipArchiveBytes(
        {{"metadata.json", "{\"keras_version\": \"3.5.0\"}"},
         {"config.json", "{\"a\":" + deep + ",\"class_name\":\"Sequential\"}"}});
    QVERIFY(zip.ok());
    const QString keras = dir.filePath("deep.keras");
    std::ofstream(keras.toStdString(), std::ios::binary) << *zip;
    for (const QStringList& args :
         {QStringList{"import", keras, "-o", dir.filePath("x.json")},
          QStringList{"predict", keras, dir.filePath("x.npy")}, QStringList{"summary", keras}}) {
        Run r = traindeck(args);
        QVERIFY2(r.code == 2, qPrintable(args.join(' ') + ": " + r.err));
        QVERIFY2(r.err.contains("deep.keras: config.json: a[0][0]") &&
                     r.err.contains("nested deeper than 256 levels"),
                 qPrintable(r.err));
    }
}

// A store on a read-only folder or mount: listing, showing and exporting work; what must write
// says the store is read-only; the file is not changed. As root, the commands run as nobody
// (root writes anywhere).
void TestCliFaults::readOnlyStore() {
    QStringList prefix;
    if (::geteuid() == 0) {
        const QString setpriv = QStandardPaths::findExecutable("setpriv");
        if (setpriv.isEmpty()) QSKIP("running as root without setpriv: no read-only store");
        prefix = {setpriv, "--reuid=65534", "--regid=65534", "--clear-groups"};
    }
    QTemporaryDir dir;
    QVERIFY(QDir(dir.path()).mkpath("ro") && QDir(dir.path()).mkpath("out"));
    writeBlobs(dir.filePath("a.json"), [](QJsonObject& p) { setTraining(p, "epochs", 1); });
    const QString db = dir.filePath("ro/a.db");
    QCOMPARE(traindeck({"train", dir.filePath("a.json"), "--db", db, "--run-name", "A"}).code, 0);
    // As a TrainDeck before run idle times (schema 6) left it: read-only, it cannot be migrated,
    // and is read as it is.
    sql(db.toStdString(), "ALTER TABLE runs DROP COLUMN idle_ms; PRAGMA user_version = 6;");
    for (const QString& d : {dir.path(), dir.filePath("out")})
        QVERIFY(QFile::setPermissions(d, QFileDevice::ReadOwner | QFileDevice::WriteOwner |
                                             QFileDevice::ExeOwner | QFileDevice::ReadOther |
                                             QFileDevice::ExeOther | QFileDevice::WriteOther |
                                             QFileDevice::ReadGroup | QFileDevice::ExeGroup));
    QVERIFY(QFile::setPermissions(dir.filePath("a.json"),
                                  QFileDevice::ReadOwner | QFileDevice::ReadOther));
    for (const auto& e : fs::recursive_directory_iterator(dir.filePath("ro").toStdString()))
        fs::permissions(e.path(), e.is_directory()
                                      ? fs::perms::owner_read | fs::perms::owner_exec |
                                            fs::perms::others_read | fs::perms::others_exec
                                      : fs::perms::owner_read | fs::perms::others_read);
    fs::permissions(dir.filePath("ro").toStdString(),
                    fs::perms::owner_read | fs::perms::owner_exec | fs::perms::others_read |
                        fs::perms::others_exec);
    const std::string before = [&] {
        std::ifstream f(db.toStdString(), std::ios::binary);
        return std::string(std::istreambuf_iterator<char>(f), {});
    }();
    auto as = [&](const QStringList& args) {
        QProcess p;
        p.start(prefix.isEmpty() ? QString(td::dev::kBinary) : prefix[0],
                (prefix.isEmpty() ? QStringList{} : prefix.mid(1) + QStringList{td::dev::kBinary}) +
                    args);
        p.waitForFinished(120000);
        return Run{p.exitStatus() == QProcess::NormalExit ? p.exitCode() : -1,
                   QString::fromUtf8(p.readAllStandardOutput()),
                   QString::fromUtf8(p.readAllStandardError())};
    };
    Run list = as({"runs", "--db", db, "--json"});
    QVERIFY2(list.code == 0 && list.out.contains("\"name\": \"A\""), qPrintable(list.err));
    Run show = as({"show", "A", "--db", db});
    QVERIFY2(show.code == 0 && show.out.contains("Run 1: A"), qPrintable(show.err));
    Run exported = as({"export", "A", "--db", db, "-o", dir.filePath("out/A.keras")});
    QVERIFY2(exported.code == 0, qPrintable(exported.err));
    QVERIFY(QFile::exists(dir.filePath("out/A.keras")));
    Run train = as({"train", dir.filePath("a.json"), "--db", db});
    QVERIFY(train.code != 0);
    QVERIFY2(train.err.contains("the run store is read-only"), qPrintable(train.err));
    Run resume = as({"train", "--resume", "A", "--db", db});
    QCOMPARE(resume.code, 2);
    QVERIFY2(resume.err.contains("the run store is read-only"), qPrintable(resume.err));
    Run del = as({"runs", "delete", "A", "--db", db});
    QVERIFY(del.code > 0);
    QVERIFY2(del.err.contains("the run store is read-only"), qPrintable(del.err));
    std::ifstream f(db.toStdString(), std::ios::binary);
    QVERIFY(std::string(std::istreambuf_iterator<char>(f), {}) == before);
    fs::permissions(dir.filePath("ro").toStdString(), fs::perms::owner_all);
}

void TestCliFaults::messages_data() {
    QTest::addColumn<QStringList>("args");
    QTest::addColumn<int>("code");
    QTest::addColumn<QString>("expected");  // in stderr, or stdout for a success
    const QString d = QDir::temp().filePath(
        QString("traindeck-faults-%1").arg(QCoreApplication::applicationPid()));
    QDir().mkpath(d);
    // Fixtures: a trained run and its model, float labels, odd and NaN prediction input.
    writeBlobs(d + "/a.json", [](QJsonObject& p) { setTraining(p, "epochs", 1); });
    if (!QFile::exists(d + "/A.keras")) {
        traindeck({"train", d + "/a.json", "--db", d + "/a.db", "--run-name", "A"});
        traindeck({"export", "A", "--db", d + "/a.db", "-o", d + "/A.keras"});
    }
    QString ckpt;
    for (const auto& e : fs::recursive_directory_iterator((d + "/checkpoints").toStdString()))
        if (e.path().extension() == ".tdckpt") ckpt = QString::fromStdString(e.path().string());
    std::vector<float> x(64 * 16, 0.5f), y(64, 1.5f);
    writeNpy(d + "/x.npy", {64, 16}, x);
    writeNpy(d + "/y.npy", {64}, y);
    writeBlobs(d + "/npy.json", [](QJsonObject& p) {
        QJsonObject data = p["data"].toObject();
        data["source"] = QJsonObject{{"type", "npy"}, {"train_x", "x.npy"}, {"train_y", "y.npy"}};
        p["data"] = data;
    });
    writeNpy(d + "/square.npy", {4, 4, 4}, std::vector<float>(64, 0.25f));
    std::vector<float> nan(4 * 16, 0.25f);
    nan[16 + 3] = std::nanf("");
    writeNpy(d + "/nan.npy", {4, 16}, nan);
    {
        QFile in(d + "/a.json");
        in.open(QIODevice::ReadOnly);
        QString text = QString::fromUtf8(in.readAll());
        text.replace("\"learning_rate\": 0.05", "\"learning_rate\": 1e999");
        QFile out(d + "/lr.json");
        out.open(QIODevice::WriteOnly);
        out.write(text.toUtf8());
    }
    const QString db = d + "/m.db";

    QTest::newRow("float labels in NPY")
        << QStringList{"train", d + "/npy.json", "--db", db} << 2
        << "/y.npy: the labels are floating-point (f32 [64,1], the first is 1.500000), but the "
           "loss expects integer class ids 0..3";
    QTest::newRow("learning_rate 1e999")
        << QStringList{"summary", d + "/lr.json"} << 2
        << "lr.json: training.optimizer.config.learning_rate: the number 1e999 is out of range";
    QTest::newRow("--batch-size 0")
        << QStringList{"train", d + "/a.json", "--batch-size", "0", "--db", db} << 2
        << "--batch-size: expected a whole number of at least 1, got '0'";
    QTest::newRow("summary of a .keras file")
        << QStringList{"summary", d + "/A.keras"} << 0 << "Total params: 676";
    QTest::newRow("export --weights of a checkpoint")
        << QStringList{"export", "--project", d + "/a.json", "--weights",
                       ckpt,     "-o",        d + "/w.keras"}
        << 2
        << ": --weights takes a Keras 3 .keras file (its weights are matched to the project's "
           "layers by name); this is a TrainDeck checkpoint";
    QTest::newRow("too long --run-name")
        << QStringList{"train", d + "/a.json", "--run-name", QString(300, 'n'), "--db", db} << 2
        << "traindeck: error: --run-name: is 300 characters long";
    QTest::newRow("predict of another shape")
        << QStringList{"predict", d + "/A.keras", d + "/square.npy"} << 0
        << "warning: " + d +
               "/square.npy: samples of shape [4,4] are read as the model's input shape [16]";
    QTest::newRow("predict of NaN input")
        << QStringList{"predict", d + "/A.keras", d + "/nan.npy"} << 2
        << "nan.npy: sample 1, value 3 is NaN (expected finite features, as training does)";
}

void TestCliFaults::messages() {
    QFETCH(QStringList, args);
    QFETCH(int, code);
    QFETCH(QString, expected);
    Run r = traindeck(args);
    QVERIFY2(r.code == code, qPrintable(QString::number(r.code) + ": " + r.err));
    QVERIFY2((r.err + r.out).contains(expected), qPrintable(r.err + r.out));
}

QTEST_GUILESS_MAIN(TestCliFaults)
#include "test_cli_faults.moc"

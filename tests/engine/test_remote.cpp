// The CLI over a real SSH connection, as the desktop app uses it (engine/api/remote.h): Debian's
// sshd started by the test on a free port of 127.0.0.1 with its own host key and an authorized
// key of a temporary key pair (skipped, with the reason, where it cannot start). Over it: runs
// --json, follow of a live run compared with the store, a follow whose connection is killed and
// continued from its cursor with nothing missing or twice, stop, train - --detach with the
// project sent on standard input, export to standard output; hostile run names that would run
// commands if they were not quoted; a host key that is not the server's, refused and explained.
#include <signal.h>
#include <unistd.h>

#include <QDir>
#include <QFile>
#include <QJsonArray>
#include <QJsonDocument>
#include <QJsonObject>
#include <QProcess>
#include <QSet>
#include <QTemporaryDir>
#include <QtTest>
#include <memory>

#include "engine/api/remote.h"
#include "engine/store/run_store.h"
#include "tests/engine/cli_process.h"
#include "tests/engine/ssh_server.h"

using td::api::RemoteServer;
using td::test::Run;
using td::test::traindeck;

namespace {

using td::test::runSsh;
using td::test::Ssh;

QStringList toArgs(const std::vector<std::string>& argv) {
    return td::test::sshArgs(argv);
}

}  // namespace

class TestRemote : public QObject {
    Q_OBJECT

  private slots:
    void initTestCase();
    void cleanupTestCase();
    void quoting();
    void runsAndShowOverSsh();
    void followLiveRunOverSsh();
    void steerAndDetachOverSsh();
    void exportToStandardOutputOverSsh();
    void unknownHostKeyIsRefused();
    void followDecoderRefusesWhatItCannotRead();

  private:
    RemoteServer server() const { return sshd_.server(db_); }
    td::test::SshServer sshd_;
    QTemporaryDir dir_;  // the store and its logs
    int port_ = 0;
    QString skip_;
    QString db_;
};

void TestRemote::initTestCase() {
    db_ = dir_.filePath("runs.db");
    sshd_.start();
    skip_ = sshd_.skip();
    port_ = sshd_.port();
}

void TestRemote::cleanupTestCase() {
    sshd_.stop();
}

// Every word survives the shell as it is: /bin/sh prints the quoted words back unchanged.
void TestRemote::quoting() {
    const std::vector<std::string> words{"plain", "two words", "it's", "$(touch /tmp/td-pwned)",
                                         "`id`",  "a\nb",      "'",    "''",
                                         "\\",    "*",         ""};
    std::string script = "printf '%s\\0'";
    for (const std::string& w : words) script += " " + td::api::shellQuote(w);
    QProcess sh;
    sh.start("/bin/sh", {"-c", QString::fromStdString(script)});
    QVERIFY(sh.waitForFinished(10000));
    const QList<QByteArray> got = sh.readAllStandardOutput().split('\0');
    QCOMPARE(got.size(), static_cast<int>(words.size()) + 1);
    for (size_t i = 0; i < words.size(); ++i)
        QCOMPARE(got[static_cast<int>(i)].toStdString(), words[i]);
    QVERIFY(!QFile::exists("/tmp/td-pwned"));
    RemoteServer bad;
    bad.host = "-oProxyCommand=touch x";
    QVERIFY(!td::api::checkRemoteServer(bad).ok());
    bad.host = "ok";
    bad.store = "runs\n.db";
    QVERIFY(!td::api::checkRemoteServer(bad).ok());
}

// Runs and a run's details over SSH, by names that would run commands unquoted.
void TestRemote::runsAndShowOverSsh() {
    if (!skip_.isEmpty()) QSKIP(qPrintable(skip_));
    const QString projectPath = dir_.filePath("blobs.json");
    QFile p(projectPath);
    QVERIFY(p.open(QIODevice::WriteOnly));
    p.write(td::test::blobsProject(1));
    p.close();
    const QString pwned = dir_.filePath("pwned");
    const QStringList names{"it's $(touch " + pwned + ")", "`touch " + pwned + "`; echo x",
                            "plain"};
    for (const QString& n : names)
        QCOMPARE(traindeck({"train", projectPath, "--db", db_, "--run-name", n}).code, 0);
    const Ssh list = runSsh(server(), {"runs", "--json"});
    QVERIFY2(list.code == 0, qPrintable(list.err));
    const QJsonArray runs = QJsonDocument::fromJson(list.out).array();
    QCOMPARE(runs.size(), names.size());
    for (const QString& n : names) {
        const Ssh show = runSsh(server(), {"show", n.toStdString(), "--json"});
        QVERIFY2(show.code == 0, qPrintable(show.err));
        QCOMPARE(QJsonDocument::fromJson(show.out).object()["name"].toString(), n);
    }
    QVERIFY(!QFile::exists(pwned));
    // A failure there is traindeck's own message.
    const Ssh missing = runSsh(server(), {"show", "no such run"});
    QVERIFY(missing.code != 0);
    const std::string why =
        td::api::explainRemoteFailure(server(), missing.code, missing.err.toStdString());
    QVERIFY2(QString::fromStdString(why).contains("no such run"), why.c_str());
    RemoteServer nowhere = server();
    nowhere.traindeck = "/nonexistent/traindeck";
    const Ssh none = runSsh(nowhere, {"runs"});
    QVERIFY(none.code != 0);
    const std::string noTd =
        td::api::explainRemoteFailure(nowhere, none.code, none.err.toStdString());
    QVERIFY2(QString::fromStdString(noTd).contains("no traindeck at"), noTd.c_str());
}

// follow of a live run over SSH: the rows are the store's; a connection killed mid-follow and
// continued from the last line's cursor loses and repeats nothing.
void TestRemote::followLiveRunOverSsh() {
    if (!skip_.isEmpty()) QSKIP(qPrintable(skip_));
    const Ssh started = runSsh(server(), {"train", "-", "--detach", "--run-name", "live"},
                               td::test::blobsProject(300));
    QVERIFY2(started.code == 0, qPrintable(started.err));
    const std::string id = started.out.trimmed().toStdString();
    QProcess cut;
    cut.start("ssh", toArgs(td::api::sshCommand(server(), {"follow", id, "--poll-ms", "50"})));
    QVERIFY(cut.waitForStarted());
    QByteArray first;
    while (first.count('\n') < 200 && cut.waitForReadyRead(30000)) first += cut.readAll();
    cut.kill();  // the connection drops
    cut.waitForFinished();
    QList<QByteArray> firstLines = first.split('\n').mid(0, 200);
    const QString cursor = QJsonDocument::fromJson(firstLines.last()).object()["cursor"].toString();
    QVERIFY2(!cursor.isEmpty(), firstLines.last().constData());
    const Ssh rest = runSsh(server(), {"follow", id, "--from", cursor.toStdString()});
    QVERIFY2(rest.code == 0, qPrintable(rest.err));
    auto steps = [](const QList<QByteArray>& lines) {
        QStringList out;
        for (const QByteArray& l : lines) {
            const QJsonObject o = QJsonDocument::fromJson(l).object();
            if (o["type"].toString() == "step")
                out << QString::number(o["global_step"].toInteger());
        }
        return out;
    };
    const QStringList followed = steps(firstLines) + steps(rest.out.split('\n'));
    auto store = td::RunStore::open(db_.toStdString());
    QVERIFY(store.ok());
    auto stored = (*store)->steps(std::stoll(id));
    QVERIFY(stored.ok());
    QStringList want;
    for (const td::StepRow& s : *stored) want << QString::number(s.globalStep);
    QCOMPARE(followed, want);
    // The app's reading of the same lines (FollowDecoder): one RunStarted over both
    // connections, every stored step as the StepMetrics it was recorded from, the epochs, and a
    // RunFinished with the run's status and final metrics.
    td::api::FollowDecoder decoder;
    std::vector<td::Event> events;
    for (const QByteArray& l : firstLines) QVERIFY(decoder.feed(l.toStdString(), events).ok());
    QCOMPARE(QString::fromStdString(decoder.cursor()), cursor);
    decoder.reconnecting();
    for (const QByteArray& l : rest.out.split('\n')) {
        const td::Status st = decoder.feed(l.toStdString(), events);
        QVERIFY2(st.ok(), st.error().c_str());
    }
    QVERIFY(decoder.finished());
    auto epochs = (*store)->epochs(std::stoll(id));
    auto run = (*store)->getRun(std::stoll(id));
    QVERIFY(epochs.ok() && run.ok());
    int runStarts = 0;
    size_t stepAt = 0, epochAt = 0;
    for (const td::Event& e : events) {
        if (auto* rs = std::get_if<td::RunStarted>(&e)) {
            ++runStarts;
            QCOMPARE(rs->runName, std::string("live"));
            QCOMPARE(rs->epochs, 300);
            QVERIFY(rs->stepsPerEpoch > 0 && rs->batchSize > 0 && !rs->devices.empty());
        } else if (auto* sm = std::get_if<td::StepMetrics>(&e)) {
            QVERIFY(stepAt < stored->size());
            const td::StepRow& row = (*stored)[stepAt++];
            QCOMPARE(sm->globalStep, row.globalStep);
            QCOMPARE(sm->metrics.at("loss"), row.metrics.at("loss"));
            QCOMPARE(sm->samplesPerSecond, row.metrics.at("samples_per_s"));
        } else if (auto* em = std::get_if<td::EpochMetrics>(&e)) {
            QVERIFY(epochAt < epochs->size());
            const td::EpochRow& row = (*epochs)[epochAt++];
            QCOMPARE(em->epoch, row.epoch);
            QCOMPARE(em->metrics.at("loss"), row.metrics.at("loss"));
        } else if (auto* f = std::get_if<td::RunFinished>(&e)) {
            QCOMPARE(f->status, td::RunStatus::Completed);
            QVERIFY(f->finalMetrics.count("loss") == 1);
        }
    }
    QCOMPARE(runStarts, 1);
    QCOMPARE(stepAt, stored->size());
    QCOMPARE(epochAt, epochs->size());
    QVERIFY(rest.out.trimmed().endsWith("}"));
    QCOMPARE(QJsonDocument::fromJson(rest.out.trimmed().split('\n').last())
                 .object()["status"]
                 .toString(),
             QString("completed"));
}

// A run started there with the project sent on standard input, detached; stopped from here.
void TestRemote::steerAndDetachOverSsh() {
    if (!skip_.isEmpty()) QSKIP(qPrintable(skip_));
    const Ssh started = runSsh(server(), {"train", "-", "--detach", "--run-name", "to stop"},
                               td::test::blobsProject(100000));
    QVERIFY2(started.code == 0, qPrintable(started.err));
    const std::string id = started.out.trimmed().toStdString();
    // A failing check must not leave the detached run training behind.
    struct EndRun {
        QString control;
        ~EndRun() {
            QFile f(control);
            if (f.open(QIODevice::ReadOnly)) ::kill(f.readLine().trimmed().toInt(), SIGKILL);
        }
    } endRun{dir_.filePath("logs/runs.db-run-" + QString::fromStdString(id) + ".control")};
    QTRY_VERIFY_WITH_TIMEOUT(
        runSsh(server(), {"show", id, "--json"}).out.contains("\"epochs\": [\n"), 30000);
    const Ssh stop = runSsh(server(), {"stop", id});
    QVERIFY2(stop.code == 0, qPrintable(stop.err));
    QTRY_VERIFY_WITH_TIMEOUT(QJsonDocument::fromJson(runSsh(server(), {"show", id, "--json"}).out)
                                     .object()["status"]
                                     .toString() == "stopped",
                             30000);
}

void TestRemote::exportToStandardOutputOverSsh() {
    if (!skip_.isEmpty()) QSKIP(qPrintable(skip_));
    const QString local = dir_.filePath("plain.keras");
    QCOMPARE(traindeck({"export", "plain", "--db", db_, "-o", local}).code, 0);
    const Ssh e = runSsh(server(), {"export", "plain", "-o", "-", "--format", "keras"});
    QVERIFY2(e.code == 0, qPrintable(e.err));
    QFile f(local);
    QVERIFY(f.open(QIODevice::ReadOnly));
    QVERIFY(e.out == f.readAll());
}

// A known_hosts entry with another key for the server: ssh refuses, TrainDeck says why.
void TestRemote::unknownHostKeyIsRefused() {
    if (!skip_.isEmpty()) QSKIP(qPrintable(skip_));
    QFile known(dir_.filePath("wrong_known_hosts"));
    QFile other(sshd_.dir() + "/other_host_key.pub");
    QVERIFY(known.open(QIODevice::WriteOnly) && other.open(QIODevice::ReadOnly));
    known.write(QString("[127.0.0.1]:%1 ").arg(port_).toUtf8() + other.readAll());
    known.close();
    RemoteServer s = server();
    s.controlDir.clear();  // a new connection, not the shared one
    s.sshOptions[5] = "UserKnownHostsFile=" + known.fileName().toStdString();
    const Ssh r = runSsh(s, {"runs"});
    QCOMPARE(r.code, 255);
    const std::string why = td::api::explainRemoteFailure(s, r.code, r.err.toStdString());
    QVERIFY2(QString::fromStdString(why).contains("host key"), why.c_str());
    // No key at all for it: refused too, never added.
    QVERIFY(known.open(QIODevice::WriteOnly));
    known.close();
    const Ssh unknown = runSsh(s, {"runs"});
    QCOMPARE(unknown.code, 255);
    QVERIFY2(QString::fromStdString(
                 td::api::explainRemoteFailure(s, unknown.code, unknown.err.toStdString()))
                 .contains("not known here"),
             qPrintable(unknown.err));
    QVERIFY(known.open(QIODevice::ReadOnly));
    QVERIFY(known.readAll().isEmpty());
}

QTEST_GUILESS_MAIN(TestRemote)
// Lines the app cannot take end the follow with a message saying what to do.
void TestRemote::followDecoderRefusesWhatItCannotRead() {
    std::vector<td::Event> events;
    td::api::FollowDecoder notHello;
    td::Status st = notHello.feed(R"({"type":"step","global_step":1})", events);
    QVERIFY(!st.ok() && st.error().find("hello") != std::string::npos);
    td::api::FollowDecoder newer;
    st = newer.feed(
        R"({"type":"hello","traindeck":"9.0","protocol":2,"run":{"id":1,"status":"running"}})",
        events);
    QVERIFY2(!st.ok() && st.error().find("protocol 2") != std::string::npos &&
                 st.error().find("same TrainDeck release") != std::string::npos,
             st.error().c_str());
    td::api::FollowDecoder garbage;
    QVERIFY(!garbage.feed("Welcome to the server!", events).ok());
    QVERIFY(events.empty());
    // A resumed stream's hello for another run is refused.
    td::api::FollowDecoder d;
    QVERIFY(
        d.feed(
             R"({"type":"hello","traindeck":"x","protocol":1,"run":{"id":4,"status":"running","devices":"cpu:0, cpu:1","config":{"epochs":3,"steps_per_epoch":10,"batch_size":8}}})",
             events)
            .ok());
    QCOMPARE(events.size(), size_t(1));
    const auto& rs = std::get<td::RunStarted>(events[0]);
    QCOMPARE(rs.devices, (std::vector<std::string>{"cpu:0", "cpu:1"}));
    QCOMPARE(rs.stepsPerEpoch, int64_t(10));
    d.reconnecting();
    QVERIFY(
        !d.feed(
              R"({"type":"hello","traindeck":"x","protocol":1,"run":{"id":5,"status":"running"}})",
              events)
             .ok());
    QVERIFY(!td::api::runsFromJson("[{\"name\": \"no id\"}]").ok());
}

#include "test_remote.moc"

// The desktop app watching and steering runs on a server over SSH (File > Connect to Server),
// offscreen, against a real sshd started by the test (tests/engine/ssh_server.h; skipped with the
// reason where it cannot start): the server's runs listed beside the local store, a run started
// there followed live in the Monitor (every step the server stores drawn once, in order, through
// a connection killed on purpose), Pause, Continue and Stop acting there, Export model bringing
// the file back, Start on Server sending the open project, Compare of a remote run with a local
// one, and a host key that is not the server's explained. Prints the latency from a step's row
// stored on the server to its point drawn here (p50, p99).
#include <QAction>
#include <QComboBox>
#include <QElapsedTimer>
#include <QFile>
#include <QFileInfo>
#include <QJsonArray>
#include <QJsonDocument>
#include <QJsonObject>
#include <QLabel>
#include <QLineEdit>
#include <QStandardPaths>
#include <QTemporaryDir>
#include <QTest>
#include <algorithm>
#include <chrono>
#include <set>

#include "engine/api/runs.h"
#include "tests/engine/cli_process.h"
#include "tests/engine/ssh_server.h"
#include "ui/chart_widget.h"
#include "ui/config_diff.h"
#include "ui/main_window.h"
#include "ui/monitor_panel.h"
#include "ui/project_controller.h"
#include "ui/remote_link.h"
#include "ui/run_controller.h"
#include "ui/runs_panel.h"
#include "ui/runs_table_model.h"
#include "ui/servers_panel.h"

using namespace td;
using namespace td::ui;

namespace {

int64_t nowMs() {
    return std::chrono::duration_cast<std::chrono::milliseconds>(
               std::chrono::system_clock::now().time_since_epoch())
        .count();
}

}  // namespace

class TestUiRemote : public QObject {
    Q_OBJECT
  private slots:
    void initTestCase();
    void cleanupTestCase();
    void watchAndSteerARemoteRun();
    void startOnServerExportAndCompare();
    void wrongHostKeyIsExplained();

  private:
    std::unique_ptr<MainWindow> makeWindow();
    td::test::SshServer sshd_;
    QTemporaryDir dir_;
    QString remoteDb_, localDb_;
};

void TestUiRemote::initTestCase() {
    QStandardPaths::setTestModeEnabled(true);
    QCoreApplication::setOrganizationName("TrainDeckTest");
    QCoreApplication::setApplicationName("test_ui_remote");
    remoteDb_ = dir_.filePath("server/runs.db");
    localDb_ = dir_.filePath("local/runs.db");
    QDir().mkpath(dir_.filePath("server"));
    QDir().mkpath(dir_.filePath("local"));
    sshd_.start();
}

void TestUiRemote::cleanupTestCase() {
    sshd_.stop();
}

std::unique_ptr<MainWindow> TestUiRemote::makeWindow() {
    auto w = std::make_unique<MainWindow>();
    w->setInteractive(false);
    QString error;
    if (!w->openDatabase(localDb_, &error)) qWarning("openDatabase: %s", qPrintable(error));
    w->show();
    return w;
}

void TestUiRemote::watchAndSteerARemoteRun() {
    if (!sshd_.skip().isEmpty()) QSKIP(qPrintable(sshd_.skip()));
    const td::api::RemoteServer server = sshd_.server(remoteDb_, false);
    // A long run on the server, started there as a user of the CLI would.
    const td::test::Ssh started = td::test::runSsh(
        sshd_.server(remoteDb_), {"train", "-", "--detach", "--run-name", "remote $(id) 'run'"},
        td::test::blobsProject(100000, true));
    QVERIFY2(started.code == 0, qPrintable(started.err));
    const int64_t id = started.out.trimmed().toLongLong();
    QVERIFY(id > 0);
    struct EndRun {  // a failing check must not leave the run training behind
        td::api::RemoteServer s;
        int64_t id;
        ~EndRun() { td::test::runSsh(s, {"stop", std::to_string(id)}); }
    } endRun{sshd_.server(remoteDb_), id};

    auto w = makeWindow();
    QString error;
    RemoteRunsPage* page = w->connectServer(server, &error);
    QVERIFY2(page, qPrintable(error));
    QCOMPARE(w->runSources()->count(), 2);
    QCOMPARE(w->runSources()->currentWidget(), page);
    QTRY_VERIFY_WITH_TIMEOUT(page->model()->rowOf(id) >= 0, 20000);
    const td::RunRecord* listed = page->model()->runById(id);
    QCOMPARE(QString::fromStdString(listed->name), QString("remote $(id) 'run'"));
    QCOMPARE(QString::fromStdString(listed->status), QString("running"));
    QVERIFY(page->stateLabel()->text().startsWith("Connected"));

    // Watch: the Monitor draws every step the server stores, once and in order.
    RunController* rc = w->runController();
    std::vector<int64_t> drawn;
    // Latency of the steps stored while watched over a steady connection (not the rows
    // stored before the watch began, nor those around the dropped connection).
    std::vector<double> latencyMs;
    int64_t measureFrom = 0;
    bool measuring = true;
    connect(rc, &RunController::eventsArrived, this, [&](const EventBatch& b) {
        const int64_t now = nowMs();
        for (const td::StepMetrics& s : b.steps) {
            drawn.push_back(s.globalStep);
            if (RemoteFollow* f = w->remoteFollow(); f && measuring)
                if (const int64_t at = f->storedAtMs(s.globalStep); at > measureFrom)
                    latencyMs.push_back(static_cast<double>(now - at));
        }
    });
    std::vector<td::RunFinished> finished;
    connect(rc, &RunController::runFinished, this,
            [&](const td::RunFinished& r) { finished.push_back(r); });
    page->selectRun(id);
    measureFrom = nowMs() + 1000;  // the stored rows sent first have waited since they were stored
    QVERIFY2(w->watchRemoteRun(page, id, &error), qPrintable(error));
    QCOMPARE(w->tabs()->currentIndex(), int(MainWindow::MonitorTab));
    QVERIFY(rc->following());
    QTRY_VERIFY_WITH_TIMEOUT(w->monitorPanel()->lossChart()->pointCount(0) > 20, 30000);
    // 300 steps, or what 30 s bring (a slow build: sanitizers).
    QElapsedTimer measured;
    measured.start();
    QTRY_VERIFY_WITH_TIMEOUT(
        latencyMs.size() >= 300 || (measured.elapsed() > 30000 && latencyMs.size() >= 20), 120000);
    measuring = false;
    // A second Watch while one is shown is refused with the reason.
    QVERIFY(!w->watchRemoteRun(page, id, &error));
    QVERIFY(error.contains("watching run"));

    // The connection drops (the network, a suspended laptop): it is made again and the charts
    // go on from the last step seen.
    const size_t before = drawn.size();
    w->remoteFollow()->dropConnection();
    QTRY_VERIFY_WITH_TIMEOUT(w->remoteFollow()->reconnects() >= 1, 10000);
    QTRY_VERIFY_WITH_TIMEOUT(drawn.size() > before + 20, 30000);

    // Pause there: the server stores no new step while paused; Continue: it goes on.
    rc->pauseAction()->trigger();
    QCOMPARE(rc->state(), RunController::State::Paused);
    // The pause reaches the run at its next step, and the rows stored before it arrive: wait
    // until nothing new came for 2 s, then nothing more comes.
    size_t paused = drawn.size();
    for (int i = 0; i < 15; ++i) {
        QTest::qWait(2000);
        if (drawn.size() == paused) break;
        paused = drawn.size();
    }
    QTest::qWait(2000);
    QVERIFY2(drawn.size() == paused, qPrintable(QString("%1 -> %2").arg(paused).arg(drawn.size())));
    rc->pauseAction()->trigger();
    QCOMPARE(rc->state(), RunController::State::Running);
    QTRY_VERIFY_WITH_TIMEOUT(drawn.size() > paused + 10, 30000);

    // Stop there: the run ends stopped, and the Monitor with it.
    rc->stopAction()->trigger();
    QTRY_VERIFY_WITH_TIMEOUT(finished.size() == 1, 60000);
    QCOMPARE(finished[0].status, td::RunStatus::Stopped);
    QTRY_COMPARE_WITH_TIMEOUT(rc->state(), RunController::State::Idle, 5000);

    // Every stored step drawn once, in order, across the dropped connection.
    auto catalog = td::api::RunCatalog::open(remoteDb_.toStdString());
    QVERIFY(catalog.ok());
    auto steps = (*catalog)->steps(id);
    QVERIFY(steps.ok());
    std::vector<int64_t> want;
    for (const td::StepRow& s : *steps) want.push_back(s.globalStep);
    QCOMPARE(drawn, want);
    QTRY_VERIFY_WITH_TIMEOUT(
        page->model()->runById(id) && page->model()->runById(id)->status == "stopped", 10000);

    std::sort(latencyMs.begin(), latencyMs.end());
    const auto at = [&](double q) {
        return latencyMs[std::min(latencyMs.size() - 1,
                                  static_cast<size_t>(q * static_cast<double>(latencyMs.size())))];
    };
    std::printf(
        "stored-to-drawn latency over SSH: p50 %.0f ms, p99 %.0f ms, max %.0f ms (%zu "
        "steps, follow's default polling, a 40 ms Monitor drain)\n",
        at(0.5), at(0.99), latencyMs.back(), latencyMs.size());
}

void TestUiRemote::startOnServerExportAndCompare() {
    if (!sshd_.skip().isEmpty()) QSKIP(qPrintable(sshd_.skip()));
    auto w = makeWindow();
    // The open project, sent to the server and started there.
    // Mirrored over two CPU replicas: the per-replica charts are fed from the server's rows.
    QJsonObject project = QJsonDocument::fromJson(td::test::blobsProject(2)).object();
    project["strategy"] = QJsonObject{{"type", "mirrored"}, {"replicas", 2}};
    QFile f(dir_.filePath("blobs.json"));
    QVERIFY(f.open(QIODevice::WriteOnly));
    f.write(QJsonDocument(project).toJson());
    f.close();
    QString error;
    QVERIFY2(w->openProject(f.fileName(), &error), qPrintable(error));
    RemoteRunsPage* page = w->connectServer(sshd_.server(remoteDb_), &error);
    QVERIFY2(page, qPrintable(error));
    int64_t id = 0;
    QString startError;
    std::vector<td::RunFinished> finished;
    connect(w->runController(), &RunController::runFinished, this,
            [&](const td::RunFinished& r) { finished.push_back(r); });
    w->startOnServer(page, [&](int64_t newId, const QString& e) {
        id = newId;
        startError = e;
    });
    QTRY_VERIFY_WITH_TIMEOUT(id > 0 || !startError.isEmpty(), 30000);
    QVERIFY2(startError.isEmpty(), qPrintable(startError));
    // Watched at once, to its end.
    QTRY_VERIFY_WITH_TIMEOUT(finished.size() == 1, 120000);
    QCOMPARE(finished[0].status, td::RunStatus::Completed);
    MonitorPanel* mon = w->monitorPanel();
    QVERIFY(mon->lossChart()->pointCount(1) == 2);  // both epochs drawn
    QCOMPARE(mon->replicaSelector()->count(), 3);   // the mean, then each replica
    for (const char* key : {"tp/0", "tp/1"}) {
        const int series = mon->seriesIndex(key);
        QVERIFY2(series >= 0 && mon->throughputChart()->pointCount(series) > 0, key);
    }
    const int wait1 = mon->seriesIndex("st/1/compute");
    QVERIFY(wait1 >= 0 && mon->stepTimeChart()->pointCount(wait1) > 0);

    // Export model: the file the server's store has for the run, here.
    const QString keras = dir_.filePath("remote.keras");
    QString exportError = "pending";
    page->exportModel(id, keras, [&](const QString& e) { exportError = e; });
    QTRY_VERIFY_WITH_TIMEOUT(exportError != "pending", 30000);
    QVERIFY2(exportError.isEmpty(), qPrintable(exportError));
    const td::test::Run local = td::test::traindeck(
        {"export", QString::number(id), "--db", remoteDb_, "-o", dir_.filePath("direct.keras")});
    QVERIFY2(local.code == 0, qPrintable(local.err));
    QFile a(keras), b(dir_.filePath("direct.keras"));
    QVERIFY(a.open(QIODevice::ReadOnly) && b.open(QIODevice::ReadOnly));
    QVERIFY(a.readAll() == b.readAll());
    QString missing = "pending";
    page->exportModel(999, dir_.filePath("none.keras"), [&](const QString& e) { missing = e; });
    QTRY_VERIFY_WITH_TIMEOUT(missing != "pending", 30000);
    QVERIFY2(missing.contains("999"), qPrintable(missing));
    QVERIFY(!QFile::exists(dir_.filePath("none.keras")));

    // Compare the remote run with a local run of the same project with other epochs.
    QVERIFY(td::test::traindeck({"train", f.fileName(), "--db", localDb_, "--epochs", "1"}).code ==
            0);
    w->runsPanel()->refresh();
    QTRY_VERIFY_WITH_TIMEOUT(w->runsPanel()->model()->rowCount() >= 1, 10000);
    const int64_t localId = w->runsPanel()->model()->run(0)->id;
    auto localRun = w->runsPanel()->catalog()->run(localId);
    QVERIFY(localRun.ok());
    std::vector<ConfigDiffRow> rows;
    QString compareError = "pending";
    page->compare(
        id, &*localRun, 0, [&](const td::RunRecord& r, const td::RunRecord& l, const QString& e) {
            compareError = e;
            rows = diffJsonConfigs(QString::fromStdString("{\"project\":" + r.projectJson +
                                                          ",\"effective\":" + r.configJson + "}"),
                                   QString::fromStdString("{\"project\":" + l.projectJson +
                                                          ",\"effective\":" + l.configJson + "}"));
        });
    QTRY_VERIFY_WITH_TIMEOUT(compareError != "pending", 30000);
    QVERIFY2(compareError.isEmpty(), qPrintable(compareError));
    std::set<QString> differing;
    for (const ConfigDiffRow& r : rows)
        if (r.differs) differing.insert(r.path);
    QVERIFY(differing.count("effective.epochs") == 1);
    QVERIFY(differing.count("project.model.config.name") == 0);
    QVERIFY(rows.size() > 20);
}

void TestUiRemote::wrongHostKeyIsExplained() {
    if (!sshd_.skip().isEmpty()) QSKIP(qPrintable(sshd_.skip()));
    QFile known(dir_.filePath("wrong_known_hosts"));
    QFile other(sshd_.dir() + "/other_host_key.pub");
    QVERIFY(known.open(QIODevice::WriteOnly) && other.open(QIODevice::ReadOnly));
    known.write(QString("[127.0.0.1]:%1 ").arg(sshd_.port()).toUtf8() + other.readAll());
    known.close();
    td::api::RemoteServer s = sshd_.server(remoteDb_, false);
    for (std::string& o : s.sshOptions)
        if (o.rfind("UserKnownHostsFile=", 0) == 0)
            o = "UserKnownHostsFile=" + known.fileName().toStdString();
    auto w = makeWindow();
    QString error;
    RemoteRunsPage* page = w->connectServer(s, &error);
    QVERIFY(page);
    QTRY_VERIFY_WITH_TIMEOUT(page->stateLabel()->text().contains("host key"), 20000);
    QVERIFY2(page->stateLabel()->text().contains("never accepts"),
             qPrintable(page->stateLabel()->text()));
    QCOMPARE(page->model()->rowCount(), 0);
    // A host ssh would read as an option is refused before anything runs.
    td::api::RemoteServer bad = s;
    bad.host = "-oProxyCommand=touch /tmp/td-pwned";
    QVERIFY(!w->connectServer(bad, &error));
    QVERIFY(error.contains("not a host"));
    w->disconnectServer(page);
    QTRY_COMPARE_WITH_TIMEOUT(w->runSources()->count(), 1, 5000);
    QVERIFY(!w->findChild<QAction*>("startOnServerAction")->isEnabled());
    // The dialog's fields are the server as ssh takes it; no password field anywhere.
    ConnectDialog dialog;
    dialog.setServer(s);
    const td::api::RemoteServer back = dialog.server();
    QCOMPARE(back.host, s.host);
    QCOMPARE(back.port, s.port);
    QCOMPARE(back.store, s.store);
    QCOMPARE(back.traindeck, s.traindeck);
    for (QLineEdit* e : dialog.findChildren<QLineEdit*>())
        QVERIFY(e->echoMode() == QLineEdit::Normal);
}

QTEST_MAIN(TestUiRemote)
#include "test_ui_remote.moc"

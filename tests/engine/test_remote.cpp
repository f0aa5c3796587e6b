// The CLI over a real SSH connection, as the desktop app uses it (engine/api/remote.h): Debian's
// sshd started by the test on a free port of 127.0.0.1 with its own host key and an authorized
// key of a temporary key pair (skipped, with the reason, where it cannot start). Over it: runs
// --json, follow of a live run compared with the store, a follow whose connection is killed and
// continued from its cursor with nothing missing or twice, stop, train - --detach with the
// project sent on standard input, export to standard output; hostile run names that would run
// commands if they were not quoted; a host key that is not the server's, refused and explained.
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
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

using td::api::RemoteServer;
using td::test::Run;
using td::test::traindeck;

namespace {

QStringList toArgs(const std::vector<std::string>& argv) {
    QStringList out;
    for (size_t i = 1; i < argv.size(); ++i) out << QString::fromStdString(argv[i]);
    return out;
}

struct Ssh {
    int code = -1;
    QByteArray out;
    QString err;
};

Ssh runSsh(const RemoteServer& s, const std::vector<std::string>& args,
           const QByteArray& input = {}, bool withDb = true) {
    QProcess p;
    p.start("ssh", toArgs(td::api::sshCommand(s, args, withDb)));
    if (!p.waitForStarted()) return {};
    if (!input.isEmpty()) p.write(input);
    p.closeWriteChannel();
    if (!p.waitForFinished(300000)) {
        p.kill();
        p.waitForFinished();
    }
    return {p.exitStatus() == QProcess::NormalExit ? p.exitCode() : -1, p.readAllStandardOutput(),
            QString::fromUtf8(p.readAllStandardError())};
}

// A TCP port of 127.0.0.1 free now (the kernel's pick).
int freePort() {
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0) return 0;
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof a;
    int port = 0;
    if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0 &&
        ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0)
        port = ntohs(a.sin_port);
    ::close(fd);
    return port;
}

bool run(const QString& program, const QStringList& args) {
    QProcess p;
    p.start(program, args);
    return p.waitForFinished(60000) && p.exitCode() == 0;
}

QString blobsProject(int epochs) {
    QFile f(td::test::project("synthetic_blobs.json"));
    if (!f.open(QIODevice::ReadOnly)) return {};
    QJsonObject p = QJsonDocument::fromJson(f.readAll()).object();
    QJsonObject training = p["training"].toObject();
    training["epochs"] = epochs;
    p["training"] = training;
    return QString::fromUtf8(QJsonDocument(p).toJson());
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

  private:
    RemoteServer server() const;
    QTemporaryDir dir_;
    std::unique_ptr<QProcess> sshd_;
    int port_ = 0;
    QString skip_;
    QString db_;
};

void TestRemote::initTestCase() {
    const QString sshd = "/usr/sbin/sshd";
    if (!QFile::exists(sshd)) {
        skip_ = "no /usr/sbin/sshd (installer/deps.sh --test installs openssh-server)";
        return;
    }
    if (QStandardPaths::findExecutable("ssh").isEmpty()) {
        skip_ = "no ssh client (openssh-client)";
        return;
    }
    const QString d = dir_.path();
    if (!run("ssh-keygen", {"-q", "-t", "ed25519", "-N", "", "-f", d + "/host_key"}) ||
        !run("ssh-keygen", {"-q", "-t", "ed25519", "-N", "", "-f", d + "/user_key"}) ||
        !run("ssh-keygen", {"-q", "-t", "ed25519", "-N", "", "-f", d + "/other_host_key"})) {
        skip_ = "ssh-keygen failed";
        return;
    }
    QFile::copy(d + "/user_key.pub", d + "/authorized_keys");
    // As root, sshd needs its privilege separation folder.
    if (::geteuid() == 0) QDir().mkpath("/run/sshd");
    port_ = freePort();
    QFile cfg(d + "/sshd_config");
    if (!cfg.open(QIODevice::WriteOnly)) return;
    cfg.write(QString("Port %1\nListenAddress 127.0.0.1\nHostKey %2/host_key\n"
                      "AuthorizedKeysFile %2/authorized_keys\nPasswordAuthentication no\n"
                      "KbdInteractiveAuthentication no\nUsePAM no\nStrictModes no\n"
                      "PermitRootLogin prohibit-password\nPidFile %2/sshd.pid\n")
                  .arg(port_)
                  .arg(d)
                  .toUtf8());
    cfg.close();
    sshd_ = std::make_unique<QProcess>();
    sshd_->setProcessChannelMode(QProcess::MergedChannels);
    sshd_->start(sshd, {"-D", "-e", "-f", d + "/sshd_config"});
    if (!sshd_->waitForStarted(10000)) {
        skip_ = "sshd does not start";
        return;
    }
    QFile known(d + "/known_hosts");
    QFile hostPub(d + "/host_key.pub");
    if (!known.open(QIODevice::WriteOnly) || !hostPub.open(QIODevice::ReadOnly)) return;
    known.write(QString("[127.0.0.1]:%1 ").arg(port_).toUtf8() + hostPub.readAll());
    known.close();
    QDir().mkpath(d + "/ctl");
    db_ = d + "/runs.db";
    // Until the server answers (or 10 s).
    for (int i = 0; i < 50; ++i) {
        const Ssh s = runSsh(server(), {"devices"}, {}, false);
        if (s.code == 0) return;
        if (sshd_->state() != QProcess::Running) break;
        QTest::qWait(200);
    }
    skip_ =
        "sshd started but no login works here: " + QString::fromUtf8(sshd_->readAll()).left(400);
}

void TestRemote::cleanupTestCase() {
    if (sshd_) {
        QProcess::execute("ssh", {"-o", "ControlPath=" + dir_.path() + "/ctl/%C", "-O", "exit",
                                  "-p", QString::number(port_), "127.0.0.1"});
        sshd_->terminate();
        sshd_->waitForFinished(5000);
    }
}

RemoteServer TestRemote::server() const {
    RemoteServer s;
    s.host = "127.0.0.1";
    s.port = port_;
    s.store = db_.toStdString();
    s.traindeck = td::dev::kBinary;
    s.controlDir = (dir_.path() + "/ctl").toStdString();
    s.sshOptions = {"-i", (dir_.path() + "/user_key").toStdString(),
                    "-o", "IdentitiesOnly=yes",
                    "-o", "UserKnownHostsFile=" + (dir_.path() + "/known_hosts").toStdString(),
                    "-o", "LogLevel=ERROR"};
    return s;
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
    p.write(blobsProject(1).toUtf8());
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
                               blobsProject(300).toUtf8());
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
                               blobsProject(100000).toUtf8());
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
    QFile other(dir_.filePath("other_host_key.pub"));
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
#include "test_remote.moc"

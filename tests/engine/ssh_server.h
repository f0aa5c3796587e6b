// A real OpenSSH server for the remote tests: Debian's sshd started on a free port of 127.0.0.1
// with its own host key and an authorized key of a temporary key pair, and the RemoteServer that
// reaches it (a known_hosts file with its key, the key pair, a control folder). When it cannot
// start here, skip() says why (tests QSKIP with it).
#pragma once

#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <QByteArray>
#include <QDir>
#include <QFile>
#include <QJsonArray>
#include <QJsonDocument>
#include <QJsonObject>
#include <QProcess>
#include <QStandardPaths>
#include <QTemporaryDir>
#include <QTest>
#include <memory>
#include <string>
#include <vector>

#include "engine/api/remote.h"
#include "tests/engine/cli_process.h"
#include "tests/source_dir.h"

namespace td::test {

// The arguments after argv[0] ("ssh") of an sshCommand.
inline QStringList sshArgs(const std::vector<std::string>& argv) {
    QStringList out;
    for (size_t i = 1; i < argv.size(); ++i) out << QString::fromStdString(argv[i]);
    return out;
}

struct Ssh {
    int code = -1;
    QByteArray out;
    QString err;
};

// `traindeck ARGS` on the server, waited for.
inline Ssh runSsh(const td::api::RemoteServer& s, const std::vector<std::string>& args,
                  const QByteArray& input = {}, bool withDb = true) {
    QProcess p;
    p.start("ssh", sshArgs(td::api::sshCommand(s, args, withDb)));
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
inline int freePort() {
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

inline bool runTool(const QString& program, const QStringList& args) {
    QProcess p;
    p.start(program, args);
    return p.waitForFinished(60000) && p.exitCode() == 0;
}

// projects/synthetic_blobs.json with `epochs`; `wide`: 256 features into 2048 units, so that a
// step takes milliseconds here and the run is watched live for as long as the test needs.
inline QByteArray blobsProject(int epochs, bool wide = false) {
    QFile f(td::test::project("synthetic_blobs.json"));
    if (!f.open(QIODevice::ReadOnly)) return {};
    QJsonObject p = QJsonDocument::fromJson(f.readAll()).object();
    QJsonObject training = p["training"].toObject();
    training["epochs"] = epochs;
    p["training"] = training;
    if (wide) {
        training["log_every_steps"] = 16;
        p["training"] = training;
        QJsonObject data = p["data"].toObject();
        QJsonObject source = data["source"].toObject();
        source["shape"] = QJsonArray{256};
        data["source"] = source;
        p["data"] = data;
        QJsonObject model = p["model"].toObject();
        QJsonObject config = model["config"].toObject();
        QJsonArray layers = config["layers"].toArray();
        QJsonObject input = layers[0].toObject(), dense = layers[1].toObject();
        QJsonObject ic = input["config"].toObject(), dc = dense["config"].toObject();
        ic["batch_shape"] = QJsonArray{QJsonValue(), 256};
        dc["units"] = 2048;
        input["config"] = ic;
        dense["config"] = dc;
        layers[0] = input;
        layers[1] = dense;
        config["layers"] = layers;
        model["config"] = config;
        p["model"] = model;
    }
    return QJsonDocument(p).toJson();
}

class SshServer {
  public:
    // Starts sshd and waits until a login works (at most 10 s).
    void start() {
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
        if (!runTool("ssh-keygen", {"-q", "-t", "ed25519", "-N", "", "-f", d + "/host_key"}) ||
            !runTool("ssh-keygen", {"-q", "-t", "ed25519", "-N", "", "-f", d + "/user_key"}) ||
            !runTool("ssh-keygen",
                     {"-q", "-t", "ed25519", "-N", "", "-f", d + "/other_host_key"})) {
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
        // A test that crashes takes its sshd with it.
        sshd_->setChildProcessModifier([] { ::prctl(PR_SET_PDEATHSIG, SIGTERM); });
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
        for (int i = 0; i < 50; ++i) {
            const Ssh s = runSsh(server(), {"devices"}, {}, false);
            if (s.code == 0) return;
            if (sshd_->state() != QProcess::Running) break;
            QTest::qWait(200);
        }
        skip_ = "sshd started but no login works here: " +
                QString::fromUtf8(sshd_->readAll()).left(400);
    }

    ~SshServer() { stop(); }
    void stop() {
        if (!sshd_) return;
        QProcess::execute("ssh", {"-o", "ControlPath=" + dir_.path() + "/ctl/%C", "-O", "exit",
                                  "-p", QString::number(port_), "127.0.0.1"});
        sshd_->terminate();
        sshd_->waitForFinished(5000);
        sshd_.reset();
    }

    // Empty when the server runs; otherwise why it does not.
    const QString& skip() const { return skip_; }
    int port() const { return port_; }
    // A folder of the test's own: keys, known_hosts, the control socket folder ("ctl").
    QString dir() const { return dir_.path(); }

    // The server as the app reaches it, with the store `store` there and the built traindeck.
    td::api::RemoteServer server(const QString& store = {}, bool multiplexed = true) const {
        td::api::RemoteServer s;
        s.host = "127.0.0.1";
        s.port = port_;
        s.store = store.toStdString();
        s.traindeck = td::dev::kBinary;
        if (multiplexed) s.controlDir = (dir_.path() + "/ctl").toStdString();
        s.sshOptions = {"-i", (dir_.path() + "/user_key").toStdString(),
                        "-o", "IdentitiesOnly=yes",
                        "-o", "UserKnownHostsFile=" + (dir_.path() + "/known_hosts").toStdString(),
                        "-o", "LogLevel=ERROR"};
        return s;
    }

  private:
    QTemporaryDir dir_;
    std::unique_ptr<QProcess> sshd_;
    int port_ = 0;
    QString skip_;
};

}  // namespace td::test

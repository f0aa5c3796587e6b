#include "ui/remote_link.h"

#include <QDir>
#include <QProcess>
#include <QRegularExpression>
#include <QSaveFile>
#include <QStandardPaths>
#include <QTemporaryDir>
#include <algorithm>

namespace td::ui {

namespace {

QStringList sshArguments(const std::vector<std::string>& argv) {
    QStringList out;
    for (size_t i = 1; i < argv.size(); ++i) out << QString::fromStdString(argv[i]);
    return out;
}

}  // namespace

RemoteLink::RemoteLink(td::api::RemoteServer server, QObject* parent)
    : QObject(parent), server_(std::move(server)) {
    if (server_.controlDir.empty()) {
        // A short, private folder for the control socket (sockets take ~100-byte paths).
        const QString base = QDir::tempPath() + "/traindeck-ssh-XXXXXX";
        QTemporaryDir dir(base);
        dir.setAutoRemove(false);
        if (dir.isValid()) {
            ownControlDir_ = dir.path();
            QFile::setPermissions(ownControlDir_,
                                  QFile::ReadOwner | QFile::WriteOwner | QFile::ExeOwner);
            server_.controlDir = ownControlDir_.toStdString();
        }
    }
}

RemoteLink::~RemoteLink() {
    if (!server_.controlDir.empty()) {
        // The shared connection ends with the link (it would linger ControlPersist seconds).
        QStringList args{"-o", QString::fromStdString("ControlPath=" + server_.controlDir + "/%C"),
                         "-O", "exit"};
        if (server_.port > 0) args << "-p" << QString::number(server_.port);
        for (const std::string& o : server_.sshOptions) args << QString::fromStdString(o);
        args << "--" << QString::fromStdString(server_.host);
        QProcess p;
        p.setProcessChannelMode(QProcess::MergedChannels);
        p.start("ssh", args);
        if (p.waitForStarted(2000) && !p.waitForFinished(3000)) p.kill();
    }
    if (!ownControlDir_.isEmpty()) QDir(ownControlDir_).removeRecursively();
}

QString RemoteLink::label() const {
    QString s = QString::fromStdString(server_.host);
    if (server_.port > 0) s += ":" + QString::number(server_.port);
    if (!server_.store.empty()) s += " " + QString::fromStdString(server_.store);
    return s;
}

void RemoteLink::command(const std::vector<std::string>& args, Done done, QByteArray input,
                         bool withDb) {
    auto* p = new QProcess(this);
    auto reply = std::make_shared<Done>(std::move(done));
    connect(p, &QProcess::finished, this, [this, p, reply](int code, QProcess::ExitStatus st) {
        Reply r;
        const bool crashed = st != QProcess::NormalExit;
        r.exitCode = crashed ? -1 : code;
        r.out = p->readAllStandardOutput();
        if (crashed || code != 0)
            r.error = QString::fromStdString(td::api::explainRemoteFailure(
                server_, crashed ? 255 : code, p->readAllStandardError().toStdString()));
        p->deleteLater();
        if (*reply) (*reply)(r);
    });
    connect(p, &QProcess::errorOccurred, this, [this, p, reply](QProcess::ProcessError e) {
        if (e != QProcess::FailedToStart) return;  // finished() follows the other errors
        Reply r;
        r.error = tr("%1: cannot run ssh here (%2); install the OpenSSH client (openssh-client)")
                      .arg(label(), p->errorString());
        p->deleteLater();
        if (*reply) (*reply)(r);
    });
    p->start("ssh", sshArguments(td::api::sshCommand(server_, args, withDb)));
    if (!input.isEmpty()) p->write(input);
    p->closeWriteChannel();
}

void RemoteLink::refreshRuns() {
    if (listing_) return;
    if (td::Status bad = td::api::checkRemoteServer(server_); !bad.ok()) {
        lastError_ = QString::fromStdString(bad.error());
        emit failed(lastError_);
        return;
    }
    listing_ = true;
    command({"runs", "--json"}, [this](const Reply& r) {
        listing_ = false;
        if (!r.error.isEmpty()) {
            lastError_ = r.error;
            emit failed(lastError_);
            return;
        }
        auto runs = td::api::runsFromJson(r.out.toStdString());
        if (!runs.ok()) {
            lastError_ = tr("%1: %2").arg(label(), QString::fromStdString(runs.error()));
            emit failed(lastError_);
            return;
        }
        lastError_.clear();
        runs_ = std::move(runs).value();
        emit runsListed();
    });
}

const td::RunRecord* RemoteLink::run(int64_t id) const {
    for (const td::RunRecord& r : runs_)
        if (r.id == id) return &r;
    return nullptr;
}

void RemoteLink::stop(int64_t runId, Done done) {
    command({"stop", std::to_string(runId)}, std::move(done));
}

void RemoteLink::pause(int64_t runId, bool pause, Done done) {
    command({pause ? "pause" : "continue", std::to_string(runId)}, std::move(done));
}

void RemoteLink::exportModel(int64_t runId, const QString& format, const QString& path,
                             std::function<void(const QString&)> done) {
    command({"export", std::to_string(runId), "-o", "-", "--format", format.toStdString()},
            [path, done = std::move(done)](const Reply& r) {
                if (!r.error.isEmpty()) return done(r.error);
                if (r.out.isEmpty()) return done(tr("the server sent an empty model file"));
                QSaveFile f(path);
                if (!f.open(QIODevice::WriteOnly) || f.write(r.out) != r.out.size() || !f.commit())
                    return done(tr("%1: cannot write (%2)").arg(path, f.errorString()));
                done({});
            });
}

void RemoteLink::show(int64_t runId, std::function<void(td::Result<td::RunRecord>)> done) {
    command({"show", std::to_string(runId), "--json"}, [done = std::move(done)](const Reply& r) {
        if (!r.error.isEmpty()) return done(td::err(r.error.toStdString()));
        done(td::api::runFromJson(r.out.toStdString()));
    });
}

void RemoteLink::startDetached(const QByteArray& projectJson, const QString& runName,
                               std::function<void(int64_t, const QString&)> done) {
    std::vector<std::string> args{"train", "-", "--detach"};
    if (!runName.isEmpty()) args.insert(args.end(), {"--run-name", runName.toStdString()});
    command(
        args,
        [this, done = std::move(done)](const Reply& r) {
            if (!r.error.isEmpty()) return done(0, r.error);
            bool ok = false;
            const int64_t id = r.out.trimmed().toLongLong(&ok);
            if (!ok || id <= 0)
                return done(0, tr("%1: train --detach printed '%2', expected the new run's id")
                                   .arg(label(), QString::fromUtf8(r.out.left(200))));
            done(id, {});
        },
        projectJson);
}

RemoteFollow::RemoteFollow(RemoteLink* link, int64_t runId, QObject* parent)
    : QObject(parent), link_(link), runId_(runId), queue_(std::make_shared<td::EventQueue>()) {
    retry_.setSingleShot(true);
    connect(&retry_, &QTimer::timeout, this, &RemoteFollow::connectNow);
}

RemoteFollow::~RemoteFollow() {
    if (process_) {
        process_->disconnect(this);
        process_->kill();
        process_->waitForFinished(2000);
    }
}

void RemoteFollow::start() {
    connectNow();
}

void RemoteFollow::connectNow() {
    if (ended_) return;
    if (!link_) return end(td::RunStatus::Stopped, "the server's connection was closed");
    std::vector<std::string> args{"follow", std::to_string(runId_)};
    if (!decoder_.cursor().empty()) args.insert(args.end(), {"--from", decoder_.cursor()});
    decoder_.reconnecting();
    partial_.clear();
    stderr_.clear();
    gotLine_ = false;
    process_ = new QProcess(this);
    connect(process_, &QProcess::readyReadStandardOutput, this, &RemoteFollow::onOutput);
    connect(process_, &QProcess::readyReadStandardError, this,
            [this] { stderr_ += QString::fromUtf8(process_->readAllStandardError()); });
    connect(process_, &QProcess::finished, this, [this](int code, QProcess::ExitStatus st) {
        onFinished(st == QProcess::NormalExit ? code : 255);
    });
    connect(process_, &QProcess::errorOccurred, this, [this](QProcess::ProcessError e) {
        if (e == QProcess::FailedToStart)
            end(td::RunStatus::Stopped,
                "cannot run ssh here; install the OpenSSH client (openssh-client)");
    });
    process_->start("ssh", sshArguments(td::api::sshCommand(link_->server(), args)));
    process_->closeWriteChannel();
}

void RemoteFollow::onOutput() {
    if (!process_) return;
    partial_ += process_->readAllStandardOutput();
    std::vector<td::Event> events;
    qsizetype at = 0;
    for (qsizetype nl; (nl = partial_.indexOf('\n', at)) >= 0; at = nl + 1) {
        const std::string_view line(partial_.constData() + at, static_cast<size_t>(nl - at));
        if (td::Status st = decoder_.feed(line, events); !st.ok()) {
            for (td::Event& e : events) queue_->push(std::move(e));
            return end(td::RunStatus::Stopped, st.error());
        }
        gotLine_ = true;
    }
    partial_.remove(0, at);
    if (gotLine_ && backoffMs_ != 1000) {
        backoffMs_ = 1000;
        emit connectionChanged(tr("Connected to %1 again").arg(link_ ? link_->label() : ""), false);
    }
    for (td::Event& e : events) {
        if (auto* rs = std::get_if<td::RunStarted>(&e); rs && link_)
            rs->runName = link_->label().toStdString() + ": " + rs->runName;
        if (auto* s = std::get_if<td::StepMetrics>(&e)) {
            stored_.emplace_back(s->globalStep, decoder_.lastStepStoredAtMs());
            if (stored_.size() > 8192) stored_.pop_front();
        }
        const bool finished = std::holds_alternative<td::RunFinished>(e);
        queue_->push(std::move(e));
        if (finished) ended_ = true;
    }
}

void RemoteFollow::onFinished(int exitCode) {
    if (!process_) return;
    onOutput();  // what arrived before the end
    const QString err = stderr_;
    process_->deleteLater();
    process_ = nullptr;
    if (ended_) return;
    if (decoder_.finished()) {
        ended_ = true;
        return;
    }
    const td::api::RemoteServer server = link_ ? link_->server() : td::api::RemoteServer{};
    const std::string why =
        td::api::explainRemoteFailure(server, exitCode == 0 ? 255 : exitCode, err.toStdString());
    // Another try mends a dropped connection (ssh's own failure, 255), not an answer of the
    // traindeck there (no such run, another protocol) nor a first connection that never worked.
    if (!decoder_.started() || (exitCode != 255 && exitCode != 0))
        return end(td::RunStatus::Stopped, why);
    ++reconnects_;
    const int wait = backoffMs_;
    backoffMs_ = std::min(backoffMs_ * 2, kMaxBackoffMs);
    const QString text = tr("Connection to %1 lost (%2); trying again in %3 s, from step %4")
                             .arg(link_ ? link_->label() : QString(),
                                  QString::fromStdString(why).section('\n', 0, 0))
                             .arg(wait / 1000.0, 0, 'f', wait < 1000 ? 1 : 0)
                             .arg(decoder_.lastGlobalStep());
    td::LogLine line;
    line.level = td::LogLine::Level::Warning;
    line.text = text.toStdString();
    queue_->push(line);
    emit connectionChanged(text, true);
    retry_.start(wait);
}

void RemoteFollow::end(td::RunStatus status, const std::string& message) {
    if (ended_) return;
    ended_ = true;
    retry_.stop();
    closeProcess();
    td::LogLine line;
    line.level = td::LogLine::Level::Error;
    line.text = message;
    queue_->push(line);
    td::RunFinished f;
    f.status = status;
    f.message = message;
    queue_->push(f);
    emit connectionChanged(QString::fromStdString(message), true);
}

void RemoteFollow::closeProcess() {
    if (!process_) return;
    process_->disconnect(this);
    process_->kill();
    process_->waitForFinished(2000);
    process_->deleteLater();
    process_ = nullptr;
}

void RemoteFollow::cancel() {
    if (ended_) return;
    retry_.stop();
    closeProcess();
    ended_ = true;
    td::RunFinished f;
    f.status = td::RunStatus::Stopped;
    f.message = "no longer watched here; the run goes on on the server";
    queue_->push(f);
}

int64_t RemoteFollow::storedAtMs(int64_t globalStep) const {
    for (auto it = stored_.rbegin(); it != stored_.rend(); ++it)
        if (it->first == globalStep) return it->second;
    return -1;
}

void RemoteFollow::dropConnection() {
    if (process_) process_->kill();
}

}  // namespace td::ui

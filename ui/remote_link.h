// A run store on a server, reached over SSH: the commands of engine/api/remote.h run as the
// system's ssh client (QProcess, never blocking the GUI thread), one multiplexed connection per
// server. RemoteLink lists, steers and exports; RemoteFollow turns `traindeck follow` into the
// events a local run publishes, for RunController::follow, and makes the connection again with
// backoff when it drops, continuing from the last row seen.
#pragma once

#include <QByteArray>
#include <QObject>
#include <QPointer>
#include <QString>
#include <QTimer>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "engine/api/remote.h"
#include "engine/core/events.h"
#include "engine/core/run_records.h"

class QProcess;

namespace td::ui {

class RemoteLink : public QObject {
    Q_OBJECT
  public:
    // `server.controlDir` empty: the link makes its own (a short private folder: a socket path
    // is limited to about 100 bytes).
    explicit RemoteLink(td::api::RemoteServer server, QObject* parent = nullptr);
    ~RemoteLink() override;  // ends the shared connection (ssh -O exit)

    const td::api::RemoteServer& server() const { return server_; }
    // "host" or "host:port", with the store when one is named: what the app shows.
    QString label() const;

    // The outcome of one command there. `error` is empty on success, else what went wrong in
    // words (explainRemoteFailure: host key, refused login, no traindeck, traindeck's own error).
    struct Reply {
        int exitCode = -1;
        QByteArray out;
        QString error;
    };
    using Done = std::function<void(const Reply&)>;
    // Runs `traindeck ARGS` there (with --db STORE when `withDb`), writing `input` to its standard
    // input. `done` runs on the GUI thread, and never after the link is destroyed.
    void command(const std::vector<std::string>& args, Done done, QByteArray input = {},
                 bool withDb = true);

    // Asks for the run list (`runs --json`); runsListed or failed follows.
    void refreshRuns();
    const std::vector<td::RunRecord>& runs() const { return runs_; }
    const td::RunRecord* run(int64_t id) const;
    // The last failure of a listing ("" after a good one): the server's state as the app shows it.
    const QString& lastError() const { return lastError_; }

    // Steering a run there; `done` gets the outcome.
    void stop(int64_t runId, Done done);
    void pause(int64_t runId, bool pause, Done done);
    // `traindeck export RUN -o - --format F`, written to `path` here (atomically: a partial file
    // never replaces anything).
    void exportModel(int64_t runId, const QString& format, const QString& path,
                     std::function<void(const QString& error)> done);
    // `show RUN --json`: the run with its project and settings (Compare).
    void show(int64_t runId, std::function<void(td::Result<td::RunRecord>)> done);
    // Sends `projectJson` to `traindeck train - --detach` there; `done` gets the new run's id.
    void startDetached(const QByteArray& projectJson, const QString& runName,
                       std::function<void(int64_t runId, const QString& error)> done);

  signals:
    void runsListed();
    void failed(const QString& error);

  private:
    td::api::RemoteServer server_;
    QString ownControlDir_;
    std::vector<td::RunRecord> runs_;
    QString lastError_;
    bool listing_ = false;
};

// Follows one run there. Events go to queue() as a local run's do; connectionChanged says how the
// connection stands. A connection that drops is made again after 1, 2, 4 ... 30 s, asking for the
// rows after the cursor of the last line seen (nothing missing, nothing twice); an error that
// another try cannot mend (another protocol, a run that is not there) ends the follow with a
// RunFinished that says why.
class RemoteFollow : public QObject {
    Q_OBJECT
  public:
    RemoteFollow(RemoteLink* link, int64_t runId, QObject* parent = nullptr);
    ~RemoteFollow() override;

    std::shared_ptr<td::EventQueue> queue() const { return queue_; }
    int64_t runId() const { return runId_; }
    void start();
    // Stops watching (the run goes on there): a RunFinished saying so ends the queue.
    void cancel();
    bool ended() const { return ended_; }
    int reconnects() const { return reconnects_; }
    // When the server stored a step (Unix ms, from its row), for the steps seen lately; -1 when
    // not known. With the time its point is drawn here: the stored-to-drawn latency.
    int64_t storedAtMs(int64_t globalStep) const;
    // For tests: drops the connection as a network failure would (the ssh process is killed).
    void dropConnection();

    static constexpr int kMaxBackoffMs = 30000;

  signals:
    // `error`: the connection is down (text says what and when the next try is).
    void connectionChanged(const QString& text, bool error);

  private:
    void connectNow();
    void onOutput();
    void onFinished(int exitCode);
    void end(td::RunStatus status, const std::string& message);
    void closeProcess();  // the ssh of the current connection, killed and forgotten

    QPointer<RemoteLink> link_;
    int64_t runId_;
    std::shared_ptr<td::EventQueue> queue_;
    td::api::FollowDecoder decoder_;
    QProcess* process_ = nullptr;
    QByteArray partial_;
    QTimer retry_;
    int backoffMs_ = 1000;
    int reconnects_ = 0;
    bool ended_ = false;
    bool gotLine_ = false;  // this connection delivered at least one line
    QString stderr_;
    std::deque<std::pair<int64_t, int64_t>> stored_;  // (global step, stored at ms)
};

}  // namespace td::ui

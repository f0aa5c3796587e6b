// A run store on another machine, reached with the system's OpenSSH client: the commands the
// desktop app runs there (`traindeck runs --json`, `follow`, `stop`, `train - --detach`,
// `export -o -`), built as ssh's argument vector. Nothing listens on a port and TrainDeck holds
// no credentials: ssh runs in BatchMode (keys and the agent only, never a password prompt), with
// StrictHostKeyChecking (an unknown or changed host key is refused, never accepted), over one
// multiplexed connection (ControlMaster) that listing, following and steering share.
//
// Quoting: ssh hands the remote command to the login shell there as one string. Every word is
// sent single-quoted (shellQuote), so a run name, a path or a project holding quotes, spaces,
// `$(...)`, backquotes or newlines is a word there and never runs as a command.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "engine/core/events.h"
#include "engine/core/result.h"
#include "engine/core/run_records.h"

namespace td::api {

// `s` as one word of a POSIX shell: 'text', each ' written as '\''.
std::string shellQuote(const std::string& s);

struct RemoteServer {
    std::string host;   // as ssh takes it: an alias of ~/.ssh/config, host, or user@host
    int port = 0;       // 0: what ssh's configuration says (22 by default)
    std::string store;  // the run store there; "" = traindeck's default there
    std::string traindeck = "traindeck";  // the traindeck there (a path, or a name on its PATH)
    // The folder of the connection's control socket ("" = no multiplexing).
    std::string controlDir;
    // More ssh options, as given ("-o", "UserKnownHostsFile=...", "-i", "key", ...).
    std::vector<std::string> sshOptions;
};

// Refuses what cannot be a host, store path or traindeck path (empty, control characters, a host
// starting with '-' that ssh would read as an option), naming the field.
Status checkRemoteServer(const RemoteServer& s);

// ssh's argument vector (argv[0] "ssh") running `traindeck ARGS` there, with `--db STORE`
// appended when the server names a store and `withDb`.
std::vector<std::string> sshCommand(const RemoteServer& s, const std::vector<std::string>& args,
                                    bool withDb = true);

// What a failed ssh command means, for a person, from its exit status and standard error: an
// unknown or changed host key, a refused login, an unreachable host, no traindeck there, or the
// traindeck error itself. Empty for exit status 0.
std::string explainRemoteFailure(const RemoteServer& s, int exitCode,
                                 const std::string& stderrText);

// The protocol of `traindeck follow` this build speaks (its hello line's "protocol").
constexpr int kFollowProtocol = 1;

// A run summary as `runs --json`, `show --json` and follow's hello and status lines write it
// (app/cli.cpp runJson); errors name the field.
Result<RunRecord> runFromJson(std::string_view json);
// `traindeck runs --json` (an array of summaries, newest first).
Result<std::vector<RunRecord>> runsFromJson(std::string_view json);

// Reads `traindeck follow`'s JSON lines back into the events a local run publishes, so the
// Monitor shows a remote run with the code that shows a local one: the hello line becomes
// RunStarted (once, however many times the stream is resumed), step lines StepMetrics with their
// replica lines, then epochs, devices, logs, checkpoints, and the status line RunFinished.
class FollowDecoder {
  public:
    // One line, without its newline. Appends the events it completes to `out`. Errors: a line
    // that is not JSON, a first line that is not a hello, a hello of another protocol (the
    // message says which versions are at each end and what to do).
    Status feed(std::string_view line, std::vector<Event>& out);
    // Where the stream stands after the last row line taken ("" before any): what `follow --from`
    // continues after when the connection is made again.
    const std::string& cursor() const { return cursor_; }
    bool finished() const { return finished_; }
    // The hello's summary (the run's id, name, devices, settings); valid once started().
    const RunRecord& run() const { return run_; }
    bool started() const { return started_; }
    const std::string& remoteVersion() const { return version_; }
    // The newest step line's global step and the time the server stored it (Unix ms; -1: none).
    int64_t lastGlobalStep() const { return lastGlobalStep_; }
    int64_t lastStepStoredAtMs() const { return lastStepTimeMs_; }
    // A new connection sends its hello again: the next line must be one.
    void reconnecting() { expectHello_ = true; }

  private:
    bool started_ = false, finished_ = false, expectHello_ = true;
    RunRecord run_;
    std::string version_, cursor_;
    std::vector<ReplicaStats> pendingReplicas_;  // replica lines wait for their step line
    int64_t pendingStep_ = -1;
    int64_t lastGlobalStep_ = 0, lastStepTimeMs_ = -1;
};

}  // namespace td::api

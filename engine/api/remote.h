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

#include <string>
#include <vector>

#include "engine/core/result.h"

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

}  // namespace td::api

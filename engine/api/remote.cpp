// Commands for a run store over SSH (remote.h).
#include "engine/api/remote.h"

namespace td::api {
namespace {

bool hasControl(const std::string& s) {
    for (unsigned char c : s)
        if (c < 0x20 || c == 0x7f) return true;
    return false;
}

bool contains(const std::string& text, const char* part) {
    return text.find(part) != std::string::npos;
}

}  // namespace

std::string shellQuote(const std::string& s) {
    std::string out = "'";
    for (char c : s) {
        if (c == '\'')
            out += "'\\''";
        else
            out += c;
    }
    return out + "'";
}

Status checkRemoteServer(const RemoteServer& s) {
    if (s.host.empty()) return err("server: the host is empty (expected an ssh host or alias)");
    if (s.host[0] == '-' || hasControl(s.host) || s.host.find(' ') != std::string::npos)
        return err("server: '" + s.host +
                   "' is not a host ssh takes (expected an alias, host or user@host)");
    if (s.port < 0 || s.port > 65535)
        return err("server: port " + std::to_string(s.port) + " is not a TCP port (1-65535)");
    if (hasControl(s.store))
        return err("server: the store path holds a control character (a newline?)");
    if (s.traindeck.empty() || hasControl(s.traindeck))
        return err("server: the traindeck there must be a path or a command name");
    return Status::success();
}

std::vector<std::string> sshCommand(const RemoteServer& s, const std::vector<std::string>& args,
                                    bool withDb) {
    std::vector<std::string> argv{"ssh",
                                  "-o",
                                  "BatchMode=yes",
                                  "-o",
                                  "StrictHostKeyChecking=yes",
                                  "-o",
                                  "ConnectTimeout=10",
                                  "-o",
                                  "ServerAliveInterval=5",
                                  "-o",
                                  "ServerAliveCountMax=3"};
    if (!s.controlDir.empty()) {
        argv.insert(argv.end(), {"-o", "ControlMaster=auto", "-o",
                                 "ControlPath=" + s.controlDir + "/%C", "-o", "ControlPersist=60"});
    }
    if (s.port > 0) argv.insert(argv.end(), {"-p", std::to_string(s.port)});
    argv.insert(argv.end(), s.sshOptions.begin(), s.sshOptions.end());
    argv.push_back("--");
    argv.push_back(s.host);
    // One string for the login shell there, each word quoted.
    std::string remote = shellQuote(s.traindeck);
    for (const std::string& a : args) remote += " " + shellQuote(a);
    if (withDb && !s.store.empty()) remote += " --db " + shellQuote(s.store);
    argv.push_back(remote);
    return argv;
}

std::string explainRemoteFailure(const RemoteServer& s, int exitCode,
                                 const std::string& stderrText) {
    if (exitCode == 0) return {};
    const std::string& e = stderrText;
    const std::string where = s.host + (s.port > 0 ? ":" + std::to_string(s.port) : "");
    if (contains(e, "REMOTE HOST IDENTIFICATION HAS CHANGED"))
        return where +
               ": its host key has changed since it was last seen; if the server was "
               "reinstalled, check the new key and remove the old one (ssh-keygen -R " +
               s.host + "); TrainDeck never accepts a host key by itself";
    if (contains(e, "Host key verification failed") || contains(e, "No ED25519 host key") ||
        contains(e, "host key for") || contains(e, "No matching host key"))
        return where + ": its host key is not known here; connect once with ssh " + s.host +
               " in a terminal and check the key it shows (TrainDeck never accepts one itself)";
    if (contains(e, "Permission denied"))
        return where +
               ": the login was refused; TrainDeck logs in with keys and the SSH agent only (no "
               "passwords): add your public key to the server's authorized_keys, or load it "
               "into the agent (ssh-add)";
    if (contains(e, "Could not resolve hostname") || contains(e, "Connection refused") ||
        contains(e, "Connection timed out") || contains(e, "No route to host") ||
        contains(e, "Network is unreachable") || contains(e, "Connection closed by") ||
        contains(e, "Connection reset"))
        return where + ": cannot reach the server (" + e.substr(0, e.find('\n')) + ")";
    if (exitCode == 127 || contains(e, "command not found") || contains(e, "No such file"))
        return where + ": no traindeck at '" + s.traindeck +
               "' there; install TrainDeck there or give the traindeck's path";
    // traindeck's own error line ("traindeck: error: ...").
    const size_t at = e.find("traindeck: error: ");
    if (at != std::string::npos) {
        const std::string line = e.substr(at + 18, e.find('\n', at) - at - 18);
        return where + ": " + line;
    }
    return where + ": ssh ended with status " + std::to_string(exitCode) +
           (e.empty() ? std::string() : ": " + e.substr(0, e.find('\n')));
}

}  // namespace td::api

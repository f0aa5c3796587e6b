// Commands for a run store over SSH (remote.h).
#include "engine/api/remote.h"

#include <nlohmann/json.hpp>

#include "engine/api/runs.h"

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

using Json = nlohmann::json;

// j[key] when it has the type asked for, else the fallback (a field of an older or newer writer).
std::string str(const Json& j, const char* key) {
    auto it = j.find(key);
    return it != j.end() && it->is_string() ? it->get<std::string>() : std::string();
}
int64_t int64(const Json& j, const char* key, int64_t fallback = 0) {
    auto it = j.find(key);
    return it != j.end() && it->is_number() ? it->get<int64_t>() : fallback;
}
double num(const Json& j, const char* key, double fallback = 0) {
    auto it = j.find(key);
    return it != j.end() && it->is_number() ? it->get<double>() : fallback;
}
MetricMap metrics(const Json& j, const char* key) {
    MetricMap m;
    auto it = j.find(key);
    if (it == j.end() || !it->is_object()) return m;
    for (const auto& [k, v] : it->items())
        if (v.is_number()) m[k] = v.get<double>();
    return m;
}

Result<RunRecord> runFrom(const Json& j) {
    if (!j.is_object()) return err("a run summary: expected a JSON object");
    if (!j.contains("id") || !j["id"].is_number_integer())
        return err("a run summary: no integer \"id\"");
    RunRecord r;
    r.id = j["id"].get<int64_t>();
    r.name = str(j, "name");
    r.status = str(j, "status");
    if (r.status.empty()) return err("run " + std::to_string(r.id) + ": no \"status\"");
    r.startedAtMs = int64(j, "started_at_ms");
    r.endedAtMs = int64(j, "ended_at_ms");
    r.idleMs = int64(j, "idle_ms");
    r.host = str(j, "host");
    r.pid = int64(j, "pid");
    r.devices = str(j, "devices");
    r.modelName = str(j, "model");
    r.params = int64(j, "params");
    r.message = str(j, "message");
    r.notes = str(j, "notes");
    if (auto it = j.find("final_metrics"); it != j.end() && it->is_object())
        r.finalMetricsJson = it->dump();
    if (auto it = j.find("config"); it != j.end() && it->is_object()) r.configJson = it->dump();
    if (auto it = j.find("best_val_accuracy"); it != j.end() && it->is_number())
        r.bestValAccuracy = it->get<double>();
    if (auto it = j.find("project"); it != j.end() && it->is_object()) r.projectJson = it->dump(2);
    // show --json: the epochs with their metrics beside "epoch" and "seconds".
    if (auto it = j.find("epochs"); it != j.end() && it->is_array() && !it->empty())
        if (double sps = it->back().is_object() ? num(it->back(), "samples_per_s") : 0; sps > 0)
            r.lastEpochSamplesPerSecond = sps;
    r.updatedAtMs = std::max(r.startedAtMs, r.endedAtMs);
    return r;
}

RunStatus statusFromName(const std::string& s) {
    if (s == "completed") return RunStatus::Completed;
    if (s == "stopped") return RunStatus::Stopped;
    if (s == "failed") return RunStatus::Failed;
    if (s == "interrupted") return RunStatus::Interrupted;
    return RunStatus::Running;
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

Result<RunRecord> runFromJson(std::string_view json) {
    const Json j = Json::parse(json, nullptr, false);
    if (j.is_discarded()) return err("a run summary: not JSON");
    return runFrom(j);
}

Result<std::vector<RunRecord>> runsFromJson(std::string_view json) {
    const Json j = Json::parse(json, nullptr, false);
    if (j.is_discarded() || !j.is_array())
        return err("runs --json: expected a JSON array of runs, got '" +
                   std::string(json.substr(0, 80)) + "'");
    std::vector<RunRecord> out;
    for (const Json& r : j) {
        TD_ASSIGN_OR_RETURN(RunRecord run, runFrom(r));
        out.push_back(std::move(run));
    }
    return out;
}

Status FollowDecoder::feed(std::string_view line, std::vector<Event>& out) {
    while (!line.empty() && (line.back() == '\r' || line.back() == ' ')) line.remove_suffix(1);
    if (line.empty()) return Status::success();
    const Json j = Json::parse(line, nullptr, false);
    if (j.is_discarded() || !j.is_object())
        return err("follow: not a JSON line: '" + std::string(line.substr(0, 120)) + "'");
    const std::string type = str(j, "type");
    if (expectHello_) {
        if (type != "hello")
            return err(
                "follow: the stream did not start with a hello line (is the traindeck there "
                "a TrainDeck?): '" +
                std::string(line.substr(0, 120)) + "'");
        version_ = str(j, "traindeck");
        const int64_t protocol = int64(j, "protocol", -1);
        if (protocol != kFollowProtocol)
            return err("the traindeck there (" + (version_.empty() ? "unknown version" : version_) +
                       ") speaks follow protocol " + std::to_string(protocol) +
                       ", this TrainDeck speaks " + std::to_string(kFollowProtocol) +
                       ": install the same TrainDeck release on both machines");
        TD_ASSIGN_OR_RETURN(RunRecord run, runFrom(j.value("run", Json())));
        expectHello_ = false;
        if (started_) {
            if (run.id != run_.id)
                return err("follow: the server sent run " + std::to_string(run.id) +
                           " on a new connection, expected run " + std::to_string(run_.id));
            return Status::success();  // a resumed stream: its run has started already
        }
        run_ = std::move(run);
        started_ = true;
        RunStarted rs;
        rs.runId = run_.id;
        rs.runName = run_.name;
        for (size_t at = 0; at < run_.devices.size();) {
            size_t comma = run_.devices.find(',', at);
            if (comma == std::string::npos) comma = run_.devices.size();
            std::string d = run_.devices.substr(at, comma - at);
            while (!d.empty() && d.front() == ' ') d.erase(d.begin());
            if (!d.empty()) rs.devices.push_back(d);
            at = comma + 1;
        }
        rs.params = run_.params;
        const Json cfg =
            Json::parse(run_.configJson.empty() ? "{}" : run_.configJson, nullptr, false);
        if (cfg.is_object()) {
            rs.epochs = static_cast<int>(int64(cfg, "epochs"));
            rs.batchSize = int64(cfg, "batch_size");
            rs.stepsPerEpoch = int64(cfg, "steps_per_epoch");
            rs.trainSamples = int64(cfg, "train_samples");
            rs.validationSamples = int64(cfg, "validation_samples");
            if (std::string st = str(cfg, "strategy"); !st.empty()) rs.strategy = st;
        }
        out.emplace_back(std::move(rs));
        return Status::success();
    }
    if (type == "hello") return err("follow: a second hello line on one connection");
    if (type == "status") {
        TD_ASSIGN_OR_RETURN(RunRecord end, runFrom(j));
        RunFinished f;
        f.status = statusFromName(end.status);
        f.message = end.message;
        const Json fm =
            Json::parse(end.finalMetricsJson.empty() ? "{}" : end.finalMetricsJson, nullptr, false);
        if (fm.is_object())
            for (const auto& [k, v] : fm.items())
                if (v.is_number()) f.finalMetrics[k] = v.get<double>();
        if (end.endedAtMs > end.startedAtMs)
            f.seconds = static_cast<double>(end.activeMs(end.endedAtMs)) / 1000.0;
        finished_ = true;
        out.emplace_back(std::move(f));
        return Status::success();
    }
    if (!started_) return err("follow: a '" + type + "' line before the hello");
    if (type == "replica") {
        const int64_t step = int64(j, "global_step");
        if (step != pendingStep_) pendingReplicas_.clear();
        pendingStep_ = step;
        ReplicaStats r;
        r.replica = static_cast<int>(int64(j, "replica"));
        r.worker = static_cast<int>(int64(j, "worker"));
        r.device = str(j, "device");
        r.samplesPerSecond = num(j, "samples_per_s");
        r.computeSeconds = num(j, "compute_s");
        r.allReduceSeconds = num(j, "all_reduce_s");
        r.inputWaitSeconds = num(j, "input_wait_s");
        pendingReplicas_.push_back(std::move(r));
    } else if (type == "step") {
        StepRow row;
        row.globalStep = int64(j, "global_step");
        row.epoch = static_cast<int>(int64(j, "epoch"));
        row.step = int64(j, "step");
        row.timeMs = int64(j, "time_ms");
        row.metrics = metrics(j, "metrics");
        StepMetrics m = stepEvent(row);
        if (pendingStep_ == row.globalStep) m.replicas = std::move(pendingReplicas_);
        pendingReplicas_.clear();
        pendingStep_ = -1;
        lastGlobalStep_ = row.globalStep;
        lastStepTimeMs_ = row.timeMs;
        out.emplace_back(std::move(m));
    } else if (type == "epoch") {
        EpochRow row;
        row.epoch = static_cast<int>(int64(j, "epoch"));
        row.timeMs = int64(j, "time_ms");
        row.seconds = num(j, "seconds");
        row.metrics = metrics(j, "metrics");
        out.emplace_back(epochEvent(row));
    } else if (type == "device") {
        DeviceStats d;
        d.device = str(j, "device");
        d.utilization = num(j, "utilization");
        d.memoryBytes = int64(j, "memory_bytes");
        d.samplesPerSecond = num(j, "samples_per_s");
        d.memoryUsedBytes = int64(j, "memory_used_bytes", -1);
        d.memoryTotalBytes = int64(j, "memory_total_bytes", -1);
        d.gpuUtilization = num(j, "gpu_utilization", -1);
        out.emplace_back(std::move(d));
    } else if (type == "log") {
        LogLine l;
        const std::string level = str(j, "level");
        l.level = level == "error"     ? LogLine::Level::Error
                  : level == "warning" ? LogLine::Level::Warning
                                       : LogLine::Level::Info;
        l.text = str(j, "text");
        out.emplace_back(std::move(l));
    } else if (type == "checkpoint") {
        CheckpointSaved c;
        c.path = str(j, "path");
        c.kind = str(j, "kind");
        c.globalStep = int64(j, "global_step");
        c.epoch = static_cast<int>(int64(j, "epoch"));
        c.stepInEpoch = int64(j, "step");
        c.bytes = int64(j, "bytes");
        out.emplace_back(std::move(c));
    }
    // A line type of a newer writer is skipped; its cursor still counts.
    if (std::string c = str(j, "cursor"); !c.empty()) cursor_ = std::move(c);
    return Status::success();
}

}  // namespace td::api

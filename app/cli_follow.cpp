// `traindeck follow RUN`: a run's rows as JSON lines on standard output, what is stored first,
// then live as the process training it appends them (the store is read, never written), ending
// with the run's final status. What the desktop app runs on a server over SSH to watch a run.
//
// Lines (one JSON object each, by its "type"):
//   hello       {"traindeck": version, "protocol": 1, "run": the run's summary (runs --json)}
//   step        global_step, epoch, step, time_ms, metrics
//   replica     global_step, time_ms, replica, worker, device, samples_per_s, compute_s,
//               all_reduce_s, input_wait_s
//   epoch       epoch, time_ms, seconds, metrics
//   device      time_ms, device, utilization, memory_bytes, samples_per_s, memory_used_bytes,
//               memory_total_bytes, gpu_utilization (-1: unknown)
//   log         time_ms, level, text
//   checkpoint  global_step, epoch, step, kind, path, bytes, created_at_ms
//   status      the run's summary once it is no longer running (status, message, metrics)
// Every row line carries "cursor": where the stream stands after it. `--from CURSOR` continues
// after that line, with nothing missing and nothing twice (a dropped connection); `--from-step N`
// sends the rows stored after step N (steps and replica rows after it, the other rows stored
// later than it).
//
// Live: a look costs one PRAGMA data_version when nothing was committed (RunWatcher), every
// --poll-ms. A run whose process on this host has died is marked interrupted by opening the store
// (RunStore::open does that), and the stream ends with that status.
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <sstream>
#include <thread>

#include "app/cli.h"
#include "engine/api/runs.h"
#include "engine/store/run_store.h"

namespace td::cli {

namespace {

constexpr int kProtocol = 1;
// How often a live run's process is checked (a look at /proc) while nothing is committed.
constexpr auto kLivenessEvery = std::chrono::seconds(2);

// Where the stream stands: the last step and replica step sent, the next epoch, and how many
// device and log rows were sent (they have no key of their own; the store only appends them).
struct Cursor {
    int64_t step = 0, replicaStep = 0, checkpointStep = 0;
    int64_t nextEpoch = 0;
    int64_t devices = 0, logs = 0;

    std::string text() const {
        return "s" + std::to_string(step) + ".r" + std::to_string(replicaStep) + ".e" +
               std::to_string(nextEpoch) + ".d" + std::to_string(devices) + ".l" +
               std::to_string(logs) + ".c" + std::to_string(checkpointStep);
    }
    static Result<Cursor> parse(const std::string& t) {
        Cursor c;
        char sep[6] = {};
        long long v[6] = {};
        if (std::sscanf(t.c_str(), "s%lld%c r%lld%c e%lld%c d%lld%c l%lld%c c%lld", &v[0], &sep[0],
                        &v[1], &sep[1], &v[2], &sep[2], &v[3], &sep[3], &v[4], &sep[4],
                        &v[5]) != 11)
            return err(
                "--from: expected a cursor of an earlier follow (s<N>.r<N>.e<N>.d<N>.l<N>"
                ".c<N>), got '" +
                t + "'");
        for (long long x : v)
            if (x < 0) return err("--from: negative position in '" + t + "'");
        c.step = v[0];
        c.replicaStep = v[1];
        c.nextEpoch = v[2];
        c.devices = v[3];
        c.logs = v[4];
        c.checkpointStep = v[5];
        return c;
    }
};

// One line out; false when standard output is gone (the SSH connection dropped).
bool emit(nlohmann::json line, const Cursor* cursor) {
    if (cursor) line["cursor"] = cursor->text();
    const std::string text = line.dump() + "\n";
    return std::fwrite(text.data(), 1, text.size(), stdout) == text.size() &&
           std::fflush(stdout) == 0;
}

nlohmann::json metricsJson(const MetricMap& m) {
    nlohmann::json j = nlohmann::json::object();
    for (const auto& [k, v] : m) j[k] = v;
    return j;
}

bool processAlive(int64_t pid) {
    return pid > 0 && (::kill(static_cast<pid_t>(pid), 0) == 0 || errno == EPERM);
}

std::string thisHost() {
    char name[256] = {};
    return ::gethostname(name, sizeof name - 1) == 0 ? std::string(name) : std::string();
}

class Follower {
  public:
    Follower(api::RunCatalog& catalog, int64_t runId, Cursor c)
        : catalog_(catalog), runId_(runId), c_(c) {}

    // Sends every row stored after the cursor; false on an error (printed) or a closed output.
    bool sendNew() {
        auto steps = catalog_.steps(runId_, c_.step);
        auto replicas = catalog_.replicaStats(runId_, c_.replicaStep);
        auto epochs = catalog_.epochs(runId_);
        auto devices = catalog_.deviceStats(runId_);
        auto logs = catalog_.logs(runId_);
        auto checkpoints = catalog_.checkpoints(runId_);
        for (const Status& s : {statusOf(steps), statusOf(replicas), statusOf(epochs),
                                statusOf(devices), statusOf(logs), statusOf(checkpoints)})
            if (!s.ok()) {
                printError("follow: " + s.error());
                return false;
            }
        // Steps with their replica rows, in step order.
        size_t r = 0;
        for (const StepRow& s : *steps) {
            for (; r < replicas->size() && (*replicas)[r].globalStep <= s.globalStep; ++r)
                if (!sendReplica((*replicas)[r])) return false;
            c_.step = s.globalStep;
            if (!emit({{"type", "step"},
                       {"global_step", s.globalStep},
                       {"epoch", s.epoch},
                       {"step", s.step},
                       {"time_ms", s.timeMs},
                       {"metrics", metricsJson(s.metrics)}},
                      &c_))
                return false;
        }
        for (; r < replicas->size(); ++r)
            if (!sendReplica((*replicas)[r])) return false;
        for (const EpochRow& e : *epochs) {
            if (e.epoch < c_.nextEpoch) continue;
            c_.nextEpoch = e.epoch + 1;
            if (!emit({{"type", "epoch"},
                       {"epoch", e.epoch},
                       {"time_ms", e.timeMs},
                       {"seconds", e.seconds},
                       {"metrics", metricsJson(e.metrics)}},
                      &c_))
                return false;
        }
        for (auto i = static_cast<size_t>(c_.devices); i < devices->size(); ++i) {
            const DeviceRow& d = (*devices)[i];
            c_.devices = static_cast<int64_t>(i) + 1;
            if (!emit({{"type", "device"},
                       {"time_ms", d.timeMs},
                       {"device", d.device},
                       {"utilization", d.utilization},
                       {"memory_bytes", d.memoryBytes},
                       {"samples_per_s", d.samplesPerSecond},
                       {"memory_used_bytes", d.memoryUsedBytes},
                       {"memory_total_bytes", d.memoryTotalBytes},
                       {"gpu_utilization", d.gpuUtilization}},
                      &c_))
                return false;
        }
        for (auto i = static_cast<size_t>(c_.logs); i < logs->size(); ++i) {
            const LogRow& l = (*logs)[i];
            c_.logs = static_cast<int64_t>(i) + 1;
            if (!emit(
                    {{"type", "log"}, {"time_ms", l.timeMs}, {"level", l.level}, {"text", l.text}},
                    &c_))
                return false;
        }
        // Newest first in the store: sent oldest first.
        for (auto it = checkpoints->rbegin(); it != checkpoints->rend(); ++it) {
            if (it->globalStep <= c_.checkpointStep) continue;
            c_.checkpointStep = it->globalStep;
            if (!emit({{"type", "checkpoint"},
                       {"global_step", it->globalStep},
                       {"epoch", it->epoch},
                       {"step", it->stepInEpoch},
                       {"kind", it->kind},
                       {"path", it->path},
                       {"bytes", it->bytes},
                       {"created_at_ms", it->createdAtMs}},
                      &c_))
                return false;
        }
        return true;
    }

    // --from-step N: the position after step N (see the top).
    bool startAfterStep(int64_t n) {
        auto steps = catalog_.steps(runId_, 0);
        if (!steps.ok()) {
            printError("follow: " + steps.error());
            return false;
        }
        int64_t timeMs = -1;
        for (const StepRow& s : *steps)
            if (s.globalStep <= n) timeMs = s.timeMs;
        c_.step = c_.replicaStep = c_.checkpointStep = n;
        if (timeMs < 0) return true;  // nothing stored up to step N: everything else is new
        auto epochs = catalog_.epochs(runId_);
        auto devices = catalog_.deviceStats(runId_);
        auto logs = catalog_.logs(runId_);
        if (!epochs.ok() || !devices.ok() || !logs.ok()) {
            printError("follow: cannot read the run's rows");
            return false;
        }
        for (const EpochRow& e : *epochs)
            if (e.timeMs <= timeMs) c_.nextEpoch = e.epoch + 1;
        for (const DeviceRow& d : *devices) c_.devices += d.timeMs <= timeMs ? 1 : 0;
        for (const LogRow& l : *logs) c_.logs += l.timeMs <= timeMs ? 1 : 0;
        return true;
    }

  private:
    bool sendReplica(const ReplicaRow& r) {
        c_.replicaStep = r.globalStep;
        return emit({{"type", "replica"},
                     {"global_step", r.globalStep},
                     {"time_ms", r.timeMs},
                     {"replica", r.stats.replica},
                     {"worker", r.stats.worker},
                     {"device", r.stats.device},
                     {"samples_per_s", r.stats.samplesPerSecond},
                     {"compute_s", r.stats.computeSeconds},
                     {"all_reduce_s", r.stats.allReduceSeconds},
                     {"input_wait_s", r.stats.inputWaitSeconds}},
                    &c_);
    }

    api::RunCatalog& catalog_;
    int64_t runId_;
    Cursor c_;
};

}  // namespace

int follow(const FollowArgs& a) {
    // SSH closing the connection: writes fail (EPIPE) and the loop ends, instead of a signal.
    signal(SIGPIPE, SIG_IGN);
    const std::string path = a.db.empty() ? defaultDbPath() : a.db;
    std::error_code ec;
    if (!std::filesystem::is_regular_file(path, ec)) {
        printError("follow: no run store at " + path);
        return 2;
    }
    Cursor start;
    if (!a.from.empty()) {
        auto c = Cursor::parse(a.from);
        if (!c.ok()) {
            printError(c.error());
            return 2;
        }
        start = *c;
    }
    auto catalog = api::RunCatalog::open(path);
    if (!catalog.ok()) {
        printError(catalog.error());
        return 2;
    }
    auto watcher = api::RunWatcher::open(path);
    if (!watcher.ok()) {
        printError(watcher.error());
        return 2;
    }
    auto run = (*catalog)->findRun(a.run);
    if (!run.ok()) {
        printError(run.error());
        return 2;
    }
    const int64_t id = run->id;
    Follower f(**catalog, id, start);
    if (a.from.empty() && a.fromStep > 0 && !f.startAfterStep(a.fromStep)) return 1;
    if (!emit({{"type", "hello"},
               {"traindeck", TRAINDECK_VERSION},
               {"protocol", kProtocol},
               {"run", runJson(*run)}},
              nullptr))
        return 1;

    int64_t version = -1;
    auto lastLiveness = std::chrono::steady_clock::now();
    const bool local = run->host == thisHost();
    while (true) {
        auto look = (*watcher)->changedRuns(version, id, {id});
        if (!look.ok()) {
            printError("follow: " + look.error());
            return 1;
        }
        if (look->unchanged) {
            // Nothing committed: is the writer still there?
            if (local && std::chrono::steady_clock::now() - lastLiveness > kLivenessEvery) {
                lastLiveness = std::chrono::steady_clock::now();
                auto now = (*catalog)->run(id);
                if (now.ok() && now->status == "running" && !processAlive(now->pid)) {
                    // Opening a store marks the runs of dead processes interrupted.
                    (void)RunStore::open(path);
                    version = -1;
                    continue;
                }
            }
            std::this_thread::sleep_for(std::chrono::milliseconds(a.pollMs));
            continue;
        }
        version = look->dataVersion;
        // The status first: a run seen finished here has every row stored before it.
        auto now = (*catalog)->run(id);
        if (!now.ok()) {
            printError("follow: run " + std::to_string(id) + ": " + now.error());
            return 1;
        }
        if (!f.sendNew()) return 1;
        if (now->status != "running") {
            nlohmann::json end = runJson(*now);
            end["type"] = "status";
            return emit(end, nullptr) ? 0 : 1;
        }
    }
}

}  // namespace td::cli

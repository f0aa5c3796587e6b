#include "app/cli.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>

#include "engine/api/export.h"
#include "engine/api/projects.h"
#include "engine/api/runs.h"
#include "engine/api/session.h"
#include "engine/core/text_limits.h"
#include "engine/store/run_store.h"

namespace td::cli {

void printError(const std::string& msg) {
    std::fprintf(stderr, "traindeck: error: %s\n", msg.c_str());
}

namespace {

// SIGTERM, SIGINT and SIGHUP stop a headless run as the app's Stop button does: the step in
// progress finishes, a checkpoint is written, the store gets every row and the status 'stopped'.
// A second signal ends the process at once (the default action). The handler only records the
// signal; train()'s event loop acts on it. (Under an MPI launcher, the launch's own handler for
// SIGTERM and SIGINT replaces this one once the session has joined the job.)
std::atomic<int> gStopSignal{0};
static_assert(std::atomic<int>::is_always_lock_free);

extern "C" void onStopSignal(int sig) {
    int expected = 0;
    if (!gStopSignal.compare_exchange_strong(expected, sig)) {
        struct sigaction dfl {};
        dfl.sa_handler = SIG_DFL;
        sigemptyset(&dfl.sa_mask);
        sigaction(sig, &dfl, nullptr);
        raise(sig);
    }
}

// SIGUSR1 pauses a headless run between steps, SIGUSR2 continues it (`traindeck pause|continue`).
std::atomic<int> gPauseSignal{0};  // the last of SIGUSR1 / SIGUSR2 received, until acted on

extern "C" void onPauseSignal(int sig) {
    gPauseSignal.store(sig);
}

// This process as the kernel knows it beyond its pid: its start time in clock ticks after boot
// (/proc/PID/stat, field 22) and the boot's id. A pid reused by another process, or after a
// reboot, does not match.
std::string processIdentity(pid_t pid) {
    std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
    std::string text((std::istreambuf_iterator<char>(stat)), std::istreambuf_iterator<char>());
    const size_t close = text.rfind(')');  // the command name may hold spaces and parentheses
    if (close == std::string::npos) return {};
    std::istringstream fields(text.substr(close + 2));
    std::string f;
    for (int i = 3; i <= 22 && fields >> f; ++i) {
        if (i == 22) {
            std::ifstream boot("/proc/sys/kernel/random/boot_id");
            std::string id;
            boot >> id;
            return f + " " + id;
        }
    }
    return {};
}

std::string hostName() {
    char name[256] = {};
    if (::gethostname(name, sizeof name - 1) != 0) return {};
    return name;
}

// <store folder>/logs/run-<id>.control: the process training the run (pid, identity, host),
// written when the run starts and removed when it ends, for stop/pause/continue.
std::string controlFile(const std::string& storePath, int64_t runId) {
    std::error_code ec;
    const auto dir = std::filesystem::absolute(storePath, ec).parent_path() / "logs";
    const std::string store = std::filesystem::path(storePath).filename().string();
    return (dir / (store + "-run-" + std::to_string(runId) + ".control")).string();
}

void writeControlFile(const std::string& path) {
    std::error_code ec;
    std::filesystem::create_directories(std::filesystem::path(path).parent_path(), ec);
    const std::string tmp = path + ".tmp" + std::to_string(::getpid());
    {
        std::ofstream out(tmp);
        out << ::getpid() << "\n" << processIdentity(::getpid()) << "\n" << hostName() << "\n";
        if (!out) return;
    }
    std::filesystem::rename(tmp, path, ec);
}

void installStopSignals() {
    struct sigaction pause {};
    pause.sa_handler = onPauseSignal;
    sigemptyset(&pause.sa_mask);
    pause.sa_flags = SA_RESTART;
    for (int sig : {SIGUSR1, SIGUSR2}) sigaction(sig, &pause, nullptr);
    struct sigaction sa {};
    sa.sa_handler = onStopSignal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;
    for (int sig : {SIGTERM, SIGINT, SIGHUP}) sigaction(sig, &sa, nullptr);
    // A closed terminal or pipe must not end the run before its checkpoint: writes then fail
    // with EPIPE instead.
    signal(SIGPIPE, SIG_IGN);
}

const char* stopSignalName(int sig) {
    return sig == SIGTERM  ? "SIGTERM"
           : sig == SIGINT ? "SIGINT"
           : sig == SIGHUP ? "SIGHUP"
                           : "a signal";
}

// The most a project read from standard input may hold.
constexpr size_t kMaxStdinProject = size_t{64} << 20;

// loadProject ("-": standard input, its relative paths against the working folder), then the keys
// of its Keras model that were accepted but are not applied, on stderr.
Result<Project> openProject(const std::string& path) {
    Result<Project> project = err("");
    if (path == "-") {
        std::string text;
        char buf[1 << 16];
        size_t got = 0;
        while ((got = std::fread(buf, 1, sizeof buf, stdin)) > 0) {
            text.append(buf, got);
            if (text.size() > kMaxStdinProject)
                return err("standard input: a project of more than 64 MiB");
        }
        if (text.empty()) return err("standard input: no project (expected its JSON text)");
        std::error_code ec;
        const std::string cwd = std::filesystem::current_path(ec).string();
        const std::string name = (ec ? std::string(".") : cwd) + "/standard input";
        project = parseProject(text, name);
        if (!project.ok() && project.error().rfind(name, 0) == 0)
            return err("standard input" + project.error().substr(name.size()));
    } else {
        project = loadProject(path);
    }
    if (project.ok())
        for (const std::string& w : project->warnings)
            std::fprintf(stderr, "traindeck: warning: %s: %s\n", path.c_str(), w.c_str());
    return project;
}

// `train --detach`: forks. The parent (return value >= 0, its exit status) waits until the child
// reports its run's id on a pipe ("run N"), prints it with the log's path and returns 0; a child
// that ends before that has failed to start: the parent prints the log's last lines and returns 2.
// The child (return -1, `reportFd` the pipe's write end) leaves the terminal's session, reads
// /dev/null and writes to <store folder>/logs/train-<time>-<pid>.log.
int detach(const std::string& storePath, int& reportFd) {
    namespace fs = std::filesystem;
    std::error_code ec;
    const fs::path dir = fs::absolute(storePath, ec).parent_path() / "logs";
    fs::create_directories(dir, ec);
    if (ec) {
        printError("--detach: cannot create the log folder " + dir.string() + ": " + ec.message());
        return 2;
    }
    const auto now = std::chrono::system_clock::to_time_t(std::chrono::system_clock::now());
    char stamp[32];
    std::strftime(stamp, sizeof stamp, "%Y%m%d-%H%M%S", std::localtime(&now));
    const std::string log =
        (dir / ("train-" + std::string(stamp) + "-" + std::to_string(::getpid()) + ".log"))
            .string();
    int fds[2];
    if (::pipe2(fds, O_CLOEXEC) != 0) {
        printError(std::string("--detach: pipe: ") + std::strerror(errno));
        return 2;
    }
    std::fflush(stdout);
    std::fflush(stderr);
    const pid_t pid = ::fork();
    if (pid < 0) {
        printError(std::string("--detach: fork: ") + std::strerror(errno));
        return 2;
    }
    if (pid > 0) {
        ::close(fds[1]);
        std::string said;
        char buf[256];
        ssize_t got = 0;
        while ((got = ::read(fds[0], buf, sizeof buf)) > 0)
            said.append(buf, static_cast<size_t>(got));
        ::close(fds[0]);
        if (said.rfind("run ", 0) == 0) {
            const std::string id = said.substr(4, said.find('\n') - 4);
            std::printf("%s\n", id.c_str());
            std::fprintf(stderr, "traindeck: run %s trains detached (process %d); its output: %s\n",
                         id.c_str(), static_cast<int>(pid), log.c_str());
            return 0;
        }
        int status = 0;
        ::waitpid(pid, &status, 0);
        std::ifstream in(log);
        std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
        if (text.size() > 4000) text = text.substr(text.size() - 4000);
        printError("--detach: the run did not start (its output, " + log + "):\n" + text);
        return 2;
    }
    ::close(fds[0]);
    ::setsid();
    const int in = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
    const int out = ::open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (in >= 0) ::dup2(in, STDIN_FILENO);
    if (out >= 0) {
        ::dup2(out, STDOUT_FILENO);
        ::dup2(out, STDERR_FILENO);
    }
    if (in > STDERR_FILENO) ::close(in);
    if (out > STDERR_FILENO) ::close(out);
    reportFd = fds[1];
    return -1;
}

std::string fmtDuration(double s) {
    char buf[32];
    if (s < 60)
        std::snprintf(buf, sizeof buf, "%.0fs", s);
    else if (s < 3600)
        std::snprintf(buf, sizeof buf, "%dm%02ds", static_cast<int>(s) / 60,
                      static_cast<int>(s) % 60);
    else
        std::snprintf(buf, sizeof buf, "%dh%02dm", static_cast<int>(s) / 3600,
                      (static_cast<int>(s) / 60) % 60);
    return buf;
}

std::string fmtMetrics(const MetricMap& m) {
    std::string out;
    // Keras prints metrics in alphabetical order, val_* after the training ones.
    for (int pass = 0; pass < 2; ++pass)
        for (const auto& [k, v] : m) {
            const bool val = k.rfind("val_", 0) == 0 || k.rfind("test_", 0) == 0;
            if (val != (pass == 1)) continue;
            char buf[64];
            std::snprintf(buf, sizeof buf, " - %s: %.4f", k.c_str(), v);
            out += buf;
        }
    return out;
}

// Keras-style progress bar on a terminal; plain lines (one per epoch) otherwise.
class Progress {
  public:
    Progress(bool tty, bool quiet, bool verbose) : tty_(tty), quiet_(quiet), verbose_(verbose) {}
    void onEvent(const Event& e) {
        if (quiet_) {
            if (auto* f = std::get_if<RunFinished>(&e)) finished_ = *f;
            return;
        }
        if (auto* s = std::get_if<RunStarted>(&e)) {
            steps_ = s->stepsPerEpoch;
            epochs_ = s->epochs;
            std::printf(
                "Training %lld samples (%lld validation), batch %lld, %lld steps/epoch, %lld "
                "params on %s\n",
                static_cast<long long>(s->trainSamples),
                static_cast<long long>(s->validationSamples), static_cast<long long>(s->batchSize),
                static_cast<long long>(s->stepsPerEpoch), static_cast<long long>(s->params),
                s->devices.size() == 1
                    ? s->devices[0].c_str()
                    : (std::to_string(s->devices.size()) + " replicas (" + s->strategy +
                       (s->workers > 1 ? ", " + std::to_string(s->workers) + " workers"
                                       : std::string()) +
                       ")")
                          .c_str());
            replicas_.assign(s->devices.size(), {});
            for (size_t i = 0; i < s->devices.size(); ++i) replicas_[i].device = s->devices[i];
            allReduceBytes_ = s->allReduceBytesPerStep;
            buckets_ = s->gradientBuckets;
            if (s->runId) std::printf("Run %lld\n", static_cast<long long>(s->runId));
            std::fflush(stdout);  // a log file or pipe sees each line as it is printed
        } else if (auto* m = std::get_if<StepMetrics>(&e)) {
            for (const ReplicaStats& r : m->replicas)
                if (r.replica >= 0 && static_cast<size_t>(r.replica) < replicas_.size()) {
                    ReplicaStats& t = replicas_[static_cast<size_t>(r.replica)];
                    t.computeSeconds += r.computeSeconds;
                    t.allReduceSeconds += r.allReduceSeconds;
                    t.inputWaitSeconds += r.inputWaitSeconds;
                }
            if (m->epoch != epoch_ || !started_) {
                epoch_ = m->epoch;
                started_ = true;
                epochT0_ = std::chrono::steady_clock::now();
                std::printf("Epoch %d/%d\n", m->epoch + 1, epochs_);
                std::fflush(stdout);
            }
            if (!tty_) return;
            const double el = secondsSinceEpoch();
            const int width = 20;
            const int filled = steps_ ? static_cast<int>(width * m->step / steps_) : width;
            std::string bar;
            for (int i = 0; i < width; ++i) bar += i < filled ? "\u2501" : "\u2500";
            const double eta =
                m->step ? el / static_cast<double>(m->step) * static_cast<double>(steps_ - m->step)
                        : 0;
            std::printf(
                "\r\033[K%lld/%lld %s %s %s%s", static_cast<long long>(m->step),
                static_cast<long long>(steps_), bar.c_str(),
                m->step < steps_ ? ("ETA " + fmtDuration(eta)).c_str() : fmtDuration(el).c_str(),
                ("- " + std::to_string(static_cast<long long>(m->samplesPerSecond)) + " samples/s")
                    .c_str(),
                fmtMetrics(m->metrics).c_str());
            std::fflush(stdout);
        } else if (auto* em = std::get_if<EpochMetrics>(&e)) {
            if (!started_ || em->epoch != epoch_)
                std::printf("Epoch %d/%d\n", em->epoch + 1, epochs_);
            started_ = false;
            char head[160];
            std::snprintf(head, sizeof head, "%lld/%lld %s %.0fus/step %.0f samples/s",
                          static_cast<long long>(steps_), static_cast<long long>(steps_),
                          fmtDuration(em->seconds).c_str(),
                          em->seconds / std::max<int64_t>(1, steps_) * 1e6, em->samplesPerSecond);
            std::printf("%s%s%s\n", tty_ ? "\r\033[K" : "", head, fmtMetrics(em->metrics).c_str());
            std::fflush(stdout);
        } else if (auto* c = std::get_if<CheckpointSaved>(&e)) {
            if (!c->path.empty()) lastCheckpoint_ = c->path;
        } else if (auto* l = std::get_if<LogLine>(&e)) {
            if (l->detail && !verbose_) return;
            std::printf("%s%s\n", tty_ ? "\r\033[K" : "", l->text.c_str());
            std::fflush(stdout);
        } else if (auto* f = std::get_if<RunFinished>(&e)) {
            finished_ = *f;
            std::printf("Run %s after %s%s\n", runStatusName(f->status),
                        fmtDuration(f->seconds).c_str(),
                        f->message.empty() ? "" : (": " + f->message).c_str());
            MetricMap test;
            for (const auto& [k, v] : f->finalMetrics)
                if (k.rfind("test_", 0) == 0) test[k] = v;
            if (!test.empty()) std::printf("Test%s\n", fmtMetrics(test).c_str());
            // Where each replica's time went (several replicas only).
            if (replicas_.size() > 1) {
                std::printf("All-reduce: %.1f KiB per replica per step in %d bucket%s\n",
                            static_cast<double>(allReduceBytes_) / 1024.0, buckets_,
                            buckets_ == 1 ? "" : "s");
                for (const ReplicaStats& r : replicas_) {
                    const double total = r.computeSeconds + r.allReduceSeconds + r.inputWaitSeconds;
                    std::printf(
                        "  %s: compute %.2f s, all-reduce %.2f s (%.1f%%), input wait %.2f s\n",
                        r.device.c_str(), r.computeSeconds, r.allReduceSeconds,
                        total > 0 ? 100.0 * r.allReduceSeconds / total : 0.0, r.inputWaitSeconds);
                }
            }
            std::fflush(stdout);
        }
    }
    // The run's result; empty until RunFinished arrived.
    const std::optional<RunFinished>& finished() const { return finished_; }
    // The newest checkpoint file the run wrote; empty when none.
    const std::string& lastCheckpoint() const { return lastCheckpoint_; }

  private:
    double secondsSinceEpoch() const {
        return std::chrono::duration<double>(std::chrono::steady_clock::now() - epochT0_).count();
    }
    bool tty_;
    bool quiet_;
    bool verbose_;
    int64_t steps_ = 0;
    int epochs_ = 0, epoch_ = -1;
    bool started_ = false;
    std::optional<RunFinished> finished_;
    std::string lastCheckpoint_;
    std::chrono::steady_clock::time_point epochT0_;
    std::vector<ReplicaStats> replicas_;  // totals over the run
    int64_t allReduceBytes_ = 0;
    int buckets_ = 0;
};

std::string fmtParams(int64_t n) {
    std::string s = std::to_string(n);
    for (int i = static_cast<int>(s.size()) - 3; i > 0; i -= 3)
        s.insert(static_cast<size_t>(i), ",");
    return s;
}

std::string fmtTime(int64_t ms) {
    if (ms <= 0) return "-";
    std::time_t t = ms / 1000;
    char buf[32];
    std::strftime(buf, sizeof buf, "%Y-%m-%d %H:%M:%S", std::localtime(&t));
    return buf;
}

}  // namespace

nlohmann::json runJson(const RunRecord& r) {
    nlohmann::json j = {{"id", r.id},
                        {"name", r.name},
                        {"status", r.status},
                        {"started_at_ms", r.startedAtMs},
                        {"ended_at_ms", r.endedAtMs},
                        {"idle_ms", r.idleMs},
                        {"host", r.host},
                        {"pid", r.pid},
                        {"devices", r.devices},
                        {"model", r.modelName},
                        {"params", r.params},
                        {"message", r.message},
                        {"notes", r.notes}};
    j["final_metrics"] = nlohmann::json::parse(
        r.finalMetricsJson.empty() ? "{}" : r.finalMetricsJson, nullptr, false);
    // The effective settings (epochs, batch size, precision, strategy...): what a remote viewer
    // shows in its table and needs for a run's progress. Summaries without documents have none.
    if (!r.configJson.empty()) j["config"] = nlohmann::json::parse(r.configJson, nullptr, false);
    if (r.bestValAccuracy)
        j["best_val_accuracy"] = *r.bestValAccuracy;
    else
        j["best_val_accuracy"] = nullptr;
    return j;
}

std::string defaultDbPath() {
    if (const char* e = std::getenv("TRAINDECK_DB")) return e;
    std::string base;
    if (const char* x = std::getenv("XDG_DATA_HOME"); x && *x)
        base = x;
    else if (const char* h = std::getenv("HOME"); h && *h)
        base = std::string(h) + "/.local/share";
    else
        base = ".";
    // The same folder the GUI uses (QStandardPaths::AppDataLocation: <data
    // home>/TrainDeck/TrainDeck).
    std::string dir = base + "/TrainDeck/TrainDeck";
    std::error_code ec;
    std::filesystem::create_directories(dir, ec);
    return dir + "/runs.db";
}

int train(const TrainArgs& a) {
    SessionOptions opt;
    opt.storePath = a.db.empty() ? defaultDbPath() : a.db;
    // The run's name is the command line's, not the project file's.
    if (std::string e = textProblem(a.runName, TextKind::Name); !e.empty()) {
        printError("--run-name: " + e);
        return 2;
    }
    Result<Project> project = err("no project");
    std::string label = a.project;
    if (!a.resume.empty()) {
        // The run continues with the project it was trained with; only its length may change.
        if (!a.project.empty() || !a.runName.empty() || a.batchSize > 0 || a.seed >= 0) {
            printError(
                "--resume: a resumed run keeps its project, name, batch size and seed "
                "(only --epochs, --db and --plain go with it)");
            return 2;
        }
        auto point = findResumePoint(opt.storePath, a.resume);
        if (!point.ok()) {
            printError("--resume " + a.resume + ": " + point.error());
            return 2;
        }
        label = "run " + std::to_string(point->runId);
        project = point->project;
        opt.resume = std::move(point).value();
    } else if (a.project.empty()) {
        printError("train: expected a project file, or --resume RUN");
        return 2;
    } else {
        project = openProject(a.project);
    }
    if (!project.ok()) {
        printError(project.error());
        return 2;
    }
    for (const std::string& pass : a.disablePasses)
        if (std::find(project->disabledPasses.begin(), project->disabledPasses.end(), pass) ==
            project->disabledPasses.end())
            project->disabledPasses.push_back(pass);
    opt.runName = a.runName;
    if (a.epochs > 0) opt.epochs = a.epochs;
    if (a.batchSize > 0) opt.batchSize = a.batchSize;
    if (a.seed >= 0) opt.seed = static_cast<uint64_t>(a.seed);
    // --detach: the run goes on in a process of its own session (an SSH logout does not end it),
    // its output in a log beside the store; this one says the run's id, or why it did not start.
    int detachFd = -1;
    if (a.detach) {
        const int rc = detach(opt.storePath, detachFd);
        if (rc >= 0) return rc;  // the parent
    }
    installStopSignals();
    auto session = Session::create(*project, opt);
    if (!session.ok()) {
        printError(label + ": " + session.error());
        return 2;
    }
    if (const int sig = gStopSignal.load()) {
        std::fprintf(
            stderr,
            "traindeck: %s received before the run started: nothing was trained or stored\n",
            stopSignalName(sig));
        return 128 + sig;
    }
    // Under MultiWorkerMirrored only the chief (rank 0) reports progress and stores the run; the
    // other workers speak only when they fail.
    const int rank = (*session)->workerRank();
    Progress progress(!a.plain && isatty(STDOUT_FILENO), rank != 0, a.verbose);
    auto queue = (*session)->events().subscribe();
    (*session)->start();
    // The session closes the queue after RunFinished on every path, the failed ones included.
    // Ten times a second, or when the run starts or ends: the step figures wake no thread
    // (EventQueue::waitBatch), so the progress costs the training cores nothing in between.
    int stopSignal = 0;
    std::string control;  // the run's control file, once the run is stored
    while (true) {
        std::vector<Event> batch = queue->waitBatch(std::chrono::milliseconds(100));
        for (const Event& e : batch) progress.onEvent(e);
        if (control.empty() && (*session)->runId() != 0 && rank == 0) {
            control = controlFile(opt.storePath, (*session)->runId());
            writeControlFile(control);
        }
        if (const int sig = gPauseSignal.exchange(0)) {
            if (sig == SIGUSR1 && !(*session)->paused()) {
                (*session)->pause();
                std::fprintf(stderr,
                             "\ntraindeck: paused after the current step (traindeck "
                             "continue, or SIGUSR2, continues)\n");
            } else if (sig == SIGUSR2 && (*session)->paused()) {
                (*session)->resume();
                std::fprintf(stderr, "\ntraindeck: continued\n");
            }
        }
        if (detachFd >= 0 && (*session)->runId() != 0) {
            const std::string line = "run " + std::to_string((*session)->runId()) + "\n";
            (void)!::write(detachFd, line.data(), line.size());
            ::close(detachFd);
            detachFd = -1;
        }
        if (batch.empty() && queue->closed()) break;
        if (const int sig = gStopSignal.load(); sig && !stopSignal) {
            stopSignal = sig;
            std::fprintf(stderr,
                         "\ntraindeck: %s received: stopping after the current step, writing a "
                         "checkpoint and storing the run (send it again to end at once)\n",
                         stopSignalName(sig));
            (*session)->requestStop();
        }
    }
    (*session)->join();
    if (!control.empty()) ::unlink(control.c_str());
    const std::optional<RunFinished>& fin = progress.finished();
    if (!fin) {
        printError(label + ": the run ended without a final status; the store " + opt.storePath +
                   " may not hold it");
        return 1;
    }
    if (fin->status == RunStatus::Failed) {
        printError(rank != 0 ? "worker rank " + std::to_string(rank) + ": " + fin->message
                             : fin->message);
        // A run the store could not take is not stored, or only in part.
        if (fin->storeError.empty() && rank == 0)
            std::printf("Stored in %s\n", opt.storePath.c_str());
        return 1;
    }
    if (rank == 0) std::printf("Stored in %s\n", opt.storePath.c_str());
    if (stopSignal && fin->status == RunStatus::Stopped) {
        const int64_t id = (*session)->runId();
        std::fprintf(stderr,
                     "traindeck: run %lld stopped by %s%s; continue it with: traindeck train "
                     "--resume %lld --db %s\n",
                     static_cast<long long>(id), stopSignalName(stopSignal),
                     progress.lastCheckpoint().empty()
                         ? ""
                         : (", checkpoint " + progress.lastCheckpoint()).c_str(),
                     static_cast<long long>(id), opt.storePath.c_str());
        return 128 + stopSignal;
    }
    if (rank == 0 && !a.saveModel.empty()) return saveTrainedModel(**session, a.saveModel);
    return 0;
}

int summary(const std::string& path) {
    // A Keras 3 model file: its model, as `import` reads it.
    std::ifstream probe(path, std::ios::binary);
    char head[2] = {};
    probe.read(head, 2);
    if (probe.gcount() == 2 && head[0] == 'P' && head[1] == 'K') {
        auto imported = importKerasModel(path, nullptr);
        if (!imported.ok()) {
            printError(imported.error());
            return 2;
        }
        auto info = inferShapes(imported->project.model);
        if (!info.ok()) {
            printError(path + ": " + info.error());
            return 2;
        }
        std::fputs(summaryTable(imported->project.model, *info).c_str(), stdout);
        return 0;
    }
    auto project = openProject(path);
    if (!project.ok()) {
        printError(project.error());
        return 2;
    }
    auto info = inferShapes(project->model);
    if (!info.ok()) {
        printError(path + ": " + info.error());
        return 2;
    }
    std::fputs(summaryTable(project->model, *info).c_str(), stdout);
    return 0;
}

namespace {

// A store named with --db for reading must be there: a mistyped path (here or in the app's
// Connect to Server) is an error, not a new empty store.
bool namedStoreMissing(const std::string& db, const std::string& command) {
    std::error_code ec;
    if (db.empty() || std::filesystem::exists(db, ec)) return false;
    printError(command + ": no run store at " + db +
               " (a store is created by `traindeck train`; check the path)");
    return true;
}

}  // namespace

int runs(const std::string& db, bool json) {
    if (namedStoreMissing(db, "runs")) return 2;
    auto store = RunStore::open(db.empty() ? defaultDbPath() : db);
    if (!store.ok()) {
        printError(store.error());
        return 2;
    }
    auto list = (*store)->listRuns();
    if (!list.ok()) {
        printError(list.error());
        return 2;
    }
    if (json) {
        nlohmann::json arr = nlohmann::json::array();
        for (const auto& r : *list) arr.push_back(runJson(r));
        std::printf("%s\n", arr.dump(2).c_str());
        return 0;
    }
    std::printf("%-5s %-24s %-11s %-19s %9s %-12s %10s %8s\n", "ID", "NAME", "STATUS", "STARTED",
                "DURATION", "MODEL", "PARAMS", "BEST VAL");
    for (const auto& r : *list) {
        const double dur = r.activeMs(r.endedAtMs) / 1000.0;  // stopped time not counted
        char best[16] = "-";
        if (r.bestValAccuracy) std::snprintf(best, sizeof best, "%.4f", *r.bestValAccuracy);
        std::printf("%-5lld %-24s %-11s %-19s %9s %-12s %10s %8s\n", static_cast<long long>(r.id),
                    r.name.substr(0, 24).c_str(), r.status.c_str(), fmtTime(r.startedAtMs).c_str(),
                    r.endedAtMs > 0 ? fmtDuration(dur).c_str() : "-",
                    r.modelName.substr(0, 12).c_str(), fmtParams(r.params).c_str(), best);
    }
    return 0;
}

int deleteRun(const std::string& db, const std::string& run, bool deleteCheckpoints) {
    auto catalog = api::RunCatalog::open(db.empty() ? defaultDbPath() : db);
    if (!catalog.ok()) {
        printError(catalog.error());
        return 2;
    }
    auto r = (*catalog)->findRun(run);
    if (!r.ok()) {
        printError(r.error());
        return 2;
    }
    if (r->status == "running") {
        printError("run " + std::to_string(r->id) + " is running (process " +
                   std::to_string(r->pid) + " on " + r->host + "); stop it first");
        return 2;
    }
    auto files = (*catalog)->checkpoints(r->id);
    if (!files.ok()) {
        printError(files.error());
        return 2;
    }
    if (Status st = (*catalog)->remove(r->id, deleteCheckpoints); !st.ok()) {
        printError(st.error());
        return 1;
    }
    std::printf("Deleted run %lld (%s)", static_cast<long long>(r->id), r->name.c_str());
    if (deleteCheckpoints)
        std::printf(" and its %zu checkpoint file%s\n", files->size(),
                    files->size() == 1 ? "" : "s");
    else if (!files->empty())
        std::printf("; its %zu checkpoint file%s stay (--delete-checkpoints deletes them)\n",
                    files->size(), files->size() == 1 ? "" : "s");
    else
        std::printf("\n");
    return 0;
}

int steer(const std::string& db, const std::string& run, const std::string& action) {
    const std::string storePath = db.empty() ? defaultDbPath() : db;
    auto store = RunStore::open(storePath);
    if (!store.ok()) {
        printError(store.error());
        return 2;
    }
    auto r = (*store)->findRun(run);
    if (!r.ok()) {
        printError(r.error());
        return 2;
    }
    const std::string what = "run " + std::to_string(r->id) + " (" + r->name + ")";
    if (r->status != "running") {
        printError(action + ": " + what + " is " + r->status + ", not running");
        return 2;
    }
    const std::string path = controlFile(storePath, r->id);
    std::ifstream in(path);
    long long pid = 0;
    std::string ticks, boot, host;
    in >> pid >> ticks >> boot >> host;
    if (!in || pid <= 0) {
        printError(action + ": " + what + " has no control file (" + path +
                   "): it is not trained by a headless `traindeck train` of this store (the "
                   "desktop app steers its own runs), or it is on another machine" +
                   (r->host.empty() ? std::string() : " (" + r->host + ")"));
        return 2;
    }
    if (host != hostName()) {
        printError(action + ": " + what + " trains on " + host + ", not here (" + hostName() +
                   "): run this there");
        return 2;
    }
    const auto p = static_cast<pid_t>(pid);
    if (processIdentity(p) != ticks + " " + boot) {
        printError(action + ": " + what + ": its process " + std::to_string(pid) +
                   " is gone (the pid is free or another process's now); nothing was signalled");
        return 2;
    }
    const int sig = action == "stop" ? SIGTERM : action == "pause" ? SIGUSR1 : SIGUSR2;
    if (::kill(p, sig) != 0) {
        printError(action + ": " + what + ": cannot signal process " + std::to_string(pid) + ": " +
                   std::strerror(errno));
        return 1;
    }
    std::printf("%s %s (process %lld)%s\n",
                action == "stop"    ? "Stopping"
                : action == "pause" ? "Pausing"
                                    : "Continuing",
                what.c_str(), pid, action == "continue" ? "" : " after its current step");
    return 0;
}

int show(const std::string& db, const std::string& run, bool json) {
    if (namedStoreMissing(db, "show " + run)) return 2;
    auto store = RunStore::open(db.empty() ? defaultDbPath() : db);
    if (!store.ok()) {
        printError(store.error());
        return 2;
    }
    auto r = (*store)->findRun(run);
    if (!r.ok()) {
        printError(r.error());
        return 2;
    }
    auto epochs = (*store)->epochs(r->id);
    if (!epochs.ok()) {
        printError(epochs.error());
        return 2;
    }
    if (json) {
        nlohmann::json j = runJson(*r);
        j["config"] =
            nlohmann::json::parse(r->configJson.empty() ? "{}" : r->configJson, nullptr, false);
        // The project as trained (a remote viewer compares it with another run's).
        j["project"] = nlohmann::json::parse(r->projectJson, nullptr, false);
        if (j["project"].is_discarded()) j["project"] = nullptr;
        j["epochs"] = nlohmann::json::array();
        for (const auto& e : *epochs) {
            nlohmann::json ej = {{"epoch", e.epoch}, {"seconds", e.seconds}};
            for (const auto& [k, v] : e.metrics) ej[k] = v;
            j["epochs"].push_back(ej);
        }
        std::printf("%s\n", j.dump(2).c_str());
        return 0;
    }
    std::printf("Run %lld: %s\n", static_cast<long long>(r->id), r->name.c_str());
    std::printf("  status:   %s%s\n", r->status.c_str(),
                r->message.empty() ? "" : (" (" + r->message + ")").c_str());
    std::printf("  started:  %s on %s (pid %lld)\n", fmtTime(r->startedAtMs).c_str(),
                r->host.c_str(), static_cast<long long>(r->pid));
    std::printf("  ended:    %s\n", fmtTime(r->endedAtMs).c_str());
    if (r->endedAtMs > 0)
        std::printf("  trained:  %s%s\n", fmtDuration(r->activeMs(r->endedAtMs) / 1000.0).c_str(),
                    r->idleMs > 0 ? (" (" + fmtDuration(r->idleMs / 1000.0) +
                                     " stopped between sessions not counted)")
                                        .c_str()
                                  : "");
    std::printf("  model:    %s, %s params, devices %s\n", r->modelName.c_str(),
                fmtParams(r->params).c_str(), r->devices.c_str());
    std::printf("  config:   %s\n", r->configJson.c_str());
    if (!r->notes.empty()) std::printf("  notes:    %s\n", r->notes.c_str());
    for (const auto& e : *epochs)
        std::printf("  epoch %3d %8.2fs%s\n", e.epoch + 1, e.seconds,
                    fmtMetrics(e.metrics).c_str());
    auto fm = nlohmann::json::parse(r->finalMetricsJson.empty() ? "{}" : r->finalMetricsJson,
                                    nullptr, false);
    if (fm.is_object() && !fm.empty()) {
        MetricMap m;
        for (auto it = fm.begin(); it != fm.end(); ++it)
            if (it.value().is_number()) m[it.key()] = it.value().get<double>();
        std::printf("  final:   %s\n", fmtMetrics(m).c_str());
    }
    return 0;
}

int devices(bool json) {
    auto devs = listDevices();
    if (json) {
        nlohmann::json arr = nlohmann::json::array();
        for (const auto& d : devs) {
            nlohmann::json j = {
                {"id", d.id}, {"kind", d.kind}, {"name", d.name}, {"memory_bytes", d.memoryBytes}};
            // GPU fields only where the device has them (the CPU has none).
            if (!d.computeCapability.empty()) j["compute_capability"] = d.computeCapability;
            if (d.memoryFreeBytes >= 0) j["memory_free_bytes"] = d.memoryFreeBytes;
            if (!d.driverVersion.empty()) j["driver_version"] = d.driverVersion;
            if (!d.runtimeVersion.empty()) j["runtime_version"] = d.runtimeVersion;
            arr.push_back(j);
        }
        std::printf("%s\n", arr.dump(2).c_str());
        return 0;
    }
    const auto gib = [](int64_t bytes) {
        return static_cast<double>(bytes) / (1024.0 * 1024.0 * 1024.0);
    };
    // One line per device: id, kind, memory, name; GPUs add compute capability, free memory and
    // the CUDA versions of driver and runtime.
    for (const auto& d : devs) {
        std::printf("%-8s %-6s %8.1f GiB  %s", d.id.c_str(), d.kind.c_str(), gib(d.memoryBytes),
                    d.name.c_str());
        if (!d.computeCapability.empty()) std::printf(", compute %s", d.computeCapability.c_str());
        if (d.memoryFreeBytes >= 0) std::printf(", %.1f GiB free", gib(d.memoryFreeBytes));
        if (!d.driverVersion.empty()) std::printf(", driver CUDA %s", d.driverVersion.c_str());
        if (!d.runtimeVersion.empty()) std::printf(", runtime CUDA %s", d.runtimeVersion.c_str());
        std::printf("\n");
    }
    // The strategies this build and machine can run, and why not where they cannot.
    for (const char* type : {"one_device", "mirrored", "multi_worker_mirrored"}) {
        const Capability c = strategyCapability(type);
        std::printf("strategy %-22s %s\n", type,
                    c.available ? "available" : ("unavailable: " + c.reason).c_str());
    }
    return 0;
}

int compile(const std::string& path, const std::string& dumpAfter, bool report,
            const std::vector<std::string>& disablePasses) {
    auto project = openProject(path);
    if (!project.ok()) {
        printError(project.error());
        return 2;
    }
    for (const std::string& pass : disablePasses)
        if (std::find(project->disabledPasses.begin(), project->disabledPasses.end(), pass) ==
            project->disabledPasses.end())
            project->disabledPasses.push_back(pass);
    if (report) {
        auto r = api::compileReport(*project);
        if (!r.ok()) {
            printError(path + ": " + r.error());
            return 2;
        }
        std::fputs(r->text.c_str(), stdout);
        return 0;
    }
    auto session = Session::create(*project, SessionOptions{});
    if (!session.ok()) {
        printError(path + ": " + session.error());
        return 2;
    }
    auto text = (*session)->dumpIr(dumpAfter.empty() ? "final" : dumpAfter);
    if (!text.ok()) {
        printError(text.error());
        return 2;
    }
    std::fputs(text->c_str(), stdout);
    return 0;
}

}  // namespace td::cli

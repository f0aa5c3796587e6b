#include "engine/distribute/mpi_world.h"

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <thread>

#include "engine/distribute/mpi_detail.h"

namespace td {

namespace {

// A whole non-negative decimal number, or -1.
int envInt(const char* name) {
    const char* s = std::getenv(name);
    if (!s || !*s) return -1;
    char* end = nullptr;
    errno = 0;
    const long v = std::strtol(s, &end, 10);
    if (errno != 0 || *end != '\0' || v < 0 || v > 1 << 30) return -1;
    return static_cast<int>(v);
}

bool envSet(const char* name) {
    const char* s = std::getenv(name);
    return s && *s;
}

std::atomic<int> gTerminationSignal{0};
std::atomic<bool> gBroken{false};
static_assert(std::atomic<int>::is_always_lock_free && std::atomic<bool>::is_always_lock_free);

#if TRAINDECK_HAVE_MPI
// Async-signal-safe: an atomic store, and on a second signal sigaction + raise.
extern "C" void onTerminationSignal(int sig) {
    int expected = 0;
    if (!gTerminationSignal.compare_exchange_strong(expected, sig)) {
        struct sigaction dfl {};
        dfl.sa_handler = SIG_DFL;
        sigemptyset(&dfl.sa_mask);
        sigaction(sig, &dfl, nullptr);
        raise(sig);
    }
}

void installTerminationHandler() {
    struct sigaction sa {};
    sa.sa_handler = onTerminationSignal;
    sigemptyset(&sa.sa_mask);
    // Blocking system calls elsewhere (file reads, SQLite) resume; the waits poll the flag.
    sa.sa_flags = SA_RESTART;
    sigaction(SIGTERM, &sa, nullptr);
    sigaction(SIGINT, &sa, nullptr);
}
#endif

}  // namespace

bool mpiSupported() {
#if TRAINDECK_HAVE_MPI
    return true;
#else
    return false;
#endif
}

MpiLaunch detectMpiLaunch() {
    MpiLaunch l;
    if (envSet("OMPI_COMM_WORLD_SIZE") || envSet("OMPI_COMM_WORLD_RANK")) {
        l.launched = true;
        l.launcher = "mpirun (Open MPI)";
        l.rank = envInt("OMPI_COMM_WORLD_RANK");
        l.size = envInt("OMPI_COMM_WORLD_SIZE");
        l.localRank = envInt("OMPI_COMM_WORLD_LOCAL_RANK");
        return l;
    }
    // srun sets the step variables; a batch script's own shell has SLURM_PROCID=0 and
    // SLURM_NTASKS but no step, and is not a launched worker.
    if (envSet("SLURM_PROCID") && (envSet("SLURM_STEP_NUM_TASKS") || envSet("SLURM_STEP_ID"))) {
        l.launched = true;
        l.launcher = "srun (Slurm)";
        l.rank = envInt("SLURM_PROCID");
        l.size = envSet("SLURM_STEP_NUM_TASKS") ? envInt("SLURM_STEP_NUM_TASKS")
                                                : envInt("SLURM_NTASKS");
        l.localRank = envInt("SLURM_LOCALID");
        return l;
    }
    if (envSet("PMI_RANK") || envSet("PMI_SIZE")) {
        l.launched = true;
        l.launcher = "PMI";
        l.rank = envInt("PMI_RANK");
        l.size = envInt("PMI_SIZE");
        l.localRank = envSet("MPI_LOCALRANKID") ? envInt("MPI_LOCALRANKID") : -1;
        return l;
    }
    if (envSet("PMIX_RANK")) {
        l.launched = true;
        l.launcher = "PMIx";
        l.rank = envInt("PMIX_RANK");
        l.size = -1;
        l.localRank = -1;
        return l;
    }
    return l;
}

std::string MpiWorld::describe() const {
    std::string s = "worker rank " + std::to_string(rank_) + " of " + std::to_string(size_) +
                    " on " + hostName() + " (local rank " + std::to_string(localRank_) + " of " +
                    std::to_string(localSize_) + ")";
    if (!launcher_.empty()) s += ", started by " + launcher_;
    return s;
}

int mpiTerminationSignal() {
    return gTerminationSignal.load(std::memory_order_relaxed);
}

std::string signalName(int signal) {
    if (signal == SIGTERM) return "SIGTERM";
    if (signal == SIGINT) return "SIGINT";
    return "signal " + std::to_string(signal);
}

void markMpiWorldBroken() {
    gBroken.store(true);
}

bool mpiWorldBroken() {
    return gBroken.load();
}

struct MpiWorldAccess {
    static MpiWorld* create() { return new MpiWorld(); }
    static void set(MpiWorld& w, int rank, int size, int threadLevel, std::string launcher,
                    std::vector<std::string> hosts) {
        w.rank_ = rank;
        w.size_ = size;
        w.threadLevel_ = threadLevel;
        w.launcher_ = std::move(launcher);
        w.hostNames_ = std::move(hosts);
        w.localRank_ = 0;
        w.localSize_ = 0;
        for (int r = 0; r < size; ++r) {
            if (w.hostNames_[static_cast<size_t>(r)] != w.hostName()) continue;
            if (r < rank) ++w.localRank_;
            ++w.localSize_;
        }
    }
};

#if TRAINDECK_HAVE_MPI

namespace mpi_detail {

std::mutex& callMutex() {
    static std::mutex m;
    return m;
}

std::string errorString(int code) {
    char text[MPI_MAX_ERROR_STRING] = {};
    int len = 0;
    if (MPI_Error_string(code, text, &len) != MPI_SUCCESS)
        return "MPI error " + std::to_string(code);
    return std::string(text, static_cast<size_t>(len));
}

void Backoff::pause() {
    const double waited = std::chrono::duration<double>(Clock::now() - start_).count();
    if (waited < 0.01) {
        std::this_thread::yield();
    } else if (waited < 0.2) {
        std::this_thread::sleep_for(std::chrono::microseconds(20));
    } else {
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
}

std::string formatSeconds(double seconds) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%g s", seconds);
    return buf;
}

Status pollRequest(MPI_Request* request, Clock::time_point deadline, const std::string& what,
                   double timeoutSeconds) {
    Backoff backoff;
    for (;;) {
        int done = 0;
        TD_RETURN_IF_ERROR(TD_MPI_CHECK(MPI_Test(request, &done, MPI_STATUS_IGNORE)));
        if (done) return Status::success();
        if (const int sig = mpiTerminationSignal())
            return err(what + ": the launcher is ending the job (" + signalName(sig) + ")");
        if (Clock::now() >= deadline)
            return err(what + ": not every worker arrived within " + formatSeconds(timeoutSeconds) +
                       " (one exited, hangs or never started)");
        backoff.pause();
    }
}

}  // namespace mpi_detail

namespace {

std::mutex gWorldMutex;
MpiWorld* gWorld = nullptr;  // never deleted: the atexit handler may run after static destructors
bool gWeInitialized = false;

void finalizeAtExit() {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (finalized) return;
    // A failed collective may have left requests to a dead or hung peer, and MPI_Finalize waits
    // for every peer; after a launcher's SIGTERM the job is being torn down anyway.
    if (gBroken.load() || gTerminationSignal.load() != 0) return;
    MPI_Finalize();
}

}  // namespace

Result<MpiWorld*> mpiWorld(double startupTimeoutSeconds) {
    using namespace mpi_detail;
    std::lock_guard<std::mutex> lock(gWorldMutex);
    if (gWorld) return gWorld;
    const MpiLaunch launch = detectMpiLaunch();
    if (!launch.launched)
        return err(
            "multi-worker training needs a launcher: start every worker with mpirun (e.g. "
            "`mpirun -np 2 traindeck train project.json`) or srun; this process was started "
            "directly (for one process, use the mirrored or one_device strategy)");
    int initialized = 0;
    TD_RETURN_IF_ERROR(TD_MPI_CHECK(MPI_Initialized(&initialized)));
    int provided = 0;
    if (initialized) {
        TD_RETURN_IF_ERROR(TD_MPI_CHECK(MPI_Query_thread(&provided)));
    } else {
        TD_RETURN_IF_ERROR(
            TD_MPI_CHECK(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_SERIALIZED, &provided)));
        gWeInitialized = true;
        std::atexit(finalizeAtExit);
    }
    // Errors come back as return codes (the default handler would end the process).
    TD_RETURN_IF_ERROR(TD_MPI_CHECK(MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN)));
    if (provided < MPI_THREAD_SERIALIZED)
        return err("MPI provides thread level " + std::to_string(provided) +
                   ", below MPI_THREAD_SERIALIZED (the engine calls MPI from its own thread); "
                   "use an MPI library built with thread support");
    installTerminationHandler();

    int rank = 0, size = 1;
    TD_RETURN_IF_ERROR(TD_MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &rank)));
    TD_RETURN_IF_ERROR(TD_MPI_CHECK(MPI_Comm_size(MPI_COMM_WORLD, &size)));

    char name[MPI_MAX_PROCESSOR_NAME] = {};
    int len = 0;
    TD_RETURN_IF_ERROR(TD_MPI_CHECK(MPI_Get_processor_name(name, &len)));
    std::vector<char> all(static_cast<size_t>(size) * MPI_MAX_PROCESSOR_NAME, '\0');
    MPI_Request req = MPI_REQUEST_NULL;
    TD_RETURN_IF_ERROR(
        TD_MPI_CHECK(MPI_Iallgather(name, MPI_MAX_PROCESSOR_NAME, MPI_CHAR, all.data(),
                                    MPI_MAX_PROCESSOR_NAME, MPI_CHAR, MPI_COMM_WORLD, &req)));
    const auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                             std::chrono::duration<double>(startupTimeoutSeconds));
    if (Status s = pollRequest(&req, deadline, "MPI start-up (host names of every worker)",
                               startupTimeoutSeconds);
        !s.ok()) {
        gBroken.store(true);
        return std::move(s).takeError();
    }
    std::vector<std::string> hosts;
    hosts.reserve(static_cast<size_t>(size));
    for (int r = 0; r < size; ++r) {
        const char* h = all.data() + static_cast<size_t>(r) * MPI_MAX_PROCESSOR_NAME;
        hosts.emplace_back(h, strnlen(h, MPI_MAX_PROCESSOR_NAME));
    }
    MpiWorld* w = MpiWorldAccess::create();
    MpiWorldAccess::set(*w, rank, size, provided, launch.launcher, std::move(hosts));
    gWorld = w;
    return gWorld;
}

bool mpiWorldStarted() {
    std::lock_guard<std::mutex> lock(gWorldMutex);
    return gWorld != nullptr;
}

void endFailedMpiRun(int exitCode) {
    {
        std::lock_guard<std::mutex> lock(gWorldMutex);
        if (!gWorld || !gWeInitialized) return;
    }
    gBroken.store(true);  // whatever happens next, no MPI_Finalize at exit
    if (gWorld->size() == 1) return;
    std::fflush(stdout);
    std::fflush(stderr);
    // The run is over; a thread still stuck in a wait gets a second to leave it.
    std::unique_lock<std::mutex> lock(mpi_detail::callMutex(), std::defer_lock);
    const auto until = mpi_detail::Clock::now() + std::chrono::seconds(1);
    while (!lock.try_lock() && mpi_detail::Clock::now() < until)
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
    MPI_Abort(MPI_COMM_WORLD, exitCode);
}

#else  // no MPI in this build

Result<MpiWorld*> mpiWorld(double) {
    return err(kNoMpiSupport);
}

bool mpiWorldStarted() {
    return false;
}

void endFailedMpiRun(int) {}

#endif

}  // namespace td

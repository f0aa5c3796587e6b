// MpiCollectives between processes. Started by check_mpi.sh under mpirun (mpi_launch.sh), one case
// per run:
//   test_mpi_collectives reduce    buckets of several sizes, sums exact and bit-identical on every
//                                  rank (hashes compared through allGatherHost)
//   test_mpi_collectives host      allReduceHost, allGatherHost, barrier
//   test_mpi_collectives hang      rank 1 sleeps past the 2 s timeout: rank 0 fails naming it
//   test_mpi_collectives abort     rank 1 aborts (from a second thread during a wait): rank 0 fails
//                                  at once with the reason
//   test_mpi_collectives kill      rank 1 kills itself (SIGKILL): rank 0 fails naming it
//   test_mpi_collectives bench     all-reduce times for 1 MB and 8 MB buckets
//   test_mpi_collectives launch    (run directly, not under mpirun) launch detection from the
//                                  environment, and mpiWorld() refusing without a launcher
// Every rank prints "[rank R] PASS ..." or "[rank R] FAIL ..." lines; exit 0 when the rank's
// checks passed, 1 otherwise (a rank expected to fail its collectives reports PASS and exits 1
// like a failed run would). Exit 77 when the build has no MPI.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "engine/distribute/mpi_collectives.h"
#include "engine/distribute/mpi_world.h"

#if TRAINDECK_HAVE_MPI
#define OMPI_SKIP_MPICXX 1
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>
#endif

namespace {

using Clock = std::chrono::steady_clock;

int gRank = -1;
bool gOk = true;

double secondsSince(Clock::time_point t0) {
    return std::chrono::duration<double>(Clock::now() - t0).count();
}

void say(const std::string& line) {
    if (gRank < 0)
        std::printf("%s\n", line.c_str());
    else
        std::printf("[rank %d] %s\n", gRank, line.c_str());
    std::fflush(stdout);
}

void check(bool cond, const std::string& what) {
    if (!cond) gOk = false;
    say(std::string(cond ? "PASS " : "FAIL ") + what);
}

bool contains(const std::string& s, const std::string& part) {
    return s.find(part) != std::string::npos;
}

// Values of rank r for element i of a bucket: not exactly representable sums, signs mixed.
float valueOf(int bucket, int r, int64_t i, int step) {
    const double x = std::sin(0.37 * static_cast<double>(i) + 1.3 * r + 0.11 * bucket + step);
    return static_cast<float>(x * (1.0 + 1e-3 * r) * std::pow(10.0, (i % 7) - 3));
}

uint64_t fnv1a(const void* p, size_t n, uint64_t h = 1469598103934665603ull) {
    const auto* b = static_cast<const unsigned char*>(p);
    for (size_t i = 0; i < n; ++i) {
        h ^= b[i];
        h *= 1099511628211ull;
    }
    return h;
}

void sleepSeconds(double s) {
    const auto until = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                          std::chrono::duration<double>(s));
    while (Clock::now() < until) std::this_thread::sleep_until(until);
}

// (a) Buckets of different sizes, started in order, waited in order and in reverse.
void caseReduce(td::MpiCollectives& c) {
    const std::vector<int64_t> sizes = {1, 3, 1000, 65537, (1 << 20) + 7, 5, 0};
    const int n = c.size();
    std::vector<std::vector<float>> data(sizes.size());
    for (int step = 0; step < 3; ++step) {
        for (size_t b = 0; b < sizes.size(); ++b) {
            data[b].resize(static_cast<size_t>(sizes[b]));
            for (int64_t i = 0; i < sizes[b]; ++i)
                data[b][static_cast<size_t>(i)] = valueOf(static_cast<int>(b), c.rank(), i, step);
            td::Status s = c.allReduceStart(static_cast<int>(b), data[b].data(), sizes[b]);
            if (!s.ok()) return check(false, "allReduceStart: " + s.error());
        }
        for (size_t k = 0; k < sizes.size(); ++k) {
            // Step 1 waits in reverse order: the buckets move along whatever is waited for.
            const size_t b = step == 1 ? sizes.size() - 1 - k : k;
            td::Status s = c.allReduceWait(static_cast<int>(b));
            if (!s.ok()) return check(false, "allReduceWait: " + s.error());
        }
        uint64_t hash = 1469598103934665603ull;
        int64_t wrong = 0;
        for (size_t b = 0; b < sizes.size(); ++b) {
            for (int64_t i = 0; i < sizes[b]; ++i) {
                // The documented order: x0 + x1 + ... in float.
                float want = valueOf(static_cast<int>(b), 0, i, step);
                for (int r = 1; r < n; ++r) want += valueOf(static_cast<int>(b), r, i, step);
                const float got = data[b][static_cast<size_t>(i)];
                if (std::memcmp(&want, &got, sizeof got) != 0) ++wrong;
            }
            hash = fnv1a(data[b].data(), data[b].size() * sizeof(float), hash);
        }
        check(wrong == 0, "step " + std::to_string(step) + ": every sum equals x0 + x1 + ... (" +
                              std::to_string(wrong) + " differ)");
        const double mine[2] = {static_cast<double>(hash >> 32),
                                static_cast<double>(hash & 0xffffffffu)};
        std::vector<double> all(2 * static_cast<size_t>(n));
        td::Status s = c.allGatherHost(mine, 2, all.data());
        if (!s.ok()) return check(false, "allGatherHost: " + s.error());
        bool same = true;
        for (int r = 0; r < n; ++r)
            same = same && all[2 * static_cast<size_t>(r)] == mine[0] &&
                   all[2 * static_cast<size_t>(r) + 1] == mine[1];
        check(same, "step " + std::to_string(step) + ": result hash identical on every rank");
    }
}

// (b) Host all-reduce, all-gather and barrier.
void caseHost(td::MpiCollectives& c) {
    const int n = c.size(), r = c.rank();
    double v[3] = {r + 1.0, 0.1 * r, 1e-17 * (r + 1)};
    double want[3] = {1.0, 0.0, 1e-17};
    for (int q = 1; q < n; ++q) {
        want[0] += q + 1.0;
        want[1] += 0.1 * q;
        want[2] += 1e-17 * (q + 1);
    }
    td::Status s = c.allReduceHost(v, 3);
    check(s.ok() && std::memcmp(v, want, sizeof v) == 0,
          "allReduceHost sums in rank order" + (s.ok() ? std::string() : ": " + s.error()));
    s = c.allReduceHost(nullptr, 0);
    check(s.ok(), "allReduceHost of no values");

    const double mine[2] = {static_cast<double>(r), 10.0 * r};
    std::vector<double> all(2 * static_cast<size_t>(n), -1);
    s = c.allGatherHost(mine, 2, all.data());
    bool right = s.ok();
    for (int q = 0; q < n && right; ++q)
        right =
            all[2 * static_cast<size_t>(q)] == q && all[2 * static_cast<size_t>(q) + 1] == 10.0 * q;
    check(right, "allGatherHost rank-major" + (s.ok() ? std::string() : ": " + s.error()));

    // The last rank arrives 0.5 s late: everyone else's barrier lasts about that long.
    if (r == n - 1) sleepSeconds(0.5);
    const auto t0 = Clock::now();
    s = c.barrier();
    const double waited = secondsSince(t0);
    check(s.ok(), "barrier" + (s.ok() ? std::string() : ": " + s.error()));
    if (r != n - 1) {
        char buf[96];
        std::snprintf(buf, sizeof buf, "barrier waited for the late rank (%.2f s)", waited);
        check(waited > 0.3, buf);
    }
    for (int i = 0; i < 3; ++i) s = c.barrier();
    check(s.ok(), "three more barriers");
}

// (c) Rank 1 sleeps past the timeout; rank 0 fails in timeout + a margin, naming rank 1, and
// every later call fails at once. Rank 0 then ends the job (endFailedMpiRun) so the sleeper does
// not hold it up.
void caseHang(td::MpiCollectives& c) {
    std::vector<float> x(4096, 1.0f);
    td::Status s = c.allReduceStart(0, x.data(), static_cast<int64_t>(x.size()));
    if (s.ok()) s = c.allReduceWait(0);
    check(s.ok(), "first all-reduce");
    if (c.rank() == 1) {
        say("sleeping 8 s");
        sleepSeconds(8);
        say("woke up");
        return;
    }
    const auto t0 = Clock::now();
    s = c.allReduceStart(0, x.data(), static_cast<int64_t>(x.size()));
    if (s.ok()) s = c.allReduceWait(0);
    const double took = secondsSince(t0);
    say("error after " + std::to_string(took) + " s: " + (s.ok() ? "none" : s.error()));
    check(!s.ok() && contains(s.error(), "worker rank 1 did not answer within 2 s"),
          "the wait names rank 1");
    check(took >= 1.9 && took < 2.0 + 1.0, "failed within the timeout + 1 s");
    const auto t1 = Clock::now();
    td::Status again = c.barrier();
    check(!again.ok() && again.error() == s.error() && secondsSince(t1) < 0.1,
          "a later call fails at once with the same error");
    check(td::mpiWorldBroken(), "the world is marked broken (no MPI_Finalize at exit)");
    say("ending the job");
    td::endFailedMpiRun(3);
    check(false, "endFailedMpiRun returned");
}

// (d) Rank 1 waits for a bucket rank 0 joins late; a second thread of rank 1 aborts meanwhile.
// Rank 1's wait fails with the reason; rank 0 fails at once when it joins.
void caseAbort(td::MpiCollectives& c) {
    const std::string reason = "x: the input pipeline of rank 1 failed";
    std::vector<float> x(1000, 1.0f);
    td::Status s = c.allReduceStart(0, x.data(), static_cast<int64_t>(x.size()));
    if (s.ok()) s = c.allReduceWait(0);
    check(s.ok(), "first all-reduce");
    if (c.rank() == 1) {
        std::thread aborter([&] {
            sleepSeconds(0.3);
            c.abort(reason);
        });
        const auto t0 = Clock::now();
        s = c.allReduceStart(1, x.data(), static_cast<int64_t>(x.size()));
        if (s.ok()) s = c.allReduceWait(1);
        const double took = secondsSince(t0);
        aborter.join();
        check(!s.ok() && s.error() == reason && took < 1.0,
              "the wait ends with the abort's reason (" + std::to_string(took) + " s)");
        check(!c.barrier().ok(), "a later call fails");
        sleepSeconds(2);  // rank 0 must not learn of it from this process ending
        return;
    }
    sleepSeconds(1.0);
    const auto t0 = Clock::now();
    s = c.allReduceStart(1, x.data(), static_cast<int64_t>(x.size()));
    if (s.ok()) s = c.allReduceWait(1);
    const double took = secondsSince(t0);
    say("error after " + std::to_string(took) + " s: " + (s.ok() ? "none" : s.error()));
    check(!s.ok() && contains(s.error(), "worker rank 1 failed: " + reason),
          "the error carries rank 1's reason");
    check(took < 0.5, "failed at once (timeout 30 s)");
}

// (e) Rank 1 is killed (SIGKILL) between steps; mpirun tears the job down. Rank 0 fails naming
// rank 1, through the launcher's SIGTERM or its own timeout.
void caseKill(td::MpiCollectives& c) {
    std::vector<float> x(100000, 1.0f);
    for (int step = 0; step < 3; ++step) {
        td::Status s = c.allReduceStart(0, x.data(), static_cast<int64_t>(x.size()));
        if (s.ok()) s = c.allReduceWait(0);
        if (!s.ok()) return check(false, "all-reduce before the kill: " + s.error());
    }
    check(true, "three all-reduces before the kill");
    if (c.rank() == 1) {
        say("killing myself");
        std::raise(SIGKILL);
    }
    const auto t0 = Clock::now();
    td::Status s;
    for (int step = 0; step < 1000 && s.ok(); ++step) {
        s = c.allReduceStart(0, x.data(), static_cast<int64_t>(x.size()));
        if (s.ok()) s = c.allReduceWait(0);
    }
    const double took = secondsSince(t0);
    say("error after " + std::to_string(took) + " s: " + (s.ok() ? "none" : s.error()));
    check(!s.ok() && (contains(s.error(),
                               "worker rank 1 stopped answering; the launcher is "
                               "ending the job (SIGTERM)") ||
                      contains(s.error(), "worker rank 1 did not answer")),
          "the error names rank 1");
}

// Launch detection reads the environment only; mpiWorld() refuses without a launcher and leaves
// MPI untouched. Runs in builds with and without MPI.
int caseLaunch() {
    const char* vars[] = {"OMPI_COMM_WORLD_SIZE",
                          "OMPI_COMM_WORLD_RANK",
                          "OMPI_COMM_WORLD_LOCAL_RANK",
                          "SLURM_PROCID",
                          "SLURM_NTASKS",
                          "SLURM_STEP_NUM_TASKS",
                          "SLURM_STEP_ID",
                          "SLURM_LOCALID",
                          "PMI_RANK",
                          "PMI_SIZE",
                          "MPI_LOCALRANKID",
                          "PMIX_RANK"};
    auto clear = [&] {
        for (const char* v : vars) unsetenv(v);
    };
    auto expect = [](const char* what, bool launched, const char* launcher, int rank, int size,
                     int local) {
        const td::MpiLaunch l = td::detectMpiLaunch();
        check(l.launched == launched && l.launcher == launcher && l.rank == rank &&
                  l.size == size && l.localRank == local,
              std::string(what) + ": launched=" + std::to_string(l.launched) + " '" + l.launcher +
                  "' rank " + std::to_string(l.rank) + " size " + std::to_string(l.size) +
                  " local " + std::to_string(l.localRank));
    };
    clear();
    expect("no launcher", false, "", 0, 1, 0);
    setenv("OMPI_COMM_WORLD_SIZE", "4", 1);
    setenv("OMPI_COMM_WORLD_RANK", "3", 1);
    setenv("OMPI_COMM_WORLD_LOCAL_RANK", "1", 1);
    expect("mpirun", true, "mpirun (Open MPI)", 3, 4, 1);
    clear();
    // A batch script's own shell: Slurm variables but no step.
    setenv("SLURM_PROCID", "0", 1);
    setenv("SLURM_NTASKS", "8", 1);
    expect("sbatch shell", false, "", 0, 1, 0);
    setenv("SLURM_STEP_ID", "0", 1);
    setenv("SLURM_STEP_NUM_TASKS", "2", 1);
    setenv("SLURM_PROCID", "1", 1);
    setenv("SLURM_LOCALID", "0", 1);
    expect("srun", true, "srun (Slurm)", 1, 2, 0);
    clear();
    setenv("PMI_RANK", "2", 1);
    setenv("PMI_SIZE", "3", 1);
    expect("PMI", true, "PMI", 2, 3, -1);
    clear();
    setenv("PMIX_RANK", "5", 1);
    expect("PMIx", true, "PMIx", 5, -1, -1);
    clear();
    setenv("OMPI_COMM_WORLD_SIZE", "two", 1);
    expect("unreadable size", true, "mpirun (Open MPI)", -1, -1, -1);
    clear();

    auto world = td::mpiWorld();
    const std::string want =
        td::mpiSupported() ? "multi-worker training needs a launcher" : td::kNoMpiSupport;
    check(!world.ok() && contains(world.error(), want),
          "mpiWorld() without a launcher: " + (world.ok() ? "ok" : world.error()));
    check(!td::mpiWorldStarted(), "MPI was not started");
#if TRAINDECK_HAVE_MPI
    int initialized = 1;
    MPI_Initialized(&initialized);
    check(initialized == 0, "MPI_Initialized is false");
#endif
    td::endFailedMpiRun(1);  // nothing to end: returns
    check(true, "endFailedMpiRun returns when MPI was never started");
    return gOk ? 0 : 1;
}

void caseBench(td::MpiCollectives& c) {
    for (const int64_t bytes : {int64_t(1) << 20, int64_t(8) << 20}) {
        const int64_t count = bytes / 4;
        std::vector<float> x(static_cast<size_t>(count), 1.0f);
        auto once = [&]() -> double {
            const auto t0 = Clock::now();
            td::Status s = c.allReduceStart(0, x.data(), count);
            if (s.ok()) s = c.allReduceWait(0);
            if (!s.ok()) {
                check(false, "bench: " + s.error());
                return -1;
            }
            return secondsSince(t0);
        };
        for (int i = 0; i < 5; ++i) once();
        std::vector<double> t;
        for (int i = 0; i < 30; ++i) t.push_back(once());
        std::sort(t.begin(), t.end());
#if TRAINDECK_HAVE_MPI
        std::vector<double> ref;
        for (int i = 0; i < 35; ++i) {
            const auto t0 = Clock::now();
            MPI_Allreduce(MPI_IN_PLACE, x.data(), static_cast<int>(count), MPI_FLOAT, MPI_SUM,
                          MPI_COMM_WORLD);
            if (i >= 5) ref.push_back(secondsSince(t0));
        }
        std::sort(ref.begin(), ref.end());
        const double refMedian = ref[ref.size() / 2];
#else
        const double refMedian = 0;
#endif
        if (c.rank() == 0) {
            char buf[300];
            const double med = t[t.size() / 2];
            double mean = 0;
            for (double v : t) mean += v / static_cast<double>(t.size());
            std::snprintf(buf, sizeof buf,
                          "bench %lld MB: median %.3f ms (%.2f GB/s of bucket), min %.3f ms, "
                          "mean %.3f ms, max %.3f ms; MPI_Allreduce median %.3f ms",
                          static_cast<long long>(bytes >> 20), med * 1e3,
                          static_cast<double>(bytes) / med / 1e9, t.front() * 1e3, mean * 1e3,
                          t.back() * 1e3, refMedian * 1e3);
            say(buf);
        }
    }
}

}  // namespace

int main(int argc, char** argv) {
    const std::string mode = argc > 1 ? argv[1] : "";
    if (mode == "launch") return caseLaunch();
    if (!td::mpiSupported()) {
        std::printf("SKIP: %s\n", td::kNoMpiSupport);
        return 77;
    }
    if (!td::detectMpiLaunch().launched) {
        std::fprintf(stderr,
                     "test_mpi_collectives: start it under mpirun (tests/distribute/check_mpi.sh "
                     "runs every case)\n");
        return 2;
    }
    auto world = td::mpiWorld();
    if (!world.ok()) {
        std::printf("FAIL mpiWorld: %s\n", world.error().c_str());
        return 1;
    }
    gRank = (*world)->rank();
    say((*world)->describe());
    const double timeout = mode == "hang" ? 2.0 : 30.0;
    auto made = td::MpiCollectives::create(**world, timeout);
    if (!made.ok()) {
        say("FAIL MpiCollectives::create: " + made.error());
        return 1;
    }
    td::MpiCollectives& c = **made;
    if (c.size() < 2) {
        say("FAIL needs at least 2 workers, got " + std::to_string(c.size()));
        return 1;
    }
    if (mode == "reduce") {
        caseReduce(c);
    } else if (mode == "host") {
        caseHost(c);
    } else if (mode == "hang") {
        caseHang(c);
    } else if (mode == "abort") {
        caseAbort(c);
    } else if (mode == "kill") {
        caseKill(c);
    } else if (mode == "bench") {
        caseBench(c);
    } else {
        say("FAIL unknown case '" + mode + "' (reduce, host, hang, abort, kill, bench)");
        return 2;
    }
    if (!gOk) return 1;
    // A worker whose group broke ends like a failed run: non-zero, without MPI_Finalize.
    if (c.broken()) {
        say("done (group broken: " + c.error() + ")");
        return 1;
    }
    say("done");
    return 0;
}

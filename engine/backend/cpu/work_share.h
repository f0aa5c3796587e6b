// A small team of helper threads that share the pieces of one operation with the calling thread,
// for a device whose step runs on one thread but whose large products and optimizer update are
// worth splitting across the other cores.
//
// Why not an OpenMP team: on a machine with as many cores as the device has threads, the input
// pipeline's threads share those cores with the step. An OpenMP region splits its work evenly up
// front and waits at a barrier for every member, so a member the scheduler has parked behind a
// pipeline thread stalls the whole step for a time slice. Here the pieces are claimed one at a
// time: the caller takes whatever a helper has not claimed yet, so a late helper costs at most
// the piece it holds. Idle helpers spin briefly, then yield their core between checks (so the
// pipeline's threads run when they have work), and sleep on a condition variable after 2 ms
// without a job.
//
// Each thread owns a fixed, contiguous run of the pieces (piece p belongs to thread
// p * width / pieces) and runs its own first; only then does it take pieces another thread has
// not started. Operations split alike (a weight gradient by rows, the update by the same
// parameters) so keep the same data on the same core from one step to the next, in its cache.
// A job may ask for interleaved ownership instead (piece p belongs to thread p % width): pieces
// whose work grows along the split (an image's middle rows of pixels hold more nonzeros than its
// first and last) then spread evenly over the threads.
//
// The split is decided by the caller and fixed at compile time, never by which thread runs a
// piece, so results do not depend on timing.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <type_traits>
#include <vector>

namespace td {

class WorkShare {
  public:
    static constexpr int64_t kMaxPieces = 1 << 16;
    // `helpers` threads besides the caller; each runs `threadInit` once when it starts (the
    // device's per-thread setup: floating-point modes, its OpenMP team size).
    explicit WorkShare(int helpers, std::function<void()> threadInit = {});
    ~WorkShare();
    WorkShare(const WorkShare&) = delete;
    WorkShare& operator=(const WorkShare&) = delete;

    // The caller and its helpers.
    int width() const { return static_cast<int>(threads_.size()) + 1; }

    // Runs fn(piece, worker) for every piece in [0, pieces), each exactly once, on the calling
    // thread (worker 0) and the helpers (workers 1..width()-1); returns when all have finished.
    // Pieces may run in any order and at the same time. One caller at a time; under kMaxPieces
    // pieces.
    // Which pieces a worker owns (runs first): a contiguous run each, or every width()-th piece.
    enum class Ownership { Runs, Interleaved };
    // The first piece worker w of `width` owns under Ownership::Runs (also for a team of
    // threads that splits pieces the same way without a WorkShare).
    static int64_t firstOwned(int64_t pieces, int w, int width) { return pieces * w / width; }
    int64_t firstOwned(int64_t pieces, int w) const { return firstOwned(pieces, w, width()); }
    template <class F>
    void run(int64_t pieces, F&& fn, Ownership ownership = Ownership::Runs) {
        runImpl(
            pieces,
            [](void* ctx, int64_t piece, int worker) {
                (*static_cast<std::remove_reference_t<F>*>(ctx))(piece, worker);
            },
            &fn, ownership == Ownership::Interleaved);
    }

    // Aside: one task for a helper's idle moments. post() hands `task` to the first helper that
    // finishes its share of a job begun after the call (the rest of the caller's work then goes
    // on without waiting for it); finishPosted() returns once it ran, running it on the caller
    // when no helper has started it. One task at a time, from the thread that calls run().
    // False from post(): no helpers (the caller runs the task itself).
    bool post(void (*task)(void*), void* ctx);
    void finishPosted();

  private:
    using Call = void (*)(void*, int64_t, int);
    void runImpl(int64_t pieces, Call call, void* ctx, bool interleaved);
    // Claims and runs pieces of job `gen`, its own first, until none is left or another job has
    // begun. Under interleaved ownership a slot counts the owner's pieces (k-th: k * width +
    // owner) instead of holding piece numbers.
    void work(uint32_t gen, int worker);
    // The next unclaimed piece of those worker `owner` owns, claimed; -1: none (or a new job).
    int64_t claim(uint32_t gen, int owner);
    void helperLoop(int worker, const std::function<void()>& init);

    // Per worker: the job's generation in the high 32 bits, then the next unclaimed piece of
    // those it owns and the end of its run, 16 bits each. A claim reads nothing else, so one
    // that is late (its job finished, the next one begun) fails on the generation instead of
    // taking a piece of the next job.
    struct alignas(64) Slot {
        std::atomic<uint64_t> next{0};
    };
    std::vector<Slot> slots_;
    alignas(64) std::atomic<uint32_t> job_{0};  // the current job's generation
    alignas(64) std::atomic<int64_t> done_{0};
    std::atomic<Call> call_{nullptr};
    std::atomic<void*> ctx_{nullptr};
    std::atomic<bool> interleaved_{false};
    uint32_t gen_ = 0;  // the caller's
    // The aside task: kAsideNone, then kAsidePosted (after job asideAfter_), kAsideRunning,
    // kAsideDone.
    enum : int { kAsideNone, kAsidePosted, kAsideRunning, kAsideDone };
    alignas(64) std::atomic<int> aside_{kAsideNone};
    void (*asideTask_)(void*) = nullptr;
    void* asideCtx_ = nullptr;
    std::atomic<uint32_t> asideAfter_{0};
    void runAside(uint32_t gen);
    std::atomic<int> sleepers_{0};
    std::atomic<bool> stop_{false};
    std::mutex mu_;
    std::condition_variable cv_;
    std::vector<std::thread> threads_;
};

}  // namespace td

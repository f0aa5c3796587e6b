#include "engine/backend/cpu/work_share.h"

#include "engine/core/result.h"

#include <pthread.h>

#include <chrono>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define TD_CPU_RELAX() _mm_pause()
#else
#define TD_CPU_RELAX() std::this_thread::yield()
#endif

namespace td {
namespace {

using Clock = std::chrono::steady_clock;

// An idle helper watches for the next job, spinning for kHelperSpin, then yielding its core
// between checks (to the input pipeline's threads, when they have work) until kHelperWatch, and
// then sleeps. The split work of one step (forward product, gradient products, update) comes
// every 100-600 us on a small model; a helper that slept in between arrived too late to take its
// share (measured on a 2-core machine: seed MLP at batch 32, 154-170 us per step with a 40 us
// spin and sleep, 137-145 with this).
constexpr auto kHelperSpin = std::chrono::microseconds(10);
constexpr auto kHelperWatch = std::chrono::milliseconds(2);
// How long the caller spins on a piece a helper holds before it yields its core (the helper may
// be waiting for that core).
constexpr auto kCallerSpin = std::chrono::microseconds(20);

// A slot: the job's generation, the next unclaimed piece and the end of the owner's run, all in
// one word, so a claim never reads anything a later job may have rewritten.
constexpr uint64_t pack(uint32_t gen, uint64_t next, uint64_t end) {
    return (static_cast<uint64_t>(gen) << 32) | (next << 16) | end;
}

}  // namespace

WorkShare::WorkShare(int helpers, std::function<void()> threadInit)
    : slots_(static_cast<size_t>(std::max(helpers, 0)) + 1) {
    threads_.reserve(static_cast<size_t>(std::max(helpers, 0)));
    for (int w = 1; w <= helpers; ++w)
        threads_.emplace_back([this, w, threadInit] { helperLoop(w, threadInit); });
}

WorkShare::~WorkShare() {
    {
        std::lock_guard<std::mutex> lk(mu_);
        stop_.store(true);
    }
    cv_.notify_all();
    for (std::thread& t : threads_) t.join();
}

int64_t WorkShare::claim(uint32_t gen, int owner) {
    std::atomic<uint64_t>& next = slots_[static_cast<size_t>(owner)].next;
    uint64_t cur = next.load(std::memory_order_acquire);
    for (;;) {
        if (static_cast<uint32_t>(cur >> 32) != gen) return -1;
        const auto piece = static_cast<int64_t>((cur >> 16) & 0xffff);
        if (piece >= static_cast<int64_t>(cur & 0xffff)) return -1;
        if (next.compare_exchange_weak(cur, cur + (uint64_t{1} << 16), std::memory_order_acq_rel,
                                       std::memory_order_acquire))
            return piece;
    }
}

void WorkShare::work(uint32_t gen, int worker) {
    const int n = width();
    for (int k = 0; k < n; ++k) {
        const int owner = (worker + k) % n;
        for (int64_t c; (c = claim(gen, owner)) >= 0;) {
            // Read after a claim of this job's generation, so this job's (see runImpl).
            const int64_t piece = interleaved_.load(std::memory_order_relaxed) ? c * n + owner : c;
            call_.load(std::memory_order_relaxed)(ctx_.load(std::memory_order_relaxed), piece,
                                                  worker);
            done_.fetch_add(1, std::memory_order_acq_rel);
        }
    }
}

void WorkShare::runImpl(int64_t pieces, Call call, void* ctx, bool interleaved) {
    if (pieces <= 0) return;
    if (threads_.empty() || pieces == 1) {
        for (int64_t p = 0; p < pieces; ++p) call(ctx, p, 0);
        return;
    }
    // The previous job is finished (done_ reached its count), so no helper touches these until
    // the store of next_ below publishes them.
    TD_ASSERT_MSG(pieces < kMaxPieces, "WorkShare: too many pieces for one job");
    call_.store(call, std::memory_order_relaxed);
    ctx_.store(ctx, std::memory_order_relaxed);
    interleaved_.store(interleaved, std::memory_order_relaxed);
    done_.store(0, std::memory_order_relaxed);
    if (++gen_ == 0) ++gen_;  // 0 is the helpers' "none seen yet"
    const uint32_t gen = gen_;
    const int n = width();
    for (int w = 0; w < n; ++w) {
        // Interleaved: the owner's count of pieces (those p < pieces with p % n == w).
        const int64_t first = interleaved ? 0 : firstOwned(pieces, w);
        const int64_t end = interleaved ? (pieces - w + n - 1) / n : firstOwned(pieces, w + 1);
        slots_[static_cast<size_t>(w)].next.store(
            pack(gen, static_cast<uint64_t>(first), static_cast<uint64_t>(end)),
            std::memory_order_release);
    }
    job_.store(gen, std::memory_order_seq_cst);
    if (sleepers_.load(std::memory_order_seq_cst) > 0) {
        { std::lock_guard<std::mutex> lk(mu_); }
        cv_.notify_all();
    }
    work(gen, 0);
    // Pieces still held by helpers: spin a little, then give the core away between checks.
    const auto t0 = Clock::now();
    int spins = 0;
    while (done_.load(std::memory_order_acquire) < pieces) {
        if ((++spins & 63) == 0 && Clock::now() - t0 > kCallerSpin)
            std::this_thread::yield();
        else
            TD_CPU_RELAX();
    }
}

bool WorkShare::post(void (*task)(void*), void* ctx) {
    if (threads_.empty()) return false;
    TD_ASSERT_MSG(aside_.load(std::memory_order_relaxed) == kAsideNone,
                  "WorkShare: a posted task was not finished");
    asideTask_ = task;
    asideCtx_ = ctx;
    asideAfter_.store(gen_, std::memory_order_relaxed);
    aside_.store(kAsidePosted, std::memory_order_release);
    return true;
}

// A helper that has just finished its share of job `gen`: the posted task, when it was posted
// before that job began (a helper late from a job begun before the post leaves it alone; the
// generations wrap, hence the signed difference). asideAfter_ is atomic because a helper late
// enough may read it while the caller posts the next task.
void WorkShare::runAside(uint32_t gen) {
    int expected = kAsidePosted;
    if (aside_.load(std::memory_order_acquire) != kAsidePosted ||
        static_cast<int32_t>(gen - asideAfter_.load(std::memory_order_relaxed)) <= 0 ||
        !aside_.compare_exchange_strong(expected, kAsideRunning, std::memory_order_acq_rel))
        return;
    asideTask_(asideCtx_);
    aside_.store(kAsideDone, std::memory_order_release);
}

void WorkShare::finishPosted() {
    int expected = kAsidePosted;
    if (aside_.compare_exchange_strong(expected, kAsideRunning, std::memory_order_acq_rel)) {
        asideTask_(asideCtx_);  // no helper took it
    } else if (expected == kAsideRunning) {
        const auto t0 = Clock::now();
        int spins = 0;
        while (aside_.load(std::memory_order_acquire) != kAsideDone) {
            if ((++spins & 63) == 0 && Clock::now() - t0 > kCallerSpin)
                std::this_thread::yield();
            else
                TD_CPU_RELAX();
        }
    } else if (expected == kAsideNone) {
        return;
    }
    aside_.store(kAsideNone, std::memory_order_release);
}

void WorkShare::helperLoop(int worker, const std::function<void()>& init) {
    // Named for top, gdb and perf (at most 15 characters).
    pthread_setname_np(pthread_self(), ("td-share-" + std::to_string(worker)).c_str());
    if (init) init();
    uint32_t seen = 0;
    auto fresh = [&] { return job_.load(std::memory_order_seq_cst); };
    for (;;) {
        const auto t0 = Clock::now();
        int spins = 0;
        while (fresh() == seen && !stop_.load(std::memory_order_relaxed)) {
            if ((++spins & 63) != 0) {
                TD_CPU_RELAX();
                continue;
            }
            const auto idle = Clock::now() - t0;
            if (idle < kHelperSpin) continue;
            if (idle < kHelperWatch) {
                std::this_thread::yield();
                continue;
            }
            {
                std::unique_lock<std::mutex> lk(mu_);
                sleepers_.fetch_add(1, std::memory_order_seq_cst);
                cv_.wait(lk, [&] { return fresh() != seen || stop_.load(); });
                sleepers_.fetch_sub(1, std::memory_order_seq_cst);
            }
            break;
        }
        if (stop_.load()) return;
        seen = fresh();
        work(seen, worker);
        runAside(seen);
    }
}

}  // namespace td

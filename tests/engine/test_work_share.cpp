// WorkShare (engine/backend/cpu/work_share.h) and what the CPU device splits across it: every piece
// runs exactly once whatever the timing, a helper that is late leaves its pieces to the caller, and
// a product or an optimizer update split into pieces equals the whole one.
#include <omp.h>

#include <unistd.h>
#include <QtTest/QtTest>
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <future>
#include <initializer_list>
#include <random>
#include <thread>
#include <vector>

#include "engine/backend/cpu/cpu_passes.h"
#include "engine/backend/cpu/sparse_kernels.h"
#include "engine/backend/cpu/update.h"
#include "engine/backend/cpu/weight_placement.h"
#include "engine/backend/cpu/work_share.h"
#include "engine/backend/host_threads.h"
#include "engine/core/cpu_isa.h"
#include "engine/train/optimizer.h"
#include "tests/graph/harness.h"

using td::WorkShare;

namespace {

// What fn writes to stderr (file descriptor 2).
template <class F>
std::string stderrOf(F&& fn) {
    std::fflush(stderr);
    FILE* tmp = std::tmpfile();
    if (!tmp) return "(no temporary file)";
    const int saved = dup(2);
    dup2(fileno(tmp), 2);
    fn();
    std::fflush(stderr);
    dup2(saved, 2);
    close(saved);
    std::rewind(tmp);
    std::string text;
    char chunk[4096];
    for (size_t n; (n = std::fread(chunk, 1, sizeof chunk, tmp)) > 0;) text.append(chunk, n);
    std::fclose(tmp);
    return text;
}

// The calling thread's OpenMP team size, restored when it goes out of scope: the harness sets
// it, and the next test case needs it back even when a check fails.
struct RestoreThreads {
    int n = omp_get_max_threads();
    ~RestoreThreads() { omp_set_num_threads(n); }
};

// Each vector in turn filled with values uniform in [-scale, scale) drawn from rng.
void fillUniform(std::mt19937& rng, std::initializer_list<std::vector<float>*> vectors,
                 float scale = 1.f) {
    std::uniform_real_distribution<float> uni(-1.f, 1.f);
    for (std::vector<float>* v : vectors)
        for (float& e : *v) e = scale * uni(rng);
}

// Compiles `ir` with its gradients into h for `threads` threads, profiled (TRAINDECK_PROFILE=1,
// unset again before it returns) and with the CPU device's pass `off` turned off when given. Then
// copies in the parameters (in order), the input and the labels. Callers check
// QTest::currentTestFailed() after it.
void compileProfiled(tdtest::Harness& h, const std::string& ir, int threads, const char* off,
                     std::initializer_list<const std::vector<float>*> params,
                     const std::vector<float>& x, const std::vector<float>& y,
                     int deviceThreads = 0) {
    setenv("TRAINDECK_PROFILE", "1", 1);
    td::Graph g = tdtest::parseOrDie(ir);
    const bool differentiated = td::autodiff(g).ok();
    td::CompileOptions co;
    if (off) co.disabled.insert(off);
    tdtest::HarnessOptions opt;
    opt.passes = &co;
    opt.programThreads = threads;
    opt.deviceThreads = deviceThreads;
    std::string error;
    const bool compiled = differentiated && h.compile(std::move(g), {}, &error, opt);
    unsetenv("TRAINDECK_PROFILE");
    QVERIFY(differentiated);
    QVERIFY2(compiled, error.c_str());
    size_t t = 0;
    for (const std::vector<float>* p : params) std::memcpy(h.param(t++), p->data(), p->size() * 4);
    std::memcpy(h.in(), x.data(), x.size() * 4);
    std::memcpy(h.lab(), y.data(), y.size() * 4);
}

// Ten steps of the program compiled by compileProfiled (the pass `off` turned off when given, the
// step on `programThreads` threads: 1, its large work on the device's WorkShare; 2, the team), SGD
// applied on the host after each so that every step's products see new weights: out receives each
// step's loss, then the last step's gradients. Returns the profile (stderr).
std::string sgdSteps(const std::string& ir, const char* off,
                     std::initializer_list<const std::vector<float>*> params,
                     const std::vector<float>& x, const std::vector<float>& y,
                     std::vector<float>* out, int deviceThreads = 0, int programThreads = 1) {
    return stderrOf([&] {
        tdtest::Harness h;
        compileProfiled(h, ir, programThreads, off, params, x, y, deviceThreads);
        if (QTest::currentTestFailed()) return;
        const size_t tensors = params.size();
        for (int step = 1; step <= 10; ++step) {
            h.run(step);
            out->push_back(h.output("loss")[0]);
            for (size_t t = 0; t < tensors; ++t)
                for (size_t e = 0; e < h.params[t].bytes / 4; ++e)
                    h.param(t)[e] -= 0.05f * h.grad(t)[e];
        }
        for (size_t t = 0; t < tensors; ++t)
            out->insert(out->end(), h.grad(t), h.grad(t) + h.params[t].bytes / 4);
    });
}

// Whether pixel k of sample i lies in the sample's bright window: images 28 pixels wide on a
// dark background, the window moving with the sample (about 55% zeros, in runs along each row).
bool insideWindow(size_t i, size_t k) {
    const size_t r = k / 28, c = k % 28, shift = i % 5;
    return r >= 3 + shift && r < 22 + shift / 2 && c >= 5 + shift && c < 22 + shift / 2;
}

// `rows` such images of 784 pixels, each pixel in its window drawn from rng in [0, 1), the rest 0.
std::vector<float> windowImages(std::mt19937& rng, size_t rows) {
    std::uniform_real_distribution<float> uni(-1.f, 1.f);
    std::vector<float> images(rows * 784);
    for (size_t i = 0; i < rows; ++i)
        for (size_t k = 0; k < 784; ++k)
            images[i * 784 + k] = insideWindow(i, k) ? 0.5f + 0.5f * uni(rng) : 0.f;
    return images;
}

// Two dense layers on a batch of `rows` 784-pixel inputs (784-128 ReLU, 128-64) and an MSE loss.
std::string twoLayerIr(int rows) {
    const std::string b = std::to_string(rows);
    return "graph t {\n %0 = input() : f32[" + b +
           ",784]\n"
           " %1 = param() {name=w} : f32[784,128]\n"
           " %2 = param() {name=b} : f32[128]\n"
           " %3 = matmul(%0, %1) {trans_a=0, trans_b=0} : f32[" +
           b + ",128]\n %4 = bias_add(%3, %2) : f32[" + b +
           ",128]\n %5 = act(%4) {act=relu} : f32[" + b +
           ",128]\n %6 = param() {name=w2} : f32[128,64]\n"
           " %7 = matmul(%5, %6) {trans_a=0, trans_b=0} : f32[" +
           b + ",64]\n %8 = label() : f32[" + b +
           ",64]\n %9 = loss(%7, %8) {loss=mse, scale=" + std::to_string(1.0 / rows) +
           "} : f32[1]\n output loss = %9\n}\n";
}

}  // namespace

class TestWorkShare : public QObject {
    Q_OBJECT

  private slots:
    void ownership() {
        WorkShare share(1);
        QCOMPARE(share.width(), 2);
        // Interleaved ownership: the caller owns the even pieces, the helper the odd; with the
        // helper kept out, the caller runs its own first, in order, then the helper's.
        {
            std::promise<void> release;
            std::shared_future<void> gate = release.get_future().share();
            WorkShare parked(1, [gate] { gate.wait(); });
            std::vector<int> order;
            parked.run(
                7, [&](int64_t p, int) { order.push_back(static_cast<int>(p)); },
                WorkShare::Ownership::Interleaved);
            release.set_value();
            QCOMPARE(order, (std::vector<int>{0, 2, 4, 6, 1, 3, 5}));
        }
        QCOMPARE(share.firstOwned(8, 0), int64_t{0});
        QCOMPARE(share.firstOwned(8, 1), int64_t{4});
        QCOMPARE(share.firstOwned(8, 2), int64_t{8});
        QCOMPARE(share.firstOwned(3, 1), int64_t{1});
        WorkShare none(0);
        QCOMPARE(none.width(), 1);
    }

    // Thousands of jobs of every size, back to back, so helpers arrive early, late or asleep:
    // each piece runs once, on a worker of the share.
    void everyPieceOnce_data() {
        QTest::addColumn<int>("helpers");
        QTest::addColumn<bool>("interleaved");
        QTest::newRow("1 helper") << 1 << false;
        QTest::newRow("3 helpers") << 3 << false;
        QTest::newRow("1 helper, interleaved") << 1 << true;
        QTest::newRow("3 helpers, interleaved") << 3 << true;
    }
    void everyPieceOnce() {
        QFETCH(int, helpers);
        QFETCH(bool, interleaved);
        const auto ownership =
            interleaved ? WorkShare::Ownership::Interleaved : WorkShare::Ownership::Runs;
        WorkShare share(helpers);
        std::vector<std::atomic<int>> runs(64);
        std::atomic<int> badWorker{0};
        // Sizes that grow and shrink from one job to the next: a claim left over from a job must
        // never take a piece of the next one (whose runs start elsewhere).
        const int64_t sizes[] = {4, 6, 2, 9, 3, 40, 1, 0, 7, 5};
        for (int job = 0; job < 20000; ++job) {
            const int64_t pieces = job < 3000 ? job % 41 : sizes[job % 10];
            for (auto& r : runs) r.store(0);
            share.run(
                pieces,
                [&](int64_t p, int worker) {
                    if (worker < 0 || worker >= share.width()) badWorker.fetch_add(1);
                    runs[static_cast<size_t>(p)].fetch_add(1);
                    if (job % 997 == 0) std::this_thread::sleep_for(std::chrono::microseconds(50));
                },
                ownership);
            // The message is built only on a failure: built for each of the 1.28 million checks,
            // it ran this test past QTest's 300 s limit under AddressSanitizer on a 2-core Zen 3.
            for (int64_t p = 0; p < 64; ++p)
                if (runs[static_cast<size_t>(p)].load() != (p < pieces ? 1 : 0))
                    QFAIL(qPrintable(QString("job %1, piece %2 ran %3 times")
                                         .arg(job)
                                         .arg(p)
                                         .arg(runs[static_cast<size_t>(p)].load())));
        }
        QCOMPARE(badWorker.load(), 0);
    }

    // A helper that has not started (its core taken by another thread) holds nothing: the caller
    // runs every piece itself, and the share goes on working once the helper is back.
    void callerTakesWhatAHelperLeaves() {
        std::promise<void> release;
        std::shared_future<void> gate = release.get_future().share();
        WorkShare share(1, [gate] { gate.wait(); });
        std::vector<int> by(8, -1);
        share.run(8, [&](int64_t p, int worker) { by[static_cast<size_t>(p)] = worker; });
        for (int w : by) QCOMPARE(w, 0);
        release.set_value();
        std::atomic<int> total{0};
        for (int job = 0; job < 200; ++job) share.run(6, [&](int64_t, int) { total.fetch_add(1); });
        QCOMPARE(total.load(), 1200);
    }

    // Each worker first runs the pieces it owns: with the helper parked in its first piece, the
    // caller finishes its own run before it takes the helper's others.
    void ownPiecesFirst() {
        WorkShare share(1);
        for (int attempt = 0; attempt < 20; ++attempt) {
            std::atomic<bool> helperIn{false};
            std::atomic<int> held{-1};  // the helper's first piece (4 unless it came late)
            std::vector<int> order;     // pieces the caller ran, in order
            share.run(8, [&](int64_t p, int worker) {
                if (worker == 1 && !helperIn.exchange(true)) {
                    held = static_cast<int>(p);
                    std::this_thread::sleep_for(std::chrono::milliseconds(30));
                }
                if (worker == 0) {
                    order.push_back(static_cast<int>(p));
                    std::this_thread::sleep_for(std::chrono::milliseconds(1));
                }
            });
            if (!helperIn.load()) continue;  // the helper was asleep throughout: try again
            QVERIFY(order.size() >= 4);
            for (size_t k = 0; k < 4; ++k) QCOMPARE(order[k], static_cast<int>(k));
            // The piece the helper held is not run again by the caller.
            QCOMPARE(static_cast<int>(std::count(order.begin(), order.end(), held.load())), 0);
            return;
        }
        QSKIP("the helper never woke in time on this machine");
    }

    // A posted task runs exactly once: on a helper once it has finished its share of a job run
    // after the post (while the caller goes on with its own), on the caller when no job runs
    // before finishPosted. Never before that job; nothing to post without helpers.
    void postedTaskRunsOnAnIdleHelper() {
        WorkShare share(1);
        const std::thread::id caller = std::this_thread::get_id();
        struct Task {
            std::atomic<int> runs{0};
            std::atomic<bool> jobStarted{false}, beforeJob{false};
            std::thread::id on;
            static void run(void* self) {
                auto* t = static_cast<Task*>(self);
                if (!t->jobStarted.load()) t->beforeJob = true;
                t->on = std::this_thread::get_id();
                t->runs.fetch_add(1);
            }
        };
        // Deterministic, not statistical: the caller holds its first piece until the task has
        // run, so a helper that joins the job (takes any piece) always finishes its share while
        // the caller still works, and must then run the task. Only a helper that never wakes
        // (the deadline, far beyond any scheduling delay) leaves it to finishPosted.
        int joined = 0;
        for (int attempt = 0; attempt < 50; ++attempt) {
            Task t;
            // A job before the post, so that a helper spinning right after it sees the task
            // before any job of its own: it must wait for the next one.
            share.run(2, [](int64_t, int) {});
            QVERIFY(share.post(&Task::run, &t));
            std::this_thread::sleep_for(std::chrono::microseconds(200));
            t.jobStarted = true;
            std::atomic<bool> helperIn{false};
            const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
            share.run(4, [&](int64_t, int worker) {
                if (worker != 0) {
                    helperIn = true;
                    return;
                }
                while (t.runs.load() == 0 && std::chrono::steady_clock::now() < deadline)
                    std::this_thread::yield();
            });
            share.finishPosted();
            QCOMPARE(t.runs.load(), 1);
            QVERIFY(!t.beforeJob.load());
            if (!helperIn.load()) break;  // the helper slept through 10 s: see below
            QVERIFY2(t.on != caller, qPrintable(QString("attempt %1: the helper took a piece but "
                                                        "left the task to finishPosted")
                                                    .arg(attempt)));
            ++joined;
        }
        qInfo("%d posted tasks ran on the helper", joined);
        // No job between post and finish: the caller runs it.
        Task alone;
        QVERIFY(share.post(&Task::run, &alone));
        share.finishPosted();
        QCOMPARE(alone.runs.load(), 1);
        QVERIFY(alone.on == caller);
        share.finishPosted();  // nothing posted: returns
        QCOMPARE(alone.runs.load(), 1);

        WorkShare none(0);
        Task unposted;
        QVERIFY(!none.post(&Task::run, &unposted));
        none.finishPosted();
        QCOMPARE(unposted.runs.load(), 0);
        if (joined == 0) QSKIP("the helper never woke within 10 s on this machine");
    }

    // The optimizer update split into pieces across the share gives the same bits as on one
    // thread (each element's math does not depend on the split).
    void splitUpdateEqualsWhole() {
        const std::vector<int64_t> sizes{100352, 128, 1280, 10, 40000};
        std::mt19937 rng(5);
        std::uniform_real_distribution<float> uni(-1.f, 1.f);
        struct State {
            std::vector<std::vector<float>> w, g, m, v;
        } a, b;
        for (int64_t n : sizes) {
            std::vector<float> w(static_cast<size_t>(n)), g(static_cast<size_t>(n));
            for (auto& x : w) x = uni(rng);
            for (auto& x : g) x = uni(rng);
            for (State* s : {&a, &b}) {
                s->w.push_back(w);
                s->g.push_back(g);
                s->m.emplace_back(static_cast<size_t>(n), 0.f);
                s->v.emplace_back(static_cast<size_t>(n), 0.f);
            }
        }
        auto tensors = [&](State& s) {
            std::vector<td::UpdateTensor> t(sizes.size());
            for (size_t i = 0; i < sizes.size(); ++i) {
                t[i].value = s.w[i].data();
                t[i].grad = s.g[i].data();
                t[i].size = sizes[i];
                t[i].slot[0] = s.m[i].data();
                t[i].slot[1] = s.v[i].data();
            }
            return t;
        };
        td::UpdateSpec spec;
        spec.kind = td::UpdateKind::Adam;
        td::UpdateScalars sc;
        sc.lr = 1e-3f;
        sc.alpha = 1e-3f;
        WorkShare share(1);
        const auto ta = tensors(a), tb = tensors(b);
        for (int step = 0; step < 5; ++step) {
            QVERIFY(td::applyUpdate(spec, sc, ta, 1));
            QVERIFY(td::applyUpdate(spec, sc, tb, 1, nullptr, &share));
        }
        for (size_t i = 0; i < sizes.size(); ++i) {
            QVERIFY(std::memcmp(a.w[i].data(), b.w[i].data(), a.w[i].size() * 4) == 0);
            QVERIFY(std::memcmp(a.m[i].data(), b.m[i].data(), a.m[i].size() * 4) == 0);
            QVERIFY(std::memcmp(a.v[i].data(), b.v[i].data(), a.v[i].size() * 4) == 0);
        }
    }

    // A dense layer's forward product (split by rows; at batch 32 along K, each thread reading
    // the weight rows whose gradient it computes), its weight gradient (the batch read
    // transposed, split by rows) and its input gradient, compiled on one of two threads so the
    // device splits them, against the same program on two OpenMP threads (whole products). The
    // batch is then moved with rebindBatch: the pieces read their slices of the new batch.
    void splitProductsEqualWhole_data() {
        QTest::addColumn<int>("rows");
        QTest::newRow("batch 256, forward in row pieces") << 256;
        QTest::newRow("batch 32, forward along K") << 32;
    }
    void splitProductsEqualWhole() {
        QFETCH(int, rows);
        if (omp_get_max_threads() < 2 || td::makeCpuDevice(0)->desc().threads < 2)
            QSKIP("needs a CPU device with two threads (OMP_NUM_THREADS=2)");
        const RestoreThreads restore;
        const std::string b = std::to_string(rows);
        const std::string ir =
            "graph t {\n"
            " %0 = input() : f32[" +
            b +
            ",784]\n"
            " %1 = param() {name=w} : f32[784,128]\n"
            " %2 = param() {name=b} : f32[128]\n"
            " %3 = matmul(%0, %1) {trans_a=0, trans_b=0} : f32[" +
            b +
            ",128]\n"
            " %4 = bias_add(%3, %2) : f32[" +
            b +
            ",128]\n"
            " %5 = act(%4) {act=relu} : f32[" +
            b +
            ",128]\n"
            " %6 = param() {name=w2} : f32[128,64]\n"
            " %7 = matmul(%5, %6) {trans_a=0, trans_b=0} : f32[" +
            b +
            ",64]\n"
            " %8 = label() : f32[" +
            b +
            ",64]\n"
            " %9 = loss(%7, %8) {loss=mse, scale=" +
            std::to_string(1.0 / rows) + "}" +
            " : f32[1]\n"
            " output loss = %9\n"
            "}\n";
        auto build = [&](int threads, tdtest::Harness& h, const char* off = nullptr) {
            td::Graph g = tdtest::parseOrDie(ir);
            QVERIFY(td::autodiff(g).ok());
            td::CompileOptions co;
            if (off) co.disabled.insert(off);
            tdtest::HarnessOptions opt;
            opt.passes = &co;
            opt.programThreads = threads;
            std::string error;
            QVERIFY2(h.compile(std::move(g), {}, &error, opt), error.c_str());
        };
        std::mt19937 rng(11);
        const size_t n = static_cast<size_t>(rows);
        std::vector<float> x(n * 784), x2(n * 784), y(n * 64), p0(784 * 128), p1(128), p2(128 * 64);
        fillUniform(rng, {&x, &x2, &y, &p0, &p1, &p2});
        // Results of a step: loss, then each gradient.
        auto step = [&](tdtest::Harness& h, const std::vector<float>& batch, bool rebind,
                        std::vector<float>* out) {
            std::memcpy(h.param(0), p0.data(), p0.size() * 4);
            std::memcpy(h.param(1), p1.data(), p1.size() * 4);
            std::memcpy(h.param(2), p2.data(), p2.size() * 4);
            std::memcpy(h.lab(), y.data(), y.size() * 4);
            if (rebind)
                QVERIFY(h.exe->rebindBatch(batch.data(), h.lab()));
            else
                std::memcpy(h.in(), batch.data(), batch.size() * 4);
            h.run();
            out->assign(1, h.output("loss")[0]);
            for (size_t i = 0; i < 3; ++i)
                out->insert(out->end(), h.grad(i), h.grad(i) + h.params[i].bytes / 4);
        };
        auto close = [](const std::vector<float>& u, const std::vector<float>& v) {
            if (u.size() != v.size()) return false;
            for (size_t i = 0; i < u.size(); ++i)
                if (std::fabs(u[i] - v[i]) > 1e-5f * (1.f + std::fabs(v[i]))) return false;
            return true;
        };
        std::vector<float> whole, whole2, split, split2, rowSplit;
        // A program on every thread of the device has no helpers to form the next batch beside
        // it (HostThreads::runsAside, which the trainer asks before it sets up the input pipeline);
        // a program on one of two threads has one.
        {
            tdtest::Harness h;
            build(2, h);
            QVERIFY(!h.dev->hostThreads()->runsAside());
            step(h, x, false, &whole);
            step(h, x2, true, &whole2);
        }
        {
            tdtest::Harness h;
            build(1, h);
            QVERIFY(h.dev->hostThreads()->runsAside());
            step(h, x, false, &split);
            step(h, x2, true, &split2);
        }
        {
            // The forward product in row pieces, as the pass cpu_split_k off asks.
            tdtest::Harness h;
            build(1, h, "cpu_split_k");
            step(h, x, false, &rowSplit);
        }
        QVERIFY(close(split, whole));
        QVERIFY(close(split2, whole2));
        QVERIFY(!close(whole, whole2));  // the second batch is a different step
        QVERIFY(close(rowSplit, whole));
        // At batch 32 the partial sums along K are added in another order than in row pieces:
        // other bits, so the K split ran. At batch 256 there is no K split, so the pass changes
        // nothing and the two programs give the same bits.
        const bool sameBits = std::memcmp(split.data(), rowSplit.data(), split.size() * 4) == 0;
        QCOMPARE(sameBits, rows == 256);
    }

    // Products split on the WorkShare skip the zeros of their input where that leaves at most
    // 75% of the work (engine/backend/cpu/sparse_kernels.h): an input shaped like images on a
    // background (about 55% zeros, in runs) gives the gradients and the loss of the same program
    // with every product dense (the pass cpu_skip_zeros off), to float rounding, at batch 32 (the
    // forward product along K and the weight gradients) and 256 (the weight gradients in row
    // pieces), for ten steps of SGD. The profile says at least two products skipped zeros on
    // every step; with a dense input only the first run measures, then oneDNN runs (the next
    // measurement comes after 64 runs).
    void zeroSkippingEqualsDense_data() {
        QTest::addColumn<int>("rows");
        QTest::newRow("batch 32") << 32;
        QTest::newRow("batch 256") << 256;
    }
    void zeroSkippingEqualsDense() {
        QFETCH(int, rows);
        if (omp_get_max_threads() < 2 || td::makeCpuDevice(0)->desc().threads < 2)
            QSKIP("needs a CPU device with two threads (OMP_NUM_THREADS=2)");
        if (!td::cpu::sparse::active())
            QSKIP(
                "the zero-skipping products need AVX2 with FMA or AVX-512; this CPU keeps every "
                "product dense");
        const RestoreThreads restore;
        const std::string ir = twoLayerIr(rows);
        std::mt19937 rng(29);
        const size_t n = static_cast<size_t>(rows);
        std::vector<float> noise(n * 784), y(n * 64), p0(784 * 128), p1(128), p2(128 * 64);
        fillUniform(rng, {&noise, &y, &p0, &p1, &p2});
        const std::vector<float> images = windowImages(rng, n);
        // The loss of every step and the gradients of the last, and the profile.
        auto run = [&](bool dense, const std::vector<float>& x, std::vector<float>* out) {
            return sgdSteps(ir, dense ? "cpu_skip_zeros" : nullptr, {&p0, &p1, &p2}, x, y, out);
        };
        std::vector<float> skipping, dense, noisy;
        const std::string profile = run(false, images, &skipping);
        run(true, images, &dense);
        const std::string noiseProfile = run(false, noise, &noisy);
        QCOMPARE(skipping.size(), dense.size());
        double worst = 0;
        for (size_t i = 0; i < dense.size(); ++i)
            worst = std::max(worst, std::fabs(double{skipping[i]} - dense[i]) /
                                        (1e-3 + std::fabs(double{dense[i]})));
        QVERIFY2(worst < 1e-4, qPrintable(QString("worst relative difference %1").arg(worst)));
        // The forward product and the first kernel's gradient, on all ten steps.
        size_t every = 0;
        for (size_t at = 0;
             (at = profile.find("skipped zeros in 10 of 10 runs", at)) != std::string::npos; ++at)
            ++every;
        QVERIFY2(every >= 2, profile.c_str());
        // The first kernel's weight gradient: eight pieces a thread at batch 32 (a small batch's,
        // kSmallGradPiecesPerWorker), two at 256.
        const char* split = rows == 32 ? "[784,128], 16 pieces" : "[784,128], 4 pieces";
        QVERIFY2(profile.find(split) != std::string::npos, profile.c_str());
        // A dense input: every run of the products that read it sees so (sparseRun) and oneDNN
        // runs them; the second layer's weight gradient reads the ReLU's output, half zeros,
        // and skips them on every run.
        const size_t firstGrad = noiseProfile.find("matmul %13 [784,128]");
        QVERIFY2(firstGrad != std::string::npos, noiseProfile.c_str());
        QVERIFY2(noiseProfile.find("skipped zeros in 0 of 10 runs", firstGrad) != std::string::npos,
                 noiseProfile.c_str());
        QVERIFY2(rows != 32 || noiseProfile.find("skipped zeros in 0 of 10 runs, pieces along "
                                                 "K") != std::string::npos,
                 noiseProfile.c_str());
        if (rows != 32) return;
        // Along K the pieces are split where the weight gradient's pieces are (row 400 of 784)
        // on every run, whatever the data: with every nonzero in the image's lower part (pixels
        // 500 on) the edge stays, so the order of the additions depends on the program alone
        // (a resumed run repeats an uninterrupted one), and the results are the dense
        // products'.
        std::vector<float> lower(n * 784, 0.f);
        for (size_t i = 0; i < n; ++i)
            for (size_t k = 500; k < 784; ++k) lower[i * 784 + k] = images[i * 784 + (k + i) % 784];
        std::vector<float> lowerSkipping, lowerDense;
        const std::string lowerProfile = run(false, lower, &lowerSkipping);
        run(true, lower, &lowerDense);
        auto edgeIn = [](const std::string& text) {
            const size_t at = text.find("pieces along K split at ");
            return at == std::string::npos ? -1 : std::atoi(text.c_str() + at + 24);
        };
        QCOMPARE(edgeIn(lowerProfile), 400);
        for (size_t i = 0; i < lowerDense.size(); ++i)
            QVERIFY2(std::fabs(double{lowerSkipping[i]} - lowerDense[i]) <=
                         1e-4 * (1e-3 + std::fabs(double{lowerDense[i]})),
                     qPrintable(QString("value %1: %2 against %3")
                                    .arg(i)
                                    .arg(lowerSkipping[i])
                                    .arg(lowerDense[i])));
        QCOMPARE(edgeIn(profile), 400);
    }

    // A step on the device's OpenMP team of two (a large step: no WorkShare) runs the weight
    // gradients that may skip zeros in row pieces, one run of them per member of the team
    // (cpu_device.cpp, teamPieces_), and every other product whole: ten SGD steps give the
    // losses and gradients of oneDNN's whole products (cpu_team_pieces off) to 1e-4, on
    // images (zeros skipped on every run) and on a dense input (whose pieces run oneDNN, each on
    // its member alone).
    void teamPiecesEqualWhole() {
        if (omp_get_max_threads() < 2 || td::makeCpuDevice(0)->desc().threads < 2)
            QSKIP("needs a CPU device with two threads (OMP_NUM_THREADS=2)");
        if (!td::cpu::sparse::active())
            QSKIP(
                "the team splits only weight gradients that may skip zeros, which need AVX2 with "
                "FMA or AVX-512");
        const RestoreThreads restore;
        const int rows = 256;
        const std::string ir = twoLayerIr(rows);
        std::mt19937 rng(31);
        const size_t n = static_cast<size_t>(rows);
        std::vector<float> noise(n * 784), y(n * 64), p0(784 * 128), p1(128), p2(128 * 64);
        fillUniform(rng, {&noise, &y, &p0, &p1, &p2});
        const std::vector<float> images = windowImages(rng, n);
        const std::vector<float>* inputs[] = {&images, &noise};
        for (const std::vector<float>* x : inputs) {
            std::vector<float> pieces, whole;
            const std::string profile =
                sgdSteps(ir, nullptr, {&p0, &p1, &p2}, *x, y, &pieces, 0, 2);
            const std::string wholeProfile =
                sgdSteps(ir, "cpu_team_pieces", {&p0, &p1, &p2}, *x, y, &whole, 0, 2);
            QCOMPARE(pieces.size(), whole.size());
            double worst = 0;
            for (size_t i = 0; i < whole.size(); ++i)
                worst = std::max(worst, std::fabs(double{pieces[i]} - whole[i]) /
                                            (1e-3 + std::fabs(double{whole[i]})));
            QVERIFY2(worst < 1e-4, qPrintable(QString("worst relative difference %1").arg(worst)));
            QVERIFY2(profile.find("in pieces on the OpenMP team") != std::string::npos,
                     profile.c_str());
            QVERIFY2(wholeProfile.find("pieces") == std::string::npos, wholeProfile.c_str());
            // Both kernels' weight gradients in pieces (the second's 64 outputs at the bound),
            // the forward products whole.
            QVERIFY2(profile.find("[784,128], 4 pieces") != std::string::npos, profile.c_str());
            QVERIFY2(profile.find("[128,64], 4 pieces") != std::string::npos, profile.c_str());
            const size_t forward = profile.find("[256,128]");
            QVERIFY2(forward != std::string::npos, profile.c_str());
            QVERIFY2(
                profile.substr(forward, profile.find('\n', forward) - forward).find("pieces") ==
                    std::string::npos,
                profile.c_str());
            const char* skipped =
                x == &images ? "skipped zeros in 10 of 10 runs" : "skipped zeros in 0 of 10 runs";
            QVERIFY2(profile.find(skipped) != std::string::npos, profile.c_str());
        }
    }

    // A device of one thread runs the products that may skip zeros in the pieces of two
    // threads, one after the other (a share without helpers): its profile says so, the results
    // are the bits of the same program on a two-thread device's share, and oneDNN's whole
    // products (cpu_solo_pieces off) give them to 1e-4.
    void oneThreadRunsThePieces() {
        if (!td::cpu::sparse::active())
            QSKIP(
                "a one-thread device splits only products that skip zeros, which need AVX2 with "
                "FMA or AVX-512");
        const RestoreThreads restore;
        const std::string ir = twoLayerIr(32);
        std::mt19937 rng(31);
        std::vector<float> y(32 * 64), p0(784 * 128), p1(128), p2(128 * 64);
        fillUniform(rng, {&y, &p0, &p1, &p2});
        const std::vector<float> images = windowImages(rng, 32);
        std::vector<float> solo, whole;
        const std::string profile =
            sgdSteps(ir, nullptr, {&p0, &p1, &p2}, images, y, &solo, /*deviceThreads=*/1);
        const std::string wholeProfile = sgdSteps(ir, "cpu_solo_pieces", {&p0, &p1, &p2}, images, y,
                                                  &whole, /*deviceThreads=*/1);
        QVERIFY2(profile.find("(products and update in pieces on one thread)") != std::string::npos,
                 profile.c_str());
        QVERIFY2(profile.find("[32,128], 2 pieces along K") != std::string::npos, profile.c_str());
        QVERIFY2(profile.find("[784,128], 16 pieces") != std::string::npos, profile.c_str());
        size_t every = 0;
        for (size_t at = 0;
             (at = profile.find("skipped zeros in 10 of 10 runs", at)) != std::string::npos; ++at)
            ++every;
        QVERIFY2(every == 2, profile.c_str());
        QVERIFY2(wholeProfile.find("pieces") == std::string::npos, wholeProfile.c_str());
        QVERIFY2(wholeProfile.find("skipped zeros") == std::string::npos, wholeProfile.c_str());
        QCOMPARE(solo.size(), whole.size());
        for (size_t i = 0; i < whole.size(); ++i)
            QVERIFY2(
                std::fabs(double{solo[i]} - whole[i]) <=
                    1e-4 * (1e-3 + std::fabs(double{whole[i]})),
                qPrintable(QString("value %1: %2 against %3").arg(i).arg(solo[i]).arg(whole[i])));
        if (td::makeCpuDevice(2)->desc().threads < 2) return;
        std::vector<float> shared;
        const std::string sharedProfile =
            sgdSteps(ir, nullptr, {&p0, &p1, &p2}, images, y, &shared, /*deviceThreads=*/2);
        QVERIFY2(sharedProfile.find("shared with the WorkShare") != std::string::npos,
                 sharedProfile.c_str());
        QCOMPARE(shared.size(), solo.size());
        QVERIFY(std::memcmp(shared.data(), solo.data(), solo.size() * 4) == 0);
    }

    // Products with a narrow output (at most two vectors wide: a Dense of 16 units with ReLU,
    // a classifier's 10, their weight gradients read transposed) run on the narrow kernel
    // (sparse_kernels.h) instead of oneDNN's, and the classifier's input gradient (ten terms in
    // each sum) on the short kernel: the losses of ten steps and the last gradients
    // agree with oneDNN's (cpu_narrow_kernel off) to float rounding (here bit for bit: at these
    // shapes oneDNN's AVX2 kernels also add the products in order with multiply-adds), and the
    // profile names the products that ran on it.
    void narrowProductsEqualOneDnn() {
        if (!td::cpu::sparse::active()) QSKIP("the narrow kernel needs AVX2 with FMA or AVX-512");
        const RestoreThreads restore;
        const std::string ir =
            "graph t {\n %0 = input() : f32[64,96]\n"
            " %1 = param() {name=w} : f32[96,16]\n"
            " %2 = param() {name=b} : f32[16]\n"
            " %3 = matmul(%0, %1) {trans_a=0, trans_b=0} : f32[64,16]\n"
            " %4 = bias_add(%3, %2) : f32[64,16]\n"
            " %5 = act(%4) {act=relu} : f32[64,16]\n"
            " %6 = param() {name=w2} : f32[16,10]\n"
            " %7 = matmul(%5, %6) {trans_a=0, trans_b=0} : f32[64,10]\n"
            " %8 = label() : f32[64,10]\n"
            " %9 = loss(%7, %8) {loss=mse, scale=0.015625} : f32[1]\n"
            " output loss = %9\n}\n";
        std::mt19937 rng(37);
        std::vector<float> x(64 * 96), y(64 * 10), p0(96 * 16), p1(16), p2(16 * 10);
        fillUniform(rng, {&x, &y, &p0, &p1, &p2});
        auto run = [&](bool oneDnn, std::vector<float>* out) {
            return sgdSteps(ir, oneDnn ? "cpu_narrow_kernel" : nullptr, {&p0, &p1, &p2}, x, y, out);
        };
        std::vector<float> narrow, oneDnn;
        const std::string profile = run(false, &narrow);
        const std::string oneDnnProfile = run(true, &oneDnn);
        QCOMPARE(narrow.size(), size_t{10 + 96 * 16 + 16 + 16 * 10});
        QCOMPARE(oneDnn.size(), narrow.size());
        double worst = 0;
        for (size_t i = 0; i < narrow.size(); ++i)
            worst = std::max(worst, std::fabs(double{narrow[i]} - oneDnn[i]) /
                                        (1e-3 + std::fabs(double{oneDnn[i]})));
        QVERIFY2(worst < 1e-4, qPrintable(QString("worst relative difference %1").arg(worst)));
        // The two forward products and the two weight gradients.
        size_t count = 0;
        for (size_t at = 0; (at = profile.find(", narrow kernel", at)) != std::string::npos; ++at)
            ++count;
        QVERIFY2(count >= 4, profile.c_str());
        QVERIFY2(oneDnnProfile.find(", narrow kernel") == std::string::npos, oneDnnProfile.c_str());
        // The input gradient of the ten-output layer ([64,10] x [16,10]^T): the short kernel.
        QVERIFY2(profile.find("[64,16], short kernel") != std::string::npos, profile.c_str());
        QVERIFY2(oneDnnProfile.find(", short kernel") == std::string::npos, oneDnnProfile.c_str());
    }

    // The device's own passes (cpu_passes.h) carry the names the graph layer checks
    // (cpuPassNames), in the same order; an unknown name is refused naming it. A program
    // compiled with one turned off reports it off and the others on, with the places each
    // changed: here, on one thread of two, a forward product along K (cpu_split_k) that the
    // pass off leaves in row pieces.
    void passesNamedAndReported() {
        const std::vector<std::string>& names = td::cpuPassNames();
        QCOMPARE(names.size(), td::cpu::kPassCount);
        for (size_t i = 0; i < names.size(); ++i) {
            const td::cpu::PassInfo& p = td::cpu::passTable()[i];
            QCOMPARE(static_cast<size_t>(p.pass), i);
            QCOMPARE(std::string(p.name), names[i]);
            QVERIFY(std::strlen(p.what) > 0);
            QVERIFY2(td::checkPassNames({names[i]}).ok(), p.name);
        }
        const td::Status unknown = td::checkPassNames({"cpu_split_k", "cpu_split_everything"});
        QVERIFY(!unknown.ok());
        QVERIFY2(unknown.error().find("unknown pass 'cpu_split_everything'") != std::string::npos,
                 unknown.error().c_str());
        QVERIFY2(unknown.error().find("cpu_narrow_kernel") != std::string::npos,
                 unknown.error().c_str());
        const RestoreThreads restore;
        const bool twoThreads =
            omp_get_max_threads() >= 2 && td::makeCpuDevice(0)->desc().threads >= 2;
        for (const char* off : {static_cast<const char*>(nullptr), "cpu_split_k"}) {
            td::Graph g = tdtest::parseOrDie(twoLayerIr(32));
            QVERIFY(td::autodiff(g).ok());
            td::CompileOptions co;
            if (off) co.disabled.insert(off);
            tdtest::HarnessOptions opt;
            opt.passes = &co;
            opt.programThreads = 1;
            tdtest::Harness h;
            std::string error;
            QVERIFY2(h.compile(std::move(g), {}, &error, opt), error.c_str());
            const std::vector<td::BackendPassRecord> records = h.exe->passRecords();
            QCOMPARE(records.size(), names.size());
            for (size_t i = 0; i < records.size(); ++i) {
                QCOMPARE(records[i].name, names[i]);
                QCOMPARE(records[i].disabled, off && records[i].name == off);
                QVERIFY(records[i].changed >= 0);
                if (records[i].disabled) QCOMPARE(records[i].changed, int64_t{0});
            }
            const int64_t alongK = records[static_cast<size_t>(td::cpu::Pass::SplitK)].changed;
            if (twoThreads) QCOMPARE(alongK, off ? int64_t{0} : int64_t{1});
        }
    }

    // The CPU device places weight matrices whose rows are a multiple of 1 KiB (at least 2 KiB)
    // 16 bytes past a cache line where oneDNN runs AVX2 kernels (on an AVX-512 CPU it may keep
    // them aligned): oneDNN's f32 matmul then packs them instead of reading them in place across
    // colliding cache sets (cpu_device.cpp, offsetWeights). Other buffers stay 64-byte aligned;
    // every buffer starts zeroed and is released whole.
    void weightsPlacedOffAlignment() {
        auto device = td::makeCpuDevice(0);
        const size_t bytes = 1024 * 1024 * 4;
        auto placed = [&](size_t rowBytes) {
            auto b = device->hostThreads()->allocateWeights(bytes, rowBytes);
            if (!b.ok()) {
                QTest::qFail(b.error().c_str(), __FILE__, __LINE__);
                return size_t{99};
            }
            const auto* p = static_cast<const unsigned char*>(b->ptr);
            bool zero = true;
            for (size_t i = 0; i < bytes; i += 4093) zero = zero && p[i] == 0;
            if (!zero) QTest::qFail("allocateWeights: not zeroed", __FILE__, __LINE__);
            std::memset(b->ptr, 1, bytes);  // the whole size is usable
            const size_t offset = reinterpret_cast<uintptr_t>(b->ptr) % 64;
            td::Buffer buf = *b;
            device->release(buf);
            return offset;
        };
        QCOMPARE(placed(0), size_t{0});
        QCOMPARE(placed(128 * 4), size_t{0});
        QCOMPARE(placed(1000 * 4), size_t{0});
        const size_t wide = placed(1024 * 4);
        QCOMPARE(placed(2048 * 4), wide);
        QVERIFY(wide == 0 || wide == 16);
        // The rule, which traindeck_bench_matmul shares (weight_placement.h), and the device
        // following it for the instruction set oneDNN runs here.
        QVERIFY(td::cpu::weightsOffsetFor(dnnl::cpu_isa::avx2, 4096));
        QVERIFY(td::cpu::weightsOffsetFor(dnnl::cpu_isa::avx2_vnni, 8192));
        QVERIFY(!td::cpu::weightsOffsetFor(dnnl::cpu_isa::avx2, 1024));  // under 2 KiB
        QVERIFY(!td::cpu::weightsOffsetFor(dnnl::cpu_isa::avx2, 4000));  // not a multiple of 1 KiB
        QVERIFY(!td::cpu::weightsOffsetFor(dnnl::cpu_isa::avx512_core, 4096));
        QCOMPARE(wide, td::cpu::weightsOffsetFor(dnnl::get_effective_cpu_isa(), 4096)
                           ? td::cpu::kWeightsOffset
                           : size_t{0});
        if (td::detectedCpuIsa() == td::CpuIsa::Avx2 && !std::getenv("ONEDNN_MAX_CPU_ISA"))
            QCOMPARE(wide, size_t{16});
        auto plain = device->allocate(bytes);
        QVERIFY(plain.ok());
        QCOMPARE(reinterpret_cast<uintptr_t>(plain->ptr) % 64, uintptr_t{0});
        td::Buffer buf = *plain;
        device->release(buf);
    }
};

QTEST_GUILESS_MAIN(TestWorkShare)
#include "test_work_share.moc"

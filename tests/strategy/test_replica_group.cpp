// The in-process replica group: sums in rank order, identical on every replica, many steps in a
// row, host collectives, and failures (a replica that never arrives, an abort, calls out of step)
// that end every wait with an error naming the replica instead of a hang.
#include <QtTest>

#include <atomic>
#include <chrono>
#include <cstring>
#include <random>
#include <thread>

#include "engine/distribute/replica_group.h"

using namespace td;

namespace {

// Runs body(r) on one thread per replica and joins them.
template <typename Body>
void onReplicas(int n, Body body) {
    std::vector<std::thread> ts;
    for (int r = 0; r < n; ++r) ts.emplace_back([&, r] { body(r); });
    for (auto& t : ts) t.join();
}

std::vector<float> randomValues(int64_t n, uint32_t seed) {
    std::mt19937 g(seed);
    std::uniform_real_distribution<float> u(-1.f, 1.f);
    std::vector<float> v(static_cast<size_t>(n));
    for (float& x : v) x = u(g);
    return v;
}

}  // namespace

class TestReplicaGroup : public QObject {
    Q_OBJECT
  private slots:
    void sumsInRankOrderOnEveryReplica_data() {
        QTest::addColumn<int>("replicas");
        QTest::newRow("2") << 2;
        QTest::newRow("3") << 3;
        QTest::newRow("4") << 4;
    }
    void sumsInRankOrderOnEveryReplica() {
        QFETCH(int, replicas);
        const std::vector<int64_t> sizes{1, 7, 1000, 33333, 0};
        ReplicaGroup group(replicas, 30);
        // data[step][replica][bucket]
        const int steps = 20;
        std::vector<std::vector<std::vector<std::vector<float>>>> data(steps);
        for (int s = 0; s < steps; ++s) {
            data[s].resize(replicas);
            for (int r = 0; r < replicas; ++r)
                for (size_t b = 0; b < sizes.size(); ++b)
                    data[s][r].push_back(randomValues(sizes[b], 1000u * s + 10u * r + b));
        }
        auto original = data;
        std::atomic<int> failures{0};
        onReplicas(replicas, [&](int r) {
            Collectives& c = group.replica(r);
            for (int s = 0; s < steps; ++s) {
                for (size_t b = 0; b < sizes.size(); ++b) {
                    // Uneven arrival: the replicas post at different moments.
                    if ((r + s + static_cast<int>(b)) % 3 == 0)
                        std::this_thread::sleep_for(std::chrono::microseconds(200));
                    if (!c.allReduceStart(static_cast<int>(b), data[s][r][b].data(), sizes[b]).ok())
                        ++failures;
                }
                for (size_t b = 0; b < sizes.size(); ++b)
                    if (!c.allReduceWait(static_cast<int>(b)).ok()) ++failures;
            }
        });
        QCOMPARE(failures.load(), 0);
        for (int s = 0; s < steps; ++s)
            for (size_t b = 0; b < sizes.size(); ++b)
                for (int64_t i = 0; i < sizes[b]; ++i) {
                    float expect = original[s][0][b][i];
                    for (int r = 1; r < replicas; ++r) expect += original[s][r][b][i];
                    for (int r = 0; r < replicas; ++r)
                        QCOMPARE(std::memcmp(&data[s][r][b][i], &expect, 4), 0);
                }
    }

    void hostCollectives() {
        const int n = 3;
        ReplicaGroup group(n, 30);
        std::vector<std::vector<double>> sums(n), gathers(n);
        onReplicas(n, [&](int r) {
            Collectives& c = group.replica(r);
            QCOMPARE(c.size(), n);
            QCOMPARE(c.rank(), r);
            std::vector<double> v{1.0 * r, 10.0 + r};
            QVERIFY(c.allReduceHost(v.data(), 2).ok());
            sums[r] = v;
            std::vector<double> all(2 * n);
            const double mine[2] = {double(r), double(-r)};
            QVERIFY(c.allGatherHost(mine, 2, all.data()).ok());
            gathers[r] = all;
            QVERIFY(c.barrier().ok());
        });
        for (int r = 0; r < n; ++r) {
            QCOMPARE(sums[r], (std::vector<double>{3.0, 33.0}));
            QCOMPARE(gathers[r], (std::vector<double>{0, 0, 1, -1, 2, -2}));
        }
    }

    void replicaThatNeverArrivesIsNamed() {
        ReplicaGroup group(3, 0.3);
        std::vector<std::string> errors(3);
        const auto t0 = std::chrono::steady_clock::now();
        onReplicas(3, [&](int r) {
            if (r == 2) return;  // never calls
            std::vector<float> v(100, 1.f);
            Collectives& c = group.replica(r);
            Status s = c.allReduceStart(0, v.data(), 100);
            if (s.ok()) s = c.allReduceWait(0);
            if (!s.ok()) errors[r] = s.error();
        });
        const double seconds =
            std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        QVERIFY2(seconds < 5, "the wait must end near the timeout");
        for (int r = 0; r < 2; ++r) {
            QVERIFY2(errors[r].find("replica 2 did not arrive within 0.3 s") != std::string::npos,
                     errors[r].c_str());
            QVERIFY(errors[r].find("bucket 0") != std::string::npos);
        }
        // Broken for good: a later call fails at once with the same error.
        std::vector<float> v(1);
        Status again = group.replica(0).allReduceStart(1, v.data(), 1);
        QVERIFY(!again.ok());
        QVERIFY(again.error().find("replica 2") != std::string::npos);
    }

    void abortEndsEveryWait() {
        ReplicaGroup group(2, 60);
        std::string error;
        const auto t0 = std::chrono::steady_clock::now();
        onReplicas(2, [&](int r) {
            Collectives& c = group.replica(r);
            if (r == 1) {
                std::this_thread::sleep_for(std::chrono::milliseconds(50));
                c.abort("replica 1: the pipeline failed");
                return;
            }
            double v = 1;
            Status s = c.allReduceHost(&v, 1);
            if (!s.ok()) error = s.error();
        });
        const double seconds =
            std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        QVERIFY(seconds < 5);
        QCOMPARE(QString::fromStdString(error), QString("replica 1: the pipeline failed"));
    }

    void callsOutOfStepAreAnError() {
        ReplicaGroup group(2, 5);
        std::vector<std::string> errors(2);
        onReplicas(2, [&](int r) {
            std::vector<float> v(static_cast<size_t>(10 + r));
            Collectives& c = group.replica(r);
            Status s = c.allReduceStart(0, v.data(), 10 + r);  // different sizes
            if (s.ok()) s = c.allReduceWait(0);
            if (!s.ok()) errors[r] = s.error();
        });
        QVERIFY(!errors[0].empty() || !errors[1].empty());
        const std::string& e = errors[0].empty() ? errors[1] : errors[0];
        QVERIFY2(e.find("out of step") != std::string::npos, e.c_str());
    }

    void waitForABucketNeverStarted() {
        ReplicaGroup group(1, 5);
        Status s = group.replica(0).allReduceWait(3);
        QVERIFY(!s.ok());
        QVERIFY(s.error().find("bucket 3") != std::string::npos);
    }
};

QTEST_GUILESS_MAIN(TestReplicaGroup)
#include "test_replica_group.moc"

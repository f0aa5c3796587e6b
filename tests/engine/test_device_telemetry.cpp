// What of the GPU extras runs without a GPU: the NVML figures (deviceTelemetry) are absent for
// CPUs, unknown devices and machines without NVML, without an error or a crash; the PCI bus id
// matching CUDA devices to NVML's; and the agreement between workers that decides whether their
// gradient buckets are summed with NCCL (workerDeviceCollectives), here between CPU "workers" of
// an in-process replica group, which must all keep their host collectives; worker 0's NCCL id.
#include <QTest>
#include <thread>
#include <vector>

#include "engine/backend/backend.h"
#include "engine/backend/device_collectives.h"
#include "engine/backend/nccl_workers.h"
#include "engine/backend/telemetry.h"
#include "engine/distribute/replica_group.h"
#if TRAINDECK_HAVE_CUDA
#include "engine/backend/cuda/nvml_stats.h"
#endif

using namespace td;

class TestDeviceTelemetry : public QObject {
    Q_OBJECT
  private slots:
    void noFiguresForCpusOrUnknownDevices() {
        QVERIFY(!deviceTelemetry("cpu:0").has_value());
        QVERIFY(!deviceTelemetry("").has_value());
        QVERIFY(!deviceTelemetry("cuda:").has_value());
        QVERIFY(!deviceTelemetry("cuda:x").has_value());
        QVERIFY(!deviceTelemetry("cuda:-1").has_value());
        QVERIFY(!deviceTelemetry("cuda:99999").has_value());
        QVERIFY(!deviceTelemetry("cuda:999").has_value());  // no such GPU
    }

    // Every GPU this machine has: figures when NVML is there (memory used within the total,
    // utilisation 0..1 or unknown), none when it is not; twice, as a trainer reads them.
    void gpuFiguresWhereNvmlIs() {
        for (int pass = 0; pass < 2; ++pass)
            for (const DeviceDesc& d : cudaDevices()) {
                auto t = deviceTelemetry(d.id);
#if TRAINDECK_HAVE_CUDA
                if (!cuda::nvmlUnavailableReason().empty()) {
                    QVERIFY(!t.has_value());
                    continue;
                }
#endif
                if (!t) continue;  // NVML does not know this GPU
                QVERIFY(t->memoryTotalBytes > 0);
                QVERIFY(t->memoryUsedBytes >= 0 && t->memoryUsedBytes <= t->memoryTotalBytes);
                QVERIFY(t->gpuUtilization == -1 ||
                        (t->gpuUtilization >= 0 && t->gpuUtilization <= 1));
            }
        // "cuda:0" where there is no GPU (or no NVML): nothing, and no error.
        if (cudaDevices().empty()) QVERIFY(!deviceTelemetry("cuda:0").has_value());
    }

    void pciBusIdsInNvmlForm() {
#if TRAINDECK_HAVE_CUDA
        using cuda::nvmlBusId;
        QCOMPARE(nvmlBusId("0000:3B:00.0").value_or(""), std::string("00000000:3b:00.0"));
        QCOMPARE(nvmlBusId("00000001:c1:1f.7").value_or(""), std::string("00000001:c1:1f.7"));
        QCOMPARE(nvmlBusId("3b:00.0").value_or(""), std::string("00000000:3b:00.0"));
        QCOMPARE(nvmlBusId(" 0000:3b:00.0\n").value_or(""), std::string("00000000:3b:00.0"));
        for (const char* bad :
             {"", "0000:3b:00", "0000:3b:00.0x", "g000:3b:00.0", "0000:3b.00.0", "0:0:0:0.0",
              "0000:100:00.0", "0000:3b:20.0", "0000:3b:00.8", "0000:3b:00.-1"})
            QVERIFY2(!nvmlBusId(bad).has_value(), bad);
#else
        QSKIP("no CUDA backend in this build");
#endif
    }

    // Worker 0's side of the NCCL bootstrap, where NCCL loads (it needs no GPU): a 128-byte id,
    // or an error that says why, never a crash.
    void ncclIdWhereNcclLoads() {
        auto id = ncclUniqueIdBytes();
        if (id.ok()) {
            QCOMPARE(id->size(), size_t(128));
        } else {
            QVERIFY(!id.error().empty());
            qInfo("no NCCL id here: %s", id.error().c_str());
        }
    }

    // Three workers with CPU replicas agree (through their process-level group) to keep their
    // host collectives: no NCCL, no reason to report, no error.
    void cpuWorkersKeepHostCollectives() {
        constexpr int kWorkers = 3;
        ReplicaGroup workers(kWorkers, 30);
        std::vector<std::unique_ptr<Device>> devices;
        for (int w = 0; w < kWorkers; ++w) devices.push_back(makeCpuDevice(1));
        std::vector<Result<WorkerDeviceCollectives>> results;
        for (int w = 0; w < kWorkers; ++w) results.emplace_back(err("not run"));
        std::vector<std::thread> threads;
        for (int w = 0; w < kWorkers; ++w)
            threads.emplace_back([&, w] {
                Collectives& self = workers.replica(w);
                results[static_cast<size_t>(w)] = workerDeviceCollectives(
                    {devices[static_cast<size_t>(w)].get()}, {&self}, self, 30);
            });
        for (auto& t : threads) t.join();
        for (auto& r : results) {
            QVERIFY2(r.ok(), r.ok() ? "" : r.error().c_str());
            QVERIFY(r->collectives.empty());
            QVERIFY2(r->whyNot.empty(), r->whyNot.c_str());
        }
    }
};

QTEST_GUILESS_MAIN(TestDeviceTelemetry)
#include "test_device_telemetry.moc"

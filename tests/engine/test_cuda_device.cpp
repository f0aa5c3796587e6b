// Whole training runs on the CUDA device against the same on CPU replicas: one_device on cuda:0,
// mirrored with two replicas on cuda:0 (and over two GPUs where there are two), through the trainer
// (data pipeline, pinned staging, the eval program, accumulators read at log points), compared by
// their final metrics. The op-level comparison of every kernel against the CPU is
// tests/graph/test_backend_ops.
//
// Without a GPU (or without the CUDA backend) it prints why and exits 77, which CTest reports as
// skipped: never a silent pass.
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "engine/api/session.h"
#include "engine/backend/backend.h"
#include "engine/io/project.h"
#include "tests/source_dir.h"

using namespace td;

namespace {

constexpr int kSkip = 77;

// A whole training run through the trainer (data pipeline, staging, the eval program,
// accumulators read at log points) of the synthetic project on the given strategy: its final
// metrics.
Result<MetricMap> trainSynthetic(const std::string& type, const std::vector<std::string>& devices,
                                 int replicas) {
    TD_ASSIGN_OR_RETURN(Project p, loadProject(std::string(td::dev::kSourceDir) +
                                               "/projects/synthetic_blobs.json"));
    p.data.source.samples = 1024;
    p.training.epochs = 2;
    p.strategy.type = type;
    p.strategy.devices = devices;
    p.strategy.replicas = replicas;
    TD_ASSIGN_OR_RETURN(auto session, Session::create(p, {}));
    auto q = session->events().subscribe();
    TD_RETURN_IF_ERROR(session->fit());
    for (const Event& e : q->drain())
        if (const auto* f = std::get_if<RunFinished>(&e)) {
            if (f->status != RunStatus::Completed) return err("run ended: " + f->message);
            return f->finalMetrics;
        }
    return err("no RunFinished event");
}

// The trainer on the GPU strategies against the same strategies on CPU replicas.
int trainerCases(const std::vector<DeviceDesc>& gpus) {
    struct Run {
        std::string name, type;
        std::vector<std::string> devices;
        int gpuReplicas;  // 0: one per listed GPU
        int cpuReplicas;
    };
    // Two replicas on one GPU sum through that GPU's own kernel (NCCL takes one rank per GPU).
    std::vector<Run> runs = {
        {"trainer one_device", "one_device", {gpus[0].id}, 0, 1},
        {"trainer mirrored, 2 replicas on " + gpus[0].id, "mirrored", {gpus[0].id}, 2, 2}};
    if (gpus.size() >= 2)
        runs.push_back({"trainer mirrored x2", "mirrored", {gpus[0].id, gpus[1].id}, 0, 2});
    int failed = 0;
    for (const Run& r : runs) {
        auto got = trainSynthetic(r.type, r.devices, r.gpuReplicas);
        auto want = r.cpuReplicas == 1 ? trainSynthetic("one_device", {"cpu:0"}, 0)
                                       : trainSynthetic("mirrored", {}, r.cpuReplicas);
        if (!got.ok() || !want.ok()) {
            std::printf("FAIL %s: cpu: %s | gpu: %s\n", r.name.c_str(),
                        want.ok() ? "ok" : want.error().c_str(),
                        got.ok() ? "ok" : got.error().c_str());
            ++failed;
            continue;
        }
        double worst = 0;
        std::string worstKey;
        for (const auto& [key, v] : *want) {
            auto it = got->find(key);
            const double d = it == got->end()
                                 ? INFINITY
                                 : std::fabs(it->second - v) / std::max(1.0, std::fabs(v));
            if (!(d <= worst)) {
                worst = d;
                worstKey = key;
            }
        }
        const bool ok = !want->empty() && worst <= 1e-3;
        std::printf("%s %s: %zu final metrics, worst difference %.3g (%s)\n", ok ? "ok  " : "FAIL",
                    r.name.c_str(), want->size(), worst, worstKey.c_str());
        if (!ok) ++failed;
    }
    return failed;
}

}  // namespace

int main() {
    const std::vector<DeviceDesc> gpus = cudaDevices();
    if (gpus.empty()) {
        auto d = openDevice("cuda:0");
        std::printf("SKIP: no CUDA device to test (%s)\n",
                    d.ok() ? "none enumerated" : d.error().c_str());
        return kSkip;
    }
    std::printf("testing %s (%s) against cpu:0\n", gpus[0].id.c_str(), gpus[0].name.c_str());
    const int failed = trainerCases(gpus);
    std::printf("%d training runs failed\n", failed);
    return failed == 0 ? 0 : 1;
}

#include <algorithm>
#include <cstdlib>
#include <functional>
#include <string>

#include "engine/backend/backend.h"
#include "engine/backend/device_collectives.h"
#include "engine/backend/nccl_workers.h"
#include "engine/backend/telemetry.h"
#include "engine/distribute/collectives.h"

namespace td {

std::vector<DeviceDesc> enumerateDevices() {
    std::vector<DeviceDesc> out{cpuDeviceDesc()};
    for (const DeviceDesc& d : cudaDevices()) out.push_back(d);
    return out;
}

Result<std::unique_ptr<Device>> openDevice(const std::string& id) {
    if (id == "cpu" || id == "cpu:0") return makeCpuDevice(0);
    if (id.rfind("cuda:", 0) == 0) {
        const int index = std::atoi(id.c_str() + 5);
        return makeCudaDevice(index);
    }
    std::string known;
    for (const DeviceDesc& d : enumerateDevices()) known += (known.empty() ? "" : ", ") + d.id;
    return err("unknown device '" + id + "' (this machine has: " + known + ")");
}

#ifndef TRAINDECK_HAVE_CUDA
std::vector<DeviceDesc> cudaDevices() {
    return {};
}
Result<std::unique_ptr<Device>> makeCudaDevice(int index) {
    return err("cuda:" + std::to_string(index) +
               ": this build has no CUDA backend (configure with the CUDA toolkit installed)");
}
Result<std::vector<std::unique_ptr<Collectives>>> deviceCollectives(
    const std::vector<Device*>&, const std::vector<Collectives*>&, double) {
    return err("this build has no CUDA backend: collectives sum host memory");
}
std::string ncclAcrossWorkersUnavailable(const std::vector<Device*>& devices, bool& cpu) {
    cpu = true;
    for (Device* d : devices)
        if (d->desc().kind != DeviceKind::Cpu) cpu = false;
    return "this build has no CUDA backend";
}
Result<std::vector<uint8_t>> ncclUniqueIdBytes() {
    return err("this build has no CUDA backend");
}
Result<std::vector<std::unique_ptr<Collectives>>> ncclAcrossWorkers(
    const std::vector<Device*>&, const std::vector<Collectives*>&, const std::vector<uint8_t>&,
    Collectives&, double) {
    return err("this build has no CUDA backend");
}
std::optional<DeviceTelemetry> deviceTelemetry(const std::string&) {
    return std::nullopt;
}
#endif

// Every worker says whether it can (0), has CPU replicas (1) or GPUs without NCCL (2), and how
// many local replicas it has; only when all can does worker 0's NCCL id go round.
Result<WorkerDeviceCollectives> workerDeviceCollectives(const std::vector<Device*>& devices,
                                                        const std::vector<Collectives*>& host,
                                                        Collectives& workers,
                                                        double timeoutSeconds) {
    WorkerDeviceCollectives out;
    bool cpu = false;
    const std::string mine = ncclAcrossWorkersUnavailable(devices, cpu);
    const int n = workers.size();
    const double own[2] = {mine.empty() ? 0.0
                           : cpu        ? 1.0
                                        : 2.0,
                           static_cast<double>(devices.size())};
    std::vector<double> all(static_cast<size_t>(n) * 2);
    TD_RETURN_IF_ERROR(workers.allGatherHost(own, 2, all.data()));
    int firstNo = -1;
    bool anyGpu = false;
    for (int w = 0; w < n; ++w) {
        const double code = all[static_cast<size_t>(w) * 2];
        if (code != 1.0) anyGpu = true;
        if (code != 0.0 && firstNo < 0) firstNo = w;
    }
    if (firstNo >= 0) {
        if (anyGpu) {
            const double code = all[static_cast<size_t>(firstNo) * 2];
            out.whyNot = "worker rank " + std::to_string(firstNo) + ": " +
                         (firstNo == workers.rank() ? mine
                          : code == 1.0             ? std::string("CPU replicas")
                                                    : std::string("no NCCL"));
        }
        return out;
    }
    for (int w = 1; w < n; ++w)
        if (all[static_cast<size_t>(w) * 2 + 1] != all[1])
            return err(
                "strategy.devices: every worker needs the same number of GPUs for NCCL "
                "between workers (worker rank 0 has " +
                std::to_string(static_cast<int>(all[1])) + ", worker rank " + std::to_string(w) +
                " has " + std::to_string(static_cast<int>(all[static_cast<size_t>(w) * 2 + 1])) +
                ")");
    // NCCL takes one rank per GPU: workers (or replicas of one worker) that share a GPU, as two
    // processes on a one-GPU machine do, sum through the host group instead. A GPU is known by
    // its UUID, 48 bits of whose hash travel exactly in a double.
    const size_t local = devices.size();
    std::vector<double> gpuOwn(local), gpus(static_cast<size_t>(n) * local);
    for (size_t i = 0; i < local; ++i)
        gpuOwn[i] = static_cast<double>(std::hash<std::string>{}(devices[i]->desc().uuid) &
                                        ((uint64_t{1} << 48) - 1));
    TD_RETURN_IF_ERROR(
        workers.allGatherHost(gpuOwn.data(), static_cast<int64_t>(local), gpus.data()));
    for (size_t a = 0; a < gpus.size(); ++a)
        for (size_t b = a + 1; b < gpus.size(); ++b)
            if (gpus[a] == gpus[b]) {
                const size_t wa = a / local, wb = b / local;
                out.whyNot =
                    (wa == wb ? "worker rank " + std::to_string(wa) + " has two replicas on"
                              : "worker ranks " + std::to_string(wa) + " and " +
                                    std::to_string(wb) + " share") +
                    " one GPU, and NCCL takes one rank per GPU";
                return out;
            }
    // Worker 0's id, one byte per value (exact in a double), and a last value saying whether
    // worker 0 could not make one (it still takes part in the exchange, so no peer waits for it).
    constexpr size_t kIdBytes = 128;  // NCCL_UNIQUE_ID_BYTES
    std::vector<double> idOwn(kIdBytes + 1, 0.0);
    std::vector<uint8_t> id;
    if (workers.rank() == 0) {
        auto made = ncclUniqueIdBytes();
        if (made.ok() && made->size() == kIdBytes) {
            id = std::move(made).value();
            std::copy(id.begin(), id.end(), idOwn.begin());
        } else {
            idOwn[kIdBytes] = 1.0;
        }
    }
    std::vector<double> ids(static_cast<size_t>(n) * (kIdBytes + 1));
    TD_RETURN_IF_ERROR(
        workers.allGatherHost(idOwn.data(), static_cast<int64_t>(kIdBytes + 1), ids.data()));
    if (ids[kIdBytes] != 0.0)
        return err("NCCL between workers: worker rank 0 could not create the NCCL id");
    id.assign(kIdBytes, 0);
    for (size_t i = 0; i < kIdBytes; ++i) id[i] = static_cast<uint8_t>(ids[i]);
    auto made = ncclAcrossWorkers(devices, host, id, workers, timeoutSeconds);
    if (!made.ok()) {
        // A set-up that did not complete: a barrier names the worker that is missing, if one is.
        const Status named = workers.barrier();
        return err(made.error() + (named.ok() ? std::string() : "; " + named.error()));
    }
    out.collectives = std::move(made).value();
    return out;
}

}  // namespace td

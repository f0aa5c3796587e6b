// Collectives in device memory, an interface of their own beside the device contract
// (backend.h): gradient buckets summed on the devices' streams (NCCL), for the CUDA devices of one
// process and between the processes of a multi-worker job. The trainer asks for them once per
// run and keeps its host collectives (engine/distribute) where they answer "why not".
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "engine/backend/backend.h"
#include "engine/distribute/collectives.h"

namespace td {

// The part every device-memory Collectives shares: gradient buckets summed on the devices (by the
// subclass), everything else (group size and rank, host sums, gathers, barriers) passed on to the
// host collectives of the replica group, which the subclass's abort() also breaks.
class DeviceSumCollectives : public Collectives {
  public:
    explicit DeviceSumCollectives(Collectives& host) : host_(host) {}
    int size() const override { return host_.size(); }
    int rank() const override { return host_.rank(); }
    bool reducesDeviceMemory() const override { return true; }
    Status allReduceHost(double* values, int64_t count) override {
        return host_.allReduceHost(values, count);
    }
    Status allGatherHost(const double* values, int64_t count, double* out) override {
        return host_.allGatherHost(values, count, out);
    }
    Status barrier() override { return host_.barrier(); }

  protected:
    Collectives& host_;
};

// Collectives that sum gradient buckets in the devices' own memory on their streams (NCCL
// between the CUDA devices of this process; a kernel of the GPU's own where every replica shares
// one GPU, which NCCL refuses), one per device in order, passing host reductions, barriers and
// aborts on to host[i] (one group, same order). An error says why not (CPU devices, no NCCL,
// replicas spread over several GPUs with more than one on some): the caller keeps `host`.
// timeoutSeconds bounds how long a replica waits for the others at a shared GPU's sum.
Result<std::vector<std::unique_ptr<Collectives>>> deviceCollectives(
    const std::vector<Device*>& devices, const std::vector<Collectives*>& host,
    double timeoutSeconds);

// The same between the processes of a multi-worker job (MultiWorkerMirrored on GPUs): one NCCL
// communicator over every GPU of every worker, global NCCL rank = worker rank x local GPUs + local
// index. `workers` is the process-level group (MPI, one member per process): worker 0's NCCL id
// travels through it, and the workers agree through it first whether every one of them can (all
// its replicas CUDA devices, NCCL loads). Collective: every worker calls it at the same point.
// `collectives` stays empty when some worker cannot (`whyNot` then says which and why, empty when
// no worker has GPUs): every worker keeps its host collectives. Errors end the run: workers with
// different GPU counts, a worker that did not arrive, NCCL set-up failing or not completing within
// `timeoutSeconds`. The communicators are non-blocking and watched: a peer's NCCL error, or a sum
// that does not complete within `timeoutSeconds`, aborts them and breaks the host group with a
// reason naming the worker that did not answer where the host group can tell (see
// nccl_collectives.cpp).
struct WorkerDeviceCollectives {
    std::vector<std::unique_ptr<Collectives>> collectives;
    std::string whyNot;
};
Result<WorkerDeviceCollectives> workerDeviceCollectives(const std::vector<Device*>& devices,
                                                        const std::vector<Collectives*>& host,
                                                        Collectives& workers,
                                                        double timeoutSeconds);

}  // namespace td

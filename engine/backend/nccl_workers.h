// Private to engine/backend: the backend-specific halves of workerDeviceCollectives
// (device_collectives.h), which devices.cpp joins with the agreement between workers.
// cuda/nccl_collectives.cpp implements them; devices.cpp has the stubs of a build without CUDA.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "engine/backend/backend.h"

namespace td {

// Why these devices cannot join a NCCL group across processes; empty: they can. `cpu` is set
// when the reason is a CPU replica (no GPU at all), so the caller can tell that from a missing
// NCCL.
std::string ncclAcrossWorkersUnavailable(const std::vector<Device*>& devices, bool& cpu);
// Worker 0's part of the bootstrap: a new NCCL id (ncclGetUniqueId), NCCL_UNIQUE_ID_BYTES long.
Result<std::vector<uint8_t>> ncclUniqueIdBytes();
// Once every worker agreed: this worker's communicators in the job-wide group of worker 0's `id`
// (one per local device, global rank = workers.rank() x devices + local index), polled to
// completion within `timeoutSeconds`; `host[i]` takes the host reductions of device i.
Result<std::vector<std::unique_ptr<Collectives>>> ncclAcrossWorkers(
    const std::vector<Device*>& devices, const std::vector<Collectives*>& host,
    const std::vector<uint8_t>& id, Collectives& workers, double timeoutSeconds);

}  // namespace td

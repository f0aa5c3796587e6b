// What other parts of the CUDA backend (nccl_collectives.cpp, cuda_devices.cpp) share of CUDA
// devices.
#pragma once

#include <cuda_runtime_api.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "engine/backend/backend.h"
#include "engine/distribute/collectives.h"

namespace td::cuda {

// The stream a CUDA device runs its programs and copies on; null for any other device.
cudaStream_t streamOf(Device& device);

// A CUDA runtime error as "cudaErrorName (its description)".
std::string cudaText(cudaError_t e);

// Collectives for two or more replicas on one GPU (NCCL takes one rank per GPU): each bucket
// summed on that GPU, in replica order, by one kernel over every replica's bucket once all of
// them reached it (shared_gpu_sums.cpp). A replica that does not arrive within timeoutSeconds
// breaks the group, naming it.
Result<std::vector<std::unique_ptr<Collectives>>> sharedGpuCollectives(
    const std::vector<Device*>& devices, const std::vector<Collectives*>& host,
    double timeoutSeconds);

}  // namespace td::cuda

namespace td {

// GPUs the driver reports (0 without a driver or GPU).
int cudaDeviceCount();
// One GPU's description from its properties alone (no context is made, so no free memory);
// none for an index the driver does not report.
std::optional<DeviceDesc> cudaDeviceProperties(int index);

}  // namespace td

// What other parts of the CUDA backend (nccl_collectives.cpp, cuda_devices.cpp) share of CUDA
// devices.
#pragma once

#include <cuda_runtime_api.h>

#include <optional>

#include "engine/backend/backend.h"

namespace td::cuda {

// The stream a CUDA device runs its programs and copies on; null for any other device.
cudaStream_t streamOf(Device& device);

}  // namespace td::cuda

namespace td {

// GPUs the driver reports (0 without a driver or GPU).
int cudaDeviceCount();
// One GPU's description from its properties alone (no context is made, so no free memory);
// none for an index the driver does not report.
std::optional<DeviceDesc> cudaDeviceProperties(int index);

}  // namespace td

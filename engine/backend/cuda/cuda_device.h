// What other parts of the CUDA backend (nccl_collectives.cpp) need of a CUDA device.
#pragma once

#include <cuda_runtime_api.h>

#include "engine/backend/backend.h"

namespace td::cuda {

// The stream a CUDA device runs its programs and copies on; null for any other device.
cudaStream_t streamOf(Device& device);

}  // namespace td::cuda

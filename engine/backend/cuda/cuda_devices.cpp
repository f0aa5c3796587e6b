// CUDA device discovery through the runtime API. A machine without a driver or GPU makes
// cudaGetDeviceCount fail: that is zero devices, not an error. Running Programs on CUDA devices
// is not implemented yet; openDevice("cuda:N") says so.
#include <cuda_runtime_api.h>

#include "engine/backend/backend.h"

namespace td {

std::vector<DeviceDesc> cudaDevices() {
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess) {
        (void)cudaGetLastError();  // clear the sticky error
        return {};
    }
    std::vector<DeviceDesc> out;
    for (int i = 0; i < count; ++i) {
        cudaDeviceProp prop{};
        if (cudaGetDeviceProperties(&prop, i) != cudaSuccess) continue;
        DeviceDesc d;
        d.kind = DeviceKind::Cuda;
        d.index = i;
        d.id = "cuda:" + std::to_string(i);
        d.name = prop.name;
        d.memoryBytes = static_cast<int64_t>(prop.totalGlobalMem);
        out.push_back(d);
    }
    return out;
}

}  // namespace td

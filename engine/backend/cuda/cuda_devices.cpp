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

Result<std::unique_ptr<Device>> makeCudaDevice(int index) {
    const auto devs = cudaDevices();
    if (index < 0 || index >= static_cast<int>(devs.size()))
        return err("cuda:" + std::to_string(index) + ": no such GPU (" +
                   std::to_string(devs.size()) + " detected)");
    return err("cuda:" + std::to_string(index) + " (" + devs[static_cast<size_t>(index)].name +
               "): the CUDA backend detects GPUs but does not run training programs yet; use "
               "cpu:0");
}

}  // namespace td

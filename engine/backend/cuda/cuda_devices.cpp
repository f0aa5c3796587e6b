// CUDA device discovery through the runtime API. A machine without a driver or GPU makes
// cudaGetDeviceCount fail: that is zero devices, not an error. The device itself (what runs
// programs) is cuda_device.cpp.
#include <cuda_runtime_api.h>

#include <optional>

#include "engine/backend/backend.h"
#include "engine/backend/cuda/cuda_device.h"

namespace td {

namespace {

// CUDA encodes versions as 1000 * major + 10 * minor (13000 = "13.0").
std::string cudaVersionString(int v) {
    if (v <= 0) return {};
    return std::to_string(v / 1000) + "." + std::to_string((v % 1000) / 10);
}

}  // namespace

int cudaDeviceCount() {
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess) {
        (void)cudaGetLastError();  // clear the sticky error
        return 0;
    }
    return count;
}

std::optional<DeviceDesc> cudaDeviceProperties(int index) {
    cudaDeviceProp prop{};
    if (index < 0 || index >= cudaDeviceCount() ||
        cudaGetDeviceProperties(&prop, index) != cudaSuccess) {
        (void)cudaGetLastError();
        return std::nullopt;
    }
    int driver = 0;
    int runtime = 0;
    if (cudaDriverGetVersion(&driver) != cudaSuccess) driver = 0;
    if (cudaRuntimeGetVersion(&runtime) != cudaSuccess) runtime = 0;
    (void)cudaGetLastError();
    DeviceDesc d;
    d.kind = DeviceKind::Cuda;
    d.index = index;
    d.id = "cuda:" + std::to_string(index);
    d.name = prop.name;
    d.memoryBytes = static_cast<int64_t>(prop.totalGlobalMem);
    d.computeCapability = std::to_string(prop.major) + "." + std::to_string(prop.minor);
    d.driverVersion = cudaVersionString(driver);
    d.runtimeVersion = cudaVersionString(runtime);
    static const char* hex = "0123456789abcdef";
    for (char byte : prop.uuid.bytes) {
        const auto b = static_cast<unsigned char>(byte);
        d.uuid += hex[b >> 4];
        d.uuid += hex[b & 15];
    }
    return d;
}

std::vector<DeviceDesc> cudaDevices() {
    const int count = cudaDeviceCount();
    // cudaSetDevice below changes the calling thread's current device: put it back afterwards.
    int previous = -1;
    if (count > 0 && cudaGetDevice(&previous) != cudaSuccess) previous = -1;
    std::vector<DeviceDesc> out;
    for (int i = 0; i < count; ++i) {
        std::optional<DeviceDesc> desc = cudaDeviceProperties(i);
        if (!desc) continue;
        DeviceDesc& d = *desc;
        // Free memory needs a context on the device: its primary context is made here (the one a
        // cuda:N device uses, and which stays for the process's life); a device that refuses one
        // is still listed, without free memory.
        size_t freeBytes = 0;
        size_t totalBytes = 0;
        if (cudaSetDevice(i) == cudaSuccess &&
            cudaMemGetInfo(&freeBytes, &totalBytes) == cudaSuccess)
            d.memoryFreeBytes = static_cast<int64_t>(freeBytes);
        else
            (void)cudaGetLastError();
        out.push_back(d);
    }
    if (previous >= 0) (void)cudaSetDevice(previous);
    (void)cudaGetLastError();
    return out;
}

}  // namespace td

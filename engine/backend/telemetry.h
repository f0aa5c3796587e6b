// Device telemetry, an interface of its own beside the device contract (backend.h): what a device
// reports of itself while a run goes on (NVML for CUDA devices). The trainer publishes it at log
// points (DeviceStats).
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace td {

// Live figures of a device, where the system can tell (NVML for CUDA devices).
struct DeviceTelemetry {
    int64_t memoryUsedBytes = -1;   // -1: unknown
    int64_t memoryTotalBytes = -1;  // -1: unknown
    double gpuUtilization = -1;     // 0..1 over NVML's last sample period; -1: unknown
};
// Reads them for a device id ("cuda:0"). nullopt for CPUs, without the CUDA backend, and where
// NVML (libnvidia-ml.so.1, opened with dlopen at first use) is absent or does not know the GPU.
// Never fails loudly: the figures are optional.
std::optional<DeviceTelemetry> deviceTelemetry(const std::string& deviceId);

}  // namespace td

// Per-GPU memory and utilisation from NVML (the driver's management library), for the DeviceStats
// the trainer publishes at log points. libnvidia-ml.so.1 is opened with dlopen at first use, so
// the binary has no link dependency on it; where it is absent, or does not know a GPU, there are
// simply no figures. CUDA devices are matched to NVML's by PCI bus id (CUDA and NVML may number
// the GPUs differently, e.g. under CUDA_VISIBLE_DEVICES).
#pragma once

#include <optional>
#include <string>

#include "engine/backend/backend.h"
#include "engine/backend/telemetry.h"

namespace td::cuda {

// A PCI bus id as cudaDeviceGetPCIBusId writes it ("0000:3B:00.0") in NVML's form
// ("00000000:3b:00.0"): domain, bus, device in hexadecimal, function. Also takes the domain-less
// "3b:00.0". nullopt when it is not a bus id.
std::optional<std::string> nvmlBusId(const std::string& pciBusId);

// NVML's figures for CUDA device `index`; nullopt without NVML, or when NVML does not know it.
std::optional<DeviceTelemetry> nvmlTelemetry(int index);

// Why NVML gives no figures (the library is absent, nvmlInit failed); empty once it is loaded.
std::string nvmlUnavailableReason();

}  // namespace td::cuda

// Devices whose kernels run on host threads (the CPU device): what their callers can ask of those
// threads, an interface of its own beside the device contract (backend.h). Device::hostThreads()
// returns it; a device with processors of its own (a GPU) has none.
#pragma once

#include <cstddef>

#include "engine/backend/backend.h"

namespace td {

class HostThreads {
  public:
    virtual ~HostThreads() = default;
    // Called on a thread before it compiles or runs programs. `workerThreads` is how many threads
    // the device may use for that thread's work (0 = all it has). The CPU device also sets
    // flush-to-zero / denormals-are-zero there and in its worker pool: optimizer moments of
    // always-zero gradients decay into denormals, which cost ~100x per operation.
    virtual void prepareThread(int workerThreads) = 0;
    // A parameter whose products read it as a matrix with rows of `rowBytes` (its last
    // dimension's bytes; 0 for a vector), placed where those reads run fastest (the CPU device
    // offsets some from alignment, see cpu_device.cpp). Released by Device::release().
    virtual Result<Buffer> allocateWeights(size_t bytes, size_t rowBytes) = 0;
    // Host work for the idle moments of the next run: a device whose runs share their work with
    // helper threads of its own (the CPU device's WorkShare) hands `task` to the first helper
    // that finishes its part of an operation of that run; finishAside() returns once the task ran
    // (on the calling thread if no helper started it). False: no such helpers; the caller runs the
    // task itself. One task at a time, posted and finished by the thread that runs the programs.
    virtual bool startAside(void (*task)(void*), void* ctx) = 0;
    virtual void finishAside() = 0;
    // Whether startAside can hand a task to such a helper: the programs compiled so far share
    // their work with helper threads (for a step on fewer threads than the device has).
    virtual bool runsAside() const = 0;
};

// The calling thread's share of `device` (see HostThreads::prepareThread); nothing for a device
// without host threads.
inline void prepareThreadFor(Device& device, int workerThreads) {
    if (HostThreads* h = device.hostThreads()) h->prepareThread(workerThreads);
}

// A weight matrix on `device`: placed by its host threads' rule where it has one.
inline Result<Buffer> allocateWeightsOn(Device& device, size_t bytes, size_t rowBytes) {
    if (HostThreads* h = device.hostThreads()) return h->allocateWeights(bytes, rowBytes);
    return device.allocate(bytes);
}

}  // namespace td

// Collectives: how the replicas of a strategy sum their gradients (and, at log points, their
// metric sums). One Collectives object per replica; every replica of the group calls the same
// operations in the same order. Implementations: an in-process group for CPU replicas on threads
// (replica_group.h), MPI between processes (mpi_collectives.h), NCCL between GPUs (CUDA backend:
// the GPUs of one process, or of every process of a multi-worker job), and a GPU's own sum kernel
// for replicas that share one GPU.
//
// Failure: a peer that dies or stops answering makes every wait fail within the group's timeout
// with an error naming the rank (or replica) that did not arrive, e.g. "all-reduce: worker rank 1
// did not answer within 30 s (it exited or hangs)". Once a call failed, the group is broken:
// every later call fails at once with the same error (abort() breaks it on purpose).
#pragma once

#include <cstdint>
#include <string>

#include "engine/core/result.h"

namespace td {

class Collectives {
  public:
    virtual ~Collectives() = default;
    // Replicas in the whole group (every process) and this replica's index among them.
    virtual int size() const = 0;
    virtual int rank() const = 0;

    // Starts summing `count` f32 values at `data` (memory of this replica's device) across every
    // replica of the group, in place; `bucket` numbers the buckets of one step in start order
    // (0, 1, ...). Returns once started: the backward pass goes on while the sum is computed.
    // `data` must not be touched until allReduceWait(bucket) returns. The sum is the same bit for
    // bit on every replica (a fixed order over ranks).
    virtual Status allReduceStart(int bucket, float* data, int64_t count) = 0;
    // Waits for the sum of a started bucket.
    virtual Status allReduceWait(int bucket) = 0;
    // (optional) Where allReduceStart's `data` lives: false (the default) host memory, which a
    // GPU device stages its buckets through; true the device memory of this replica's GPU, the
    // sum enqueued on that device's stream (NCCL: allReduceStart returns once enqueued, and
    // allReduceWait has nothing to wait for, the stream orders what reads the sum).
    virtual bool reducesDeviceMemory() const { return false; }
    // (optional) Collectives that sum device memory: whether sums may still be enqueued. A
    // program whose captured step holds the sums asks before every run, so a group broken from
    // another thread (NCCL's watchdog saw a peer fail or hang, and aborted the communicators)
    // fails the step with the reason instead of replaying sums on a broken communicator.
    virtual Status deviceSumsUsable() { return Status::success(); }
    // (optional) Collectives that sum device memory: whether their sums may be captured with the
    // step into a CUDA Graph (NCCL's can). False: each start meets the other replicas on the host
    // (replicas sharing one GPU), so a program replays no graph and launches its step instead.
    virtual bool capturable() const { return true; }

    // Blocking sum of host values across the group (metric sums at log points, per-replica
    // figures). Same order guarantee.
    virtual Status allReduceHost(double* values, int64_t count) = 0;
    // Blocking: every replica gets every replica's `count` values, rank-major, in `out`
    // (size() * count values). Used to bring per-replica figures to the chief.
    virtual Status allGatherHost(const double* values, int64_t count, double* out) = 0;
    // Waits until every replica arrived.
    virtual Status barrier() = 0;

    // Breaks the group: every replica blocked in (or later entering) a call of this group fails
    // with `reason`. Called by a replica that fails on its own, so no peer waits for it forever.
    virtual void abort(const std::string& reason) = 0;
};

}  // namespace td

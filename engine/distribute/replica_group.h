// The in-process replica group: N replicas of one process (CPU replicas on their own threads, or
// the GPUs of one machine before NCCL is involved) summing buffers in shared memory.
//
// An all-reduce is a reduce-scatter and an all-gather in one pass: once every replica has posted
// a bucket, replica r sums chunk r of the bucket over all replicas in rank order and writes the
// sum into every replica's copy. Each replica does its chunk at its first call after the last
// post (its own start of a later bucket, or the wait), so the work is shared and overlaps the
// backward passes of replicas that are still running. The sum is in a fixed rank order, so every
// replica holds the same bits, and the result does not depend on timing.
//
// With an outer group (MPI between processes), the local sum of each bucket is summed across the
// processes by replica 0 of each process before the local replicas are released: hierarchical
// all-reduce with one process-level operation per bucket.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "engine/distribute/collectives.h"

namespace td {

class ReplicaGroup {
  public:
    // `replicas` local replicas; a wait that takes longer than `timeoutSeconds` fails naming the
    // replicas that did not arrive. `outer` (may be null): the process-level group this one is
    // part of; size() and rank() then count replicas over all processes (every process must have
    // the same number of local replicas).
    ReplicaGroup(int replicas, double timeoutSeconds, Collectives* outer = nullptr);
    ~ReplicaGroup();
    ReplicaGroup(const ReplicaGroup&) = delete;
    ReplicaGroup& operator=(const ReplicaGroup&) = delete;

    int replicas() const;
    // The handle replica `r` (0-based, local) calls from its own thread.
    Collectives& replica(int r);
    // Breaks the group for every replica (a failed replica, a stop of the whole run).
    void abort(const std::string& reason);

    struct State;

  private:
    std::unique_ptr<State> state_;
    std::vector<std::unique_ptr<Collectives>> handles_;
};

}  // namespace td

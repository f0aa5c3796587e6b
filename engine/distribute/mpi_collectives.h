// Collectives between the processes of an MPI job (MultiWorkerMirrored on CPUs): one replica per
// process, every process of MPI_COMM_WORLD.
//
// All-reduce: the bucket is cut into size() contiguous chunks; chunk j belongs to rank j. Every
// rank sends chunk j to its owner and receives its own chunk from every peer (point-to-point, so
// a missing piece names its sender); the owner sums its chunk in rank order, x0 + x1 + ... (the
// order a single process summing the replicas would use), and sends the sum back to every peer.
// Each rank moves 2 (N-1)/N of the bucket, as a ring does, and every rank ends with the same bits
// whatever the timing. With two workers, and for buckets of at most 8192 values, every rank
// instead receives the whole bucket from every peer and sums all of it in the same order: one
// round of messages instead of two (for two workers, the same bytes). Host all-reduce, all-gather
// and the barrier exchange directly with every peer the same way.
//
// Waits poll (MPI_Testsome, the control channel, the launcher's SIGTERM) and sleep briefly in
// between; a wait fails after timeoutSeconds without progress from a peer, naming the ranks that
// did not deliver. abort(), a failed wait and a timeout tell every peer over a separate
// communicator, so their waits fail at once with the reason instead of at their own timeout.
#pragma once

#include <memory>
#include <string>

#include "engine/core/result.h"
#include "engine/distribute/collectives.h"
#include "engine/distribute/mpi_world.h"

namespace td {

class MpiCollectives final : public Collectives {
  public:
    // Collective: every process of the job calls it, in the same order as its other MPI set-up.
    // `timeoutSeconds` (> 0) bounds every wait. Errors: no MPI in this build, a world that could
    // not be set up, or a peer that did not arrive within the timeout.
    static Result<std::unique_ptr<MpiCollectives>> create(MpiWorld& world, double timeoutSeconds);
    ~MpiCollectives() override;

    int size() const override;
    int rank() const override;

    // `data` must be host memory (CPU replicas); at most 2^31-1 values per chunk. Buckets are
    // numbered 0, 1, ... below 16384.
    Status allReduceStart(int bucket, float* data, int64_t count) override;
    Status allReduceWait(int bucket) override;
    Status allReduceHost(double* values, int64_t count) override;
    Status allGatherHost(const double* values, int64_t count, double* out) override;
    Status barrier() override;
    // Thread-safe: may be called from another thread than the one in a wait; that wait fails
    // with `reason` at its next poll (within about a millisecond).
    void abort(const std::string& reason) override;

    double timeoutSeconds() const;
    // True once a call failed or abort() was called; error() then says why.
    bool broken() const;
    std::string error() const;

    struct Impl;

  private:
    explicit MpiCollectives(std::unique_ptr<Impl> impl);
    std::unique_ptr<Impl> impl_;
};

}  // namespace td

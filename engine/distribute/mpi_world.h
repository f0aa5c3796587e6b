// The process level of MultiWorkerMirrored: how this process was launched (mpirun, srun or another
// PMI launcher), MPI start-up and shutdown, and the launcher's termination signals.
//
// A process that no launcher started never touches MPI: detectMpiLaunch() reads the environment
// only. mpiWorld() initializes MPI once (MPI_Init_thread, at least MPI_THREAD_SERIALIZED: calls
// come from one engine thread at a time, not necessarily the main one) and finalizes it at exit,
// unless a collective failed: then MPI_Finalize could wait forever for a peer and is skipped.
//
// Without MPI in the build (TRAINDECK_MPI=OFF, or no MPI found), everything here still links:
// mpiWorld() and MpiCollectives::create() return an error that says so.
#pragma once

#include <string>
#include <vector>

#include "engine/core/result.h"

namespace td {

// The message of every MPI entry point in a build without MPI.
inline constexpr const char* kNoMpiSupport =
    "this build has no MPI support; install libopenmpi-dev and rebuild";

// True when this build was compiled with MPI (TRAINDECK_HAVE_MPI).
bool mpiSupported();

// What the environment says about the launcher. Read without initializing MPI.
struct MpiLaunch {
    bool launched = false;  // started by mpirun/mpiexec, srun or a PMI/PMIx launcher
    std::string launcher;   // "mpirun (Open MPI)", "srun (Slurm)", "PMI", "PMIx"; empty when not
    int rank = 0;           // -1 where the launcher's variables do not say
    int size = 1;           // -1 where the launcher's variables do not say
    int localRank = 0;      // -1 where the launcher's variables do not say
};
// Open MPI's OMPI_COMM_WORLD_{RANK,SIZE,LOCAL_RANK}; Slurm's SLURM_PROCID with SLURM_STEP_NUM_TASKS
// or SLURM_STEP_ID (set by srun only: a batch script's own shell is not a launched worker);
// PMI_RANK/PMI_SIZE (MPICH's Hydra, Intel MPI); PMIX_RANK.
MpiLaunch detectMpiLaunch();

// The MPI job this process belongs to (MPI_COMM_WORLD): one member per worker process (its local
// replicas sum first, in a ReplicaGroup).
class MpiWorld {
  public:
    int rank() const { return rank_; }
    int size() const { return size_; }
    // Among the processes on this host (by host name).
    int localRank() const { return localRank_; }
    int localSize() const { return localSize_; }
    // Rank 0 is the chief: the only worker that writes the run store.
    bool isChief() const { return rank_ == 0; }
    // MPI_Get_processor_name of every rank, by rank.
    const std::vector<std::string>& hostNames() const { return hostNames_; }
    const std::string& hostName() const { return hostNames_[static_cast<size_t>(rank_)]; }
    // The thread support MPI provided (MPI_THREAD_SERIALIZED or MPI_THREAD_MULTIPLE).
    int threadLevel() const { return threadLevel_; }
    // The launcher detectMpiLaunch() saw, e.g. "mpirun (Open MPI)".
    const std::string& launcher() const { return launcher_; }
    // "worker rank 1 of 4 on node2 (local rank 0 of 2), started by mpirun (Open MPI)"
    std::string describe() const;

  private:
    friend struct MpiWorldAccess;
    MpiWorld() = default;
    int rank_ = 0;
    int size_ = 1;
    int localRank_ = 0;
    int localSize_ = 1;
    int threadLevel_ = 0;
    std::string launcher_;
    std::vector<std::string> hostNames_;
};

// Initializes MPI on the first call (later calls return the same world) and installs the SIGTERM
// and SIGINT handler below. Call it first on the thread that will leave main(): MPI wants its
// finalization, done at exit, on the thread that initialized it. Errors: no MPI in this build,
// the process was not started by a launcher (a single process needs no MPI: run it without the
// multi-worker strategy, or under `mpirun -np 1`), an MPI thread level below SERIALIZED, or a
// start-up in which not every worker arrived within `startupTimeoutSeconds`.
Result<MpiWorld*> mpiWorld(double startupTimeoutSeconds = 300);
// True once mpiWorld() succeeded (and MPI was initialized by it).
bool mpiWorldStarted();

// The launcher's termination request. mpirun ends a job whose worker died (or that the user
// interrupted) by sending SIGTERM to every surviving worker and SIGKILL a grace period later.
// mpiWorld() installs a handler for SIGTERM and SIGINT that only records the signal; the
// collectives' waits poll it and fail with "... the launcher is ending the job (SIGTERM)", so the
// run can still end cleanly in the store. A second signal of either kind ends the process at once.
// Returns the first signal received, or 0.
int mpiTerminationSignal();
// "SIGTERM", "SIGINT" or "signal N".
std::string signalName(int signal);

// Marks the world broken (a collective failed or the group was aborted): MPI_Finalize is skipped
// at exit, since it could wait forever for a dead or hung peer. The collectives call it.
void markMpiWorldBroken();
bool mpiWorldBroken();

// For the command line, at the very end of a failed multi-worker run, after the error has been
// reported and stored: ends every process of the job now (MPI_Abort with `exitCode`), so no
// worker waits for this one and srun or mpirun stop the job instead of waiting for its timeout.
// Returns (doing nothing) when MPI was never initialized by mpiWorld(). The engine itself never
// calls it: library code returns errors.
void endFailedMpiRun(int exitCode);

}  // namespace td

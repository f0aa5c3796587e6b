// Shared by the MPI sources of engine/distribute only (includes <mpi.h>; never include it from a
// public header). Built only when TRAINDECK_HAVE_MPI is defined.
#pragma once

#if TRAINDECK_HAVE_MPI

// The C API only: no C++ bindings (Open MPI's and MPICH's mpi.h pull them in for C++ otherwise).
#ifndef OMPI_SKIP_MPICXX
#define OMPI_SKIP_MPICXX 1
#endif
#ifndef MPICH_SKIP_MPICXX
#define MPICH_SKIP_MPICXX 1
#endif
#include <mpi.h>

#include <chrono>
#include <mutex>
#include <string>

#include "engine/core/result.h"

namespace td::mpi_detail {

using Clock = std::chrono::steady_clock;

// "MPI_ERR_TRUNCATE: message truncated" style text for an MPI error code.
std::string errorString(int code);

// Every MPI call goes through this: a failed call becomes an error naming it.
inline Status check(int rc, const char* call) {
    if (rc == MPI_SUCCESS) return Status::success();
    return err(std::string(call) + " failed: " + errorString(rc));
}
#define TD_MPI_CHECK(call) ::td::mpi_detail::check((call), #call)

// MPI is initialized with MPI_THREAD_SERIALIZED: every MPI call of the process after start-up
// (every MpiCollectives, endFailedMpiRun) runs under this mutex.
std::mutex& callMutex();

// Pauses between polls of pending requests. Open MPI moves a large message along (fragment by
// fragment through shared memory, or over TCP) only inside MPI calls on both sides, so the first
// 10 ms poll after a yield; then 20 us sleeps (about 70 us with timer slack) up to 0.2 s, then 1
// ms. A waiting worker thus leaves the cores to the peers it waits for (workers may share cores).
class Backoff {
  public:
    void pause();
    void reset() { start_ = Clock::now(); }

  private:
    Clock::time_point start_ = Clock::now();
};

// Polls one request (a collective started with MPI_I*) until it completes or `deadline` passes.
// Used for start-up steps that involve every rank at once, where no single peer can be named.
Status pollRequest(MPI_Request* request, Clock::time_point deadline, const std::string& what,
                   double timeoutSeconds);

// "30 s", "2.5 s"
std::string formatSeconds(double seconds);

}  // namespace td::mpi_detail

#endif  // TRAINDECK_HAVE_MPI

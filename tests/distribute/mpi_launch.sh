#!/usr/bin/env bash
# Runs a command as NP workers on this machine under Open MPI's mpirun, with the flags every
# local and CI run needs (the one place the tests take them from):
#   mpi_launch.sh NP COMMAND [ARGS...]
#   --allow-run-as-root            mpirun refuses root otherwise (containers, CI)
#   --oversubscribe --bind-to none more workers than cores (2-core machines); the scheduler
#                                  places them instead of pinning two to one core
#   --mca odls_base_sigkill_timeout N
#                                  when a worker dies, mpirun waits N s, sends SIGTERM to the
#                                  survivors, waits N s more, then SIGKILL: the survivors' grace to
#                                  report the error and store the failed run (default 1 s);
#                                  TRAINDECK_MPI_SIGKILL_TIMEOUT sets N here (default 2)
#   --mca btl_vader_single_copy_mechanism none
#                                  shared-memory transfers without cross-process reads (CMA needs
#                                  ptrace rights many containers deny; Open MPI then fails large
#                                  messages); TRAINDECK_MPI_SINGLE_COPY=cma keeps the fast path
# Extra mpirun options: TRAINDECK_MPIRUN_FLAGS. Exit 77 when mpirun is not installed.
set -uo pipefail
if [ $# -lt 2 ]; then
  echo "usage: mpi_launch.sh NP COMMAND [ARGS...]" >&2
  exit 2
fi
np="$1"
shift
if ! command -v mpirun >/dev/null 2>&1; then
  echo "SKIP: mpirun not found (Debian: openmpi-bin)"
  exit 77
fi
flags=(-np "$np" --oversubscribe --bind-to none
       --mca odls_base_sigkill_timeout "${TRAINDECK_MPI_SIGKILL_TIMEOUT:-2}")
if [ "${TRAINDECK_MPI_SINGLE_COPY:-none}" != cma ]; then
  flags+=(--mca btl_vader_single_copy_mechanism none)
fi
if [ "$(id -u)" = 0 ]; then
  flags+=(--allow-run-as-root)
fi
# shellcheck disable=SC2206
extra=(${TRAINDECK_MPIRUN_FLAGS:-})
exec mpirun "${flags[@]}" "${extra[@]}" "$@"

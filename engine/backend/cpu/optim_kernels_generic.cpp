// Optimizer kernels for the baseline CPU of the build (SSE2 on x86-64).
#define TD_OPTIM_ISA_NAMESPACE isa_generic
#define TD_OPTIM_ISA_LEVEL td::CpuIsa::Generic
#include "engine/backend/cpu/optim_kernels_impl.h"

// The optimizer update on memory the CPU can address: a multi-tensor update of every trainable
// parameter (UpdateSpec and this step's UpdateScalars, graph/update_spec.h). Gradient clipping by
// norm needs norms of the gradients; the update computes them itself, so the step needs no host
// read. The CPU backend's update instruction and Optimizer::apply both run applyUpdate.
#pragma once

#include <cstdint>
#include <span>

#include "engine/graph/update_spec.h"

namespace td {

class WorkShare;

// One trainable parameter as the update reads and writes it (memory the CPU can address).
struct UpdateTensor {
    float* value = nullptr;
    const float* grad = nullptr;
    int64_t size = 0;
    // spec.slotsPerParam() arrays of `size` floats, in the optimizer's slot order: SGD momentum;
    // Adam m, v[, vhat]; RMSprop velocity[, momentum][, average_gradient].
    float* slot[3] = {nullptr, nullptr, nullptr};
    // Mixed precision: the parameter's 16-bit copy the next step's matrix products read,
    // written from the updated value (bf16, or f16 when shadowF16). Null: none.
    uint16_t* shadow = nullptr;
    bool shadowF16 = false;
};

// One optimizer step over every tensor, in one pass: gradient clipping (the norms computed here),
// decoupled weight decay and the update rule, with the element loops of the active instruction
// set. With 32k elements or more in all, the tensors are one range split across `threads`
// OpenMP threads (0 = the calling thread's team size) in one fork: the element math does not
// depend on the split, so results are the same for every thread count. The CPU backend's update
// instruction and Optimizer::apply both run this, so their results are identical.
// With `lossScale`: the gradients are divided by its scale first (clipping sees the unscaled
// values); a step with a non-finite gradient changes nothing but the loss-scale state. Returns
// whether the step was applied.
// With `share` (a device whose step runs on fewer threads than it has): the range is split
// into pieces claimed by the caller and the share's helpers instead of an OpenMP team.
bool applyUpdate(const UpdateSpec& spec, const UpdateScalars& scalars,
                 std::span<const UpdateTensor> tensors, int threads = 0,
                 LossScaleState* lossScale = nullptr, WorkShare* share = nullptr);

}  // namespace td

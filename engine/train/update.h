// The optimizer update as a device runs it: a multi-tensor update of every trainable parameter,
// fixed per run (UpdateSpec, from the optimizer's configuration) plus a few scalars per step
// (UpdateScalars, computed on the host by Optimizer::nextStep from the iteration count and the
// schedule, never from device values). Gradient clipping by norm needs norms of the gradients;
// the device computes them inside the update, so the step needs no host read.
#pragma once

#include <cstdint>
#include <span>

namespace td {

class WorkShare;

enum class UpdateKind : uint8_t { Sgd, Adam, RmsProp };
enum class ClipKind : uint8_t { None, Value, Norm, GlobalNorm };

struct UpdateSpec {
    UpdateKind kind = UpdateKind::Adam;
    // SGD (momentum 0 = plain) and RMSprop momentum.
    float momentum = 0;
    bool nesterov = false;
    // Adam / AdamW: 1 - beta_1 and 1 - beta_2 as Keras rounds them (double, then float).
    float oneMinusBeta1 = 0, oneMinusBeta2 = 0;
    bool amsgrad = false;
    // RMSprop
    float rho = 0, oneMinusRho = 0;
    bool centered = false;
    float epsilon = 0;
    // Decoupled weight decay (AdamW, or weight_decay on any optimizer): w -= w * wd * lr first.
    bool decay = false;
    // Clipping: Value clamps each gradient element to [-clip, clip]; Norm scales each tensor by
    // clip / max(||g||, clip); GlobalNorm scales all by min(1, clip / ||all g||) (NaN when that
    // norm is not finite), as Keras' BaseOptimizer._clip_gradients. The norms are computed in
    // double against the threshold as configured (double); clipvalue clamps in float.
    ClipKind clip = ClipKind::None;
    double clipValue = 0;

    int slotsPerParam() const {
        switch (kind) {
            case UpdateKind::Sgd:
                return momentum != 0 ? 1 : 0;
            case UpdateKind::Adam:
                return amsgrad ? 3 : 2;
            case UpdateKind::RmsProp:
                return 1 + (momentum > 0 ? 1 : 0) + (centered ? 1 : 0);
        }
        return 0;
    }
};

struct UpdateScalars {
    float lr = 0;     // the learning rate of this step
    float alpha = 0;  // Adam: lr * sqrt(1 - beta_2^t) / (1 - beta_1^t), in float32 as Keras
    float wdLr = 0;   // weight_decay * lr
};

// Dynamic loss scaling of mixed_float16 (Keras' LossScaleOptimizer), kept in device memory next
// to the optimizer slots: the loss gradient is multiplied by `scale`; the update divides the
// gradients by it, and when any gradient is not finite it skips the step, halves the scale and
// counts the skip; after `growthSteps` finite steps in a row the scale doubles.
struct LossScaleState {
    float scale = 32768.0f;  // 2^15
    int32_t goodSteps = 0;   // finite steps since the last change of scale
    int64_t skippedSteps = 0;
    int32_t growthSteps = 2000;
    int32_t lastSkipped = 0;  // 1 when the last step was skipped
};

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

// Elements [begin, end) of one tensor, as applyUpdate updates them when nothing scales the
// gradients (no norm clipping, no loss scaling): for an update run in pieces as its gradient is
// produced. The same arithmetic per element, so the same bits as applyUpdate's.
void applyUpdateSlice(const UpdateSpec& spec, const UpdateScalars& scalars,
                      const UpdateTensor& tensor, int64_t begin, int64_t end);

}  // namespace td

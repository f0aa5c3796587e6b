// The optimizer update as a lowered program carries it: fixed per run (UpdateSpec, from the
// optimizer's configuration) plus a few scalars per step (UpdateScalars, computed on the host by
// Optimizer::nextStep from the iteration count and the schedule, never from device values), and
// the dynamic loss-scale state of mixed_float16. Every backend runs the update from these
// (backend/cpu/update.h on the CPU, backend/cuda/cuda_update.cu on the GPU), with the
// per-element math of backend/update_math.h.
#pragma once

#include <cstdint>

namespace td {

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

}  // namespace td

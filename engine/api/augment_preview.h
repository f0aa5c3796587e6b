// What the data panel shows of the samples after the model's leading preprocessing and
// augmentation layers, as a training step computes them: the pipeline's map steps (scale,
// normalize) first, then those layers compiled into a program of their own on the CPU device and
// run in training mode, so the random layers draw. Nothing here implements a layer: the program is
// the training graph's own nodes (buildGraph), lowered and run by the CPU device's kernels.
//
// The layers that count run from the model's start up to the first layer that is neither
// Rescaling nor an image preprocessing layer (Resizing, CenterCrop, RandomCrop, RandomFlip,
// RandomRotation, RandomZoom, RandomTranslation, RandomContrast, RandomBrightness); a Reshape
// between them (e.g. [28, 28] -> [28, 28, 1] before a RandomFlip) runs with them.
//
// Draws: a random layer keys each sample's transform by (its seed, the step, the sample's global
// index), its seed being its own or the one training derives from the project's training.seed.
// Draw d is step d + 1 with the previewed samples as rows 0, 1, ... of its batch: draw 0 shows
// the transforms that the first training step gives the first rows of its batch (that batch holds
// other samples when the pipeline shuffles). The same project and draw give the same pictures.
// Loading reads the source (as previewData does), so callers run these off the GUI thread.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "engine/core/result.h"
#include "engine/core/tensor.h"
#include "engine/io/project.h"

namespace td::api {

// The model's leading layers a preview runs.
struct AugmentLayers {
    std::vector<std::string> names;  // in model order; empty when there are none
    Shape inputShape;                // the model's input (one sample)
    Shape outputShape;               // after the last of them: [H, W] or [H, W, 1|3]
    // Why there is nothing to preview (no such layers, their result is not an image, the model
    // does not check); empty when `names` holds layers to run.
    std::string unavailable;

    bool available() const { return unavailable.empty(); }
};
// Reads the model only (shape inference on a copy): cheap enough for the GUI thread.
AugmentLayers augmentLayers(const Project& project);

// The project's first training samples as the model receives them: after the pipeline's
// element-wise map steps (scale, normalize, cast; one_hot and the cache's place do not touch the
// features), f32, in the model's input shape.
struct AugmentInput {
    Shape sampleShape;                         // the model's input shape
    std::vector<std::vector<float>> samples;   // numElements(sampleShape) values each
    double displayLow = 0, displayHigh = 255;  // the range pictures show (previewAugmented)
};
Result<AugmentInput> augmentInput(const Project& project, int maxSamples = 48);

// The samples after the leading layers.
//
// Pictures: every value maps linearly from one display range onto 0..255 and is clamped there.
// That range is the samples' own range, carried through the map steps and the leading Rescaling
// layers (x * scale + offset): 0..255 for u8 sources (so a sample no layer changed looks exactly
// as previewData shows it), for f32 sources the min..max over all the previewed samples together.
// One range for every sample, unlike previewData's per-sample stretch of float samples, so what
// RandomBrightness and RandomContrast change stays visible; values they (or a constant fill)
// push outside it are clamped.
struct AugmentedPreview {
    std::vector<std::string> layers;  // the layers that ran
    uint64_t draw = 0;
    int64_t step = 1;  // the training step whose draws these are (draw + 1)
    int imageHeight = 0, imageWidth = 0, imageChannels = 0;
    std::vector<std::vector<float>> values;    // per sample, H * W * C row-major, as computed
    std::vector<std::vector<uint8_t>> pixels;  // per sample, H * W * C, 0..255
    double displayLow = 0, displayHigh = 0;    // the range mapped onto 0..255
};
// Errors: the reason of augmentLayers when there is nothing to run, samples that do not fit the
// model's input, and what compiling or running the program said.
Result<AugmentedPreview> previewAugmented(const Project& project, const AugmentInput& input,
                                          uint64_t draw = 0);
// augmentInput, then previewAugmented.
Result<AugmentedPreview> previewAugmented(const Project& project, int maxSamples = 48,
                                          uint64_t draw = 0);

}  // namespace td::api

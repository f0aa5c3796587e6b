// What the data panel shows of a source before training: the first samples (as pictures when
// they are images, as numbers otherwise) with their labels, a class histogram of the training
// split, and the input pipeline a project builds, in words. Loading reads the whole source (a
// histogram needs every label), so callers run previewData off the GUI thread.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "engine/core/data_config.h"
#include "engine/core/result.h"
#include "engine/core/tensor.h"

namespace td::api {

struct DataPreview {
    int64_t trainSamples = 0;
    int64_t testSamples = 0;  // 0 when the source has no test split
    Shape sampleShape;        // one training sample, e.g. [28,28]
    std::string dtype;        // as stored: "u8", "f32"
    int64_t numClasses = 0;   // 0 when the labels are not class ids
    std::vector<std::string> classNames;

    // The first samples of the training split, in order.
    std::vector<int> labels;  // class id (argmax of one-hot or target rows); -1 when none
    // Pictures, when a sample is [H, W] or [H, W, 1|3] with H, W >= 4: one H*W*C row-major
    // buffer per sample, 0..255 (float samples are stretched from their own min..max).
    int imageHeight = 0, imageWidth = 0, imageChannels = 0;  // 0: not images
    std::vector<std::vector<uint8_t>> pixels;
    // Otherwise the first features of each sample, as f32.
    std::vector<std::vector<float>> features;

    // Samples per label over the whole training split, by label ascending (label -1: samples
    // without a class id).
    std::vector<std::pair<int, int64_t>> classCounts;

    bool images() const { return imageHeight > 0; }
    // The source's class name for a label, or the number.
    std::string className(int label) const;
};

// Loads `source` (errors name the file and what was expected) and keeps what a preview shows:
// at most `maxSamples` samples and, for tables, `maxFeatures` features of each.
Result<DataPreview> previewData(const SourceConfig& source, int maxSamples = 48,
                                int maxFeatures = 12);

// The pipeline `data` and `batchSize` build, stage by stage in tf.data order, e.g.
// "fashion_mnist → cache (memory) → shuffle (buffer 60000, each epoch) → batch 32 →
// map scale ×0.00392157 (AUTOTUNE workers) → prefetch (AUTOTUNE)".
std::string describePipeline(const DataConfig& data, int64_t batchSize);

// The folder the built-in Fashion-MNIST source reads ($TRAINDECK_FASHION_MNIST_DIR or
// /usr/share/datasets/fashion-mnist, from the Debian package dataset-fashion-mnist).
std::string fashionMnistDirectory();

}  // namespace td::api

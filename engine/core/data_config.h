// Configuration of a data source and its input pipeline (tf.data semantics).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "engine/core/tensor.h"

namespace td {

// What a NaN or infinite value in a file source's features or labels does.
enum class NonFinitePolicy {
    Error,     // refuse the data, naming the file, the row (sample) and the column (feature)
    DropRows,  // leave every sample holding one out
};

// A folder of images, one sub-folder per class: Keras' image_dataset_from_directory, its
// arguments and their defaults (engine/data/image_folder.h).
struct ImageDirectoryConfig {
    std::string directory;      // absolute once loaded from a project
    std::string testDirectory;  // optional: the test split, read the same way
    // "inferred": the class of a file is its sub-folder; otherwise one class id per image file
    // of `directory` (all its files, recursively, in sorted path order).
    bool labelsInferred = true;
    std::vector<int64_t> labels;
    std::string labelMode = "int";        // "int", "categorical" (one-hot), "binary" (0/1)
    std::vector<std::string> classNames;  // sub-folders to use, in this order (empty: all, sorted)
    std::string colorMode = "rgb";        // "grayscale", "rgb", "rgba"
    int64_t height = 256, width = 256;    // image_size
    std::string interpolation = "bilinear";  // "bilinear", "nearest"
    bool cropToAspectRatio = false;
    bool padToAspectRatio = false;
    bool followLinks = false;
    bool shuffle = true;           // the file order as Keras shuffles it with `seed`
    std::optional<uint32_t> seed;  // needed with validation_split (as in Keras)
    double validationSplit = 0.0;  // Keras' validation subset: the last int(split * n) files
    // A file that does not decode is left out (counted and named in the run's log), not an error.
    bool skipBadFiles = false;

    bool operator==(const ImageDirectoryConfig&) const = default;
};

// TFRecord shards of tf.train.Example (engine/data/tfrecord_source.h): which feature holds the
// sample and how it is decoded, which holds the label, and how the shards are read (tf.data's
// interleave, the shard list shuffled each epoch).
struct TfRecordConfig {
    std::vector<std::string> files;      // glob patterns, absolute once loaded from a project
    std::vector<std::string> testFiles;  // optional: the test split
    std::string compression;             // "" (none) or "GZIP"
    std::string xFeature = "image";
    std::string xDecode = "image";   // "image" (encoded JPEG/PNG/BMP/GIF), "raw" (bytes), "float"
    std::string rawDtype = "uint8";  // raw: "uint8" or "float32" (little-endian)
    Shape xShape;                    // raw and float: the sample's shape
    // decode "image": color_mode, image_size, interpolation, crop_to_aspect_ratio and
    // pad_to_aspect_ratio as image_directory reads them (the other fields are unused).
    ImageDirectoryConfig image;
    std::string yFeature = "label";
    std::string yDecode = "int64";  // "int64": class ids; "float": targets of yWidth values
    int64_t yWidth = 1;
    int64_t cycleLength = 0;   // shards read at once; 0: all of them, at most 16
    int64_t blockLength = 1;   // records taken from a shard before the next
    bool shuffleFiles = true;  // the shard list shuffled each epoch (when training shuffles)
    // A record that does not read (a CRC mismatch, a feature missing or of the wrong size, an
    // image that does not decode), the unreadable rest of a shard after a framing error, or a
    // shard that does not open is left out (counted and named in the run's log), not an error.
    bool skipBadFiles = false;

    bool operator==(const TfRecordConfig&) const = default;
};

struct SourceConfig {
    // "fashion_mnist" (built-in), "idx", "csv", "npy", "synthetic", "image_directory", "tfrecord"
    std::string type = "fashion_mnist";
    ImageDirectoryConfig images;  // image_directory
    TfRecordConfig records;       // tfrecord
    // idx: images/labels files (gzip or raw); npy: x/y arrays; csv: trainPath/testPath.
    std::string trainImages, trainLabels, testImages, testLabels;
    std::string trainPath, testPath;                     // csv
    std::string labelColumn = "label";                   // csv
    NonFinitePolicy nonFinite = NonFinitePolicy::Error;  // csv, idx, npy
    // synthetic: a deterministic classification problem
    int64_t samples = 2048;
    int64_t testSamples = 512;
    Shape sampleShape{16};
    int64_t classes = 4;
    uint64_t seed = 1;
};

// One element-wise map step, applied in order. A "cache" step marks the cache's place among them:
// the steps before it are applied once, when the cache is filled; without one, the cache holds the
// source elements and every step runs on every epoch. A "decode" step marks where an
// image_directory or tfrecord source's files or records are decoded (without one: first, before
// every other step); only a "cache" step may come before it, and then the cache keeps the encoded
// bytes (file contents, records) and every epoch decodes them on the map workers.
struct MapStep {
    std::string op;  // "scale" (x*factor), "normalize" ((x-mean)/std), "cast" (to f32),
                     // "one_hot" (labels -> depth), "cache" (the cache's place), "decode" (the
                     // decode's place)
    double factor = 1.0;
    double mean = 0.0, stddev = 1.0;
    int64_t depth = 0;
};

constexpr int64_t kAutotune = -1;

struct PipelineConfig {
    std::vector<MapStep> map;             // e.g. {{"scale", 1/255}}
    std::string cache = "memory";         // "none", "memory", or "file:<path>" (kept across runs)
    int64_t shuffleBuffer = 0;            // 0 = no shuffle
    std::optional<uint64_t> shuffleSeed;  // unset: derived from the training seed
    bool reshuffleEachIteration = true;
    bool dropRemainder = false;
    int64_t prefetch = kAutotune;       // 0 = off, N, or kAutotune
    int64_t parallelCalls = kAutotune;  // 1 = sequential, N, or kAutotune
};

// True when the pipeline caches (cache "memory" or "file:") and its "cache" step comes before a
// "decode" step: the cache keeps encoded elements, so the source must stream (not be decoded at
// load).
inline bool cachesEncoded(const PipelineConfig& p) {
    if (p.cache == "none") return false;
    for (const MapStep& s : p.map) {
        if (s.op == "decode") return false;
        if (s.op == "cache") {
            for (const MapStep& t : p.map)
                if (t.op == "decode") return true;
            return false;
        }
    }
    return false;
}

struct DataConfig {
    SourceConfig source;
    PipelineConfig pipeline;
    double validationSplit = 0.0;  // last fraction of the training data, taken before shuffling
    // "none", or "test": validate on the source's test split after every epoch (Keras'
    // validation_data=(x_test, y_test)). Exclusive with validationSplit.
    std::string validationData = "none";
};

}  // namespace td

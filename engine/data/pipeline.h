// Data sources and the input pipeline, with tf.data semantics (see shared REFERENCE.md):
// cache -> shuffle -> batch -> map (parallel, order kept) -> prefetch. Images stay u8 until a
// batch is formed; the map steps then produce f32 features.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "engine/core/result.h"
#include "engine/core/tensor.h"
#include "engine/data/data_config.h"

namespace td {

// An in-memory dataset: x is u8 or f32 with shape [N, ...]; y is i32 [N] (class ids) or
// f32 [N, k] (targets).
struct Dataset {
    Tensor x;
    Tensor y;
    int64_t numClasses = 0;  // 0 when the labels are not class ids
    std::vector<std::string> classNames;
    int64_t size() const { return x.empty() ? 0 : x.dim(0); }
    Shape sampleShape() const;  // x's shape without the leading N
};

struct DataSplits {
    Dataset train;
    std::optional<Dataset> test;
};

// Loads a source. Errors name the file and what was expected (magic, sizes, header...). The
// built-in "fashion_mnist" reads /usr/share/datasets/fashion-mnist and, when that is missing, says
// to install the Debian package dataset-fashion-mnist.
Result<DataSplits> loadSource(const SourceConfig& cfg);

// Individual loaders (also used by tests).
// IDX, gzip or raw: u8 -> u8; i8/i16/i32 -> i32; f32/f64 -> f32.
Result<Tensor> readIdx(const std::string& path);
// NPY v1-v3, C order: <f4/<f8 -> f32; <i4/<i8 -> i32; |u1 -> u8.
Result<Tensor> readNpy(const std::string& path);
struct CsvData {
    Tensor x;
    Tensor y;
    std::vector<std::string> featureNames;
    int64_t droppedRows = 0;  // rows left out for a NaN or infinite value (DropRows)
};
Result<CsvData> readCsv(const std::string& path, const std::string& labelColumn,
                        NonFinitePolicy nonFinite = NonFinitePolicy::Error);
Dataset makeSynthetic(int64_t samples, const Shape& sampleShape, int64_t classes, uint64_t seed);

// Splits off the last `fraction` of samples (before any shuffling), as Keras' validation_split.
std::pair<Dataset, Dataset> splitTail(const Dataset& d, double fraction);

// A batch handed to the trainer. x is f32 [B, ...] after the map steps; y is i32 [B] or
// f32 [B, k]. Batches come from a pool owned by the pipeline: a Batch stays valid until the next
// call to next() after it (so at most one batch is held by the consumer at a time).
struct Batch {
    Tensor x;
    Tensor y;
    int64_t size = 0;        // rows in this batch (== batch size except a remainder)
    int64_t firstIndex = 0;  // position in the epoch of the first row (for keyed randomness)
};

struct PipelineStats {
    int64_t prefetchDepth = 0;           // current buffer size (tuned when AUTOTUNE)
    int64_t parallelCalls = 0;           // current map workers (tuned when AUTOTUNE)
    double producerSecondsPerBatch = 0;  // one worker's time to form a batch (moving average)
    bool readingCacheFile = false;       // cache "file:": epochs now read the completed file
};

class Pipeline {
  public:
    // `shuffle` false ignores shuffleBuffer (evaluation); `seed` keys the shuffle order when the
    // config has no shuffleSeed.
    static Result<std::unique_ptr<Pipeline>> create(const Dataset& data, const PipelineConfig& cfg,
                                                    int64_t batchSize, bool shuffle, uint64_t seed);
    virtual ~Pipeline() = default;

    // Starts epoch `epoch` (0-based): resets the iterator, reshuffles when configured, starts the
    // prefetch producer.
    virtual Status beginEpoch(int epoch) = 0;
    // The next batch of the epoch, or nullptr at its end. Errors (e.g. a cache file that cannot be
    // written) are returned, never thrown.
    virtual Result<const Batch*> next() = 0;
    virtual int64_t batchesPerEpoch() const = 0;
    virtual Shape featureShape() const = 0;  // per-sample shape of x after the map steps
    virtual PipelineStats stats() const = 0;
};

}  // namespace td

// Data sources and the input pipeline, with tf.data semantics (see shared REFERENCE.md):
// [map steps before the cache] -> cache -> shuffle -> batch -> map (parallel, order kept) ->
// prefetch. Without a {"op": "cache"} step the cache holds the source elements, and images stay u8
// until a batch is formed; the map steps then produce f32 features.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "engine/core/data_config.h"
#include "engine/core/result.h"
#include "engine/core/tensor.h"

namespace td {

// The features of a source that are read, and decoded, when a batch needs them (tf.data's element
// of a file reference): image files, TFRecord records. The pipeline's map workers call read(), so
// decoding runs in the parallel map stage, and only what the pipeline holds is in memory.
class ElementReader {
  public:
    virtual ~ElementReader() = default;
    virtual int64_t size() const = 0;
    virtual Shape sampleShape() const = 0;  // of one sample
    virtual DType dtype() const = 0;        // U8 or F32
    // Sample i, decoded, into dst (numElements(sampleShape()) values of dtype()). Called from
    // several threads at once. Errors name the file (and the record's offset).
    virtual Status read(int64_t i, void* dst) const = 0;
    // What the samples are made of (each file's path, size and modification time, the decoding
    // options): a file cache filled from this reader is trusted again only when it is the same.
    virtual std::string identity() const = 0;
    // The order in which a shuffled epoch's elements come from the source, before the shuffle
    // buffer: empty for 0, 1, ..., n - 1. TFRecord shards shuffle their file list each epoch.
    virtual std::vector<int32_t> epochOrder(uint64_t /*seed*/) const { return {}; }

    // Encoded elements, for a cache placed before the decode ({"op": "cache"}, {"op": "decode"}):
    // the bytes sample i is decoded from (an image file's contents, a TFRecord record) and their
    // decode, so that read(i) is decode(i, readEncoded(i)). Readers without them say false.
    virtual bool hasEncoded() const { return false; }
    // Every sample's encoded size, known before reading it (file sizes, record lengths): what a
    // cache of encoded elements will hold. Errors name the file.
    virtual Result<std::vector<int64_t>> encodedSizes() const;
    // Sample i's encoded bytes into `out` (resized). Called from several threads at once.
    virtual Status readEncoded(int64_t i, std::vector<uint8_t>& out) const;
    // Sample i decoded from its encoded bytes into dst, as read() decodes it.
    virtual Status decode(int64_t i, const uint8_t* bytes, size_t size, void* dst) const;
    // Sample i's file (and record), for errors.
    virtual std::string elementName(int64_t i) const { return "sample " + std::to_string(i); }
};

// A dataset: x is u8 or f32 with shape [N, ...] in memory, or, streamed, empty with `reader`
// giving the samples; y is i32 [N] (class ids) or f32 [N, k] (targets), always in memory.
struct Dataset {
    Tensor x;
    Tensor y;
    std::shared_ptr<const ElementReader> reader;  // streamed features (x empty)
    // A decoded source whose epochs still read in an order of their own (ElementReader::
    // epochOrder of the reader it was decoded from); unset: the reader's, if any.
    std::function<std::vector<int32_t>(uint64_t)> epochOrder;
    int64_t numClasses = 0;  // 0 when the labels are not class ids
    std::vector<std::string> classNames;
    int64_t size() const;
    Shape sampleShape() const;  // x's shape without the leading N
    DType xType() const;
    int64_t sampleValues() const { return numElements(sampleShape()); }
    bool streamed() const { return reader != nullptr; }
};

// A streamed dataset's samples decoded into memory (`threads` 0: every schedulable core), after a
// check that they fit the memory budget (`where` names the source in that error). A sample that
// does not read is an error, or, with `skipBad`, left out with its label (`skipped` counts them,
// `skippedErrors` holds the first kNamedSkips errors, in sample order). The samples kept keep
// their order, and a shuffled epoch's order is the reader's with the left-out samples taken out
// where they were. An in-memory dataset is returned as it is.
constexpr size_t kNamedSkips = 5;
struct Materialized {
    Dataset data;
    int64_t skipped = 0;
    std::vector<std::string> skippedErrors;
};
Result<Materialized> materialize(const Dataset& d, const std::string& where, bool skipBad = false,
                                 int64_t threads = 0);
// A streamed dataset without the samples that do not read: every sample is read (decoded) once, in
// parallel, into nothing; those that fail are left out as materialize(d, where, true) leaves them
// out (the same samples kept, in the same order, the same epoch orders), and the rest stay
// streamed. An in-memory dataset is returned as it is.
Result<Materialized> dropUnreadable(const Dataset& d, const std::string& where,
                                    int64_t threads = 0);
// The line for the run's log about `m`'s left-out samples: "<field>: left out 3 training
// images that do not decode (of 120): <first errors>; ...". `what` names one ("training
// image").
std::string skippedNote(const std::string& field, const Materialized& m, int64_t of,
                        const std::string& what);
// Samples [first, first + count) of a streamed dataset's reader.
std::shared_ptr<const ElementReader> sliceReader(std::shared_ptr<const ElementReader> base,
                                                 int64_t first, int64_t count);
// The samples `kept` (increasing indices) of a reader, renumbered 0, 1, ...; its epoch orders are
// the base's with the other samples taken out.
std::shared_ptr<const ElementReader> subsetReader(std::shared_ptr<const ElementReader> base,
                                                  std::vector<int64_t> kept);

struct DataSplits {
    Dataset train;
    std::optional<Dataset> test;
    // Lines for the run's log about how the data was read (e.g. a decoded-source cache entry that
    // could not be written); never errors.
    std::vector<std::string> notes;
    // The source's own validation subset (an image_directory with validation_split), used for
    // validation instead of data.validation_split.
    std::optional<Dataset> validation;
};

// Loads a source. Errors name the file and what was expected (magic, sizes, header...). The
// built-in "fashion_mnist" reads /usr/share/datasets/fashion-mnist and, when that is missing, says
// to install the Debian package dataset-fashion-mnist. gzip-compressed IDX files (fashion_mnist,
// "idx") are decoded once and then read from the decoded-source cache (decode_cache.h).
// With `stream`, image_directory and tfrecord sources give streamed datasets (Dataset::reader),
// decoded batch by batch in the pipeline; without, their samples are decoded here.
Result<DataSplits> loadSource(const SourceConfig& cfg, bool stream = false);
// The folder the built-in "fashion_mnist" source reads: $TRAINDECK_FASHION_MNIST_DIR when set,
// else /usr/share/datasets/fashion-mnist.
std::string fashionMnistDir();

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

// AUTOTUNE forms an epoch's batches inline when a batch took at most this long to form and the
// consumer's step holds every core (PipelineOptions::consumerThreads). Measured on a 2-core
// machine (Fashion-MNIST MLP, Adam, batch 32, a batch formed in 7-10 us), alternating pairs of
// epoch-2 steps: formed in next() 99-109 us against 103-140 with a worker (7 pairs, 6 faster);
// this AUTOTUNE against one worker, 95-101 us against 97-111 (8 pairs: 2 were 10% faster, none
// more than 1 us slower). At batch 256 (50-56 us a batch) the worker was faster (535 against 548
// us a step, medians of 3), the CNN at batch 64 (21 us) even.
constexpr double kInlineMaxBatchSeconds = 20e-6;
// With PipelineOptions::formsAside, AUTOTUNE also forms inline an epoch whose batches took at most
// this share of the consumer's own time per batch. Measured on the 2-core AVX2 machine, epochs
// 2-3 of `traindeck train` (seed MLP, the helper forming the next batch during the step) with a
// worker against inline, alternating: batch 128 (a batch in 46-49 us inline) 371-379 against
// 360-364 us a step, batch 256 (41-43 us on a worker) 668-685 against 644-677, batch 512
// 1403-1460 against 1336-1369, the 784-1024-1024-10 MLP at batch 256 (87-108 us) 16.4 against
// 16.0 ms; the CNN at batch 64 (26-45 us, 11 ms a step) even.
constexpr double kInlineAsideShare = 0.25;

struct PipelineStats {
    // Threads. AUTOTUNE sets parallelCalls so that the map keeps up with the consumer's rate,
    // within maxParallelCalls (the CPU budget), and prefetchDepth from how often the consumer
    // waits (from 8, or the cap when lower, upwards); both are retuned every few batches.
    int64_t prefetchDepth = 0;           // current buffer size (tuned when AUTOTUNE)
    int64_t parallelCalls = 0;           // current map workers (tuned when AUTOTUNE)
    int64_t maxParallelCalls = 0;        // worker threads started: the CPU budget under AUTOTUNE
    double producerSecondsPerBatch = 0;  // one worker's time to form a batch (moving average)
    double readSecondsPerBatch = 0;      // of it, reading (decoding) a streamed source's samples
    double consumerSecondsPerBatch = 0;  // consumer's time between next() calls, waits excluded
    int64_t consumerWaits = 0;           // batches of the current epoch the consumer waited for
    int64_t consumerWakeups = 0;         // times the consumer signalled the workers this epoch
    // Cache. Elements of the current (or last) epoch read from the source and from the cache.
    int64_t epochSourceElements = 0;
    int64_t epochCacheElements = 0;
    bool cacheComplete = false;     // a full pass filled the cache; epochs now read it
    bool readingCacheFile = false;  // cache "file:": epochs now read the completed file
    // AUTOTUNE: this epoch forms its batches in next(), on the consumer's thread, because the
    // consumer's step holds every core and a batch forms quickly (PipelineOptions).
    bool formingInline = false;
};

// One line for logs: workers, prefetch and where the epoch's elements came from.
std::string describePipeline(const PipelineStats& s);

// An epoch is input-bound when the step loop spent at least this share of its time waiting for
// batches (TensorFlow's input-pipeline analyzer calls such a step "highly input-bound")
constexpr double kInputBoundShare = 0.2;
// ... and waited at least this long in all, for at least a tenth of its batches (the pipeline's
// start alone is not a bound).
constexpr double kInputBoundMinSeconds = 0.05;
// The change that would help an input-bound epoch most, in project fields: a cache (`cacheBytes`:
// what a memory cache of the data would hold), more map workers, prefetch, or lighter work.
std::string inputBoundAdvice(const PipelineStats& s, const PipelineConfig& cfg, double cacheBytes);
// Fault injection for the tests, as TRAINDECK_FAULT_WORKER and TRAINDECK_FAULT_DECODE_CACHE_BYTES
// (not a setting): every batch takes this many microseconds longer to form, a slow pipeline on
// demand for the input-bound report's test.
constexpr const char* kSlowBatchFaultEnv = "TRAINDECK_FAULT_SLOW_BATCH_US";

// Knobs that are not part of a project.
struct PipelineOptions {
    int64_t cpuBudget = 0;  // cores AUTOTUNE may use for map workers; 0: the schedulable cores
    // Cores the consumer's own step keeps busy (a CPU device's compute threads); 0: not known.
    // With AUTOTUNE for both prefetch and parallel_calls, when these are all the schedulable
    // cores, an epoch whose batches formed in under kInlineMaxBatchSeconds each (as last
    // measured) forms them inline in next() instead of on workers: a worker could then only run
    // by taking a core from the step.
    int64_t consumerThreads = 0;
    // The consumer forms an inline epoch's batches on a thread of its step that would otherwise
    // wait (the trainer, through HostThreads::startAside), not on its step's critical path: the
    // limit on a batch's forming time is then also kInlineAsideShare of the consumer's own time per
    // batch.
    bool formsAside = false;
    // Called once per element as a batch is formed, on the forming thread, with the element's
    // source index: lets tests make the map stage slow.
    std::function<void(int64_t)> elementHook;
};

class Pipeline {
  public:
    // `shuffle` false ignores shuffleBuffer (evaluation); `seed` keys the shuffle order when the
    // config has no shuffleSeed.
    // A "file:" cache that already holds these elements (same source data, same map steps before
    // the cache) is read from the first epoch on; one that does not match is rebuilt, and
    // messages() says why.
    static Result<std::unique_ptr<Pipeline>> create(const Dataset& data, const PipelineConfig& cfg,
                                                    int64_t batchSize, bool shuffle, uint64_t seed,
                                                    const PipelineOptions& options = {});
    virtual ~Pipeline() = default;

    // Starts epoch `epoch` (0-based): resets the iterator, reshuffles when configured, starts the
    // prefetch producer.
    virtual Status beginEpoch(int epoch) = 0;
    // The next batch of the epoch, or nullptr at its end. The call that hands out an epoch's last
    // batch completes a cache being filled (the consumer need not ask for the end). Errors (e.g. a
    // cache file that cannot be renamed) are returned, never thrown. When batches are formed in
    // next() (prefetch 0, or stats().formingInline), they rotate through three slots of the
    // pool: a batch then stays valid until the second call after it, so a consumer may form the
    // next batch, on another thread, while it still reads this one (calls never overlap).
    virtual Result<const Batch*> next() = 0;
    virtual int64_t batchesPerEpoch() const = 0;
    virtual Shape featureShape() const = 0;  // per-sample shape of x after the map steps
    virtual PipelineStats stats() const = 0;
    // Notes for the run's log (e.g. a cache file rebuilt, and why), oldest first.
    virtual std::vector<std::string> messages() const = 0;
};

}  // namespace td

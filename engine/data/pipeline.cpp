// The input pipeline: [map steps before the cache] -> cache -> shuffle -> batch -> map -> prefetch,
// with tf.data semantics.
//
// Map steps. cast/scale/normalize fold into affine maps and one_hot expands the labels. A
// {"op": "cache"} step splits them: the steps before it ("pre") produce the cached elements, the
// steps after it ("post") run on every epoch. Without one, every step is "post". Values are the
// same whichever way an element is formed: from the source, pre then post; from the cache, post.
//
// Cache. "none" reads the source every epoch. "memory" and "file:" fill the cache, in source
// order, while the first pass runs (batch b fills the source rows [b*N/nb, (b+1)*N/nb), so a pass
// fills every row, also those a drop_remainder never batches) and commit it when the pass hands
// out its last batch: a partial pass is never committed and the next epoch fills again. Committed,
// the cache is what every later epoch reads (shuffled anew). A memory cache of unmapped elements is
// the in-memory source itself. A file cache is keyed by its path: one that holds the same elements
// (header fingerprint of the source data and the pre steps, hash of the rows) is read from the
// first epoch of a later run; anything else is rebuilt. A cache before the decode ({"op": "cache"},
// {"op": "decode"}) of a streamed source keeps its encoded elements (ElementReader::readEncoded:
// file contents, records) in a region of their own sizes after a table of offsets, planned from
// ElementReader::encodedSizes() when the pipeline is created; a fill pass copies each element read
// there, and every epoch decodes the elements (from the source in the fill pass, then from the
// cache) on the map workers, into the same rows as a decoded cache would give.
//
// Threads. The consumer (the trainer) calls beginEpoch/next from one thread; stats() may be called
// from any thread. With prefetch 0 everything runs inline in next() (parallelCalls is then 1).
// Otherwise beginEpoch starts `maxWorkers_` threads, of which at most `parallelism_` form batches
// at a time; they claim batch numbers in epoch order, form each batch (gather + map) into a free
// pool slot and mark it ready; next() hands the slots out in batch order, so the output does not
// depend on the thread count (deterministic=True).
//
// Flow control. Workers may run at most `prefetchDepth + parallelism` batches (the window) ahead
// of the consumer. The pool holds prefetchCap + maxWorkers + 2 slots (one held by the consumer, one
// spare), so a claim always finds a free slot.
//
// Wake-ups. A worker sleeps only when the window is full, and keeps forming batches while it has
// room. The consumer wakes one once the window has room for half of it (at least one batch), not
// at every batch it takes: a wake-up costs the consumer a futex call and, on a virtual machine, an
// inter-processor interrupt (about 5% of the step loop of a small model, batch 32, when it came
// with every batch), and a woken worker then forms several batches in a row. A consumer about to
// wait for batch b finds b unclaimed only when the claimed window is empty, i.e. all of it is room,
// so the call that took b - 1 woke a worker: nobody waits for a batch no one will form.
//
// Forming inline. Under AUTOTUNE for both prefetch and parallel_calls, a consumer whose step keeps
// every schedulable core busy (PipelineOptions::consumerThreads) leaves a worker no core of its
// own: it runs by preempting one of the step's threads, which then holds up the others, and every
// burst costs wake-ups and switches. When the last epoch formed a batch in at most
// kInlineMaxBatchSeconds, beginEpoch starts no workers and next() forms each batch itself, as with
// prefetch 0. A consumer that forms those batches on a thread of its step that would otherwise wait
// (PipelineOptions::formsAside) pays for a batch only where that thread has no idle moment, so
// the limit is then also a share of the consumer's own time per batch (kInlineAsideShare), as
// last measured: a batch of 256 Fashion-MNIST images takes 40-60 us to form, over
// kInlineMaxBatchSeconds but 6-9% of a step. The first epoch always runs on workers (nothing is
// measured yet), and an epoch whose batches got slower to form goes back to them. The batches
// are the same either way.
//
// AUTOTUNE. Every kTunePeriodBatches consumed batches, from what that period measured: the
// parallelism becomes the number of workers whose combined rate (each forms a batch in P seconds)
// meets the consumer's demand (one batch per C seconds of its own work, waits excluded), with
// kParallelHeadroom to spare, within the CPU budget (schedulable cores, at most
// kAutotuneMaxWorkers); it grows at once and shrinks at most by half per period. The prefetch
// depth starts at kAutotunePrefetchMin, grows by one when the consumer had to wait in the period
// and shrinks by one when the buffer never dropped below its depth (the consumer never needed it),
// within [min(kAutotunePrefetchMin, cap), cap], the cap coming from kPrefetchRamBudgetBytes. The
// floor keeps the window wide enough for wake-ups in bursts; it costs no memory, as the pool is
// sized for the cap.
//
// Memory. Every tensor (pool slots, shuffle order, memory cache) and the cache file's storage are
// allocated by create(); beginEpoch() starts threads; next() allocates nothing.
#include <sched.h>

#include <unistd.h>
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <mutex>
#include <sstream>
#include <system_error>
#include <thread>

#include "engine/data/cache_file.h"
#include "engine/data/convert_kernels.h"
#include "engine/data/pipeline.h"
#include "engine/data/random.h"
#include "engine/data/resource_plan.h"

namespace td {
namespace {

using Clock = std::chrono::steady_clock;

constexpr int64_t kAutotunePrefetchMin = 8;  // and the start
constexpr int64_t kAutotunePrefetchCap = 16;
constexpr int64_t kAutotuneMaxWorkers = 8;  // the gather is memory-bound beyond a few cores
constexpr int64_t kPrefetchRamBudgetBytes = int64_t{256} << 20;
constexpr int64_t kTunePeriodBatches = 8;
// Batches formed in next() rotate through this many slots of the pool (the contract of next():
// a batch stays valid until the second call after it), not all of them: a slot written again
// three batches later is still in the caches, where one of the pool's dozen slots is not. Seed
// MLP at batch 256 (800 KB a batch), epochs 2-3 of `traindeck train`, three alternating runs on
// the 2-core AVX2 machine: a batch formed in 52-59 us against 75-83 through the whole pool, the
// step 648-670 us against 655-679. At batch 32 even.
constexpr size_t kInlineSlots = 3;
constexpr double kParallelHeadroom = 1.25;  // absorbs jitter in the measured rates

int64_t schedulableCores() {
    cpu_set_t set;
    CPU_ZERO(&set);
    if (sched_getaffinity(0, sizeof set, &set) == 0) return std::max(1, CPU_COUNT(&set));
    return std::max(1u, std::thread::hardware_concurrency());
}

double secondsBetween(Clock::time_point a, Clock::time_point b) {
    return std::chrono::duration<double>(b - a).count();
}

// x' = x * scale + shift: the composition of "cast", "scale" and "normalize" steps.
struct AffineMap {
    double scale = 1.0, shift = 0.0;
    bool identity() const { return scale == 1.0 && shift == 0.0; }
};

// One row: dst[k] = src[k] * a + b with the kernels of this CPU's level (convert_kernels.h).
void convertRow(const data_kernels::Table& k, const uint8_t* src, DType type, float* dst, int64_t n,
                const AffineMap& m) {
    const auto a = static_cast<float>(m.scale), b = static_cast<float>(m.shift);
    if (type == DType::U8) {
        k.affineU8(src, dst, n, a, b);
    } else {
        k.affineF32(reinterpret_cast<const float*>(src), dst, n, a, b);
    }
}

// Software prefetch of a source row a few rows ahead of the gather: shuffled rows are random
// accesses the hardware prefetcher cannot predict (about 2x on Fashion-MNIST).
constexpr int64_t kPrefetchRowsAhead = 2;
inline void prefetchRow(const uint8_t* row, int64_t bytes) {
    for (int64_t o = 0; o < std::min<int64_t>(bytes, 4096); o += 64) __builtin_prefetch(row + o);
}

// tf.data shuffle buffer over indices: fill a buffer with the first `buffer` inputs; each output
// is drawn uniformly from the buffer and its place is taken by the next input (once the input is
// exhausted, by the buffer's last element). buffer >= n is a uniform permutation; buffer 1 is the
// identity. `scratch` holds min(buffer, n) entries.
void shuffleOrder(int64_t n, int64_t buffer, uint64_t seed, int32_t* order, int32_t* scratch) {
    const int64_t size = std::min(buffer, n);
    for (int64_t i = 0; i < size; ++i) scratch[i] = static_cast<int32_t>(i);
    int64_t count = size, nextInput = size;
    Rng rng(seed);
    for (int64_t p = 0; p < n; ++p) {
        const auto j = static_cast<int64_t>(rng.uniform(static_cast<uint64_t>(count)));
        order[p] = scratch[j];
        if (nextInput < n) {
            scratch[j] = static_cast<int32_t>(nextInput++);
        } else {
            scratch[j] = scratch[--count];
        }
    }
}

// Where a batch's rows are read from: the source, or the cache.
struct ElementView {
    const uint8_t* x = nullptr;
    DType xType = DType::U8;
    int64_t xRowBytes = 0;
    const uint8_t* y = nullptr;
    DType yType = DType::I32;
    int64_t yRowElems = 0;
};

enum class CacheKind { None, Memory, File };

// The map steps (split at the cache) and the shapes they produce, as read from the config.
struct MapPlan {
    AffineMap pre, post;
    bool preConverts = false;  // a cast/scale/normalize before the cache: cached x is f32
    int64_t preOneHot = 0, postOneHot = 0;
    std::string preText;  // the pre steps, for the cache fingerprint
    // A "decode" step after the "cache" step: the cache keeps the encoded elements.
    bool cacheBeforeDecode = false;
};

Result<MapPlan> planMap(const std::vector<MapStep>& steps, const Dataset& data) {
    MapPlan plan;
    bool afterCache = false;
    bool hasCacheStep =
        std::any_of(steps.begin(), steps.end(), [](const MapStep& s) { return s.op == "cache"; });
    // Without a cache step every map step runs after the cache.
    if (!hasCacheStep) afterCache = true;
    const int64_t n = data.size();
    bool decodeSeen = false, otherSeen = false;
    for (const MapStep& step : steps) {
        AffineMap& m = afterCache ? plan.post : plan.pre;
        std::ostringstream text;
        text.precision(17);
        text << step.op;
        if (step.op == "cache") {
            if (afterCache && hasCacheStep) return err("map step 'cache' appears twice");
            afterCache = true;
            continue;
        }
        // The decode's place: only a cache may come before it (other steps would act on encoded
        // bytes). Without a streamed source, or after no cache, it marks nothing more than
        // decoding first.
        if (step.op == "decode") {
            if (decodeSeen) return err("map step 'decode' appears twice");
            if (otherSeen)
                return err(
                    "map step 'decode' must come before every step but 'cache' (those "
                    "would act on encoded bytes)");
            decodeSeen = true;
            plan.cacheBeforeDecode = hasCacheStep && afterCache;
            continue;
        }
        otherSeen = true;
        if (step.op == "cast") {
        } else if (step.op == "scale") {
            if (!std::isfinite(step.factor)) return err("map 'scale': factor must be finite");
            m.scale *= step.factor;
            m.shift *= step.factor;
            text << ' ' << step.factor;
        } else if (step.op == "normalize") {
            if (!std::isfinite(step.mean) || !std::isfinite(step.stddev) || step.stddev == 0) {
                return err("map 'normalize': mean must be finite and stddev finite and non-zero");
            }
            m.scale /= step.stddev;
            m.shift = (m.shift - step.mean) / step.stddev;
            text << ' ' << step.mean << ' ' << step.stddev;
        } else if (step.op == "one_hot") {
            if (plan.preOneHot != 0 || plan.postOneHot != 0) {
                return err("map 'one_hot' appears twice");
            }
            if (data.y.dtype() != DType::I32 || data.y.size() != n) {
                return err("map 'one_hot' needs class-id labels (i32 [N]), found " +
                           std::string(dtypeName(data.y.dtype())) + " " +
                           shapeToString(data.y.shape()));
            }
            const int32_t* y = data.y.data<int32_t>();
            const int32_t maxLabel = *std::max_element(y, y + n);
            const int32_t minLabel = *std::min_element(y, y + n);
            if (minLabel < 0) return err("map 'one_hot': labels must be >= 0");
            if (step.depth <= maxLabel) {
                return err("map 'one_hot': depth " + std::to_string(step.depth) +
                           " must exceed the largest label " + std::to_string(maxLabel));
            }
            (afterCache ? plan.postOneHot : plan.preOneHot) = step.depth;
            text << ' ' << step.depth;
        } else {
            return err("unknown map step '" + step.op +
                       "' (valid steps: cast, scale, normalize, one_hot, cache, decode)");
        }
        if (!afterCache) {
            if (step.op != "one_hot") plan.preConverts = true;
            plan.preText += text.str() + ";";
        }
    }
    return plan;
}

class PipelineImpl final : public Pipeline {
  public:
    ~PipelineImpl() override { stopWorkers(); }

    static Result<std::unique_ptr<Pipeline>> make(const Dataset& data, const PipelineConfig& cfg,
                                                  int64_t batchSize, bool shuffle, uint64_t seed,
                                                  const PipelineOptions& options);

    Status beginEpoch(int epoch) override;
    Result<const Batch*> next() override;
    int64_t batchesPerEpoch() const override { return numBatches_; }
    Shape featureShape() const override { return data_.sampleShape(); }
    PipelineStats stats() const override;
    std::vector<std::string> messages() const override { return messages_; }

  private:
    struct Slot {
        Batch batch;
        Tensor fullX, fullY;             // [B, ...]
        Tensor remX, remY;               // views of the first `remainder` rows (empty when none)
        std::vector<float> preRow;       // one element after the pre steps (source read, pre != id)
        std::vector<uint8_t> sourceRow;  // one element read from a streamed source
        std::vector<uint8_t> encoded;    // one encoded element read (a cache before the decode)
    };

    Status setUpCache(const PipelineConfig& cfg);
    Status produce(int64_t b, Slot& slot);
    Status readElement(int64_t i, Slot& slot);
    void fillRow(int64_t i, const uint8_t* src);
    void fillRowY(int64_t i);
    Status commitCache();
    void workerLoop();
    void stopWorkers();
    void finishEpoch();
    void retune();                        // under mu_
    void recordProduced(double seconds);  // under mu_

    // Immutable after create().
    Dataset data_;
    const ElementReader* reader_ = nullptr;  // a streamed source (data_.reader)
    PipelineOptions options_;
    const data_kernels::Table& kernels_ = data_kernels::activeKernels();
    int64_t n_ = 0, batchSize_ = 0, numBatches_ = 0, remainder_ = 0;
    int64_t xRowElems_ = 0, yRowElems_ = 0;  // per sample, in the source
    MapPlan plan_;
    int64_t oneHotDepth_ = 0;  // of the output labels; 0: labels pass through
    bool shuffle_ = false, reshuffle_ = true;
    int64_t shuffleBuffer_ = 0;
    uint64_t shuffleSeed_ = 0;
    CacheKind cacheKind_ = CacheKind::None;
    std::string cachePath_;  // for "file:<path>"
    CacheLayout cacheLayout_;
    uint64_t fingerprint_ = 0;
    ElementView sourceView_, cacheView_;
    uint8_t* cacheFillX_ =
        nullptr;  // where a fill pass writes x rows; null: the source is the cache
    uint8_t* cacheFillY_ = nullptr;
    Tensor memoryCacheX_, memoryCacheY_;
    std::unique_ptr<CacheFileWriter> cacheWriter_;    // a cache file being filled (or committed)
    std::unique_ptr<CacheFileMapping> cacheMapping_;  // a committed file of an earlier run
    // A cache before the decode: it keeps the streamed source's encoded elements, element i in
    // bytes [encodedOffsets_[i], encodedOffsets_[i + 1]) of encodedRows_ (the cache's x region
    // after its offset table); a fill pass writes them at encodedFill_.
    bool encoded_ = false;
    const uint64_t* encodedOffsets_ = nullptr;
    const uint8_t* encodedRows_ = nullptr;
    uint8_t* encodedFill_ = nullptr;
    bool async_ = false, autotunePrefetch_ = false, autotuneParallel_ = false;
    bool inlineEligible_ = false;      // AUTOTUNE may form epochs inline (see the top)
    std::atomic<bool> inline_{false};  // this epoch forms its batches in next()
    double inlineMaxBatchSeconds_ = kInlineMaxBatchSeconds;  // TRAINDECK_INLINE_MAX_US
    bool inlineLimitSet_ = false;  // by TRAINDECK_INLINE_MAX_US: the only limit
    bool formsAside_ = false;      // PipelineOptions::formsAside
    int64_t formDelayUs_ = 0;      // kSlowBatchFaultEnv
    int64_t maxWorkers_ = 1, prefetchCap_ = 0;
    std::vector<std::string> messages_;

    // Epoch state, written by beginEpoch()/next() while no worker runs, read-only for the workers.
    std::vector<int32_t> order_, shuffleScratch_;
    bool filling_ = false;        // this epoch fills the cache
    bool readFromCache_ = false;  // this epoch reads the committed cache
    bool epochBegun_ = false, epochFinished_ = false;

    std::vector<Slot> slots_;
    std::vector<std::thread> threads_;

    // Shared between the consumer and the workers, guarded by mu_.
    std::mutex mu_;
    std::condition_variable workCv_;   // workers: a claim may be possible, or stop
    std::condition_variable readyCv_;  // consumer: a batch became ready, or an error
    int64_t nextToStart_ = 0, nextToConsume_ = 0;
    int64_t active_ = 0;      // workers forming a batch now
    int64_t readyAhead_ = 0;  // batches formed and not yet handed out
    std::vector<int> freeSlots_;
    std::vector<int> slotOfBatch_;  // batch b -> slot, at b % slots_.size()
    std::vector<uint8_t> slotReady_;
    int heldSlot_ = -1;
    int syncSlot_ = 0;
    bool cancel_ = false;
    std::optional<Error> error_;
    // AUTOTUNE measurements of the current period.
    double periodProduceSeconds_ = 0, periodConsumerSeconds_ = 0;
    int64_t periodProduced_ = 0, periodConsumed_ = 0, periodConsumerBatches_ = 0;
    int64_t periodWaits_ = 0, periodMinAhead_ = std::numeric_limits<int64_t>::max();
    Clock::time_point lastReturn_;
    bool lastReturnValid_ = false;

    std::atomic<int64_t> prefetchDepth_{0};
    std::atomic<int64_t> parallelism_{1};
    std::atomic<double> secondsPerBatch_{0.0};
    std::atomic<double> readSecondsPerBatch_{0.0};  // of it, reading a streamed source
    std::atomic<double> consumerSecondsPerBatch_{0.0};
    std::atomic<int64_t> epochWaits_{0};
    std::atomic<int64_t> epochWakeups_{0};
    std::atomic<int64_t> epochSourceElements_{0}, epochCacheElements_{0};
    std::atomic<bool> cacheComplete_{false};
    std::atomic<bool> readingCacheFile_{false};
};

Result<std::unique_ptr<Pipeline>> PipelineImpl::make(const Dataset& data, const PipelineConfig& cfg,
                                                     int64_t batchSize, bool shuffle, uint64_t seed,
                                                     const PipelineOptions& options) {
    auto p = std::unique_ptr<PipelineImpl>(new PipelineImpl());
    const int64_t n = data.size();
    if (n == 0) return err("pipeline: the dataset is empty");
    if (n > std::numeric_limits<int32_t>::max()) {
        return err("pipeline: " + std::to_string(n) + " samples exceed the 2^31-1 supported");
    }
    const DType xType = data.xType();
    if (xType != DType::U8 && xType != DType::F32) {
        return err(std::string("pipeline: features must be u8 or f32, found ") + dtypeName(xType));
    }
    if (data.y.empty() || data.y.rank() == 0 || data.y.dim(0) != n ||
        (data.y.dtype() != DType::I32 && data.y.dtype() != DType::F32)) {
        return err("pipeline: labels must be i32 [N] or f32 [N, k] with N = " + std::to_string(n));
    }
    if (batchSize <= 0) return err("pipeline: batch size must be > 0");
    if (cfg.shuffleBuffer < 0) return err("pipeline: shuffle buffer must be >= 0");
    if (cfg.prefetch < 0 && cfg.prefetch != kAutotune) {
        return err("pipeline: prefetch must be >= 0 or AUTOTUNE");
    }
    if (cfg.parallelCalls < 1 && cfg.parallelCalls != kAutotune) {
        return err("pipeline: num_parallel_calls must be >= 1 or AUTOTUNE");
    }
    TD_RETURN_IF_ERROR(checkPipelineResources(data, cfg, batchSize));

    p->data_ = data;
    p->options_ = options;
    p->n_ = n;
    p->batchSize_ = batchSize;
    p->numBatches_ = cfg.dropRemainder ? n / batchSize : (n + batchSize - 1) / batchSize;
    p->remainder_ = cfg.dropRemainder ? 0 : n % batchSize;
    if (p->numBatches_ == 0) {
        return err("pipeline: batch size " + std::to_string(batchSize) +
                   " with drop_remainder leaves no batch of the " + std::to_string(n) + " samples");
    }
    p->xRowElems_ = data.sampleValues();
    p->yRowElems_ = data.y.size() / n;
    p->reader_ = data.reader.get();
    TD_ASSIGN_OR_RETURN(p->plan_, planMap(cfg.map, data));
    p->oneHotDepth_ = p->plan_.preOneHot + p->plan_.postOneHot;
    p->sourceView_ = ElementView{static_cast<const uint8_t*>(p->data_.x.raw()),
                                 xType,
                                 p->xRowElems_ * static_cast<int64_t>(dtypeSize(xType)),
                                 static_cast<const uint8_t*>(p->data_.y.raw()),
                                 data.y.dtype(),
                                 p->yRowElems_};
    TD_RETURN_IF_ERROR(p->setUpCache(cfg));

    // Shuffle.
    p->shuffle_ = shuffle && cfg.shuffleBuffer > 0;
    p->shuffleBuffer_ = cfg.shuffleBuffer;
    p->shuffleSeed_ = cfg.shuffleSeed.value_or(seed);
    p->reshuffle_ = cfg.reshuffleEachIteration;
    p->order_.resize(static_cast<size_t>(n));
    if (p->shuffle_) p->shuffleScratch_.resize(static_cast<size_t>(std::min(cfg.shuffleBuffer, n)));

    // Threads and buffers.
    p->async_ = cfg.prefetch != 0;
    if (p->async_) {
        if (cfg.parallelCalls == kAutotune) {
            p->autotuneParallel_ = true;
            const int64_t budget = options.cpuBudget > 0 ? options.cpuBudget : schedulableCores();
            p->maxWorkers_ = std::clamp<int64_t>(budget, 1, kAutotuneMaxWorkers);
            p->parallelism_ = (p->maxWorkers_ + 1) / 2;
        } else {
            p->maxWorkers_ = cfg.parallelCalls;
            p->parallelism_ = cfg.parallelCalls;
        }
    }
    Shape xShape{batchSize};
    for (int64_t d : data.sampleShape()) xShape.push_back(d);
    const Shape yShape = p->oneHotDepth_                ? Shape{batchSize, p->oneHotDepth_}
                         : data.y.dtype() == DType::I32 ? Shape{batchSize}
                                                        : Shape{batchSize, p->yRowElems_};
    const DType yType = p->oneHotDepth_ ? DType::F32 : data.y.dtype();
    const auto slotBytes = static_cast<int64_t>(
        numElements(xShape) * 4 + numElements(yShape) * static_cast<int64_t>(dtypeSize(yType)));
    if (!p->async_) {
        p->prefetchCap_ = 0;
    } else if (cfg.prefetch == kAutotune) {
        p->autotunePrefetch_ = true;
        p->prefetchCap_ = std::clamp<int64_t>(
            kPrefetchRamBudgetBytes / std::max<int64_t>(slotBytes, 1) - p->maxWorkers_ - 2, 1,
            kAutotunePrefetchCap);
    } else {
        p->prefetchCap_ = cfg.prefetch;
    }
    p->prefetchDepth_ =
        p->autotunePrefetch_ ? std::min(kAutotunePrefetchMin, p->prefetchCap_) : p->prefetchCap_;
    p->inlineEligible_ = p->autotunePrefetch_ && p->autotuneParallel_ &&
                         options.consumerThreads >= schedulableCores();
    p->formsAside_ = options.formsAside;
    // TRAINDECK_INLINE_MAX_US replaces both limits, kInlineMaxBatchSeconds and the share of the
    // consumer's time (to measure either way on another machine, and for the tests, which must
    // not depend on how fast this one forms a batch).
    // Fault injection (kSlowBatchFaultEnv): every batch takes this much longer to form.
    if (const char* v = std::getenv(kSlowBatchFaultEnv); v && *v) {
        char* end = nullptr;
        const long long us = std::strtoll(v, &end, 10);
        if (end == v || *end != '\0' || us < 0 || us > 10000000)
            return err(std::string(kSlowBatchFaultEnv) +
                       ": expected microseconds from 0 to 10000000, got '" + v + "'");
        p->formDelayUs_ = us;
    }
    if (const char* v = std::getenv("TRAINDECK_INLINE_MAX_US"); v && *v) {
        char* end = nullptr;
        const double us = std::strtod(v, &end);
        if (end == v || *end != '\0' || !(us >= 0) || !std::isfinite(us))
            return err(std::string("TRAINDECK_INLINE_MAX_US: expected a number of microseconds "
                                   "(0 or more), got '") +
                       v + "'");
        p->inlineMaxBatchSeconds_ = us * 1e-6;
        p->inlineLimitSet_ = true;
    }

    const auto poolSize = static_cast<size_t>(p->prefetchCap_ + p->maxWorkers_ + 2);
    const bool twoStage = !p->plan_.pre.identity();
    p->slots_.resize(poolSize);
    for (Slot& s : p->slots_) {
        s.fullX = Tensor(DType::F32, xShape);
        s.fullY = Tensor(yType, yShape);
        if (p->remainder_ > 0) {
            s.remX = s.fullX.slice(0, p->remainder_);
            s.remY = s.fullY.slice(0, p->remainder_);
        }
        s.batch.x = s.fullX;
        s.batch.y = s.fullY;
        if (twoStage) s.preRow.resize(static_cast<size_t>(p->xRowElems_));
        if (p->reader_) s.sourceRow.resize(static_cast<size_t>(p->sourceView_.xRowBytes));
    }
    p->freeSlots_.reserve(poolSize);
    p->slotOfBatch_.assign(poolSize, -1);
    p->slotReady_.assign(poolSize, 0);
    return std::unique_ptr<Pipeline>(std::move(p));
}

Status PipelineImpl::setUpCache(const PipelineConfig& cfg) {
    if (cfg.cache == "none") {
        cacheKind_ = CacheKind::None;
        return {};
    }
    if (cfg.cache == "memory") {
        cacheKind_ = CacheKind::Memory;
    } else if (cfg.cache.rfind("file:", 0) == 0) {
        cacheKind_ = CacheKind::File;
        cachePath_ = cfg.cache.substr(5);
        if (cachePath_.empty()) return err("pipeline cache 'file:' needs a path");
    } else {
        return err("unknown pipeline cache '" + cfg.cache + "' (valid: none, memory, file:<path>)");
    }

    // What the cache holds: the elements after the pre steps, or, before the decode, the
    // streamed source's encoded elements (each of its own size, after a table of offsets).
    cacheLayout_.rows = n_;
    cacheLayout_.xType = plan_.preConverts ? DType::F32 : data_.xType();
    cacheLayout_.xRowBytes = xRowElems_ * static_cast<int64_t>(dtypeSize(cacheLayout_.xType));
    cacheLayout_.yType = plan_.preOneHot ? DType::F32 : data_.y.dtype();
    const int64_t cacheYElems = plan_.preOneHot ? plan_.preOneHot : yRowElems_;
    cacheLayout_.yRowBytes = cacheYElems * static_cast<int64_t>(dtypeSize(cacheLayout_.yType));
    std::vector<uint64_t> offsets;
    if (plan_.cacheBeforeDecode) {
        if (!reader_ || !reader_->hasEncoded())
            return err(
                "pipeline: a cache before 'decode' keeps the encoded files or records of an "
                "image_directory or tfrecord source as it streams them; these samples are "
                "already decoded in memory");
        encoded_ = true;
        TD_ASSIGN_OR_RETURN(std::vector<int64_t> sizes, reader_->encodedSizes());
        TD_ASSERT(static_cast<int64_t>(sizes.size()) == n_);
        offsets.resize(static_cast<size_t>(n_) + 1);
        for (int64_t i = 0; i < n_; ++i)
            offsets[static_cast<size_t>(i) + 1] =
                offsets[static_cast<size_t>(i)] +
                static_cast<uint64_t>(sizes[static_cast<size_t>(i)]);
        const uint64_t tableBytes = offsets.size() * sizeof(uint64_t);
        cacheLayout_.xType = DType::U8;
        cacheLayout_.xRowBytes = 0;
        cacheLayout_.xVariableBytes = static_cast<int64_t>(tableBytes + offsets.back());
    }
    // Points the encoded views at a cache's x region, writing its offset table when it fills.
    auto encodedViews = [&](const uint8_t* x, uint8_t* fill) {
        const size_t tableBytes = offsets.size() * sizeof(uint64_t);
        if (fill) std::memcpy(fill, offsets.data(), tableBytes);
        encodedOffsets_ = reinterpret_cast<const uint64_t*>(x);
        encodedRows_ = x + tableBytes;
        encodedFill_ = fill ? fill + tableBytes : nullptr;
    };

    const uint8_t* x = nullptr;
    const uint8_t* y = nullptr;
    if (cacheKind_ == CacheKind::Memory && encoded_) {
        TD_RETURN_IF_ERROR(
            checkFileFits("data.pipeline.cache",
                          "a memory cache of " + std::to_string(n_) +
                              " encoded samples (the files or records as read, before the decode)",
                          static_cast<double>(cacheLayout_.xVariableBytes)));
        memoryCacheX_ = Tensor(DType::U8, {cacheLayout_.xVariableBytes});
        cacheFillX_ = static_cast<uint8_t*>(memoryCacheX_.raw());
        encodedViews(cacheFillX_, cacheFillX_);
        x = cacheFillX_;
        y = sourceView_.y;
    } else if (cacheKind_ == CacheKind::Memory) {
        // Unmapped elements already in memory: the source is the cache.
        if (plan_.preConverts || reader_) {
            TD_RETURN_IF_ERROR(checkFileFits(
                "data.pipeline.cache", "a memory cache of " + std::to_string(n_) + " samples",
                static_cast<double>(n_) * static_cast<double>(cacheLayout_.xRowBytes)));
            memoryCacheX_ = Tensor(cacheLayout_.xType, {n_, xRowElems_});
            cacheFillX_ = static_cast<uint8_t*>(memoryCacheX_.raw());
        }
        if (plan_.preOneHot) {
            memoryCacheY_ = Tensor(DType::F32, {n_, cacheYElems});
            cacheFillY_ = static_cast<uint8_t*>(memoryCacheY_.raw());
        }
        x = cacheFillX_ ? cacheFillX_ : sourceView_.x;
        y = cacheFillY_ ? cacheFillY_ : sourceView_.y;
    } else {
        // The fingerprint names what the rows were made from, so a later run can trust them.
        uint64_t h = 1;
        if (reader_) {
            const std::string id = reader_->identity();
            h = hashBytes(id.data(), id.size(), h);
        } else {
            h = hashBytes(data_.x.raw(), data_.x.bytes(), h);
        }
        h = hashBytes(data_.y.raw(), data_.y.bytes(), h);
        Shape xShape{n_};
        for (int64_t dim : data_.sampleShape()) xShape.push_back(dim);
        std::string shapes = shapeToString(xShape) + dtypeName(data_.xType()) +
                             shapeToString(data_.y.shape()) + dtypeName(data_.y.dtype()) + "|" +
                             plan_.preText;
        if (encoded_) {
            shapes += "|encoded";
            h = hashBytes(offsets.data(), offsets.size() * sizeof(uint64_t), h);
        }
        fingerprint_ = hashBytes(shapes.data(), shapes.size(), h);
        if (::access(cachePath_.c_str(), F_OK) == 0) {
            auto mapping = CacheFileMapping::open(cachePath_, cacheLayout_, fingerprint_);
            if (mapping.ok()) {
                cacheMapping_ = std::move(mapping).value();
                cacheComplete_ = true;
                readingCacheFile_ = true;
            } else {
                messages_.push_back(mapping.error() + "; rebuilding it");
            }
        }
        if (cacheMapping_) {
            x = cacheMapping_->x();
            y = cacheMapping_->y();
            if (encoded_) encodedViews(x, nullptr);
        } else {
            // Fail now rather than at the first epoch when the file cannot be written.
            TD_ASSIGN_OR_RETURN(cacheWriter_, CacheFileWriter::create(cachePath_, cacheLayout_));
            cacheFillX_ = cacheWriter_->x();
            cacheFillY_ = cacheWriter_->y();
            x = cacheFillX_;
            y = cacheFillY_;
            if (encoded_) encodedViews(cacheFillX_, cacheFillX_);
        }
    }
    cacheView_ = ElementView{x, cacheLayout_.xType, cacheLayout_.xRowBytes,
                             y, cacheLayout_.yType, cacheYElems};
    return {};
}

Status PipelineImpl::beginEpoch(int epoch) {
    stopWorkers();
    {
        std::lock_guard lock(mu_);
        nextToStart_ = nextToConsume_ = 0;
        active_ = readyAhead_ = 0;
        freeSlots_.clear();
        for (int s = static_cast<int>(slots_.size()) - 1; s >= 0; --s) freeSlots_.push_back(s);
        std::fill(slotReady_.begin(), slotReady_.end(), uint8_t{0});
        heldSlot_ = -1;
        cancel_ = false;
        error_.reset();
        lastReturnValid_ = false;
    }
    epochBegun_ = true;
    epochFinished_ = false;
    // An unfinished fill pass is discarded (tf.data never keeps a partial cache): this epoch fills
    // every row again.
    readFromCache_ = cacheKind_ != CacheKind::None && cacheComplete_;
    if (readFromCache_) readSecondsPerBatch_ = 0;  // the source is no longer read
    filling_ = cacheKind_ != CacheKind::None && !cacheComplete_;
    epochWaits_ = 0;
    epochWakeups_ = 0;
    epochSourceElements_ = 0;
    epochCacheElements_ = 0;

    if (shuffle_) {
        const uint64_t epochSeed =
            deriveSeed(shuffleSeed_, reshuffle_ ? static_cast<uint64_t>(epoch) : 0);
        shuffleOrder(n_, shuffleBuffer_, epochSeed, order_.data(), shuffleScratch_.data());
        // A source that reads its elements in an order of its own each epoch (shards shuffled):
        // the buffer shuffles that sequence.
        if (reader_ || data_.epochOrder) {
            const std::vector<int32_t> base =
                data_.epochOrder ? data_.epochOrder(epochSeed) : reader_->epochOrder(epochSeed);
            if (static_cast<int64_t>(base.size()) == n_)
                for (int32_t& i : order_) i = base[static_cast<size_t>(i)];
        }
    } else {
        for (int64_t i = 0; i < n_; ++i) order_[static_cast<size_t>(i)] = static_cast<int32_t>(i);
    }

    const double formSeconds = secondsPerBatch_.load(std::memory_order_relaxed);
    double inlineLimit = inlineMaxBatchSeconds_;
    if (formsAside_ && !inlineLimitSet_)
        inlineLimit = std::max(inlineLimit, kInlineAsideShare * consumerSecondsPerBatch_.load());
    inline_ = inlineEligible_ && formSeconds > 0 && formSeconds <= inlineLimit;
    if (async_ && !inline_) {
        try {
            for (int64_t w = 0; w < maxWorkers_; ++w) {
                threads_.emplace_back([this] { workerLoop(); });
            }
        } catch (const std::system_error& e) {
            stopWorkers();
            Error e2 = err(std::string("pipeline: cannot start a worker thread: ") + e.what());
            error_ = e2;  // next() returns the same error
            return e2;
        }
    }
    return {};
}

void PipelineImpl::stopWorkers() {
    {
        std::lock_guard lock(mu_);
        cancel_ = true;
    }
    workCv_.notify_all();
    for (std::thread& t : threads_) t.join();
    threads_.clear();
}

// Source row i, its bytes at `src`, after the pre steps, into the cache being filled.
void PipelineImpl::fillRow(int64_t i, const uint8_t* src) {
    if (cacheFillX_) {
        uint8_t* d = cacheFillX_ + i * cacheLayout_.xRowBytes;
        if (plan_.preConverts)
            convertRow(kernels_, src, sourceView_.xType, reinterpret_cast<float*>(d), xRowElems_,
                       plan_.pre);
        else
            std::memcpy(d, src, static_cast<size_t>(cacheLayout_.xRowBytes));
    }
    fillRowY(i);
}

// Source label i (after the pre steps) into the cache being filled, where it keeps labels.
void PipelineImpl::fillRowY(int64_t i) {
    if (cacheFillY_) {
        uint8_t* d = cacheFillY_ + i * cacheLayout_.yRowBytes;
        if (plan_.preOneHot) {
            auto* row = reinterpret_cast<float*>(d);
            std::fill(row, row + plan_.preOneHot, 0.0f);
            row[reinterpret_cast<const int32_t*>(sourceView_.y)[i]] = 1.0f;
        } else {
            std::memcpy(d, sourceView_.y + i * cacheLayout_.yRowBytes,
                        static_cast<size_t>(cacheLayout_.yRowBytes));
        }
    }
}

// Streamed element i into slot.sourceRow, decoded: read from the source (filling the cache in a
// fill pass), or, from a cache before the decode, decoded from its encoded bytes there.
Status PipelineImpl::readElement(int64_t i, Slot& slot) {
    if (!encoded_) {
        TD_RETURN_IF_ERROR(reader_->read(i, slot.sourceRow.data()));
        if (filling_) fillRow(i, slot.sourceRow.data());
        return {};
    }
    const uint64_t begin = encodedOffsets_[i];
    const uint64_t size = encodedOffsets_[i + 1] - begin;
    if (readFromCache_)
        return reader_->decode(i, encodedRows_ + begin, static_cast<size_t>(size),
                               slot.sourceRow.data());
    TD_RETURN_IF_ERROR(reader_->readEncoded(i, slot.encoded));
    if (slot.encoded.size() != size)
        return err(reader_->elementName(i) + ": " + std::to_string(slot.encoded.size()) +
                   " bytes read, " + std::to_string(size) +
                   " expected (its size when the run started): it changed during the run");
    if (filling_) {
        std::memcpy(encodedFill_ + begin, slot.encoded.data(), static_cast<size_t>(size));
        fillRowY(i);
    }
    return reader_->decode(i, slot.encoded.data(), static_cast<size_t>(size),
                           slot.sourceRow.data());
}

// Forms batch b (rows order_[b*B, b*B + size)) into `slot`; in a fill pass, also fills this
// batch's share of the cache: of an in-memory source, the source rows [b*N/nb, (b+1)*N/nb); of a
// streamed one, the rows it reads (each read once), and the last batch also the rows no batch
// reads (drop_remainder). Runs on a worker, or inline in next().
Status PipelineImpl::produce(int64_t b, Slot& slot) {
    if (filling_ && !reader_)
        for (int64_t i = b * n_ / numBatches_; i < (b + 1) * n_ / numBatches_; ++i)
            fillRow(i, sourceView_.x + i * sourceView_.xRowBytes);
    if (filling_ && reader_ && b == numBatches_ - 1)
        for (int64_t k = std::min(n_, numBatches_ * batchSize_); k < n_; ++k)
            TD_RETURN_IF_ERROR(readElement(order_[static_cast<size_t>(k)], slot));
    const int64_t first = b * batchSize_;
    const int64_t rows = std::min(batchSize_, n_ - first);
    const int32_t* idx = order_.data() + first;
    const ElementView& v = readFromCache_ ? cacheView_ : sourceView_;
    // The type of the x rows formed: a cache before the decode gives decoded source rows.
    const DType xType = readFromCache_ && !encoded_ ? cacheView_.xType : sourceView_.xType;
    (readFromCache_ ? epochCacheElements_ : epochSourceElements_) += rows;

    // x: gather + map to f32 [rows, ...]. From the source with pre steps: pre, then post.
    const int64_t d = xRowElems_;
    float* x = slot.fullX.data<float>();
    const AffineMap& post = plan_.post;
    const auto a = static_cast<float>(post.scale), c = static_cast<float>(post.shift);
    const int64_t rowBytes = v.xRowBytes;
    // Rows past this batch are prefetched too: they start the next batch.
    const int64_t prefetchable = n_ - first;
    Status readStatus;
    auto gather = [&](auto&& formRow) {
        if (reader_ && (!readFromCache_ || encoded_)) {
            // A streamed source: each element read (decoded) here, on the map worker; from a
            // cache before the decode, decoded here from its encoded bytes.
            const auto readStart = Clock::now();
            double mapSeconds = 0;
            for (int64_t r = 0; r < rows; ++r) {
                readStatus = readElement(idx[r], slot);
                if (!readStatus.ok()) return;
                const auto mapStart = Clock::now();
                formRow(slot.sourceRow.data(), x + r * d);
                mapSeconds += secondsBetween(mapStart, Clock::now());
                if (options_.elementHook) options_.elementHook(idx[r]);
            }
            const double readSeconds = secondsBetween(readStart, Clock::now()) - mapSeconds;
            const double prev = readSecondsPerBatch_.load(std::memory_order_relaxed);
            readSecondsPerBatch_.store(prev == 0 ? readSeconds : 0.9 * prev + 0.1 * readSeconds,
                                       std::memory_order_relaxed);
            return;
        }
        for (int64_t r = 0; r < std::min(kPrefetchRowsAhead, prefetchable); ++r) {
            prefetchRow(v.x + idx[r] * rowBytes, rowBytes);
        }
        for (int64_t r = 0; r < rows; ++r) {
            if (r + kPrefetchRowsAhead < prefetchable) {
                prefetchRow(v.x + idx[r + kPrefetchRowsAhead] * rowBytes, rowBytes);
            }
            formRow(v.x + idx[r] * rowBytes, x + r * d);
            if (options_.elementHook) options_.elementHook(idx[r]);
        }
        // And the rest of the next batch's rows: a shuffled epoch reads rows all over the
        // source, from memory, and forming the next batch (a step later) then finds them in
        // cache. Seed MLP, batch 32, a batch formed beside the step: 12.3-12.6 us against
        // 14.5-15.6 (a busy host; three alternating pairs).
        for (int64_t r = rows + kPrefetchRowsAhead; r < std::min(rows + batchSize_, prefetchable);
             ++r)
            prefetchRow(v.x + idx[r] * rowBytes, rowBytes);
    };
    // One loop per case: no per-element or per-row decision inside the gather.
    if (!readFromCache_ && !plan_.pre.identity()) {
        float* tmp = slot.preRow.data();
        // As when the row is read back from the cache (below): pre, then post, each rounded.
        if (post.identity()) {
            gather([&](const uint8_t* src, float* dst) {
                convertRow(kernels_, src, xType, dst, d, plan_.pre);
            });
        } else {
            gather([&](const uint8_t* src, float* dst) {
                convertRow(kernels_, src, xType, tmp, d, plan_.pre);
                kernels_.affineF32(tmp, dst, d, a, c);
            });
        }
    } else if (xType == DType::U8) {
        gather([&](const uint8_t* src, float* dst) { kernels_.affineU8(src, dst, d, a, c); });
    } else if (post.identity()) {
        gather([&](const uint8_t* src, float* dst) {
            std::memcpy(dst, src, static_cast<size_t>(d) * sizeof(float));
        });
    } else {
        gather([&](const uint8_t* src, float* dst) {
            kernels_.affineF32(reinterpret_cast<const float*>(src), dst, d, a, c);
        });
    }

    TD_RETURN_IF_ERROR(readStatus);

    // y: class ids [rows], one-hot f32 [rows, depth], or f32 rows [rows, k] (targets, or labels
    // one-hot encoded before the cache).
    if (v.yType == DType::I32 && oneHotDepth_) {
        const auto* labels = reinterpret_cast<const int32_t*>(v.y);
        float* y = slot.fullY.data<float>();
        std::memset(y, 0, static_cast<size_t>(rows * oneHotDepth_) * sizeof(float));
        for (int64_t r = 0; r < rows; ++r) y[r * oneHotDepth_ + labels[idx[r]]] = 1.0f;
    } else if (v.yType == DType::I32) {
        const auto* labels = reinterpret_cast<const int32_t*>(v.y);
        int32_t* y = slot.fullY.data<int32_t>();
        for (int64_t r = 0; r < rows; ++r) y[r] = labels[idx[r]];
    } else {
        const auto* targets = reinterpret_cast<const float*>(v.y);
        const int64_t k = v.yRowElems;
        float* y = slot.fullY.data<float>();
        for (int64_t r = 0; r < rows; ++r) {
            std::memcpy(y + r * k, targets + idx[r] * k, static_cast<size_t>(k) * sizeof(float));
        }
    }

    // Same-rank shape assignments: no allocation.
    slot.batch.x = rows == batchSize_ ? slot.fullX : slot.remX;
    slot.batch.y = rows == batchSize_ ? slot.fullY : slot.remY;
    slot.batch.size = rows;
    slot.batch.firstIndex = first;
    if (formDelayUs_ > 0) std::this_thread::sleep_for(std::chrono::microseconds(formDelayUs_));
    return {};
}

void PipelineImpl::recordProduced(double seconds) {
    periodProduceSeconds_ += seconds;
    ++periodProduced_;
    const double prev = secondsPerBatch_.load(std::memory_order_relaxed);
    secondsPerBatch_.store(prev == 0 ? seconds : 0.9 * prev + 0.1 * seconds,
                           std::memory_order_relaxed);
}

void PipelineImpl::workerLoop() {
    const auto poolSize = static_cast<int64_t>(slots_.size());
    std::unique_lock lock(mu_);
    while (true) {
        workCv_.wait(lock, [&] {
            return cancel_ || error_ || nextToStart_ >= numBatches_ ||
                   (active_ < parallelism_.load() &&
                    nextToStart_ - nextToConsume_ < prefetchDepth_.load() + parallelism_.load() &&
                    !freeSlots_.empty());
        });
        if (cancel_ || error_ || nextToStart_ >= numBatches_) return;
        const int64_t b = nextToStart_++;
        // Workers beyond the tuned parallelism sleep until the epoch's last claim lets them end.
        if (nextToStart_ == numBatches_) workCv_.notify_all();
        const int s = freeSlots_.back();
        freeSlots_.pop_back();
        slotOfBatch_[static_cast<size_t>(b % poolSize)] = s;
        ++active_;
        lock.unlock();

        const auto start = Clock::now();
        Status status = produce(b, slots_[static_cast<size_t>(s)]);
        const double seconds = secondsBetween(start, Clock::now());

        lock.lock();
        --active_;
        if (!status.ok()) {
            if (!error_) error_ = std::move(status).takeError();
            lock.unlock();
            readyCv_.notify_all();
            workCv_.notify_all();
            return;
        }
        slotReady_[static_cast<size_t>(s)] = 1;
        ++readyAhead_;
        recordProduced(seconds);
        if (b == nextToConsume_) readyCv_.notify_one();  // the consumer only waits for this one
    }
}

void PipelineImpl::finishEpoch() {
    if (epochFinished_) return;
    epochFinished_ = true;
    stopWorkers();
}

// The pass that filled the cache has formed its last batch: every row is in place.
Status PipelineImpl::commitCache() {
    filling_ = false;
    if (cacheWriter_) {
        TD_RETURN_IF_ERROR(cacheWriter_->commit(fingerprint_));
        readingCacheFile_ = true;
    }
    cacheComplete_ = true;
    return {};
}

void PipelineImpl::retune() {
    if (autotuneParallel_ && periodProduced_ > 0 && periodConsumerBatches_ > 0) {
        const double produce = periodProduceSeconds_ / static_cast<double>(periodProduced_);
        const double consume = periodConsumerSeconds_ / static_cast<double>(periodConsumerBatches_);
        const double needed =
            consume > 0 ? produce / consume * kParallelHeadroom : static_cast<double>(maxWorkers_);
        const int64_t target = needed >= static_cast<double>(maxWorkers_)
                                   ? maxWorkers_
                                   : std::max<int64_t>(1, static_cast<int64_t>(std::ceil(needed)));
        const int64_t current = parallelism_.load();
        if (target > current) {
            parallelism_ = target;
            workCv_.notify_all();
        } else if (target < current) {
            parallelism_ = std::max(target, current / 2);
        }
    }
    if (periodConsumerBatches_ > 0) {
        consumerSecondsPerBatch_ =
            periodConsumerSeconds_ / static_cast<double>(periodConsumerBatches_);
    }
    if (autotunePrefetch_) {
        const int64_t depth = prefetchDepth_.load();
        if (periodWaits_ > 0 && depth < prefetchCap_) {
            prefetchDepth_ = depth + 1;
            workCv_.notify_all();
        } else if (periodWaits_ == 0 && periodMinAhead_ >= depth &&
                   depth > std::min(kAutotunePrefetchMin, prefetchCap_)) {
            prefetchDepth_ = depth - 1;
        }
    }
    periodProduceSeconds_ = periodConsumerSeconds_ = 0;
    periodProduced_ = periodConsumed_ = periodConsumerBatches_ = periodWaits_ = 0;
    periodMinAhead_ = std::numeric_limits<int64_t>::max();
}

Result<const Batch*> PipelineImpl::next() {
    TD_ASSERT_MSG(epochBegun_, "Pipeline::next() before beginEpoch()");
    if (!async_ || inline_) {
        if (error_) return *error_;
        if (nextToConsume_ >= numBatches_) {
            finishEpoch();
            return static_cast<const Batch*>(nullptr);
        }
        Slot& slot = slots_[static_cast<size_t>(syncSlot_)];
        syncSlot_ = (syncSlot_ + 1) % static_cast<int>(std::min(slots_.size(), kInlineSlots));
        const auto start = Clock::now();
        Status s = produce(nextToConsume_, slot);
        if (s.ok()) {
            std::lock_guard lock(mu_);
            recordProduced(secondsBetween(start, Clock::now()));
        }
        if (s.ok() && ++nextToConsume_ == numBatches_ && filling_) s = commitCache();
        if (!s.ok()) {
            error_ = std::move(s).takeError();
            return *error_;
        }
        return static_cast<const Batch*>(&slot.batch);
    }

    const auto enter = Clock::now();
    const auto poolSize = static_cast<int64_t>(slots_.size());
    std::unique_lock lock(mu_);
    if (lastReturnValid_) {
        periodConsumerSeconds_ += secondsBetween(lastReturn_, enter);
        ++periodConsumerBatches_;
        lastReturnValid_ = false;
    }
    // The pool always has a free slot for a claim the window allows (see the top of this file), so
    // returning the held slot wakes nobody; advancing nextToConsume_ below does.
    if (heldSlot_ >= 0) {
        slotReady_[static_cast<size_t>(heldSlot_)] = 0;
        freeSlots_.push_back(heldSlot_);
        heldSlot_ = -1;
    }
    if (error_) return *error_;
    if (nextToConsume_ >= numBatches_) {
        lock.unlock();
        finishEpoch();
        return static_cast<const Batch*>(nullptr);
    }
    const int64_t b = nextToConsume_;
    auto ready = [&] {
        return nextToStart_ > b &&
               slotReady_[static_cast<size_t>(slotOfBatch_[static_cast<size_t>(b % poolSize)])] !=
                   0;
    };
    if (!ready()) {
        // The first batch of an epoch is always waited for: the workers have just started.
        if (b > 0) {
            ++periodWaits_;
            ++epochWaits_;
        }
        readyCv_.wait(lock, [&] { return error_ || ready(); });
        if (error_) return *error_;
    }
    heldSlot_ = slotOfBatch_[static_cast<size_t>(b % poolSize)];
    ++nextToConsume_;
    --readyAhead_;
    periodMinAhead_ = std::min(periodMinAhead_, readyAhead_);
    if (++periodConsumed_ >= kTunePeriodBatches) retune();
    // Wake-ups in bursts (see the top of this file); none once every batch is claimed.
    const int64_t window = prefetchDepth_.load() + parallelism_.load();
    if (nextToStart_ < numBatches_ &&
        window - (nextToStart_ - nextToConsume_) >= std::max<int64_t>(1, window / 2)) {
        ++epochWakeups_;
        workCv_.notify_one();
    }
    if (b + 1 == numBatches_ && filling_) {
        lock.unlock();
        Status s = commitCache();
        lock.lock();
        if (!s.ok()) {
            error_ = std::move(s).takeError();
            return *error_;
        }
    }
    lastReturn_ = Clock::now();
    lastReturnValid_ = true;
    return static_cast<const Batch*>(&slots_[static_cast<size_t>(heldSlot_)].batch);
}

PipelineStats PipelineImpl::stats() const {
    PipelineStats s;
    const bool formingInline = inline_.load();
    s.formingInline = formingInline;
    s.prefetchDepth = formingInline ? 0 : prefetchDepth_.load();
    s.parallelCalls = async_ && !formingInline ? parallelism_.load() : 1;
    s.maxParallelCalls = async_ ? maxWorkers_ : 1;
    s.producerSecondsPerBatch = secondsPerBatch_.load(std::memory_order_relaxed);
    s.readSecondsPerBatch = readSecondsPerBatch_.load(std::memory_order_relaxed);
    s.consumerSecondsPerBatch = consumerSecondsPerBatch_.load(std::memory_order_relaxed);
    s.consumerWaits = epochWaits_.load();
    s.consumerWakeups = epochWakeups_.load();
    s.epochSourceElements = epochSourceElements_.load();
    s.epochCacheElements = epochCacheElements_.load();
    s.cacheComplete = cacheComplete_.load();
    s.readingCacheFile = readingCacheFile_.load();
    return s;
}

}  // namespace

std::string inputBoundAdvice(const PipelineStats& s, const PipelineConfig& cfg, double cacheBytes) {
    if (cfg.cache == "none") {
        auto budget = hostMemoryBudget();
        if (budget.ok() && cacheBytes > 0.5 * budget.value().bytes)
            return "a cache file after the decode and map steps (data.pipeline.cache "
                   "\"file:<path>\": " +
                   formatBytes(cacheBytes) +
                   " on disk for this data, more than half the memory budget of " +
                   formatBytes(budget.value().bytes) + ") would decode each sample once";
        return "a cache after the decode and map steps (data.pipeline.cache \"memory\": " +
               formatBytes(cacheBytes) + " for this data) would form each sample once";
    }
    if (cfg.parallelCalls != kAutotune && cfg.parallelCalls < s.maxParallelCalls)
        return "more map workers (data.pipeline.parallel_calls \"autotune\", or above " +
               std::to_string(cfg.parallelCalls) + ")";
    if (cfg.prefetch == 0)
        return "prefetching batches ahead of the step (data.pipeline.prefetch \"autotune\")";
    return "fewer or lighter map steps, or a smaller image size (the map workers are at the CPU "
           "budget, " +
           std::to_string(s.maxParallelCalls) + ")";
}

std::string describePipeline(const PipelineStats& s) {
    std::string text =
        s.formingInline
            ? "input pipeline: batches formed inline (AUTOTUNE: the step holds every core, a "
              "batch forms in " +
                  std::to_string(
                      static_cast<int64_t>(std::lround(s.producerSecondsPerBatch * 1e6))) +
                  " us); "
            : "input pipeline: " + std::to_string(s.parallelCalls) + " of " +
                  std::to_string(s.maxParallelCalls) + " map workers (a batch forms in " +
                  std::to_string(
                      static_cast<int64_t>(std::lround(s.producerSecondsPerBatch * 1e6))) +
                  " us" +
                  (s.readSecondsPerBatch > 0 ? ", " +
                                                   std::to_string(static_cast<int64_t>(
                                                       std::lround(s.readSecondsPerBatch * 1e6))) +
                                                   " of them reading and decoding files"
                                             : std::string()) +
                  "), prefetch " + std::to_string(s.prefetchDepth) + ", waited for " +
                  std::to_string(s.consumerWaits) + " batches; ";
    text += std::to_string(s.epochSourceElements) + " elements from the source, " +
            std::to_string(s.epochCacheElements) + " from the cache";
    if (s.readingCacheFile) text += " file";
    return text;
}

Result<std::unique_ptr<Pipeline>> Pipeline::create(const Dataset& data, const PipelineConfig& cfg,
                                                   int64_t batchSize, bool shuffle, uint64_t seed,
                                                   const PipelineOptions& options) {
    return PipelineImpl::make(data, cfg, batchSize, shuffle, seed, options);
}

}  // namespace td

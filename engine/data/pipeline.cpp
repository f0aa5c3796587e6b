// The input pipeline: cache -> shuffle -> batch -> map -> prefetch, with tf.data semantics.
//
// Threads. The consumer (the trainer) calls beginEpoch/next from one thread; stats() may be called
// from any thread. With prefetch 0 everything runs inline in next() (parallelCalls is then 1).
// Otherwise `workers_` threads, started by beginEpoch, claim batch numbers in epoch order, form
// each batch (gather + map) into a free pool slot and mark it ready; next() hands the slots out in
// batch order, so the output does not depend on the thread count (deterministic=True). With one
// worker that thread is the prefetch producer; with N it is N parallel map calls.
//
// Flow control. Workers may run at most `prefetchDepth + workers` batches ahead of the consumer.
// The pool holds prefetchCap + workers + 2 slots (one held by the consumer, one spare), so a claim
// always finds a free slot. AUTOTUNE prefetch starts at 2 and grows by one (up to the cap, itself
// bounded by kPrefetchRamBudgetBytes) each time the consumer has to wait for a batch other than
// the first of an epoch.
//
// Memory. Every tensor (pool slots, shuffle order) is allocated by create(); beginEpoch() starts
// threads and, for a file cache, opens the writer or maps the file; next() allocates nothing.
#include <sched.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstring>
#include <limits>
#include <mutex>
#include <system_error>
#include <thread>

#include "engine/data/cache_file.h"
#include "engine/data/pipeline.h"
#include "engine/data/random.h"
#include "engine/data/resource_plan.h"

namespace td {
namespace {

constexpr int64_t kAutotunePrefetchStart = 2;
constexpr int64_t kAutotunePrefetchCap = 16;
constexpr int64_t kAutotuneMaxWorkers = 8;  // the gather is memory-bound beyond a few cores
constexpr int64_t kPrefetchRamBudgetBytes = int64_t{256} << 20;

int64_t schedulableCores() {
    cpu_set_t set;
    CPU_ZERO(&set);
    if (sched_getaffinity(0, sizeof set, &set) == 0) return std::max(1, CPU_COUNT(&set));
    return std::max(1u, std::thread::hardware_concurrency());
}

// x' = x * scale + shift: the composition of the "cast", "scale" and "normalize" steps.
struct AffineMap {
    double scale = 1.0, shift = 0.0;
    bool identity() const { return scale == 1.0 && shift == 0.0; }
};

// One row of the gather: dst[k] = src[k] * a + b, vectorised by the compiler.
template <typename Src>
void convertRow(const Src* __restrict src, float* __restrict dst, int64_t n, float a, float b) {
    for (int64_t k = 0; k < n; ++k) dst[k] = static_cast<float>(src[k]) * a + b;
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

class PipelineImpl final : public Pipeline {
  public:
    ~PipelineImpl() override { stopWorkers(); }

    static Result<std::unique_ptr<Pipeline>> make(const Dataset& data, const PipelineConfig& cfg,
                                                  int64_t batchSize, bool shuffle, uint64_t seed);

    Status beginEpoch(int epoch) override;
    Result<const Batch*> next() override;
    int64_t batchesPerEpoch() const override { return numBatches_; }
    Shape featureShape() const override { return data_.sampleShape(); }
    PipelineStats stats() const override;

  private:
    struct Slot {
        Batch batch;
        Tensor fullX, fullY;  // [B, ...]
        Tensor remX, remY;    // views of the first `remainder` rows (empty when none)
    };

    Status produce(int64_t b, Slot& slot);
    void workerLoop();
    void stopWorkers();
    Status finishEpoch();

    // Immutable after create().
    Dataset data_;
    int64_t n_ = 0, batchSize_ = 0, numBatches_ = 0, remainder_ = 0;
    int64_t xRowElems_ = 0, yRowElems_ = 0;  // per sample, in the source
    AffineMap affine_;
    int64_t oneHotDepth_ = 0;  // 0: labels pass through
    bool shuffle_ = false, reshuffle_ = true;
    int64_t shuffleBuffer_ = 0;
    uint64_t shuffleSeed_ = 0;
    std::string cachePath_;  // non-empty for "file:<path>"
    CacheLayout cacheLayout_;
    bool async_ = false, autotunePrefetch_ = false;
    int64_t workers_ = 1, prefetchCap_ = 0;

    // Epoch state, written by beginEpoch() while no worker runs, read-only for the workers.
    std::vector<int32_t> order_, shuffleScratch_;
    const uint8_t* srcX_ = nullptr;
    const uint8_t* srcY_ = nullptr;
    std::unique_ptr<CacheFileWriter> cacheWriter_;  // while an epoch fills the cache
    std::unique_ptr<CacheFileMapping> cacheMapping_;
    bool epochBegun_ = false, epochFinished_ = false;

    std::vector<Slot> slots_;
    std::vector<std::thread> threads_;

    // Shared between the consumer and the workers, guarded by mu_.
    std::mutex mu_;
    std::condition_variable workCv_;   // workers: a claim may be possible, or stop
    std::condition_variable readyCv_;  // consumer: a batch became ready, or an error
    int64_t nextToStart_ = 0, nextToConsume_ = 0;
    std::vector<int> freeSlots_;
    std::vector<int> slotOfBatch_;  // batch b -> slot, at b % slots_.size()
    std::vector<uint8_t> slotReady_;
    int heldSlot_ = -1;
    int syncSlot_ = 0;
    bool cancel_ = false;
    std::optional<Error> error_;

    std::atomic<int64_t> prefetchDepth_{0};
    std::atomic<double> secondsPerBatch_{0.0};
    std::atomic<bool> readingCacheFile_{false};
};

Result<std::unique_ptr<Pipeline>> PipelineImpl::make(const Dataset& data, const PipelineConfig& cfg,
                                                     int64_t batchSize, bool shuffle,
                                                     uint64_t seed) {
    auto p = std::unique_ptr<PipelineImpl>(new PipelineImpl());
    const int64_t n = data.size();
    if (n == 0) return err("pipeline: the dataset is empty");
    if (n > std::numeric_limits<int32_t>::max()) {
        return err("pipeline: " + std::to_string(n) + " samples exceed the 2^31-1 supported");
    }
    if (data.x.dtype() != DType::U8 && data.x.dtype() != DType::F32) {
        return err(std::string("pipeline: features must be u8 or f32, found ") +
                   dtypeName(data.x.dtype()));
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
    p->n_ = n;
    p->batchSize_ = batchSize;
    p->numBatches_ = cfg.dropRemainder ? n / batchSize : (n + batchSize - 1) / batchSize;
    p->remainder_ = cfg.dropRemainder ? 0 : n % batchSize;
    if (p->numBatches_ == 0) {
        return err("pipeline: batch size " + std::to_string(batchSize) +
                   " with drop_remainder leaves no batch of the " + std::to_string(n) + " samples");
    }
    p->xRowElems_ = data.x.size() / n;
    p->yRowElems_ = data.y.size() / n;

    // Map steps: cast/scale/normalize fold into one affine map; one_hot expands the labels.
    for (const MapStep& step : cfg.map) {
        if (step.op == "cast") {
        } else if (step.op == "scale") {
            if (!std::isfinite(step.factor)) return err("map 'scale': factor must be finite");
            p->affine_.scale *= step.factor;
            p->affine_.shift *= step.factor;
        } else if (step.op == "normalize") {
            if (!std::isfinite(step.mean) || !std::isfinite(step.stddev) || step.stddev == 0) {
                return err("map 'normalize': mean must be finite and stddev finite and non-zero");
            }
            p->affine_.scale /= step.stddev;
            p->affine_.shift = (p->affine_.shift - step.mean) / step.stddev;
        } else if (step.op == "one_hot") {
            if (p->oneHotDepth_ != 0) return err("map 'one_hot' appears twice");
            if (data.y.dtype() != DType::I32 || p->yRowElems_ != 1) {
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
            p->oneHotDepth_ = step.depth;
        } else {
            return err("unknown map step '" + step.op +
                       "' (valid steps: cast, scale, normalize, one_hot)");
        }
    }

    // Cache.
    if (cfg.cache.rfind("file:", 0) == 0) {
        p->cachePath_ = cfg.cache.substr(5);
        if (p->cachePath_.empty()) return err("pipeline cache 'file:' needs a path");
        p->cacheLayout_.rows = n;
        p->cacheLayout_.xRowBytes = p->xRowElems_ * static_cast<int64_t>(dtypeSize(data.x.dtype()));
        p->cacheLayout_.yRowBytes = p->yRowElems_ * static_cast<int64_t>(dtypeSize(data.y.dtype()));
        p->cacheLayout_.xType = data.x.dtype();
        p->cacheLayout_.yType = data.y.dtype();
        // Fail now rather than at the first epoch when the file cannot be written.
        TD_RETURN_IF_ERROR(CacheFileWriter::create(p->cachePath_, p->cacheLayout_));
    } else if (cfg.cache != "memory" && cfg.cache != "none") {
        return err("unknown pipeline cache '" + cfg.cache + "' (valid: none, memory, file:<path>)");
    }
    // "none" and "memory" behave alike: the source is an in-memory Dataset, which is the cache.

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
        p->workers_ = cfg.parallelCalls == kAutotune
                          ? std::clamp<int64_t>(schedulableCores() - 1, 1, kAutotuneMaxWorkers)
                          : cfg.parallelCalls;
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
            kPrefetchRamBudgetBytes / std::max<int64_t>(slotBytes, 1) - p->workers_ - 2, 1,
            kAutotunePrefetchCap);
    } else {
        p->prefetchCap_ = cfg.prefetch;
    }
    p->prefetchDepth_ =
        p->autotunePrefetch_ ? std::min(kAutotunePrefetchStart, p->prefetchCap_) : p->prefetchCap_;

    const auto poolSize = static_cast<size_t>(p->prefetchCap_ + p->workers_ + 2);
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
    }
    p->freeSlots_.reserve(poolSize);
    p->slotOfBatch_.assign(poolSize, -1);
    p->slotReady_.assign(poolSize, 0);
    return std::unique_ptr<Pipeline>(std::move(p));
}

Status PipelineImpl::beginEpoch(int epoch) {
    stopWorkers();
    // An unfinished epoch's partial cache file is deleted by the writer's destructor.
    cacheWriter_.reset();
    {
        std::lock_guard lock(mu_);
        nextToStart_ = nextToConsume_ = 0;
        freeSlots_.clear();
        for (int s = static_cast<int>(slots_.size()) - 1; s >= 0; --s) freeSlots_.push_back(s);
        std::fill(slotReady_.begin(), slotReady_.end(), uint8_t{0});
        heldSlot_ = -1;
        cancel_ = false;
        error_.reset();
    }
    epochBegun_ = true;
    epochFinished_ = false;
    // A failed start leaves an epoch whose next() returns the same error.
    auto fail = [this](Error e) -> Status {
        error_ = e;
        return e;
    };

    if (!cachePath_.empty()) {
        if (readingCacheFile_ && !cacheMapping_) {
            auto mapping = CacheFileMapping::open(cachePath_, cacheLayout_);
            if (!mapping.ok()) return fail(std::move(mapping).takeError());
            cacheMapping_ = std::move(mapping).value();
        }
        if (!readingCacheFile_) {
            auto writer = CacheFileWriter::create(cachePath_, cacheLayout_);
            if (!writer.ok()) return fail(std::move(writer).takeError());
            cacheWriter_ = std::move(writer).value();
        }
    }
    srcX_ = cacheMapping_ ? cacheMapping_->x() : static_cast<const uint8_t*>(data_.x.raw());
    srcY_ = cacheMapping_ ? cacheMapping_->y() : static_cast<const uint8_t*>(data_.y.raw());

    if (shuffle_) {
        const uint64_t epochSeed =
            deriveSeed(shuffleSeed_, reshuffle_ ? static_cast<uint64_t>(epoch) : 0);
        shuffleOrder(n_, shuffleBuffer_, epochSeed, order_.data(), shuffleScratch_.data());
    } else {
        for (int64_t i = 0; i < n_; ++i) order_[static_cast<size_t>(i)] = static_cast<int32_t>(i);
    }

    if (async_) {
        try {
            for (int64_t w = 0; w < workers_; ++w) threads_.emplace_back([this] { workerLoop(); });
        } catch (const std::system_error& e) {
            stopWorkers();
            return fail(err(std::string("pipeline: cannot start a worker thread: ") + e.what()));
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

// Forms batch b (rows order_[b*B, b*B + size)) into `slot`; when filling a file cache, also writes
// this batch's share of the source rows. Runs on a worker, or inline in next().
Status PipelineImpl::produce(int64_t b, Slot& slot) {
    if (cacheWriter_) {
        const int64_t begin = b * n_ / numBatches_, end = (b + 1) * n_ / numBatches_;
        TD_RETURN_IF_ERROR(cacheWriter_->writeRows(srcX_, srcY_, begin, end));
    }
    const int64_t first = b * batchSize_;
    const int64_t rows = std::min(batchSize_, n_ - first);
    const int32_t* idx = order_.data() + first;

    // x: gather + convert to f32 [rows, ...]
    const int64_t d = xRowElems_;
    float* x = slot.fullX.data<float>();
    const auto a = static_cast<float>(affine_.scale), c = static_cast<float>(affine_.shift);
    const int64_t rowBytes = d * static_cast<int64_t>(dtypeSize(data_.x.dtype()));
    // Rows past this batch are prefetched too: they start the next batch.
    const int64_t prefetchable = n_ - first;
    auto prefetchAhead = [&](int64_t r) {
        if (r + kPrefetchRowsAhead < prefetchable) {
            prefetchRow(srcX_ + idx[r + kPrefetchRowsAhead] * rowBytes, rowBytes);
        }
    };
    for (int64_t r = 0; r < std::min(kPrefetchRowsAhead, prefetchable); ++r) {
        prefetchRow(srcX_ + idx[r] * rowBytes, rowBytes);
    }
    if (data_.x.dtype() == DType::U8) {
        for (int64_t r = 0; r < rows; ++r) {
            prefetchAhead(r);
            convertRow(srcX_ + idx[r] * d, x + r * d, d, a, c);
        }
    } else {
        const auto* src = reinterpret_cast<const float*>(srcX_);
        const bool copy = affine_.identity();
        for (int64_t r = 0; r < rows; ++r) {
            prefetchAhead(r);
            if (copy) {
                std::memcpy(x + r * d, src + idx[r] * d, static_cast<size_t>(d) * sizeof(float));
            } else {
                convertRow(src + idx[r] * d, x + r * d, d, a, c);
            }
        }
    }

    // y: class ids [rows], one-hot f32 [rows, depth], or f32 targets [rows, k]
    if (oneHotDepth_) {
        const auto* labels = reinterpret_cast<const int32_t*>(srcY_);
        float* y = slot.fullY.data<float>();
        std::memset(y, 0, static_cast<size_t>(rows * oneHotDepth_) * sizeof(float));
        for (int64_t r = 0; r < rows; ++r) y[r * oneHotDepth_ + labels[idx[r]]] = 1.0f;
    } else if (data_.y.dtype() == DType::I32) {
        const auto* labels = reinterpret_cast<const int32_t*>(srcY_);
        int32_t* y = slot.fullY.data<int32_t>();
        for (int64_t r = 0; r < rows; ++r) y[r] = labels[idx[r]];
    } else {
        const auto* targets = reinterpret_cast<const float*>(srcY_);
        const int64_t k = yRowElems_;
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
    return {};
}

void PipelineImpl::workerLoop() {
    const auto poolSize = static_cast<int64_t>(slots_.size());
    std::unique_lock lock(mu_);
    while (true) {
        workCv_.wait(lock, [&] {
            return cancel_ || error_ || nextToStart_ >= numBatches_ ||
                   (nextToStart_ - nextToConsume_ < prefetchDepth_ + workers_ &&
                    !freeSlots_.empty());
        });
        if (cancel_ || error_ || nextToStart_ >= numBatches_) return;
        const int64_t b = nextToStart_++;
        const int s = freeSlots_.back();
        freeSlots_.pop_back();
        slotOfBatch_[static_cast<size_t>(b % poolSize)] = s;
        lock.unlock();

        const auto start = std::chrono::steady_clock::now();
        Status status = produce(b, slots_[static_cast<size_t>(s)]);
        const double seconds =
            std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();

        lock.lock();
        if (!status.ok()) {
            if (!error_) error_ = std::move(status).takeError();
            lock.unlock();
            readyCv_.notify_all();
            workCv_.notify_all();
            return;
        }
        slotReady_[static_cast<size_t>(s)] = 1;
        const double prev = secondsPerBatch_.load(std::memory_order_relaxed);
        secondsPerBatch_.store(prev == 0 ? seconds : 0.9 * prev + 0.1 * seconds,
                               std::memory_order_relaxed);
        if (b == nextToConsume_) readyCv_.notify_one();  // the consumer only waits for this one
    }
}

// At the end of an epoch: join the workers and, when this epoch filled the file cache, commit it.
Status PipelineImpl::finishEpoch() {
    if (epochFinished_) return {};
    epochFinished_ = true;
    stopWorkers();
    if (cacheWriter_) {
        Status s = cacheWriter_->commit();
        cacheWriter_.reset();
        TD_RETURN_IF_ERROR(s);
        readingCacheFile_ = true;
    }
    return {};
}

Result<const Batch*> PipelineImpl::next() {
    TD_ASSERT_MSG(epochBegun_, "Pipeline::next() before beginEpoch()");
    if (!async_) {
        if (error_) return *error_;
        if (nextToConsume_ >= numBatches_) {
            Status s = finishEpoch();
            if (!s.ok()) {
                error_ = std::move(s).takeError();
                return *error_;
            }
            return static_cast<const Batch*>(nullptr);
        }
        Slot& slot = slots_[static_cast<size_t>(syncSlot_)];
        syncSlot_ = (syncSlot_ + 1) % static_cast<int>(slots_.size());
        const auto start = std::chrono::steady_clock::now();
        Status s = produce(nextToConsume_, slot);
        if (!s.ok()) {
            error_ = std::move(s).takeError();
            return *error_;
        }
        const double seconds =
            std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        const double prev = secondsPerBatch_.load(std::memory_order_relaxed);
        secondsPerBatch_.store(prev == 0 ? seconds : 0.9 * prev + 0.1 * seconds,
                               std::memory_order_relaxed);
        ++nextToConsume_;
        return static_cast<const Batch*>(&slot.batch);
    }

    const auto poolSize = static_cast<int64_t>(slots_.size());
    std::unique_lock lock(mu_);
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
        Status s = finishEpoch();
        if (!s.ok()) {
            lock.lock();
            error_ = std::move(s).takeError();
            return *error_;
        }
        return static_cast<const Batch*>(nullptr);
    }
    const int64_t b = nextToConsume_;
    auto ready = [&] {
        return nextToStart_ > b &&
               slotReady_[static_cast<size_t>(slotOfBatch_[static_cast<size_t>(b % poolSize)])] !=
                   0;
    };
    if (!ready()) {
        const int64_t depth = prefetchDepth_.load();
        if (autotunePrefetch_ && b > 0 && depth < prefetchCap_) {
            prefetchDepth_.store(depth + 1);
            workCv_.notify_one();
        }
        readyCv_.wait(lock, [&] { return error_ || ready(); });
        if (error_) return *error_;
    }
    heldSlot_ = slotOfBatch_[static_cast<size_t>(b % poolSize)];
    ++nextToConsume_;
    workCv_.notify_one();
    return static_cast<const Batch*>(&slots_[static_cast<size_t>(heldSlot_)].batch);
}

PipelineStats PipelineImpl::stats() const {
    PipelineStats s;
    s.prefetchDepth = prefetchDepth_.load();
    s.parallelCalls = async_ ? workers_ : 1;
    s.producerSecondsPerBatch = secondsPerBatch_.load(std::memory_order_relaxed);
    s.readingCacheFile = readingCacheFile_.load();
    return s;
}

}  // namespace

Result<std::unique_ptr<Pipeline>> Pipeline::create(const Dataset& data, const PipelineConfig& cfg,
                                                   int64_t batchSize, bool shuffle, uint64_t seed) {
    return PipelineImpl::make(data, cfg, batchSize, shuffle, seed);
}

}  // namespace td

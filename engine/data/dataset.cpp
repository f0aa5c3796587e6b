// Datasets: shape helpers, streamed samples decoded into memory, Keras-style validation split,
// the synthetic source.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <thread>
#include <vector>

#include "engine/data/pipeline.h"
#include "engine/data/random.h"
#include "engine/data/resource_plan.h"

namespace td {

int64_t Dataset::size() const {
    if (reader) return reader->size();
    return x.empty() ? 0 : x.dim(0);
}

Shape Dataset::sampleShape() const {
    if (reader) return reader->sampleShape();
    if (x.empty() || x.rank() == 0) return {};
    return Shape(x.shape().begin() + 1, x.shape().end());
}

DType Dataset::xType() const {
    return reader ? reader->dtype() : x.dtype();
}

namespace {

// An epoch order of a whole source restricted to its samples [first, first + count).
std::vector<int32_t> restrictOrder(const std::vector<int32_t>& order, int64_t first,
                                   int64_t count) {
    if (order.empty()) return {};
    std::vector<int32_t> out;
    out.reserve(static_cast<size_t>(count));
    for (int32_t i : order)
        if (i >= first && i < first + count) out.push_back(static_cast<int32_t>(i - first));
    return out;
}

// Samples [first, first + count) of another reader.
class SliceReader final : public ElementReader {
  public:
    SliceReader(std::shared_ptr<const ElementReader> base, int64_t first, int64_t count)
        : base_(std::move(base)), first_(first), count_(count) {}
    int64_t size() const override { return count_; }
    Shape sampleShape() const override { return base_->sampleShape(); }
    DType dtype() const override { return base_->dtype(); }
    Status read(int64_t i, void* dst) const override { return base_->read(first_ + i, dst); }
    std::string identity() const override {
        return base_->identity() + "[" + std::to_string(first_) + ", +" + std::to_string(count_) +
               ")";
    }
    std::vector<int32_t> epochOrder(uint64_t seed) const override {
        return restrictOrder(base_->epochOrder(seed), first_, count_);
    }

  private:
    std::shared_ptr<const ElementReader> base_;
    int64_t first_, count_;
};

}  // namespace

std::shared_ptr<const ElementReader> sliceReader(std::shared_ptr<const ElementReader> base,
                                                 int64_t first, int64_t count) {
    return std::make_shared<SliceReader>(std::move(base), first, count);
}

Result<Materialized> materialize(const Dataset& d, const std::string& where, bool skipBad,
                                 int64_t threads) {
    if (!d.reader) return Materialized{d, 0, {}};
    const ElementReader& r = *d.reader;
    const int64_t n = r.size();
    const Shape sample = r.sampleShape();
    const int64_t per = numElements(sample);
    const size_t rowBytes = static_cast<size_t>(per) * dtypeSize(r.dtype());
    TD_RETURN_IF_ERROR(checkFileFits(where,
                                     std::to_string(n) + " decoded samples of " +
                                         shapeToString(sample) + " " + dtypeName(r.dtype()) +
                                         " values",
                                     static_cast<double>(n) * static_cast<double>(rowBytes)));
    Shape xShape{n};
    xShape.insert(xShape.end(), sample.begin(), sample.end());
    Tensor x(r.dtype(), xShape);
    auto* base = static_cast<uint8_t*>(x.raw());
    std::vector<std::string> errors(static_cast<size_t>(n));
    std::atomic<int64_t> next{0};
    std::atomic<bool> failed{false};
    auto work = [&] {
        for (int64_t i; (i = next.fetch_add(1)) < n;) {
            if (failed.load(std::memory_order_relaxed)) return;
            Status s = r.read(i, base + static_cast<size_t>(i) * rowBytes);
            if (s.ok()) continue;
            errors[static_cast<size_t>(i)] = s.error();
            if (!skipBad) failed = true;
        }
    };
    if (threads <= 0) threads = hardwareThreads();
    threads = std::clamp<int64_t>(threads, 1, std::max<int64_t>(n, 1));
    std::vector<std::thread> pool;
    for (int64_t t = 1; t < threads; ++t) pool.emplace_back(work);
    work();
    for (std::thread& t : pool) t.join();

    Materialized out;
    std::vector<int64_t> good;
    for (int64_t i = 0; i < n; ++i) {
        const std::string& e = errors[static_cast<size_t>(i)];
        if (e.empty()) {
            good.push_back(i);
        } else if (!skipBad) {
            return err(e);  // the first failing sample in order
        } else if (out.skipped++ == 0) {
            out.firstSkipped = e;
        }
    }
    if (good.empty()) return err(where + ": none of its " + std::to_string(n) + " samples reads");
    out.data = d;
    out.data.reader.reset();
    if (static_cast<int64_t>(good.size()) == n) {
        out.data.x = std::move(x);
        out.data.epochOrder = [reader = d.reader](uint64_t seed) {
            return reader->epochOrder(seed);
        };
        return out;
    }
    const auto m = static_cast<int64_t>(good.size());
    xShape[0] = m;
    out.data.x = Tensor(r.dtype(), xShape);
    Shape yShape = d.y.shape();
    yShape[0] = m;
    out.data.y = Tensor(d.y.dtype(), yShape);
    const size_t yRow =
        static_cast<size_t>(d.y.size() / std::max<int64_t>(n, 1)) * dtypeSize(d.y.dtype());
    for (int64_t j = 0; j < m; ++j) {
        const auto src = static_cast<size_t>(good[static_cast<size_t>(j)]);
        std::memcpy(static_cast<uint8_t*>(out.data.x.raw()) + static_cast<size_t>(j) * rowBytes,
                    base + src * rowBytes, rowBytes);
        std::memcpy(static_cast<uint8_t*>(out.data.y.raw()) + static_cast<size_t>(j) * yRow,
                    static_cast<const uint8_t*>(d.y.raw()) + src * yRow, yRow);
    }
    return out;
}

std::pair<Dataset, Dataset> splitTail(const Dataset& d, double fraction) {
    // Keras: split_at = int(n * (1 - validation_split)); fractions outside [0, 1] are clamped
    // (validating the user's value is the project loader's job).
    fraction = std::clamp(fraction, 0.0, 1.0);
    const int64_t n = d.size();
    const auto splitAt = static_cast<int64_t>(static_cast<double>(n) * (1.0 - fraction));
    Dataset head = d, tail = d;
    if (n == 0) return {head, tail};
    if (d.reader) {
        head.reader = sliceReader(d.reader, 0, splitAt);
        tail.reader = sliceReader(d.reader, splitAt, n - splitAt);
    } else {
        head.x = d.x.slice(0, splitAt);
        tail.x = d.x.slice(splitAt, n);
    }
    if (d.epochOrder) {
        head.epochOrder = [f = d.epochOrder, splitAt](uint64_t seed) {
            return restrictOrder(f(seed), 0, splitAt);
        };
        tail.epochOrder = [f = d.epochOrder, splitAt, n](uint64_t seed) {
            return restrictOrder(f(seed), splitAt, n - splitAt);
        };
    }
    head.y = d.y.slice(0, splitAt);
    tail.y = d.y.slice(splitAt, n);
    return {head, tail};
}

Dataset makeSynthetic(int64_t samples, const Shape& sampleShape, int64_t classes, uint64_t seed) {
    TD_ASSERT(samples >= 0 && classes >= 1 && numElements(sampleShape) > 0);
    const int64_t dims = numElements(sampleShape);
    // Class centroids ~ N(0, 1) per dimension; a sample is its centroid plus N(0, 1) noise, so the
    // class means are about sqrt(2 * dims) noise standard deviations apart: a small MLP learns it.
    std::vector<float> centroids(static_cast<size_t>(classes * dims));
    Rng centroidRng(deriveSeed(seed, ~0ull));
    for (float& c : centroids) c = static_cast<float>(centroidRng.normal());

    Shape xShape{samples};
    xShape.insert(xShape.end(), sampleShape.begin(), sampleShape.end());
    Dataset d;
    d.x = Tensor(DType::F32, xShape);
    d.y = Tensor(DType::I32, {samples});
    d.numClasses = classes;
    float* x = d.x.data<float>();
    int32_t* y = d.y.data<int32_t>();
    for (int64_t i = 0; i < samples; ++i) {
        // One stream per sample: sample i does not depend on how many samples are drawn.
        Rng rng(deriveSeed(seed, static_cast<uint64_t>(i)));
        const auto label = static_cast<int64_t>(rng.uniform(static_cast<uint64_t>(classes)));
        y[i] = static_cast<int32_t>(label);
        const float* centroid = centroids.data() + label * dims;
        float* row = x + i * dims;
        for (int64_t k = 0; k < dims; ++k) row[k] = centroid[k] + static_cast<float>(rng.normal());
    }
    return d;
}

}  // namespace td

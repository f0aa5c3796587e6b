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
    bool hasEncoded() const override { return base_->hasEncoded(); }
    Result<std::vector<int64_t>> encodedSizes() const override {
        TD_ASSIGN_OR_RETURN(std::vector<int64_t> all, base_->encodedSizes());
        return std::vector<int64_t>(all.begin() + first_, all.begin() + first_ + count_);
    }
    Status readEncoded(int64_t i, std::vector<uint8_t>& out) const override {
        return base_->readEncoded(first_ + i, out);
    }
    Status decode(int64_t i, const uint8_t* bytes, size_t size, void* dst) const override {
        return base_->decode(first_ + i, bytes, size, dst);
    }
    std::string elementName(int64_t i) const override { return base_->elementName(first_ + i); }

  private:
    std::shared_ptr<const ElementReader> base_;
    int64_t first_, count_;
};

// An epoch order of a whole source without some of its samples: `newIndex` maps a sample to its
// index among those kept, or -1.
std::vector<int32_t> keepInOrder(const std::vector<int32_t>& order,
                                 const std::vector<int32_t>& newIndex) {
    if (order.empty()) return {};
    std::vector<int32_t> out;
    out.reserve(order.size());
    for (int32_t i : order)
        if (const int32_t k = newIndex[static_cast<size_t>(i)]; k >= 0) out.push_back(k);
    return out;
}

std::vector<int32_t> newIndexOf(const std::vector<int64_t>& kept, int64_t n) {
    std::vector<int32_t> newIndex(static_cast<size_t>(n), -1);
    for (size_t k = 0; k < kept.size(); ++k)
        newIndex[static_cast<size_t>(kept[k])] = static_cast<int32_t>(k);
    return newIndex;
}

// The samples `kept` of another reader (subsetReader).
class SubsetReader final : public ElementReader {
  public:
    SubsetReader(std::shared_ptr<const ElementReader> base, std::vector<int64_t> kept)
        : base_(std::move(base)),
          kept_(std::move(kept)),
          newIndex_(newIndexOf(kept_, base_->size())) {}
    int64_t size() const override { return static_cast<int64_t>(kept_.size()); }
    Shape sampleShape() const override { return base_->sampleShape(); }
    DType dtype() const override { return base_->dtype(); }
    Status read(int64_t i, void* dst) const override { return base_->read(at(i), dst); }
    std::string identity() const override {
        std::string id = base_->identity() + " leaving out";
        for (size_t i = 0; i < newIndex_.size(); ++i)
            if (newIndex_[i] < 0) id += " " + std::to_string(i);
        return id;
    }
    std::vector<int32_t> epochOrder(uint64_t seed) const override {
        return keepInOrder(base_->epochOrder(seed), newIndex_);
    }
    bool hasEncoded() const override { return base_->hasEncoded(); }
    Result<std::vector<int64_t>> encodedSizes() const override {
        TD_ASSIGN_OR_RETURN(std::vector<int64_t> all, base_->encodedSizes());
        std::vector<int64_t> out;
        out.reserve(kept_.size());
        for (int64_t k : kept_) out.push_back(all[static_cast<size_t>(k)]);
        return out;
    }
    Status readEncoded(int64_t i, std::vector<uint8_t>& out) const override {
        return base_->readEncoded(at(i), out);
    }
    Status decode(int64_t i, const uint8_t* bytes, size_t size, void* dst) const override {
        return base_->decode(at(i), bytes, size, dst);
    }
    std::string elementName(int64_t i) const override { return base_->elementName(at(i)); }

  private:
    int64_t at(int64_t i) const { return kept_[static_cast<size_t>(i)]; }
    std::shared_ptr<const ElementReader> base_;
    std::vector<int64_t> kept_;
    std::vector<int32_t> newIndex_;
};

// Reads every sample of `r` into `rowAt(i)` (a row of its own, or one scratch row per thread),
// `threads` at a time; each sample's error, or "" (all of them with `keepGoing`; otherwise the
// reading stops at the first error, and later samples may be left unread).
template <class RowAt>
std::vector<std::string> readAll(const ElementReader& r, int64_t threads, bool keepGoing,
                                 RowAt rowAt) {
    const int64_t n = r.size();
    std::vector<std::string> errors(static_cast<size_t>(n));
    std::atomic<int64_t> next{0};
    std::atomic<bool> failed{false};
    auto work = [&] {
        std::vector<uint8_t> scratch;
        for (int64_t i; (i = next.fetch_add(1)) < n;) {
            if (failed.load(std::memory_order_relaxed)) return;
            Status s = r.read(i, rowAt(i, scratch));
            if (s.ok()) continue;
            errors[static_cast<size_t>(i)] = s.error();
            if (!keepGoing) failed = true;
        }
    };
    if (threads <= 0) threads = hardwareThreads();
    threads = std::clamp<int64_t>(threads, 1, std::max<int64_t>(n, 1));
    std::vector<std::thread> pool;
    for (int64_t t = 1; t < threads; ++t) pool.emplace_back(work);
    work();
    for (std::thread& t : pool) t.join();
    return errors;
}

// The samples whose read succeeded, and the count and first errors of the others.
std::vector<int64_t> keptSamples(const std::vector<std::string>& errors, Materialized& out) {
    std::vector<int64_t> good;
    for (size_t i = 0; i < errors.size(); ++i) {
        if (errors[i].empty()) {
            good.push_back(static_cast<int64_t>(i));
        } else {
            if (out.skippedErrors.size() < kNamedSkips) out.skippedErrors.push_back(errors[i]);
            ++out.skipped;
        }
    }
    return good;
}

// The label rows `good` of y.
Tensor keepRows(const Tensor& y, const std::vector<int64_t>& good) {
    const int64_t n = y.empty() ? 0 : y.dim(0);
    Shape shape = y.shape();
    shape[0] = static_cast<int64_t>(good.size());
    Tensor out(y.dtype(), shape);
    const size_t row =
        static_cast<size_t>(y.size() / std::max<int64_t>(n, 1)) * dtypeSize(y.dtype());
    for (size_t j = 0; j < good.size(); ++j)
        std::memcpy(static_cast<uint8_t*>(out.raw()) + j * row,
                    static_cast<const uint8_t*>(y.raw()) + static_cast<size_t>(good[j]) * row, row);
    return out;
}

}  // namespace

namespace {
Error noEncoded() {
    return err(
        "this source has no encoded elements to cache (a cache before \"decode\" needs an "
        "image_directory or tfrecord source)");
}
}  // namespace

Result<std::vector<int64_t>> ElementReader::encodedSizes() const {
    return noEncoded();
}

Status ElementReader::readEncoded(int64_t, std::vector<uint8_t>&) const {
    return noEncoded();
}

Status ElementReader::decode(int64_t, const uint8_t*, size_t, void*) const {
    return noEncoded();
}

std::shared_ptr<const ElementReader> sliceReader(std::shared_ptr<const ElementReader> base,
                                                 int64_t first, int64_t count) {
    return std::make_shared<SliceReader>(std::move(base), first, count);
}

std::shared_ptr<const ElementReader> subsetReader(std::shared_ptr<const ElementReader> base,
                                                  std::vector<int64_t> kept) {
    return std::make_shared<SubsetReader>(std::move(base), std::move(kept));
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
    const std::vector<std::string> errors = readAll(
        r, threads, skipBad,
        [&](int64_t i, std::vector<uint8_t>&) { return base + static_cast<size_t>(i) * rowBytes; });
    if (!skipBad)
        for (const std::string& e : errors)
            if (!e.empty()) return err(e);  // the first failing sample in order
    Materialized out;
    const std::vector<int64_t> good = keptSamples(errors, out);
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
    for (int64_t j = 0; j < m; ++j)
        std::memcpy(static_cast<uint8_t*>(out.data.x.raw()) + static_cast<size_t>(j) * rowBytes,
                    base + static_cast<size_t>(good[static_cast<size_t>(j)]) * rowBytes, rowBytes);
    out.data.y = keepRows(d.y, good);
    out.data.epochOrder = [reader = d.reader, newIndex = newIndexOf(good, n)](uint64_t seed) {
        return keepInOrder(reader->epochOrder(seed), newIndex);
    };
    return out;
}

Result<Materialized> dropUnreadable(const Dataset& d, const std::string& where, int64_t threads) {
    if (!d.reader) return Materialized{d, 0, {}};
    const ElementReader& r = *d.reader;
    const int64_t n = r.size();
    const size_t rowBytes = static_cast<size_t>(d.sampleValues()) * dtypeSize(r.dtype());
    const std::vector<std::string> errors =
        readAll(r, threads, true, [&](int64_t, std::vector<uint8_t>& scratch) {
            scratch.resize(rowBytes);
            return static_cast<void*>(scratch.data());
        });
    Materialized out;
    std::vector<int64_t> good = keptSamples(errors, out);
    if (good.empty()) return err(where + ": none of its " + std::to_string(n) + " samples reads");
    out.data = d;
    if (out.skipped == 0) return out;
    out.data.y = keepRows(d.y, good);
    out.data.reader = subsetReader(d.reader, std::move(good));
    return out;
}

std::string skippedNote(const std::string& field, const Materialized& m, int64_t of,
                        const std::string& what) {
    std::string note = field + ": left out " + std::to_string(m.skipped) + " of " +
                       std::to_string(of) + " " + what;
    if (m.skipped == 0) return note + " (every one reads)";
    for (size_t k = 0; k < m.skippedErrors.size(); ++k)
        note += (k == 0 ? ": " : "; ") + m.skippedErrors[k];
    if (m.skipped > static_cast<int64_t>(m.skippedErrors.size()))
        note += "; and " +
                std::to_string(m.skipped - static_cast<int64_t>(m.skippedErrors.size())) + " more";
    return note;
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

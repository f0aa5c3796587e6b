#include "engine/api/data_preview.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <map>

#include "engine/data/pipeline.h"

namespace td::api {
namespace {

// Class id of sample i: i32 labels as they are, f32 rows (one-hot or targets) by argmax.
int labelOf(const Dataset& d, int64_t i) {
    if (d.y.empty()) return -1;
    if (d.y.dtype() == DType::I32 && d.y.rank() == 1) return d.y.data<int32_t>()[i];
    if (d.y.dtype() == DType::F32 && d.y.rank() == 2) {
        const int64_t k = d.y.dim(1);
        const float* p = d.y.data<float>() + i * k;
        return static_cast<int>(std::max_element(p, p + k) - p);
    }
    return -1;
}

// Sample i's n values as f32 (read from a streamed dataset's files).
Result<std::vector<float>> sampleValues(const Dataset& d, int64_t i, int64_t n) {
    std::vector<float> v(static_cast<size_t>(n));
    if (d.reader) {
        std::vector<uint8_t> raw(static_cast<size_t>(n) * dtypeSize(d.xType()));
        TD_RETURN_IF_ERROR(d.reader->read(i, raw.data()));
        if (d.xType() == DType::U8)
            std::copy(raw.begin(), raw.end(), v.begin());
        else
            std::memcpy(v.data(), raw.data(), raw.size());
    } else if (d.x.dtype() == DType::U8) {
        const uint8_t* p = d.x.data<uint8_t>() + i * n;
        std::copy(p, p + n, v.begin());
    } else {
        const Tensor xf = d.x.dtype() == DType::F32 ? d.x : d.x.slice(i, i + 1).to(DType::F32);
        const float* p = xf.data<float>() + (d.x.dtype() == DType::F32 ? i * n : 0);
        std::copy(p, p + n, v.begin());
    }
    return v;
}

// 0..255 pixels of sample i (n values).
Result<std::vector<uint8_t>> samplePixels(const Dataset& d, int64_t i, int64_t n) {
    std::vector<uint8_t> px(static_cast<size_t>(n));
    if (d.xType() == DType::U8 && !d.reader) {
        const uint8_t* p = d.x.data<uint8_t>() + i * n;
        std::copy(p, p + n, px.begin());
    } else {
        TD_ASSIGN_OR_RETURN(std::vector<float> v, sampleValues(d, i, n));
        const float* p = v.data();
        const float lo = *std::min_element(p, p + n), hi = *std::max_element(p, p + n);
        const float scale = hi > lo ? 255.f / (hi - lo) : 0.f;
        for (int64_t k = 0; k < n; ++k)
            px[static_cast<size_t>(k)] = static_cast<uint8_t>((p[k] - lo) * scale);
    }
    return px;
}

std::string count(int64_t n) {
    return n == kAutotune ? std::string("AUTOTUNE") : std::to_string(n);
}

std::string number(double v) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%g", v);
    return buf;
}

std::string mapStepText(const MapStep& s) {
    if (s.op == "scale") return "scale ×" + number(s.factor);
    if (s.op == "normalize") return "normalize (x − " + number(s.mean) + ") / " + number(s.stddev);
    if (s.op == "one_hot") return "one_hot " + std::to_string(s.depth);
    return s.op;
}

std::string joinSteps(const std::vector<MapStep>& steps) {
    std::string out;
    for (const MapStep& s : steps) out += (out.empty() ? "" : ", ") + mapStepText(s);
    return out;
}

}  // namespace

std::string DataPreview::className(int label) const {
    if (label >= 0 && label < static_cast<int>(classNames.size()))
        return classNames[static_cast<size_t>(label)];
    return std::to_string(label);
}

Result<DataPreview> previewData(const SourceConfig& source, int maxSamples, int maxFeatures) {
    // Streamed: only the samples shown are decoded.
    TD_ASSIGN_OR_RETURN(DataSplits splits, loadSource(source, /*stream=*/true));
    const Dataset& d = splits.train;
    DataPreview p;
    p.trainSamples = d.size();
    p.testSamples = splits.test ? splits.test->size() : 0;
    p.sampleShape = d.sampleShape();
    p.dtype = dtypeName(d.xType());
    p.numClasses = d.numClasses;
    p.classNames = d.classNames;

    const int64_t n = d.size();
    const int64_t shown = std::clamp<int64_t>(maxSamples, 0, n);
    const int64_t perSample = n > 0 ? d.sampleValues() : 0;
    for (int64_t i = 0; i < shown; ++i) p.labels.push_back(labelOf(d, i));

    const Shape& s = p.sampleShape;
    const bool pictures = (s.size() == 2 || s.size() == 3) && s[0] >= 4 && s[1] >= 4 &&
                          (s.size() == 2 || s[2] == 1 || s[2] == 3) &&
                          (d.xType() == DType::U8 || d.xType() == DType::F32);
    if (pictures) {
        p.imageHeight = static_cast<int>(s[0]);
        p.imageWidth = static_cast<int>(s[1]);
        p.imageChannels = s.size() == 3 ? static_cast<int>(s[2]) : 1;
        for (int64_t i = 0; i < shown; ++i) {
            TD_ASSIGN_OR_RETURN(std::vector<uint8_t> px, samplePixels(d, i, perSample));
            p.pixels.push_back(std::move(px));
        }
    } else if (shown > 0) {
        const int64_t features = std::clamp<int64_t>(maxFeatures, 0, perSample);
        for (int64_t i = 0; i < shown; ++i) {
            TD_ASSIGN_OR_RETURN(std::vector<float> row, sampleValues(d, i, perSample));
            row.resize(static_cast<size_t>(features));
            p.features.push_back(std::move(row));
        }
    }

    std::map<int, int64_t> counts;
    for (int64_t i = 0; i < n; ++i) ++counts[labelOf(d, i)];
    p.classCounts.assign(counts.begin(), counts.end());
    return p;
}

std::string describePipeline(const DataConfig& data, int64_t batchSize) {
    const PipelineConfig& c = data.pipeline;
    // Map steps before a "cache" step fill the cache; the rest (all, without one) run per batch.
    std::vector<MapStep> pre, post;
    const bool hasCacheStep =
        std::any_of(c.map.begin(), c.map.end(), [](const MapStep& s) { return s.op == "cache"; });
    bool afterCache = !hasCacheStep;
    for (const MapStep& s : c.map) {
        if (s.op == "cache") {
            afterCache = true;
        } else if (s.op != "decode") {
            (afterCache ? post : pre).push_back(s);
        }
    }

    std::vector<std::string> stages{data.source.type};
    const std::string workers =
        c.parallelCalls == 1 ? std::string("1 worker") : count(c.parallelCalls) + " workers";
    // Image and record sources: decoded at load for a memory cache, else by the map workers as
    // batches read them (each epoch, or the first one when a file cache keeps them decoded). A
    // cache before the "decode" step keeps the encoded files or records, decoded every epoch.
    const bool files = data.source.type == "image_directory" || data.source.type == "tfrecord";
    const bool decodes = data.source.type == "image_directory" ||
                         (data.source.type == "tfrecord" && data.source.records.xDecode == "image");
    const bool encodedCache = files && cachesEncoded(c);
    const std::string decodeStage = decodes ? "decode + resize" : "parse records";
    if (decodes && !encodedCache && c.cache == "memory") {
        stages.back() += " (decoded at load, every core)";
    } else if (decodes && !encodedCache) {
        stages.push_back(decodeStage + " (" + workers +
                         (c.cache == "none" ? ", every epoch)" : ", first epoch)"));
    }
    if (!pre.empty()) stages.push_back("map " + joinSteps(pre));
    if (c.cache != "none")
        stages.push_back(
            "cache (" + (c.cache.rfind("file:", 0) == 0 ? "file " + c.cache.substr(5) : c.cache) +
            (encodedCache
                 ? (data.source.type == "tfrecord" ? ", encoded records" : ", encoded files")
                 : "") +
            ")");
    if (c.shuffleBuffer > 0)
        stages.push_back("shuffle (buffer " + std::to_string(c.shuffleBuffer) +
                         (c.reshuffleEachIteration ? ", each epoch)" : ", once)"));
    stages.push_back("batch " + std::to_string(batchSize) +
                     (c.dropRemainder ? " (drop remainder)" : ""));
    if (encodedCache) stages.push_back(decodeStage + " (" + workers + ", every epoch)");
    if (!post.empty()) stages.push_back("map " + joinSteps(post) + " (" + workers + ")");
    if (c.prefetch != 0) stages.push_back("prefetch (" + count(c.prefetch) + ")");

    std::string out;
    for (const std::string& s : stages) out += (out.empty() ? "" : " → ") + s;
    if (data.validationData == "test") {
        out += "; validation on the test split";
    } else if (data.validationSplit > 0) {
        out += "; validation on the last " + number(100.0 * data.validationSplit) +
               "% of the training samples";
    }
    return out;
}

std::string fashionMnistDirectory() {
    return fashionMnistDir();
}

}  // namespace td::api

// loadSource: dispatch on SourceConfig::type and normalise what the readers return into the
// Dataset contract (x u8/f32 [N, ...]; y i32 class ids [N] or f32 targets [N, k]).
#include <sys/stat.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "engine/data/decode_cache.h"
#include "engine/data/image_folder.h"
#include "engine/data/pipeline.h"
#include "engine/data/resource_plan.h"
#include "engine/data/sources.h"
#include "engine/data/tfrecord_source.h"

namespace td {
namespace {

constexpr const char* kFashionMnistDir = "/usr/share/datasets/fashion-mnist";
constexpr const char* kFashionMnistDirEnv = "TRAINDECK_FASHION_MNIST_DIR";

bool fileExists(const std::string& path) {
    struct stat st {};
    return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

// Features: u8 and f32 stay, i32 becomes f32; a rank-1 x becomes [N, 1].
Result<Tensor> normaliseFeatures(Tensor x, const std::string& file) {
    if (x.rank() == 0) return err(file + ": features must have a leading sample dimension");
    if (x.dtype() == DType::I32) x = x.to(DType::F32);
    if (x.dtype() != DType::U8 && x.dtype() != DType::F32) {
        return err(file + ": unsupported feature dtype " + dtypeName(x.dtype()));
    }
    if (x.rank() == 1) x = x.reshaped({x.dim(0), 1});
    return x;
}

// Labels: integer [N] or [N, 1] -> i32 class ids [N] (must be >= 0); f32 -> f32 [N, k].
Result<Tensor> normaliseLabels(Tensor y, const std::string& file) {
    if (y.rank() == 0) return err(file + ": labels must have a leading sample dimension");
    const int64_t n = y.dim(0);
    const int64_t perSample = n ? y.size() / n : 1;
    if (y.dtype() == DType::U8 || y.dtype() == DType::I32) {
        if (perSample != 1)
            return err(file +
                       ": integer labels must be class ids of shape [N] or "
                       "[N, 1], found " +
                       shapeToString(y.shape()));
        if (y.dtype() == DType::U8) y = y.to(DType::I32);
        y = y.reshaped({n});
        const int32_t* p = y.data<int32_t>();
        for (int64_t i = 0; i < n; ++i) {
            if (p[i] < 0) {
                return err(file + ": label " + std::to_string(p[i]) + " of sample " +
                           std::to_string(i) + " is negative; integer labels are class ids " +
                           "0..K-1 (store regression targets as floats)");
            }
        }
        return y;
    }
    if (y.dtype() == DType::F32) return y.reshaped({n, perSample});
    return err(file + ": unsupported label dtype " + dtypeName(y.dtype()));
}

int64_t maxLabelPlusOne(const Tensor& y) {
    if (y.dtype() != DType::I32) return 0;
    const int32_t* p = y.data<int32_t>();
    int32_t m = -1;
    for (int64_t i = 0; i < y.size(); ++i) m = std::max(m, p[i]);
    return int64_t{m} + 1;
}

// Builds a Dataset from separately loaded x and y, checking that their sample counts agree.
Result<Dataset> makeDataset(Tensor x, const std::string& xFile, Tensor y,
                            const std::string& yFile) {
    Dataset d;
    TD_ASSIGN_OR_RETURN(d.x, normaliseFeatures(std::move(x), xFile));
    TD_ASSIGN_OR_RETURN(d.y, normaliseLabels(std::move(y), yFile));
    if (d.x.dim(0) != d.y.dim(0)) {
        return err(xFile + " has " + std::to_string(d.x.dim(0)) + " samples but " + yFile +
                   " has " + std::to_string(d.y.dim(0)) + " labels");
    }
    if (d.x.dim(0) == 0) return err(xFile + ": no samples");
    return d;
}

// Marks the samples of an f32 array [N, ...] that hold a NaN or an infinity (a float64 beyond the
// f32 range reads as one), or with `drop` false returns an error naming the first: its sample,
// its feature (flat within the sample) and its flat index in the file.
Status findNonFinite(const Tensor& t, const std::string& file, bool drop,
                     std::vector<uint8_t>& badSample) {
    if (t.dtype() != DType::F32 || t.rank() == 0 || t.dim(0) == 0) return Status::success();
    const int64_t n = t.dim(0), perSample = t.size() / n;
    const float* p = t.data<float>();
    for (int64_t i = 0; i < t.size(); ++i) {
        if (std::isfinite(p[i])) continue;
        const int64_t sample = i / perSample;
        if (drop) {
            badSample[static_cast<size_t>(sample)] = 1;
            i = (sample + 1) * perSample - 1;  // the rest of this sample does not matter
            continue;
        }
        return err(file + ": sample " + std::to_string(sample) + ", feature " +
                   std::to_string(i % perSample) + " (flat index " + std::to_string(i) +
                   "): value " +
                   (std::isnan(p[i]) ? "nan"
                    : p[i] > 0       ? "inf"
                                     : "-inf") +
                   " is not a finite float32 (a NaN, an infinity, or a float64 beyond the float32 "
                   "range); set data.source.non_finite to \"drop_rows\" to leave such samples "
                   "out");
    }
    return Status::success();
}

// The samples of t whose mark is 0, in order.
Tensor keepSamples(const Tensor& t, const std::vector<uint8_t>& badSample, int64_t kept) {
    Shape shape = t.shape();
    shape[0] = kept;
    Tensor out(t.dtype(), shape);
    const int64_t n = t.dim(0);
    const size_t rowBytes = t.bytes() / static_cast<size_t>(n);
    const auto* src = static_cast<const unsigned char*>(t.raw());
    auto* dst = static_cast<unsigned char*>(out.raw());
    for (int64_t i = 0; i < n; ++i) {
        if (badSample[static_cast<size_t>(i)]) continue;
        std::memcpy(dst, src + static_cast<size_t>(i) * rowBytes, rowBytes);
        dst += rowBytes;
    }
    return out;
}

// NaN or infinite features or float labels: refused (naming file, sample and feature) or, with
// DropRows, left out together with their other half.
Result<Dataset> applyNonFinitePolicy(Dataset d, const std::string& xFile, const std::string& yFile,
                                     NonFinitePolicy policy) {
    const bool drop = policy == NonFinitePolicy::DropRows;
    std::vector<uint8_t> bad(drop ? static_cast<size_t>(d.size()) : 0, 0);
    TD_RETURN_IF_ERROR(findNonFinite(d.x, xFile, drop, bad));
    TD_RETURN_IF_ERROR(findNonFinite(d.y, yFile, drop, bad));
    if (!drop) return d;
    const auto dropped = static_cast<int64_t>(std::count(bad.begin(), bad.end(), uint8_t{1}));
    if (dropped == 0) return d;
    const int64_t kept = d.size() - dropped;
    if (kept == 0)
        return err(xFile + ": every one of the " + std::to_string(dropped) +
                   " samples holds a NaN or infinite value (non_finite \"drop_rows\" left none)");
    d.x = keepSamples(d.x, bad, kept);
    d.y = keepSamples(d.y, bad, kept);
    return d;
}

// A file reader; `notes` collects lines for the run's log (from the decoded-source cache).
using ArrayReader = Result<Tensor> (*)(const std::string&, std::vector<std::string>* notes);

Result<Tensor> readNpyFile(const std::string& path, std::vector<std::string>*) {
    return readNpy(path);
}

Result<Dataset> loadPair(ArrayReader read, const std::string& xFile, const std::string& yFile,
                         NonFinitePolicy nonFinite, std::vector<std::string>& notes) {
    TD_ASSIGN_OR_RETURN(Tensor x, read(xFile, &notes));
    TD_ASSIGN_OR_RETURN(Tensor y, read(yFile, &notes));
    TD_ASSIGN_OR_RETURN(Dataset d, makeDataset(std::move(x), xFile, std::move(y), yFile));
    return applyNonFinitePolicy(std::move(d), xFile, yFile, nonFinite);
}

// Shared tail of every source: the test split must match the training samples' shape; numClasses
// covers the labels of both splits.
Result<DataSplits> finish(Dataset train, std::optional<Dataset> test, const std::string& what) {
    if (test) {
        if (test->sampleShape() != train.sampleShape()) {
            return err(what + ": test samples have shape " + shapeToString(test->sampleShape()) +
                       " but training samples " + shapeToString(train.sampleShape()));
        }
        if (test->y.dtype() != train.y.dtype() ||
            (test->y.dtype() == DType::F32 && test->y.dim(1) != train.y.dim(1))) {
            return err(what + ": test labels (" + dtypeName(test->y.dtype()) + " " +
                       shapeToString(test->y.shape()) + ") do not match the training labels (" +
                       dtypeName(train.y.dtype()) + " " + shapeToString(train.y.shape()) + ")");
        }
    }
    if (train.y.dtype() == DType::I32 && train.numClasses == 0) {
        train.numClasses = maxLabelPlusOne(train.y);
        if (test) train.numClasses = std::max(train.numClasses, maxLabelPlusOne(test->y));
    }
    if (test) {
        test->numClasses = train.numClasses;
        test->classNames = train.classNames;
    }
    return DataSplits{std::move(train), std::move(test)};
}

}  // namespace

std::string fashionMnistDir() {
    const char* env = std::getenv(kFashionMnistDirEnv);
    return env && *env ? env : kFashionMnistDir;
}

namespace {

Result<DataSplits> loadFashionMnist() {
    const char* env = std::getenv(kFashionMnistDirEnv);
    const std::string dir = fashionMnistDir();
    const std::string trainX = dir + "/train-images-idx3-ubyte.gz";
    const std::string trainY = dir + "/train-labels-idx1-ubyte.gz";
    const std::string testX = dir + "/t10k-images-idx3-ubyte.gz";
    const std::string testY = dir + "/t10k-labels-idx1-ubyte.gz";
    for (const std::string& f : {trainX, trainY, testX, testY}) {
        if (!fileExists(f)) {
            return err("Fashion-MNIST not found: " + f +
                       " is missing. Install the Debian package dataset-fashion-mnist "
                       "(sudo apt-get install dataset-fashion-mnist)" +
                       (env && *env ? std::string(" or fix ") + kFashionMnistDirEnv
                                    : std::string(" or point ") + kFashionMnistDirEnv +
                                          " at a folder holding the four files"));
        }
    }
    // u8 images: never a NaN. The .gz files go through the decoded-source cache.
    std::vector<std::string> notes;
    TD_ASSIGN_OR_RETURN(Dataset train,
                        loadPair(&readIdxCached, trainX, trainY, NonFinitePolicy::Error, notes));
    TD_ASSIGN_OR_RETURN(Dataset test,
                        loadPair(&readIdxCached, testX, testY, NonFinitePolicy::Error, notes));
    for (const auto& [d, file] : {std::pair{&train, trainX}, std::pair{&test, testX}}) {
        if (d->x.dtype() != DType::U8 || d->sampleShape() != Shape{28, 28}) {
            return err(file + ": expected u8 images of 28x28, found " + dtypeName(d->x.dtype()) +
                       " " + shapeToString(d->x.shape()));
        }
    }
    train.numClasses = 10;
    train.classNames = {"T-shirt/top", "Trouser", "Pullover", "Dress", "Coat",
                        "Sandal",      "Shirt",   "Sneaker",  "Bag",   "Ankle boot"};
    for (const auto& [y, file] : {std::pair{&train.y, trainY}, std::pair{&test.y, testY}}) {
        if (maxLabelPlusOne(*y) > 10) return err(file + ": labels must be 0..9");
    }
    TD_ASSIGN_OR_RETURN(DataSplits splits,
                        finish(std::move(train), std::move(test), "fashion_mnist"));
    splits.notes = std::move(notes);
    return splits;
}

// idx / npy: the train pair is required; the test pair is optional (both paths empty = none).
Result<DataSplits> loadArrays(const SourceConfig& cfg, ArrayReader read) {
    if (cfg.trainImages.empty() || cfg.trainLabels.empty()) {
        return err("data source '" + cfg.type + "' needs trainImages and trainLabels paths");
    }
    std::vector<std::string> notes;
    TD_ASSIGN_OR_RETURN(Dataset train,
                        loadPair(read, cfg.trainImages, cfg.trainLabels, cfg.nonFinite, notes));
    std::optional<Dataset> test;
    if (!cfg.testImages.empty() || !cfg.testLabels.empty()) {
        if (cfg.testImages.empty() || cfg.testLabels.empty()) {
            return err("data source '" + cfg.type +
                       "': give both testImages and testLabels, or neither");
        }
        TD_ASSIGN_OR_RETURN(test,
                            loadPair(read, cfg.testImages, cfg.testLabels, cfg.nonFinite, notes));
    }
    TD_ASSIGN_OR_RETURN(DataSplits splits,
                        finish(std::move(train), std::move(test), cfg.trainImages));
    splits.notes = std::move(notes);
    return splits;
}

Result<Dataset> loadCsvDataset(const std::string& path, const std::string& labelColumn,
                               NonFinitePolicy nonFinite) {
    TD_ASSIGN_OR_RETURN(CsvData csv, readCsv(path, labelColumn, nonFinite));
    return makeDataset(std::move(csv.x), path, std::move(csv.y), path);
}

Result<DataSplits> loadCsv(const SourceConfig& cfg) {
    if (cfg.trainPath.empty()) return err("data source 'csv' needs a trainPath");
    TD_ASSIGN_OR_RETURN(Dataset train,
                        loadCsvDataset(cfg.trainPath, cfg.labelColumn, cfg.nonFinite));
    std::optional<Dataset> test;
    if (!cfg.testPath.empty()) {
        TD_ASSIGN_OR_RETURN(test, loadCsvDataset(cfg.testPath, cfg.labelColumn, cfg.nonFinite));
    }
    return finish(std::move(train), std::move(test), cfg.trainPath);
}

Result<DataSplits> loadSynthetic(const SourceConfig& cfg) {
    if (cfg.samples <= 0) return err("synthetic data: samples must be > 0");
    if (cfg.testSamples < 0) return err("synthetic data: testSamples must be >= 0");
    if (cfg.classes < 2) return err("synthetic data: classes must be >= 2");
    if (cfg.classes > std::numeric_limits<int32_t>::max())
        return err("synthetic data: " + std::to_string(cfg.classes) +
                   " classes do not fit 32-bit class ids");
    if (cfg.samples > std::numeric_limits<int32_t>::max() - cfg.testSamples)
        return err("synthetic data: " + std::to_string(cfg.samples) + " + " +
                   std::to_string(cfg.testSamples) + " samples exceed the 2^31-1 supported");
    if (cfg.sampleShape.empty())
        return err("synthetic data: sampleShape [] must have at least one dimension");
    int64_t values = 1;
    for (int64_t d : cfg.sampleShape) {
        if (d <= 0 || d > (int64_t{1} << 40) / values)
            return err("synthetic data: sampleShape " + shapeToString(cfg.sampleShape) +
                       (d <= 0 ? " must have positive dimensions" : " exceeds 2^40 values"));
        values *= d;
    }
    // Field names as in the project's data.source, which callers put in front of the error.
    MemoryPlan plan;
    planSource(cfg, "", plan);
    if (Status fits = plan.check(); !fits.ok()) return err("synthetic data: " + fits.error());
    // One draw for both splits so they share the class centroids; the first `samples` rows do not
    // depend on testSamples.
    const Dataset all =
        makeSynthetic(cfg.samples + cfg.testSamples, cfg.sampleShape, cfg.classes, cfg.seed);
    Dataset train = all, test = all;
    train.x = all.x.slice(0, cfg.samples);
    train.y = all.y.slice(0, cfg.samples);
    std::optional<Dataset> testSplit;
    if (cfg.testSamples > 0) {
        test.x = all.x.slice(cfg.samples, all.size());
        test.y = all.y.slice(cfg.samples, all.size());
        testSplit = std::move(test);
    }
    return finish(std::move(train), std::move(testSplit), "synthetic");
}

}  // namespace

Status checkLabelsFit(const SourceConfig& cfg, const DataSplits& splits, int64_t units) {
    const auto check = [&](const Dataset& d, const std::string& where) -> Status {
        // Float labels straight from the source: the loss takes class ids, which no map step
        // makes of floats (one_hot goes the other way).
        if (d.y.dtype() == DType::F32 && d.y.size() > 0) {
            const float v = d.y.data<float>()[0];
            return err(where + ": the labels are floating-point (" + dtypeName(d.y.dtype()) + " " +
                       shapeToString(d.y.shape()) + ", the first is " + std::to_string(v) +
                       "), but the loss expects integer class ids 0.." + std::to_string(units - 1) +
                       ": store them as integers (NumPy: y.astype('int32')), or train with a "
                       "loss for float targets (categorical_crossentropy with one-hot rows, "
                       "binary_crossentropy, mean_squared_error)");
        }
        if (d.y.dtype() != DType::I32) return Status::success();
        const int32_t* y = d.y.data<int32_t>();
        for (int64_t i = 0; i < d.y.size(); ++i) {
            if (y[i] >= 0 && y[i] < units) continue;
            return err(where + ": sample " + std::to_string(i) + " has label " +
                       std::to_string(y[i]) + ": the data has " +
                       std::to_string(splits.train.numClasses) +
                       " classes but the last layer has " + std::to_string(units) +
                       " units (class ids 0.." + std::to_string(units - 1) + ")");
        }
        return Status::success();
    };
    std::string trainWhere = cfg.type + " training labels", testWhere = cfg.type + " test labels";
    if (cfg.type == "idx" || cfg.type == "npy") {
        trainWhere = cfg.trainLabels;
        testWhere = cfg.testLabels;
    } else if (cfg.type == "csv") {
        trainWhere = cfg.trainPath + " (column '" + cfg.labelColumn + "')";
        testWhere = cfg.testPath + " (column '" + cfg.labelColumn + "')";
    }
    TD_RETURN_IF_ERROR(check(splits.train, trainWhere));
    if (splits.test) TD_RETURN_IF_ERROR(check(*splits.test, testWhere));
    return Status::success();
}

Result<DataSplits> loadSource(const SourceConfig& cfg, bool stream) {
    if (cfg.type == "fashion_mnist") return loadFashionMnist();
    // gzip-compressed IDX files go through the decoded-source cache (decode_cache.h).
    if (cfg.type == "idx") return loadArrays(cfg, &readIdxCached);
    if (cfg.type == "npy") return loadArrays(cfg, &readNpyFile);
    if (cfg.type == "csv") return loadCsv(cfg);
    if (cfg.type == "synthetic") return loadSynthetic(cfg);
    if (cfg.type == "image_directory") return loadImageDirectory(cfg.images, stream);
    if (cfg.type == "tfrecord") return loadTfRecords(cfg.records, stream);
    return err("unknown data source type '" + cfg.type +
               "' (valid types: fashion_mnist, idx, npy, csv, synthetic, image_directory, "
               "tfrecord)");
}

}  // namespace td

// loadSource: dispatch on SourceConfig::type and normalise what the readers return into the
// Dataset contract (x u8/f32 [N, ...]; y i32 class ids [N] or f32 targets [N, k]).
#include <sys/stat.h>

#include <algorithm>
#include <cstdlib>
#include <string>

#include "engine/data/pipeline.h"

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

using ArrayReader = Result<Tensor> (*)(const std::string&);

Result<Dataset> loadPair(ArrayReader read, const std::string& xFile, const std::string& yFile) {
    TD_ASSIGN_OR_RETURN(Tensor x, read(xFile));
    TD_ASSIGN_OR_RETURN(Tensor y, read(yFile));
    return makeDataset(std::move(x), xFile, std::move(y), yFile);
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

Result<DataSplits> loadFashionMnist() {
    const char* env = std::getenv(kFashionMnistDirEnv);
    const std::string dir = env && *env ? env : kFashionMnistDir;
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
    TD_ASSIGN_OR_RETURN(Dataset train, loadPair(&readIdx, trainX, trainY));
    TD_ASSIGN_OR_RETURN(Dataset test, loadPair(&readIdx, testX, testY));
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
    return finish(std::move(train), std::move(test), "fashion_mnist");
}

// idx / npy: the train pair is required; the test pair is optional (both paths empty = none).
Result<DataSplits> loadArrays(const SourceConfig& cfg, ArrayReader read) {
    if (cfg.trainImages.empty() || cfg.trainLabels.empty()) {
        return err("data source '" + cfg.type + "' needs trainImages and trainLabels paths");
    }
    TD_ASSIGN_OR_RETURN(Dataset train, loadPair(read, cfg.trainImages, cfg.trainLabels));
    std::optional<Dataset> test;
    if (!cfg.testImages.empty() || !cfg.testLabels.empty()) {
        if (cfg.testImages.empty() || cfg.testLabels.empty()) {
            return err("data source '" + cfg.type +
                       "': give both testImages and testLabels, or neither");
        }
        TD_ASSIGN_OR_RETURN(test, loadPair(read, cfg.testImages, cfg.testLabels));
    }
    return finish(std::move(train), std::move(test), cfg.trainImages);
}

Result<Dataset> loadCsvDataset(const std::string& path, const std::string& labelColumn) {
    TD_ASSIGN_OR_RETURN(CsvData csv, readCsv(path, labelColumn));
    return makeDataset(std::move(csv.x), path, std::move(csv.y), path);
}

Result<DataSplits> loadCsv(const SourceConfig& cfg) {
    if (cfg.trainPath.empty()) return err("data source 'csv' needs a trainPath");
    TD_ASSIGN_OR_RETURN(Dataset train, loadCsvDataset(cfg.trainPath, cfg.labelColumn));
    std::optional<Dataset> test;
    if (!cfg.testPath.empty()) {
        TD_ASSIGN_OR_RETURN(test, loadCsvDataset(cfg.testPath, cfg.labelColumn));
    }
    return finish(std::move(train), std::move(test), cfg.trainPath);
}

Result<DataSplits> loadSynthetic(const SourceConfig& cfg) {
    if (cfg.samples <= 0) return err("synthetic data: samples must be > 0");
    if (cfg.testSamples < 0) return err("synthetic data: testSamples must be >= 0");
    if (cfg.classes < 2) return err("synthetic data: classes must be >= 2");
    if (cfg.sampleShape.empty() || numElements(cfg.sampleShape) <= 0 ||
        std::any_of(cfg.sampleShape.begin(), cfg.sampleShape.end(),
                    [](int64_t d) { return d <= 0; })) {
        return err("synthetic data: sampleShape " + shapeToString(cfg.sampleShape) +
                   " must have positive dimensions");
    }
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

Result<DataSplits> loadSource(const SourceConfig& cfg) {
    if (cfg.type == "fashion_mnist") return loadFashionMnist();
    if (cfg.type == "idx") return loadArrays(cfg, &readIdx);
    if (cfg.type == "npy") return loadArrays(cfg, &readNpy);
    if (cfg.type == "csv") return loadCsv(cfg);
    if (cfg.type == "synthetic") return loadSynthetic(cfg);
    return err("unknown data source type '" + cfg.type +
               "' (valid types: fashion_mnist, idx, npy, csv, synthetic)");
}

}  // namespace td

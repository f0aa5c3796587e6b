// Strategies through the public Session API: Mirrored with 2 and 4 CPU replicas equals one device
// with the same global batch (losses at every step and final weights, dropout and L2 on, and
// with augmentation layers in the training step); the
// step loop reads nothing back from a device between log points; a global batch that does not
// split evenly is refused; a replica that fails mid-run ends the run with its error, no hang.
#include <QtTest>

#include <atomic>
#include <chrono>
#include <cmath>
#include <regex>

#include "engine/api/session.h"
#include "engine/backend/backend.h"
#include "engine/train/callbacks.h"

using namespace td;

namespace {

// Blobs, a model with dropout and an L2 penalty, plain Adam: every part of the step that must
// stay equal across replica counts.
Project blobs(const std::string& strategyJson, int64_t batch = 64, int epochs = 2,
              int64_t samples = 1024) {
    const std::string text = R"({
  "format": "traindeck-project", "version": 1, "name": "strategies",
  "model": {"class_name": "Sequential", "config": {"name": "m", "layers": [
    {"class_name": "InputLayer", "config": {"batch_shape": [null, 16]}},
    {"class_name": "Dense", "config": {"units": 48, "activation": "relu",
      "kernel_regularizer": {"class_name": "L2", "config": {"l2": 0.001}}}},
    {"class_name": "Dropout", "config": {"rate": 0.25}},
    {"class_name": "Dense", "config": {"units": 24, "activation": "tanh"}},
    {"class_name": "Dense", "config": {"units": 4, "activation": "softmax"}}]}},
  "data": {"source": {"type": "synthetic", "samples": )" +
                             std::to_string(samples) +
                             R"(, "test_samples": 128, "shape": [16],
                      "classes": 4, "seed": 3},
           "pipeline": {"map": [], "cache": "memory", "shuffle_buffer": 1024, "prefetch": 2}},
  "training": {"epochs": )" + std::to_string(epochs) +
                             R"(, "batch_size": )" + std::to_string(batch) + R"(, "seed": 7,
    "optimizer": {"class_name": "Adam", "config": {"learning_rate": 0.01}},
    "loss": {"class_name": "SparseCategoricalCrossentropy", "config": {"from_logits": false}},
    "metrics": ["accuracy"], "log_every_steps": 1, "evaluate_test": false},
  "strategy": )" + strategyJson +
                             "}";
    auto p = parseProject(text, "strategies.json");
    if (!p.ok()) qFatal("%s", p.error().c_str());
    return std::move(p).value();
}

// Images [8, 8, 1] through RandomFlip, RandomTranslation and RandomContrast (each sample's draw
// keyed by the step and its global index), then a small MLP. `augment` false: the same model
// without the three layers.
Project augmentedImages(const std::string& strategyJson, bool augment = true) {
    const std::string layers = augment ? R"(
    {"class_name": "RandomFlip", "config": {"mode": "horizontal_and_vertical", "seed": 5}},
    {"class_name": "RandomTranslation", "config": {"height_factor": 0.2, "width_factor": 0.2,
                                                   "fill_mode": "reflect"}},
    {"class_name": "RandomContrast", "config": {"factor": 0.3, "value_range": [-10, 10]}},)"
                                       : "";
    const std::string text = R"({
  "format": "traindeck-project", "version": 1, "name": "augmented strategies",
  "model": {"class_name": "Sequential", "config": {"name": "m", "layers": [
    {"class_name": "InputLayer", "config": {"batch_shape": [null, 8, 8, 1]}},)" +
                             layers + R"(
    {"class_name": "Flatten", "config": {}},
    {"class_name": "Dense", "config": {"units": 24, "activation": "relu"}},
    {"class_name": "Dense", "config": {"units": 4, "activation": "softmax"}}]}},
  "data": {"source": {"type": "synthetic", "samples": 1024, "test_samples": 128,
                      "shape": [8, 8, 1], "classes": 4, "seed": 3},
           "pipeline": {"map": [], "cache": "memory", "shuffle_buffer": 1024, "prefetch": 2}},
  "training": {"epochs": 2, "batch_size": 64, "seed": 7,
    "optimizer": {"class_name": "Adam", "config": {"learning_rate": 0.01}},
    "metrics": ["accuracy"], "log_every_steps": 1, "evaluate_test": false},
  "strategy": )" + strategyJson +
                             "}";
    auto p = parseProject(text, "augmented.json");
    if (!p.ok()) qFatal("%s", p.error().c_str());
    return std::move(p).value();
}

// A CNN in mixed_bfloat16 on the synthetic [8,8,1] images: Conv2D(8, 3x3 same, relu) (sums of 9
// terms: f32) -> Conv2D(8, 3x3, relu) (72 terms: bf16 where the CPU has bf16 convolutions) ->
// Flatten -> Dense(4, softmax).
Project bf16Cnn(const std::string& strategyJson) {
    const std::string text = R"({
  "format": "traindeck-project", "version": 1, "name": "bf16 cnn strategies",
  "model": {"class_name": "Sequential", "config": {"name": "m", "layers": [
    {"class_name": "InputLayer", "config": {"batch_shape": [null, 8, 8, 1]}},
    {"class_name": "Conv2D", "config": {"filters": 8, "kernel_size": [3, 3], "padding": "same",
                                        "activation": "relu"}},
    {"class_name": "Conv2D", "config": {"filters": 8, "kernel_size": [3, 3], "activation": "relu"}},
    {"class_name": "Flatten", "config": {}},
    {"class_name": "Dense", "config": {"units": 4, "activation": "softmax"}}]}},
  "data": {"source": {"type": "synthetic", "samples": 1024, "test_samples": 128,
                      "shape": [8, 8, 1], "classes": 4, "seed": 3},
           "pipeline": {"map": [], "cache": "memory", "shuffle_buffer": 1024, "prefetch": 2}},
  "training": {"epochs": 2, "batch_size": 64, "seed": 7,
    "optimizer": {"class_name": "Adam", "config": {"learning_rate": 0.001}},
    "metrics": ["accuracy"], "log_every_steps": 1, "evaluate_test": false},
  "precision": "mixed_bfloat16",
  "strategy": )" + strategyJson +
                             "}";
    auto p = parseProject(text, "bf16cnn.json");
    if (!p.ok()) qFatal("%s", p.error().c_str());
    return std::move(p).value();
}

// Records the final weights through a callback, as a user's callback would.
class WeightsAtEnd : public Callback {
  public:
    void onTrainEnd(TrainControl& c) override { weights = c.getWeights(); }
    bool wantsBatchLogs() const override { return false; }
    std::vector<Tensor> weights;
};

struct Outcome {
    Status status = Status::success();
    std::vector<double> stepLoss;  // running epoch mean after every step
    std::vector<double> stepAccuracy;
    std::vector<Tensor> weights;
    std::vector<StepMetrics> steps;
    std::vector<std::string> devices;
    std::vector<std::string> logs;
};

Outcome train(const Project& p, SessionOptions o = {}) {
    auto w = std::make_shared<WeightsAtEnd>();
    o.callbacks.push_back(w);
    Outcome out;
    auto s = Session::create(p, o);
    if (!s.ok()) {
        out.status = err(s.error());
        return out;
    }
    auto q = s.value()->events().subscribe();
    out.status = s.value()->fit();
    for (const Event& e : q->drain()) {
        if (auto* m = std::get_if<StepMetrics>(&e)) {
            out.stepLoss.push_back(m->metrics.at("loss"));
            out.stepAccuracy.push_back(m->metrics.at("accuracy"));
            out.steps.push_back(*m);
        }
        if (auto* r = std::get_if<RunStarted>(&e)) out.devices = r->devices;
        if (auto* l = std::get_if<LogLine>(&e)) out.logs.push_back(l->text);
    }
    out.weights = w->weights;
    return out;
}

double maxRelDiff(const std::vector<double>& a, const std::vector<double>& b) {
    double m = 0;
    for (size_t i = 0; i < a.size() && i < b.size(); ++i)
        m = std::max(m, std::abs(a[i] - b[i]) / std::max(1e-6, std::abs(b[i])));
    return m;
}

// A CPU device that counts every read of device memory by the host, and can make one replica's
// programs fail after a number of runs.
std::atomic<int> hostReads{0};

class CountingExecutable final : public Executable {
  public:
    CountingExecutable(std::unique_ptr<Executable> inner, int failAfter)
        : inner_(std::move(inner)), failAfter_(failAfter) {}
    Status run(const StepArgs& a) override {
        if (failAfter_ >= 0 && runs_++ >= failAfter_)
            return err("replica device failed on purpose at step " + std::to_string(a.step));
        return inner_->run(a);
    }
    const void* valuePtr(int id) const override { return inner_->valuePtr(id); }
    size_t arenaBytes() const override { return inner_->arenaBytes(); }

  private:
    std::unique_ptr<Executable> inner_;
    int failAfter_;
    int runs_ = 0;
};

std::atomic<int> hostAllocations{0}, eventsRecorded{0}, eventsWaited{0};

class CountingDevice final : public Device {
  public:
    CountingDevice(std::unique_ptr<Device> inner, int failAfter, bool hostAddressable = true)
        : inner_(std::move(inner)), failAfter_(failAfter), hostAddressable_(hostAddressable) {}
    const DeviceDesc& desc() const override { return inner_->desc(); }
    Result<Buffer> allocate(size_t n) override { return inner_->allocate(n); }
    void release(Buffer& b) override { inner_->release(b); }
    Result<Buffer> allocateHost(size_t n) override {
        ++hostAllocations;
        return inner_->allocateHost(n);
    }
    void releaseHost(Buffer& b) override { inner_->releaseHost(b); }
    Status copyToDevice(const Buffer& d, size_t o, const void* s, size_t n) override {
        return inner_->copyToDevice(d, o, s, n);
    }
    Status copyToHost(void* d, const Buffer& s, size_t o, size_t n) override {
        ++hostReads;
        return inner_->copyToHost(d, s, o, n);
    }
    Status copyToDeviceAsync(const Buffer& d, size_t o, const void* s, size_t n) override {
        return inner_->copyToDeviceAsync(d, o, s, n);
    }
    Status copyToHostAsync(void* d, const Buffer& s, size_t o, size_t n) override {
        ++hostReads;
        return inner_->copyToHostAsync(d, s, o, n);
    }
    Status fillZero(const Buffer& d, size_t o, size_t n) override {
        return inner_->fillZero(d, o, n);
    }
    Support supportsOp(const Graph& g, const Node& n) const override {
        return inner_->supportsOp(g, n);
    }
    bool halfConvolutions(DType compute) const override {
        return inner_->halfConvolutions(compute);
    }
    Result<std::unique_ptr<Executable>> compile(const LoweredProgram& p,
                                                const ProgramBindings& b) override {
        TD_ASSIGN_OR_RETURN(auto exe, inner_->compile(p, b));
        return std::unique_ptr<Executable>(new CountingExecutable(std::move(exe), failAfter_));
    }
    Status synchronize() override { return inner_->synchronize(); }
    Result<int64_t> recordEvent() override {
        ++eventsRecorded;
        return inner_->recordEvent();
    }
    Status waitEvent(int64_t e) override {
        ++eventsWaited;
        return inner_->waitEvent(e);
    }
    HostThreads* hostThreads() override { return inner_->hostThreads(); }
    // False: the trainer must stage batches in host buffers and copy them, as for a GPU.
    bool hostAddressable() const override { return hostAddressable_ && inner_->hostAddressable(); }

  private:
    std::unique_ptr<Device> inner_;
    int failAfter_;
    bool hostAddressable_;
};

// Opens counting CPU devices; the device opened `failIndex`-th (0-based) fails after
// `failAfter` runs.
decltype(SessionOptions::openDevice) countingOpener(int failIndex = -1, int failAfter = -1,
                                                    bool hostAddressable = true) {
    auto opened = std::make_shared<std::atomic<int>>(0);
    return [=](const std::string&, int threads) -> Result<std::unique_ptr<Device>> {
        const int index = (*opened)++;
        return std::unique_ptr<Device>(new CountingDevice(
            makeCpuDevice(threads), index == failIndex ? failAfter : -1, hostAddressable));
    };
}

}  // namespace

class TestStrategies : public QObject {
    Q_OBJECT
  private slots:
    // BatchNormalization with replicas: each normalizes with its own rows' statistics, and the
    // moving statistics are averaged over the replicas after every step. With the layer on the
    // input features (which no weight changes), the moving mean of 2 replicas is then the one
    // device's moving mean over the same global batches; without the averaging it would follow
    // replica 0's half of every batch.
    void mirroredBatchNormMovingMean() {
        auto withBatchNorm = [](Project p) {
            LayerSpec bn;
            bn.type = LayerType::BatchNormalization;
            bn.name = "batch_normalization";
            bn.momentum = 0.5;  // moves far in 32 steps
            p.model.layers.insert(p.model.layers.begin() + 1, bn);
            return p;
        };
        const Outcome one = train(withBatchNorm(blobs(R"({"type": "one_device"})")));
        QVERIFY2(one.status.ok(), one.status.error().c_str());
        const Outcome two = train(withBatchNorm(blobs(R"({"type": "mirrored", "replicas": 2})")));
        QVERIFY2(two.status.ok(), two.status.error().c_str());
        QCOMPARE(two.weights.size(), one.weights.size());
        // gamma, beta, moving_mean, moving_variance, then the Dense layers.
        const Tensor& mean1 = one.weights.at(2);
        const Tensor& mean2 = two.weights.at(2);
        QCOMPARE(mean1.size(), int64_t(16));
        double moved = 0;
        for (int64_t k = 0; k < 16; ++k) {
            const float a = mean1.data<float>()[k], b = mean2.data<float>()[k];
            moved += std::abs(a);
            QVERIFY2(std::abs(a - b) <= 1e-5f + 1e-4f * std::abs(a),
                     qPrintable(QString("moving_mean[%1]: %2 vs %3").arg(k).arg(a).arg(b)));
        }
        QVERIFY(moved > 0.1);  // it did move away from its zeros
        // The variance is not the same (the replicas' variances are about their own means),
        // but it moved from its ones and stays positive.
        for (int64_t k = 0; k < 16; ++k) {
            QVERIFY(two.weights.at(3).data<float>()[k] > 0.f);
            QVERIFY(two.weights.at(3).data<float>()[k] != 1.f);
        }
        QVERIFY(two.stepLoss.back() < two.stepLoss.front());
    }

    void mirroredEqualsOneDevice_data() {
        QTest::addColumn<int>("replicas");
        QTest::newRow("2 replicas") << 2;
        QTest::newRow("4 replicas") << 4;
    }
    void mirroredEqualsOneDevice() {
        QFETCH(int, replicas);
        const Outcome one = train(blobs(R"({"type": "one_device"})"));
        QVERIFY2(one.status.ok(), one.status.error().c_str());
        const Outcome many =
            train(blobs(R"({"type": "mirrored", "replicas": )" + std::to_string(replicas) + "}"));
        QVERIFY2(many.status.ok(), many.status.error().c_str());
        QCOMPARE(many.devices.size(), size_t(replicas));
        QCOMPARE(many.stepLoss.size(), one.stepLoss.size());
        QCOMPARE(one.stepLoss.size(), size_t(2 * 16));
        // Equal to float tolerance: only the order of the gradient sums differs.
        QVERIFY2(maxRelDiff(many.stepLoss, one.stepLoss) < 1e-4,
                 qPrintable(QString::number(maxRelDiff(many.stepLoss, one.stepLoss))));
        // A prediction exactly at a tie could flip: at most one sample per step.
        for (size_t i = 0; i < one.stepAccuracy.size(); ++i)
            QVERIFY(std::abs(many.stepAccuracy[i] - one.stepAccuracy[i]) <= 1.0 / 64 + 1e-12);
        QCOMPARE(many.weights.size(), one.weights.size());
        for (size_t i = 0; i < one.weights.size(); ++i) {
            const float* a = one.weights[i].data<float>();
            const float* b = many.weights[i].data<float>();
            for (int64_t k = 0; k < one.weights[i].size(); ++k)
                QVERIFY2(std::abs(a[k] - b[k]) <= 1e-4f + 1e-3f * std::abs(a[k]),
                         qPrintable(
                             QString("weight %1[%2]: %3 vs %4").arg(i).arg(k).arg(a[k]).arg(b[k])));
        }
        // Every replica reports its own figures.
        const StepMetrics& last = many.steps.back();
        QCOMPARE(last.replicas.size(), size_t(replicas));
        for (int r = 0; r < replicas; ++r) {
            QCOMPARE(last.replicas[r].replica, r);
            QVERIFY(last.replicas[r].samplesPerSecond > 0);
            QVERIFY(last.replicas[r].computeSeconds > 0);
            QVERIFY(last.replicas[r].allReduceSeconds > 0);
        }
    }

    // Augmentation inside the step: each sample's flip, shift and contrast are keyed by the step
    // and its global index, so 2 and 4 replicas draw exactly what one device draws for the same
    // global batch (losses and weights as above), and the draws do change the run.
    void mirroredWithAugmentationEqualsOneDevice_data() {
        QTest::addColumn<int>("replicas");
        QTest::newRow("2 replicas") << 2;
        QTest::newRow("4 replicas") << 4;
    }
    void mirroredWithAugmentationEqualsOneDevice() {
        QFETCH(int, replicas);
        const Outcome one = train(augmentedImages(R"({"type": "one_device"})"));
        QVERIFY2(one.status.ok(), one.status.error().c_str());
        const Outcome many = train(augmentedImages(R"({"type": "mirrored", "replicas": )" +
                                                   std::to_string(replicas) + "}"));
        QVERIFY2(many.status.ok(), many.status.error().c_str());
        QCOMPARE(many.devices.size(), size_t(replicas));
        QCOMPARE(one.stepLoss.size(), size_t(2 * 16));
        QCOMPARE(many.stepLoss.size(), one.stepLoss.size());
        QVERIFY2(maxRelDiff(many.stepLoss, one.stepLoss) < 1e-4,
                 qPrintable(QString::number(maxRelDiff(many.stepLoss, one.stepLoss))));
        QCOMPARE(many.weights.size(), one.weights.size());
        for (size_t i = 0; i < one.weights.size(); ++i) {
            const float* a = one.weights[i].data<float>();
            const float* b = many.weights[i].data<float>();
            for (int64_t k = 0; k < one.weights[i].size(); ++k)
                QVERIFY2(std::abs(a[k] - b[k]) <= 1e-4f + 1e-3f * std::abs(a[k]),
                         qPrintable(
                             QString("weight %1[%2]: %3 vs %4").arg(i).arg(k).arg(a[k]).arg(b[k])));
        }
        const Outcome plain = train(augmentedImages(R"({"type": "one_device"})", false));
        QVERIFY2(plain.status.ok(), plain.status.error().c_str());
        QCOMPARE(plain.stepLoss.size(), one.stepLoss.size());
        QVERIFY2(maxRelDiff(plain.stepLoss, one.stepLoss) > 1e-3,
                 "the augmentation layers did not change the run");
    }

    // Mixed precision's bf16 convolutions: 2 replicas (each a half batch through the same bf16
    // convolutions, the dy cast per replica) equal one device, as in float32 (the order of the
    // f32 gradient sums is all that differs). The program did compute a convolution in bf16.
    void mirroredBf16ConvolutionsEqualOneDevice() {
        if (!cpuHalfConvolutions(DType::BF16))
            QSKIP("this CPU has no native bf16 convolution (AVX512-BF16 or AMX-BF16)");
        const Outcome one = train(bf16Cnn(R"({"type": "one_device"})"));
        QVERIFY2(one.status.ok(), one.status.error().c_str());
        const Outcome two = train(bf16Cnn(R"({"type": "mirrored", "replicas": 2})"));
        QVERIFY2(two.status.ok(), two.status.error().c_str());
        QCOMPARE(two.devices.size(), size_t(2));
        QCOMPARE(one.stepLoss.size(), size_t(2 * 16));
        QCOMPARE(two.stepLoss.size(), one.stepLoss.size());
        QVERIFY2(maxRelDiff(two.stepLoss, one.stepLoss) < 1e-4,
                 qPrintable(QString::number(maxRelDiff(two.stepLoss, one.stepLoss))));
        QCOMPARE(two.weights.size(), one.weights.size());
        for (size_t i = 0; i < one.weights.size(); ++i) {
            const float* a = one.weights[i].data<float>();
            const float* b = two.weights[i].data<float>();
            for (int64_t k = 0; k < one.weights[i].size(); ++k)
                QVERIFY2(std::abs(a[k] - b[k]) <= 1e-4f + 1e-3f * std::abs(a[k]),
                         qPrintable(
                             QString("weight %1[%2]: %3 vs %4").arg(i).arg(k).arg(a[k]).arg(b[k])));
        }
        QVERIFY(two.stepLoss.back() < two.stepLoss.front());
        // The second convolution's kernel is read through its bf16 copy.
        auto s = Session::create(bf16Cnn(R"({"type": "one_device"})"), SessionOptions{});
        QVERIFY2(s.ok(), s.ok() ? "" : s.error().c_str());
        auto ir = (*s)->dumpIr("forward");
        QVERIFY2(ir.ok(), ir.ok() ? "" : ir.error().c_str());
        QVERIFY2(ir->find("bf16[3,3,8,8]") != std::string::npos, ir->c_str());
        QVERIFY2(ir->find("bf16[3,3,1,8]") == std::string::npos, ir->c_str());
    }

    // The step loop reads device memory only at log points: one read of each replica's
    // accumulators per log point, nothing in between.
    void noHostReadsBetweenLogPoints_data() {
        QTest::addColumn<int>("replicas");
        QTest::addColumn<int>("logEvery");
        QTest::newRow("one device, every 5 steps") << 1 << 5;
        QTest::newRow("one device, every 100 steps") << 1 << 100;
        QTest::newRow("2 replicas, every 4 steps") << 2 << 4;
    }
    void noHostReadsBetweenLogPoints() {
        QFETCH(int, replicas);
        QFETCH(int, logEvery);
        Project p =
            replicas == 1
                ? blobs(R"({"type": "one_device"})")
                : blobs(R"({"type": "mirrored", "replicas": )" + std::to_string(replicas) + "}");
        p.training.logEverySteps = logEvery;
        p.training.epochs = 3;
        SessionOptions o;
        o.openDevice = countingOpener();
        auto s = Session::create(p, o);
        QVERIFY2(s.ok(), s.ok() ? "" : s.error().c_str());
        hostReads = 0;
        auto q = s.value()->events().subscribe();
        QVERIFY(s.value()->fit().ok());
        const int steps = 1024 / 64;
        const int logPoints = 3 * ((steps + logEvery - 1) / logEvery);
        QCOMPARE(hostReads.load(), logPoints * replicas);
        int published = 0;
        for (const Event& e : q->drain()) published += std::holds_alternative<StepMetrics>(e);
        QCOMPARE(published, logPoints);
    }

    // A device the host cannot address gets its batches through two pinned staging buffers,
    // reused only after the stream passed the marker of their last copy: the same results.
    void stagedUploadsEqualDirectOnes_data() {
        QTest::addColumn<int>("replicas");
        QTest::newRow("one device") << 1;
        QTest::newRow("2 replicas") << 2;
    }
    void stagedUploadsEqualDirectOnes() {
        QFETCH(int, replicas);
        const std::string strategy =
            replicas == 1 ? R"({"type": "one_device"})"
                          : R"({"type": "mirrored", "replicas": )" + std::to_string(replicas) + "}";
        const Outcome direct = train(blobs(strategy));
        QVERIFY2(direct.status.ok(), direct.status.error().c_str());
        SessionOptions o;
        o.openDevice = countingOpener(-1, -1, false);
        hostAllocations = eventsRecorded = eventsWaited = 0;
        const Outcome staged = train(blobs(strategy), o);
        QVERIFY2(staged.status.ok(), staged.status.error().c_str());
        QCOMPARE(staged.stepLoss, direct.stepLoss);
        QCOMPARE(hostAllocations.load(), 2 * replicas);  // two per replica, before the loop
        const int uploads = 2 * 16 * replicas;           // 2 epochs of 16 steps
        QCOMPARE(eventsRecorded.load(), uploads);
        QCOMPARE(eventsWaited.load(), uploads - 2 * replicas);  // all but each buffer's first
    }

    // Mirrored with `replicas` over the GPUs listed: two replicas on one GPU (a machine with one
    // GPU proves the multi-replica paths so), opened as two devices of that id; a count that does
    // not spread evenly is refused naming both. Here the "GPU" is a CPU device the host cannot
    // address, opened under the GPU's id: two replicas on it equal one device, and since it is
    // no CUDA device the sums go through host memory, which the run's log says.
    void gpuReplicasSpreadOverTheListedGpus() {
        auto ids = std::make_shared<std::vector<std::string>>();
        SessionOptions o;
        o.openDevice = [ids](const std::string& id,
                             int threads) -> Result<std::unique_ptr<Device>> {
            ids->push_back(id);
            return std::unique_ptr<Device>(new CountingDevice(makeCpuDevice(threads), -1, false));
        };
        const Outcome one = train(blobs(R"({"type": "one_device"})"));
        QVERIFY2(one.status.ok(), one.status.error().c_str());
        const Outcome two =
            train(blobs(R"({"type": "mirrored", "devices": ["cuda:0"], "replicas": 2})"), o);
        QVERIFY2(two.status.ok(), two.status.error().c_str());
        QCOMPARE(*ids, (std::vector<std::string>{"cuda:0", "cuda:0"}));
        QCOMPARE(two.devices.size(), size_t(2));
        QCOMPARE(two.stepLoss.size(), one.stepLoss.size());
        QVERIFY2(maxRelDiff(two.stepLoss, one.stepLoss) < 1e-4,
                 qPrintable(QString::number(maxRelDiff(two.stepLoss, one.stepLoss))));
        QVERIFY2(std::any_of(two.logs.begin(), two.logs.end(),
                             [](const std::string& l) {
                                 return l.find("go through host memory") != std::string::npos;
                             }),
                 "no note of the host-memory sums");
        ids->clear();
        const Outcome three = train(
            blobs(R"({"type": "mirrored", "devices": ["cuda:0", "cuda:1"], "replicas": 3})"), o);
        QVERIFY(!three.status.ok());
        QVERIFY2(three.status.error().find("strategy.replicas: 3 replicas do not spread evenly "
                                           "over the 2 GPUs") != std::string::npos,
                 three.status.error().c_str());
        QVERIFY(ids->empty());
    }

    // An epoch's short last batch: split unevenly when every replica gets a sample (and then
    // still equal to one device), skipped with a warning when not.
    void shortLastBatch() {
        // 1030 samples: a last batch of 6 over 4 replicas (1, 2, 1, 2 rows).
        const Outcome one = train(blobs(R"({"type": "one_device"})", 64, 2, 1030));
        const Outcome four = train(blobs(R"({"type": "mirrored", "replicas": 4})", 64, 2, 1030));
        QVERIFY2(one.status.ok(), one.status.error().c_str());
        QVERIFY2(four.status.ok(), four.status.error().c_str());
        QCOMPARE(four.stepLoss.size(), size_t(2 * 17));
        QCOMPARE(four.stepLoss.size(), one.stepLoss.size());
        QVERIFY(maxRelDiff(four.stepLoss, one.stepLoss) < 1e-4);
        // 1026 samples: a last batch of 2 cannot feed 4 replicas; each epoch skips it.
        SessionOptions o;
        auto w = std::make_shared<WeightsAtEnd>();
        o.callbacks.push_back(w);
        auto s = Session::create(blobs(R"({"type": "mirrored", "replicas": 4})", 64, 2, 1026), o);
        QVERIFY2(s.ok(), s.ok() ? "" : s.error().c_str());
        auto q = s.value()->events().subscribe();
        QVERIFY(s.value()->fit().ok());
        int steps = 0;
        bool warned = false;
        int64_t announced = 0;
        for (const Event& e : q->drain()) {
            steps += std::holds_alternative<StepMetrics>(e);
            if (auto* r = std::get_if<RunStarted>(&e)) announced = r->stepsPerEpoch;
            if (auto* l = std::get_if<LogLine>(&e))
                warned =
                    warned || l->text.find("last batch of each epoch (2 samples) is skipped") !=
                                  std::string::npos;
        }
        QCOMPARE(announced, int64_t(16));
        QCOMPARE(steps, 2 * 16);
        QVERIFY(warned);
    }

    // A stop between log points (here from a callback after step 3, logging every 100 steps):
    // the epoch's metrics still cover every step that ran.
    void stopBetweenLogPoints_data() {
        QTest::addColumn<int>("replicas");
        QTest::newRow("one device") << 1;
        QTest::newRow("2 replicas") << 2;
    }
    void stopBetweenLogPoints() {
        QFETCH(int, replicas);
        class StopAfter : public Callback {
          public:
            explicit StopAfter(Session** s) : s_(s) {}
            void onBatchEnd(int64_t step, const MetricMap&, TrainControl&) override {
                if (step == 3) (*s_)->requestStop();
            }
            bool wantsBatchLogs() const override { return false; }

          private:
            Session** s_;
        };
        Session* session = nullptr;
        SessionOptions o;
        o.callbacks.push_back(std::make_shared<StopAfter>(&session));
        Project p = replicas == 1 ? blobs(R"({"type": "one_device"})")
                                  : blobs(R"({"type": "mirrored", "replicas": 2})");
        p.training.logEverySteps = 100;
        auto s = Session::create(p, o);
        QVERIFY2(s.ok(), s.ok() ? "" : s.error().c_str());
        session = s.value().get();
        auto q = session->events().subscribe();
        QVERIFY(session->fit().ok());
        std::vector<EpochMetrics> epochs;
        RunFinished fin;
        for (const Event& e : q->drain()) {
            if (auto* m = std::get_if<EpochMetrics>(&e)) epochs.push_back(*m);
            if (auto* f = std::get_if<RunFinished>(&e)) fin = *f;
        }
        QCOMPARE(fin.status, RunStatus::Stopped);
        QCOMPARE(epochs.size(), size_t(1));
        QVERIFY(std::isfinite(epochs[0].metrics.at("loss")) && epochs[0].metrics.at("loss") > 0);
        // 3 steps of 64 samples: the accuracy is a count of correct samples over 192.
        const double correct = epochs[0].metrics.at("accuracy") * 192;
        QVERIFY2(std::abs(correct - std::round(correct)) < 1e-6,
                 qPrintable(QString::number(correct)));
    }

    void unevenGlobalBatchIsRefused() {
        auto s = Session::create(blobs(R"({"type": "mirrored", "replicas": 3})", 64), {});
        QVERIFY(!s.ok());
        QVERIFY2(s.error().find("training.batch_size") != std::string::npos, s.error().c_str());
        QVERIFY2(s.error().find("3 replicas") != std::string::npos, s.error().c_str());
        QVERIFY2(s.error().find("multiple of 3") != std::string::npos, s.error().c_str());
    }

    void failingReplicaEndsTheRun() {
        SessionOptions o;
        o.openDevice = countingOpener(1, 5);  // replica 1's program fails at its 6th run
        const auto t0 = std::chrono::steady_clock::now();
        Outcome out =
            train(blobs(R"({"type": "mirrored", "replicas": 2, "timeout_seconds": 30})"), o);
        const double seconds =
            std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        QVERIFY(!out.status.ok());
        QVERIFY2(out.status.error().find("failed on purpose") != std::string::npos,
                 out.status.error().c_str());
        QVERIFY2(seconds < 20, "a failed replica must not leave the others waiting");
    }

    void replicasInRunStarted() {
        const Outcome out = train(blobs(R"({"type": "mirrored", "replicas": 2})", 64, 1));
        QVERIFY2(out.status.ok(), out.status.error().c_str());
        QCOMPARE(out.devices, (std::vector<std::string>{"cpu:0/replica 0", "cpu:0/replica 1"}));
    }
};

QTEST_GUILESS_MAIN(TestStrategies)
#include "test_strategies.moc"

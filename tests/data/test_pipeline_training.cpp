// The input pipeline's cache through whole training runs (Session::fit): the first epoch fills a
// file cache, later epochs and later runs read it instead of the source, and a cache that no
// longer matches the data is rebuilt with a warning. The pipeline reports, per epoch, where its
// elements came from in the run's log.
#include <sched.h>

#include <QFile>
#include <QTemporaryDir>
#include <QtTest>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <regex>
#include <string>
#include <utility>

#include "engine/api/data_preview.h"
#include "engine/api/session.h"
#include "engine/data/pipeline.h"
#include "tests/scoped_env.h"
#include "tests/source_dir.h"

using namespace td;

namespace {

Project blobs(const std::string& cache, uint64_t dataSeed) {
    auto p = loadProject(std::string(td::dev::kSourceDir) + "/projects/synthetic_blobs.json");
    if (!p.ok()) qFatal("%s", p.error().c_str());
    Project project = std::move(p).value();
    project.data.source.samples = 640;
    project.data.source.seed = dataSeed;
    project.training.epochs = 3;
    project.training.evaluateTest = false;
    project.data.pipeline.cache = cache;
    // The cache holds the scaled values; the steps after it run on every epoch.
    project.data.pipeline.map = {MapStep{.op = "scale", .factor = 0.5}, MapStep{.op = "cache"},
                                 MapStep{.op = "normalize", .mean = 0.0, .stddev = 2.0}};
    return project;
}

struct EpochSources {
    int64_t source = 0, cache = 0;
    bool file = false;
    bool formedInline = false;  // "batches formed inline" (AUTOTUNE, the step holds every core)
    std::string line;           // the whole log line
};

struct Run {
    std::vector<EpochSources> epochs;  // from the pipeline's log line after each epoch
    std::vector<std::string> warnings;
    std::vector<double> losses;
    std::vector<double> waitShares;  // EpochMetrics: input wait over the epoch's seconds
    RunStatus status = RunStatus::Running;
};

using td::test::ScopedEnv;

Run train(const Project& project) {
    auto s = Session::create(project, {});
    if (!s.ok()) qFatal("Session::create: %s", s.error().c_str());
    auto q = (*s)->events().subscribe();
    const Status st = (*s)->fit();
    if (!st.ok()) qFatal("fit: %s", st.error().c_str());
    Run run;
    const std::regex line(
        R"(epoch \d+: input pipeline: .* (\d+) elements from the source, (\d+) from the cache( file)?)");
    for (const Event& e : q->drain()) {
        if (const auto* l = std::get_if<LogLine>(&e)) {
            std::smatch m;
            if (std::regex_search(l->text, m, line)) {
                run.epochs.push_back(EpochSources{
                    std::stoll(m[1].str()), std::stoll(m[2].str()), m[3].matched,
                    l->text.find("batches formed inline") != std::string::npos, l->text});
            }
            if (l->level == LogLine::Level::Warning) run.warnings.push_back(l->text);
        } else if (const auto* em = std::get_if<EpochMetrics>(&e)) {
            run.losses.push_back(em->metrics.at("loss"));
            run.waitShares.push_back(em->inputWaitSeconds / std::max(1e-9, em->seconds));
        } else if (const auto* f = std::get_if<RunFinished>(&e)) {
            run.status = f->status;
        }
    }
    return run;
}

}  // namespace

class TestPipelineTraining : public QObject {
    Q_OBJECT
  private slots:
    void fileCacheReadAfterTheFirstEpochAndByTheNextRun();
    void memoryCacheReadAfterTheFirstEpoch();
    void cacheStepInTheProjectFile();
    void inlineEpochsTrainAsWorkerEpochs();
    void inputBoundEpochsSaySo();
    void skipBadFilesAndDecodeStepInTheProjectFile();
};

void TestPipelineTraining::fileCacheReadAfterTheFirstEpochAndByTheNextRun() {
    QTemporaryDir dir;
    const QString path = dir.filePath("blobs.cache");
    const Project project = blobs("file:" + path.toStdString(), 1);

    const Run first = train(project);
    QCOMPARE(first.status, RunStatus::Completed);
    QCOMPARE(first.epochs.size(), size_t{3});
    QVERIFY(first.warnings.empty());
    QCOMPARE(first.epochs[0].source, int64_t{640});
    QCOMPARE(first.epochs[0].cache, int64_t{0});
    for (size_t e = 1; e < 3; ++e) {
        QCOMPARE(first.epochs[e].source, int64_t{0});
        QCOMPARE(first.epochs[e].cache, int64_t{640});
        QVERIFY(first.epochs[e].file);
    }
    QVERIFY(QFile::exists(path));

    // The next run with the same cache reads the file from its first epoch, and trains on the
    // same values: the same losses.
    const Run second = train(project);
    QVERIFY(second.warnings.empty());
    for (const EpochSources& e : second.epochs) {
        QCOMPARE(e.source, int64_t{0});
        QCOMPARE(e.cache, int64_t{640});
    }
    QCOMPARE(second.losses, first.losses);

    // Other source data under the same cache path: rebuilt, with a warning naming the file.
    const Run other = train(blobs("file:" + path.toStdString(), 2));
    QCOMPARE(other.warnings.size(), size_t{1});
    QVERIFY2(other.warnings[0].find(path.toStdString()) != std::string::npos &&
                 other.warnings[0].find("rebuilding") != std::string::npos,
             other.warnings[0].c_str());
    QCOMPARE(other.epochs[0].source, int64_t{640});
    QCOMPARE(other.epochs[2].cache, int64_t{640});
}

void TestPipelineTraining::memoryCacheReadAfterTheFirstEpoch() {
    const Run run = train(blobs("memory", 1));
    QCOMPARE(run.epochs.size(), size_t{3});
    QCOMPARE(run.epochs[0].source, int64_t{640});
    QCOMPARE(run.epochs[1].cache, int64_t{640});
    QCOMPARE(run.epochs[2].source, int64_t{0});
    QVERIFY(!run.epochs[1].file);
    // The cache changes where values come from, not what they are.
    const Run none = train(blobs("none", 1));
    QCOMPARE(none.epochs[2].source, int64_t{640});
    QCOMPARE(run.losses, none.losses);
}

// {"op": "cache"} in data.pipeline.map survives a project file round trip; a second one, or one
// with other keys, is refused by name.
void TestPipelineTraining::cacheStepInTheProjectFile() {
    const Project project = blobs("memory", 1);
    auto parsed = parseProject(projectToJson(project));
    QVERIFY2(parsed.ok(), parsed.ok() ? "" : parsed.error().c_str());
    QCOMPARE(parsed->data.pipeline.map.size(), size_t{3});
    QCOMPARE(parsed->data.pipeline.map[1].op, std::string("cache"));
    QCOMPARE(projectDifference(project, *parsed), std::string());

    const std::string json = projectToJson(project);
    const std::regex step(R"re("op":\s*"cache")re");
    QVERIFY(std::regex_search(json, step));
    const std::string withKey = std::regex_replace(json, step, R"("op": "cache", "x": 1)");
    auto badKey = parseProject(withKey);
    QVERIFY(!badKey.ok());
    QVERIFY2(badKey.error().find("data.pipeline.map[1]") != std::string::npos,
             badKey.error().c_str());

    Project twice = project;
    twice.data.pipeline.map.push_back(MapStep{.op = "cache"});
    auto s = Session::create(twice, {});
    QVERIFY(s.ok());
    const Status st = (*s)->fit();
    QVERIFY(!st.ok());
    QVERIFY2(st.error().find("'cache' appears twice") != std::string::npos, st.error().c_str());
}

// The trainer tells the pipeline how many cores its step holds: a CPU device's threads. On one
// schedulable core (this test narrows its affinity, so that any machine and any OMP_NUM_THREADS
// qualify) AUTOTUNE then forms the later epochs' batches inline when the last epoch formed a
// batch within the limit. How long a batch takes depends on the machine (17-51 us on a 2-core
// Zen 3 against the default limit of 20), so the test sets the limit (TRAINDECK_INLINE_MAX_US):
// far above any machine's time, every epoch after the first forms inline; at 0, none does. The
// inline epochs train on the same batches as with a worker (parallel_calls 1 keeps one): the
// same losses.
void TestPipelineTraining::inlineEpochsTrainAsWorkerEpochs() {
    cpu_set_t saved;
    CPU_ZERO(&saved);
    QCOMPARE(sched_getaffinity(0, sizeof saved, &saved), 0);
    int first = 0;
    while (!CPU_ISSET(first, &saved)) ++first;
    cpu_set_t one;
    CPU_ZERO(&one);
    CPU_SET(first, &one);
    QCOMPARE(sched_setaffinity(0, sizeof one, &one), 0);
    struct Restore {
        cpu_set_t set;
        ~Restore() { sched_setaffinity(0, sizeof set, &set); }
    } restore{saved};

    // The seed MLP (784-128-10, batch 32) on synthetic images: its first layer's products are
    // split across the CPU device's WorkShare, whose helper then forms the next batch during the
    // step (HostThreads::startAside).
    auto loaded =
        loadProject(std::string(td::dev::kSourceDir) + "/projects/fashion_mnist_mlp.json");
    QVERIFY2(loaded.ok(), loaded.ok() ? "" : loaded.error().c_str());
    Project project = std::move(loaded).value();
    project.data.source = SourceConfig{};
    project.data.source.type = "synthetic";
    project.data.source.samples = 640;
    project.data.source.testSamples = 64;
    project.data.source.sampleShape = {28, 28};
    project.data.source.classes = 10;
    project.data.pipeline.shuffleBuffer = 640;
    project.training.evaluateTest = false;
    project.training.epochs = 4;
    project.data.pipeline.prefetch = kAutotune;
    project.data.pipeline.parallelCalls = kAutotune;
    auto inlineEpochs = [](const Run& r) {
        int formed = 0;
        QString lines;
        for (size_t e = 0; e < r.epochs.size(); ++e) {
            if (e > 0) formed += r.epochs[e].formedInline ? 1 : 0;
            lines += "\n" + QString::fromStdString(r.epochs[e].line);
        }
        return std::make_pair(formed, lines);
    };
    const ScopedEnv never("TRAINDECK_INLINE_MAX_US", "0");
    const Run limitZero = train(project);
    QCOMPARE(limitZero.epochs.size(), size_t{4});
    const auto [none, noneLines] = inlineEpochs(limitZero);
    QVERIFY2(none == 0, qPrintable(QString("%1 of epochs 2-4 formed inline with the limit at 0:%2")
                                       .arg(none)
                                       .arg(noneLines)));

    const ScopedEnv always("TRAINDECK_INLINE_MAX_US", "1000000");
    const Run tuned = train(project);
    QCOMPARE(tuned.status, RunStatus::Completed);
    QCOMPARE(tuned.epochs.size(), size_t{4});
    QVERIFY(!tuned.epochs[0].formedInline);  // nothing measured yet: workers
    const auto [formed, lines] = inlineEpochs(tuned);
    QVERIFY2(formed == 3,
             qPrintable(QString("%1 of epochs 2-4 formed inline:%2").arg(formed).arg(lines)));
    QCOMPARE(tuned.losses, limitZero.losses);

    project.data.pipeline.parallelCalls = 1;
    const Run worker = train(project);
    for (const EpochSources& e : worker.epochs) QVERIFY(!e.formedInline);
    QCOMPARE(tuned.losses, worker.losses);

    // A limit that is not a number of microseconds stops the run with the variable's name.
    const ScopedEnv bad("TRAINDECK_INLINE_MAX_US", "fast");
    auto s = Session::create(project, {});
    QVERIFY2(s.ok(), s.ok() ? "" : s.error().c_str());
    const Status st = (*s)->fit();
    QVERIFY(!st.ok());
    QVERIFY2(st.error().find("TRAINDECK_INLINE_MAX_US") != std::string::npos &&
                 st.error().find("'fast'") != std::string::npos,
             st.error().c_str());
}

// Did training wait for data? A deliberately slow pipeline (each batch 10 ms longer to form, one
// worker, no cache, no prefetch) is input-bound, and the run says so with the share and the
// change that would help (here the cache); the same run with a fast pipeline says nothing.
void TestPipelineTraining::inputBoundEpochsSaySo() {
    Project project = blobs("none", 3);
    project.data.pipeline.map = {MapStep{.op = "scale", .factor = 0.5}};
    project.data.pipeline.parallelCalls = 1;
    project.data.pipeline.prefetch = 0;
    project.training.epochs = 2;
    const Run fast = train(project);
    QCOMPARE(fast.status, RunStatus::Completed);
    for (const std::string& w : fast.warnings)
        QVERIFY2(w.find("input-bound") == std::string::npos, w.c_str());
    const ScopedEnv slowly(kSlowBatchFaultEnv, "10000");
    const Run slow = train(project);
    QCOMPARE(slow.status, RunStatus::Completed);
    QCOMPARE(slow.waitShares.size(), size_t{2});
    int bound = 0;
    for (const std::string& w : slow.warnings) {
        if (w.find("was input-bound: ") == std::string::npos) continue;
        ++bound;
        QVERIFY2(w.find("of the step loop's time waited for data; a cache after the decode and "
                        "map steps (data.pipeline.cache \"memory\": ") != std::string::npos,
                 w.c_str());
    }
    QCOMPARE(bound, 2);
    for (double share : slow.waitShares)
        QVERIFY2(share >= kInputBoundShare, qPrintable(QString::number(share)));
    // Its pipeline line is then for everyone, not a detail.
    QCOMPARE(slow.epochs.size(), size_t{2});
    // A delay that is not a number of microseconds is refused, naming the variable.
    const ScopedEnv bad(kSlowBatchFaultEnv, "slow");
    auto s = Session::create(project, {});
    QVERIFY(s.ok());
    const Status st = (*s)->fit();
    QVERIFY(!st.ok());
    QVERIFY2(st.error().find(kSlowBatchFaultEnv) != std::string::npos, st.error().c_str());
}

namespace {

// A 24-bit 8x8 BMP whose pixels are `level` plus a pattern of `seed`.
void writeBmp(const std::string& path, int level, int seed) {
    constexpr int kSide = 8, kStride = 24;
    std::vector<uint8_t> b(54 + kStride * kSide, 0);
    auto put32 = [&](size_t at, uint32_t v) {
        for (int i = 0; i < 4; ++i)
            b[at + static_cast<size_t>(i)] = static_cast<uint8_t>(v >> (8 * i));
    };
    b[0] = 'B';
    b[1] = 'M';
    put32(2, static_cast<uint32_t>(b.size()));
    put32(10, 54);
    put32(14, 40);
    put32(18, kSide);
    put32(22, kSide);
    b[26] = 1;
    b[28] = 24;
    for (size_t i = 54; i < b.size(); ++i)
        b[i] = static_cast<uint8_t>(
            level + static_cast<int>((i * 7 + static_cast<size_t>(seed) * 13) % 50));
    std::ofstream(path, std::ios::binary)
        .write(reinterpret_cast<const char*>(b.data()), static_cast<std::streamsize>(b.size()));
}

std::string folderProject(const std::string& folder, const std::string& map,
                          const std::string& cache) {
    return R"({"format": "traindeck-project", "version": 1, "name": "folder",
 "model": {"class_name": "Sequential", "config": {"name": "m", "layers": [
  {"class_name": "InputLayer", "config": {"name": "in", "batch_shape": [null, 8, 8, 3]}},
  {"class_name": "Flatten", "config": {"name": "f"}},
  {"class_name": "Dense", "config": {"name": "d", "units": 2, "activation": "softmax"}}]}},
 "data": {"source": {"type": "image_directory", "directory": ")" +
           folder + R"(", "image_size": [8, 8], "seed": 3, "skip_bad_files": true},
  "pipeline": {"map": )" +
           map + R"(, "cache": ")" + cache + R"(", "shuffle_buffer": 64}},
 "training": {"epochs": 3, "batch_size": 8, "seed": 5,
  "optimizer": {"class_name": "SGD", "config": {"learning_rate": 0.05}},
  "loss": {"class_name": "SparseCategoricalCrossentropy", "config": {}},
  "evaluate_test": false}})";
}

}  // namespace

// skip_bad_files and a "decode" map step from a project file: parsed, saved and compared (a
// change of either is a difference), refused where they make no sense, described with the cache
// before the decode; trained, the run's log counts and names the files left out, and a memory
// cache of the encoded files trains on exactly the batches of the decoded cache (the same
// losses), the first epoch from the files, the later ones from the cache.
void TestPipelineTraining::skipBadFilesAndDecodeStepInTheProjectFile() {
    QTemporaryDir dir;
    const std::filesystem::path root = dir.path().toStdString();
    for (int c = 0; c < 2; ++c) {
        std::filesystem::create_directories(root / ("c" + std::to_string(c)));
        for (int i = 0; i < 20; ++i)
            writeBmp((root / ("c" + std::to_string(c)) / (std::to_string(i) + ".bmp")).string(),
                     c * 120, i);
    }
    const std::string bad = (root / "c1" / "4.bmp").string();
    std::filesystem::resize_file(bad, 60);
    const std::string scale = R"({"op": "scale", "factor": 0.00392156862745098})";
    const std::string encodedMap = R"([{"op": "cache"}, {"op": "decode"}, )" + scale + "]";
    auto encoded = parseProject(folderProject(root.string(), encodedMap, "memory"));
    QVERIFY2(encoded.ok(), encoded.ok() ? "" : encoded.error().c_str());
    QVERIFY(encoded->data.source.images.skipBadFiles);
    QCOMPARE(encoded->data.pipeline.map.size(), size_t(3));
    QCOMPARE(encoded->data.pipeline.map[1].op, std::string("decode"));
    QVERIFY(cachesEncoded(encoded->data.pipeline));
    auto again = parseProject(projectToJson(*encoded));
    QVERIFY2(again.ok(), again.ok() ? "" : again.error().c_str());
    QCOMPARE(projectDifference(*encoded, *again), std::string());
    Project changed = *encoded;
    changed.data.source.images.skipBadFiles = false;
    QCOMPARE(projectDifference(*encoded, changed), std::string("data.source (image_directory)"));
    changed = *encoded;
    changed.data.pipeline.map.erase(changed.data.pipeline.map.begin() + 1);
    QCOMPARE(projectDifference(*encoded, changed), std::string("data.pipeline.map"));
    QCOMPARE(api::describePipeline(encoded->data, 8),
             std::string("image_directory → cache (memory, encoded files) → shuffle (buffer 64, "
                         "each epoch) → batch 8 → decode + resize (AUTOTUNE workers, every epoch) "
                         "→ map scale ×0.00392157 (AUTOTUNE workers) → prefetch (AUTOTUNE)"));
    // tfrecord: skip_bad_files saved and compared too.
    Project records = *encoded;
    records.data.source.images = ImageDirectoryConfig{};
    records.data.source.type = "tfrecord";
    records.data.source.records.files = {(root / "*.tfrecord").string()};
    records.data.source.records.xFeature = "image";
    records.data.source.records.image.height = records.data.source.records.image.width = 8;
    records.data.source.records.skipBadFiles = true;
    auto recordsAgain = parseProject(projectToJson(records));
    QVERIFY2(recordsAgain.ok(), recordsAgain.ok() ? "" : recordsAgain.error().c_str());
    QVERIFY(recordsAgain->data.source.records.skipBadFiles);
    QCOMPARE(projectDifference(records, *recordsAgain), std::string());
    records.data.source.records.skipBadFiles = false;
    QCOMPARE(projectDifference(records, *recordsAgain), std::string("data.source (tfrecord)"));
    // Refused: a decode step where nothing is decoded, a step before it other than the cache,
    // two of them.
    for (const auto& [map, part] : std::vector<std::pair<std::string, std::string>>{
             {"[" + scale + R"(, {"op": "decode"}])",
              R"(data.pipeline.map[0].op: "scale" before "decode" would act on encoded bytes)"},
             {R"([{"op": "decode"}, {"op": "decode"}])",
              R"(data.pipeline.map[1].op: "decode" appears twice)"}}) {
        auto refused = parseProject(folderProject(root.string(), map, "memory"));
        QVERIFY(!refused.ok());
        QVERIFY2(refused.error().find(part) != std::string::npos, refused.error().c_str());
    }
    {
        Project synthetic = blobs("memory", 1);
        synthetic.data.pipeline.map = {MapStep{.op = "decode"}};
        const std::string json = projectToJson(synthetic);
        auto refused = parseProject(json);
        QVERIFY(!refused.ok());
        QVERIFY2(refused.error().find("\"decode\" marks where an image_directory or tfrecord "
                                      "source decodes its files or records; a \"synthetic\"") !=
                     std::string::npos,
                 refused.error().c_str());
    }

    // Trained: the decoded cache and the encoded one, the same losses.
    auto decoded = parseProject(folderProject(root.string(), "[" + scale + "]", "memory"));
    QVERIFY2(decoded.ok(), decoded.ok() ? "" : decoded.error().c_str());
    const Run a = train(*decoded);
    const Run b = train(*encoded);
    QCOMPARE(a.status, RunStatus::Completed);
    QCOMPARE(b.status, RunStatus::Completed);
    QCOMPARE(a.losses.size(), size_t(3));
    QCOMPARE(b.losses, a.losses);
    for (const Run* r : {&a, &b}) {
        bool noted = false;
        for (const std::string& w : r->warnings)
            noted = noted ||
                    (w.find("data.source.skip_bad_files: left out 1 of 40 training images: " + bad +
                            ": truncated BMP file") != std::string::npos);
        QVERIFY(noted);
    }
    QCOMPARE(b.epochs.size(), size_t(3));
    QCOMPARE(b.epochs[0].source, int64_t(39));
    QCOMPARE(b.epochs[1].cache, int64_t(39));
    QCOMPARE(b.epochs[2].cache, int64_t(39));
}

QTEST_GUILESS_MAIN(TestPipelineTraining)
#include "test_pipeline_training.moc"

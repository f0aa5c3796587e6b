// The input pipeline's cache through whole training runs (Session::fit): the first epoch fills a
// file cache, later epochs and later runs read it instead of the source, and a cache that no
// longer matches the data is rebuilt with a warning. The pipeline reports, per epoch, where its
// elements came from in the run's log.
#include <sched.h>

#include <QFile>
#include <QTemporaryDir>
#include <QtTest>
#include <cstdlib>
#include <regex>
#include <string>
#include <utility>

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

QTEST_GUILESS_MAIN(TestPipelineTraining)
#include "test_pipeline_training.moc"

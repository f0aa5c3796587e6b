// Streaming through the CLI, as a user runs it: an image folder whose decoded samples are three
// times the memory budget (TRAINDECK_MEMORY_BUDGET) trains with the pipeline's cache off, and the
// process's peak resident memory stays under the budget; the same project with a memory cache is
// refused before training, with the sizes and the way out; a file that does not decode, met by a
// batch mid-epoch, ends the run as failed with the file named.
#include <fcntl.h>
#include <spawn.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <QTemporaryDir>
#include <QtTest>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "engine/api/runs.h"
#include "tests/source_dir.h"

extern char** environ;

namespace fs = std::filesystem;

namespace {

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
constexpr bool kSanitized = true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
constexpr bool kSanitized = true;
#else
constexpr bool kSanitized = false;
#endif
#else
constexpr bool kSanitized = false;
#endif

// A 24-bit BMP of noise around a per-class level (the classes differ in brightness).
void writeBmp(const std::string& path, int side, int level, std::mt19937& rng) {
    const int stride = (side * 3 + 3) / 4 * 4;
    const uint32_t size = 54 + static_cast<uint32_t>(stride * side);
    std::vector<uint8_t> b(size, 0);
    auto put32 = [&](size_t at, uint32_t v) {
        for (int i = 0; i < 4; ++i)
            b[at + static_cast<size_t>(i)] = static_cast<uint8_t>(v >> (8 * i));
    };
    b[0] = 'B';
    b[1] = 'M';
    put32(2, size);
    put32(10, 54);
    put32(14, 40);
    put32(18, static_cast<uint32_t>(side));
    put32(22, static_cast<uint32_t>(side));
    b[26] = 1;
    b[28] = 24;
    for (size_t i = 54; i < size; ++i)
        b[i] = static_cast<uint8_t>(level + static_cast<int>(rng() % 64));
    std::ofstream(path, std::ios::binary).write(reinterpret_cast<const char*>(b.data()), size);
}

struct Child {
    int code = -1;
    int64_t peakKiB = 0;
    std::string out;
};

// Runs the CLI with `env` added; the child's own peak resident set from wait4.
Child runCli(const std::vector<std::string>& args, const std::vector<std::string>& env,
             const std::string& outFile) {
    std::vector<std::string> argv{td::dev::kBinary};
    argv.insert(argv.end(), args.begin(), args.end());
    std::vector<char*> a;
    for (std::string& s : argv) a.push_back(s.data());
    a.push_back(nullptr);
    std::vector<std::string> envs;
    for (char** e = environ; *e; ++e) envs.emplace_back(*e);
    envs.insert(envs.end(), env.begin(), env.end());
    std::vector<char*> e;
    for (std::string& s : envs) e.push_back(s.data());
    e.push_back(nullptr);
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 1, outFile.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    posix_spawn_file_actions_adddup2(&fa, 1, 2);
    pid_t pid = 0;
    Child c;
    if (posix_spawn(&pid, a[0], &fa, nullptr, a.data(), e.data()) != 0) return c;
    posix_spawn_file_actions_destroy(&fa);
    int status = 0;
    rusage ru{};
    if (wait4(pid, &status, 0, &ru) != pid) return c;
    c.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    c.peakKiB = ru.ru_maxrss;
    std::ifstream f(outFile);
    c.out.assign(std::istreambuf_iterator<char>(f), {});
    return c;
}

std::string project(const std::string& folder, const std::string& cache, const std::string& name) {
    return R"({"format": "traindeck-project", "version": 1, "name": ")" + name + R"(",
 "model": {"class_name": "Sequential", "config": {"name": "m", "layers": [
  {"class_name": "InputLayer", "config": {"name": "in", "batch_shape": [null, 64, 64, 3]}},
  {"class_name": "Flatten", "config": {"name": "f"}},
  {"class_name": "Dense", "config": {"name": "d", "units": 4, "activation": "softmax"}}]}},
 "data": {"source": {"type": "image_directory", "directory": ")" +
           folder + R"(", "image_size": [64, 64], "seed": 1},
  "pipeline": {"map": [{"op": "scale", "factor": 0.00392156862745098}], "cache": ")" +
           cache + R"(", "shuffle_buffer": 1000}},
 "training": {"epochs": 1, "batch_size": 32, "optimizer": {"class_name": "Adam", "config": {}},
  "loss": {"class_name": "SparseCategoricalCrossentropy", "config": {}}, "metrics": ["accuracy"],
  "evaluate_test": false}})";
}

// A small project over a folder of 16x16 images: `source` adds keys to the source object, `map`
// is data.pipeline.map.
std::string smallProject(const std::string& folder, const std::string& name,
                         const std::string& source, const std::string& map,
                         const std::string& cache) {
    return R"({"format": "traindeck-project", "version": 1, "name": ")" + name + R"(",
 "model": {"class_name": "Sequential", "config": {"name": "m", "layers": [
  {"class_name": "InputLayer", "config": {"name": "in", "batch_shape": [null, 16, 16, 3]}},
  {"class_name": "Flatten", "config": {"name": "f"}},
  {"class_name": "Dense", "config": {"name": "d", "units": 3, "activation": "softmax"}}]}},
 "data": {"source": {"type": "image_directory", "directory": ")" +
           folder + R"(", "image_size": [16, 16], "seed": 4)" + source + R"(},
  "pipeline": {"map": )" +
           map + R"(, "cache": ")" + cache + R"(", "shuffle_buffer": 100}},
 "training": {"epochs": 2, "batch_size": 8, "optimizer": {"class_name": "Adam", "config": {}},
  "loss": {"class_name": "SparseCategoricalCrossentropy", "config": {}}, "metrics": ["accuracy"],
  "evaluate_test": false}})";
}

}  // namespace

class TestStreaming : public QObject {
    Q_OBJECT

  private slots:
    void folderThreeTimesTheBudgetTrains() {
        QTemporaryDir dir;
        const fs::path root = dir.path().toStdString();
        // 6,400 images of 64x64x3: 302 MiB as f32 samples, three times a 100 MiB budget.
        constexpr int kPerClass = 1600;
        std::mt19937 rng(7);
        for (int c = 0; c < 4; ++c) {
            fs::create_directories(root / "images" / ("c" + std::to_string(c)));
            for (int i = 0; i < kPerClass; ++i)
                writeBmp(
                    (root / "images" / ("c" + std::to_string(c)) / (std::to_string(i) + ".bmp"))
                        .string(),
                    64, 40 * c, rng);
        }
        const std::string images = (root / "images").string();
        const std::string db = (root / "runs.db").string();
        const std::string log = (root / "out.txt").string();
        std::ofstream((root / "stream.json").string()) << project(images, "none", "stream");
        std::ofstream((root / "memory.json").string()) << project(images, "memory", "memory");
        const std::vector<std::string> env{"TRAINDECK_MEMORY_BUDGET=100M", "OMP_NUM_THREADS=1",
                                           "HOME=" + root.string()};

        const Child s = runCli({"train", (root / "stream.json").string(), "--db", db}, env, log);
        QVERIFY2(s.code == 0, s.out.c_str());
        QVERIFY2(s.out.find("6400 elements from the source, 0 from the cache") != std::string::npos,
                 s.out.c_str());
        QVERIFY2(s.out.find("reading and decoding files") != std::string::npos, s.out.c_str());
        qInfo("streamed 302 MiB of samples: peak resident %.1f MiB (budget 100 MiB)",
              static_cast<double>(s.peakKiB) / 1024);
        // A sanitizer's shadow memory and quarantine make the process's size meaningless.
        if (!kSanitized)
            QVERIFY2(s.peakKiB < 100 * 1024, qPrintable(QString("peak %1 KiB").arg(s.peakKiB)));

        const Child m = runCli({"train", (root / "memory.json").string(), "--db", db}, env, log);
        QCOMPARE(m.code == 0, false);
        QVERIFY2(m.out.find("over the budget of 100.0 MiB") != std::string::npos, m.out.c_str());
        QVERIFY2(m.out.find("6400 decoded samples of [64,64,3] f32 values") != std::string::npos,
                 m.out.c_str());
        QVERIFY2(
            m.out.find("with data.pipeline.cache \"none\" or \"file:<path>\"") != std::string::npos,
            m.out.c_str());

        // A file cut short, met mid-epoch: the run fails naming it, and the store says failed.
        const fs::path cut = root / "images" / "c2" / "77.bmp";
        fs::resize_file(cut, 120);
        const Child f = runCli({"train", (root / "stream.json").string(), "--db", db}, env, log);
        QVERIFY2(f.code != 0, f.out.c_str());
        QVERIFY2(f.out.find(cut.string() + ": truncated BMP file") != std::string::npos,
                 f.out.c_str());
        const Child runs = runCli({"runs", "--db", db}, env, log);
        QVERIFY2(runs.out.find("failed") != std::string::npos, runs.out.c_str());
    }

    // skip_bad_files and a cache before the decode, as a user runs them: without the option a bad
    // file ends the run naming it; with it the run trains and its log (the CLI's output and the
    // store's) says how many files were left out and names them; a memory cache of the encoded
    // files fills in the first epoch and feeds the second.
    void skipBadFilesAndEncodedCacheThroughTheCli() {
        QTemporaryDir dir;
        const fs::path root = dir.path().toStdString();
        std::mt19937 rng(3);
        for (int c = 0; c < 3; ++c) {
            fs::create_directories(root / "images" / ("c" + std::to_string(c)));
            for (int i = 0; i < 30; ++i)
                writeBmp(
                    (root / "images" / ("c" + std::to_string(c)) / (std::to_string(i) + ".bmp"))
                        .string(),
                    16, 60 * c, rng);
        }
        const fs::path cut = root / "images" / "c1" / "7.bmp";
        fs::resize_file(cut, 100);
        const fs::path text = root / "images" / "c2" / "12.bmp";
        std::ofstream(text.string()) << "not a bitmap";
        const std::string images = (root / "images").string();
        const std::string db = (root / "runs.db").string();
        const std::string log = (root / "out.txt").string();
        const std::string scale = R"([{"op": "scale", "factor": 0.00392156862745098}])";
        const std::string encoded =
            R"([{"op": "cache"}, {"op": "decode"}, {"op": "scale", "factor": 0.00392156862745098}])";
        std::ofstream((root / "strict.json").string())
            << smallProject(images, "strict", "", scale, "none");
        std::ofstream((root / "skip.json").string())
            << smallProject(images, "skip", R"(, "skip_bad_files": true)", scale, "none");
        std::ofstream((root / "encoded.json").string())
            << smallProject(images, "encoded", R"(, "skip_bad_files": true)", encoded, "memory");
        const std::vector<std::string> env{"OMP_NUM_THREADS=1", "HOME=" + root.string()};

        const Child strict =
            runCli({"train", (root / "strict.json").string(), "--db", db}, env, log);
        QVERIFY2(strict.code != 0, strict.out.c_str());
        QVERIFY2(strict.out.find(cut.string() + ": truncated BMP file") != std::string::npos ||
                     strict.out.find(text.string() + ": not an image") != std::string::npos,
                 strict.out.c_str());
        QVERIFY2(strict.out.find("set data.source.skip_bad_files") != std::string::npos,
                 strict.out.c_str());

        const std::string leftOut =
            "data.source.skip_bad_files: left out 2 of 90 training images: ";
        const Child skip =
            runCli({"train", (root / "skip.json").string(), "--db", db, "--verbose"}, env, log);
        QVERIFY2(skip.code == 0, skip.out.c_str());
        QVERIFY2(skip.out.find(leftOut) != std::string::npos, skip.out.c_str());
        QVERIFY2(skip.out.find(cut.string() + ": truncated BMP file") != std::string::npos,
                 skip.out.c_str());
        QVERIFY2(skip.out.find(text.string() + ": not an image") != std::string::npos,
                 skip.out.c_str());
        QVERIFY2(
            skip.out.find("88 elements from the source, 0 from the cache") != std::string::npos,
            skip.out.c_str());
        // The store's log of the run keeps the line.
        const auto runAt = skip.out.find("Run ");
        QVERIFY2(runAt != std::string::npos, skip.out.c_str());
        auto catalog = td::api::RunCatalog::open(db);
        QVERIFY2(catalog.ok(), catalog.ok() ? "" : catalog.error().c_str());
        auto logs = (*catalog)->logs(std::stoll(skip.out.substr(runAt + 4)));
        QVERIFY2(logs.ok(), logs.ok() ? "" : logs.error().c_str());
        bool stored = false;
        for (const td::LogRow& row : *logs)
            stored = stored || (row.level == "warning" && row.text.find(leftOut) == 0 &&
                                row.text.find(cut.string()) != std::string::npos);
        QVERIFY2(stored, skip.out.c_str());

        const Child enc =
            runCli({"train", (root / "encoded.json").string(), "--db", db, "--verbose"}, env, log);
        QVERIFY2(enc.code == 0, enc.out.c_str());
        QVERIFY2(enc.out.find(leftOut) != std::string::npos, enc.out.c_str());
        QVERIFY2(enc.out.find("88 elements from the source, 0 from the cache") != std::string::npos,
                 enc.out.c_str());
        QVERIFY2(enc.out.find("0 elements from the source, 88 from the cache") != std::string::npos,
                 enc.out.c_str());
    }
};

QTEST_GUILESS_MAIN(TestStreaming)
#include "test_streaming.moc"

// engine/data at its limits: NaN and infinite values in CSV, NPY and IDX data (refused, or dropped
// on request), zero dimensions in headers, labels beyond the model's classes, and sizes that
// cannot fit (the memory plan, the thread ceiling) refused before anything is allocated.
#include <zlib.h>

#include <QFile>
#include <QTemporaryDir>
#include <QtTest>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <string>
#include <vector>

#include "engine/data/decode_cache.h"
#include "engine/data/pipeline.h"
#include "engine/data/resource_plan.h"
#include "engine/data/sources.h"
#include "tests/scoped_env.h"

using namespace td;

namespace {

void writeBytes(const QString& path, const std::string& bytes, bool gzip = false) {
    if (gzip) {
        gzFile f = gzopen(path.toStdString().c_str(), "wb");
        QVERIFY(f != nullptr);
        QCOMPARE(gzwrite(f, bytes.data(), static_cast<unsigned>(bytes.size())),
                 static_cast<int>(bytes.size()));
        QCOMPARE(gzclose(f), Z_OK);
    } else {
        QFile f(path);
        QVERIFY(f.open(QIODevice::WriteOnly));
        QCOMPARE(f.write(bytes.data(), static_cast<qint64>(bytes.size())),
                 static_cast<qint64>(bytes.size()));
    }
}

void appendBigEndian32(std::string& s, uint32_t v) {
    for (int shift = 24; shift >= 0; shift -= 8) s += static_cast<char>((v >> shift) & 0xff);
}

std::string idxBytes(uint8_t type, const std::vector<uint32_t>& dims, const std::string& payload) {
    std::string s = {0, 0, static_cast<char>(type), static_cast<char>(dims.size())};
    for (uint32_t d : dims) appendBigEndian32(s, d);
    return s + payload;
}

std::string npyBytes(const std::string& descr, const std::string& shape, const std::string& data) {
    std::string header =
        "{'descr': '" + descr + "', 'fortran_order': False, 'shape': " + shape + ", }";
    while ((10 + header.size() + 1) % 64 != 0) header += ' ';
    header += '\n';
    std::string s = "\x93NUMPY\x01";
    s += '\0';
    s += static_cast<char>(header.size() & 0xff);
    s += static_cast<char>((header.size() >> 8) & 0xff);
    return s + header + data;
}

template <typename T>
std::string rawBytes(const std::vector<T>& v) {
    return std::string(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(T));
}

using td::test::ScopedEnv;

QString q(const std::string& s) {
    return QString::fromStdString(s);
}

Dataset smallDataset(int64_t n, int64_t features) {
    Dataset d;
    d.x = Tensor(DType::F32, {n, features});
    d.y = Tensor(DType::I32, {n});
    for (int64_t i = 0; i < n; ++i) d.y.data<int32_t>()[i] = static_cast<int32_t>(i % 3);
    d.numClasses = 3;
    return d;
}

}  // namespace

class TestDataLimits : public QObject {
    Q_OBJECT
  private slots:

    // ---- NaN and infinity ---------------------------------------------------------------------

    void csvNonFiniteIsRefused_data() {
        QTest::addColumn<QString>("rows");
        QTest::addColumn<QString>("expected");
        QTest::newRow("nan feature") << "1,2,0\n3,nan,1\n"
                                     << ":3: row 2, column 2 'b': 'nan' is not a finite number";
        QTest::newRow("inf feature") << "1,inf,0\n"
                                     << ":2: row 1, column 2 'b': 'inf' is not a finite number";
        QTest::newRow("-infinity feature")
            << "1,2,0\n3,4,1\n-infinity,4,1\n"
            << ":4: row 3, column 1 'a': '-infinity' is not a finite number";
        QTest::newRow("beyond float32") << "1e39,2,0\n"
                                        << "row 1, column 1 'a': '1e39' is beyond the float32";
        QTest::newRow("nan label") << "1,2,0\n1,2,NaN\n"
                                   << "row 2, column 3 'label': 'NaN' is not a finite number";
        QTest::newRow("quoted nan") << "1,\"nan\",0\n"
                                    << "row 1, column 2 'b': 'nan' is not a finite number";
    }
    void csvNonFiniteIsRefused() {
        QFETCH(QString, rows);
        QFETCH(QString, expected);
        QTemporaryDir dir;
        const QString path = dir.filePath("values.csv");
        writeBytes(path, "a,b,label\n" + rows.toStdString());
        Result<CsvData> csv = readCsv(path.toStdString(), "label");
        QVERIFY2(!csv.ok(), "a non-finite value was accepted");
        QVERIFY2(q(csv.error()).startsWith(path), csv.error().c_str());
        QVERIFY2(q(csv.error()).contains(expected), csv.error().c_str());
        QVERIFY2(q(csv.error()).contains("non_finite"), csv.error().c_str());
    }

    void csvDropRows() {
        QTemporaryDir dir;
        const QString path = dir.filePath("values.csv");
        writeBytes(path, "a,b,label\n1,2,0\n3,nan,1\n5,6,2\ninf,7,0\n8,9,1e39\n10,11,1\n");
        Result<CsvData> csv = readCsv(path.toStdString(), "label", NonFinitePolicy::DropRows);
        QVERIFY2(csv.ok(), csv.ok() ? "" : csv.error().c_str());
        QCOMPARE(csv->droppedRows, int64_t{3});
        QCOMPARE(csv->x.shape(), (Shape{3, 2}));
        const std::vector<float> x(csv->x.data<float>(), csv->x.data<float>() + 6);
        QCOMPARE(x, (std::vector<float>{1, 2, 5, 6, 10, 11}));
        QCOMPARE(csv->y.dtype(), DType::I32);
        QCOMPARE(csv->y.data<int32_t>()[1], 2);

        // Dropping every row leaves nothing to train on: say so.
        writeBytes(path, "a,b,label\nnan,2,0\n");
        csv = readCsv(path.toStdString(), "label", NonFinitePolicy::DropRows);
        QVERIFY(!csv.ok());
        QVERIFY2(q(csv.error()).contains("every one of the 1 data rows"), csv.error().c_str());
        // A non-number is still an error under drop_rows.
        writeBytes(path, "a,b,label\nnan,2,0\n1,x,0\n");
        csv = readCsv(path.toStdString(), "label", NonFinitePolicy::DropRows);
        QVERIFY(!csv.ok());
        QVERIFY2(q(csv.error()).contains("'x' is not a number"), csv.error().c_str());
    }

    void arrayNonFiniteIsRefused_data() {
        QTest::addColumn<QString>("kind");  // npy-f4, npy-f8, idx-f32
        QTest::addColumn<QString>("expected");
        QTest::newRow("npy <f4 nan") << "npy-f4"
                                     << "x.npy: sample 2, feature 1 (flat index 5): value nan";
        QTest::newRow("npy <f8 beyond float32")
            << "npy-f8"
            << "x.npy: sample 2, feature 1 (flat index 5): value inf";
        QTest::newRow("idx f32 -inf") << "idx-f32"
                                      << "x.idx: sample 2, feature 1 (flat index 5): value -inf";
        QTest::newRow("npy <f4 nan target") << "npy-target"
                                            << "y.npy: sample 1, feature 0 (flat index 1)";
    }
    void arrayNonFiniteIsRefused() {
        QFETCH(QString, kind);
        QFETCH(QString, expected);
        QTemporaryDir dir;
        SourceConfig cfg;
        const float nan = std::numeric_limits<float>::quiet_NaN();
        std::vector<float> x{0, 1, 2, 3, 4, nan, 6, 7};  // [4, 2], sample 2 feature 1
        std::vector<int32_t> labels{0, 1, 0, 1};
        if (kind.startsWith("npy")) {
            cfg.type = "npy";
            cfg.trainImages = dir.filePath("x.npy").toStdString();
            cfg.trainLabels = dir.filePath("y.npy").toStdString();
            if (kind == "npy-f8") {
                std::vector<double> x8{0, 1, 2, 3, 4, 1e300, 6, 7};
                writeBytes(q(cfg.trainImages), npyBytes("<f8", "(4, 2)", rawBytes(x8)));
            } else if (kind == "npy-target") {
                x[5] = 5;
                writeBytes(q(cfg.trainImages), npyBytes("<f4", "(4, 2)", rawBytes(x)));
            } else {
                writeBytes(q(cfg.trainImages), npyBytes("<f4", "(4, 2)", rawBytes(x)));
            }
            if (kind == "npy-target")
                writeBytes(q(cfg.trainLabels),
                           npyBytes("<f4", "(4,)", rawBytes(std::vector<float>{0, nan, 1, 2})));
            else
                writeBytes(q(cfg.trainLabels), npyBytes("<i4", "(4,)", rawBytes(labels)));
        } else {
            cfg.type = "idx";
            cfg.trainImages = dir.filePath("x.idx").toStdString();
            cfg.trainLabels = dir.filePath("y.idx").toStdString();
            x[5] = -std::numeric_limits<float>::infinity();
            std::string payload;
            for (float v : x) {
                uint32_t bits;
                std::memcpy(&bits, &v, 4);
                appendBigEndian32(payload, bits);
            }
            writeBytes(q(cfg.trainImages), idxBytes(0x0D, {4, 2}, payload));
            writeBytes(q(cfg.trainLabels), idxBytes(0x08, {4}, std::string("\0\1\0\1", 4)));
        }
        Result<DataSplits> d = loadSource(cfg);
        QVERIFY2(!d.ok(), "a non-finite value was accepted");
        QVERIFY2(q(d.error()).contains(expected), d.error().c_str());
        QVERIFY2(q(d.error()).contains("drop_rows"), d.error().c_str());

        // drop_rows leaves the sample out, features and label together.
        cfg.nonFinite = NonFinitePolicy::DropRows;
        d = loadSource(cfg);
        QVERIFY2(d.ok(), d.ok() ? "" : d.error().c_str());
        const Dataset& t = d->train;
        QCOMPARE(t.size(), int64_t{3});
        QCOMPARE(t.x.data<float>()[4], 6.0f);  // sample 3 moved up
        if (t.y.dtype() == DType::I32) QCOMPARE(t.y.data<int32_t>()[2], 1);
        for (int64_t i = 0; i < t.x.size(); ++i) QVERIFY(std::isfinite(t.x.data<float>()[i]));
    }

    // ---- headers --------------------------------------------------------------------------------

    void idxZeroDimensionIsNamed_data() {
        QTest::addColumn<int>("zeroAt");  // 0-based
        QTest::addColumn<QString>("expected");
        QTest::newRow("samples") << 0 << "header dimension 1 of 3 is 0 (dimensions 0x2x3)";
        QTest::newRow("rows") << 1 << "header dimension 2 of 3 is 0 (dimensions 4x0x3)";
        QTest::newRow("columns") << 2 << "header dimension 3 of 3 is 0 (dimensions 4x2x0)";
    }
    void idxZeroDimensionIsNamed() {
        QFETCH(int, zeroAt);
        QFETCH(QString, expected);
        std::vector<uint32_t> dims{4, 2, 3};
        dims[static_cast<size_t>(zeroAt)] = 0;
        QTemporaryDir dir;
        for (bool gzip : {false, true}) {
            const QString path = dir.filePath(gzip ? "zero.idx.gz" : "zero.idx");
            writeBytes(path, idxBytes(0x08, dims, ""), gzip);
            Result<Tensor> t = readIdx(path.toStdString());
            QVERIFY2(!t.ok(), "a zero dimension was accepted");
            QVERIFY2(q(t.error()).startsWith(path), t.error().c_str());
            QVERIFY2(q(t.error()).contains(expected), t.error().c_str());
        }
    }

    void npyZeroDimensionIsNamed() {
        QTemporaryDir dir;
        const QString path = dir.filePath("zero.npy");
        writeBytes(path, npyBytes("<f4", "(3, 0)", ""));
        Result<Tensor> t = readNpy(path.toStdString());
        QVERIFY2(!t.ok(), "a zero dimension was accepted");
        QVERIFY2(q(t.error()).contains("shape [3,0]: dimension 2 of 2 is 0"), t.error().c_str());
    }

    // A header that declares more than the file holds, or more than memory holds, is refused
    // before the array is allocated (raw files are measured; gzip ones checked against the budget).
    void headerBeyondFileOrBudget() {
        ScopedEnv budget(kMemoryBudgetEnv, "1G");
        QTemporaryDir dir;
        const std::vector<uint32_t> huge{1u << 20, 1u << 12, 1u << 4};  // 2^36 u8 = 64 GiB
        const QString raw = dir.filePath("huge.idx");
        writeBytes(raw, idxBytes(0x08, huge, "abc"));
        Result<Tensor> t = readIdx(raw.toStdString());
        QVERIFY(!t.ok());
        QVERIFY2(
            q(t.error()).contains("truncated: header says 1048576x4096x16 = 68719476736 bytes, "
                                  "found 3"),
            t.error().c_str());
        // gzip: a header beyond what the compressed stream can expand to is refused as such ...
        const QString gz = dir.filePath("huge.idx.gz");
        writeBytes(gz, idxBytes(0x08, huge, "abc"), true);
        t = readIdx(gz.toStdString());
        QVERIFY(!t.ok());
        QVERIFY2(q(t.error()).contains("1048576x4096x16 = 68719476736 bytes, more than its gzip "
                                       "stream can hold"),
                 t.error().c_str());
        // ... and one the stream could hold is checked against the budget before allocating.
        {
            ScopedEnv small(kMemoryBudgetEnv, "32768");
            const QString gzFit = dir.filePath("fits-stream.idx.gz");
            writeBytes(gzFit, idxBytes(0x08, {256, 256}, std::string(65536, '\0')), true);
            t = readIdx(gzFit.toStdString());
            QVERIFY(!t.ok());
            QVERIFY2(q(t.error()).startsWith(gzFit + ": needs about 64.0 KiB of host memory, over "
                                                     "the budget of 32.0 KiB"),
                     t.error().c_str());
            QVERIFY2(q(t.error()).contains("the 256x256 u8 array its header declares"),
                     t.error().c_str());
        }
        const QString npy = dir.filePath("huge.npy");
        writeBytes(npy, npyBytes("<f8", "(1048576, 4096, 16)", "abcdefgh"));
        t = readNpy(npy.toStdString());
        QVERIFY(!t.ok());
        QVERIFY2(q(t.error()).contains("truncated: header says shape [1048576,4096,16] <f8"),
                 t.error().c_str());
    }

    // ---- labels against the model
    // ----------------------------------------------------------------

    void labelBeyondUnitsNamesFileSampleAndValue() {
        QTemporaryDir dir;
        SourceConfig cfg;
        cfg.type = "idx";
        cfg.trainImages = dir.filePath("train-images.idx").toStdString();
        cfg.trainLabels = dir.filePath("train-labels.idx").toStdString();
        std::string labels(100, '\0');
        for (size_t i = 0; i < labels.size(); ++i) labels[i] = static_cast<char>(i % 10);
        labels[57] = static_cast<char>(200);
        writeBytes(q(cfg.trainImages), idxBytes(0x08, {100, 2}, std::string(200, '\1')));
        writeBytes(q(cfg.trainLabels), idxBytes(0x08, {100}, labels));
        Result<DataSplits> d = loadSource(cfg);
        QVERIFY2(d.ok(), d.ok() ? "" : d.error().c_str());
        Status s = checkLabelsFit(cfg, *d, 10);
        QVERIFY(!s.ok());
        QCOMPARE(q(s.error()), q(cfg.trainLabels) +
                                   ": sample 57 has label 200: the data has 201 classes but the "
                                   "last layer has 10 units (class ids 0..9)");
        QVERIFY(checkLabelsFit(cfg, *d, 201).ok());

        // The test split is checked too, and named as such.
        labels[57] = 3;
        writeBytes(q(cfg.trainLabels), idxBytes(0x08, {100}, labels));
        cfg.testImages = dir.filePath("test-images.idx").toStdString();
        cfg.testLabels = dir.filePath("test-labels.idx").toStdString();
        writeBytes(q(cfg.testImages), idxBytes(0x08, {3, 2}, std::string(6, '\1')));
        writeBytes(q(cfg.testLabels), idxBytes(0x08, {3}, std::string("\1\2\14", 3)));
        d = loadSource(cfg);
        QVERIFY2(d.ok(), d.ok() ? "" : d.error().c_str());
        s = checkLabelsFit(cfg, *d, 10);
        QVERIFY(!s.ok());
        QVERIFY2(q(s.error()).startsWith(q(cfg.testLabels) + ": sample 2 has label 12"),
                 s.error().c_str());
    }

    void csvLabelBeyondUnitsNamesColumn() {
        QTemporaryDir dir;
        SourceConfig cfg;
        cfg.type = "csv";
        cfg.trainPath = dir.filePath("t.csv").toStdString();
        writeBytes(q(cfg.trainPath), "a,cls\n1,0\n2,1\n3,7\n");
        cfg.labelColumn = "cls";
        Result<DataSplits> d = loadSource(cfg);
        QVERIFY2(d.ok(), d.ok() ? "" : d.error().c_str());
        Status s = checkLabelsFit(cfg, *d, 3);
        QVERIFY(!s.ok());
        QVERIFY2(
            q(s.error()).startsWith(q(cfg.trainPath) + " (column 'cls'): sample 2 has label 7"),
            s.error().c_str());
    }

    // ---- the memory plan
    // -------------------------------------------------------------------------

    void budgetFromEnvironment_data() {
        QTest::addColumn<QString>("value");
        QTest::addColumn<double>("bytes");  // -1: refused
        QTest::newRow("plain") << "1073741824" << 1073741824.0;
        QTest::newRow("G") << "8G" << 8.0 * (1 << 30);
        QTest::newRow("MiB") << "512 MiB" << 512.0 * (1 << 20);
        QTest::newRow("gb lower case") << "2gb" << 2.0 * (1 << 30);
        QTest::newRow("word") << "lots" << -1.0;
        QTest::newRow("zero") << "0" << -1.0;
        QTest::newRow("unknown unit") << "3Q" << -1.0;
    }
    void budgetFromEnvironment() {
        QFETCH(QString, value);
        QFETCH(double, bytes);
        ScopedEnv env(kMemoryBudgetEnv, value.toStdString().c_str());
        Result<HostBudget> b = hostMemoryBudget();
        if (bytes < 0) {
            QVERIFY(!b.ok());
            QVERIFY2(q(b.error()).startsWith(kMemoryBudgetEnv), b.error().c_str());
            QVERIFY2(q(b.error()).contains(value), b.error().c_str());
        } else {
            QVERIFY2(b.ok(), b.ok() ? "" : b.error().c_str());
            QCOMPARE(b->bytes, bytes);
        }
    }

    void budgetDefaultsToThisMachine() {
        ScopedEnv env(kMemoryBudgetEnv, nullptr);
        Result<HostBudget> b = hostMemoryBudget();
        QVERIFY(b.ok());
        QVERIFY(b->bytes >= 64.0 * (1 << 20));
        QVERIFY(b->origin == "physical memory" || b->origin == "cgroup memory.max");
    }

    void planNamesLargestItemAndTotal() {
        MemoryPlan plan;
        plan.add("data.source.samples", "rows", 600.0 * (1 << 20));
        plan.add("data.pipeline.prefetch", "slots", 900.0 * (1 << 20));
        plan.add("model", "tiny", 1.0);
        QVERIFY(plan.check(HostBudget{2.0 * (1 << 30), "test"}).ok());
        Status s = plan.check(HostBudget{1.0 * (1 << 30), "test"});
        QVERIFY(!s.ok());
        QCOMPARE(q(s.error()),
                 QString("data.pipeline.prefetch: needs about 1.5 GiB of host memory, over the "
                         "budget of 1.0 GiB (test; set TRAINDECK_MEMORY_BUDGET to change it): "
                         "900.0 MiB for data.pipeline.prefetch (slots); 600.0 MiB for "
                         "data.source.samples (rows)"));
    }

    void formatBytesUnits() {
        QCOMPARE(q(formatBytes(12)), QString("12 bytes"));
        QCOMPARE(q(formatBytes(1536)), QString("1.5 KiB"));
        QCOMPARE(q(formatBytes(3.0 * (1 << 30))), QString("3.0 GiB"));
        QVERIFY(q(formatBytes(1e30)).endsWith("EiB"));
    }

    // Pipeline::create refuses what the plan refuses, before it allocates a slot or a thread.
    void pipelineRefusesWhatCannotFit_data() {
        QTest::addColumn<qint64>("prefetch");
        QTest::addColumn<qint64>("parallelCalls");
        QTest::addColumn<qint64>("oneHotDepth");
        QTest::addColumn<qint64>("batch");
        QTest::addColumn<QString>("expected");
        QTest::newRow("prefetch 1e12") << qint64(1e12) << qint64(2) << qint64(0) << qint64(32)
                                       << "pipeline.prefetch: needs about";
        QTest::newRow("parallel_calls 1e6")
            << qint64(4) << qint64(1000000) << qint64(0) << qint64(32)
            << "pipeline.parallel_calls: 1000000 map workers is more than this machine";
        QTest::newRow("one_hot depth 1e10") << qint64(4) << qint64(2) << qint64(1e10) << qint64(32)
                                            << "pipeline.map[0].depth: a one_hot depth of "
                                               "10000000000 is beyond the largest class id";
        QTest::newRow("one_hot depth 1e9") << qint64(4) << qint64(2) << qint64(1e9) << qint64(32)
                                           << "pipeline.map[0].depth: needs about";
        QTest::newRow("batch 1e9")
            << qint64(0) << qint64(1) << qint64(0) << qint64(1e9) << "batch_size: needs about";
    }
    void pipelineRefusesWhatCannotFit() {
        QFETCH(qint64, prefetch);
        QFETCH(qint64, parallelCalls);
        QFETCH(qint64, oneHotDepth);
        QFETCH(qint64, batch);
        QFETCH(QString, expected);
        ScopedEnv env(kMemoryBudgetEnv, "1G");
        PipelineConfig cfg;
        cfg.prefetch = prefetch;
        cfg.parallelCalls = parallelCalls;
        if (oneHotDepth) cfg.map.push_back(MapStep{.op = "one_hot", .depth = oneHotDepth});
        auto p = Pipeline::create(smallDataset(64, 4), cfg, batch, true, 1);
        QVERIFY2(!p.ok(), "an absurd pipeline was created");
        QVERIFY2(q(p.error()).contains(expected), p.error().c_str());
        QVERIFY2(q(p.error()).contains("budget") || q(p.error()).contains("map workers") ||
                     q(p.error()).contains("class id"),
                 p.error().c_str());
    }

    void pipelineWithinLimitsStillWorks() {
        ScopedEnv env(kMemoryBudgetEnv, "1G");
        PipelineConfig cfg;
        cfg.prefetch = 8;
        cfg.parallelCalls = maxParallelCalls();
        cfg.shuffleBuffer = int64_t{1} << 60;  // bounded by the data: harmless
        auto p = Pipeline::create(smallDataset(64, 4), cfg, 16, true, 1);
        QVERIFY2(p.ok(), p.ok() ? "" : p.error().c_str());
        QVERIFY((*p)->beginEpoch(0).ok());
        int batches = 0;
        while (true) {
            auto b = (*p)->next();
            QVERIFY(b.ok());
            if (!*b) break;
            ++batches;
        }
        QCOMPARE(batches, 4);
    }

    void syntheticSourceThatCannotFit_data() {
        QTest::addColumn<qint64>("samples");
        QTest::addColumn<qint64>("classes");
        QTest::addColumn<QString>("expected");
        QTest::newRow("1e12 samples") << qint64(1e12) << qint64(4) << "exceed the 2^31-1 supported";
        QTest::newRow("1e9 samples")
            << qint64(1e9) << qint64(4) << "synthetic data: samples: needs about";
        QTest::newRow("1e9 classes")
            << qint64(1000) << qint64(1e9) << "synthetic data: classes: needs about";
        QTest::newRow("1e10 classes")
            << qint64(1000) << qint64(1e10) << "classes do not fit 32-bit class ids";
    }
    void syntheticSourceThatCannotFit() {
        QFETCH(qint64, samples);
        QFETCH(qint64, classes);
        QFETCH(QString, expected);
        ScopedEnv env(kMemoryBudgetEnv, "1G");
        SourceConfig cfg;
        cfg.type = "synthetic";
        cfg.samples = samples;
        cfg.classes = classes;
        Result<DataSplits> d = loadSource(cfg);
        QVERIFY2(!d.ok(), "an absurd synthetic source was generated");
        QVERIFY2(q(d.error()).contains(expected), d.error().c_str());
    }

    // A decoded-source cache entry is held to the same budget as decoding: over it, the load fails
    // with the reader's own error, naming the source file.
    void decodedCacheEntryOverTheBudget() {
        QTemporaryDir dir, cache;
        ScopedEnv xdg("XDG_CACHE_HOME", cache.path().toStdString().c_str());
        ScopedEnv on(kDecodeCacheEnv, nullptr);
        const QString images = dir.filePath("images.idx.gz");
        writeBytes(images, idxBytes(0x08, {256, 256}, std::string(65536, '\3')), true);
        QVERIFY(readIdxCached(images.toStdString()).ok());
        const DecodeCacheStats before = decodeCacheStats();
        QVERIFY(readIdxCached(images.toStdString()).ok());
        QCOMPARE(decodeCacheStats().hits - before.hits, int64_t{1});

        ScopedEnv small(kMemoryBudgetEnv, "32768");
        Result<Tensor> t = readIdxCached(images.toStdString());
        QVERIFY(!t.ok());
        QCOMPARE(q(t.error()), q(readIdx(images.toStdString()).error()));
        QVERIFY2(q(t.error()).startsWith(images + ": needs about 64.0 KiB of host memory, over "
                                                  "the budget of 32.0 KiB"),
                 t.error().c_str());
    }
};

QTEST_GUILESS_MAIN(TestDataLimits)
#include "test_data_limits.moc"

// engine/data: sources (IDX, NPY, CSV, synthetic, Fashion-MNIST), the decoded-source cache, the
// batch-forming kernels and the tf.data-style pipeline.
#include <zlib.h>

#include <fcntl.h>
#include <sched.h>
#include <sys/stat.h>
#include <QDir>
#include <QFile>
#include <QTemporaryDir>
#include <QtTest>
#include <algorithm>

#include <atomic>
#include <chrono>
#include <cstring>
#include <ctime>
#include <functional>
#include <memory>
#include <set>
#include <thread>
#include <vector>

#include "engine/core/cpu_isa.h"
#include "engine/data/cache_file.h"
#include "engine/data/convert_kernels.h"
#include "engine/data/decode_cache.h"
#include "engine/data/pipeline.h"
#include "tests/scoped_env.h"

using namespace td;

Q_DECLARE_METATYPE(QList<MapStep>)

namespace {

// --- fixtures
// -------------------------------------------------------------------------------------

void writeBytes(const QString& path, const std::string& bytes, bool gzip) {
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

// An IDX file: magic 00 00 type ndim, big-endian dims, then `payload` (already big-endian).
std::string idxBytes(uint8_t type, const std::vector<uint32_t>& dims, const std::string& payload) {
    std::string s = {0, 0, static_cast<char>(type), static_cast<char>(dims.size())};
    for (uint32_t d : dims) appendBigEndian32(s, d);
    return s + payload;
}

// u8 images [n, 2, 3] with pixel value (i * 6 + k) % 256, and labels i % 10.
std::string idxImagesU8(uint32_t n) {
    std::string payload;
    for (uint32_t i = 0; i < n * 6; ++i) payload += static_cast<char>(i % 256);
    return idxBytes(0x08, {n, 2, 3}, payload);
}
std::string idxLabelsU8(uint32_t n) {
    std::string payload;
    for (uint32_t i = 0; i < n; ++i) payload += static_cast<char>(i % 10);
    return idxBytes(0x08, {n}, payload);
}

std::string npyBytes(const std::string& descr, const std::string& shape, const std::string& data,
                     int version = 1, bool fortran = false) {
    std::string header = "{'descr': '" + descr +
                         "', 'fortran_order': " + (fortran ? "True" : "False") +
                         ", 'shape': " + shape + ", }";
    const size_t prefix = version == 1 ? 10 : 12;
    while ((prefix + header.size() + 1) % 64 != 0) header += ' ';
    header += '\n';
    std::string s = "\x93NUMPY";
    s += static_cast<char>(version);
    s += '\0';
    const auto len = static_cast<uint32_t>(header.size());
    s += static_cast<char>(len & 0xff);
    s += static_cast<char>((len >> 8) & 0xff);
    if (version != 1) {
        s += static_cast<char>((len >> 16) & 0xff);
        s += static_cast<char>((len >> 24) & 0xff);
    }
    return s + header + data;
}

template <typename T>
std::string rawBytes(const std::vector<T>& v) {
    return std::string(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(T));
}

// n samples of `dims` u8 features, row i = (i * 7 + k) % 251, label i: the label names the row.
Dataset indexedDataset(int64_t n, int64_t dims = 5) {
    Dataset d;
    d.x = Tensor(DType::U8, {n, dims});
    d.y = Tensor(DType::I32, {n});
    for (int64_t i = 0; i < n; ++i) {
        for (int64_t k = 0; k < dims; ++k) {
            d.x.data<uint8_t>()[i * dims + k] = static_cast<uint8_t>((i * 7 + k) % 251);
        }
        d.y.data<int32_t>()[i] = static_cast<int32_t>(i);
    }
    d.numClasses = n;
    return d;
}

struct EpochOutput {
    std::vector<int32_t> labels;  // in output order
    std::vector<float> x;         // all batches' x, concatenated
    std::vector<float> yf;        // all batches' f32 y (one-hot or targets), concatenated
    std::vector<int64_t> sizes;
    std::vector<int64_t> firstIndices;
};

EpochOutput runEpoch(Pipeline& p, int epoch) {
    EpochOutput out;
    const Status begun = p.beginEpoch(epoch);
    if (!begun.ok()) qFatal("beginEpoch: %s", begun.error().c_str());
    while (true) {
        Result<const Batch*> b = p.next();
        if (!b.ok()) qFatal("next: %s", b.error().c_str());
        if (!*b) break;
        const Batch& batch = **b;
        out.sizes.push_back(batch.size);
        out.firstIndices.push_back(batch.firstIndex);
        if (batch.x.dim(0) != batch.size) qFatal("x rows != batch size");
        const float* x = batch.x.data<float>();
        out.x.insert(out.x.end(), x, x + batch.x.size());
        if (batch.y.dtype() == DType::I32) {
            const int32_t* y = batch.y.data<int32_t>();
            out.labels.insert(out.labels.end(), y, y + batch.size);
        } else {
            const float* y = batch.y.data<float>();
            out.yf.insert(out.yf.end(), y, y + batch.y.size());
        }
    }
    return out;
}

// One epoch as the trainer runs it: exactly batchesPerEpoch() calls to next(), each followed by
// `work` of consumer time; records the tuned values after every batch.
struct Consumed {
    std::vector<int32_t> labels;
    std::vector<int64_t> parallel, depth;
};
Consumed consume(Pipeline& p, int epoch, std::chrono::microseconds work) {
    Consumed out;
    const Status begun = p.beginEpoch(epoch);
    if (!begun.ok()) qFatal("beginEpoch: %s", begun.error().c_str());
    for (int64_t i = 0; i < p.batchesPerEpoch(); ++i) {
        Result<const Batch*> b = p.next();
        if (!b.ok() || !*b) qFatal("next: no batch %lld", static_cast<long long>(i));
        const int32_t* y = (*b)->y.data<int32_t>();
        out.labels.insert(out.labels.end(), y, y + (*b)->size);
        const PipelineStats st = p.stats();
        out.parallel.push_back(st.parallelCalls);
        out.depth.push_back(st.prefetchDepth);
        if (work.count() > 0) std::this_thread::sleep_for(work);
    }
    return out;
}

std::unique_ptr<Pipeline> makePipeline(const Dataset& d, const PipelineConfig& cfg, int64_t batch,
                                       bool shuffle = true, uint64_t seed = 7) {
    auto p = Pipeline::create(d, cfg, batch, shuffle, seed);
    if (!p.ok()) qFatal("Pipeline::create: %s", p.error().c_str());
    return std::move(p).value();
}

PipelineConfig shuffled(int64_t buffer, uint64_t seed = 42, bool reshuffle = true) {
    PipelineConfig cfg;
    cfg.shuffleBuffer = buffer;
    cfg.shuffleSeed = seed;
    cfg.reshuffleEachIteration = reshuffle;
    return cfg;
}

bool isPermutation(std::vector<int32_t> v, int64_t n) {
    if (static_cast<int64_t>(v.size()) != n) return false;
    std::sort(v.begin(), v.end());
    for (int64_t i = 0; i < n; ++i) {
        if (v[static_cast<size_t>(i)] != i) return false;
    }
    return true;
}

const char* kFashionDir = "/usr/share/datasets/fashion-mnist";

using td::test::ScopedEnv;

bool sameTensor(const Tensor& a, const Tensor& b) {
    return a.dtype() == b.dtype() && a.shape() == b.shape() &&
           std::memcmp(a.raw(), b.raw(), a.bytes()) == 0;
}

bool sameSplits(const DataSplits& a, const DataSplits& b) {
    if (!sameTensor(a.train.x, b.train.x) || !sameTensor(a.train.y, b.train.y)) return false;
    if (a.test.has_value() != b.test.has_value()) return false;
    return !a.test || (sameTensor(a.test->x, b.test->x) && sameTensor(a.test->y, b.test->y));
}

DecodeCacheStats statsSince(const DecodeCacheStats& before) {
    const DecodeCacheStats now = decodeCacheStats();
    return {now.hits - before.hits, now.decoded - before.decoded, now.written - before.written,
            now.rejected - before.rejected, now.writeFailures - before.writeFailures};
}

// Sets a file's modification time to `seconds` + `nanos` since the epoch.
void setMtime(const QString& path, int64_t seconds, int64_t nanos) {
    const timespec times[2] = {{static_cast<time_t>(seconds), static_cast<long>(nanos)},
                               {static_cast<time_t>(seconds), static_cast<long>(nanos)}};
    QCOMPARE(::utimensat(AT_FDCWD, path.toStdString().c_str(), times, 0), 0);
}

// An "idx" source of gzip'd files in `dir`: 40 u8 images of 2x3 and their labels, plus a raw
// (uncompressed) test split, which the cache leaves alone.
SourceConfig gzipIdxSource(const QTemporaryDir& dir) {
    writeBytes(dir.filePath("train-images.gz"), idxImagesU8(40), true);
    writeBytes(dir.filePath("train-labels.gz"), idxLabelsU8(40), true);
    writeBytes(dir.filePath("test-images.idx"), idxImagesU8(8), false);
    writeBytes(dir.filePath("test-labels.idx"), idxLabelsU8(8), false);
    SourceConfig cfg;
    cfg.type = "idx";
    cfg.trainImages = dir.filePath("train-images.gz").toStdString();
    cfg.trainLabels = dir.filePath("train-labels.gz").toStdString();
    cfg.testImages = dir.filePath("test-images.idx").toStdString();
    cfg.testLabels = dir.filePath("test-labels.idx").toStdString();
    return cfg;
}

// The source as decoded without any cache.
DataSplits decodedWithoutCache(const SourceConfig& cfg) {
    ScopedEnv off(kDecodeCacheEnv, "off");
    Result<DataSplits> s = loadSource(cfg);
    if (!s.ok()) qFatal("loadSource: %s", s.error().c_str());
    return std::move(s).value();
}

QStringList filesIn(const QString& dir) {
    return QDir(dir).entryList(QDir::Files | QDir::Hidden, QDir::Name);
}

}  // namespace

class TestData : public QObject {
    Q_OBJECT

  private slots:
    // Every test's decoded-source cache lives in this process's own folder, never the user's.
    void initTestCase() {
        QVERIFY(cacheHome_.isValid());
        ::setenv("XDG_CACHE_HOME", cacheHome_.path().toStdString().c_str(), 1);
        ::unsetenv(kDecodeCacheEnv);
        ::unsetenv(kDecodeCacheFaultBytesEnv);
    }

    // --- IDX ------------------------------------------------------------------------------------
    void idxRoundTrip_data() {
        QTest::addColumn<bool>("gzip");
        QTest::addColumn<int>("type");
        QTest::newRow("u8 raw") << false << 0x08;
        QTest::newRow("u8 gzip") << true << 0x08;
        QTest::newRow("i32 raw") << false << 0x0C;
        QTest::newRow("i32 gzip") << true << 0x0C;
        QTest::newRow("f32 gzip") << true << 0x0D;
        QTest::newRow("i16 raw") << false << 0x0B;
        QTest::newRow("f64 raw") << false << 0x0E;
    }
    void idxRoundTrip() {
        QFETCH(bool, gzip);
        QFETCH(int, type);
        QTemporaryDir dir;
        const QString path = dir.filePath(gzip ? "a.idx.gz" : "a.idx");
        // 4 x 3 values -2.5 * (i - 5), stored big-endian in the file's type.
        std::string payload;
        std::vector<double> values;
        for (int i = 0; i < 12; ++i) values.push_back(type == 0x08 ? i * 20 : -2.0 * (i - 5));
        for (double v : values) {
            if (type == 0x08) {
                payload += static_cast<char>(static_cast<uint8_t>(v));
            } else if (type == 0x0B) {
                const auto u = static_cast<uint16_t>(static_cast<int16_t>(v));
                payload += static_cast<char>(u >> 8);
                payload += static_cast<char>(u & 0xff);
            } else if (type == 0x0C) {
                appendBigEndian32(payload, static_cast<uint32_t>(static_cast<int32_t>(v)));
            } else if (type == 0x0D) {
                const auto f = static_cast<float>(v);
                uint32_t bits;
                std::memcpy(&bits, &f, 4);
                appendBigEndian32(payload, bits);
            } else {
                uint64_t bits;
                std::memcpy(&bits, &v, 8);
                appendBigEndian32(payload, static_cast<uint32_t>(bits >> 32));
                appendBigEndian32(payload, static_cast<uint32_t>(bits));
            }
        }
        writeBytes(path, idxBytes(static_cast<uint8_t>(type), {4, 3}, payload), gzip);

        Result<Tensor> t = readIdx(path.toStdString());
        QVERIFY2(t.ok(), t.ok() ? "" : t.error().c_str());
        QCOMPARE(t->shape(), (Shape{4, 3}));
        const DType expected = type == 0x08                   ? DType::U8
                               : type == 0x0D || type == 0x0E ? DType::F32
                                                              : DType::I32;
        QCOMPARE(t->dtype(), expected);
        const Tensor f = t->to(DType::F32);
        for (int i = 0; i < 12; ++i) QCOMPARE(f.data<float>()[i], static_cast<float>(values[i]));
    }

    void idxErrors_data() {
        QTest::addColumn<QByteArray>("bytes");
        QTest::addColumn<QString>("expected");
        const std::string full = idxImagesU8(10);
        QTest::newRow("truncated") << QByteArray::fromStdString(full.substr(0, full.size() - 7))
                                   << "truncated: header says 10x2x3 = 60 bytes, found 53";
        QTest::newRow("trailing") << QByteArray::fromStdString(full + "xyz") << "3 more bytes";
        QTest::newRow("wrong magic") << QByteArray::fromStdString("PK\x03\x04" + full.substr(4))
                                     << "not an IDX file: expected magic 00 00";
        QTest::newRow("bad type") << QByteArray::fromStdString(idxBytes(0x07, {2}, "ab"))
                                  << "found 00 00 07 01";
        QTest::newRow("short header") << QByteArray::fromStdString(full.substr(0, 9))
                                      << "truncated: header declares 3 dimensions";
    }
    void idxErrors() {
        QFETCH(QByteArray, bytes);
        QFETCH(QString, expected);
        QTemporaryDir dir;
        for (bool gzip : {false, true}) {
            const QString path = dir.filePath(gzip ? "images.gz" : "images.idx");
            writeBytes(path, bytes.toStdString(), gzip);
            Result<Tensor> t = readIdx(path.toStdString());
            QVERIFY(!t.ok());
            QVERIFY2(QString::fromStdString(t.error()).contains(expected), t.error().c_str());
            QVERIFY2(QString::fromStdString(t.error()).startsWith(path), t.error().c_str());
        }
    }

    void idxMissingFile() {
        Result<Tensor> t = readIdx("/nonexistent/train-images.gz");
        QVERIFY(!t.ok());
        QVERIFY(QString::fromStdString(t.error()).contains("/nonexistent/train-images.gz"));
    }

    void idxSourceLoadsSplits() {
        QTemporaryDir dir;
        writeBytes(dir.filePath("tx.gz"), idxImagesU8(12), true);
        writeBytes(dir.filePath("ty.gz"), idxLabelsU8(12), true);
        writeBytes(dir.filePath("vx"), idxImagesU8(4), false);
        writeBytes(dir.filePath("vy"), idxLabelsU8(4), false);
        SourceConfig cfg;
        cfg.type = "idx";
        cfg.trainImages = dir.filePath("tx.gz").toStdString();
        cfg.trainLabels = dir.filePath("ty.gz").toStdString();
        Result<DataSplits> s = loadSource(cfg);
        QVERIFY2(s.ok(), s.ok() ? "" : s.error().c_str());
        QCOMPARE(s->train.size(), int64_t{12});
        QVERIFY(!s->test.has_value());
        QCOMPARE(s->train.y.dtype(), DType::I32);
        QCOMPARE(s->train.numClasses, int64_t{10});
        QCOMPARE(s->train.sampleShape(), (Shape{2, 3}));

        cfg.testImages = dir.filePath("vx").toStdString();
        cfg.testLabels = dir.filePath("vy").toStdString();
        s = loadSource(cfg);
        QVERIFY2(s.ok(), s.ok() ? "" : s.error().c_str());
        QVERIFY(s->test.has_value());
        QCOMPARE(s->test->size(), int64_t{4});
    }

    void idxSampleCountMismatch() {
        QTemporaryDir dir;
        writeBytes(dir.filePath("train-images.gz"), idxImagesU8(12), true);
        writeBytes(dir.filePath("train-labels.gz"), idxLabelsU8(11), true);
        SourceConfig cfg;
        cfg.type = "idx";
        cfg.trainImages = dir.filePath("train-images.gz").toStdString();
        cfg.trainLabels = dir.filePath("train-labels.gz").toStdString();
        Result<DataSplits> s = loadSource(cfg);
        QVERIFY(!s.ok());
        const QString e = QString::fromStdString(s.error());
        QVERIFY2(e.contains("train-images.gz has 12 samples"), s.error().c_str());
        QVERIFY2(e.contains("train-labels.gz has 11 labels"), s.error().c_str());
    }

    // --- NPY ------------------------------------------------------------------------------------
    void npyDtypes_data() {
        QTest::addColumn<QByteArray>("bytes");
        QTest::addColumn<int>("dtype");
        QTest::addColumn<QList<double>>("values");
        const QList<double> values{0, 1.5, -3, 250};
        const QList<double> ints{0, 7, -3, 250};
        QTest::newRow("<f4 v1") << QByteArray::fromStdString(
                                       npyBytes("<f4", "(2, 2)",
                                                rawBytes(std::vector<float>{0, 1.5f, -3, 250})))
                                << int(DType::F32) << values;
        QTest::newRow("<f8 v2") << QByteArray::fromStdString(
                                       npyBytes("<f8", "(2, 2)",
                                                rawBytes(std::vector<double>{0, 1.5, -3, 250}), 2))
                                << int(DType::F32) << values;
        QTest::newRow("<i4 v3") << QByteArray::fromStdString(
                                       npyBytes("<i4", "(2, 2)",
                                                rawBytes(std::vector<int32_t>{0, 7, -3, 250}), 3))
                                << int(DType::I32) << ints;
        QTest::newRow("<i8 v1") << QByteArray::fromStdString(
                                       npyBytes("<i8", "(2, 2)",
                                                rawBytes(std::vector<int64_t>{0, 7, -3, 250})))
                                << int(DType::I32) << ints;
        QTest::newRow("|u1 v1") << QByteArray::fromStdString(
                                       npyBytes("|u1", "(2, 2)",
                                                rawBytes(std::vector<uint8_t>{0, 7, 3, 250})))
                                << int(DType::U8) << QList<double>{0, 7, 3, 250};
    }
    void npyDtypes() {
        QFETCH(QByteArray, bytes);
        QFETCH(int, dtype);
        QFETCH(QList<double>, values);
        QTemporaryDir dir;
        const QString path = dir.filePath("a.npy");
        writeBytes(path, bytes.toStdString(), false);
        Result<Tensor> t = readNpy(path.toStdString());
        QVERIFY2(t.ok(), t.ok() ? "" : t.error().c_str());
        QCOMPARE(int(t->dtype()), dtype);
        QCOMPARE(t->shape(), (Shape{2, 2}));
        const Tensor f = t->to(DType::F32);
        for (int i = 0; i < 4; ++i) QCOMPARE(f.data<float>()[i], static_cast<float>(values[i]));
    }

    void npyErrors_data() {
        QTest::addColumn<QByteArray>("bytes");
        QTest::addColumn<QString>("expected");
        QTest::newRow("complex dtype")
            << QByteArray::fromStdString(npyBytes("<c8", "(1,)", std::string(8, '\0')))
            << "unsupported dtype '<c8' (supported: <f4, <f8";
        QTest::newRow("big endian")
            << QByteArray::fromStdString(npyBytes(">f4", "(1,)", std::string(4, '\0')))
            << "unsupported dtype '>f4'";
        QTest::newRow("fortran") << QByteArray::fromStdString(
                                        npyBytes("<f4", "(2, 2)", std::string(16, '\0'), 1, true))
                                 << "fortran_order True is not supported";
        QTest::newRow("truncated")
            << QByteArray::fromStdString(npyBytes("<f4", "(3, 2)", std::string(20, '\0')))
            << "truncated: header says shape [3,2] <f4 = 24 bytes, found 20";
        QTest::newRow("not npy") << QByteArray("hello world, not numpy") << "not a .npy file";
        QTest::newRow("version 4")
            << QByteArray::fromStdString("\x93NUMPY\x04" + std::string(20, '\0'))
            << "unsupported .npy format version 4.0";
    }
    void npyErrors() {
        QFETCH(QByteArray, bytes);
        QFETCH(QString, expected);
        QTemporaryDir dir;
        const QString path = dir.filePath("bad.npy");
        writeBytes(path, bytes.toStdString(), false);
        Result<Tensor> t = readNpy(path.toStdString());
        QVERIFY(!t.ok());
        QVERIFY2(QString::fromStdString(t.error()).contains(expected), t.error().c_str());
        QVERIFY2(QString::fromStdString(t.error()).contains("bad.npy"), t.error().c_str());
    }

    void npySource() {
        QTemporaryDir dir;
        std::vector<float> x(6 * 3);
        for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(i);
        writeBytes(dir.filePath("x.npy"), npyBytes("<f4", "(6, 3)", rawBytes(x)), false);
        writeBytes(dir.filePath("y.npy"),
                   npyBytes("<i8", "(6,)", rawBytes(std::vector<int64_t>{0, 1, 2, 0, 1, 4})),
                   false);
        writeBytes(dir.filePath("y5.npy"),
                   npyBytes("<i8", "(5,)", rawBytes(std::vector<int64_t>{0, 1, 2, 0, 1})), false);
        SourceConfig cfg;
        cfg.type = "npy";
        cfg.trainImages = dir.filePath("x.npy").toStdString();
        cfg.trainLabels = dir.filePath("y.npy").toStdString();
        Result<DataSplits> s = loadSource(cfg);
        QVERIFY2(s.ok(), s.ok() ? "" : s.error().c_str());
        QCOMPARE(s->train.numClasses, int64_t{5});
        QCOMPARE(s->train.x.dtype(), DType::F32);

        cfg.trainLabels = dir.filePath("y5.npy").toStdString();
        s = loadSource(cfg);
        QVERIFY(!s.ok());
        QVERIFY2(QString::fromStdString(s.error()).contains("x.npy has 6 samples"),
                 s.error().c_str());
        QVERIFY2(QString::fromStdString(s.error()).contains("y5.npy has 5 labels"),
                 s.error().c_str());
    }

    // --- CSV ------------------------------------------------------------------------------------
    void csvLabels_data() {
        QTest::addColumn<QString>("text");
        QTest::addColumn<int>("labelType");
        QTest::addColumn<QList<double>>("labels");
        QTest::newRow("class ids") << "a,species,b\n1,0,2\n3,2,4\n\n5,1,6\n"
                                   << int(DType::I32) << QList<double>{0, 2, 1};
        QTest::newRow("float targets") << "a,species,b\r\n1,0.5,2\r\n3,2,4\r\n5,-1,6\r\n"
                                       << int(DType::F32) << QList<double>{0.5, 2, -1};
        QTest::newRow("quoted header") << "\"a\",\"species\",b\n1,\"0\",2\n3,2,4\n5,1,6"
                                       << int(DType::I32) << QList<double>{0, 2, 1};
    }
    void csvLabels() {
        QFETCH(QString, text);
        QFETCH(int, labelType);
        QFETCH(QList<double>, labels);
        QTemporaryDir dir;
        const QString path = dir.filePath("d.csv");
        writeBytes(path, text.toStdString(), false);
        Result<CsvData> c = readCsv(path.toStdString(), "species");
        QVERIFY2(c.ok(), c.ok() ? "" : c.error().c_str());
        QCOMPARE(c->x.shape(), (Shape{3, 2}));
        QCOMPARE(c->featureNames, (std::vector<std::string>{"a", "b"}));
        QCOMPARE(int(c->y.dtype()), labelType);
        const Tensor y = c->y.to(DType::F32);
        for (int i = 0; i < 3; ++i) QCOMPARE(y.data<float>()[i], static_cast<float>(labels[i]));
        const float expectedX[] = {1, 2, 3, 4, 5, 6};
        for (int i = 0; i < 6; ++i) QCOMPARE(c->x.data<float>()[i], expectedX[i]);
    }

    void csvErrors_data() {
        QTest::addColumn<QString>("text");
        QTest::addColumn<QString>("expected");
        QTest::newRow("missing column") << "a,b,c\n1,2,3\n"
                                        << "no label column 'species' (columns: a, b, c)";
        QTest::newRow("bad cell") << "a,species\n1,2\n3,4\nx1,5\n"
                                  << "d.csv:4: column 1 'a': 'x1' is not a number";
        QTest::newRow("field count") << "a,species\n1,2\n3,4,5\n"
                                     << "d.csv:3: expected 2 fields as in the header, found 3";
        QTest::newRow("empty") << ""
                               << "empty file";
        QTest::newRow("header only") << "a,species\n"
                                     << "no data rows";
    }
    void csvErrors() {
        QFETCH(QString, text);
        QFETCH(QString, expected);
        QTemporaryDir dir;
        const QString path = dir.filePath("d.csv");
        writeBytes(path, text.toStdString(), false);
        Result<CsvData> c = readCsv(path.toStdString(), "species");
        QVERIFY(!c.ok());
        QVERIFY2(QString::fromStdString(c.error()).contains(expected), c.error().c_str());
    }

    void csvSource() {
        QTemporaryDir dir;
        writeBytes(dir.filePath("train.csv"), "f1,f2,label\n0.5,1,0\n1.5,2,2\n2.5,3,1\n", false);
        writeBytes(dir.filePath("test.csv"), "f1,f2,label\n0.5,1,3\n", false);
        SourceConfig cfg;
        cfg.type = "csv";
        cfg.trainPath = dir.filePath("train.csv").toStdString();
        Result<DataSplits> s = loadSource(cfg);
        QVERIFY2(s.ok(), s.ok() ? "" : s.error().c_str());
        QVERIFY(!s->test.has_value());
        QCOMPARE(s->train.numClasses, int64_t{3});
        QCOMPARE(s->train.sampleShape(), (Shape{2}));
        cfg.testPath = dir.filePath("test.csv").toStdString();
        s = loadSource(cfg);
        QVERIFY2(s.ok(), s.ok() ? "" : s.error().c_str());
        QCOMPARE(s->test->size(), int64_t{1});
        QCOMPARE(s->train.numClasses, int64_t{4});  // the largest label of both splits
        QCOMPARE(s->test->numClasses, int64_t{4});
    }

    // --- synthetic, fashion_mnist, dispatch -----------------------------------------------------
    void syntheticDeterministic() {
        const Dataset a = makeSynthetic(300, {4, 2}, 3, 11);
        const Dataset b = makeSynthetic(300, {4, 2}, 3, 11);
        const Dataset c = makeSynthetic(300, {4, 2}, 3, 12);
        const Dataset prefix = makeSynthetic(100, {4, 2}, 3, 11);
        QCOMPARE(a.x.shape(), (Shape{300, 4, 2}));
        QCOMPARE(a.x.dtype(), DType::F32);
        QCOMPARE(a.y.dtype(), DType::I32);
        QCOMPARE(a.numClasses, int64_t{3});
        QCOMPARE(std::memcmp(a.x.raw(), b.x.raw(), a.x.bytes()), 0);
        QCOMPARE(std::memcmp(a.y.raw(), b.y.raw(), a.y.bytes()), 0);
        QVERIFY(std::memcmp(a.x.raw(), c.x.raw(), a.x.bytes()) != 0);
        QCOMPARE(std::memcmp(a.x.raw(), prefix.x.raw(), prefix.x.bytes()), 0);
    }

    // Nearest class mean fitted on the training split classifies the test split well: the problem
    // is learnable and both splits share the class centroids.
    void syntheticLearnable() {
        SourceConfig cfg;
        cfg.type = "synthetic";
        cfg.samples = 2000;
        cfg.testSamples = 500;
        cfg.sampleShape = {16};
        cfg.classes = 4;
        Result<DataSplits> s = loadSource(cfg);
        QVERIFY2(s.ok(), s.ok() ? "" : s.error().c_str());
        QVERIFY(s->test.has_value());
        QCOMPARE(s->train.size(), int64_t{2000});
        QCOMPARE(s->test->size(), int64_t{500});
        std::vector<double> means(4 * 16, 0.0);
        std::vector<int> counts(4, 0);
        for (int64_t i = 0; i < 2000; ++i) {
            const int label = s->train.y.data<int32_t>()[i];
            ++counts[static_cast<size_t>(label)];
            for (int k = 0; k < 16; ++k) {
                means[static_cast<size_t>(label * 16 + k)] += s->train.x.data<float>()[i * 16 + k];
            }
        }
        for (int c = 0; c < 4; ++c) {
            QVERIFY(counts[static_cast<size_t>(c)] > 300);
            for (int k = 0; k < 16; ++k)
                means[static_cast<size_t>(c * 16 + k)] /= counts[static_cast<size_t>(c)];
        }
        int correct = 0;
        for (int64_t i = 0; i < 500; ++i) {
            int best = 0;
            double bestDist = 1e300;
            for (int c = 0; c < 4; ++c) {
                double dist = 0;
                for (int k = 0; k < 16; ++k) {
                    const double diff = s->test->x.data<float>()[i * 16 + k] -
                                        means[static_cast<size_t>(c * 16 + k)];
                    dist += diff * diff;
                }
                if (dist < bestDist) {
                    bestDist = dist;
                    best = c;
                }
            }
            correct += best == s->test->y.data<int32_t>()[i];
        }
        QVERIFY2(correct > 450, qPrintable(QString("nearest-mean accuracy %1/500").arg(correct)));
    }

    void unknownSourceType() {
        SourceConfig cfg;
        cfg.type = "parquet";
        Result<DataSplits> s = loadSource(cfg);
        QVERIFY(!s.ok());
        QVERIFY2(QString::fromStdString(s.error()).contains(
                     "'parquet' (valid types: fashion_mnist, idx, npy, csv, synthetic, "
                     "image_directory, tfrecord)"),
                 s.error().c_str());
    }

    void fashionMnistMissing() {
        QTemporaryDir dir;
        qputenv("TRAINDECK_FASHION_MNIST_DIR", dir.path().toUtf8());
        SourceConfig cfg;
        Result<DataSplits> s = loadSource(cfg);
        qunsetenv("TRAINDECK_FASHION_MNIST_DIR");
        QVERIFY(!s.ok());
        QVERIFY2(QString::fromStdString(s.error()).contains("dataset-fashion-mnist"),
                 s.error().c_str());
        QVERIFY2(QString::fromStdString(s.error()).contains(dir.path()), s.error().c_str());
    }

    void fashionMnistReal() {
        if (!QDir(kFashionDir).exists()) QSKIP("dataset-fashion-mnist is not installed");
        qunsetenv("TRAINDECK_FASHION_MNIST_DIR");
        Result<DataSplits> s = loadSource(SourceConfig{});
        QVERIFY2(s.ok(), s.ok() ? "" : s.error().c_str());
        QCOMPARE(s->train.size(), int64_t{60000});
        QVERIFY(s->test.has_value());
        QCOMPARE(s->test->size(), int64_t{10000});
        QCOMPARE(s->train.sampleShape(), (Shape{28, 28}));
        QCOMPARE(s->test->sampleShape(), (Shape{28, 28}));
        QCOMPARE(s->train.x.dtype(), DType::U8);
        QCOMPARE(s->train.y.dtype(), DType::I32);
        QCOMPARE(s->train.numClasses, int64_t{10});
        QCOMPARE(s->train.classNames.size(), size_t{10});
        QCOMPARE(s->train.classNames[0], std::string("T-shirt/top"));
        QCOMPARE(s->train.classNames[9], std::string("Ankle boot"));
        std::vector<int> counts(10, 0);
        for (int64_t i = 0; i < 60000; ++i)
            ++counts[static_cast<size_t>(s->train.y.data<int32_t>()[i])];
        for (int c : counts) QCOMPARE(c, 6000);  // Fashion-MNIST is balanced
    }

    // Not a pass/fail check on speed: prints what the pipeline sustains with no consumer work.
    void fashionMnistThroughput() {
        if (!QDir(kFashionDir).exists()) QSKIP("dataset-fashion-mnist is not installed");
        Result<DataSplits> s = loadSource(SourceConfig{});
        QVERIFY(s.ok());
        for (const int64_t prefetch : {int64_t{0}, kAutotune}) {
            PipelineConfig cfg;
            cfg.map = {MapStep{.op = "scale", .factor = 1.0 / 255}};
            cfg.shuffleBuffer = 60000;
            cfg.prefetch = prefetch;
            auto p = makePipeline(s->train, cfg, 32);
            int64_t samples = 0;
            const auto start = std::chrono::steady_clock::now();
            for (int epoch = 0; epoch < 3; ++epoch) {
                QVERIFY(p->beginEpoch(epoch).ok());
                while (true) {
                    Result<const Batch*> b = p->next();
                    QVERIFY(b.ok());
                    if (!*b) break;
                    samples += (*b)->size;
                }
            }
            const double seconds =
                std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
            QCOMPARE(samples, int64_t{3 * 60000});
            const PipelineStats st = p->stats();
            qInfo(
                "fashion_mnist batch 32 scale 1/255 prefetch %s: %.0f samples/s (depth %lld, "
                "workers %lld, %.1f us to form a batch)",
                prefetch == 0 ? "0" : "AUTOTUNE", static_cast<double>(samples) / seconds,
                static_cast<long long>(st.prefetchDepth), static_cast<long long>(st.parallelCalls),
                st.producerSecondsPerBatch * 1e6);
        }
    }

    void splitTailKeras() {
        const Dataset d = indexedDataset(10);
        const auto [train, val] = splitTail(d, 0.25);  // int(10 * 0.75) = 7
        QCOMPARE(train.size(), int64_t{7});
        QCOMPARE(val.size(), int64_t{3});
        QCOMPARE(val.y.data<int32_t>()[0], 7);
        QCOMPARE(val.x.data<uint8_t>()[0], d.x.data<uint8_t>()[7 * 5]);
        QCOMPARE(train.numClasses, d.numClasses);
        const auto [all, none] = splitTail(d, 0.0);
        QCOMPARE(all.size(), int64_t{10});
        QCOMPARE(none.size(), int64_t{0});
    }

    // --- shuffle --------------------------------------------------------------------------------
    void shuffleSameSeedIsReproducibleAndAPermutation_data() {
        QTest::addColumn<qlonglong>("buffer");
        QTest::newRow("full") << 1000LL;
        QTest::newRow("larger than N") << 5000LL;
        QTest::newRow("partial") << 64LL;
    }
    void shuffleSameSeedIsReproducibleAndAPermutation() {
        QFETCH(qlonglong, buffer);
        const Dataset d = indexedDataset(1000);
        auto p1 = makePipeline(d, shuffled(buffer), 32);
        auto p2 = makePipeline(d, shuffled(buffer), 32);
        const EpochOutput a = runEpoch(*p1, 0), b = runEpoch(*p2, 0);
        QCOMPARE(a.labels, b.labels);
        QCOMPARE(a.x, b.x);
        QVERIFY(isPermutation(a.labels, 1000));
        std::vector<int32_t> identity(1000);
        for (int i = 0; i < 1000; ++i) identity[static_cast<size_t>(i)] = i;
        QVERIFY(a.labels != identity);
        auto p3 = makePipeline(d, shuffled(buffer, 43), 32);
        QVERIFY(runEpoch(*p3, 0).labels != a.labels);
    }

    void shuffleEachIteration() {
        const Dataset d = indexedDataset(500);
        auto reshuffling = makePipeline(d, shuffled(500, 42, true), 50);
        const EpochOutput e0 = runEpoch(*reshuffling, 0), e1 = runEpoch(*reshuffling, 1);
        QVERIFY(isPermutation(e1.labels, 500));
        QVERIFY(e0.labels != e1.labels);
        QCOMPARE(runEpoch(*reshuffling, 0).labels, e0.labels);  // epoch e's order is keyed by e

        auto fixed = makePipeline(d, shuffled(500, 42, false), 50);
        const EpochOutput f0 = runEpoch(*fixed, 0), f1 = runEpoch(*fixed, 1);
        QCOMPARE(f0.labels, f1.labels);
        QCOMPARE(runEpoch(*fixed, 5).labels, f0.labels);
    }

    void shuffleBufferSemantics_data() {
        QTest::addColumn<qlonglong>("buffer");
        QTest::newRow("1") << 1LL;
        QTest::newRow("2") << 2LL;
        QTest::newRow("10") << 10LL;
    }
    void shuffleBufferSemantics() {
        QFETCH(qlonglong, buffer);
        const Dataset d = indexedDataset(400);
        auto p = makePipeline(d, shuffled(buffer), 16);
        for (int epoch = 0; epoch < 3; ++epoch) {
            const EpochOutput e = runEpoch(*p, epoch);
            QVERIFY(isPermutation(e.labels, 400));
            bool moved = false;
            for (int pos = 0; pos < 400; ++pos) {
                // The output at position p was among the first p + buffer inputs.
                QVERIFY(e.labels[static_cast<size_t>(pos)] <= pos + buffer - 1);
                moved |= e.labels[static_cast<size_t>(pos)] != pos;
            }
            QCOMPARE(moved, buffer > 1);
        }
    }

    void noShuffleForEvaluation() {
        const Dataset d = indexedDataset(100);
        auto p = makePipeline(d, shuffled(100), 8, /*shuffle=*/false);
        const EpochOutput e = runEpoch(*p, 3);
        for (int i = 0; i < 100; ++i) QCOMPARE(e.labels[static_cast<size_t>(i)], i);
    }

    // --- batch ----------------------------------------------------------------------------------
    void batchRemainder_data() {
        QTest::addColumn<bool>("drop");
        QTest::addColumn<qlonglong>("prefetch");
        QTest::addColumn<QList<qlonglong>>("sizes");
        QTest::newRow("keep, sync") << false << 0LL << QList<qlonglong>{4, 4, 2};
        QTest::newRow("keep, prefetch")
            << false << qlonglong(kAutotune) << QList<qlonglong>{4, 4, 2};
        QTest::newRow("drop, sync") << true << 0LL << QList<qlonglong>{4, 4};
        QTest::newRow("drop, prefetch") << true << 3LL << QList<qlonglong>{4, 4};
    }
    void batchRemainder() {
        QFETCH(bool, drop);
        QFETCH(qlonglong, prefetch);
        QFETCH(QList<qlonglong>, sizes);
        const Dataset d = indexedDataset(10);
        PipelineConfig cfg;
        cfg.dropRemainder = drop;
        cfg.prefetch = prefetch;
        auto p = makePipeline(d, cfg, 4);
        QCOMPARE(p->batchesPerEpoch(), static_cast<int64_t>(sizes.size()));
        QCOMPARE(p->featureShape(), (Shape{5}));
        for (int epoch = 0; epoch < 2; ++epoch) {
            const EpochOutput e = runEpoch(*p, epoch);
            QCOMPARE(e.sizes.size(), static_cast<size_t>(sizes.size()));
            for (int i = 0; i < sizes.size(); ++i) {
                QCOMPARE(e.sizes[static_cast<size_t>(i)], static_cast<int64_t>(sizes[i]));
                QCOMPARE(e.firstIndices[static_cast<size_t>(i)], int64_t{4} * i);
            }
        }
    }

    void batchLargerThanDatasetWithDropIsAnError() {
        PipelineConfig cfg;
        cfg.dropRemainder = true;
        auto p = Pipeline::create(indexedDataset(10), cfg, 32, true, 1);
        QVERIFY(!p.ok());
        QVERIFY2(QString::fromStdString(p.error()).contains("leaves no batch"), p.error().c_str());
    }

    // --- map ------------------------------------------------------------------------------------
    void mapSteps_data() {
        QTest::addColumn<QList<MapStep>>("steps");
        QTest::addColumn<float>("from0");
        QTest::addColumn<float>("from255");
        QTest::newRow("none (cast to f32)") << QList<MapStep>{} << 0.0f << 255.0f;
        QTest::newRow("cast") << QList<MapStep>{MapStep{.op = "cast"}} << 0.0f << 255.0f;
        QTest::newRow("scale 1/255")
            << QList<MapStep>{MapStep{.op = "scale", .factor = 1.0 / 255}} << 0.0f << 1.0f;
        QTest::newRow("scale then normalize")
            << QList<MapStep>{MapStep{.op = "scale", .factor = 1.0 / 255},
                              MapStep{.op = "normalize", .mean = 0.5, .stddev = 0.25}}
            << -2.0f << 2.0f;
    }
    void mapSteps() {
        QFETCH(QList<MapStep>, steps);
        QFETCH(float, from0);
        QFETCH(float, from255);
        Dataset d;
        d.x = Tensor(DType::U8, {3, 2});
        d.y = Tensor(DType::I32, {3});
        const uint8_t pixels[] = {0, 255, 255, 0, 0, 0};
        std::memcpy(d.x.raw(), pixels, 6);
        PipelineConfig cfg;
        cfg.map = std::vector<MapStep>(steps.begin(), steps.end());
        auto p = makePipeline(d, cfg, 3, false);
        const EpochOutput e = runEpoch(*p, 0);
        QCOMPARE(e.x.size(), size_t{6});
        for (int i = 0; i < 6; ++i) {
            QCOMPARE(e.x[static_cast<size_t>(i)], pixels[i] == 255 ? from255 : from0);
        }
    }

    void mapOneHot() {
        Dataset d = indexedDataset(6);
        for (int i = 0; i < 6; ++i) d.y.data<int32_t>()[i] = (i * 5) % 3;
        PipelineConfig cfg;
        cfg.map = {MapStep{.op = "one_hot", .depth = 4}};
        cfg.shuffleBuffer = 6;
        auto p = makePipeline(d, cfg, 4);
        QVERIFY(p->beginEpoch(0).ok());
        int64_t rows = 0;
        while (true) {
            Result<const Batch*> b = p->next();
            QVERIFY(b.ok());
            if (!*b) break;
            const Batch& batch = **b;
            QCOMPARE(batch.y.dtype(), DType::F32);
            QCOMPARE(batch.y.shape(), (Shape{batch.size, 4}));
            for (int64_t r = 0; r < batch.size; ++r) {
                // x's first feature identifies the source row: (i * 7) % 251.
                const int i = static_cast<int>(batch.x.data<float>()[r * 5]) / 7;
                for (int c = 0; c < 4; ++c) {
                    QCOMPARE(batch.y.data<float>()[r * 4 + c], c == (i * 5) % 3 ? 1.0f : 0.0f);
                }
            }
            rows += batch.size;
        }
        QCOMPARE(rows, int64_t{6});
    }

    void mapErrors_data() {
        QTest::addColumn<QList<MapStep>>("steps");
        QTest::addColumn<QString>("expected");
        QTest::newRow("one_hot depth") << QList<MapStep>{MapStep{.op = "one_hot", .depth = 9}}
                                       << "depth 9 must exceed the largest label 9";
        QTest::newRow("unknown op") << QList<MapStep>{MapStep{.op = "flip"}}
                                    << "unknown map step 'flip' (valid steps: cast, scale";
        QTest::newRow("zero stddev")
            << QList<MapStep>{MapStep{.op = "normalize", .stddev = 0}} << "stddev";
    }
    void mapErrors() {
        QFETCH(QList<MapStep>, steps);
        QFETCH(QString, expected);
        PipelineConfig cfg;
        cfg.map = std::vector<MapStep>(steps.begin(), steps.end());
        auto p = Pipeline::create(indexedDataset(10), cfg, 4, true, 1);
        QVERIFY(!p.ok());
        QVERIFY2(QString::fromStdString(p.error()).contains(expected), p.error().c_str());
    }

    void oneHotNeedsClassIds() {
        Dataset d = indexedDataset(4);
        d.y = Tensor(DType::F32, {4, 1});
        PipelineConfig cfg;
        cfg.map = {MapStep{.op = "one_hot", .depth = 4}};
        auto p = Pipeline::create(d, cfg, 2, true, 1);
        QVERIFY(!p.ok());
        QVERIFY2(QString::fromStdString(p.error()).contains("class-id labels"), p.error().c_str());
    }

    void f32FeaturesAndTargets() {
        Dataset d;
        d.x = Tensor(DType::F32, {5, 3});
        d.y = Tensor(DType::F32, {5, 2});
        for (int i = 0; i < 15; ++i) d.x.data<float>()[i] = static_cast<float>(i);
        for (int i = 0; i < 10; ++i) d.y.data<float>()[i] = static_cast<float>(100 + i);
        PipelineConfig cfg;
        cfg.map = {MapStep{.op = "scale", .factor = 2}};
        cfg.shuffleBuffer = 5;
        auto p = makePipeline(d, cfg, 2);
        QVERIFY(p->beginEpoch(0).ok());
        std::set<int> seen;
        while (true) {
            Result<const Batch*> b = p->next();
            QVERIFY(b.ok());
            if (!*b) break;
            QCOMPARE((*b)->y.shape(), (Shape{(*b)->size, 2}));
            for (int64_t r = 0; r < (*b)->size; ++r) {
                const int i = static_cast<int>((*b)->x.data<float>()[r * 3]) / 6;  // 2 * (3i)
                QCOMPARE((*b)->x.data<float>()[r * 3 + 2], 2.0f * (3 * i + 2));
                QCOMPARE((*b)->y.data<float>()[r * 2 + 1], 100.0f + 2 * i + 1);
                seen.insert(i);
            }
        }
        QCOMPARE(seen.size(), size_t{5});
    }

    // --- threads --------------------------------------------------------------------------------
    // Parallel map and prefetch change when batches are formed, never what they contain.
    void threadedOutputEqualsSynchronous_data() {
        QTest::addColumn<qlonglong>("prefetch");
        QTest::addColumn<qlonglong>("parallelCalls");
        QTest::newRow("prefetch 1, 1 call") << 1LL << 1LL;
        QTest::newRow("prefetch 2, 4 calls") << 2LL << 4LL;
        QTest::newRow("prefetch AUTOTUNE, 1 call") << qlonglong(kAutotune) << 1LL;
        QTest::newRow("AUTOTUNE both") << qlonglong(kAutotune) << qlonglong(kAutotune);
        QTest::newRow("prefetch 8, 3 calls") << 8LL << 3LL;
    }
    void threadedOutputEqualsSynchronous() {
        QFETCH(qlonglong, prefetch);
        QFETCH(qlonglong, parallelCalls);
        const Dataset d = indexedDataset(1003, 37);
        PipelineConfig cfg = shuffled(300);
        cfg.map = {MapStep{.op = "scale", .factor = 1.0 / 255}};
        cfg.prefetch = 0;
        cfg.parallelCalls = 1;
        auto reference = makePipeline(d, cfg, 16);
        cfg.prefetch = prefetch;
        cfg.parallelCalls = parallelCalls;
        auto threaded = makePipeline(d, cfg, 16);
        for (int epoch = 0; epoch < 3; ++epoch) {
            const EpochOutput a = runEpoch(*reference, epoch), b = runEpoch(*threaded, epoch);
            QCOMPARE(b.labels, a.labels);
            QCOMPARE(b.x, a.x);
            QCOMPARE(b.sizes, a.sizes);
            QCOMPARE(b.firstIndices, a.firstIndices);
        }
        const PipelineStats st = threaded->stats();
        QVERIFY(st.prefetchDepth >= 1);
        QVERIFY(st.parallelCalls >= 1);
        if (parallelCalls > 0) QCOMPARE(st.parallelCalls, static_cast<int64_t>(parallelCalls));
        if (prefetch > 0) QCOMPARE(st.prefetchDepth, static_cast<int64_t>(prefetch));
        QCOMPARE(reference->stats().prefetchDepth, int64_t{0});
        QCOMPARE(reference->stats().parallelCalls, int64_t{1});
    }

    // AUTOTUNE starts the buffer at 8 and keeps it within [8, 16].
    void autotunePrefetchStaysWithinBounds() {
        const Dataset d = indexedDataset(20000, 784);
        PipelineConfig cfg;
        cfg.prefetch = kAutotune;
        cfg.parallelCalls = 1;
        auto p = makePipeline(d, cfg, 8);
        QCOMPARE(p->stats().prefetchDepth, int64_t{8});
        for (int epoch = 0; epoch < 2; ++epoch) runEpoch(*p, epoch);
        const PipelineStats st = p->stats();
        QVERIFY(st.prefetchDepth >= 8 && st.prefetchDepth <= 16);
        QVERIFY(st.producerSecondsPerBatch > 0);
    }

    // Batches come from the preallocated pool: the same buffers across epochs.
    void batchesComeFromAPool() {
        const Dataset d = indexedDataset(300);
        PipelineConfig cfg;
        cfg.prefetch = 3;
        cfg.parallelCalls = 2;
        auto p = makePipeline(d, cfg, 8);
        std::set<const void*> buffers;
        for (int epoch = 0; epoch < 4; ++epoch) {
            QVERIFY(p->beginEpoch(epoch).ok());
            while (true) {
                Result<const Batch*> b = p->next();
                QVERIFY(b.ok());
                if (!*b) break;
                buffers.insert((*b)->x.raw());
            }
        }
        QVERIFY(buffers.size() <= size_t{3 + 2 + 2});
    }

    // Stopping mid-epoch, restarting an epoch, or destroying a running pipeline never hangs.
    void earlyStopAndRestart() {
        const Dataset d = indexedDataset(2000, 64);
        for (const int64_t calls : {int64_t{1}, int64_t{4}}) {
            PipelineConfig cfg = shuffled(2000);
            cfg.prefetch = kAutotune;
            cfg.parallelCalls = calls;
            auto p = makePipeline(d, cfg, 10);
            QVERIFY(p->beginEpoch(0).ok());
            QVERIFY(p->next().ok());
            QVERIFY(p->beginEpoch(0).ok());  // restart the unfinished epoch
            const EpochOutput e = runEpoch(*p, 1);
            QVERIFY(isPermutation(e.labels, 2000));
            QVERIFY(p->beginEpoch(2).ok());
            for (int i = 0; i < 3; ++i) QVERIFY(p->next().ok());
            p.reset();  // destroy with workers mid-epoch
        }
        // Never started, and ended then destroyed.
        auto idle = makePipeline(d, PipelineConfig{}, 10);
        idle.reset();
    }

    void nextAfterEndKeepsReturningNull() {
        auto p = makePipeline(indexedDataset(10), PipelineConfig{}, 5);
        runEpoch(*p, 0);
        Result<const Batch*> b = p->next();
        QVERIFY(b.ok());
        QVERIFY(*b == nullptr);
    }

    // --- cache ----------------------------------------------------------------------------------
    void cacheFile_data() {
        QTest::addColumn<qlonglong>("prefetch");
        QTest::addColumn<qlonglong>("parallelCalls");
        QTest::newRow("sync") << 0LL << 1LL;
        QTest::newRow("prefetch, 3 calls") << qlonglong(kAutotune) << 3LL;
    }
    void cacheFile() {
        QFETCH(qlonglong, prefetch);
        QFETCH(qlonglong, parallelCalls);
        QTemporaryDir dir;
        const QString path = dir.filePath("train.cache");
        const Dataset d = indexedDataset(103, 6);
        PipelineConfig cfg;
        cfg.cache = "file:" + path.toStdString();
        cfg.prefetch = prefetch;
        cfg.parallelCalls = parallelCalls;
        auto p = makePipeline(d, cfg, 10);
        QVERIFY(!QFile::exists(path));

        // A partial first epoch publishes no cache file; its temporary is deleted.
        QVERIFY(p->beginEpoch(0).ok());
        QVERIFY(p->next().ok());
        QVERIFY(p->beginEpoch(0).ok());
        QVERIFY(!QFile::exists(path));
        QVERIFY(!p->stats().readingCacheFile);

        const EpochOutput e0 = runEpoch(*p, 0);
        QVERIFY(QFile::exists(path));
        QCOMPARE(QDir(dir.path()).entryList(QDir::Files), QStringList{"train.cache"});
        QVERIFY(p->stats().readingCacheFile);
        const EpochOutput e1 = runEpoch(*p, 1);
        QCOMPARE(e1.labels, e0.labels);
        QCOMPARE(e1.x, e0.x);

        // Epochs after the first read the file: a byte changed there shows up in the output.
        auto q = makePipeline(d, cfg, 10);
        QVERIFY(q->beginEpoch(0).ok());
        Result<const Batch*> first = q->next();
        QVERIFY(first.ok() && *first);
        runEpoch(*q, 0);
        QFile file(path);
        QVERIFY(file.open(QIODevice::ReadWrite));
        QVERIFY(file.seek(kCacheHeaderBytes));  // row 0, feature 0 (was 0)
        QCOMPARE(file.write("\x2a", 1), qint64{1});
        file.close();
        const EpochOutput changed = runEpoch(*q, 1);
        QCOMPARE(changed.x[0], 42.0f);
        QCOMPARE(changed.x[1], e0.x[1]);
    }

    // Removing a committed cache file does not disturb the run that wrote it (its mapping stays
    // valid); the next pipeline finds no file and builds it again without a message.
    void cacheFileRemovedBetweenEpochs() {
        QTemporaryDir dir;
        const QString path = dir.filePath("gone.cache");
        PipelineConfig cfg;
        cfg.cache = "file:" + path.toStdString();
        const Dataset d = indexedDataset(50);
        auto p = makePipeline(d, cfg, 8);
        const EpochOutput e0 = runEpoch(*p, 0);
        QVERIFY(QFile::remove(path));
        const EpochOutput e1 = runEpoch(*p, 1);
        QCOMPARE(e1.x, e0.x);
        QCOMPARE(p->stats().epochCacheElements, int64_t{50});
        auto q = makePipeline(d, cfg, 8);
        QVERIFY(q->messages().empty());
        QVERIFY(!q->stats().readingCacheFile);
        runEpoch(*q, 0);
        QCOMPARE(q->stats().epochSourceElements, int64_t{50});
        QVERIFY(QFile::exists(path));
    }

    // The trainer asks for exactly batchesPerEpoch() batches and never for the end: the pass still
    // commits when it hands out its last batch, and later epochs read the cache, not the source.
    void cacheCommitsWhenTheLastBatchIsHandedOut_data() {
        QTest::addColumn<QString>("cache");
        QTest::addColumn<qlonglong>("prefetch");
        QTest::newRow("file, sync") << "file" << 0LL;
        QTest::newRow("file, prefetch") << "file" << qlonglong(kAutotune);
        QTest::newRow("memory, sync") << "memory" << 0LL;
        QTest::newRow("memory, prefetch") << "memory" << qlonglong(kAutotune);
    }
    void cacheCommitsWhenTheLastBatchIsHandedOut() {
        QFETCH(QString, cache);
        QFETCH(qlonglong, prefetch);
        QTemporaryDir dir;
        const QString path = dir.filePath("c.cache");
        const Dataset d = indexedDataset(103, 6);
        PipelineConfig cfg = shuffled(50);
        cfg.cache = cache == "file" ? "file:" + path.toStdString() : std::string("memory");
        cfg.prefetch = prefetch;
        auto p = makePipeline(d, cfg, 10);
        for (int epoch = 0; epoch < 3; ++epoch) {
            const Consumed c = consume(*p, epoch, std::chrono::microseconds(0));
            QVERIFY(isPermutation(c.labels, 103));
            const PipelineStats st = p->stats();
            QVERIFY(st.cacheComplete);
            QCOMPARE(st.epochSourceElements, epoch == 0 ? int64_t{103} : int64_t{0});
            QCOMPARE(st.epochCacheElements, epoch == 0 ? int64_t{0} : int64_t{103});
            QCOMPARE(st.readingCacheFile, cache == "file");
            QCOMPARE(QFile::exists(path), cache == "file");
        }
    }

    // A cache step after map steps caches the mapped values (the file holds x*0.5, and one-hot
    // labels when one_hot comes first); later epochs apply only the steps after it, and reshuffle
    // the cached elements. Every epoch equals the uncached pipeline's output.
    void cacheAfterMapHoldsMappedValues_data() {
        QTest::addColumn<QString>("cache");
        QTest::addColumn<bool>("oneHotFirst");
        QTest::addColumn<qlonglong>("prefetch");
        QTest::newRow("file, sync") << "file" << false << 0LL;
        QTest::newRow("file, one_hot cached, prefetch") << "file" << true << qlonglong(kAutotune);
        QTest::newRow("memory, prefetch") << "memory" << false << qlonglong(kAutotune);
        QTest::newRow("memory, one_hot cached, sync") << "memory" << true << 0LL;
    }
    void cacheAfterMapHoldsMappedValues() {
        QFETCH(QString, cache);
        QFETCH(bool, oneHotFirst);
        QFETCH(qlonglong, prefetch);
        QTemporaryDir dir;
        const QString path = dir.filePath("mapped.cache");
        const int64_t n = 101, dims = 7;
        const Dataset d = indexedDataset(n, dims);
        const MapStep scale{.op = "scale", .factor = 0.5};
        const MapStep normalize{.op = "normalize", .mean = 3.0, .stddev = 2.0};
        const MapStep oneHot{.op = "one_hot", .depth = n};
        const MapStep cacheStep{.op = "cache"};
        PipelineConfig reference = shuffled(40);
        reference.cache = "none";
        reference.map = {scale, normalize, oneHot};
        reference.prefetch = 0;
        PipelineConfig cfg = reference;
        cfg.cache = cache == "file" ? "file:" + path.toStdString() : std::string("memory");
        cfg.map = oneHotFirst ? std::vector<MapStep>{scale, oneHot, cacheStep, normalize}
                              : std::vector<MapStep>{scale, cacheStep, normalize, oneHot};
        cfg.prefetch = prefetch;
        auto ref = makePipeline(d, reference, 8);
        auto p = makePipeline(d, cfg, 8);
        std::vector<float> firstRow;
        for (int epoch = 0; epoch < 3; ++epoch) {
            const EpochOutput a = runEpoch(*ref, epoch), b = runEpoch(*p, epoch);
            QCOMPARE(b.x, a.x);
            QCOMPARE(b.yf, a.yf);
            QCOMPARE(p->stats().epochCacheElements, epoch == 0 ? int64_t{0} : n);
            QCOMPARE(p->stats().epochSourceElements, epoch == 0 ? n : int64_t{0});
            if (epoch == 0) {
                firstRow.assign(b.x.begin(), b.x.begin() + dims);
            } else {  // reshuffled: another element comes first
                QVERIFY(std::vector<float>(b.x.begin(), b.x.begin() + dims) != firstRow);
            }
        }
        if (cache != "file") return;
        QFile file(path);
        QVERIFY(file.open(QIODevice::ReadOnly));
        const QByteArray bytes = file.readAll();
        std::vector<float> row0(dims);
        std::memcpy(row0.data(), bytes.constData() + kCacheHeaderBytes, dims * sizeof(float));
        for (int64_t k = 0; k < dims; ++k) QCOMPARE(row0[size_t(k)], 0.5f * float(k));
        const auto yBytes = static_cast<qsizetype>(oneHotFirst ? n * n * 4 : n * 4);
        float y1[3];
        std::memcpy(y1, bytes.constData() + bytes.size() - yBytes + (oneHotFirst ? n * 4 : 4),
                    sizeof y1);
        if (oneHotFirst) {
            QCOMPARE(y1[0], 0.0f);  // row 1 one-hot: [0, 1, 0, ...]
            QCOMPARE(y1[1], 1.0f);
            QCOMPARE(y1[2], 0.0f);
        } else {
            int32_t label = 0;
            std::memcpy(&label, y1, 4);
            QCOMPARE(label, 1);
        }
    }

    // A pass abandoned halfway is never committed (tf.data discards a partial cache): the next
    // epoch reads the source again and fills every row, also those drop_remainder leaves out.
    void cachePartialPassIsDiscarded() {
        const Dataset d = indexedDataset(100, 5);
        PipelineConfig reference = shuffled(100);
        reference.cache = "none";
        reference.dropRemainder = true;
        reference.map = {MapStep{.op = "scale", .factor = 0.5}};
        PipelineConfig cfg = reference;
        cfg.cache = "memory";
        cfg.map = {MapStep{.op = "scale", .factor = 0.5}, MapStep{.op = "cache"}};
        auto ref = makePipeline(d, reference, 8);
        auto p = makePipeline(d, cfg, 8);
        QVERIFY(p->beginEpoch(0).ok());
        for (int i = 0; i < 3; ++i) QVERIFY(p->next().ok());
        const EpochOutput e1 = runEpoch(*p, 1);
        QVERIFY(p->stats().cacheComplete);
        QCOMPARE(p->stats().epochSourceElements, int64_t{96});
        QCOMPARE(e1.x, runEpoch(*ref, 1).x);
        const EpochOutput e2 = runEpoch(*p, 2);
        QCOMPARE(p->stats().epochSourceElements, int64_t{0});
        QCOMPARE(p->stats().epochCacheElements, int64_t{96});
        QCOMPARE(e2.x, runEpoch(*ref, 2).x);
    }

    // A file cache outlives its pipeline: the next one (the next run) reads it from its first
    // epoch. One that does not hold these elements (other data, other steps before the cache, cut
    // short, damaged, not a cache) is rebuilt, and messages() says why.
    void cacheFileAcrossRuns() {
        QTemporaryDir dir;
        const QString path = dir.filePath("runs.cache");
        const Dataset d = indexedDataset(64, 5);
        PipelineConfig cfg = shuffled(64);
        cfg.cache = "file:" + path.toStdString();
        cfg.map = {MapStep{.op = "scale", .factor = 0.5}, MapStep{.op = "cache"}};
        auto p = makePipeline(d, cfg, 8);
        const EpochOutput e0 = runEpoch(*p, 0);
        p.reset();
        auto q = makePipeline(d, cfg, 8);
        QVERIFY(q->messages().empty());
        QVERIFY(q->stats().readingCacheFile);
        QCOMPARE(runEpoch(*q, 0).x, e0.x);
        QCOMPARE(q->stats().epochSourceElements, int64_t{0});
        QCOMPARE(q->stats().epochCacheElements, int64_t{64});
        q.reset();

        auto expectRebuilt = [&](const Dataset& data, const PipelineConfig& c, const QString& why) {
            auto r = makePipeline(data, c, 8);
            const std::vector<std::string> m = r->messages();
            QCOMPARE(m.size(), size_t{1});
            const QString text = QString::fromStdString(m[0]);
            QVERIFY2(text.contains(path) && text.contains(why) && text.contains("rebuilding"),
                     m[0].c_str());
            QVERIFY(!r->stats().readingCacheFile);
            runEpoch(*r, 0);
            QCOMPARE(r->stats().epochSourceElements, int64_t{64});
            r.reset();
            auto again = makePipeline(data, c, 8);
            QVERIFY(again->messages().empty());
            QVERIFY(again->stats().readingCacheFile);
        };
        Dataset changed = indexedDataset(64, 5);
        changed.x.data<uint8_t>()[3] ^= 1;
        expectRebuilt(changed, cfg, "other source data");
        PipelineConfig otherStep = cfg;
        otherStep.map[0].factor = 0.25;
        expectRebuilt(changed, otherStep, "other map steps");

        auto edit = [&](auto&& change) {
            QFile file(path);
            QVERIFY(file.open(QIODevice::ReadWrite));
            change(file);
        };
        edit([](QFile& f) { QVERIFY(f.resize(f.size() / 2)); });
        expectRebuilt(changed, otherStep, "bytes");
        edit([](QFile& f) {
            QVERIFY(f.seek(kCacheHeaderBytes + 9));
            QCOMPARE(f.write("\x7f", 1), qint64{1});
        });
        expectRebuilt(changed, otherStep, "damaged");
        edit([](QFile& f) { QCOMPARE(f.write("NOTCACHE", 8), qint64{8}); });
        expectRebuilt(changed, otherStep, "not a cache file");
    }

    // --- AUTOTUNE -------------------------------------------------------------------------------
    // Map parallelism follows the measured rates: a map that is slow against the consumer gets
    // more workers, the same pipeline fewer once its map becomes cheap. Sleeps stand in for the
    // map's cost, so the relation holds on a loaded machine; the order never changes.
    void autotuneParallelismFollowsMapCost() {
        const Dataset d = indexedDataset(640, 37);
        std::atomic<int> delayUs{2000};
        PipelineOptions opt;
        opt.cpuBudget = 4;
        opt.elementHook = [&delayUs](int64_t) {
            if (const int us = delayUs.load()) {
                std::this_thread::sleep_for(std::chrono::microseconds(us));
            }
        };
        PipelineConfig cfg = shuffled(640);
        cfg.prefetch = kAutotune;
        cfg.parallelCalls = kAutotune;
        auto created = Pipeline::create(d, cfg, 8, true, 7, opt);
        QVERIFY(created.ok());
        auto& p = *created;
        PipelineConfig seq = cfg;
        seq.prefetch = 0;
        auto reference = makePipeline(d, seq, 8);
        QCOMPARE(p->stats().maxParallelCalls, int64_t{4});

        const auto work = std::chrono::microseconds(1000);
        const Consumed slow = consume(*p, 0, work);
        const int64_t slowTuned = p->stats().parallelCalls;
        delayUs = 0;
        std::vector<Consumed> fast;
        for (int epoch = 1; epoch < 3; ++epoch) fast.push_back(consume(*p, epoch, work));
        const int64_t fastTuned = p->stats().parallelCalls;
        qInfo("tuned map workers: slow map %lld, fast map %lld (budget 4)",
              static_cast<long long>(slowTuned), static_cast<long long>(fastTuned));
        QVERIFY2(slowTuned > fastTuned,
                 qPrintable(QString("slow %1, fast %2").arg(slowTuned).arg(fastTuned)));
        QVERIFY(slowTuned >= 2);
        for (const Consumed* c : std::vector<const Consumed*>{&slow, &fast[0], &fast[1]}) {
            for (int64_t v : c->parallel) QVERIFY(v >= 1 && v <= 4);
        }
        QCOMPARE(slow.labels, consume(*reference, 0, std::chrono::microseconds(0)).labels);
        QCOMPARE(fast[1].labels, consume(*reference, 2, std::chrono::microseconds(0)).labels);
    }

    // The prefetch buffer stays at its floor when it is always full (a cheap map, a slower
    // consumer) and grows when the consumer waits (a map slower than the consumer), within
    // [8, cap].
    void autotunePrefetchFollowsWaits() {
        const Dataset d = indexedDataset(480, 37);
        PipelineConfig cfg;
        cfg.prefetch = kAutotune;
        cfg.parallelCalls = 1;
        auto full = makePipeline(d, cfg, 8);
        QCOMPARE(full->stats().prefetchDepth, int64_t{8});
        const Consumed a = consume(*full, 0, std::chrono::microseconds(3000));
        const int64_t minDepth = *std::min_element(a.depth.begin(), a.depth.end());
        const int64_t maxFull = *std::max_element(a.depth.begin(), a.depth.end());
        QVERIFY2(minDepth == 8 && maxFull == 8,
                 qPrintable(QString("%1..%2").arg(minDepth).arg(maxFull)));

        PipelineOptions opt;
        opt.elementHook = [](int64_t) {
            std::this_thread::sleep_for(std::chrono::microseconds(500));
        };
        auto created = Pipeline::create(d, cfg, 8, false, 7, opt);
        QVERIFY(created.ok());
        const Consumed b = consume(**created, 0, std::chrono::microseconds(0));
        const int64_t maxDepth = *std::max_element(b.depth.begin(), b.depth.end());
        QVERIFY2(maxDepth > 8 && maxDepth <= 16, qPrintable(QString::number(maxDepth)));
        QVERIFY((*created)->stats().consumerWaits > 0);
    }

    // Without a budget, AUTOTUNE may use the cores this process can be scheduled on.
    void autotuneBudgetIsTheSchedulableCores() {
        cpu_set_t set;
        CPU_ZERO(&set);
        QCOMPARE(sched_getaffinity(0, sizeof set, &set), 0);
        PipelineConfig cfg;
        cfg.parallelCalls = kAutotune;
        auto p = makePipeline(indexedDataset(100), cfg, 10);
        QCOMPARE(p->stats().maxParallelCalls, std::min<int64_t>(CPU_COUNT(&set), 8));
        QVERIFY(p->stats().parallelCalls <= p->stats().maxParallelCalls);
    }

    // AUTOTUNE forms an epoch's batches inline (no workers) once the consumer's step holds every
    // schedulable core and the last epoch formed a batch within kInlineMaxBatchSeconds; the
    // batches are those of the workers and of prefetch 0. The first epoch runs on workers. A
    // consumer that leaves a core free, a fixed prefetch or parallel_calls, or a map slower than
    // the limit keep the workers.
    void autotuneFormsInlineWhenTheStepHoldsEveryCore() {
        cpu_set_t set;
        CPU_ZERO(&set);
        QCOMPARE(sched_getaffinity(0, sizeof set, &set), 0);
        const int64_t cores = CPU_COUNT(&set);
        const Dataset d = indexedDataset(403, 6);
        PipelineConfig cfg = shuffled(100);
        cfg.map = {MapStep{.op = "scale", .factor = 1.0 / 255}};
        cfg.prefetch = 0;
        cfg.parallelCalls = 1;
        auto reference = makePipeline(d, cfg, 8);
        auto make = [&](int64_t prefetch, int64_t parallel, int64_t consumerThreads,
                        std::function<void(int64_t)> hook = {}) {
            PipelineConfig c = cfg;
            c.prefetch = prefetch;
            c.parallelCalls = parallel;
            PipelineOptions opt;
            opt.consumerThreads = consumerThreads;
            opt.elementHook = std::move(hook);
            auto p = Pipeline::create(d, c, 8, true, 7, opt);
            if (!p.ok()) qFatal("Pipeline::create: %s", p.error().c_str());
            return std::move(p).value();
        };
        // Epochs 1..5: inline once a batch formed fast enough (a tiny map: microseconds, but a
        // worker preempted at the end of an epoch may leave one epoch on workers). Returns the
        // epochs formed inline; -1 when epoch 0 was, or an inline epoch's report was wrong, or
        // (`compare`) a batch differed from prefetch 0's.
        auto inlineEpochs = [&](Pipeline& p, bool compare) -> int {
            int count = 0;
            for (int epoch = 0; epoch < 6; ++epoch) {
                const EpochOutput got = runEpoch(p, epoch);
                const PipelineStats st = p.stats();
                if (st.formingInline) {
                    if (epoch == 0 || st.prefetchDepth != 0 ||
                        describePipeline(st).find("batches formed inline") == std::string::npos)
                        return -1;
                    ++count;
                }
                if (compare) {
                    const EpochOutput want = runEpoch(*reference, epoch);
                    if (got.labels != want.labels || got.x != want.x ||
                        got.firstIndices != want.firstIndices)
                        return -1;
                }
            }
            return count;
        };
        auto all = make(kAutotune, kAutotune, cores);
        const int formed = inlineEpochs(*all, true);
        QVERIFY2(formed >= 3, qPrintable(QString("%1 of 5 epochs inline").arg(formed)));
        // More consumer threads than cores: the same.
        QVERIFY(inlineEpochs(*make(kAutotune, kAutotune, cores + 3), false) >= 3);
        // Not every core held, or not AUTOTUNE for both: workers throughout.
        QCOMPARE(inlineEpochs(*make(kAutotune, kAutotune, cores - 1), true), 0);
        QCOMPARE(inlineEpochs(*make(kAutotune, kAutotune, 0), false), 0);
        QCOMPARE(inlineEpochs(*make(4, kAutotune, cores), false), 0);
        QCOMPARE(inlineEpochs(*make(kAutotune, 2, cores), false), 0);
        // A map slower than the limit (8 elements of at least 7 us each a batch): workers.
        auto slow = make(kAutotune, kAutotune, cores, [](int64_t) {
            std::this_thread::sleep_for(std::chrono::microseconds(7));
        });
        QCOMPARE(inlineEpochs(*slow, true), 0);
        QVERIFY(slow->stats().producerSecondsPerBatch > kInlineMaxBatchSeconds);
    }

    // A consumer that forms inline batches on an otherwise idle thread of its step
    // (PipelineOptions::formsAside): the limit is then also kInlineAsideShare of its own time per
    // batch. A map of 8 elements of at least 7 us a batch (over kInlineMaxBatchSeconds) forms
    // inline under a consumer that works 10 ms a batch, on workers under one that does not work;
    // TRAINDECK_INLINE_MAX_US, when set, is the only limit. The batches are prefetch 0's.
    void autotuneFormsInlineWithinAShareOfAStepThatFormsAside() {
        cpu_set_t set;
        CPU_ZERO(&set);
        QCOMPARE(sched_getaffinity(0, sizeof set, &set), 0);
        const Dataset d = indexedDataset(96, 6);
        PipelineConfig cfg = shuffled(96);
        cfg.prefetch = 0;
        cfg.parallelCalls = 1;
        auto reference = makePipeline(d, cfg, 8);
        cfg.prefetch = kAutotune;
        cfg.parallelCalls = kAutotune;
        // Epochs 0-2: how many formed inline (-1: epoch 0 did, or the labels differed).
        auto inlineEpochs = [&](std::chrono::microseconds work, bool aside) {
            PipelineOptions opt;
            opt.consumerThreads = CPU_COUNT(&set);
            opt.formsAside = aside;
            opt.elementHook = [](int64_t) {
                std::this_thread::sleep_for(std::chrono::microseconds(7));
            };
            auto made = Pipeline::create(d, cfg, 8, true, 7, opt);
            if (!made.ok()) qFatal("Pipeline::create: %s", made.error().c_str());
            Pipeline& p = **made;
            int count = 0;
            for (int epoch = 0; epoch < 3; ++epoch) {
                const Consumed got = consume(p, epoch, work);
                if (got.labels != consume(*reference, epoch, std::chrono::microseconds(0)).labels)
                    return -1;
                if (p.stats().formingInline) {
                    if (epoch == 0) return -1;
                    ++count;
                }
            }
            return count;
        };
        const auto busy = std::chrono::microseconds(10000), idle = std::chrono::microseconds(0);
        QCOMPARE(inlineEpochs(busy, true), 2);
        QCOMPARE(inlineEpochs(idle, true), 0);
        QCOMPARE(inlineEpochs(busy, false), 0);
        const ScopedEnv limit("TRAINDECK_INLINE_MAX_US", "0");
        QCOMPARE(inlineEpochs(busy, true), 0);
    }

    // Batches formed in next() (prefetch 0) rotate through a few slots of the pool: each stays
    // valid, unchanged, until the second call after it, so a consumer may form the next batch
    // while it still reads this one (the trainer's helper does).
    void inlineBatchStaysValidUntilTheSecondCallAfterIt() {
        const Dataset d = indexedDataset(200, 6);
        PipelineConfig cfg = shuffled(200);
        cfg.prefetch = 0;
        cfg.map = {MapStep{.op = "scale", .factor = 1.0 / 255}};
        auto p = makePipeline(d, cfg, 8);
        QVERIFY(p->beginEpoch(0).ok());
        const Batch* held = nullptr;
        std::vector<float> heldX;
        std::vector<int32_t> heldY;
        for (int64_t i = 0; i < p->batchesPerEpoch(); ++i) {
            Result<const Batch*> b = p->next();
            QVERIFY(b.ok() && *b);
            if (held) {
                QVERIFY(*b != held);
                QVERIFY(std::equal(heldX.begin(), heldX.end(), held->x.data<float>()));
                QVERIFY(std::equal(heldY.begin(), heldY.end(), held->y.data<int32_t>()));
            }
            held = *b;
            heldX.assign(held->x.data<float>(), held->x.data<float>() + held->x.size());
            heldY.assign(held->y.data<int32_t>(), held->y.data<int32_t>() + held->size);
        }
    }

    // A slower consumer wakes the worker once per half window, not once per batch; the batches
    // are the same.
    void consumerWakesWorkersInBursts() {
        const Dataset d = indexedDataset(480, 37);
        PipelineConfig cfg = shuffled(480, 5);
        cfg.prefetch = 8;
        cfg.parallelCalls = 1;  // window 9: a wake-up once 4 batches are free
        auto p = makePipeline(d, cfg, 8);
        auto reference = makePipeline(
            d,
            [&] {
                PipelineConfig c = cfg;
                c.prefetch = 0;
                return c;
            }(),
            8);
        const Consumed got = consume(*p, 0, std::chrono::microseconds(1000));
        QCOMPARE(got.labels, consume(*reference, 0, std::chrono::microseconds(0)).labels);
        const PipelineStats st = p->stats();
        qInfo("%lld wake-ups for 60 batches", static_cast<long long>(st.consumerWakeups));
        QVERIFY2(st.consumerWakeups >= 1 && st.consumerWakeups <= 30,
                 qPrintable(QString("%1 wake-ups for 60 batches").arg(st.consumerWakeups)));
    }

    // Whatever the window, the consumer never waits for a batch no worker will form, and the
    // batches come in order: windows of 2 to 11 batches, 1 to 3 workers, a map and a consumer
    // of varying speed.
    void burstWakeupsNeverStall() {
        const Dataset d = indexedDataset(203, 11);
        for (const int64_t prefetch : {1, 2, 3, 5, 8}) {
            for (const int64_t parallel : {1, 2, 3}) {
                PipelineConfig cfg = shuffled(100, 9);
                cfg.prefetch = prefetch;
                cfg.parallelCalls = parallel;
                PipelineOptions opt;
                opt.elementHook = [](int64_t i) {
                    if (i % 17 == 0) std::this_thread::sleep_for(std::chrono::microseconds(200));
                };
                auto created = Pipeline::create(d, cfg, 7, true, 7, opt);
                QVERIFY(created.ok());
                PipelineConfig inlineCfg = cfg;
                inlineCfg.prefetch = 0;
                auto reference = makePipeline(d, inlineCfg, 7);
                for (int epoch = 0; epoch < 2; ++epoch) {
                    const auto work = std::chrono::microseconds(epoch == 0 ? 0 : 150);
                    QCOMPARE(consume(**created, epoch, work).labels,
                             consume(*reference, epoch, std::chrono::microseconds(0)).labels);
                }
            }
        }
    }

    void cacheFileUnwritable() {
        PipelineConfig cfg;
        cfg.cache = "file:/nonexistent-dir/sub/train.cache";
        auto p = Pipeline::create(indexedDataset(10), cfg, 4, true, 1);
        QVERIFY(!p.ok());
        QVERIFY2(QString::fromStdString(p.error()).contains("/nonexistent-dir/sub/train.cache"),
                 p.error().c_str());
    }

    void cacheConfigErrors() {
        PipelineConfig cfg;
        cfg.cache = "disk";
        auto p = Pipeline::create(indexedDataset(10), cfg, 4, true, 1);
        QVERIFY(!p.ok());
        QVERIFY2(QString::fromStdString(p.error()).contains("none, memory, file:<path>"),
                 p.error().c_str());
    }

    // --- decoded-source cache -------------------------------------------------------------------
    void decodeCacheFolder() {
        {
            ScopedEnv xdg("XDG_CACHE_HOME", "/tmp/xdg-cache/");
            QCOMPARE(QString::fromStdString(decodeCacheDir()),
                     QString("/tmp/xdg-cache/traindeck/decoded"));
        }
        {
            // A relative XDG_CACHE_HOME is ignored (XDG base directory spec).
            ScopedEnv xdg("XDG_CACHE_HOME", "relative/cache");
            ScopedEnv home("HOME", "/home/someone");
            QCOMPARE(QString::fromStdString(decodeCacheDir()),
                     QString("/home/someone/.cache/traindeck/decoded"));
        }
        for (const char* off : {"off", "OFF", "0", "false", "no"}) {
            ScopedEnv env(kDecodeCacheEnv, off);
            QVERIFY2(decodeCacheDir().empty(), off);
        }
        ScopedEnv on(kDecodeCacheEnv, "on");
        QVERIFY(!decodeCacheDir().empty());
    }

    // The first load decodes and writes one entry per gzip file; the second reads them and
    // returns the same tensors.
    void decodeCacheSecondLoadReadsIt() {
        QTemporaryDir data, cache;
        ScopedEnv xdg("XDG_CACHE_HOME", cache.path().toStdString().c_str());
        const SourceConfig cfg = gzipIdxSource(data);
        const DataSplits reference = decodedWithoutCache(cfg);
        const QString dir = QString::fromStdString(decodeCacheDir());

        DecodeCacheStats before = decodeCacheStats();
        Result<DataSplits> first = loadSource(cfg);
        QVERIFY2(first.ok(), first.ok() ? "" : first.error().c_str());
        DecodeCacheStats d = statsSince(before);
        QCOMPARE(d.hits, int64_t{0});
        QCOMPARE(d.decoded, int64_t{2});  // the raw test split is read as it is
        QCOMPARE(d.written, int64_t{2});
        QVERIFY(first->notes.empty());
        QVERIFY(sameSplits(*first, reference));
        QCOMPARE(filesIn(dir).size(), 2);  // no temporary file left
        QVERIFY(QFile::exists(
            QString::fromStdString(decodeCacheEntry(dir.toStdString(), cfg.trainImages))));

        before = decodeCacheStats();
        Result<DataSplits> second = loadSource(cfg);
        QVERIFY2(second.ok(), second.ok() ? "" : second.error().c_str());
        d = statsSince(before);
        QCOMPARE(d.hits, int64_t{2});
        QCOMPARE(d.decoded, int64_t{0});
        QCOMPARE(d.written, int64_t{0});
        QVERIFY(sameSplits(*second, reference));
        QCOMPARE(second->train.numClasses, reference.train.numClasses);

        // readIdxCached on its own, and through another spelling of the same path.
        before = decodeCacheStats();
        const std::string dotted = data.path().toStdString() + "/./train-images.gz";
        Result<Tensor> t = readIdxCached(dotted);
        QVERIFY(t.ok());
        QCOMPARE(statsSince(before).hits, int64_t{1});
        QVERIFY(sameTensor(*t, *readIdx(cfg.trainImages)));
        // A tensor read from an entry is the caller's to change: the entry stays as it was.
        t->data<uint8_t>()[0] ^= 0xff;
        before = decodeCacheStats();
        QVERIFY(sameTensor(*readIdxCached(cfg.trainImages), *readIdx(cfg.trainImages)));
        QCOMPARE(statsSince(before).hits, int64_t{1});
    }

    // A source whose modification time (or size, or content) changed makes its entry stale:
    // ignored, decoded again, rewritten.
    void decodeCacheSourceTouched() {
        QTemporaryDir data, cache;
        ScopedEnv xdg("XDG_CACHE_HOME", cache.path().toStdString().c_str());
        const SourceConfig cfg = gzipIdxSource(data);
        const QString images = QString::fromStdString(cfg.trainImages);
        setMtime(images, 1700000000, 100);
        QVERIFY(loadSource(cfg).ok());

        // Only the nanoseconds differ.
        setMtime(images, 1700000000, 200);
        DecodeCacheStats before = decodeCacheStats();
        Result<DataSplits> s = loadSource(cfg);
        QVERIFY(s.ok());
        DecodeCacheStats d = statsSince(before);
        QCOMPARE(d.rejected, int64_t{1});
        QCOMPARE(d.decoded, int64_t{1});
        QCOMPARE(d.written, int64_t{1});
        QCOMPARE(d.hits, int64_t{1});  // the labels
        QVERIFY(s->notes.empty());     // a stale entry is routine, not news
        before = decodeCacheStats();
        QVERIFY(loadSource(cfg).ok());
        QCOMPARE(statsSince(before).hits, int64_t{2});

        // New content: the next load returns it, not the old array.
        writeBytes(images, idxImagesU8(40).replace(20, 1, "\x7f"), true);
        setMtime(images, 1700000100, 0);
        const DataSplits changed = decodedWithoutCache(cfg);
        before = decodeCacheStats();
        s = loadSource(cfg);
        QVERIFY(s.ok());
        QCOMPARE(statsSince(before).rejected, int64_t{1});
        QVERIFY(sameSplits(*s, changed));
        QCOMPARE(s->train.x.data<uint8_t>()[4], uint8_t{0x7f});
    }

    // Damaged or foreign entries are never trusted: ignored, deleted, rewritten, and the load
    // returns the source's arrays.
    void decodeCacheCorruptEntry_data() {
        QTest::addColumn<QString>("damage");
        QTest::addColumn<QString>("why");
        QTest::newRow("payload byte") << "payload"
                                      << "its array is damaged";
        QTest::newRow("header byte") << "header"
                                     << "its header is damaged";
        QTest::newRow("cut short") << "truncate"
                                   << "cut short";
        QTest::newRow("appended") << "append"
                                  << "overlong";
        QTest::newRow("garbage") << "garbage"
                                 << "not a decoded-source cache entry";
        QTest::newRow("empty") << "empty"
                               << "shorter than its header";
    }
    void decodeCacheCorruptEntry() {
        QFETCH(QString, damage);
        QFETCH(QString, why);
        QTemporaryDir data, cache;
        ScopedEnv xdg("XDG_CACHE_HOME", cache.path().toStdString().c_str());
        const SourceConfig cfg = gzipIdxSource(data);
        const DataSplits reference = decodedWithoutCache(cfg);
        QVERIFY(loadSource(cfg).ok());
        const QString entry =
            QString::fromStdString(decodeCacheEntry(decodeCacheDir(), cfg.trainImages));
        QFile f(entry);
        QVERIFY(f.open(QIODevice::ReadWrite));
        QByteArray bytes = f.readAll();
        QCOMPARE(bytes.size(), qsizetype(kDecodeCacheHeaderBytes + 40 * 6));
        if (damage == "payload") {
            bytes[qsizetype(kDecodeCacheHeaderBytes) + 17] ^= 0x01;
        } else if (damage == "header") {
            bytes[70] ^= 0x01;  // a dimension
        } else if (damage == "truncate") {
            bytes.chop(5);
        } else if (damage == "append") {
            bytes.append("xyz");
        } else if (damage == "garbage") {
            bytes.fill('x');
        } else {
            bytes.clear();
        }
        QVERIFY(f.resize(0));
        QVERIFY(f.seek(0));
        QCOMPARE(f.write(bytes), qint64(bytes.size()));
        f.close();

        DecodeCacheStats before = decodeCacheStats();
        Result<DataSplits> s = loadSource(cfg);
        QVERIFY2(s.ok(), s.ok() ? "" : s.error().c_str());
        const DecodeCacheStats d = statsSince(before);
        QCOMPARE(d.rejected, int64_t{1});
        QCOMPARE(d.decoded, int64_t{1});
        QCOMPARE(d.written, int64_t{1});
        QVERIFY(sameSplits(*s, reference));
        QCOMPARE(s->notes.size(), size_t{1});
        QVERIFY2(QString::fromStdString(s->notes[0]).contains(why), s->notes[0].c_str());
        QVERIFY2(QString::fromStdString(s->notes[0]).contains(entry), s->notes[0].c_str());

        // Rewritten: the next load reads it.
        before = decodeCacheStats();
        s = loadSource(cfg);
        QVERIFY(s.ok());
        QCOMPARE(statsSince(before).hits, int64_t{2});
        QVERIFY(sameSplits(*s, reference));
    }

    void decodeCacheOff() {
        QTemporaryDir data, cache;
        ScopedEnv xdg("XDG_CACHE_HOME", cache.path().toStdString().c_str());
        ScopedEnv off(kDecodeCacheEnv, "off");
        const SourceConfig cfg = gzipIdxSource(data);
        for (int run = 0; run < 2; ++run) {
            const DecodeCacheStats before = decodeCacheStats();
            Result<DataSplits> s = loadSource(cfg);
            QVERIFY(s.ok());
            const DecodeCacheStats d = statsSince(before);
            QCOMPARE(d.decoded, int64_t{2});
            QCOMPARE(d.hits + d.written + d.rejected + d.writeFailures, int64_t{0});
        }
        QVERIFY(QDir(cache.path()).isEmpty());
    }

    // A cache folder that cannot be created, or a disk that fills up while an entry is written:
    // the load succeeds, nothing half-written stays, a note says why.
    void decodeCacheCannotWrite() {
        QTemporaryDir data, cache;
        const SourceConfig cfg = gzipIdxSource(data);
        const DataSplits reference = decodedWithoutCache(cfg);
        {
            // XDG_CACHE_HOME is a file: the folder cannot be made (root could write anywhere
            // else, so permissions would not show this).
            const QString file = cache.filePath("a-file");
            writeBytes(file, "x", false);
            ScopedEnv xdg("XDG_CACHE_HOME", file.toStdString().c_str());
            const DecodeCacheStats before = decodeCacheStats();
            Result<DataSplits> s = loadSource(cfg);
            QVERIFY2(s.ok(), s.ok() ? "" : s.error().c_str());
            QVERIFY(sameSplits(*s, reference));
            const DecodeCacheStats d = statsSince(before);
            QCOMPARE(d.writeFailures, int64_t{2});
            QCOMPARE(d.written, int64_t{0});
            QCOMPARE(s->notes.size(), size_t{2});
            QVERIFY2(QString::fromStdString(s->notes[0]).contains("cannot create"),
                     s->notes[0].c_str());
        }
        {
            ScopedEnv xdg("XDG_CACHE_HOME", cache.path().toStdString().c_str());
            ScopedEnv full(kDecodeCacheFaultBytesEnv, "4200");  // the header, and a bit
            const DecodeCacheStats before = decodeCacheStats();
            Result<DataSplits> s = loadSource(cfg);
            QVERIFY2(s.ok(), s.ok() ? "" : s.error().c_str());
            QVERIFY(sameSplits(*s, reference));
            const DecodeCacheStats d = statsSince(before);
            // An entry of the 40 labels fits in 4200 bytes, one of the 240 pixels does not.
            QCOMPARE(d.writeFailures, int64_t{1});
            QCOMPARE(d.written, int64_t{1});
            QCOMPARE(s->notes.size(), size_t{1});
            QVERIFY2(QString::fromStdString(s->notes[0]).contains("No space left on device"),
                     s->notes[0].c_str());
            QVERIFY2(QString::fromStdString(s->notes[0]).contains("train-images.gz"),
                     s->notes[0].c_str());
            const QStringList files = filesIn(QString::fromStdString(decodeCacheDir()));
            QCOMPARE(files.size(), 1);
            QVERIFY(!files[0].contains(".tmp"));
        }
    }

    // Writing an entry removes those of deleted sources and temporary files a killed writer left.
    void decodeCachePrunesEntriesOfDeletedSources() {
        QTemporaryDir cache;
        ScopedEnv xdg("XDG_CACHE_HOME", cache.path().toStdString().c_str());
        const QString dir = QString::fromStdString(decodeCacheDir());
        auto gone = std::make_unique<QTemporaryDir>();
        const SourceConfig goneCfg = gzipIdxSource(*gone);
        QVERIFY(loadSource(goneCfg).ok());
        QCOMPARE(filesIn(dir).size(), 2);
        gone.reset();
        const QString oldTemp = dir + "/0123456789abcdef.idx.tmp-1-0";
        const QString newTemp = dir + "/0123456789abcdef.idx.tmp-2-0";
        writeBytes(oldTemp, "partial", false);
        writeBytes(newTemp, "partial", false);
        setMtime(oldTemp, std::time(nullptr) - 7200, 0);

        QTemporaryDir kept;
        const SourceConfig cfg = gzipIdxSource(kept);
        QVERIFY(loadSource(cfg).ok());
        QStringList want{
            QFileInfo(QString::fromStdString(decodeCacheEntry(dir.toStdString(), cfg.trainImages)))
                .fileName(),
            QFileInfo(QString::fromStdString(decodeCacheEntry(dir.toStdString(), cfg.trainLabels)))
                .fileName(),
            QFileInfo(newTemp).fileName()};
        want.sort();
        QCOMPARE(filesIn(dir), want);
    }

    // The built-in source: a second load is read from the cache and equals the decoded files.
    void decodeCacheFashionMnist() {
        if (!QDir(kFashionDir).exists()) QSKIP("dataset-fashion-mnist is not installed");
        qunsetenv("TRAINDECK_FASHION_MNIST_DIR");
        QTemporaryDir cache;
        ScopedEnv xdg("XDG_CACHE_HOME", cache.path().toStdString().c_str());
        const DataSplits reference = decodedWithoutCache(SourceConfig{});
        Result<DataSplits> first = loadSource(SourceConfig{});
        QVERIFY(first.ok());
        const DecodeCacheStats before = decodeCacheStats();
        Result<DataSplits> second = loadSource(SourceConfig{});
        QVERIFY(second.ok());
        QCOMPARE(statsSince(before).hits, int64_t{4});
        QVERIFY(sameSplits(*second, reference));
        QCOMPARE(second->train.classNames, reference.train.classNames);
    }

    // --- batch-forming kernels ------------------------------------------------------------------
    // Every level this CPU runs gives the generic level's rows, bit for bit.
    void convertKernelsMatchGeneric() {
        const data_kernels::Table& generic = data_kernels::kernelsFor(CpuIsa::Generic);
        QCOMPARE(generic.isa, CpuIsa::Generic);
        std::vector<CpuIsa> levels{CpuIsa::Generic};
        if (detectedCpuIsa() != CpuIsa::Generic) levels.push_back(CpuIsa::Avx2);
        if (detectedCpuIsa() == CpuIsa::Avx512) levels.push_back(CpuIsa::Avx512);
        const std::pair<float, float> maps[] = {
            {1.0f / 255, 0.0f},
            {static_cast<float>(1.0 / 255 / 0.3081), static_cast<float>(-0.1307 / 0.3081)},
            {-3.5f, 1e-7f},
            {1e30f, -1e30f}};
        // Room for the largest n at the largest offset.
        std::vector<uint8_t> u8(1003);
        std::vector<float> f32(1003);
        for (size_t i = 0; i < u8.size(); ++i) {
            u8[i] = static_cast<uint8_t>((i * 37 + 11) % 256);
            f32[i] = static_cast<float>(i) * 0.37f - 91.5f + 1.0f / static_cast<float>(i + 1);
        }
        for (const CpuIsa isa : levels) {
            const data_kernels::Table& k = data_kernels::kernelsFor(isa);
            QCOMPARE(k.isa, isa);
            for (const auto& [a, b] : maps) {
                for (const int64_t n : {0, 1, 7, 8, 15, 16, 17, 31, 33, 63, 65, 784, 999}) {
                    // Offsets 0 and 3: unaligned rows as a gather meets them.
                    for (const int64_t off : {0, 3}) {
                        std::vector<float> want(1000, -1.0f), got(1000, -1.0f);
                        generic.affineU8(u8.data() + off, want.data(), n, a, b);
                        k.affineU8(u8.data() + off, got.data(), n, a, b);
                        QVERIFY2(std::memcmp(want.data(), got.data(), 4000) == 0,
                                 qPrintable(QString("u8 %1 n=%2").arg(cpuIsaName(isa)).arg(n)));
                        for (int64_t i = 0; i < n; ++i) {
                            const float ref =
                                static_cast<float>(u8[static_cast<size_t>(off + i)]) * a;
                            QCOMPARE(want[static_cast<size_t>(i)], ref + b);
                        }
                        generic.affineF32(f32.data() + off, want.data(), n, a, b);
                        k.affineF32(f32.data() + off, got.data(), n, a, b);
                        QVERIFY2(std::memcmp(want.data(), got.data(), 4000) == 0,
                                 qPrintable(QString("f32 %1 n=%2").arg(cpuIsaName(isa)).arg(n)));
                    }
                }
            }
        }
    }

    // A pipeline's batches hold float(x) * a + b of the gathered rows, as the scalar formula
    // computes them, whatever level forms them.
    void pipelineRowsAreTheAffineMap() {
        const Dataset d = indexedDataset(50, 37);
        PipelineConfig cfg = shuffled(50, 3);
        cfg.map = {MapStep{.op = "scale", .factor = 1.0 / 255},
                   MapStep{.op = "normalize", .mean = 0.1307, .stddev = 0.3081}};
        cfg.cache = "none";
        auto p = makePipeline(d, cfg, 8);
        const EpochOutput out = runEpoch(*p, 0);
        const double s = 1.0 / 255 / 0.3081, t = (0.0 - 0.1307) / 0.3081;
        const auto a = static_cast<float>(s), b = static_cast<float>(t);
        for (size_t r = 0; r < out.labels.size(); ++r) {
            const int64_t row = out.labels[r];
            for (int64_t k = 0; k < 37; ++k) {
                const float x = static_cast<float>(d.x.data<uint8_t>()[row * 37 + k]);
                const float want = x * a + b;
                const float got = out.x[r * 37 + static_cast<size_t>(k)];
                QVERIFY(std::memcmp(&want, &got, 4) == 0);
            }
        }
    }

  private:
    QTemporaryDir cacheHome_;
};

QTEST_GUILESS_MAIN(TestData)
#include "test_data.moc"

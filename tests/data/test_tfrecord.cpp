// TFRecord files and tf.train.Example (engine/data/tfrecord.h): CRC-32C against published vectors,
// write -> scan -> readRecord round trips (plain and GZIP), every framing error with the file and
// offset it names, the Example decoder on packed, unpacked and oddly merged encodings and on
// garbage, and, where the benchmark environment has TensorFlow, TensorFlow reading what this
// writes and this reading what TensorFlow writes. projects/make_tfrecords.py is checked against the
// IDX files it reads (and against TensorFlow's parser and PNG decoder where available).
#include <zlib.h>

#include <QDir>
#include <QFile>
#include <QProcess>
#include <QStandardPaths>
#include <QTemporaryDir>
#include <QtTest>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "engine/data/image_folder.h"
#include "engine/data/pipeline.h"
#include "engine/data/tfrecord.h"
#include "engine/data/tfrecord_source.h"
#include "tests/scoped_env.h"
#include "tests/source_dir.h"

namespace fs = std::filesystem;
using namespace td;

namespace {

void writeFile(const std::string& path, const std::string& bytes) {
    std::ofstream(path, std::ios::binary)
        .write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

std::string readFile(const std::string& path) {
    std::ifstream f(path, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
}

// `bytes` as one gzip member (zlib's deflate with a gzip wrapper).
std::string gzipBytes(const std::string& bytes) {
    z_stream z{};
    if (deflateInit2(&z, 6, Z_DEFLATED, 15 + 16, 8, Z_DEFAULT_STRATEGY) != Z_OK) return {};
    std::string out(deflateBound(&z, static_cast<uLong>(bytes.size())) + 32, '\0');
    z.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(bytes.data()));
    z.avail_in = static_cast<uInt>(bytes.size());
    z.next_out = reinterpret_cast<Bytef*>(out.data());
    z.avail_out = static_cast<uInt>(out.size());
    const int rc = deflate(&z, Z_FINISH);
    out.resize(z.total_out);
    deflateEnd(&z);
    return rc == Z_STREAM_END ? out : std::string();
}

// Records of assorted sizes: empty, small, several crossing the scan's 1 MiB buffer, one larger
// than it.
std::vector<std::string> sampleRecords() {
    std::vector<std::string> records;
    std::mt19937 rng(7);
    const size_t sizes[] = {0, 1, 7, 100, 65536, 300000, 500000, 700000, (size_t(3) << 20) + 5,
                            3, 0, 12};
    for (const size_t n : sizes) {
        std::string r(n, '\0');
        for (char& c : r) c = static_cast<char>(rng());
        records.push_back(std::move(r));
    }
    for (int i = 0; i < 200; ++i) records.push_back("record " + std::to_string(i));
    return records;
}

std::string framed(const std::vector<std::string>& records,
                   std::vector<int64_t>* offsets = nullptr) {
    std::string out;
    for (const std::string& r : records) {
        if (offsets) offsets->push_back(static_cast<int64_t>(out.size()));
        appendTfRecord(out, r);
    }
    return out;
}

struct Scanned {
    std::vector<int64_t> offsets;
    std::vector<std::string> records;
};

// Opens and scans `path`; the error (empty when none).
std::string scanFile(const std::string& path, const std::string& compression, Scanned& out) {
    auto f = TfRecordFile::open(path, compression);
    if (!f.ok()) return f.error();
    const Status s = (*f)->scan([&](int64_t offset, std::string_view data) {
        out.offsets.push_back(offset);
        out.records.emplace_back(data);
        return Status::success();
    });
    return s.ok() ? std::string() : s.error();
}

// Verifies that `error` (non-empty) contains `part`.
void expectContains(const std::string& error, const std::string& part) {
    QVERIFY2(!error.empty(), ("no error; expected one containing: " + part).c_str());
    QVERIFY2(error.find(part) != std::string::npos,
             ("error \"" + error + "\" does not contain \"" + part + "\"").c_str());
}

// --- protobuf bytes written by hand
std::string varint(uint64_t v) {
    std::string s;
    while (v >= 0x80) {
        s += static_cast<char>((v & 0x7f) | 0x80);
        v >>= 7;
    }
    s += static_cast<char>(v);
    return s;
}
std::string key(uint32_t field, uint32_t wire) {
    return varint((uint64_t(field) << 3) | wire);
}
std::string ld(uint32_t field, const std::string& payload) {
    return key(field, 2) + varint(payload.size()) + payload;
}
std::string fixed32(uint32_t field, float v) {
    std::string s = key(field, 5);
    char b[4];
    std::memcpy(b, &v, 4);
    return s + std::string(b, 4);
}
std::string entry(const std::string& name, const std::string& feature) {
    return ld(1, ld(1, name) + ld(2, feature));
}

// The values both directions of the TensorFlow comparison use.
struct Sample {
    std::vector<std::string> names;
    std::vector<int64_t> ids;
    std::vector<float> scores;
};
std::vector<Sample> tfSamples() {
    return {
        {{"shirt", std::string("\x00\x01\xff\x80", 4)},
         {1, -2, 300, std::numeric_limits<int64_t>::max(), std::numeric_limits<int64_t>::min()},
         {0.5f, -1.25f, 3.4028234663852886e38f, 1e-30f, -0.0f}},
        {{""}, {0}, {}},
        {{std::string(1000, 'x'), "y"}, {7, 8, 9}, {1.0f, 2.0f, 3.0f}},
    };
}

ExampleFeatures sampleFeatures(const Sample& s) {
    ExampleFeatures f;
    ExampleFeature& names = f["name"];
    for (const std::string& n : s.names) names.bytes.emplace_back(n);
    f["ids"].kind = ExampleFeature::Kind::Int64;
    f["ids"].ints = s.ids;
    f["score"].kind = ExampleFeature::Kind::Float;
    f["score"].floats = s.scores;
    return f;
}

// The sample as hand-written unpacked fields (proto2 writers' encoding), with unknown fields in
// the Example and in a Feature, and with `unknownEverywhere` also in the Features map, a map entry
// and a list. (TensorFlow's parse_single_example refuses unknown fields in those three, though
// protobuf accepts them; this parser follows protobuf.)
std::string unpackedExample(const Sample& s, bool unknownEverywhere) {
    std::string names, ids, scores;
    for (const std::string& n : s.names) names += ld(1, n);
    for (const int64_t v : s.ids) ids += key(1, 0) + varint(static_cast<uint64_t>(v));
    for (const float v : s.scores) scores += fixed32(1, v);
    const std::string unknown = key(9, 0) + varint(5) + key(10, 1) + std::string(8, '\x11');
    const std::string more = unknownEverywhere ? unknown : std::string();
    return ld(1, entry("name", ld(1, names) + unknown) + entry("ids", ld(3, ids + more)) +
                     ld(1, ld(2, ld(2, scores)) + more + ld(1, "score")) + more) +
           ld(2, "an unknown field of Example");
}

// Compares a parsed Example with the sample it was written from.
void checkSample(const ExampleFeatures& got, const Sample& s) {
    QCOMPARE(got.size(), size_t(3));
    const ExampleFeature& names = got.at("name");
    QVERIFY(names.kind == ExampleFeature::Kind::Bytes);
    QCOMPARE(names.bytes.size(), s.names.size());
    for (size_t i = 0; i < s.names.size(); ++i) QVERIFY(names.bytes[i] == s.names[i]);
    QVERIFY(got.at("ids").kind == ExampleFeature::Kind::Int64);
    QVERIFY(got.at("ids").ints == s.ids);
    QVERIFY(got.at("score").kind == ExampleFeature::Kind::Float);
    QCOMPARE(got.at("score").floats.size(), s.scores.size());
    for (size_t i = 0; i < s.scores.size(); ++i) {
        // Bit for bit (-0.0 included).
        uint32_t a, b;
        std::memcpy(&a, &got.at("score").floats[i], 4);
        std::memcpy(&b, &s.scores[i], 4);
        QCOMPARE(a, b);
    }
}

// Round-trips exactly, sign of zero included (QString::number drops it).
std::string floatText(float v) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.9g", static_cast<double>(v));
    return buf;
}

std::string hexOf(std::string_view s) {
    static const char* digits = "0123456789abcdef";
    std::string h;
    for (const char c : s) {
        h += digits[static_cast<uint8_t>(c) >> 4];
        h += digits[static_cast<uint8_t>(c) & 15];
    }
    return h;
}

// --- Python
QString benchPython() {
    const QByteArray env = qgetenv("TRAINDECK_KERAS_PYTHON");
    if (!env.isEmpty()) return QString::fromLocal8Bit(env);
    const QString venv = QDir::homePath() + "/.cache/traindeck/bench-venv/bin/python";
    return QFile::exists(venv) ? venv : QString();
}

QString systemPython() {
    return QFile::exists("/usr/bin/python3") ? QString("/usr/bin/python3")
                                             : QStandardPaths::findExecutable("python3");
}

struct PyRun {
    int code = -1;
    QString out, err;
};
PyRun runPython(const QString& python, const QStringList& args) {
    QProcess p;
    QProcessEnvironment env = QProcessEnvironment::systemEnvironment();
    env.insert("TF_CPP_MIN_LOG_LEVEL", "3");
    p.setProcessEnvironment(env);
    p.start(python, args);
    p.waitForFinished(240000);
    return {p.exitStatus() == QProcess::NormalExit ? p.exitCode() : -1,
            QString::fromUtf8(p.readAllStandardOutput()),
            QString::fromUtf8(p.readAllStandardError())};
}

// The pixels and labels of the first `n` images of an IDX pair (gzip or raw).
bool readIdxPrefix(const std::string& path, size_t headerBytes, size_t bytes, std::string& out) {
    gzFile f = gzopen(path.c_str(), "rb");
    if (!f) return false;
    std::string all(headerBytes + bytes, '\0');
    const int n = gzread(f, all.data(), static_cast<unsigned>(all.size()));
    gzclose(f);
    if (n != static_cast<int>(all.size())) return false;
    out = all.substr(headerBytes);
    return true;
}

std::string findIdx(const std::string& dir, const std::string& stem) {
    for (const std::string& name : {stem + ".gz", stem})
        if (fs::exists(dir + "/" + name)) return dir + "/" + name;
    return {};
}

}  // namespace

class TestTfRecord : public QObject {
    Q_OBJECT

  private slots:
    // The iSCSI vectors (RFC 3720, B.4) and the usual check value; the SSE4.2 and table paths
    // agree at every length and alignment; continuing a CRC equals computing it at once.
    void crc32cKnownVectors() {
        QCOMPARE(crc32c("123456789", 9), 0xE3069283u);
        QCOMPARE(crc32c("", 0), 0u);
        const std::string zeros(32, '\0'), ones(32, '\xff');
        std::string up, down;
        for (int i = 0; i < 32; ++i) {
            up += static_cast<char>(i);
            down += static_cast<char>(31 - i);
        }
        for (auto* fn : {&crc32c, &crc32cSoftware}) {
            QCOMPARE(fn("123456789", 9, 0), 0xE3069283u);
            QCOMPARE(fn(zeros.data(), 32, 0), 0x8A9136AAu);
            QCOMPARE(fn(ones.data(), 32, 0), 0x62A8AB43u);
            QCOMPARE(fn(up.data(), 32, 0), 0x46DD794Eu);
            QCOMPARE(fn(down.data(), 32, 0), 0x113FDB5Cu);
        }
        std::mt19937 rng(1);
        std::string buf(4096 + 64, '\0');
        for (char& c : buf) c = static_cast<char>(rng());
        for (size_t start = 0; start < 16; ++start)
            for (size_t n = 0; n < 300; n += 1 + n / 8)
                QCOMPARE(crc32c(buf.data() + start, n), crc32cSoftware(buf.data() + start, n));
        QCOMPARE(crc32c(buf.data(), 4096), crc32cSoftware(buf.data(), 4096));
        QCOMPARE(crc32c(buf.data() + 1000, 3096, crc32c(buf.data(), 1000)),
                 crc32c(buf.data(), 4096));
        QCOMPARE(crc32cSoftware(buf.data() + 13, 4083, crc32cSoftware(buf.data(), 13)),
                 crc32c(buf.data(), 4096));
        // TFRecord's mask.
        QCOMPARE(maskCrc32c(0), 0xa282ead8u);
        QCOMPARE(maskCrc32c(0xE3069283u),
                 ((0xE3069283u >> 15) | (0xE3069283u << 17)) + 0xa282ead8u);
        QCOMPARE(maskedCrc32c("123456789", 9), maskCrc32c(0xE3069283u));
        // An empty record's framing: eight zero bytes of length and their masked CRC.
        std::string empty;
        appendTfRecord(empty, "");
        QCOMPARE(empty.size(), size_t(16));
        QCOMPARE(empty.substr(0, 8), std::string(8, '\0'));
        uint32_t lengthCrc;
        std::memcpy(&lengthCrc, empty.data() + 8, 4);
        QCOMPARE(lengthCrc, maskCrc32c(crc32cSoftware(std::string(8, '\0').data(), 8)));
        uint32_t dataCrc;
        std::memcpy(&dataCrc, empty.data() + 12, 4);
        QCOMPARE(dataCrc, maskCrc32c(0));
    }

    // write -> scan -> readRecord, with records smaller and larger than the scan's buffer; reads
    // from several threads at once.
    void roundTrip() {
        QTemporaryDir dir;
        const std::string path = dir.filePath("data.tfrecord").toStdString();
        const std::vector<std::string> records = sampleRecords();
        std::vector<int64_t> offsets;
        writeFile(path, framed(records, &offsets));
        Scanned s;
        const std::string e = scanFile(path, "", s);
        QVERIFY2(e.empty(), e.c_str());
        QVERIFY(s.offsets == offsets);
        QVERIFY(s.records == records);

        auto f = TfRecordFile::open(path, "NONE");
        QVERIFY2(f.ok(), f.ok() ? "" : f.error().c_str());
        QCOMPARE((*f)->path(), path);
        QVERIFY(!(*f)->gzip());
        std::string out = "stale";
        for (size_t i = 0; i < records.size(); ++i) {
            const Status r = (*f)->readRecord(offsets[i], out);
            QVERIFY2(r.ok(), r.ok() ? "" : r.error().c_str());
            QVERIFY(out == records[i]);
        }
        // Reading from many threads at once, in a scrambled order.
        const TfRecordFile& file = **f;
        std::atomic<int> bad{0};
        std::vector<std::thread> threads;
        for (int t = 0; t < 4; ++t)
            threads.emplace_back([&, t] {
                std::string buf;
                for (size_t k = 0; k < records.size() * 3; ++k) {
                    const size_t i = (k * 7919 + static_cast<size_t>(t) * 31) % records.size();
                    if (!file.readRecord(offsets[i], buf).ok() || buf != records[i]) ++bad;
                }
            });
        for (std::thread& t : threads) t.join();
        QCOMPARE(bad.load(), 0);
        // Offsets that are not a record's start, or are past the end.
        expectContains(statusOrEmpty((*f)->readRecord(offsets[3] + 1, out)),
                       path + ": record at offset " + std::to_string(offsets[3] + 1) +
                           ": length CRC mismatch");
        expectContains(statusOrEmpty((*f)->readRecord((*f)->size(), out)),
                       path + ": no record at offset " + std::to_string((*f)->size()));
        expectContains(statusOrEmpty((*f)->readRecord(-1, out)), "no record at offset -1");

        // onRecord's error ends the scan and comes back as it is.
        int calls = 0;
        const Status stop = (*f)->scan([&](int64_t, std::string_view) -> Status {
            if (++calls == 3) return err("stop here");
            return Status::success();
        });
        QVERIFY(!stop.ok());
        QCOMPARE(stop.error(), std::string("stop here"));
        QCOMPARE(calls, 3);
    }

    // A flipped data byte, a flipped length byte and CRC byte, each named with file and offset.
    void corruption() {
        QTemporaryDir dir;
        const std::string path = dir.filePath("shard-00001.tfrecord").toStdString();
        const std::vector<std::string> records = {"alpha", "bravo-charlie", "delta", "echo"};
        std::vector<int64_t> offsets;
        const std::string good = framed(records, &offsets);

        std::string bad = good;
        bad[static_cast<size_t>(offsets[2] + 12 + 1)] ^= 0x20;  // "delta" -> "dElta"
        writeFile(path, bad);
        Scanned s;
        std::string e = scanFile(path, "", s);
        expectContains(e, path + ": record at offset " + std::to_string(offsets[2]) +
                              ": data CRC mismatch (stored 0x");
        expectContains(e, ", computed 0x");
        QCOMPARE(s.records.size(), size_t(2));  // the records before it were delivered
        {
            auto f = TfRecordFile::open(path, "");
            QVERIFY(f.ok());
            std::string out;
            expectContains(
                statusOrEmpty((*f)->readRecord(offsets[2], out)),
                "record at offset " + std::to_string(offsets[2]) + ": data CRC mismatch");
            QVERIFY((*f)->readRecord(offsets[3], out).ok());
        }

        // The stored data CRC itself damaged.
        bad = good;
        bad[static_cast<size_t>(offsets[1] + 12 + 13)] ^= 0x01;
        writeFile(path, bad);
        s = {};
        expectContains(scanFile(path, "", s),
                       "record at offset " + std::to_string(offsets[1]) + ": data CRC mismatch");

        // A length byte of the third record: its length CRC no longer matches.
        bad = good;
        bad[static_cast<size_t>(offsets[2])] ^= 0x04;
        writeFile(path, bad);
        s = {};
        expectContains(scanFile(path, "", s), path + ": record at offset " +
                                                  std::to_string(offsets[2]) +
                                                  ": length CRC mismatch (stored 0x");
        // ... of the first: not a TFRecord file at all.
        bad = good;
        bad[0] ^= 0x01;
        writeFile(path, bad);
        s = {};
        expectContains(scanFile(path, "", s),
                       path + ": not a TFRecord file (length CRC mismatch at offset 0");
        writeFile(path, "this is a text file, not records\n");
        expectContains(scanFile(path, "", s), path + ": not a TFRecord file");
    }

    // Cut records, an oversized length, an empty file.
    void truncation() {
        QTemporaryDir dir;
        const std::string path = dir.filePath("cut.tfrecord").toStdString();
        const std::vector<std::string> records = {std::string(100, 'a'), std::string(5000, 'b')};
        std::vector<int64_t> offsets;
        const std::string good = framed(records, &offsets);
        Scanned s;

        writeFile(path, good.substr(0, static_cast<size_t>(offsets[1]) + 12 + 12));
        expectContains(scanFile(path, "", s),
                       path + ": truncated record at offset " + std::to_string(offsets[1]) +
                           ": length says 5000 bytes (+4 CRC bytes), 12 remain");
        QCOMPARE(s.records.size(), size_t(1));
        // Only the data CRC missing.
        s = {};
        writeFile(path, good.substr(0, good.size() - 2));
        expectContains(scanFile(path, "", s),
                       "truncated record at offset " + std::to_string(offsets[1]) +
                           ": length says 5000 bytes (+4 CRC bytes), 5002 remain");
        // Cut inside the header.
        s = {};
        writeFile(path, good.substr(0, static_cast<size_t>(offsets[1]) + 5));
        expectContains(scanFile(path, "", s), "truncated record at offset " +
                                                  std::to_string(offsets[1]) +
                                                  ": 5 bytes remain, a record's header needs 12");
        s = {};
        writeFile(path, good.substr(0, 5));
        expectContains(scanFile(path, "", s), path + ": not a TFRecord file (5 bytes");
        {
            writeFile(path, good.substr(0, static_cast<size_t>(offsets[1]) + 100));
            auto f = TfRecordFile::open(path, "");
            QVERIFY(f.ok());
            std::string out;
            expectContains(statusOrEmpty((*f)->readRecord(offsets[1], out)),
                           "truncated record at offset " + std::to_string(offsets[1]));
            QVERIFY((*f)->readRecord(0, out).ok());
        }

        // A length over 1 GiB, with a valid CRC, is refused before anything is allocated.
        std::string huge(8, '\0');
        const uint64_t length = (uint64_t(1) << 30) + 1;
        std::memcpy(huge.data(), &length, 8);
        const uint32_t crc = maskedCrc32c(huge.data(), 8);
        huge.append(reinterpret_cast<const char*>(&crc), 4);
        huge += std::string(64, 'z');
        writeFile(path, huge);
        s = {};
        expectContains(scanFile(path, "", s),
                       "record at offset 0: length 1073741825 bytes is over the limit");

        writeFile(path, "");
        s = {};
        QCOMPARE(scanFile(path, "", s), std::string());
        QVERIFY(s.records.empty());
        QCOMPARE(scanFile(path, "GZIP", s), std::string());  // an empty file, even as GZIP
        QVERIFY(s.records.empty());
    }

    // GZIP: the same records and offsets as the uncompressed file; several members; the
    // temporary file is unlinked at once; the errors of a bad stream.
    void gzipFiles() {
        QTemporaryDir dir, tmp;
        test::ScopedEnv tmpdir("TMPDIR", tmp.path().toLocal8Bit().constData());
        const std::vector<std::string> records = sampleRecords();
        std::vector<int64_t> offsets;
        const std::string plain = framed(records, &offsets);
        const std::string path = dir.filePath("data.tfrecord.gz").toStdString();
        {  // written with zlib's gz* file functions
            gzFile g = gzopen(path.c_str(), "wb");
            QVERIFY(g != nullptr);
            QCOMPARE(gzwrite(g, plain.data(), static_cast<unsigned>(plain.size())),
                     static_cast<int>(plain.size()));
            QCOMPARE(gzclose(g), Z_OK);
        }
        auto f = TfRecordFile::open(path, "GZIP");
        QVERIFY2(f.ok(), f.ok() ? "" : f.error().c_str());
        QVERIFY((*f)->gzip());
        QCOMPARE((*f)->size(), static_cast<int64_t>(plain.size()));
        QVERIFY(QDir(tmp.path()).entryList(QDir::NoDotAndDotDot | QDir::AllEntries).isEmpty());
        Scanned s;
        const Status st = (*f)->scan([&](int64_t offset, std::string_view data) {
            s.offsets.push_back(offset);
            s.records.emplace_back(data);
            return Status::success();
        });
        QVERIFY2(st.ok(), st.ok() ? "" : st.error().c_str());
        QVERIFY(s.offsets == offsets);
        QVERIFY(s.records == records);
        std::string out;
        QVERIFY((*f)->readRecord(offsets[8], out).ok());
        QVERIFY(out == records[8]);

        // Two members concatenated (as `cat a.gz b.gz` gives) read as one stream.
        const std::string half1 =
            framed(std::vector<std::string>(records.begin(), records.begin() + 5));
        const std::string half2 =
            framed(std::vector<std::string>(records.begin() + 5, records.end()));
        writeFile(path, gzipBytes(half1) + gzipBytes(half2));
        s = {};
        std::string e = scanFile(path, "GZIP", s);
        QVERIFY2(e.empty(), e.c_str());
        QVERIFY(s.records == records);
        QVERIFY(s.offsets == offsets);

        // A damaged deflate stream, a truncated one, a file that is not gzip, trailing junk.
        std::string gz = gzipBytes(plain);
        QVERIFY(gz.size() > 1000);
        std::string bad = gz;
        for (size_t i = 200; i < 260; ++i) bad[i] = static_cast<char>(bad[i] ^ 0x5a);
        writeFile(path, bad);
        s = {};
        e = scanFile(path, "GZIP", s);
        QVERIFY2(!e.empty(), "a damaged gzip stream read without an error");
        QVERIFY2(e.rfind(path + ": ", 0) == 0, e.c_str());
        QVERIFY2(e.find("gzip") != std::string::npos, e.c_str());
        writeFile(path, gz.substr(0, gz.size() / 2));
        expectContains(scanFile(path, "GZIP", s), path + ": truncated gzip stream");
        writeFile(path, plain);
        expectContains(scanFile(path, "GZIP", s),
                       path + ": not a valid gzip stream (zlib: incorrect header check");
        writeFile(path, gz + "junk");
        expectContains(scanFile(path, "GZIP", s), path + ": not a valid gzip stream");
        // No room for the temporary file.
        test::ScopedEnv nowhere("TMPDIR", "/nonexistent/traindeck-tfrecord-test");
        writeFile(path, gz);
        expectContains(
            scanFile(path, "GZIP", s),
            path + ": cannot create a temporary file in /nonexistent/traindeck-tfrecord-test");
    }

    void openErrors() {
        QTemporaryDir dir;
        const std::string path = dir.filePath("x.tfrecord").toStdString();
        writeFile(path, framed({"a"}));
        auto f = TfRecordFile::open(path, "ZLIB");
        QVERIFY(!f.ok());
        expectContains(f.error(), path + ": unknown TFRecord compression \"ZLIB\"");
        expectContains(f.error(), "\"GZIP\"");
        expectContains(f.error(), "\"NONE\"");
        QVERIFY(!TfRecordFile::open(path, "gzip").ok());
        auto missing = TfRecordFile::open(path + ".missing", "");
        QVERIFY(!missing.ok());
        expectContains(missing.error(), path + ".missing: cannot open: ");
        auto folder = TfRecordFile::open(dir.path().toStdString(), "");
        QVERIFY(!folder.ok());
        expectContains(folder.error(), "is a directory");
    }

    // serializeExample -> parseExample with all three kinds; only the wanted features decoded.
    void exampleRoundTrip() {
        for (const Sample& sample : tfSamples()) {
            ExampleFeatures in = sampleFeatures(sample);
            in["unwanted"].kind = ExampleFeature::Kind::Int64;
            in["unwanted"].ints = {1, 2, 3};
            const std::string bytes = serializeExample(in);
            auto got = parseExample(bytes, {"name", "ids", "score", "not there"});
            QVERIFY2(got.ok(), got.ok() ? "" : got.error().c_str());
            checkSample(*got, sample);
            QVERIFY(got->count("unwanted") == 0);
            QVERIFY(got->count("not there") == 0);
            // The views point into the record.
            const std::string_view first = got->at("name").bytes[0];
            QVERIFY(first.data() >= bytes.data() && first.data() <= bytes.data() + bytes.size());
            auto none = parseExample(bytes, {});
            QVERIFY(none.ok() && none->empty());
            // Unpacked (proto2) encoding, with unknown fields at every level.
            // The views point into the record: it must outlive them.
            const std::string unpackedBytes = unpackedExample(sample, true);
            auto unpacked = parseExample(unpackedBytes, {"name", "ids", "score"});
            QVERIFY2(unpacked.ok(), unpacked.ok() ? "" : unpacked.error().c_str());
            checkSample(*unpacked, sample);
        }
        // An empty list keeps its kind.
        ExampleFeatures empty;
        empty["f"].kind = ExampleFeature::Kind::Float;
        auto e = parseExample(serializeExample(empty), {"f"});
        QVERIFY(e.ok());
        QVERIFY(e->at("f").kind == ExampleFeature::Kind::Float);
        QVERIFY(e->at("f").floats.empty());
        // An empty record is an Example with no features.
        auto blank = parseExample("", {"f"});
        QVERIFY(blank.ok() && blank->empty());
    }

    // protobuf's merge rules: packed and unpacked mixed in one list; a repeated map key (the
    // last entry wins); key after value; two `features` fields; a Feature's list given twice
    // (appended) or another kind after it (replaces); groups in unknown fields skipped.
    void exampleMergeRules() {
        std::string packedInts;
        for (const int v : {4, 5}) packedInts += varint(static_cast<uint64_t>(v));
        std::string packedFloats(8, '\0');
        const float pf[2] = {2.5f, -3.0f};
        std::memcpy(packedFloats.data(), pf, 8);
        const std::string ints = ld(3, key(1, 0) + varint(1) + ld(1, packedInts) + key(1, 0) +
                                           varint(static_cast<uint64_t>(int64_t(-6))));
        const std::string floats = ld(2, fixed32(1, 1.0f) + ld(1, packedFloats) + fixed32(1, 9.0f));
        const std::string group =
            key(20, 3) + key(21, 0) + varint(1) + key(22, 3) + key(22, 4) + key(20, 4);
        const std::string record =
            ld(1, entry("ints", ints) + entry("label", ld(3, ld(1, varint(1)))) +
                      ld(1, ld(2, ld(1, ld(1, "value-first"))) + ld(1, "keyed-late")) + group) +
            group +
            ld(1,
               entry("label", ld(3, ld(1, varint(8)))) + entry("floats", floats) +
                   entry("twice", ld(1, ld(1, "a")) + "") +
                   ld(1, ld(1, "twice") + ld(2, ld(1, ld(1, "b"))) + ld(2, ld(1, ld(1, "c")))) +
                   ld(1, ld(1, "switch") + ld(2, ld(1, ld(1, "gone")) + ld(3, ld(1, varint(3))))));
        auto got =
            parseExample(record, {"ints", "label", "keyed-late", "floats", "twice", "switch"});
        QVERIFY2(got.ok(), got.ok() ? "" : got.error().c_str());
        QVERIFY((got->at("ints").ints == std::vector<int64_t>{1, 4, 5, -6}));
        QVERIFY((got->at("label").ints == std::vector<int64_t>{8}));  // the later entry
        QCOMPARE(got->at("keyed-late").bytes.size(), size_t(1));
        QVERIFY(got->at("keyed-late").bytes[0] == "value-first");
        QVERIFY((got->at("floats").floats == std::vector<float>{1.0f, 2.5f, -3.0f, 9.0f}));
        // A map entry's value given twice merges: the lists append.
        QCOMPARE(got->at("twice").bytes.size(), size_t(2));
        QVERIFY(got->at("twice").bytes[0] == "b" && got->at("twice").bytes[1] == "c");
        QVERIFY(got->at("switch").kind == ExampleFeature::Kind::Int64);
        QVERIFY((got->at("switch").ints == std::vector<int64_t>{3}));
        QVERIFY(got->at("switch").bytes.empty());
    }

    // Malformed bytes: an error saying what, never a crash; random and mutated input.
    void exampleGarbage() {
        const auto expectBad = [](const std::string& bytes, const std::string& part) {
            auto r = parseExample(bytes, {"a"});
            QVERIFY2(!r.ok(), ("parsed: " + hexOf(bytes)).c_str());
            expectContains(r.error(), "malformed tf.train.Example at byte ");
            expectContains(r.error(), part);
        };
        expectBad("\x0a", "truncated varint");
        expectBad("\x0a\x80\x80", "truncated varint");
        expectBad(std::string("\x0a\x05\x0a\x03", 4), "runs past the end of its message");
        expectBad("\x0f", "invalid wire type 7");
        expectBad("\x0e", "invalid wire type 6");
        expectBad(std::string("\x02\x00", 2), "invalid field number 0");
        expectBad(std::string(11, '\xff'), "varint longer than 10 bytes");
        expectBad("\x0d\x01\x02", "truncated fixed32");
        expectBad("\x09\x01\x02", "truncated fixed64");
        expectBad("\x0b\x10\x01", "without its end");
        expectBad("\x0c", "without its start");
        expectBad(ld(1, entry("a", ld(2, ld(1, "12345")))), "packed float list of 5 bytes");
        expectBad(ld(1, entry("a", ld(3, ld(1, "\x80")))), "truncated varint");
        // The value of a feature nobody wants is not decoded (only the framing around it is).
        auto r = parseExample(ld(1, entry("b", ld(3, "\x0f"))), {"a"});
        QVERIFY(r.ok());  // the unwanted feature's value is not decoded
        r = parseExample(ld(1, "\x0a\x01"), {"a"});
        QVERIFY(!r.ok());
        expectContains(r.error(), "at byte 3: length 1 runs past");

        std::mt19937 rng(42);
        const std::vector<Sample> samples = tfSamples();  // the features view its strings
        ExampleFeatures features = sampleFeatures(samples[0]);
        const std::string good = serializeExample(features);
        const std::vector<std::string> wanted = {"name", "ids", "score"};
        int errors = 0;
        for (size_t cut = 0; cut < good.size(); ++cut)
            errors += parseExample(good.substr(0, cut), wanted).ok() ? 0 : 1;
        QVERIFY(errors > 0);
        for (int i = 0; i < 20000; ++i) {
            std::string bytes;
            if (i % 2 == 0) {
                bytes = good;
                for (int k = 0; k < 1 + i % 5; ++k)
                    bytes[rng() % bytes.size()] = static_cast<char>(rng());
            } else {
                bytes.resize(rng() % 64);
                for (char& c : bytes) c = static_cast<char>(rng() % 4 == 0 ? 0x0a : rng());
            }
            auto p = parseExample(bytes, wanted);
            if (p.ok()) {
                for (const auto& [name, f] : *p)
                    for (const std::string_view b : f.bytes)
                        QVERIFY(b.data() >= bytes.data() &&
                                b.data() + b.size() <= bytes.data() + bytes.size());
            }
        }
    }

    // TensorFlow reads what serializeExample and appendTfRecord write (and the unpacked
    // encoding), and this reader returns exactly what tf.io.TFRecordWriter wrote, plain and GZIP.
    void matchesTensorFlow() {
        const QString python = benchPython();
        if (python.isEmpty())
            QSKIP(
                "no Python with TensorFlow (installer/bench.sh sets one up at "
                "~/.cache/traindeck/bench-venv, or set TRAINDECK_KERAS_PYTHON)");
        if (runPython(python, {"-c", "import tensorflow"}).code != 0)
            QSKIP("the benchmark Python has no TensorFlow");
        QTemporaryDir dir;
        const std::string ours = dir.filePath("ours.tfrecord").toStdString();
        const std::vector<Sample> samples = tfSamples();
        std::string file;
        for (const Sample& s : samples) appendTfRecord(file, serializeExample(sampleFeatures(s)));
        appendTfRecord(file, unpackedExample(samples[0], false));
        writeFile(ours, file);

        // The samples as Python literals for TensorFlow to write.
        QString literal = "[";
        for (const Sample& s : samples) {
            literal += "([";
            for (const std::string& n : s.names)
                literal += QString("bytes.fromhex('%1'),").arg(QString::fromStdString(hexOf(n)));
            literal += "], [";
            for (const int64_t v : s.ids) literal += QString::number(v) + ",";
            literal += "], [";
            for (const float v : s.scores)  // float('-0') keeps the sign
                literal += QString::fromStdString("float('" + floatText(v) + "'),");
            literal += "]),";
        }
        literal += "]";
        const QString script = QString(R"PY(
import sys
import tensorflow as tf
d = sys.argv[1]
spec = {"name": tf.io.VarLenFeature(tf.string), "ids": tf.io.VarLenFeature(tf.int64),
        "score": tf.io.VarLenFeature(tf.float32)}
for r in tf.data.TFRecordDataset([d + "/ours.tfrecord"]):
    e = tf.io.parse_single_example(r, spec)
    p = tf.train.Example.FromString(r.numpy())
    assert p.features.feature["ids"].int64_list.value == list(e["ids"].values.numpy())
    print("name=" + ",".join(v.hex() for v in e["name"].values.numpy()) +
          ";ids=" + ",".join(str(int(v)) for v in e["ids"].values.numpy()) +
          ";score=" + ",".join(repr(float(v)) for v in e["score"].values.numpy()))
samples = %1
for path, opts in ((d + "/tf.tfrecord", None), (d + "/tf.tfrecord.gz", tf.io.TFRecordOptions(compression_type="GZIP"))):
    with tf.io.TFRecordWriter(path, opts) as w:
        for names, ids, scores in samples:
            w.write(tf.train.Example(features=tf.train.Features(feature={
                "name": tf.train.Feature(bytes_list=tf.train.BytesList(value=names)),
                "ids": tf.train.Feature(int64_list=tf.train.Int64List(value=ids)),
                "score": tf.train.Feature(float_list=tf.train.FloatList(value=scores)),
                "other": tf.train.Feature(float_list=tf.train.FloatList(value=[1.0])),
            })).SerializeToString())
)PY")
                                   .arg(literal);
        const PyRun run = runPython(python, {"-c", script, dir.path()});
        QVERIFY2(run.code == 0, qPrintable(run.err.right(700)));

        // What TensorFlow read from our file.
        const QStringList lines = run.out.trimmed().split('\n');
        QCOMPARE(lines.size(), static_cast<qsizetype>(samples.size() + 1));
        for (int i = 0; i < lines.size(); ++i) {
            // The last record is samples[0] again, unpacked.
            const Sample& s =
                samples[i < static_cast<int>(samples.size()) ? static_cast<size_t>(i) : 0];
            const QStringList parts = lines[i].split(';');
            QCOMPARE(parts.size(), 3);
            QStringList names;
            for (const std::string& n : s.names) names << QString::fromStdString(hexOf(n));
            QCOMPARE(parts[0], "name=" + names.join(','));
            QStringList ids;
            for (const int64_t v : s.ids) ids << QString::number(v);
            QCOMPARE(parts[1], "ids=" + ids.join(','));
            const QStringList scores = parts[2].mid(6).split(',', Qt::SkipEmptyParts);
            QCOMPARE(scores.size(), static_cast<qsizetype>(s.scores.size()));
            for (int k = 0; k < scores.size(); ++k) {
                const float v = static_cast<float>(scores[k].toDouble());
                QCOMPARE(std::signbit(v), std::signbit(s.scores[static_cast<size_t>(k)]));
                QCOMPARE(v, s.scores[static_cast<size_t>(k)]);
            }
        }

        // What TensorFlow wrote, read here: plain and GZIP alike, and byte for byte the framing
        // appendTfRecord writes.
        for (const char* name : {"tf.tfrecord", "tf.tfrecord.gz"}) {
            const bool gz = std::string(name).ends_with(".gz");
            Scanned s;
            const std::string path = dir.filePath(name).toStdString();
            const std::string e = scanFile(path, gz ? "GZIP" : "", s);
            QVERIFY2(e.empty(), e.c_str());
            QCOMPARE(s.records.size(), samples.size());
            std::string reframed;
            for (size_t i = 0; i < samples.size(); ++i) {
                auto got = parseExample(s.records[i], {"name", "ids", "score"});
                QVERIFY2(got.ok(), got.ok() ? "" : got.error().c_str());
                checkSample(*got, samples[i]);
                appendTfRecord(reframed, s.records[i]);
            }
            if (!gz) QVERIFY(reframed == readFile(path));
        }
    }

    // projects/make_tfrecords.py: its shards hold the first images and labels of the IDX files
    // (PNG-encoded, or raw), plain and GZIP; and TensorFlow reads them the same.
    void makeTfrecordsScript() {
        const std::string idxDir = fashionMnistDir();
        const std::string images = findIdx(idxDir, "train-images-idx3-ubyte");
        const std::string labels = findIdx(idxDir, "train-labels-idx1-ubyte");
        if (images.empty() || labels.empty())
            QSKIP("no Fashion-MNIST IDX files (Debian's dataset-fashion-mnist)");
        const QString python = systemPython();
        if (python.isEmpty()) QSKIP("no python3 to run projects/make_tfrecords.py");
        constexpr int kImages = 20;
        std::string pixels, classes;
        QVERIFY(readIdxPrefix(images, 16, kImages * 784, pixels));
        QVERIFY(readIdxPrefix(labels, 8, kImages, classes));

        QTemporaryDir dir;
        const QString script = QString(td::dev::kSourceDir) + "/projects/make_tfrecords.py";
        struct Variant {
            const char* folder;
            QStringList flags;
            bool gzip, raw;
        };
        const std::vector<Variant> variants = {{"plain", {}, false, false},
                                               {"gz", {"--gzip"}, true, false},
                                               {"raw", {"--raw", "--shards", "3"}, false, true}};
        for (const Variant& v : variants) {
            const QString out = dir.filePath(v.folder);
            const PyRun run = runPython(
                python, QStringList{script, "--limit", QString::number(kImages), "--out", out,
                                    "--fashion-mnist", QString::fromStdString(idxDir)} +
                            v.flags);
            QVERIFY2(run.code == 0, qPrintable(run.err));
            const int shards = v.raw ? 3 : 8;
            int n = 0;
            for (int shard = 0; shard < shards; ++shard) {
                const std::string path = (out + QString("/train-%1-of-%2.tfrecord%3")
                                                    .arg(shard, 5, 10, QChar('0'))
                                                    .arg(shards, 5, 10, QChar('0'))
                                                    .arg(v.gzip ? ".gz" : ""))
                                             .toStdString();
                auto f = TfRecordFile::open(path, v.gzip ? "GZIP" : "");
                QVERIFY2(f.ok(), f.ok() ? "" : f.error().c_str());
                const std::vector<std::string> wanted = {"image", "image_raw", "label"};
                const Status st = (*f)->scan([&](int64_t, std::string_view data) -> Status {
                    TD_ASSIGN_OR_RETURN(auto ex, parseExample(data, wanted));
                    const std::string want = pixels.substr(static_cast<size_t>(n) * 784, 784);
                    if (ex.size() != 2 || !ex.count("label") ||
                        ex["label"].ints != std::vector<int64_t>{static_cast<uint8_t>(
                                                classes[static_cast<size_t>(n)])})
                        return err("image " + std::to_string(n) + ": wrong features or label");
                    if (v.raw) {
                        if (!ex.count("image_raw") || ex["image_raw"].bytes.size() != 1 ||
                            ex["image_raw"].bytes[0] != want)
                            return err("image " + std::to_string(n) + ": raw pixels differ");
                    } else {
                        if (!ex.count("image") || ex["image"].bytes.size() != 1)
                            return err("image " + std::to_string(n) + ": no PNG");
                        const std::string_view png = ex["image"].bytes[0];
                        TD_ASSIGN_OR_RETURN(
                            const DecodedImage img,
                            decodeImageFile(path, 1, std::vector<uint8_t>(png.begin(), png.end())));
                        if (img.height != 28 || img.width != 28 || img.channels != 1 ||
                            std::string(img.pixels.begin(), img.pixels.end()) != want)
                            return err("image " + std::to_string(n) + ": PNG pixels differ");
                    }
                    ++n;
                    return Status::success();
                });
                QVERIFY2(st.ok(), st.ok() ? "" : st.error().c_str());
            }
            QCOMPARE(n, kImages);
            QVERIFY(fs::exists((out + (v.gzip ? "/test-00001-of-00002.tfrecord.gz"
                                              : "/test-00001-of-00002.tfrecord"))
                                   .toStdString()));
        }

        const QString tfPython = benchPython();
        if (tfPython.isEmpty() || runPython(tfPython, {"-c", "import tensorflow"}).code != 0)
            QSKIP(
                "the script's output was checked here; no Python with TensorFlow to check it with");
        const QString check = R"PY(
import glob, gzip, struct, sys
import tensorflow as tf
d, images, labels, n = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
def idx(path):
    data = (gzip.open if path.endswith(".gz") else open)(path, "rb").read()
    return data[4 + 4 * data[3]:]
px, lab = idx(images), idx(labels)
spec = {"image": tf.io.FixedLenFeature([], tf.string), "label": tf.io.FixedLenFeature([], tf.int64)}
for sub, suffix, comp in (("plain", ".tfrecord", ""), ("gz", ".tfrecord.gz", "GZIP")):
    files = sorted(glob.glob(d + "/" + sub + "/train-*-of-00008" + suffix))
    i = 0
    for r in tf.data.TFRecordDataset(files, compression_type=comp):
        e = tf.io.parse_single_example(r, spec)
        assert tf.io.decode_png(e["image"]).numpy().tobytes() == px[i * 784:(i + 1) * 784], i
        assert int(e["label"]) == lab[i], i
        i += 1
    assert i == n, (sub, i)
print("ok")
)PY";
        const PyRun run =
            runPython(tfPython, {"-c", check, dir.path(), QString::fromStdString(images),
                                 QString::fromStdString(labels), QString::number(kImages)});
        QVERIFY2(run.code == 0 && run.out.trimmed() == "ok", qPrintable(run.err.right(700)));
    }

  private:
    static std::string statusOrEmpty(const Status& s) { return s.ok() ? std::string() : s.error(); }

    // Shards whose records carry their global number as the label and as a one-byte x: the
    // order a source reads them in is the order of its labels.
    static std::vector<std::string> numberedShards(const std::string& dir,
                                                   const std::vector<int64_t>& counts) {
        std::vector<std::string> paths;
        int64_t id = 0;
        for (size_t f = 0; f < counts.size(); ++f) {
            std::string file;
            for (int64_t r = 0; r < counts[f]; ++r, ++id) {
                ExampleFeatures e;
                e["x"].kind = ExampleFeature::Kind::Bytes;
                const std::string byte(1, static_cast<char>(id));
                e["x"].bytes = {byte};
                e["label"].kind = ExampleFeature::Kind::Int64;
                e["label"].ints = {id};
                appendTfRecord(file, serializeExample(e));
            }
            paths.push_back(dir + "/shard-" + std::to_string(f) + ".tfrecord");
            writeFile(paths.back(), file);
        }
        return paths;
    }

    static TfRecordConfig numberedConfig(const std::string& dir) {
        TfRecordConfig c;
        c.files = {dir + "/shard-*.tfrecord"};
        c.xFeature = "x";
        c.xDecode = "raw";
        c.xShape = {1};
        return c;
    }

    static std::vector<int32_t> labelsOf(const Dataset& d) {
        return std::vector<int32_t>(d.y.data<int32_t>(), d.y.data<int32_t>() + d.y.size());
    }

  private slots:

    // tf.data's interleave, worked by hand: files of 5, 2 and 7 records, cycle 2, block 3.
    void interleaveOrderByHand() {
        const auto order = interleaveOrder({5, 2, 7}, {0, 1, 2}, 2, 3);
        const std::vector<std::pair<int32_t, int64_t>> want{{0, 0}, {0, 1}, {0, 2}, {1, 0}, {1, 1},
                                                            {0, 3}, {0, 4}, {2, 0}, {2, 1}, {2, 2},
                                                            {2, 3}, {2, 4}, {2, 5}, {2, 6}};
        QCOMPARE(order, want);
        // Cycle 1 reads the files one after the other; in the order given.
        const auto seq = interleaveOrder({2, 1}, {1, 0}, 1, 4);
        QCOMPARE(seq, (std::vector<std::pair<int32_t, int64_t>>{{1, 0}, {0, 0}, {0, 1}}));
    }

    // The tfrecord source reads shards in the order tf.data's interleave does, for several
    // cycle and block lengths (TensorFlow itself gives the expected order, where it is there).
    void interleaveMatchesTensorFlow() {
        const QString python = benchPython();
        if (python.isEmpty()) QSKIP("no Python with TensorFlow (installer/bench.sh)");
        if (runPython(python, {"-c", "import tensorflow"}).code != 0)
            QSKIP("the benchmark Python has no TensorFlow");
        QTemporaryDir dir;
        const std::string d = dir.path().toStdString();
        numberedShards(d, {5, 2, 7, 1, 4});
        const QString script = R"PY(
import glob, sys
import tensorflow as tf
files = sorted(glob.glob(sys.argv[1] + "/shard-*.tfrecord"))
spec = {"label": tf.io.FixedLenFeature([], tf.int64)}
for cycle, block in ((1, 1), (2, 3), (3, 1), (8, 2)):
    ds = tf.data.Dataset.from_tensor_slices(files).interleave(
        tf.data.TFRecordDataset, cycle_length=cycle, block_length=block,
        num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
    print(",".join(str(int(tf.io.parse_single_example(r, spec)["label"])) for r in ds))
)PY";
        const PyRun r = runPython(python, {"-c", script, dir.path()});
        QVERIFY2(r.code == 0, qPrintable(r.err));
        const QStringList lines = r.out.trimmed().split('\n');
        QCOMPARE(lines.size(), 4);
        const std::vector<std::pair<int64_t, int64_t>> configs{{1, 1}, {2, 3}, {3, 1}, {8, 2}};
        for (size_t k = 0; k < configs.size(); ++k) {
            TfRecordConfig c = numberedConfig(d);
            c.cycleLength = configs[k].first;
            c.blockLength = configs[k].second;
            auto splits = loadSource(SourceConfig{.type = "tfrecord", .records = c});
            QVERIFY2(splits.ok(), splits.ok() ? "" : splits.error().c_str());
            QStringList got;
            for (int32_t v : labelsOf(splits->train)) got << QString::number(v);
            QCOMPARE(got.join(','), lines[static_cast<int>(k)]);
        }
    }

    // A source of shards: decoded at load and streamed give the same batches; a shuffled epoch
    // reads the shards in an order of its own (every record once); raw, float and encoded-image
    // features; GZIP shards.
    void sourceReadsShards() {
        QTemporaryDir dir;
        const std::string d = dir.path().toStdString();
        numberedShards(d, {9, 4, 11});
        TfRecordConfig c = numberedConfig(d);
        c.cycleLength = 2;
        auto decoded = loadSource(SourceConfig{.type = "tfrecord", .records = c});
        auto streamed = loadSource(SourceConfig{.type = "tfrecord", .records = c}, true);
        QVERIFY2(decoded.ok() && streamed.ok(), decoded.ok() ? "" : decoded.error().c_str());
        QVERIFY(streamed->train.streamed() && !decoded->train.streamed());
        QCOMPARE(decoded->train.x.dtype(), DType::U8);
        QCOMPARE(decoded->train.numClasses, int64_t(24));
        for (int64_t i = 0; i < 24; ++i)  // x is the label's byte
            QCOMPARE(int(decoded->train.x.data<uint8_t>()[i]), decoded->train.y.data<int32_t>()[i]);
        PipelineConfig pc;
        pc.cache = "none";
        pc.shuffleBuffer = 4;
        std::vector<std::vector<int32_t>> epochs;
        for (const Dataset* ds : {&decoded->train, &streamed->train}) {
            auto pipe = Pipeline::create(*ds, pc, 5, true, 11);
            QVERIFY2(pipe.ok(), pipe.ok() ? "" : pipe.error().c_str());
            for (int e = 0; e < 3; ++e) {
                QVERIFY((*pipe)->beginEpoch(e).ok());
                std::vector<int32_t> seen;
                while (true) {
                    auto b = (*pipe)->next();
                    QVERIFY(b.ok());
                    if (!*b) break;
                    for (int64_t r = 0; r < (*b)->size; ++r) {
                        const int32_t label = (*b)->y.data<int32_t>()[r];
                        QCOMPARE(static_cast<int32_t>((*b)->x.data<float>()[r]), label);
                        seen.push_back(label);
                    }
                }
                epochs.push_back(seen);
            }
        }
        for (int e = 0; e < 3; ++e) {
            QCOMPARE(epochs[static_cast<size_t>(e)], epochs[static_cast<size_t>(e + 3)]);
            std::vector<int32_t> sorted = epochs[static_cast<size_t>(e)];
            std::sort(sorted.begin(), sorted.end());
            for (int32_t i = 0; i < 24; ++i) QCOMPARE(sorted[static_cast<size_t>(i)], i);
        }
        QVERIFY(epochs[0] != epochs[1] && epochs[1] != epochs[2]);
        // A validation split keeps the shard order's shuffle on each side, decoded or streamed.
        {
            auto [dHead, dTail] = splitTail(decoded->train, 0.25);
            auto [sHead, sTail] = splitTail(streamed->train, 0.25);
            std::vector<int32_t> first[2];
            for (int k = 0; k < 2; ++k) {
                auto pipe = Pipeline::create(k == 0 ? dHead : sHead, pc, 18, true, 11);
                QVERIFY(pipe.ok() && (*pipe)->beginEpoch(2).ok());
                auto b = (*pipe)->next();
                QVERIFY(b.ok() && *b);
                first[k].assign((*b)->y.data<int32_t>(), (*b)->y.data<int32_t>() + 18);
            }
            QCOMPARE(first[0], first[1]);
            QVERIFY(dHead.epochOrder && !dHead.epochOrder(7).empty());
        }
        // Without shuffle_files the shards keep their order: only the buffer shuffles, so a
        // record moves at most a few places ahead... and the epochs differ only by the buffer.
        c.shuffleFiles = false;
        auto fixed = loadSource(SourceConfig{.type = "tfrecord", .records = c}, true);
        QVERIFY(fixed.ok());
        PipelineConfig none = pc;
        none.shuffleBuffer = 1;  // a buffer of one keeps the order
        auto pipe = Pipeline::create(fixed->train, none, 24, true, 11);
        QVERIFY(pipe.ok() && (*pipe)->beginEpoch(1).ok());
        auto b = (*pipe)->next();
        QVERIFY(b.ok() && *b);
        QCOMPARE(std::vector<int32_t>((*b)->y.data<int32_t>(), (*b)->y.data<int32_t>() + 24),
                 labelsOf(decoded->train));

        // Float features, float targets, GZIP.
        std::string file;
        for (int r = 0; r < 3; ++r) {
            ExampleFeatures e;
            e["v"].kind = ExampleFeature::Kind::Float;
            e["v"].floats = {float(r), 0.5f, -1.0f};
            e["t"].kind = ExampleFeature::Kind::Float;
            e["t"].floats = {float(r) * 2};
            appendTfRecord(file, serializeExample(e));
        }
        writeFile(d + "/floats.tfrecord.gz", gzipBytes(file));
        TfRecordConfig f;
        f.files = {d + "/floats.tfrecord.gz"};
        f.compression = "GZIP";
        f.xFeature = "v";
        f.xDecode = "float";
        f.xShape = {3};
        f.yFeature = "t";
        f.yDecode = "float";
        auto floats = loadSource(SourceConfig{.type = "tfrecord", .records = f});
        QVERIFY2(floats.ok(), floats.ok() ? "" : floats.error().c_str());
        QCOMPARE(floats->train.x.shape(), (Shape{3, 3}));
        QCOMPARE(floats->train.x.data<float>()[6], 2.0f);
        QCOMPARE(floats->train.y.shape(), (Shape{3, 1}));
        QCOMPARE(floats->train.y.data<float>()[2], 4.0f);
    }

    // Bad input, each named: a pattern that matches nothing, a record without the feature, a
    // raw feature of the wrong size, a record whose CRC does not match, an image that does not
    // decode (met when its sample is read, streamed).
    void sourceErrorsNameTheRecord() {
        QTemporaryDir dir;
        const std::string d = dir.path().toStdString();
        const auto paths = numberedShards(d, {3, 2});
        auto load = [&](const TfRecordConfig& c, bool stream = false) {
            return loadSource(SourceConfig{.type = "tfrecord", .records = c}, stream);
        };
        auto expect = [&](const TfRecordConfig& c, const std::string& part) {
            auto r = load(c);
            QVERIFY2(!r.ok(), part.c_str());
            QVERIFY2(r.error().find(part) != std::string::npos, r.error().c_str());
        };
        TfRecordConfig c = numberedConfig(d);
        c.files.push_back(d + "/nothing-*.tfrecord");
        expect(c, "data.source.files[1]: \"" + d + "/nothing-*.tfrecord\" matches no file");
        c = numberedConfig(d);
        c.yFeature = "class";
        expect(c, paths[0] + ": record at offset 0: no feature \"class\" (data.source.y.feature)");
        c = numberedConfig(d);
        c.xShape = {2};
        expect(c, paths[0] +
                      ": record at offset 0: feature \"x\" has 1 bytes; data.source.x "
                      "expects 2");
        // A flipped byte in the second record's data.
        std::string bytes = readFile(paths[1]);
        const size_t second = bytes.size() / 2;
        bytes[second + 14] = static_cast<char>(bytes[second + 14] ^ 0x40);
        writeFile(paths[1], bytes);
        c = numberedConfig(d);
        expect(c,
               paths[1] + ": record at offset " + std::to_string(second) + ": data CRC mismatch");
        fs::remove(paths[1]);
        // An "image" that is not one.
        c = numberedConfig(d);
        c.xDecode = "image";
        c.image.colorMode = "grayscale";
        c.image.height = c.image.width = 2;
        auto streamed = load(c, true);
        QVERIFY2(streamed.ok(), streamed.ok() ? "" : streamed.error().c_str());
        std::vector<float> px(4);
        const Status s = streamed->train.reader->read(1, px.data());
        QVERIFY(!s.ok());
        QVERIFY2(s.error().find(paths[0] + ": record at offset ") != std::string::npos &&
                     s.error().find("not an image") != std::string::npos,
                 s.error().c_str());
        expect(c, "not an image");
    }

    // Same batches, bit for bit, from two pipelines over `epochs` epochs; the labels seen, in
    // order.
    static std::vector<int32_t> sameBatches(Pipeline& a, Pipeline& b, int epochs,
                                            const std::string& what) {
        std::vector<int32_t> labels;
        for (int epoch = 0; epoch < epochs; ++epoch) {
            if (!a.beginEpoch(epoch).ok() || !b.beginEpoch(epoch).ok()) {
                QTest::qFail(("beginEpoch: " + what).c_str(), __FILE__, __LINE__);
                return {};
            }
            for (int64_t k = 0;; ++k) {
                auto ba = a.next();
                auto bb = b.next();
                const std::string at =
                    what + " epoch " + std::to_string(epoch) + " batch " + std::to_string(k);
                if (!ba.ok() || !bb.ok() || (*ba == nullptr) != (*bb == nullptr)) {
                    QTest::qFail((at + ": " +
                                  (!ba.ok()   ? ba.error()
                                   : !bb.ok() ? bb.error()
                                              : std::string("one ended first")))
                                     .c_str(),
                                 __FILE__, __LINE__);
                    return {};
                }
                if (!*ba) break;
                if (std::memcmp((*ba)->x.raw(), (*bb)->x.raw(), (*ba)->x.bytes()) != 0 ||
                    std::memcmp((*ba)->y.raw(), (*bb)->y.raw(), (*ba)->y.bytes()) != 0) {
                    QTest::qFail((at + ": the batches differ").c_str(), __FILE__, __LINE__);
                    return {};
                }
                labels.insert(labels.end(), (*ba)->y.data<int32_t>(),
                              (*ba)->y.data<int32_t>() + (*ba)->size);
            }
        }
        return labels;
    }

    // skip_bad_files on TFRecord shards: a record whose data CRC does not match, a record without
    // the x feature, a record whose raw x has another size (found only by decoding), the rest of
    // a shard cut short, a file that is not TFRecord at all. Off: an error naming the file and the
    // offset. On: left out, counted and named in the log, the same records decoded at load and
    // streamed; each left-out record keeps its place in the interleave (the unshuffled order is
    // the full interleave without them), so the batches are the same either way, shuffled shards
    // included, and with a cache before the decode (memory and file).
    void skipBadRecords() {
        QTemporaryDir dir;
        const std::string d = dir.path().toStdString();
        // Shard f holds ids firstId[f]...; x is the id's byte, the label the id.
        auto example = [](int64_t id, bool withX, size_t xBytes) {
            ExampleFeatures e;
            const std::string x(xBytes, static_cast<char>(id));  // the feature views it
            if (withX) {
                e["x"].kind = ExampleFeature::Kind::Bytes;
                e["x"].bytes = {x};
            }
            e["label"].kind = ExampleFeature::Kind::Int64;
            e["label"].ints = {id};
            return serializeExample(e);
        };
        std::vector<std::string> paths;
        std::vector<int64_t> recordOffset(18);
        for (int f = 0; f < 3; ++f) {
            const int64_t first[] = {0, 6, 11}, count[] = {6, 5, 7};
            std::string file;
            for (int64_t id = first[f]; id < first[f] + count[f]; ++id) {
                recordOffset[static_cast<size_t>(id)] = static_cast<int64_t>(file.size());
                appendTfRecord(file, example(id, id != 8, id == 9 ? 2 : 1));
            }
            if (f == 0) file[static_cast<size_t>(recordOffset[2]) + 14] ^= 0x20;  // id 2's data
            if (f == 2) file.resize(file.size() - 5);                             // id 17 cut short
            paths.push_back(d + "/shard-" + std::to_string(f) + ".tfrecord");
            writeFile(paths.back(), file);
        }
        paths.push_back(d + "/shard-3.tfrecord");
        writeFile(paths.back(), "this is not a TFRecord file at all");
        TfRecordConfig c = numberedConfig(d);
        c.cycleLength = 2;
        c.blockLength = 2;
        c.shuffleFiles = false;
        auto load = [&](const TfRecordConfig& cfg, bool stream) {
            return loadSource(SourceConfig{.type = "tfrecord", .records = cfg}, stream);
        };
        // Off: the first bad record is an error naming its file and offset, and the way out.
        for (bool stream : {false, true}) {
            auto r = load(c, stream);
            QVERIFY(!r.ok());
            expectContains(r.error(), paths[0] + ": record at offset " +
                                          std::to_string(recordOffset[2]) + ": data CRC mismatch");
            expectContains(r.error(), "set data.source.skip_bad_files");
        }
        c.skipBadFiles = true;
        auto decoded = load(c, false);
        auto streamed = load(c, true);
        QVERIFY2(decoded.ok(), decoded.ok() ? "" : decoded.error().c_str());
        QVERIFY2(streamed.ok(), streamed.ok() ? "" : streamed.error().c_str());
        QVERIFY(streamed->train.streamed() && !decoded->train.streamed());
        QCOMPARE(decoded->train.size(), int64_t(14));
        QCOMPARE(streamed->train.size(), int64_t(14));
        for (const DataSplits* splits : {&*decoded, &*streamed}) {
            std::string notes;
            for (const std::string& n : splits->notes) notes += n + "\n";
            expectContains(notes,
                           "data.source.skip_bad_files: left out 5 of 19 training records: ");
            expectContains(notes, paths[0] + ": record at offset " +
                                      std::to_string(recordOffset[2]) + ": data CRC mismatch");
            expectContains(notes, paths[1] + ": record at offset " +
                                      std::to_string(recordOffset[8]) + ": no feature \"x\"");
            expectContains(notes, paths[1] + ": record at offset " +
                                      std::to_string(recordOffset[9]) +
                                      ": feature \"x\" has 2 bytes; data.source.x expects 1");
            expectContains(notes, paths[2] + ": truncated record at offset " +
                                      std::to_string(recordOffset[17]));
            expectContains(notes, "(the rest of the file is left out)");
            expectContains(notes, paths[3] + ": not a TFRecord file");
            QVERIFY2(notes.find("set data.source.skip_bad_files") == std::string::npos,
                     notes.c_str());
        }
        // The unshuffled order: the interleave of all four shards, each bad record (and each
        // unreadable rest) in its place, then taken out.
        const std::vector<std::vector<int32_t>> idsOf{
            {0, 1, 2, 3, 4, 5}, {6, 7, 8, 9, 10}, {11, 12, 13, 14, 15, 16, -1}, {-1}};
        std::vector<int32_t> expected;
        for (auto [f, r] : interleaveOrder({6, 5, 7, 1}, {0, 1, 2, 3}, 2, 2)) {
            const int32_t id = idsOf[static_cast<size_t>(f)][static_cast<size_t>(r)];
            if (id >= 0 && id != 2 && id != 8 && id != 9) expected.push_back(id);
        }
        QCOMPARE(labelsOf(decoded->train), expected);
        QCOMPARE(labelsOf(streamed->train), expected);
        for (int64_t i = 0; i < 14; ++i)  // x is the label's byte
            QCOMPARE(int(decoded->train.x.data<uint8_t>()[i]), expected[static_cast<size_t>(i)]);

        // Shuffled shards: decoded at load, streamed, and streamed through a cache before the
        // decode (memory, file) give the same batches.
        c.shuffleFiles = true;
        decoded = load(c, false);
        streamed = load(c, true);
        QVERIFY(decoded.ok() && streamed.ok());
        PipelineConfig pc;
        pc.shuffleBuffer = 3;
        PipelineConfig none = pc;
        none.cache = "none";
        PipelineConfig enc = pc;
        enc.map = {MapStep{.op = "cache"}, MapStep{.op = "decode"}};
        {
            auto a = Pipeline::create(decoded->train, pc, 4, true, 21);
            auto b = Pipeline::create(streamed->train, none, 4, true, 21);
            QVERIFY(a.ok() && b.ok());
            const auto labels = sameBatches(**a, **b, 3, "streamed");
            QCOMPARE(labels.size(), size_t(42));
            std::vector<int32_t> first(labels.begin(), labels.begin() + 14);
            QVERIFY(first != std::vector<int32_t>(labels.begin() + 14, labels.begin() + 28));
            std::sort(first.begin(), first.end());
            std::vector<int32_t> sortedExpected = expected;
            std::sort(sortedExpected.begin(), sortedExpected.end());
            QCOMPARE(first, sortedExpected);
        }
        for (const std::string& cache : {std::string("memory"), "file:" + d + "/records.cache"}) {
            enc.cache = cache;
            auto a = Pipeline::create(decoded->train, pc, 4, true, 21);
            auto b = Pipeline::create(streamed->train, enc, 4, true, 21);
            QVERIFY2(a.ok() && b.ok(), b.ok() ? "" : b.error().c_str());
            sameBatches(**a, **b, 3, "encoded cache " + cache);
            QCOMPARE((*b)->stats().epochCacheElements, int64_t(14));
        }

        // A GZIP shard whose stream is broken does not open: left out whole, counted.
        std::string good, other;
        for (int64_t id = 0; id < 4; ++id) appendTfRecord(good, example(id, true, 1));
        for (int64_t id = 4; id < 7; ++id) appendTfRecord(other, example(id, true, 1));
        writeFile(d + "/z-0.tfrecord.gz", gzipBytes(good));
        const std::string broken = gzipBytes(other);
        writeFile(d + "/z-1.tfrecord.gz", broken.substr(0, broken.size() / 2));
        TfRecordConfig z = numberedConfig(d);
        z.files = {d + "/z-*.tfrecord.gz"};
        z.compression = "GZIP";
        auto refused = load(z, true);
        QVERIFY(!refused.ok());
        expectContains(refused.error(), d + "/z-1.tfrecord.gz: truncated gzip stream");
        z.skipBadFiles = true;
        auto kept = load(z, true);
        QVERIFY2(kept.ok(), kept.ok() ? "" : kept.error().c_str());
        QCOMPARE(kept->train.size(), int64_t(4));
        std::string notes;
        for (const std::string& n : kept->notes) notes += n + "\n";
        expectContains(notes, "left out 1 of 5 training records: " + d +
                                  "/z-1.tfrecord.gz: truncated gzip stream");
    }
};

QTEST_GUILESS_MAIN(TestTfRecord)
#include "test_tfrecord.moc"

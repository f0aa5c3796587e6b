// The tfrecord source (tfrecord_source.h).
#include "engine/data/tfrecord_source.h"

#include <glob.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <limits>
#include <map>
#include <unordered_map>

#include "engine/data/image_folder.h"
#include "engine/data/random.h"
#include "engine/data/tfrecord.h"

namespace td {
namespace fs = std::filesystem;

namespace {

constexpr int64_t kMaxDefaultCycle = 16;
constexpr const char* kSkipHint = " (set data.source.skip_bad_files to leave such records out)";

// Each pattern's matches, sorted, in pattern order; a pattern that matches nothing is an error.
Result<std::vector<std::string>> expandPatterns(const std::vector<std::string>& patterns,
                                                const std::string& field) {
    std::vector<std::string> files;
    for (size_t k = 0; k < patterns.size(); ++k) {
        glob_t g{};
        const int rc = ::glob(patterns[k].c_str(), GLOB_ERR, nullptr, &g);
        std::vector<std::string> found;
        for (size_t i = 0; rc == 0 && i < g.gl_pathc; ++i) {
            std::error_code ec;
            if (fs::is_regular_file(g.gl_pathv[i], ec)) found.emplace_back(g.gl_pathv[i]);
        }
        globfree(&g);
        if (found.empty())
            return err(field + "[" + std::to_string(k) + "]: \"" + patterns[k] +
                       "\" matches no file");
        std::sort(found.begin(), found.end());
        files.insert(files.end(), found.begin(), found.end());
    }
    return files;
}

std::string describeDecode(const TfRecordConfig& c) {
    std::string d = c.xFeature + ":" + c.xDecode + ":" + c.rawDtype + ":" + shapeToString(c.xShape);
    if (c.xDecode == "image")
        d += ":" + c.image.colorMode + ":" + std::to_string(c.image.height) + "x" +
             std::to_string(c.image.width) + ":" + c.image.interpolation +
             (c.image.cropToAspectRatio ? ":crop" : "") + (c.image.padToAspectRatio ? ":pad" : "");
    return d;
}

struct RecordRef {
    int64_t offset = 0;
    int32_t file = 0;
    uint32_t length = 0;  // of the record's data (at most kTfRecordMaxLength)
};

class TfRecordReader final : public ElementReader {
  public:
    // `files[f]` is null for a shard that did not open (skip_bad_files; its one sample is bad).
    // `bad`: the samples that do not read (skip_bad_files), with their errors.
    TfRecordReader(const TfRecordConfig& cfg, std::vector<std::string> paths,
                   std::vector<std::unique_ptr<TfRecordFile>> files, std::vector<RecordRef> refs,
                   std::vector<int64_t> counts, std::vector<std::vector<int32_t>> indexOf,
                   std::unordered_map<int64_t, std::string> bad)
        : cfg_(cfg),
          paths_(std::move(paths)),
          files_(std::move(files)),
          refs_(std::move(refs)),
          counts_(std::move(counts)),
          indexOf_(std::move(indexOf)),
          bad_(std::move(bad)) {
        if (cfg_.xDecode == "image") {
            shape_ = {cfg_.image.height, cfg_.image.width, channelsOf(cfg_.image.colorMode)};
            dtype_ = DType::F32;
        } else {
            shape_ = cfg_.xShape;
            dtype_ = cfg_.xDecode == "raw" && cfg_.rawDtype == "uint8" ? DType::U8 : DType::F32;
        }
    }
    int64_t size() const override { return static_cast<int64_t>(refs_.size()); }
    Shape sampleShape() const override { return shape_; }
    DType dtype() const override { return dtype_; }

    Status read(int64_t i, void* dst) const override {
        thread_local std::string record;
        TD_RETURN_IF_ERROR(readRecord(i, record));
        const RecordRef& r = refs_[static_cast<size_t>(i)];
        return withHint(decodeX(paths_[static_cast<size_t>(r.file)], r.offset, record, dst));
    }

    bool hasEncoded() const override { return true; }
    std::string elementName(int64_t i) const override {
        const RecordRef& r = refs_[static_cast<size_t>(i)];
        return paths_[static_cast<size_t>(r.file)] + ": record at offset " +
               std::to_string(r.offset);
    }
    Result<std::vector<int64_t>> encodedSizes() const override {
        std::vector<int64_t> sizes;
        sizes.reserve(refs_.size());
        for (const RecordRef& r : refs_) sizes.push_back(r.length);
        return sizes;
    }
    Status readEncoded(int64_t i, std::vector<uint8_t>& out) const override {
        thread_local std::string record;
        TD_RETURN_IF_ERROR(readRecord(i, record));
        out.assign(record.begin(), record.end());
        return Status::success();
    }
    Status decode(int64_t i, const uint8_t* bytes, size_t size, void* dst) const override {
        const RecordRef& r = refs_[static_cast<size_t>(i)];
        return withHint(decodeX(paths_[static_cast<size_t>(r.file)], r.offset,
                                std::string_view(reinterpret_cast<const char*>(bytes), size), dst));
    }

    // The x feature of one record into dst (also used to check records at load).
    Status decodeX(const std::string& path, int64_t offset, std::string_view record,
                   void* dst) const {
        const auto where = [&] { return path + ": record at offset " + std::to_string(offset); };
        auto parsed = parseExample(record, {cfg_.xFeature});
        if (!parsed.ok()) return err(where() + ": not a tf.train.Example: " + parsed.error());
        auto it = parsed->find(cfg_.xFeature);
        if (it == parsed->end())
            return err(where() + ": no feature \"" + cfg_.xFeature + "\" (data.source.x.feature)");
        const ExampleFeature& f = it->second;
        const int64_t values = numElements(shape_);
        if (cfg_.xDecode == "image" || cfg_.xDecode == "raw") {
            if (f.kind != ExampleFeature::Kind::Bytes || f.bytes.size() != 1)
                return err(where() + ": feature \"" + cfg_.xFeature +
                           "\" is not one bytes value (data.source.x.decode \"" + cfg_.xDecode +
                           "\" reads one)");
            const std::string_view b = f.bytes[0];
            if (cfg_.xDecode == "image") {
                const std::vector<uint8_t> bytes(b.begin(), b.end());
                return decodeToSize(cfg_.image, where(), bytes, static_cast<float*>(dst));
            }
            const auto want = static_cast<size_t>(values) * dtypeSize(dtype_);
            if (b.size() != want)
                return err(where() + ": feature \"" + cfg_.xFeature + "\" has " +
                           std::to_string(b.size()) + " bytes; data.source.x expects " +
                           std::to_string(want) + " (" + shapeToString(shape_) + " " +
                           cfg_.rawDtype + ")");
            std::memcpy(dst, b.data(), want);
            return Status::success();
        }
        // "float": a float list, or an int64 list converted.
        const size_t n = f.kind == ExampleFeature::Kind::Int64 ? f.ints.size() : f.floats.size();
        if (static_cast<int64_t>(n) != values || f.kind == ExampleFeature::Kind::Bytes)
            return err(where() + ": feature \"" + cfg_.xFeature + "\" has " +
                       std::to_string(f.kind == ExampleFeature::Kind::Bytes ? 0 : n) +
                       " numbers; data.source.x.shape " + shapeToString(shape_) + " expects " +
                       std::to_string(values));
        auto* out = static_cast<float*>(dst);
        for (size_t k = 0; k < n; ++k)
            out[k] =
                f.kind == ExampleFeature::Kind::Int64 ? static_cast<float>(f.ints[k]) : f.floats[k];
        return Status::success();
    }

    std::string identity() const override {
        std::string id = "tfrecord " + describeDecode(cfg_) + " cycle " +
                         std::to_string(cfg_.cycleLength) + " block " +
                         std::to_string(cfg_.blockLength) + "\n";
        for (const std::string& p : paths_) {
            std::error_code ec;
            const auto bytes = fs::file_size(p, ec);
            const auto time = fs::last_write_time(p, ec).time_since_epoch().count();
            id += p + " " + std::to_string(ec ? 0 : bytes) + " " + std::to_string(time) + "\n";
        }
        return id;
    }

    // The shards in an order drawn from the epoch's seed, interleaved.
    std::vector<int32_t> epochOrder(uint64_t seed) const override {
        if (!cfg_.shuffleFiles || files_.size() < 2) return {};
        std::vector<int32_t> files(files_.size());
        for (size_t f = 0; f < files.size(); ++f) files[f] = static_cast<int32_t>(f);
        Rng rng(deriveSeed(seed, 0x7f4a7c15ull));
        for (size_t k = files.size() - 1; k > 0; --k)
            std::swap(files[k], files[static_cast<size_t>(rng.uniform(k + 1))]);
        std::vector<int32_t> order;
        order.reserve(refs_.size());
        for (auto [f, r] : interleaveOrder(counts_, files, cycle(), cfg_.blockLength))
            order.push_back(indexOf_[static_cast<size_t>(f)][static_cast<size_t>(r)]);
        return order;
    }

    int64_t cycle() const {
        return cfg_.cycleLength > 0
                   ? cfg_.cycleLength
                   : std::min<int64_t>(kMaxDefaultCycle, static_cast<int64_t>(files_.size()));
    }

  private:
    // Record i's data, checked (a sample found bad at load gives its error again).
    Status readRecord(int64_t i, std::string& out) const {
        if (!bad_.empty())
            if (auto it = bad_.find(i); it != bad_.end()) return err(it->second);
        const RecordRef& r = refs_[static_cast<size_t>(i)];
        return withHint(files_[static_cast<size_t>(r.file)]->readRecord(r.offset, out));
    }
    // A record that does not read, without skip_bad_files: the error says how to leave it out.
    Status withHint(Status s) const {
        if (s.ok() || cfg_.skipBadFiles) return s;
        return err(s.error() + kSkipHint);
    }

    TfRecordConfig cfg_;
    std::vector<std::string> paths_;
    std::vector<std::unique_ptr<TfRecordFile>> files_;
    std::vector<RecordRef> refs_;
    std::vector<int64_t> counts_;
    std::vector<std::vector<int32_t>> indexOf_;  // file, record -> sample
    std::unordered_map<int64_t, std::string> bad_;
    Shape shape_;
    DType dtype_ = DType::F32;
};

// One split: the shards opened and walked, labels read, the x feature checked present in every
// record. With skip_bad_files, what does not read (a shard that does not open, a record whose CRC
// does not match, the rest of a shard after a framing error, a record without its features or
// with a label that is not one) becomes a bad sample in its place, left out later (loadTfRecords)
// with those whose x does not decode.
Result<Dataset> loadSplit(const TfRecordConfig& cfg, const std::vector<std::string>& patterns,
                          const std::string& field) {
    TD_ASSIGN_OR_RETURN(std::vector<std::string> paths, expandPatterns(patterns, field));
    const bool skip = cfg.skipBadFiles;
    std::vector<std::unique_ptr<TfRecordFile>> files;
    std::vector<std::vector<int64_t>> offsets(paths.size());
    std::vector<std::vector<uint32_t>> lengths(paths.size());
    std::vector<std::vector<double>> labels(paths.size());            // exact for int64 class ids
    std::vector<std::map<int64_t, std::string>> badOf(paths.size());  // record -> error
    std::vector<int64_t> counts(paths.size());
    const int64_t labelWidth = cfg.yDecode == "int64" ? 1 : cfg.yWidth;
    for (size_t f = 0; f < paths.size(); ++f) {
        // A bad record in its place: a placeholder label, and its error.
        auto markBad = [&](int64_t offset, const std::string& error) {
            badOf[f][static_cast<int64_t>(offsets[f].size())] = error;
            offsets[f].push_back(offset);
            lengths[f].push_back(0);
            labels[f].insert(labels[f].end(), static_cast<size_t>(labelWidth), 0.0);
        };
        auto opened = TfRecordFile::open(paths[f], cfg.compression);
        if (!opened.ok()) {
            if (!skip) return err(opened.error() + kSkipHint);
            markBad(0, opened.error());
            files.emplace_back();
            counts[f] = 1;
            continue;
        }
        std::unique_ptr<TfRecordFile> file = std::move(opened).value();
        auto onRecord = [&](int64_t offset, std::string_view data) -> Status {
            const auto where = [&] {
                return paths[f] + ": record at offset " + std::to_string(offset);
            };
            auto check = [&]() -> Status {
                auto parsed = parseExample(data, {cfg.xFeature, cfg.yFeature});
                if (!parsed.ok())
                    return err(where() + ": not a tf.train.Example: " + parsed.error());
                if (!parsed->count(cfg.xFeature))
                    return err(where() + ": no feature \"" + cfg.xFeature +
                               "\" (data.source.x.feature)");
                auto y = parsed->find(cfg.yFeature);
                if (y == parsed->end())
                    return err(where() + ": no feature \"" + cfg.yFeature +
                               "\" (data.source.y.feature)");
                const ExampleFeature& yf = y->second;
                std::vector<double>& out = labels[f];
                if (cfg.yDecode == "int64") {
                    if (yf.kind != ExampleFeature::Kind::Int64 || yf.ints.size() != 1)
                        return err(where() + ": feature \"" + cfg.yFeature +
                                   "\" is not one int64 value (data.source.y.decode \"int64\": "
                                   "a class id)");
                    const int64_t v = yf.ints[0];
                    if (v < 0 || v > std::numeric_limits<int32_t>::max())
                        return err(where() + ": label " + std::to_string(v) +
                                   " is not a class id (0 to 2147483647)");
                    out.push_back(static_cast<double>(v));
                } else {
                    const size_t n =
                        yf.kind == ExampleFeature::Kind::Int64 ? yf.ints.size() : yf.floats.size();
                    if (static_cast<int64_t>(n) != cfg.yWidth ||
                        yf.kind == ExampleFeature::Kind::Bytes)
                        return err(where() + ": feature \"" + cfg.yFeature + "\" holds " +
                                   std::to_string(yf.kind == ExampleFeature::Kind::Bytes ? 0 : n) +
                                   " numbers; data.source.y.shape expects " +
                                   std::to_string(cfg.yWidth));
                    for (size_t k = 0; k < n; ++k)
                        out.push_back(yf.kind == ExampleFeature::Kind::Int64
                                          ? static_cast<double>(static_cast<float>(yf.ints[k]))
                                          : static_cast<double>(yf.floats[k]));
                }
                return Status::success();
            };
            Status s = check();
            if (!s.ok()) {
                if (!skip) return s;
                markBad(offset, s.error());
                return Status::success();
            }
            offsets[f].push_back(offset);
            lengths[f].push_back(static_cast<uint32_t>(data.size()));
            return Status::success();
        };
        if (skip) {
            TD_RETURN_IF_ERROR(
                file->scan(onRecord, [&](int64_t offset, const std::string& error, bool rest) {
                    markBad(offset, rest ? error + " (the rest of the file is left out)" : error);
                }));
        } else if (Status s = file->scan(onRecord); !s.ok()) {
            return err(s.error() + kSkipHint);
        }
        counts[f] = static_cast<int64_t>(offsets[f].size());
        files.push_back(std::move(file));
    }
    int64_t n = 0;
    for (int64_t c : counts) n += c;
    if (n == 0)
        return err(field + ": the " + std::to_string(paths.size()) + " file(s) hold no records");
    if (n > std::numeric_limits<int32_t>::max())
        return err(field + ": " + std::to_string(n) + " records exceed the 2^31-1 supported");

    // Samples in the unshuffled interleave's order.
    std::vector<int32_t> identity(paths.size());
    for (size_t f = 0; f < identity.size(); ++f) identity[f] = static_cast<int32_t>(f);
    const int64_t cycle =
        cfg.cycleLength > 0
            ? cfg.cycleLength
            : std::min<int64_t>(kMaxDefaultCycle, static_cast<int64_t>(paths.size()));
    std::vector<RecordRef> refs;
    refs.reserve(static_cast<size_t>(n));
    std::vector<std::vector<int32_t>> indexOf(paths.size());
    for (size_t f = 0; f < paths.size(); ++f) indexOf[f].resize(offsets[f].size());
    std::unordered_map<int64_t, std::string> bad;
    Dataset d;
    const bool ids = cfg.yDecode == "int64";
    d.y = ids ? Tensor(DType::I32, {n}) : Tensor(DType::F32, {n, cfg.yWidth});
    int32_t maxLabel = -1;
    for (auto [f, r] : interleaveOrder(counts, identity, cycle, cfg.blockLength)) {
        const auto k = static_cast<int64_t>(refs.size());
        const auto fi = static_cast<size_t>(f);
        indexOf[fi][static_cast<size_t>(r)] = static_cast<int32_t>(k);
        refs.push_back(
            {offsets[fi][static_cast<size_t>(r)], f, lengths[fi][static_cast<size_t>(r)]});
        if (auto b = badOf[fi].find(r); b != badOf[fi].end()) bad.emplace(k, b->second);
        const std::vector<double>& l = labels[fi];
        if (ids) {
            const auto v = static_cast<int32_t>(l[static_cast<size_t>(r)]);
            d.y.data<int32_t>()[k] = v;
            if (!bad.count(k)) maxLabel = std::max(maxLabel, v);
        } else {
            for (int64_t j = 0; j < cfg.yWidth; ++j)
                d.y.data<float>()[k * cfg.yWidth + j] =
                    static_cast<float>(l[static_cast<size_t>(r * cfg.yWidth + j)]);
        }
    }
    d.numClasses = ids ? int64_t{maxLabel} + 1 : 0;
    d.reader =
        std::make_shared<TfRecordReader>(cfg, std::move(paths), std::move(files), std::move(refs),
                                         std::move(counts), std::move(indexOf), std::move(bad));
    return d;
}

}  // namespace

std::vector<std::pair<int32_t, int64_t>> interleaveOrder(const std::vector<int64_t>& counts,
                                                         const std::vector<int32_t>& fileOrder,
                                                         int64_t cycleLength, int64_t blockLength) {
    std::vector<std::pair<int32_t, int64_t>> out;
    const auto cycle = static_cast<size_t>(std::max<int64_t>(1, cycleLength));
    const int64_t block = std::max<int64_t>(1, blockLength);
    struct Open {
        int32_t file = -1;
        int64_t next = 0;
    };
    std::vector<Open> slots(cycle);
    size_t nextFile = 0, index = 0, open = 0;
    int64_t inBlock = 0;
    // As tf.data's interleave iterator steps: the slot at `index` yields a record (ending its
    // block after `block` of them), or, with its file done, closes and the turn passes on; an
    // empty slot opens the next file and yields from it at once.
    while (nextFile < fileOrder.size() || open > 0) {
        Open& s = slots[index];
        if (s.file >= 0) {
            if (s.next < counts[static_cast<size_t>(s.file)]) {
                out.emplace_back(s.file, s.next++);
                if (++inBlock == block) {
                    inBlock = 0;
                    index = (index + 1) % cycle;
                }
                continue;
            }
            s.file = -1;
            --open;
            inBlock = 0;
            index = (index + 1) % cycle;
        } else if (nextFile < fileOrder.size()) {
            s.file = fileOrder[nextFile++];
            s.next = 0;
            ++open;
        } else {
            inBlock = 0;
            index = (index + 1) % cycle;
        }
    }
    return out;
}

Result<DataSplits> loadTfRecords(const TfRecordConfig& cfg, bool stream) {
    DataSplits out;
    TD_ASSIGN_OR_RETURN(out.train, loadSplit(cfg, cfg.files, "data.source.files"));
    if (!cfg.testFiles.empty()) {
        TD_ASSIGN_OR_RETURN(Dataset test, loadSplit(cfg, cfg.testFiles, "data.source.test_files"));
        out.test = std::move(test);
    }
    if (out.test && out.train.numClasses > 0)
        out.test->numClasses = out.train.numClasses =
            std::max(out.train.numClasses, out.test->numClasses);
    // Decoded here, or streamed; with skip_bad_files, the records that do not read (found while
    // scanning, or by decoding each once) are left out, the same ones either way and in the same
    // places, and a line with their count (and the first ones' errors) goes to the run's log.
    const bool skip = cfg.skipBadFiles;
    auto prepare = [&](const Dataset& d, const std::string& field) -> Result<Materialized> {
        if (!stream) return materialize(d, field, skip);
        if (skip) return dropUnreadable(d, field);
        return Materialized{d, 0, {}};
    };
    std::vector<std::string> skipNotes;
    TD_ASSIGN_OR_RETURN(Materialized t, prepare(out.train, "data.source.files"));
    if (skip)
        skipNotes.push_back(
            skippedNote("data.source.skip_bad_files", t, out.train.size(), "training records"));
    out.train = std::move(t.data);
    if (out.test) {
        TD_ASSIGN_OR_RETURN(Materialized te, prepare(*out.test, "data.source.test_files"));
        if (skip)
            skipNotes.push_back(
                skippedNote("data.source.skip_bad_files", te, out.test->size(), "test records"));
        out.test = std::move(te.data);
    }
    out.notes.push_back("data.source: " + std::to_string(out.train.size()) + " training and " +
                        std::to_string(out.test ? out.test->size() : 0) + " test records");
    out.notes.insert(out.notes.end(), skipNotes.begin(), skipNotes.end());
    return out;
}

}  // namespace td

#include "engine/train/checkpoint.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <limits>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>

#include "engine/core/json_text.h"
#include "engine/data/cache_file.h"
#include "engine/graph/builder.h"
#include "engine/io/project.h"

namespace td {

namespace {

constexpr char kMagic[8] = {'T', 'D', 'C', 'K', 'P', 'T', '\r', '\n'};
constexpr uint32_t kVersion = 3;  // 3: store id and model fingerprint; 2: the loss scale
constexpr uint32_t kOldestVersion = 1;
constexpr size_t kHeaderBytes = 40;  // magic, version, 0, payload bytes, payload hash, own hash
constexpr uint64_t kPayloadSeed = 0x7464636b70743031ULL;  // "tdckpt01"
constexpr uint64_t kHeaderSeed = 0x7464636b70686472ULL;   // "tdckphdr"

std::string errnoText() {
    return std::strerror(errno);
}

std::string hex(uint64_t v) {
    std::ostringstream o;
    o << "0x" << std::hex << v;
    return o.str();
}

// ---- serialization ------------------------------------------------------------------------------

// Where an encoded payload goes: a string (tests, the fuzzer) or a file (writeCheckpoint).
class Sink {
  public:
    virtual ~Sink() = default;
    virtual void write(const void* p, size_t n) = 0;
};

class StringSink final : public Sink {
  public:
    std::string out;
    void write(const void* p, size_t n) override { out.append(static_cast<const char*>(p), n); }
};

class Writer {
  public:
    explicit Writer(Sink& sink) : sink_(sink) {}
    void u8(uint8_t v) { raw(&v, 1); }
    void u32(uint32_t v) { raw(&v, 4); }
    void u64(uint64_t v) { raw(&v, 8); }
    void i64(int64_t v) { raw(&v, 8); }
    void f64(double v) { raw(&v, 8); }
    void str(const std::string& s) {
        u64(s.size());
        raw(s.data(), s.size());
    }
    void optF64(const std::optional<double>& v) {
        u8(v ? 1 : 0);
        f64(v.value_or(0.0));
    }
    void tensor(const Tensor& t) {
        u8(static_cast<uint8_t>(t.dtype()));
        u32(static_cast<uint32_t>(t.rank()));
        for (int64_t d : t.shape()) i64(d);
        u64(t.bytes());
        raw(t.raw(), t.bytes());
    }
    void raw(const void* p, size_t n) { sink_.write(p, n); }

  private:
    Sink& sink_;
};

// Reads the payload back; every read checks the bytes left, so a damaged length can never make
// it read past the end or allocate more than the file holds.
class Reader {
  public:
    Reader(const std::string& file, const char* data, size_t size)
        : file_(file), p_(data), left_(size) {}

    Status fail(const std::string& what) const {
        return err(file_ + ": damaged checkpoint: " + what);
    }
    template <typename T>
    Status pod(T& v, const char* what) {
        if (left_ < sizeof(T))
            return fail(std::string("ends inside ") + what + " (" + std::to_string(left_) +
                        " bytes left, expected " + std::to_string(sizeof(T)) + ")");
        std::memcpy(&v, p_, sizeof(T));
        p_ += sizeof(T);
        left_ -= sizeof(T);
        return Status::success();
    }
    Status count(uint64_t& n, size_t minBytesEach, const char* what) {
        TD_RETURN_IF_ERROR(pod(n, what));
        if (minBytesEach > 0 && n > left_ / minBytesEach)
            return fail(std::string(what) + ": " + std::to_string(n) + " entries, but only " +
                        std::to_string(left_) + " bytes are left");
        return Status::success();
    }
    Status str(std::string& s, const char* what) {
        uint64_t n = 0;
        TD_RETURN_IF_ERROR(count(n, 1, what));
        s.assign(p_, static_cast<size_t>(n));
        p_ += n;
        left_ -= n;
        return Status::success();
    }
    Status optF64(std::optional<double>& v, const char* what) {
        uint8_t has = 0;
        double x = 0;
        TD_RETURN_IF_ERROR(pod(has, what));
        TD_RETURN_IF_ERROR(pod(x, what));
        if (has > 1) return fail(std::string(what) + ": bad presence flag");
        v = has ? std::optional<double>(x) : std::nullopt;
        return Status::success();
    }
    Status tensor(Tensor& t, const std::string& what) {
        uint8_t dt = 0;
        uint32_t rank = 0;
        TD_RETURN_IF_ERROR(pod(dt, what.c_str()));
        if (dt > static_cast<uint8_t>(DType::F64)) return fail(what + ": unknown dtype");
        TD_RETURN_IF_ERROR(pod(rank, what.c_str()));
        if (rank > 8) return fail(what + ": rank " + std::to_string(rank) + " (expected <= 8)");
        Shape shape(rank);
        int64_t elements = 1;
        for (uint32_t i = 0; i < rank; ++i) {
            TD_RETURN_IF_ERROR(pod(shape[i], what.c_str()));
            if (shape[i] < 0 || (shape[i] > 0 && elements > std::numeric_limits<int64_t>::max() /
                                                                std::max<int64_t>(1, shape[i])))
                return fail(what + ": bad shape");
            elements *= shape[i];
        }
        uint64_t bytes = 0;
        TD_RETURN_IF_ERROR(pod(bytes, what.c_str()));
        const uint64_t want = static_cast<uint64_t>(elements) * dtypeSize(static_cast<DType>(dt));
        if (bytes != want)
            return fail(what + ": " + std::to_string(bytes) + " bytes for shape " +
                        shapeToString(shape) + " (expected " + std::to_string(want) + ")");
        if (bytes > left_)
            return fail(what + ": " + std::to_string(bytes) + " bytes, but only " +
                        std::to_string(left_) + " are left");
        t = Tensor(static_cast<DType>(dt), shape);
        if (bytes) std::memcpy(t.raw(), p_, bytes);
        p_ += bytes;
        left_ -= bytes;
        return Status::success();
    }
    size_t left() const { return left_; }

  private:
    std::string file_;
    const char* p_;
    size_t left_;
};

void encode(const CheckpointState& s, Sink& sink) {
    Writer w(sink);
    w.str(s.projectJson);
    w.i64(s.runId);
    w.str(s.kind);
    w.i64(s.globalStep);
    w.i64(s.epoch);
    w.i64(s.stepInEpoch);
    w.u64(s.seed);
    w.i64(s.epochSamples);
    w.u64(s.accumulators.size());
    for (const auto& a : s.accumulators) {
        w.u64(a.size());
        for (double v : a) w.f64(v);
    }
    w.u64(s.lastEpochMetrics.size());
    for (const auto& [k, v] : s.lastEpochMetrics) {
        w.str(k);
        w.f64(v);
    }
    w.optF64(s.monitorValue);
    w.u64(s.params.size());
    for (const NamedTensor& p : s.params) {
        w.str(p.name);
        w.tensor(p.value);
    }
    w.i64(s.optimizerIterations);
    w.optF64(s.learningRateOverride);
    w.u64(s.optimizerSlots.size());
    for (const Tensor& t : s.optimizerSlots) w.tensor(t);
    w.u64(s.callbacks.size());
    for (const CallbackState& c : s.callbacks) {
        w.u64(c.values.size());
        for (double v : c.values) w.f64(v);
        w.u64(c.tensors.size());
        for (const Tensor& t : c.tensors) w.tensor(t);
    }
    w.u64(s.writers.size());
    for (const CheckpointWriterState& ws : s.writers) {
        w.str(ws.id);
        w.optF64(ws.best);
        w.u64(ws.kept.size());
        for (const std::string& k : ws.kept) w.str(k);
    }
    w.u8(s.lossScale ? 1 : 0);
    if (s.lossScale) {
        w.f64(s.lossScale->scale);
        w.i64(s.lossScale->goodSteps);
        w.i64(s.lossScale->skippedSteps);
        w.i64(s.lossScale->growthSteps);
        w.i64(s.lossScale->lastSkipped);
        w.i64(s.lossScaleSkipsReported);
    }
    w.str(s.storeId);
    w.u64(s.modelFingerprint);
}

Status decode(Reader& r, CheckpointState& s, uint32_t version) {
    int64_t epoch = 0;
    TD_RETURN_IF_ERROR(r.str(s.projectJson, "the project"));
    TD_RETURN_IF_ERROR(r.pod(s.runId, "the run id"));
    TD_RETURN_IF_ERROR(r.str(s.kind, "the kind"));
    TD_RETURN_IF_ERROR(r.pod(s.globalStep, "the global step"));
    TD_RETURN_IF_ERROR(r.pod(epoch, "the epoch"));
    TD_RETURN_IF_ERROR(r.pod(s.stepInEpoch, "the step in the epoch"));
    TD_RETURN_IF_ERROR(r.pod(s.seed, "the seed"));
    TD_RETURN_IF_ERROR(r.pod(s.epochSamples, "the epoch's samples"));
    if (epoch < 0 || epoch > std::numeric_limits<int>::max() || s.globalStep < 0 ||
        s.stepInEpoch < 0 || s.epochSamples < 0)
        return r.fail("negative or out-of-range position");
    s.epoch = static_cast<int>(epoch);
    uint64_t n = 0;
    TD_RETURN_IF_ERROR(r.count(n, 8, "the accumulators"));
    s.accumulators.resize(n);
    for (auto& a : s.accumulators) {
        uint64_t m = 0;
        TD_RETURN_IF_ERROR(r.count(m, 8, "an accumulator"));
        a.resize(m);
        for (double& v : a) TD_RETURN_IF_ERROR(r.pod(v, "an accumulator"));
    }
    TD_RETURN_IF_ERROR(r.count(n, 16, "the last epoch's metrics"));
    for (uint64_t i = 0; i < n; ++i) {
        std::string k;
        double v = 0;
        TD_RETURN_IF_ERROR(r.str(k, "a metric name"));
        TD_RETURN_IF_ERROR(r.pod(v, "a metric value"));
        s.lastEpochMetrics[k] = v;
    }
    TD_RETURN_IF_ERROR(r.optF64(s.monitorValue, "the monitored value"));
    TD_RETURN_IF_ERROR(r.count(n, 8, "the parameters"));
    s.params.resize(n);
    for (size_t i = 0; i < s.params.size(); ++i) {
        TD_RETURN_IF_ERROR(r.str(s.params[i].name, "a parameter name"));
        TD_RETURN_IF_ERROR(r.tensor(s.params[i].value, "parameter '" + s.params[i].name + "'"));
    }
    TD_RETURN_IF_ERROR(r.pod(s.optimizerIterations, "the optimizer's iterations"));
    TD_RETURN_IF_ERROR(r.optF64(s.learningRateOverride, "the learning rate override"));
    TD_RETURN_IF_ERROR(r.count(n, 8, "the optimizer slots"));
    s.optimizerSlots.resize(n);
    for (size_t i = 0; i < s.optimizerSlots.size(); ++i)
        TD_RETURN_IF_ERROR(r.tensor(s.optimizerSlots[i], "optimizer slot " + std::to_string(i)));
    TD_RETURN_IF_ERROR(r.count(n, 16, "the callbacks"));
    s.callbacks.resize(n);
    for (CallbackState& c : s.callbacks) {
        uint64_t m = 0;
        TD_RETURN_IF_ERROR(r.count(m, 8, "a callback's values"));
        c.values.resize(m);
        for (double& v : c.values) TD_RETURN_IF_ERROR(r.pod(v, "a callback's value"));
        TD_RETURN_IF_ERROR(r.count(m, 8, "a callback's tensors"));
        c.tensors.resize(m);
        for (Tensor& t : c.tensors) TD_RETURN_IF_ERROR(r.tensor(t, "a callback's tensor"));
    }
    TD_RETURN_IF_ERROR(r.count(n, 8, "the checkpoint writers"));
    s.writers.resize(n);
    for (CheckpointWriterState& ws : s.writers) {
        TD_RETURN_IF_ERROR(r.str(ws.id, "a writer's id"));
        TD_RETURN_IF_ERROR(r.optF64(ws.best, "a writer's best value"));
        uint64_t m = 0;
        TD_RETURN_IF_ERROR(r.count(m, 8, "a writer's files"));
        ws.kept.resize(m);
        for (std::string& k : ws.kept) TD_RETURN_IF_ERROR(r.str(k, "a writer's file"));
    }
    if (version >= 2) {
        uint8_t has = 0;
        TD_RETURN_IF_ERROR(r.pod(has, "the loss scale"));
        if (has > 1) return r.fail("loss scale flag " + std::to_string(has) + " (expected 0 or 1)");
        if (has) {
            double scale = 0;
            int64_t good = 0, skipped = 0, growth = 0, last = 0;
            TD_RETURN_IF_ERROR(r.pod(scale, "the loss scale"));
            TD_RETURN_IF_ERROR(r.pod(good, "the loss scale's finite steps"));
            TD_RETURN_IF_ERROR(r.pod(skipped, "the loss scale's skipped steps"));
            TD_RETURN_IF_ERROR(r.pod(growth, "the loss scale's growth interval"));
            TD_RETURN_IF_ERROR(r.pod(last, "the loss scale's last step"));
            TD_RETURN_IF_ERROR(
                r.pod(s.lossScaleSkipsReported, "the loss scale's skipped steps reported"));
            constexpr int64_t kMax = std::numeric_limits<int32_t>::max();
            if (!(scale > 0) || !std::isfinite(scale) || scale > 3.4e38 || good < 0 ||
                good > kMax || skipped < 0 || growth < 1 || growth > kMax || last < 0 || last > 1 ||
                s.lossScaleSkipsReported < 0 || s.lossScaleSkipsReported > skipped)
                return r.fail("loss scale out of range (scale " + std::to_string(scale) +
                              ", finite steps " + std::to_string(good) + ", growth interval " +
                              std::to_string(growth) + ")");
            LossScaleState ls;
            ls.scale = static_cast<float>(scale);
            ls.goodSteps = static_cast<int32_t>(good);
            ls.skippedSteps = skipped;
            ls.growthSteps = static_cast<int32_t>(growth);
            ls.lastSkipped = static_cast<int32_t>(last);
            s.lossScale = ls;
        }
    }
    if (version >= 3) {
        TD_RETURN_IF_ERROR(r.str(s.storeId, "the store id"));
        TD_RETURN_IF_ERROR(r.pod(s.modelFingerprint, "the model fingerprint"));
        if (s.storeId.size() > 64)
            return r.fail("a store id of " + std::to_string(s.storeId.size()) +
                          " bytes (expected at most 64)");
    }
    if (r.left() != 0)
        return r.fail(std::to_string(r.left()) + " bytes after the last field (expected none)");
    return Status::success();
}

Status makeDirs(const std::string& dir) {
    std::error_code ec;
    std::filesystem::create_directories(dir, ec);
    if (ec) return err("cannot create the checkpoint folder " + dir + ": " + ec.message());
    return Status::success();
}

Status writeAll(int fd, const char* p, size_t n, const std::string& tmp) {
    while (n > 0) {
        const ssize_t k = ::write(fd, p, n);
        if (k < 0) {
            if (errno == EINTR) continue;
            return err(tmp + ": write: " + errnoText());
        }
        p += k;
        n -= static_cast<size_t>(k);
    }
    return Status::success();
}

// The payload straight into the file, hashed as it goes: small fields gather in a buffer, a
// tensor's bytes go from the tensor to the file. So writing a checkpoint holds no copy of it.
class FileSink final : public Sink {
  public:
    FileSink(int fd, std::string tmp) : fd_(fd), tmp_(std::move(tmp)), hash_(kPayloadSeed) {}
    void write(const void* p, size_t n) override {
        if (!status_.ok()) return;
        hash_.update(p, n);
        if (used_ + n <= sizeof(buffer_)) {
            std::memcpy(buffer_ + used_, p, n);
            used_ += n;
            return;
        }
        flush();
        if (n < sizeof(buffer_) / 2) {
            std::memcpy(buffer_, p, n);
            used_ = n;
        } else if (status_.ok()) {
            status_ = writeAll(fd_, static_cast<const char*>(p), n, tmp_);
        }
    }
    void flush() {
        if (status_.ok() && used_ > 0) status_ = writeAll(fd_, buffer_, used_, tmp_);
        used_ = 0;
    }
    const Status& status() const { return status_; }
    const HashStream& hash() const { return hash_; }

  private:
    int fd_;
    std::string tmp_;
    HashStream hash_;
    Status status_ = Status::success();
    size_t used_ = 0;
    char buffer_[64 << 10];
};

// The header for a payload of `payloadBytes` bytes whose hash is `payloadHash`.
std::array<unsigned char, kHeaderBytes> fileHeader(uint64_t payloadBytes, uint64_t payloadHash) {
    std::array<unsigned char, kHeaderBytes> header{};
    std::memcpy(header.data(), kMagic, 8);
    const uint32_t version = kVersion;
    std::memcpy(header.data() + 8, &version, 4);
    std::memcpy(header.data() + 16, &payloadBytes, 8);
    std::memcpy(header.data() + 24, &payloadHash, 8);
    const uint64_t headerHash = hashBytes(header.data(), 32, kHeaderSeed);
    std::memcpy(header.data() + 32, &headerHash, 8);
    return header;
}

}  // namespace

std::string checkpointFileBytes(std::string_view payload) {
    const auto header =
        fileHeader(payload.size(), hashBytes(payload.data(), payload.size(), kPayloadSeed));
    std::string out(reinterpret_cast<const char*>(header.data()), header.size());
    out.append(payload.data(), payload.size());
    return out;
}

std::string encodeCheckpointPayload(const CheckpointState& state) {
    StringSink sink;
    encode(state, sink);
    return std::move(sink.out);
}

Status writeCheckpoint(const std::string& path, const CheckpointState& state) {
    const std::filesystem::path target(path);
    const std::string dir =
        target.has_parent_path() ? target.parent_path().string() : std::string(".");
    TD_RETURN_IF_ERROR(makeDirs(dir));

    // The temporary's name starts with '.', so no listing of checkpoints takes it for one.
    const std::string tmp = (std::filesystem::path(dir) / ("." + target.filename().string() +
                                                           ".tmp" + std::to_string(::getpid())))
                                .string();
    const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) return err(tmp + ": cannot create the checkpoint's temporary file: " + errnoText());
    // The payload first, after room for the header; then the header, whose size and hash are
    // known once the payload is written. The file gets its final name only when all of it is there.
    Status st = Status::success();
    if (::lseek(fd, static_cast<off_t>(kHeaderBytes), SEEK_SET) < 0)
        st = err(tmp + ": seek: " + errnoText());
    if (st.ok()) {
        auto sink = std::make_unique<FileSink>(fd, tmp);
        encode(state, *sink);
        sink->flush();
        st = sink->status();
        if (st.ok()) {
            const auto header = fileHeader(sink->hash().bytes(), sink->hash().digest());
            const ssize_t k = ::pwrite(fd, header.data(), header.size(), 0);
            if (k != static_cast<ssize_t>(header.size()))
                st = err(tmp + ": write of the header: " +
                         (k < 0 ? errnoText() : std::string("short write")));
        }
    }
    if (st.ok() && ::fsync(fd) != 0) st = err(tmp + ": fsync: " + errnoText());
    if (::close(fd) != 0 && st.ok()) st = err(tmp + ": close: " + errnoText());
    if (st.ok() && ::rename(tmp.c_str(), path.c_str()) != 0)
        st = err(path + ": rename from " + tmp + ": " + errnoText());
    if (!st.ok()) {
        ::unlink(tmp.c_str());
        return st;
    }
    // The rename is durable once the folder's entry is.
    const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd < 0) return err(dir + ": cannot open the folder to fsync it: " + errnoText());
    const int rc = ::fsync(dfd);
    const std::string why = rc != 0 ? errnoText() : std::string();
    ::close(dfd);
    if (rc != 0) return err(dir + ": fsync of the folder: " + why);
    return Status::success();
}

Result<CheckpointState> readCheckpoint(const std::string& path) {
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return err(path + ": cannot open the checkpoint: " + errnoText());
    struct stat sb {};
    if (::fstat(fd, &sb) != 0) {
        const std::string why = errnoText();
        ::close(fd);
        return err(path + ": fstat: " + why);
    }
    const uint64_t fileBytes = static_cast<uint64_t>(sb.st_size);
    std::string data;
    data.resize(static_cast<size_t>(std::min<uint64_t>(fileBytes, kHeaderBytes)));
    auto readAll = [&](char* p, size_t n) -> Status {
        while (n > 0) {
            const ssize_t k = ::read(fd, p, n);
            if (k < 0 && errno == EINTR) continue;
            if (k < 0) return err(path + ": read: " + errnoText());
            if (k == 0) return err(path + ": truncated while reading");
            p += k;
            n -= static_cast<size_t>(k);
        }
        return Status::success();
    };
    Status st = readAll(data.data(), data.size());
    if (!st.ok()) {
        ::close(fd);
        return err(st.error());
    }
    auto fail = [&](const std::string& what) -> Error {
        ::close(fd);
        return err(path + ": not a usable TrainDeck checkpoint: " + what);
    };
    if (fileBytes < kHeaderBytes)
        return fail("truncated: expected a header of " + std::to_string(kHeaderBytes) +
                    " bytes, the file has " + std::to_string(fileBytes));
    if (std::memcmp(data.data(), kMagic, 8) != 0)
        return fail("bad magic (expected a file that starts with \"TDCKPT\")");
    uint64_t headerHash = 0, payloadBytes = 0, payloadHash = 0;
    uint32_t version = 0;
    std::memcpy(&version, data.data() + 8, 4);
    std::memcpy(&payloadBytes, data.data() + 16, 8);
    std::memcpy(&payloadHash, data.data() + 24, 8);
    std::memcpy(&headerHash, data.data() + 32, 8);
    if (const uint64_t h = hashBytes(data.data(), 32, kHeaderSeed); h != headerHash)
        return fail("header checksum mismatch (the file is damaged): expected " + hex(headerHash) +
                    ", computed " + hex(h));
    if (version < kOldestVersion || version > kVersion)
        return fail("format version " + std::to_string(version) + " (expected " +
                    std::to_string(kOldestVersion) + " to " + std::to_string(kVersion) + ")");
    if (fileBytes - kHeaderBytes != payloadBytes)
        return fail((fileBytes - kHeaderBytes < payloadBytes ? "truncated: " : "size mismatch: ") +
                    std::string("expected ") + std::to_string(payloadBytes) +
                    " payload bytes after the header, the file has " +
                    std::to_string(fileBytes - kHeaderBytes));
    std::string payload;
    payload.resize(static_cast<size_t>(payloadBytes));
    st = readAll(payload.data(), payload.size());
    ::close(fd);
    if (!st.ok()) return err(st.error());
    if (const uint64_t h = hashBytes(payload.data(), payload.size(), kPayloadSeed);
        h != payloadHash)
        return err(path +
                   ": not a usable TrainDeck checkpoint: checksum mismatch (the file is damaged): "
                   "expected " +
                   hex(payloadHash) + ", computed " + hex(h));
    CheckpointState s;
    Reader r(path, payload.data(), payload.size());
    TD_RETURN_IF_ERROR(decode(r, s, version));
    return s;
}

Status checkCheckpointParams(const std::string& path, const CheckpointState& state,
                             const std::vector<std::string>& names,
                             const std::vector<Shape>& shapes) {
    if (state.params.size() != names.size())
        return err(path + ": the checkpoint holds " + std::to_string(state.params.size()) +
                   " parameters, the model has " + std::to_string(names.size()));
    for (size_t i = 0; i < names.size(); ++i) {
        const NamedTensor& p = state.params[i];
        if (p.name != names[i])
            return err(path + ": parameter " + std::to_string(i) + " is '" + p.name +
                       "', the model expects '" + names[i] + "'");
        if (p.value.dtype() != DType::F32 || p.value.shape() != shapes[i])
            return err(path + ": parameter '" + p.name + "' is " + dtypeName(p.value.dtype()) +
                       " " + shapeToString(p.value.shape()) + ", the model expects f32 " +
                       shapeToString(shapes[i]));
    }
    return Status::success();
}

Result<Project> checkpointProject(const std::string& path, const CheckpointState& state) {
    auto p = parseProject(state.projectJson, path);
    if (!p.ok()) return err(path + ": the checkpoint's project: " + p.error());
    return p;
}

Result<CheckpointModel> readCheckpointModel(const std::string& path) {
    TD_ASSIGN_OR_RETURN(CheckpointState s, readCheckpoint(path));
    return checkpointModel(path, std::move(s));
}

Result<CheckpointModel> checkpointModel(const std::string& path, CheckpointState s) {
    TD_RETURN_IF_ERROR(checkCheckpointIdentity(path, s, {}));
    TD_ASSIGN_OR_RETURN(Project project, checkpointProject(path, s));
    TD_ASSIGN_OR_RETURN(ModelInfo info, inferShapes(project.model));
    BuildOptions bo;
    bo.batch = 1;
    bo.mode = GraphMode::Predict;
    bo.loss = project.training.loss;
    auto g = buildGraph(project.model, info, bo);
    if (!g.ok()) return err(path + ": the checkpoint's model: " + g.error());
    std::vector<std::string> names;
    std::vector<Shape> shapes;
    for (int id : g.value().params()) {
        const Node& n = g.value().node(id);
        names.push_back(n.attrs.name.value_or(""));
        shapes.push_back(n.shape);
    }
    TD_RETURN_IF_ERROR(checkCheckpointParams(path, s, names, shapes));
    CheckpointModel m;
    m.model = std::move(project.model);
    m.weights = std::move(s.params);
    m.runId = s.runId;
    m.globalStep = s.globalStep;
    m.epoch = s.epoch;
    m.stepInEpoch = s.stepInEpoch;
    m.projectJson = std::move(s.projectJson);
    m.storeId = std::move(s.storeId);
    return m;
}

bool hasCheckpointMagic(std::string_view firstBytes) {
    return firstBytes.size() >= sizeof kMagic &&
           std::memcmp(firstBytes.data(), kMagic, sizeof kMagic) == 0;
}

std::vector<std::string> checkpointFilesIn(const std::string& dir) {
    std::vector<std::string> out;
    std::error_code ec;
    for (const auto& e : std::filesystem::directory_iterator(dir, ec)) {
        const std::string name = e.path().filename().string();
        if (name.empty() || name[0] == '.' || !e.is_regular_file(ec)) continue;
        char head[sizeof kMagic] = {};
        const int fd = ::open(e.path().c_str(), O_RDONLY | O_CLOEXEC);
        if (fd < 0) continue;
        const ssize_t k = ::read(fd, head, sizeof head);
        ::close(fd);
        if (k == static_cast<ssize_t>(sizeof head) &&
            hasCheckpointMagic(std::string_view(head, sizeof head)))
            out.push_back(e.path().string());
    }
    return out;
}

uint64_t modelFingerprint(const std::string& projectJson) {
    if (jsonTextProblem(projectJson)) return 0;
    const nlohmann::json j = nlohmann::json::parse(projectJson, nullptr, false);
    if (!j.is_object() || !j.contains("model")) return 0;
    const std::string model = j["model"].dump();  // nlohmann::json keeps keys sorted
    const uint64_t h = hashBytes(model.data(), model.size(), 0x746463666d6f646cULL);  // "tdcfmodl"
    return h == 0 ? 1 : h;
}

Status checkCheckpointIdentity(const std::string& path, const CheckpointState& state,
                               const CheckpointIdentity& expected) {
    const uint64_t own = modelFingerprint(state.projectJson);
    if (state.modelFingerprint != 0 && state.modelFingerprint != own)
        return err(path + ": not a usable TrainDeck checkpoint: its model fingerprint " +
                   hex(state.modelFingerprint) + " is not its own project's (" + hex(own) +
                   "): the file was altered");
    const std::string store = expected.storePath.empty() ? "its run store" : expected.storePath;
    if (expected.runId != 0 && state.runId != expected.runId)
        return err(path + ": belongs to run " + std::to_string(state.runId) + ", expected run " +
                   std::to_string(expected.runId) + " of " + store);
    if (!expected.storeId.empty() && !state.storeId.empty() && state.storeId != expected.storeId)
        return err(path + ": belongs to run " + std::to_string(state.runId) +
                   " of another run store (store id " + state.storeId + "), expected run " +
                   std::to_string(expected.runId) + " of " + store + " (store id " +
                   expected.storeId + ")");
    if (expected.modelFingerprint != 0 && own != expected.modelFingerprint)
        return err(path + ": holds another model than run " + std::to_string(expected.runId) +
                   " of " + store + " was trained with (model fingerprint " + hex(own) +
                   ", the run's " + hex(expected.modelFingerprint) +
                   "): it is not this run's checkpoint");
    return Status::success();
}

}  // namespace td

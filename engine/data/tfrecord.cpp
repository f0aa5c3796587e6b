// TFRecord files and tf.train.Example records (tfrecord.h): CRC-32C (SSE4.2 or slicing-by-8),
// the framing checks of a sequential scan and of a read by offset, the one-pass inflate of a
// GZIP file into an unlinked temporary file, and a protobuf wire-format decoder for Example.
#include "engine/data/tfrecord.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <utility>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace td {

static_assert(std::endian::native == std::endian::little,
              "the TFRecord reader assumes a little-endian host");

// --- CRC-32C ------------------------------------------------------------------------------------

namespace {

constexpr uint32_t kCastagnoli = 0x82F63B78u;

// t[0] is the byte-at-a-time table; t[k][b] is the CRC of byte b followed by k zero bytes, so eight
// lookups advance the CRC over eight bytes at once.
struct Crc32cTables {
    uint32_t t[8][256];
};

constexpr Crc32cTables makeCrc32cTables() {
    Crc32cTables tables{};
    for (uint32_t i = 0; i < 256; ++i) {
        uint32_t c = i;
        for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ kCastagnoli : c >> 1;
        tables.t[0][i] = c;
    }
    for (int k = 1; k < 8; ++k)
        for (uint32_t i = 0; i < 256; ++i) {
            const uint32_t prev = tables.t[k - 1][i];
            tables.t[k][i] = (prev >> 8) ^ tables.t[0][prev & 0xff];
        }
    return tables;
}

constexpr Crc32cTables kCrc32cTables = makeCrc32cTables();

#if defined(__x86_64__)
// The crc32 instruction computes exactly CRC-32C; 8 bytes per instruction.
__attribute__((target("sse4.2"))) uint32_t crc32cSse42(const uint8_t* p, size_t n, uint32_t crc) {
    uint32_t c = ~crc;
    for (; n > 0 && (reinterpret_cast<uintptr_t>(p) & 7) != 0; --n) c = _mm_crc32_u8(c, *p++);
    uint64_t c64 = c;
    for (; n >= 8; n -= 8, p += 8) {
        uint64_t w;
        std::memcpy(&w, p, 8);
        c64 = _mm_crc32_u64(c64, w);
    }
    c = static_cast<uint32_t>(c64);
    for (; n > 0; --n) c = _mm_crc32_u8(c, *p++);
    return ~c;
}

bool hasSse42() {
    static const bool yes = [] {
        __builtin_cpu_init();
        return __builtin_cpu_supports("sse4.2") != 0;
    }();
    return yes;
}
#endif

}  // namespace

uint32_t crc32cSoftware(const void* data, size_t n, uint32_t crc) {
    const auto& t = kCrc32cTables.t;
    const auto* p = static_cast<const uint8_t*>(data);
    uint32_t c = ~crc;
    for (; n > 0 && (reinterpret_cast<uintptr_t>(p) & 7) != 0; --n)
        c = t[0][(c ^ *p++) & 0xff] ^ (c >> 8);
    for (; n >= 8; n -= 8, p += 8) {
        uint64_t w;
        std::memcpy(&w, p, 8);
        w ^= c;
        c = t[7][w & 0xff] ^ t[6][(w >> 8) & 0xff] ^ t[5][(w >> 16) & 0xff] ^
            t[4][(w >> 24) & 0xff] ^ t[3][(w >> 32) & 0xff] ^ t[2][(w >> 40) & 0xff] ^
            t[1][(w >> 48) & 0xff] ^ t[0][w >> 56];
    }
    for (; n > 0; --n) c = t[0][(c ^ *p++) & 0xff] ^ (c >> 8);
    return ~c;
}

uint32_t crc32c(const void* data, size_t n, uint32_t crc) {
#if defined(__x86_64__)
    if (hasSse42()) return crc32cSse42(static_cast<const uint8_t*>(data), n, crc);
#endif
    return crc32cSoftware(data, n, crc);
}

uint32_t maskCrc32c(uint32_t crc) {
    return ((crc >> 15) | (crc << 17)) + 0xa282ead8u;
}

uint32_t maskedCrc32c(const void* data, size_t n) {
    return maskCrc32c(crc32c(data, n));
}

// --- TfRecordFile -------------------------------------------------------------------------------

namespace {

constexpr size_t kScanChunk = size_t(1) << 20;  // the scan's buffer, unless a record is larger
constexpr size_t kInflateChunk = size_t(256) << 10;

std::string hex32(uint32_t v) {
    char s[16];
    std::snprintf(s, sizeof s, "0x%08x", v);
    return s;
}

uint64_t load64(const char* p) {
    uint64_t v;
    std::memcpy(&v, p, 8);
    return v;
}
uint32_t load32(const char* p) {
    uint32_t v;
    std::memcpy(&v, p, 4);
    return v;
}

// pread until `n` bytes or the end of the file; the bytes read, or -1 with errno.
ssize_t preadFull(int fd, char* dst, size_t n, int64_t offset) {
    size_t done = 0;
    while (done < n) {
        const ssize_t r = ::pread(fd, dst + done, n - done, static_cast<off_t>(offset) + done);
        if (r < 0) {
            if (errno == EINTR) continue;
            return -1;
        }
        if (r == 0) break;
        done += static_cast<size_t>(r);
    }
    return static_cast<ssize_t>(done);
}

Status writeFull(int fd, const unsigned char* src, size_t n) {
    while (n > 0) {
        const ssize_t w = ::write(fd, src, n);
        if (w < 0) {
            if (errno == EINTR) continue;
            return err(std::strerror(errno));
        }
        src += w;
        n -= static_cast<size_t>(w);
    }
    return Status::success();
}

// Closes an fd on every early return.
struct FdGuard {
    int fd = -1;
    ~FdGuard() {
        if (fd >= 0) ::close(fd);
    }
    int release() { return std::exchange(fd, -1); }
};

// Inflates the gzip file open at `in` (one member or several concatenated, as gunzip reads them)
// into a new unlinked temporary file; returns its fd.
Result<int> inflateToTempFile(const std::string& path, int in) {
    const char* envDir = std::getenv("TMPDIR");
    const std::string dir = envDir && *envDir ? envDir : "/tmp";
    std::string name = dir + "/traindeck-tfrecord-XXXXXX";
    FdGuard out{::mkostemp(name.data(), O_CLOEXEC)};
    if (out.fd < 0)
        return err(path + ": cannot create a temporary file in " + dir +
                   " to inflate into: " + std::strerror(errno));
    ::unlink(name.c_str());

    z_stream z{};
    if (inflateInit2(&z, 16 + MAX_WBITS) != Z_OK) return err(path + ": zlib inflateInit2 failed");
    struct ZGuard {
        z_stream* z;
        ~ZGuard() { inflateEnd(z); }
    } zguard{&z};

    std::vector<unsigned char> inBuf(kInflateChunk), outBuf(kInflateChunk);
    int64_t consumed = 0;   // compressed bytes read from the file
    bool inMember = false;  // inside a gzip member (its end not reached yet)
    bool eof = false;
    for (;;) {
        if (z.avail_in == 0 && !eof) {
            const ssize_t r =
                preadFull(in, reinterpret_cast<char*>(inBuf.data()), inBuf.size(), consumed);
            if (r < 0) return err(path + ": cannot read: " + std::strerror(errno));
            if (r == 0) eof = true;
            z.next_in = inBuf.data();
            z.avail_in = static_cast<uInt>(r);
            consumed += r;
        }
        if (z.avail_in == 0 && eof) {
            if (inMember)
                return err(path + ": truncated gzip stream (it ends after " +
                           std::to_string(consumed) + " bytes, inside compressed data)");
            break;
        }
        inMember = true;
        z.next_out = outBuf.data();
        z.avail_out = static_cast<uInt>(outBuf.size());
        const int rc = inflate(&z, Z_NO_FLUSH);
        const size_t produced = outBuf.size() - z.avail_out;
        if (produced > 0) {
            const Status w = writeFull(out.fd, outBuf.data(), produced);
            if (!w.ok())
                return err(path + ": cannot write the inflated data to a temporary file in " + dir +
                           ": " + w.error());
        }
        if (rc == Z_STREAM_END) {
            inMember = false;  // another member may follow
            if (inflateReset(&z) != Z_OK) return err(path + ": zlib inflateReset failed");
        } else if (rc == Z_BUF_ERROR) {
            if (z.avail_in != 0) return err(path + ": zlib made no progress inflating");
        } else if (rc != Z_OK) {
            const int64_t at = consumed - static_cast<int64_t>(z.avail_in);
            return err(path + ": not a valid gzip stream (zlib: " +
                       (z.msg ? std::string(z.msg) : "error " + std::to_string(rc)) +
                       ", near compressed byte " + std::to_string(at) + ")");
        }
    }
    return out.release();
}

}  // namespace

Result<std::unique_ptr<TfRecordFile>> TfRecordFile::open(const std::string& path,
                                                         const std::string& compression) {
    bool gzip = false;
    if (compression == "GZIP") {
        gzip = true;
    } else if (!compression.empty() && compression != "NONE") {
        return err(path + ": unknown TFRecord compression \"" + compression +
                   "\" (valid: \"\" or \"NONE\" for uncompressed, \"GZIP\")");
    }
    FdGuard fd{::open(path.c_str(), O_RDONLY | O_CLOEXEC)};
    if (fd.fd < 0) return err(path + ": cannot open: " + std::strerror(errno));
    struct stat st {};
    if (::fstat(fd.fd, &st) != 0) return err(path + ": cannot stat: " + std::strerror(errno));
    if (S_ISDIR(st.st_mode)) return err(path + ": is a directory, not a TFRecord file");
    if (gzip) {
        TD_ASSIGN_OR_RETURN(const int inflated, inflateToTempFile(path, fd.fd));
        FdGuard tmp{inflated};
        if (::fstat(tmp.fd, &st) != 0)
            return err(path + ": cannot stat the inflated temporary file: " + std::strerror(errno));
        std::swap(fd.fd, tmp.fd);  // the source closes with `tmp`
    }
    const int64_t size = static_cast<int64_t>(st.st_size);
    return std::unique_ptr<TfRecordFile>(new TfRecordFile(path, fd.release(), size, gzip));
}

TfRecordFile::~TfRecordFile() {
    if (fd_ >= 0) ::close(fd_);
}

std::string TfRecordFile::where(int64_t offset) const {
    return "record at offset " + std::to_string(offset) + (gzip_ ? " of the inflated data" : "");
}

Result<uint64_t> TfRecordFile::checkHeader(int64_t offset, const char* header) const {
    const uint64_t length = load64(header);
    const uint32_t stored = load32(header + 8);
    const uint32_t computed = maskedCrc32c(header, 8);
    if (stored != computed) {
        if (offset == 0)
            return err(path_ + ": not a TFRecord file (length CRC mismatch at offset 0: stored " +
                       hex32(stored) + ", computed " + hex32(computed) + ")");
        return err(path_ + ": " + where(offset) + ": length CRC mismatch (stored " + hex32(stored) +
                   ", computed " + hex32(computed) +
                   "): the file is corrupt or the previous record's length is wrong");
    }
    if (length > kTfRecordMaxLength)
        return err(path_ + ": " + where(offset) + ": length " + std::to_string(length) +
                   " bytes is over the limit of " + std::to_string(kTfRecordMaxLength) +
                   " (1 GiB)");
    const int64_t remain = size_ - offset - kTfRecordHeaderBytes;
    if (static_cast<int64_t>(length) + 4 > remain)
        return err(path_ + ": truncated " + where(offset) + ": length says " +
                   std::to_string(length) + " bytes (+4 CRC bytes), " + std::to_string(remain) +
                   " remain");
    return length;
}

Status TfRecordFile::checkData(int64_t offset, const char* data, uint64_t length) const {
    const uint32_t stored = load32(data + length);
    const uint32_t computed = maskedCrc32c(data, length);
    if (stored != computed)
        return err(path_ + ": " + where(offset) + ": data CRC mismatch (stored " + hex32(stored) +
                   ", computed " + hex32(computed) + ")");
    return Status::success();
}

Status TfRecordFile::readAt(int64_t offset, char* dst, size_t n) const {
    const ssize_t r = preadFull(fd_, dst, n, offset);
    if (r < 0)
        return err(path_ + ": cannot read at offset " + std::to_string(offset) + ": " +
                   std::strerror(errno));
    if (static_cast<size_t>(r) < n)
        return err(path_ + ": unexpected end of file at offset " + std::to_string(offset + r) +
                   " (the file shrank while it was read?)");
    return Status::success();
}

Status TfRecordFile::scan(
    const std::function<Status(int64_t offset, std::string_view data)>& onRecord) const {
    return scan(onRecord, nullptr);
}

Status TfRecordFile::scan(
    const std::function<Status(int64_t offset, std::string_view data)>& onRecord,
    const std::function<void(int64_t offset, const std::string& error, bool rest)>& onDamage)
    const {
    // buf holds the file's bytes [bufStart, bufStart + have).
    std::vector<char> buf(static_cast<size_t>(std::min<int64_t>(size_, kScanChunk)));
    int64_t bufStart = 0;
    size_t have = 0;
    // Makes [offset, offset + need) available in buf (need <= the bytes left in the file).
    auto ensure = [&](int64_t offset, size_t need) -> Result<const char*> {
        if (offset >= bufStart &&
            offset + static_cast<int64_t>(need) <= bufStart + static_cast<int64_t>(have))
            return buf.data() + (offset - bufStart);
        const size_t keep = static_cast<size_t>(bufStart + static_cast<int64_t>(have) - offset);
        if (need > buf.size()) {
            // Doubling, so that records growing a little at a time do not reallocate each time.
            std::vector<char> bigger(static_cast<size_t>(std::max<int64_t>(
                static_cast<int64_t>(need),
                std::min<int64_t>(2 * static_cast<int64_t>(buf.size()), size_ - offset))));
            std::memcpy(bigger.data(), buf.data() + (offset - bufStart), keep);
            buf.swap(bigger);
        } else {
            std::memmove(buf.data(), buf.data() + (offset - bufStart), keep);
        }
        bufStart = offset;
        have = keep;
        const size_t want =
            static_cast<size_t>(std::min<int64_t>(static_cast<int64_t>(buf.size() - have),
                                                  size_ - bufStart - static_cast<int64_t>(have)));
        TD_RETURN_IF_ERROR(readAt(bufStart + static_cast<int64_t>(have), buf.data() + have, want));
        have += want;
        return buf.data();
    };
    // A framing error: the rest of the file cannot be read (reported, with onDamage).
    auto framing = [&](int64_t offset, Error e) -> Status {
        if (!onDamage) return e;
        onDamage(offset, e.message, true);
        return Status::success();
    };
    int64_t offset = 0;
    while (offset < size_) {
        const int64_t remain = size_ - offset;
        if (remain < kTfRecordHeaderBytes) {
            if (offset == 0)
                return framing(offset,
                               err(path_ + ": not a TFRecord file (" + std::to_string(remain) +
                                   " bytes, shorter than a record's 12-byte header)"));
            return framing(
                offset, err(path_ + ": truncated " + where(offset) + ": " + std::to_string(remain) +
                            " bytes remain, a record's header needs 12"));
        }
        TD_ASSIGN_OR_RETURN(const char* header, ensure(offset, kTfRecordHeaderBytes));
        Result<uint64_t> length = checkHeader(offset, header);
        if (!length.ok()) return framing(offset, std::move(length).takeError());
        const size_t total = static_cast<size_t>(*length) + kTfRecordOverheadBytes;
        TD_ASSIGN_OR_RETURN(const char* record, ensure(offset, total));
        const char* data = record + kTfRecordHeaderBytes;
        if (Status s = checkData(offset, data, *length); !s.ok()) {
            if (!onDamage) return s;
            onDamage(offset, s.error(), false);
        } else {
            TD_RETURN_IF_ERROR(onRecord(offset, std::string_view(data, *length)));
        }
        offset += static_cast<int64_t>(total);
    }
    return Status::success();
}

Status TfRecordFile::readRecord(int64_t offset, std::string& out) const {
    if (offset < 0 || offset > size_ - kTfRecordHeaderBytes)
        return err(path_ + ": no record at offset " + std::to_string(offset) + " (the file has " +
                   std::to_string(size_) + " bytes" + (gzip_ ? " inflated" : "") + ")");
    char header[kTfRecordHeaderBytes];
    TD_RETURN_IF_ERROR(readAt(offset, header, sizeof header));
    TD_ASSIGN_OR_RETURN(const uint64_t length, checkHeader(offset, header));
    out.resize(static_cast<size_t>(length) + 4);
    TD_RETURN_IF_ERROR(readAt(offset + kTfRecordHeaderBytes, out.data(), out.size()));
    TD_RETURN_IF_ERROR(checkData(offset, out.data(), length));
    out.resize(static_cast<size_t>(length));
    return Status::success();
}

// --- tf.train.Example ---------------------------------------------------------------------------

namespace {

enum WireType : uint32_t {
    kVarint = 0,
    kFixed64 = 1,
    kLengthDelimited = 2,
    kStartGroup = 3,
    kEndGroup = 4,
    kFixed32 = 5
};

constexpr int kMaxGroupDepth = 64;

// Reads one message's fields; positions in errors count from the start of the record.
class WireReader {
  public:
    WireReader(std::string_view record, std::string_view message)
        : base_(record.data()), p_(message.data()), end_(message.data() + message.size()) {}

    bool done() const { return p_ == end_; }

    Result<uint64_t> varint() {
        uint64_t v = 0;
        const char* start = p_;
        for (int shift = 0; shift < 70; shift += 7) {
            if (p_ == end_) return error(start, "truncated varint");
            const auto b = static_cast<uint8_t>(*p_++);
            if (shift < 64) v |= static_cast<uint64_t>(b & 0x7f) << shift;
            if ((b & 0x80) == 0) return v;
        }
        return error(start, "varint longer than 10 bytes");
    }

    // A field's key: (field number, wire type).
    Result<std::pair<uint32_t, uint32_t>> key() {
        const char* start = p_;
        TD_ASSIGN_OR_RETURN(const uint64_t k, varint());
        const uint64_t field = k >> 3;
        const auto wire = static_cast<uint32_t>(k & 7);
        if (field == 0 || field > 0x1fffffff)
            return error(start, "invalid field number " + std::to_string(field));
        if (wire > kFixed32)
            return error(start, "invalid wire type " + std::to_string(wire) + " (field " +
                                    std::to_string(field) + ")");
        return std::pair{static_cast<uint32_t>(field), wire};
    }

    Result<std::string_view> lengthDelimited() {
        const char* start = p_;
        TD_ASSIGN_OR_RETURN(const uint64_t n, varint());
        const auto left = static_cast<uint64_t>(end_ - p_);
        if (n > left)
            return error(start, "length " + std::to_string(n) +
                                    " runs past the end of its message (" + std::to_string(left) +
                                    " bytes remain)");
        std::string_view v(p_, static_cast<size_t>(n));
        p_ += n;
        return v;
    }

    Result<std::string_view> fixed(size_t n) {
        if (static_cast<size_t>(end_ - p_) < n)
            return error(p_, "truncated fixed" + std::to_string(8 * n) + " value");
        std::string_view v(p_, n);
        p_ += n;
        return v;
    }

    // Skips a field's value of wire type `wire` (a group up to its matching end).
    Status skip(uint32_t field, uint32_t wire, int depth = 0) {
        switch (wire) {
            case kVarint:
                return statusOf(varint());
            case kFixed64:
                return statusOf(fixed(8));
            case kFixed32:
                return statusOf(fixed(4));
            case kLengthDelimited:
                return statusOf(lengthDelimited());
            case kStartGroup: {
                if (depth >= kMaxGroupDepth) return error(p_, "groups nested too deeply");
                const char* start = p_;
                for (;;) {
                    if (done())
                        return error(start,
                                     "group (field " + std::to_string(field) + ") without its end");
                    TD_ASSIGN_OR_RETURN(const auto k, key());
                    if (k.second == kEndGroup) {
                        if (k.first != field)
                            return error(p_, "end of group " + std::to_string(k.first) +
                                                 " inside group " + std::to_string(field));
                        return Status::success();
                    }
                    TD_RETURN_IF_ERROR(skip(k.first, k.second, depth + 1));
                }
            }
            default:  // kEndGroup outside a group
                return error(p_, "end of group " + std::to_string(field) + " without its start");
        }
    }

    // An error about the bytes at `at` (within the record).
    Error error(const char* at, const std::string& what) const {
        return err("malformed tf.train.Example at byte " + std::to_string(at - base_) + ": " +
                   what);
    }

  private:
    const char* base_;
    const char* p_;
    const char* end_;
};

// Merges one serialized FloatList / Int64List / BytesList into `f`.
Status mergeList(std::string_view record, std::string_view msg, ExampleFeature& f) {
    WireReader r(record, msg);
    while (!r.done()) {
        TD_ASSIGN_OR_RETURN(const auto k, r.key());
        const auto [field, wire] = k;
        if (field != 1) {
            TD_RETURN_IF_ERROR(r.skip(field, wire));
            continue;
        }
        switch (f.kind) {
            case ExampleFeature::Kind::Bytes:
                if (wire != kLengthDelimited) break;
                {
                    TD_ASSIGN_OR_RETURN(const std::string_view v, r.lengthDelimited());
                    f.bytes.push_back(v);
                }
                continue;
            case ExampleFeature::Kind::Float:
                if (wire == kFixed32) {
                    TD_ASSIGN_OR_RETURN(const std::string_view v, r.fixed(4));
                    f.floats.push_back(std::bit_cast<float>(load32(v.data())));
                    continue;
                }
                if (wire != kLengthDelimited) break;
                {
                    TD_ASSIGN_OR_RETURN(const std::string_view v, r.lengthDelimited());
                    if (v.size() % 4 != 0)
                        return r.error(v.data(), "a packed float list of " +
                                                     std::to_string(v.size()) +
                                                     " bytes (not a multiple of 4)");
                    const size_t n = v.size() / 4, old = f.floats.size();
                    f.floats.resize(old + n);
                    std::memcpy(f.floats.data() + old, v.data(), v.size());
                }
                continue;
            case ExampleFeature::Kind::Int64:
                if (wire == kVarint) {
                    TD_ASSIGN_OR_RETURN(const uint64_t v, r.varint());
                    f.ints.push_back(static_cast<int64_t>(v));
                    continue;
                }
                if (wire != kLengthDelimited) break;
                {
                    TD_ASSIGN_OR_RETURN(const std::string_view v, r.lengthDelimited());
                    WireReader packed(record, v);
                    while (!packed.done()) {
                        TD_ASSIGN_OR_RETURN(const uint64_t x, packed.varint());
                        f.ints.push_back(static_cast<int64_t>(x));
                    }
                }
                continue;
        }
        // Field 1 with a wire type its declaration does not allow: an unknown field to protobuf.
        TD_RETURN_IF_ERROR(r.skip(field, wire));
    }
    return Status::success();
}

// Merges one serialized Feature into `f`: a list of another kind than the one set replaces it (the
// oneof's last member wins), one of the same kind appends (embedded messages merge).
Status mergeFeature(std::string_view record, std::string_view msg, ExampleFeature& f,
                    bool& kindSet) {
    WireReader r(record, msg);
    while (!r.done()) {
        TD_ASSIGN_OR_RETURN(const auto k, r.key());
        const auto [field, wire] = k;
        if (field < 1 || field > 3 || wire != kLengthDelimited) {
            TD_RETURN_IF_ERROR(r.skip(field, wire));
            continue;
        }
        const auto kind = field == 1   ? ExampleFeature::Kind::Bytes
                          : field == 2 ? ExampleFeature::Kind::Float
                                       : ExampleFeature::Kind::Int64;
        if (!kindSet || f.kind != kind) {
            f = ExampleFeature{};
            f.kind = kind;
            kindSet = true;
        }
        TD_ASSIGN_OR_RETURN(const std::string_view list, r.lengthDelimited());
        TD_RETURN_IF_ERROR(mergeList(record, list, f));
    }
    return Status::success();
}

bool isWanted(const std::vector<std::string>& wanted, std::string_view name) {
    return std::find(wanted.begin(), wanted.end(), name) != wanted.end();
}

// One Features message: its map entries, each decoded when its key is wanted.
Status parseFeatures(std::string_view record, std::string_view msg,
                     const std::vector<std::string>& wanted, ExampleFeatures& out) {
    WireReader r(record, msg);
    std::vector<std::string_view> values;
    while (!r.done()) {
        TD_ASSIGN_OR_RETURN(const auto k, r.key());
        const auto [field, wire] = k;
        if (field != 1 || wire != kLengthDelimited) {
            TD_RETURN_IF_ERROR(r.skip(field, wire));
            continue;
        }
        TD_ASSIGN_OR_RETURN(const std::string_view entry, r.lengthDelimited());
        // The entry's key (the last one, if repeated) and its value's occurrences, which merge.
        std::string_view name;
        values.clear();
        WireReader e(record, entry);
        while (!e.done()) {
            TD_ASSIGN_OR_RETURN(const auto ek, e.key());
            if (ek.first == 1 && ek.second == kLengthDelimited) {
                TD_ASSIGN_OR_RETURN(name, e.lengthDelimited());
            } else if (ek.first == 2 && ek.second == kLengthDelimited) {
                TD_ASSIGN_OR_RETURN(const std::string_view v, e.lengthDelimited());
                values.push_back(v);
            } else {
                TD_RETURN_IF_ERROR(e.skip(ek.first, ek.second));
            }
        }
        if (!isWanted(wanted, name)) continue;
        ExampleFeature f;
        bool kindSet = false;
        for (const std::string_view v : values)
            TD_RETURN_IF_ERROR(mergeFeature(record, v, f, kindSet));
        auto it = out.find(name);
        if (it == out.end())
            out.emplace(std::string(name), std::move(f));
        else
            it->second = std::move(f);  // a later entry with the same key replaces the earlier
    }
    return Status::success();
}

// --- writing

void putVarint(std::string& out, uint64_t v) {
    while (v >= 0x80) {
        out.push_back(static_cast<char>((v & 0x7f) | 0x80));
        v >>= 7;
    }
    out.push_back(static_cast<char>(v));
}

void putLengthDelimited(std::string& out, uint32_t field, std::string_view bytes) {
    putVarint(out, (uint64_t(field) << 3) | kLengthDelimited);
    putVarint(out, bytes.size());
    out.append(bytes);
}

}  // namespace

Result<ExampleFeatures> parseExample(std::string_view record,
                                     const std::vector<std::string>& wanted) {
    ExampleFeatures out;
    WireReader r(record, record);
    while (!r.done()) {
        TD_ASSIGN_OR_RETURN(const auto k, r.key());
        const auto [field, wire] = k;
        if (field == 1 && wire == kLengthDelimited) {
            // Repeated occurrences of `features` merge: their map entries accumulate.
            TD_ASSIGN_OR_RETURN(const std::string_view features, r.lengthDelimited());
            TD_RETURN_IF_ERROR(parseFeatures(record, features, wanted, out));
        } else {
            TD_RETURN_IF_ERROR(r.skip(field, wire));
        }
    }
    return out;
}

void appendTfRecord(std::string& out, std::string_view data) {
    char header[kTfRecordHeaderBytes];
    const uint64_t length = data.size();
    std::memcpy(header, &length, 8);
    const uint32_t lengthCrc = maskedCrc32c(header, 8);
    std::memcpy(header + 8, &lengthCrc, 4);
    const uint32_t dataCrc = maskedCrc32c(data.data(), data.size());
    char footer[4];
    std::memcpy(footer, &dataCrc, 4);
    out.append(header, sizeof header);
    out.append(data);
    out.append(footer, sizeof footer);
}

std::string serializeExample(const ExampleFeatures& features) {
    std::string map;
    for (const auto& [name, f] : features) {
        std::string list;
        uint32_t kindField = 1;
        switch (f.kind) {
            case ExampleFeature::Kind::Bytes:
                for (const std::string_view b : f.bytes) putLengthDelimited(list, 1, b);
                break;
            case ExampleFeature::Kind::Float:
                kindField = 2;
                if (!f.floats.empty())
                    putLengthDelimited(
                        list, 1,
                        std::string_view(reinterpret_cast<const char*>(f.floats.data()),
                                         f.floats.size() * sizeof(float)));
                break;
            case ExampleFeature::Kind::Int64: {
                kindField = 3;
                std::string packed;
                for (const int64_t v : f.ints) putVarint(packed, static_cast<uint64_t>(v));
                if (!packed.empty()) putLengthDelimited(list, 1, packed);
                break;
            }
        }
        std::string feature, entry;
        putLengthDelimited(feature, kindField, list);
        putLengthDelimited(entry, 1, name);
        putLengthDelimited(entry, 2, feature);
        putLengthDelimited(map, 1, entry);
    }
    std::string example;
    putLengthDelimited(example, 1, map);
    return example;
}

}  // namespace td

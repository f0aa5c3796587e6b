// MNIST IDX reader: magic 00 00 <type> <ndim>, ndim big-endian u32 dims, then the big-endian
// payload. Files may be gzip-compressed (detected by the 1f 8b magic) or raw.
#include <sys/stat.h>
#include <zlib.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "engine/data/pipeline.h"
#include "engine/data/resource_plan.h"

namespace td {
namespace {

// Sequential reader over a raw or gzip file. read() returns the bytes read (short only at end of
// file) or -1 on a read or decompression error, described by error().
class ByteReader {
  public:
    ~ByteReader() {
        if (gz_) gzclose(gz_);
        if (file_) std::fclose(file_);
    }

    Status open(const std::string& path) {
        path_ = path;
        file_ = std::fopen(path.c_str(), "rb");
        if (!file_) return err(path + ": cannot open: " + std::strerror(errno));
        struct stat st {};
        if (fstat(fileno(file_), &st) == 0 && S_ISREG(st.st_mode)) {
            fileSize_ = static_cast<uint64_t>(st.st_size);
        }
        unsigned char magic[2] = {0, 0};
        const size_t got = std::fread(magic, 1, 2, file_);
        if (got == 2 && magic[0] == 0x1f && magic[1] == 0x8b) {
            std::fclose(file_);
            file_ = nullptr;
            gz_ = gzopen(path.c_str(), "rb");
            if (!gz_) return err(path + ": cannot open gzip stream: " + std::strerror(errno));
            gzbuffer(gz_, 1 << 18);
        } else {
            std::rewind(file_);
        }
        return {};
    }

    int64_t read(void* dst, size_t n) {
        auto* out = static_cast<unsigned char*>(dst);
        size_t total = 0;
        while (total < n) {
            const size_t chunk = std::min<size_t>(n - total, size_t{1} << 30);
            if (gz_) {
                const int got = gzread(gz_, out + total, static_cast<unsigned>(chunk));
                if (got < 0) return -1;
                if (got == 0) break;
                total += static_cast<size_t>(got);
            } else {
                const size_t got = std::fread(out + total, 1, chunk, file_);
                total += got;
                if (got < chunk) {
                    if (std::ferror(file_)) return -1;
                    break;
                }
            }
        }
        consumed_ += total;
        return static_cast<int64_t>(total);
    }

    // An upper bound on the bytes still to come, checked before allocating what a header claims
    // so that a short file cannot make the reader allocate terabytes: the exact remainder of a
    // raw file; for gzip, the compressed size times deflate's largest expansion (about 1032:1).
    uint64_t remainingBound() const {
        if (fileSize_ == kUnknownSize) return kUnknownSize;
        if (gz_) return fileSize_ * 1032 + 1024;
        return fileSize_ > consumed_ ? fileSize_ - consumed_ : 0;
    }
    bool compressed() const { return gz_ != nullptr; }

    std::string error() const {
        if (gz_) {
            int code = 0;
            const char* msg = gzerror(gz_, &code);
            return std::string("corrupt gzip data: ") + (msg ? msg : "unknown error");
        }
        return std::string("read error: ") + std::strerror(errno);
    }

  private:
    static constexpr uint64_t kUnknownSize = ~uint64_t{0};  // not a regular file (a pipe)
    std::string path_;
    uint64_t fileSize_ = kUnknownSize;
    uint64_t consumed_ = 0;
    std::FILE* file_ = nullptr;
    gzFile gz_ = nullptr;
};

struct IdxType {
    uint8_t code;
    const char* name;
    size_t bytes;
    DType storedAs;
};

constexpr IdxType kIdxTypes[] = {
    {0x08, "u8", 1, DType::U8},   {0x09, "i8", 1, DType::I32},  {0x0B, "i16", 2, DType::I32},
    {0x0C, "i32", 4, DType::I32}, {0x0D, "f32", 4, DType::F32}, {0x0E, "f64", 8, DType::F32},
};

uint32_t loadBigEndian32(const unsigned char* p) {
    return (uint32_t{p[0]} << 24) | (uint32_t{p[1]} << 16) | (uint32_t{p[2]} << 8) | uint32_t{p[3]};
}

std::string hexBytes(const unsigned char* p, size_t n) {
    std::string s;
    char buf[4];
    for (size_t i = 0; i < n; ++i) {
        std::snprintf(buf, sizeof buf, "%s%02x", i ? " " : "", p[i]);
        s += buf;
    }
    return s;
}

// Converts `count` big-endian elements of `type` in `src` into `out` (u8, i32 or f32 storage).
void decodeBigEndian(const IdxType& type, const unsigned char* src, int64_t count, Tensor& out) {
    switch (type.code) {
        case 0x08:
            if (src != out.raw()) std::memcpy(out.raw(), src, static_cast<size_t>(count));
            break;
        case 0x09: {
            int32_t* dst = out.data<int32_t>();
            for (int64_t i = 0; i < count; ++i) dst[i] = static_cast<int8_t>(src[i]);
            break;
        }
        case 0x0B: {
            int32_t* dst = out.data<int32_t>();
            for (int64_t i = 0; i < count; ++i) {
                const auto u = static_cast<uint16_t>((src[2 * i] << 8) | src[2 * i + 1]);
                dst[i] = static_cast<int16_t>(u);
            }
            break;
        }
        case 0x0C:
        case 0x0D: {
            auto* dst = static_cast<uint32_t*>(out.raw());
            for (int64_t i = 0; i < count; ++i) dst[i] = loadBigEndian32(src + 4 * i);
            break;
        }
        case 0x0E: {
            float* dst = out.data<float>();
            for (int64_t i = 0; i < count; ++i) {
                const uint64_t bits = (uint64_t{loadBigEndian32(src + 8 * i)} << 32) |
                                      loadBigEndian32(src + 8 * i + 4);
                double v;
                std::memcpy(&v, &bits, 8);
                dst[i] = static_cast<float>(v);
            }
            break;
        }
        default:
            break;
    }
}

}  // namespace

Result<Tensor> readIdx(const std::string& path) {
    ByteReader in;
    TD_RETURN_IF_ERROR(in.open(path));

    unsigned char magic[4];
    const int64_t gotMagic = in.read(magic, 4);
    if (gotMagic < 0) return err(path + ": " + in.error());
    if (gotMagic < 4) return err(path + ": not an IDX file: shorter than the 4-byte magic");
    const IdxType* type = nullptr;
    for (const IdxType& t : kIdxTypes) {
        if (t.code == magic[2]) type = &t;
    }
    if (magic[0] != 0 || magic[1] != 0 || magic[3] == 0 || !type) {
        return err(
            path + ": not an IDX file: expected magic 00 00 <type> <ndim> with type one of " +
            "08 (u8), 09 (i8), 0b (i16), 0c (i32), 0d (f32), 0e (f64) and ndim >= 1, found " +
            hexBytes(magic, 4));
    }

    const int ndim = magic[3];
    std::vector<unsigned char> dimBytes(static_cast<size_t>(4 * ndim));
    const int64_t gotDims = in.read(dimBytes.data(), dimBytes.size());
    if (gotDims < 0) return err(path + ": " + in.error());
    if (gotDims < static_cast<int64_t>(dimBytes.size())) {
        return err(path + ": truncated: header declares " + std::to_string(ndim) +
                   " dimensions but ends after " + std::to_string(gotDims / 4));
    }
    Shape shape;
    std::string dimsText;
    for (int i = 0; i < ndim; ++i) {
        const int64_t d = loadBigEndian32(dimBytes.data() + 4 * i);
        shape.push_back(d);
        dimsText += (i ? "x" : "") + std::to_string(d);
    }
    int64_t count = 1;
    for (int i = 0; i < ndim; ++i) {
        const int64_t d = shape[static_cast<size_t>(i)];
        if (d == 0) {
            return err(path + ": header dimension " + std::to_string(i + 1) + " of " +
                       std::to_string(ndim) + " is 0 (dimensions " + dimsText + ")" +
                       (i == 0 ? ": the file holds no samples" : ": samples would hold no values"));
        }
        // Checked before multiplying: the product of two 32-bit dims times a third overflows.
        if (count > (int64_t{1} << 40) / d) {
            return err(path + ": header dimensions " + dimsText + " exceed 2^40 elements");
        }
        count *= d;
    }
    const auto payloadBytes = static_cast<size_t>(count) * type->bytes;
    // Refuse what cannot be there before allocating for it: a file shorter than its header says,
    // or an array beyond the memory budget.
    if (payloadBytes > in.remainingBound()) {
        return err(path + ": truncated: header says " + dimsText + " = " +
                   std::to_string(payloadBytes) + " bytes" +
                   (type->bytes > 1 ? " of " + std::string(type->name) : std::string()) +
                   (in.compressed() ? ", more than its gzip stream can hold"
                                    : ", found " + std::to_string(in.remainingBound())));
    }
    const size_t stagingBytes = type->bytes != dtypeSize(type->storedAs) ? payloadBytes : 0;
    TD_RETURN_IF_ERROR(
        checkFileFits(path, "the " + dimsText + " " + type->name + " array its header declares",
                      double(count) * double(dtypeSize(type->storedAs)) + double(stagingBytes)));

    Tensor out(type->storedAs, shape);
    // u8 and 4-byte payloads decode in place; i8/i16/f64 go through a staging buffer.
    std::vector<unsigned char> staging;
    unsigned char* dst = static_cast<unsigned char*>(out.raw());
    if (type->bytes != dtypeSize(type->storedAs)) {
        staging.resize(payloadBytes);
        dst = staging.data();
    }
    const int64_t got = in.read(dst, payloadBytes);
    if (got < 0) return err(path + ": " + in.error());
    if (static_cast<size_t>(got) < payloadBytes) {
        return err(path + ": truncated: header says " + dimsText + " = " +
                   std::to_string(payloadBytes) + " bytes" +
                   (type->bytes > 1 ? " of " + std::string(type->name) : std::string()) +
                   ", found " + std::to_string(got));
    }
    unsigned char extra[4096];
    int64_t extraBytes = 0;
    for (int64_t n = 0; (n = in.read(extra, sizeof extra)) != 0;) {
        if (n < 0) return err(path + ": " + in.error());
        extraBytes += n;
    }
    if (extraBytes > 0) {
        return err(path + ": header says " + dimsText + " = " + std::to_string(payloadBytes) +
                   " bytes, but the file has " + std::to_string(extraBytes) +
                   " more bytes after them");
    }
    decodeBigEndian(*type, dst, count, out);
    return out;
}

}  // namespace td

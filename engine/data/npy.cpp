// NumPy .npy reader (format versions 1.0, 2.0 and 3.0): "\x93NUMPY", major, minor, a little-endian
// u16 (v1) or u32 (v2, v3) header length, a Python dict literal header, then the C-order payload.
#include <sys/stat.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "engine/data/pipeline.h"
#include "engine/data/resource_plan.h"

namespace td {
namespace {

static_assert(std::endian::native == std::endian::little,
              "the .npy reader assumes a little-endian host");

struct NpyHeader {
    std::string descr;
    bool fortranOrder = false;
    Shape shape;
};

size_t skipSpaces(const std::string& s, size_t i) {
    while (i < s.size() && (s[i] == ' ' || s[i] == '\t' || s[i] == '\n')) ++i;
    return i;
}

// Position just after `'key'` and the following ':', or npos.
size_t findKey(const std::string& h, const char* key) {
    for (const char quote : {'\'', '"'}) {
        const std::string k = std::string(1, quote) + key + quote;
        size_t p = h.find(k);
        if (p == std::string::npos) continue;
        p = skipSpaces(h, p + k.size());
        if (p < h.size() && h[p] == ':') return skipSpaces(h, p + 1);
    }
    return std::string::npos;
}

Result<NpyHeader> parseHeader(const std::string& path, const std::string& h) {
    NpyHeader out;
    size_t p = findKey(h, "descr");
    if (p == std::string::npos) return err(path + ": .npy header has no 'descr': " + h);
    if (h[p] != '\'' && h[p] != '"') {
        return err(path + ": unsupported structured dtype " + h.substr(p, 40) +
                   " (expected a simple dtype such as '<f4')");
    }
    const size_t end = h.find(h[p], p + 1);
    if (end == std::string::npos) return err(path + ": malformed .npy header: " + h);
    out.descr = h.substr(p + 1, end - p - 1);

    p = findKey(h, "fortran_order");
    if (p == std::string::npos) return err(path + ": .npy header has no 'fortran_order': " + h);
    if (h.compare(p, 4, "True") == 0) {
        out.fortranOrder = true;
    } else if (h.compare(p, 5, "False") != 0) {
        return err(path + ": malformed 'fortran_order' in .npy header: " + h);
    }

    p = findKey(h, "shape");
    if (p == std::string::npos || h[p] != '(')
        return err(path + ": .npy header has no shape: " + h);
    ++p;
    while (true) {
        p = skipSpaces(h, p);
        if (p >= h.size()) return err(path + ": malformed shape in .npy header: " + h);
        if (h[p] == ')') break;
        if (h[p] == ',') {
            ++p;
            continue;
        }
        if (h[p] < '0' || h[p] > '9') return err(path + ": malformed shape in .npy header: " + h);
        int64_t d = 0;
        while (p < h.size() && h[p] >= '0' && h[p] <= '9') {
            d = d * 10 + (h[p++] - '0');
            if (d > (int64_t{1} << 40)) return err(path + ": shape too large in .npy header: " + h);
        }
        out.shape.push_back(d);
    }
    // The product is bounded too (checked before multiplying): each dim alone can be 2^40.
    int64_t count = 1;
    for (const int64_t d : out.shape) {
        if (d != 0 && count > (int64_t{1} << 40) / d) {
            return err(path + ": shape " + shapeToString(out.shape) +
                       " in .npy header exceeds 2^40 elements");
        }
        count *= d;
    }
    return out;
}

struct NpyType {
    const char* descr;
    size_t bytes;
    DType storedAs;
};

constexpr NpyType kNpyTypes[] = {
    {"<f4", 4, DType::F32}, {"<f8", 8, DType::F32}, {"<i4", 4, DType::I32},
    {"<i8", 8, DType::I32}, {"|u1", 1, DType::U8},  {"<u1", 1, DType::U8},
};

}  // namespace

Result<Tensor> readNpy(const std::string& path) {
    std::unique_ptr<std::FILE, int (*)(std::FILE*)> file(std::fopen(path.c_str(), "rb"),
                                                         &std::fclose);
    if (!file) return err(path + ": cannot open: " + std::strerror(errno));
    std::FILE* f = file.get();

    unsigned char pre[10];
    if (std::fread(pre, 1, 8, f) != 8 || std::memcmp(pre, "\x93NUMPY", 6) != 0) {
        return err(path + ": not a .npy file (expected the magic \\x93NUMPY)");
    }
    const int major = pre[6];
    uint32_t headerLen = 0;
    if (major == 1) {
        if (std::fread(pre + 8, 1, 2, f) != 2) return err(path + ": truncated .npy header");
        headerLen = pre[8] | (uint32_t{pre[9]} << 8);
    } else if (major == 2 || major == 3) {
        unsigned char len[4];
        if (std::fread(len, 1, 4, f) != 4) return err(path + ": truncated .npy header");
        headerLen =
            len[0] | (uint32_t{len[1]} << 8) | (uint32_t{len[2]} << 16) | (uint32_t{len[3]} << 24);
    } else {
        return err(path + ": unsupported .npy format version " + std::to_string(major) + "." +
                   std::to_string(pre[7]) + " (expected 1.0, 2.0 or 3.0)");
    }
    if (headerLen > (1u << 24)) return err(path + ": implausible .npy header length");
    std::string header(headerLen, '\0');
    if (std::fread(header.data(), 1, headerLen, f) != headerLen) {
        return err(path + ": truncated .npy header");
    }
    while (!header.empty() && (header.back() == '\n' || header.back() == ' ')) header.pop_back();

    TD_ASSIGN_OR_RETURN(NpyHeader h, parseHeader(path, header));
    if (h.fortranOrder) {
        return err(path + ": fortran_order True is not supported; save a C-order array " +
                   "(numpy.ascontiguousarray)");
    }
    const NpyType* type = nullptr;
    for (const NpyType& t : kNpyTypes) {
        if (h.descr == t.descr) type = &t;
    }
    if (!type) {
        return err(path + ": unsupported dtype '" + h.descr +
                   "' (supported: <f4, <f8 -> f32; <i4, <i8 -> i32; |u1 -> u8)");
    }

    int64_t count = 1;
    for (size_t i = 0; i < h.shape.size(); ++i) {
        if (h.shape[i] == 0) {
            return err(
                path + ": shape " + shapeToString(h.shape) + ": dimension " +
                std::to_string(i + 1) + " of " + std::to_string(h.shape.size()) + " is 0" +
                (i == 0 ? ": the array holds no samples" : ": samples would hold no values"));
        }
        count *= h.shape[i];
        if (count > (int64_t{1} << 40))
            return err(path + ": shape " + shapeToString(h.shape) + " exceeds 2^40 elements");
    }
    const size_t payloadBytes = static_cast<size_t>(count) * type->bytes;
    // Checked before allocating, so a short file cannot make the reader allocate what its header
    // claims. Only regular files have a known size (a pipe is read until it ends).
    struct stat st {};
    const long offset = std::ftell(f);
    if (fstat(fileno(f), &st) == 0 && S_ISREG(st.st_mode) && offset >= 0) {
        const auto remaining =
            static_cast<uint64_t>(std::max<int64_t>(0, static_cast<int64_t>(st.st_size) - offset));
        if (payloadBytes > remaining) {
            return err(path + ": truncated: header says shape " + shapeToString(h.shape) + " " +
                       h.descr + " = " + std::to_string(payloadBytes) + " bytes, found " +
                       std::to_string(remaining));
        }
    }
    const size_t stagingBytes = type->bytes != dtypeSize(type->storedAs) ? payloadBytes : 0;
    TD_RETURN_IF_ERROR(checkFileFits(
        path, "the " + shapeToString(h.shape) + " " + h.descr + " array its header declares",
        double(count) * double(dtypeSize(type->storedAs)) + double(stagingBytes)));
    Tensor out(type->storedAs, h.shape);
    std::vector<unsigned char> staging;
    unsigned char* dst = static_cast<unsigned char*>(out.raw());
    if (type->bytes != dtypeSize(type->storedAs)) {
        staging.resize(payloadBytes);
        dst = staging.data();
    }
    const size_t got = std::fread(dst, 1, payloadBytes, f);
    if (got < payloadBytes) {
        return err(path + ": truncated: header says shape " + shapeToString(h.shape) + " " +
                   h.descr + " = " + std::to_string(payloadBytes) + " bytes, found " +
                   std::to_string(got));
    }
    unsigned char extra[4096];
    size_t extraBytes = 0;
    for (size_t n = 0; (n = std::fread(extra, 1, sizeof extra, f)) > 0;) extraBytes += n;
    if (extraBytes > 0) {
        return err(path + ": header says shape " + shapeToString(h.shape) + " " + h.descr + " = " +
                   std::to_string(payloadBytes) + " bytes, but the file has " +
                   std::to_string(extraBytes) + " more bytes after them");
    }

    if (h.descr == "<f8") {
        float* o = out.data<float>();
        for (int64_t i = 0; i < count; ++i) {
            double v;
            std::memcpy(&v, dst + 8 * i, 8);
            o[i] = static_cast<float>(v);
        }
    } else if (h.descr == "<i8") {
        int32_t* o = out.data<int32_t>();
        for (int64_t i = 0; i < count; ++i) {
            int64_t v;
            std::memcpy(&v, dst + 8 * i, 8);
            if (v < std::numeric_limits<int32_t>::min() ||
                v > std::numeric_limits<int32_t>::max()) {
                return err(path + ": element " + std::to_string(i) + " = " + std::to_string(v) +
                           " does not fit in int32");
            }
            o[i] = static_cast<int32_t>(v);
        }
    }
    return out;
}

}  // namespace td

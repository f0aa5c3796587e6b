#include "engine/data/cache_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>

namespace td {
namespace {

constexpr char kMagic[8] = {'T', 'D', 'C', 'A', 'C', 'H', 'E', '2'};
constexpr uint64_t kPageBytes = 4096;

// On-disk header (little-endian host order; the cache is local to this machine).
struct CacheHeader {
    char magic[8];
    int64_t rows;
    int64_t xRowBytes;
    int64_t yRowBytes;
    uint8_t xType;
    uint8_t yType;
    uint8_t reserved[6];
    uint64_t fingerprint;    // of the source data and the map steps before the cache
    uint64_t rowsHash;       // of the x rows, then the y rows
    int64_t xVariableBytes;  // CacheLayout::xVariableBytes (0 in files of fixed-size rows)
};
static_assert(sizeof(CacheHeader) <= kCacheHeaderBytes);

std::string errnoText() {
    return std::strerror(errno);
}

inline uint64_t rotl(uint64_t v, int r) {
    return (v << r) | (v >> (64 - r));
}

inline uint64_t finalMix(uint64_t h) {
    h ^= h >> 33;
    h *= 0xff51afd7ed558ccdULL;
    h ^= h >> 33;
    h *= 0xc4ceb9fe1a85ec53ULL;
    return h ^ (h >> 33);
}

uint64_t rowsHash(const uint8_t* base, const CacheLayout& l) {
    const uint64_t h = hashBytes(base + l.xOffset(), static_cast<size_t>(l.xBytes()), 0);
    return hashBytes(base + l.yOffset(), static_cast<size_t>(l.rows * l.yRowBytes), h);
}

}  // namespace

namespace {

constexpr uint64_t kP1 = 0x9e3779b185ebca87ULL, kP2 = 0xc2b2ae3d27d4eb4fULL;

// Four independent lanes keep the multiplier busy: hashing runs near memory bandwidth.
inline void hashBlocks(uint64_t lane[4], const uint8_t* p, size_t blocks) {
    for (size_t b = 0; b < blocks; ++b, p += 32) {
        for (int j = 0; j < 4; ++j) {
            uint64_t w;
            std::memcpy(&w, p + 8 * j, 8);
            lane[j] = rotl(lane[j] + w * kP2, 31) * kP1;
        }
    }
}

inline uint64_t hashFinish(const uint64_t lane[4], const uint8_t* tail, size_t tailBytes,
                           uint64_t total) {
    uint64_t h = rotl(lane[0], 1) + rotl(lane[1], 7) + rotl(lane[2], 12) + rotl(lane[3], 18);
    for (size_t i = 0; i < tailBytes; ++i) h = rotl(h ^ (tail[i] * kP1), 23) * kP2;
    return finalMix(h ^ total);
}

}  // namespace

uint64_t hashBytes(const void* data, size_t bytes, uint64_t seed) {
    const auto* p = static_cast<const uint8_t*>(data);
    uint64_t lane[4] = {seed + kP1, seed ^ kP2, seed, seed - kP1};
    const size_t blocks = bytes / 32;
    hashBlocks(lane, p, blocks);
    return hashFinish(lane, p + blocks * 32, bytes - blocks * 32, bytes);
}

HashStream::HashStream(uint64_t seed) : lane_{seed + kP1, seed ^ kP2, seed, seed - kP1} {}

void HashStream::update(const void* data, size_t bytes) {
    const auto* p = static_cast<const uint8_t*>(data);
    total_ += bytes;
    if (pendingBytes_ > 0) {
        const size_t take = std::min(bytes, sizeof(pending_) - pendingBytes_);
        std::memcpy(pending_ + pendingBytes_, p, take);
        pendingBytes_ += take;
        p += take;
        bytes -= take;
        if (pendingBytes_ < sizeof(pending_)) return;
        hashBlocks(lane_, pending_, 1);
        pendingBytes_ = 0;
    }
    const size_t blocks = bytes / 32;
    hashBlocks(lane_, p, blocks);
    pendingBytes_ = bytes - blocks * 32;
    std::memcpy(pending_, p + blocks * 32, pendingBytes_);
}

uint64_t HashStream::digest() const {
    return hashFinish(lane_, pending_, pendingBytes_, total_);
}

uint64_t CacheLayout::xBytes() const {
    return static_cast<uint64_t>(xVariableBytes > 0 ? xVariableBytes : rows * xRowBytes);
}

uint64_t CacheLayout::yOffset() const {
    const uint64_t xEnd = xOffset() + xBytes();
    return (xEnd + kPageBytes - 1) / kPageBytes * kPageBytes;
}

uint64_t CacheLayout::fileBytes() const {
    return yOffset() + static_cast<uint64_t>(rows * yRowBytes);
}

Result<std::unique_ptr<CacheFileWriter>> CacheFileWriter::create(const std::string& path,
                                                                 const CacheLayout& layout) {
    static std::atomic<uint64_t> counter{0};
    const std::string temp = path + ".partial-" + std::to_string(::getpid()) + "-" +
                             std::to_string(counter.fetch_add(1));
    const int fd = ::open(temp.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) return err("cache file " + path + ": cannot be written: " + errnoText());
    auto fail = [&](const std::string& what, int code) -> Error {
        ::close(fd);
        ::unlink(temp.c_str());
        return err("cache file " + path + ": " + what + ": " + std::strerror(code));
    };
    // Reserved blocks: a disk that fills later cannot turn a store into the mapping into SIGBUS.
    const int rc = ::posix_fallocate(fd, 0, static_cast<off_t>(layout.fileBytes()));
    if (rc != 0) {
        return fail("cannot reserve " + std::to_string(layout.fileBytes()) + " bytes", rc);
    }
    void* base = ::mmap(nullptr, layout.fileBytes(), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (base == MAP_FAILED) return fail("cannot be mapped", errno);
    ::close(fd);
    return std::unique_ptr<CacheFileWriter>(
        new CacheFileWriter(path, temp, static_cast<uint8_t*>(base), layout));
}

CacheFileWriter::~CacheFileWriter() {
    ::munmap(base_, layout_.fileBytes());
    if (!committed_) ::unlink(tempPath_.c_str());
}

Status CacheFileWriter::commit(uint64_t fingerprint) {
    TD_ASSERT(!committed_);
    CacheHeader h{};
    std::memcpy(h.magic, kMagic, sizeof kMagic);
    h.rows = layout_.rows;
    h.xRowBytes = layout_.xRowBytes;
    h.yRowBytes = layout_.yRowBytes;
    h.xType = static_cast<uint8_t>(layout_.xType);
    h.yType = static_cast<uint8_t>(layout_.yType);
    h.fingerprint = fingerprint;
    h.xVariableBytes = layout_.xVariableBytes;
    h.rowsHash = rowsHash(base_, layout_);
    std::memcpy(base_, &h, sizeof h);
    // No fsync: a file cut short or damaged by a crash fails the size or rows-hash check when a
    // later run opens it, and is rebuilt.
    if (::rename(tempPath_.c_str(), path_.c_str()) != 0) {
        return err("cache file " + path_ + ": cannot rename " + tempPath_ + ": " + errnoText());
    }
    committed_ = true;
    return {};
}

Result<std::unique_ptr<CacheFileMapping>> CacheFileMapping::open(const std::string& path,
                                                                 const CacheLayout& expected,
                                                                 uint64_t fingerprint) {
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return err("cache file " + path + ": cannot be opened: " + errnoText());
    struct stat st {};
    if (::fstat(fd, &st) != 0 || static_cast<uint64_t>(st.st_size) != expected.fileBytes()) {
        ::close(fd);
        return err("cache file " + path + ": expected " + std::to_string(expected.fileBytes()) +
                   " bytes, found " + std::to_string(st.st_size) + " (cut short, or other data)");
    }
    void* base = ::mmap(nullptr, expected.fileBytes(), PROT_READ, MAP_SHARED, fd, 0);
    const std::string why = errnoText();
    ::close(fd);
    if (base == MAP_FAILED) return err("cache file " + path + ": cannot be mapped: " + why);
    const auto* bytes = static_cast<const uint8_t*>(base);
    CacheHeader h;
    std::memcpy(&h, bytes, sizeof h);
    std::string mismatch;
    if (std::memcmp(h.magic, kMagic, sizeof kMagic) != 0) {
        mismatch = "not a cache file of this version";
    } else if (h.rows != expected.rows || h.xRowBytes != expected.xRowBytes ||
               h.yRowBytes != expected.yRowBytes || h.xVariableBytes != expected.xVariableBytes ||
               h.xType != static_cast<uint8_t>(expected.xType) ||
               h.yType != static_cast<uint8_t>(expected.yType)) {
        mismatch = "its rows have another shape or type";
    } else if (h.fingerprint != fingerprint) {
        mismatch = "written for other source data or other map steps";
    } else if (h.rowsHash != rowsHash(bytes, expected)) {
        mismatch = "its rows are damaged (hash mismatch)";
    }
    if (!mismatch.empty()) {
        ::munmap(base, expected.fileBytes());
        return err("cache file " + path + ": " + mismatch);
    }
    return std::unique_ptr<CacheFileMapping>(
        new CacheFileMapping(bytes, expected.fileBytes(), expected));
}

CacheFileMapping::~CacheFileMapping() {
    ::munmap(const_cast<uint8_t*>(base_), bytes_);
}

}  // namespace td

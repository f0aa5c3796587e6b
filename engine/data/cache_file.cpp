#include "engine/data/cache_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>

namespace td {
namespace {

constexpr char kMagic[8] = {'T', 'D', 'C', 'A', 'C', 'H', 'E', '1'};
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
};
static_assert(sizeof(CacheHeader) <= kCacheHeaderBytes);

std::string errnoText() {
    return std::strerror(errno);
}

Status writeAll(int fd, const void* data, size_t bytes, uint64_t offset, const std::string& path) {
    const auto* p = static_cast<const char*>(data);
    while (bytes > 0) {
        const ssize_t n = ::pwrite(fd, p, bytes, static_cast<off_t>(offset));
        if (n < 0) {
            if (errno == EINTR) continue;
            return err("cache file " + path + ": write failed: " + errnoText());
        }
        p += n;
        bytes -= static_cast<size_t>(n);
        offset += static_cast<uint64_t>(n);
    }
    return {};
}

}  // namespace

uint64_t CacheLayout::yOffset() const {
    const uint64_t xEnd = xOffset() + static_cast<uint64_t>(rows * xRowBytes);
    return (xEnd + kPageBytes - 1) / kPageBytes * kPageBytes;
}

uint64_t CacheLayout::fileBytes() const {
    return yOffset() + static_cast<uint64_t>(rows * yRowBytes);
}

CacheFileWriter::CacheFileWriter(std::string path, std::string tempPath, int fd, CacheLayout layout)
    : path_(std::move(path)), tempPath_(std::move(tempPath)), fd_(fd), layout_(layout) {}

Result<std::unique_ptr<CacheFileWriter>> CacheFileWriter::create(const std::string& path,
                                                                 const CacheLayout& layout) {
    static std::atomic<uint64_t> counter{0};
    const std::string temp = path + ".partial-" + std::to_string(::getpid()) + "-" +
                             std::to_string(counter.fetch_add(1));
    const int fd = ::open(temp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) return err("cache file " + path + ": cannot be written: " + errnoText());
    if (::ftruncate(fd, static_cast<off_t>(layout.fileBytes())) != 0) {
        const std::string why = errnoText();
        ::close(fd);
        ::unlink(temp.c_str());
        return err("cache file " + path + ": cannot be sized: " + why);
    }
    return std::unique_ptr<CacheFileWriter>(new CacheFileWriter(path, temp, fd, layout));
}

CacheFileWriter::~CacheFileWriter() {
    if (fd_ >= 0) ::close(fd_);
    if (!committed_) ::unlink(tempPath_.c_str());
}

Status CacheFileWriter::writeRows(const void* x, const void* y, int64_t begin, int64_t end) {
    TD_ASSERT(0 <= begin && begin <= end && end <= layout_.rows);
    const auto* xb = static_cast<const char*>(x);
    const auto* yb = static_cast<const char*>(y);
    TD_RETURN_IF_ERROR(writeAll(
        fd_, xb + begin * layout_.xRowBytes, static_cast<size_t>((end - begin) * layout_.xRowBytes),
        layout_.xOffset() + static_cast<uint64_t>(begin * layout_.xRowBytes), path_));
    return writeAll(fd_, yb + begin * layout_.yRowBytes,
                    static_cast<size_t>((end - begin) * layout_.yRowBytes),
                    layout_.yOffset() + static_cast<uint64_t>(begin * layout_.yRowBytes), path_);
}

Status CacheFileWriter::commit() {
    TD_ASSERT(!committed_ && fd_ >= 0);
    CacheHeader h{};
    std::memcpy(h.magic, kMagic, sizeof kMagic);
    h.rows = layout_.rows;
    h.xRowBytes = layout_.xRowBytes;
    h.yRowBytes = layout_.yRowBytes;
    h.xType = static_cast<uint8_t>(layout_.xType);
    h.yType = static_cast<uint8_t>(layout_.yType);
    TD_RETURN_IF_ERROR(writeAll(fd_, &h, sizeof h, 0, path_));
    // No fsync: the file is only trusted by the pipeline that wrote it, in this process.
    const int rc = ::close(fd_);
    fd_ = -1;
    if (rc != 0) return err("cache file " + path_ + ": close failed: " + errnoText());
    if (::rename(tempPath_.c_str(), path_.c_str()) != 0) {
        return err("cache file " + path_ + ": cannot rename " + tempPath_ + ": " + errnoText());
    }
    committed_ = true;
    return {};
}

Result<std::unique_ptr<CacheFileMapping>> CacheFileMapping::open(const std::string& path,
                                                                 const CacheLayout& expected) {
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return err("cache file " + path + ": cannot be opened: " + errnoText());
    struct stat st {};
    if (::fstat(fd, &st) != 0 || static_cast<uint64_t>(st.st_size) != expected.fileBytes()) {
        ::close(fd);
        return err("cache file " + path + ": expected " + std::to_string(expected.fileBytes()) +
                   " bytes, found " + std::to_string(st.st_size) + " (changed since written?)");
    }
    void* base = ::mmap(nullptr, expected.fileBytes(), PROT_READ, MAP_SHARED, fd, 0);
    const std::string why = errnoText();
    ::close(fd);
    if (base == MAP_FAILED) return err("cache file " + path + ": cannot be mapped: " + why);
    CacheHeader h;
    std::memcpy(&h, base, sizeof h);
    if (std::memcmp(h.magic, kMagic, sizeof kMagic) != 0 || h.rows != expected.rows ||
        h.xRowBytes != expected.xRowBytes || h.yRowBytes != expected.yRowBytes ||
        h.xType != static_cast<uint8_t>(expected.xType) ||
        h.yType != static_cast<uint8_t>(expected.yType)) {
        ::munmap(base, expected.fileBytes());
        return err("cache file " + path + ": header does not match the dataset (changed since " +
                   "written?)");
    }
    ::madvise(base, expected.fileBytes(), MADV_WILLNEED);
    return std::unique_ptr<CacheFileMapping>(
        new CacheFileMapping(static_cast<const uint8_t*>(base), expected.fileBytes(), expected));
}

CacheFileMapping::~CacheFileMapping() {
    ::munmap(const_cast<uint8_t*>(base_), bytes_);
}

}  // namespace td

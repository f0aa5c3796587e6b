// The file behind PipelineConfig::cache = "file:<path>": the source elements (pre-shuffle, in
// source order) written during the first complete epoch, memory-mapped by later epochs.
//
// Layout: a kCacheHeaderBytes header (magic, dtypes, row sizes, offsets), the x rows from offset
// kCacheHeaderBytes, then the y rows from the next page boundary. A file is only ever visible under
// its final name once complete: rows go to "<path>.partial-<pid>-<n>", which commit() renames.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "engine/core/result.h"
#include "engine/core/tensor.h"

namespace td {

constexpr size_t kCacheHeaderBytes = 4096;

struct CacheLayout {
    int64_t rows = 0;
    int64_t xRowBytes = 0, yRowBytes = 0;
    DType xType = DType::U8, yType = DType::I32;
    uint64_t xOffset() const { return kCacheHeaderBytes; }
    uint64_t yOffset() const;
    uint64_t fileBytes() const;
};

// Writes one cache file. writeRows may be called concurrently for disjoint row ranges (pwrite);
// commit() and the destructor from one thread once the writers are done. An uncommitted file is
// deleted by the destructor.
class CacheFileWriter {
  public:
    static Result<std::unique_ptr<CacheFileWriter>> create(const std::string& path,
                                                           const CacheLayout& layout);
    ~CacheFileWriter();
    CacheFileWriter(const CacheFileWriter&) = delete;
    CacheFileWriter& operator=(const CacheFileWriter&) = delete;

    // Rows [begin, end) of x and y, given as the source arrays' base pointers.
    Status writeRows(const void* x, const void* y, int64_t begin, int64_t end);
    // Writes the header and renames the temporary file to the final path.
    Status commit();

  private:
    CacheFileWriter(std::string path, std::string tempPath, int fd, CacheLayout layout);
    std::string path_, tempPath_;
    int fd_ = -1;
    CacheLayout layout_;
    bool committed_ = false;
};

// A read-only mapping of a committed cache file; the header must match `expected`.
class CacheFileMapping {
  public:
    static Result<std::unique_ptr<CacheFileMapping>> open(const std::string& path,
                                                          const CacheLayout& expected);
    ~CacheFileMapping();
    CacheFileMapping(const CacheFileMapping&) = delete;
    CacheFileMapping& operator=(const CacheFileMapping&) = delete;

    const uint8_t* x() const { return base_ + layout_.xOffset(); }
    const uint8_t* y() const { return base_ + layout_.yOffset(); }

  private:
    CacheFileMapping(const uint8_t* base, size_t bytes, CacheLayout layout)
        : base_(base), bytes_(bytes), layout_(layout) {}
    const uint8_t* base_;
    size_t bytes_;
    CacheLayout layout_;
};

}  // namespace td

// The file behind PipelineConfig::cache = "file:<path>": the elements at the cache's place in the
// pipeline (source elements, or the values after the map steps listed before it), in source order,
// written during the first complete pass and read by every later epoch and by later runs.
//
// Layout: a kCacheHeaderBytes header (magic, dtypes, row sizes, the fingerprint of what produced
// the rows, a hash of the rows), the x rows from offset kCacheHeaderBytes (of one size, or, for
// encoded elements, of their own sizes after an offset table), then the y rows from the next page
// boundary. A file is only ever visible under its final name once complete: rows go to
// "<path>.partial-<pid>-<n>", which commit() renames.
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
    // Rows of their own lengths (encoded elements; xRowBytes 0): the bytes of the x region, an
    // offset table of rows + 1 uint64 values (row r is bytes [table[r], table[r + 1]) of what
    // follows the table), then the rows. 0: rows of xRowBytes each.
    int64_t xVariableBytes = 0;
    uint64_t xOffset() const { return kCacheHeaderBytes; }
    uint64_t xBytes() const;
    uint64_t yOffset() const;
    uint64_t fileBytes() const;
};

// A 64-bit hash of a byte range, chained through `seed` (not cryptographic: it tells a cache that
// belongs to other data or was damaged from a good one).
uint64_t hashBytes(const void* data, size_t bytes, uint64_t seed);

// hashBytes of a byte range that arrives in parts: digest() after update(a), update(b) equals
// hashBytes(a followed by b, seed), so a file can be hashed while it is written.
class HashStream {
  public:
    explicit HashStream(uint64_t seed);
    void update(const void* data, size_t bytes);
    uint64_t digest() const;
    uint64_t bytes() const { return total_; }

  private:
    uint64_t lane_[4];
    unsigned char pending_[32];
    size_t pendingBytes_ = 0;
    uint64_t total_ = 0;
};

// Writes one cache file through a shared mapping of its temporary. Rows are written in place
// (x(), y()) by any number of threads for disjoint rows; commit() and the destructor run from one
// thread once the writers are done. The storage is reserved up front, so a full disk fails
// create(), not a write. An uncommitted file is deleted by the destructor; a committed one stays
// mapped, and readable through x() and y(), until then.
class CacheFileWriter {
  public:
    static Result<std::unique_ptr<CacheFileWriter>> create(const std::string& path,
                                                           const CacheLayout& layout);
    ~CacheFileWriter();
    CacheFileWriter(const CacheFileWriter&) = delete;
    CacheFileWriter& operator=(const CacheFileWriter&) = delete;

    uint8_t* x() const { return base_ + layout_.xOffset(); }
    uint8_t* y() const { return base_ + layout_.yOffset(); }
    // Hashes the rows, writes the header and renames the temporary file to the final path.
    Status commit(uint64_t fingerprint);
    bool committed() const { return committed_; }

  private:
    CacheFileWriter(std::string path, std::string tempPath, uint8_t* base, CacheLayout layout)
        : path_(std::move(path)), tempPath_(std::move(tempPath)), base_(base), layout_(layout) {}
    std::string path_, tempPath_;
    uint8_t* base_;
    CacheLayout layout_;
    bool committed_ = false;
};

// A read-only mapping of a committed cache file. open() checks the size, the header against
// `expected` and `fingerprint`, and the hash of the rows; the error says which did not match.
class CacheFileMapping {
  public:
    static Result<std::unique_ptr<CacheFileMapping>> open(const std::string& path,
                                                          const CacheLayout& expected,
                                                          uint64_t fingerprint);
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

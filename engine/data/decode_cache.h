// The decoded-source cache: the arrays readIdx made of gzip-compressed IDX files (the built-in
// fashion_mnist source, "idx" sources with .gz files), kept in the user's cache folder so that a
// later run reads the decoded array instead of inflating the file again.
//
// Folder: $XDG_CACHE_HOME/traindeck/decoded (an absolute XDG_CACHE_HOME), else
// $HOME/.cache/traindeck/decoded. One entry per source file, named by a hash of its canonical path.
// An entry is a kDecodeCacheHeaderBytes header (magic, format version, the source's canonical
// path, size, modification time in ns and inode, the array's dtype and shape, the payload's size
// and hash, and last a hash of the header itself), then the array as readIdx returns it.
//
// Trust: an entry is used only when its header checks (magic, version, header hash), names the
// source as it is now (path, size, mtime, inode), its sizes agree with the file's, the array fits
// the memory budget (resource_plan.h) and the payload's hash checks. Anything else is ignored,
// deleted and rewritten from the decoded source; the load never fails because of the cache.
// Writing goes to a temporary file in the folder that is fsync'd and renamed over the entry, so a
// reader sees a whole entry or none. A folder that cannot be created or written, or a full disk,
// means no entry (a note for the run's log), never an error.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "engine/core/result.h"
#include "engine/core/tensor.h"

namespace td {

// "off" (or 0, false, no) disables the cache: entries are neither read nor written.
constexpr const char* kDecodeCacheEnv = "TRAINDECK_DECODE_CACHE";
// Test hook: entries may write at most N bytes; a write beyond fails as on a full disk (ENOSPC).
constexpr const char* kDecodeCacheFaultBytesEnv = "TRAINDECK_FAULT_DECODE_CACHE_BYTES";

constexpr size_t kDecodeCacheHeaderBytes = 4096;

// Process-wide counts since start (every reader thread adds to them).
struct DecodeCacheStats {
    int64_t hits = 0;           // arrays read from an entry
    int64_t decoded = 0;        // gzip sources inflated (no usable entry, or the cache off)
    int64_t written = 0;        // entries written
    int64_t rejected = 0;       // entries found stale or damaged, deleted
    int64_t writeFailures = 0;  // entries that could not be written (folder, disk)
};
DecodeCacheStats decodeCacheStats();

// The folder, or "" when the cache is off or no home folder is known.
std::string decodeCacheDir();
// The entry of `source` (any spelling of its path) in `dir`, whether it exists or not.
std::string decodeCacheEntry(const std::string& dir, const std::string& source);

// readIdx(path), through the cache when the file is gzip-compressed and the cache is on. The
// errors are readIdx's; what went wrong with the cache itself goes to `notes` (when given).
Result<Tensor> readIdxCached(const std::string& path, std::vector<std::string>* notes = nullptr);

}  // namespace td

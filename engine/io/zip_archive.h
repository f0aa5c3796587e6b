// Zip archives as Keras 3 writes and reads its `.keras` files: a handful of members, small enough
// to hold in memory. Written members are stored (no compression), as Keras' own writer does;
// readers accept stored and deflate members and check every member's CRC-32.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "engine/core/result.h"

namespace td {

struct ZipMember {
    std::string name;   // path inside the archive, '/' separated
    std::string bytes;  // uncompressed content
};

// The archive's bytes (local headers, data, central directory, end record). Errors: a member
// name that is empty or too long, more than 65535 members, a member or archive over 4 GiB (no
// Zip64).
Result<std::string> zipArchiveBytes(const std::vector<ZipMember>& members);

// Reads every member of an archive held in memory. `fileName` only names the archive in errors:
// "model.keras: not a zip archive (no end-of-central-directory record)", "model.keras: member
// 'config.json': CRC-32 mismatch (damaged archive)". Members larger than `maxMemberBytes`
// uncompressed are refused before they are inflated.
Result<std::vector<ZipMember>> readZipArchive(const std::string& bytes, const std::string& fileName,
                                              uint64_t maxMemberBytes = uint64_t{1} << 32);

// Whole-file helpers. writeFileAtomic writes a temporary file next to `path`, fsyncs it and
// renames it over `path`, so a reader sees the old file or the new one, never a part.
Result<std::string> readWholeFile(const std::string& path, uint64_t maxBytes);
Status writeFileAtomic(const std::string& path, const std::string& bytes);

}  // namespace td

// Zip format: PKWARE APPNOTE 6.3 (local file header 0x04034b50, central directory header
// 0x02014b50, end of central directory 0x06054b50), without Zip64 or encryption.
#include "engine/io/zip_archive.h"

#include <fcntl.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>

namespace td {

namespace {

constexpr uint32_t kLocalSig = 0x04034b50;
constexpr uint32_t kCentralSig = 0x02014b50;
constexpr uint32_t kEndSig = 0x06054b50;
constexpr uint16_t kVersion = 20;  // 2.0: deflate, folders
// 1980-01-01 00:00 in MS-DOS form: the archive's bytes depend on its content only.
constexpr uint16_t kDosTime = 0;
constexpr uint16_t kDosDate = (0 << 9) | (1 << 5) | 1;

void put16(std::string& out, uint16_t v) {
    out.push_back(static_cast<char>(v & 0xff));
    out.push_back(static_cast<char>(v >> 8));
}
void put32(std::string& out, uint32_t v) {
    for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}
uint16_t get16(const std::string& s, size_t at) {
    return static_cast<uint16_t>(static_cast<unsigned char>(s[at]) |
                                 (static_cast<unsigned char>(s[at + 1]) << 8));
}
uint32_t get32(const std::string& s, size_t at) {
    return static_cast<uint32_t>(get16(s, at)) | (static_cast<uint32_t>(get16(s, at + 2)) << 16);
}

uint32_t crc32Of(const std::string& bytes) {
    uLong crc = crc32(0L, Z_NULL, 0);
    const auto* p = reinterpret_cast<const Bytef*>(bytes.data());
    size_t left = bytes.size();
    while (left > 0) {
        const uInt n = static_cast<uInt>(std::min<size_t>(left, 1u << 30));
        crc = crc32(crc, p, n);
        p += n;
        left -= n;
    }
    return static_cast<uint32_t>(crc);
}

Result<std::string> inflateRaw(const std::string& in, uint64_t outBytes, const std::string& what) {
    std::string out(static_cast<size_t>(outBytes), '\0');
    z_stream zs{};
    if (inflateInit2(&zs, -MAX_WBITS) != Z_OK) return err(what + ": cannot start zlib inflate");
    zs.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(in.data()));
    zs.avail_in = static_cast<uInt>(in.size());
    zs.next_out = reinterpret_cast<Bytef*>(out.data());
    zs.avail_out = static_cast<uInt>(out.size());
    const int rc = inflate(&zs, Z_FINISH);
    const uLong produced = zs.total_out;
    inflateEnd(&zs);
    if (rc != Z_STREAM_END || produced != outBytes)
        return err(what + ": deflate data is damaged (inflated " + std::to_string(produced) +
                   " of " + std::to_string(outBytes) + " bytes)");
    return out;
}

}  // namespace

Result<std::string> zipArchiveBytes(const std::vector<ZipMember>& members) {
    if (members.size() > 0xffff) return err("zip: more than 65535 members");
    std::string out;
    std::string central;
    for (const ZipMember& m : members) {
        if (m.name.empty() || m.name.size() > 0xffff)
            return err("zip: member name must have 1 to 65535 characters");
        if (m.bytes.size() >= 0xffffffffull || out.size() + m.bytes.size() >= 0xffffffffull)
            return err("zip: member '" + m.name + "': over 4 GiB (Zip64 is not written)");
        const uint32_t crc = crc32Of(m.bytes);
        const auto size = static_cast<uint32_t>(m.bytes.size());
        const auto offset = static_cast<uint32_t>(out.size());
        put32(out, kLocalSig);
        put16(out, kVersion);
        put16(out, 0);  // flags
        put16(out, 0);  // method: stored
        put16(out, kDosTime);
        put16(out, kDosDate);
        put32(out, crc);
        put32(out, size);  // compressed
        put32(out, size);  // uncompressed
        put16(out, static_cast<uint16_t>(m.name.size()));
        put16(out, 0);  // extra field length
        out += m.name;
        out += m.bytes;

        put32(central, kCentralSig);
        put16(central, (3 << 8) | kVersion);  // made by: Unix, 2.0
        put16(central, kVersion);
        put16(central, 0);
        put16(central, 0);
        put16(central, kDosTime);
        put16(central, kDosDate);
        put32(central, crc);
        put32(central, size);
        put32(central, size);
        put16(central, static_cast<uint16_t>(m.name.size()));
        put16(central, 0);            // extra
        put16(central, 0);            // comment
        put16(central, 0);            // disk number
        put16(central, 0);            // internal attributes
        put32(central, 0644u << 16);  // external attributes: a regular file, rw-r--r--
        put32(central, offset);
        central += m.name;
    }
    if (out.size() + central.size() >= 0xffffffffull)
        return err("zip: archive over 4 GiB (Zip64 is not written)");
    const auto centralOffset = static_cast<uint32_t>(out.size());
    out += central;
    put32(out, kEndSig);
    put16(out, 0);
    put16(out, 0);
    put16(out, static_cast<uint16_t>(members.size()));
    put16(out, static_cast<uint16_t>(members.size()));
    put32(out, static_cast<uint32_t>(central.size()));
    put32(out, centralOffset);
    put16(out, 0);  // comment length
    return out;
}

Result<std::vector<ZipMember>> readZipArchive(const std::string& bytes, const std::string& fileName,
                                              uint64_t maxMemberBytes) {
    const std::string f = fileName + ": ";
    // The end record is the last 22 bytes plus a comment of up to 65535 bytes.
    if (bytes.size() < 22)
        return err(f + "not a zip archive (only " + std::to_string(bytes.size()) + " bytes)");
    size_t end = std::string::npos;
    const size_t lowest = bytes.size() >= 22 + 0xffff ? bytes.size() - 22 - 0xffff : 0;
    for (size_t at = bytes.size() - 22 + 1; at-- > lowest;)
        if (get32(bytes, at) == kEndSig && at + 22 + get16(bytes, at + 20) == bytes.size()) {
            end = at;
            break;
        }
    if (end == std::string::npos)
        return err(f + "not a zip archive (no end-of-central-directory record)");
    if (get16(bytes, end + 4) != 0 || get16(bytes, end + 6) != 0)
        return err(f + "multi-disk zip archives are not supported");
    const uint16_t count = get16(bytes, end + 10);
    const uint32_t centralSize = get32(bytes, end + 12);
    const uint32_t centralOffset = get32(bytes, end + 16);
    if (count == 0xffff || centralOffset == 0xffffffffu)
        return err(f + "Zip64 archives are not supported");
    if (uint64_t{centralOffset} + centralSize > end)
        return err(f + "damaged zip archive (central directory outside the file)");

    std::vector<ZipMember> members;
    size_t at = centralOffset;
    for (uint16_t i = 0; i < count; ++i) {
        if (at + 46 > end || get32(bytes, at) != kCentralSig)
            return err(f + "damaged zip archive (central directory entry " + std::to_string(i) +
                       ")");
        const uint16_t flags = get16(bytes, at + 8);
        const uint16_t method = get16(bytes, at + 10);
        const uint32_t crc = get32(bytes, at + 16);
        const uint32_t packed = get32(bytes, at + 20);
        const uint32_t size = get32(bytes, at + 24);
        const uint16_t nameLen = get16(bytes, at + 28);
        const uint16_t extraLen = get16(bytes, at + 30);
        const uint16_t commentLen = get16(bytes, at + 32);
        const uint32_t local = get32(bytes, at + 42);
        if (at + 46 + nameLen > end)
            return err(f + "damaged zip archive (central directory entry " + std::to_string(i) +
                       ")");
        ZipMember m;
        m.name = bytes.substr(at + 46, nameLen);
        at += 46 + size_t{nameLen} + extraLen + commentLen;
        const std::string what = f + "member '" + m.name + "'";
        if (flags & 1) return err(what + ": encrypted members are not supported");
        if (packed == 0xffffffffu || size == 0xffffffffu || local == 0xffffffffu)
            return err(what + ": Zip64 members are not supported");
        if (size > maxMemberBytes)
            return err(what + ": " + std::to_string(size) +
                       " bytes uncompressed, over the limit of " + std::to_string(maxMemberBytes));
        if (uint64_t{local} + 30 > centralOffset || get32(bytes, local) != kLocalSig)
            return err(what + ": damaged zip archive (no local header at offset " +
                       std::to_string(local) + ")");
        const size_t dataAt =
            size_t{local} + 30 + get16(bytes, local + 26) + get16(bytes, local + 28);
        if (uint64_t{dataAt} + packed > centralOffset)
            return err(what + ": damaged zip archive (data runs past the central directory)");
        const std::string data = bytes.substr(dataAt, packed);
        if (method == 0) {
            if (packed != size) return err(what + ": damaged zip archive (stored sizes differ)");
            m.bytes = data;
        } else if (method == 8) {
            // Deflate expands at most about 1032:1; a larger claim is a damaged (or hostile)
            // header, refused before the output is allocated.
            if (uint64_t{size} > uint64_t{packed} * 1032 + 64)
                return err(what + ": claims " + std::to_string(size) + " bytes from " +
                           std::to_string(packed) + " compressed (more than deflate can expand)");
            TD_ASSIGN_OR_RETURN(m.bytes, inflateRaw(data, size, what));
        } else {
            return err(what + ": compression method " + std::to_string(method) +
                       " is not supported (expected stored or deflate)");
        }
        if (crc32Of(m.bytes) != crc) return err(what + ": CRC-32 mismatch (damaged archive)");
        members.push_back(std::move(m));
    }
    return members;
}

Result<std::string> readWholeFile(const std::string& path, uint64_t maxBytes) {
    std::error_code ec;
    if (!std::filesystem::is_regular_file(path, ec))
        return err(path + ": " +
                   (std::filesystem::exists(path, ec) ? "not a regular file" : "no such file"));
    const uintmax_t size = std::filesystem::file_size(path, ec);
    if (ec) return err(path + ": cannot read its size: " + ec.message());
    if (size > maxBytes)
        return err(path + ": " + std::to_string(size) + " bytes, over the limit of " +
                   std::to_string(maxBytes));
    std::ifstream in(path, std::ios::binary);
    if (!in) return err(path + ": cannot open: " + std::strerror(errno));
    std::string bytes(static_cast<size_t>(size), '\0');
    in.read(bytes.data(), static_cast<std::streamsize>(size));
    if (static_cast<uintmax_t>(in.gcount()) != size) return err(path + ": short read");
    return bytes;
}

Status writeFileAtomic(const std::string& path, const std::string& bytes) {
    const std::string temp = path + ".tmp-" + std::to_string(::getpid());
    const int fd = ::open(temp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) return err(path + ": cannot write: " + std::strerror(errno));
    size_t done = 0;
    int code = 0;
    while (done < bytes.size()) {
        const ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
        if (n < 0) {
            if (errno == EINTR) continue;
            code = errno;
            break;
        }
        done += static_cast<size_t>(n);
    }
    if (code == 0 && ::fsync(fd) != 0) code = errno;
    if (::close(fd) != 0 && code == 0) code = errno;
    if (code == 0 && ::rename(temp.c_str(), path.c_str()) != 0) code = errno;
    if (code != 0) {
        ::unlink(temp.c_str());
        return err(path + ": cannot write: " + std::strerror(code));
    }
    return Status::success();
}

}  // namespace td

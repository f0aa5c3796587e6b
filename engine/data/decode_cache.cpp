// Decoded-source cache (decode_cache.h).
#include "engine/data/decode_cache.h"

#include <dirent.h>
#include <fcntl.h>
#include <pwd.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cctype>
#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <limits>
#include <memory>

#include "engine/data/cache_file.h"
#include "engine/data/pipeline.h"
#include "engine/data/resource_plan.h"

namespace td {
namespace {

constexpr char kMagic[8] = {'T', 'D', 'D', 'E', 'C', 'O', 'D', 'E'};
// Raised whenever the layout or what readIdx returns for the same file changes.
constexpr uint32_t kFormatVersion = 1;
constexpr uint64_t kHeaderHashSeed = 0x6465636f64656864ULL;
constexpr uint64_t kPayloadHashSeed = 0x7061796c6f616468ULL;

// The fixed start of the header; then int64 dims[rank], then the path's bytes; the header's last
// 8 bytes hold the hash of everything before them. Host byte order: the cache is this machine's.
struct EntryHeader {
    char magic[8];
    uint32_t version;
    uint32_t headerBytes;
    uint64_t sourceSize;
    int64_t sourceMtimeNs;
    uint64_t sourceInode;
    uint64_t payloadBytes;
    uint64_t payloadHash;
    uint8_t dtype;
    uint8_t rank;
    uint16_t pathBytes;
    uint32_t reserved;
};
static_assert(sizeof(EntryHeader) == 64);
constexpr size_t kHashOffset = kDecodeCacheHeaderBytes - sizeof(uint64_t);

struct Counters {
    std::atomic<int64_t> hits{0}, decoded{0}, written{0}, rejected{0}, writeFailures{0};
};
Counters& counters() {
    static Counters c;
    return c;
}

// The source file as the entry names it.
struct SourceId {
    std::string path;  // canonical
    uint64_t size = 0;
    int64_t mtimeNs = 0;
    uint64_t inode = 0;
    bool operator==(const SourceId&) const = default;
};

bool statSource(const std::string& canonical, SourceId& id) {
    struct stat st {};
    if (::stat(canonical.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) return false;
    id.path = canonical;
    id.size = static_cast<uint64_t>(st.st_size);
    id.mtimeNs = static_cast<int64_t>(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec;
    id.inode = static_cast<uint64_t>(st.st_ino);
    return true;
}

std::string canonicalPath(const std::string& path) {
    char buf[PATH_MAX];
    if (::realpath(path.c_str(), buf) != nullptr) return buf;
    return {};
}

bool cacheEnabled() {
    const char* v = std::getenv(kDecodeCacheEnv);
    if (!v) return true;
    std::string s;
    for (const char* p = v; *p; ++p)
        s += static_cast<char>(std::tolower(static_cast<unsigned char>(*p)));
    return !(s == "off" || s == "0" || s == "false" || s == "no");
}

bool isAbsolute(const char* p) {
    return p && p[0] == '/';
}

bool isGzip(const std::string& path) {
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return false;
    unsigned char magic[2] = {0, 0};
    const ssize_t got = ::pread(fd, magic, 2, 0);
    ::close(fd);
    return got == 2 && magic[0] == 0x1f && magic[1] == 0x8b;
}

std::string hex16(uint64_t v) {
    char buf[17];
    std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(v));
    return buf;
}

uint64_t headerHash(const unsigned char* header) {
    return hashBytes(header, kHashOffset, kHeaderHashSeed);
}

// Checks a header read from an entry (magic, version, its hash, the extent of its shape and path)
// and fills `h` and `path`; otherwise says why it is not one.
bool parseHeader(const unsigned char* header, EntryHeader& h, std::string& path, std::string& why) {
    std::memcpy(&h, header, sizeof h);
    uint64_t storedHash;
    std::memcpy(&storedHash, header + kHashOffset, sizeof storedHash);
    if (std::memcmp(h.magic, kMagic, sizeof kMagic) != 0) {
        why = "not a decoded-source cache entry";
        return false;
    }
    if (h.version != kFormatVersion || h.headerBytes != kDecodeCacheHeaderBytes) {
        why = "written by another format version";
        return false;
    }
    if (storedHash != headerHash(header)) {
        why = "its header is damaged (hash mismatch)";
        return false;
    }
    // A header whose hash checks is the one that was written; the range checks stay anyway, so
    // that nothing read from a file can lead outside it.
    const size_t dimsEnd = sizeof(EntryHeader) + size_t{h.rank} * sizeof(int64_t);
    if (h.rank == 0 || dimsEnd + h.pathBytes > kHashOffset) {
        why = "its header is damaged (shape)";
        return false;
    }
    path.assign(reinterpret_cast<const char*>(header + dimsEnd), h.pathBytes);
    return true;
}

enum class Lookup { Hit, Absent, Rejected, Unusable };

// The entry's array, when the entry is whole and names `id`. Rejected: stale or damaged (`why`
// says which); Unusable: sound, but over the memory budget (the source's reader then reports it).
//
// The array is not copied: the tensor is a private mapping of the entry's payload (page aligned at
// kDecodeCacheHeaderBytes), whose pages are the page cache's own until someone writes to them
// (then the writer gets a copy; the file never changes). Entries are only ever replaced by a
// rename, never rewritten in place, so a mapped entry keeps its contents while it is used.
Lookup readEntry(const std::string& entry, const SourceId& id, Tensor& out, std::string& why) {
    const int fd = ::open(entry.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return Lookup::Absent;
    struct stat st {};
    if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) ||
        static_cast<uint64_t>(st.st_size) < kDecodeCacheHeaderBytes) {
        ::close(fd);
        why = "shorter than its header";
        return Lookup::Rejected;
    }
    const auto fileBytes = static_cast<size_t>(st.st_size);
    void* mapped = ::mmap(nullptr, fileBytes, PROT_READ | PROT_WRITE, MAP_PRIVATE, fd, 0);
    ::close(fd);
    if (mapped == MAP_FAILED) {
        why = std::string("cannot be mapped: ") + std::strerror(errno);
        return Lookup::Rejected;
    }
    std::shared_ptr<void> mapping(mapped, [fileBytes](void* p) { ::munmap(p, fileBytes); });
    const auto* header = static_cast<const unsigned char*>(mapped);

    EntryHeader h;
    std::string path;
    if (!parseHeader(header, h, path, why)) return Lookup::Rejected;
    if (path != id.path || h.sourceSize != id.size || h.sourceMtimeNs != id.mtimeNs ||
        h.sourceInode != id.inode) {
        why = "stale: the source file changed since it was written";
        return Lookup::Rejected;
    }
    const auto dtype = static_cast<DType>(h.dtype);
    if (dtype != DType::U8 && dtype != DType::I32 && dtype != DType::F32) {
        why = "its header is damaged (dtype)";
        return Lookup::Rejected;
    }
    Shape shape(h.rank);
    std::memcpy(shape.data(), header + sizeof(EntryHeader), size_t{h.rank} * sizeof(int64_t));
    int64_t count = 1;
    for (const int64_t d : shape) {
        if (d <= 0 || count > (int64_t{1} << 40) / d) {
            why = "its header is damaged (dimensions)";
            return Lookup::Rejected;
        }
        count *= d;
    }
    const uint64_t payloadBytes = static_cast<uint64_t>(count) * dtypeSize(dtype);
    if (payloadBytes != h.payloadBytes || fileBytes != kDecodeCacheHeaderBytes + payloadBytes) {
        why = "cut short or overlong: " + std::to_string(fileBytes) + " bytes for a payload of " +
              std::to_string(h.payloadBytes);
        return Lookup::Rejected;
    }
    if (!checkFileFits(id.path, "the decoded array", static_cast<double>(payloadBytes)).ok()) {
        return Lookup::Unusable;
    }
    auto* payload = static_cast<unsigned char*>(mapped) + kDecodeCacheHeaderBytes;
#if defined(MADV_POPULATE_READ)
    // One call maps every page (read-only, shared with the page cache) instead of a fault per few
    // pages during the hash below; kernels before 5.14 refuse it, and the faults then do the same.
    ::madvise(payload, payloadBytes, MADV_POPULATE_READ);
#endif
    if (hashBytes(payload, payloadBytes, kPayloadHashSeed) != h.payloadHash) {
        why = "its array is damaged (hash mismatch)";
        return Lookup::Rejected;
    }
    out = Tensor::wrap(dtype, std::move(shape), std::move(mapping), payload);
    return Lookup::Hit;
}

// Creates `dir` and its missing parents (mode 0700, as the XDG spec asks of the cache folder).
bool makeDirs(const std::string& dir, std::string& why) {
    for (size_t pos = 1; pos <= dir.size(); ++pos) {
        if (pos != dir.size() && dir[pos] != '/') continue;
        const std::string prefix = dir.substr(0, pos);
        if (::mkdir(prefix.c_str(), 0700) != 0 && errno != EEXIST) {
            why = "cannot create " + prefix + ": " + std::strerror(errno);
            return false;
        }
    }
    struct stat st {};
    if (::stat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
        why = dir + " is not a folder";
        return false;
    }
    return true;
}

// The bytes an entry may still write under the fault hook (unlimited without it).
uint64_t faultBudget() {
    const char* v = std::getenv(kDecodeCacheFaultBytesEnv);
    if (!v || !*v) return std::numeric_limits<uint64_t>::max();
    char* end = nullptr;
    const unsigned long long n = std::strtoull(v, &end, 10);
    return end && *end == '\0' ? n : std::numeric_limits<uint64_t>::max();
}

// Writes all of [data, data + bytes); false with errno set on a failure.
bool writeAll(int fd, const void* data, size_t bytes, uint64_t& budget) {
    const auto* p = static_cast<const unsigned char*>(data);
    while (bytes > 0) {
        size_t chunk = std::min<size_t>(bytes, size_t{1} << 30);
        if (budget == 0) {
            errno = ENOSPC;
            return false;
        }
        chunk = static_cast<size_t>(std::min<uint64_t>(chunk, budget));
        const ssize_t put = ::write(fd, p, chunk);
        if (put < 0 && errno == EINTR) continue;
        if (put <= 0) {
            if (put == 0) errno = ENOSPC;
            return false;
        }
        p += put;
        bytes -= static_cast<size_t>(put);
        budget -= static_cast<uint64_t>(put);
    }
    return true;
}

// Writes the entry for `id` holding `t`: temporary file, fsync, rename. An error says why.
Status writeEntry(const std::string& dir, const std::string& entry, const SourceId& id,
                  const Tensor& t) {
    unsigned char header[kDecodeCacheHeaderBytes] = {};
    const size_t dimsEnd = sizeof(EntryHeader) + t.rank() * sizeof(int64_t);
    if (t.rank() == 0 || t.rank() > 255 || dimsEnd + id.path.size() > kHashOffset) {
        return err("the path or the shape does not fit an entry's header");
    }
    EntryHeader h{};
    std::memcpy(h.magic, kMagic, sizeof kMagic);
    h.version = kFormatVersion;
    h.headerBytes = kDecodeCacheHeaderBytes;
    h.sourceSize = id.size;
    h.sourceMtimeNs = id.mtimeNs;
    h.sourceInode = id.inode;
    h.payloadBytes = t.bytes();
    h.payloadHash = hashBytes(t.raw(), t.bytes(), kPayloadHashSeed);
    h.dtype = static_cast<uint8_t>(t.dtype());
    h.rank = static_cast<uint8_t>(t.rank());
    h.pathBytes = static_cast<uint16_t>(id.path.size());
    std::memcpy(header, &h, sizeof h);
    std::memcpy(header + sizeof h, t.shape().data(), t.rank() * sizeof(int64_t));
    std::memcpy(header + dimsEnd, id.path.data(), id.path.size());
    const uint64_t hh = headerHash(header);
    std::memcpy(header + kHashOffset, &hh, sizeof hh);

    std::string why;
    if (!makeDirs(dir, why)) return err(why);
    static std::atomic<uint64_t> serial{0};
    const std::string temp =
        entry + ".tmp-" + std::to_string(::getpid()) + "-" + std::to_string(serial.fetch_add(1));
    const int fd = ::open(temp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd < 0) return err("cannot create " + temp + ": " + std::strerror(errno));
    uint64_t budget = faultBudget();
    int code = 0;
    if (!writeAll(fd, header, sizeof header, budget) || !writeAll(fd, t.raw(), t.bytes(), budget) ||
        ::fsync(fd) != 0) {
        code = errno;
    }
    if (::close(fd) != 0 && code == 0) code = errno;
    if (code == 0 && ::rename(temp.c_str(), entry.c_str()) != 0) code = errno;
    if (code != 0) {
        ::unlink(temp.c_str());
        return err("cannot write " + entry + ": " + std::strerror(code));
    }
    // The rename itself survives a crash once the folder is synced; without it a later run finds
    // no entry (or the previous one) and decodes again.
    if (const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC); dfd >= 0) {
        ::fsync(dfd);
        ::close(dfd);
    }
    return {};
}

// The source path an entry names, or "" when it is not a whole entry header.
std::string entrySource(const std::string& entry) {
    const int fd = ::open(entry.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return {};
    unsigned char header[kDecodeCacheHeaderBytes];
    const ssize_t got = ::pread(fd, header, sizeof header, 0);
    ::close(fd);
    if (got != static_cast<ssize_t>(sizeof header)) return {};
    EntryHeader h;
    std::string path, why;
    return parseHeader(header, h, path, why) ? path : std::string();
}

// Removes the entries whose source file no longer exists (a dataset deleted, a temporary folder
// cleaned up) and temporary files older than an hour (a writer that was killed), so the folder
// holds at most one entry per existing source. Runs after an entry was written, i.e. on the runs
// that decode anyway.
void pruneFolder(const std::string& dir) {
    DIR* d = ::opendir(dir.c_str());
    if (!d) return;
    const time_t now = std::time(nullptr);
    while (const dirent* e = ::readdir(d)) {
        const std::string name = e->d_name;
        const std::string path = dir + "/" + name;
        if (name.find(".idx.tmp-") != std::string::npos) {
            struct stat st {};
            if (::stat(path.c_str(), &st) == 0 && now - st.st_mtime > 3600) ::unlink(path.c_str());
        } else if (name.size() > 4 && name.compare(name.size() - 4, 4, ".idx") == 0) {
            const std::string source = entrySource(path);
            struct stat st {};
            if (!source.empty() && ::stat(source.c_str(), &st) != 0 && errno == ENOENT) {
                ::unlink(path.c_str());
            }
        }
    }
    ::closedir(d);
}

}  // namespace

DecodeCacheStats decodeCacheStats() {
    const Counters& c = counters();
    return {c.hits.load(), c.decoded.load(), c.written.load(), c.rejected.load(),
            c.writeFailures.load()};
}

std::string decodeCacheDir() {
    if (!cacheEnabled()) return {};
    std::string base;
    if (const char* xdg = std::getenv("XDG_CACHE_HOME"); isAbsolute(xdg)) {
        base = xdg;
    } else if (const char* home = std::getenv("HOME"); isAbsolute(home)) {
        base = std::string(home) + "/.cache";
    } else {
        struct passwd pw {};
        struct passwd* found = nullptr;
        char buf[4096];
        if (::getpwuid_r(::getuid(), &pw, buf, sizeof buf, &found) != 0 || !found ||
            !isAbsolute(pw.pw_dir)) {
            return {};
        }
        base = std::string(pw.pw_dir) + "/.cache";
    }
    while (base.size() > 1 && base.back() == '/') base.pop_back();
    return base + "/traindeck/decoded";
}

std::string decodeCacheEntry(const std::string& dir, const std::string& source) {
    std::string canonical = canonicalPath(source);
    if (canonical.empty()) canonical = source;
    return dir + "/" + hex16(hashBytes(canonical.data(), canonical.size(), 0)) + ".idx";
}

Result<Tensor> readIdxCached(const std::string& path, std::vector<std::string>* notes) {
    const auto note = [&](std::string text) {
        if (notes) notes->push_back("decoded-source cache: " + std::move(text));
    };
    const std::string dir = decodeCacheDir();
    const std::string canonical = canonicalPath(path);
    SourceId before;
    if (!isGzip(path) || canonical.empty() || !statSource(canonical, before)) return readIdx(path);
    if (dir.empty()) {
        ++counters().decoded;
        return readIdx(path);
    }
    const std::string entry = decodeCacheEntry(dir, canonical);
    Tensor cached;
    std::string why;
    switch (readEntry(entry, before, cached, why)) {
        case Lookup::Hit:
            ++counters().hits;
            return cached;
        case Lookup::Rejected:
            ++counters().rejected;
            ::unlink(entry.c_str());
            // A stale entry is what a changed dataset leaves behind; damage is worth a line.
            if (why.rfind("stale", 0) != 0) note(entry + ": " + why + "; decoding " + path);
            break;
        case Lookup::Absent:
        case Lookup::Unusable:
            break;
    }

    ++counters().decoded;
    Result<Tensor> decoded = readIdx(path);
    if (!decoded.ok()) return decoded;
    // A source rewritten while it was read would leave an entry that names the new file but holds
    // the old array: such an array is used once and not kept.
    SourceId after;
    if (!statSource(canonical, after) || !(after == before)) return decoded;
    if (Status s = writeEntry(dir, entry, before, *decoded); s.ok()) {
        ++counters().written;
        pruneFolder(dir);
    } else {
        ++counters().writeFailures;
        note(s.error() + "; " + path + " will be decoded again next time");
    }
    return decoded;
}

}  // namespace td

// TFRecord files and tf.train.Example records, read and written without TensorFlow or a protobuf
// library.
//
// A TFRecord file is a sequence of records, each framed as
//     uint64 length (little-endian), uint32 masked CRC-32C of those 8 bytes,
//     `length` data bytes,           uint32 masked CRC-32C of the data,
// where masked(crc) = ((crc >> 15) | (crc << 17)) + 0xa282ead8. With compression "GZIP" the whole
// file is one gzip stream (or several concatenated members) of that sequence: it is inflated once,
// streaming, into an unlinked temporary file, so records are read by offset as in a plain file.
//
// A record is usually a serialized tf.train.Example:
//     Example  { Features features = 1; }
//     Features { map<string, Feature> feature = 1; }   (entry: string key = 1; Feature value = 2)
//     Feature  { oneof kind { BytesList bytes_list = 1; FloatList float_list = 2;
//                             Int64List int64_list = 3; } }
//     BytesList { repeated bytes value = 1; }  FloatList { repeated float value = 1 [packed]; }
//     Int64List { repeated int64 value = 1 [packed]; }
// parseExample decodes it as protobuf does: packed and unpacked repeated scalars both accepted,
// unknown fields skipped by wire type, a repeated embedded message merged into the earlier one
// (so the last oneof kind set wins), a repeated map key replacing the earlier entry.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "engine/core/result.h"

namespace td {

// CRC-32C (Castagnoli, reflected polynomial 0x82F63B78), continuing from `crc` (the CRC of the
// bytes before `data`; 0 to start): crc32c("123456789") == 0xE3069283. Uses the SSE4.2 crc32
// instruction where the CPU has it, else slicing-by-8 tables.
uint32_t crc32c(const void* data, size_t n, uint32_t crc = 0);
// The table method alone (the same values; for tests and CPUs without SSE4.2).
uint32_t crc32cSoftware(const void* data, size_t n, uint32_t crc = 0);
// TFRecord's mask of a CRC: ((crc >> 15) | (crc << 17)) + 0xa282ead8.
uint32_t maskCrc32c(uint32_t crc);
// maskCrc32c(crc32c(data, n)).
uint32_t maskedCrc32c(const void* data, size_t n);

// The largest record data a reader accepts (1 GiB); a longer length field is an error.
inline constexpr uint64_t kTfRecordMaxLength = uint64_t(1) << 30;
// Length field, its CRC, and the data's CRC: the bytes a record has besides its data.
inline constexpr int64_t kTfRecordHeaderBytes = 12;
inline constexpr int64_t kTfRecordOverheadBytes = 16;

// A TFRecord file opened for reading. Errors name the file (and, for a record, its offset).
class TfRecordFile {
  public:
    // compression: "" or "NONE" (uncompressed) or "GZIP"; anything else is an error naming the
    // valid values. A GZIP file is inflated here, in full, into an unlinked temporary file in
    // $TMPDIR (or /tmp); a corrupt or truncated gzip stream is an error naming the file.
    static Result<std::unique_ptr<TfRecordFile>> open(const std::string& path,
                                                      const std::string& compression);

    // Walks every record once in file order, checking the framing and both CRCs, and calls
    // onRecord(offset, data): `offset` is that of the record's first byte (its length field) in
    // the (inflated) file, `data` a view valid only during the call. Reads through a bounded
    // buffer (one record of up to kTfRecordMaxLength at most). An empty file has no records. The
    // first error (the framing's, or one onRecord returns, passed on as it is) ends the walk.
    Status scan(const std::function<Status(int64_t offset, std::string_view data)>& onRecord) const;
    // The same, where damage is not an error but reported: a record whose data CRC does not match
    // goes to onDamage(offset, error, false) and the walk goes on with the next record (its length
    // checked); a framing error (a length CRC mismatch, a length over the limit, a record or
    // header cut short) leaves the rest of the file unreadable: onDamage(offset, error, true), and
    // the walk ends without an error. Read errors (I/O) and onRecord's errors still end it.
    Status scan(const std::function<Status(int64_t offset, std::string_view data)>& onRecord,
                const std::function<void(int64_t offset, const std::string& error, bool rest)>&
                    onDamage) const;

    // Reads the record whose length field is at `offset` into `out` (resized to the data),
    // checking both CRCs. Thread-safe: concurrent calls on one file are fine (pread).
    Status readRecord(int64_t offset, std::string& out) const;

    const std::string& path() const { return path_; }
    // Bytes of the file as records are read from it (after inflating, for GZIP).
    int64_t size() const { return size_; }
    bool gzip() const { return gzip_; }

    ~TfRecordFile();
    TfRecordFile(const TfRecordFile&) = delete;
    TfRecordFile& operator=(const TfRecordFile&) = delete;

  private:
    TfRecordFile(std::string path, int fd, int64_t size, bool gzip)
        : path_(std::move(path)), fd_(fd), size_(size), gzip_(gzip) {}
    // "record at offset N" (and ", of the inflated data" for GZIP), for errors.
    std::string where(int64_t offset) const;
    // Checks the 12 header bytes of the record at `offset` and returns its data length.
    Result<uint64_t> checkHeader(int64_t offset, const char* header) const;
    Status checkData(int64_t offset, const char* data, uint64_t length) const;
    Status readAt(int64_t offset, char* dst, size_t n) const;

    std::string path_;
    int fd_ = -1;
    int64_t size_ = 0;
    bool gzip_ = false;
};

// One feature of a tf.train.Example.
struct ExampleFeature {
    enum class Kind { Bytes, Float, Int64 } kind = Kind::Bytes;
    std::vector<std::string_view> bytes;  // views into the record
    std::vector<float> floats;
    std::vector<int64_t> ints;
    // A Feature with no kind set (an empty Feature message) parses as Kind::Bytes with no values,
    // as protobuf leaves it; TensorFlow treats it as an empty list of whatever type is asked.
};

using ExampleFeatures = std::map<std::string, ExampleFeature, std::less<>>;

// Parses one serialized Example. Only the features named in `wanted` are decoded and returned
// (the others are skipped without copying); a wanted feature the Example lacks is left out of
// the map, not an error. Malformed bytes (a truncated varint, a length past the end, an invalid
// wire type or field number, a packed float list whose length is not a multiple of 4) are an
// error that says what and at which byte of the record (the caller adds the file and offset).
Result<ExampleFeatures> parseExample(std::string_view record,
                                     const std::vector<std::string>& wanted);

// Writing, for tests and tools: one record's framing around `data`, appended to `out`.
void appendTfRecord(std::string& out, std::string_view data);
// An Example with these features (floats and ints packed; an empty list as an empty list
// message, so the feature keeps its kind).
std::string serializeExample(const ExampleFeatures& features);

}  // namespace td

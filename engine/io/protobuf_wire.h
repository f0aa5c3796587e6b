// Protocol Buffers wire format, write side only: enough to serialize ONNX's messages without a
// protobuf library. A message is the concatenation of its fields; a field is a key
// (field_number << 3 | wire_type) as a varint, then its value: a varint (wire type 0), 4 bytes
// little-endian (5, float) or a varint length and the bytes (2: strings, bytes, nested
// messages, packed repeated scalars).
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

namespace td::proto {

class Writer {
  public:
    // int32/int64/uint64/bool/enum fields (negative int64 as its two's complement, 10 bytes).
    void varint(int field, uint64_t value) {
        key(field, 0);
        raw(value);
    }
    void varintSigned(int field, int64_t value) { varint(field, static_cast<uint64_t>(value)); }
    void float32(int field, float value) {
        key(field, 5);
        uint32_t bits;
        std::memcpy(&bits, &value, 4);
        for (int i = 0; i < 4; ++i) buf_.push_back(static_cast<char>((bits >> (8 * i)) & 0xff));
    }
    // string, bytes, or a nested message's serialized bytes.
    void bytes(int field, std::string_view value) {
        key(field, 2);
        raw(value.size());
        buf_.append(value.data(), value.size());
    }
    void message(int field, const Writer& nested) { bytes(field, nested.buf_); }
    // repeated int64, packed (the proto3 default; proto2 parsers accept it too).
    void packedInt64(int field, const std::vector<int64_t>& values) {
        Writer packed;
        for (int64_t v : values) packed.raw(static_cast<uint64_t>(v));
        bytes(field, packed.buf_);
    }

    const std::string& data() const { return buf_; }

  private:
    void key(int field, int wireType) {
        raw((static_cast<uint64_t>(field) << 3) | static_cast<uint64_t>(wireType));
    }
    void raw(uint64_t v) {
        while (v >= 0x80) {
            buf_.push_back(static_cast<char>((v & 0x7f) | 0x80));
            v >>= 7;
        }
        buf_.push_back(static_cast<char>(v));
    }
    std::string buf_;
};

}  // namespace td::proto

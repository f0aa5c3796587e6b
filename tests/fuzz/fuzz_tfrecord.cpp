// TFRecord reader and tf.train.Example decoder: any bytes, as a plain file or (when they start
// with gzip's magic) a GZIP one, give records or an error naming the file, never a crash; every
// record scan delivers reads back the same by its offset; parseExample on each record, and on the
// whole input (so mutations reach the decoder without passing the framing's CRCs), gives features
// whose byte views lie inside the record, or an error that says it is malformed.
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "engine/data/tfrecord.h"
#include "tests/fuzz/mem_file.h"

namespace {

void parse(std::string_view record) {
    static const std::vector<std::string> wanted = {"", "a", "b", "image", "label"};
    auto r = td::parseExample(record, wanted);
    if (!r.ok()) {
        if (r.error().find("malformed tf.train.Example") != 0)
            td::fuzz::fail("Example error does not say it is malformed: " + r.error());
        return;
    }
    for (const auto& [name, f] : r.value()) {
        bool isWanted = false;
        for (const std::string& w : wanted) isWanted = isWanted || w == name;
        if (!isWanted) td::fuzz::fail("parseExample returned an unwanted feature: " + name);
        for (const std::string_view b : f.bytes)
            if (b.data() < record.data() || b.data() + b.size() > record.data() + record.size())
                td::fuzz::fail("a bytes value outside the record");
    }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    static td::fuzz::MemFile file;
    const std::string& path = file.write(data, size);
    parse(std::string_view(reinterpret_cast<const char*>(data), size));
    const bool gzip = size >= 2 && data[0] == 0x1f && data[1] == 0x8b;
    auto f = td::TfRecordFile::open(path, gzip ? "GZIP" : "");
    if (!f.ok()) {
        if (f.error().find(path) != 0)
            td::fuzz::fail("TFRecord open error does not start with the path: " + f.error());
        return 0;
    }
    const td::TfRecordFile& tf = *f.value();
    int64_t next = 0;
    std::string again;
    const td::Status s = tf.scan([&](int64_t offset, std::string_view record) -> td::Status {
        if (offset != next) td::fuzz::fail("TFRecord offsets not contiguous");
        next = offset + td::kTfRecordOverheadBytes + static_cast<int64_t>(record.size());
        if (next > tf.size()) td::fuzz::fail("TFRecord record past the end of the file");
        const td::Status r = tf.readRecord(offset, again);
        if (!r.ok() || again != record)
            td::fuzz::fail("readRecord differs from scan at offset " + std::to_string(offset));
        parse(record);
        return td::Status::success();
    });
    if (s.ok() && next != tf.size()) td::fuzz::fail("TFRecord scan stopped before the end");
    if (!s.ok() && s.error().find(path) != 0)
        td::fuzz::fail("TFRecord error does not start with the path: " + s.error());
    return 0;
}

// Checkpoint reader: any bytes, as a whole file and as a payload behind a valid header (so the
// decoder is reached past the checksums), give a state or an error naming the file, never a
// crash or an allocation beyond the file's size.
#include <cstdint>
#include <string_view>

#include "engine/train/checkpoint.h"
#include "tests/fuzz/mem_file.h"

namespace {

void check(td::fuzz::MemFile& file, const uint8_t* data, size_t size) {
    const std::string& path = file.write(data, size);
    auto r = td::readCheckpoint(path);
    if (r.ok()) {
        for (const td::NamedTensor& p : r.value().params)
            if (p.value.bytes() !=
                static_cast<size_t>(p.value.size()) * td::dtypeSize(p.value.dtype()))
                td::fuzz::fail("checkpoint tensor size");
    } else if (r.error().find(path) != 0) {
        td::fuzz::fail("checkpoint error does not start with the path: " + r.error());
    }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    static td::fuzz::MemFile file;
    check(file, data, size);
    const std::string wrapped =
        td::checkpointFileBytes(std::string_view(reinterpret_cast<const char*>(data), size));
    check(file, reinterpret_cast<const uint8_t*>(wrapped.data()), wrapped.size());
    return 0;
}

// CSV reader: any bytes give features + labels or an error naming the file, never a crash; a
// result has one label per feature row.
#include <cstdint>

#include "engine/data/pipeline.h"
#include "tests/fuzz/mem_file.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    static td::fuzz::MemFile file;
    const std::string& path = file.write(data, size);
    auto r = td::readCsv(path, "label");
    if (r.ok()) {
        const td::CsvData& d = r.value();
        if (d.x.shape().size() != 2 || d.x.shape()[0] < 1) td::fuzz::fail("CSV features shape");
        if (d.y.shape()[0] != d.x.shape()[0]) td::fuzz::fail("CSV label count != row count");
        if (d.x.shape()[1] != static_cast<int64_t>(d.featureNames.size())) {
            td::fuzz::fail("CSV feature count != feature names");
        }
    } else if (r.error().find(path) != 0) {
        td::fuzz::fail("CSV error does not start with the path: " + r.error());
    }
    return 0;
}

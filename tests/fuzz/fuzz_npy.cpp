// .npy reader: any bytes give a tensor or an error naming the file, never a crash.
#include <cstdint>

#include "engine/data/pipeline.h"
#include "tests/fuzz/mem_file.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    static td::fuzz::MemFile file;
    const std::string& path = file.write(data, size);
    auto r = td::readNpy(path);
    if (r.ok()) {
        const td::Tensor& t = r.value();
        if (t.size() != td::numElements(t.shape())) td::fuzz::fail("NPY element count");
    } else if (r.error().find(path) != 0) {
        td::fuzz::fail("NPY error does not start with the path: " + r.error());
    }
    return 0;
}

// Keras 3 .keras reader (zip, HDF5 weights, config.json): any bytes give a model with weights or
// an error, never a crash or an exception; an archive that parses is written back out, and that
// file parses to the same model and the same weights.
// Damaged HDF5 metadata can make libhdf5 itself try to allocate what a header claims (its
// metadata cache, before TrainDeck sees a value); the fuzzer's malloc limit reports those as
// out-of-memory findings (run.sh ignores them), and the library returns an error without it.
#include <cstdint>
#include <cstring>
#include <string>

#include "engine/io/keras_archive.h"
#include "tests/fuzz/mem_file.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    const std::string bytes(reinterpret_cast<const char*>(data), size);
    auto r = td::parseKerasArchive(bytes, "fuzz.keras");
    if (!r.ok()) return 0;
    auto written = td::kerasArchiveBytes(r.value().weights);
    if (!written.ok()) td::fuzz::fail("parsed archive does not write: " + written.error());
    auto again = td::parseKerasArchive(written.value(), "again.keras");
    if (!again.ok()) td::fuzz::fail("written archive does not parse: " + again.error());
    if (!(again.value().weights.model == r.value().weights.model))
        td::fuzz::fail("round trip changes the model");
    for (const auto& [name, t] : r.value().weights.params) {
        const auto it = again.value().weights.params.find(name);
        if (it == again.value().weights.params.end() || it->second.shape() != t.shape() ||
            std::memcmp(it->second.raw(), t.raw(), t.bytes()) != 0)
            td::fuzz::fail("round trip changes weights '" + name + "'");
    }
    return 0;
}

// Keras model.to_json() reader: any text gives a model or an error, never a crash or an
// exception; a parsed model written back out parses again and writes the same text.
#include <cstdint>
#include <string>

#include "engine/io/project.h"
#include "tests/fuzz/mem_file.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    const std::string text(reinterpret_cast<const char*>(data), size);
    auto r = td::modelFromKerasJson(text);
    if (!r.ok()) return 0;
    const std::string written = td::modelToKerasJson(r.value());
    auto again = td::modelFromKerasJson(written);
    if (!again.ok()) td::fuzz::fail("written model does not parse: " + again.error());
    if (td::modelToKerasJson(again.value()) != written) td::fuzz::fail("round trip changes model");
    return 0;
}

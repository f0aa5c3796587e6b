// Project file parser: any text gives a Project or an error, never a crash or an exception; a
// parsed project written back out parses again to an equal project.
#include <cstdint>
#include <string>

#include "engine/io/project.h"
#include "tests/fuzz/mem_file.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    const std::string text(reinterpret_cast<const char*>(data), size);
    auto r = td::parseProject(text, "fuzz.json");
    if (!r.ok()) return 0;
    const std::string written = td::projectToJson(r.value());
    auto again = td::parseProject(written, "fuzz.json");
    if (!again.ok()) td::fuzz::fail("written project does not parse: " + again.error());
    const std::string diff = td::projectDifference(r.value(), again.value());
    if (!diff.empty()) td::fuzz::fail("round trip changes " + diff);
    return 0;
}

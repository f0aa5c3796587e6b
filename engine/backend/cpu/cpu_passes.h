// The CPU device's own passes: the choices and rewrites that make a LoweredProgram's instructions
// a fast CpuProgram (cpu_device.cpp), each named so that a project's "disabled_passes" (the CLI's
// `--disable-pass NAME`) turns it off, for a measurement or to isolate a fault. Two stages:
// - choices that the translation of each instruction consults (how a product splits, which
//   kernel may run it): asked whether they are on, they count each place they applied;
// - rewrites of the translated program, run after it in the table's order by the PassRunner,
//   each returning how many places it changed.
// A pass turned off leaves the plain form (a whole product on oneDNN, an instruction on its own),
// equal to the default bit for bit or up to the order of additions. The graph layer cannot
// include this header: graph/passes.cpp keeps the same names (cpuPassNames) for checkPassNames,
// and the first PassRunner checks that both lists agree.
#pragma once

#include <array>
#include <cstdint>
#include <set>
#include <string>
#include <vector>

#include "engine/backend/backend.h"
#include "engine/core/result.h"

namespace td::cpu {

enum class Pass : uint8_t {
    // Choices made while translating.
    SkipZeros,
    SoloPieces,
    TeamPieces,
    SplitK,
    // Rewrites, in the order they run.
    NarrowKernel,
    ShareNormSums,
};
constexpr size_t kPassCount = 6;

enum class PassStage : uint8_t { Choice, Rewrite };

struct PassInfo {
    Pass pass;
    const char* name;
    PassStage stage;
    const char* what;  // one line
};

// Every pass in the order it acts (the enum's).
const std::array<PassInfo, kPassCount>& passTable();
const PassInfo& passInfo(Pass p);

// The passes of one program's compile: which are on, and what each did.
class PassRunner {
  public:
    // `off`: the names turned off (LoweredProgram::passesOff); other names there are the graph
    // compiler's and are ignored.
    explicit PassRunner(const std::set<std::string>& off);
    bool enabled(Pass p) const { return !records_[index(p)].disabled; }
    // A choice applied at `places` more places.
    void note(Pass p, int64_t places = 1);
    // Runs a rewrite unless it is turned off: `rewrite()` returns the places it changed. Rewrites
    // run in the table's order, each once.
    template <class F>
    void run(Pass p, F&& rewrite) {
        const size_t i = index(p);
        TD_ASSERT(passTable()[i].stage == PassStage::Rewrite && (next_ <= i));
        next_ = i + 1;
        if (records_[i].disabled) return;
        records_[i].changed += rewrite();
    }
    const std::vector<BackendPassRecord>& records() const { return records_; }

  private:
    static size_t index(Pass p) { return static_cast<size_t>(p); }
    std::vector<BackendPassRecord> records_;
    size_t next_ = 0;  // the first rewrite that may still run
};

}  // namespace td::cpu

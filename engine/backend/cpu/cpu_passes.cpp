#include "engine/backend/cpu/cpu_passes.h"

#include "engine/graph/passes.h"

namespace td::cpu {

const std::array<PassInfo, kPassCount>& passTable() {
    using enum PassStage;
    static const std::array<PassInfo, kPassCount> table{{
        {Pass::SkipZeros, "cpu_skip_zeros", Choice,
         "products in pieces may skip their input's zeros (judged on each run's batch)"},
        {Pass::SoloPieces, "cpu_solo_pieces", Choice,
         "a one-thread device runs those products in two-thread pieces, in turn"},
        {Pass::TeamPieces, "cpu_team_pieces", Choice,
         "a step on the OpenMP team splits those weight gradients into row pieces"},
        {Pass::SplitK, "cpu_split_k", Choice,
         "a small batch's forward product splits along K, each thread its weight rows"},
        {Pass::NarrowKernel, "cpu_narrow_kernel", Rewrite,
         "narrow products and a narrow layer's input gradient on own kernels, not oneDNN"},
        {Pass::ShareNormSums, "cpu_share_norm_sums", Rewrite,
         "BatchNormalization's gamma and beta gradients from the sums its input gradient made"},
    }};
    return table;
}

const PassInfo& passInfo(Pass p) {
    return passTable()[static_cast<size_t>(p)];
}

PassRunner::PassRunner(const std::set<std::string>& off) {
    // The table follows the enum, and graph/passes.cpp knows the same names in the same order.
    static const bool agree = [] {
        const std::vector<std::string>& names = cpuPassNames();
        if (names.size() != kPassCount) return false;
        for (size_t i = 0; i < kPassCount; ++i)
            if (static_cast<size_t>(passTable()[i].pass) != i || names[i] != passTable()[i].name)
                return false;
        return true;
    }();
    TD_ASSERT(agree);
    for (const PassInfo& p : passTable()) {
        BackendPassRecord r;
        r.name = p.name;
        r.what = p.what;
        r.disabled = off.count(p.name) != 0;
        records_.push_back(std::move(r));
    }
}

void PassRunner::note(Pass p, int64_t places) {
    BackendPassRecord& r = records_[index(p)];
    TD_ASSERT(!r.disabled);
    r.changed += places;
}

}  // namespace td::cpu

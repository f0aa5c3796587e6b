// Runs a fuzz target's LLVMFuzzerTestOneInput on every file given on the command line and every
// file under the folders given there (its corpus and the crash inputs found so far), so ordinary
// builds keep replaying them. A crash input that regresses crashes or trips a sanitizer here. Fails
// when no input was found, so a moved corpus cannot pass silently.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include <sys/resource.h>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

// The fuzzers ran with a 512 MiB allocation limit, so that a reader allocating whatever a short
// file's header claims counted as a crash; replays keep that limit.
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define TD_REPLAY_SANITIZED 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define TD_REPLAY_SANITIZED 1
#endif
#endif
constexpr size_t kMemoryLimitMb = 512;
#if defined(TD_REPLAY_SANITIZED)
extern "C" const char* __asan_default_options() {
    return "max_allocation_size_mb=512";
}
#endif

int main(int argc, char** argv) {
    namespace fs = std::filesystem;
#if !defined(TD_REPLAY_SANITIZED)
    // Sanitizers reserve terabytes of shadow address space, so only plain builds cap it.
    const rlimit cap{kMemoryLimitMb << 20, kMemoryLimitMb << 20};
    setrlimit(RLIMIT_AS, &cap);
#endif
    std::vector<fs::path> files;
    for (int i = 1; i < argc; ++i) {
        std::error_code ec;
        if (fs::is_regular_file(argv[i], ec)) {
            files.emplace_back(argv[i]);
            continue;
        }
        if (!fs::is_directory(argv[i], ec)) continue;  // a target may have no crash inputs
        for (const auto& e : fs::recursive_directory_iterator(argv[i])) {
            if (e.is_regular_file() && e.path().filename().string()[0] != '.') {
                files.push_back(e.path());
            }
        }
    }
    std::sort(files.begin(), files.end());
    if (files.empty()) {
        std::fprintf(stderr, "replay: no inputs found in the given folders\n");
        return 1;
    }
    for (const fs::path& f : files) {
        std::ifstream in(f, std::ios::binary);
        if (!in) {
            std::fprintf(stderr, "replay: cannot read %s\n", f.c_str());
            return 1;
        }
        const std::vector<char> bytes((std::istreambuf_iterator<char>(in)),
                                      std::istreambuf_iterator<char>());
        // The data pointer of an empty vector may be null; libFuzzer never passes null.
        static const uint8_t kEmpty = 0;
        const auto* p = bytes.empty() ? &kEmpty : reinterpret_cast<const uint8_t*>(bytes.data());
        LLVMFuzzerTestOneInput(p, bytes.size());
    }
    std::printf("replay: %zu inputs ran cleanly\n", files.size());
    return 0;
}

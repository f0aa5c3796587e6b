// The IDX, CSV and NPY readers take a path, so each input goes to an in-memory file reached
// through /proc/self/fd: no disk traffic per execution and nothing left behind after a crash.
#pragma once

#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

namespace td::fuzz {

class MemFile {
  public:
    MemFile() {
        fd_ = memfd_create("traindeck-fuzz", 0);
        if (fd_ < 0) {
            std::perror("memfd_create");
            std::abort();
        }
        path_ = "/proc/self/fd/" + std::to_string(fd_);
    }
    ~MemFile() { close(fd_); }
    MemFile(const MemFile&) = delete;
    MemFile& operator=(const MemFile&) = delete;

    // Replaces the file's contents with `data` and returns a path the readers can open.
    const std::string& write(const uint8_t* data, size_t size) {
        if (ftruncate(fd_, 0) != 0) std::abort();
        size_t done = 0;
        while (done < size) {
            const ssize_t n = pwrite(fd_, data + done, size - done, static_cast<off_t>(done));
            if (n <= 0) std::abort();
            done += static_cast<size_t>(n);
        }
        return path_;
    }

  private:
    int fd_ = -1;
    std::string path_;
};

// Reports a broken invariant the way a sanitizer would: message, then abort (a fuzzer crash).
[[noreturn]] inline void fail(const std::string& what) {
    std::fprintf(stderr, "fuzz invariant violated: %s\n", what.c_str());
    std::abort();
}

}  // namespace td::fuzz

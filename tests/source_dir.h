// The root of the checkout a build was configured from, for the tests and benchmarks that read
// its projects, fixtures and README. Defined in one file CMake generates into the build folder
// (library traindeck_source_dir) rather than passed to every test as a -D, so the tests' objects
// do not depend on where the checkout lies and ccache serves them to another clone of the same
// commit (installer/ccache_env.sh).
#pragma once

namespace td::dev {
extern const char kSourceDir[];
}  // namespace td::dev

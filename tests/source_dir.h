// Where the checkout a build was configured from lies, and that build's CLI (traindeck), for the
// tests and benchmarks that read the checkout's projects, fixtures and README or run the CLI.
// Defined in one file CMake generates into the build folder (library traindeck_source_dir)
// rather than passed to every test as a -D, so the tests' objects do not depend on where the
// checkout lies and ccache serves them to another clone of the same commit
// (installer/ccache_env.sh).
#pragma once

namespace td::dev {
extern const char kSourceDir[];
extern const char kBinary[];
}  // namespace td::dev

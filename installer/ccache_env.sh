# Sourced by the scripts that configure a build (installer/build.sh, installer/sanitize.sh,
# tests/gpu/check.sh): with ccache installed, sets launcher to compile through it and hashes the
# paths under the checkout as relative ones (CCACHE_BASEDIR, CCACHE_NOHASHDIR), so a second clone
# of the same commit (CI's, a worktree) reuses the objects of the first. A caller's own
# CCACHE_BASEDIR or CCACHE_NOHASHDIR wins. Needs $root (the checkout) and the array launcher.
if command -v ccache >/dev/null; then
  launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
  export CCACHE_BASEDIR="${CCACHE_BASEDIR:-$root}"
  export CCACHE_NOHASHDIR="${CCACHE_NOHASHDIR:-true}"
  # Qt6::Test defines the test's build and source folders (absolute) for QFINDTESTDATA, which no
  # test here uses (tests/source_dir.h instead): left out of the hash so the tests' objects match.
  export CCACHE_IGNOREOPTIONS="${CCACHE_IGNOREOPTIONS:--DQT_TESTCASE_BUILDDIR=* -DQT_TESTCASE_SOURCEDIR=*}"
fi

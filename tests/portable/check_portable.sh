#!/usr/bin/env bash
# The traindeck binary runs on an x86-64 CPU without AVX, and AVX/AVX-512 code in it is confined
# to the kernels chosen at run time (engine/core/cpu_isa.h).
#   check_portable.sh TRAINDECK_BINARY SOURCE_DIR
# 1. Under qemu's user-mode emulator with a Nehalem CPU (SSE4.2, no AVX; package qemu-user), the
#    binary lists its devices with the generic level, trains a small project, and refuses
#    TRAINDECK_ISA=avx512 with a message instead of stopping with SIGILL.
# 2. In the disassembly, every function that touches a ymm, zmm or mask register belongs to the
#    td::isa_avx2 / td::isa_avx512 (optimizer), td::cpu::isa_avx2 / td::cpu::isa_avx512 or
#    td::data_kernels::isa_avx2 / td::data_kernels::isa_avx512 (batch forming) loops, or
#    td::half::isa_f16c (the f16 conversions, chosen by CPUID); the zero-skipping products
#    (sparse_kernels_avx2.cpp, sparse_kernels_avx512.cpp) are in td::cpu::isa_avx2 and
#    td::cpu::isa_avx512.
# Exit 77 (skipped) only when neither qemu-x86_64 nor objdump is installed.
set -uo pipefail
bin="$1"
src="$2"
fail=0
ran=0
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT

# AddressSanitizer and ThreadSanitizer reserve terabytes of shadow address space, which the
# user-mode emulator cannot map: such builds get the disassembly check only.
sanitized=0
# (The headers go to a variable first: grep -q stops reading early, and under pipefail the
# writer's SIGPIPE would make the test read "not sanitized".)
headers="$(objdump -p "$bin" 2>/dev/null)"
if grep -Eq 'NEEDED +lib(a|t|hwa)san' <<<"$headers"; then sanitized=1; fi

if [ "$sanitized" = 1 ]; then
  echo "$bin is built with a sanitizer runtime: skipping the emulated run"
elif command -v qemu-x86_64 >/dev/null 2>&1; then
  ran=1
  emu=(qemu-x86_64 -cpu Nehalem)
  if ! out="$(timeout 120 "${emu[@]}" "$bin" devices 2>&1)"; then
    echo "FAIL: traindeck devices on a Nehalem CPU (no AVX):"; echo "$out"; fail=1
  elif ! grep -q 'cpu:0 .*generic)' <<<"$out"; then
    echo "FAIL: traindeck devices on Nehalem does not report the generic level:"; echo "$out"
    fail=1
  else
    echo "ok: devices on Nehalem: $(grep 'cpu:0' <<<"$out")"
  fi
  if ! out="$(timeout 300 "${emu[@]}" "$bin" train "$src/projects/synthetic_blobs.json" \
              --epochs 2 --plain --db "$tmp/runs.db" 2>&1)"; then
    echo "FAIL: traindeck train on a Nehalem CPU (no AVX):"; echo "$out"; fail=1
  else
    echo "ok: trained projects/synthetic_blobs.json on Nehalem"
  fi
  out="$(TRAINDECK_ISA=avx512 timeout 120 "${emu[@]}" "$bin" devices 2>&1)"
  rc=$?
  if [ "$rc" != 2 ] || ! grep -q 'TRAINDECK_ISA: avx512 is not available on this CPU' <<<"$out"; then
    echo "FAIL: TRAINDECK_ISA=avx512 on Nehalem: expected exit 2 with a message, got $rc:"
    echo "$out"; fail=1
  else
    echo "ok: TRAINDECK_ISA=avx512 refused on Nehalem"
  fi
else
  echo "qemu-x86_64 not installed (package qemu-user): skipping the emulated run"
fi

if command -v objdump >/dev/null 2>&1; then
  ran=1
  # Function headers look like "0000000000401230 <td::isa_avx512::(anonymous namespace)::...>:".
  objdump -d --no-show-raw-insn -C "$bin" >"$tmp/dis.txt"
  awk '
    /^[0-9a-f]+ <.*>:$/ { fn = $0; sub(/^[0-9a-f]+ </, "", fn); sub(/>:$/, "", fn); next }
    /%[yz]mm[0-9]|%k[0-7]([^0-9]|$)/ {
      # A function template instance is demangled with its return type first ("void td::...").
      if (fn !~ /^([a-z_0-9:]+ )?td::(cpu::|data_kernels::)?isa_avx(2|512)::/ && fn !~ /^td::half::isa_f16c::/ && !(fn in seen)) {
        seen[fn] = 1; print fn
      }
    }' "$tmp/dis.txt" >"$tmp/wide.txt"
  if [ -s "$tmp/wide.txt" ]; then
    echo "FAIL: functions outside the dispatched kernels use AVX registers:"
    head -n 20 "$tmp/wide.txt"
    echo "($(wc -l <"$tmp/wide.txt") functions in all)"
    fail=1
  else
    echo "ok: AVX registers only in the dispatched isa_avx2 / isa_avx512 / isa_f16c functions"
  fi
else
  echo "objdump not installed (package binutils): skipping the disassembly check"
fi

[ "$ran" = 1 ] || exit 77
exit "$fail"

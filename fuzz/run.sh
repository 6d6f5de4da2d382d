#!/usr/bin/env bash
# Coverage-guided runs of every fuzz target, bounded in time:
#   fuzz/run.sh [seconds per target, default 180] [target...]
# Works on stable Rust: RUSTC_BOOTSTRAP=1 lets cargo-fuzz pass its -Z flags
# (AddressSanitizer, sanitizer coverage). New inputs go to a scratch corpus
# ($FUZZ_WORK, default a temp dir); fuzz/corpus/<target> holds the seeds and
# is only read. A crash leaves its input in fuzz/artifacts/<target>/.
set -euo pipefail
cd "$(dirname "$0")"
command -v cargo-fuzz >/dev/null || cargo install cargo-fuzz --locked
export RUSTC_BOOTSTRAP=1
seconds=${1:-180}
shift || true
targets=("$@")
[ ${#targets[@]} -gt 0 ] || mapfile -t targets < <(cargo fuzz list)
work=${FUZZ_WORK:-$(mktemp -d)}
cargo fuzz build -O
status=0
for target in "${targets[@]}"; do
  mkdir -p "$work/$target"
  seeds=()
  [ -d "corpus/$target" ] && seeds=("corpus/$target")
  echo "== $target: ${seconds}s, corpus $work/$target"
  cargo fuzz run -O "$target" "$work/$target" "${seeds[@]}" -- \
    -max_total_time="$seconds" -print_final_stats=1 || status=1
done
exit $status

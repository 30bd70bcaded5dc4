#!/usr/bin/env bash
# The assign benchmark of two revisions in one run: BASE_REV (any git revision) and the
# working tree as it is, uncommitted changes included. Each is built in release mode, then
# bench/before_after.py runs them side by side, alternating, on the embedded store and on
# one Redis, and prints per store and route each side's median rate and the median and
# range of the working-tree/base ratios of neighbouring runs. A measurement, not a check.
#
#   bash bench/compare.sh main               # the working tree against main
#   ROUNDS=9 DURATION=10 bash bench/compare.sh HEAD~3
#   INSTRUCTIONS=1 bash bench/compare.sh main   # also instructions per assign (callgrind)
#
# The base revision is checked out in a temporary worktree and built into the same target
# directory (so that the dependencies are built once), its binary copied aside; the
# worktree is removed when the script ends, however it ends.
set -euo pipefail
cd "$(dirname "$0")/.."

if (($# != 1)); then
    echo "usage: bash bench/compare.sh BASE_REV" >&2
    exit 2
fi
base_rev="$(git rev-parse --verify "$1^{commit}")"

missing=()
command -v wrk >/dev/null 2>&1 || missing+=(wrk)
command -v redis-server >/dev/null 2>&1 || missing+=(redis-server)
if ((${#missing[@]})); then
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq && apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

root="$(pwd)"
target_dir="${CARGO_TARGET_DIR:-$root/target}"
scratch="$(mktemp -d "${TMPDIR:-/tmp}/compare.XXXXXX")"
cleanup() {
    git -C "$root" worktree remove --force "$scratch/base" >/dev/null 2>&1 || true
    rm -rf "$scratch"
}
trap cleanup EXIT

# Both builds go into one target directory (the dependencies are built once), and that
# needs care: cargo names our crate's build outputs the same for both checkouts and judges
# them fresh by comparing the sources' modification times with the output's, so after the
# base (checked out just now) a working tree whose files are older would be taken as built
# and the base's code measured as both sides, and run by every later benchmark. Touching
# the working tree's sources before its build and after the base's makes cargo rebuild it.
touch_tree() { find "$root/src" -type f -exec touch {} +; }
touch_tree
echo "==> building the working tree ($(git rev-parse --short HEAD)$(git diff --quiet HEAD || echo ', with uncommitted changes'))" >&2
CARGO_TARGET_DIR="$target_dir" cargo build --release --quiet
cp "$target_dir/release/proxy-allocator" "$scratch/proxy-allocator.tree"

echo "==> building the base ${base_rev:0:12} ($1)" >&2
git worktree add --quiet --detach "$scratch/base" "$base_rev"
(cd "$scratch/base" && CARGO_TARGET_DIR="$target_dir" cargo build --release --quiet)
cp "$target_dir/release/proxy-allocator" "$scratch/proxy-allocator.base"
# The base's binary is a hard link to its build output: replaced, not written through.
rm -f "$target_dir/release/proxy-allocator"
cp "$scratch/proxy-allocator.tree" "$target_dir/release/proxy-allocator"
touch_tree
if cmp -s "$scratch/proxy-allocator.base" "$scratch/proxy-allocator.tree"; then
    echo "==> note: the base and the working tree built the same binary" >&2
fi

echo "==> base ${base_rev:0:12} against the working tree; load average $(cut -d' ' -f1-3 /proc/loadavg)" >&2
python3 bench/before_after.py "$scratch/proxy-allocator.base" "$scratch/proxy-allocator.tree"
if [[ "${INSTRUCTIONS:-}" == 1 ]]; then
    STORE=redis python3 bench/instructions.py "$scratch/proxy-allocator.base" "$scratch/proxy-allocator.tree"
fi

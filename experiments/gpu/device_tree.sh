#!/usr/bin/env bash
# The working tree a device call sends must stay under 64 MiB of disk (tracked and untracked files
# that git does not ignore, with the carried wheels), and the committed results have grown past
# that. The GPU scripts and GPU tests read none of the per-prompt records, the archive, the figures,
# the GPU areas' committed grids (roofline, serve, refactor_guard: what the calls produce, read back on
# the host) or the mini128 model (the GPU tests use models/mini), so a device call goes without them:
#   bash experiments/gpu/device_tree.sh slim      # those out of the working tree,
#                                                 # and HEAD into experiments/gpu/base_commit.txt (env.sh: BASE_COMMIT)
#   ... the device call(s) ...
#   bash experiments/gpu/device_tree.sh restore   # them back from git (nothing else is touched)
#   bash experiments/gpu/device_tree.sh size      # what a call would send, in KiB (file sizes)
# `slim` refuses when either folder holds changes not yet committed (restore would lose them).
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
PATHS=(results/records results/archive results/figures results/roofline results/serve results/refactor_guard models/mini128)
# "<bytes> <path>" of every file a call sends (files slim removed are still listed by git: stat skips
# them, and its failure is not the script's); size sums them (a `du -c` total was xargs's last batch's)
files() { (git ls-files; git ls-files -o --exclude-standard) | { xargs -d '\n' stat -c '%s %n' 2>/dev/null || true; }; }
size() { files | awk '{s += $1} END {print int(s / 1024)}'; }
case "${1:-}" in
  slim)
    if [ -n "$(git status --porcelain -- "${PATHS[@]}")" ]; then
      echo "device_tree: ${PATHS[*]} hold uncommitted changes; commit them first" >&2; exit 2
    fi
    rm -rf "${PATHS[@]}"
    # the commit the call's logs and report.json name (experiments/gpu/env.sh reads it): the device's .git can be older
    if [ -n "$(git status --porcelain --untracked-files=no | grep -v -E '^ D (results|models/mini128)/')" ]; then
      echo "device_tree: uncommitted changes: the call would run a tree that no commit names; commit first" >&2
      git checkout -- "${PATHS[@]}"; exit 2
    fi
    kib=$(size)
    if [ "$kib" -gt 64512 ]; then  # the tool's limit is 65536 KiB with the carried wheels (~400 KiB)
      echo "device_tree: $kib KiB would still travel, over the device tool's 64 MiB; the largest files:" >&2
      files | sort -rn | head -5 >&2 || true
      git checkout -- "${PATHS[@]}"; exit 2
    fi
    git rev-parse --short HEAD > experiments/gpu/base_commit.txt
    echo "device_tree: ${PATHS[*]} removed from the working tree; $kib KiB would travel (limit 65536, wheels not counted); commit $(cat experiments/gpu/base_commit.txt)" ;;
  restore)
    git checkout -- "${PATHS[@]}"
    rm -f experiments/gpu/base_commit.txt
    echo "device_tree: ${PATHS[*]} restored" ;;
  size)
    echo "$(size) KiB" ;;
  *)
    echo "usage: bash experiments/gpu/device_tree.sh slim|restore|size" >&2; exit 2 ;;
esac

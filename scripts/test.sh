#!/usr/bin/env bash
# The test command: set up this machine, then run the whole suite (real FUSE mounts, a local emulator).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
# Types first (vitest does not check them), then the suites.
npm run --silent typecheck

# Every temporary file of the run (buckets, block caches, mount points, logs: gigabytes) goes in one
# folder, removed at the end whatever happens, so runs never pile up on a small disk. Mounts in it are
# cut first, deepest first, so rm never walks into a bucket.
run_tmp=$(mktemp -d "${TMPDIR:-/tmp}/gcsmount-tests-XXXXXX")
remove_run_tmp() {
  awk -v d="$run_tmp/" 'index($2, d) == 1 {print $2}' /proc/mounts | sort -r | while read -r m; do
    fusermount3 -u -z "$m" 2>/dev/null || umount -l "$m" 2>/dev/null || true
  done
  rm -rf --one-file-system "$run_tmp"
}
trap remove_run_tmp EXIT
free_mib=$(df -m --output=avail "$run_tmp" | tail -1 | tr -d ' ')
echo "test: temporary files in $run_tmp (${free_mib} MiB free)"
# The suite holds up to about 1 GiB there at once (measured: 0.9 GiB, two files at a time); less free space fails tests with ENOSPC.
[ "$free_mib" -ge 1536 ] || echo "test: WARNING: only ${free_mib} MiB free in $run_tmp; tests may fail with ENOSPC (no space left on device)" >&2
TMPDIR="$run_tmp" npx vitest run "$@"

#!/usr/bin/env bash
# The main job, end to end: set up, start the bundled GCS emulator with sample data (or use a real
# bucket: DEMO_BUCKET=my-bucket with Google credentials at hand), mount it, read through the mount
# from other processes, and clean up.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh

work=$(mktemp -d /tmp/gcsmount-demo.XXXXXX)
mnt="$work/mnt"
mkdir -p "$mnt"
emu_pid=""
cleanup() {
  if grep -qs " $mnt " /proc/mounts; then bin/gcsmount unmount "$mnt" || fusermount3 -u -z "$mnt" || true; fi
  [ -n "$emu_pid" ] && kill "$emu_pid" 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT

if [ -n "${DEMO_BUCKET:-}" ]; then
  bucket="$DEMO_BUCKET"
  endpoint_args=()
else
  bucket=demo-bucket
  root="$work/emulator-root"
  mkdir -p "$root/$bucket/text" "$root/$bucket/binary"
  echo "hello from gcsmount" > "$root/$bucket/text/hello.txt"
  seq 1 100000 > "$root/$bucket/text/numbers.txt"
  head -c $((16 * 1024 * 1024)) /dev/urandom > "$root/$bucket/binary/random-16MiB.bin"
  # A small Zarr store, written by the same zarr library the pipelines use.
  /usr/bin/python3 - "$root/$bucket/weather.zarr" <<'PY'
import sys, numpy as np, xarray as xr
t = np.arange(24)
ds = xr.Dataset({"temperature": (("time", "lat", "lon"), np.random.default_rng(0).normal(15, 8, (24, 90, 180)).astype("float32"))},
                coords={"time": t, "lat": np.linspace(-89, 89, 90), "lon": np.linspace(-179, 179, 180)})
ds.chunk({"time": 6}).to_zarr(sys.argv[1], mode="w", consolidated=True)
PY
  node bin/gcsmount emulator --root "$root" --port 0 > "$work/emulator.out" 2> "$work/emulator.log" &
  emu_pid=$!
  for _ in $(seq 1 100); do grep -q listening "$work/emulator.out" 2>/dev/null && break; sleep 0.1; done
  url=$(grep -o 'http://[0-9.:]*' "$work/emulator.out" | head -1)
  endpoint_args=(--custom-endpoint "$url")
  echo "emulator: $url serving $root"
fi

echo "mount:    gcsmount $bucket $mnt ${endpoint_args[*]}"
bin/gcsmount "$bucket" "$mnt" "${endpoint_args[@]}" --log-file "$work/gcsmount.log"

echo; echo "== ls -lR $mnt"
ls -lR "$mnt" | head -40
if [ -z "${DEMO_BUCKET:-}" ]; then
  echo; echo "== cat text/hello.txt"; cat "$mnt/text/hello.txt"
  echo; echo "== sha256 through the mount vs the source"
  sha256sum "$mnt/binary/random-16MiB.bin" "$root/$bucket/binary/random-16MiB.bin"
  a=$(sha256sum < "$mnt/binary/random-16MiB.bin"); b=$(sha256sum < "$root/$bucket/binary/random-16MiB.bin")
  [ "$a" = "$b" ] && echo "identical"
  echo; echo "== xarray.open_zarr through the mount"
  /usr/bin/python3 - "$mnt/weather.zarr" "$root/$bucket/weather.zarr" <<'PY'
import sys, numpy as np, xarray as xr
mounted, local = xr.open_zarr(sys.argv[1]).load(), xr.open_zarr(sys.argv[2]).load()
print(mounted)
assert np.array_equal(mounted.temperature.values, local.temperature.values)
print("mean temperature:", float(mounted.temperature.mean()), "- identical to the local copy")
PY
  echo; echo "== GCS requests the emulator saw"
  node -e "fetch(process.argv[1]).then((r) => r.text()).then(console.log)" "$url/_stats"
fi
echo; echo "unmount:  gcsmount unmount $mnt"
bin/gcsmount unmount "$mnt"

#!/bin/bash
# One run: emulator in its own process, 30 ms to first byte, 50 MB/s per response.
set -u
# Usage: bench/prefetch-zarr-run.sh [WORKDIR]  (not yet part of `npm run bench`: see bench/RESULTS.md)
W=$(cd "$(dirname "$0")/.." && pwd); B=${1:-/tmp/pfbench}; PY=/usr/bin/python3
[ -d $B/root/zb/stores ] || { mkdir -p $B/root/zb && $PY $W/test/fixtures/make_zarr.py $B/root/zb/stores --scale bench > /dev/null; }
PORT=$((20000 + RANDOM % 20000))
$W/bin/gcsmount emulator --root $B/root --port $PORT --latency-ms 0 > $B/emu.log 2>&1 &
EMU=$!; sleep 2
URL=http://127.0.0.1:$PORT
curl -s "$URL/storage/v1/b/zb/o?maxResults=1000" > /dev/null   # hashes computed outside the rounds
curl -s -X POST -H 'content-type: application/json' -d '{"latencyMs":30,"bandwidthBytesPerSec":50000000}' $URL/_knobs > /dev/null
round() { # label mountroot threads
  curl -s -X POST $URL/_reset > /dev/null
  local out; out=$($PY $W/test/fixtures/read_zarr.py $2/stores --stores consolidated --dask-threads $3 | tail -1)
  local st; st=$(curl -s $URL/_stats)
  echo "$1 | threads=$3 | $out | $st" | cut -c1-600
}
gm() { # label threads extra-args...
  local label=$1 threads=$2; shift 2
  local mnt; mnt=$(mktemp -d $B/mnt-XXXX); local cache; cache=$(mktemp -d $B/cache-XXXX)
  $W/bin/gcsmount zb $mnt --custom-endpoint $URL --cache-dir $cache "$@" || return
  round "$label cold" $mnt $threads
  [ "$threads" = 0 ] && round "$label warm" $mnt $threads
  fusermount -u $mnt; sleep 1.5; rm -rf $cache
}
rc() { # threads
  local mnt; mnt=$(mktemp -d $B/mnt-XXXX); local cache; cache=$(mktemp -d $B/cache-XXXX)
  printf '[emu]\ntype = google cloud storage\nanonymous = true\nendpoint = %s/storage/v1/\n' $URL > $B/rclone.conf
  rclone mount emu:zb $mnt --config $B/rclone.conf --read-only --vfs-cache-mode full --vfs-cache-max-age 24h --dir-cache-time 1h --attr-timeout 60s --cache-dir $cache --log-file $B/rclone.log &
  local pid=$!
  for i in $(seq 100); do mountpoint -q $mnt && break; sleep 0.1; done
  round "rclone mount --vfs-cache-mode full cold" $mnt $1
  fusermount -u $mnt; wait $pid; rm -rf $cache
}
for T in 0 16; do
  gm "gcsmount (prefetch on, defaults)" $T
  gm "gcsmount --prefetch-max-files-ahead 0" $T --prefetch-max-files-ahead 0
  rc $T
done
kill $EMU

#!/usr/bin/env bash
# Everything gcsmount needs on a fresh Debian 12 machine: system packages, node modules (native ones
# built), and the compiled JavaScript. Safe to run again: it skips what is already there.
set -euo pipefail
cd "$(dirname "$0")/.."

# libfuse3-dev: headers and pkg-config for the FUSE addon
# (native/, built by npm ci). fuse3: libfuse3 at run time, fusermount3 and /etc/fuse.conf.
# python3-zarr/xarray/numpy: the Zarr acceptance tests, run with /usr/bin/python3. systemd: systemd-analyze
# verify checks the unit file. curl: the benchmarks' download ceiling and floor (no gcsmount code in them).
APT_PACKAGES=(libfuse3-dev fuse3 pkg-config python3-zarr python3-xarray python3-numpy systemd curl)
missing=()
for p in "${APT_PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing ${missing[*]}"
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
fi

# npm ci builds better-sqlite3 from source (package.json's allowScripts lets npm 11 run its install
# script), and the root package's own install script builds the FUSE addon (node-gyp, native/binding.gyp).
stamp=node_modules/.gcsmount-lock
if [ ! -f "$stamp" ] || ! cmp -s package-lock.json "$stamp"; then
  echo "setup: npm ci"
  npm ci --no-audit --no-fund --loglevel=error
  cp package-lock.json "$stamp"
fi
node -e "require('better-sqlite3')(':memory:').close(); require('./native/build/Release/gcsmount_fuse.node')" \
  || { echo "setup: native modules did not build (better-sqlite3, native/gcsmount_fuse)" >&2; exit 1; }

npm run --silent build

# The kernel's FUSE control file system (/sys/fs/fuse/connections: each mount's max_background and
# congestion_threshold, and its abort file for a hung mount), which systemd mounts at boot; a machine
# started without it (a container, this VM on some boots) has the folder empty. The tests read it.
if [ -d /sys/fs/fuse/connections ] && ! mountpoint -q /sys/fs/fuse/connections && [ "$(id -u)" -eq 0 ]; then
  mount -t fusectl fusectl /sys/fs/fuse/connections || echo "setup: could not mount fusectl on /sys/fs/fuse/connections" >&2
fi

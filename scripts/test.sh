#!/usr/bin/env bash
# The test command: set up this machine, then run the whole suite (real FUSE mounts, a local emulator).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
# Types first (vitest does not check them), then the suites.
npm run --silent typecheck
npx vitest run "$@"

import { existsSync } from 'node:fs';
import { defineConfig } from 'vitest/config';
import { BaseSequencer, type TestSpecification } from 'vitest/node';

/**
 * Files whose assertions lean on timing or on the whole machine: prefetch decisions and request counts
 * that follow a reader's pace, the page cache (they drop it, or count on it), the kernel's readahead,
 * rate limits and pacing, time bounds. They run one at a time, after the rest, with the machine to
 * themselves, as the whole suite once did.
 */
const ALONE = [
  'zarr',
  'zarr-v3',
  'zarr-nested',
  'prefetch',
  'prefetch-walk',
  'data-path',
  'native-reads',
  'native-waits',
  'fuse-layer',
  'memory-limit',
  'sharing',
  'connection-flags',
  'stall-resume',
  'block-buffers',
  'request-rate',
  // Drops the page cache of every mount on the machine (its reads must reach the daemons): a file
  // beside it that counts on the kernel keeping pages (metadata's warm Zarr open) paid 8 requests.
  'torture',
].map((name) => `test/${name}.test.ts`);

/**
 * The longest files of the shared group, longest first (2026-12-03, two at a time: 110, 65, 56, 48, 46,
 * 45, 36 s): started first, so the group does not end on one of them running alone. A fresh clone has no
 * timings of its own to sort by (vitest falls back to file size, which tells little here).
 */
const LONGEST = ['write-mount-differential', 'writes', 'block-cache', 'metadata-scale', 'mount', 'namespace-schedules', 'hostile'];

// A renamed file would otherwise drop silently out of these lists.
for (const file of [...ALONE, ...LONGEST.map((name) => `test/${name}.test.ts`)]) {
  if (!existsSync(new URL(file, import.meta.url))) throw new Error(`vitest.config.ts: no ${file}`);
}

class LongestFirst extends BaseSequencer {
  override async sort(files: TestSpecification[]): Promise<TestSpecification[]> {
    const rank = (f: TestSpecification) => {
      const i = LONGEST.findIndex((name) => f.moduleId.endsWith(`/test/${name}.test.ts`));
      return i < 0 ? LONGEST.length : i;
    };
    return (await super.sort(files)).map((f, i) => ({ f, i })).sort((a, b) => rank(a.f) - rank(b.f) || a.i - b.i).map((x) => x.f);
  }
}

// Tests mount real FUSE filesystems and start real daemons, each a file's own. Measured on the 2-core
// machine (2026-12-03): the suite took 943 s one file at a time and 574 s two at a time, so the rest
// run two at a time first; a cold mount on a loaded machine gets room in the timeouts.
const common = { testTimeout: 60_000, hookTimeout: 60_000, teardownTimeout: 30_000 };

export default defineConfig({
  test: {
    reporters: ['default'],
    projects: [
      { test: { ...common, name: 'shared', include: ['test/**/*.test.ts'], exclude: ALONE, maxWorkers: 2, sequence: { groupOrder: 0, sequencer: LongestFirst } } },
      { test: { ...common, name: 'alone', include: ALONE, fileParallelism: false, sequence: { groupOrder: 1 } } },
    ],
  },
});

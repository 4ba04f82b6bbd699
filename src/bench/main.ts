import { machine } from './harness.js';
import { indexScenario, warmReadScenario } from './block-cache.js';
import { coldCpuScenario } from './cold-cpu.js';
import { dataPathScenario } from './data-path.js';
import { fuseCeilingScenario } from './fuse-ceiling.js';
import { listingScenario } from './listing.js';
import { memoryScenario } from './memory.js';
import { scalingScenario } from './scaling.js';
import { metadataScenario } from './metadata.js';
import { sharingScenario } from './sharing.js';
import { statScenario } from './stat.js';
import { writeScenario } from './write.js';
import { dropFromPageCache, zarrScenario } from './zarr.js';
import { zarrV3Scenario } from './zarr-v3.js';
import { zarrNestedScenario } from './zarr-nested.js';

/** `npm run bench [-- SCENARIO...]`: prints Markdown for bench/RESULTS.md. */
const SCENARIOS: Record<string, { title: string; run: () => Promise<string> }> = {
  metadata: { title: 'Metadata at scale: ls -f of 100,000 objects, 160 random opens, find -ls of 10,000 objects in 100 folders, 30 ms latency', run: metadataScenario },
  zarr: { title: 'Zarr: open + load of a 1 GiB store', run: zarrScenario },
  'zarr-v3': { title: 'Zarr v3, plain and sharded, cold and warm, and a shuffled loader, against the local copy', run: () => zarrV3Scenario(dropFromPageCache) },
  'zarr-nested': { title: 'Zarr with nested chunk keys: requests in front of a cold load and a shuffled loader, 30 ms and a realistic list cost', run: zarrNestedScenario },
  'data-path': { title: 'Cold reads: sequential, many small files, random, against the download ceiling', run: dataPathScenario },
  index: { title: 'Block index: SQLite at 1,000,000 blocks', run: indexScenario },
  sharing: { title: 'Sharing a bucket: three daemons under one 60 requests/s limit; reads through stalling bodies', run: sharingScenario },
  stat: { title: 'Cold stat/s: 10,000 files in one folder by 1 and 4 threads, no latency', run: statScenario },
  'fuse-ceiling': { title: 'The FUSE layer\'s ceiling: 1 GiB answered from memory through the addon, against dd from /dev/shm', run: fuseCeilingScenario },
  scaling: { title: 'Scaling without a bigger machine: cold reads with the daemon pinned to 1 and 2 cores, 0-2 download workers', run: scalingScenario },
  'cold-cpu': { title: 'Cold reads: daemon CPU per GiB, GCS through the mount into the block cache (and without one)', run: coldCpuScenario },
  listing: { title: '`ls -l` of 10,000 files in one folder: LOOKUPs against READDIRPLUS, no latency', run: listingScenario },
  memory: { title: 'Many readers, one memory budget: 96 readers of 96 files against 16, cold and warm, with and without a cache dir', run: memoryScenario },
  write: { title: 'Writes: 1 GiB sequential, a checkpoint of 64 x 64 MiB by 16 writers, a Zarr store of 10,000 small chunk files, against curl uploads and a local folder', run: writeScenario },
  'warm-read': { title: 'Warm reads: 1 GiB from the block cache vs cat of a plain file on the same disk', run: warmReadScenario },
};

async function main(): Promise<void> {
  const wanted = process.argv.slice(2);
  const unknown = wanted.filter((w) => !(w in SCENARIOS));
  if (unknown.length) {
    process.stderr.write(`unknown scenario ${unknown.join(', ')}; known: ${Object.keys(SCENARIOS).join(', ')}\n`);
    process.exit(2);
  }
  process.stdout.write(`Machine: ${machine()}; ${new Date().toISOString().slice(0, 10)}\n\n`);
  for (const name of wanted.length ? wanted : Object.keys(SCENARIOS)) {
    const s = SCENARIOS[name]!;
    process.stdout.write(`### ${s.title}\n\nCommand: \`npm run bench -- ${name}\`\n\n${await s.run()}\n\n`);
  }
}

main().then(
  () => process.exit(0),
  (err: Error) => {
    process.stderr.write(`bench failed: ${err.message}\n`);
    process.exit(1);
  },
);

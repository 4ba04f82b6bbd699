import { promises as fsp } from 'node:fs';
import { join } from 'node:path';
import { dropPageCache, fmt, sh, timed, type BenchBucket } from './harness.js';
import { objectFile, type ThroughMount } from './write-mounts.js';

/**
 * The write bench's third part: a Zarr store of many small chunk files written by xarray, the load
 * where a request per file (not bandwidth) sets the pace, against the same store in a local folder.
 */

const PY = '/usr/bin/python3';
/** Threads xarray's dask writes and reads the Zarr store with (as the zarr-nested bench reads). */
const ZARR_THREADS = 16;

const WRITE_ZARR = `
import sys, time, json
import numpy as np, xarray as xr, dask
path, rows, cols, threads = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
dask.config.set(scheduler='threads', num_workers=threads)
data = np.random.default_rng(0).random((64 * rows, 64 * cols), dtype=np.float32)
ds = xr.Dataset({'v': (('y', 'x'), data)}).chunk({'y': 64, 'x': 64})
t0 = time.perf_counter()
ds.to_zarr(path, mode='w-', encoding={'v': {'chunks': (64, 64), 'compressor': None}})
print(json.dumps({'seconds': time.perf_counter() - t0}))
`;

const READ_ZARR = `
import sys, time, json
import numpy as np, xarray as xr, dask
path, rows, cols, threads = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
dask.config.set(scheduler='threads', num_workers=threads)
t0 = time.perf_counter()
v = xr.open_zarr(path).v.values
seconds = time.perf_counter() - t0
expected = np.random.default_rng(0).random((64 * rows, 64 * cols), dtype=np.float32)
print(json.dumps({'seconds': seconds, 'equal': bool(np.array_equal(v, expected))}))
`;

/** 3. A Zarr store of small chunk files written by xarray: time and GCS requests per file, against a local folder. */
export async function zarrStore(b: BenchBucket, throughMount: ThroughMount, rows: number, cols: number): Promise<string> {
  const chunkFiles = rows * cols;
  const args = (path: string) => [path, String(rows), String(cols), String(ZARR_THREADS)];
  const py = async (script: string, path: string) => {
    const r = await sh(PY, ['-c', script, ...args(path)]);
    if (r.code !== 0) throw new Error(`python (${path}): ${r.stderr.trim().split('\n').slice(-3).join(' ')}`);
    return JSON.parse(r.stdout.trim().split('\n').pop()!) as { seconds: number; equal?: boolean };
  };
  const local = join(b.dir, 'local', 'store.zarr');
  await fsp.mkdir(join(b.dir, 'local'));
  await dropPageCache();
  const localWrite = await timed(() => py(WRITE_ZARR, local));
  const localFiles = Number((await sh('sh', ['-c', `find '${local}' -type f | wc -l`])).stdout.trim());

  let write = { seconds: NaN };
  let read: { seconds: number; equal?: boolean } = { seconds: NaN };
  const run = await throughMount(
    'zarr',
    async () => undefined,
    async (m) => {
      write = await py(WRITE_ZARR, join(m.path, 'store.zarr'));
    },
  );
  const stored = Number((await sh('sh', ['-c', `find '${objectFile(b, 'store.zarr')}' -type f | wc -l`])).stdout.trim());
  // Read back through a fresh mount: what GCS holds, not what the writer's daemon remembers.
  await throughMount('zarr-read', async () => undefined, async (m) => {
    read = await py(READ_ZARR, join(m.path, 'store.zarr'));
  });
  const localRead = await py(READ_ZARR, local);

  const req = run.emulator.requests;
  const kinds = (Object.keys(req) as (keyof typeof req)[]).filter((k) => k !== 'total' && req[k] > 0).map((k) => `${k} ${req[k]}`).join(', ');
  const daemonKinds = Object.entries(run.counters).filter(([, v]) => v > 0).map(([k, v]) => `${k} ${v}`).join(', ');
  return [
    `#### 3. A Zarr store written by xarray: ${chunkFiles.toLocaleString('en')} chunk files of 16 KiB (float32, ${64 * rows} x ${64 * cols}, chunks 64 x 64, compressor=None, dask ${ZARR_THREADS} threads)`,
    '',
    '| where | command | write time | files/s | GCS requests per chunk file | check |',
    '|---|---|---|---|---|---|',
    `| local folder (${localFiles} files) | \`ds.to_zarr(local + '/store.zarr')\` | ${fmt(localWrite.result.seconds, 2)} s | ${fmt(localFiles / localWrite.result.seconds)} | - | read back ${localRead.equal ? 'equal' : '**differs**'} (${fmt(localRead.seconds, 2)} s) |`,
    `| **gcsmount** (${stored} objects stored) | \`ds.to_zarr(MNT + '/store.zarr')\` | ${fmt(write.seconds, 2)} s | **${fmt(stored / write.seconds)}** | **${fmt(req.total / chunkFiles, 2)}** (${req.total} requests: ${kinds}) | read back through a fresh mount with xr.open_zarr ${read.equal ? 'equal' : '**differs**'} (${fmt(read.seconds, 2)} s) |`,
    '',
    `Write time is to_zarr's own (python start-up and data generation left out). Requests as the emulator counted them during the write; the daemon's gcs_requests_* counters: ${daemonKinds || 'none'}. ` +
      `Daemon CPU during the write ${fmt(run.cpu, 2)} s (main thread ${fmt(run.mainCpu, 2)} s, ${fmt((run.mainCpu / stored) * 1000, 2)} ms per file), peak RSS ${fmt(run.rssMiB)} MiB. Goal: 1 request per chunk file. gcsmount / local time: ${fmt(write.seconds / localWrite.result.seconds, 1)}x. ` +
      'zarr 2\'s DirectoryStore writes each chunk to a `.partial` file and renames it into place: an upload and a move per chunk file, and the chunk files of one array share a folder, where the kernel runs renames one at a time (it holds the folder\'s lock across a rename within it).',
  ].join('\n');
}

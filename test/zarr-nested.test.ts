import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { cleanupAll, mount, run, startBucket, tempDir, unmount, type TestBucket } from './helpers/harness.js';

const PY = '/usr/bin/python3';
const FIXTURES = join(import.meta.dirname, 'fixtures');

const LOAD = `
import sys, json, dask, xarray as xr
dask.config.set(scheduler='threads', num_workers=16)
print(json.dumps(float(xr.open_zarr(sys.argv[1]).t2m.load().sum())))
`;

/** Reads the chunk files named on stdin from 8 processes; prints a CRC of every file's CRC, by name. */
const LOADER = `
import sys, os, json, zlib
from multiprocessing import Pool
root = sys.argv[1]
def read(name):
    with open(os.path.join(root, name), 'rb') as f:
        return name, zlib.crc32(f.read())
with Pool(8) as p:
    crcs = dict(p.map(read, sys.stdin.read().split(), chunksize=1))
print(zlib.crc32(json.dumps(sorted(crcs.items())).encode()))
`;

/**
 * Metadata must not multiply a cold Zarr load's requests (issue 27): in a store with nested chunk keys
 * every chunk's lookups pass through folders nobody listed (t2m/T/Y/X, two chunks a folder). Requests
 * of every kind are counted against the media requests, at 20 ms per request so that lookups and
 * downloads overlap as they do on GCS.
 */
describe('a nested Zarr store, cold, through a fresh mount', () => {
  let tb: TestBucket;
  let local: string;

  beforeAll(async () => {
    tb = await startBucket('nested');
    local = join(tb.root, tb.bucket);
    const made = await run(PY, [join(FIXTURES, 'make_nested_zarr.py'), local, '--time', '16']);
    expect(made.code, made.stderr).toBe(0);
    // The emulator hashes an object the first time it describes it; GCS has them stored.
    await fetch(`${tb.emulator.url}/storage/v1/b/${tb.bucket}/o?fields=items(name,crc32c)&maxResults=1000`);
    tb.emulator.setKnobs({ latencyMs: 20, listMsPerEntry: 0.1 });
  }, 120_000);

  afterAll(async () => {
    await cleanupAll();
    await tb?.emulator.close();
  });

  it('an xarray load costs at most 1.15 requests per chunk download, and its sum is the local copy\'s', async () => {
    const expected = await run(PY, ['-c', LOAD, join(local, 'era5.zarr')]);
    expect(expected.code, expected.stderr).toBe(0);
    const m = await mount({ tb, args: ['--cache-dir', await tempDir('cache')] });
    tb.emulator.resetStats();
    const r = await run(PY, ['-c', LOAD, join(m.path, 'era5.zarr')], { timeoutMs: 120_000 });
    expect(r.stderr).not.toMatch(/Traceback/);
    expect(r.stdout).toBe(expected.stdout);
    const req = tb.emulator.stats().requests;
    expect(req.media).toBeGreaterThanOrEqual(64); // 16 time steps x 4 chunks of t2m, each fetched
    expect(req.total, JSON.stringify(req)).toBeLessThanOrEqual(1.15 * req.media);
    await unmount(m.path);
  }, 120_000);

  it('a shuffled loader of 8 processes costs at most 1.15 requests per chunk download', async () => {
    const names: string[] = [];
    for (const v of ['t2m', 'u10', 'v10']) for (let t = 0; t < 16; t++) for (let y = 0; y < 2; y++) for (let x = 0; x < 2; x++) names.push(`${v}/${t}/${y}/${x}`);
    // A fixed shuffle of 120 of the 192 chunks.
    const picked = names.map((n, i) => ({ n, k: (i * 7919) % 193 })).sort((a, b) => a.k - b.k).slice(0, 120).map((x) => x.n);
    const loader = (root: string) => run('sh', ['-c', `printf '%s\\n' ${picked.join(' ')} | ${PY} -c "$0" "$1"`, LOADER, join(root, 'era5.zarr')], { timeoutMs: 120_000 });
    const expected = await loader(local);
    expect(expected.code, expected.stderr).toBe(0);
    const m = await mount({ tb, args: ['--cache-dir', await tempDir('cache')] });
    tb.emulator.resetStats();
    const r = await loader(m.path);
    expect(r.stderr).not.toMatch(/Traceback/);
    expect(r.stdout).toBe(expected.stdout);
    const req = tb.emulator.stats().requests;
    expect(req.media).toBeGreaterThanOrEqual(120);
    expect(req.total, JSON.stringify(req)).toBeLessThanOrEqual(1.15 * req.media);
    await unmount(m.path);
  }, 120_000);
});

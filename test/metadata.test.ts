import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { cleanupAll, eventually, mount, run, sha256Of, startBucket, unmount, writeObjects, type Mounted, type TestBucket } from './helpers/harness.js';
import { heldReader } from './helpers/held-reader.js';
import { bytes, sha256, upload } from './helpers/objects.js';

const PY = '/usr/bin/python3';
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

describe('metadata caches', () => {
  let tb: TestBucket;

  beforeAll(async () => {
    tb = await startBucket('meta');
    const objects: Record<string, string> = { 'present.txt': 'here' };
    for (let i = 0; i < 500; i++) objects[`five-hundred/obj-${String(i).padStart(3, '0')}`] = 'x'.repeat(i);
    await writeObjects(tb.root, tb.bucket, objects);
  });

  afterAll(async () => {
    await cleanupAll();
    await tb?.emulator.close();
  });

  it('ls -l of 500 entries costs its list pages and no per-object request; again within the TTL, nothing', async () => {
    const m = await mount({ tb });
    tb.emulator.resetStats();
    const first = await run('ls', ['-l', join(m.path, 'five-hundred')]);
    expect(first.stdout.trim().split('\n')).toHaveLength(501); // "total" and 500 entries
    expect(first.stdout).toContain(' 499 ');
    // One list page for the directory, and one for the lookup of the directory itself: a page of the
    // root listed flat from that name on. Nothing before the name is listed for it.
    expect(tb.emulator.stats().requests).toMatchObject({ list: 2, metadata: 0, media: 0, total: 2 });
    tb.emulator.resetStats();
    const second = await run('ls', ['-l', join(m.path, 'five-hundred')]);
    expect(second.stdout).toBe(first.stdout);
    expect(tb.emulator.stats().requests.total).toBe(0);
    await unmount(m.path);
  });

  it('asks GCS once about a missing path within the negative TTL, and again after it', async () => {
    const m = await mount({ tb, args: ['--metadata-cache-negative-ttl-secs', '2'] });
    tb.emulator.resetStats();
    const missing = join(m.path, 'no-such-chunk');
    for (let i = 0; i < 2; i++) expect((await run('stat', [missing])).code).not.toBe(0);
    // The first lookup in the folder lists it from the name on (one page); that page answers the second stat.
    expect(tb.emulator.stats().requests).toMatchObject({ total: 1, list: 1 });
    await sleep(2_500);
    // The listing still answers for the names it shows, but "no such name" only within the negative TTL.
    expect((await run('stat', [missing])).code).not.toBe(0);
    expect(tb.emulator.stats().requests.total).toBe(2);
    await unmount(m.path);
  });

  it('answers 32 concurrent stats of one path with one request (a page of its folder from that name on)', async () => {
    const m = await mount({ tb });
    tb.emulator.resetStats();
    const results = await Promise.all(Array.from({ length: 32 }, () => run('stat', ['-c', '%s', join(m.path, 'present.txt')])));
    expect(results.map((r) => r.stdout.trim())).toEqual(Array(32).fill('4'));
    expect(tb.emulator.stats().requests).toMatchObject({ total: 1, list: 1 });
    await unmount(m.path);
  });

  it('answers 32 concurrent stats of one path with one request without metadata prefetch', async () => {
    const m = await mount({ tb, args: ['--enable-metadata-prefetch=false'] });
    tb.emulator.resetStats();
    const results = await Promise.all(Array.from({ length: 32 }, () => run('stat', ['-c', '%s', join(m.path, 'present.txt')])));
    expect(results.map((r) => r.stdout.trim())).toEqual(Array(32).fill('4'));
    expect(tb.emulator.stats().requests.total).toBe(1);
    await unmount(m.path);
  });

  it('answers correctly with a tiny stat cache', async () => {
    const m = await mount({ tb, args: ['--stat-cache-max-size-mb', '1', '--type-cache-max-size-mb', '1'] });
    const long: Record<string, string> = {};
    // About 1.5 MB of metadata against a 1 MiB budget: the listing cannot be kept, and most entries are
    // evicted before they are stat'ed. Fixed-width numbers keep each lookup's list page to one item.
    for (let i = 0; i < 1200; i++) long[`long-names/${'n'.repeat(235)}-${String(i).padStart(4, '0')}`] = String(i);
    await writeObjects(tb.root, tb.bucket, long);
    const r = await run('sh', ['-c', `cd ${join(m.path, 'long-names')} && stat -c '%n %s' * | sort`]);
    const expected = Object.entries(long).map(([k, v]) => `${k.slice('long-names/'.length)} ${v.length}`).sort();
    expect(r.stdout.trim().split('\n')).toEqual(expected);
    await unmount(m.path);
  });

  it('serves a replaced object (new generation) after the TTL, and never mixes generations in one open file', async () => {
    const MIB = 1024 * 1024;
    const old = bytes(12 * MIB, 7);
    const replacement = bytes(12 * MIB, 8);
    await upload(tb, 'replaced.bin', old);
    const m = await mount({ tb, args: ['--metadata-cache-ttl-secs', '1'] });
    const path = join(m.path, 'replaced.bin');
    expect(await sha256Of(path)).toBe(sha256(old));
    // A reader opens the old generation and reads its first block; then the object is replaced.
    // It holds the file open until told to go on, however long the steps below take.
    const reader = heldReader(`
import sys, hashlib
f = open(${JSON.stringify(path)}, 'rb')
head = f.read(${MIB})
sys.stdout.write('opened\\n'); sys.stdout.flush()
sys.stdin.readline()
try:
    print(hashlib.sha256(head + f.read()).hexdigest())
except OSError as e:
    print('error', e.errno)
`);
    await reader.opened;
    await upload(tb, 'replaced.bin', replacement);
    await sleep(1_500); // past the 1 s TTL: time itself is what is tested
    // Past the TTL, but the reader still holds the old generation open: every open sees that one, so
    // the kernel's page cache (one per inode, shared by all opens) never takes in bytes of the new one.
    const during = await run('sha256sum', [path]);
    expect([sha256(old), '']).toContain(during.stdout.split(' ')[0]);
    reader.proceed();
    const out = (await reader.done).stdout.trim().split('\n');
    expect(out[0]).toBe('opened');
    // The open file pinned the old generation: it reads all of it, or fails with ESTALE (116: the
    // generation is gone, as gcsfuse answers, since 0585b93); it never mixes in new bytes.
    expect([sha256(old), 'error 116']).toContain(out[1]);
    // Once it is released (the kernel sends release asynchronously after close), the new generation is served.
    await eventually(async () => (await sha256Of(path).catch(() => '')) === sha256(replacement), 5_000);
    await unmount(m.path);
  });
});

describe('a Zarr store opened with xarray through the mount', () => {
  let tb: TestBucket;
  let m: Mounted;
  /**
   * Requests of the first, cold open, measured here (21: 13 lookups, 8 reads: .zmetadata, three
   * coordinates, four chunks of time 0) and kept as the number it must not exceed.
   */
  const COLD_OPEN_MAX_REQUESTS = 21;

  beforeAll(async () => {
    tb = await startBucket('zarr');
    const store = join(tb.root, tb.bucket, 'era.zarr');
    const w = await run(PY, ['-c', `
import numpy as np, xarray as xr, zarr
t = np.arange(8)
temp = np.random.default_rng(1).normal(size=(8, 40, 60)).astype('float32')
temp[4:, :20, :] = np.nan   # chunks of NaN only are not written: zarr reads them as fill value
ds = xr.Dataset({'temp': (('time', 'y', 'x'), temp), 'mask': (('y', 'x'), (np.arange(2400).reshape(40, 60) % 7).astype('int16'))},
                coords={'time': t, 'y': np.arange(40), 'x': np.arange(60)})
enc = {'temp': {'chunks': (4, 20, 30), 'write_empty_chunks': False}, 'mask': {'chunks': (20, 30)}}
ds.to_zarr(${JSON.stringify(store)}, mode='w', consolidated=True, encoding=enc)
`]);
    expect(w.stderr).not.toMatch(/Traceback/);
    // The open's own cost: prefetch would add the GETs of its bet on the chunks after those the open
    // read (and of each array's .zarray); what it adds and saves is counted in test/prefetch.test.ts.
    // "Within the TTL" for the names zarr probes and does not find too: a cold open on a loaded machine
    // can outlast the 5 s default negative TTL, and then the warm open rightly asks again.
    m = await mount({ tb, args: ['--prefetch-zarr=false', '--prefetch-siblings=false', '--metadata-cache-negative-ttl-secs', '600'] });
  });

  afterAll(async () => {
    await cleanupAll();
    await tb?.emulator.close();
  });

  const openZarr = () =>
    run(PY, ['-c', `
import numpy as np, xarray as xr
ds = xr.open_zarr(${JSON.stringify(join(m.path, 'era.zarr'))})
local = xr.open_zarr(${JSON.stringify(join(tb.root, tb.bucket, 'era.zarr'))})
assert list(ds.data_vars) == ['mask', 'temp'] or sorted(ds.data_vars) == ['mask', 'temp'], list(ds.data_vars)
print(ds.temp.shape, bool(ds.temp.isel(time=0).equals(local.temp.isel(time=0))))
`]);

  it('costs no request on a second open within the TTL', async () => {
    tb.emulator.resetStats();
    const cold = await openZarr();
    expect(cold.stderr).not.toMatch(/Traceback/);
    expect(cold.stdout.trim()).toBe('(8, 40, 60) True');
    const coldRequests = tb.emulator.stats().requests.total;
    expect(coldRequests).toBeGreaterThan(0);
    expect(coldRequests).toBeLessThanOrEqual(COLD_OPEN_MAX_REQUESTS);
    tb.emulator.resetStats();
    const warm = await openZarr();
    expect(warm.stdout).toBe(cold.stdout);
    expect(tb.emulator.stats().requests.total).toBe(0);
  });
});

import { promises as fsp } from 'node:fs';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { cleanupAll, eventually, mount, run, startBucket, tempDir, unmount, writeObjects, type TestBucket } from './helpers/harness.js';

/**
 * Prefetch, judged by the emulator's request log: chunk files a reader walks in C order (or files of a
 * folder in name order) are downloaded before the reader opens them, missing (fill-value) chunks are
 * never asked for, a shuffled reader costs no more than 1.5x what it reads, and a replaced object is
 * never served from what was prefetched. The readers are other processes (cat), one file at a time.
 */

const CHUNK = 32 * 1024;

function bytesOf(label: string, size = CHUNK): Buffer {
  const b = Buffer.alloc(size);
  for (let i = 0; i < size; i++) b[i] = (label.charCodeAt(i % label.length) + i) & 0xff;
  return b;
}

/** cat of each path, one after another, in one shell process; the bytes go to sha-less /dev/null but must be read. */
async function catInOrder(paths: string[]): Promise<void> {
  const r = await run('sh', ['-c', 'for f in "$@"; do cat "$f" > /dev/null || exit 1; done', 'sh', ...paths], { timeoutMs: 120_000 });
  expect(r.code, r.stderr).toBe(0);
}

describe('prefetch of files not yet opened', () => {
  let tb: TestBucket;
  const mediaOf = (name: string) => tb.emulator.requestLog().filter((e) => e.kind === 'media' && e.object === name);
  const anyOf = (name: string) => tb.emulator.requestLog().filter((e) => e.object === name);

  beforeAll(async () => {
    // Every request costs a round trip, so a prefetch is worth something and a test can watch it happen.
    tb = await startBucket('prefetch', { latencyMs: 20 });
    const objects: Record<string, Buffer | string> = {};
    // v2, '.' separator: 6 x 8 chunks, one row of them missing (fill values).
    objects['dot/.zarray'] = JSON.stringify({ zarr_format: 2, shape: [6, 8], chunks: [1, 1], dtype: '<f8', dimension_separator: '.' });
    for (let i = 0; i < 6; i++) for (let j = 0; j < 8; j++) if (i !== 3) objects[`dot/${i}.${j}`] = bytesOf(`dot${i}.${j}`);
    // v2, '/' separator.
    objects['slash/.zarray'] = JSON.stringify({ zarr_format: 2, shape: [3, 4], chunks: [1, 1], dimension_separator: '/' });
    for (let i = 0; i < 3; i++) for (let j = 0; j < 4; j++) objects[`slash/${i}/${j}`] = bytesOf(`slash${i}/${j}`);
    // v3, default chunk key encoding.
    objects['v3/zarr.json'] = JSON.stringify({ zarr_format: 3, node_type: 'array', shape: [2, 6], chunk_grid: { name: 'regular', configuration: { chunk_shape: [1, 1] } } });
    for (let i = 0; i < 2; i++) for (let j = 0; j < 6; j++) objects[`v3/c/${i}/${j}`] = bytesOf(`v3${i}/${j}`);
    // A big array for the shuffled reader: 400 chunks.
    objects['big/.zarray'] = JSON.stringify({ zarr_format: 2, shape: [20, 20], chunks: [1, 1] });
    for (let i = 0; i < 20; i++) for (let j = 0; j < 20; j++) objects[`big/${i}.${j}`] = bytesOf(`big${i}.${j}`, 16 * 1024);
    // A WebDataset-style file series.
    for (let i = 0; i < 12; i++) objects[`shards/shard-${String(i).padStart(6, '0')}.tar`] = bytesOf(`shard${i}`, 100 * 1024);
    // A consolidated v2 store (what xarray's to_zarr writes): a group, a nested group, .zmetadata at the
    // root naming both arrays; their .zarray files exist too, as in every consolidated store.
    const consA = { zarr_format: 2, shape: [1, 8], chunks: [1, 1], dtype: '<f8' };
    const consB = { zarr_format: 2, shape: [8], chunks: [1], dtype: '<f8' };
    objects['cons/.zgroup'] = JSON.stringify({ zarr_format: 2 });
    objects['cons/inner/.zgroup'] = JSON.stringify({ zarr_format: 2 });
    objects['cons/.zmetadata'] = JSON.stringify({
      zarr_consolidated_format: 1,
      metadata: { '.zgroup': { zarr_format: 2 }, 'a/.zarray': consA, 'inner/.zgroup': { zarr_format: 2 }, 'inner/b/.zarray': consB },
    });
    objects['cons/a/.zarray'] = JSON.stringify(consA);
    objects['cons/inner/b/.zarray'] = JSON.stringify(consB);
    for (let j = 0; j < 8; j++) objects[`cons/a/0.${j}`] = bytesOf(`consa${j}`);
    for (let j = 0; j < 8; j++) objects[`cons/inner/b/${j}`] = bytesOf(`consb${j}`);
    // For the replaced-object test.
    objects['swap/.zarray'] = JSON.stringify({ zarr_format: 2, shape: [1, 8], chunks: [1, 1] });
    for (let j = 0; j < 8; j++) objects[`swap/0.${j}`] = bytesOf(`swap-old${j}`);
    await writeObjects(tb.root, tb.bucket, objects);
  });

  afterAll(async () => {
    await cleanupAll();
    await tb?.emulator.close();
    if (tb) await fsp.rm(tb.root, { recursive: true, force: true });
  });

  for (const cacheArgs of [[] as string[], ['--cache-dir']] as const) {
    const label = cacheArgs.length ? 'with a disk cache' : 'in memory';
    it(`v2 '.' array read in C order: later chunks arrive before they are opened, fill chunks never asked (${label})`, { timeout: 120_000 }, async () => {
      const args = cacheArgs.length ? ['--cache-dir', await tempDir('pf-cache')] : [];
      const m = await mount({ tb, args });
      tb.emulator.resetStats();
      const order: string[] = [];
      for (let i = 0; i < 6; i++) for (let j = 0; j < 8; j++) if (i !== 3) order.push(`dot/${i}.${j}`);
      // xarray reads the array's metadata first, then the chunks.
      await catInOrder([join(m.path, 'dot/.zarray'), ...order.slice(0, 10).map((k) => join(m.path, k))]);
      // Not opened yet, already here (or on the way): the next chunks, across the missing row too.
      await eventually(async () => mediaOf('dot/2.4').length === 1 && mediaOf('dot/2.5').length === 1, 15_000).catch((err: unknown) => {
        console.log(tb.emulator.requestLog().map((e) => `${e.seq} ${e.kind} ${e.object} ${e.status}`).join('\n'));
        throw err;
      });
      await new Promise((r) => setTimeout(r, 500)); // let any download on its way land
      // Reading the prefetched ones now costs no media request at read time.
      const seqBefore = Math.max(...tb.emulator.requestLog().map((e) => e.seq));
      await catInOrder(['dot/1.2', 'dot/1.3'].map((k) => join(m.path, k)));
      const atRead = tb.emulator.requestLog().filter((e) => e.seq > seqBefore && (e.object === 'dot/1.2' || e.object === 'dot/1.3'));
      expect(atRead).toEqual([]);
      // The rest, in order: each chunk fetched exactly once, whether by prefetch or by its read.
      await catInOrder(order.slice(12).map((k) => join(m.path, k)));
      for (const k of order) expect(mediaOf(k).length, k).toBe(1);
      for (let j = 0; j < 8; j++) expect(anyOf(`dot/3.${j}`), `fill chunk 3.${j}`).toEqual([]);
      const stats = await run(join(process.cwd(), 'bin/gcsmount'), ['stats', m.path, '--json']);
      const c = (JSON.parse(stats.stdout) as { counters: Record<string, number> }).counters;
      console.log(label, JSON.stringify(Object.fromEntries(Object.entries(c).filter(([k]) => k.startsWith("prefetch") || k.startsWith("gcs_req")))));
      expect(c.prefetch_files).toBeGreaterThan(20);
      expect(c.prefetch_used_files).toBe(c.prefetch_files);
      expect(c.prefetch_fill_skipped).toBeGreaterThan(0);
      // On disk, a prefetched chunk nobody waited for is also loaded into the native path's memory, so
      // its open reads no disk either.
      if (cacheArgs.length) expect(c.native_preloads).toBeGreaterThan(10);
      await unmount(m.path);
    });
  }

  it("follows v2 '/' keys and v3 c/… keys", { timeout: 60_000 }, async () => {
    const m = await mount({ tb });
    tb.emulator.resetStats();
    await catInOrder(['slash/.zarray', 'slash/0/0', 'slash/0/1', 'slash/0/2'].map((k) => join(m.path, k)));
    await eventually(async () => mediaOf('slash/0/3').length === 1 && mediaOf('slash/1/0').length === 1);
    await catInOrder(['v3/zarr.json', 'v3/c/0/0', 'v3/c/0/1', 'v3/c/0/2'].map((k) => join(m.path, k)));
    await eventually(async () => mediaOf('v3/c/0/3').length === 1 && mediaOf('v3/c/0/4').length === 1);
    await unmount(m.path);
  });

  it('takes array layouts from a consolidated store\'s .zmetadata: no GET of any .zarray', { timeout: 60_000 }, async () => {
    // With a disk cache the .zmetadata the reader read is where the prefetcher finds it (without one,
    // the prefetcher reads it once more: one GET per store instead of one per array).
    const m = await mount({ tb, args: ['--cache-dir', await tempDir('pf-cons')] });
    tb.emulator.resetStats();
    // xarray.open_zarr reads the root's .zmetadata once, then only chunks.
    await catInOrder(['cons/.zmetadata', 'cons/a/0.0', 'cons/a/0.1', 'cons/a/0.2'].map((k) => join(m.path, k)));
    await eventually(async () => mediaOf('cons/a/0.3').length === 1 && mediaOf('cons/a/0.4').length === 1);
    await catInOrder(['cons/inner/b/0', 'cons/inner/b/1', 'cons/inner/b/2'].map((k) => join(m.path, k)));
    await eventually(async () => mediaOf('cons/inner/b/3').length === 1 && mediaOf('cons/inner/b/4').length === 1);
    expect(mediaOf('cons/.zmetadata').length).toBe(1);
    expect(anyOf('cons/a/.zarray')).toEqual([]);
    expect(anyOf('cons/inner/b/.zarray')).toEqual([]);
    const stats = await run(join(process.cwd(), 'bin/gcsmount'), ['stats', m.path, '--json']);
    expect((JSON.parse(stats.stdout) as { counters: Record<string, number> }).counters.prefetch_consolidated_layouts).toBe(2);
    await unmount(m.path);
  });

  it('a shuffled reader of 10% of the chunks fetches no more than 1.5x the bytes it reads', { timeout: 120_000 }, async () => {
    const m = await mount({ tb });
    tb.emulator.resetStats();
    await catInOrder([join(m.path, 'big/.zarray')]);
    let seed = 42;
    const rand = () => (seed = (seed * 1103515245 + 12345) % 2 ** 31) / 2 ** 31;
    const all = Array.from({ length: 400 }, (_, n) => `big/${Math.floor(n / 20)}.${n % 20}`);
    for (let i = all.length - 1; i > 0; i--) {
      const k = Math.floor(rand() * (i + 1));
      [all[i], all[k]] = [all[k]!, all[i]!];
    }
    const picked = all.slice(0, 40);
    await catInOrder(picked.map((k) => join(m.path, k)));
    await new Promise((r) => setTimeout(r, 500));
    const chunkBytes = tb.emulator
      .requestLog()
      .filter((e) => e.kind === 'media' && e.object!.startsWith('big/') && e.object !== 'big/.zarray')
      .reduce((n, e) => n + e.bytes, 0);
    const read = picked.length * 16 * 1024;
    console.log(`shuffled reader: read ${read} bytes of chunks, fetched ${chunkBytes}`);
    expect(chunkBytes).toBeGreaterThanOrEqual(read);
    expect(chunkBytes).toBeLessThanOrEqual(1.5 * read);
    await unmount(m.path);
  });

  it('files of a folder read in name order: the next ones arrive before they are opened', { timeout: 60_000 }, async () => {
    const m = await mount({ tb });
    tb.emulator.resetStats();
    const names = Array.from({ length: 12 }, (_, i) => `shards/shard-${String(i).padStart(6, '0')}.tar`);
    await catInOrder(names.slice(0, 4).map((k) => join(m.path, k)));
    await eventually(async () => mediaOf(names[4]!).length === 1 && mediaOf(names[5]!).length === 1);
    await catInOrder(names.slice(4).map((k) => join(m.path, k)));
    for (const n of names) expect(mediaOf(n).length, n).toBe(1);
    await unmount(m.path);
  });

  it('a replaced object is never served from what was prefetched', { timeout: 60_000 }, async () => {
    // Metadata TTL 0: every open asks GCS, so the open right after the replacement sees the new generation.
    const m = await mount({ tb, args: ['--metadata-cache-ttl-secs', '0'] });
    tb.emulator.resetStats();
    await catInOrder(['swap/.zarray', 'swap/0.0', 'swap/0.1', 'swap/0.2'].map((k) => join(m.path, k)));
    await eventually(async () => mediaOf('swap/0.3').length === 1);
    await new Promise((r) => setTimeout(r, 300));
    const oldGeneration = tb.emulator.requestLog().find((e) => e.kind === 'media' && e.object === 'swap/0.3');
    expect(oldGeneration).toBeDefined();
    // Replace it, with a newer mtime (the emulator's generation).
    const file = join(tb.root, tb.bucket, 'swap/0.3');
    const fresh = bytesOf('swap-NEW-3');
    await fsp.writeFile(file, fresh);
    const later = new Date(Date.now() + 60_000);
    await fsp.utimes(file, later, later);
    const r = await run('sha256sum', [join(m.path, 'swap/0.3')]);
    const expected = (await run('sha256sum', [file])).stdout.split(' ')[0];
    expect(r.stdout.split(' ')[0]).toBe(expected);
    // The new generation was downloaded for the read: the prefetched blocks were not served for it.
    expect(mediaOf('swap/0.3').length).toBe(2);
    await unmount(m.path);
  });
});

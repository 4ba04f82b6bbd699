import { spawn } from 'node:child_process';
import { closeSync, openSync, promises as fsp } from 'node:fs';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { ObjectMeta } from '../src/gcs/object-client.js';
import { compareKeys, Listing, listingOf } from '../src/namespace/listing.js';
import { ListingRun } from '../src/namespace/listing-run.js';
import { MetadataCache } from '../src/namespace/metadata-cache.js';
import { ListWorkers } from '../src/namespace/list-workers.js';
import { RangeLister, type FetchedPage } from '../src/namespace/range-lister.js';
import { splitPoints } from '../src/namespace/split-points.js';
import { Metrics } from '../src/observe/metrics.js';
import type { RequestLogEntry } from '../src/emulator/server.js';
import { cleanupAll, eventually, mount, mountStats, run, startBucket, unmount, type TestBucket } from './helpers/harness.js';

const MIB = 1024 * 1024;
const meta = (name: string, i: number): ObjectMeta => ({ name, size: i, generation: String(1_700_000_000_000_000 + i), metageneration: '1', updatedMs: 1_700_000_000_000 + i, crc32c: 'AAAAAA==' });
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

/** Creates `n` empty objects `${dir}/${name(i)}` straight in the emulator's folder: seconds for 100,000. */
function emptyObjects(tb: TestBucket, dir: string, n: number, name: (i: number) => string): void {
  for (let i = 0; i < n; i++) closeSync(openSync(join(tb.root, tb.bucket, dir, name(i)), 'w'));
}

/**
 * How the list requests of `log` cover `sorted` (every name of the folder, in name order): each page is
 * one run of it, so a page is the span of indices from its first name to its last. `overlap`: the most
 * names any two pages share; `repeated`: names returned beyond the first time.
 */
function pageOverlaps(log: RequestLogEntry[], sorted: readonly string[]): { pages: number; names: number; overlap: number; repeated: number } {
  const index = new Map(sorted.map((n, i) => [n, i]));
  const spans: [number, number][] = [];
  let names = 0;
  for (const e of log) {
    if (e.kind !== 'list' || !e.list || e.list.count === 0) continue;
    const from = index.get(e.list.first!);
    const to = index.get(e.list.last!);
    expect(from, e.list.first!).toBeDefined();
    expect(to! - from! + 1, JSON.stringify(e.list)).toBe(e.list.count);
    spans.push([from!, to!]);
    names += e.list.count;
  }
  spans.sort((a, b) => a[0] - b[0]);
  let overlap = 0;
  let reach = -1;
  let distinct = 0;
  for (const [from, to] of spans) {
    overlap = Math.max(overlap, Math.min(reach, to) - from + 1);
    distinct += Math.max(0, to - Math.max(from, reach + 1) + 1);
    reach = Math.max(reach, to);
  }
  return { pages: spans.length, names, overlap, repeated: names - distinct };
}

describe('compact listings', () => {
  it('hold 100,000 entries in well under 20 MiB, answer by binary search, and round-trip every field', () => {
    const keys = Array.from({ length: 100_000 }, (_, i) => `c.${i}`).sort(compareKeys);
    const listing = new Listing('era5/t2m/');
    for (let at = 0; at < keys.length; at += 1000) {
      const page = keys.slice(at, at + 1000);
      listing.add(ListingRun.of(page, page.map((k) => meta(`era5/t2m/${k}`, Number(k.slice(2))))));
    }
    listing.compact(() => undefined);
    expect(listing.count).toBe(100_000);
    expect(listing.bytes).toBeLessThan(8 * MIB);
    expect(listing.get('c.54321')).toEqual({ kind: 'file', meta: meta('era5/t2m/c.54321', 54321) });
    expect(listing.get('c.100000')).toBeNull();
    expect(listing.names()).toEqual(keys);
  });

  it('keep generations beyond 2^53 and odd CRCs exactly, show a directory over a same-named file', () => {
    const odd: ObjectMeta = { name: 'p/x', size: 5, generation: '12345678901234567890', metageneration: '3', updatedMs: 7, crc32c: null };
    const conflicts: string[] = [];
    const listing = listingOf('p/', [
      { name: 'x', entry: { kind: 'file', meta: odd } },
      { name: 'x', entry: { kind: 'dir', mtimeMs: null } },
      { name: 'x.1', entry: { kind: 'file', meta: { ...odd, name: 'p/x.1', generation: '1' } } },
    ], (n) => conflicts.push(n));
    expect(listing.get('x')).toEqual({ kind: 'dir', mtimeMs: null });
    expect(listing.names()).toEqual(['x.1', 'x']); // key order: 'x.1' < 'x/'
    expect(conflicts).toEqual(['p/x']);
    const alone = listingOf('p/', [{ name: 'x', entry: { kind: 'file', meta: odd } }]);
    expect(alone.get('x')).toEqual({ kind: 'file', meta: odd });
  });

  it('number the files by binary search and give the files next to one, across pages that share a key', () => {
    const fileKeys = Array.from({ length: 30 }, (_, i) => `c.${i}`).sort(compareKeys);
    const keys = [...fileKeys, 'c.1/', 'c.2/', 'd/'].sort(compareKeys); // folders among the files
    const listing = new Listing('z/');
    // Pages meet at a key both hold, and arrive out of order.
    for (const [from, to] of [[20, keys.length], [0, 11], [10, 21]] as const) {
      const page = keys.slice(from, to);
      listing.add(ListingRun.of(page, page.map((k) => (k.endsWith('/') ? null : meta(`z/${k}`, 1)))));
    }
    const ordinals = fileKeys.map((k) => listing.fileOrdinal(k));
    // A file's index among the files: the next file is one further on, whatever folders sit between
    // them (a reader's stream is judged by these steps).
    expect(ordinals).toEqual(fileKeys.map((_, i) => i));
    fileKeys.forEach((_, i) => {
      expect(listing.filesFrom(ordinals[i]!, 1, 3).map((f) => f.name)).toEqual(fileKeys.slice(i + 1, i + 4));
      expect(listing.filesFrom(ordinals[i]!, -1, 2).map((f) => f.name)).toEqual(fileKeys.slice(Math.max(0, i - 2), i).reverse());
    });
    expect(listing.fileOrdinal('c.30')).toBe(-1);
    expect(listing.fileOrdinal('d')).toBe(-1); // a folder, not a file
    // A file under a folder of the same name is not visible, so neither placed nor given.
    const shadowed = listingOf('p/', [
      { name: 'a', entry: { kind: 'file', meta: meta('p/a', 1) } },
      { name: 'x', entry: { kind: 'file', meta: meta('p/x', 1) } },
      { name: 'x', entry: { kind: 'dir', mtimeMs: null } },
      { name: 'y', entry: { kind: 'file', meta: meta('p/y', 1) } },
    ]);
    expect(shadowed.fileOrdinal('x')).toBe(-1);
    expect(shadowed.fileOrdinal('y')).toBe(1);
    expect(shadowed.filesFrom(shadowed.fileOrdinal('a'), 1, 5)).toEqual([{ name: 'y', meta: meta('p/y', 1) }]);
  });

  it('are evicted as whole folders, least recently used, and one larger than the budget is never kept', () => {
    const metrics = new Metrics();
    const cache = new MetadataCache({ ttl: { kind: 'ms', ms: 60_000 }, negativeTtl: { kind: 'ms', ms: 5_000 }, statBudget: { kind: 'bytes', bytes: 3 * MIB }, typeBudget: { kind: 'bytes', bytes: MIB } }, metrics);
    const folder = (n: number, tag: string) => listingOf(`${tag}/`, Array.from({ length: n }, (_, i) => ({ name: `chunk-${i}`, entry: { kind: 'file' as const, meta: meta(`${tag}/chunk-${i}`, i) } })));
    const a = folder(20_000, 'a');
    const b = folder(20_000, 'b');
    expect(a.bytes).toBeGreaterThan(MIB);
    expect(cache.rememberListing('/a', a)).toBe(true);
    expect(cache.rememberListing('/b', b)).toBe(true);
    expect(cache.listing('/a')).toBe(a); // a is now the most recently used
    expect(cache.rememberListing('/c', folder(20_000, 'c'))).toBe(true);
    expect(cache.listing('/b')).toBeUndefined(); // evicted whole
    expect(cache.lookup('/a/chunk-19999', '/a')).toMatchObject({ kind: 'file' });
    // Larger than the whole budget: refused, and the others stay.
    expect(cache.rememberListing('/huge', folder(100_000, 'huge'))).toBe(false);
    expect(cache.listing('/a')).toBe(a);
    const g = metrics.snapshot().gauges;
    expect(g.meta_listing_folders).toBe(2);
    expect(g.meta_listing_entries).toBe(40_000);
    expect(g.meta_listing_bytes).toBeLessThanOrEqual(3 * MIB);
  });
});

describe('splitting a listing into parts', () => {
  it('cuts after a page at the characters its names use where they vary, one position back first, within the part', () => {
    // The first page of the names 0..99999: '0', '1', '10', '100', '1000', '10000' ... '10897'.
    const page = Array.from({ length: 100_000 }, (_, i) => String(i)).sort(compareKeys).slice(0, 1000);
    expect(splitPoints(page.at(-1)!, null, page, 9, true)).toEqual(['2', '3', '4', '5', '6', '7', '8', '9']);
    const mid = Array.from({ length: 900 }, (_, i) => `c.${53421 + i}`);
    expect(splitPoints(mid.at(-1)!, null, mid, 9, true)).toEqual(['c.55', 'c.56', 'c.57', 'c.58', 'c.59', 'c.6', 'c.7', 'c.8', 'c.9']);
    expect(splitPoints(mid.at(-1)!, 'c.57', mid, 9, true)).toEqual(['c.55', 'c.56']);
    // Zero-padded names: parts of 10,000 names ('c01'..), not of one page ('c001'..), which would cost a
    // request each to find where the page's part ends.
    const padded = Array.from({ length: 1000 }, (_, i) => `c${String(i).padStart(6, '0')}`);
    expect(splitPoints(padded.at(-1)!, null, padded, 9, true)).toEqual(['c01', 'c02', 'c03', 'c04', 'c05', 'c06', 'c07', 'c08', 'c09']);
    // With a delimiter a key is one name: never a point inside a sub-folder's range ('a/c'); a position
    // holding a character the names do not vary in ('/') is no place to cut.
    expect(splitPoints('a/b', null, ['a/a', 'a/b', 'a/c'], 3, true)).toEqual(['b', 'c']);
    expect(splitPoints('a/b', null, ['a/a', 'a/b', 'a/c'], 3, false)).toEqual(['a/c', 'b', 'c']);
  });
});

describe('a listing in parts', () => {
  /** GCS over a sorted array of names (no delimiter), with pages of 50 and a little latency. */
  function fakeFolder(names: string[]) {
    const sorted = [...names].sort(compareKeys);
    let requests = 0;
    const fetch = async (start: string, end: string | null): Promise<FetchedPage> => {
      requests++;
      await sleep(1 + Math.random() * 4);
      const from = sorted.findIndex((n) => compareKeys(n, start) >= 0);
      const rest = from < 0 ? [] : sorted.slice(from).filter((n) => end === null || compareKeys(n, end) < 0);
      const keys = rest.slice(0, 50);
      return { keys, metas: keys.map((k, i) => meta(k, i)), lastKey: keys.at(-1) ?? null, more: rest.length > 50 };
    };
    return { sorted, fetch, requests: () => requests };
  }

  it("goes on with GCS's page token, sent with the very offsets of the request that gave it", async () => {
    const names = Array.from({ length: 5000 }, (_, i) => `c${String(i).padStart(5, '0')}`);
    const sorted = [...names].sort(compareKeys);
    const issued = new Map<string, { start: string; end: string | null }>();
    let requests = 0;
    let repeated = 0;
    const seen = new Set<string>();
    const fetch = async (start: string, end: string | null, token?: string): Promise<FetchedPage> => {
      requests++;
      await sleep(1 + Math.random() * 3);
      let from = sorted.findIndex((n) => compareKeys(n, start) >= 0);
      if (token !== undefined) {
        const origin = issued.get(token);
        // GCS answers a token only with the query that gave it.
        expect(origin).toEqual({ start, end });
        from = Number(token.split(':')[1]);
      }
      const rest = from < 0 ? [] : sorted.slice(from).filter((n) => end === null || compareKeys(n, end) < 0);
      const keys = rest.slice(0, 100);
      for (const k of keys) if (seen.has(k)) repeated++; else seen.add(k);
      let nextPageToken: string | null = null;
      if (rest.length > 100) {
        nextPageToken = `t${requests}:${from + 100}`;
        issued.set(nextPageToken, { start, end });
      }
      return { keys, metas: keys.map((k, i) => meta(k, i)), lastKey: keys.at(-1) ?? null, more: nextPageToken !== null, nextPageToken };
    };
    const listing = new Listing('');
    const lister = new RangeLister({ fetch, onPage: (k, m) => listing.add(ListingRun.of(k, m)), workers: new ListWorkers(10), maxParallel: 10, delimited: true });
    lister.start('', true);
    await lister.finish();
    listing.compact(() => undefined);
    expect(listing.names()).toEqual(sorted);
    // A part that goes on by token never lists its last key again: a key is seen twice only where a part
    // was cut and starts afresh at its cursor (a few dozen cuts at most), not once per page as with offsets.
    expect(repeated).toBeLessThanOrEqual(25);
    // 50 pages, plus guessed parts past the last name (c05..c09) and pages that find where a cut part ends.
    expect(requests).toBeLessThan(50 + 30);
  });

  it('fetches a page a reader waits for even when the walk is paused (once it hung for good)', async () => {
    const workers = new ListWorkers(1);
    let paused = false;
    let n = 0;
    const fetch = async (start: string): Promise<FetchedPage> => {
      await sleep(10);
      if (start === '') return { keys: ['a'], metas: [meta('a', 0)], lastKey: 'a', more: false };
      n++;
      const k = `m/${String(n).padStart(3, '0')}`;
      return { keys: [k], metas: [meta(k, n)], lastKey: k, more: n < 3, nextPageToken: n < 3 ? `t${n}` : null };
    };
    const lister = new RangeLister({ fetch, onPage: () => undefined, workers, maxParallel: 10, delimited: false, paused: () => paused });
    lister.start('', false, ['m/']);
    // The part [m/, ...) takes the only worker for its first page; another walk's page queues behind it.
    await sleep(5);
    void workers.run(() => sleep(300).then(() => undefined));
    await sleep(50); // m/'s first page is in; its next waits in the queue
    paused = true; // the walk is now far ahead of its reader
    const covered = await Promise.race([lister.coverRange('m/', 'm0').then(() => 'covered'), sleep(3000).then(() => 'hung')]);
    expect(covered).toBe('covered');
    expect(n).toBe(3);
  });

  it("asks a short first page for a lookup's own part, and full pages for the rest", async () => {
    const sorted = Array.from({ length: 2000 }, (_, i) => `c.${i}`).sort(compareKeys);
    const asked: { start: string; small: boolean }[] = [];
    const fetch = async (start: string, end: string | null, _token?: string, small = false): Promise<FetchedPage> => {
      asked.push({ start, small });
      await sleep(1);
      const from = sorted.findIndex((n) => compareKeys(n, start) >= 0);
      const rest = from < 0 ? [] : sorted.slice(from).filter((n) => end === null || compareKeys(n, end) < 0);
      const keys = rest.slice(0, small ? 10 : 100);
      return { keys, metas: keys.map((k, i) => meta(k, i)), lastKey: keys.at(-1) ?? null, more: rest.length > keys.length };
    };
    const listing = new Listing('');
    const lister = new RangeLister({ fetch, onPage: (k, m) => listing.add(ListingRun.of(k, m)), workers: new ListWorkers(2), maxParallel: 2, delimited: true });
    // A lookup of c.1500 starts the background listing; another lookup cuts a part at c.700.
    lister.start('c.1500', false);
    await lister.cover('c.1500');
    await lister.cover('c.700');
    expect(listing.get('c.700')).not.toBeNull();
    await lister.finish();
    listing.compact(() => undefined);
    expect(listing.names()).toEqual(sorted);
    const smalls = asked.filter((a) => a.small).map((a) => a.start);
    expect(smalls.sort()).toEqual(['c.1500', 'c.700']);
    // Everything else (the part before, the pages after a lookup's first) in full pages.
    expect(asked.filter((a) => !a.small).length).toBeGreaterThan(10);
  });

  it('answers every name it covers, present or absent, before and after the offset, and ends complete', async () => {
    const names = Array.from({ length: 3000 }, (_, i) => `k${(i * 7919) % 100_003}`);
    const folder = fakeFolder(names);
    const truth = new Set(names);
    const listing = new Listing('');
    const lister = new RangeLister({ fetch: folder.fetch, onPage: (k, m) => listing.add(ListingRun.of(k, m)), workers: new ListWorkers(4), maxParallel: 4, delimited: true });
    lister.start('k5', false);
    const probes = Array.from({ length: 300 }, (_, i) => (i % 3 === 0 ? `k${i * 331}` : folder.sorted[(i * 97) % folder.sorted.length]!));
    await Promise.all(
      probes.map(async (name, i) => {
        await sleep(i % 20);
        // Whatever is covered at any moment must be right, absent names included.
        if (lister.covers(name)) expect(listing.get(name) !== null, name).toBe(truth.has(name));
        await lister.cover(name);
        expect(listing.get(name) !== null, name).toBe(truth.has(name));
      }),
    );
    await lister.finish();
    listing.compact(() => undefined);
    expect(listing.names()).toEqual(folder.sorted);
    // Parts and the lookups' own pages, but nothing like a page per lookup on top of the listing.
    expect(folder.requests()).toBeLessThan(3000 / 50 + 300);
  });
});

describe('metadata at scale through the mount', () => {
  let tb: TestBucket;

  beforeAll(async () => {
    tb = await startBucket('scale');
  });

  afterAll(async () => {
    await cleanupAll();
    await tb?.emulator.close();
  });

  it('lists a 100,000-object folder once; ls again costs no request; stats shows the listing and its bytes', async () => {
    await fsp.mkdir(join(tb.root, tb.bucket, 'big'), { recursive: true });
    emptyObjects(tb, 'big', 100_000, (i) => `c.${i}`);
    const m = await mount({ tb });
    tb.emulator.resetStats();
    const first = await run('ls', ['-f', join(m.path, 'big')], { timeoutMs: 170_000 });
    expect(first.code, first.stderr).toBe(0);
    expect(first.stdout.trim().split('\n')).toHaveLength(100_002); // with . and ..
    const cold = tb.emulator.stats().requests;
    expect(cold.metadata + cold.media).toBe(0);
    expect(cold.list).toBeGreaterThanOrEqual(100);
    // The lookup of big (its own short page, from the root) aside, the folder's listing in parts, read
    // name by name from the log: parts never overlap by more than the key where they meet, so no page
    // is fetched twice. A part goes on by GCS's page token and repeats no key; only a part cut shorter
    // (its token would list on past its new end) starts afresh at its cursor, repeating that one key.
    // Measured 12-14 repeated names; 92-93 with no page token kept (each page starts at its cursor);
    // 5,986-6,330 (pages of 1,000 twice) with a token kept across a cut, listing on into the next part.
    const sorted = Array.from({ length: 100_000 }, (_, i) => `big/c.${i}`).sort(compareKeys);
    const parts = pageOverlaps(tb.emulator.requestLog().filter((e) => e.list?.prefix === 'big/'), sorted);
    console.log(`ls -f of 100,000 names: ${cold.list} list requests; the folder's pages: ${JSON.stringify(parts)}`);
    expect(parts.overlap).toBeLessThanOrEqual(1);
    expect(parts.repeated).toBeLessThanOrEqual(30);
    // 100 full pages, and a short last page for each part (a few dozen parts at most). Measured
    // 112-116; 163-174 with split points cut at the nearest varying position first (parts a page long,
    // two requests each) instead of one position back.
    expect(cold.list).toBeLessThan(135);
    tb.emulator.resetStats();
    const second = await run('ls', ['-f', join(m.path, 'big')], { timeoutMs: 60_000 });
    expect(second.stdout).toBe(first.stdout);
    expect(tb.emulator.stats().requests.total).toBe(0);
    // Every name is answered from the listing too.
    const some = await run('stat', ['-c', '%n', ...[7, 54321, 99999].map((i) => join(m.path, 'big', `c.${i}`))]);
    expect(some.code).toBe(0);
    expect(tb.emulator.stats().requests.total).toBe(0);
    const { gauges } = await mountStats(m.path);
    expect(gauges.meta_listing_entries).toBeGreaterThanOrEqual(100_000);
    expect(gauges.meta_listing_bytes).toBeLessThan(20 * MIB);
    expect(gauges.meta_listing_bytes).toBeLessThanOrEqual(gauges.meta_stat_limit_bytes!);
    await unmount(m.path);
  }, 240_000);

  it('16 parallel lookups in a fresh folder cost at most a request each, and answer the names after them', async () => {
    await fsp.mkdir(join(tb.root, tb.bucket, 'fresh'), { recursive: true });
    emptyObjects(tb, 'fresh', 5_000, (i) => `${i}.0.0`);
    const m = await mount({ tb });
    tb.emulator.resetStats();
    const picks = Array.from({ length: 16 }, (_, i) => (i * 1237) % 5000);
    const results = await Promise.all(picks.map((p) => run('stat', ['-c', '%s', join(m.path, 'fresh', `${p}.0.0`)])));
    expect(results.map((r) => r.code)).toEqual(Array(16).fill(0));
    // One small page for the lookup of 'fresh' (the root from that name on) and at most one per name:
    // nothing before a name is listed for it, and pages ahead only as lookups answered from memory pay.
    const req = tb.emulator.stats().requests;
    expect(req.metadata + req.media).toBe(0);
    expect(req.list).toBeLessThanOrEqual(1 + 16);
    const { counters } = await mountStats(m.path);
    expect(counters.meta_lookup_walks).toBe(1); // one flat listing of the root answers the folder below too
    // The page each lookup waited for holds the names after it: the next chunk of each is a memory hit.
    // Hits pay for pages ahead of the readers (one per ten), and those are the only requests.
    tb.emulator.resetStats();
    const ahead = (await mountStats(m.path)).counters.meta_lookup_pages_ahead ?? 0;
    const next = await run('stat', ['-c', '%s', ...picks.map((p) => join(m.path, 'fresh', `${p + 1}.0.0`))]);
    expect(next.stdout.trim().split('\n')).toHaveLength(16);
    const pagesAhead = ((await mountStats(m.path)).counters.meta_lookup_pages_ahead ?? 0) - ahead;
    expect(tb.emulator.stats().requests.total).toBeLessThanOrEqual(pagesAhead);
    expect(pagesAhead).toBeLessThanOrEqual(2);
    await unmount(m.path);
  }, 120_000);

  it('names missing past the negative TTL cost one page between them, not a request each', async () => {
    await fsp.mkdir(join(tb.root, tb.bucket, 'sparse'), { recursive: true });
    emptyObjects(tb, 'sparse', 50, (i) => `${i * 2}.0`); // a Zarr array whose odd chunks are fill values
    const m = await mount({ tb, args: ['--metadata-cache-negative-ttl-secs', '1'] });
    expect((await run('ls', [join(m.path, 'sparse')])).code).toBe(0);
    await sleep(1_200); // the listing now answers for the names it shows, no longer for missing ones
    tb.emulator.resetStats();
    const walks = (await mountStats(m.path)).counters.meta_lookup_walks ?? 0;
    // One process stats 20 missing chunks one after another, as a reader walking the grid does.
    const missing = await run('stat', ['-c', '%n', ...Array.from({ length: 20 }, (_, i) => join(m.path, 'sparse', `${i * 2 + 1}.0`))]);
    expect(missing.code).not.toBe(0);
    expect(missing.stderr.trim().split('\n')).toHaveLength(20);
    // The first miss lists the folder afresh from its name on (one page); the rest are answered by that
    // page. A request per name would be 20.
    expect(tb.emulator.stats().requests.list).toBe(1);
    expect((await mountStats(m.path)).counters.meta_lookup_walks).toBe(walks + 1);
    await unmount(m.path);
  }, 60_000);

  it('a lookup walk older than the negative TTL answers a new missing name with the one page it lists for it', async () => {
    await fsp.mkdir(join(tb.root, tb.bucket, 'late'), { recursive: true });
    emptyObjects(tb, 'late', 300, (i) => `n${String(i).padStart(3, '0')}`);
    const m = await mount({ tb, args: ['--metadata-cache-negative-ttl-secs', '1'] });
    // A missing name starts a lookup walk of the folder at it; its page holds the names after it.
    expect((await run('stat', [join(m.path, 'late', 'n000x')])).code).not.toBe(0);
    await sleep(1_200); // the walk lives on, but its pages no longer say "no such name"
    tb.emulator.resetStats();
    // A name far past that page (a writer's new temporary file): the walk lists a page at it, for this
    // lookup, so that page's "no such name" is fresh. (It was asked again by a second walk: 2 lists.)
    expect((await run('stat', [join(m.path, 'late', 'n250x')])).code).not.toBe(0);
    expect(tb.emulator.stats().requests.list).toBe(1);
    // And remembered for the negative TTL, as any lookup's answer.
    expect((await run('stat', [join(m.path, 'late', 'n250x')])).code).not.toBe(0);
    expect(tb.emulator.stats().requests.total).toBe(1);
    await unmount(m.path);
  }, 60_000);

  it('walks 100 folders x 100 objects with about ten list requests (find -ls)', async () => {
    for (let d = 0; d < 100; d++) {
      const dir = `walk/folder-${String(d).padStart(3, '0')}`;
      await fsp.mkdir(join(tb.root, tb.bucket, dir), { recursive: true });
      emptyObjects(tb, dir, 100, (f) => `chunk.${f}`);
    }
    const m = await mount({ tb });
    tb.emulator.resetStats();
    const r = await run('find', [join(m.path, 'walk'), '-ls'], { timeoutMs: 60_000 });
    expect(r.code, r.stderr).toBe(0);
    expect(r.stdout.trim().split('\n')).toHaveLength(1 + 100 + 10_000);
    const req = tb.emulator.stats().requests;
    // The lookup of 'walk' lists the root (2), readdir of walk (1), then the subtree flat in ten parts.
    expect(req).toMatchObject({ metadata: 0, media: 0 });
    expect(req.list).toBeLessThanOrEqual(16);
    const { counters } = await mountStats(m.path);
    expect(counters.meta_walks).toBe(1);
    expect(counters.meta_walk_folders).toBeGreaterThanOrEqual(100);
    tb.emulator.resetStats();
    expect((await run('find', [join(m.path, 'walk'), '-ls'])).stdout).toBe(r.stdout);
    expect(tb.emulator.stats().requests.total).toBe(0);
    await unmount(m.path);
  }, 120_000);

  it('a walk pauses 50,000 entries ahead of its reader, even inside one huge folder it has not finished', async () => {
    for (const d of ['top/x', 'top/y', 'top/z/huge']) await fsp.mkdir(join(tb.root, tb.bucket, d), { recursive: true });
    // More than a lookup's first page: the lookup of `top` does not list all of top/x for the walk.
    emptyObjects(tb, 'top/x', 200, (i) => `f${i}`);
    emptyObjects(tb, 'top/y', 3, (i) => `f${i}`);
    emptyObjects(tb, 'top/z/huge', 120_000, (i) => `c.${i}`);
    const m = await mount({ tb });
    tb.emulator.resetStats();
    // A walk starts: `top` was read, and now one of its sub-folders.
    const r = await run('sh', ['-c', `ls ${join(m.path, 'top')} > /dev/null && ls ${join(m.path, 'top/x')}`]);
    expect(r.stdout.trim().split('\n')).toHaveLength(200);
    // Let the walk run until it pauses (no new list request for a second).
    let last = -1;
    for (let i = 0; i < 60 && tb.emulator.stats().requests.list !== last; i++) {
      last = tb.emulator.stats().requests.list;
      await sleep(1000);
    }
    expect((await mountStats(m.path)).counters.meta_walks).toBe(1);
    // The root, `top`, then 50,000 entries of the walk (50 pages) and the pages in flight when it paused;
    // not the 120 pages of top/z/huge.
    const lists = tb.emulator.stats().requests.list;
    expect(lists).toBeGreaterThanOrEqual(40);
    // Measured 60-81 (a CI run on 2026-11-25 at 81: the lookups' own pages and the parts cut ahead of the
    // pause); a walk that did not pause lists top/z/huge's 120 pages on top of everything else.
    expect(lists).toBeLessThanOrEqual(95);
    await unmount(m.path);
    await fsp.rm(join(tb.root, tb.bucket, 'top'), { recursive: true, force: true });
  }, 180_000);

  it('answers a lookup at once while readahead of a 256 MiB file fills --max-conns-per-host 4', async () => {
    await fsp.mkdir(join(tb.root, tb.bucket, 'data'), { recursive: true });
    // Before 'data' in name order: the page that answered the lookups of data/huge.bin (from 'data' on)
    // does not hold it, so the lookup below needs a request of its own.
    await fsp.mkdir(join(tb.root, tb.bucket, 'aside'), { recursive: true });
    // Sparse: zeros that cost no disk; far more than the readahead reaches in the test (16 MiB in flight).
    const fh = await fsp.open(join(tb.root, tb.bucket, 'data/huge.bin'), 'w');
    await fh.truncate(256 * MIB);
    await fh.close();
    emptyObjects(tb, 'aside', 10, (i) => `f${i}`);
    // The emulator hashes an object for its first listing (GCS has the hash stored): not during the test.
    await fetch(`${tb.emulator.url}/storage/v1/b/${tb.bucket}/o/${encodeURIComponent('data/huge.bin')}?fields=crc32c`);
    const m = await mount({ tb, args: ['--max-conns-per-host', '4'] });
    // 2 MiB/s per response: each 4 MiB readahead block holds its connection for two seconds.
    tb.emulator.setKnobs({ bandwidthBytesPerSec: 2 * MIB });
    const reader = spawn('dd', [`if=${join(m.path, 'data/huge.bin')}`, 'of=/dev/null', 'bs=1M'], { stdio: 'ignore' });
    try {
      for (let i = 0; i < 150 && ((await mountStats(m.path)).gauges.downloads_in_flight ?? 0) < 4; i++) await sleep(100);
      expect((await mountStats(m.path)).gauges.downloads_in_flight).toBeGreaterThanOrEqual(4);
      const r = await run('stat', ['-c', '%s', join(m.path, 'aside', 'f3')]);
      expect(r.stdout.trim()).toBe('0');
      // Proven from the emulator's log, not a clock: the lookup's list request ran from start to end
      // while four media requests held all four data connections, so it queued behind none of them
      // (behind the readahead it would start only once a 4 MiB block, two seconds, had finished). The
      // log has a request once it has ended: wait for those blocks.
      const spanning = () => {
        const log = tb.emulator.requestLog();
        const list = log.filter((e) => e.kind === 'list').at(-1)!;
        return { log, media: log.filter((e) => e.kind === 'media' && e.startMs <= list.startMs && e.endMs >= list.endMs) };
      };
      await eventually(async () => spanning().media.length >= 4, 10_000).catch(() => undefined);
      const { log, media } = spanning();
      expect(media.length, JSON.stringify(log.map((e) => [e.kind, Math.round(e.startMs), Math.round(e.endMs)]))).toBeGreaterThanOrEqual(4);
    } finally {
      reader.kill('SIGKILL');
      tb.emulator.setKnobs({ bandwidthBytesPerSec: 0 });
    }
    await unmount(m.path);
  }, 120_000);
});

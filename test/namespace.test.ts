import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { resolveEndpoint } from '../src/gcs/endpoint.js';
import { GcsError } from '../src/gcs/errors.js';
import { AdaptiveConcurrency } from '../src/gcs/adaptive-concurrency.js';
import { HttpObjectClient } from '../src/gcs/http-client.js';
import { DEFAULT_RETRY, retryDelay } from '../src/gcs/retry.js';
import { componentProblem, NameMapper } from '../src/namespace/names.js';
import { MetadataCache } from '../src/namespace/metadata-cache.js';
import { Namespace } from '../src/namespace/namespace.js';
import { OnceLog, silentLogger } from '../src/observe/logger.js';
import { Metrics } from '../src/observe/metrics.js';
import { startBucket, writeObjects, type TestBucket } from './helpers/harness.js';
import { upload } from './helpers/objects.js';

describe('retry policy', () => {
  const transient = new GcsError('TRANSIENT', 'x', 503);
  it('backs off exponentially with full jitter, capped, and gives up on permanent errors or the last attempt', () => {
    expect(retryDelay(DEFAULT_RETRY, 1, transient, () => 1)).toBe(100);
    expect(retryDelay(DEFAULT_RETRY, 4, transient, () => 1)).toBe(800);
    expect(retryDelay(DEFAULT_RETRY, 4, transient, () => 0)).toBe(0);
    expect(retryDelay({ ...DEFAULT_RETRY, maxAttempts: 99 }, 30, transient, () => 1)).toBe(DEFAULT_RETRY.maxDelayMs);
    expect(retryDelay({ ...DEFAULT_RETRY, maxAttempts: 5 }, 5, transient, () => 1)).toBe('give-up');
    expect(retryDelay(DEFAULT_RETRY, 1_000, transient, () => 1)).toBe(DEFAULT_RETRY.maxDelayMs); // 0 = no limit
    expect(retryDelay({ ...DEFAULT_RETRY, multiplier: 3 }, 3, transient, () => 1)).toBe(900);
    expect(retryDelay(DEFAULT_RETRY, 1, new GcsError('NOT_FOUND', 'x', 404), () => 1)).toBe('give-up');
    expect(retryDelay(DEFAULT_RETRY, 1, new Error('not ours'), () => 1)).toBe('give-up');
  });
  it('waits at least what Retry-After asks, within the cap', () => {
    expect(retryDelay(DEFAULT_RETRY, 1, new GcsError('TRANSIENT', 'x', 429, 3), () => 0)).toBe(3000);
    expect(retryDelay({ ...DEFAULT_RETRY, maxDelayMs: 1000 }, 1, new GcsError('TRANSIENT', 'x', 429, 3), () => 0)).toBe(1000);
  });
});

describe('endpoint', () => {
  it('accepts STORAGE_EMULATOR_HOST as host:port, URL, or URL with /storage/v1; the flag wins', () => {
    expect(resolveEndpoint(undefined, {})).toEqual({ origin: 'https://storage.googleapis.com', custom: false });
    expect(resolveEndpoint(undefined, { STORAGE_EMULATOR_HOST: '127.0.0.1:9023' }).origin).toBe('http://127.0.0.1:9023');
    expect(resolveEndpoint(undefined, { STORAGE_EMULATOR_HOST: 'http://127.0.0.1:9023/storage/v1' }).origin).toBe('http://127.0.0.1:9023');
    expect(resolveEndpoint('http://localhost:1', { STORAGE_EMULATOR_HOST: '127.0.0.1:9023' })).toEqual({ origin: 'http://localhost:1', custom: true });
    expect(() => resolveEndpoint('ftp://x', {})).toThrow(/only http and https/);
  });
});

describe('names', () => {
  it('rejects components that cannot be paths', () => {
    expect(componentProblem('ok.txt')).toBeNull();
    expect(componentProblem('')).toBe('empty');
    expect(componentProblem('..')).toBe('dot');
    expect(componentProblem('a\0b')).toBe('nul');
    expect(componentProblem('é'.repeat(128))).toBe('too-long'); // 256 bytes in UTF-8
    expect(componentProblem('é'.repeat(127))).toBeNull();
  });
  it('maps paths under --only-dir', () => {
    const n = new NameMapper('/sub/dir/');
    expect(n.rootPrefix).toBe('sub/dir/');
    expect(n.objectName('/a/b')).toBe('sub/dir/a/b');
    expect(n.dirPrefix('/a')).toBe('sub/dir/a/');
    expect(n.dirPrefix('/')).toBe('sub/dir/');
  });
});

describe('namespace lookups against the emulator', () => {
  let tb: TestBucket;
  let client: HttpObjectClient;
  let ns: Namespace;

  beforeAll(async () => {
    tb = await startBucket('ns');
    // 150 siblings that sort between "x" and "x/" push the directory past the first lookup page.
    const siblings: Record<string, string> = { x: 'file x', 'y/inner': 'i' };
    for (let i = 0; i < 150; i++) siblings[`x.${String(i).padStart(3, '0')}`] = '';
    await writeObjects(tb.root, tb.bucket, siblings);
    await upload(tb, 'x/child', 'c'); // x is now both a file and a directory
    client = new HttpObjectClient({
      endpoint: { origin: tb.emulator.url, custom: true },
      bucket: tb.bucket,
      auth: null,
      maxConnections: 4,
      timeoutMs: 10_000,
      retry: DEFAULT_RETRY,
      concurrency: new AdaptiveConcurrency({ max: 4, min: 1, cooldownMs: 1000 }),
      log: silentLogger,
      metrics: new Metrics(),
    });
    ns = fresh();
  });

  /** A namespace with empty caches and no lookup misses counted yet; without metadata prefetch, one name one request. */
  function fresh(): Namespace {
    const cache = new MetadataCache(
      { ttl: { kind: 'ms', ms: 60_000 }, negativeTtl: { kind: 'ms', ms: 5_000 }, statBudget: { kind: 'unlimited' }, typeBudget: { kind: 'unlimited' } },
      new Metrics(),
    );
    const prefetch = { enabled: false, entriesLimit: Number.POSITIVE_INFINITY, maxWorkers: 10 };
    return new Namespace({ client, names: new NameMapper(null), cache, listTtlMs: 60_000, prefetch, once: new OnceLog(silentLogger), metrics: new Metrics() });
  }

  afterAll(async () => {
    await client?.close();
    await tb?.emulator.close();
  });

  it('resolves a file in one list request', async () => {
    tb.emulator.resetStats();
    const e = await ns.lookup('/x.005');
    expect(e?.kind).toBe('file');
    expect(tb.emulator.stats().requests).toMatchObject({ total: 1, list: 1 });
  });

  it('resolves an implicit directory in one list request', async () => {
    ns = fresh();
    tb.emulator.resetStats();
    expect((await ns.lookup('/y'))?.kind).toBe('dir');
    expect(tb.emulator.stats().requests).toMatchObject({ total: 1, list: 1 });
  });

  it('finds a directory beyond the first page with one more request, and prefers it over a same-named file', async () => {
    ns = fresh();
    tb.emulator.resetStats();
    expect((await ns.lookup('/x'))?.kind).toBe('dir');
    expect(tb.emulator.stats().requests).toMatchObject({ total: 2, list: 2 });
  });

  it('answers a second lookup, and every entry of a listed directory, from the caches', async () => {
    ns = fresh();
    tb.emulator.resetStats();
    expect((await ns.lookup('/x.005'))?.kind).toBe('file');
    const entries = await ns.readdir('/');
    expect(entries.count).toBeGreaterThan(150);
    expect(tb.emulator.stats().requests).toMatchObject({ total: 2, list: 2 }); // the lookup, the listing
    expect((await ns.lookup('/x.005'))?.kind).toBe('file');
    for (const name of ['/x.149', '/y', '/nothing-here']) await ns.lookup(name);
    expect(await ns.readdir('/')).toBe(entries);
    expect(tb.emulator.stats().requests.total).toBe(2);
  });

  it('lists a directory after two lookup misses in it, and answers every later name from that listing', async () => {
    ns = fresh();
    tb.emulator.resetStats();
    expect((await ns.lookup('/x.001'))?.kind).toBe('file'); // one name: one request
    expect((await ns.lookup('/x.002'))?.kind).toBe('file'); // a second miss in "/": list it all
    expect(tb.emulator.stats().requests).toMatchObject({ total: 2, list: 2 });
    for (const name of ['/x.003', '/x.149', '/y', '/no-such-chunk']) await ns.lookup(name);
    expect(await ns.lookup('/no-such-chunk')).toBeNull();
    expect(tb.emulator.stats().requests.total).toBe(2);
  });

  it('answers a missing name with null in one request, and shares one request among concurrent lookups', async () => {
    ns = fresh();
    tb.emulator.resetStats();
    const all = await Promise.all(Array.from({ length: 32 }, () => ns.lookup('/y/missing')));
    expect(all.every((e) => e === null)).toBe(true);
    expect(tb.emulator.stats().requests.total).toBe(1);
  });

  it("trusts a lookup walk's 'no such name' for the negative TTL from when its page was asked for, not from its answer", async () => {
    // A page that takes 4 s of the namespace's clock to come back: its "missing" is 4 s old on arrival.
    const clock = { t: 0, now: () => clock.t };
    const cache = new MetadataCache(
      { ttl: { kind: 'ms', ms: 60_000 }, negativeTtl: { kind: 'ms', ms: 5_000 }, statBudget: { kind: 'unlimited' }, typeBudget: { kind: 'unlimited' }, clock },
      new Metrics(),
    );
    const prefetch = { enabled: true, entriesLimit: Number.POSITIVE_INFINITY, maxWorkers: 10 };
    const walking = new Namespace({ client, names: new NameMapper(null), cache, listTtlMs: 60_000, prefetch, once: new OnceLog(silentLogger), metrics: new Metrics() });
    tb.emulator.setKnobs({ latencyMs: 200 });
    try {
      const asked = walking.lookup('/y/late');
      clock.t = 4_000;
      expect(await asked).toBeNull();
      await upload(tb, 'y/late', 'now here');
      // 5.1 s after the question (1.1 s after the answer): the negative TTL has run out, GCS is asked.
      clock.t = 5_100;
      expect(await walking.lookup('/y/late')).toMatchObject({ kind: 'file' });
    } finally {
      tb.emulator.setKnobs({ latencyMs: 0 });
    }
  });
});

import { promises as fsp } from 'node:fs';
import { createServer, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { gzipSync } from 'node:zlib';
import { pino } from 'pino';
import { afterAll, beforeAll, describe, expect, it, vi } from 'vitest';
import { crc32c } from '../src/crc32c.js';
import { AdaptiveConcurrency } from '../src/gcs/adaptive-concurrency.js';
import type { AuthHeaders } from '../src/gcs/auth.js';
import { HttpObjectClient, transportError, type HttpClientConfig } from '../src/gcs/http-client.js';
import { isRetryable } from '../src/gcs/retry.js';
import { startEmulator, type Emulator } from '../src/emulator/server.js';
import { silentLogger } from '../src/observe/logger.js';
import { Metrics } from '../src/observe/metrics.js';
import { REPO, run } from './helpers/harness.js';

const OBJECT = Buffer.from(Array.from({ length: 100_000 }, (_, i) => i % 251));
const VERSION = { name: 'o', generation: '1', size: OBJECT.length };

/** How the fake server answers a ranged GET. */
let mode: 'honest' | 'shifted' | 'whole' | 'hang' | 'chunked' = 'honest';
let requests = 0;

function client(url: string, downloadWorkers = 0, metrics = new Metrics(), more: Partial<HttpClientConfig> = {}): HttpObjectClient {
  return new HttpObjectClient({
    downloadWorkers,
    endpoint: { origin: url, custom: true },
    bucket: 'b',
    auth: null,
    maxConnections: 4,
    ...more,
    timeoutMs: 5_000,
    retry: { maxAttempts: 3, baseDelayMs: 1, multiplier: 2, maxDelayMs: 5 },
    concurrency: new AdaptiveConcurrency({ max: 4, min: 1, cooldownMs: 1000 }),
    log: silentLogger,
    metrics,
    ...more,
  });
}

describe('range GETs into a caller buffer', () => {
  let server: Server;
  let url: string;
  beforeAll(async () => {
    server = createServer((req, res) => {
      requests++;
      const [, a, b] = /bytes=(\d+)-(\d+)/.exec(req.headers.range ?? '')!;
      let start = Number(a);
      const end = Number(b);
      if (mode === 'whole') {
        res.writeHead(200, { 'content-length': OBJECT.length });
        res.end(OBJECT);
        return;
      }
      if (mode === 'chunked') {
        // No Content-Length: Node frames the body in chunks.
        res.writeHead(206, { 'content-range': `bytes ${start}-${end}/${OBJECT.length}` });
        res.write(OBJECT.subarray(start, start + 100));
        res.end(OBJECT.subarray(start + 100, end + 1));
        return;
      }
      if (mode === 'hang') {
        // Headers and a first part of the body, then nothing: an attempt that stays in flight.
        res.writeHead(206, { 'content-range': `bytes ${start}-${end}/${OBJECT.length}`, 'content-length': end - start + 1 });
        res.write(OBJECT.subarray(start, start + 1000));
        return;
      }
      // A server (or proxy) that answers with the neighbouring range, of the right length.
      if (mode === 'shifted') start += 1;
      res.writeHead(206, { 'content-range': `bytes ${start}-${start + end - Number(a)}/${OBJECT.length}`, 'content-length': end - Number(a) + 1 });
      res.end(OBJECT.subarray(start, start + end - Number(a) + 1));
    });
    await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
    url = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
  });
  afterAll(() => new Promise<void>((r) => server.close(() => r())));

  it('fills the buffer from a 206, and picks its window out of a 200 that ignored the range', async () => {
    const c = client(url);
    const into = Buffer.alloc(30_000, 0xee);
    for (const m of ['honest', 'whole'] as const) {
      mode = m;
      requests = 0;
      const got = await c.readRange(VERSION, 5_000, 25_000, into);
      expect(got.length).toBe(20_000);
      expect(got.buffer).toBe(into.buffer);
      expect(got.equals(OBJECT.subarray(5_000, 25_000))).toBe(true);
      expect(requests).toBe(1);
    }
    await c.close();
  });

  it('refuses the bytes of another range, at once, rather than serve them', async () => {
    mode = 'shifted';
    requests = 0;
    const c = client(url);
    await expect(c.readRange(VERSION, 5_000, 25_000, Buffer.alloc(20_000))).rejects.toMatchObject({ code: 'CORRUPT' });
    expect(requests).toBe(1); // not retried
    await c.close();
  });

  it('on a download worker, fills shared memory the same, and refuses another range the same (the error crosses threads intact)', async () => {
    const c = client(url, 1);
    expect(c.workers?.count).toBe(1);
    const into = Buffer.from(new SharedArrayBuffer(30_000));
    for (const m of ['honest', 'whole'] as const) {
      mode = m;
      requests = 0;
      into.fill(0xee);
      const hash = { crc32c: null as number | null };
      const got = await c.readRange(VERSION, 5_000, 25_000, into, undefined, hash);
      expect(got.buffer).toBe(into.buffer);
      expect(got.equals(OBJECT.subarray(5_000, 25_000))).toBe(true);
      // Hashed where it landed, on the worker.
      expect(hash.crc32c).toBe(crc32c(OBJECT.subarray(5_000, 25_000)));
      expect(requests).toBe(1);
    }
    mode = 'shifted';
    requests = 0;
    await expect(c.readRange(VERSION, 5_000, 25_000, into)).rejects.toMatchObject({ code: 'CORRUPT', name: 'GcsError' });
    expect(requests).toBe(1);
    await c.close();
  });
  it('on a download worker, a range body framed in chunks is read through undici (the worker\'s own reader takes only Content-Length)', async () => {
    const metrics = new Metrics();
    const c = client(url, 1, metrics);
    const into = Buffer.from(new SharedArrayBuffer(30_000)).fill(0xee);
    mode = 'chunked';
    requests = 0;
    const hash = { crc32c: null as number | null };
    const got = await c.readRange(VERSION, 5_000, 25_000, into, undefined, hash);
    expect(got.equals(OBJECT.subarray(5_000, 25_000))).toBe(true);
    expect(hash.crc32c).toBe(crc32c(OBJECT.subarray(5_000, 25_000)));
    // Refused by the worker's reader at its head, asked again through undici.
    expect(requests).toBe(2);
    expect(metrics.get('gcs_raw_fallbacks')).toBe(1);
    mode = 'honest';
    await c.close();
  });

  it('a download worker that dies mid-body fails that attempt as transient: it is retried on the worker that replaces it', async () => {
    const c = client(url, 1);
    const into = Buffer.from(new SharedArrayBuffer(30_000));
    mode = 'hang';
    requests = 0;
    const hash = { crc32c: null as number | null };
    const read = c.readRange(VERSION, 5_000, 25_000, into, undefined, hash);
    while (requests < 1) await new Promise((r) => setTimeout(r, 10));
    mode = 'honest';
    const [slot] = (c.workers as unknown as { slots: Array<{ worker: { terminate(): Promise<number> } }> }).slots;
    await slot!.worker.terminate();
    const got = await read;
    expect(got.equals(OBJECT.subarray(5_000, 25_000))).toBe(true);
    expect(hash.crc32c).toBe(crc32c(OBJECT.subarray(5_000, 25_000)));
    expect(requests).toBe(2);
    expect(c.workers?.count).toBe(1);
    await c.close();
  });

  /** Starts `n` reads the server leaves hanging; resolves once it has them all. Close the client to end them. */
  async function hung(c: HttpObjectClient, n: number): Promise<void> {
    mode = 'hang';
    requests = 0;
    for (let i = 0; i < n; i++) c.readRange(VERSION, i * 10_000, i * 10_000 + 5_000, Buffer.from(new SharedArrayBuffer(5_000))).catch(() => undefined);
    while (requests < n) await new Promise((r) => setTimeout(r, 10));
  }

  it('puts downloads on one worker while it is not busy (the other not even started), and on a spare one only when the first holds its share of --max-conns-per-host', async () => {
    const free = client(url, 2, new Metrics(), { maxConnections: 0 });
    await hung(free, 3);
    expect(free.workers!.loads().map((l) => [l.inFlight, l.inUse])).toEqual([[3, true]]);
    await free.close();
    // A cap of 4: 2 connections for each worker; the third download starts the spare one rather than wait.
    const capped = client(url, 2);
    expect(capped.workers!.count).toBe(1);
    await hung(capped, 3);
    expect(capped.workers!.loads().map((l) => [l.inFlight, l.inUse])).toEqual([[2, true], [1, false]]);
    await capped.close();
    mode = 'honest';
  });

  it('puts a spare worker to use once those in use are busy (here: any use counts as busy), and spreads downloads over them', async () => {
    const c = client(url, 2, new Metrics(), { maxConnections: 0, workersInUse: { grow: -1, busyWindows: 1, shrink: -1, idleWindows: 1, cpus: () => 8 } });
    expect(c.workers!.count).toBe(1);
    const deadline = Date.now() + 10_000;
    const both = (): boolean => c.workers!.loads().length === 2 && c.workers!.loads().every((l) => l.inUse);
    while (!both() && Date.now() < deadline) await new Promise((r) => setTimeout(r, 50));
    expect(c.workers!.loads().map((l) => l.inUse)).toEqual([true, true]);
    await hung(c, 2);
    expect(c.workers!.loads().map((l) => l.inFlight)).toEqual([1, 1]);
    await c.close();
    mode = 'honest';
  });

  it('close() ends requests in flight at once (CLOSED), on the main thread and on a worker', async () => {
    for (const workers of [0, 1]) {
      const c = client(url, workers);
      const into = workers ? Buffer.from(new SharedArrayBuffer(30_000)) : Buffer.alloc(30_000);
      mode = 'hang';
      requests = 0;
      const read = c.readRange(VERSION, 5_000, 25_000, into);
      const outcome = read.then(() => 'read', (err: { code?: string }) => err.code);
      while (requests < 1) await new Promise((r) => setTimeout(r, 10));
      const t0 = performance.now();
      await c.close();
      expect(await outcome).toBe('CLOSED');
      // The client's timeout is 5 s: close() did not wait for it.
      expect(performance.now() - t0).toBeLessThan(2_000);
      expect(requests).toBe(1);
    }
    mode = 'honest';
  });
});

describe('a daemon at its file-descriptor limit', () => {
  it('gets a request through with one descriptor left (its HTTP parser loaded before, not on the first connection)', async () => {
    const server = createServer((_req, res) => res.end('ok'));
    await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
    try {
      const origin = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
      const r = await run('prlimit', ['--nofile=64', process.execPath, join(REPO, 'test/fixtures/request_at_fd_limit.mjs'), join(REPO, 'dist/gcs/dispatcher.js'), origin]);
      expect(r.stdout.trim(), r.stderr).toBe('status 200');
    } finally {
      server.close();
    }
  });
});

describe('answers that cannot be the range asked for', () => {
  let server: Server;
  let url: string;
  let answer: 'transcoded' | 'short-whole' = 'transcoded';
  beforeAll(async () => {
    server = createServer((_req, res) => {
      requests++;
      if (answer === 'transcoded') {
        // GCS's decompressive transcoding: the whole decompressed object, chunked, Range ignored.
        res.writeHead(200, { 'x-goog-stored-content-encoding': 'gzip' });
        res.write(OBJECT.subarray(0, 50_000));
        res.end(OBJECT.subarray(50_000));
        return;
      }
      res.writeHead(200, { 'content-length': OBJECT.length - 1 });
      res.end(OBJECT.subarray(1));
    });
    await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
    url = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
  });
  afterAll(() => new Promise<void>((r) => server.close(() => r())));

  it('refuses a 200 whose length is not the object size (chunked, or another length), at once', async () => {
    for (const a of ['transcoded', 'short-whole'] as const) {
      answer = a;
      requests = 0;
      const c = client(url);
      const err = await c.readRange(VERSION, 5_000, 25_000, Buffer.alloc(20_000)).catch((e: unknown) => e);
      expect(err, a).toMatchObject({ code: 'CORRUPT' });
      expect(String((err as Error).message), a).toMatch(/a 200 of .* for a 100000-byte object/);
      expect(requests, a).toBe(1); // not retried
      await c.close();
    }
  });
});

describe('against the emulator', () => {
  let tb: { root: string; emu: Emulator };
  const plain = Buffer.from('a line of text that compresses well\n'.repeat(10_000));
  const stored = gzipSync(plain);

  beforeAll(async () => {
    const root = await fsp.mkdtemp(join(tmpdir(), 'gcsmount-http-'));
    await fsp.mkdir(join(root, 'b'));
    tb = { root, emu: await startEmulator({ root }) };
    const r = await fetch(`${tb.emu.url}/upload/storage/v1/b/b/o?uploadType=media&name=gz&contentEncoding=gzip`, { method: 'POST', body: new Uint8Array(stored) });
    expect(r.status).toBe(200);
  });
  afterAll(async () => {
    await tb.emu.close();
    await fsp.rm(tb.root, { recursive: true, force: true });
  });

  function emulatorClient(auth: AuthHeaders | null, logLines: string[] = [], retry = { maxAttempts: 3, baseDelayMs: 1, multiplier: 2, maxDelayMs: 5 }): HttpObjectClient {
    return new HttpObjectClient({
      endpoint: { origin: tb.emu.url, custom: true },
      bucket: 'b',
      auth,
      maxConnections: 4,
      timeoutMs: 5_000,
      retry,
      concurrency: new AdaptiveConcurrency({ max: 4, min: 1, cooldownMs: 1000 }),
      log: pino({ level: 'debug' }, { write: (line: string) => void logLines.push(line) }),
      metrics: new Metrics(),
      env: {},
    });
  }

  it('reads a gzip-encoded object as its stored bytes, ranges honoured, one request each', async () => {
    const c = emulatorClient(null);
    const meta = (await c.statObject('gz'))!;
    expect(meta.size).toBe(stored.length);
    tb.emu.resetStats();
    const whole = await c.readRange(meta, 0, meta.size);
    expect(whole.equals(stored)).toBe(true);
    const part = await c.readRange(meta, 100, 1100);
    expect(part.equals(stored.subarray(100, 1100))).toBe(true);
    const log = tb.emu.requestLog();
    expect(log.map((e) => [e.kind, e.status])).toEqual([
      ['media', 206],
      ['media', 206],
    ]);
    await c.close();
  });

  it('retries a 401 once with a freshly fetched token, and gives up after that one', async () => {
    let fresh = 0;
    let token = 'stale';
    const auth: AuthHeaders = async (opts) => {
      if (opts?.fresh) token = `fresh-${++fresh}`;
      return { authorization: `Bearer ${token}` };
    };
    const lines: string[] = [];
    const c = emulatorClient(auth, lines);
    tb.emu.setKnobs({ rejectTokens: ['stale'] });
    tb.emu.resetStats();
    const meta = (await c.statObject('gz'))!;
    expect(meta.size).toBe(stored.length);
    expect(fresh).toBe(1);
    expect(tb.emu.requestLog().map((e) => e.status)).toEqual([401, 200]);
    expect(lines.some((l) => l.includes('GCS retry with a fresh token'))).toBe(true);
    // A token that the server keeps refusing: one fresh token, then the 401 stands (no endless loop).
    tb.emu.setKnobs({ rejectTokens: ['stale', 'fresh-1', 'fresh-2', 'fresh-3'] });
    token = 'stale';
    tb.emu.resetStats();
    await expect(c.readRange(meta, 0, 10)).rejects.toMatchObject({ code: 'UNAUTHENTICATED' });
    expect(fresh).toBe(2);
    expect(tb.emu.requestLog().map((e) => e.status)).toEqual([401, 401]);
    tb.emu.setKnobs({ rejectTokens: [] });
    await c.close();
  });

  it('a request cut off by close() is shutdown, not a GCS fault: no retry, no retry log line', async () => {
    const lines: string[] = [];
    // Retries without end, up to 23 days apart (jittered: under the test's 60 s timeout one time in
    // 30,000): only close() can end this read, by cutting the backoff's sleep short. Were the sleep
    // slept out, the test would time out; there is no clock to race.
    const c = emulatorClient(null, lines, { maxAttempts: Number.POSITIVE_INFINITY, baseDelayMs: 2e9, multiplier: 1, maxDelayMs: 2e9 });
    const meta = (await c.statObject('gz'))!;
    tb.emu.setKnobs({ rate503: 1 });
    try {
      const reading = c.readRange(meta, 0, 10).catch((e: unknown) => e);
      // Let the first 503 arrive and its backoff begin, then stop.
      await vi.waitFor(() => expect(lines.some((l) => l.includes('GCS retry after'))).toBe(true));
      const atClose = lines.length;
      await c.close();
      expect(await reading).toMatchObject({ code: 'CLOSED' });
      await expect(c.readRange(meta, 0, 10)).rejects.toMatchObject({ code: 'CLOSED' });
      expect(lines.slice(atClose).filter((l) => /GCS retry|GCS request failed/.test(l))).toEqual([]);
    } finally {
      tb.emu.setKnobs({ rate503: 0 });
    }
  });

  it('classifies undici\'s closed and destroyed errors as CLOSED, resets as TRANSIENT', () => {
    const closed = Object.assign(new Error('The client is closed'), { code: 'UND_ERR_CLOSED' });
    const destroyed = Object.assign(new Error('The client is destroyed'), { code: 'UND_ERR_DESTROYED' });
    const reset = Object.assign(new Error('socket hang up'), { code: 'ECONNRESET' });
    expect(transportError(closed, 'x').code).toBe('CLOSED');
    expect(transportError(destroyed, 'x').code).toBe('CLOSED');
    expect(transportError(reset, 'x').code).toBe('TRANSIENT');
    expect(isRetryable(transportError(closed, 'x'))).toBe(false);
  });
});

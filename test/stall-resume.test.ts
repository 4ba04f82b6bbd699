import { createServer, type Server, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { crc32c } from '../src/crc32c.js';
import { AdaptiveConcurrency } from '../src/gcs/adaptive-concurrency.js';
import { HttpObjectClient } from '../src/gcs/http-client.js';
import { StallTimeout } from '../src/gcs/stall-timeout.js';
import { silentLogger } from '../src/observe/logger.js';
import { Metrics } from '../src/observe/metrics.js';

const OBJECT = Buffer.from(Array.from({ length: 1_000_000 }, (_, i) => (i * 7) % 253));

/** How the server answers: 'stall-once' sends part of the first body then nothing; 'silent' never answers. */
let mode: 'stall-once' | 'silent' = 'stall-once';
let ranges: string[] = [];
const hung: ServerResponse[] = [];

function client(url: string, metrics: Metrics, maxRetryDurationMs = 0, downloadWorkers = 0): HttpObjectClient {
  return new HttpObjectClient({
    downloadWorkers,
    endpoint: { origin: url, custom: true },
    bucket: 'b',
    auth: null,
    maxConnections: 4,
    timeoutMs: 0,
    retry: { maxAttempts: Number.POSITIVE_INFINITY, baseDelayMs: 1, multiplier: 2, maxDelayMs: 50 },
    concurrency: new AdaptiveConcurrency({ max: 4, min: 1, cooldownMs: 1000 }),
    stall: new StallTimeout({ initialMs: 300, minMs: 200, maxMs: 10_000, percentile: 0.99 }),
    maxRetryDurationMs,
    log: silentLogger,
    metrics,
  });
}

describe('stalled responses and bounded retries (HTTP client)', () => {
  let server: Server;
  let url: string;
  beforeAll(async () => {
    server = createServer((req, res) => {
      if (mode === 'silent') {
        hung.push(res);
        return;
      }
      ranges.push(req.headers.range ?? '');
      const [, a, b] = /bytes=(\d+)-(\d+)/.exec(req.headers.range ?? '')!;
      const start = Number(a);
      const end = Number(b);
      res.writeHead(206, { 'content-range': `bytes ${start}-${end}/${OBJECT.length}`, 'content-length': end - start + 1 });
      if (ranges.length === 1) {
        // 300,000 bytes, then silence with the connection open.
        res.write(OBJECT.subarray(start, start + 300_000));
        hung.push(res);
        return;
      }
      res.end(OBJECT.subarray(start, end + 1));
    });
    await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
    url = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
  });
  afterAll(async () => {
    for (const r of hung) r.destroy();
    await new Promise<void>((r) => server.close(() => r()));
  });

  // On a download worker (into shared memory) the worker cuts and the main thread resumes: the same.
  for (const workers of [0, 1]) {
  it(`cuts a silent body and asks for the rest only, keeping the bytes received (${workers} download workers)`, async () => {
    mode = 'stall-once';
    ranges = [];
    const metrics = new Metrics();
    const c = client(url, metrics, 0, workers);
    const into = workers > 0 ? Buffer.from(new SharedArrayBuffer(OBJECT.length)) : Buffer.alloc(OBJECT.length);
    const hash = { crc32c: null as number | null };
    const got = await c.readRange({ name: 'o', generation: '1', size: OBJECT.length }, 0, OBJECT.length, into, undefined, hash);
    expect(got.equals(OBJECT)).toBe(true);
    // A worker hashes the whole range, the first attempt's bytes included; the main thread does not.
    expect(hash.crc32c).toBe(workers > 0 ? crc32c(OBJECT) : null);
    expect(ranges.length).toBe(2);
    const resumedFrom = Number(/bytes=(\d+)-/.exec(ranges[1]!)![1]);
    expect(resumedFrom).toBeGreaterThan(0);
    expect(resumedFrom).toBeLessThanOrEqual(300_000);
    expect(ranges[1]).toBe(`bytes=${resumedFrom}-${OBJECT.length - 1}`);
    expect(metrics.get('gcs_stalls')).toBe(1);
    expect(metrics.get('gcs_resumed_reads')).toBe(1);
    expect(metrics.get('gcs_media_bytes')).toBe(OBJECT.length);
    await c.close();
  });

  it(`gives up on an endpoint that never answers once --max-retry-duration has passed (${workers} download workers)`, async () => {
    mode = 'silent';
    const metrics = new Metrics();
    const c = client(url, metrics, 1_000, workers);
    const t0 = performance.now();
    const into = workers > 0 ? Buffer.from(new SharedArrayBuffer(1000)) : undefined;
    await expect(c.readRange({ name: 'o', generation: '1', size: 1000 }, 0, 1000, into)).rejects.toThrow(/max-retry-duration 1000 ms/);
    await expect(c.statObject('o')).rejects.toThrow(/max-retry-duration/);
    const seconds = (performance.now() - t0) / 1000;
    expect(seconds).toBeGreaterThan(1.9);
    expect(seconds).toBeLessThan(10);
    expect(metrics.get('gcs_retry_deadline_exceeded')).toBe(2);
    // Attempts were cut by the stall timeout in between, not only by the deadline.
    expect(metrics.get('gcs_stalls')).toBeGreaterThan(0);
    await c.close();
  });
  }
});

import { createServer, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { AdaptiveConcurrency } from '../src/gcs/adaptive-concurrency.js';
import { HttpObjectClient } from '../src/gcs/http-client.js';
import { silentLogger } from '../src/observe/logger.js';
import { Metrics } from '../src/observe/metrics.js';

const OBJECT = Buffer.from(Array.from({ length: 100_000 }, (_, i) => i % 251));

/** How the fake server answers a ranged GET. */
let mode: 'honest' | 'shifted' | 'whole' = 'honest';
let requests = 0;

function client(url: string): HttpObjectClient {
  return new HttpObjectClient({
    endpoint: { origin: url, custom: true },
    bucket: 'b',
    auth: null,
    maxConnections: 4,
    timeoutMs: 5_000,
    retry: { maxAttempts: 3, baseDelayMs: 1, multiplier: 2, maxDelayMs: 5 },
    concurrency: new AdaptiveConcurrency({ max: 4, min: 1, cooldownMs: 1000 }),
    log: silentLogger,
    metrics: new Metrics(),
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
      const got = await c.readRange('o', '1', 5_000, 25_000, into);
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
    await expect(c.readRange('o', '1', 5_000, 25_000, Buffer.alloc(20_000))).rejects.toMatchObject({ code: 'CORRUPT' });
    expect(requests).toBe(1); // not retried
    await c.close();
  });
});

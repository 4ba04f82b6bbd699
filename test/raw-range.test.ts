import { execFileSync } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import net from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import tls from 'node:tls';
import { afterEach, describe, expect, it } from 'vitest';
import { crc32c } from '../src/crc32c.js';
import { StalledError } from '../src/gcs/attempt-limits.js';
import { GcsError } from '../src/gcs/errors.js';
import { RawPool } from '../src/gcs/raw-pool.js';
import { RawFramingError, receiveRangeRaw, type RawConnection } from '../src/gcs/raw-range.js';

// A server whose every answer the test writes by hand: each request (its head) goes to `answer`, with
// the connection's number and the request's number on it.
type Answer = (socket: net.Socket, request: string, conn: number, nth: number) => void;

interface Scripted {
  origin: string;
  connections: number;
  /** The most connections open at once. */
  mostOpen: number;
  requests: string[];
  close(): Promise<void>;
}

const servers: Array<{ close(): Promise<void> }> = [];
afterEach(async () => {
  for (const s of servers.splice(0)) await s.close();
});

function listen(server: net.Server, answer: Answer, scheme: string): Promise<Scripted> {
  const sockets = new Set<net.Socket>();
  const state: Scripted = { origin: '', connections: 0, mostOpen: 0, requests: [], close: async () => undefined };
  server.on(scheme === 'https' ? 'secureConnection' : 'connection', (socket: net.Socket) => {
    const conn = ++state.connections;
    sockets.add(socket);
    state.mostOpen = Math.max(state.mostOpen, sockets.size);
    socket.on('close', () => sockets.delete(socket));
    socket.on('error', () => undefined);
    let pending = '';
    let nth = 0;
    socket.on('data', (d: Buffer) => {
      pending += d.toString('latin1');
      for (let end = pending.indexOf('\r\n\r\n'); end >= 0; end = pending.indexOf('\r\n\r\n')) {
        const request = pending.slice(0, end);
        pending = pending.slice(end + 4);
        state.requests.push(request);
        answer(socket, request, conn, ++nth);
      }
    });
  });
  return new Promise((resolve) => {
    server.listen(0, '127.0.0.1', () => {
      const port = (server.address() as net.AddressInfo).port;
      state.origin = `${scheme}://127.0.0.1:${port}`;
      state.close = () =>
        new Promise<void>((r) => {
          for (const s of sockets) s.destroy();
          server.close(() => r());
        });
      servers.push(state);
      resolve(state);
    });
  });
}

const scripted = (answer: Answer): Promise<Scripted> => listen(net.createServer(), answer, 'http');

const OBJECT = randomBytes(3 * 65536 + 1234);
const noisy: RawConnection = { stall: null, metrics: { inc: () => undefined }, log: { warn: () => undefined } as unknown as RawConnection['log'] };
const limits = (stallMs = 60_000) => ({ stallMs, deadlineAt: performance.now() + 60_000 });

/** The range header's bounds. */
function rangeOf(request: string): [number, number] {
  const m = /range: bytes=(\d+)-(\d+)/i.exec(request)!;
  return [Number(m[1]), Number(m[2])];
}

/** A 206 of the asked range, its head `extra` headers longer. */
function partial(socket: net.Socket, request: string, extra = ''): void {
  const [a, b] = rangeOf(request);
  const body = OBJECT.subarray(a, b + 1);
  socket.write(`HTTP/1.1 206 Partial Content\r\ncontent-range: bytes ${a}-${b}/${OBJECT.length}\r\ncontent-length: ${body.length}\r\nkeep-alive: timeout=5\r\n${extra}\r\n`);
  socket.write(body);
}

async function get(pool: RawPool, start: number, length: number, opts: { stallMs?: number; into?: Buffer } = {}) {
  const out = opts.into ?? Buffer.alloc(length);
  const got = { bytes: 0 };
  const hashed = { crc32c: 0 };
  await receiveRangeRaw(pool, noisy, '/o', { range: `bytes=${start}-${start + length - 1}` }, start, OBJECT.length, out, 'test range', limits(opts.stallMs), got, hashed);
  return { out, got, crc: hashed.crc32c };
}

describe('a range GET read straight into memory (raw-range.ts)', () => {
  it('reads a 206 whose head comes a byte at a time, the body partly with it, and reuses the connection', async () => {
    const server = await scripted((socket, request, _conn, nth) => {
      const [a, b] = rangeOf(request);
      const body = OBJECT.subarray(a, b + 1);
      const head = Buffer.from(`HTTP/1.1 206 Partial Content\r\nContent-Range: bytes ${a}-${b}/${OBJECT.length}\r\nContent-Length: ${body.length}\r\n\r\n`);
      if (nth === 1) {
        // Byte by byte, then the first 100 body bytes with the head's last byte.
        let i = 0;
        const drip = (): void => {
          if (i < head.length - 1) {
            socket.write(head.subarray(i, ++i));
            setTimeout(drip, 1);
          } else {
            socket.write(Buffer.concat([head.subarray(i), body.subarray(0, 100)]));
            setTimeout(() => socket.write(body.subarray(100)), 5);
          }
        };
        drip();
      } else socket.write(Buffer.concat([head, body]));
    });
    const pool = new RawPool(server.origin, {});
    const first = await get(pool, 1000, 150_000);
    expect(first.got.bytes).toBe(150_000);
    expect(first.out.equals(OBJECT.subarray(1000, 151_000))).toBe(true);
    expect(first.crc).toBe(crc32c(OBJECT.subarray(1000, 151_000)));
    const second = await get(pool, 5, 10);
    expect(second.out.equals(OBJECT.subarray(5, 15))).toBe(true);
    expect(server.connections).toBe(1);
    expect(server.requests[0]).toMatch(/^GET \/o HTTP\/1\.1\r\nhost: 127\.0\.0\.1:\d+\r\nrange: bytes=1000-150999$/);
  });

  it('skips into a 200 of the whole object, lands only the window, and closes that connection', async () => {
    const server = await scripted((socket) => {
      socket.write(`HTTP/1.1 200 OK\r\ncontent-length: ${OBJECT.length}\r\n\r\n`);
      socket.write(OBJECT.subarray(0, 70_000));
      setTimeout(() => socket.write(OBJECT.subarray(70_000)), 5);
    });
    const pool = new RawPool(server.origin, {});
    const into = Buffer.alloc(100_002, 0xee);
    const r = await get(pool, 65_000, 100_000, { into: into.subarray(1, 100_001) });
    expect(r.out.equals(OBJECT.subarray(65_000, 165_000))).toBe(true);
    expect(r.crc).toBe(crc32c(OBJECT.subarray(65_000, 165_000)));
    expect(into[0]).toBe(0xee);
    expect(into[100_001]).toBe(0xee);
    await get(pool, 0, 10);
    expect(server.connections).toBe(2);
  });

  it('refuses another range as CORRUPT without landing a byte', async () => {
    const server = await scripted((socket) => {
      socket.write(`HTTP/1.1 206 Partial Content\r\ncontent-range: bytes 0-9/${OBJECT.length}\r\ncontent-length: 10\r\n\r\n`);
      socket.write(OBJECT.subarray(0, 10));
    });
    const pool = new RawPool(server.origin, {});
    const out = Buffer.alloc(10, 0xee);
    await expect(get(pool, 10, 10, { into: out })).rejects.toMatchObject({ code: 'CORRUPT' });
    expect(out.equals(Buffer.alloc(10, 0xee))).toBe(true);
  });

  it('gives an error status its GCS error, Retry-After included, and keeps the connection for the next request', async () => {
    const server = await scripted((socket, request, _conn, nth) => {
      if (nth === 1) {
        const body = JSON.stringify({ error: { code: 503, message: 'backend busy' } });
        socket.write(`HTTP/1.1 503 Service Unavailable\r\nretry-after: 7\r\ncontent-type: application/json\r\ncontent-length: ${body.length}\r\n\r\n${body}`);
      } else partial(socket, request);
    });
    const pool = new RawPool(server.origin, {});
    const err = await get(pool, 0, 100).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(GcsError);
    expect(err).toMatchObject({ code: 'TRANSIENT', status: 503, retryAfterSeconds: 7 });
    expect((err as Error).message).toContain('backend busy');
    const ok = await get(pool, 0, 100);
    expect(ok.out.equals(OBJECT.subarray(0, 100))).toBe(true);
    expect(server.connections).toBe(1);
  });

  it('reads a chunked error body for its message, then closes that connection', async () => {
    const server = await scripted((socket, request, conn) => {
      if (conn === 1) {
        const body = JSON.stringify({ error: { code: 429, message: 'slow down' } });
        socket.write(`HTTP/1.1 429 Too Many Requests\r\ntransfer-encoding: chunked\r\n\r\n${body.length.toString(16)}\r\n${body}\r\n0\r\n\r\n`);
      } else partial(socket, request);
    });
    const pool = new RawPool(server.origin, {});
    const err = await get(pool, 0, 100).catch((e: unknown) => e);
    expect(err).toMatchObject({ code: 'TRANSIENT', status: 429 });
    expect((err as Error).message).toContain('slow down');
    await get(pool, 0, 100);
    expect(server.connections).toBe(2);
  });

  it('settles an empty chunked error body at its last chunk, not at the connection\'s end', async () => {
    const server = await scripted((socket) => socket.write('HTTP/1.1 503 Service Unavailable\r\ntransfer-encoding: chunked\r\n\r\n0\r\n\r\n'));
    const pool = new RawPool(server.origin, {});
    const t0 = performance.now();
    await expect(get(pool, 0, 100, { stallMs: 5_000 })).rejects.toMatchObject({ code: 'TRANSIENT', status: 503 });
    expect(performance.now() - t0).toBeLessThan(2_000);
  });

  it('fails a body cut by a reset as transient, keeping the bytes that came and nothing after them', async () => {
    const server = await scripted((socket, request) => {
      const [a, b] = rangeOf(request);
      socket.write(`HTTP/1.1 206 Partial Content\r\ncontent-range: bytes ${a}-${b}/${OBJECT.length}\r\ncontent-length: ${b - a + 1}\r\n\r\n`);
      socket.write(OBJECT.subarray(a, a + 5000), () => setTimeout(() => socket.resetAndDestroy(), 20));
    });
    const pool = new RawPool(server.origin, {});
    const out = Buffer.alloc(20_000, 0xee);
    const got = { bytes: 0 };
    const err = await receiveRangeRaw(pool, noisy, '/o', { range: 'bytes=0-19999' }, 0, OBJECT.length, out, 'cut', limits(), got).catch((e: unknown) => e);
    expect(err).not.toBeInstanceOf(GcsError);
    expect((err as { code?: string }).code).toBe('UND_ERR_SOCKET');
    expect(got.bytes).toBe(5000);
    expect(out.subarray(0, 5000).equals(OBJECT.subarray(0, 5000))).toBe(true);
    expect(out.subarray(5000).equals(Buffer.alloc(15_000, 0xee))).toBe(true);
  });

  it('asks again on a new connection when a kept-alive one was closed by the server as the request went out', async () => {
    const server = await scripted((socket, request, conn, nth) => {
      // The first connection answers once, then drops the next request unanswered.
      if (conn === 1 && nth === 2) socket.destroy();
      else partial(socket, request);
    });
    const pool = new RawPool(server.origin, {});
    await get(pool, 0, 10);
    const r = await get(pool, 10, 10);
    expect(r.out.equals(OBJECT.subarray(10, 20))).toBe(true);
    expect(server.connections).toBe(2);
  });

  it('retries an unanswered request within the connection limit', async () => {
    const server = await scripted((socket, request, conn, nth) => {
      if (conn === 1 && nth === 2) setTimeout(() => socket.destroy(), 30);
      else setTimeout(() => partial(socket, request), 10);
    });
    const pool = new RawPool(server.origin, { connections: 1 });
    await get(pool, 0, 10);
    const both = await Promise.all([get(pool, 10, 10), get(pool, 20, 10)]);
    expect(both[0].out.equals(OBJECT.subarray(10, 20))).toBe(true);
    expect(both[1].out.equals(OBJECT.subarray(20, 30))).toBe(true);
    expect(server.mostOpen).toBe(1);
  });

  it('skips an interim answer (103) to the final one', async () => {
    const server = await scripted((socket, request) => {
      socket.write('HTTP/1.1 103 Early Hints\r\nlink: </x>; rel=preload\r\n\r\n');
      setTimeout(() => partial(socket, request), 5);
    });
    const pool = new RawPool(server.origin, {});
    const r = await get(pool, 100, 1000);
    expect(r.out.equals(OBJECT.subarray(100, 1100))).toBe(true);
  });

  it('keeps an HTTP/1.0 connection only when the server says keep-alive', async () => {
    const server = await scripted((socket, request, conn) => {
      const [a, b] = rangeOf(request);
      const body = OBJECT.subarray(a, b + 1);
      const keep = conn === 1 ? '' : 'connection: keep-alive\r\n';
      socket.write(Buffer.concat([Buffer.from(`HTTP/1.0 206 Partial Content\r\n${keep}content-range: bytes ${a}-${b}/${OBJECT.length}\r\ncontent-length: ${body.length}\r\n\r\n`), body]));
    });
    const pool = new RawPool(server.origin, {});
    await get(pool, 0, 10); // closed after: the server did not say keep-alive
    await get(pool, 0, 10); // a new connection, kept
    const r = await get(pool, 10, 10);
    expect(r.out.equals(OBJECT.subarray(10, 20))).toBe(true);
    expect(server.connections).toBe(2);
  });

  it('frames no body by a doubtful Content-Length: a range is refused before a byte lands', async () => {
    const server = await scripted((socket, request) => {
      const [a, b] = rangeOf(request);
      const body = OBJECT.subarray(a, b + 1);
      socket.write(Buffer.concat([Buffer.from(`HTTP/1.1 206 Partial Content\r\ncontent-range: bytes ${a}-${b}/${OBJECT.length}\r\ncontent-length: ${body.length}\r\ncontent-length: ${body.length + 1}\r\n\r\n`), body]));
    });
    const pool = new RawPool(server.origin, {});
    const out = Buffer.alloc(10, 0xee);
    await expect(get(pool, 0, 10, { into: out })).rejects.toBeInstanceOf(RawFramingError);
    expect(out.equals(Buffer.alloc(10, 0xee))).toBe(true);
  });

  it('forgets a kept-alive connection the server closed while it was idle', async () => {
    const server = await scripted((socket, request) => {
      partial(socket, request);
      setTimeout(() => socket.end(), 20);
    });
    const pool = new RawPool(server.origin, {});
    await get(pool, 0, 10);
    await new Promise((r) => setTimeout(r, 100));
    const r = await get(pool, 10, 10);
    expect(r.out.equals(OBJECT.subarray(10, 20))).toBe(true);
    expect(server.connections).toBe(2);
  });

  it('refuses a chunked range body before a byte lands (undici reads those)', async () => {
    const server = await scripted((socket, request) => {
      const [a, b] = rangeOf(request);
      const body = OBJECT.subarray(a, b + 1);
      socket.write(`HTTP/1.1 206 Partial Content\r\ncontent-range: bytes ${a}-${b}/${OBJECT.length}\r\ntransfer-encoding: chunked\r\n\r\n${body.length.toString(16)}\r\n`);
      socket.write(body);
      socket.write('\r\n0\r\n\r\n');
    });
    const pool = new RawPool(server.origin, {});
    const out = Buffer.alloc(100, 0xee);
    await expect(get(pool, 0, 100, { into: out })).rejects.toBeInstanceOf(RawFramingError);
    expect(out.equals(Buffer.alloc(100, 0xee))).toBe(true);
  });

  it('cuts a silent body at the stall limit, and bytes sent after that never land', async () => {
    const server = await scripted((socket, request) => {
      const [a, b] = rangeOf(request);
      socket.write(`HTTP/1.1 206 Partial Content\r\ncontent-range: bytes ${a}-${b}/${OBJECT.length}\r\ncontent-length: ${b - a + 1}\r\n\r\n`);
      socket.write(OBJECT.subarray(a, a + 1000));
      setTimeout(() => socket.write(OBJECT.subarray(a + 1000, b + 1)), 300);
    });
    const pool = new RawPool(server.origin, {});
    const out = Buffer.alloc(4000, 0xee);
    const got = { bytes: 0 };
    const err = await receiveRangeRaw(pool, noisy, '/o', { range: 'bytes=0-3999' }, 0, OBJECT.length, out, 'silent', limits(100), got).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(StalledError);
    expect(got.bytes).toBe(1000);
    await new Promise((r) => setTimeout(r, 400));
    expect(out.subarray(1000).equals(Buffer.alloc(3000, 0xee))).toBe(true);
  });

  it('keeps to its connection limit: requests beyond it wait for a connection', async () => {
    let open = 0;
    let most = 0;
    const server = await scripted((socket, request) => {
      open++;
      most = Math.max(most, open);
      setTimeout(() => {
        open--;
        partial(socket, request);
      }, 20);
    });
    const pool = new RawPool(server.origin, { connections: 2 });
    const results = await Promise.all(Array.from({ length: 6 }, (_, i) => get(pool, i * 100, 100)));
    results.forEach((r, i) => expect(r.out.equals(OBJECT.subarray(i * 100, i * 100 + 100))).toBe(true));
    expect(server.connections).toBe(2);
    expect(most).toBeLessThanOrEqual(2);
  });

  it('counts a wait for a connection as the attempt\'s silence, and gives the connection on once it is free', async () => {
    const server = await scripted((socket, request, _conn, nth) => {
      // The first request's answer comes late; it holds the pool's only connection meanwhile.
      if (nth === 1) setTimeout(() => partial(socket, request), 300);
      else partial(socket, request);
    });
    const pool = new RawPool(server.origin, { connections: 1 });
    const slow = get(pool, 0, 10);
    await new Promise((r) => setTimeout(r, 20));
    await expect(get(pool, 10, 10, { stallMs: 100 })).rejects.toBeInstanceOf(StalledError);
    await slow;
    const r = await get(pool, 20, 10);
    expect(r.out.equals(OBJECT.subarray(20, 30))).toBe(true);
    expect(server.connections).toBe(1);
  });

  it('reads over TLS the same', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'gcsmount-tls-'));
    try {
      execFileSync('openssl', ['req', '-x509', '-newkey', 'rsa:2048', '-nodes', '-keyout', join(dir, 'key.pem'), '-out', join(dir, 'cert.pem'), '-days', '2', '-subj', '/CN=127.0.0.1', '-addext', 'subjectAltName=IP:127.0.0.1'], { stdio: 'ignore' });
      const cert = readFileSync(join(dir, 'cert.pem'));
      const server = await listen(tls.createServer({ key: readFileSync(join(dir, 'key.pem')), cert }), (socket, request) => partial(socket, request), 'https');
      const pool = new RawPool(server.origin, { tls: { ca: cert } });
      const r = await get(pool, 777, 190_000);
      expect(r.out.equals(OBJECT.subarray(777, 190_777))).toBe(true);
      expect(r.crc).toBe(crc32c(OBJECT.subarray(777, 190_777)));
      await get(pool, 0, 10);
      expect(server.connections).toBe(1);
      // Not our CA: the connection is refused, as undici's would be.
      const stranger = new RawPool(server.origin, {});
      await expect(get(stranger, 0, 10)).rejects.toMatchObject({ code: expect.stringMatching(/SELF_SIGNED|UNABLE_TO_VERIFY|CERT/) });
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });
});

// GCS behaviours, tested on the emulator (no real GCS is contacted): behaviour the first emulator lacked, and the environments operators run daemons in (issue 16):
// gzip-encoded objects, HTTP(S)_PROXY and NO_PROXY.
import { promises as fsp } from 'node:fs';
import http from 'node:http';
import net from 'node:net';
import { join } from 'node:path';
import { gzipSync } from 'node:zlib';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { cleanupAll, mount, mountStats, run, sha256Of, startBucket, tempDir, unmount, writeObjects, type TestBucket } from './helpers/harness.js';
import { bytes, sha256, upload } from './helpers/objects.js';

const MIB = 1024 * 1024;
const BLOCK = 4 * MIB;

describe('objects stored with Content-Encoding: gzip', () => {
  let tb: TestBucket;
  /** name -> the stored (compressed) bytes, which the mount must show. */
  const stored: Record<string, Buffer> = {};

  beforeAll(async () => {
    tb = await startBucket('gzipped');
    // Small: one whole-object GET. Big: compressed well past the 8 MiB whole-object threshold, so read
    // in 4 MiB range GETs. Incompressible: gzip makes it bigger than its plain bytes.
    stored['small.txt'] = gzipSync(Buffer.from('a small text that compresses\n'.repeat(4000)));
    stored['big.bin'] = gzipSync(Buffer.concat([bytes(18 * MIB, 7), Buffer.alloc(30 * MIB)]), { level: 1 });
    stored['noise.bin'] = gzipSync(bytes(3 * MIB, 8));
    for (const [name, buf] of Object.entries(stored)) await upload(tb, `gz/${name}`, buf, { contentEncoding: 'gzip' });
    expect(stored['big.bin']!.length).toBeGreaterThan(8 * MIB);
    expect(stored['noise.bin']!.length).toBeGreaterThan(3 * MIB);
  });

  afterAll(async () => {
    await cleanupAll();
    await tb?.emulator.close();
  });

  it('reads each as its stored bytes with its stored size, in one ranged GET per block, never a 200', async () => {
    const m = await mount({ tb, args: ['--cache-dir', await tempDir('cache')] });
    try {
      for (const [name, buf] of Object.entries(stored)) {
        expect((await run('stat', ['-c', '%s', join(m.path, 'gz', name)])).stdout.trim(), name).toBe(String(buf.length));
      }
      tb.emulator.resetStats();
      for (const [name, buf] of Object.entries(stored)) expect(await sha256Of(join(m.path, 'gz', name)), name).toBe(sha256(buf));
      const media = tb.emulator.requestLog().filter((e) => e.kind === 'media');
      // small and noise whole (one GET each), big one GET per 4 MiB block.
      expect(media).toHaveLength(2 + Math.ceil(stored['big.bin']!.length / BLOCK));
      expect(new Set(media.map((e) => e.status))).toEqual(new Set([206]));
      // Every byte sent is a stored byte: nothing was decompressed on the way.
      const total = Object.values(stored).reduce((n, b) => n + b.length, 0);
      expect(tb.emulator.stats().mediaBytes).toBe(total);
      // A second read comes from the cache: no request.
      tb.emulator.resetStats();
      expect(await sha256Of(join(m.path, 'gz', 'small.txt'))).toBe(sha256(stored['small.txt']!));
      expect(tb.emulator.stats().requests.media).toBe(0);
    } finally {
      await unmount(m.path);
    }
  });
});

/** A forward proxy on loopback that tunnels CONNECT requests, as corporate proxies do, and counts them. */
async function startConnectProxy(): Promise<{ url: string; tunnels: () => number; bytesDown: () => number; close: () => Promise<void> }> {
  let tunnels = 0;
  let bytesDown = 0;
  const sockets = new Set<net.Socket>();
  const server = http.createServer((_req, res) => {
    // undici tunnels plain http too; a request in absolute-URI form is not expected here.
    res.writeHead(405).end();
  });
  server.on('connect', (req: http.IncomingMessage, client: net.Socket, head: Buffer) => {
    tunnels++;
    const [host, port] = (req.url ?? '').split(':');
    const upstream = net.connect(Number(port), host!, () => {
      client.write('HTTP/1.1 200 Connection Established\r\n\r\n');
      if (head.length) upstream.write(head);
      upstream.on('data', (d: Buffer) => (bytesDown += d.length));
      upstream.pipe(client);
      client.pipe(upstream);
    });
    for (const s of [client, upstream]) {
      sockets.add(s);
      s.on('error', () => s.destroy());
      s.on('close', () => sockets.delete(s));
    }
    upstream.on('close', () => client.destroy());
    client.on('close', () => upstream.destroy());
  });
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  const port = (server.address() as net.AddressInfo).port;
  return {
    url: `http://127.0.0.1:${port}`,
    tunnels: () => tunnels,
    bytesDown: () => bytesDown,
    close: async () => {
      for (const s of sockets) s.destroy();
      await new Promise<void>((r) => server.close(() => r()));
    },
  };
}

describe('HTTP_PROXY and NO_PROXY', () => {
  let tb: TestBucket;
  let proxy: Awaited<ReturnType<typeof startConnectProxy>>;
  const content = bytes(6 * MIB, 21);

  beforeAll(async () => {
    tb = await startBucket('proxied');
    await writeObjects(tb.root, tb.bucket, { 'blob.bin': content });
    proxy = await startConnectProxy();
  });

  afterAll(async () => {
    await cleanupAll();
    await proxy?.close();
    await tb?.emulator.close();
  });

  it('sends every request through the proxy when HTTP_PROXY applies to the endpoint', async () => {
    // undici (unlike curl) proxies loopback too unless NO_PROXY says otherwise; NO_PROXY names another host.
    const m = await mount({ tb, env: { HTTP_PROXY: proxy.url, NO_PROXY: 'example.invalid' } });
    try {
      expect(await sha256Of(join(m.path, 'blob.bin'))).toBe(sha256(content));
      expect(proxy.tunnels()).toBeGreaterThan(0);
      // The object's bytes came down the tunnels: the daemon reached the emulator only through the proxy.
      expect(proxy.bytesDown()).toBeGreaterThan(content.length);
    } finally {
      await unmount(m.path);
    }
  });

  it('goes direct when NO_PROXY names the endpoint host', async () => {
    const before = proxy.tunnels();
    const m = await mount({ tb, env: { HTTP_PROXY: proxy.url, NO_PROXY: 'localhost,127.0.0.1' } });
    try {
      expect(await sha256Of(join(m.path, 'blob.bin'))).toBe(sha256(content));
      expect(tb.emulator.stats().requests.media).toBeGreaterThan(0);
      expect(proxy.tunnels()).toBe(before);
    } finally {
      await unmount(m.path);
    }
  });
});

describe("an object whose bytes do not match GCS's CRC32C", () => {
  let tb: TestBucket;

  beforeAll(async () => {
    tb = await startBucket('crc');
  });

  afterAll(async () => {
    await cleanupAll();
    await tb?.emulator.close();
  });

  it('is never served: refetched, then EIO; served once its bytes match again (checked on a download worker and on the main thread)', async () => {
    for (const workers of ['1', '0']) {
      const name = `crc/w${workers}.bin`;
      const good = bytes(MIB + 7, 40 + Number(workers));
      await writeObjects(tb.root, tb.bucket, { [name]: good });
      const file = join(tb.root, tb.bucket, name);
      const ref = `${file}.times`;
      const m = await mount({ tb, args: ['--download-workers', workers, '--cache-dir', await tempDir('crc-cache')] });
      // Known first (the emulator hashes a version when it first describes it), then damaged in place
      // with its mtime kept: the emulator serves the new bytes under the old CRC32C, as a corrupted read would.
      expect((await run('stat', ['-c', '%s', join(m.path, name)])).stdout.trim()).toBe(String(good.length));
      expect((await run('touch', ['-r', file, ref])).code).toBe(0);
      const bad = Buffer.from(good);
      bad[12345] ^= 0x01;
      await fsp.writeFile(file, bad);
      expect((await run('touch', ['-r', ref, file])).code).toBe(0);
      tb.emulator.resetStats();
      const r = await run('cat', [join(m.path, name)]);
      expect(r.code, `workers ${workers}`).not.toBe(0);
      expect(r.stderr).toMatch(/Input\/output error/);
      // Every download refused (3 per read; the kernel may ask twice, its readahead and the read).
      const media = tb.emulator.stats().requests.media;
      expect(media).toBeGreaterThanOrEqual(3);
      expect(media % 3).toBe(0);
      const counters = (await mountStats(m.path)).counters;
      expect(counters.object_crc_mismatches).toBe(media);
      // Bytes failing GCS's CRC32C are never handed to the native path's memory either.
      expect(counters.native_blocks_lent ?? 0).toBe(0);
      // Right again (same version): read whole and right, once.
      await fsp.writeFile(file, good);
      expect((await run('touch', ['-r', ref, file])).code).toBe(0);
      tb.emulator.resetStats();
      expect(await sha256Of(join(m.path, name))).toBe(sha256(good));
      expect(tb.emulator.stats().requests.media).toBe(1);
      await unmount(m.path);
    }
  });
});

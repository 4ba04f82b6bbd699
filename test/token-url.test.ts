import http from 'node:http';
import type { AddressInfo } from 'node:net';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { CredentialsError, resolveAuth } from '../src/gcs/auth.js';
import { GcsError } from '../src/gcs/errors.js';
import { parseTokenUrl, tokenUrlAuth } from '../src/gcs/token-url.js';
import { cleanupAll, daemonEnv, GCSMOUNT, mount, run, startBucket, tempDir, unmount, writeObjects, type TestBucket } from './helpers/harness.js';

/** A token service: answers GET with the next token (tok-1, tok-2, ...) or what `answer` says; counts the paths asked. */
class TokenServer {
  asked: string[] = [];
  headers: http.IncomingHttpHeaders[] = [];
  answer: ((n: number) => { status: number; body: string }) | null = null;
  expiresIn: number | null = 3600;
  private readonly server = http.createServer((req, res) => {
    this.asked.push(req.url ?? '');
    this.headers.push(req.headers);
    const n = this.asked.length;
    const a = this.answer?.(n) ?? { status: 200, body: JSON.stringify({ access_token: `tok-${n}`, token_type: 'bearer', ...(this.expiresIn === null ? {} : { expires_in: this.expiresIn }) }) };
    res.writeHead(a.status, { 'content-type': 'application/json' }).end(a.body);
  });

  async listen(where: number | string = 0): Promise<string> {
    await new Promise<void>((r) => this.server.listen(typeof where === 'number' ? { port: where, host: '127.0.0.1' } : { path: where }, () => r()));
    const addr = this.server.address();
    return typeof addr === 'string' ? addr : `http://127.0.0.1:${(addr as AddressInfo).port}`;
  }

  close(): Promise<void> {
    this.server.closeAllConnections();
    return new Promise((r) => this.server.close(() => r()));
  }
}

describe('token URLs (gcsfuse --token-url)', () => {
  let tokens: TokenServer;
  let base: string;

  beforeAll(async () => {
    tokens = new TokenServer();
    base = await tokens.listen();
  });

  afterAll(async () => {
    await tokens.close();
  });

  it('reuses one token until 10 s before its expiry, and fetches afresh when GCS refused it', async () => {
    tokens.asked = [];
    tokens.expiresIn = 60;
    let now = 1_000_000;
    const auth = await tokenUrlAuth(`${base}/token?scope=rw`, { reuse: true, timeoutMs: 5000, now: () => now });
    expect(await Promise.all([auth(), auth(), auth()])).toEqual(Array(3).fill({ authorization: 'Bearer tok-1' }));
    now += 49_000;
    expect(await auth()).toEqual({ authorization: 'Bearer tok-1' });
    now += 2_000;
    // Stale for three requests at once: one fetch.
    expect(await Promise.all([auth(), auth(), auth()])).toEqual(Array(3).fill({ authorization: 'Bearer tok-2' }));
    expect(await auth({ fresh: true })).toEqual({ authorization: 'Bearer tok-3' });
    expect(tokens.asked).toEqual(Array(3).fill('/token?scope=rw'));
  });

  it('without reuse, every request fetches its own token (the first one the token fetched at start)', async () => {
    tokens.asked = [];
    const auth = await tokenUrlAuth(`${base}/t`, { reuse: false, timeoutMs: 5000 });
    expect([await auth(), await auth(), await auth()]).toEqual([{ authorization: 'Bearer tok-1' }, { authorization: 'Bearer tok-2' }, { authorization: 'Bearer tok-3' }]);
  });

  it('asks over a Unix socket, the path and query after #', async () => {
    const sock = join(await tempDir('tok'), 'tok.sock');
    const local = new TokenServer();
    await local.listen(sock);
    try {
      const auth = await tokenUrlAuth(`unix://${sock}#/v1/token?aud=gcs`, { reuse: true, timeoutMs: 5000 });
      expect(await auth()).toEqual({ authorization: 'Bearer tok-1' });
      expect(local.asked).toEqual(['/v1/token?aud=gcs']);
    } finally {
      await local.close();
    }
  });

  it('a refusal is UNAUTHENTICATED (given up at once), a 503 transient, a body without a token invalid; bad URLs are refused', async () => {
    try {
      for (const [status, body, code] of [
        [403, '{"error":"denied"}', 'UNAUTHENTICATED'],
        [503, 'busy', 'TRANSIENT'],
        [200, '{"token":"x"}', 'INVALID'],
        [200, 'not json', 'INVALID'],
      ] as const) {
        tokens.answer = () => ({ status, body });
        const err = await tokenUrlAuth(`${base}/t`, { reuse: true, timeoutMs: 5000 }).catch((e: unknown) => e);
        expect(err, `${status} ${body}`).toBeInstanceOf(GcsError);
        expect((err as GcsError).code).toBe(code);
      }
    } finally {
      tokens.answer = null;
    }
    for (const bad of ['ftp://x/y', 'not a url', 'unix:///']) expect(() => parseTokenUrl(bad), bad).toThrow(RangeError);
  });

  it("keeps the fragment's escapes (as gcsfuse), sends user:password as Basic and the User-Agent", async () => {
    expect(parseTokenUrl('unix:///run/t.sock#/token?scope=a%2Bb%26c').path).toBe('/token?scope=a%2Bb%26c');
    tokens.headers = [];
    const withUser = base.replace('http://', 'http://svc:p%40ss@');
    await tokenUrlAuth(`${withUser}/t`, { reuse: true, timeoutMs: 5000, userAgent: 'gcsmount/9.9 job' });
    expect(tokens.headers[0]!.authorization).toBe(`Basic ${Buffer.from('svc:p@ss').toString('base64')}`);
    expect(tokens.headers[0]!['user-agent']).toBe('gcsmount/9.9 job');
  });

  it("takes Go's zero expiry as none, and an expiry before expires_in", async () => {
    let now = Date.parse('2026-12-02T00:00:00Z');
    try {
      tokens.asked = [];
      tokens.answer = (n) => ({ status: 200, body: JSON.stringify({ access_token: `z-${n}`, expiry: '0001-01-01T00:00:00Z', expires_in: 1 }) });
      const zero = await tokenUrlAuth(`${base}/t`, { reuse: true, timeoutMs: 5000, now: () => now });
      now += 3_600_000;
      expect(await zero()).toEqual({ authorization: 'Bearer z-1' });
      tokens.answer = (n) => ({ status: 200, body: JSON.stringify({ access_token: `e-${n}`, expiry: '2026-12-02T00:00:30Z', expires_in: 3600 }) });
      now = Date.parse('2026-12-02T00:00:00Z');
      const dated = await tokenUrlAuth(`${base}/t`, { reuse: true, timeoutMs: 5000, now: () => now });
      now += 21_000;
      expect((await dated()).authorization).not.toBe('Bearer e-2');
    } finally {
      tokens.answer = null;
    }
  });

  it('requests refused together take one new token between them', async () => {
    tokens.asked = [];
    const auth = await tokenUrlAuth(`${base}/t`, { reuse: true, timeoutMs: 5000 });
    const old = (await auth()).authorization;
    const first = await auth({ fresh: true, refused: old });
    // Refused with the old token too, but answered after the new one came: no third fetch.
    expect(await Promise.all([auth({ fresh: true, refused: old }), auth({ fresh: true, refused: old })])).toEqual([first, first]);
    expect(tokens.asked).toHaveLength(2);
  });

  it('gives up on an answer that trickles past the deadline', async () => {
    const slow = http.createServer((_req, res) => {
      res.writeHead(200, { 'content-type': 'application/json' });
      res.write('{');
      const t = setInterval(() => res.write(' '), 50);
      res.on('close', () => clearInterval(t));
    });
    await new Promise<void>((r) => slow.listen(0, '127.0.0.1', () => r()));
    try {
      const t0 = performance.now();
      const err = await tokenUrlAuth(`http://127.0.0.1:${(slow.address() as AddressInfo).port}/t`, { reuse: true, timeoutMs: 400 }).catch((e: unknown) => e);
      expect((err as GcsError).code).toBe('TRANSIENT');
      expect((err as GcsError).message).toMatch(/no token within 0.4 s/);
      expect(performance.now() - t0).toBeLessThan(5000);
    } finally {
      slow.closeAllConnections();
      await new Promise((r) => slow.close(r));
    }
  });

  it('at start, waits for a token service not up yet within the start-up timeout; without one, fails at once', async () => {
    const later = new TokenServer();
    const port = await new Promise<number>((r) => {
      const probe = http.createServer().listen(0, '127.0.0.1', () => {
        const p = (probe.address() as AddressInfo).port;
        probe.close(() => r(p));
      });
    });
    const url = `http://127.0.0.1:${port}/t`;
    await expect(resolveAuth({ kind: 'token-url', url, reuse: true }, { startupMs: 0 })).rejects.toBeInstanceOf(CredentialsError);
    const up = setTimeout(() => void later.listen(port), 600);
    try {
      const auth = await resolveAuth({ kind: 'token-url', url, reuse: true }, { startupMs: 20_000 });
      expect(await auth!()).toEqual({ authorization: 'Bearer tok-1' });
    } finally {
      clearTimeout(up);
      await later.close().catch(() => undefined);
    }
  });
});

describe('a mount with --token-url', () => {
  let tb: TestBucket;
  let tokens: TokenServer;
  let url: string;

  beforeAll(async () => {
    tb = await startBucket('tokened');
    await writeObjects(tb.root, tb.bucket, { 'a.txt': 'with a token', 'b.txt': 'still readable' });
    tokens = new TokenServer();
    url = `${await tokens.listen()}/token`;
  });

  afterAll(async () => {
    await cleanupAll();
    await tokens?.close();
    await tb?.emulator.close();
  });

  it('sends its tokens (with --custom-endpoint too) and takes a new one when GCS refuses the old', async () => {
    tokens.asked = [];
    tokens.answer = null;
    // tok-1 is the start check's, which the daemon's own client reuses.
    const m = await mount({ tb, args: ['--token-url', url] });
    try {
      expect((await run('cat', [`${m.path}/a.txt`])).stdout).toBe('with a token');
      const fetched = tokens.asked.length;
      tb.emulator.setKnobs({ rejectTokens: Array.from({ length: fetched }, (_, i) => `tok-${i + 1}`) });
      const r = await run('cat', [`${m.path}/b.txt`]);
      expect(r.stdout, r.stderr).toBe('still readable');
      expect(tokens.asked.length).toBe(fetched + 1);
      expect(tb.emulator.stats().injected['401']).toBeGreaterThan(0);
    } finally {
      tb.emulator.setKnobs({ rejectTokens: [] });
      await unmount(m.path);
    }
  });

  it('a token service that refuses fails the start: exit 5, one line; a URL it cannot use is exit 2', async () => {
    tokens.answer = () => ({ status: 403, body: '{"error":"denied"}' });
    try {
      const r = await run(GCSMOUNT, [tb.bucket, await tempDir('mnt'), '--custom-endpoint', tb.emulator.url, '--token-url', url], { env: daemonEnv() });
      expect(r.code, r.stderr).toBe(5);
      expect(r.stderr.trim().split('\n')).toHaveLength(1);
      expect(r.stderr).toMatch(/cannot get an access token: --token-url .* answered HTTP 403/);
    } finally {
      tokens.answer = null;
    }
    const bad = await run(GCSMOUNT, [tb.bucket, await tempDir('mnt'), '--custom-endpoint', tb.emulator.url, '--token-url', 'ftp://127.0.0.1/x'], { env: daemonEnv() });
    expect(bad.code, bad.stderr).toBe(2);
    expect(bad.stderr).toMatch(/only http, https and unix URLs/);
  });
});

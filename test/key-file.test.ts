import { generateKeyPairSync } from 'node:crypto';
import { promises as fsp } from 'node:fs';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createServer, type Socket } from 'node:net';
import { CredentialsError, resolveAuth, tokenError } from '../src/gcs/auth.js';
import { GcsError } from '../src/gcs/errors.js';
import { checkKeyFile } from '../src/gcs/key-file.js';
import { cleanupAll, daemonEnv, GCSMOUNT, run, startBucket, tempDir, type TestBucket } from './helpers/harness.js';

/** A --key-file that cannot give a token stops the mount (exit 5, one line naming it), never mounts without one. */
describe('--key-file', () => {
  let tb: TestBucket;
  let dir: string;
  const pem = generateKeyPairSync('rsa', { modulusLength: 2048 }).privateKey.export({ type: 'pkcs8', format: 'pem' }) as string;
  const serviceAccount = { type: 'service_account', project_id: 'p', private_key_id: 'k', private_key: pem, client_email: 'sa@p.iam.gserviceaccount.com', token_uri: 'https://oauth2.googleapis.com/token' };
  const write = async (name: string, text: string) => {
    const path = join(dir, name);
    await fsp.writeFile(path, text);
    return path;
  };

  beforeAll(async () => {
    tb = await startBucket('keys');
    dir = await tempDir('keys');
  });

  afterAll(async () => {
    await cleanupAll();
    await tb?.emulator.close();
  });

  it('gives up on a token endpoint that never answers, after the token timeout, with one line (it hung for good)', async () => {
    // A proxy on loopback that takes the connection and never answers: the token request goes nowhere else.
    const sockets: Socket[] = [];
    const silent = createServer((s) => void sockets.push(s));
    await new Promise<void>((r) => silent.listen(0, '127.0.0.1', r));
    const { port } = silent.address() as { port: number };
    const saved = { https: process.env.HTTPS_PROXY, no: process.env.NO_PROXY };
    process.env.HTTPS_PROXY = `http://127.0.0.1:${port}`;
    delete process.env.NO_PROXY;
    try {
      const key = await write('sa-silent.json', JSON.stringify(serviceAccount));
      const t0 = performance.now();
      const outcome = await Promise.race([
        resolveAuth({ kind: 'key-file', path: key }, { env: { METADATA_SERVER_DETECTION: 'none' }, tokenTimeoutMs: 500 }).then(() => 'resolved', (err: unknown) => err),
        new Promise((r) => setTimeout(() => r('hung'), 10_000)),
      ]);
      expect(outcome).toBeInstanceOf(CredentialsError);
      expect((outcome as Error).message).toMatch(/no access token after 0.5 s/);
      expect(performance.now() - t0).toBeLessThan(5_000);
    } finally {
      process.env.HTTPS_PROXY = saved.https;
      if (saved.https === undefined) delete process.env.HTTPS_PROXY;
      if (saved.no !== undefined) process.env.NO_PROXY = saved.no;
      for (const s of sockets) s.destroy();
      silent.close();
    }
  });

  it('takes a token endpoint refusing the credentials (invalid_grant) as UNAUTHENTICATED, not a transient error', () => {
    const refused = tokenError(Object.assign(new Error('invalid_grant: Invalid JWT Signature.'), { response: { status: 400, data: { error: 'invalid_grant' } } }));
    expect(refused).toBeInstanceOf(GcsError);
    expect((refused as GcsError).code).toBe('UNAUTHENTICATED');
    const unavailable = Object.assign(new Error('Service Unavailable'), { response: { status: 503 } });
    expect(tokenError(unavailable)).toBe(unavailable);
  });

  it('accepts service-account and authorized-user keys', async () => {
    expect(() => checkKeyFile(join(dir, 'none')), 'missing').toThrow(CredentialsError);
    checkKeyFile(await write('sa.json', JSON.stringify(serviceAccount)));
    checkKeyFile(await write('user.json', JSON.stringify({ type: 'authorized_user', client_id: 'c', client_secret: 's', refresh_token: 'r' })));
  });

  it('refuses truncated, corrupt and incomplete keys with one line naming the file', async () => {
    const full = JSON.stringify(serviceAccount);
    const bad: Record<string, string> = {
      truncated: full.slice(0, full.length / 2),
      empty: '',
      array: '[]',
      'no-type': JSON.stringify({ ...serviceAccount, type: undefined }),
      'no-email': JSON.stringify({ ...serviceAccount, client_email: '' }),
      'key-cut': JSON.stringify({ ...serviceAccount, private_key: pem.slice(0, 500) }),
      'user-no-token': JSON.stringify({ type: 'authorized_user', client_id: 'c', client_secret: 's' }),
    };
    for (const [name, text] of Object.entries(bad)) {
      const path = await write(`${name}.json`, text);
      expect(() => checkKeyFile(path), name).toThrow(new RegExp(`^key file ${path} is not usable: [^\\n]+$`));
    }
  });

  it('stops the mount with exit 5 and one line, even where the key would go unused (a custom endpoint)', async () => {
    const full = JSON.stringify(serviceAccount);
    const path = await write('cut.json', full.slice(0, 300));
    const mnt = await tempDir('mnt');
    tb.emulator.resetStats();
    const r = await run(GCSMOUNT, [tb.bucket, mnt, '--custom-endpoint', tb.emulator.url, '--key-file', path], { env: daemonEnv() });
    if (r.code === 0) await run('fusermount3', ['-u', '-z', mnt]); // mounted after all: do not leave it
    expect(r.code, r.stderr).toBe(5);
    const lines = r.stderr.trim().split('\n');
    expect(lines).toHaveLength(1);
    expect(lines[0]).toMatch(new RegExp(`^gcsmount: key file ${path} is not usable: not JSON`));
    // Nothing went out without credentials.
    const s = tb.emulator.stats().requests;
    expect(s.list + s.metadata + s.media).toBe(0);
  });
});

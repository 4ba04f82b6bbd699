import { generateKeyPairSync } from 'node:crypto';
import { promises as fsp } from 'node:fs';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { CredentialsError } from '../src/gcs/auth.js';
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

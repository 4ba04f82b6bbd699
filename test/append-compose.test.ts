import { promises as fsp } from 'node:fs';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { AppendTempSweeper, composeAppend, STALE_MS, type ComposeAppendDeps } from '../src/writes/append-compose.js';
import { GcsError } from '../src/gcs/errors.js';
import type { ObjectMeta, WritableObjectClient, WrittenObject } from '../src/gcs/object-client.js';
import { crc32c } from '../src/crc32c.js';
import { crc32cBase64 } from '../src/gcs/uploads.js';
import { cleanupAll, GCSMOUNT, mount, mountStats, run, startBucket, tempDir, unmount, type Mounted, type TestBucket } from './helpers/harness.js';
import { bytes, upload } from './helpers/objects.js';

const MIB = 2 ** 20;

async function stored(tb: TestBucket, name: string): Promise<Buffer | null> {
  const res = await fetch(`${tb.emulator.url}/storage/v1/b/${tb.bucket}/o/${encodeURIComponent(name)}?alt=media`);
  return res.status === 404 ? null : Buffer.from(await res.arrayBuffer());
}

async function resource(tb: TestBucket, name: string): Promise<Record<string, unknown>> {
  return (await (await fetch(`${tb.emulator.url}/storage/v1/b/${tb.bucket}/o/${encodeURIComponent(name)}`)).json()) as Record<string, unknown>;
}

/** gcsfuse's append optimization: an append to an object of 2 MiB or more sends the tail, not the file. */
describe('appends by compose, through a mount', () => {
  let tb: TestBucket;
  let m: Mounted;

  const head = bytes(3 * MIB + 17, 1);
  const big = bytes(3 * MIB, 2);
  const small = bytes(MIB, 3);

  beforeAll(async () => {
    tb = await startBucket('appends');
    // All there before the mount lists anything: what it lists is kept for its metadata TTL.
    await upload(tb, 'logs/run.log', head, { contentType: 'text/plain', metadata: { owner: 'pipeline' } });
    await upload(tb, 'edit/big.bin', big);
    await upload(tb, 'edit/small.bin', small);
    await upload(tb, 'race/a.log', bytes(2 * MIB + 5, 4));
    m = await mount({ tb, args: ['--cache-dir', await tempDir('cache')] });
  });

  afterAll(async () => {
    if (m) await unmount(m.path);
    await cleanupAll();
    await tb?.emulator.close();
  });

  it('sends the tail as a temporary object and composes it on: three requests, the bytes, the attributes kept, no temporary left', async () => {
    // Read once: in the block cache, the staged copy's fill needs no download.
    expect((await run('sh', ['-c', `cat '${m.path}/logs/run.log' | wc -c`])).stdout.trim()).toBe(String(head.length));
    const before = await mountStats(m.path);
    tb.emulator.resetStats();
    const r = await run('sh', ['-c', `printf 'epoch 1 done\\n' >> '${m.path}/logs/run.log'`]);
    expect(r.code, r.stderr).toBe(0);
    const after = await mountStats(m.path);
    const log = tb.emulator.requestLog().filter((e) => e.kind !== 'metadata' && e.kind !== 'list');
    expect(log.map((e) => `${e.method} ${e.kind}`)).toEqual(['POST upload', 'POST compose', 'DELETE delete']);
    expect((after.counters.gcs_upload_bytes ?? 0) - (before.counters.gcs_upload_bytes ?? 0)).toBe('epoch 1 done\n'.length);
    expect((after.counters.write_compose_appends ?? 0) - (before.counters.write_compose_appends ?? 0)).toBe(1);
    expect((await stored(tb, 'logs/run.log'))!.equals(Buffer.concat([head, Buffer.from('epoch 1 done\n')]))).toBe(true);
    const res = await resource(tb, 'logs/run.log');
    expect(res.contentType).toBe('text/plain');
    expect((res.metadata as Record<string, string>).owner).toBe('pipeline');
    expect((res.metadata as Record<string, string>).gcsfuse_mtime).toBeDefined();
    const tails = await (await fetch(`${tb.emulator.url}/storage/v1/b/${tb.bucket}/o?prefix=.gcsmount_tmp/`)).json();
    expect((tails as { items?: unknown[] }).items ?? []).toEqual([]);
    // The mount reads the new generation: the appended line, from its own cache or the bucket.
    expect((await run('tail', ['-c', '13', `${m.path}/logs/run.log`])).stdout).toBe('epoch 1 done\n');
    // And a second append composes onto the composed object.
    await run('sh', ['-c', `printf 'epoch 2 done\\n' >> '${m.path}/logs/run.log'`]);
    expect((await stored(tb, 'logs/run.log'))!.equals(Buffer.concat([head, Buffer.from('epoch 1 done\nepoch 2 done\n')]))).toBe(true);
    expect((await run(GCSMOUNT, ['stats', m.path])).stdout).toMatch(/writes +uploads 2 \(appends by compose 2\) +sent 26 B/);
  });

  it('uploads the whole file when a byte inside the object changed, or the object is under 2 MiB', async () => {
    tb.emulator.resetStats();
    // Append and a write at offset 10 in one open: not an append only.
    const py = `import os,sys\nfd=os.open(sys.argv[1], os.O_WRONLY)\nos.pwrite(fd, b'XY', 10)\nos.pwrite(fd, b'tail', ${3 * MIB})\nos.close(fd)`;
    const r1 = await run('/usr/bin/python3', ['-c', py, `${m.path}/edit/big.bin`]);
    expect(r1.code, r1.stderr).toBe(0);
    await run('sh', ['-c', `printf 'more' >> '${m.path}/edit/small.bin'`]);
    expect(tb.emulator.requestLog().filter((e) => e.kind === 'compose')).toEqual([]);
    const want = Buffer.concat([big, Buffer.from('tail')]);
    want.write('XY', 10);
    expect((await stored(tb, 'edit/big.bin'))!.equals(want)).toBe(true);
    expect((await stored(tb, 'edit/small.bin'))!.equals(Buffer.concat([small, Buffer.from('more')]))).toBe(true);
  });

  it('an object replaced behind the mount while open for appending: the close fails ESTALE, the other object stays, no temporary left', async () => {
    const theirs = bytes(2 * MIB + 9, 5);
    // Open, append, wait for the file to be replaced, close: python holds the descriptor across it.
    const py = `import os,sys,time\nfd=os.open(sys.argv[1], os.O_WRONLY|os.O_APPEND)\nos.write(fd, b'mine')\nprint('written', flush=True)\nwhile not os.path.exists(sys.argv[2]): time.sleep(0.05)\ntry:\n  os.close(fd)\n  print('closed')\nexcept OSError as e:\n  print(e.errno)`;
    const flag = join(await tempDir('flag'), 'go');
    const writer = run('/usr/bin/python3', ['-c', py, `${m.path}/race/a.log`, flag]);
    await new Promise((r) => setTimeout(r, 1000));
    await upload(tb, 'race/a.log', theirs);
    await fsp.writeFile(flag, '');
    const done = await writer;
    const out = done.stdout.trim().split('\n');
    expect(done.stderr).toBe('');
    expect(out).toEqual(['written', '116']); // ESTALE
    expect((await stored(tb, 'race/a.log'))!.equals(theirs)).toBe(true);
    const tails = await (await fetch(`${tb.emulator.url}/storage/v1/b/${tb.bucket}/o?prefix=.gcsmount_tmp/`)).json();
    expect((tails as { items?: unknown[] }).items ?? []).toEqual([]);
  });
});

/** The compose step alone, on a client that fails where told. */
describe('composeAppend', () => {
  const source: ObjectMeta = { name: 'f', size: 4, generation: '7', metageneration: '1', updatedMs: 0, crc32c: crc32cBase64(crc32c(Buffer.from('head'))) };
  const want = crc32cBase64(crc32c(Buffer.from('headtail')));
  const written = (name: string, size: number, generation: string, crc: string): WrittenObject => ({ name, size, generation, metageneration: '1', updatedMs: 0, crc32c: crc, contentType: null, metadata: {} });
  const deps = (client: Partial<WritableObjectClient>, calls: string[]): ComposeAppendDeps => ({
    client: {
      uploadObject: async (name: string) => (calls.push(`upload ${name.slice(0, 14)}`), written(name, 4, '100', 'x')),
      deleteObject: async (name: string, o?: { ifGenerationMatch?: string }) => void calls.push(`delete ${name.slice(0, 14)}#${o?.ifGenerationMatch}`),
      ...client,
    } as WritableObjectClient,
    log: { info: () => undefined, warn: () => undefined, error: () => undefined } as never,
    metrics: { inc: () => undefined } as never,
    tempPrefix: '.gcsmount_tmp/',
  });
  const args = { name: 'f', source, tail: Buffer.from('tail'), attrs: { metadata: {} } };

  it('falls back (whole upload) when the tail cannot be stored, or GCS refuses the compose; the tail is deleted', async () => {
    const calls: string[] = [];
    expect(await composeAppend(deps({ uploadObject: async () => Promise.reject(new GcsError('FORBIDDEN', 'no')) }, calls), args)).toEqual({ fallback: true });
    expect(calls).toEqual([]);
    expect(await composeAppend(deps({ composeObjects: async () => Promise.reject(new GcsError('INVALID', 'too many components', 400)) }, calls), args)).toEqual({ fallback: true });
    expect(calls).toEqual(['upload .gcsmount_tmp/', 'delete .gcsmount_tmp/#100']);
  });

  it('a 412 is ESTALE unless the object is what this compose makes (an answer lost and sent again)', async () => {
    const calls: string[] = [];
    const refused = { composeObjects: async () => Promise.reject(new GcsError('PRECONDITION', '412', 412)) };
    await expect(composeAppend(deps({ ...refused, statObject: async () => ({ ...source, generation: '9', size: 8, crc32c: 'other' }) }, calls), args)).rejects.toMatchObject({ code: 'PRECONDITION' });
    const ours = await composeAppend(deps({ ...refused, statObject: async () => ({ ...source, generation: '9', size: 8, crc32c: want }), objectAttributes: async () => ({ contentType: 'text/plain', metadata: { a: 'b' } }) }, calls), args);
    expect(ours).toMatchObject({ object: { generation: '9', size: 8, contentType: 'text/plain', metadata: { a: 'b' } } });
    expect(calls.filter((c) => c.startsWith('delete'))).toHaveLength(2);
  });

  it('a composed object that is not the file is replaced by a whole upload over it', async () => {
    const calls: string[] = [];
    const bad = written('f', 8, '11', 'not-it');
    expect(await composeAppend(deps({ composeObjects: async () => bad }, calls), args)).toEqual({ fallback: true, over: bad });
    expect(await composeAppend(deps({ composeObjects: async () => written('f', 8, '12', want) }, calls), args)).toMatchObject({ object: { generation: '12' } });
  });

  it('the sweeper deletes only stale tails under its prefix, each at its listed generation', async () => {
    const now = 10 * STALE_MS;
    const listed: ObjectMeta[] = [
      { name: '.gcsmount_tmp/00112233445566ff', size: 1, generation: '1', metageneration: '1', updatedMs: now - STALE_MS - 1, crc32c: null },
      { name: '.gcsmount_tmp/8899aabbccddeeff', size: 1, generation: '2', metageneration: '1', updatedMs: now - 1000, crc32c: null },
      // Old, under the prefix, but not a tail's name: a user's file.
      { name: '.gcsmount_tmp/notes.txt', size: 1, generation: '3', metageneration: '1', updatedMs: now - STALE_MS - 1, crc32c: null },
    ];
    const calls: string[] = [];
    const sweeper = new AppendTempSweeper(deps({ list: async (req) => (calls.push(`list ${req.prefix}`), { objects: listed, prefixes: [], nextPageToken: null }) }, calls), () => now);
    await sweeper.sweep();
    await sweeper.close();
    expect(calls).toEqual(['list .gcsmount_tmp/', 'delete .gcsmount_tmp/#1']);
  });
});

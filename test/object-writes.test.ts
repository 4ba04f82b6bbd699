// The write layer of gcs/ against the emulator: resumable sessions (with resets, 429s and expiry),
// preconditions, and the one-call writes, with the requests each costs read from the emulator's log.
import { randomBytes } from 'node:crypto';
import { promises as fsp } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { afterAll, afterEach, beforeAll, beforeEach, describe, expect, it } from 'vitest';
import { crc32c } from '../src/crc32c.js';
import { AdaptiveConcurrency } from '../src/gcs/adaptive-concurrency.js';
import { GcsError, UploadSessionExpiredError, isSessionExpired } from '../src/gcs/errors.js';
import { HttpObjectClient } from '../src/gcs/http-client.js';
import { formatMtime, parseMtime } from '../src/gcs/mtime.js';
import type { RetryPolicy } from '../src/gcs/retry.js';
import { crc32cBase64 } from '../src/gcs/uploads.js';
import { startEmulator, type Emulator, type EmulatorKnobs, type RequestLogEntry } from '../src/emulator/server.js';
import { silentLogger } from '../src/observe/logger.js';
import { Metrics } from '../src/observe/metrics.js';

const MiB = 1024 * 1024;
const QUIET: Partial<EmulatorKnobs> = { rate429: 0, rate503: 0, uploadResetRate: 0, uploadDropRate: 0, uploadBytesPerSec: 0, uploadSessionTtlMs: 0, rewriteBytesPerCall: 0, retryAfterSeconds: null };

let root: string;
let emu: Emulator;
let metrics: Metrics;
let client: HttpObjectClient;

function makeClient(retry: RetryPolicy = { maxAttempts: 20, baseDelayMs: 1, multiplier: 2, maxDelayMs: 20 }, downloadWorkers = 0, timeoutMs = 30_000): HttpObjectClient {
  metrics = new Metrics();
  return new HttpObjectClient({
    downloadWorkers,
    endpoint: { origin: emu.url, custom: true },
    bucket: 'bkt',
    auth: null,
    maxConnections: 4,
    timeoutMs,
    retry,
    concurrency: new AdaptiveConcurrency({ max: 4, min: 1, cooldownMs: 1000 }),
    log: silentLogger,
    metrics,
  });
}

const crcOf = (b: Buffer): string => crc32cBase64(crc32c(b));
const onDisk = (name: string): Promise<Buffer> => fsp.readFile(path.join(root, 'bkt', name));
const uploads = (): RequestLogEntry[] => emu.requestLog().filter((e) => e.kind === 'upload');

/** Sends `data` through one session in `chunk`-byte chunks, the last one finalizing. */
async function uploadInChunks(name: string, data: Buffer, chunk: number, ifGenerationMatch = '0'): Promise<void> {
  const session = await client.startUpload(name, { ifGenerationMatch });
  for (let off = 0; off < data.length; off += chunk) {
    const end = Math.min(data.length, off + chunk);
    const final = end === data.length ? { size: data.length, crc32c: crcOf(data) } : undefined;
    const r = await client.putChunk(session, off, data.subarray(off, end), { final });
    expect(r.committed).toBe(end);
    if (final) expect(r.object?.crc32c).toBe(final.crc32c);
  }
}

beforeAll(async () => {
  root = await fsp.mkdtemp(path.join(os.tmpdir(), 'gcs-writes-test-'));
  await fsp.mkdir(path.join(root, 'bkt'));
  emu = await startEmulator({ root });
});

afterAll(async () => {
  await emu?.close();
  if (root) await fsp.rm(root, { recursive: true, force: true });
});

beforeEach(() => {
  client = makeClient();
  emu.setKnobs(QUIET);
  emu.resetStats();
});

afterEach(async () => {
  emu.setKnobs(QUIET);
  await client.close();
});

describe('resumable uploads', () => {
  it('sends 100 MiB in 32 MiB chunks as one session of 4 chunk PUTs, each byte once, CRC32C checked', async () => {
    const data = randomBytes(100 * MiB);
    await uploadInChunks('big', data, 32 * MiB);
    expect((await onDisk('big')).equals(data)).toBe(true);
    const log = uploads();
    expect(log.filter((e) => e.method === 'POST')).toHaveLength(1);
    const puts = log.filter((e) => e.method === 'PUT');
    expect(puts.map((e) => e.range)).toEqual([0, 1, 2, 3].map((i) => ({ start: i * 32 * MiB, end: Math.min(100 * MiB, (i + 1) * 32 * MiB) - 1 })));
    expect(metrics.get('gcs_requests_upload')).toBe(5);
    expect(metrics.get('gcs_upload_bytes')).toBe(100 * MiB);
    expect(metrics.get('gcs_uploads_finalized')).toBe(1);
    expect(metrics.get('gcs_upload_resumes')).toBe(0);
  });

  it('a chunk GCS answers 308 without keeping is sent again after a backoff, never in a loop as fast as GCS answers', async () => {
    const data = randomBytes(2 * MiB + 7);
    client = makeClient({ maxAttempts: 20, baseDelayMs: 40, multiplier: 2, maxDelayMs: 200 });
    emu.setKnobs({ uploadDropRate: 1 });
    const started = performance.now();
    const done = uploadInChunks('dropped', data, MiB);
    // While every chunk is dropped: a handful of attempts in half a second, not hundreds.
    await new Promise((r) => setTimeout(r, 500));
    const whileDropped = uploads().filter((e) => e.injected === 'upload-drop').length;
    emu.setKnobs(QUIET);
    await done;
    expect((await onDisk('dropped')).equals(data)).toBe(true);
    expect(whileDropped).toBeGreaterThanOrEqual(2);
    expect(whileDropped).toBeLessThanOrEqual(12);
    expect(performance.now() - started).toBeGreaterThan(500);
  });

  for (const workers of [0, 1]) {
    it(`a chunk that takes longer to send than --http-client-timeout is not cut while its bytes go out (${workers} download workers)`, async () => {
      await client.close();
      client = makeClient(undefined, workers, 1_000);
      // A 3 MiB chunk taken at 2 MiB/s: 1.5 s of sending against a 1 s silence limit, GCS never silent.
      const data = Buffer.from(new SharedArrayBuffer(3 * MiB + 5));
      randomBytes(data.length).copy(data);
      emu.setKnobs({ uploadBytesPerSec: 2 * MiB });
      try {
        await uploadInChunks(`slow-link-${workers}`, data, 4 * MiB);
      } finally {
        emu.setKnobs(QUIET);
      }
      expect((await onDisk(`slow-link-${workers}`)).equals(data)).toBe(true);
      // One request, never cut and resumed.
      expect(uploads().filter((e) => e.method === 'PUT')).toHaveLength(1);
      expect(metrics.get('gcs_retries')).toBe(0);
    });
  }

  it('a chunk reset part-way is resumed from the committed offset: no byte sent again beyond the uncommitted tail', async () => {
    const data = randomBytes(12 * MiB + 12345);
    emu.setKnobs({ uploadResetRate: 0.5, seed: 7 });
    await uploadInChunks('reset', data, 4 * MiB);
    emu.setKnobs(QUIET);
    expect((await onDisk('reset')).equals(data)).toBe(true);
    const log = uploads().filter((e) => e.method === 'PUT');
    expect(log.some((e) => e.injected === 'reset')).toBe(true);
    expect(metrics.get('gcs_upload_resumes')).toBeGreaterThan(0);
    // Each request that sends bytes starts exactly where the session stood after the one before it
    // (a chunk's answer, or the status query after a cut): committed bytes are never sent again.
    let committed = 0;
    for (const e of log) {
      if (e.range) expect(e.range.start).toBe(committed);
      expect(e.committed).not.toBeNull();
      committed = e.committed!;
    }
    expect(committed).toBe(data.length);
  });

  it('sends chunks in shared memory on a download worker; one that dies with a chunk in flight is resumed from the committed offset', async () => {
    await client.close();
    client = makeClient(undefined, 1);
    // The afterEach hook closes it.
    const data = Buffer.from(new SharedArrayBuffer(3 * MiB));
    randomBytes(3 * MiB).copy(data);
    const session = await client.startUpload('on-worker', { ifGenerationMatch: '0' });
    // Every answer 300 ms late: the first chunk is still waiting for its answer when its worker goes.
    emu.setKnobs({ latencyMs: 300 });
    const first = client.putChunk(session, 0, data.subarray(0, MiB));
    await new Promise((r) => setTimeout(r, 100));
    const [slot] = (client.workers as unknown as { slots: Array<{ worker: { terminate(): Promise<number> } }> }).slots;
    await slot!.worker.terminate();
    expect((await first).committed).toBe(MiB);
    emu.setKnobs(QUIET);
    await client.putChunk(session, MiB, data.subarray(MiB, 2 * MiB));
    const done = await client.putChunk(session, 2 * MiB, data.subarray(2 * MiB), { final: { size: data.length, crc32c: crcOf(data) } });
    expect(done.object?.size).toBe(data.length);
    expect((await onDisk('on-worker')).equals(data)).toBe(true);
    expect(metrics.get('gcs_upload_requests_on_workers')).toBeGreaterThanOrEqual(3);
    expect(metrics.get('gcs_upload_resumes')).toBeGreaterThanOrEqual(1);
    expect(client.workers?.count).toBe(1);
  });

  it('retries 429s on chunks (a status query, then the rest) and counts them', async () => {
    const data = randomBytes(3 * MiB);
    emu.setKnobs({ rate429: 0.4, seed: 3 });
    await uploadInChunks('throttled', data, MiB);
    emu.setKnobs(QUIET);
    expect((await onDisk('throttled')).equals(data)).toBe(true);
    expect(metrics.get('gcs_throttled')).toBeGreaterThan(0);
    const sent = uploads().filter((e) => e.range !== null && (e.status === 308 || e.status === 200)).reduce((n, e) => n + (e.range ? e.range.end - e.range.start + 1 : 0), 0);
    expect(sent).toBe(data.length);
  });

  it('reports an expired session distinctly (the caller restarts), and a 412 at start and at finalize', async () => {
    emu.setKnobs({ uploadSessionTtlMs: 30 });
    const session = await client.startUpload('expiring', { ifGenerationMatch: '0' });
    await new Promise((r) => setTimeout(r, 80));
    const err = await client.putChunk(session, 0, Buffer.alloc(256 * 1024)).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(UploadSessionExpiredError);
    expect(isSessionExpired(err)).toBe(true);
    expect(metrics.get('gcs_upload_sessions_expired')).toBe(1);
    emu.setKnobs(QUIET);

    await client.uploadObject('taken', Buffer.from('first'), { ifGenerationMatch: '0' });
    await expect(client.startUpload('taken', { ifGenerationMatch: '0' })).rejects.toMatchObject({ code: 'PRECONDITION', status: 412 });
    // Another writer creates the name while our session is open: our finalize must not overwrite it.
    const mine = await client.startUpload('raced', { ifGenerationMatch: '0' });
    await client.uploadObject('raced', Buffer.from('theirs'));
    const bytes = Buffer.from('mine');
    await expect(client.putChunk(mine, 0, bytes, { final: { size: 4, crc32c: crcOf(bytes) } })).rejects.toMatchObject({ code: 'PRECONDITION' });
    expect((await onDisk('raced')).toString()).toBe('theirs');
    expect(metrics.get('gcs_precondition_failures')).toBe(2);
  });

  it('refuses a finalize whose CRC32C is not the bytes, and a short non-final chunk before sending it', async () => {
    const session = await client.startUpload('badcrc');
    await expect(client.putChunk(session, 0, Buffer.from('abc'), { final: { size: 3, crc32c: crcOf(Buffer.from('abd')) } })).rejects.toBeInstanceOf(GcsError);
    await expect(client.putChunk(session, 0, Buffer.alloc(1000))).rejects.toThrow(RangeError);
    expect(await client.statObject('badcrc')).toBeNull();
  });

  it('an empty object, and status and cancel of a session', async () => {
    const s = await client.startUpload('empty');
    expect(await client.uploadStatus(s)).toEqual({ committed: 0, object: null });
    const r = await client.putChunk(s, 0, Buffer.alloc(0), { final: { size: 0, crc32c: 'AAAAAA==' } });
    expect(r.object?.size).toBe(0);
    const gone = await client.startUpload('cancelled');
    await client.putChunk(gone, 0, Buffer.alloc(256 * 1024, 1));
    await client.cancelUpload(gone);
    await expect(client.uploadStatus(gone)).rejects.toBeInstanceOf(UploadSessionExpiredError);
  });
});

describe('one-call writes', () => {
  it('multipart upload with metadata; patch bumps the metageneration and honours ifMetagenerationMatch', async () => {
    const mtime = formatMtime(1_764_000_000_123_456_789n);
    const o = await client.uploadObject('meta', Buffer.from('hello'), { ifGenerationMatch: '0', contentType: 'text/plain', metadata: { gcsfuse_mtime: mtime } });
    expect(o).toMatchObject({ size: 5, metageneration: '1', contentType: 'text/plain', metadata: { gcsfuse_mtime: mtime }, crc32c: crcOf(Buffer.from('hello')) });
    expect(parseMtime(mtime)).toBe(1_764_000_000_123_456_789n);
    const p = await client.patchMetadata('meta', { metadata: { gcsfuse_mtime: formatMtime(0n), extra: 'x' }, ifMetagenerationMatch: '1' });
    expect(p).toMatchObject({ generation: o.generation, metageneration: '2', metadata: { gcsfuse_mtime: '1970-01-01T00:00:00Z', extra: 'x' } });
    await expect(client.patchMetadata('meta', { metadata: { extra: null }, ifMetagenerationMatch: '1' })).rejects.toMatchObject({ code: 'PRECONDITION' });
    const q = await client.patchMetadata('meta', { metadata: { extra: null }, ifMetagenerationMatch: '2' });
    expect(q.metadata).toEqual({ gcsfuse_mtime: '1970-01-01T00:00:00Z' });
    expect(emu.requestLog().filter((e) => e.kind === 'patch')).toHaveLength(3);
  });

  it('delete with the generation seen; a stale one is 412 and leaves the object', async () => {
    const o = await client.uploadObject('del', Buffer.from('x'));
    await client.uploadObject('del', Buffer.from('y'));
    await expect(client.deleteObject('del', { ifGenerationMatch: o.generation })).rejects.toMatchObject({ code: 'PRECONDITION' });
    const cur = await client.statObject('del');
    await client.deleteObject('del', { ifGenerationMatch: cur!.generation });
    expect(await client.statObject('del')).toBeNull();
    await expect(client.deleteObject('del')).rejects.toMatchObject({ code: 'NOT_FOUND' });
  });

  it('copy through rewrite, in several calls when the server says so, with preconditions', async () => {
    const data = randomBytes(3 * MiB);
    const src = await client.uploadObject('src', data, { metadata: { k: 'v' } });
    emu.setKnobs({ rewriteBytesPerCall: MiB });
    const copy = await client.copyObject('src', 'dst', { ifGenerationMatch: '0', ifSourceGenerationMatch: src.generation });
    expect(copy).toMatchObject({ name: 'dst', size: data.length, crc32c: src.crc32c, metadata: { k: 'v' } });
    expect(emu.requestLog().filter((e) => e.kind === 'copy')).toHaveLength(3);
    await expect(client.copyObject('src', 'dst', { ifGenerationMatch: '0' })).rejects.toMatchObject({ code: 'PRECONDITION' });
    await expect(client.copyObject('src', 'dst2', { ifSourceGenerationMatch: '1' })).rejects.toMatchObject({ code: 'PRECONDITION' });
  });

  it('compose concatenates in order; move is one request, atomic, a new generation', async () => {
    await client.uploadObject('p1', Buffer.from('abc'));
    await client.uploadObject('p2', Buffer.from('def'));
    const c = await client.composeObjects([{ name: 'p1' }, { name: 'p2' }], 'whole', { ifGenerationMatch: '0', metadata: { m: '1' } });
    expect(c).toMatchObject({ size: 6, crc32c: crcOf(Buffer.from('abcdef')), metadata: { m: '1' } });
    emu.resetStats();
    const moved = await client.moveObject('whole', 'renamed/whole', { ifSourceGenerationMatch: c.generation, ifGenerationMatch: '0' });
    expect(moved).toMatchObject({ name: 'renamed/whole', size: 6, metageneration: '1', metadata: { m: '1' } });
    expect(moved.generation).not.toBe(c.generation);
    expect(await client.statObject('whole')).toBeNull();
    expect((await onDisk('renamed/whole')).toString()).toBe('abcdef');
    expect(emu.stats().requests).toMatchObject({ total: 2, move: 1, metadata: 1 });
    await expect(client.moveObject('p1', 'p2', { ifGenerationMatch: '0' })).rejects.toMatchObject({ code: 'PRECONDITION' });
    expect((await onDisk('p1')).toString()).toBe('abc');
  });

  it('a write without a precondition is not repeated after a 503 (it might have happened); with one it is', async () => {
    await client.uploadObject('once', Buffer.from('1'));
    emu.setKnobs({ rate503: 1 });
    await expect(client.deleteObject('once')).rejects.toMatchObject({ code: 'TRANSIENT' });
    expect(emu.requestLog().filter((e) => e.kind === 'delete')).toHaveLength(1);
    emu.setKnobs({ rate503: 0.5, seed: 11 });
    const cur = (await client.statObject('once'))!;
    await client.deleteObject('once', { ifGenerationMatch: cur.generation });
    emu.setKnobs(QUIET);
    expect(await client.statObject('once')).toBeNull();
  });
});

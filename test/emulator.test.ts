// Fidelity tests for the GCS emulator, using @google-cloud/storage (a client written by others) as the
// judge wherever it can be, and raw fetch where a client would hide the detail under test.
process.env.METADATA_SERVER_DETECTION = 'none';
delete process.env.STORAGE_EMULATOR_HOST;

import { createHash, randomBytes } from 'node:crypto';
import { execFileSync } from 'node:child_process';
import http from 'node:http';
import { gzipSync } from 'node:zlib';
import { promises as fsp } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it, vi } from 'vitest';
import type { Bucket, Storage as StorageType } from '@google-cloud/storage';
import { runEmulatorCli } from '../src/emulator/cli.js';
import { rfc3339 } from '../src/emulator/resources.js';
import { startEmulator, type Emulator, type EmulatorKnobs } from '../src/emulator/server.js';

// A bit-by-bit table CRC32C, deliberately not the library the emulator uses.
const CRC_TABLE = (() => {
  const t = new Uint32Array(256);
  for (let n = 0; n < 256; n++) {
    let c = n;
    for (let k = 0; k < 8; k++) c = c & 1 ? (c >>> 1) ^ 0x82f63b78 : c >>> 1;
    t[n] = c >>> 0;
  }
  return t;
})();
function crc32cB64(buf: Buffer): string {
  let c = 0xffffffff;
  for (let i = 0; i < buf.length; i++) c = CRC_TABLE[(c ^ buf[i]!) & 0xff]! ^ (c >>> 8);
  const out = Buffer.alloc(4);
  out.writeUInt32BE((c ^ 0xffffffff) >>> 0);
  return out.toString('base64');
}
const md5B64 = (buf: Buffer): string => createHash('md5').update(buf).digest('base64');
const byteOrder = (a: string, b: string): number => Buffer.compare(Buffer.from(a), Buffer.from(b));
const enc = encodeURIComponent;

const DEFAULT_KNOBS: Partial<EmulatorKnobs> = {
  latencyMs: 0,
  bandwidthBytesPerSec: 0,
  rate429: 0,
  rate503: 0,
  retryAfterSeconds: null,
  resetRate: 0,
  shortBodyRate: 0,
  pageSize: 1000,
  failMedia: null,
  denyBucketGet: false,
  denyDelete: false,
  rejectTokens: [],
  requesterPays: [],
  uploadResetRate: 0,
  uploadSessionTtlMs: 0,
  rewriteBytesPerCall: 0,
};

let root: string;
let emu: Emulator;
let storage: StorageType;
let StorageCtor: typeof StorageType;
let bucket: Bucket;
const logLines: string[] = [];

async function rawJson(p: string, init?: RequestInit): Promise<{ status: number; headers: Headers; body: any }> {
  const res = await fetch(emu.url + p, init);
  const text = await res.text();
  return { status: res.status, headers: res.headers, body: text ? JSON.parse(text) : null };
}

async function rawUpload(name: string, data: Buffer | string): Promise<any> {
  const r = await rawJson(`/upload/storage/v1/b/bkt/o?uploadType=media&name=${enc(name)}`, {
    method: 'POST',
    body: typeof data === 'string' ? data : new Uint8Array(data),
  });
  expect(r.status).toBe(200);
  return r.body;
}

async function withKnobs<T>(k: Partial<EmulatorKnobs>, fn: () => Promise<T>): Promise<T> {
  emu.setKnobs(k);
  try {
    return await fn();
  } finally {
    emu.setKnobs(DEFAULT_KNOBS);
  }
}

beforeAll(async () => {
  root = await fsp.mkdtemp(path.join(os.tmpdir(), 'gcs-emu-test-'));
  await fsp.mkdir(path.join(root, 'bkt'));
  emu = await startEmulator({ root, log: (l) => logLines.push(l) });
  // Imported here so METADATA_SERVER_DETECTION is set before google-auth-library loads.
  StorageCtor = (await import('@google-cloud/storage')).Storage;
  storage = new StorageCtor({ apiEndpoint: emu.url, projectId: 'test', useAuthWithCustomEndpoint: false });
  bucket = storage.bucket('bkt');
});

afterAll(async () => {
  await emu?.close();
  if (root) await fsp.rm(root, { recursive: true, force: true });
});

describe('buckets', () => {
  it('serves bucket metadata through the client, and 404 for a missing bucket', async () => {
    const [md] = await bucket.getMetadata();
    expect(md).toMatchObject({ kind: 'storage#bucket', id: 'bkt', name: 'bkt', projectNumber: '0', location: 'US', storageClass: 'STANDARD', metageneration: '1' });
    expect(Date.parse(md.timeCreated!)).not.toBeNaN();
    const [exists] = await storage.bucket('missing').exists();
    expect(exists).toBe(false);
    const r = await rawJson('/storage/v1/b/missing');
    expect(r.status).toBe(404);
    expect(r.body.error.errors[0]).toMatchObject({ domain: 'global', reason: 'notFound' });
  });
});

describe('STORAGE_EMULATOR_HOST', () => {
  it('also works when the client is pointed at the emulator by environment (bare /b/... paths)', async () => {
    process.env.STORAGE_EMULATOR_HOST = emu.url;
    let viaEnv: StorageType;
    try {
      viaEnv = new StorageCtor({ projectId: 'test' });
    } finally {
      delete process.env.STORAGE_EMULATOR_HOST;
    }
    const before = logLines.length;
    const file = viaEnv.bucket('bkt').file('env/hello.txt');
    await file.save('hello via env');
    expect((await file.getMetadata())[0].size).toBe('13');
    expect((await file.download())[0].toString()).toBe('hello via env');
    const lines = logLines.slice(before);
    expect(lines.some((l) => l.startsWith('GET /b/bkt/o/env%2Fhello.txt 200'))).toBe(true);
    expect(lines.some((l) => l.startsWith('PUT /upload/storage/v1/b/bkt/o 200'))).toBe(true);
  });
});

describe('uploads and metadata', () => {
  it('file.save() (resumable) round-trips size, generation, crc32c and md5', async () => {
    const data = randomBytes(300 * 1024 + 7);
    const file = bucket.file('up/save.bin');
    await file.save(data);
    const [md] = await file.getMetadata();
    expect(md.size).toBe(String(data.length));
    expect(md.generation).toMatch(/^\d+$/);
    expect(md.crc32c).toBe(crc32cB64(data));
    expect(md.md5Hash).toBe(md5B64(data));
    expect(md.id).toBe(`bkt/up/save.bin/${md.generation}`);
    expect((await fsp.readFile(path.join(root, 'bkt/up/save.bin'))).equals(data)).toBe(true);
    // The client really used the resumable protocol: a POST for the session, then a PUT.
    expect(logLines.some((l) => l.startsWith('POST /upload/storage/v1/b/bkt/o 200'))).toBe(true);
    expect(logLines.some((l) => l.startsWith('PUT /upload/storage/v1/b/bkt/o 200'))).toBe(true);
  });

  it('handles multipart (resumable: false), chunked resumable, and bucket.upload()', async () => {
    const a = randomBytes(50_000);
    await bucket.file('up/multi.bin').save(a, { resumable: false });
    const [ma] = await bucket.file('up/multi.bin').getMetadata();
    expect([ma.size, ma.crc32c]).toEqual([String(a.length), crc32cB64(a)]);

    const b = randomBytes(700 * 1024);
    const before = logLines.length;
    await bucket.file('up/chunked.bin').save(b, { chunkSize: 256 * 1024 });
    expect(logLines.slice(before).filter((l) => l.startsWith('PUT /upload/') && / 308 /.test(l)).length).toBeGreaterThanOrEqual(2);
    expect((await fsp.readFile(path.join(root, 'bkt/up/chunked.bin'))).equals(b)).toBe(true);

    const local = path.join(root, 'local-src.bin');
    const c = randomBytes(10_000);
    await fsp.writeFile(local, c);
    await bucket.upload(local, { destination: 'up/uploaded.bin' });
    const [mc] = await bucket.file('up/uploaded.bin').getMetadata();
    expect(mc.md5Hash).toBe(md5B64(c));
  });

  it('rejects an upload whose declared hash does not match the bytes', async () => {
    const r = await rawJson(`/upload/storage/v1/b/bkt/o?uploadType=media&name=up/bad.bin`, {
      method: 'POST',
      body: 'abc',
      headers: { 'x-goog-hash': `crc32c=${crc32cB64(Buffer.from('abd'))}` },
    });
    expect(r.status).toBe(400);
    expect((await bucket.file('up/bad.bin').exists())[0]).toBe(false);
  });

  it('sees files rewritten directly on disk on the next request', async () => {
    const p = path.join(root, 'bkt/direct/file.txt');
    await fsp.mkdir(path.dirname(p), { recursive: true });
    await fsp.writeFile(p, 'one');
    expect((await bucket.file('direct/file.txt').getMetadata())[0].size).toBe('3');
    await fsp.writeFile(p, 'three');
    const [md] = await bucket.file('direct/file.txt').getMetadata();
    expect(md.size).toBe('5');
    expect(md.crc32c).toBe(crc32cB64(Buffer.from('three')));
  });

  it('deletes objects (204) and prunes the emptied folders', async () => {
    await rawUpload('del/deep/x.txt', 'x');
    await bucket.file('del/deep/x.txt').delete();
    expect((await bucket.file('del/deep/x.txt').exists())[0]).toBe(false);
    await expect(fsp.stat(path.join(root, 'bkt/del'))).rejects.toThrow();
    const r = await rawJson(`/storage/v1/b/bkt/o/${enc('del/deep/x.txt')}`, { method: 'DELETE' });
    expect(r.status).toBe(404);
  });
});

describe('generations', () => {
  it('strictly increase on replace; a stale generation is 404; ifGenerationMatch is 412', async () => {
    const gens: bigint[] = [];
    for (let i = 0; i < 5; i++) gens.push(BigInt((await rawUpload('gen/obj', `v${i}`)).generation));
    for (let i = 1; i < gens.length; i++) expect(gens[i]! > gens[i - 1]!).toBe(true);
    const stale = gens[0]!.toString();
    const live = gens[4]!.toString();
    const obj = `/storage/v1/b/bkt/o/${enc('gen/obj')}`;
    expect((await rawJson(`${obj}?generation=${stale}`)).status).toBe(404);
    expect((await fetch(`${emu.url}${obj}?alt=media&generation=${stale}`)).status).toBe(404);
    const ok = await fetch(`${emu.url}${obj}?alt=media&generation=${live}`);
    expect([ok.status, await ok.text(), ok.headers.get('x-goog-generation')]).toEqual([200, 'v4', live]);
    expect((await rawJson(`${obj}?ifGenerationMatch=${stale}`)).status).toBe(412);
    // The client's view: a File pinned to an old generation cannot be read.
    await expect(bucket.file('gen/obj', { generation: stale }).download()).rejects.toMatchObject({ code: 404 });
    const up = await rawJson(`/upload/storage/v1/b/bkt/o?uploadType=media&name=gen/obj&ifGenerationMatch=0`, { method: 'POST', body: 'x' });
    expect(up.status).toBe(412);
  });
});

describe('times', () => {
  it('formats object times as Date.toISOString does, within one second and across seconds', () => {
    // In an order that revisits a second after leaving it: the formatter keeps the last second's text.
    const ms = [1_732_400_000_123, 1_732_400_000_999, 1_732_400_000_000, 1_732_400_001_005, 1_732_400_000_500, 0, -1, -1_001, 253_402_300_799_999];
    for (const m of ms) expect(rfc3339(BigInt(m) * 1_000_000n + 456_789n)).toBe(new Date(m).toISOString());
  });
});

describe('listing', () => {
  const N = 2500;
  beforeAll(async () => {
    const dir = path.join(root, 'bkt/many');
    await fsp.mkdir(path.join(dir, 'sub1'), { recursive: true });
    await fsp.mkdir(path.join(dir, 'sub2/deeper'), { recursive: true });
    await fsp.mkdir(path.join(dir, 'emptydir/also-empty'), { recursive: true });
    await fsp.writeFile(path.join(dir, 'sub1/x'), 'x');
    await fsp.writeFile(path.join(dir, 'sub2/deeper/y'), 'y');
    for (let i = 0; i < N; i += 250) {
      await Promise.all(Array.from({ length: 250 }, (_, j) => fsp.writeFile(path.join(dir, `f${String(i + j).padStart(4, '0')}`), String(i + j))));
    }
  });

  it('pages through 2,500 objects with pageToken via the client (prefix, delimiter, maxResults)', async () => {
    const names: string[] = [];
    const prefixes: string[] = [];
    let query: Record<string, unknown> | null = { prefix: 'many/', delimiter: '/', autoPaginate: false, maxResults: 700 };
    let pages = 0;
    while (query) {
      const [files, next, resp] = (await bucket.getFiles(query)) as unknown as [{ name: string }[], Record<string, unknown> | null, any];
      pages++;
      expect(files.length + (resp.prefixes?.length ?? 0)).toBeLessThanOrEqual(700);
      names.push(...files.map((f) => f.name));
      prefixes.push(...(resp.prefixes ?? []));
      query = next;
    }
    expect(pages).toBe(Math.ceil((N + 2) / 700));
    expect(names.length).toBe(N);
    expect(new Set(names).size).toBe(N);
    expect(names).toEqual([...names].sort(byteOrder));
    // Empty folders are not prefixes: GCS only knows prefixes of objects.
    expect(prefixes).toEqual(['many/sub1/', 'many/sub2/']);
  });

  it('lists flat (no delimiter) in byte order across folders, and honours startOffset/endOffset', async () => {
    const [files] = await bucket.getFiles({ prefix: 'many/', startOffset: 'many/f2495', endOffset: 'many/sub2/z' });
    expect(files.map((f) => f.name)).toEqual(['many/f2495', 'many/f2496', 'many/f2497', 'many/f2498', 'many/f2499', 'many/sub1/x', 'many/sub2/deeper/y']);
  });

  it('keeps a listed folder current through its own uploads and deletes, and through changes behind its back', async () => {
    const names = async (): Promise<string[]> => {
      const r = await rawJson(`/storage/v1/b/bkt/o?${new URLSearchParams({ prefix: 'grow/', delimiter: '/', fields: 'items(name),prefixes' })}`);
      return [...(r.body.items ?? []).map((i: { name: string }) => i.name), ...(r.body.prefixes ?? [])].sort(byteOrder);
    };
    const expected = new Set<string>();
    await bucket.file('grow/seed').save('s', { resumable: false });
    expected.add('grow/seed');
    expect(await names()).toEqual([...expected].sort(byteOrder));
    // Listed between changes, so each change patches a cached folder (uploads, replaces, deletes).
    for (let i = 0; i < 30; i++) {
      const name = `grow/${['b', 'a', 'c'][i % 3]}${i}`;
      await bucket.file(name).save(`v${i}`, { resumable: false });
      expected.add(name);
      if (i % 4 === 0) await bucket.file(name).save(`again${i}`, { resumable: false });
      if (i % 5 === 0) {
        await bucket.file('grow/seed').delete().catch(() => undefined);
        expected.delete('grow/seed');
      }
      expect(await names()).toEqual([...expected].sort(byteOrder));
    }
    // Behind its back: a file and a folder added, one removed.
    await fsp.writeFile(path.join(root, 'bkt', 'grow', 'disk'), 'd');
    await fsp.mkdir(path.join(root, 'bkt', 'grow', 'sub'));
    await fsp.writeFile(path.join(root, 'bkt', 'grow', 'sub', 'x'), 'x');
    await fsp.rm(path.join(root, 'bkt', 'grow', 'a4'));
    expected.add('grow/disk').add('grow/sub/');
    expected.delete('grow/a4');
    expect(await names()).toEqual([...expected].sort(byteOrder));
    await bucket.file('grow/after').save('x', { resumable: false });
    expect(await names()).toEqual([...expected.add('grow/after')].sort(byteOrder));
  });

  it('pages with any prefix, delimiter and start/end offsets exactly as a sort of every name says', async () => {
    // The listing walks folders in name order and stops after a page: check it against the plain rule.
    const names = ['off/a', 'off/a-b', 'off/a.0', 'off/a0', 'off/b/x', 'off/b/y/z', 'off/b-', 'off/c', 'off/d/e/f', 'off/d/g', 'off/é', 'off/z'];
    for (let i = 0; i < 40; i++) names.push(`off/b/n${String(i).padStart(2, '0')}`, `off/m${i}`);
    for (const n of names) {
      await fsp.mkdir(path.dirname(path.join(root, 'bkt', n)), { recursive: true });
      await fsp.writeFile(path.join(root, 'bkt', n), n);
    }
    const sorted = [...names].sort(byteOrder);
    const expected = (prefix: string, delimiter: string | null, S: string | null, E: string | null): string[] => {
      const out: string[] = [];
      for (const n of sorted) {
        if (!n.startsWith(prefix) || (S !== null && byteOrder(n, S) < 0) || (E !== null && byteOrder(n, E) >= 0)) continue;
        const i = delimiter ? n.indexOf(delimiter, prefix.length) : -1;
        const key = i >= 0 ? `${n.slice(0, i + 1)}/` : n;
        if (out.at(-1) !== key) out.push(key);
      }
      return out;
    };
    const listed = async (prefix: string, delimiter: string | null, S: string | null, E: string | null, maxResults: number): Promise<string[]> => {
      const out: string[] = [];
      let token: string | undefined;
      do {
        const q = new URLSearchParams({ prefix, maxResults: String(maxResults), fields: 'items(name),prefixes,nextPageToken' });
        if (delimiter) q.set('delimiter', delimiter);
        if (S) q.set('startOffset', S);
        if (E) q.set('endOffset', E);
        if (token) q.set('pageToken', token);
        const r = await rawJson(`/storage/v1/b/bkt/o?${q}`);
        const page = [...(r.body.items ?? []).map((x: { name: string }) => x.name), ...(r.body.prefixes ?? []).map((p: string) => `${p}/`)];
        expect(page.length).toBeLessThanOrEqual(maxResults);
        out.push(...page);
        token = r.body.nextPageToken;
      } while (token);
      return out.sort(byteOrder);
    };
    const offsets = [null, 'off/a.', 'off/b/', 'off/b/n1', 'off/b/y', 'off/m3', 'off/é'];
    for (const delimiter of [null, '/']) {
      for (const S of offsets) {
        for (const E of offsets) {
          for (const maxResults of [3, 1000]) {
            // Prefixes are marked with a second '/', so an item and a prefix of one name stay apart.
            const want = expected('off/', delimiter, S, E).sort(byteOrder);
            expect(await listed('off/', delimiter, S, E, maxResults), `${delimiter} ${S} ${E} ${maxResults}`).toEqual(want);
          }
        }
      }
    }
  });

  it('caps pages at the pageSize knob and validates maxResults/pageToken', async () => {
    await withKnobs({ pageSize: 100 }, async () => {
      const r = await rawJson('/storage/v1/b/bkt/o?prefix=many/&maxResults=1000&fields=items(name),nextPageToken');
      expect(r.body.items.length).toBe(100);
      expect(typeof r.body.nextPageToken).toBe('string');
    });
    expect((await rawJson('/storage/v1/b/bkt/o?maxResults=abc')).status).toBe(400);
    expect((await rawJson('/storage/v1/b/bkt/o?pageToken=%21%21garbage')).status).toBe(400);
    expect((await rawJson('/storage/v1/b/nope/o')).status).toBe(404);
    const last = await rawJson('/storage/v1/b/bkt/o?prefix=many/sub1/');
    expect(last.body.nextPageToken).toBeUndefined();
    expect(last.body.prefixes).toBeUndefined();
    const none = await rawJson('/storage/v1/b/bkt/o?prefix=no-such-prefix/');
    expect(none.body).toEqual({ kind: 'storage#objects' });
  });

  it('applies a fields projection (raw fetch)', async () => {
    const r = await rawJson(`/storage/v1/b/bkt/o?prefix=many/&delimiter=/&maxResults=3&fields=${enc('items(name,size,generation),prefixes,nextPageToken')}`);
    expect(Object.keys(r.body).sort()).toEqual(['items', 'nextPageToken']);
    expect(r.body.items).toHaveLength(3);
    for (const it of r.body.items) expect(Object.keys(it).sort()).toEqual(['generation', 'name', 'size']);
    const slash = await rawJson(`/storage/v1/b/bkt/o?prefix=many/sub&fields=items/name,kind`);
    expect(slash.body).toEqual({ kind: 'storage#objects', items: [{ name: 'many/sub1/x' }, { name: 'many/sub2/deeper/y' }] });
    const one = await rawJson(`/storage/v1/b/bkt/o/${enc('many/f0001')}?fields=name,size,crc32c`);
    expect(one.body).toEqual({ name: 'many/f0001', size: '1', crc32c: crc32cB64(Buffer.from('1')) });
    expect((await rawJson(`/storage/v1/b/bkt/o?fields=${enc('items(name')}`)).status).toBe(400);
  });
});

describe('media', () => {
  const data = randomBytes(1024 * 1024 + 123);
  beforeAll(async () => {
    await fsp.mkdir(path.join(root, 'bkt/media'), { recursive: true });
    await fsp.writeFile(path.join(root, 'bkt/media/blob.bin'), data);
  });

  it('ranged download through the client returns the exact slice', async () => {
    const [slice] = await bucket.file('media/blob.bin').download({ start: 1000, end: 70_999 });
    expect(slice.equals(data.subarray(1000, 71_000))).toBe(true);
    const entry = emu.requestLog().filter((e) => e.kind === 'media').at(-1)!;
    expect(entry).toMatchObject({ status: 206, range: { start: 1000, end: 70_999 }, bytes: 70_000 });
  });

  it('whole download passes the client’s own crc32c and md5 validation', async () => {
    const [all] = await bucket.file('media/blob.bin').download();
    expect(all.equals(data)).toBe(true);
    const [again] = await bucket.file('media/blob.bin').download({ validation: 'md5' });
    expect(again.equals(data)).toBe(true);
  });

  it('client validation really runs: stale hashes make the download fail', async () => {
    // Prime the hash cache, then change bytes in place and restore the exact mtime with touch(1)
    // (nanosecond precision), so the emulator serves the old x-goog-hash with new bytes.
    const p = path.join(root, 'bkt/media/tamper.bin');
    await fsp.writeFile(p, Buffer.alloc(4096, 1));
    await bucket.file('media/tamper.bin').getMetadata();
    const before = await fsp.stat(p, { bigint: true });
    const fh = await fsp.open(p, 'r+');
    await fh.write(Buffer.from([9]), 0, 1, 100);
    await fh.close();
    const s = before.mtimeNs / 1_000_000_000n;
    const ns = (before.mtimeNs % 1_000_000_000n).toString().padStart(9, '0');
    execFileSync('touch', ['-m', '-d', `@${s}.${ns}`, p]);
    expect((await fsp.stat(p, { bigint: true })).mtimeNs).toBe(before.mtimeNs);
    await expect(bucket.file('media/tamper.bin').download()).rejects.toMatchObject({ code: 'CONTENT_DOWNLOAD_MISMATCH' });
  });

  it('sends GCS media headers, and handles suffix, open and bad ranges', async () => {
    const url = `${emu.url}/download/storage/v1/b/bkt/o/${enc('media/blob.bin')}?alt=media`;
    const full = await fetch(url);
    expect(full.status).toBe(200);
    expect(full.headers.get('content-length')).toBe(String(data.length));
    expect(full.headers.get('x-goog-hash')).toBe(`crc32c=${crc32cB64(data)},md5=${md5B64(data)}`);
    expect(full.headers.get('x-goog-stored-content-length')).toBe(String(data.length));
    expect(full.headers.get('accept-ranges')).toBe('bytes');
    await full.arrayBuffer();
    const tail = await fetch(url, { headers: { Range: 'bytes=-10' } });
    expect(tail.status).toBe(206);
    expect(tail.headers.get('content-range')).toBe(`bytes ${data.length - 10}-${data.length - 1}/${data.length}`);
    expect(Buffer.from(await tail.arrayBuffer()).equals(data.subarray(-10))).toBe(true);
    const open = await fetch(url, { headers: { Range: `bytes=${data.length - 3}-` } });
    expect([open.status, (await open.arrayBuffer()).byteLength]).toEqual([206, 3]);
    const bad = await fetch(url, { headers: { Range: 'bytes=abc' } });
    expect([bad.status, (await bad.arrayBuffer()).byteLength]).toEqual([200, data.length]);
  });

  it('answers 416 for a range past the end, and for any range on an empty object', async () => {
    const url = `${emu.url}/storage/v1/b/bkt/o/${enc('media/blob.bin')}?alt=media`;
    const r = await fetch(url, { headers: { Range: `bytes=${data.length}-` } });
    expect(r.status).toBe(416);
    expect(r.headers.get('content-range')).toBe(`bytes */${data.length}`);
    expect((await r.json()).error.errors[0].reason).toBe('requestedRangeNotSatisfiable');
    await rawUpload('media/empty', '');
    const e = await fetch(`${emu.url}/storage/v1/b/bkt/o/media%2Fempty?alt=media`, { headers: { Range: 'bytes=0-' } });
    expect([e.status, e.headers.get('content-range')]).toEqual([416, 'bytes */0']);
    await e.arrayBuffer();
    await expect(bucket.file('media/blob.bin').download({ start: data.length + 5 })).rejects.toMatchObject({ code: 416 });
  });
});

/** A GET whose body arrives exactly as sent: Node's fetch would undo a Content-Encoding. */
function rawGet(p: string, headers: Record<string, string> = {}): Promise<{ status: number; headers: Record<string, string | string[] | undefined>; body: Buffer }> {
  return new Promise((resolve, reject) => {
    http
      .get(emu.url + p, { headers }, (res) => {
        const parts: Buffer[] = [];
        res.on('data', (c: Buffer) => parts.push(c));
        res.on('end', () => resolve({ status: res.statusCode!, headers: res.headers, body: Buffer.concat(parts) }));
        res.on('error', reject);
      })
      .on('error', reject);
  });
}

describe('gzip-encoded objects (decompressive transcoding)', () => {
  const plain = Buffer.from('hello, transcoded world. '.repeat(4000));
  const stored = gzipSync(plain);
  const media = `/storage/v1/b/bkt/o/${enc('gz/text.txt')}?alt=media`;

  beforeAll(async () => {
    const r = await rawJson(`/upload/storage/v1/b/bkt/o?uploadType=media&name=${enc('gz/text.txt')}&contentEncoding=gzip`, {
      method: 'POST',
      body: new Uint8Array(stored),
    });
    expect(r.status).toBe(200);
    expect(r.body).toMatchObject({ contentEncoding: 'gzip', size: String(stored.length) });
  });

  it('without Accept-Encoding: gzip, sends the whole decompressed body as a 200, Range ignored, no Content-Length', async () => {
    const r = await rawGet(media, { range: 'bytes=10-19' });
    expect(r.status).toBe(200);
    expect(r.body.equals(plain)).toBe(true);
    expect(r.headers['content-length']).toBeUndefined();
    expect(r.headers['content-encoding']).toBeUndefined();
    expect(r.headers['content-range']).toBeUndefined();
    expect(r.headers['x-goog-stored-content-encoding']).toBe('gzip');
    expect(r.headers['x-goog-stored-content-length']).toBe(String(stored.length));
    // The hashes are those of the stored (compressed) bytes, as GCS's are.
    expect(r.headers['x-goog-hash']).toContain(`crc32c=${crc32cB64(stored)}`);
  });

  it('with Accept-Encoding: gzip, sends the stored bytes with Content-Encoding: gzip and honours Range', async () => {
    const ranged = await rawGet(media, { range: 'bytes=10-19', 'accept-encoding': 'gzip' });
    expect(ranged.status).toBe(206);
    expect(ranged.headers['content-encoding']).toBe('gzip');
    expect(ranged.headers['content-range']).toBe(`bytes 10-19/${stored.length}`);
    expect(ranged.body.equals(stored.subarray(10, 20))).toBe(true);
    const whole = await rawGet(media, { 'accept-encoding': 'deflate, gzip;q=0.5' });
    expect([whole.status, whole.headers['content-length']]).toEqual([200, String(stored.length)]);
    expect(whole.body.equals(stored)).toBe(true);
    // q=0 refuses gzip: transcoded again.
    expect((await rawGet(media, { 'accept-encoding': 'gzip;q=0' })).body.equals(plain)).toBe(true);
  });

  it('reports contentEncoding in metadata and listings; the client library stores and reads gzip objects', async () => {
    expect((await rawJson(`/storage/v1/b/bkt/o/${enc('gz/text.txt')}`)).body.contentEncoding).toBe('gzip');
    const listed = (await rawJson(`/storage/v1/b/bkt/o?prefix=gz/`)).body.items as any[];
    expect(listed.find((i) => i.name === 'gz/text.txt').contentEncoding).toBe('gzip');
    // @google-cloud/storage as the judge: save({gzip}) sends contentEncoding in a resumable session's metadata.
    const file = bucket.file('gz/by-client.txt');
    await file.save(plain, { gzip: true });
    const [md] = await file.getMetadata();
    expect(md.contentEncoding).toBe('gzip');
    expect(Number(md.size)).toBeLessThan(plain.length);
    expect((await file.download())[0].equals(plain)).toBe(true);
  });

  it('forgets the encoding when the object is replaced, or its file rewritten behind the emulator', async () => {
    await rawUpload('gz/replaced.txt', stored);
    expect((await rawJson(`/storage/v1/b/bkt/o/${enc('gz/replaced.txt')}`)).body.contentEncoding).toBeUndefined();
    await rawJson(`/upload/storage/v1/b/bkt/o?uploadType=media&name=${enc('gz/rewritten.txt')}&contentEncoding=gzip`, { method: 'POST', body: new Uint8Array(stored) });
    await new Promise((r) => setTimeout(r, 5));
    await fsp.writeFile(path.join(root, 'bkt/gz/rewritten.txt'), stored);
    const r = await rawGet(`/storage/v1/b/bkt/o/${enc('gz/rewritten.txt')}?alt=media`);
    expect([r.status, r.headers['x-goog-stored-content-encoding']]).toEqual([200, 'identity']);
    expect(r.body.equals(stored)).toBe(true);
  });
});

describe('names a file system cannot hold', () => {
  it('stores x and x/y, a placeholder d/, and a//b, and lists them like GCS', async () => {
    const contents: Record<string, string> = {
      'odd/x': 'file x',
      'odd/x/y': 'file x/y',
      'odd/d/': 'placeholder',
      'odd/a//b': 'double slash',
      'odd/dot/./z': 'dot',
      'odd/nl\nname': 'newline',
    };
    for (const [n, c] of Object.entries(contents)) await bucket.file(n).save(c, { resumable: false });
    // The other order: a prefix first, then an object with the prefix's name.
    await rawUpload('odd2/p/q', 'q');
    await rawUpload('odd2/p', 'p');

    const [flat] = await bucket.getFiles({ prefix: 'odd/' });
    expect(flat.map((f) => f.name)).toEqual(Object.keys(contents).sort(byteOrder));
    for (const [n, c] of Object.entries(contents)) expect((await bucket.file(n).download())[0].toString()).toBe(c);

    const [items, , resp] = (await bucket.getFiles({ prefix: 'odd/', delimiter: '/', autoPaginate: false })) as unknown as [{ name: string }[], unknown, any];
    expect(items.map((f) => f.name)).toEqual(['odd/nl\nname', 'odd/x']);
    expect(resp.prefixes).toEqual(['odd/a/', 'odd/d/', 'odd/dot/', 'odd/x/']);
    const itd = await rawJson('/storage/v1/b/bkt/o?prefix=odd/&delimiter=/&includeTrailingDelimiter=true&fields=items(name)');
    expect(itd.body.items.map((i: any) => i.name)).toEqual(['odd/d/', 'odd/nl\nname', 'odd/x']);

    const [odd2] = await bucket.getFiles({ prefix: 'odd2/' });
    expect(odd2.map((f) => f.name)).toEqual(['odd2/p', 'odd2/p/q']);
    expect((await bucket.file('odd2/p').download())[0].toString()).toBe('p');
    // The side store never leaks into listings.
    const [all] = await bucket.getFiles();
    expect(all.some((f) => f.name.includes('.gcs-emulator'))).toBe(false);
  });
});

describe('knobs', () => {
  const obj = `/storage/v1/b/bkt/o/${enc('media/blob.bin')}`;

  it('rate429=1 answers 429 with Retry-After; rate503 without it; control routes unaffected', async () => {
    await withKnobs({ rate429: 1, retryAfterSeconds: 2 }, async () => {
      const r = await rawJson(obj);
      expect(r.status).toBe(429);
      expect(r.headers.get('retry-after')).toBe('2');
      expect(r.body.error.errors[0].reason).toBe('rateLimitExceeded');
      expect((await rawJson('/_stats')).status).toBe(200);
    });
    await withKnobs({ rate503: 1 }, async () => {
      const r = await rawJson(obj);
      expect([r.status, r.headers.get('retry-after'), r.body.error.errors[0].reason]).toEqual([503, null, 'backendError']);
    });
    expect((await rawJson(obj)).status).toBe(200);
  });

  it('resetRate=1 and shortBodyRate=1 break a media body partway through', async () => {
    for (const knob of ['resetRate', 'shortBodyRate'] as const) {
      await withKnobs({ [knob]: 1 }, async () => {
        const res = await fetch(`${emu.url}${obj}?alt=media`);
        expect(res.status).toBe(200);
        await expect(res.arrayBuffer()).rejects.toThrow();
      });
      const e = emu.requestLog().filter((x) => x.kind === 'media').at(-1)!;
      expect(e.injected).toBe(knob === 'resetRate' ? 'reset' : 'short');
      expect(e.bytes).toBeGreaterThan(0);
      expect(e.bytes).toBeLessThan(1024 * 1024);
    }
    expect(emu.stats().injected.reset).toBeGreaterThanOrEqual(1);
    expect(emu.stats().injected.short).toBeGreaterThanOrEqual(1);
  });

  it('latency shows up in the request log as a late first byte', async () => {
    await withKnobs({ latencyMs: 150 }, async () => {
      expect((await rawJson(obj)).status).toBe(200);
    });
    const e = emu.requestLog().filter((x) => x.kind === 'metadata').at(-1)!;
    expect(e.firstByteMs! - e.startMs).toBeGreaterThanOrEqual(140);
  });

  it('a bandwidth cap slows a 2 MiB body to about size/rate', async () => {
    await rawUpload('media/two-mib', randomBytes(2 * 1024 * 1024));
    await withKnobs({ bandwidthBytesPerSec: 4 * 1024 * 1024 }, async () => {
      const t0 = performance.now();
      const res = await fetch(`${emu.url}/storage/v1/b/bkt/o/${enc('media/two-mib')}?alt=media`);
      expect((await res.arrayBuffer()).byteLength).toBe(2 * 1024 * 1024);
      expect(performance.now() - t0).toBeGreaterThanOrEqual(450);
    });
  });

  it('failMedia makes every media request fail with that status, metadata still works', async () => {
    await withKnobs({ failMedia: { status: 403 } }, async () => {
      const r = await fetch(`${emu.url}${obj}?alt=media`);
      expect([r.status, (await r.json()).error.errors[0].reason]).toEqual([403, 'forbidden']);
      expect((await rawJson(obj)).status).toBe(200);
    });
  });

  it('denyBucketGet answers bucket GETs 403; objects.list still works', async () => {
    await withKnobs({ denyBucketGet: true }, async () => {
      const r = await rawJson('/storage/v1/b/bkt');
      expect([r.status, r.body.error.errors[0].reason]).toEqual([403, 'forbidden']);
      expect((await rawJson('/storage/v1/b/bkt/o?maxResults=1')).status).toBe(200);
    });
    expect((await rawJson('/storage/v1/b/bkt')).status).toBe(200);
  });

  it('denyDelete answers deletes and moves 403 and keeps the object; reads and uploads still work', async () => {
    await withKnobs({ denyDelete: true }, async () => {
      const del = await fetch(`${emu.url}${obj}`, { method: 'DELETE' });
      expect([del.status, (await del.json()).error.errors[0].reason]).toEqual([403, 'forbidden']);
      const move = await fetch(`${emu.url}${obj}/moveTo/o/moved-elsewhere`, { method: 'POST' });
      expect(move.status).toBe(403);
      expect((await rawJson(obj)).status).toBe(200);
      expect((await fetch(`${emu.url}${obj}?alt=media`)).status).toBe(200);
    });
    expect((await rawJson('/storage/v1/b/bkt/o/moved-elsewhere')).status).toBe(404);
  });

  it('rejectTokens answers 401 to requests bearing those tokens only', async () => {
    await withKnobs({ rejectTokens: ['stale'] }, async () => {
      const bearing = (t: string) => ({ headers: { authorization: `Bearer ${t}` } });
      expect((await rawJson('/storage/v1/b/bkt/o?maxResults=1', bearing('stale'))).status).toBe(401);
      expect((await rawJson('/storage/v1/b/bkt/o?maxResults=1', bearing('fresh'))).status).toBe(200);
      expect((await rawJson('/storage/v1/b/bkt/o?maxResults=1')).status).toBe(200);
    });
    expect((await rawJson('/_knobs', { method: 'POST', body: JSON.stringify({ rejectTokens: 'x' }) })).status).toBe(400);
  });

  it('requesterPays: a request that names no project to bill is 400 (reason required); @google-cloud/storage with userProject works', async () => {
    await rawUpload('rp/a.txt', 'billed bytes');
    await withKnobs({ requesterPays: ['bkt'] }, async () => {
      for (const p of ['/storage/v1/b/bkt/o?maxResults=1', '/storage/v1/b/bkt/o/rp%2Fa.txt', '/storage/v1/b/bkt/o/rp%2Fa.txt?alt=media', '/storage/v1/b/bkt/o/no-such-object']) {
        const r = await rawJson(p);
        expect([p, r.status, r.body.error.errors[0].reason]).toEqual([p, 400, 'required']);
        expect(r.body.error.message).toMatch(/requester pays/i);
      }
      expect((await rawJson('/storage/v1/b/bkt/o/no-such-object?userProject=payer')).status).toBe(404);
      const billed = storage.bucket('bkt', { userProject: 'payer' });
      const [meta] = await billed.getMetadata();
      expect(meta.billing).toEqual({ requesterPays: true });
      const [files] = await billed.getFiles({ prefix: 'rp/' });
      expect(files.map((f) => f.name)).toEqual(['rp/a.txt']);
      // The library's media download bills only what its own options name (not the bucket's userProject).
      expect((await billed.file('rp/a.txt').download({ userProject: 'payer' }))[0].toString()).toBe('billed bytes');
      emu.resetStats();
      await billed.file('rp/b.bin').save(randomBytes(300 * 1024), { resumable: true, chunkSize: 256 * 1024 });
      const log = emu.requestLog();
      expect(log.filter((e) => e.kind === 'upload').length).toBeGreaterThanOrEqual(2);
      // The session's start names the project; the session's own requests need not.
      expect(log.filter((e) => e.status >= 400)).toEqual([]);
      expect(log.find((e) => e.kind === 'upload' && e.method === 'POST')?.userProject).toBe('payer');
      await expect(bucket.file('rp/a.txt').download()).rejects.toMatchObject({ code: 400 });
    });
    // Off again: the same unbilled request is answered.
    expect((await rawJson('/storage/v1/b/bkt/o/rp%2Fa.txt')).status).toBe(200);
    expect((await rawJson('/storage/v1/b/bkt')).body.billing).toBeUndefined();
    expect((await rawJson('/_knobs', { method: 'POST', body: JSON.stringify({ requesterPays: 'bkt' }) })).status).toBe(400);
  });

  it('knobs are settable over HTTP and validated', async () => {
    const set = await rawJson('/_knobs', { method: 'POST', body: JSON.stringify({ latencyMs: 1 }) });
    expect(set.body).toMatchObject({ latencyMs: 1, pageSize: 1000 });
    expect((await rawJson('/_knobs', { method: 'POST', body: JSON.stringify({ rate429: 2 }) })).status).toBe(400);
    expect((await rawJson('/_knobs')).body.latencyMs).toBe(1);
    emu.setKnobs(DEFAULT_KNOBS);
  });
});

describe('writes through @google-cloud/storage', () => {
  it('resumes a resumable upload where the session stands (the client asks, then sends only the rest)', async () => {
    const data = randomBytes(1024 * 1024 + 100);
    const file = bucket.file('w/resumed.bin');
    const [uri] = await file.createResumableUpload({ preconditionOpts: { ifGenerationMatch: 0 } });
    // Half the upload, sent by someone else before the client picks the session up.
    const first = await fetch(uri, { method: 'PUT', headers: { 'Content-Range': `bytes 0-${512 * 1024 - 1}/*` }, body: new Uint8Array(data.subarray(0, 512 * 1024)) });
    expect(first.status).toBe(308);
    expect(first.headers.get('range')).toBe(`bytes=0-${512 * 1024 - 1}`);
    emu.resetStats();
    await file.save(data, { uri, resumable: true, validation: 'crc32c' });
    const [got] = await file.download();
    expect(got.equals(data)).toBe(true);
    const puts = emu.requestLog().filter((e) => e.kind === 'upload' && e.method === 'PUT');
    // Whatever the client asked first, no byte range it sent starts before the committed half.
    expect(puts.every((e) => e.range === null || e.range.start >= 512 * 1024)).toBe(true);
    expect(puts.some((e) => e.range !== null)).toBe(true);
  });

  it('a mid-chunk reset is resumed by the client from the committed offset', async () => {
    const data = randomBytes(2 * 1024 * 1024);
    const file = bucket.file('w/reset.bin');
    emu.resetStats();
    // Enough retries for the dice, each after about a second; the library retries only a conditional upload.
    const patient = new StorageCtor({ apiEndpoint: emu.url, projectId: 'test', useAuthWithCustomEndpoint: false, retryOptions: { maxRetries: 20, maxRetryDelay: 1, retryDelayMultiplier: 1 } });
    const resetFile = patient.bucket('bkt').file('w/reset.bin');
    await withKnobs({ uploadResetRate: 0.3, seed: 5 }, () => resetFile.save(data, { resumable: true, chunkSize: 512 * 1024, preconditionOpts: { ifGenerationMatch: 0 } }));
    const [got] = await file.download();
    expect(got.equals(data)).toBe(true);
    expect(emu.requestLog().some((e) => e.injected === 'reset')).toBe(true);
  });

  it('preconditions: ifGenerationMatch on save and delete, ifMetagenerationMatch on setMetadata, are 412 when stale', async () => {
    const file = bucket.file('w/pre.txt');
    await file.save('v1', { resumable: false, preconditionOpts: { ifGenerationMatch: 0 } });
    await expect(file.save('v2', { resumable: false, preconditionOpts: { ifGenerationMatch: 0 } })).rejects.toMatchObject({ code: 412 });
    await expect(file.save('v2', { resumable: true, preconditionOpts: { ifGenerationMatch: 0 } })).rejects.toSatisfy((e: any) => e.code === 412 || e.status === 412);
    const [meta] = await file.getMetadata();
    await file.setMetadata({ metadata: { gcsfuse_mtime: '2026-11-25T10:00:00.5Z' } }, { ifMetagenerationMatch: 1 });
    await expect(file.setMetadata({ metadata: { a: 'b' } }, { ifMetagenerationMatch: 1 })).rejects.toMatchObject({ code: 412 });
    const [after] = await file.getMetadata();
    expect(after).toMatchObject({ metageneration: '2', generation: meta.generation, metadata: { gcsfuse_mtime: '2026-11-25T10:00:00.5Z' } });
    await expect(file.delete({ ifGenerationMatch: 1 })).rejects.toMatchObject({ code: 412 });
    await file.delete({ ifGenerationMatch: Number(meta.generation) });
    expect((await file.exists())[0]).toBe(false);
  });

  it('copy (rewrite, several calls), compose and the atomic move, with their metadata', async () => {
    const data = randomBytes(3 * 1024 * 1024);
    const src = bucket.file('w/src.bin');
    await src.save(data, { resumable: false, metadata: { contentType: 'application/x-test', metadata: { k: 'v' } } });
    emu.resetStats();
    await withKnobs({ rewriteBytesPerCall: 1024 * 1024 }, () => src.copy('w/copy.bin'));
    expect(emu.requestLog().filter((e) => e.kind === 'copy')).toHaveLength(3);
    const [copyMeta] = await bucket.file('w/copy.bin').getMetadata();
    expect(copyMeta).toMatchObject({ size: String(data.length), contentType: 'application/x-test', metadata: { k: 'v' }, crc32c: crc32cB64(data) });

    await bucket.file('w/a').save('abc', { resumable: false });
    await bucket.file('w/b').save('def', { resumable: false });
    await bucket.combine(['w/a', 'w/b'], 'w/ab');
    expect((await bucket.file('w/ab').download())[0].toString()).toBe('abcdef');

    const [before] = await bucket.file('w/ab').getMetadata();
    emu.resetStats();
    await bucket.file('w/ab').moveFileAtomic('w/moved');
    expect(emu.stats().requests.move).toBe(1);
    const [moved] = await bucket.file('w/moved').getMetadata();
    expect(moved.generation).not.toBe(before.generation);
    expect(moved.metageneration).toBe('1');
    expect((await bucket.file('w/ab').exists())[0]).toBe(false);
    await expect(bucket.file('w/a').moveFileAtomic('w/b', { preconditionOpts: { ifGenerationMatch: 0 } })).rejects.toMatchObject({ code: 412 });
    expect((await bucket.file('w/a').download())[0].toString()).toBe('abc');
  });
});

describe('settable object fields (cacheControl, storageClass, ...)', () => {
  const fields = { cacheControl: 'no-store', contentDisposition: 'inline', contentLanguage: 'de', customTime: '2026-03-04T05:06:07.000Z', storageClass: 'NEARLINE' };

  it('keeps them from the upload, through a copy, and patches all but the storage class; bad values are 400', async () => {
    const file = bucket.file('f/fields.txt');
    await file.save('x', { resumable: false, metadata: fields });
    expect((await file.getMetadata())[0]).toMatchObject(fields);
    await file.copy('f/copy.txt');
    expect((await bucket.file('f/copy.txt').getMetadata())[0]).toMatchObject(fields);
    // A rewrite names the new class (setStorageClass rewrites the object onto itself).
    await bucket.file('f/copy.txt').setStorageClass('COLDLINE');
    expect((await bucket.file('f/copy.txt').getMetadata())[0]).toMatchObject({ ...fields, storageClass: 'COLDLINE' });
    await file.setMetadata({ cacheControl: 'public, max-age=60', customTime: '2026-05-01T00:00:00.000Z' });
    expect((await file.getMetadata())[0]).toMatchObject({ cacheControl: 'public, max-age=60', customTime: '2026-05-01T00:00:00.000Z', storageClass: 'NEARLINE' });
    await expect(file.setMetadata({ customTime: '2020-01-01T00:00:00.000Z' })).rejects.toMatchObject({ code: 400 });
    await expect(file.setMetadata({ storageClass: 'ARCHIVE' })).rejects.toMatchObject({ code: 400 });
    await expect(bucket.file('f/bad.txt').save('x', { resumable: false, metadata: { storageClass: 'SHINY' } })).rejects.toMatchObject({ code: 400 });
    // Unset: storageClass reads as STANDARD, the others are absent.
    await bucket.file('f/plain.txt').save('x', { resumable: false });
    const [plain] = await bucket.file('f/plain.txt').getMetadata();
    expect(plain.storageClass).toBe('STANDARD');
    expect(plain.cacheControl).toBeUndefined();
  });
});

describe('stats', () => {
  it('/_stats counts match the requests made, by kind and status', async () => {
    expect((await rawJson('/_reset', { method: 'POST' })).status).toBe(200);
    const file = bucket.file('media/blob.bin');
    await bucket.getMetadata();
    await file.getMetadata();
    await file.getMetadata();
    await file.download({ start: 0, end: 9 });
    await file.download({ start: 10, end: 19 });
    await file.download({ start: 20, end: 29 });
    await bucket.getFiles({ prefix: 'many/sub', autoPaginate: false });
    await rawUpload('stats/one', '1');
    await bucket.file('stats/one').delete();
    expect((await rawJson(`/storage/v1/b/bkt/o/nope`)).status).toBe(404);
    const s = (await rawJson('/_stats')).body;
    expect(s.requests).toEqual({ total: 10, bucket: 1, list: 1, metadata: 3, media: 3, upload: 1, delete: 1, patch: 0, copy: 0, compose: 0, move: 0, other: 0 });
    expect(s.byStatus).toEqual({ '200': 5, '206': 3, '204': 1, '404': 1 });
    expect(s.mediaBytes).toBe(30);
    expect(s.injected).toEqual({ '401': 0, '403': 0, '429': 0, '503': 0, reset: 0, short: 0, stall: 0, throttle: 0, 'body-stall': 0, 'upload-drop': 0 });
    const log = (await rawJson('/_log')).body as any[];
    expect(log).toHaveLength(10);
    expect(log.map((e) => e.seq)).toEqual([...log.map((e) => e.seq)].sort((a, b) => a - b));
    expect(emu.stats()).toEqual(s);
  });
});

describe('cli', () => {
  async function run(args: string[]): Promise<{ rc: number; err: string }> {
    let err = '';
    const spy = vi.spyOn(process.stderr, 'write').mockImplementation((chunk: string | Uint8Array) => {
      err += String(chunk);
      return true;
    });
    try {
      return { rc: await runEmulatorCli(args), err };
    } finally {
      spy.mockRestore();
    }
  }

  it('rejects bad values with exit code 2 and a one-line message', async () => {
    for (const args of [
      ['--root', path.join(root, 'does-not-exist')],
      ['--root', root, '--rate-429', '1.5'],
      ['--root', root, '--page-size', '2.5'],
      ['--root', root, '--latency-ms', '-1'],
      ['--root', root, '--port', 'http'],
      ['--port', '0'],
    ]) {
      const { rc, err } = await run(args);
      expect(rc, args.join(' ')).toBe(2);
      expect(err.trim().split('\n'), args.join(' ')).toHaveLength(1);
      expect(err).toMatch(/^error: /);
    }
  });

  it('runs as `node dist/cli/main.js emulator`, not only through bin/gcsmount', async () => {
    const { spawn } = await import('node:child_process');
    const child = spawn(process.execPath, [path.join(__dirname, '..', 'dist', 'cli', 'main.js'), 'emulator', '--root', root, '--port', '0'], { stdio: ['ignore', 'pipe', 'pipe'] });
    let out = '';
    child.stdout.on('data', (c: Buffer) => (out += c.toString()));
    try {
      await vi.waitFor(() => expect(out).toMatch(/listening on http:\/\/127\.0\.0\.1:\d+/), { timeout: 15_000, interval: 100 });
    } finally {
      child.kill('SIGTERM');
    }
  });

  it('starts, creates buckets, serves, and stops on SIGTERM with exit code 0', async () => {
    let out = '';
    const spy = vi.spyOn(process.stdout, 'write').mockImplementation((chunk: string | Uint8Array) => {
      out += String(chunk);
      return true;
    });
    const before = process.listeners('SIGTERM');
    try {
      const done = runEmulatorCli(['--root', root, '--port', '0', '--quiet', '--create-bucket', 'cli-made', '--latency-ms', '1']);
      await vi.waitFor(() => expect(out).toMatch(/listening on http:\/\/127\.0\.0\.1:\d+ \(root /), { timeout: 5000 });
      const url = /(http:\/\/\S+)/.exec(out)![1]!;
      expect((await fetch(`${url}/storage/v1/b/cli-made`)).status).toBe(200);
      expect((await (await fetch(`${url}/_knobs`)).json()).latencyMs).toBe(1);
      // Call only the CLI's own listener: emitting a real signal would reach the test runner too.
      for (const l of process.listeners('SIGTERM').filter((l) => !before.includes(l))) (l as () => void)();
      expect(await done).toBe(0);
    } finally {
      spy.mockRestore();
    }
  });
});

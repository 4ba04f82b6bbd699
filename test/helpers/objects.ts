import { createCipheriv, createHash, randomBytes } from 'node:crypto';
import type { TestBucket } from './harness.js';

/**
 * Uploads through the emulator's JSON API: the only way to create names a file system cannot hold, or
 * objects with metadata (a Content-Encoding).
 */
/** Puts an object in the emulator's bucket; `metadata` is custom metadata, set as another tool (gcsfuse) sets it. */
export async function upload(
  tb: TestBucket,
  name: string,
  content: Buffer | string = '',
  opts: { contentEncoding?: string; metadata?: Record<string, string>; contentType?: string; fields?: Record<string, string> } = {},
): Promise<void> {
  const encoding = opts.contentEncoding ? `&contentEncoding=${encodeURIComponent(opts.contentEncoding)}` : '';
  const media = typeof content === 'string' ? Buffer.from(content) : content;
  // Fields only a new object's resource sets (storageClass: a patch cannot): a multipart upload.
  const boundary = 'test-boundary-7f3a';
  const body = opts.fields
    ? Buffer.concat([
        Buffer.from(`--${boundary}\r\nContent-Type: application/json\r\n\r\n${JSON.stringify({ name, ...opts.fields })}\r\n--${boundary}\r\nContent-Type: application/octet-stream\r\n\r\n`),
        media,
        Buffer.from(`\r\n--${boundary}--\r\n`),
      ])
    : media;
  const url = `${tb.emulator.url}/upload/storage/v1/b/${tb.bucket}/o?uploadType=${opts.fields ? 'multipart' : 'media'}&name=${encodeURIComponent(name)}${encoding}`;
  const contentType = opts.fields ? `multipart/related; boundary=${boundary}` : 'application/octet-stream';
  const res = await fetch(url, { method: 'POST', body: new Uint8Array(body), headers: { 'content-type': contentType } });
  if (!res.ok) throw new Error(`upload ${name}: ${res.status} ${await res.text()}`);
  if (!opts.metadata && !opts.contentType) return;
  const patch = await fetch(`${tb.emulator.url}/storage/v1/b/${tb.bucket}/o/${encodeURIComponent(name)}`, {
    method: 'PATCH',
    body: JSON.stringify({ ...(opts.metadata ? { metadata: opts.metadata } : {}), ...(opts.contentType ? { contentType: opts.contentType } : {}) }),
    headers: { 'content-type': 'application/json' },
  });
  if (!patch.ok) throw new Error(`metadata of ${name}: ${patch.status} ${await patch.text()}`);
}

export interface GcsObject {
  name: string;
  size: string;
  generation: string;
  updated: string;
}

export async function objectMeta(tb: TestBucket, name: string): Promise<GcsObject> {
  const res = await fetch(`${tb.emulator.url}/storage/v1/b/${tb.bucket}/o/${encodeURIComponent(name)}`);
  if (!res.ok) throw new Error(`meta ${name}: ${res.status}`);
  return (await res.json()) as GcsObject;
}

/**
 * Deterministic pseudo-random bytes, so a failure reproduces: AES-256-CTR's keystream under a key made
 * from the seed. OpenSSL makes it at GB/s; the SHA-256 chain this replaced took ~40 s of the suite's setup
 * (9 s per 64 MiB, and data-path alone makes 300 MiB).
 */
export function bytes(size: number, seed = 1): Buffer {
  const key = createHash('sha256').update(String(seed)).digest();
  const cipher = createCipheriv('aes-256-ctr', key, Buffer.alloc(16));
  const out = Buffer.allocUnsafe(size);
  const zeros = Buffer.alloc(Math.min(size, 4 * 1024 * 1024));
  for (let off = 0; off < size; off += zeros.length) {
    const n = Math.min(zeros.length, size - off);
    cipher.update(zeros.subarray(0, n)).copy(out, off);
  }
  return out;
}

export function sha256(buf: Buffer): string {
  return createHash('sha256').update(buf).digest('hex');
}

export { randomBytes };

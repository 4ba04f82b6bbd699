// Object downloads (alt=media): headers as GCS sends them, Range handling, and body faults.
import type { IncomingHttpHeaders, OutgoingHttpHeaders } from 'node:http';
import { createGunzip } from 'node:zlib';
import { checkRead, validateGenerationParams } from './conditions.js';
import { HttpError, type RequestContext } from './context.js';
import { hashesOf, openExisting } from './objects.js';
import { etagFor } from './resources.js';
import { sendBody } from './send.js';
import type { FileHandle } from 'node:fs/promises';

export type RangeRequest =
  | { kind: 'none' }
  | { kind: 'ok'; start: number; end: number }
  | { kind: 'unsatisfiable'; start: number; end: number };

/**
 * One `bytes=` range, resolved against `size` (end inclusive). Anything malformed, or several ranges,
 * is ignored as HTTP allows, and the whole object is sent.
 */
export function parseRange(header: string | undefined, size: number): RangeRequest {
  if (header === undefined) return { kind: 'none' };
  const m = /^\s*bytes\s*=\s*(\d*)\s*-\s*(\d*)\s*$/i.exec(header);
  if (!m || (m[1] === '' && m[2] === '')) return { kind: 'none' };
  if (m[1] === '') {
    const n = Number(m[2]);
    if (n === 0 || size === 0) return { kind: 'unsatisfiable', start: size, end: size - 1 };
    return { kind: 'ok', start: Math.max(0, size - n), end: size - 1 };
  }
  const start = Number(m[1]);
  const end = m[2] === '' ? Infinity : Number(m[2]);
  if (!Number.isSafeInteger(start) || end < start) return { kind: 'none' };
  if (start >= size) return { kind: 'unsatisfiable', start, end: Number.isFinite(end) ? end : size - 1 };
  return { kind: 'ok', start, end: Math.min(end, size - 1) };
}

const FAIL_MESSAGES: Record<number, string> = {
  401: 'Anonymous caller does not have storage.objects.get access.',
  403: 'Caller does not have storage.objects.get access to the Google Cloud Storage object.',
  429: 'The rate of requests for this object is too high.',
  500: 'Internal Error',
  503: 'Service Unavailable',
};

/** Whether the request's Accept-Encoding admits gzip (present, and not `q=0`). */
export function acceptsGzip(headers: IncomingHttpHeaders): boolean {
  const raw = headers['accept-encoding'];
  if (!raw) return false;
  for (const part of raw.split(',')) {
    const [coding, ...params] = part.trim().toLowerCase().split(';');
    if (coding?.trim() !== 'gzip' && coding?.trim() !== '*') continue;
    const q = params.map((p) => /^\s*q\s*=\s*([\d.]+)\s*$/.exec(p)?.[1]).find((v) => v !== undefined);
    return q === undefined || Number(q) > 0;
  }
  return false;
}

export async function getObjectMedia(ctx: RequestContext, bucket: string, name: string): Promise<void> {
  const fail = ctx.knobs.failMedia;
  if (fail) {
    const msg = fail.status === 404 ? `No such object: ${bucket}/${name}` : (FAIL_MESSAGES[fail.status] ?? `Injected status ${fail.status}`);
    throw new HttpError(fail.status, msg);
  }
  validateGenerationParams(ctx.query);
  const opened = await openExisting(ctx, bucket, name);
  try {
    const { obj, fh } = opened;
    // Only a metageneration condition needs the attributes: a range GET costs no extra stat otherwise.
    const metaConditioned = ctx.query.has('ifMetagenerationMatch') || ctx.query.has('ifMetagenerationNotMatch');
    checkRead(ctx.query, obj, metaConditioned ? (await ctx.shared.store.attrs.get(obj)).metageneration : '1');
    const hashes = await hashesOf(ctx, opened);
    const encoding = (await ctx.shared.store.encodings.of(bucket)).of(obj);
    const gzipped = encoding !== null && encoding.toLowerCase() === 'gzip';
    // GCS's decompressive transcoding: a gzip-encoded object is sent decompressed unless the request
    // accepts gzip; then Range is ignored and the answer is a 200 with neither Content-Length nor
    // Content-Encoding (https://cloud.google.com/storage/docs/transcoding).
    const transcode = gzipped && !acceptsGzip(ctx.req.headers);
    const range = transcode ? ({ kind: 'none' } as const) : parseRange(ctx.req.headers.range, obj.size);
    const headers: OutgoingHttpHeaders = {
      'Content-Type': 'application/octet-stream',
      'Accept-Ranges': 'bytes',
      ETag: `"${etagFor(BigInt(obj.generation))}"`,
      'Last-Modified': new Date(Number(obj.mtimeNs / 1_000_000n)).toUTCString(),
      'Cache-Control': 'private, max-age=0',
      'x-goog-generation': obj.generation,
      'x-goog-metageneration': '1',
      'x-goog-stored-content-length': String(obj.size),
      // @google-cloud/storage only checks x-goog-hash when it is told the stored bytes are the sent bytes.
      'x-goog-stored-content-encoding': encoding ?? 'identity',
      'x-goog-hash': `crc32c=${hashes.crc32c},md5=${hashes.md5Hash}`,
      'x-goog-storage-class': 'STANDARD',
    };
    if (range.kind === 'unsatisfiable') {
      ctx.entry.range = { start: range.start, end: range.end };
      throw new HttpError(416, 'The requested range cannot be satisfied.', { 'Content-Range': `bytes */${obj.size}` });
    }
    let start = 0;
    let end = obj.size - 1;
    let status = 200;
    if (range.kind === 'ok') {
      ({ start, end } = range);
      status = 206;
      headers['Content-Range'] = `bytes ${start}-${end}/${obj.size}`;
      ctx.entry.range = { start, end };
    }
    const length = end - start + 1;
    if (transcode) {
      await sendDecompressed(ctx, opened.fh, headers);
      return;
    }
    // Served as stored: the client said it takes gzip, so the bytes go with their encoding.
    if (encoding !== null) headers['Content-Encoding'] = encoding;
    headers['Content-Length'] = length;
    ctx.res.writeHead(status, headers);
    if (ctx.req.method === 'HEAD' || length === 0) {
      ctx.res.end();
      return;
    }
    const fault = ctx.shared.faults.rollBody(length);
    if (fault) ctx.entry.injected = fault.fault;
    const stall = fault ? null : ctx.shared.faults.rollStall(length);
    if (stall) ctx.entry.injected = 'body-stall';
    const body = fh.createReadStream({ start, end, autoClose: false, highWaterMark: 256 * 1024 });
    try {
      const r = await sendBody(ctx.res, body, {
        bytesPerSec: ctx.knobs.bandwidthBytesPerSec,
        cut: fault ? { at: fault.cutAt, fault: fault.fault } : null,
        stall,
        onBytes: (n) => (ctx.entry.bytes += n),
        onCut: ctx.finish,
      });
      // A file truncated while being served leaves the body short of its Content-Length; ending the
      // response normally would leave the client waiting on a reused connection, so cut it instead.
      if (r === 'done') {
        if (ctx.entry.bytes === length) ctx.res.end();
        else ctx.res.destroy();
      }
    } finally {
      body.destroy();
    }
  } finally {
    await opened.fh.close();
  }
}

/**
 * The decompressed bytes of a gzip-encoded object, chunked (their length is not known up front). Body
 * faults are not injected here: the knobs cut bodies at a fraction of a known length.
 */
async function sendDecompressed(ctx: RequestContext, fh: FileHandle, headers: OutgoingHttpHeaders): Promise<void> {
  ctx.res.writeHead(200, headers);
  if (ctx.req.method === 'HEAD') {
    ctx.res.end();
    return;
  }
  const stored = fh.createReadStream({ autoClose: false, highWaterMark: 256 * 1024 });
  const gunzip = createGunzip();
  stored.pipe(gunzip);
  try {
    const r = await sendBody(ctx.res, gunzip, { bytesPerSec: ctx.knobs.bandwidthBytesPerSec, cut: null, onBytes: (n) => (ctx.entry.bytes += n) });
    if (r === 'done') ctx.res.end();
  } catch {
    // Not gzip after all (the metadata lied): the body so far is all there is; cut it so the client sees it short.
    ctx.res.destroy();
  } finally {
    stored.destroy();
    gunzip.destroy();
  }
}

// Uploads: uploadType=media, multipart, and resumable sessions (POST for a session URI, then PUTs).
import { randomBytes } from 'node:crypto';
import { createWriteStream, promises as fsp } from 'node:fs';
import type { Readable } from 'node:stream';
import { Transform } from 'node:stream';
import { finished, pipeline } from 'node:stream/promises';
import { attrsFromResource, type NewAttrs } from './attributes.js';
import { checkWrite, validateGenerationParams } from './conditions.js';
import { HttpError, type RequestContext } from './context.js';
import { hashHandle, type Hashes } from './hashes.js';
import { MultipartError, boundaryOf, readMultipart } from './multipart.js';
import { objectNameError } from './names.js';
import { noSuchBucket } from './objects.js';
import { objectResource } from './resources.js';
import type { StoredObject } from './stored-object.js';

/** A completed upload: what a repeated finalize answers with. */
interface Done {
  obj: StoredObject;
  hashes: Hashes;
  contentEncoding: string | null;
  attrs: NewAttrs;
}

interface Session {
  bucket: string;
  name: string;
  tmp: string;
  /** Query of the initiating POST: its preconditions apply when the upload completes. */
  query: URLSearchParams;
  /** The object resource sent with the initiating POST (contentEncoding applies at completion). */
  metadata: Record<string, unknown>;
  received: number;
  done: Done | null;
  /** PUTs to one session are handled one at a time. */
  lock: Promise<void>;
  /** performance.now() at the initiating POST: the session expires `uploadSessionTtlMs` after it. */
  createdAt: number;
}

/** GCS persists a resumable upload in units of 256 KiB: only the final chunk may end elsewhere. */
const GRANULE = 256 * 1024;

/** Thrown inside a chunk's body pipeline to cut it where the reset fault said. */
class InjectedReset extends Error {}

const MAX_SESSIONS = 10_000;

export class Uploads {
  private readonly sessions = new Map<string, Session>();

  /** POST/PUT/DELETE under /upload/storage/v1/b/BUCKET/o. */
  async handle(ctx: RequestContext, bucket: string): Promise<void> {
    const id = ctx.query.get('upload_id');
    if (id !== null) return this.withSession(ctx, id);
    if (ctx.req.method !== 'POST') throw new HttpError(405, `Method ${ctx.req.method} not allowed here.`);
    validateGenerationParams(ctx.query);
    const { store } = ctx.shared;
    if (!(await store.bucketStat(bucket))) throw noSuchBucket();
    const boundary = boundaryOf(ctx.req.headers['content-type']);
    const type = ctx.query.get('uploadType') ?? (boundary ? 'multipart' : 'media');
    if (type === 'media') return this.simple(ctx, bucket, null);
    if (type === 'multipart') {
      if (!boundary) throw new HttpError(400, 'uploadType=multipart needs a multipart/related body with a boundary.');
      return this.simple(ctx, bucket, boundary);
    }
    if (type === 'resumable') return this.startSession(ctx, bucket);
    throw new HttpError(400, `Invalid uploadType: ${type}`);
  }

  private async simple(ctx: RequestContext, bucket: string, boundary: string | null): Promise<void> {
    const { store } = ctx.shared;
    let name = ctx.query.get('name');
    if (!boundary) checkName(name);
    const tmp = await store.tempPath(bucket);
    try {
      let metadata: Record<string, unknown> = {};
      if (boundary) {
        const out = createWriteStream(tmp);
        try {
          metadata = await readMultipart(ctx.req, boundary, out);
        } catch (e) {
          out.destroy();
          if (e instanceof MultipartError) throw new HttpError(400, e.message);
          throw e;
        }
        out.end();
        await finished(out);
        if (name === null && typeof metadata.name === 'string') name = metadata.name;
        checkName(name);
      } else {
        await pipeline(ctx.req, createWriteStream(tmp));
      }
      await this.complete(ctx, bucket, name!, tmp, ctx.query, metadata);
    } finally {
      await fsp.rm(tmp, { force: true });
    }
  }

  private async startSession(ctx: RequestContext, bucket: string): Promise<void> {
    const raw = await readSmallBody(ctx.req);
    let metadata: Record<string, unknown> = {};
    if (raw.length) {
      try {
        metadata = JSON.parse(raw.toString('utf8')) as Record<string, unknown>;
      } catch {
        throw new HttpError(400, 'Resumable upload metadata is not valid JSON.');
      }
    }
    const name = ctx.query.get('name') ?? (typeof metadata?.name === 'string' ? metadata.name : null);
    checkName(name);
    const { store, baseUrl } = ctx.shared;
    newAttrs(metadata);
    // GCS refuses a session whose precondition already fails rather than after the bytes are sent.
    const cur = await store.stat(bucket, name!);
    checkWrite(ctx.query, cur, { bucket, name: name! }, cur ? (await store.attrs.get(cur)).metageneration : '1');
    const tmp = await store.tempPath(bucket);
    await fsp.writeFile(tmp, '');
    const id = randomBytes(16).toString('hex');
    this.remember(id, { bucket, name: name!, tmp, query: ctx.query, metadata, received: 0, done: null, lock: Promise.resolve(), createdAt: performance.now() });
    const location =
      `${baseUrl}/upload/storage/v1/b/${encodeURIComponent(bucket)}/o` +
      `?uploadType=resumable&name=${encodeURIComponent(name!)}&upload_id=${id}`;
    await ctx.send(200, Buffer.alloc(0), { Location: location, 'X-GUploader-UploadID': id });
  }

  private async withSession(ctx: RequestContext, id: string): Promise<void> {
    const s = this.sessions.get(id);
    if (!s) throw new HttpError(404, 'No such upload session (unknown or already cancelled).');
    const ttl = ctx.knobs.uploadSessionTtlMs;
    if (ttl > 0 && !s.done && performance.now() - s.createdAt > ttl) {
      this.sessions.delete(id);
      await fsp.rm(s.tmp, { force: true });
      ctx.req.resume();
      throw new HttpError(404, 'The upload session has expired; start a new one.');
    }
    const prev = s.lock;
    let release!: () => void;
    s.lock = new Promise((r) => (release = r));
    await prev;
    try {
      if (ctx.req.method === 'DELETE') {
        this.sessions.delete(id);
        await fsp.rm(s.tmp, { force: true });
        // GCS answers a cancelled session with 499.
        await ctx.send(499, Buffer.alloc(0));
        return;
      }
      if (ctx.req.method !== 'PUT' && ctx.req.method !== 'POST') throw new HttpError(405, `Method ${ctx.req.method} not allowed here.`);
      await this.put(ctx, id, s);
    } finally {
      release();
    }
  }

  /** One PUT: a chunk (`bytes a-b/total`), the rest (`bytes a-*\/total` or no header), or a status query. */
  private async put(ctx: RequestContext, id: string, s: Session): Promise<void> {
    if (s.done) {
      ctx.req.resume();
      return this.reply(ctx, s.done);
    }
    const cr = parseContentRange(ctx.req.headers['content-range']);
    if (cr.start !== null && ctx.shared.faults.rollUploadDrop()) {
      // Received, then dropped: the session holds what it held before.
      ctx.req.resume();
      await new Promise<void>((resolve) => ctx.req.once('end', resolve).once('error', () => resolve()));
      ctx.entry.injected = 'upload-drop';
      ctx.entry.committed = s.received;
      const headers = s.received > 0 ? { Range: `bytes=0-${s.received - 1}` } : {};
      await ctx.send(308, Buffer.alloc(0), headers);
      return;
    }
    if (cr.start !== null) {
      if (cr.start > s.received) {
        throw new HttpError(400, `Content-Range starts at ${cr.start} but only ${s.received} bytes were persisted.`);
      }
      // The range the client sent, as it said it or, open-ended, as many bytes as came.
      let sent = 0;
      ctx.req.on('data', (c: Buffer) => (sent += c.length));
      const noteRange = (): void => {
        const end = cr.end ?? (sent > 0 ? cr.start! + sent - 1 : null);
        if (end !== null) ctx.entry.range = { start: cr.start!, end };
      };
      const whole = await this.receiveChunk(ctx, s, cr, noteRange);
      noteRange();
      if (!whole) return;
    } else {
      ctx.req.resume();
    }
    const total = cr.total;
    if (total !== null && s.received > total) throw new HttpError(400, `Received ${s.received} bytes but the total is ${total}.`);
    const last = total !== null ? s.received === total : cr.start !== null && cr.end === null;
    if (!last) await this.persistGranules(s);
    ctx.entry.committed = s.received;
    if (!last) {
      const headers = s.received > 0 ? { Range: `bytes=0-${s.received - 1}` } : {};
      await ctx.send(308, Buffer.alloc(0), headers);
      return;
    }
    try {
      s.done = await this.complete(ctx, s.bucket, s.name, s.tmp, s.query, s.metadata);
    } catch (e) {
      // A session that failed its hash check or precondition cannot succeed later; GCS drops it too.
      this.sessions.delete(id);
      await fsp.rm(s.tmp, { force: true });
      throw e;
    }
  }

  /**
   * Appends a chunk's new bytes (those past what is persisted) to the session's file. With the reset
   * fault rolled, the connection is reset part-way and what arrived is kept up to a 256 KiB boundary;
   * returns false then (the request is over).
   */
  private async receiveChunk(ctx: RequestContext, s: Session, cr: ContentRange, beforeCut: () => void): Promise<boolean> {
    const declared = Number(ctx.req.headers['content-length'] ?? NaN);
    const cutAt = Number.isFinite(declared) ? ctx.shared.faults.rollUploadReset(declared) : null;
    const out = createWriteStream(s.tmp, { flags: 'a' });
    try {
      const skip = skipBytes(s.received - cr.start!);
      const rate = ctx.knobs.uploadBytesPerSec;
      if (rate > 0) await pipeline(ctx.req, slowTo(rate), ...(cutAt === null ? [] : [cutAfter(cutAt)]), skip, out);
      else if (cutAt === null) await pipeline(ctx.req, skip, out);
      else await pipeline(ctx.req, cutAfter(cutAt), skip, out);
      return true;
    } catch (e) {
      if (!(e instanceof InjectedReset)) throw e;
      ctx.entry.injected = 'reset';
      await this.persistGranules(s);
      ctx.entry.committed = s.received;
      beforeCut();
      ctx.finish();
      // The socket may already be detached from the request once the pipeline tore it down.
      const socket = (ctx.res.socket ?? ctx.req.socket) as (typeof ctx.req.socket & { resetAndDestroy?: () => void }) | null;
      if (socket?.resetAndDestroy) socket.resetAndDestroy();
      else if (socket) socket.destroy();
      else ctx.res.destroy();
      return false;
    } finally {
      s.received = (await fsp.stat(s.tmp)).size;
    }
  }

  /** Drops bytes past the last 256 KiB boundary: GCS commits a non-final chunk only in whole units. */
  private async persistGranules(s: Session): Promise<void> {
    const size = (await fsp.stat(s.tmp)).size;
    const keep = Math.floor(size / GRANULE) * GRANULE;
    if (keep < size) await fsp.truncate(s.tmp, keep);
    s.received = keep;
  }

  /** Verifies client-sent hashes, commits the temp file, and answers with the object resource. */
  private async complete(
    ctx: RequestContext,
    bucket: string,
    name: string,
    tmp: string,
    query: URLSearchParams,
    metadata: Record<string, unknown>,
  ): Promise<Done> {
    const { store } = ctx.shared;
    const fh = await fsp.open(tmp, 'r');
    let hashes: Hashes;
    try {
      hashes = await hashHandle(fh, (await fh.stat()).size);
    } finally {
      await fh.close();
    }
    verifyHashes(hashes, ctx.req.headers['x-goog-hash'], metadata);
    const contentEncoding = contentEncodingOf(query, metadata);
    const attrs = newAttrs(metadata);
    const obj = await store.commit(bucket, name, tmp, (cur, a) => checkWrite(query, cur, { bucket, name }, a.metageneration), contentEncoding, attrs);
    ctx.shared.hashes.seed(obj, hashes);
    const done = { obj, hashes, contentEncoding, attrs };
    await this.reply(ctx, done);
    return done;
  }

  private reply(ctx: RequestContext, d: Done): Promise<void> {
    return ctx.projected(objectResource(ctx.shared.baseUrl, d.obj, d.hashes, d.contentEncoding, undefined, { metageneration: '1', ...d.attrs }), ctx.fields());
  }

  /** Removes temp files of sessions that never completed. */
  async dispose(): Promise<void> {
    const pending = [...this.sessions.values()].filter((s) => !s.done);
    this.sessions.clear();
    await Promise.all(pending.map((s) => fsp.rm(s.tmp, { force: true })));
  }

  private remember(id: string, s: Session): void {
    if (this.sessions.size >= MAX_SESSIONS) {
      for (const [k, v] of this.sessions) {
        if (v.done) this.sessions.delete(k);
        if (this.sessions.size < MAX_SESSIONS / 2) break;
      }
    }
    this.sessions.set(id, s);
  }
}

/**
 * The object's Content-Encoding: the `contentEncoding` query parameter (objects.insert takes one for
 * media uploads), else the resource's field; 'identity' or nothing is no encoding.
 */
function contentEncodingOf(query: URLSearchParams, metadata: Record<string, unknown>): string | null {
  const v = query.get('contentEncoding') ?? (typeof metadata.contentEncoding === 'string' ? metadata.contentEncoding : null);
  const trimmed = v?.trim() ?? '';
  return trimmed === '' || trimmed.toLowerCase() === 'identity' ? null : trimmed;
}

/** The new object's contentType and custom metadata, from the resource the client sent; malformed is 400. */
function newAttrs(resource: Record<string, unknown>): NewAttrs {
  try {
    return attrsFromResource(resource);
  } catch (e) {
    throw new HttpError(400, `Invalid object resource: ${(e as Error).message}`);
  }
}

function checkName(name: string | null): void {
  if (name === null) throw new HttpError(400, 'Required parameter: name');
  const err = objectNameError(name);
  if (err) throw new HttpError(400, err);
}

/** GCS rejects an upload whose bytes do not match hashes the client declared. */
function verifyHashes(h: Hashes, header: string | string[] | undefined, metadata: Record<string, unknown>): void {
  const declared: { crc32c?: string; md5?: string } = {};
  for (const part of [header ?? []].flat().join(',').split(',')) {
    const eq = part.indexOf('=');
    if (eq < 0) continue;
    const k = part.slice(0, eq).trim().toLowerCase();
    const v = part.slice(eq + 1).trim();
    if (k === 'crc32c' || k === 'md5') declared[k] = v;
  }
  if (typeof metadata.crc32c === 'string') declared.crc32c = metadata.crc32c;
  if (typeof metadata.md5Hash === 'string') declared.md5 = metadata.md5Hash;
  if (declared.crc32c !== undefined && declared.crc32c !== h.crc32c) {
    throw new HttpError(400, `Provided CRC32C "${declared.crc32c}" doesn't match calculated CRC32C "${h.crc32c}".`);
  }
  if (declared.md5 !== undefined && declared.md5 !== h.md5Hash) {
    throw new HttpError(400, `Provided MD5 hash "${declared.md5}" doesn't match calculated MD5 hash "${h.md5Hash}".`);
  }
}

interface ContentRange {
  /** null for a status query (`bytes *\/total`) or when the header is absent and the body is empty. */
  start: number | null;
  /** null when open-ended (`a-*`). */
  end: number | null;
  total: number | null;
}

function parseContentRange(h: string | undefined): ContentRange {
  if (h === undefined) return { start: 0, end: null, total: null };
  const status = /^bytes \*\/(\d+|\*)$/.exec(h.trim());
  if (status) return { start: null, end: null, total: status[1] === '*' ? null : Number(status[1]) };
  const m = /^bytes (\d+)-(\d+|\*)\/(\d+|\*)$/.exec(h.trim());
  if (!m) throw new HttpError(400, `Invalid Content-Range: ${h}`);
  return {
    start: Number(m[1]),
    end: m[2] === '*' ? null : Number(m[2]),
    total: m[3] === '*' ? null : Number(m[3]),
  };
}

/** Passes `n` bytes of a request body, then fails the pipeline as a reset connection would. */
/** Takes a request body no faster than `bytesPerSec` (a slow uplink: the client's writes back up). */
function slowTo(bytesPerSec: number): Transform {
  return new Transform({
    highWaterMark: 16 * 1024,
    transform(chunk: Buffer, _enc, done) {
      setTimeout(() => done(null, chunk), (chunk.length / bytesPerSec) * 1000);
    },
  });
}

function cutAfter(n: number): Transform {
  let left = n;
  return new Transform({
    transform(chunk: Buffer, _enc, cb) {
      if (left >= chunk.length) {
        left -= chunk.length;
        cb(null, chunk);
        return;
      }
      const head = chunk.subarray(0, left);
      left = 0;
      if (head.length) this.push(head);
      cb(new InjectedReset('injected reset mid-chunk'));
    },
  });
}

/** Drops bytes a retried chunk re-sends that are already persisted. */
function skipBytes(n: number): Transform {
  let left = n;
  return new Transform({
    transform(chunk: Buffer, _enc, cb) {
      if (left >= chunk.length) {
        left -= chunk.length;
        cb();
        return;
      }
      const rest = chunk.subarray(left);
      left = 0;
      cb(null, rest);
    },
  });
}

export async function readSmallBody(req: Readable, limit = 1 << 20): Promise<Buffer> {
  const parts: Buffer[] = [];
  let size = 0;
  for await (const chunk of req as AsyncIterable<Buffer>) {
    size += chunk.length;
    if (size > limit) throw new HttpError(400, 'Request body too large.');
    parts.push(chunk);
  }
  return Buffer.concat(parts);
}

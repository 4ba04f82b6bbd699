// Resumable uploads (GCS's resumable protocol): a session opened by POST, chunks PUT with
// Content-Range, 308 + Range for what is committed, a status query after a failure so a chunk is
// resumed where GCS stands (never from zero), and a finalize whose CRC32C and precondition are checked.
import { GcsError, UploadOffsetError, UploadSessionExpiredError } from './errors.js';
import { KEPT_FIELDS, UPLOAD_CHUNK_UNIT, type FinalChunk, type NewObjectAttrs, type Preconditions, type ReadPriority, type UploadProgress, type UploadSession } from './object-client.js';
import { errorFromResponse, type SentResponse } from './responses.js';
import { WRITTEN_FIELDS, notePrecondition, toWritten, type RawWritten, type Transport } from './transport.js';

/** The big-endian CRC32C as GCS writes it (base64), from the value a running crc32c() returns. */
export function crc32cBase64(value: number): string {
  const b = Buffer.alloc(4);
  b.writeUInt32BE(value >>> 0);
  return b.toString('base64');
}

/** The object resource a new object is created with (a session's body, a multipart upload's first part). */
export function newResource(name: string, attrs: NewObjectAttrs, crc32c?: string): Record<string, unknown> {
  const r: Record<string, unknown> = { name, ...attrsBody(attrs) };
  if (crc32c !== undefined) r.crc32c = crc32c;
  return r;
}

/** The resource fields of `attrs` that are set (a copy's or compose's destination, a new object's resource). */
export function attrsBody(attrs: NewObjectAttrs): Record<string, unknown> {
  const r: Record<string, unknown> = {};
  if (attrs.contentType !== undefined) r.contentType = attrs.contentType;
  for (const key of KEPT_FIELDS) if (attrs[key] !== undefined) r[key] = attrs[key];
  if (attrs.metadata !== undefined) r.metadata = attrs.metadata;
  return r;
}

/** The precondition parameters GCS takes on the query string. */
export function preconditionQuery(q: URLSearchParams, p: Preconditions): URLSearchParams {
  if (p.ifGenerationMatch !== undefined) q.set('ifGenerationMatch', p.ifGenerationMatch);
  if (p.ifMetagenerationMatch !== undefined) q.set('ifMetagenerationMatch', p.ifMetagenerationMatch);
  return q;
}

/** What one request to a session answered: the committed offset, or the finished object. */
interface Answer extends UploadProgress {
  queried: boolean;
}

export class ResumableUploads {
  constructor(private readonly t: Transport) {}

  async start(name: string, opts: Preconditions & NewObjectAttrs = {}): Promise<UploadSession> {
    const q = preconditionQuery(new URLSearchParams({ uploadType: 'resumable', name }), opts);
    const what = `start upload ${name}`;
    const body = JSON.stringify(newResource(name, opts));
    try {
      // A repeated start at worst leaves an unused session behind: always safe to retry.
      const url = await this.t.run('upload', what, { idempotent: true }, async (headers) => {
        const res = await this.t.send('upload', {
          method: 'POST',
          path: `/upload${this.t.bucketPath}/o?${q}`,
          headers: { ...headers, 'content-type': 'application/json; charset=UTF-8', ...(opts.contentType ? { 'x-upload-content-type': opts.contentType } : {}) },
          body,
        });
        if (res.statusCode !== 200 && res.statusCode !== 201) throw await errorFromResponse(res, what);
        await res.body.dump();
        const location = res.headers.location;
        if (typeof location !== 'string' || location === '') throw new GcsError('INVALID', `${what}: no Location in the answer`);
        return location;
      });
      this.t.metrics.inc('gcs_uploads_started');
      return { name, url };
    } catch (err) {
      notePrecondition(this.t, err);
      throw err;
    }
  }

  async putChunk(session: UploadSession, offset: number, bytes: Buffer, opts: { final?: FinalChunk; priority?: ReadPriority } = {}): Promise<UploadProgress> {
    const final = opts.final ?? null;
    const end = offset + bytes.length;
    if (!final && bytes.length % UPLOAD_CHUNK_UNIT !== 0) throw new RangeError(`putChunk: a chunk before the last must be a multiple of ${UPLOAD_CHUNK_UNIT} bytes, not ${bytes.length}`);
    if (final && final.size !== end) throw new RangeError(`putChunk: the last chunk ends at ${end}, not at the size ${final.size}`);
    const what = `upload ${session.name} [${offset}, ${end})`;
    let committed = offset;
    // Set when an attempt failed without an answer to trust: the next one asks GCS where it stands.
    let unsure = false;
    try {
      for (;;) {
        const answer = await this.t.run('upload', what, { idempotent: true, priority: opts.priority }, async (headers): Promise<Answer> => {
          if (unsure) return { ...(await this.query(session, headers, final, what)), queried: true };
          let sent: UploadProgress;
          try {
            sent = await this.send(session, headers, bytes.subarray(committed - offset), committed, end, final, what);
          } catch (err) {
            // A transport error (reset, timeout) is still raw here: anything but a definite answer
            // leaves us unsure how much GCS kept.
            if (!(err instanceof GcsError) || err.code === 'TRANSIENT') unsure = true;
            throw err;
          }
          // A 308 that kept nothing of what was sent (GCS could not persist it, or a finalize it did
          // not take): a failure of this attempt, sent again after the policy's growing backoff (GCS
          // said where it stands: no query). Re-sent at once, it was a loop as fast as GCS answered.
          if (!sent.object && sent.committed === committed) throw new GcsError('TRANSIENT', `${what}: GCS kept none of it (308, ${sent.committed} bytes committed)`, 308);
          return { ...sent, queried: false };
        });
        if (answer.queried) {
          unsure = false;
          this.t.metrics.inc('gcs_upload_resumes');
          this.t.log.info({ what, committed: answer.committed }, 'GCS upload chunk resumed from the committed offset');
        }
        if (answer.object) return this.finished(answer, final, what);
        if (answer.committed < offset) throw new UploadOffsetError(what, answer.committed);
        committed = Math.min(answer.committed, end);
        if (committed === end && !final) return { committed: answer.committed, object: null };
      }
    } catch (err) {
      notePrecondition(this.t, err);
      if (err instanceof UploadSessionExpiredError) this.t.metrics.inc('gcs_upload_sessions_expired');
      throw err;
    }
  }

  async status(session: UploadSession): Promise<UploadProgress> {
    const what = `upload status ${session.name}`;
    return this.t.run('upload', what, { idempotent: true }, (headers) => this.query(session, headers, null, what));
  }

  async cancel(session: UploadSession): Promise<void> {
    const what = `cancel upload ${session.name}`;
    await this.t.run('upload', what, { idempotent: true }, async (headers) => {
      const res = await this.t.send('upload', { method: 'DELETE', path: pathOf(session), headers: { ...headers, 'content-length': '0' } });
      // 499 is GCS's answer to a cancel; a session already gone is cancelled too.
      if (![499, 204, 200, 404, 410].includes(res.statusCode)) throw await errorFromResponse(res, what);
      await res.body.dump();
    });
  }

  /** One chunk PUT (or, for a last chunk already committed whole, the finalize alone). */
  private async send(session: UploadSession, headers: Record<string, string>, body: Buffer, from: number, end: number, final: FinalChunk | null, what: string): Promise<UploadProgress> {
    const range = body.length === 0 ? `bytes */${final ? final.size : '*'}` : `bytes ${from}-${end - 1}/${final ? final.size : '*'}`;
    const h: Record<string, string> = { ...headers, 'content-range': range, 'content-length': String(body.length) };
    if (final) h['x-goog-hash'] = `crc32c=${final.crc32c}`;
    this.t.metrics.inc('gcs_upload_chunks');
    const res = await this.t.send('upload', { method: 'PUT', path: pathOf(session, !!final), headers: h, body });
    this.t.metrics.inc('gcs_upload_bytes', body.length);
    return this.answer(res, session, what);
  }

  /**
   * Where the session stands (`bytes *\/*`). For a last chunk the size is declared and the hash sent: a
   * session holding every byte is then finalized by the query itself, as GCS does.
   */
  private async query(session: UploadSession, headers: Record<string, string>, final: FinalChunk | null, what: string): Promise<UploadProgress> {
    const h: Record<string, string> = { ...headers, 'content-range': `bytes */${final ? final.size : '*'}`, 'content-length': '0' };
    if (final) h['x-goog-hash'] = `crc32c=${final.crc32c}`;
    const res = await this.t.send('upload', { method: 'PUT', path: pathOf(session, !!final), headers: h });
    return this.answer(res, session, what);
  }

  private async answer(res: SentResponse, session: UploadSession, what: string): Promise<UploadProgress> {
    if (res.statusCode === 308) {
      await res.body.dump();
      return { committed: committedOf(res.headers.range), object: null };
    }
    if (res.statusCode === 200 || res.statusCode === 201) {
      const object = toWritten((await res.body.json()) as RawWritten);
      return { committed: object.size, object };
    }
    if (res.statusCode === 404 || res.statusCode === 410) {
      await res.body.dump();
      throw new UploadSessionExpiredError(`${what} (session of ${session.name})`, res.statusCode);
    }
    throw await errorFromResponse(res, what);
  }

  /** A finished session: the object must be the bytes we sent, size and CRC32C. */
  private finished(answer: UploadProgress, final: FinalChunk | null, what: string): UploadProgress {
    const object = answer.object!;
    if (final && (object.size !== final.size || (object.crc32c !== null && object.crc32c !== final.crc32c))) {
      throw new GcsError('CORRUPT', `${what}: GCS stored ${object.size} bytes with CRC32C ${object.crc32c}, we sent ${final.size} with ${final.crc32c}`);
    }
    this.t.metrics.inc('gcs_uploads_finalized');
    return answer;
  }
}

/** The session URL's path and query, sent to the client's own origin (GCS answers on the same one). */
function pathOf(session: UploadSession, withFields = false): string {
  const u = new URL(session.url);
  if (withFields) u.searchParams.set('fields', WRITTEN_FIELDS);
  return `${u.pathname}${u.search}`;
}

/** `Range: bytes=0-N` of a 308: N + 1 bytes committed; none yet without the header. */
function committedOf(header: string | string[] | undefined): number {
  const v = Array.isArray(header) ? header[0] : header;
  const m = v ? /bytes=0-(\d+)/.exec(v) : null;
  return m ? Number(m[1]) + 1 : 0;
}

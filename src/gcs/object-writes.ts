// Object writes that are one JSON call (or a few, for rewrite): one-shot multipart upload, delete,
// copy through rewrite, compose, the atomic move, and metadata patch, each with its preconditions.
import { randomBytes } from 'node:crypto';
import { crc32c } from '../crc32c.js';
import { GcsError } from './errors.js';
import type { NewObjectAttrs, Preconditions, WrittenObject } from './object-client.js';
import { errorFromResponse } from './responses.js';
import { WRITTEN_FIELDS, jsonCall, notePrecondition, toWritten, type RawWritten, type Transport } from './transport.js';
import { attrsBody, crc32cBase64, newResource, preconditionQuery } from './uploads.js';

interface RewriteResponse {
  done: boolean;
  rewriteToken?: string;
  resource?: RawWritten;
}

export class ObjectWrites {
  constructor(private readonly t: Transport) {}

  /** uploadType=multipart: the resource (with the CRC32C GCS checks the bytes against) and the bytes. */
  async upload(name: string, bytes: Buffer, opts: Preconditions & NewObjectAttrs = {}): Promise<WrittenObject> {
    const crc = crc32cBase64(crc32c(bytes));
    const q = preconditionQuery(new URLSearchParams({ uploadType: 'multipart', fields: WRITTEN_FIELDS }), opts);
    const boundary = `gcsmount-${randomBytes(12).toString('hex')}`;
    const body = Buffer.concat([
      Buffer.from(`--${boundary}\r\nContent-Type: application/json; charset=UTF-8\r\n\r\n${JSON.stringify(newResource(name, opts, crc))}\r\n`),
      Buffer.from(`--${boundary}\r\nContent-Type: ${opts.contentType ?? 'application/octet-stream'}\r\n\r\n`),
      bytes,
      Buffer.from(`\r\n--${boundary}--\r\n`),
    ]);
    const what = `upload ${name} (${bytes.length} bytes, one request)`;
    return this.guarded(async () => {
      const object = await this.t.run('upload', what, { idempotent: opts.ifGenerationMatch !== undefined }, async (headers) => {
        const res = await this.t.send('upload', {
          method: 'POST',
          path: `/upload${this.t.bucketPath}/o?${q}`,
          headers: { ...headers, 'content-type': `multipart/related; boundary=${boundary}`, 'content-length': String(body.length) },
          body,
        });
        this.t.metrics.inc('gcs_upload_bytes', bytes.length);
        if (res.statusCode !== 200) throw await errorFromResponse(res, what);
        return toWritten((await res.body.json()) as RawWritten);
      });
      if (object.size !== bytes.length || (object.crc32c !== null && object.crc32c !== crc)) {
        throw new GcsError('CORRUPT', `${what}: GCS stored ${object.size} bytes with CRC32C ${object.crc32c}, we sent ${bytes.length} with ${crc}`);
      }
      this.t.metrics.inc('gcs_uploads_finalized');
      return object;
    });
  }

  async delete(name: string, opts: Pick<Preconditions, 'ifGenerationMatch'> = {}): Promise<void> {
    const q = preconditionQuery(new URLSearchParams(), opts);
    await this.guarded(() => jsonCall(this.t, `delete ${name}`, { idempotent: opts.ifGenerationMatch !== undefined }, { method: 'DELETE', path: `${this.objectPath(name)}?${q}` }));
  }

  /** objects.rewrite, called again with its rewriteToken while GCS answers `done: false` (large or cross-location copies). */
  async copy(src: string, dest: string, opts: Preconditions & NewObjectAttrs & { ifSourceGenerationMatch?: string } = {}): Promise<WrittenObject> {
    const q = preconditionQuery(new URLSearchParams({ fields: `done,rewriteToken,resource(${WRITTEN_FIELDS})` }), opts);
    if (opts.ifSourceGenerationMatch !== undefined) q.set('ifSourceGenerationMatch', opts.ifSourceGenerationMatch);
    const body = JSON.stringify(attrsBody(opts));
    const path = `${this.objectPath(src)}/rewriteTo/b/${encodeURIComponent(this.bucketName())}/o/${encodeURIComponent(dest)}`;
    const idempotent = opts.ifGenerationMatch !== undefined;
    return this.guarded(async () => {
      for (let calls = 1; ; calls++) {
        const r = await jsonCall<RewriteResponse>(this.t, `copy ${src} to ${dest} (call ${calls})`, { idempotent }, { method: 'POST', path: `${path}?${q}`, body });
        if (r?.done && r.resource) return toWritten(r.resource);
        if (!r?.rewriteToken) throw new GcsError('INVALID', `copy ${src} to ${dest}: rewrite answered neither done nor a rewriteToken`);
        q.set('rewriteToken', r.rewriteToken);
      }
    });
  }

  async compose(sources: Array<{ name: string; generation?: string }>, dest: string, opts: Preconditions & NewObjectAttrs = {}): Promise<WrittenObject> {
    const q = preconditionQuery(new URLSearchParams({ fields: WRITTEN_FIELDS }), opts);
    const body = JSON.stringify({
      sourceObjects: sources.map((s) => (s.generation === undefined ? { name: s.name } : { name: s.name, generation: s.generation })),
      destination: attrsBody(opts),
    });
    const what = `compose ${sources.length} objects into ${dest}`;
    return this.guarded(async () => toWritten((await jsonCall<RawWritten>(this.t, what, { idempotent: opts.ifGenerationMatch !== undefined }, { method: 'POST', path: `${this.objectPath(dest)}/compose?${q}`, body }))!));
  }

  async move(src: string, dest: string, opts: Preconditions & { ifSourceGenerationMatch?: string } = {}): Promise<WrittenObject> {
    const q = preconditionQuery(new URLSearchParams({ fields: WRITTEN_FIELDS }), opts);
    if (opts.ifSourceGenerationMatch !== undefined) q.set('ifSourceGenerationMatch', opts.ifSourceGenerationMatch);
    // Repeated after a lost answer, a move that happened finds no source (404): harmless, so a move
    // with a source precondition is retried like any conditional write.
    const idempotent = opts.ifSourceGenerationMatch !== undefined || opts.ifGenerationMatch !== undefined;
    const path = `${this.objectPath(src)}/moveTo/o/${encodeURIComponent(dest)}?${q}`;
    return this.guarded(async () => toWritten((await jsonCall<RawWritten>(this.t, `move ${src} to ${dest}`, { idempotent }, { method: 'POST', path }))!));
  }

  async patch(name: string, opts: Preconditions & { metadata?: Record<string, string | null>; contentType?: string }): Promise<WrittenObject> {
    const q = preconditionQuery(new URLSearchParams({ fields: WRITTEN_FIELDS }), opts);
    const body: Record<string, unknown> = {};
    if (opts.metadata !== undefined) body.metadata = opts.metadata;
    if (opts.contentType !== undefined) body.contentType = opts.contentType;
    // Setting the same values twice is the same result; only the metageneration would grow twice.
    const what = `patch ${name}`;
    return this.guarded(async () => toWritten((await jsonCall<RawWritten>(this.t, what, { idempotent: true }, { method: 'PATCH', path: `${this.objectPath(name)}?${q}`, body: JSON.stringify(body) }))!));
  }

  private async guarded<T>(fn: () => Promise<T>): Promise<T> {
    try {
      return await fn();
    } catch (err) {
      notePrecondition(this.t, err);
      throw err;
    }
  }

  private objectPath(name: string): string {
    return `${this.t.bucketPath}/o/${encodeURIComponent(name)}`;
  }

  private bucketName(): string {
    return decodeURIComponent(this.t.bucketPath.slice(this.t.bucketPath.lastIndexOf('/') + 1));
  }
}

// A Writes (the mount's write side) over an in-memory GCS, without FUSE: for name changes racing each
// other and closes, whose order a mount test cannot pin down. The fake keeps GCS's generations and
// preconditions (412), and can delay uploads so a close is in flight while another call runs.
import { mkdtempSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { crc32c } from '../../src/crc32c.js';
import { GcsError } from '../../src/gcs/errors.js';
import type { ObjectMeta, WrittenObject } from '../../src/gcs/object-client.js';
import { crc32cBase64 } from '../../src/gcs/uploads.js';
import { UploadSlots } from '../../src/writes/file-upload.js';
import { LocalChanges } from '../../src/writes/local-changes.js';
import { StagingDir } from '../../src/writes/staging.js';
import { UploadBuffers } from '../../src/writes/upload-buffers.js';
import { Writes } from '../../src/writes/writes.js';

export const sleep = (ms: number) => new Promise<void>((r) => setTimeout(r, ms));

/** What an object carries beside its bytes: content type, custom metadata, the kept fields (storageClass, ...). */
type Attrs = Record<string, unknown> & { contentType?: string; metadata?: Record<string, string> };

interface Stored {
  name: string;
  bytes: Buffer;
  generation: string;
  attrs: Attrs;
}

interface Session {
  name: string;
  opts: { ifGenerationMatch?: string };
  parts: Buffer[];
  cancelled: boolean;
}

let generations = 1000;

export class FakeGcs {
  readonly objs = new Map<string, Stored>();
  /** Each upload (and each chunk, up to this) waits this long first. */
  uploadDelayMs = 0;
  /** Uploads still to answer 412 after they committed (a retry of a call whose answer was lost). */
  loseAnswers = 0;
  /** Moves still to answer 404 after they moved (a retry of a call whose answer was lost). */
  loseMoveAnswers = 0;
  /** The attributes every upload was sent with, in order. */
  readonly uploadOpts: Record<string, unknown>[] = [];

  meta(o: Stored): WrittenObject {
    const { contentType, metadata, ...fields } = o.attrs;
    return { ...fields, name: o.name, size: o.bytes.length, generation: o.generation, metageneration: '1', updatedMs: Date.now(), crc32c: crc32cBase64(crc32c(o.bytes)), contentType: contentType ?? null, metadata: { ...metadata } };
  }

  /** Stores an object with the attributes `opts` names beside its preconditions, as an upload's resource. */
  put(name: string, bytes: Buffer | string, opts: Attrs & { ifGenerationMatch?: string } = {}): WrittenObject {
    const cur = this.objs.get(name);
    if (opts.ifGenerationMatch !== undefined && (cur?.generation ?? '0') !== opts.ifGenerationMatch) throw new GcsError('PRECONDITION', `412 ${name}`);
    const { ifGenerationMatch: _g, ifMetagenerationMatch: _m, ...attrs } = opts;
    const o = { name, bytes: Buffer.from(bytes), generation: String(++generations), attrs };
    this.objs.set(name, o);
    return this.meta(o);
  }

  text(name: string): string | undefined {
    return this.objs.get(name)?.bytes.toString();
  }

  /** The client Writes talks to (the calls the write side makes). */
  client() {
    const at = (name: string) => this.objs.get(name);
    return {
      uploadObject: async (name: string, bytes: Buffer, opts: { ifGenerationMatch?: string } = {}) => {
        await sleep(this.uploadDelayMs);
        this.uploadOpts.push(opts);
        const made = this.put(name, bytes, opts);
        if (this.loseAnswers > 0 && this.loseAnswers--) throw new GcsError('PRECONDITION', `412 ${name} (the retry of a call that did it)`);
        return made;
      },
      startUpload: async (name: string, opts: { ifGenerationMatch?: string }) => ({ name, url: `s${Math.random()}`, opts, parts: [], cancelled: false }) as Session,
      putChunk: async (s: Session, from: number, bytes: Buffer, { final }: { final?: { size: number } } = {}) => {
        await sleep(this.uploadDelayMs);
        if (s.cancelled) throw new GcsError('NOT_FOUND', 'session cancelled');
        const have = s.parts.reduce((n, p) => n + p.length, 0);
        if (from !== have) throw new GcsError('INVALID', `chunk at ${from}, session has ${have}`);
        s.parts.push(Buffer.from(bytes));
        if (!final) return { committed: from + bytes.length, object: null };
        return { committed: final.size, object: this.put(s.name, Buffer.concat(s.parts), s.opts) };
      },
      cancelUpload: async (s: Session) => void (s.cancelled = true),
      // As GCS's client answers a stat: what a read needs, not the written object's attributes.
      statObject: async (name: string): Promise<ObjectMeta | null> => {
        const o = at(name);
        if (!o) return null;
        const { contentType: _t, metadata: _m, ...meta } = this.meta(o);
        return meta;
      },
      deleteObject: async (name: string, opts: { ifGenerationMatch?: string } = {}) => {
        const o = at(name);
        if (!o) throw new GcsError('NOT_FOUND', `404 ${name}`);
        if (opts.ifGenerationMatch !== undefined && o.generation !== opts.ifGenerationMatch) throw new GcsError('PRECONDITION', `412 ${name}`);
        this.objs.delete(name);
      },
      moveObject: async (src: string, dest: string, opts: { ifSourceGenerationMatch?: string; ifGenerationMatch?: string }) => {
        const o = at(src);
        if (!o) throw new GcsError('NOT_FOUND', `404 ${src}`);
        if (opts.ifSourceGenerationMatch !== undefined && o.generation !== opts.ifSourceGenerationMatch) throw new GcsError('PRECONDITION', `412 ${src}`);
        if (opts.ifGenerationMatch !== undefined && (at(dest)?.generation ?? '0') !== opts.ifGenerationMatch) throw new GcsError('PRECONDITION', `412 ${dest}`);
        this.objs.delete(src);
        const made = this.put(dest, o.bytes, o.attrs);
        if (this.loseMoveAnswers > 0 && this.loseMoveAnswers--) throw new GcsError('NOT_FOUND', `404 ${src} (the retry of a move that did it)`);
        return made;
      },
      list: async ({ prefix }: { prefix: string }) => ({ objects: [...this.objs.values()].filter((o) => o.name.startsWith(prefix)).map((o) => this.meta(o)), nextPageToken: null }),
      patchMetadata: async (name: string) => this.meta(at(name)!),
      objectAttributes: async (name: string, generation: string) => {
        const o = at(name);
        return o && o.generation === generation ? this.meta(o) : null;
      },
    };
  }
}

/** A Writes over `gcs`, objects named by the path without its leading '/'; blocks read straight from the fake. */
export function fakeWrites(gcs: FakeGcs, blockSize = 1 << 20): Writes {
  const noop = () => undefined;
  const log = { info: noop, warn: noop, error: noop, debug: noop, trace: noop, child: () => log };
  const metrics = { inc: noop, setGauge: noop };
  const memory = { reserve: async () => ({ release: noop }), tryReserve: () => ({ release: noop }), addReclaimer: () => noop };
  const client = gcs.client();
  const namespace = {
    async lookup(path: string) {
      const m = await client.statObject(path.slice(1));
      if (m) return { kind: 'file', meta: m };
      const p = `${path.slice(1)}/`;
      for (const k of gcs.objs.keys()) if (k.startsWith(p)) return { kind: 'dir', mtimeMs: 0 };
      return null;
    },
    forget: noop,
  };
  const blocks = {
    blockSize,
    async get(meta: ObjectMeta, i: number) {
      const o = gcs.objs.get(meta.name);
      if (!o || o.generation !== meta.generation) throw new GcsError('NOT_FOUND', `404 ${meta.name}#${meta.generation}`);
      return { bytes: o.bytes.subarray(i * blockSize, (i + 1) * blockSize), release: noop };
    },
    adoptWritten: async () => 0,
  };
  const chunkBytes = 1 << 20;
  const deps = {
    client,
    names: { objectName: (p: string) => p.slice(1), dirPrefix: (p: string) => `${p.slice(1)}/` },
    appendTempPrefix: '.gcsmount_tmp/',
    namespace,
    changes: new LocalChanges(60_000, 100_000, noop),
    renameDirLimit: 100,
    createEmptyFile: false,
    config: { chunkBytes, streaming: true, maxChunksAhead: 1 },
    staging: StagingDir.open(mkdtempSync(join(tmpdir(), 'gcsmount-fake-writes-')), 'staging', log as never),
    blocks,
    slots: new UploadSlots(4),
    buffers: new UploadBuffers(memory as never, chunkBytes, 4, 1000, false),
    memory,
    log,
    metrics,
  };
  return new Writes(deps as never);
}

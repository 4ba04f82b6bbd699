/**
 * An append to a large object without sending the object again, as gcsfuse does it: the new tail goes to
 * GCS as a temporary object, and a compose of [the object's generation, the tail] replaces the object
 * under the same precondition a full upload would carry. Three small requests (upload, compose, delete)
 * instead of the whole file: `echo line >> big.log` on a 5 GiB log sent 5 GiB.
 *
 * Temporary objects live under TEMP_DIR in the mount's root; one a crash left behind is removed by
 * AppendTempSweeper once it is older than STALE_MS (gcsfuse sweeps its .gcsfuse_tmp/ the same way).
 */
import { randomBytes } from 'node:crypto';
import { crc32c, crc32cCombine } from '../crc32c.js';
import { GcsError } from '../gcs/errors.js';
import type { NewObjectAttrs, ObjectMeta, WritableObjectClient, WrittenObject } from '../gcs/object-client.js';
import { crc32cBase64 } from '../gcs/uploads.js';
import type { Logger } from '../observe/logger.js';
import type { Metrics } from '../observe/metrics.js';
import { isPrecondition } from './write-error.js';

/** Objects at least this large are appended to by compose (gcsfuse's threshold); smaller ones are sent whole. */
export const COMPOSE_APPEND_MIN_BYTES = 2 * 2 ** 20;
/** The largest tail sent in one request for a compose; a longer one is uploaded with the whole file. */
export const COMPOSE_APPEND_MAX_TAIL = 16 * 2 ** 20;
/** The folder of temporary tails, in the mount's root (the only objects gcsmount makes of its own). */
export const TEMP_DIR = '.gcsmount_tmp/';
/** A temporary tail older than this is one a crash left: swept. */
export const STALE_MS = 30 * 60_000;
/** A tail's name under the prefix: 16 hex digits, as tailName makes it (anything else there is not ours). */
const TAIL_NAME = /^[0-9a-f]{16}$/;

function tailName(prefix: string): string {
  return `${prefix}${randomBytes(8).toString('hex')}`;
}

export interface ComposeAppendDeps {
  client: WritableObjectClient;
  log: Logger;
  metrics: Metrics;
  /** TEMP_DIR under the mount's root prefix. */
  tempPrefix: string;
}

export interface ComposeAppend {
  /** The object name the file goes to. */
  name: string;
  /** The generation the file was opened on, whose bytes are the file's first `source.size` unchanged. */
  source: ObjectMeta;
  /** The bytes after them. */
  tail: Buffer;
  /** What the new generation carries (content type, metadata with the mtime, the kept fields). */
  attrs: NewObjectAttrs;
}

/** The CRC32C of `source`'s bytes followed by `tail`, as GCS reports it (base64, big-endian). */
function expectedCrc(source: ObjectMeta, tail: Buffer): string | null {
  if (source.crc32c === null) return null;
  const head = Buffer.from(source.crc32c, 'base64').readUInt32BE(0);
  return crc32cBase64(crc32cCombine(head, crc32c(tail), tail.length));
}

/** What a compose append did: `object`, the file's new generation; or `fallback`: upload the whole file (over `over`, when set). */
export type ComposeOutcome = { object: WrittenObject } | { fallback: true; over?: WrittenObject };

/**
 * Appends by compose. Falls back (the caller uploads the whole file) when compose could not make the
 * object: the tail not stored, a compose GCS refused (too many components, mixed storage classes), or
 * a composed object that is not the file's bytes (then `over` is it, the generation to replace). Throws
 * a precondition error when another writer replaced the object (the caller's ESTALE).
 */
export async function composeAppend(deps: ComposeAppendDeps, a: ComposeAppend): Promise<ComposeOutcome> {
  const want = expectedCrc(a.source, a.tail);
  if (want === null) return { fallback: true };
  const size = a.source.size + a.tail.length;
  const tempName = tailName(deps.tempPrefix);
  let temp: WrittenObject;
  try {
    temp = await deps.client.uploadObject(tempName, a.tail, { ifGenerationMatch: '0', ...(a.attrs.storageClass ? { storageClass: a.attrs.storageClass } : {}) });
  } catch (err) {
    deps.log.info({ object: a.name, err: String(err) }, 'append by compose: the tail could not be stored; the whole file is uploaded');
    return { fallback: true };
  }
  try {
    let composed: WrittenObject;
    try {
      composed = await deps.client.composeObjects([{ name: a.name, generation: a.source.generation }, { name: tempName, generation: temp.generation }], a.name, { ...a.attrs, ifGenerationMatch: a.source.generation });
    } catch (err) {
      if (!isPrecondition(err)) {
        deps.log.info({ object: a.name, err: String(err) }, 'append by compose refused; the whole file is uploaded');
        return { fallback: true };
      }
      // A compose whose answer was lost and that was sent again meets its own result: the object holds
      // the file's bytes then, and is ours.
      const now = await deps.client.statObject(a.name).catch(() => null);
      if (!now || now.size !== size || now.crc32c !== want || now.generation === a.source.generation) throw err;
      const attrs = await deps.client.objectAttributes(a.name, now.generation).catch(() => null);
      composed = { ...now, ...attrs, contentType: attrs?.contentType ?? null, metadata: attrs?.metadata ?? {} };
    }
    if (composed.size !== size || (composed.crc32c !== null && composed.crc32c !== want)) {
      deps.log.error({ object: a.name, size: composed.size, crc32c: composed.crc32c, want: { size, crc32c: want } }, 'append by compose made an object that is not the file: the whole file is uploaded over it');
      return { fallback: true, over: composed };
    }
    deps.metrics.inc('write_compose_appends');
    return { object: composed };
  } finally {
    await deps.client.deleteObject(tempName, { ifGenerationMatch: temp.generation }).catch((err: unknown) => {
      if (!(err instanceof GcsError && err.code === 'NOT_FOUND')) deps.log.warn({ object: tempName, err: String(err) }, 'a temporary tail could not be deleted: swept later');
    });
  }
}

/** How often the temporary tails are looked over (gcsfuse: every 10 minutes). */
const SWEEP_EVERY_MS = 10 * 60_000;

/**
 * Removes temporary tails older than STALE_MS under `tempPrefix` (a crash between a tail's upload and its
 * delete leaves one): every SWEEP_EVERY_MS, the first that long after the start (a tail left by the
 * daemon before this one is not stale before then anyway, and a start costs no listing). Only names
 * under that prefix and of a tail's form are ever deleted, each at the generation listed.
 */
export class AppendTempSweeper {
  private readonly timer: NodeJS.Timeout;
  private running: Promise<void> | null = null;
  private stopped = false;

  constructor(
    private readonly deps: ComposeAppendDeps,
    private readonly now: () => number = () => Date.now(),
  ) {
    this.timer = setInterval(() => void this.sweep(), SWEEP_EVERY_MS);
    this.timer.unref();
  }

  /** One pass (joined when one runs); failures are logged, never thrown. */
  sweep(): Promise<void> {
    this.running ??= this.once()
      .catch((err: unknown) => {
        // Stopping: the client closed under the pass, which the next daemon makes.
        if (!(err instanceof GcsError && err.code === 'CLOSED')) this.deps.log.warn({ prefix: this.deps.tempPrefix, err: String(err) }, 'temporary tails not swept');
      })
      .finally(() => (this.running = null));
    return this.running;
  }

  async close(): Promise<void> {
    this.stopped = true;
    clearInterval(this.timer);
    await this.running;
  }

  private async once(): Promise<void> {
    let pageToken: string | undefined;
    do {
      const page = await this.deps.client.list({ prefix: this.deps.tempPrefix, ...(pageToken ? { pageToken } : {}) });
      for (const o of page.objects) {
        if (this.stopped) return;
        // Only a name of the form gcsmount gives its tails: a file a user keeps in a folder of that name stays.
        if (!o.name.startsWith(this.deps.tempPrefix) || !TAIL_NAME.test(o.name.slice(this.deps.tempPrefix.length)) || this.now() - o.updatedMs < STALE_MS) continue;
        await this.deps.client.deleteObject(o.name, { ifGenerationMatch: o.generation }).then(
          () => this.deps.metrics.inc('write_temp_tails_swept'),
          (err: unknown) => this.deps.log.info({ object: o.name, err: String(err) }, 'a temporary tail could not be swept'),
        );
      }
      pageToken = page.nextPageToken ?? undefined;
    } while (pageToken && !this.stopped);
  }
}

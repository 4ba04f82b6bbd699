// What crosses between the main thread and a download worker (range-workers.ts, range-worker.ts): one
// attempt of a range GET out, its outcome back; or one upload request whose body the worker sends, and
// its answer back; or a block file to write, its outcome back with others'. Plain data only (structured
// clone); the body's bytes never cross: the worker copies a download into the shared block memory the
// job names, sends an upload from the shared chunk memory the job names, and writes a block file from
// the shared block memory the job names.
import type { Pool } from 'undici';
import type { BlockWriteStage } from '../block-file-write.js';
import { DeadlineError, StalledError } from './attempt-limits.js';
import type { ProxySettings } from './dispatcher.js';
import { GcsError, type GcsErrorCode } from './errors.js';

/** How a worker builds its connection pool: the main client's settings. */
export interface WorkerSetup {
  origin: string;
  poolOptions: Pool.Options;
  proxy: ProxySettings;
}

export interface RangeJob {
  kind: 'range';
  id: number;
  path: string;
  headers: Record<string, string>;
  /** The first byte asked for, and the object's size (a 200 is usable only as the whole object). */
  start: number;
  objectSize: number;
  /** Where the body goes: `length` bytes of `memory` from `offset`. */
  memory: SharedArrayBuffer;
  offset: number;
  length: number;
  what: string;
  stallMs: number;
  /** The retry deadline in milliseconds since the epoch (threads count performance.now() from different origins). */
  deadlineEpochMs: number;
  /**
   * When the body has landed whole: the CRC32C of these bytes of `memory` (the whole range, earlier
   * attempts' bytes included), computed on the worker so that the main thread need not hash them.
   */
  crcOf: { offset: number; length: number } | null;
}

/** What the attempt did beside its bytes, replayed on the main thread: stall observations, counters, warnings. */
export type WorkerEvent = ['observe', number] | ['inc', string, number] | ['warn', Record<string, unknown>, string];

export interface SerializedError {
  kind: 'stalled' | 'deadline' | 'gcs' | 'other';
  message: string;
  code?: string;
  status?: number | null;
  retryAfterSeconds?: number | null;
}

export interface RangeReply {
  kind: 'range';
  id: number;
  /** Bytes copied into the job's memory (also when it failed part-way: a retry resumes after them). */
  bytes: number;
  events: WorkerEvent[];
  error: SerializedError | null;
  /** The job's crcOf bytes' CRC32C; null when not asked or the attempt failed. */
  crc32c: number | null;
}

/** One upload request (a resumable session's chunk PUT) whose body is `length` bytes of `memory` from `offset`. */
export interface SendJob {
  kind: 'send';
  id: number;
  method: 'PUT';
  path: string;
  headers: Record<string, string>;
  memory: SharedArrayBuffer;
  offset: number;
  length: number;
}

/** Its answer, whole (answers to uploads are small: a 308, an object resource, an error). */
export interface SendReply {
  kind: 'send';
  id: number;
  statusCode: number;
  headers: Record<string, string | string[]>;
  text: string;
  error: SerializedError | null;
}

/**
 * A block file to write from shared memory (a body this worker, or another, received): the addon's
 * writeBlockFile (block-file-write.ts) with these arguments, run from the worker so that its completion
 * wakes the worker; the outcome comes back in a FilesReply.
 */
export interface FileJob {
  kind: 'file';
  id: number;
  tmp: string;
  final: string;
  memory: SharedArrayBuffer;
  offset: number;
  count: number;
  length: number;
  direct: boolean;
  mode: number;
}

/**
 * One block file write's outcome: `code` null when written and renamed, else the errno's name and the
 * stage that failed; stage 'worker': the worker could not run the write at all (the caller writes it).
 */
export interface FileOutcome {
  id: number;
  code: string | null;
  stage: BlockWriteStage | 'worker' | null;
}

/** The longest a block file write's outcome waits on a worker for a reply to go with. */
export const FILES_FLUSH_MS = 10;

/**
 * Block file writes done since the worker last posted: sent just before its next reply (the main thread
 * takes both in one wake-up) or, with none coming, FILES_FLUSH_MS after the first of them.
 */
export interface FilesReply {
  kind: 'files';
  done: FileOutcome[];
}

export type WorkerJob = RangeJob | SendJob | FileJob;
/** Sent once by a worker when its module has loaded: it can take work. */
export interface ReadyReply {
  kind: 'ready';
}

export type WorkerReply = RangeReply | SendReply | FilesReply | ReadyReply;

export function serializeError(err: unknown): SerializedError {
  const message = err instanceof Error ? err.message : String(err);
  if (err instanceof StalledError) return { kind: 'stalled', message };
  if (err instanceof DeadlineError) return { kind: 'deadline', message };
  if (err instanceof GcsError) return { kind: 'gcs', message, code: err.code, status: err.status, retryAfterSeconds: err.retryAfterSeconds };
  const code = (err as { code?: unknown }).code;
  return { kind: 'other', message, ...(typeof code === 'string' ? { code } : {}) };
}

/** The error as the retry policy must see it: the same class, code and status as where it was thrown. */
export function deserializeError(e: SerializedError, what: string): Error {
  const named = (err: Error): Error => Object.assign(err, { message: e.message });
  switch (e.kind) {
    case 'stalled':
      return named(new StalledError(what, 0));
    case 'deadline':
      return named(new DeadlineError(what));
    case 'gcs':
      return new GcsError(e.code as GcsErrorCode, e.message, e.status ?? null, e.retryAfterSeconds ?? null);
    default:
      return Object.assign(new Error(e.message), e.code !== undefined ? { code: e.code } : {});
  }
}

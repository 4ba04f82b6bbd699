// What the write modules are given by the HTTP client: its retry loop (limiter, concurrency, backoff,
// token refresh) and its connection pools, so writes share one request budget with reads.
import type { Dispatcher } from 'undici';
import type { Logger } from '../observe/logger.js';
import type { Metrics } from '../observe/metrics.js';
import { GcsError } from './errors.js';
import { KEPT_FIELDS, keptFieldsOf, type KeptField, type ReadPriority, type WrittenObject } from './object-client.js';
import { errorFromResponse, toMeta, type RawObject, type SentResponse } from './responses.js';

/** 'upload': resumable sessions and media (data sockets); 'write': small JSON writes (metadata sockets). */
export type WriteKind = 'upload' | 'write';

export interface SendRequest {
  method: Dispatcher.HttpMethod;
  /** Path and query on the endpoint's origin. */
  path: string;
  headers: Record<string, string>;
  body?: Buffer | string;
}

export interface RunOptions {
  /** false: a repeat could apply the write twice (no precondition), so only a 429 is retried. */
  idempotent: boolean;
  priority?: ReadPriority;
}

export interface Transport {
  /** `/storage/v1/b/BUCKET` */
  readonly bucketPath: string;
  readonly metrics: Metrics;
  readonly log: Logger;
  /** Runs `once` (one HTTP request per call) under the client's retry policy; `headers` carry auth. */
  run<T>(kind: WriteKind, what: string, opts: RunOptions, once: (headers: Record<string, string>) => Promise<T>): Promise<T>;
  /** One request; an upload whose body lies in shared memory is sent by a download worker where there are some. */
  send(kind: WriteKind, req: SendRequest): Promise<SentResponse>;
}

/** Every field a written object's resource has that WrittenObject keeps. */
export const WRITTEN_FIELDS = `name,size,generation,metageneration,updated,crc32c,contentType,metadata,${KEPT_FIELDS.join(',')}`;

export interface RawWritten extends RawObject, Partial<Record<KeptField, string>> {
  contentType?: string;
}

export function toWritten(raw: RawWritten): WrittenObject {
  return { ...toMeta(raw), contentType: raw.contentType ?? null, metadata: { ...(raw.metadata ?? {}) }, ...keptFieldsOf(raw) };
}

/**
 * One JSON request (a write), retried by the transport: resolves with the parsed body, or null for a
 * 204. Any other status becomes the GcsError for it (412: PRECONDITION, 404: NOT_FOUND).
 */
export async function jsonCall<T>(t: Transport, what: string, opts: RunOptions, req: Omit<SendRequest, 'headers'>): Promise<T | null> {
  return t.run('write', what, opts, async (headers) => {
    const h: Record<string, string> = { ...headers };
    if (req.body !== undefined) h['content-type'] = 'application/json; charset=UTF-8';
    const res = await t.send('write', { ...req, headers: h });
    if (res.statusCode === 204) {
      await res.body.dump();
      return null;
    }
    if (res.statusCode !== 200) throw await errorFromResponse(res, what);
    return (await res.body.json()) as T;
  });
}

/** Counts a 412 where it is recognised, so `gcsmount stats` shows write conflicts. */
export function notePrecondition(t: Transport, err: unknown): void {
  if (err instanceof GcsError && err.code === 'PRECONDITION') t.metrics.inc('gcs_precondition_failures');
}

import { Pool } from 'undici';
import type { Dispatcher } from 'undici';
import type { Logger } from '../observe/logger.js';
import type { Metrics, CounterName } from '../observe/metrics.js';
import type { AdaptiveConcurrency } from './adaptive-concurrency.js';
import type { AuthHeaders } from './auth.js';
import type { Endpoint } from './endpoint.js';
import { GcsError, codeForStatus } from './errors.js';
import type { BucketMeta, ListPage, ListRequest, ObjectClient, ObjectMeta } from './object-client.js';
import { retryDelay, type RetryPolicy } from './retry.js';

export interface HttpClientConfig {
  endpoint: Endpoint;
  bucket: string;
  auth: AuthHeaders | null;
  /** Sockets to the endpoint (gcsfuse's --max-conns-per-host); 0 = no limit. */
  maxConnections: number;
  /** Headers and body inactivity timeout (gcsfuse's --http-client-timeout); 0 = undici's own (300 s). */
  timeoutMs: number;
  retry: RetryPolicy;
  /** Shared by every request, shrinking on 429s; each attempt holds a slot, sleeps between them do not. */
  concurrency: AdaptiveConcurrency;
  log: Logger;
  metrics: Metrics;
}

type RequestKind = 'bucket' | 'list' | 'metadata' | 'media';

const KIND_COUNTER: Record<RequestKind, CounterName> = {
  bucket: 'gcs_requests_bucket',
  list: 'gcs_requests_list',
  metadata: 'gcs_requests_metadata',
  media: 'gcs_requests_media',
};

/** Only what the namespace and the block cache use: small responses, cheap to parse. */
const OBJECT_FIELDS = 'name,size,generation,metageneration,updated,crc32c';

interface RawObject {
  name: string;
  size: string;
  generation: string;
  metageneration?: string;
  updated?: string;
  crc32c?: string;
}

function toMeta(raw: RawObject): ObjectMeta {
  return {
    name: raw.name,
    size: Number(raw.size),
    generation: raw.generation,
    metageneration: raw.metageneration ?? '1',
    updatedMs: raw.updated ? Date.parse(raw.updated) : 0,
    crc32c: raw.crc32c ?? null,
  };
}

function retryAfterSeconds(header: string | string[] | undefined): number | null {
  const value = Array.isArray(header) ? header[0] : header;
  if (!value) return null;
  const secs = Number(value);
  if (Number.isFinite(secs)) return Math.max(0, secs);
  const date = Date.parse(value);
  return Number.isNaN(date) ? null : Math.max(0, (date - Date.now()) / 1000);
}

/** Network-level failures (resets, refused connections, timeouts) are all worth another attempt. */
function transportError(err: unknown, what: string): GcsError {
  if (err instanceof GcsError) return err;
  const code = (err as { code?: string }).code ?? 'ERR';
  const message = err instanceof Error ? err.message : String(err);
  return new GcsError('TRANSIENT', `${what}: ${code} ${message}`);
}

async function errorFromResponse(statusCode: number, headers: Dispatcher.ResponseData['headers'], body: Dispatcher.ResponseData['body'], what: string): Promise<GcsError> {
  let detail = '';
  try {
    const text = await body.text();
    const parsed = JSON.parse(text) as { error?: { message?: string } };
    detail = parsed.error?.message ?? text.slice(0, 200);
  } catch {
    // A body that is not JSON (or a broken socket) leaves only the status to report.
  }
  return new GcsError(codeForStatus(statusCode), `${what}: HTTP ${statusCode}${detail ? ` ${detail}` : ''}`, statusCode, retryAfterSeconds(headers['retry-after']));
}

export class HttpObjectClient implements ObjectClient {
  readonly bucket: string;
  private readonly pool: Pool;
  private readonly bucketPath: string;

  constructor(private readonly cfg: HttpClientConfig) {
    this.bucket = cfg.bucket;
    this.bucketPath = `/storage/v1/b/${encodeURIComponent(cfg.bucket)}`;
    this.pool = new Pool(cfg.endpoint.origin, {
      // gcsfuse's 0 means no limit; so does undici's null.
      connections: cfg.maxConnections > 0 ? cfg.maxConnections : null,
      pipelining: 1,
      keepAliveTimeout: 30_000,
      // 0 keeps undici's defaults (300 s without a byte): no connection may hang a reader forever.
      ...(cfg.timeoutMs > 0 ? { headersTimeout: cfg.timeoutMs, bodyTimeout: cfg.timeoutMs } : {}),
      connect: { timeout: cfg.timeoutMs || 30_000 },
    });
  }

  async close(): Promise<void> {
    await this.pool.close();
  }

  async getBucket(): Promise<BucketMeta> {
    return this.json<BucketMeta>('bucket', `${this.bucketPath}?fields=name`, `bucket ${this.bucket}`);
  }

  async statObject(name: string): Promise<ObjectMeta | null> {
    try {
      const raw = await this.json<RawObject>('metadata', `${this.objectPath(name)}?fields=${OBJECT_FIELDS}`, `stat ${name}`);
      return toMeta(raw);
    } catch (err) {
      if (err instanceof GcsError && err.code === 'NOT_FOUND') return null;
      throw err;
    }
  }

  async list(req: ListRequest): Promise<ListPage> {
    const q = new URLSearchParams({ prefix: req.prefix, fields: `items(${OBJECT_FIELDS}),prefixes,nextPageToken` });
    if (req.delimiter) q.set('delimiter', req.delimiter);
    if (req.pageToken) q.set('pageToken', req.pageToken);
    if (req.maxResults) q.set('maxResults', String(req.maxResults));
    const raw = await this.json<{ items?: RawObject[]; prefixes?: string[]; nextPageToken?: string }>('list', `${this.bucketPath}/o?${q}`, `list ${req.prefix}`);
    return { objects: (raw.items ?? []).map(toMeta), prefixes: raw.prefixes ?? [], nextPageToken: raw.nextPageToken ?? null };
  }

  async readRange(name: string, generation: string, start: number, end: number): Promise<Buffer> {
    const length = end - start;
    if (length <= 0) return Buffer.alloc(0);
    const what = `read ${name}#${generation} [${start}, ${end})`;
    const path = `${this.objectPath(name)}?alt=media&generation=${generation}`;
    return this.withRetry('media', what, async (headers) => {
      const res = await this.pool.request({ method: 'GET', path, headers: { ...headers, range: `bytes=${start}-${end - 1}` } });
      if (res.statusCode !== 206 && res.statusCode !== 200) throw await errorFromResponse(res.statusCode, res.headers, res.body, what);
      // A 200 means the server ignored the range and sends the whole object: skip to our window.
      const skip = res.statusCode === 200 ? start : 0;
      const out = Buffer.allocUnsafe(length);
      // 'data' events rather than `for await`: a promise per 64 KiB chunk is a large share of the CPU
      // a sequential read costs.
      const filled = await new Promise<number>((resolve, reject) => {
        let seen = 0;
        let got = 0;
        res.body.on('data', (chunk: Buffer) => {
          const from = Math.max(0, skip - seen);
          const take = Math.min(chunk.length - from, length - got);
          if (take > 0) {
            chunk.copy(out, got, from, from + take);
            got += take;
          }
          seen += chunk.length;
          if (got === length && res.statusCode === 200) {
            res.body.destroy();
            resolve(got);
          }
        });
        res.body.on('end', () => resolve(got));
        res.body.on('error', (err) => (got === length ? resolve(got) : reject(err)));
      });
      this.cfg.metrics.inc('gcs_media_bytes', filled);
      if (filled !== length) throw new GcsError('TRANSIENT', `${what}: body ended after ${filled} of ${length} bytes`);
      return out;
    });
  }

  private objectPath(name: string): string {
    return `${this.bucketPath}/o/${encodeURIComponent(name)}`;
  }

  private async json<T>(kind: RequestKind, path: string, what: string): Promise<T> {
    return this.withRetry(kind, what, async (headers) => {
      const res = await this.pool.request({ method: 'GET', path, headers });
      if (res.statusCode !== 200) throw await errorFromResponse(res.statusCode, res.headers, res.body, what);
      return (await res.body.json()) as T;
    });
  }

  private async withRetry<T>(kind: RequestKind, what: string, attemptOnce: (headers: Record<string, string>) => Promise<T>): Promise<T> {
    const { metrics, log, retry, concurrency } = this.cfg;
    for (let attempt = 1; ; attempt++) {
      await concurrency.acquire();
      metrics.inc(KIND_COUNTER[kind]);
      try {
        const headers = this.cfg.auth ? await this.cfg.auth() : {};
        const result = await attemptOnce(headers);
        concurrency.release('ok');
        return result;
      } catch (raw) {
        const err = transportError(raw, what);
        concurrency.release(err.status === 429 ? 'throttled' : 'failed');
        if (err.status === 429) metrics.inc('gcs_throttled');
        const delay = retryDelay(retry, attempt, err);
        if (delay === 'give-up') {
          // A 404 on a stat is an answer, not a failure: the caller decides.
          if (err.code !== 'NOT_FOUND') {
            metrics.inc('gcs_errors');
            log.warn({ kind, what, attempts: attempt, code: err.code, status: err.status }, `GCS request failed: ${err.message}`);
          }
          throw err;
        }
        metrics.inc('gcs_retries');
        // Every retry is logged with its object, range and attempt, so `grep 429` on the log finds them.
        log.info({ kind, what, attempt, status: err.status, delayMs: Math.round(delay) }, `GCS retry after ${err.message}`);
        await new Promise((r) => setTimeout(r, delay));
      }
    }
  }
}

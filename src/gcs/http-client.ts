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

function errorFromStatus(statusCode: number, retryAfter: string | string[] | undefined, bodyText: string, what: string): GcsError {
  let detail = '';
  try {
    const parsed = JSON.parse(bodyText) as { error?: { message?: string } };
    detail = parsed.error?.message ?? bodyText.slice(0, 200);
  } catch {
    detail = bodyText.slice(0, 200);
  }
  return new GcsError(codeForStatus(statusCode), `${what}: HTTP ${statusCode}${detail ? ` ${detail}` : ''}`, statusCode, retryAfterSeconds(retryAfter));
}

async function errorFromResponse(res: Dispatcher.ResponseData, what: string): Promise<GcsError> {
  // A broken socket while reading an error body leaves only the status to report.
  const text = await res.body.text().catch(() => '');
  return errorFromStatus(res.statusCode, res.headers['retry-after'], text, what);
}

/** An error body is read for its message, up to this much. */
const ERROR_BODY_LIMIT = 4096;

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

  async readRange(name: string, generation: string, start: number, end: number, into?: Buffer): Promise<Buffer> {
    const length = end - start;
    if (length <= 0) return Buffer.alloc(0);
    if (into && into.length < length) throw new RangeError(`readRange: ${into.length}-byte buffer for ${length} bytes`);
    const what = `read ${name}#${generation} [${start}, ${end})`;
    const path = `${this.objectPath(name)}?alt=media&generation=${generation}`;
    const out = into ?? Buffer.allocUnsafe(length);
    return this.withRetry('media', what, async (headers) => {
      const filled = await this.receiveRange(path, { ...headers, range: `bytes=${start}-${end - 1}` }, start, out.subarray(0, length), what);
      this.cfg.metrics.inc('gcs_media_bytes', filled);
      if (filled !== length) throw new GcsError('TRANSIENT', `${what}: body ended after ${filled} of ${length} bytes`);
      return out.subarray(0, length);
    });
  }

  /**
   * One range GET whose body is copied straight into `out` as it arrives; resolves with the bytes copied.
   * undici's dispatch API rather than `request()`: a readable stream and its events per 64 KiB chunk were
   * a measured share of the CPU that a cold sequential read costs.
   */
  private receiveRange(path: string, headers: Record<string, string>, start: number, out: Buffer, what: string): Promise<number> {
    return new Promise((resolve, reject) => {
      let status = 0;
      let retryAfter: string | string[] | undefined;
      let errorText = '';
      // A 200 means the server ignored the range and sends the whole object: skip to our window.
      let skip = 0;
      let seen = 0;
      let got = 0;
      let settled = false;
      let wrongRange: string | null = null;
      const ranged = () => status === 200 || status === 206;
      const settle = (err: Error | null): void => {
        if (settled) return;
        settled = true;
        if (err) reject(err);
        else resolve(got);
      };
      this.pool.dispatch(
        { method: 'GET', path, headers },
        {
          onRequestStart: () => undefined,
          onResponseStart: (_controller, statusCode, resHeaders) => {
            status = statusCode;
            retryAfter = resHeaders['retry-after'];
            skip = statusCode === 200 ? start : 0;
            if (statusCode === 206) {
              // Bytes of another range would be served as ours: the one check a 206 body cannot make itself.
              const sent = String(resHeaders['content-range'] ?? '');
              const m = /^bytes (\d+)-(\d+)\//.exec(sent);
              if (!m || Number(m[1]) !== start || Number(m[2]) !== start + out.length - 1) wrongRange = sent || '(none)';
            }
          },
          onResponseData: (controller, chunk) => {
            if (wrongRange !== null) return;
            if (!ranged()) {
              if (errorText.length < ERROR_BODY_LIMIT) errorText += chunk.toString('utf8');
              return;
            }
            const from = Math.max(0, skip - seen);
            const take = Math.min(chunk.length - from, out.length - got);
            if (take > 0) {
              chunk.copy(out, got, from, from + take);
              got += take;
            }
            seen += chunk.length;
            if (got === out.length && status === 200) {
              settle(null);
              controller.abort(new Error('rest of an unranged response not needed'));
            }
          },
          onResponseEnd: () => {
            if (wrongRange !== null) settle(new GcsError('CORRUPT', `${what}: the server sent Content-Range ${wrongRange}`));
            else settle(ranged() ? null : errorFromStatus(status, retryAfter, errorText, what));
          },
          // A connection that breaks after the last byte has still delivered the range.
          onResponseError: (_controller, err) => settle(ranged() && wrongRange === null && got === out.length ? null : err),
        },
      );
    });
  }

  private objectPath(name: string): string {
    return `${this.bucketPath}/o/${encodeURIComponent(name)}`;
  }

  private async json<T>(kind: RequestKind, path: string, what: string): Promise<T> {
    return this.withRetry(kind, what, async (headers) => {
      const res = await this.pool.request({ method: 'GET', path, headers });
      if (res.statusCode !== 200) throw await errorFromResponse(res, what);
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

import { setTimeout as sleep } from 'node:timers/promises';
import type { Dispatcher, Pool } from 'undici';
import type { Logger } from '../observe/logger.js';
import type { Metrics, CounterName } from '../observe/metrics.js';
import type { AdaptiveConcurrency } from './adaptive-concurrency.js';
import type { AuthHeaders } from './auth.js';
import type { Endpoint } from './endpoint.js';
import { StalledError, watchSilence, type AttemptLimits } from './attempt-limits.js';
import { ByteRate } from './byte-rate.js';
import { dispatcherFor, proxySettings, redactedProxy } from './dispatcher.js';
import { GcsError } from './errors.js';
import { OBJECT_FIELDS, errorFromResponse, toMeta, transportError, type RawObject } from './responses.js';
import { KEPT_FIELDS, keptFieldsOf } from './object-client.js';
import type {
  FinalChunk,
  KeptField,
  ListPage,
  ListRequest,
  NewObjectAttrs,
  ObjectMeta,
  ObjectVersion,
  Preconditions,
  RangeHash,
  ReadPriority,
  UploadProgress,
  UploadSession,
  WritableObjectClient,
  WrittenObject,
} from './object-client.js';
import { ObjectWrites } from './object-writes.js';
import { receiveRange, type RangeConnection } from './range-body.js';
import { RangeWorkers, type ReceivedRange } from './range-workers.js';
import type { WorkersInUseLimits } from './workers-in-use.js';
import type { RateGrant, RequestRate } from './request-rate.js';
import { retryDelay, type RetryPolicy } from './retry.js';
import { sendTimeoutMs } from './upload-body.js';

export { transportError } from './responses.js';
export { proxySettings, type ProxySettings } from './dispatcher.js';
import type { StallTimeout } from './stall-timeout.js';
import type { Transport, WriteKind } from './transport.js';
import { ResumableUploads } from './uploads.js';

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
  /**
   * Requests per second, shared by every request; each attempt takes a token first. When set, 429s cut
   * the rate, not the concurrency. Absent: no rate limit (tools and benchmarks).
   */
  rate?: RequestRate | null;
  /** Cuts an attempt whose headers or body stay silent longer than this (gcsfuse's read-stall retry). */
  stall?: StallTimeout | null;
  /** The longest one read or lookup keeps retrying before it fails (gcsfuse's --max-retry-duration); 0 = no bound. */
  maxRetryDurationMs?: number;
  /** The flag that sets maxRetryDurationMs, named when a request gives up on it. */
  retryBoundFlag?: string;
  /**
   * Lookups and listings get sockets and an in-flight limit of their own, so they never queue behind
   * range GETs that fill --max-conns-per-host (a lookup behind four 4 MiB readahead downloads waited for
   * one to end). Absent: they share the data pool.
   */
  metadata?: { connections: number; concurrency: AdaptiveConcurrency } | null;
  log: Logger;
  metrics: Metrics;
  /** Where HTTP_PROXY, HTTPS_PROXY and NO_PROXY are read (and their lowercase forms); default process.env. */
  env?: NodeJS.ProcessEnv;
  /**
   * Threads that receive range GETs' bodies into shared block memory (range-workers.ts); 0 or absent:
   * bodies are received on the calling thread.
   */
  downloadWorkers?: number;
  /** When more of them are put to use (workers-in-use.ts); tests set it, the mount keeps the default. */
  workersInUse?: WorkersInUseLimits;
  /**
   * The project billed for every request (gcsfuse's --billing-project): sent as `userProject`, which a
   * Requester Pays bucket demands of each request. Empty or absent: none sent.
   */
  billingProject?: string;
  /** Sent with every request: `gcsmount/VERSION`, and gcsfuse's --app-name after it when set. */
  userAgent?: string;
  /** Bytes per second all range reads together may take (gcsfuse's --limit-bytes-per-sec); absent or <= 0: no limit. */
  limitBytesPerSec?: number;
  /** The largest range read the mount makes (a block, a whole small object): the bandwidth bucket holds at least this. */
  largestReadBytes?: number;
}

const URGENT: ReadPriority = { priority: 'urgent' };

type RequestKind = 'bucket' | 'list' | 'metadata' | 'media' | WriteKind;

const KIND_COUNTER: Record<RequestKind, CounterName> = {
  bucket: 'gcs_requests_bucket',
  list: 'gcs_requests_list',
  metadata: 'gcs_requests_metadata',
  media: 'gcs_requests_media',
  upload: 'gcs_requests_upload',
  write: 'gcs_requests_write',
};

/** Uploads carry data: they share the data sockets and in-flight limit with range GETs. */
const DATA_KINDS: ReadonlySet<RequestKind> = new Set(['media', 'upload']);

export class HttpObjectClient implements WritableObjectClient {
  readonly bucket: string;
  private readonly pool: Dispatcher;
  /** Sockets for JSON requests (lookups, listings): the data pool unless `metadata` is configured. */
  private readonly metaPool: Dispatcher;
  private readonly origin: string;
  private readonly bucketPath: string;
  /** Set by close(): from then on a failure is the shutdown's doing, never retried or reported as GCS's. */
  private closing = false;
  /** Ends the sleeps between attempts when close() is called: a stop does not wait out a backoff. */
  private readonly stopSleeping = new AbortController();
  private readonly uploads: ResumableUploads;
  private readonly writes: ObjectWrites;
  /** What a range download's body handling borrows: the data pool, and where stalls are told. */
  private readonly media: RangeConnection;
  /** Download workers, when configured: range GETs into shared memory run there. */
  readonly workers: RangeWorkers | null;
  /** --limit-bytes-per-sec: what range reads may take together; null: no limit. */
  readonly bandwidth: ByteRate | null;

  constructor(private readonly cfg: HttpClientConfig) {
    this.bucket = cfg.bucket;
    this.origin = cfg.endpoint.origin;
    this.bucketPath = `/storage/v1/b/${encodeURIComponent(cfg.bucket)}`;
    this.bandwidth = cfg.limitBytesPerSec !== undefined && cfg.limitBytesPerSec > 0 ? new ByteRate({ bytesPerSecond: cfg.limitBytesPerSec, minCapacity: cfg.largestReadBytes ?? 0 }) : null;
    const proxy = proxySettings(cfg.env ?? process.env);
    const options = (connections: number): Pool.Options => ({
      // gcsfuse's 0 means no limit; so does undici's null.
      connections: connections > 0 ? connections : null,
      pipelining: 1,
      keepAliveTimeout: 30_000,
      // 0 keeps undici's defaults (300 s without a byte): no connection may hang a reader forever.
      ...(cfg.timeoutMs > 0 ? { headersTimeout: cfg.timeoutMs, bodyTimeout: cfg.timeoutMs } : {}),
      // A connection GCS does not take within 30 s (or a shorter --http-client-timeout) is not coming.
      connect: { timeout: cfg.timeoutMs > 0 ? Math.min(cfg.timeoutMs, 30_000) : 30_000 },
    });
    this.pool = dispatcherFor(this.origin, options(cfg.maxConnections), proxy);
    this.metaPool = cfg.metadata ? dispatcherFor(this.origin, options(cfg.metadata.connections), proxy) : this.pool;
    this.media = { pool: this.pool, origin: this.origin, stall: cfg.stall ?? null, metrics: cfg.metrics, log: cfg.log };
    // Each worker's pool takes an equal share of the data sockets; the main thread's concurrency limit
    // still bounds what is in flight across all of them.
    const workers = cfg.downloadWorkers ?? 0;
    const share = cfg.maxConnections > 0 ? Math.max(1, Math.ceil(cfg.maxConnections / Math.max(1, workers))) : 0;
    this.workers = workers > 0 ? new RangeWorkers(workers, { origin: this.origin, poolOptions: options(share), proxy }, this.media, cfg.workersInUse) : null;
    if (proxy.httpProxy || proxy.httpsProxy) {
      cfg.log.debug(
        { httpProxy: proxy.httpProxy && redactedProxy(proxy.httpProxy), httpsProxy: proxy.httpsProxy && redactedProxy(proxy.httpsProxy), noProxy: proxy.noProxy },
        'proxy variables set: requests go through the proxy unless NO_PROXY names the endpoint',
      );
    }
    const transport: Transport = {
      bucketPath: this.bucketPath,
      metrics: cfg.metrics,
      log: cfg.log,
      run: (kind, what, opts, once) => this.withRetry(kind, what, opts.priority ?? URGENT, (headers) => once(headers), opts.idempotent),
      send: (kind, req) => {
        // An upload chunk in shared memory is sent by a download worker: the socket's copy (and TLS) off
        // the main thread, which otherwise spent half its time per written GiB there.
        if (kind === 'upload' && this.workers && Buffer.isBuffer(req.body) && req.method === 'PUT') {
          const sent = this.workers.send({ method: 'PUT', path: this.billed(req.path), headers: req.headers, body: req.body }, `PUT ${req.path}`);
          if (sent) return sent;
        }
        const path = this.billed(req.path);
        if (!Buffer.isBuffer(req.body)) return (DATA_KINDS.has(kind) ? this.pool : this.metaPool).request({ origin: this.origin, ...req, path });
        const headersTimeout = sendTimeoutMs(this.cfg.timeoutMs, req.body.length);
        return (DATA_KINDS.has(kind) ? this.pool : this.metaPool).request({ origin: this.origin, ...req, path, ...(headersTimeout ? { headersTimeout } : {}) });
      },
    };
    this.uploads = new ResumableUploads(transport);
    this.writes = new ObjectWrites(transport);
  }

  // Writes (ObjectWriter): the modules above do the protocol; this client lends them its retries and pools.
  startUpload(name: string, opts?: Preconditions & NewObjectAttrs): Promise<UploadSession> { return this.uploads.start(name, opts); }
  putChunk(s: UploadSession, offset: number, bytes: Buffer, opts?: { final?: FinalChunk; priority?: ReadPriority }): Promise<UploadProgress> { return this.uploads.putChunk(s, offset, bytes, opts); }
  uploadStatus(s: UploadSession): Promise<UploadProgress> { return this.uploads.status(s); }
  cancelUpload(s: UploadSession): Promise<void> { return this.uploads.cancel(s); }
  uploadObject(name: string, bytes: Buffer, opts?: Preconditions & NewObjectAttrs): Promise<WrittenObject> { return this.writes.upload(name, bytes, opts); }
  deleteObject(name: string, opts?: Pick<Preconditions, 'ifGenerationMatch'>): Promise<void> { return this.writes.delete(name, opts); }
  copyObject(src: string, dest: string, opts?: Preconditions & NewObjectAttrs & { ifSourceGenerationMatch?: string }): Promise<WrittenObject> { return this.writes.copy(src, dest, opts); }
  composeObjects(sources: Array<{ name: string; generation?: string }>, dest: string, opts?: Preconditions & NewObjectAttrs): Promise<WrittenObject> { return this.writes.compose(sources, dest, opts); }
  moveObject(src: string, dest: string, opts?: Preconditions & { ifSourceGenerationMatch?: string }): Promise<WrittenObject> { return this.writes.move(src, dest, opts); }
  patchMetadata(name: string, opts: Preconditions & { metadata?: Record<string, string | null>; contentType?: string }): Promise<WrittenObject> { return this.writes.patch(name, opts); }

  async close(): Promise<void> {
    this.closing = true;
    this.stopSleeping.abort();
    this.bandwidth?.close(new GcsError('CLOSED', 'client closed while a read waited for --limit-bytes-per-sec'));
    if (this.workers) {
      await this.workers.close();
      this.cfg.log.debug('stopping: download workers ended');
    }
    // Destroyed, not closed: undici's close() waits for requests in flight, and a stalled prefetch
    // or a retry under faults would hold a stopping daemon for its whole timeout. Nobody waits for
    // their answers any more (writes drained before this), and their callers see CLOSED.
    await this.pool.destroy();
    if (this.metaPool !== this.pool) await this.metaPool.destroy();
  }

  /**
   * Proves the bucket exists and the credentials may read it, with the permission a read-only mount
   * needs anyway (storage.objects.list): 404 = no such bucket, 401/403 = credentials.
   */
  async probeBucket(): Promise<void> {
    // Counted as the bucket check it is (gcs_requests_bucket), not as a listing the namespace made.
    await this.json<unknown>('bucket', `${this.bucketPath}/o?maxResults=1&fields=nextPageToken`, `bucket ${this.bucket}`);
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

  async objectAttributes(name: string, generation: string): Promise<NewObjectAttrs | null> {
    try {
      const q = new URLSearchParams({ generation, fields: `contentType,metadata,${KEPT_FIELDS.join(',')}` });
      const raw = await this.json<{ contentType?: string; metadata?: Record<string, string> } & Partial<Record<KeptField, string>>>('metadata', `${this.objectPath(name)}?${q}`, `attributes of ${name}#${generation}`);
      return { ...(raw.contentType ? { contentType: raw.contentType } : {}), ...keptFieldsOf(raw), metadata: raw.metadata ?? {} };
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
    if (req.startOffset) q.set('startOffset', req.startOffset);
    if (req.endOffset) q.set('endOffset', req.endOffset);
    const raw = await this.json<{ items?: RawObject[]; prefixes?: string[]; nextPageToken?: string }>('list', `${this.bucketPath}/o?${q}`, `list ${req.prefix}`);
    return { objects: (raw.items ?? []).map(toMeta), prefixes: raw.prefixes ?? [], nextPageToken: raw.nextPageToken ?? null };
  }

  async readRange(object: ObjectVersion, start: number, end: number, into?: Buffer, priority: ReadPriority = URGENT, hash?: RangeHash): Promise<Buffer> {
    const { name, generation } = object;
    const length = end - start;
    if (length <= 0) return Buffer.alloc(0);
    if (into && into.length < length) throw new RangeError(`readRange: ${into.length}-byte buffer for ${length} bytes`);
    const what = `read ${name}#${generation} [${start}, ${end})`;
    const path = this.billed(`${this.objectPath(name)}?alt=media&generation=${generation}`);
    const out = (into ?? Buffer.allocUnsafe(length)).subarray(0, length);
    // Taken once for the whole range: a resumed attempt fetches only what had not arrived.
    if (this.bandwidth) {
      const waitedMs = await this.bandwidth.acquire(length, priority);
      if (waitedMs > 0) {
        this.cfg.metrics.inc('gcs_bandwidth_waits');
        this.cfg.metrics.inc('gcs_bandwidth_wait_ms', Math.round(waitedMs));
      }
    }
    // Bytes already in `out`: a cut attempt (stall, reset, short body) is resumed from the next byte, by
    // Range, on the same generation, so what arrived is never fetched twice.
    let done = 0;
    // Accept-Encoding: gzip turns off GCS's decompressive transcoding, which would send a gzip-encoded
    // object decompressed, whole, with Range ignored. Its stored bytes are served, as gcsfuse does
    // (ReadCompressed): the file's size is the stored size. The dispatch API never decompresses.
    return this.withRetry('media', what, priority, async (headers, limits) => {
      if (done > 0) {
        this.cfg.metrics.inc('gcs_resumed_reads');
        this.cfg.log.info({ what, from: start + done }, 'GCS read resumed from the last byte received');
      }
      const got: ReceivedRange = { bytes: 0 };
      try {
        const rangeHeaders = { ...headers, range: `bytes=${start + done}-${end - 1}`, 'accept-encoding': 'gzip' };
        // The attempt that completes the range hashes all of it, earlier attempts' bytes included.
        if (this.workers) await this.workers.receive(path, rangeHeaders, start + done, object.size, out.subarray(done), what, limits, got, hash ? out : null);
        else await receiveRange(this.media, path, rangeHeaders, start + done, object.size, out.subarray(done), what, limits, got);
      } finally {
        done += got.bytes;
        this.cfg.metrics.inc('gcs_media_bytes', got.bytes);
      }
      if (done !== length) throw new GcsError('TRANSIENT', `${what}: body ended after ${done} of ${length} bytes`);
      if (hash && got.crc32c !== undefined) hash.crc32c = got.crc32c;
      return out;
    });
  }

  private objectPath(name: string): string {
    return `${this.bucketPath}/o/${encodeURIComponent(name)}`;
  }

  /**
   * The path with the billed project's `userProject`, added here where every request leaves (reads,
   * listings, writes, upload sessions), so no request of a Requester Pays bucket can go without it.
   */
  private billed(path: string): string {
    const project = this.cfg.billingProject;
    if (!project || /[?&]userProject=/.test(path)) return path;
    return `${path}${path.includes('?') ? '&' : '?'}userProject=${encodeURIComponent(project)}`;
  }

  private async json<T>(kind: RequestKind, path: string, what: string): Promise<T> {
    return this.withRetry(kind, what, URGENT, async (headers, limits) => {
      // A JSON answer is small: the stall timeout bounds the whole of it, headers and body.
      const abort = new AbortController();
      let cutBy: GcsError | null = null;
      const sentAt = performance.now();
      const silence = watchSilence(limits, what, (err, silentMs) => {
        cutBy = err;
        if (err instanceof StalledError) {
          this.cfg.stall?.observe(silentMs);
          this.cfg.metrics.inc('gcs_stalls');
          this.cfg.log.warn({ what, silentMs: Math.round(silentMs) }, 'GCS request stalled: cutting it and retrying');
        }
        abort.abort(err);
      });
      try {
        const res = await this.metaPool.request({ origin: this.origin, method: 'GET', path: this.billed(path), headers, signal: abort.signal });
        this.cfg.stall?.observe(performance.now() - sentAt);
        if (res.statusCode !== 200) throw await errorFromResponse(res, what);
        return (await res.body.json()) as T;
      } catch (err) {
        throw cutBy ?? err;
      } finally {
        silence.stop();
      }
    });
  }

  private async withRetry<T>(
    kind: RequestKind,
    what: string,
    priority: ReadPriority,
    attemptOnce: (headers: Record<string, string>, limits: AttemptLimits) => Promise<T>,
    /** false: a repeat could apply a write twice, so only a 429 (nothing done) is retried. */
    idempotent = true,
  ): Promise<T> {
    const { metrics, log, retry, rate } = this.cfg;
    const concurrency = !DATA_KINDS.has(kind) && this.cfg.metadata ? this.cfg.metadata.concurrency : this.cfg.concurrency;
    const bound = this.cfg.maxRetryDurationMs ?? 0;
    const boundFlag = this.cfg.retryBoundFlag ?? '--max-retry-duration';
    let deadlineAt = Number.POSITIVE_INFINITY;
    let lastStatus: number | null = null;
    let stalls = 0;
    let tokenRefreshed = false;
    let refreshToken = false;
    /** The Authorization the last attempt sent, and the one a 401 refused. */
    let sentAuth: string | undefined;
    let refusedAuth: string | undefined;
    for (let attempt = 1; ; attempt++) {
      if (this.closing) throw new GcsError('CLOSED', `${what}: client closed`);
      const grant: RateGrant | null = rate ? await rate.acquire(priority) : null;
      if (grant && grant.waitedMs > 0) {
        metrics.inc('gcs_rate_waits');
        metrics.inc('gcs_rate_wait_ms', Math.round(grant.waitedMs));
      }
      // The bound starts with the first attempt: waiting for the first token is queueing, not retrying.
      if (attempt === 1 && bound > 0) deadlineAt = performance.now() + bound;
      await concurrency.acquire();
      metrics.inc(KIND_COUNTER[kind]);
      try {
        const authHeaders = this.cfg.auth ? await this.cfg.auth(refreshToken ? { fresh: true, refused: refusedAuth } : undefined) : {};
        sentAuth = authHeaders.authorization;
        const headers = this.cfg.userAgent ? { ...authHeaders, 'user-agent': this.cfg.userAgent } : authHeaders;
        refreshToken = false;
        const stallMs = this.cfg.stall ? this.cfg.stall.forRetry(stalls) : Number.POSITIVE_INFINITY;
        const result = await attemptOnce(headers, { stallMs, deadlineAt });
        concurrency.release('ok');
        if (grant) rate!.succeeded(grant);
        return result;
      } catch (raw) {
        const caught = transportError(raw, what);
        // A connection that breaks once close() has begun breaks because of it (an HTTP answer stands).
        const err = this.closing && !(raw instanceof GcsError) && caught.code !== 'CLOSED' ? new GcsError('CLOSED', `${what}: client closed (${caught.message})`) : caught;
        if (err.code === 'CLOSED') {
          concurrency.release('failed');
          log.debug({ kind, what }, 'GCS request abandoned: the client is closing');
          throw err;
        }
        if (err.status !== null) lastStatus = err.status;
        const throttled = err.status === 429;
        // With a rate limiter, a 429 cuts the rate; the concurrency limit is only a cap then.
        concurrency.release(throttled && !rate ? 'throttled' : 'failed');
        if (grant) {
          if (throttled && rate!.throttled(grant, err.retryAfterSeconds)) {
            metrics.inc('gcs_rate_cuts');
            log.info({ what, rate: Math.round(rate!.rate * 10) / 10, retryAfterSeconds: err.retryAfterSeconds }, 'GCS answered 429: request rate cut');
          }
          else if (err.status !== null && err.status < 500) rate!.succeeded(grant);
        }
        if (throttled) metrics.inc('gcs_throttled');
        // A token can expire or be revoked before its stated expiry: one more try with a fresh one
        // (as Google's client libraries do), at once and outside the retry budget.
        if (err.code === 'UNAUTHENTICATED' && this.cfg.auth && !tokenRefreshed) {
          tokenRefreshed = true;
          refreshToken = true;
          refusedAuth = sentAuth;
          attempt--;
          metrics.inc('gcs_retries');
          log.info({ kind, what, status: err.status }, `GCS retry with a fresh token after ${err.message}`);
          continue;
        }
        const policy = idempotent || throttled ? retryDelay(retry, attempt, err) : 'give-up';
        // A stalled response is cut to be resumed now: the server is not overloaded, one connection is stuck.
        if (err instanceof StalledError) stalls++;
        const delay = policy !== 'give-up' && err instanceof StalledError ? 0 : policy;
        if (delay !== 'give-up' && performance.now() + delay >= deadlineAt) {
          metrics.inc('gcs_errors');
          metrics.inc('gcs_retry_deadline_exceeded');
          log.error(
            { kind, what, attempts: attempt, lastStatus, maxRetryDurationMs: bound, error: err.message },
            `GCS request gave up after ${boundFlag} (${bound} ms), last status ${lastStatus ?? 'none (no answer)'}`,
          );
          throw new GcsError(err.code, `${what}: gave up after ${boundFlag} ${bound} ms (${attempt} attempts, last status ${lastStatus ?? 'none'}): ${err.message}`, err.status, err.retryAfterSeconds);
        }
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
        await sleep(delay, undefined, { signal: this.stopSleeping.signal }).catch(() => undefined);
        if (this.closing) throw new GcsError('CLOSED', `${what}: client closed while waiting to retry`);
      }
    }
  }
}

import { AdaptiveConcurrency } from '../gcs/adaptive-concurrency.js';
import { resolveAuth, type AuthHeaders, type CredentialSource } from '../gcs/auth.js';
import { resolveEndpoint, type Endpoint } from '../gcs/endpoint.js';
import { HttpObjectClient, type HttpClientConfig } from '../gcs/http-client.js';
import { checkKeyFile } from '../gcs/key-file.js';
import { parseTokenUrl } from '../gcs/token-url.js';
import { requestRateForFlags } from '../gcs/request-rate.js';
import { DEFAULT_RETRY } from '../gcs/retry.js';
import { StallTimeout } from '../gcs/stall-timeout.js';
import type { Logger } from '../observe/logger.js';
import type { Metrics } from '../observe/metrics.js';
import { VERSION } from '../version.js';
import { EXIT, UserError } from './exit.js';
import type { MountOptions } from './options.js';

/**
 * gcsfuse's --max-conns-per-host 0 means "no limit"; requests in flight still need a ceiling for the
 * adaptive limit to halve from on a 429. gcsfuse keeps up to 100 idle connections by default.
 */
const UNLIMITED_CONNECTIONS_CEILING = 100;
/** The longest sleep between two tries of the start-up bucket check: a start should follow a recovery soon. */
const STARTUP_CHECK_MAX_SLEEP_MS = 5_000;

/** Where GCS is answered, with which credentials, and how the mount names itself. */
export interface GcsAccess {
  endpoint: Endpoint;
  auth: AuthHeaders | null;
  userAgent: string;
}

/**
 * gcsfuse's form: its name and version, then the --app-name the user gave (GCS's logs show it). Runs of
 * white space become one space; a name HTTP cannot carry is a usage error (undici refused every request
 * with it, which the bucket check retried as transient for its whole timeout).
 */
export function userAgentFor(appName: string): string {
  const name = appName.trim().replace(/\s+/g, ' ');
  if (!/^[\x20-\x7e]*$/.test(name)) throw new UserError(`--app-name ${JSON.stringify(appName)}: only printable ASCII can go into a User-Agent`, EXIT.usage);
  return `gcsmount/${VERSION}${name ? ` ${name}` : ''}`;
}

function credentialSource(opts: MountOptions, customEndpoint: boolean): CredentialSource {
  const v = opts.values;
  // Checked even where it goes unused (a custom endpoint, --anonymous-access): a corrupt key given on
  // purpose is a mistake to report, never a reason to carry on without credentials.
  if (v['key-file']) checkKeyFile(v['key-file']);
  if (v['anonymous-access']) return { kind: 'none' };
  // A key file wins over a token URL, as in gcsfuse. A token URL is used with a custom endpoint too:
  // a token service is set up for the endpoint the mount uses, unlike the ambient credentials below.
  if (v['token-url'] && !v['key-file']) {
    try {
      parseTokenUrl(v['token-url']);
    } catch (err) {
      throw new UserError((err as Error).message, EXIT.usage);
    }
    return { kind: 'token-url', url: v['token-url'], reuse: v['reuse-token-from-url'] };
  }
  if (customEndpoint) return { kind: 'none' };
  if (v['key-file']) return { kind: 'key-file', path: v['key-file'] };
  return { kind: 'default' };
}

/**
 * The endpoint (a bad --custom-endpoint is a usage error) and the credentials that go with it. A token
 * service that is not up yet (a sidecar starting beside the mount) is waited for as the bucket check
 * waits for a throttled bucket: within --startup-check-timeout, or until `abort`.
 */
export async function gcsAccess(opts: MountOptions, abort?: AbortSignal): Promise<GcsAccess> {
  let endpoint;
  try {
    endpoint = resolveEndpoint(opts.values['custom-endpoint'] || undefined, process.env);
  } catch (err) {
    throw new UserError((err as Error).message, EXIT.usage);
  }
  const userAgent = userAgentFor(opts.values['app-name']);
  const auth = await resolveAuth(credentialSource(opts, endpoint.custom), { startupMs: opts.values['startup-check-timeout'], abort, userAgent });
  return { endpoint, auth, userAgent };
}

/** The GCS client's config from the flags: connections, retries, request rate, stall timeouts; their gauges. */
export function gcsClientConfig(opts: MountOptions, access: GcsAccess, log: Logger, metrics: Metrics): HttpClientConfig {
  const v = opts.values;
  const maxConnections = v['max-conns-per-host'] > 0 ? v['max-conns-per-host'] : 0;
  const concurrency = new AdaptiveConcurrency({ max: maxConnections || UNLIMITED_CONNECTIONS_CEILING, min: 1, cooldownMs: 1000 });
  metrics.setGauge('gcs_concurrency_limit', () => concurrency.current);
  const rate = requestRateForFlags(v['initial-ops-per-sec'], v['limit-ops-per-sec']);
  if (rate) {
    metrics.setGauge('gcs_rate_limit', () => Math.round(rate.rate * 10) / 10);
    metrics.setGauge('gcs_rate_ceiling', () => Math.round(rate.ceiling()));
    metrics.setGauge('gcs_rate_queued', () => rate.queued);
  }
  const stall = v['enable-read-stall-retry']
    ? new StallTimeout({
        initialMs: v['read-stall-initial-req-timeout'],
        minMs: v['read-stall-min-req-timeout'],
        maxMs: Math.max(v['read-stall-min-req-timeout'], v['read-stall-max-req-timeout']),
        percentile: v['read-stall-req-target-percentile'],
      })
    : null;
  if (stall) metrics.setGauge('gcs_stall_timeout_ms', () => Math.round(stall.currentMs));
  return {
    endpoint: access.endpoint,
    bucket: opts.bucket,
    auth: access.auth,
    maxConnections,
    timeoutMs: v['http-client-timeout'],
    retry: {
      ...DEFAULT_RETRY,
      maxAttempts: v['max-retry-attempts'] > 0 ? v['max-retry-attempts'] : Number.POSITIVE_INFINITY,
      multiplier: v['retry-multiplier'],
      maxDelayMs: v['max-retry-sleep'],
    },
    concurrency,
    // Lookups and listings never wait for sockets or slots that downloads hold: their own pool, as large.
    metadata: { connections: maxConnections, concurrency: new AdaptiveConcurrency({ max: maxConnections || UNLIMITED_CONNECTIONS_CEILING, min: 1, cooldownMs: 1000 }) },
    rate,
    stall,
    maxRetryDurationMs: v['max-retry-duration'],
    billingProject: v['billing-project'],
    userAgent: access.userAgent,
    limitBytesPerSec: v['limit-bytes-per-sec'],
    largestReadBytes: Math.max(v['block-size-mb'], v['whole-object-threshold-mb']) * 2 ** 20,
    log,
    metrics,
  };
}

/**
 * A missing bucket or refused credentials fail the mount at once (not retryable); a throttled or
 * briefly failing bucket is retried until --startup-check-timeout (`checkMs`), so it slows a start but
 * does not fail it (under systemd, a failed start is a restart loop that adds to the load).
 */
export async function checkBucket(clientConfig: HttpClientConfig, checkMs: number, abort?: AbortSignal): Promise<void> {
  const probe = new HttpObjectClient({
    ...clientConfig,
    retry: { ...clientConfig.retry, maxAttempts: checkMs > 0 ? Number.POSITIVE_INFINITY : 1, maxDelayMs: Math.min(clientConfig.retry.maxDelayMs, STARTUP_CHECK_MAX_SLEEP_MS) },
    maxRetryDurationMs: checkMs,
    retryBoundFlag: '--startup-check-timeout',
    concurrency: new AdaptiveConcurrency({ max: 1, min: 1, cooldownMs: 0 }),
    metadata: null,
    rate: null,
    limitBytesPerSec: 0,
  });
  // Stopped while it retries (a throttled bucket, SIGTERM from systemd): closing the client ends its
  // attempt and its backoff at once.
  const onAbort = (): void => void probe.close();
  abort?.addEventListener('abort', onAbort);
  try {
    if (abort?.aborted) throw new StartInterruptedError();
    // objects.list, not a bucket GET: a read-only key (objectViewer) lacks storage.buckets.get (gcsfuse #982).
    await probe.probeBucket().catch((err: unknown) => {
      throw abort?.aborted ? new StartInterruptedError() : err;
    });
  } finally {
    abort?.removeEventListener('abort', onAbort);
    await probe.close();
  }
}

/** A signal came while the daemon was starting: it stops before mounting. */
export class StartInterruptedError extends Error {
  override readonly name = 'StartInterruptedError';
  constructor() {
    super('stopped by a signal while starting, before mounting');
  }
}

/** The mount's GCS client, with --download-workers threads for media, and their gauges. */
export function openGcsClient(clientConfig: HttpClientConfig, downloadWorkers: number, metrics: Metrics): HttpObjectClient {
  const client = new HttpObjectClient({ ...clientConfig, downloadWorkers });
  const bandwidth = client.bandwidth;
  if (bandwidth) {
    metrics.setGauge('gcs_bandwidth_limit_bytes', () => clientConfig.limitBytesPerSec ?? 0);
    metrics.setGauge('gcs_bandwidth_queued', () => bandwidth.queued);
  }
  const workers = client.workers;
  if (workers) {
    metrics.setGauge('download_workers', () => workers.count);
    metrics.setGauge('download_workers_in_flight', () => workers.inFlight);
    metrics.setGauge('download_workers_utilization', () => Math.max(0, ...workers.loads().map((l) => l.utilization)));
  }
  return client;
}

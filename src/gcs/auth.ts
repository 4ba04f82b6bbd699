import { GcsError } from './errors.js';
import { tokenUrlAuth } from './token-url.js';

/**
 * Returns the headers that authenticate one request (a fresh token when the old one nears expiry).
 * `fresh`: the server refused the current token (401), so fetch a new one whatever its stated expiry;
 * `refused`: the Authorization that was refused, so that requests refused together fetch one new token.
 */
export type AuthHeaders = (opts?: { fresh?: boolean; refused?: string }) => Promise<Record<string, string>>;

export type CredentialSource =
  | { kind: 'none' } // emulator, custom endpoint, or --anonymous-access
  | { kind: 'key-file'; path: string }
  | { kind: 'token-url'; url: string; reuse: boolean } // gcsfuse's --token-url
  | { kind: 'default' }; // Application Default Credentials

export class CredentialsError extends Error {
  override readonly name = 'CredentialsError';
}

/**
 * google-auth-library, when it finds no credentials, probes the GCE metadata server over the network and
 * waits on it. A daemon that must fail fast with a clear message should not: 'bios-only' still finds the
 * metadata server on real Google VMs (their BIOS says so) and never sends a packet elsewhere.
 */
function preferBiosMetadataDetection(env: NodeJS.ProcessEnv): void {
  if (!env.METADATA_SERVER_DETECTION) env.METADATA_SERVER_DETECTION = 'bios-only';
}

/**
 * How long fetching an access token may take. google-auth-library's token requests (gaxios over
 * node-fetch) have no timeout of their own, every request of the mount awaits the one refresh in flight,
 * and a connection to the token endpoint gone silent (a NAT or proxy dropping it) held the whole mount,
 * and its start, for good. Past this the request fails as transient: retried, within its deadline.
 */
export const TOKEN_TIMEOUT_MS = 30_000;

/**
 * An error of the token fetch as the client's retry policy should take it: the credentials themselves
 * refused (the token endpoint answered 400/401/403: invalid_grant for a revoked key or a deleted
 * service account) is UNAUTHENTICATED, given up at once (EACCES) rather than retried for minutes as
 * transient and then EIO; anything else is left as it is.
 */
export function tokenError(err: unknown): unknown {
  if (err instanceof GcsError) return err;
  const response = (err as { response?: { status?: unknown; data?: { error?: unknown } } }).response;
  const status = typeof response?.status === 'number' ? response.status : null;
  if (status === 400 || status === 401 || status === 403) {
    const reason = typeof response?.data?.error === 'string' ? response.data.error : `HTTP ${status}`;
    return new GcsError('UNAUTHENTICATED', `the token endpoint refused the credentials (${reason})`, 401);
  }
  return err;
}

/** The client's request headers (a token), within `timeoutMs`. */
async function headersWithin(client: { getRequestHeaders(): Promise<unknown> }, timeoutMs: number): Promise<Record<string, string>> {
  let timer: NodeJS.Timeout | undefined;
  const timeout = new Promise<never>((_, reject) => {
    timer = setTimeout(() => reject(new GcsError('TRANSIENT', `no access token after ${timeoutMs / 1000} s: the token endpoint does not answer`)), timeoutMs);
  });
  try {
    const headers = await Promise.race([client.getRequestHeaders(), timeout]);
    return Object.fromEntries(Object.entries(headers as Record<string, string>));
  } catch (err) {
    throw tokenError(err);
  } finally {
    clearTimeout(timer);
  }
}

export interface ResolveOptions {
  env?: NodeJS.ProcessEnv;
  tokenTimeoutMs?: number;
  /** How long a token URL that does not answer yet (refused, 5xx, silent) is retried at start; 0: one try. */
  startupMs?: number;
  /** Ends that wait at once (a stop asked for while starting). */
  abort?: AbortSignal;
  /** Sent to a token URL. */
  userAgent?: string;
}

/** The longest pause between two tries of a token URL at start: a sidecar that comes up is used soon. */
const TOKEN_URL_START_MAX_SLEEP_MS = 2_000;

/** A token URL's first token: transient failures are retried until `startupMs` has passed. */
async function firstTokenUrlAuth(source: { url: string; reuse: boolean }, o: ResolveOptions, timeoutMs: number): Promise<AuthHeaders> {
  const giveUpAt = Date.now() + (o.startupMs ?? 0);
  for (let pause = 100; ; pause = Math.min(pause * 2, TOKEN_URL_START_MAX_SLEEP_MS)) {
    try {
      return await tokenUrlAuth(source.url, { reuse: source.reuse, timeoutMs, userAgent: o.userAgent });
    } catch (err) {
      const transient = err instanceof GcsError && err.code === 'TRANSIENT';
      // Every message of the token fetch starts with `--token-url URL`.
      if (!transient || o.abort?.aborted || Date.now() + pause >= giveUpAt) throw new CredentialsError(`cannot get an access token: ${(err as Error).message}`);
      await new Promise<void>((resolve) => {
        const done = (): void => {
          clearTimeout(timer);
          o.abort?.removeEventListener('abort', done);
          resolve();
        };
        const timer = setTimeout(done, pause);
        o.abort?.addEventListener('abort', done);
      });
    }
  }
}

export async function resolveAuth(source: CredentialSource, o: ResolveOptions = {}): Promise<AuthHeaders | null> {
  const env = o.env ?? process.env;
  const tokenTimeoutMs = o.tokenTimeoutMs ?? TOKEN_TIMEOUT_MS;
  if (source.kind === 'none') return null;
  if (source.kind === 'token-url') return firstTokenUrlAuth(source, o, tokenTimeoutMs);
  preferBiosMetadataDetection(env);
  // Loaded only when credentials are needed (0.18 s: the client, google-auth-library, OpenTelemetry's
  // API): a mount of an emulator or of a public bucket never pays for it.
  const { Storage } = await import('@google-cloud/storage');
  const storage = new Storage(source.kind === 'key-file' ? { keyFilename: source.path } : {});
  const auth = storage.authClient;
  try {
    const client = await auth.getClient();
    // Fetch one token now so that bad credentials fail the mount, not the first read.
    await headersWithin(client, tokenTimeoutMs);
  } catch (err) {
    const detail = err instanceof Error ? err.message.split('\n')[0] : String(err);
    const hint =
      source.kind === 'key-file'
        ? `cannot use key file ${source.path}: ${detail}`
        : `no Google credentials found (${detail}); set GOOGLE_APPLICATION_CREDENTIALS, pass --key-file, or use --anonymous-access for a public bucket`;
    throw new CredentialsError(hint);
  }
  return async (opts) => {
    const client = await auth.getClient();
    if (opts?.fresh) expireCachedToken(client);
    return headersWithin(client, tokenTimeoutMs);
  };
}

/**
 * Makes google-auth-library fetch a new access token on its next use. Its OAuth2 clients (service-account
 * keys, user credentials, the metadata server) refresh a token once `credentials.expiry_date` has passed;
 * clients without one (self-signed JWTs) sign a fresh token per audience anyway.
 */
function expireCachedToken(client: unknown): void {
  const credentials = (client as { credentials?: { expiry_date?: number | null } }).credentials;
  if (credentials) credentials.expiry_date = 1;
}

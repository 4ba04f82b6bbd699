/**
 * Access tokens from a URL (gcsfuse's --token-url): a GET that answers an OAuth2 token as JSON
 * (`access_token`, and optionally `token_type`, `expires_in` or `expiry`), as a sidecar or a node's token
 * proxy serves it. `unix:///path/to.sock` asks over a Unix socket, with the HTTP path and query after a
 * `#` (`unix:///run/tok.sock#/token?scope=x`), as gcsfuse's form.
 *
 * With `reuse` (--reuse-token-from-url, the default) one token serves every request until 10 s before
 * its expiry (one without an expiry until GCS refuses it), and requests that find it stale share one
 * fetch; without, each request fetches its own, as gcsfuse does.
 */
import { Agent, request, type Dispatcher } from 'undici';
import type { AuthHeaders } from './auth.js';
import { GcsError } from './errors.js';

/** A token is fetched again this long before its stated expiry (golang.org/x/oauth2's margin, which gcsfuse uses). */
const EXPIRY_MARGIN_MS = 10_000;
/** A token endpoint's answer is read up to this much. */
const BODY_LIMIT = 1 << 20;

interface Token {
  header: string;
  /** Milliseconds since the epoch when it stops being used; Infinity: no expiry stated. */
  refreshAt: number;
}

/** Where the GETs go: an http(s) origin, or a Unix socket with the path asked over it. */
export interface TokenTarget {
  origin: string;
  path: string;
  socketPath: string | null;
  /** An Authorization header from the URL's user and password, or null. */
  basic: string | null;
}

/** The URL's target; one neither http(s) nor unix is a usage error (thrown as RangeError). */
export function parseTokenUrl(url: string): TokenTarget {
  let u: URL;
  try {
    u = new URL(url);
  } catch {
    throw new RangeError(`--token-url ${url}: not a URL`);
  }
  // user:password@ in the URL is sent as Basic authentication, as Go's HTTP client sends it.
  const basic = u.username || u.password ? `Basic ${Buffer.from(`${decodeURIComponent(u.username)}:${decodeURIComponent(u.password)}`).toString('base64')}` : null;
  if (u.protocol === 'http:' || u.protocol === 'https:') return { origin: u.origin, path: `${u.pathname}${u.search}`, socketPath: null, basic };
  if (u.protocol === 'unix:') {
    if (!u.pathname || u.pathname === '/') throw new RangeError(`--token-url ${url}: no socket path`);
    // The fragment as written (still escaped), as gcsfuse takes it: %2B stays a plus in the query.
    const rel = u.hash ? new URL(u.hash.slice(1), 'http://unix') : null;
    return { origin: 'http://unix', path: rel ? `${rel.pathname}${rel.search}` : `/${u.search}`, socketPath: decodeURIComponent(u.pathname), basic };
  }
  throw new RangeError(`--token-url ${url}: only http, https and unix URLs are supported`);
}

interface Target extends TokenTarget {
  dispatcher: Dispatcher | undefined;
}

/** One token from the endpoint, all of it within `timeoutMs`; errors as the client's retry policy takes them. */
async function fetchToken(target: Target, url: string, timeoutMs: number, userAgent: string | undefined, now: () => number): Promise<Token> {
  // A deadline for the whole exchange: a server that trickles bytes is never silent long enough for a
  // silence timeout, and with reuse every request of the mount waits on this one fetch.
  const signal = AbortSignal.timeout(timeoutMs);
  const headers: Record<string, string> = { accept: 'application/json', ...(userAgent ? { 'user-agent': userAgent } : {}), ...(target.basic ? { authorization: target.basic } : {}) };
  let res: Dispatcher.ResponseData;
  const chunks: Buffer[] = [];
  try {
    res = await request(`${target.origin}${target.path}`, { method: 'GET', headers, signal, ...(target.dispatcher ? { dispatcher: target.dispatcher } : {}) });
    let size = 0;
    for await (const chunk of res.body as AsyncIterable<Buffer>) {
      size += chunk.length;
      if (size > BODY_LIMIT) {
        res.body.destroy();
        throw new GcsError('INVALID', `--token-url ${url}: answer over ${BODY_LIMIT} bytes`);
      }
      chunks.push(chunk);
    }
  } catch (err) {
    if (err instanceof GcsError) throw err;
    const why = signal.aborted ? `no token within ${timeoutMs / 1000} s` : (err as Error).message;
    throw new GcsError('TRANSIENT', `--token-url ${url}: ${why}`);
  }
  const text = Buffer.concat(chunks).toString('utf8');
  if (res.statusCode < 200 || res.statusCode >= 300) {
    // A refusal of the caller is the credentials' fault: given up at once, as a revoked key is.
    const refused = res.statusCode === 400 || res.statusCode === 401 || res.statusCode === 403;
    throw new GcsError(refused ? 'UNAUTHENTICATED' : 'TRANSIENT', `--token-url ${url} answered HTTP ${res.statusCode}${text ? `: ${text.slice(0, 200)}` : ''}`, refused ? 401 : res.statusCode);
  }
  let body: { access_token?: unknown; token_type?: unknown; expires_in?: unknown; expiry?: unknown };
  try {
    body = JSON.parse(text) as typeof body;
  } catch {
    throw new GcsError('INVALID', `--token-url ${url}: the answer is not JSON`);
  }
  if (typeof body.access_token !== 'string' || body.access_token === '') throw new GcsError('INVALID', `--token-url ${url}: the answer has no access_token`);
  // oauth2's Token.Type(): Bearer unless the endpoint names another type, its common spellings made canonical.
  const rawType = typeof body.token_type === 'string' && body.token_type !== '' ? body.token_type : 'Bearer';
  const type = /^bearer$/i.test(rawType) ? 'Bearer' : /^mac$/i.test(rawType) ? 'MAC' : /^basic$/i.test(rawType) ? 'Basic' : rawType;
  let expiresAt = Number.POSITIVE_INFINITY;
  // Go's zero time (year 1, what an oauth2.Token without an expiry marshals to) means no expiry, as in gcsfuse.
  const expiry = typeof body.expiry === 'string' ? Date.parse(body.expiry) : Number.NaN;
  if (!Number.isNaN(expiry) && new Date(expiry).getUTCFullYear() > 1) expiresAt = expiry;
  else if (Number.isNaN(expiry) && typeof body.expires_in === 'number' && body.expires_in > 0) expiresAt = now() + body.expires_in * 1000;
  return { header: `${type} ${body.access_token}`, refreshAt: expiresAt - EXPIRY_MARGIN_MS };
}

export interface TokenUrlOptions {
  reuse: boolean;
  timeoutMs: number;
  userAgent?: string;
  now?: () => number;
}

/** The mount's request headers from `url`; one token is fetched now, so that a dead endpoint fails the start. */
export async function tokenUrlAuth(url: string, opts: TokenUrlOptions): Promise<AuthHeaders> {
  const parsed = parseTokenUrl(url);
  const target: Target = { ...parsed, dispatcher: parsed.socketPath ? new Agent({ connect: { socketPath: parsed.socketPath } }) : undefined };
  const now = opts.now ?? (() => Date.now());
  const fetchOne = (): Promise<Token> => fetchToken(target, url, opts.timeoutMs, opts.userAgent, now);
  let current: Token = await fetchOne();
  let inFlight: Promise<Token> | null = null;
  const authorization = (t: Token): Record<string, string> => ({ authorization: t.header });
  if (!opts.reuse) {
    let first: Token | null = current;
    return async () => {
      // The token fetched at start serves the first request; every later one fetches its own.
      const t = first ?? (await fetchOne());
      first = null;
      return authorization(t);
    };
  }
  return async (req) => {
    // A refusal of a token already replaced (requests refused together) takes the new one.
    const refused = req?.fresh === true && (req.refused === undefined || req.refused === current.header);
    if (!refused && now() < current.refreshAt) return authorization(current);
    inFlight ??= fetchOne().finally(() => (inFlight = null));
    current = await inFlight;
    return authorization(current);
  };
}

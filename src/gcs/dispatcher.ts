// The connection pool to the endpoint, or undici's proxy agent when the proxy variables say so.
import { createRequire } from 'node:module';
import { dirname, join } from 'node:path';
import { EnvHttpProxyAgent, Pool } from 'undici';
import type { Dispatcher } from 'undici';

const require = createRequire(import.meta.url);
let parserLoaded = false;

/**
 * Loads undici's HTTP parser (llhttp, WebAssembly kept in two .js files) into this thread's module
 * cache now. undici requires it on its first connection; a daemon out of file descriptors then has the
 * socket but no descriptor left to open the parser's file, fails the connection, retries, and never
 * gets one through (seen: every read of a mount at its RLIMIT_NOFILE retried until its deadline). Once
 * cached, a connection needs only its socket. Each worker thread has its own module cache: called per
 * thread, by the first pool it makes.
 */
function loadHttpParser(): void {
  if (parserLoaded) return;
  parserLoaded = true;
  const llhttp = join(dirname(require.resolve('undici')), 'lib', 'llhttp');
  // Both: undici tries the SIMD build first and falls back to the plain one.
  for (const file of ['llhttp_simd-wasm.js', 'llhttp-wasm.js']) require(join(llhttp, file));
}

export interface ProxySettings {
  httpProxy: string | undefined;
  httpsProxy: string | undefined;
  noProxy: string;
}

/** The proxy variables as curl and undici read them: lowercase first. */
export function proxySettings(env: NodeJS.ProcessEnv): ProxySettings {
  const pick = (name: string): string | undefined => (env[name.toLowerCase()] ?? env[name])?.trim() || undefined;
  return { httpProxy: pick('HTTP_PROXY'), httpsProxy: pick('HTTPS_PROXY'), noProxy: pick('NO_PROXY') ?? '' };
}

/**
 * The connection pool to the endpoint, or, when HTTP_PROXY or HTTPS_PROXY is set, undici's
 * EnvHttpProxyAgent with the same pool options: it tunnels through the proxy (CONNECT) unless NO_PROXY
 * names the host, and either way keeps one tuned Pool per origin underneath. Its rules are undici's: an
 * https endpoint uses HTTPS_PROXY, else HTTP_PROXY; loopback is proxied unless NO_PROXY says otherwise.
 */
export function dispatcherFor(origin: string, options: Pool.Options, proxy: ProxySettings): Dispatcher {
  loadHttpParser();
  if (!proxy.httpProxy && !proxy.httpsProxy) return new Pool(origin, options);
  return new EnvHttpProxyAgent({ ...options, httpProxy: proxy.httpProxy, httpsProxy: proxy.httpsProxy, noProxy: proxy.noProxy });
}

/** A proxy URL for the log: user and password left out. */
export function redactedProxy(url: string): string {
  try {
    return new URL(url).origin;
  } catch {
    return '(unparsable proxy URL)';
  }
}

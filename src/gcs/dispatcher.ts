// The connection pool to the endpoint, or undici's proxy agent when the proxy variables say so.
import { EnvHttpProxyAgent, Pool } from 'undici';
import type { Dispatcher } from 'undici';

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

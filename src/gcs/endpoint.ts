/**
 * Where the JSON API lives. `--custom-endpoint` wins over STORAGE_EMULATOR_HOST; both mean "talk to
 * this server without Google credentials". Other clients accept the variable as a bare host:port or a
 * URL, and @google-cloud/storage uses it as a base URL ending in /storage/v1: accept all three.
 */
export interface Endpoint {
  /** Origin only, e.g. https://storage.googleapis.com or http://127.0.0.1:4443 */
  origin: string;
  /** True when the user pointed us somewhere other than Google: no credentials are needed. */
  custom: boolean;
}

export const GOOGLE_ORIGIN = 'https://storage.googleapis.com';

export function resolveEndpoint(customEndpoint: string | undefined, env: NodeJS.ProcessEnv): Endpoint {
  const raw = customEndpoint?.trim() || env.STORAGE_EMULATOR_HOST?.trim();
  if (!raw) return { origin: GOOGLE_ORIGIN, custom: false };
  const withScheme = /^[a-z][a-z0-9+.-]*:\/\//i.test(raw) ? raw : `http://${raw}`;
  let url: URL;
  try {
    url = new URL(withScheme);
  } catch {
    throw new Error(`invalid endpoint "${raw}": expected host:port or an http(s) URL`);
  }
  if (url.protocol !== 'http:' && url.protocol !== 'https:') {
    throw new Error(`invalid endpoint "${raw}": only http and https are supported`);
  }
  return { origin: url.origin, custom: url.origin !== GOOGLE_ORIGIN };
}

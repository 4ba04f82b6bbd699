/**
 * Returns the headers that authenticate one request (a fresh token when the old one nears expiry).
 * `fresh`: the server refused the current token (401), so fetch a new one whatever its stated expiry.
 */
export type AuthHeaders = (opts?: { fresh?: boolean }) => Promise<Record<string, string>>;

export type CredentialSource =
  | { kind: 'none' } // emulator, custom endpoint, or --anonymous-access
  | { kind: 'key-file'; path: string }
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

export async function resolveAuth(source: CredentialSource, env: NodeJS.ProcessEnv = process.env): Promise<AuthHeaders | null> {
  if (source.kind === 'none') return null;
  preferBiosMetadataDetection(env);
  // Loaded only when credentials are needed (0.18 s: the client, google-auth-library, OpenTelemetry's
  // API): a mount of an emulator or of a public bucket never pays for it.
  const { Storage } = await import('@google-cloud/storage');
  const storage = new Storage(source.kind === 'key-file' ? { keyFilename: source.path } : {});
  const auth = storage.authClient;
  try {
    const client = await auth.getClient();
    // Fetch one token now so that bad credentials fail the mount, not the first read.
    await client.getRequestHeaders();
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
    const headers = await client.getRequestHeaders();
    return Object.fromEntries(Object.entries(headers as Record<string, string>));
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

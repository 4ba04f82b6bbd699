import { createPrivateKey } from 'node:crypto';
import { readFileSync } from 'node:fs';
import { CredentialsError } from './auth.js';

/**
 * The fields each kind of Google credentials file needs to produce a token. google-auth-library finds
 * out only when it first asks for one (and not at all where no token is asked for): a truncated or
 * hand-edited file must fail the mount, not send requests without credentials.
 */
const REQUIRED: Record<string, readonly string[]> = {
  service_account: ['client_email', 'private_key'],
  authorized_user: ['client_id', 'client_secret', 'refresh_token'],
  external_account: ['audience', 'subject_token_type', 'token_url'],
  impersonated_service_account: ['service_account_impersonation_url', 'source_credentials'],
};

/** Throws a one-line CredentialsError naming `path` unless it holds a usable Google credentials file. */
export function checkKeyFile(path: string): void {
  const bad = (why: string) => new CredentialsError(`key file ${path} is not usable: ${why}`);
  let text: string;
  try {
    text = readFileSync(path, 'utf8');
  } catch (err) {
    throw bad(`cannot be read (${(err as NodeJS.ErrnoException).code ?? String(err)})`);
  }
  let key: unknown;
  try {
    key = JSON.parse(text);
  } catch (err) {
    throw bad(`not JSON (${(err as Error).message.split('\n')[0]}); a truncated or corrupt download?`);
  }
  if (key === null || typeof key !== 'object' || Array.isArray(key)) throw bad('not a JSON object');
  const fields = key as Record<string, unknown>;
  const type = fields.type;
  if (typeof type !== 'string' || !(type in REQUIRED)) {
    throw bad(`"type" is ${JSON.stringify(type)}, not one of ${Object.keys(REQUIRED).join(', ')}`);
  }
  const missing = REQUIRED[type]!.filter((f) => {
    const v = fields[f];
    return f === 'source_credentials' ? v === null || typeof v !== 'object' : typeof v !== 'string' || v.trim() === '';
  });
  if (missing.length > 0) throw bad(`a ${type} key needs ${missing.join(', ')}`);
  if (type === 'service_account') {
    try {
      createPrivateKey(fields.private_key as string);
    } catch {
      throw bad('its private_key is not a PEM private key (cut short?)');
    }
  }
}

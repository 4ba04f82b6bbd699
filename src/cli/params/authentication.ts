// Credentials.

import type { Param } from './param.js';

export const AUTHENTICATION_PARAMS = [
  {
    flag: 'key-file',
    configKey: 'gcs-auth.key-file',
    type: 'string',
    default: '',
    help: 'Service-account (or authorized-user) JSON key file, checked at start (unusable: exit 5); unset = application default credentials',
    group: 'Authentication',
    effect: 'effective',
    path: true,
  },
  {
    flag: 'anonymous-access',
    configKey: 'gcs-auth.anonymous-access',
    type: 'bool',
    default: false,
    help: 'Send no credentials (public buckets, emulators)',
    group: 'Authentication',
    effect: 'effective',
  },
  {
    flag: 'token-url',
    configKey: 'gcs-auth.token-url',
    type: 'string',
    default: '',
    help: 'Fetch access tokens from this URL (a GET answering OAuth2 JSON: access_token, expires_in), as gcsfuse; unix:///SOCKET#/PATH asks over a Unix socket. Used when no --key-file is given, with --custom-endpoint too; at start one not answering yet is retried within --startup-check-timeout, one refusing is exit 5',
    group: 'Authentication',
    effect: 'effective',
  },
  {
    flag: 'reuse-token-from-url',
    configKey: 'gcs-auth.reuse-token-from-url',
    type: 'bool',
    default: true,
    help: 'With --token-url: one token serves every request until 10 s before its expiry (false: each request fetches its own)',
    group: 'Authentication',
    effect: 'effective',
  },
] as const satisfies readonly Param[];

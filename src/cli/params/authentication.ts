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
    help: 'Token URLs are not supported: gcsmount uses --key-file or application default credentials',
    group: 'Authentication',
    effect: 'ignored',
  },
  {
    flag: 'reuse-token-from-url',
    configKey: 'gcs-auth.reuse-token-from-url',
    type: 'bool',
    default: true,
    help: 'Only meaningful with --token-url, which gcsmount does not support',
    group: 'Authentication',
    effect: 'ignored',
  },
] as const satisfies readonly Param[];

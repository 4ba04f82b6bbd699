// The one table of every mount option gcsmount accepts, put together from its groups' parts in params/
// (each `as const`, so every flag keeps its literal name and type). gcsmount is meant as a drop-in for
// gcsfuse, so flag names, config-file keys (gcsfuse's YAML layout), types and defaults follow gcsfuse's
// own parameter table (cfg/params.yaml in GoogleCloudPlatform/gcsfuse, v3 era); our own options live
// under a `gcsmount:` section of the config file. The parser (options.ts), `--help` and the docs table
// are all generated from this list: add an option to its group's part and nowhere else.
//
// `default` is the resolved value (what MountOptions.values holds): booleans, numbers (durations in
// milliseconds, octal modes as numbers), strings, string arrays.

import { AUTHENTICATION_PARAMS } from './params/authentication.js';
import { BLOCK_CACHE_PARAMS } from './params/block-cache.js';
import { COMPATIBILITY_PARAMS } from './params/compatibility.js';
import { DOWNLOAD_PARAMS } from './params/downloads.js';
import { GCSFUSE_ONLY_PARAMS } from './params/gcsfuse-only.js';
import { GCS_CONNECTION_PARAMS } from './params/gcs-connection.js';
import { LOGGING_METRICS_PARAMS } from './params/logging-metrics.js';
import { METADATA_CACHE_PARAMS } from './params/metadata-cache.js';
import { MOUNTING_PARAMS } from './params/mounting.js';
import type { Param, ParamGroup, ParamType } from './params/param.js';
import { PERMISSION_PARAMS } from './params/permissions.js';
import { WRITE_PARAMS } from './params/writes.js';

export type { Param, ParamEffect, ParamGroup, ParamType } from './params/param.js';
export { DEFAULT_DOWNLOAD_WORKERS, DEFAULT_MAX_PARALLEL_DOWNLOADS, DEFAULT_MEMORY_LIMIT_MB, DEFAULT_RANGE_GETS_PER_READER } from './params/defaults.js';

/** In this order in the docs' table; `--help` shows them by group (GROUPS). */
export const PARAMS = [
  ...MOUNTING_PARAMS,
  ...METADATA_CACHE_PARAMS,
  ...BLOCK_CACHE_PARAMS,
  ...DOWNLOAD_PARAMS,
  ...GCS_CONNECTION_PARAMS,
  ...AUTHENTICATION_PARAMS,
  ...LOGGING_METRICS_PARAMS,
  ...PERMISSION_PARAMS,
  ...WRITE_PARAMS,
  ...COMPATIBILITY_PARAMS,
] as const satisfies readonly Param[];

/** One entry of the table, with its literal types. */
export type ParamEntry = (typeof PARAMS)[number];

/** Every flag name in the table. */
export type ParamFlag = ParamEntry['flag'];

/** The flags of a given type, e.g. FlagOfType<'bool'> = 'foreground' | 'implicit-dirs' | ... */
export type FlagOfType<T extends ParamType> = Extract<ParamEntry, { type: T }>['flag'];

/** The resolved value of each type. */
export type ValueOfType<T extends ParamType> = T extends 'bool'
  ? boolean
  : T extends 'string'
    ? string
    : T extends 'string-list'
      ? readonly string[]
      : number; // int, float, octal, duration (milliseconds)

/** Every option's resolved value, keyed by flag name. */
export type ResolvedValues = { [P in ParamEntry as P['flag']]: ValueOfType<P['type']> };

/** Table lookup by flag name. */
export const PARAM_BY_FLAG: ReadonlyMap<string, Param> = new Map(PARAMS.map((p) => [p.flag, p as Param]));

/** Table lookup by config-file key ('metadata-cache.ttl-secs'). */
export const PARAM_BY_CONFIG_KEY: ReadonlyMap<string, Param> = new Map(
  PARAMS.filter((p) => p.configKey !== null).map((p) => [p.configKey as string, p as Param]),
);

export { GCSFUSE_ONLY_PARAMS } from './params/gcsfuse-only.js';

/** gcsfuse's options without a counterpart here (accepted, checked, warned about, never used), by flag. */
export const GCSFUSE_ONLY_BY_FLAG: ReadonlyMap<string, Param> = new Map(GCSFUSE_ONLY_PARAMS.map((p) => [p.flag, p]));

/** The same, by config-file key. */
export const GCSFUSE_ONLY_BY_CONFIG_KEY: ReadonlyMap<string, Param> = new Map(GCSFUSE_ONLY_PARAMS.map((p) => [p.configKey as string, p]));

/** Groups in the order `--help` shows them. */
export const GROUPS: readonly ParamGroup[] = [
  'Mounting',
  'Metadata cache',
  'Block cache',
  'Downloads',
  'Writes',
  'GCS connection',
  'Authentication',
  'Logging and metrics',
  'Permissions',
  'Compatibility',
];

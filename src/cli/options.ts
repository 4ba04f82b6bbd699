// Command line + gcsfuse-style YAML config file -> one typed, validated MountOptions.
//
// Precedence: command-line flags, then the --config-file YAML, then the defaults in params.ts.
// Flag syntax follows gcsfuse (Go flag / pflag): --flag value, --flag=value, -flag value, -flag=value;
// boolean flags are --flag or --flag=true|false (a following word is never taken as their value);
// -o takes comma-separated mount options and may be repeated (-o allow_other -o ro, -oro).
// Flags may come before, between or after BUCKET and MOUNTPOINT; `--` ends flag parsing.
// The config file is read by config-file.ts; both sources' values go through param-value.ts.

import { homedir } from 'node:os';
import { resolve as resolvePath } from 'node:path';
import { CacheFilterError, cacheFilter } from '../blocks/cache-filter.js';
import { readConfigFile } from './config-file.js';
import { PROFILE_DEFAULTS, type Profile } from './profiles.js';
import { parseParamValue } from './param-value.js';
import {
  GCSFUSE_ONLY_BY_FLAG,
  GCSFUSE_ONLY_PARAMS,
  PARAMS,
  PARAM_BY_FLAG,
  type FlagOfType,
  type Param,
  type ParamFlag,
  type ResolvedValues,
} from './params.js';
import { suggest } from './suggest.js';
import {
  OptionError,
  msToWholeSeconds,
  optionLabel,
  sizeLimitFromMb,
  ttlFromSeconds,
  type SizeLimit,
  type Ttl,
} from './values.js';

export { OptionError } from './values.js';
export type { ResolvedValues, ParamFlag, FlagOfType } from './params.js';

/** Where an option's value came from: its default, the config file, the command line, or --profile. */
export type ValueSource = 'default' | 'config' | 'flag' | 'profile';

export interface MountOptions {
  /** Positional BUCKET. */
  bucket: string;
  /** Positional MOUNTPOINT, as given. */
  mountPoint: string;
  /** Every option by flag name, typed and defaulted (durations in ms, modes as numbers, paths absolute). */
  values: ResolvedValues;
  /** Where each value came from. */
  sources: Record<ParamFlag, ValueSource>;
  /** One line per 'ignored', 'planned' or deprecated option the user set, and similar warnings. */
  notices: string[];
}

type HasValues = Pick<MountOptions, 'values'>;

// ------------------------------------------------------------------------------------------------
// Typed accessors. Their flag parameters only accept real flags of the right type, so a typo at a
// call site is a compile error.

export function getBool(opts: HasValues, flag: FlagOfType<'bool'>): boolean {
  return opts.values[flag];
}

export function getNumber(opts: HasValues, flag: FlagOfType<'int' | 'float' | 'octal'>): number {
  return opts.values[flag];
}

export function getString(opts: HasValues, flag: FlagOfType<'string'>): string {
  return opts.values[flag];
}

export function getDurationMs(opts: HasValues, flag: FlagOfType<'duration'>): number {
  return opts.values[flag];
}

export function getStringList(opts: HasValues, flag: FlagOfType<'string-list'>): readonly string[] {
  return opts.values[flag];
}

/** The options that hold a gcsfuse-style TTL in seconds (-1 = forever, 0 = off). */
export type TtlFlag = 'metadata-cache-ttl-secs' | 'metadata-cache-negative-ttl-secs' | 'kernel-list-cache-ttl-secs';

export function getTtl(opts: HasValues, flag: TtlFlag): Ttl {
  return ttlFromSeconds(opts.values[flag], flag);
}

/** The options that hold a gcsfuse-style size limit in MiB (-1 = unlimited, 0 = off). */
export type SizeLimitFlag = 'stat-cache-max-size-mb' | 'type-cache-max-size-mb' | 'file-cache-max-size-mb';

export function getSizeLimit(opts: HasValues, flag: SizeLimitFlag): SizeLimit {
  return sizeLimitFromMb(opts.values[flag], flag);
}

/**
 * The metadata-cache TTL with gcsfuse's rule for the deprecated flags: --metadata-cache-ttl-secs if the
 * user set it; otherwise, if --stat-cache-ttl or --type-cache-ttl was set, the smaller of the two
 * rounded up to whole seconds; otherwise the --metadata-cache-ttl-secs default.
 */
export function metadataCacheTtl(opts: Pick<MountOptions, 'values' | 'sources'>): Ttl {
  const { values, sources } = opts;
  if (
    sources['metadata-cache-ttl-secs'] === 'default' &&
    (sources['stat-cache-ttl'] !== 'default' || sources['type-cache-ttl'] !== 'default')
  ) {
    const ms = Math.min(values['stat-cache-ttl'], values['type-cache-ttl']);
    return ttlFromSeconds(msToWholeSeconds(ms), 'stat-cache-ttl');
  }
  return ttlFromSeconds(values['metadata-cache-ttl-secs'], 'metadata-cache-ttl-secs');
}

// ------------------------------------------------------------------------------------------------
// Parsing

/** True if argv asks for help (-h, --help, -help) before any `--`. */
export function wantsHelp(argv: readonly string[]): boolean {
  for (const a of argv) {
    if (a === '--') return false;
    if (a === '-h' || a === '--help' || a === '-help') return true;
  }
  return false;
}

const O_PARAM = PARAM_BY_FLAG.get('o')!;

function expandPath(text: string, env: NodeJS.ProcessEnv): string {
  if (text === '') return '';
  let p = text;
  if (p === '~' || p.startsWith('~/')) p = (env['HOME'] || homedir()) + p.slice(1);
  return resolvePath(p);
}

function unknownFlag(arg: string, name: string): OptionError {
  const s = suggest(name, PARAM_BY_FLAG.keys());
  const hint = s ? ` (did you mean ${optionLabel(s)}?)` : '';
  return new OptionError(`unknown flag ${arg}${hint}`);
}

interface ArgvResult {
  flags: Map<string, unknown>;
  positionals: string[];
}

function parseArgv(argv: readonly string[]): ArgvResult {
  const flags = new Map<string, unknown>();
  const positionals: string[] = [];
  const set = (param: Param, value: unknown) => {
    if (param.type === 'string-list') {
      const prev = (flags.get(param.flag) as string[] | undefined) ?? [];
      flags.set(param.flag, [...prev, ...(value as string[])]);
    } else {
      flags.set(param.flag, value); // last one wins, as in Go
    }
  };
  for (let i = 0; i < argv.length; i++) {
    const arg = argv[i]!;
    if (arg === '--') {
      positionals.push(...argv.slice(i + 1));
      break;
    }
    if (!arg.startsWith('-') || arg === '-') {
      positionals.push(arg);
      continue;
    }
    const dashes = arg.startsWith('--') ? 2 : 1;
    const body = arg.slice(dashes);
    const eq = body.indexOf('=');
    const name = eq >= 0 ? body.slice(0, eq) : body;
    let inline: string | undefined = eq >= 0 ? body.slice(eq + 1) : undefined;
    let param = name === '' ? undefined : (PARAM_BY_FLAG.get(name) ?? GCSFUSE_ONLY_BY_FLAG.get(name));
    if (!param && dashes === 1 && body.length > 1 && body.startsWith('o')) {
      // mount(8) style -oallow_other,ro
      param = O_PARAM;
      inline = body.slice(1);
    }
    if (!param) throw unknownFlag(arg, name);
    if (param.type === 'bool') {
      set(param, inline === undefined ? true : parseParamValue(param, inline, param.flag));
      continue;
    }
    if (inline === undefined) {
      if (i + 1 >= argv.length) throw new OptionError(`flag ${optionLabel(param.flag)} needs a value`);
      inline = argv[++i]!;
    }
    set(param, parseParamValue(param, inline, param.flag));
  }
  return { flags, positionals };
}

function noticeFor(param: Param, source: ValueSource): string | undefined {
  const who = source === 'flag' ? optionLabel(param.flag) : `config key '${param.configKey}'`;
  const dep = param.deprecated ? `; gcsfuse deprecates it (${param.deprecated})` : '';
  switch (param.effect) {
    case 'ignored':
      return `${who} is accepted for gcsfuse compatibility and ignored (${param.help})${dep}`;
    case 'planned':
      return `${who} is accepted but has no effect yet in this release of gcsmount${dep}`;
    case 'effective':
      return param.deprecated ? `${who} is deprecated: ${param.deprecated}` : undefined;
  }
}

/**
 * Parse the mount command line (arguments after the program name) and the --config-file it names.
 * Throws OptionError with a one-line message on any user error.
 */
export function parseMountArgs(argv: string[], env: NodeJS.ProcessEnv = process.env): MountOptions {
  const { flags, positionals } = parseArgv(argv);
  if (positionals.length > 2) {
    throw new OptionError(`unexpected extra argument ${JSON.stringify(positionals[2])}; usage: gcsmount [flags] BUCKET MOUNTPOINT`);
  }

  const configFile = flags.get('config-file') as string | undefined;
  const fromConfig = configFile ? readConfigFile(expandPath(configFile, env)) : new Map<string, unknown>();

  const values: Record<string, unknown> = {};
  const sources = {} as Record<ParamFlag, ValueSource>;
  const notices: string[] = [];
  for (const p of PARAMS as readonly Param[]) {
    const flag = p.flag as ParamFlag;
    let value: unknown;
    let source: ValueSource;
    if (flags.has(flag)) {
      value = flags.get(flag);
      source = 'flag';
    } else if (fromConfig.has(flag)) {
      value = fromConfig.get(flag);
      source = 'config';
    } else {
      value = Array.isArray(p.default) ? [...(p.default as string[])] : p.default;
      source = 'default';
    }
    if (p.path && source !== 'default' && typeof value === 'string') value = expandPath(value, env);
    values[flag] = value;
    sources[flag] = source;
    if (source !== 'default') {
      const n = noticeFor(p, source);
      if (n) notices.push(n);
    }
  }

  // gcsfuse's options gcsmount has no use for: their values were checked; each one set is named.
  for (const p of GCSFUSE_ONLY_PARAMS) {
    const source: ValueSource | null = flags.has(p.flag) ? 'flag' : fromConfig.has(p.flag) ? 'config' : null;
    if (source) notices.push(noticeFor(p, source)!);
  }

  // BUCKET and MOUNTPOINT may also come from the config file (one file per systemd unit instance).
  const bucket = positionals[0] ?? (values['bucket'] as string);
  const mountPoint = positionals[1] ?? (values['mount-point'] as string);
  if (!bucket && !mountPoint) throw new OptionError('missing BUCKET and MOUNTPOINT; usage: gcsmount [flags] BUCKET MOUNTPOINT');
  if (!mountPoint) {
    throw new OptionError(
      `missing MOUNTPOINT after ${JSON.stringify(bucket)}; usage: gcsmount [flags] BUCKET MOUNTPOINT (mounting all buckets is not supported)`,
    );
  }
  if (bucket === '_') {
    throw new OptionError("BUCKET '_' (gcsfuse dynamic mounting of all buckets) is not supported; name one bucket");
  }
  if (!bucket) throw new OptionError('BUCKET must not be empty');
  try {
    cacheFilter(bucket, values['file-cache-include-regex'] as string, values['file-cache-exclude-regex'] as string);
  } catch (err) {
    if (err instanceof CacheFilterError) throw new OptionError(err.message);
    throw err;
  }

  applyProfile(values, sources, notices);
  applyStatCacheCapacity(values, sources);

  if (sources['implicit-dirs'] !== 'default' && values['implicit-dirs'] === false) {
    notices.push('implicit-dirs=false has no effect: gcsmount always treats object prefixes as directories');
  }

  return { bucket, mountPoint, values: values as ResolvedValues, sources, notices };
}

/**
 * --profile's defaults (profiles.ts) in place of gcsmount's, for options the user left unset; named in a
 * notice. The metadata TTL stays the deprecated flags' when the user set those (their own choice).
 */
function applyProfile(values: Record<string, unknown>, sources: Record<ParamFlag, ValueSource>, notices: string[]): void {
  const profile = values['profile'] as string;
  if (!profile) return;
  const deprecatedTtl = sources['stat-cache-ttl'] !== 'default' || sources['type-cache-ttl'] !== 'default';
  const applied: string[] = [];
  for (const [flag, value] of Object.entries(PROFILE_DEFAULTS[profile as Profile])) {
    const f = flag as ParamFlag;
    if (sources[f] !== 'default' || (f === 'metadata-cache-ttl-secs' && deprecatedTtl)) continue;
    values[f] = value;
    sources[f] = 'profile';
    applied.push(`--${f} ${value}`);
  }
  if (applied.length > 0) notices.push(`--profile ${profile} sets ${applied.join(', ')} (gcsfuse's defaults for that workload; options set explicitly win)`);
}

/** gcsfuse's size of a stat cache entry, positive and negative together, for --stat-cache-capacity. */
const STAT_ENTRY_BYTES = 1464 + 256;

/**
 * The deprecated --stat-cache-capacity (entries), set while --stat-cache-max-size-mb is not: the size
 * gcsfuse makes of it (whole MiB, rounded up), over a profile's value too, as gcsfuse orders them.
 */
function applyStatCacheCapacity(values: Record<string, unknown>, sources: Record<ParamFlag, ValueSource>): void {
  if (sources['stat-cache-capacity'] === 'default') return;
  if (sources['stat-cache-max-size-mb'] !== 'default' && sources['stat-cache-max-size-mb'] !== 'profile') return;
  values['stat-cache-max-size-mb'] = Math.ceil(((values['stat-cache-capacity'] as number) * STAT_ENTRY_BYTES) / 2 ** 20);
  sources['stat-cache-max-size-mb'] = sources['stat-cache-capacity'];
}

// The --config-file: gcsfuse's YAML layout (sections of keys, e.g. metadata-cache: ttl-secs:), read
// into values by flag name. An unknown key is an error naming the closest known one, so a misspelt key
// is not silently left at its default. gcsfuse's keys gcsmount has no use for are read (and their
// values checked) like the others, then named in a warning (params/gcsfuse-only.ts).

import { readFileSync } from 'node:fs';
import { createRequire } from 'node:module';
import { parseParamValue } from './param-value.js';
import { GCSFUSE_ONLY_BY_CONFIG_KEY, PARAM_BY_CONFIG_KEY, type Param } from './params.js';
import { suggest } from './suggest.js';
import { OptionError, parseStringList } from './values.js';

/** Every section ('metadata-cache', 'logging.log-rotate', ...) that holds config keys. */
const CONFIG_SECTIONS: ReadonlySet<string> = new Set(
  [...PARAM_BY_CONFIG_KEY.keys(), ...GCSFUSE_ONLY_BY_CONFIG_KEY.keys()].flatMap((key) => {
    const parts = key.split('.');
    return parts.slice(0, -1).map((_, i) => parts.slice(0, i + 1).join('.'));
  }),
);

function isYamlNull(v: unknown): boolean {
  return v === null || v === undefined || v === '~' || (typeof v === 'string' && /^(null|Null|NULL)$/.test(v));
}

/** Config value (from the failsafe YAML schema: strings, arrays, maps) -> resolved value, or undefined if unset. */
function configValue(param: Param, key: string, raw: unknown, file: string): unknown {
  const label = `config key '${key}'`;
  const where = ` in config file ${file}`;
  try {
    if (isYamlNull(raw)) return undefined;
    if (param.type === 'string-list') {
      const items = Array.isArray(raw) ? raw : [raw];
      const out: string[] = [];
      for (const item of items) {
        if (typeof item !== 'string') throw new OptionError(`invalid value for ${label}: expected a list of strings`);
        out.push(...parseStringList(item));
      }
      return out;
    }
    if (typeof raw !== 'string') throw new OptionError(`invalid value for ${label}: expected a single value, not a list or section`);
    if (raw === '') return undefined; // `key:` with no value, as gcsfuse: leave the default
    return parseParamValue(param, raw, label);
  } catch (e) {
    if (e instanceof OptionError) throw new OptionError(e.message + where);
    throw e;
  }
}

/** The values the config file at `file` sets, by flag name; throws OptionError naming the file. */
export function readConfigFile(file: string): Map<string, unknown> {
  let text: string;
  try {
    text = readFileSync(file, 'utf8');
  } catch (e) {
    const code = (e as NodeJS.ErrnoException).code ?? (e as Error).message;
    throw new OptionError(`cannot read config file ${file}: ${code}`);
  }
  let doc: unknown;
  try {
    // The failsafe schema keeps every scalar as its text, so '0644' stays octal text, '1h' stays a
    // duration, and all conversions go through the same parsers as command-line values.
    // yaml (72 modules) loads only for a mount with a config file; parsing flags is synchronous, so require().
    const { parse } = createRequire(import.meta.url)('yaml') as typeof import('yaml');
    doc = parse(text, { schema: 'failsafe' });
  } catch (e) {
    const first = ((e as Error).message ?? String(e)).split('\n')[0];
    throw new OptionError(`invalid YAML in config file ${file}: ${first}`);
  }
  const out = new Map<string, unknown>();
  if (isYamlNull(doc) || doc === '') return out;
  if (typeof doc !== 'object' || Array.isArray(doc)) {
    throw new OptionError(`invalid config file ${file}: expected a mapping of gcsfuse config keys at the top level`);
  }
  const walk = (node: Record<string, unknown>, prefix: string) => {
    for (const [k, v] of Object.entries(node)) {
      const key = prefix ? `${prefix}.${k}` : k;
      const param = PARAM_BY_CONFIG_KEY.get(key) ?? GCSFUSE_ONLY_BY_CONFIG_KEY.get(key);
      if (param) {
        if (v !== null && typeof v === 'object' && !Array.isArray(v)) {
          throw new OptionError(`invalid value for config key '${key}' in config file ${file}: expected a value, not a section`);
        }
        const value = configValue(param, key, v, file);
        if (value !== undefined) out.set(param.flag, value);
      } else if (CONFIG_SECTIONS.has(key)) {
        if (isYamlNull(v) || v === '') continue; // an empty section
        if (typeof v !== 'object' || Array.isArray(v)) {
          throw new OptionError(`invalid value for config key '${key}' in config file ${file}: expected a section of keys`);
        }
        walk(v as Record<string, unknown>, key);
      } else {
        const s = suggest(key, PARAM_BY_CONFIG_KEY.keys());
        const hint = s ? ` (did you mean '${s}'?)` : '';
        throw new OptionError(`unknown key '${key}' in config file ${file}${hint}`);
      }
    }
  };
  walk(doc as Record<string, unknown>, '');
  return out;
}

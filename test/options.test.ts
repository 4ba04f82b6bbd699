import { mkdtempSync, readFileSync, readdirSync, statSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { afterAll, describe, expect, it } from 'vitest';
import { rmSync } from 'node:fs';
import { cacheFilter } from '../src/blocks/cache-filter.js';
import { formatHelp, formatValue, optionsTableMarkdown } from '../src/cli/help.js';
import {
  getBool,
  getDurationMs,
  getNumber,
  getSizeLimit,
  getString,
  getStringList,
  getTtl,
  metadataCacheTtl,
  parseMountArgs,
  wantsHelp,
} from '../src/cli/options.js';
import { PARAMS, PARAM_BY_FLAG, type Param } from '../src/cli/params.js';
import {
  OptionError,
  parseBool,
  parseDuration,
  parseFloat,
  parseInt,
  parseOctal,
  sizeLimitFromMb,
  ttlFromSeconds,
} from '../src/cli/values.js';

const params = PARAMS as readonly Param[];
const PARAMS_FILE = fileURLToPath(new URL('../src/cli/params.ts', import.meta.url));
const PARAMS_DIR = fileURLToPath(new URL('../src/cli/params/', import.meta.url));
const tmp = mkdtempSync(join(tmpdir(), 'gcsmount-options-'));
afterAll(() => rmSync(tmp, { recursive: true, force: true }));

let n = 0;
function yamlFile(text: string): string {
  const file = join(tmp, `config-${n++}.yaml`);
  writeFileSync(file, text);
  return file;
}

/** Expect fn to throw an OptionError whose one-line message contains every fragment. */
function expectOptionError(fn: () => unknown, ...fragments: string[]): void {
  let caught: unknown;
  try {
    fn();
  } catch (e) {
    caught = e;
  }
  expect(caught).toBeInstanceOf(OptionError);
  const message = (caught as Error).message;
  expect(message).not.toContain('\n');
  for (const f of fragments) expect(message).toContain(f);
}

const parse = (...argv: string[]) => parseMountArgs(argv, { HOME: '/home/tester' });

describe('value parsers', () => {
  it('parses Go durations and bare seconds into milliseconds', () => {
    expect(parseDuration('x', '600s')).toBe(600_000);
    expect(parseDuration('x', '30m')).toBe(1_800_000);
    expect(parseDuration('x', '1h30m')).toBe(5_400_000);
    expect(parseDuration('x', '1.5s')).toBe(1500);
    expect(parseDuration('x', '200ms')).toBe(200);
    expect(parseDuration('x', '0')).toBe(0);
    expect(parseDuration('x', '0s')).toBe(0);
    expect(parseDuration('x', '90')).toBe(90_000);
    expect(parseDuration('x', '1m0s')).toBe(60_000);
    expect(parseDuration('x', '1500us')).toBe(1.5);
    expect(parseDuration('x', '2h45m30.5s')).toBe(9_930_500);
  });

  it('rejects bad durations, naming the flag and value', () => {
    for (const bad of ['', 'abc', '10x', '5 m', '-1s', 's', '1h-5m']) {
      expectOptionError(() => parseDuration('http-client-timeout', bad), '--http-client-timeout', JSON.stringify(bad));
    }
  });

  it('parses integers and floats with bounds', () => {
    expect(parseInt('uid', '1000')).toBe(1000);
    expect(parseInt('uid', '-1', -1)).toBe(-1);
    expect(parseInt('uid', '+7')).toBe(7);
    expectOptionError(() => parseInt('uid', '-2', -1), '--uid', '"-2"', 'at least -1');
    expectOptionError(() => parseInt('prometheus-port', '70000', 0, 65535), '--prometheus-port', 'at most 65535');
    expectOptionError(() => parseInt('uid', '1.5'), '--uid', 'integer');
    expectOptionError(() => parseInt('uid', 'ten'), '--uid', '"ten"');
    expectOptionError(() => parseInt('uid', '99999999999999999999'), '--uid');
    expect(parseFloat('retry-multiplier', '1.5')).toBe(1.5);
    expect(parseFloat('retry-multiplier', '2')).toBe(2);
    expect(parseFloat('limit-ops-per-sec', '-1')).toBe(-1);
    expect(parseFloat('x', '1e3')).toBe(1000);
    expectOptionError(() => parseFloat('retry-multiplier', '0.5', 1), '--retry-multiplier', 'at least 1');
    expectOptionError(() => parseFloat('retry-multiplier', 'two'), '--retry-multiplier', '"two"');
  });

  it('parses booleans', () => {
    for (const t of ['true', 'TRUE', 'True', '1', 'yes', 't']) expect(parseBool('x', t)).toBe(true);
    for (const f of ['false', 'False', '0', 'no', 'f']) expect(parseBool('x', f)).toBe(false);
    expectOptionError(() => parseBool('implicit-dirs', 'maybe'), '--implicit-dirs', '"maybe"');
  });

  it('parses octal modes', () => {
    expect(parseOctal('file-mode', '0644')).toBe(0o644);
    expect(parseOctal('file-mode', '644')).toBe(0o644);
    expect(parseOctal('file-mode', '0o644')).toBe(0o644);
    expect(parseOctal('dir-mode', '0777')).toBe(0o777);
    expect(parseOctal('dir-mode', '0')).toBe(0);
    expectOptionError(() => parseOctal('file-mode', '0888'), '--file-mode', '"0888"');
    expectOptionError(() => parseOctal('file-mode', '1777'), '--file-mode', 'at most 0777');
    expectOptionError(() => parseOctal('file-mode', 'rw-r--r--'), '--file-mode');
    expectOptionError(() => parseOctal('file-mode', ''), '--file-mode');
  });

  it('maps TTL seconds to a tagged union', () => {
    expect(ttlFromSeconds(-1)).toEqual({ kind: 'forever' });
    expect(ttlFromSeconds(0)).toEqual({ kind: 'off' });
    expect(ttlFromSeconds(60)).toEqual({ kind: 'ms', ms: 60_000 });
    expect(() => ttlFromSeconds(-2)).toThrow(OptionError);
    expect(() => ttlFromSeconds(1.5)).toThrow(OptionError);
  });

  it('maps MiB size limits to a tagged union', () => {
    expect(sizeLimitFromMb(-1)).toEqual({ kind: 'unlimited' });
    expect(sizeLimitFromMb(0)).toEqual({ kind: 'off' });
    expect(sizeLimitFromMb(33)).toEqual({ kind: 'bytes', bytes: 33 * 1024 * 1024 });
    expect(() => sizeLimitFromMb(-5)).toThrow(OptionError);
  });
});

describe('the parameter table', () => {
  it('has unique flags and unique config keys', () => {
    const flags = params.map((p) => p.flag);
    expect(new Set(flags).size).toBe(flags.length);
    const keys = params.map((p) => p.configKey).filter((k): k is string => k !== null);
    expect(new Set(keys).size).toBe(keys.length);
    // No config key is also a section of another key.
    for (const k of keys) expect(keys.some((other) => other.startsWith(k + '.'))).toBe(false);
  });

  it('contains every gcsfuse flag the brief requires, with their effect', () => {
    const required = [
      'implicit-dirs', 'only-dir', 'stat-cache-ttl', 'type-cache-ttl', 'metadata-cache-ttl-secs',
      'metadata-cache-negative-ttl-secs', 'stat-cache-max-size-mb', 'type-cache-max-size-mb',
      'kernel-list-cache-ttl-secs', 'cache-dir', 'file-cache-max-size-mb', 'file-cache-enable-parallel-downloads',
      'file-cache-max-parallel-downloads', 'file-cache-parallel-downloads-per-file', 'file-cache-download-chunk-size-mb',
      'file-cache-cache-file-for-range-read', 'enable-buffered-read', 'read-global-max-blocks', 'max-conns-per-host',
      'max-idle-conns-per-host', 'http-client-timeout', 'max-retry-sleep', 'max-retry-attempts', 'retry-multiplier',
      'sequential-read-size-mb', 'limit-ops-per-sec', 'limit-bytes-per-sec', 'log-file', 'log-severity', 'log-format',
      'config-file', 'foreground', 'key-file', 'token-url', 'reuse-token-from-url', 'anonymous-access',
      'custom-endpoint', 'billing-project', 'client-protocol', 'prometheus-port', 'o', 'uid', 'gid', 'file-mode',
      'dir-mode', 'rename-dir-limit', 'temp-dir', 'app-name', 'debug_fuse', 'debug_gcs', 'debug_fs',
      'block-size-mb', 'whole-object-threshold-mb',
    ];
    for (const f of required) expect(PARAM_BY_FLAG.has(f), f).toBe(true);
    // What the table says an option does is checked against the code, not against a copy of the table:
    // an option marked effective is read outside the table (values['flag'], v.flag, get*(opts, 'flag')),
    // and one marked ignored or planned is read nowhere.
    const files: string[] = [];
    const walk = (dir: string) => {
      for (const name of readdirSync(dir)) {
        const path = join(dir, name);
        if (statSync(path).isDirectory()) walk(path);
        else if (name.endsWith('.ts') && path !== PARAMS_FILE && !path.startsWith(PARAMS_DIR)) files.push(path);
      }
    };
    walk(fileURLToPath(new URL('../src', import.meta.url)));
    const code = files.map((f) => readFileSync(f, 'utf8')).join('\n');
    for (const p of params) {
      const read = code.includes(`'${p.flag}'`) || (/^[a-z]+$/.test(p.flag) && new RegExp(`\\.${p.flag}\\b`).test(code));
      expect(read, `${p.flag} is ${p.effect}`).toBe(p.effect === 'effective');
    }
    expect(PARAM_BY_FLAG.get('o')!.type).toBe('string-list');
    expect(PARAM_BY_FLAG.get('block-size-mb')!.configKey).toBe('gcsmount.block-size-mb');
    expect(PARAM_BY_FLAG.get('whole-object-threshold-mb')!.configKey).toBe('gcsmount.whole-object-threshold-mb');
  });

  it('has gcsfuse defaults and config keys for the metadata cache and GCS connection', () => {
    const expected: Record<string, [string, unknown]> = {
      'metadata-cache-ttl-secs': ['metadata-cache.ttl-secs', 60],
      'metadata-cache-negative-ttl-secs': ['metadata-cache.negative-ttl-secs', 5],
      'stat-cache-max-size-mb': ['metadata-cache.stat-cache-max-size-mb', 33],
      'type-cache-max-size-mb': ['metadata-cache.type-cache-max-size-mb', 4],
      'kernel-list-cache-ttl-secs': ['file-system.kernel-list-cache-ttl-secs', 0],
      'stat-cache-ttl': ['metadata-cache.deprecated-stat-cache-ttl', 60_000],
      'max-conns-per-host': ['gcs-connection.max-conns-per-host', 0],
      'max-idle-conns-per-host': ['gcs-connection.max-idle-conns-per-host', 100],
      // gcsmount's own default (gcsfuse: 0): a silent GCS is cut after a minute, not undici's 300 s.
      'http-client-timeout': ['gcs-connection.http-client-timeout', 60_000],
      // gcsmount's own default (gcsfuse: 200): here it caps readahead held in memory per open file.
      'sequential-read-size-mb': ['gcs-connection.sequential-read-size-mb', 128],
      // gcsmount's own default (gcsfuse: 16 downloads of 200 MiB chunks): each of its GETs is one block.
      'file-cache-parallel-downloads-per-file': ['file-cache.parallel-downloads-per-file', 32],
      'max-retry-sleep': ['gcs-retries.max-retry-sleep', 30_000],
      'max-retry-attempts': ['gcs-retries.max-retry-attempts', 0],
      'retry-multiplier': ['gcs-retries.multiplier', 2],
      'file-cache-max-size-mb': ['file-cache.max-size-mb', -1],
      'log-severity': ['logging.severity', 'info'],
      'uid': ['file-system.uid', -1],
      'file-mode': ['file-system.file-mode', 0o644],
      'dir-mode': ['file-system.dir-mode', 0o755],
      'o': ['file-system.fuse-options', []],
    };
    for (const [flag, [key, def]] of Object.entries(expected)) {
      const p = PARAM_BY_FLAG.get(flag)!;
      expect(p.configKey, flag).toBe(key);
      expect(p.default, flag).toEqual(def);
    }
  });

  it('has defaults of the right type that pass their own validation', () => {
    for (const p of params) {
      switch (p.type) {
        case 'bool':
          expect(typeof p.default, p.flag).toBe('boolean');
          break;
        case 'string':
          expect(typeof p.default, p.flag).toBe('string');
          if (p.choices) expect(p.choices, p.flag).toContain(p.default);
          break;
        case 'string-list':
          expect(Array.isArray(p.default), p.flag).toBe(true);
          break;
        default: {
          expect(typeof p.default, p.flag).toBe('number');
          const v = p.default as number;
          if (p.min !== undefined) expect(v, p.flag).toBeGreaterThanOrEqual(p.min);
          if (p.max !== undefined) expect(v, p.flag).toBeLessThanOrEqual(p.max);
        }
      }
      expect(p.help.length, p.flag).toBeGreaterThan(0);
      expect(p.help, p.flag).not.toContain('\n');
    }
  });
});

describe('parseMountArgs: command line', () => {
  it('takes BUCKET and MOUNTPOINT and defaults everything else', () => {
    const o = parse('my-bucket', '/mnt/data');
    expect(o.bucket).toBe('my-bucket');
    expect(o.mountPoint).toBe('/mnt/data');
    expect(o.notices).toEqual([]);
    for (const p of params) {
      expect(o.sources[p.flag as keyof typeof o.sources], p.flag).toBe('default');
      expect(o.values[p.flag as keyof typeof o.values], p.flag).toEqual(p.default);
    }
    expect(getNumber(o, 'metadata-cache-ttl-secs')).toBe(60);
    expect(getTtl(o, 'metadata-cache-ttl-secs')).toEqual({ kind: 'ms', ms: 60_000 });
    expect(getTtl(o, 'kernel-list-cache-ttl-secs')).toEqual({ kind: 'off' });
    expect(getSizeLimit(o, 'stat-cache-max-size-mb')).toEqual({ kind: 'bytes', bytes: 33 * 1024 * 1024 });
    expect(getSizeLimit(o, 'file-cache-max-size-mb')).toEqual({ kind: 'unlimited' });
  });

  it('accepts --flag value, --flag=value, -flag value and -flag=value', () => {
    for (const argv of [
      ['--uid', '1000', 'b', '/m'],
      ['--uid=1000', 'b', '/m'],
      ['-uid', '1000', 'b', '/m'],
      ['-uid=1000', 'b', '/m'],
    ]) {
      const o = parse(...argv);
      expect(getNumber(o, 'uid'), argv.join(' ')).toBe(1000);
      expect(o.sources.uid).toBe('flag');
      expect([o.bucket, o.mountPoint]).toEqual(['b', '/m']);
    }
  });

  it('accepts flags before, between and after the positionals', () => {
    const o = parse('--foreground', 'b', '--uid', '5', '/m', '--gid=6', '--only-dir', 'a/b');
    expect([o.bucket, o.mountPoint]).toEqual(['b', '/m']);
    expect(getBool(o, 'foreground')).toBe(true);
    expect(getNumber(o, 'uid')).toBe(5);
    expect(getNumber(o, 'gid')).toBe(6);
    expect(getString(o, 'only-dir')).toBe('a/b');
  });

  it('takes a negative number as a flag value', () => {
    expect(getNumber(parse('--metadata-cache-ttl-secs', '-1', 'b', '/m'), 'metadata-cache-ttl-secs')).toBe(-1);
    expect(getTtl(parse('--metadata-cache-ttl-secs', '-1', 'b', '/m'), 'metadata-cache-ttl-secs')).toEqual({ kind: 'forever' });
    // 0 downloads in flight would start none: every cold read hung. -1 (no limit) and positive numbers pass.
    expectOptionError(() => parse('--file-cache-max-parallel-downloads', '0', 'b', '/m'), '--file-cache-max-parallel-downloads', 'use -1');
    expect(getNumber(parse('--file-cache-max-parallel-downloads', '-1', 'b', '/m'), 'file-cache-max-parallel-downloads')).toBe(-1);
  });

  it('handles boolean flags: bare, =true, =false, and never eats the next word', () => {
    expect(getBool(parse('--foreground', 'b', '/m'), 'foreground')).toBe(true);
    expect(getBool(parse('-foreground', 'b', '/m'), 'foreground')).toBe(true);
    expect(getBool(parse('--foreground=true', 'b', '/m'), 'foreground')).toBe(true);
    expect(getBool(parse('--foreground=false', 'b', '/m'), 'foreground')).toBe(false);
    expect(getBool(parse('--anonymous-access=1', 'b', '/m'), 'anonymous-access')).toBe(true);
    const o = parse('--foreground', 'true', '/m');
    expect(o.bucket).toBe('true');
    expectOptionError(() => parse('--foreground=sometimes', 'b', '/m'), '--foreground', '"sometimes"');
  });

  it('collects -o options: comma-separated, repeatable, joined form', () => {
    const o = parse('-o', 'allow_other', '-o', 'ro,default_permissions', 'b', '/m', '-onosuid', '--o=noexec');
    expect(getStringList(o, 'o')).toEqual(['allow_other', 'ro', 'default_permissions', 'nosuid', 'noexec']);
    expect(o.sources.o).toBe('flag');
  });

  it('parses duration, octal and choice flags', () => {
    const o = parse('--http-client-timeout', '1m30s', '--max-retry-sleep=10', '--stat-cache-ttl', '200ms',
      '--file-mode', '0640', '--dir-mode=750', '--log-severity', 'TRACE', '--log-format=text', 'b', '/m');
    expect(getDurationMs(o, 'http-client-timeout')).toBe(90_000);
    expect(getDurationMs(o, 'max-retry-sleep')).toBe(10_000);
    expect(getDurationMs(o, 'stat-cache-ttl')).toBe(200);
    expect(getNumber(o, 'file-mode')).toBe(0o640);
    expect(getNumber(o, 'dir-mode')).toBe(0o750);
    expect(getString(o, 'log-severity')).toBe('trace');
    expect(getString(o, 'log-format')).toBe('text');
    expectOptionError(() => parse('--log-severity', 'loud', 'b', '/m'), '--log-severity', '"loud"', 'trace');
  });

  it('lets the last of a repeated flag win', () => {
    expect(getNumber(parse('--uid', '1', '--uid', '2', 'b', '/m'), 'uid')).toBe(2);
  });

  it('treats everything after -- as positional', () => {
    const o = parse('--uid', '3', '--', '-weird-bucket', '/m');
    expect(o.bucket).toBe('-weird-bucket');
  });

  it('expands and absolutizes path options', () => {
    const o = parse('--key-file', '~/key.json', '--log-file', 'rel/log.json', 'b', '/m');
    expect(getString(o, 'key-file')).toBe('/home/tester/key.json');
    expect(getString(o, 'log-file')).toBe(resolve('rel/log.json'));
  });

  it('rejects unknown flags, naming them and suggesting a near match', () => {
    expectOptionError(() => parse('--no-such-flag', 'b', '/m'), '--no-such-flag');
    expectOptionError(() => parse('--metdata-cache-ttl-secs', '5', 'b', '/m'), '--metdata-cache-ttl-secs', 'did you mean --metadata-cache-ttl-secs');
    expectOptionError(() => parse('b', '/m', '-x'), '-x');
  });

  it('rejects bad values, naming the flag and value', () => {
    expectOptionError(() => parse('--uid', 'root', 'b', '/m'), '--uid', '"root"');
    expectOptionError(() => parse('--metadata-cache-ttl-secs', '-2', 'b', '/m'), '--metadata-cache-ttl-secs', '"-2"');
    expectOptionError(() => parse('--file-mode', '999', 'b', '/m'), '--file-mode', '"999"');
    expectOptionError(() => parse('--http-client-timeout', 'soon', 'b', '/m'), '--http-client-timeout', '"soon"');
    expectOptionError(() => parse('b', '/m', '--uid'), '--uid', 'needs a value');
  });

  it('rejects missing, extra and dynamic-mount positionals', () => {
    expectOptionError(() => parse(), 'missing BUCKET and MOUNTPOINT');
    expectOptionError(() => parse('--foreground'), 'missing BUCKET and MOUNTPOINT');
    expectOptionError(() => parse('bucket'), 'missing MOUNTPOINT');
    expectOptionError(() => parse('b', '/m', 'extra'), 'extra', '"extra"');
    expectOptionError(() => parse('_', '/m'), "'_'", 'not supported');
  });

  it('recognises help requests', () => {
    expect(wantsHelp(['--help'])).toBe(true);
    expect(wantsHelp(['b', '-h'])).toBe(true);
    expect(wantsHelp(['b', '/m'])).toBe(false);
    expect(wantsHelp(['--', '--help'])).toBe(false);
  });
});

describe('parseMountArgs: config file', () => {
  const gcsfuseConfig = `
# a gcsfuse config file
implicit-dirs: true
only-dir: datasets/imagenet
metadata-cache:
  ttl-secs: -1
  negative-ttl-secs: 0
  stat-cache-max-size-mb: 1024
  type-cache-max-size-mb: -1
file-cache:
  max-size-mb: 2048
  cache-file-for-range-read: true
cache-dir: /var/cache/gcsmount
gcs-connection:
  max-conns-per-host: 64
  http-client-timeout: 45s
gcs-retries:
  max-retry-sleep: 1m
logging:
  severity: warning
  format: text
  log-rotate:
    max-file-size-mb: 100
file-system:
  uid: 1000
  gid: 1000
  file-mode: 0444
  dir-mode: 555
  fuse-options:
    - allow_other
    - ro
gcs-auth:
  anonymous-access: true
gcsmount:
  block-size-mb: 8
`;

  it('applies gcsfuse-layout YAML', () => {
    const file = yamlFile(gcsfuseConfig);
    const o = parse('--config-file', file, 'b', '/m');
    expect(getString(o, 'config-file')).toBe(file);
    expect(getString(o, 'only-dir')).toBe('datasets/imagenet');
    expect(getTtl(o, 'metadata-cache-ttl-secs')).toEqual({ kind: 'forever' });
    expect(getTtl(o, 'metadata-cache-negative-ttl-secs')).toEqual({ kind: 'off' });
    expect(getNumber(o, 'stat-cache-max-size-mb')).toBe(1024);
    expect(getSizeLimit(o, 'type-cache-max-size-mb')).toEqual({ kind: 'unlimited' });
    expect(getNumber(o, 'file-cache-max-size-mb')).toBe(2048);
    expect(getString(o, 'cache-dir')).toBe('/var/cache/gcsmount');
    expect(getNumber(o, 'max-conns-per-host')).toBe(64);
    expect(getDurationMs(o, 'http-client-timeout')).toBe(45_000);
    expect(getDurationMs(o, 'max-retry-sleep')).toBe(60_000);
    expect(getString(o, 'log-severity')).toBe('warning');
    expect(getNumber(o, 'log-rotate-max-file-size-mb')).toBe(100);
    expect(getNumber(o, 'uid')).toBe(1000);
    expect(getNumber(o, 'file-mode')).toBe(0o444);
    expect(getNumber(o, 'dir-mode')).toBe(0o555);
    expect(getStringList(o, 'o')).toEqual(['allow_other', 'ro']);
    expect(getBool(o, 'anonymous-access')).toBe(true);
    expect(getNumber(o, 'block-size-mb')).toBe(8);
    expect(o.sources['metadata-cache-ttl-secs']).toBe('config');
    expect(o.sources['max-idle-conns-per-host']).toBe('default');
    expect(getNumber(o, 'max-idle-conns-per-host')).toBe(100);
  });

  it('lets flags override the config file, which overrides defaults', () => {
    const file = yamlFile(gcsfuseConfig);
    const o = parse('b', '/m', '--metadata-cache-ttl-secs=30', '--config-file', file, '-o', 'nosuid', '--uid', '7');
    expect(getNumber(o, 'metadata-cache-ttl-secs')).toBe(30);
    expect(o.sources['metadata-cache-ttl-secs']).toBe('flag');
    expect(getStringList(o, 'o')).toEqual(['nosuid']);
    expect(getNumber(o, 'uid')).toBe(7);
    expect(getNumber(o, 'gid')).toBe(1000);
    expect(o.sources.gid).toBe('config');
    expect(getNumber(o, 'kernel-list-cache-ttl-secs')).toBe(0);
    expect(o.sources['kernel-list-cache-ttl-secs']).toBe('default');
  });

  it('accepts an empty config file and empty sections', () => {
    expect(parse('--config-file', yamlFile(''), 'b', '/m').notices).toEqual([]);
    const o = parse('--config-file', yamlFile('metadata-cache:\nlogging:\n  severity:\n'), 'b', '/m');
    expect(getString(o, 'log-severity')).toBe('info');
  });

  it('accepts fuse-options as a comma-separated string', () => {
    const o = parse('--config-file', yamlFile('file-system:\n  fuse-options: allow_other,ro\n'), 'b', '/m');
    expect(getStringList(o, 'o')).toEqual(['allow_other', 'ro']);
  });

  it('rejects unknown keys, naming the full key', () => {
    const file = yamlFile('metadata-cache:\n  ttl-sec: 5\n');
    expectOptionError(() => parse('--config-file', file, 'b', '/m'), "'metadata-cache.ttl-sec'", file, "did you mean 'metadata-cache.ttl-secs'");
    expectOptionError(() => parse('--config-file', yamlFile('no-such-section:\n  x: 1\n'), 'b', '/m'), "'no-such-section'");
    expectOptionError(() => parse('--config-file', yamlFile('gcsmount:\n  bogus: 1\n'), 'b', '/m'), "'gcsmount.bogus'");
  });

  it('rejects bad values, naming the key', () => {
    expectOptionError(
      () => parse('--config-file', yamlFile('metadata-cache:\n  ttl-secs: forever\n'), 'b', '/m'),
      "'metadata-cache.ttl-secs'", '"forever"',
    );
    expectOptionError(() => parse('--config-file', yamlFile('file-system:\n  uid: [1, 2]\n'), 'b', '/m'), "'file-system.uid'");
    expectOptionError(() => parse('--config-file', yamlFile('metadata-cache: 5\n'), 'b', '/m'), "'metadata-cache'");
    expectOptionError(() => parse('--config-file', yamlFile('implicit-dirs:\n  x: 1\n'), 'b', '/m'), "'implicit-dirs'");
  });

  it('rejects unreadable and invalid config files', () => {
    const missing = join(tmp, 'missing.yaml');
    expectOptionError(() => parse('--config-file', missing, 'b', '/m'), 'cannot read config file', missing, 'ENOENT');
    expectOptionError(() => parse('--config-file', yamlFile('a: [1\n'), 'b', '/m'), 'invalid YAML');
    expectOptionError(() => parse('--config-file', yamlFile('- a\n- b\n'), 'b', '/m'), 'mapping');
    expectOptionError(() => parse('--config-file', yamlFile('uid: 1\nuid: 2\n'), 'b', '/m'), 'invalid YAML');
  });
});

describe('notices', () => {
  it('names each ignored, planned or deprecated option the user set', () => {
    const file = yamlFile('write:\n  enable-rapid-appends: false\n');
    const o = parse('--client-protocol', 'grpc', '--stat-cache-ttl', '10s', '--debug_fuse',
      '--config-file', file, 'b', '/m');
    expect(o.notices).toHaveLength(4);
    expect(o.notices.find((s) => s.startsWith('--client-protocol'))).toMatch(/accepted for gcsfuse compatibility and ignored.*own transport/);
    expect(o.notices.find((s) => s.startsWith('--stat-cache-ttl'))).toMatch(/deprecated: use --metadata-cache-ttl-secs/);
    expect(o.notices.find((s) => s.startsWith('--debug_fuse'))).toMatch(/ignored.*log-severity trace/);
    expect(o.notices.find((s) => s.includes("'write.enable-rapid-appends'"))).toMatch(/ignored/);
    for (const line of o.notices) expect(line).not.toContain('\n');
  });

  it("takes gcsfuse's options that have no counterpart here, checks their values, and names each one set", () => {
    const file = yamlFile(
      [
        'enable-hns: true',
        'file-system:',
        '  enable-kernel-reader: true',
        '  disable-parallel-dirops: true',
        'list:',
        '  enable-empty-managed-folders: true',
        'write:',
        '  create-empty-file: true',
        'trace:',
        '  sampling-ratio: 0.5',
        'cloud-profiler:',
        '  enabled: false',
        '',
      ].join('\n'),
    );
    const o = parse('--enable-rapid-writes', '--strong-consistency-on-open=false', '--config-file', file, 'b', '/m');
    // The two that gcsmount implements take effect, with no notice.
    expect(o.values['create-empty-file']).toBe(true);
    expect(o.values['disable-parallel-dirops']).toBe(true);
    expect(o.notices.map((n) => n.split(' is ')[0]).sort()).toEqual(
      [
        "config key 'enable-hns'",
        "config key 'file-system.enable-kernel-reader'",
        "config key 'list.enable-empty-managed-folders'",
        "config key 'trace.sampling-ratio'",
        "config key 'cloud-profiler.enabled'",
        '--enable-rapid-writes',
        '--strong-consistency-on-open',
      ].sort(),
    );
    expect(o.notices.find((n) => n.includes("'enable-hns'"))).toMatch(/ignored \(hierarchical-namespace/);
    for (const line of o.notices) expect(line).not.toContain('\n');
    // Their values are still checked, and a misspelt key is still an error.
    expectOptionError(() => parse('--trace-sampling-ratio', 'half', 'b', '/m'), 'trace-sampling-ratio');
    expectOptionError(() => parse('--config-file', yamlFile('enable-hns: maybe\n'), 'b', '/m'), 'enable-hns');
    expectOptionError(() => parse('--config-file', yamlFile('enable-hsn: true\n'), 'b', '/m'), "unknown key 'enable-hsn'");
  });

  it('gives none for effective options and warns about no-op settings', () => {
    expect(parse('--uid', '5', '--implicit-dirs', 'b', '/m').notices).toEqual([]);
    expect(parse('--implicit-dirs=false', 'b', '/m').notices.join()).toMatch(/always treats object prefixes as directories/);
    // rw is the default (writes are on); ro turns them off: neither is a no-op worth a notice.
    expect(parse('-o', 'rw', 'b', '/m').notices).toEqual([]);
    expect(parse('-o', 'ro', 'b', '/m').notices).toEqual([]);
  });
});

describe('metadataCacheTtl', () => {
  it('follows gcsfuse rules for the deprecated TTL flags', () => {
    expect(metadataCacheTtl(parse('b', '/m'))).toEqual({ kind: 'ms', ms: 60_000 });
    expect(metadataCacheTtl(parse('--stat-cache-ttl', '1500ms', 'b', '/m'))).toEqual({ kind: 'ms', ms: 2000 });
    expect(metadataCacheTtl(parse('--stat-cache-ttl', '2m', '--type-cache-ttl', '30s', 'b', '/m'))).toEqual({ kind: 'ms', ms: 30_000 });
    expect(metadataCacheTtl(parse('--type-cache-ttl', '0', 'b', '/m'))).toEqual({ kind: 'off' });
    expect(metadataCacheTtl(parse('--stat-cache-ttl', '5s', '--metadata-cache-ttl-secs', '-1', 'b', '/m'))).toEqual({ kind: 'forever' });
  });
});

describe('help and docs', () => {
  const help = formatHelp();

  it('has the usage line and the subcommands', () => {
    expect(help).toContain('gcsmount [flags] BUCKET MOUNTPOINT');
    for (const s of ['gcsmount unmount MOUNTPOINT', 'gcsmount emulator --root DIR [--port N]']) {
      expect(help).toContain(s);
    }
  });

  it('lists every param with its default, help and marker, grouped', () => {
    const lines = help.split('\n');
    for (const p of params) {
      const label = p.flag.length === 1 ? `-${p.flag}` : `--${p.flag}`;
      const line = lines.find((l) => l.trimStart().startsWith(label + ' ') || l.trim() === label);
      expect(line, p.flag).toBeDefined();
      expect(line, p.flag).toContain(`default ${formatValue(p, p.default)}`);
      expect(line, p.flag).toContain(p.help);
      if (p.effect === 'planned') expect(line, p.flag).toContain('[not yet effective]');
      if (p.effect === 'ignored') expect(line, p.flag).toContain('[ignored: gcsfuse compatibility]');
      if (p.effect === 'effective') expect(line, p.flag).not.toMatch(/not yet effective|ignored: gcsfuse/);
    }
    expect(help).toContain('Metadata cache:');
    expect(help).toMatch(/--metadata-cache-ttl-secs <int>\s+default 60 /);
    expect(help).toMatch(/--file-mode <octal>\s+default 0644 /);
    expect(help).toMatch(/--max-retry-sleep <duration>\s+default 30s /);
  });

  it('renders a Markdown table row per param', () => {
    const md = optionsTableMarkdown();
    const rows = md.trim().split('\n');
    expect(rows[0]).toMatch(/^\| Flag \| Config key \| Type \| Default \| Effect \| Description \|$/);
    expect(rows).toHaveLength(params.length + 2);
    expect(md).toContain('| `--metadata-cache-ttl-secs` | `metadata-cache.ttl-secs` | int | `60` | effective |');
  });
});

describe('call sites', () => {
  // The accessors only accept flags of the right type at compile time; this also checks the plain
  // string uses (values['...'] and get*(opts, '...')) across src/ name real params.
  it('name only real params', () => {
    const files: string[] = [];
    const walk = (dir: string) => {
      for (const name of readdirSync(dir)) {
        const path = join(dir, name);
        if (statSync(path).isDirectory()) walk(path);
        else if (name.endsWith('.ts')) files.push(path);
      }
    };
    walk(fileURLToPath(new URL('../src', import.meta.url)));
    const use = /(?:values\[\s*'([^']+)'\s*\]|\bget(?:Bool|Number|String|DurationMs|StringList|Ttl|SizeLimit)\(\s*[\w.]+\s*,\s*'([^']+)')/g;
    for (const file of files) {
      const text = readFileSync(file, 'utf8');
      for (const m of text.matchAll(use)) {
        const flag = m[1] ?? m[2]!;
        expect(PARAM_BY_FLAG.has(flag), `${file}: ${flag}`).toBe(true);
      }
    }
  });
});

describe("the disk cache's include and exclude patterns (gcsfuse's --file-cache-*-regex)", () => {
  it('match BUCKET/OBJECT anywhere unless anchored; exclusion wins; either alone works', () => {
    const both = cacheFilter('era5', '^era5/zarr/', '\\.tmp$')!;
    expect(both('zarr/t2m/0.0')).toBe(true);
    expect(both('zarr/t2m/0.0.tmp')).toBe(false); // included and excluded: excluded
    expect(both('logs/x')).toBe(false); // not included
    expect(cacheFilter('era5', '', 'scratch')!('a/scratch/b')).toBe(false);
    expect(cacheFilter('era5', '', 'scratch')!('a/b')).toBe(true);
    expect(cacheFilter('era5', 'era5/a', '')!('x/b')).toBe(false); // the bucket name comes first: era5/x/b
    expect(cacheFilter('era5', 'era5/a', '')!('a/b')).toBe(true);
    expect(cacheFilter('era5', '', '')).toBeNull();
  });

  it("take Go's leading flags and named groups, and refuse a pattern that is no regular expression with one line (exit 2)", () => {
    expect(cacheFilter('b', '(?i)\\.ZARR/', '')!('x.zarr/0')).toBe(true);
    expect(cacheFilter('b', '(?P<store>[a-z]+)\\.zarr/', '')!('era.zarr/0')).toBe(true);
    expect(cacheFilter('b', '', 'a\\-b')!('a-b')).toBe(false);
    // Only a group's opening is a named group: an escaped paren, or one in a class, is itself.
    const literal = cacheFilter('b', '', '\\(?P<x>')!;
    expect([literal('<x>'), literal('P<x>'), literal('(P<x>')]).toEqual([true, false, false]);
    const inClass = cacheFilter('b', '', '^b/[(?P<]$')!;
    expect([inClass('P'), inClass('x')]).toEqual([false, true]);
    // Asked again (every block of an object asks), the answer is the same.
    expect([literal('<x>'), literal('(P<x>')]).toEqual([true, false]);
    // RE2's text anchors, and a dash escaped in a class (the dash, not a range).
    const tmp = cacheFilter('b', '', '\\.tmp\\z')!;
    expect([tmp('x.tmp'), tmp('x.tmp.keep')]).toEqual([false, true]);
    expect(cacheFilter('b', '\\Ab/zarr/', '')!('zarr/0')).toBe(true);
    expect(cacheFilter('b', '\\Azarr/', '')!('zarr/0')).toBe(false);
    const dash = cacheFilter('b', '', '^b/[a\\-c]$')!;
    expect([dash('-'), dash('b')]).toEqual([false, true]);
    // RE2 forms JavaScript would read as something else are refused, never read wrongly.
    for (const re2 of ['[[:digit:]]', '\\pL', '\\Q.\\E']) expectOptionError(() => parse('--file-cache-include-regex', re2, 'b', '/m'), '--file-cache-include-regex');
    expectOptionError(() => parse('--file-cache-exclude-regex', '(unclosed', 'b', '/m'), '--file-cache-exclude-regex', 'not a regular expression gcsmount can read');
    expectOptionError(() => parse('--file-cache-include-regex', '(?U)a+', 'b', '/m'), '--file-cache-include-regex', '(?U)');
    expect(parse('--file-cache-include-regex', '(?i)x', 'b', '/m').values['file-cache-include-regex']).toBe('(?i)x');
  });
});

describe("gcsfuse's --profile", () => {
  it("sets its workload's defaults for what the user left unset, and names them", () => {
    const o = parse('--profile', 'aiml-checkpointing', 'b', '/m');
    expect(metadataCacheTtl(o)).toEqual({ kind: 'forever' });
    expect(getTtl(o, 'metadata-cache-negative-ttl-secs')).toEqual({ kind: 'off' });
    expect(getSizeLimit(o, 'stat-cache-max-size-mb')).toEqual({ kind: 'unlimited' });
    expect(getNumber(o, 'rename-dir-limit')).toBe(200_000);
    expect(getNumber(o, 'kernel-list-cache-ttl-secs')).toBe(0);
    expect(o.notices.find((n) => n.startsWith('--profile aiml-checkpointing sets'))).toContain('--rename-dir-limit 200000');
    expect(getNumber(parse('--config-file', yamlFile('profile: aiml-serving\n'), 'b', '/m'), 'kernel-list-cache-ttl-secs')).toBe(-1);
    expect(getNumber(parse('--profile', 'aiml-training', 'b', '/m'), 'rename-dir-limit')).toBe(0);
  });

  it('leaves what the user set, by flag, config key or the deprecated TTL flags, and refuses an unknown profile', () => {
    const o = parse('--profile', 'aiml-training', '--metadata-cache-ttl-secs', '30', '--config-file', yamlFile('metadata-cache:\n  negative-ttl-secs: 7\n'), 'b', '/m');
    expect(metadataCacheTtl(o)).toEqual({ kind: 'ms', ms: 30_000 });
    expect(getTtl(o, 'metadata-cache-negative-ttl-secs')).toEqual({ kind: 'ms', ms: 7_000 });
    expect(getSizeLimit(o, 'stat-cache-max-size-mb')).toEqual({ kind: 'unlimited' });
    expect(metadataCacheTtl(parse('--profile', 'aiml-training', '--stat-cache-ttl', '10s', 'b', '/m'))).toEqual({ kind: 'ms', ms: 10_000 });
    expectOptionError(() => parse('--profile', 'aiml-gaming', 'b', '/m'), '--profile', 'aiml-gaming');
  });
});

describe("gcsfuse's deprecated --stat-cache-capacity", () => {
  it('becomes the stat cache size where --stat-cache-max-size-mb is not set (1,720 bytes an entry, whole MiB up), over a profile too', () => {
    expect(getSizeLimit(parse('--stat-cache-capacity', '100000', 'b', '/m'), 'stat-cache-max-size-mb')).toEqual({ kind: 'bytes', bytes: 165 * 2 ** 20 });
    expect(getSizeLimit(parse('--stat-cache-capacity', '100000', '--stat-cache-max-size-mb', '8', 'b', '/m'), 'stat-cache-max-size-mb')).toEqual({ kind: 'bytes', bytes: 8 * 2 ** 20 });
    expect(getSizeLimit(parse('--stat-cache-capacity', '0', '--profile', 'aiml-training', 'b', '/m'), 'stat-cache-max-size-mb')).toEqual({ kind: 'off' });
    expect(getSizeLimit(parse('b', '/m'), 'stat-cache-max-size-mb')).toEqual({ kind: 'bytes', bytes: 33 * 2 ** 20 });
  });
});

// `gcsmount --help`, each subcommand's help and the docs' table of options, all generated from the
// option table (params.ts): nothing here lists an option by hand.

import { GCSFUSE_ONLY_PARAMS, GROUPS, PARAMS, type Param } from './params.js';
import { formatDuration, optionLabel } from './values.js';

function typeHint(p: Param): string {
  switch (p.type) {
    case 'bool':
      return '';
    case 'int':
      return '<int>';
    case 'float':
      return '<number>';
    case 'duration':
      return '<duration>';
    case 'octal':
      return '<octal>';
    case 'string-list':
      return '<opt,...>';
    case 'string':
      // An empty choice is the default's 'none' (--profile), not a value to show.
      if (p.choices) return `<${p.choices.filter((c) => c !== '').join('|')}>`;
      return p.path ? '<path>' : '<string>';
  }
}

/** A value as the user would write it: 0644, 60s, "", none. */
export function formatValue(p: Param, value: unknown): string {
  switch (p.type) {
    case 'octal':
      return '0' + (value as number).toString(8).padStart(3, '0');
    case 'duration':
      return formatDuration(value as number);
    case 'string-list': {
      const list = value as readonly string[];
      return list.length === 0 ? 'none' : list.join(',');
    }
    case 'string':
      return value === '' ? '""' : String(value);
    default:
      return String(value);
  }
}

function marker(p: Param): string {
  const parts: string[] = [];
  if (p.effect === 'planned') parts.push('[not yet effective]');
  if (p.effect === 'ignored') parts.push('[ignored: gcsfuse compatibility]');
  if (p.deprecated) parts.push(`[deprecated: ${p.deprecated}]`);
  return parts.length ? ' ' + parts.join(' ') : '';
}

// Only commands that exist: each later one joins this list when it lands.
const SUBCOMMANDS: readonly (readonly [string, string])[] = [
  ['gcsmount [flags] BUCKET MOUNTPOINT', 'mount BUCKET at MOUNTPOINT (read-write; -o ro for read-only)'],
  ['gcsmount stats [MOUNTPOINT] [--json] [--watch [SECONDS]] [--cache-dir DIR]', "what a mount's caches and downloads are doing"],
  ['gcsmount warm MOUNTPOINT PATH...', 'download everything under PATH into the block cache'],
  ['gcsmount unmount MOUNTPOINT', 'unmount and stop the daemon'],
  ['gcsmount wait (MOUNTPOINT | --config-file FILE) [--timeout SECONDS]', 'exit 0 once the mount answers (systemd readiness)'],
  ['gcsmount cache info|verify|clear --cache-dir DIR [--json]', 'inspect, check or empty the block cache of a stopped mount'],
  ['gcsmount emulator --root DIR [--port N]', 'serve DIR as a local GCS emulator'],
];

/** `gcsmount NAME --help`: the subcommand's usage line and what it does; null for an unknown name. */
export function subcommandHelp(name: string): string | null {
  const entry = SUBCOMMANDS.find(([usage]) => usage.startsWith(`gcsmount ${name} `));
  return entry ? `usage: ${entry[0]}\n${entry[1]}\n` : null;
}

/** The full `gcsmount --help` text. */
export function formatHelp(): string {
  const params = PARAMS as readonly Param[];
  const flagCol = (p: Param) => {
    const hint = typeHint(p);
    return `${optionLabel(p.flag)}${hint ? ' ' + hint : ''}`;
  };
  const defCol = (p: Param) => `default ${formatValue(p, p.default)}`;
  const w1 = Math.min(44, Math.max(...params.map((p) => flagCol(p).length)));
  const w2 = Math.min(20, Math.max(...params.map((p) => defCol(p).length)));
  const cw = Math.max(...SUBCOMMANDS.map(([c]) => c.length));

  const lines: string[] = [
    'Usage: gcsmount [flags] BUCKET MOUNTPOINT',
    '',
    'Mount a Google Cloud Storage bucket, with caching, read-write as gcsfuse does (-o ro: read-only).',
    'A drop-in for gcsfuse: same flags, same YAML config file (--config-file).',
    '',
    'Commands:',
    ...SUBCOMMANDS.map(([c, d]) => `  ${c.padEnd(cw)}  ${d}`),
    '',
    'Flags: --flag value, --flag=value or -flag value; booleans: --flag or --flag=true|false.',
    'Precedence: command-line flags, then the config file, then defaults.',
    'Durations: 30s, 5m, 1h30m, 200ms. TTLs in seconds: -1 = forever, 0 = off. Sizes in MiB: -1 = unlimited.',
  ];
  for (const group of GROUPS) {
    const members = params.filter((p) => p.group === group);
    if (members.length === 0) continue;
    lines.push('', `${group}:`);
    for (const p of members) {
      lines.push(`  ${flagCol(p).padEnd(w1)}  ${defCol(p).padEnd(w2)}  ${p.help}${marker(p)}`);
    }
  }
  lines.push(
    `  Also accepted: ${GCSFUSE_ONLY_PARAMS.length} more of gcsfuse's options that have no counterpart here (telemetry export, its reader's`,
    '  and gRPC tuning, Rapid and hierarchical-namespace buckets, experiments): their values are checked, and each one set is',
    '  named in a warning saying why it does nothing.',
  );
  lines.push('', '  -h, --help'.padEnd(w1 + 2) + '  ' + ''.padEnd(w2) + '  show this help');
  return lines.join('\n') + '\n';
}

function mdCell(s: string): string {
  return s.replace(/\|/g, '\\|');
}

/** A Markdown table of every option, for the docs. */
export function optionsTableMarkdown(): string {
  const effectText = { effective: 'effective', planned: 'not yet effective', ignored: 'ignored (gcsfuse compatibility)' };
  const rows = (PARAMS as readonly Param[]).map((p) => {
    const flag = `\`${optionLabel(p.flag)}\``;
    const key = p.configKey ? `\`${p.configKey}\`` : '—';
    const type = p.choices ? `${p.type} (${p.choices.filter((c) => c !== '').join(', ')})` : p.type;
    const def = `\`${formatValue(p, p.default)}\``;
    const help = p.help + (p.deprecated ? ` Deprecated: ${p.deprecated}.` : '');
    return `| ${[flag, key, type, def, effectText[p.effect], help].map(mdCell).join(' | ')} |`;
  });
  return [
    '| Flag | Config key | Type | Default | Effect | Description |',
    '| --- | --- | --- | --- | --- | --- |',
    ...rows,
  ].join('\n') + '\n';
}

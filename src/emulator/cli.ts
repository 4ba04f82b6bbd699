// `gcsmount emulator`: serve a folder as a local GCS JSON API endpoint until SIGINT/SIGTERM.
import { Command, CommanderError, InvalidArgumentError, Option } from 'commander';
import { promises as fsp } from 'node:fs';
import path from 'node:path';
import type { EmulatorKnobs } from './faults.js';
import { bucketNameError } from './names.js';
import { startEmulator } from './server.js';

interface CliOptions {
  root: string;
  port: number;
  host: string;
  latencyMs?: number;
  listMsPerEntry?: number;
  bandwidthMbps?: number;
  rate429?: number;
  rate503?: number;
  retryAfter?: number;
  resetRate?: number;
  shortBodyRate?: number;
  pageSize?: number;
  seed?: number;
  rateLimit?: number;
  rateLimitBurst?: number;
  bodyStallRate?: number;
  bodyStallMs?: number;
  bodyStallHangUp?: boolean;
  createBucket: string[];
  quiet?: boolean;
}

const number = (what: string, check: (n: number) => string | null) => (v: string): number => {
  const n = Number(v);
  if (v.trim() === '' || !Number.isFinite(n)) throw new InvalidArgumentError(`${what} must be a number.`);
  const bad = check(n);
  if (bad) throw new InvalidArgumentError(bad);
  return n;
};
const nonNegative = (what: string) => number(what, (n) => (n < 0 ? `${what} must not be negative.` : null));
const rate = (what: string) => number(what, (n) => (n < 0 || n > 1 ? `${what} must be within 0..1.` : null));
const integer = (what: string, min: number, max: number) =>
  number(what, (n) => (!Number.isInteger(n) || n < min || n > max ? `${what} must be an integer within ${min}..${max}.` : null));

function buildCommand(): Command {
  return new Command('gcsmount emulator')
    .description('Serve a folder (one sub-folder per bucket) as a local Google Cloud Storage JSON API.')
    .requiredOption('--root <dir>', 'folder holding one sub-folder per bucket')
    .option('--port <n>', 'port to listen on (0 = any free port)', integer('port', 0, 65535), 4443)
    .option('--host <addr>', 'address to listen on', '127.0.0.1')
    .option('--latency-ms <ms>', 'delay before the first byte of every API response', nonNegative('latency'))
    .option('--list-ms-per-entry <ms>', 'extra delay of a list response per entry it returns (real GCS: 0.1-0.3 ms)', nonNegative('list-ms-per-entry'))
    .option('--bandwidth-mbps <MB/s>', 'cap each response body at this many MB (10^6 bytes) per second; 0 = unlimited', nonNegative('bandwidth'))
    .option('--rate-429 <p>', 'probability (0..1) of answering an API request 429', rate('rate-429'))
    .option('--rate-503 <p>', 'probability (0..1) of answering an API request 503', rate('rate-503'))
    .option('--retry-after <s>', 'send Retry-After with injected 429/503', nonNegative('retry-after'))
    .option('--reset-rate <p>', 'probability (0..1) of resetting the connection mid-way through a media body', rate('reset-rate'))
    .option('--short-body-rate <p>', 'probability (0..1) of ending a media body after about half', rate('short-body-rate'))
    .option('--page-size <n>', 'largest objects.list page', integer('page-size', 1, 1000))
    .option('--seed <n>', 'seed for the fault dice', integer('seed', -(2 ** 31), 2 ** 32))
    .option('--rate-limit <req/s>', 'requests per second accepted from all clients together; beyond it, 429 (Retry-After with --retry-after); 0 = none', nonNegative('rate-limit'))
    .option('--rate-limit-burst <n>', 'requests the rate limit lets through at once after a quiet spell (default: a fifth of a second\'s worth)', nonNegative('rate-limit-burst'))
    .option('--body-stall-rate <p>', 'probability (0..1) that a media body goes silent part-way, the connection kept open', rate('body-stall-rate'))
    .option('--body-stall-ms <ms>', 'how long a stalled body stays silent (default 60000)', nonNegative('body-stall-ms'))
    .option('--body-stall-hang-up', 'reset the connection after the silence instead of sending the rest')
    .addOption(
      new Option('--create-bucket <name>', 'create this bucket folder first (repeatable)')
        .argParser((v: string, prev: string[]) => {
          const bad = bucketNameError(v);
          if (bad) throw new InvalidArgumentError(bad);
          return [...prev, v];
        })
        .default([]),
    )
    .option('--quiet', 'do not log each request to stderr')
    .exitOverride()
    .configureOutput({ outputError: (msg, write) => write(msg.split('\n')[0]!.trim() + '\n') });
}

function knobsFrom(o: CliOptions): Partial<EmulatorKnobs> {
  const k: Partial<EmulatorKnobs> = {};
  if (o.latencyMs !== undefined) k.latencyMs = o.latencyMs;
  if (o.listMsPerEntry !== undefined) k.listMsPerEntry = o.listMsPerEntry;
  if (o.bandwidthMbps !== undefined) k.bandwidthBytesPerSec = Math.round(o.bandwidthMbps * 1e6);
  if (o.rate429 !== undefined) k.rate429 = o.rate429;
  if (o.rate503 !== undefined) k.rate503 = o.rate503;
  if (o.retryAfter !== undefined) k.retryAfterSeconds = o.retryAfter;
  if (o.resetRate !== undefined) k.resetRate = o.resetRate;
  if (o.shortBodyRate !== undefined) k.shortBodyRate = o.shortBodyRate;
  if (o.pageSize !== undefined) k.pageSize = o.pageSize;
  if (o.seed !== undefined) k.seed = o.seed;
  if (o.rateLimit !== undefined) k.rateLimit = o.rateLimit;
  if (o.rateLimitBurst !== undefined) k.rateLimitBurst = o.rateLimitBurst;
  if (o.bodyStallRate !== undefined) k.bodyStallRate = o.bodyStallRate;
  if (o.bodyStallMs !== undefined) k.bodyStallMs = o.bodyStallMs;
  if (o.bodyStallHangUp) k.bodyStallResumes = false;
  return k;
}

/** `argv` is what follows `gcsmount emulator`. Resolves 0 after a clean shutdown, 2 on bad usage. */
export async function runEmulatorCli(argv: string[]): Promise<number> {
  const cmd = buildCommand();
  try {
    await cmd.parseAsync(argv, { from: 'user' });
  } catch (e) {
    if (e instanceof CommanderError) return e.code === 'commander.helpDisplayed' || e.code === 'commander.version' ? 0 : 2;
    throw e;
  }
  const o = cmd.opts<CliOptions>();
  const root = path.resolve(o.root);
  const st = await fsp.stat(root).catch(() => null);
  if (!st?.isDirectory()) {
    process.stderr.write(`error: --root ${o.root} is not an existing directory\n`);
    return 2;
  }
  for (const b of o.createBucket) await fsp.mkdir(path.join(root, b), { recursive: true });

  let emu;
  try {
    emu = await startEmulator({
      root,
      port: o.port,
      host: o.host,
      knobs: knobsFrom(o),
      ...(o.quiet ? {} : { log: (line: string) => process.stderr.write(line + '\n') }),
    });
  } catch (e) {
    process.stderr.write(`error: cannot listen on ${o.host}:${o.port}: ${(e as Error).message}\n`);
    return 1;
  }
  process.stdout.write(`gcsmount emulator listening on ${emu.url} (root ${root})\n`);

  await new Promise<void>((resolve) => {
    const stop = (): void => {
      process.off('SIGINT', stop);
      process.off('SIGTERM', stop);
      resolve();
    };
    process.on('SIGINT', stop);
    process.on('SIGTERM', stop);
  });
  await emu.close();
  return 0;
}

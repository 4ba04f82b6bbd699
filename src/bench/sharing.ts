import { createHash, randomBytes } from 'node:crypto';
import { promises as fsp } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import type { RequestLogEntry } from '../emulator/server.js';
import { mountGcsmount, mountStats, sh, startExternalEmulator, timed, type ExternalEmulator } from './harness.js';

const MIB = 1024 * 1024;
const DAEMONS = 3;
const READERS = 8;
const FILES = 900;
const LIMIT = 60;
const LATENCY_MS = 30;
const BUCKET = 'sharing-bench';
/**
 * The convergence run: the same three daemons reading long enough for AIMD to even their rates out
 * (its time constant is about rate / step, some 10 s at 20/s and +2/s, and the 15 s job above is set
 * by its start). Shares count requests, so the files are small: 1,500 of 128 KiB per daemon, about
 * 75 s of all three reading at 60/s.
 */
const LONG_FILES = 4500;
const LONG_FILE_BYTES = 128 * 1024;
const WINDOW_S = 10;

async function mountExternal(emu: ExternalEmulator, dir: string, name: string, args: string[]): Promise<{ path: string; logFile: string; unmount(): Promise<void> }> {
  const path = join(dir, `mnt-${name}`);
  await fsp.mkdir(path, { recursive: true });
  const logFile = join(dir, `${name}.log`);
  return { ...(await mountGcsmount(emu.url, BUCKET, path, logFile, args)), logFile };
}

/** One window of the run: each daemon's share of the media requests answered in it, and its 429s. */
interface ShareWindow {
  fromS: number;
  toS: number;
  answered: number;
  shares: number[];
  throttled: number[];
}

interface SharingRun {
  label: string;
  seconds: number;
  readErrors: number;
  wrongBytes: number;
  okRequests: number;
  throttled: number;
  total: number;
  /** Per daemon: successful media requests, finishing time, and its own request/429 counts. */
  daemons: { media: number; shareWhileAll: number; finishedS: number; requests: number; throttled: number; rate: number | null; waits: number }[];
  /** Windows of WINDOW_S from the first media request until the first daemon's last answer (the last one partial). */
  windows: ShareWindow[];
}

/** Which files each daemon reads: `files` objects `c0..` under `${prefix}${d}/`. */
interface FileSet {
  prefix: string;
  files: number;
}

const SHORT_SET: FileSet = { prefix: 'd', files: FILES };
const LONG_SET: FileSet = { prefix: 'e', files: LONG_FILES };

/** Three daemons, eight readers each, reading their own share of the file set through one 60/s bucket. */
async function sharingRun(emu: ExternalEmulator, dir: string, digests: Map<string, string>, slug: string, label: string, args: string[], set: FileSet = SHORT_SET): Promise<SharingRun> {
  const mounts: Awaited<ReturnType<typeof mountExternal>>[] = [];
  for (let d = 0; d < DAEMONS; d++) mounts.push(await mountExternal(emu, dir, `${slug}-${d}`, ['--only-dir', `${set.prefix}${d}`, ...args]));
  // Let the bucket's token bucket refill after the mounts' own requests.
  await new Promise((r) => setTimeout(r, 1000));
  await emu.resetStats();
  let readErrors = 0;
  let wrongBytes = 0;
  const finished: number[] = [];
  const t = await timed(() =>
    Promise.all(
      mounts.map(async (m, d) => {
        const t0 = performance.now();
        await Promise.all(
          Array.from({ length: READERS }, async (_, r) => {
            const names = Array.from({ length: set.files / DAEMONS }, (_, i) => i).filter((i) => i % READERS === r);
            const res = await sh('sha256sum', names.map((i) => join(m.path, `c${i}`)));
            if (res.code !== 0) readErrors += (res.stderr.match(/\n/g) ?? []).length || 1;
            for (const line of res.stdout.trim().split('\n')) {
              const [sum, path] = line.split('  ');
              const name = `${set.prefix}${d}/${path!.slice(m.path.length + 1)}`;
              if (digests.get(name) !== sum) wrongBytes++;
            }
          }),
        );
        finished[d] = (performance.now() - t0) / 1000;
      }),
    ),
  );
  const log = await emu.requestLog();
  const per = await Promise.all(mounts.map((m) => mountStats(m.path)));
  for (const m of mounts) await m.unmount();
  const api = log.filter((e) => e.kind !== 'other');
  const throttled = api.filter((e) => e.status === 429).length;
  // Shares while all three were reading: media answered to each before the first daemon's last one.
  const mediaOk = log.filter((e) => e.kind === 'media' && e.status !== 429 && e.status !== 0);
  const of = (d: number) => (e: RequestLogEntry) => e.object?.startsWith(`${set.prefix}${d}/`) ?? false;
  const lastOf = (d: number) => Math.max(...mediaOk.filter(of(d)).map((e) => e.endMs));
  const firstDone = Math.min(...Array.from({ length: DAEMONS }, (_, d) => lastOf(d)));
  const early = mediaOk.filter((e) => e.endMs <= firstDone);
  const media = log.filter((e) => e.kind === 'media');
  const start = Math.min(...media.map((e) => e.startMs));
  const windows: ShareWindow[] = [];
  for (let from = start; from < firstDone; from += WINDOW_S * 1000) {
    const to = Math.min(firstDone, from + WINDOW_S * 1000);
    const ok = mediaOk.filter((e) => e.endMs >= from && e.endMs < to);
    const t429 = media.filter((e) => e.status === 429 && e.endMs >= from && e.endMs < to);
    windows.push({
      fromS: (from - start) / 1000,
      toS: (to - start) / 1000,
      answered: ok.length,
      shares: Array.from({ length: DAEMONS }, (_, d) => ok.filter(of(d)).length / Math.max(1, ok.length)),
      throttled: Array.from({ length: DAEMONS }, (_, d) => t429.filter(of(d)).length),
    });
  }
  return {
    label,
    seconds: t.seconds,
    readErrors,
    wrongBytes,
    okRequests: api.filter((e) => e.status !== 429 && e.status !== 0).length,
    throttled,
    total: api.length,
    daemons: per.map((s, d) => ({
      media: mediaOk.filter(of(d)).length,
      shareWhileAll: early.filter(of(d)).length / early.length,
      finishedS: finished[d]!,
      requests: ['bucket', 'list', 'metadata', 'media'].reduce((a, k) => a + (s.counters[`gcs_requests_${k}`] ?? 0), 0),
      throttled: s.counters.gcs_throttled ?? 0,
      rate: s.gauges.gcs_rate_limit ?? null,
      waits: s.counters.gcs_rate_waits ?? 0,
    })),
    windows,
  };
}

/** 100 MiB read once with 10% of bodies going silent for 60 s, against the same read without stalls. */
async function stallRun(emu: ExternalEmulator, dir: string, digest: string, label: string, stallRate: number): Promise<string> {
  await emu.setKnobs({ rateLimit: 0, bodyStallRate: stallRate, bodyStallMs: 60_000, bodyStallResumes: true, seed: 15 });
  const m = await mountExternal(emu, dir, `stall-${stallRate}`, []);
  await emu.resetStats();
  const t = await timed(() => sh('sha256sum', [join(m.path, 'big.bin')]));
  if (t.result.code !== 0) throw new Error(`stall run: ${t.result.stderr}`);
  const stats = await emu.stats();
  const s = await mountStats(m.path);
  await m.unmount();
  const right = t.result.stdout.split(' ')[0] === digest;
  return `| ${label} | ${(stallRate * 100).toFixed(0)}% | ${t.seconds.toFixed(1)} s | ${stats.injected['body-stall']} | ${s.counters.gcs_stalls ?? 0} | ${s.counters.gcs_resumed_reads ?? 0} | ${stats.requests.media} | ${right ? 'yes' : '**NO**'} |`;
}

/** Writes `set`'s files of `bytes` each under the bucket, recording their digests. */
async function writeFileSet(root: string, set: FileSet, bytes: number, digests: Map<string, string>): Promise<void> {
  for (let d = 0; d < DAEMONS; d++) {
    await fsp.mkdir(join(root, BUCKET, `${set.prefix}${d}`), { recursive: true });
    for (let i = 0; i < set.files / DAEMONS; i++) {
      const data = randomBytes(bytes);
      digests.set(`${set.prefix}${d}/c${i}`, createHash('sha256').update(data).digest('hex'));
      await fsp.writeFile(join(root, BUCKET, `${set.prefix}${d}`, `c${i}`), data);
    }
  }
}

/** The shares of the long run per window, goodput and 429s over all of it: whether the rates converge. */
function convergenceTable(r: SharingRun): string[] {
  const pct = (x: number) => `${(100 * x).toFixed(1)}%`;
  const inBand = (w: ShareWindow) => w.shares.every((x) => x >= 0.28 && x <= 0.39);
  return [
    `| window (s from the first media request) | media answered (/s) | shares d0 / d1 / d2 | every share within 0.28-0.39 | 429s on media d0 / d1 / d2 |`,
    '|---|---|---|---|---|',
    ...r.windows.map(
      (w) =>
        `| ${w.fromS.toFixed(0)}-${w.toS.toFixed(1)} | ${w.answered} (${(w.answered / (w.toS - w.fromS)).toFixed(1)}/s) | ${w.shares.map(pct).join(' / ')} | ${inBand(w) ? 'yes' : '**no**'} | ${w.throttled.join(' / ')} |`,
    ),
    '',
    `Whole run: ${r.seconds.toFixed(1)} s, goodput **${(r.okRequests / r.seconds / LIMIT).toFixed(2)}** of the limit, **${pct(r.throttled / r.total)}** of requests answered 429 (${r.throttled} of ${r.total}), ${r.readErrors} read errors, ${r.wrongBytes} wrong digests; finished at ${r.daemons.map((d) => `${d.finishedS.toFixed(1)} s`).join(' / ')}; shares while all three read ${r.daemons.map((d) => pct(d.shareWhileAll)).join(' / ')}; rate at end ${r.daemons.map((d) => (d.rate === null ? '-' : `${d.rate}/s`)).join(' / ')}.`,
  ];
}

export async function sharingScenario(): Promise<string> {
  const dir = await fsp.mkdtemp(join(tmpdir(), 'gcsmount-bench-sharing-'));
  const root = join(dir, 'root');
  const digests = new Map<string, string>();
  await writeFileSet(root, SHORT_SET, MIB, digests);
  await writeFileSet(root, LONG_SET, LONG_FILE_BYTES, digests);
  const big = randomBytes(100 * MIB);
  await fsp.writeFile(join(root, BUCKET, 'big.bin'), big);
  const bigDigest = createHash('sha256').update(big).digest('hex');
  const emu = await startExternalEmulator(root, { latencyMs: LATENCY_MS });
  const runs: SharingRun[] = [];
  const stalls: string[] = [];
  let long: SharingRun;
  try {
    // What this machine can do at all: the same reads with no limit in the emulator (goodput over 60/s
    // above 1 means the limit binds; below 1, the machine does).
    runs.push(await sharingRun(emu, dir, digests, 'unlimited', 'capacity: no limit in the emulator', []));
    await emu.setKnobs({ rateLimit: LIMIT });
    runs.push(await sharingRun(emu, dir, digests, 'aimd', 'gcsmount (request-rate AIMD)', []));
    await emu.setKnobs({ rateLimit: 0 });
    await emu.setKnobs({ rateLimit: LIMIT });
    runs.push(await sharingRun(emu, dir, digests, 'baseline', 'baseline: no rate limiter (--initial-ops-per-sec 0, concurrency AIMD only)', ['--initial-ops-per-sec', '0']));
    stalls.push(await stallRun(emu, dir, bigDigest, 'no stalls (baseline)', 0));
    stalls.push(await stallRun(emu, dir, bigDigest, 'stalling bodies', 0.1));
    // Last, so the rows above are made as before: the stall runs leave the limit off.
    await emu.setKnobs({ rateLimit: LIMIT, bodyStallRate: 0 });
    long = await sharingRun(emu, dir, digests, 'long', 'convergence', [], LONG_SET);
  } finally {
    await emu.close();
    await fsp.rm(dir, { recursive: true, force: true });
  }
  const pct = (x: number) => `${(100 * x).toFixed(1)}%`;
  return [
    `Emulator in its own process, ${LATENCY_MS} ms to first byte, a shared limit of ${LIMIT} requests/s (token bucket, a fifth of a second of burst) answering 429 beyond it. ${DAEMONS} daemons (\`--only-dir dK\`, defaults otherwise), ${READERS} reader processes each (\`sha256sum\` of its files), ${FILES} files of 1 MiB (${FILES / DAEMONS} per daemon). Goodput: API requests answered other than 429 per second, over the limit.`,
    '',
    '| run | wall time | goodput / limit | requests answered 429 | read errors | wrong bytes | per daemon: share while all three read, finished at, requests, 429s, rate at end |',
    '|---|---|---|---|---|---|---|',
    ...runs.map((r) => {
      const per = r.daemons
        .map((d, i) => `d${i}: ${pct(d.shareWhileAll)}, ${d.finishedS.toFixed(1)} s, ${d.requests}, ${d.throttled}, ${d.rate === null ? '-' : `${d.rate}/s`}`)
        .join('; ');
      return `| ${r.label} | ${r.seconds.toFixed(1)} s | **${(r.okRequests / r.seconds / LIMIT).toFixed(2)}** | **${pct(r.throttled / r.total)}** (${r.throttled} of ${r.total}) | ${r.readErrors} | ${r.wrongBytes} | ${per} |`;
    }),
    '',
    'Stalls: `sha256sum` of one 100 MiB object through a fresh mount (4 MiB range GETs, readahead), no rate limit, bodies going silent for 60 s part-way (the connection kept open) with the given probability; defaults (stall timeout: the p99 of recent silences within 1.5 s..20 min, 5 s until five have been timed).',
    '',
    '| run | bodies stalling | wall time | stalled bodies | cut by gcsmount | resumed by Range | media requests | bytes right |',
    '|---|---|---|---|---|---|---|---|',
    ...stalls,
    '',
    `Convergence: the same three daemons and limit (defaults), ${READERS} readers each, ${LONG_FILES} files of ${LONG_FILE_BYTES / 1024} KiB (${LONG_FILES / DAEMONS} per daemon, one media request each), long enough for AIMD to even the rates out. Shares per ${WINDOW_S} s window while all three read: each daemon's share of the media requests answered in it (the last window ends at the first daemon's last answer).`,
    '',
    ...convergenceTable(long),
  ].join('\n');
}

import { spawn, type ChildProcess } from 'node:child_process';
import { createHash, randomBytes } from 'node:crypto';
import { promises as fsp } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { createInterface } from 'node:readline';
import { fileURLToPath } from 'node:url';
import { startEmulator, type Emulator } from '../emulator/server.js';
import { controlRequest } from '../observe/control-server.js';
import { controlSocketFor } from '../observe/runtime-dir.js';

const GCSMOUNT = fileURLToPath(new URL('../../bin/gcsmount', import.meta.url));
// The compiled reader, whether this module runs from dist/ or (under vitest) from src/.
const READER = fileURLToPath(new URL('../../dist/torture/reader.js', import.meta.url));
const MIB = 1024 * 1024;

export interface TortureOptions {
  seconds: number;
  readers: number;
  objects: number;
  /** Readers of a folder of small chunk files, whole and in name order (default 2), and its files (default 24). */
  sweepers?: number;
  chunkFiles?: number;
  seed: number;
  log?: (line: string) => void;
}

export interface TortureReport {
  reads: number;
  bytesCompared: number;
  mismatches: number;
  /** Reads that failed (EIO while retries ran out, ENOTCONN during a restart): allowed, never wrong. */
  errors: number;
  errorCodes: Record<string, number>;
  /**
   * Failed reads that neither a restart (from the SIGKILL to a few seconds after the new daemon mounted)
   * nor a replacement of that object just before explains: injected faults, which retries should absorb.
   */
  unexplainedErrors: number;
  /** Daemons that exited without being told to (code, and the end of their stderr). */
  daemonDeaths: string[];
  unexplainedSamples: string[];
  /**
   * GCS requests the daemons gave up on (their logs' "GCS request failed" or "gave up" lines), but for
   * 404 and 412 (a replaced generation): an injected fault that was not retried away.
   */
  gcsGaveUp: number;
  /** Reads of a generation older than the ones still kept for comparison: neither right nor wrong. */
  unverifiable: number;
  faultsInjected: Record<string, number>;
  replacements: number;
  restarts: number;
  latencySpikes: number;
  pageCacheDrops: number;
  /**
   * The daemons' native read path, summed over each daemon's life (asked of its control socket before
   * each SIGKILL and at the end): reads answered by the addon, those that waited there for a block on its
   * way to disk, the blocks whose reads it answered from the download's memory (lent until the file
   * landed), and the reads it gave back to JavaScript.
   */
  native: { reads: number; waited: number; lent: number; fallbacks: number };
  mismatchSamples: string[];
  /** Where the daemons' log was kept when a read was wrong or failed unexplained (else null: removed). */
  keptLog: string | null;
}

/** Every generation of one object that a reader may still have open, newest last. */
const KEEP_GENERATIONS = 4;

interface ReadLine {
  name: string;
  offset: number;
  length: number;
  got?: number;
  sha?: string;
  chunks?: string[];
  error?: string;
  /** A failed read's start and end (epoch ms, the reader's clock: the same machine's). */
  began?: number;
  ended?: number;
}

const CHUNK = 64 * 1024;
/**
 * How long a replacement or a restart explains a failed read. A read that had the object open when it
 * was replaced may fail (its generation is gone), as may an open within the 1 s metadata TTL; a read is
 * at most 16 MiB, a few seconds under latency spikes. Each object is replaced only every 22 s.
 */
const EXPLAINS_MS = 5_000;

/** Which generation each 64 KiB piece of a wrong read matches (-1: none), for the mismatch report. */
function anatomy(r: ReadLine, versions: readonly Buffer[]): string {
  const parts = (r.chunks ?? []).map((h, i) => {
    const at = r.offset + i * CHUNK;
    for (let v = versions.length - 1; v >= 0; v--) {
      const piece = versions[v]!.subarray(at, Math.min(at + CHUNK, r.offset + r.got!));
      if (piece.length > 0 && sha(piece).slice(0, 16) === h) return v;
    }
    return -1;
  });
  const runs: string[] = [];
  for (let i = 0; i < parts.length; ) {
    let j = i;
    while (j < parts.length && parts[j] === parts[i]) j++;
    runs.push(`${(r.offset + i * CHUNK).toString(16)}+${(j - i) * 64}KiB:v${parts[i]}`);
    i = j;
  }
  return `sizes ${versions.map((v) => v.length).join('/')}; ${runs.join(' ')}`;
}

const sha = (b: Buffer) => createHash('sha256').update(b).digest('hex');

/** statfs's f_type of a FUSE file system. */
const FUSE_SUPER_MAGIC = 0x65735546;

/**
 * The differential torture test: readers in other processes read random ranges of random objects through
 * the mount, and every byte is compared with the source, while the emulator injects 429s, 503s,
 * connection resets, short bodies and latency spikes, objects are replaced by new generations, the cache
 * is small enough to evict all the time, and the daemon is SIGKILLed and started again.
 */
export async function runTorture(opts: TortureOptions): Promise<TortureReport> {
  const log = opts.log ?? (() => undefined);
  const dir = await fsp.mkdtemp(join(tmpdir(), 'gcsmount-torture-'));
  const bucket = 'torture';
  const root = join(dir, 'root');
  const mnt = join(dir, 'mnt');
  const cacheDir = join(dir, 'cache');
  await fsp.mkdir(join(root, bucket, 'data'), { recursive: true });
  await fsp.mkdir(mnt);

  // Sizes from 1 B to 20 MiB: one block, several blocks, whole-object fetches, and the edges.
  const sizes = [1, 4096, MIB - 1, MIB + 1, 4 * MIB, 4 * MIB + 1, 7 * MIB, 8 * MIB, 9 * MIB + 3, 12 * MIB, 20 * MIB];
  const history = new Map<string, Buffer[]>();
  const names: string[] = [];
  for (let i = 0; i < opts.objects; i++) {
    const name = `data/obj-${String(i).padStart(2, '0')}.bin`;
    const content = randomBytes(sizes[i % sizes.length]!);
    await fsp.writeFile(join(root, bucket, name), content);
    history.set(name, [content]);
    names.push(name);
  }
  // A folder of chunk files, 1 B to 1.5 MiB, which the sweepers read whole in order while the folder's
  // prefetch fetches ahead of them: their opens find blocks still downloading, and replacements and
  // eviction meet those waiting reads too.
  const chunkSizes = [1, 64 * 1024, 200_000, MIB - 1, MIB, MIB + 1, 1.5 * MIB];
  const chunkNames: string[] = [];
  await fsp.mkdir(join(root, bucket, 'chunks'));
  for (let i = 0; i < (opts.chunkFiles ?? 24); i++) {
    const name = `chunks/c-${String(i).padStart(3, '0')}`;
    const content = randomBytes(chunkSizes[i % chunkSizes.length]!);
    await fsp.writeFile(join(root, bucket, name), content);
    history.set(name, [content]);
    chunkNames.push(name);
  }
  const maxSize = Math.max(...sizes) + MIB;

  const emulator: Emulator = await startEmulator({
    root,
    port: 0,
    knobs: { rate429: 0.05, rate503: 0.03, resetRate: 0.03, shortBodyRate: 0.03, seed: opts.seed },
  });
  const report: TortureReport = { reads: 0, bytesCompared: 0, mismatches: 0, errors: 0, errorCodes: {}, unexplainedErrors: 0, unexplainedSamples: [], daemonDeaths: [], gcsGaveUp: 0, unverifiable: 0, faultsInjected: {}, replacements: 0, restarts: 0, latencySpikes: 0, pageCacheDrops: 0, native: { reads: 0, waited: 0, lent: 0, fallbacks: 0 }, mismatchSamples: [], keptLog: null };

  let daemon: ChildProcess | null = null;
  const logFile = join(dir, 'gcsmount.log');
  const startDaemon = async () => {
    // Released block buffers are overwritten with a pattern: bytes used after their release read wrong.
    const env: NodeJS.ProcessEnv = { ...process.env, METADATA_SERVER_DETECTION: 'none', GCSMOUNT_POISON_RELEASED_BLOCKS: '1' };
    delete env.STORAGE_EMULATOR_HOST;
    // A memory budget of 8 blocks for readers of up to 16 MiB each: reads wait for memory and take it
    // back from each other all the time, under the same faults.
    const args = [bucket, mnt, '--foreground', '--custom-endpoint', emulator.url, '--cache-dir', cacheDir, '--file-cache-max-size-mb', '24', '--memory-limit-mb', '32',
      '--metadata-cache-ttl-secs', '1', '--metadata-cache-negative-ttl-secs', '1', '--max-retry-sleep', '1s', '--log-file', logFile];
    const d = spawn(GCSMOUNT, args, { env, stdio: ['ignore', 'ignore', 'pipe'] });
    daemon = d;
    let stderr = '';
    d.stderr!.on('data', (b: Buffer) => (stderr = (stderr + b.toString()).slice(-2000)));
    // A daemon that dies unasked is a finding of its own: its last words go into the report.
    d.once('exit', (code, signal) => {
      if (signal !== 'SIGKILL' && signal !== 'SIGTERM' && code !== 0) report.daemonDeaths.push(`exit ${code ?? signal}: ${stderr.trim().split('\n').slice(-3).join(' | ')}`);
    });
    const deadline = Date.now() + 30_000;
    for (;;) {
      // After a SIGKILL the dead daemon's mount is still listed (ENOTCONN) until the new one replaces
      // it, and stat may still answer from the kernel's cached attributes (seen: "mounted" half a second
      // before the new daemon was). statfs always reaches the daemon: a dead mount fails it, and a FUSE
      // file system answering it is the new daemon's (not the bare folder between the two mounts).
      // (fsp runs on libuv's pool: the emulator's loop stays free.)
      const fs = await fsp.statfs(mnt).catch(() => null);
      if (fs?.type === FUSE_SUPER_MAGIC) return;
      if (daemon.exitCode !== null || Date.now() > deadline) throw new Error(`the daemon did not mount (see ${logFile})`);
      await new Promise((r) => setTimeout(r, 50));
    }
  };

  /** Adds the live daemon's native read counters to the report (a daemon that does not answer adds nothing). */
  const countNativeReads = async () => {
    const stats = await controlRequest<{ counters: Record<string, number> }>(await controlSocketFor(mnt), '/stats', 'GET', 10_000);
    if (!stats) return;
    report.native.reads += stats.counters.native_reads ?? 0;
    report.native.waited += stats.counters.native_reads_waited ?? 0;
    report.native.lent += stats.counters.native_blocks_lent ?? 0;
    report.native.fallbacks += stats.counters.native_fallbacks ?? 0;
  };

  const replacedAt = new Map<string, number>();
  /** From each SIGKILL to when the daemon after it mounted (Infinity while it has not). */
  const restarts: { killed: number; mounted: number }[] = [];
  const check = (r: ReadLine) => {
    report.reads++;
    if (r.error !== undefined) {
      report.errors++;
      report.errorCodes[r.error] = (report.errorCodes[r.error] ?? 0) + 1;
      // Judged by when the read ran, not by when its line reached this busy process (seen 13 s late).
      const began = r.began ?? Date.now();
      const ended = r.ended ?? began;
      const byRestart = restarts.some((x) => ended >= x.killed && began <= x.mounted + EXPLAINS_MS);
      const byReplacement = began - (replacedAt.get(r.name) ?? Number.NEGATIVE_INFINITY) <= EXPLAINS_MS;
      if (!byRestart && !byReplacement) {
        report.unexplainedErrors++;
        if (report.unexplainedSamples.length < 10) report.unexplainedSamples.push(`${r.error} ${r.name} [${r.offset}, +${r.length})`);
      }
      return;
    }
    const versions = history.get(r.name)!;
    for (let v = versions.length - 1; v >= 0; v--) {
      const want = versions[v]!.subarray(r.offset, r.offset + r.length);
      if (want.length === r.got && sha(want) === r.sha) {
        report.bytesCompared += r.got;
        return;
      }
    }
    if (versions.length >= KEEP_GENERATIONS) {
      report.unverifiable++;
      return;
    }
    report.mismatches++;
    if (report.mismatchSamples.length < 10) {
      report.mismatchSamples.push(`${r.name} [${r.offset}, +${r.length}) got ${r.got}: ${anatomy(r, versions)}`);
    }
  };

  try {
    await startDaemon();
    const deadline = Date.now() + opts.seconds * 1000;
    const sweepers = opts.sweepers ?? 2;
    const readers = Array.from({ length: opts.readers + sweepers }, (_, i) => {
      const what = i < opts.readers ? ['random', ...names] : ['sweep', 'chunks'];
      const child = spawn(process.execPath, [READER, mnt, String(deadline), String(opts.seed * 1000 + i + 1), String(maxSize), ...what], { stdio: ['ignore', 'pipe', 'inherit'] });
      const lines = createInterface({ input: child.stdout! });
      lines.on('line', (l) => check(JSON.parse(l) as ReadLine));
      return new Promise<void>((resolve, reject) =>
        child.on('close', (code) => (code === 0 ? resolve() : reject(new Error(`a reader exited with code ${code}`)))),
      );
    });

    let tick = 0;
    while (Date.now() < deadline) {
      await new Promise((r) => setTimeout(r, 500));
      tick++;
      if (tick % 4 === 0) {
        // A new generation: remembered before it exists, so no reader can see it first. Every other
        // one is of a chunk file, which a sweeper may be waiting on.
        const chunk = tick % 8 === 4 && chunkNames.length > 0;
        const name = chunk ? chunkNames[Math.floor(tick / 8) % chunkNames.length]! : names[tick % names.length]!;
        const versions = history.get(name)!;
        const pick = chunk ? chunkSizes : sizes;
        const content = randomBytes(pick[(tick + versions.length) % pick.length]!);
        versions.push(content);
        if (versions.length > KEEP_GENERATIONS) versions.shift();
        replacedAt.set(name, Date.now());
        // Straight into the emulator's folder (temp file, rename): a new mtime is a new generation, and
        // the emulator's injected faults are for the mount, not for the test's own writes.
        const tmp = join(root, `.replace-${tick}`);
        await fsp.writeFile(tmp, content);
        await fsp.rename(tmp, join(root, bucket, name));
        report.replacements++;
      }
      if (tick % 5 === 2) {
        // Without this, most reads would be answered by the kernel's page cache and never reach the daemon.
        await fsp.writeFile('/proc/sys/vm/drop_caches', '1').catch(() => undefined);
        report.pageCacheDrops++;
      }
      if (tick % 6 === 3) {
        emulator.setKnobs({ latencyMs: 400 });
        report.latencySpikes++;
        setTimeout(() => emulator.setKnobs({ latencyMs: 0 }), 700);
      }
      if (tick % 20 === 10 && Date.now() < deadline - 5_000) {
        log(`SIGKILL of the daemon (restart ${report.restarts + 1})`);
        await countNativeReads();
        const restart = { killed: Date.now(), mounted: Number.POSITIVE_INFINITY };
        restarts.push(restart);
        const killed = daemon as ChildProcess | null;
        const gone = killed && killed.exitCode === null && killed.signalCode === null ? new Promise((r) => killed.once('exit', r)) : Promise.resolve();
        killed?.kill('SIGKILL');
        // Its mount is stale (ENOTCONN) only once the process is gone: before that the next daemon finds it busy.
        await Promise.race([gone, new Promise((r) => setTimeout(r, 10_000))]);
        await new Promise((r) => setTimeout(r, 100));
        await startDaemon();
        restart.mounted = Date.now();
        report.restarts++;
      }
    }
    await Promise.all(readers);
    await countNativeReads();
  } finally {
    report.faultsInjected = { ...emulator.stats().injected };
    const d = daemon as ChildProcess | null;
    if (d && d.exitCode === null) {
      const exited = new Promise((r) => d.once('exit', r));
      d.kill('SIGTERM');
      await Promise.race([exited, new Promise((r) => setTimeout(r, 10_000))]);
    }
    await new Promise<void>((r) => spawn('fusermount3', ['-u', '-z', mnt], { stdio: 'ignore' }).on('close', () => r()));
    for (const line of (await fsp.readFile(logFile, 'utf8').catch(() => '')).split('\n')) {
      if (!line.includes('GCS request')) continue;
      let entry: { msg?: string; status?: number | null; lastStatus?: number | null };
      try {
        entry = JSON.parse(line) as typeof entry;
      } catch {
        continue; // a line cut by a SIGKILL
      }
      const status = entry.status ?? entry.lastStatus ?? null;
      if (/^GCS request (failed|gave up)/.test(entry.msg ?? '') && status !== 404 && status !== 412) report.gcsGaveUp++;
    }
    if (report.mismatches > 0 || report.unexplainedErrors > 0) {
      report.keptLog = `${dir}.log`;
      await fsp.copyFile(logFile, report.keptLog).catch(() => (report.keptLog = null));
    }
    await emulator.close();
    await fsp.rm(dir, { recursive: true, force: true });
  }
  return report;
}

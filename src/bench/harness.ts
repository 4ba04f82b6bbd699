import { execFile, spawn, type ChildProcess } from 'node:child_process';
import { promises as fsp } from 'node:fs';
import { cpus, tmpdir, totalmem } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import type { EmulatorKnobs, EmulatorStats, RequestLogEntry } from '../emulator/server.js';

/**
 * What every benchmark scenario needs: the emulator in a process of its own, a real mount by the real
 * CLI in another, and commands run as separate processes (this process must never touch the mount
 * itself while it waits on the daemon).
 */
export const GCSMOUNT = fileURLToPath(new URL('../../bin/gcsmount', import.meta.url));

export function sh(cmd: string, args: string[], timeoutMs = 30 * 60_000): Promise<{ stdout: string; stderr: string; code: number }> {
  return new Promise((done) => {
    execFile(cmd, args, { timeout: timeoutMs, maxBuffer: 256 * 1024 * 1024 }, (err, stdout, stderr) => {
      done({ stdout: String(stdout), stderr: String(stderr), code: err ? Number((err as { code?: number }).code ?? 1) : 0 });
    });
  });
}

/** The middle value (the mean of the two middle ones for an even count). */
export function median(xs: number[]): number {
  const s = [...xs].sort((a, b) => a - b);
  return s.length % 2 ? s[(s.length - 1) / 2]! : (s[s.length / 2 - 1]! + s[s.length / 2]!) / 2;
}

/** A figure for a results table, to `digits` decimals; '-' when a measurement gave none (NaN, Infinity). */
export function fmt(x: number, digits = 0): string {
  return Number.isFinite(x) ? x.toFixed(digits) : '-';
}

/**
 * Empties the OS page cache (root only; says whether it did). Besides making a read cold, it matters
 * for CPU figures on this VM: it gives memory the guest frees back to its host (virtio-balloon free
 * page reporting), and the first write to such a page afterwards faults in the host, charged to
 * whichever guest process wrote it. A cold read fills a GiB of page cache with the FUSE reply copy, so
 * the daemon paid 0.9-1.0 CPU-s more for a second GiB than for the first when the first was still
 * cached (measured: 2.0-2.2 against 1.1 after dropping it). Dropping the page cache just before a
 * measured read lets it reuse memory the guest has only just freed.
 */
export async function dropPageCache(): Promise<boolean> {
  if (process.getuid?.() !== 0) return false;
  await sh('sync', []);
  await fsp.writeFile('/proc/sys/vm/drop_caches', '3');
  return true;
}

/** One range GET of a curl download: bytes [from, to) of an object. */
export interface CurlRange {
  object: string;
  from: number;
  to: number;
}

/**
 * Writes a curl config (for `curl -s -K FILE`) that downloads `ranges` from the emulator, `parallel` at a
 * time, to /dev/null, printing each transfer's size: a download done by the machine's own tool, no
 * gcsmount code, for ceilings and floors.
 */
export async function curlRangesConfig(b: BenchBucket, ranges: CurlRange[], parallel: number, file: string): Promise<string> {
  const url = (object: string) => `${b.emulator.url}/download/storage/v1/b/${b.bucket}/o/${encodeURIComponent(object)}?alt=media`;
  const groups = ranges.map((r) => [`url = "${url(r.object)}"`, `range = ${r.from}-${r.to - 1}`, 'output = /dev/null', 'write-out = "%{size_download}\\n"'].join('\n'));
  await fsp.writeFile(file, `parallel\nparallel-max = ${parallel}\n${groups.join('\nnext\n')}\n`);
  return file;
}

/** The bytes the ranges span in all. */
export function rangeBytes(ranges: CurlRange[]): number {
  return ranges.reduce((sum, r) => sum + r.to - r.from, 0);
}

/** The bytes curl reported for its transfers (the write-out lines of curlRangesConfig). */
export function curlBytes(stdout: string): number {
  return stdout.split('\n').filter(Boolean).reduce((sum, n) => sum + Number(n), 0);
}

export async function timed<T>(work: () => Promise<T>): Promise<{ seconds: number; result: T }> {
  const t0 = performance.now();
  const result = await work();
  return { seconds: (performance.now() - t0) / 1000, result };
}

/**
 * The emulator in a process of its own, as GCS is: neither the bench's own work (a ceiling's client,
 * its bookkeeping) nor the daemons' load shares its event loop, and its CPU time is its own. Controlled
 * through its control routes (/_knobs, /_stats, /_log, /_reset).
 */
export interface ExternalEmulator {
  url: string;
  pid: number;
  setKnobs(k: Partial<EmulatorKnobs>): Promise<void>;
  stats(): Promise<EmulatorStats>;
  requestLog(): Promise<RequestLogEntry[]>;
  resetStats(): Promise<void>;
  close(): Promise<void>;
}

export async function startExternalEmulator(root: string, knobs: Partial<EmulatorKnobs> = {}): Promise<ExternalEmulator> {
  const proc: ChildProcess = spawn(GCSMOUNT, ['emulator', '--root', root, '--port', '0', '--quiet'], { stdio: ['ignore', 'pipe', 'inherit'] });
  const exited = new Promise<void>((r) => proc.once('exit', () => r()));
  const url = await new Promise<string>((resolve, reject) => {
    let out = '';
    proc.stdout!.on('data', (d: Buffer) => {
      out += d.toString();
      const m = /listening on (http:\/\/\S+)/.exec(out);
      if (m) resolve(m[1]!);
    });
    proc.once('exit', (code) => reject(new Error(`emulator exited ${code}`)));
  });
  const call = async <T>(path: string, init?: RequestInit): Promise<T> => {
    const res = await fetch(`${url}${path}`, init);
    if (!res.ok) throw new Error(`emulator ${path}: HTTP ${res.status} ${await res.text()}`);
    return (await res.json()) as T;
  };
  const emulator: ExternalEmulator = {
    url,
    pid: proc.pid!,
    setKnobs: async (k) => void (await call('/_knobs', { method: 'POST', body: JSON.stringify(k) })),
    stats: () => call<EmulatorStats>('/_stats'),
    requestLog: () => call<RequestLogEntry[]>('/_log'),
    resetStats: async () => void (await call('/_reset', { method: 'POST' })),
    close: async () => {
      proc.kill('SIGTERM');
      await exited;
    },
  };
  if (Object.keys(knobs).length > 0) await emulator.setKnobs(knobs);
  return emulator;
}

export interface BenchBucket {
  root: string;
  bucket: string;
  emulator: ExternalEmulator;
  dir: string;
}

export async function benchBucket(bucket: string, knobs: Partial<EmulatorKnobs> = {}): Promise<BenchBucket> {
  const dir = await fsp.mkdtemp(join(tmpdir(), 'gcsmount-bench-'));
  const root = join(dir, 'root');
  await fsp.mkdir(join(root, bucket), { recursive: true });
  const emulator = await startExternalEmulator(root, knobs);
  return { root, bucket, emulator, dir };
}

/**
 * Mounts `bucket` of the emulator at `path` (an existing folder) with the real CLI, which daemonises:
 * resolves once the mount is up, throws with its stderr if it failed.
 */
export async function mountGcsmount(emulatorUrl: string, bucket: string, path: string, logFile: string, args: string[] = [], bin = GCSMOUNT): Promise<{ path: string; unmount(): Promise<void> }> {
  const env: NodeJS.ProcessEnv = { ...process.env, METADATA_SERVER_DETECTION: 'none' };
  delete env.STORAGE_EMULATOR_HOST;
  const r = await new Promise<{ code: number; stderr: string }>((done) =>
    execFile(bin, [bucket, path, '--custom-endpoint', emulatorUrl, '--log-file', logFile, ...args], { env }, (err, _o, stderr) =>
      done({ code: err ? 1 : 0, stderr: String(stderr) }),
    ),
  );
  if (r.code !== 0) throw new Error(`mount failed: ${r.stderr}`);
  return { path, unmount: async () => void (await sh('fusermount3', ['-u', '-z', path])) };
}

export async function mountBench(b: BenchBucket, args: string[] = [], bin = GCSMOUNT): Promise<{ path: string; unmount(): Promise<void> }> {
  const path = join(b.dir, `mnt-${Date.now()}`);
  await fsp.mkdir(path);
  return mountGcsmount(b.emulator.url, b.bucket, path, join(b.dir, 'gcsmount.log'), args, bin);
}

/** `cat` of the files to /dev/null in another process (never this one: see above); throws if it failed. */
export async function catToNull(files: string[]): Promise<void> {
  const r = await sh('sh', ['-c', 'cat "$@" > /dev/null', 'cat', ...files]);
  if (r.code !== 0) throw new Error(`cat failed: ${r.stderr.trim()}`);
}

/**
 * Lists every object once through the emulator's API: it hashes an object the first time it describes
 * it, and GCS stores hashes, so no measured round should pay for that. Resolves with the objects' names.
 */
export async function primeHashes(b: BenchBucket): Promise<string[]> {
  const names: string[] = [];
  let token: string | undefined;
  do {
    const q = new URLSearchParams({ maxResults: '1000', fields: 'items(name,crc32c),nextPageToken' });
    if (token) q.set('pageToken', token);
    const res = await fetch(`${b.emulator.url}/storage/v1/b/${b.bucket}/o?${q}`);
    if (!res.ok) throw new Error(`emulator: listing ${b.bucket}: HTTP ${res.status}`);
    const page = (await res.json()) as { items?: { name: string }[]; nextPageToken?: string };
    for (const item of page.items ?? []) names.push(item.name);
    token = page.nextPageToken;
  } while (token);
  return names;
}

/**
 * Downloads every object once through the emulator's API (16 at a time), so that its code for media
 * requests is warm before the first measured round: a run's first gcsmount mount otherwise paid for the
 * emulator's warm-up (zarr-nested: 0.05-0.3 s of a 1.6 s cold load, whichever build went first).
 * `names`: the objects, as primeHashes gives them.
 */
export async function primeMedia(b: BenchBucket, names: readonly string[]): Promise<void> {
  let next = 0;
  const one = async (): Promise<void> => {
    for (let i = next++; i < names.length; i = next++) {
      const res = await fetch(`${b.emulator.url}/storage/v1/b/${b.bucket}/o/${encodeURIComponent(names[i]!)}?alt=media`);
      if (!res.ok) throw new Error(`emulator: ${names[i]}: HTTP ${res.status}`);
      await res.arrayBuffer();
    }
  };
  await Promise.all(Array.from({ length: 16 }, one));
}

export async function cleanup(b: BenchBucket): Promise<void> {
  await b.emulator.close();
  await fsp.rm(b.dir, { recursive: true, force: true });
}

export function machine(): string {
  return `${cpus().length} cores (${cpus()[0]?.model.trim() ?? 'unknown'}), ${Math.round(totalmem() / 2 ** 30)} GiB, Node ${process.version}`;
}

/** The daemon serving `mountPoint`, found by its command line (mounts here are daemonised). */
export async function daemonPid(mountPoint: string): Promise<number | null> {
  for (const entry of await fsp.readdir('/proc')) {
    if (!/^\d+$/.test(entry)) continue;
    const cmd = await fsp.readFile(`/proc/${entry}/cmdline`, 'utf8').catch(() => '');
    const args = cmd.split('\0');
    if (args.includes(mountPoint) && args.includes('--foreground')) return Number(entry);
  }
  return null;
}

/** CPU time (user + system) a process has used so far, in seconds. */
export async function cpuSeconds(pid: number): Promise<number> {
  return statCpuSeconds(`/proc/${pid}/stat`);
}

/**
 * CPU time (user + system) of one thread of process `pid` so far, in seconds: by default its main
 * thread (whose id is the pid), the daemon's JavaScript thread, which caps what one mount can do.
 */
export async function threadCpuSeconds(pid: number, tid = pid): Promise<number> {
  return statCpuSeconds(`/proc/${pid}/task/${tid}/stat`);
}

/**
 * Times a thread was switched out so far (voluntary and not, from /proc's status): a thread woken for
 * each event pays a switch each time, which a busy one does not.
 */
export async function threadSwitches(pid: number, tid = pid): Promise<number> {
  const status = await fsp.readFile(`/proc/${pid}/task/${tid}/status`, 'utf8');
  const count = (name: string) => {
    const m = new RegExp(`^${name}:\\s+(\\d+)`, 'm').exec(status);
    // A figure left out of the table beats a NaN in it that reads like a measurement.
    if (!m) throw new Error(`/proc/${pid}/task/${tid}/status has no ${name}`);
    return Number(m[1]);
  };
  return count('voluntary_ctxt_switches') + count('nonvoluntary_ctxt_switches');
}

async function statCpuSeconds(statFile: string): Promise<number> {
  const { user, sys } = await statCpuSplit(statFile);
  return user + sys;
}

/**
 * CPU time (user + system) of this process's children that have exited and been waited for (cutime and
 * cstime of proc(5)): the reader processes a round ran, in seconds.
 */
export async function childrenCpuSeconds(): Promise<number> {
  const stat = await fsp.readFile('/proc/self/stat', 'utf8');
  const fields = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
  return (Number(fields[13]) + Number(fields[14])) / 100;
}

/** User and system CPU time of a process so far, in seconds, apart. */
export function cpuSplit(pid: number): Promise<{ user: number; sys: number }> {
  return statCpuSplit(`/proc/${pid}/stat`);
}

async function statCpuSplit(statFile: string): Promise<{ user: number; sys: number }> {
  const stat = await fsp.readFile(statFile, 'utf8');
  const fields = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
  // utime and stime, fields 14 and 15 of proc(5), in clock ticks (100 per second on Linux).
  return { user: Number(fields[11]) / 100, sys: Number(fields[12]) / 100 };
}

/** Peak resident memory of a process so far, in MiB. */
export async function peakRssMiB(pid: number): Promise<number> {
  const status = await fsp.readFile(`/proc/${pid}/status`, 'utf8');
  return Number(/VmHWM:\s+(\d+)/.exec(status)![1]) / 1024;
}

/** What `gcsmount stats MOUNTPOINT --json` reports (any build's daemon answers it). */
export interface MountStats {
  counters: Record<string, number>;
  gauges: Record<string, number>;
  fuseOps: Record<string, { count: number }>;
}

/** The stats of the daemon serving `mountPoint`, asked through `bin` (another build's, for a baseline). */
export async function mountStats(mountPoint: string, bin = GCSMOUNT): Promise<MountStats> {
  const r = await sh(bin, ['stats', mountPoint, '--json']);
  return JSON.parse(r.stdout) as MountStats;
}

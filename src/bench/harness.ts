import { execFile } from 'node:child_process';
import { promises as fsp } from 'node:fs';
import { cpus, tmpdir, totalmem } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { startEmulator, type Emulator, type EmulatorKnobs } from '../emulator/server.js';

/**
 * What every benchmark scenario needs: an emulator in this process, a real mount by the real CLI in
 * another, and commands run as separate processes (this process must never touch the mount itself:
 * the daemon would wait on this event loop for the emulator's answer).
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

export async function timed<T>(work: () => Promise<T>): Promise<{ seconds: number; result: T }> {
  const t0 = performance.now();
  const result = await work();
  return { seconds: (performance.now() - t0) / 1000, result };
}

export interface BenchBucket {
  root: string;
  bucket: string;
  emulator: Emulator;
  dir: string;
}

export async function benchBucket(bucket: string, knobs: Partial<EmulatorKnobs> = {}): Promise<BenchBucket> {
  const dir = await fsp.mkdtemp(join(tmpdir(), 'gcsmount-bench-'));
  const root = join(dir, 'root');
  await fsp.mkdir(join(root, bucket), { recursive: true });
  const emulator = await startEmulator({ root, port: 0, knobs });
  return { root, bucket, emulator, dir };
}

export async function mountBench(b: BenchBucket, args: string[] = [], bin = GCSMOUNT): Promise<{ path: string; unmount(): Promise<void> }> {
  const path = join(b.dir, `mnt-${Date.now()}`);
  await fsp.mkdir(path);
  const env: NodeJS.ProcessEnv = { ...process.env, METADATA_SERVER_DETECTION: 'none' };
  delete env.STORAGE_EMULATOR_HOST;
  const r = await new Promise<{ code: number; stderr: string }>((done) =>
    execFile(bin, [b.bucket, path, '--custom-endpoint', b.emulator.url, '--log-file', join(b.dir, 'gcsmount.log'), ...args], { env }, (err, _o, stderr) =>
      done({ code: err ? 1 : 0, stderr: String(stderr) }),
    ),
  );
  if (r.code !== 0) throw new Error(`mount failed: ${r.stderr}`);
  return { path, unmount: async () => void (await sh('fusermount', ['-u', '-z', path])) };
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
  const stat = await fsp.readFile(`/proc/${pid}/stat`, 'utf8');
  const fields = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
  // utime and stime, fields 14 and 15 of proc(5), in clock ticks (100 per second on Linux).
  return (Number(fields[11]) + Number(fields[12])) / 100;
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

import { execFile, spawn, type ChildProcess } from 'node:child_process';
import { promises as fsp } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { startEmulator, type Emulator, type EmulatorKnobs } from '../../src/emulator/server.js';

/**
 * Shared by the FUSE suites. The emulator runs inside the test process, so the test process must never
 * touch a mount synchronously: the daemon would wait on this event loop for its GCS answer. Everything
 * that reads the mount runs as a separate process (cat, stat, sha256sum, python).
 */

export const REPO = fileURLToPath(new URL('../..', import.meta.url));
export const GCSMOUNT = join(REPO, 'bin/gcsmount');

export interface RunResult {
  code: number;
  stdout: string;
  stderr: string;
  /** How it ended when not by exit(0): the exit code, or the signal that killed it (a timeout's too). */
  how?: string;
}

/** Runs a command without a shell, asynchronously, never throwing on a non-zero exit. */
export function run(cmd: string, args: string[], opts: { env?: NodeJS.ProcessEnv; timeoutMs?: number; encoding?: 'utf8' } = {}): Promise<RunResult> {
  return new Promise((done) => {
    execFile(cmd, args, { env: opts.env ?? process.env, timeout: opts.timeoutMs ?? 60_000, maxBuffer: 64 * 1024 * 1024 }, (err, stdout, stderr) => {
      const failed = err as (Error & { code?: unknown; signal?: unknown; killed?: boolean }) | null;
      const code = failed ? (typeof failed.code === 'number' ? failed.code : 1) : 0;
      const how = failed ? `code ${String(failed.code)}, signal ${String(failed.signal)}${failed.killed ? ', killed' : ''}` : undefined;
      done({ code, stdout: String(stdout), stderr: String(stderr), how });
    });
  });
}

/** Every folder tempDir made in this test file, removed by cleanupAll once nothing is mounted on it. */
const tempDirs = new Set<string>();

/**
 * A new folder under the temporary dir, removed at the file's cleanupAll: a run writes gigabytes (buckets,
 * block caches), and a suite that leaves them behind fills a small disk part-way through the next run.
 */
export async function tempDir(label: string): Promise<string> {
  const dir = await fsp.mkdtemp(join(tmpdir(), `gcsmount-${label}-`));
  tempDirs.add(dir);
  return dir;
}

/** Writes {name: content} as objects of `bucket` under an emulator root (buckets are folders). */
export async function writeObjects(root: string, bucket: string, objects: Record<string, Buffer | string>): Promise<void> {
  for (const [name, content] of Object.entries(objects)) {
    const path = join(root, bucket, name);
    await fsp.mkdir(join(path, '..'), { recursive: true });
    await fsp.writeFile(path, content);
  }
}

export interface TestBucket {
  root: string;
  bucket: string;
  emulator: Emulator;
}

export async function startBucket(bucket: string, knobs: Partial<EmulatorKnobs> = {}): Promise<TestBucket> {
  const root = await tempDir('emu');
  await fsp.mkdir(join(root, bucket), { recursive: true });
  const emulator = await startEmulator({ root, port: 0, knobs });
  return { root, bucket, emulator };
}

/** The environment a daemon runs with: no Google credentials, no metadata-server probing, no emulator variable. */
export function daemonEnv(extra: NodeJS.ProcessEnv = {}): NodeJS.ProcessEnv {
  // Released block buffers are overwritten with a pattern, so a use after release fails the byte checks.
  const env: NodeJS.ProcessEnv = { ...process.env, METADATA_SERVER_DETECTION: 'none', GCSMOUNT_POISON_RELEASED_BLOCKS: '1', ...extra };
  delete env.STORAGE_EMULATOR_HOST;
  delete env.GOOGLE_APPLICATION_CREDENTIALS;
  return env;
}

const liveMounts = new Set<string>();
const liveDaemons = new Set<ChildProcess>();

async function isMounted(path: string): Promise<boolean> {
  const text = await fsp.readFile('/proc/self/mountinfo', 'utf8');
  return text.split('\n').some((l) => l.split(' ')[4] === path);
}

export interface Mounted {
  path: string;
  /** Set when started with `foreground: true`: the daemon process itself. */
  daemon: ChildProcess | null;
  logFile: string;
}

export interface MountRequest {
  tb: TestBucket;
  args?: string[];
  /** Keep the daemon as our child (to SIGKILL it), instead of letting it daemonise. */
  foreground?: boolean;
  mountPoint?: string;
  /** Added to the daemon's environment (e.g. HTTP_PROXY). */
  env?: NodeJS.ProcessEnv;
  /** Where the daemon logs; a file in a new temporary folder by default. */
  logFile?: string;
}

/** Mounts through the real CLI against the emulator and waits until the mount answers. */
export async function mount(req: MountRequest): Promise<Mounted> {
  const path = req.mountPoint ?? (await tempDir('mnt'));
  const logFile = req.logFile ?? join(await tempDir('log'), 'gcsmount.log');
  const args = [req.tb.bucket, path, '--custom-endpoint', req.tb.emulator.url, '--log-file', logFile, '--log-severity', 'debug', ...(req.args ?? [])];
  liveMounts.add(path);
  if (!req.foreground) {
    const r = await run(GCSMOUNT, args, { env: daemonEnv(req.env) });
    if (r.code !== 0) throw new Error(`gcsmount failed (${r.code}): ${r.stderr}`);
    return { path, daemon: null, logFile };
  }
  const daemon = spawn(GCSMOUNT, [...args, '--foreground'], { env: daemonEnv(req.env), stdio: ['ignore', 'ignore', 'pipe'] });
  liveDaemons.add(daemon);
  let stderr = '';
  daemon.stderr!.on('data', (d: Buffer) => (stderr += d.toString()));
  const deadline = Date.now() + 30_000;
  while (!(await isMounted(path))) {
    if (daemon.exitCode !== null) throw new Error(`daemon exited ${daemon.exitCode}: ${stderr}`);
    if (Date.now() > deadline) throw new Error(`mount did not appear: ${stderr}`);
    await new Promise((r) => setTimeout(r, 50));
  }
  return { path, daemon, logFile };
}

/** Unmounts (lazily, so a wedged mount cannot hang the suite) and stops any daemon we started. */
export async function unmount(path: string): Promise<void> {
  if (await isMounted(path)) await run('fusermount', ['-u', '-z', path]);
  liveMounts.delete(path);
}

export async function cleanupAll(): Promise<void> {
  for (const path of [...liveMounts]) await unmount(path).catch(() => undefined);
  for (const d of liveDaemons) if (d.exitCode === null) d.kill('SIGKILL');
  liveDaemons.clear();
  await removeTempDirs();
}

/**
 * Removes the file's temporary folders, never one that holds a mount (rm would walk into the bucket). A
 * daemon that is still exiting may write into its cache dir meanwhile: rm retries a folder that refills.
 */
async function removeTempDirs(): Promise<void> {
  const mountPoints = (await fsp.readFile('/proc/self/mountinfo', 'utf8')).split('\n').map((l) => l.split(' ')[4]).filter((p): p is string => !!p);
  for (const dir of [...tempDirs]) {
    if (mountPoints.some((m) => m === dir || m.startsWith(`${dir}/`))) continue;
    await fsp.rm(dir, { recursive: true, force: true, maxRetries: 5, retryDelay: 100 }).catch(() => undefined);
    tempDirs.delete(dir);
  }
}

export async function sha256Of(path: string): Promise<string> {
  const r = await run('sha256sum', [path]);
  if (r.code !== 0) throw new Error(`sha256sum ${path} (${r.how}): ${r.stderr}`);
  return r.stdout.split(' ')[0]!;
}

/** Waits until `predicate` holds, polling; for conditions another process brings about. */
export async function eventually(predicate: () => Promise<boolean>, timeoutMs = 15_000): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (!(await predicate())) {
    if (Date.now() > deadline) throw new Error('condition not met in time');
    await new Promise((r) => setTimeout(r, 50));
  }
}

/** What `gcsmount stats --json` shows of a live mount. */
export interface MountStats {
  counters: Record<string, number>;
  gauges: Record<string, number>;
  fuseOps: Record<string, { count: number } | undefined>;
}

/** A live mount's `gcsmount stats --json`. */
export async function mountStats(mountPoint: string): Promise<MountStats> {
  const r = await run(GCSMOUNT, ['stats', mountPoint, '--json']);
  if (r.code !== 0) throw new Error(`gcsmount stats ${mountPoint}: ${r.stderr}`);
  return JSON.parse(r.stdout) as MountStats;
}

/** The counters a daemon logs when it stops (its `final counters` line). */
export async function finalCounters(logFile: string): Promise<Record<string, number>> {
  let line: string | undefined;
  await eventually(async () => {
    line = (await fsp.readFile(logFile, 'utf8')).split('\n').reverse().find((l) => l.includes('"final counters"'));
    return line !== undefined;
  });
  return (JSON.parse(line!) as { metrics: { counters: Record<string, number> } }).metrics.counters;
}

export { isMounted };

import { spawn, type ChildProcess } from 'node:child_process';
import { promises as fsp } from 'node:fs';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { startEmulator, type Emulator } from '../emulator/server.js';
import type { CaseBucket, CaseMount, MountPlumbing } from './write-mount.js';

const GCSMOUNT = fileURLToPath(new URL('../../bin/gcsmount', import.meta.url));

/** Whether `path` is a mount point that answers (a killed daemon's mount is listed, but fails with ENOTCONN). */
async function answering(path: string): Promise<boolean> {
  const mounts = await fsp.readFile('/proc/self/mountinfo', 'utf8');
  // fsp.stat runs on libuv's pool: the emulator in this process stays free to answer the daemon.
  return mounts.split('\n').some((l) => l.split(' ')[4] === path) && (await fsp.stat(path).then(() => true, () => false));
}

function fusermountLazy(path: string): Promise<void> {
  return new Promise((r) => spawn('fusermount3', ['-u', '-z', path], { stdio: 'ignore' }).on('close', () => r()));
}

/**
 * The torture run's emulators, mounts and folders for the write differential (write-mount.ts), all
 * under one folder of its own: cleanup() unmounts, stops and removes everything it made.
 */
export class TorturePlumbing implements MountPlumbing {
  private readonly mounts = new Set<string>();
  private readonly daemons = new Set<ChildProcess>();
  private readonly emulators: Emulator[] = [];

  constructor(private readonly base: string) {}

  tempDir(label: string): Promise<string> {
    return fsp.mkdtemp(join(this.base, `${label}-`));
  }

  async startBucket(bucket: string): Promise<CaseBucket> {
    const root = await this.tempDir('emu');
    await fsp.mkdir(join(root, bucket), { recursive: true });
    const emulator = await startEmulator({ root, port: 0 });
    this.emulators.push(emulator);
    return { root, bucket, emulator };
  }

  async mount(req: { tb: CaseBucket; args?: string[]; foreground?: boolean; mountPoint?: string }): Promise<CaseMount> {
    const path = req.mountPoint ?? (await this.tempDir('mnt'));
    const env: NodeJS.ProcessEnv = { ...process.env, METADATA_SERVER_DETECTION: 'none', GCSMOUNT_POISON_RELEASED_BLOCKS: '1' };
    delete env.STORAGE_EMULATOR_HOST;
    const logFile = join(await this.tempDir('log'), 'gcsmount.log');
    const args = [req.tb.bucket, path, '--foreground', '--custom-endpoint', req.tb.emulator.url, '--log-file', logFile, ...(req.args ?? [])];
    // Always a child of ours, so that clean-up can stop it; `foreground` only says whether the caller may.
    const daemon = spawn(GCSMOUNT, args, { env, stdio: ['ignore', 'ignore', 'pipe'] });
    this.daemons.add(daemon);
    this.mounts.add(path);
    let stderr = '';
    daemon.stderr!.on('data', (b: Buffer) => (stderr = (stderr + b.toString()).slice(-2000)));
    const deadline = Date.now() + 30_000;
    while (!(await answering(path))) {
      if (daemon.exitCode !== null || Date.now() > deadline) throw new Error(`the daemon did not mount ${path}: ${stderr.trim()} (log: ${logFile})`);
      await new Promise((r) => setTimeout(r, 50));
    }
    return { path, daemon: req.foreground ? daemon : null };
  }

  async unmount(path: string): Promise<void> {
    await fusermountLazy(path);
    this.mounts.delete(path);
  }

  async cleanup(): Promise<void> {
    for (const path of this.mounts) await fusermountLazy(path);
    this.mounts.clear();
    for (const d of this.daemons) {
      if (d.exitCode !== null || d.signalCode !== null) continue;
      const exited = new Promise((r) => d.once('exit', r));
      d.kill('SIGTERM');
      await Promise.race([exited, new Promise((r) => setTimeout(r, 10_000))]);
      if (d.exitCode === null && d.signalCode === null) d.kill('SIGKILL');
    }
    this.daemons.clear();
    for (const e of this.emulators.splice(0)) await e.close();
    await fsp.rm(this.base, { recursive: true, force: true, maxRetries: 5, retryDelay: 100 });
  }
}

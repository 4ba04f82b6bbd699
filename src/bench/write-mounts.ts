import { promises as fsp } from 'node:fs';
import { join } from 'node:path';
import {
  cpuSeconds, daemonPid, dropPageCache, mountBench, mountStats, peakRssMiB, threadCpuSeconds, timed, type BenchBucket, type MountStats,
} from './harness.js';
import type { EmulatorStats } from '../emulator/server.js';

/**
 * The mount side of the write bench: each measured write goes through a mount of its own, so one
 * write's staging, cache and counters never colour the next, and the daemon's CPU, memory and requests
 * are what that write alone cost.
 */

export interface Mounted {
  path: string;
  pid: number;
  unmount(): Promise<void>;
}

/** What one measured write through a mount cost the daemon. */
export interface MountRun {
  seconds: number;
  cpu: number;
  /** Of `cpu`, the daemon's main (JavaScript) thread's. */
  mainCpu: number;
  rssMiB: number;
  emulator: EmulatorStats;
  /** Deltas of the daemon's gcs_requests_* counters. */
  counters: Record<string, number>;
}

/** `work` through a fresh mount, after `prepare` (not measured). */
export type ThroughMount = (label: string, prepare: (m: Mounted) => Promise<void>, work: (m: Mounted) => Promise<void>) => Promise<MountRun>;

/** Where the emulator keeps the object `name`: a write's bytes, checked after the daemon is gone. */
export const objectFile = (b: BenchBucket, name: string) => join(b.root, b.bucket, name);

async function waitGone(pid: number): Promise<void> {
  for (let i = 0; i < 600 && (await fsp.access(`/proc/${pid}`).then(() => true, () => false)); i++) await new Promise((r) => setTimeout(r, 100));
}

function counterDelta(before: MountStats, after: MountStats): Record<string, number> {
  const out: Record<string, number> = {};
  for (const [k, v] of Object.entries(after.counters)) if (k.startsWith('gcs_requests_')) out[k.slice('gcs_requests_'.length)] = v - (before.counters[k] ?? 0);
  return out;
}

/** The mounts of one run of the write bench, so whatever a failed part left mounted can be unmounted. */
export class WriteMounts {
  private readonly mounted = new Set<Mounted>();
  /** Whether the page cache was dropped before the last measured write (only root can drop it). */
  dropped = false;

  constructor(private readonly b: BenchBucket) {}

  /** A fresh mount on a fresh --cache-dir (staging goes in it), as a user would mount. */
  private async mount(label: string): Promise<Mounted> {
    const cacheDir = join(this.b.dir, `cache-${label}`);
    const m = await mountBench(this.b, ['--cache-dir', cacheDir]);
    const pid = await daemonPid(m.path);
    const entry: Mounted = {
      path: m.path,
      pid: pid ?? 0,
      unmount: async () => {
        this.mounted.delete(entry);
        await m.unmount();
        if (pid) await waitGone(pid);
        await fsp.rm(cacheDir, { recursive: true, force: true });
      },
    };
    this.mounted.add(entry);
    if (!pid) {
      await entry.unmount();
      throw new Error('cannot find the daemon');
    }
    return entry;
  }

  /** `work` through a fresh mount: time, the daemon's CPU and peak RSS, and the requests it made. */
  readonly throughMount: ThroughMount = async (label, prepare, work) => {
    const m = await this.mount(label);
    try {
      await prepare(m);
      this.dropped = await dropPageCache();
      await this.b.emulator.resetStats();
      const s0 = await mountStats(m.path);
      const c0 = await cpuSeconds(m.pid);
      const main0 = await threadCpuSeconds(m.pid);
      const t = await timed(() => work(m));
      const cpu = (await cpuSeconds(m.pid)) - c0;
      const mainCpu = (await threadCpuSeconds(m.pid)) - main0;
      const emulator = await this.b.emulator.stats();
      const counters = counterDelta(s0, await mountStats(m.path));
      return { seconds: t.seconds, cpu, mainCpu, rssMiB: await peakRssMiB(m.pid), emulator, counters };
    } finally {
      await m.unmount();
    }
  };

  async unmountAll(): Promise<void> {
    for (const m of [...this.mounted]) await m.unmount().catch(() => undefined);
  }
}

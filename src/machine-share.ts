import { readFileSync } from 'node:fs';
import { availableParallelism, totalmem } from 'node:os';
import { dirname, join, resolve } from 'node:path';

/**
 * The share of the machine this process may use: its CPUs and memory as a container or a systemd unit
 * limits them, not as the host has them (imports nothing of the project).
 *
 * Why: os.availableParallelism() follows the CPU affinity (taskset, cpuset) but Node 20's libuv (1.46)
 * ignores a CPU quota, so a pod limited to 4 CPUs on a 96-core node (GKE's CPU limits, systemd's
 * CPUQuota=) got the defaults of 96: 8 download workers, 16 native read workers, 192 range GETs, and
 * more workers in use than it has CPUs to run them on. totalmem() likewise ignores a memory limit, where
 * process.constrainedMemory() does not.
 */

/** The files a cgroup's CPU limit is read from; tests give a folder of their own. */
export interface CgroupFiles {
  /** /proc/self/cgroup. */
  membership: string;
  /** Where the cgroup v2 hierarchy is mounted (cpu.max), and where v1's cpu controller is (cpu.cfs_quota_us). */
  v2Root: string;
  v1CpuRoot: string;
}

const SYSTEM: CgroupFiles = { membership: '/proc/self/cgroup', v2Root: '/sys/fs/cgroup', v1CpuRoot: '/sys/fs/cgroup/cpu' };

function readOr(path: string): string | null {
  try {
    return readFileSync(path, 'utf8');
  } catch {
    return null;
  }
}

/**
 * Each folder from the cgroup's own up to `root`: the tightest limit anywhere on the way applies. A path
 * outside the mount (a cgroup namespace shows "/../x" for a cgroup above its root) has only the root.
 */
function upTo(root: string, path: string): string[] {
  // resolve, not join: "/" must name the root itself (join leaves a trailing slash).
  const own = resolve(root, `.${path}`);
  if (own !== root && !own.startsWith(`${root}/`)) return [root];
  const dirs = [own];
  for (let dir = own; dir !== root && dirname(dir) !== dir; ) dirs.push((dir = dirname(dir)));
  return dirs;
}

/** One folder's quota as CPUs (quota / period), or null where it has none. */
function v2Limit(dir: string): number | null {
  const text = readOr(join(dir, 'cpu.max'));
  if (text === null) return null;
  const [quota, period] = text.trim().split(/\s+/);
  if (quota === undefined || quota === 'max') return null;
  return ratio(Number(quota), Number(period ?? 100_000));
}

function v1Limit(dir: string): number | null {
  const quota = readOr(join(dir, 'cpu.cfs_quota_us'));
  const period = readOr(join(dir, 'cpu.cfs_period_us'));
  if (quota === null || period === null) return null;
  return ratio(Number(quota.trim()), Number(period.trim()));
}

function ratio(quota: number, period: number): number | null {
  return Number.isFinite(quota) && Number.isFinite(period) && quota > 0 && period > 0 ? quota / period : null;
}

/**
 * The CPU quota of this process's cgroups in CPUs (1.5 for 150 ms per 100 ms), the tightest of its
 * cgroup and every parent's, or null where none is set. cgroup v2 first; v1's cpu controller otherwise.
 */
export function cgroupCpuQuota(files: CgroupFiles = SYSTEM): number | null {
  const membership = readOr(files.membership);
  if (membership === null) return null;
  let tightest: number | null = null;
  const take = (limit: number | null) => {
    if (limit !== null && (tightest === null || limit < tightest)) tightest = limit;
  };
  for (const line of membership.split('\n')) {
    // "hierarchy-ID:controllers:path"; the path itself may hold colons.
    const m = /^(\d+):([^:]*):(.*)$/.exec(line.trim());
    if (!m) continue;
    const [, id, controllers, path] = m as unknown as [string, string, string, string];
    if (id === '0' && controllers === '') for (const dir of upTo(files.v2Root, path)) take(v2Limit(dir));
    else if (controllers.split(',').includes('cpu')) for (const dir of upTo(files.v1CpuRoot, path)) take(v1Limit(dir));
  }
  return tightest;
}

let quotaRead = false;
let quota: number | null = null;

/**
 * The CPUs this process may use now: its affinity (which taskset can change while it runs, so asked
 * each time) within its cgroup's quota (read once: a unit's limit is set before it starts), rounded up
 * (1.5 CPUs let two threads run half the time each), at least 1.
 */
export function usableCpus(): number {
  if (!quotaRead) {
    quotaRead = true;
    quota = cgroupCpuQuota();
  }
  const affinity = availableParallelism();
  return quota === null ? affinity : Math.max(1, Math.min(affinity, Math.ceil(quota)));
}

/** The memory this process may use: the machine's, or its cgroup's limit where that is smaller. */
export function usableMemory(): number {
  const total = totalmem();
  const limit = process.constrainedMemory?.() ?? 0;
  return limit > 0 && limit < total ? limit : total;
}

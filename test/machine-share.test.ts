import { execFileSync } from 'node:child_process';
import { existsSync, mkdirSync, mkdtempSync, readFileSync, rmdirSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { cgroupCpuQuota, type CgroupFiles } from '../src/machine-share.js';

const BIN = join(__dirname, '..', 'bin', 'gcsmount');
const made: string[] = [];
afterAll(() => {
  for (const dir of made) rmSync(dir, { recursive: true, force: true });
});

/** A fake /proc/self/cgroup and cgroup folders: `dirs` maps a folder (under the root) to its files. */
function fakeCgroups(membership: string, dirs: Record<string, Record<string, string>>): CgroupFiles {
  const root = mkdtempSync(join(tmpdir(), 'cgroup-'));
  made.push(root);
  for (const [dir, files] of Object.entries(dirs)) {
    mkdirSync(join(root, dir), { recursive: true });
    for (const [name, text] of Object.entries(files)) writeFileSync(join(root, dir, name), text);
  }
  writeFileSync(join(root, 'membership'), membership);
  return { membership: join(root, 'membership'), v2Root: join(root, 'v2'), v1CpuRoot: join(root, 'v1cpu') };
}

describe('the CPU quota of a cgroup', () => {
  it('reads cgroup v2 cpu.max, the tightest of the cgroup and its parents', () => {
    const files = fakeCgroups('0::/system.slice/job.service\n', {
      'v2': { 'cpu.max': 'max 100000\n' },
      'v2/system.slice': { 'cpu.max': '400000 100000\n' },
      'v2/system.slice/job.service': { 'cpu.max': '150000 100000\n' },
    });
    expect(cgroupCpuQuota(files)).toBe(1.5);
  });

  it('takes a parent quota tighter than its own', () => {
    const files = fakeCgroups('0::/pod/container\n', {
      'v2/pod': { 'cpu.max': '200000 100000\n' },
      'v2/pod/container': { 'cpu.max': 'max 100000\n' },
    });
    expect(cgroupCpuQuota(files)).toBe(2);
  });

  it('reads a namespaced cgroup (its path not under the mount) from the mount itself', () => {
    const files = fakeCgroups('0::/kubepods.slice/pod1/cri-abc\n', { 'v2': { 'cpu.max': '300000 100000\n' } });
    expect(cgroupCpuQuota(files)).toBe(3);
    // A cgroup above the namespace's root: the path climbs out of the mount, whose own limit applies.
    const above = fakeCgroups('0::/../../other\n', { 'v2': { 'cpu.max': '300000 100000\n' } });
    expect(cgroupCpuQuota(above)).toBe(3);
  });

  it("reads cgroup v1's cpu controller, named among others", () => {
    const files = fakeCgroups('4:memory:/x\n3:cpu,cpuacct:/job\n0::/\n', {
      'v1cpu': { 'cpu.cfs_quota_us': '-1\n', 'cpu.cfs_period_us': '100000\n' },
      'v1cpu/job': { 'cpu.cfs_quota_us': '50000\n', 'cpu.cfs_period_us': '100000\n' },
    });
    expect(cgroupCpuQuota(files)).toBe(0.5);
  });

  it('is null where no quota is set, or nothing can be read', () => {
    expect(cgroupCpuQuota(fakeCgroups('0::/\n', { 'v2': { 'cpu.max': 'max 100000\n' } }))).toBeNull();
    expect(cgroupCpuQuota(fakeCgroups('1:cpu:/\n', { 'v1cpu': { 'cpu.cfs_quota_us': '-1\n', 'cpu.cfs_period_us': '100000\n' } }))).toBeNull();
    expect(cgroupCpuQuota(fakeCgroups('0::/\n', {}))).toBeNull();
    expect(cgroupCpuQuota({ membership: '/nonexistent/cgroup', v2Root: '/nonexistent', v1CpuRoot: '/nonexistent' })).toBeNull();
    expect(cgroupCpuQuota(fakeCgroups('garbage\n0::/\n', { 'v2': { 'cpu.max': 'nonsense\n' } }))).toBeNull();
  });
});

/**
 * A real cgroup of this machine's (v2 where its cpu controller is enabled, v1's cpu and memory
 * controllers otherwise) limiting `gcsmount --help`, whose defaults are the ones a mount started there
 * gets. Null where this machine lets no cgroup be made (not root, no writable controller).
 */
function limitedCgroup(): { cpu: (cpus: number) => void; memory: (bytes: number) => void; run: (args: string[]) => string; remove: () => void } | null {
  const name = `gcsmount-test-${process.pid}`;
  const root = '/sys/fs/cgroup';
  const v2Controllers = existsSync(join(root, 'cgroup.subtree_control')) ? readFileSync(join(root, 'cgroup.subtree_control'), 'utf8') : '';
  try {
    if (v2Controllers.includes('cpu') && v2Controllers.includes('memory')) {
      const dir = join(root, name);
      mkdirSync(dir);
      return {
        cpu: (cpus) => writeFileSync(join(dir, 'cpu.max'), `${cpus * 100_000} 100000`),
        memory: (bytes) => writeFileSync(join(dir, 'memory.max'), String(bytes)),
        run: (args) => execFileSync('sh', ['-c', `echo $$ > ${dir}/cgroup.procs && exec "$@"`, 'sh', ...args], { encoding: 'utf8' }),
        remove: () => rmdirSync(dir),
      };
    }
    const [cpuDir, memDir] = [join(root, 'cpu', name), join(root, 'memory', name)];
    if (!existsSync(join(root, 'cpu', 'cpu.cfs_quota_us')) || !existsSync(join(root, 'memory', 'memory.limit_in_bytes'))) return null;
    mkdirSync(cpuDir);
    try {
      mkdirSync(memDir);
    } catch {
      rmdirSync(cpuDir);
      return null;
    }
    return {
      cpu: (cpus) => writeFileSync(join(cpuDir, 'cpu.cfs_quota_us'), String(cpus * Number(readFileSync(join(cpuDir, 'cpu.cfs_period_us'), 'utf8')))),
      memory: (bytes) => writeFileSync(join(memDir, 'memory.limit_in_bytes'), String(bytes)),
      run: (args) => execFileSync('sh', ['-c', `echo $$ > ${cpuDir}/cgroup.procs && echo $$ > ${memDir}/cgroup.procs && exec "$@"`, 'sh', ...args], { encoding: 'utf8' }),
      remove: () => {
        rmdirSync(cpuDir);
        rmdirSync(memDir);
      },
    };
  } catch {
    return null;
  }
}

const defaultOf = (help: string, flag: string) => new RegExp(`${flag} <int>\\s+default (\\d+)`).exec(help)?.[1];

describe("a cgroup's limits set the defaults", () => {
  it('one CPU and 1 GiB: no download worker, the smallest memory limit', (ctx) => {
    // Made here, not while the tests are collected, so a filtered run leaves no cgroup behind.
    const cgroup = limitedCgroup();
    if (cgroup === null) return ctx.skip();
    try {
      cgroup.cpu(1);
      cgroup.memory(2 ** 30);
      const limited = cgroup.run([process.execPath, BIN, '--help']);
      // 1/8 of 1 GiB is below the 256 MiB floor; half of one CPU is no worker.
      expect(defaultOf(limited, '--download-workers')).toBe('0');
      expect(defaultOf(limited, '--memory-limit-mb')).toBe('256');
      const free = execFileSync(process.execPath, [BIN, '--help'], { encoding: 'utf8' });
      expect(Number(defaultOf(free, '--memory-limit-mb'))).toBeGreaterThan(256);
    } finally {
      cgroup.remove();
    }
  });
});

import { spawn } from 'node:child_process';
import { promises as fsp } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { createInterface } from 'node:readline';
import { fileURLToPath } from 'node:url';
import { setReadAhead } from '../fs/mount.js';
import { silentLogger } from '../observe/logger.js';
import { cpuSeconds, sh, timed } from './harness.js';

/**
 * The FUSE layer's ceiling: `dd bs=1M` of a 1 GiB file that a small server (memory-fs.ts) answers from
 * memory through the project's addon, so no GCS, cache or namespace is in the way; against `dd` of the
 * same bytes from a plain file in /dev/shm, and a plain C server on libfuse3 (memfs-libfuse3.c, the
 * best a FUSE server does here), in the same run. Three ways the kernel can ask: its default 128 KiB
 * readahead, read_ahead_kb raised to 4 MiB (--max-read-ahead-kb's default: 1 MiB requests, several in
 * flight), and direct_io (every read(2) goes to the server as it is, up to max_pages). With
 * GCSMOUNT_FUSE_NATIVE_DIR set, the same file through fuse-native over libfuse 2 too (the layer the
 * addon replaced; not a dependency of the project any more).
 */
const SIZE_MIB = 1024;
const ROUNDS = 3;
const PERIOD = 251;
const ADDON_SERVER = fileURLToPath(new URL('./memory-fs.js', import.meta.url));
const OLD_SERVER = fileURLToPath(new URL('./memory-fs-libfuse2.js', import.meta.url));
const C_SOURCE = fileURLToPath(new URL('../../src/bench/memfs-libfuse3.c', import.meta.url));
/** A folder holding fuse-native 2.2.6 (`npm install --prefix DIR fuse-native@2.2.6`): the old layer's rows. */
const OLD_LAYER_DIR = process.env.GCSMOUNT_FUSE_NATIVE_DIR;

export type Layer = 'addon' | 'libfuse2' | 'c-single' | 'c-multi';

export interface Mode {
  name: string;
  io: 'buffered' | 'direct';
  readAheadKb: number;
  layer: Layer;
}

const MODES: Mode[] = [
  { name: 'addon: buffered, kernel readahead 128 KiB', io: 'buffered', readAheadKb: 128, layer: 'addon' },
  { name: 'addon: buffered, read_ahead_kb 4096 (--max-read-ahead-kb default)', io: 'buffered', readAheadKb: 4096, layer: 'addon' },
  { name: 'addon: direct_io', io: 'direct', readAheadKb: 0, layer: 'addon' },
  { name: 'C libfuse3, one thread: buffered, read_ahead_kb 4096', io: 'buffered', readAheadKb: 4096, layer: 'c-single' },
  { name: 'C libfuse3, threads: buffered, read_ahead_kb 4096', io: 'buffered', readAheadKb: 4096, layer: 'c-multi' },
  { name: 'C libfuse3, one thread: direct_io', io: 'direct', readAheadKb: 0, layer: 'c-single' },
  { name: 'fuse-native (libfuse 2): buffered', io: 'buffered', readAheadKb: 0, layer: 'libfuse2' },
  { name: 'fuse-native (libfuse 2): direct_io', io: 'direct', readAheadKb: 0, layer: 'libfuse2' },
];

/** What a server reports: the JavaScript ones count their reads; the C one only its CPU (from /proc). */
export interface Counts {
  reads: number | null;
  bytes: number | null;
  cpu: number;
}

export interface Server {
  stats(): Promise<Counts>;
  stop(): Promise<void>;
}

export async function startServer(mnt: string, mode: Mode, cBinary: string | null): Promise<Server> {
  const [cmd, args] =
    mode.layer === 'addon'
      ? [process.execPath, [ADDON_SERVER, mnt, String(SIZE_MIB), mode.io, String(mode.readAheadKb)]]
      : mode.layer === 'libfuse2'
        ? [process.execPath, [OLD_SERVER, OLD_LAYER_DIR!, mnt, String(SIZE_MIB), mode.io]]
        : [cBinary!, [mnt, String(SIZE_MIB), mode.io, mode.layer === 'c-multi' ? 'multi' : 'single']];
  const child = spawn(cmd, args, { stdio: ['pipe', 'pipe', 'pipe'] });
  let stderr = '';
  child.stderr.on('data', (d: Buffer) => (stderr += d.toString()));
  const queue: string[] = [];
  const waiting: ((l: string) => void)[] = [];
  createInterface({ input: child.stdout }).on('line', (l) => (waiting.length ? waiting.shift()!(l) : queue.push(l)));
  const exited = new Promise<void>((r) => child.once('exit', () => r()));
  const next = (): Promise<string> =>
    queue.length
      ? Promise.resolve(queue.shift()!)
      : Promise.race([new Promise<string>((r) => waiting.push(r)), exited.then(() => Promise.reject(new Error(`${mode.name}: server exited: ${stderr.trim()}`)))]);
  const first = await next();
  if (first !== 'ready') throw new Error(`${mode.name}: server said ${first}`);
  // memory-fs.ts sets its own readahead, as the daemon does; the C server is given the same.
  if (mode.layer.startsWith('c-')) await setReadAhead(mnt, mode.readAheadKb, silentLogger);
  return {
    async stats() {
      if (mode.layer.startsWith('c-')) return { reads: null, bytes: null, cpu: await cpuSeconds(child.pid!) };
      child.stdin.write('stats\n');
      const [, reads, bytes, cpu] = (await next()).split(' ');
      return { reads: Number(reads), bytes: Number(bytes), cpu: Number(cpu) };
    },
    async stop() {
      child.kill('SIGTERM');
      await Promise.race([exited, new Promise((r) => setTimeout(r, 10_000))]);
      // Never leave a mount behind, whatever the server did.
      await sh('fusermount3', ['-u', '-z', mnt]);
    },
  };
}

/** Builds the C reference server; null (and why) when this machine cannot. */
export async function buildCServer(dir: string): Promise<{ binary: string | null; why: string }> {
  const flags = await sh('pkg-config', ['--cflags', '--libs', 'fuse3']);
  if (flags.code !== 0) return { binary: null, why: 'pkg-config finds no fuse3 (libfuse3-dev)' };
  const binary = join(dir, 'memfs-libfuse3');
  const cc = await sh('cc', ['-O2', '-Wall', '-o', binary, C_SOURCE, ...flags.stdout.trim().split(/\s+/)]);
  return cc.code === 0 ? { binary, why: '' } : { binary: null, why: `cc failed: ${cc.stderr.trim().split('\n')[0]}` };
}

async function dd(file: string): Promise<number> {
  const t = await timed(() => sh('dd', [`if=${file}`, 'of=/dev/null', 'bs=1M']));
  const copied = /^(\d+) bytes/m.exec(t.result.stderr);
  if (t.result.code !== 0 || !copied || Number(copied[1]) !== SIZE_MIB * 2 ** 20) throw new Error(`dd ${file} failed: ${t.result.stderr.trim()}`);
  return t.seconds;
}

const gbps = (seconds: number): string => ((SIZE_MIB * 2 ** 20) / seconds / 1e9).toFixed(2);
const median = (xs: number[]): number => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)]!;

export async function fuseCeilingScenario(): Promise<string> {
  const dir = await fsp.mkdtemp(join(tmpdir(), 'gcsmount-ceiling-'));
  const local = join('/dev/shm', `gcsmount-ceiling-${process.pid}`);
  try {
    // The same bytes the servers answer (byte i is i mod 251), for the checksum and the local baseline.
    const chunk = Buffer.alloc(PERIOD * 4096); // a whole number of periods, so each write goes on with it
    for (let i = 0; i < chunk.length; i++) chunk[i] = i % PERIOD;
    const fh = await fsp.open(local, 'w');
    for (let off = 0; off < SIZE_MIB * 2 ** 20; off += chunk.length) await fh.write(chunk, 0, Math.min(chunk.length, SIZE_MIB * 2 ** 20 - off));
    await fh.close();
    await dd(local); // into the page cache, like the servers' memory
    const localRuns: number[] = [];
    for (let r = 0; r < ROUNDS; r++) localRuns.push(await dd(local));
    const c = await buildCServer(dir);

    const rows: string[] = [];
    const modes = MODES.filter((m) => (m.layer === 'libfuse2' ? OLD_LAYER_DIR : m.layer.startsWith('c-') ? c.binary : true));
    for (const [i, mode] of modes.entries()) {
      // A mountpoint of its own per server: a mount still going away at a shared path would be found
      // first in mountinfo, and the next server's read_ahead_kb written to its device instead.
      const mnt = join(dir, `mnt-${i}`);
      await fsp.mkdir(mnt, { recursive: true });
      const server = await startServer(mnt, mode, c.binary);
      try {
        const file = join(mnt, 'data');
        const same = await sh('cmp', [file, local]);
        if (same.code !== 0) throw new Error(`${mode.name}: the mount's bytes differ from the local file: ${same.stdout.trim()}${same.stderr.trim()}`);
        const runs: { s: number; reads: number | null; bytes: number | null; cpu: number }[] = [];
        for (let r = 0; r < ROUNDS; r++) {
          const before = await server.stats();
          const s = await dd(file);
          const after = await server.stats();
          const delta = (a: number | null, b: number | null): number | null => (a === null || b === null ? null : a - b);
          runs.push({ s, reads: delta(after.reads, before.reads), bytes: delta(after.bytes, before.bytes), cpu: after.cpu - before.cpu });
        }
        const times = runs.map((x) => x.s);
        const m = runs.find((x) => x.s === median(times))!;
        const perRead = m.reads && m.bytes !== null ? `${Math.round(m.bytes / m.reads / 1024)} KiB` : '-';
        const cpuPerRead = m.reads ? `${Math.round((m.cpu / m.reads) * 1e6)} µs` : '-';
        rows.push(
          `| ${mode.name} | ${gbps(median(times))} GB/s | ${gbps(Math.max(...times))}-${gbps(Math.min(...times))} | ${perRead} | ${(m.cpu / (SIZE_MIB / 1024)).toFixed(2)} | ${cpuPerRead} |`,
        );
      } finally {
        await server.stop();
      }
    }
    return [
      `\`dd bs=1M\` of a ${SIZE_MIB} MiB file answered from memory: by dist/bench/memory-fs.js (the project's addon over libfuse3, replies from a JavaScript Buffer, no GCS or cache), by a plain C server on libfuse3 (src/bench/memfs-libfuse3.c) and, when installed, by fuse-native over libfuse 2. ${ROUNDS} runs per row, medians; each server's bytes are checked once against the local copy with \`cmp\`. Same run, \`dd\` of the same bytes from /dev/shm: **${gbps(median(localRuns))} GB/s**.`,
      '',
      '| server and kernel requests | throughput (median) | range | bytes per FUSE read | server CPU s per GiB | server CPU per read |',
      '|---|---|---|---|---|---|',
      ...rows,
      '',
      c.binary ? '' : `The C libfuse3 rows were not measured: ${c.why}.`,
      OLD_LAYER_DIR
        ? `The fuse-native rows are the layer the addon replaced, from ${OLD_LAYER_DIR}: libfuse 2 never asks for more than 128 KiB.`
        : 'The old layer (fuse-native over libfuse 2) was not measured: set GCSMOUNT_FUSE_NATIVE_DIR to a folder where `npm install --prefix DIR fuse-native@2.2.6` ran.',
    ]
      .filter((line, i, all) => line !== '' || all[i - 1] !== '')
      .join('\n');
  } finally {
    await fsp.rm(local, { force: true });
    await fsp.rm(dir, { recursive: true, force: true });
  }
}

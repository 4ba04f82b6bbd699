import { spawn, type ChildProcessWithoutNullStreams } from 'node:child_process';
import { promises as fsp } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { createInterface, type Interface } from 'node:readline';
import { fileURLToPath } from 'node:url';
import { sh, timed } from './harness.js';

/**
 * The FUSE layer's ceiling: `dd bs=1M` of a 1 GiB file that a small server (memory-fs.ts) answers from
 * memory through the project's addon, so no GCS, cache or namespace is in the way; against `dd` of the
 * same bytes from a plain file in /dev/shm, in the same run. Three ways the kernel can ask: the
 * kernel's default 128 KiB readahead, read_ahead_kb raised to 4 MiB (--max-read-ahead-kb's default: 1 MiB requests, several in flight),
 * and direct_io (every read(2) goes to the server as it is, up to max_pages). With
 * GCSMOUNT_FUSE_NATIVE_DIR set, the same file through fuse-native over libfuse 2 too (the layer the
 * addon replaced; not a dependency of the project any more).
 */
const SIZE_MIB = 1024;
const ROUNDS = 3;
const SERVER = fileURLToPath(new URL('./memory-fs.js', import.meta.url));
const OLD_SERVER = fileURLToPath(new URL('./memory-fs-libfuse2.js', import.meta.url));
/** A folder holding fuse-native 2.2.6 (`npm install --prefix DIR fuse-native@2.2.6`): the old layer's rows. */
const OLD_LAYER_DIR = process.env.GCSMOUNT_FUSE_NATIVE_DIR;

interface Mode {
  name: string;
  io: 'buffered' | 'direct';
  readAheadKb: number;
  /** The project's addon over libfuse3, or fuse-native over libfuse 2 (the layer it replaced). */
  layer: 'addon' | 'libfuse2';
}

const MODES: Mode[] = [
  { name: 'addon: buffered, kernel readahead 128 KiB', io: 'buffered', readAheadKb: 128, layer: 'addon' },
  { name: 'addon: buffered, read_ahead_kb 4096 (--max-read-ahead-kb default)', io: 'buffered', readAheadKb: 4096, layer: 'addon' },
  { name: 'addon: direct_io', io: 'direct', readAheadKb: 0, layer: 'addon' },
  { name: 'fuse-native (libfuse 2): buffered', io: 'buffered', readAheadKb: 0, layer: 'libfuse2' },
  { name: 'fuse-native (libfuse 2): direct_io', io: 'direct', readAheadKb: 0, layer: 'libfuse2' },
];

interface Server {
  child: ChildProcessWithoutNullStreams;
  lines: Interface;
  next(): Promise<string>;
  stats(): Promise<{ reads: number; bytes: number; cpu: number }>;
  stop(): Promise<void>;
}

async function startServer(mnt: string, mode: Mode): Promise<Server> {
  const args =
    mode.layer === 'addon' ? [SERVER, mnt, String(SIZE_MIB), mode.io, String(mode.readAheadKb)] : [OLD_SERVER, OLD_LAYER_DIR!, mnt, String(SIZE_MIB), mode.io];
  const child = spawn(process.execPath, args, { stdio: ['pipe', 'pipe', 'pipe'] });
  let stderr = '';
  child.stderr.on('data', (d: Buffer) => (stderr += d.toString()));
  const lines = createInterface({ input: child.stdout });
  const queue: string[] = [];
  const waiting: ((l: string) => void)[] = [];
  lines.on('line', (l) => (waiting.length ? waiting.shift()!(l) : queue.push(l)));
  const exited = new Promise<void>((r) => child.once('exit', () => r()));
  const next = (): Promise<string> =>
    queue.length
      ? Promise.resolve(queue.shift()!)
      : Promise.race([new Promise<string>((r) => waiting.push(r)), exited.then(() => Promise.reject(new Error(`memory-fs exited: ${stderr.trim()}`)))]);
  const first = await next();
  if (first !== 'ready') throw new Error(`memory-fs said ${first}`);
  return {
    child,
    lines,
    next,
    async stats() {
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
    // The same bytes the server answers (byte i is i mod 251), for the checksum and the local baseline.
    const chunk = Buffer.alloc(251 * 4096); // a whole number of periods, so each write goes on with it
    for (let i = 0; i < chunk.length; i++) chunk[i] = i % 251;
    const fh = await fsp.open(local, 'w');
    for (let off = 0; off < SIZE_MIB * 2 ** 20; off += chunk.length) await fh.write(chunk, 0, Math.min(chunk.length, SIZE_MIB * 2 ** 20 - off));
    await fh.close();
    await dd(local); // into the page cache, like the server's memory
    const localRuns: number[] = [];
    for (let r = 0; r < ROUNDS; r++) localRuns.push(await dd(local));

    const rows: string[] = [];
    for (const mode of MODES.filter((m) => m.layer === 'addon' || OLD_LAYER_DIR)) {
      const mnt = join(dir, 'mnt');
      await fsp.mkdir(mnt, { recursive: true });
      const server = await startServer(mnt, mode);
      try {
        const file = join(mnt, 'data');
        const same = await sh('cmp', [file, local]);
        if (same.code !== 0) throw new Error(`the mount's bytes differ from the local file: ${same.stdout.trim()}${same.stderr.trim()}`);
        const runs: { s: number; reads: number; bytes: number; cpu: number }[] = [];
        for (let r = 0; r < ROUNDS; r++) {
          const before = await server.stats();
          const s = await dd(file);
          const after = await server.stats();
          runs.push({ s, reads: after.reads - before.reads, bytes: after.bytes - before.bytes, cpu: after.cpu - before.cpu });
        }
        const times = runs.map((x) => x.s);
        const m = runs.find((x) => x.s === median(times))!;
        rows.push(
          `| ${mode.name} | ${gbps(median(times))} GB/s | ${gbps(Math.max(...times))}-${gbps(Math.min(...times))} | ${Math.round(m.bytes / m.reads / 1024)} KiB | ${(m.cpu / (SIZE_MIB / 1024)).toFixed(2)} | ${(((m.cpu / m.reads) * 1e6) | 0)} µs |`,
        );
      } finally {
        await server.stop();
      }
    }
    return [
      `\`dd bs=1M\` of a ${SIZE_MIB} MiB file answered from memory by dist/bench/memory-fs.js (the project's addon over libfuse3, replies from a JavaScript Buffer, no GCS or cache), ${ROUNDS} runs per row, medians; every read is checked once against the local copy with \`cmp\`. Same run, \`dd\` of the same bytes from /dev/shm: **${gbps(median(localRuns))} GB/s**.`,
      '',
      '| kernel requests | throughput (median) | range | bytes per FUSE read | server CPU s per GiB | server CPU per read |',
      '|---|---|---|---|---|---|',
      ...rows,
      '',
      OLD_LAYER_DIR
        ? `The fuse-native rows are the layer the addon replaced, from ${OLD_LAYER_DIR}: libfuse 2 never asks for more than 128 KiB.`
        : 'The old layer (fuse-native over libfuse 2) was not measured: set GCSMOUNT_FUSE_NATIVE_DIR to a folder where `npm install --prefix DIR fuse-native@2.2.6` ran.',
    ].join('\n');
  } finally {
    await fsp.rm(local, { force: true });
    await fsp.rm(dir, { recursive: true, force: true });
  }
}

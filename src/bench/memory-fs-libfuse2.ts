// The old FUSE layer's ceiling, for the fuse-ceiling bench's same-run baseline: the file memory-fs.ts
// serves, through fuse-native 2.2.6 over libfuse 2 (which the project used before its own addon, and no
// longer depends on). fuse-native is loaded from a folder the caller installed it into:
//
//   npm install --prefix DIR fuse-native@2.2.6
//   node dist/bench/memory-fs-libfuse2.js DIR MOUNTPOINT SIZE_MIB buffered|direct
//
// Same protocol as memory-fs.ts: "ready", then "stats READS BYTES CPU_SECONDS" per "stats" line.
import { createRequire } from 'node:module';
import { join } from 'node:path';
import { createInterface } from 'node:readline';

const MIB = 2 ** 20;
const PERIOD = 251;

type Done = (code: number, value?: unknown) => void;
interface FuseNative {
  mount(cb: (err: Error | null) => void): void;
  unmount(cb: (err: Error | null) => void): void;
}
type FuseNativeClass = (new (mnt: string, ops: Record<string, unknown>, opts: Record<string, unknown>) => FuseNative) & { ENOENT: number };

function main(): void {
  const [dir, mnt, sizeArg, modeArg] = process.argv.slice(2);
  const size = Number(sizeArg) * MIB;
  if (!dir || !mnt || !(size > 0) || (modeArg !== 'buffered' && modeArg !== 'direct')) {
    process.stderr.write('usage: memory-fs-libfuse2 FUSE_NATIVE_DIR MOUNTPOINT SIZE_MIB buffered|direct\n');
    process.exit(2);
  }
  const Fuse = createRequire(join(dir, 'package.json'))('fuse-native') as FuseNativeClass;
  const pattern = Buffer.alloc(2 * MIB + PERIOD);
  for (let i = 0; i < pattern.length; i++) pattern[i] = i % PERIOD;
  const now = new Date();
  const stat = (mode: number, bytes: number, nlink: number) => ({ mtime: now, atime: now, ctime: now, size: bytes, mode, uid: 0, gid: 0, nlink });
  let reads = 0;
  let bytes = 0;
  const ops = {
    getattr(p: string, cb: Done) {
      if (p === '/') return cb(0, stat(0o40555, 0, 2));
      if (p === '/data') return cb(0, stat(0o100444, size, 1));
      return cb(Fuse.ENOENT);
    },
    readdir(_p: string, cb: Done) {
      cb(0, ['data']);
    },
    open(_p: string, _flags: number, cb: Done) {
      cb(0, 1);
    },
    release(_p: string, _fd: number, cb: Done) {
      cb(0);
    },
    // libfuse 2 hands a buffer of its own: the copy into it is part of this layer's cost.
    read(_p: string, _fd: number, buf: Buffer, len: number, pos: number, cb: (n: number) => void) {
      const n = Math.max(0, Math.min(len, size - pos));
      pattern.copy(buf, 0, pos % PERIOD, (pos % PERIOD) + n);
      reads++;
      bytes += n;
      cb(n);
    },
  };
  const fuse = new Fuse(mnt, ops, { force: true, directIO: modeArg === 'direct' });
  fuse.mount((err) => {
    if (err) {
      process.stderr.write(`memory-fs-libfuse2: cannot mount: ${err.message}\n`);
      process.exit(1);
    }
    process.stdout.write('ready\n');
  });
  const stop = (): void => fuse.unmount(() => process.exit(0));
  process.on('SIGTERM', stop);
  process.on('SIGINT', stop);
  createInterface({ input: process.stdin }).on('line', (line) => {
    if (line.trim() !== 'stats') return;
    const cpu = process.cpuUsage();
    process.stdout.write(`stats ${reads} ${bytes} ${((cpu.user + cpu.system) / 1e6).toFixed(3)}\n`);
  });
}

main();

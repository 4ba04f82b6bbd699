// The FUSE layer's own ceiling: one file served from memory through the project's addon, with no GCS,
// no block cache and no namespace behind it, so what a reader measures is the kernel, libfuse3, the
// addon's hand-off to JavaScript and the reply from a Buffer, the path every JavaScript-answered read takes.
//
//   node dist/bench/memory-fs.js MOUNTPOINT SIZE_MIB buffered|direct READ_AHEAD_KB
//
// Prints "ready" once mounted; each line "stats" on stdin is answered with
// "stats READS BYTES CPU_SECONDS" (this process, all threads); SIGTERM unmounts and exits.
import { createInterface } from 'node:readline';
import { loadFuse, OP, OPEN_FLAGS, type Attr } from '../fs/kernel.js';
import { FuseMount, prepareMountPoint, setReadAhead } from '../fs/mount.js';
import { silentLogger } from '../observe/logger.js';

const MIB = 2 ** 20;
const ENOENT = 2;
const ENOSYS = 38;
const TIMEOUT_S = 3600;

async function main(): Promise<void> {
  const [mountArg, sizeArg, modeArg, readAheadArg] = process.argv.slice(2);
  const size = Number(sizeArg) * MIB;
  if (!mountArg || !(size > 0) || (modeArg !== 'buffered' && modeArg !== 'direct') || !(Number(readAheadArg) >= 0)) {
    process.stderr.write('usage: memory-fs MOUNTPOINT SIZE_MIB buffered|direct READ_AHEAD_KB\n');
    process.exit(2);
  }
  // Byte i of the file is (i mod 251): a period that no request size divides, so a reply from the
  // wrong offset shows in the reader's checksum.
  const PERIOD = 251;
  const pattern = Buffer.alloc(2 * MIB + PERIOD);
  for (let i = 0; i < pattern.length; i++) pattern[i] = i % PERIOD;

  const fuse = loadFuse();
  const now = Date.now();
  const root: Attr = [1, 0o40555, 2, 0, 0, 0, now];
  const file: Attr = [2, 0o100444, 1, 0, 0, size, now];
  const openFlags = modeArg === 'direct' ? OPEN_FLAGS.DIRECT_IO : 0;
  let reads = 0;
  let bytes = 0;

  const path = await prepareMountPoint(mountArg);
  const mount = FuseMount.mount(
    path,
    fuse,
    (op, req, ino, _fh, y, z, name) => {
      if (!req) return; // FORGET
      switch (op) {
        case OP.LOOKUP:
          if (ino === 1 && name === 'data') fuse.replyEntry(req, file, TIMEOUT_S, TIMEOUT_S);
          else fuse.replyErr(req, ENOENT);
          return;
        case OP.GETATTR:
          return fuse.replyAttr(req, ino === 1 ? root : file, TIMEOUT_S);
        case OP.OPEN:
          fuse.replyOpen(req, 1, openFlags);
          return;
        case OP.READ: {
          const n = Math.max(0, Math.min(z, size - y));
          reads++;
          bytes += n;
          return fuse.replyBuf(req, pattern.subarray(y % PERIOD), n);
        }
        case OP.OPENDIR:
          fuse.replyOpen(req, 1, 0);
          return;
        case OP.READDIR:
          fuse.replyDir(req, ['.', '..', 'data'], [1, 1, 2], [0o040000, 0o040000, 0o100000], y, z);
          return;
        case OP.RELEASE:
        case OP.RELEASEDIR:
          return fuse.replyErr(req, 0);
        case OP.STATFS:
          return fuse.replyStatfs(req, [4096, 4096, 0, 0, 0, 0, 0, 0, 0, 0, 255]);
        default:
          return fuse.replyErr(req, ENOSYS);
      }
    },
    { readOnly: true, fsName: 'memory-fs', allowOther: false, extra: [], maxBackground: 64, congestionThreshold: 0, parallelDirops: true, readHandlesBelow: 0 },
  );
  await setReadAhead(path, Number(readAheadArg), silentLogger);

  const stop = (): void => {
    void mount.unmount().then(() => process.exit(0));
  };
  process.on('SIGTERM', stop);
  process.on('SIGINT', stop);
  void mount.ended.then(() => process.exit(0));
  createInterface({ input: process.stdin }).on('line', (line) => {
    if (line.trim() !== 'stats') return;
    const cpu = process.cpuUsage();
    process.stdout.write(`stats ${reads} ${bytes} ${((cpu.user + cpu.system) / 1e6).toFixed(3)}\n`);
  });
  process.stdout.write('ready\n');
}

main().catch((err: Error) => {
  process.stderr.write(`memory-fs: ${err.message}\n`);
  process.exit(1);
});

import { createHash } from 'node:crypto';
import { closeSync, openSync, readdirSync, readSync } from 'node:fs';
import { join } from 'node:path';

/**
 * One reader of the torture test, run as its own process (it reads the mount synchronously, which only a
 * process other than the daemon's host may do), until the deadline. It prints one JSON line per read:
 * what it asked for, how many bytes came back, their SHA-256 (or the error, and when the read began and
 * ended).
 * - `random`: random ranges of random objects among NAMEs.
 * - `sweep`: the files of the folder NAME whole, in name order, from a random one on, as a Zarr loader or
 *   `ls | xargs cat` reads chunk files: the mount's folder prefetch runs ahead of it, so its opens find
 *   blocks still downloading (the reads that wait in the addon for their block to land).
 * argv: MOUNT DEADLINE_EPOCH_MS SEED MAX_SIZE random|sweep NAME...
 */
const [mount, deadlineText, seedText, maxSizeText, mode, ...names] = process.argv.slice(2);
const deadline = Number(deadlineText);
const maxSize = Number(maxSizeText);
let state = Number(seedText) >>> 0 || 1;
/** xorshift32: reproducible per seed, and cheap. */
function rand(): number {
  state ^= state << 13;
  state ^= state >>> 17;
  state ^= state << 5;
  return (state >>> 0) / 2 ** 32;
}

const MAX_READ = 16 * 1024 * 1024;
const CHUNK = 64 * 1024;
const buf = Buffer.allocUnsafe(MAX_READ);

/** Reads [offset, offset + length) of `name` (or to its end) and prints the line for it. */
function readOne(name: string, offset: number, length: number): void {
  let fd = -1;
  // When the read began and ended: the test judges an error by when it happened, not by when its line
  // reached a busy parent (seen 13 s late).
  const began = Date.now();
  try {
    fd = openSync(join(mount!, name), 'r');
    let got = 0;
    while (got < length) {
      const n = readSync(fd, buf, got, length - got, offset + got);
      if (n === 0) break;
      got += n;
    }
    const sha = createHash('sha256').update(buf.subarray(0, got)).digest('hex');
    // Per 64 KiB chunk too, so a wrong read can be taken apart: which generation each piece came from.
    const chunks: string[] = [];
    for (let at = 0; at < got; at += CHUNK) chunks.push(createHash('sha256').update(buf.subarray(at, Math.min(got, at + CHUNK))).digest('hex').slice(0, 16));
    process.stdout.write(`${JSON.stringify({ name, offset, length, got, sha, chunks })}\n`);
  } catch (err) {
    process.stdout.write(`${JSON.stringify({ name, offset, length, error: (err as NodeJS.ErrnoException).code ?? String(err), began, ended: Date.now() })}\n`);
    // A mount being restarted fails at once: pause instead of spinning on it.
    Atomics.wait(new Int32Array(new SharedArrayBuffer(4)), 0, 0, 50);
  } finally {
    if (fd >= 0) {
      try {
        closeSync(fd);
      } catch {
        // A mount cut under the reader: the close fails too.
      }
    }
  }
}

/** The folder's files in name order (as `ls` lists them), or [] while the mount is being restarted. */
function listFolder(dir: string): string[] {
  try {
    return readdirSync(join(mount!, dir)).sort().map((f) => `${dir}/${f}`);
  } catch {
    Atomics.wait(new Int32Array(new SharedArrayBuffer(4)), 0, 0, 50);
    return [];
  }
}

if (mode === 'sweep') {
  while (Date.now() < deadline) {
    const files = listFolder(names[0]!);
    for (let i = Math.floor(rand() * files.length); i < files.length && Date.now() < deadline; i++) readOne(files[i]!, 0, MAX_READ);
  }
} else {
  while (Date.now() < deadline) {
    const name = names[Math.floor(rand() * names.length)]!;
    // Lengths from 1 B to 16 MiB, spread evenly on a log scale so both tiny and huge reads happen often.
    const length = Math.max(1, Math.floor(2 ** (rand() * 24)));
    const offset = rand() < 0.2 ? 0 : Math.floor(rand() * maxSize);
    readOne(name, offset, length);
  }
}

import { createHash } from 'node:crypto';
import { closeSync, openSync, readSync } from 'node:fs';
import { join } from 'node:path';

/**
 * One reader of the torture test, run as its own process (it reads the mount synchronously, which only a
 * process other than the daemon's host may do). Reads random ranges of random objects until the
 * deadline and prints one JSON line per read: what it asked for, how many bytes came back, their SHA-256
 * (or the error, and when the read began and ended).
 * argv: MOUNT DEADLINE_EPOCH_MS SEED MAX_SIZE NAME...
 */
const [mount, deadlineText, seedText, maxSizeText, ...names] = process.argv.slice(2);
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
while (Date.now() < deadline) {
  const name = names[Math.floor(rand() * names.length)]!;
  // Lengths from 1 B to 16 MiB, spread evenly on a log scale so both tiny and huge reads happen often.
  const length = Math.max(1, Math.floor(2 ** (rand() * 24)));
  const offset = rand() < 0.2 ? 0 : Math.floor(rand() * maxSize);
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

// CRC32C and MD5 of object content, streamed from an open file and remembered per file version.
import { createHash } from 'node:crypto';
import type { FileHandle } from 'node:fs/promises';
import { crc32c } from '@node-rs/crc32';

export interface Hashes {
  /** base64 of the big-endian 4-byte CRC32C, as GCS reports it. */
  crc32c: string;
  /** base64 of the 16-byte MD5. */
  md5Hash: string;
}

/** Identifies one version of a file's content without reading it. */
export interface FileVersion {
  path: string;
  ino: bigint;
  size: number;
  mtimeNs: bigint;
}

const CHUNK = 1 << 20;
const MAX_ENTRIES = 200_000;

export function crc32cBase64(value: number): string {
  const b = Buffer.alloc(4);
  b.writeUInt32BE(value >>> 0);
  return b.toString('base64');
}

/** Reads from the handle rather than the path so the hashes match the bytes a caller is serving. */
export async function hashHandle(fh: FileHandle, size: number): Promise<Hashes> {
  const buf = Buffer.allocUnsafe(Math.min(CHUNK, Math.max(size, 1)));
  const md5 = createHash('md5');
  let crc = 0;
  let pos = 0;
  for (;;) {
    const { bytesRead } = await fh.read(buf, 0, buf.length, pos);
    if (bytesRead === 0) break;
    const chunk = buf.subarray(0, bytesRead);
    crc = crc32c(chunk, crc);
    md5.update(chunk);
    pos += bytesRead;
  }
  return { crc32c: crc32cBase64(crc), md5Hash: md5.digest('base64') };
}

/** One file version's hashes: being computed (`hashes`), and once known also `settled`, for callers that cannot wait. */
interface HashEntry {
  ino: bigint;
  size: number;
  mtimeNs: bigint;
  hashes: Promise<Hashes>;
  settled?: Hashes;
}

/**
 * Hashing a 100 MiB object on every metadata call would dominate a benchmark, so results are kept by
 * file version; concurrent callers for the same version share one computation. One version per path
 * (the newest asked for): a lookup is one Map get and three comparisons, as a listing asks for
 * 1,000 of them per page.
 */
export class HashCache {
  private readonly entries = new Map<string, HashEntry>();

  get(version: FileVersion, compute: () => Promise<Hashes>): Promise<Hashes> {
    let p = this.peek(version);
    if (!p) {
      const computing = compute();
      p = computing;
      this.remember(version, computing);
      // A failed read (file vanished mid-hash) must not poison the cache.
      computing.catch(() => {
        if (this.entries.get(version.path)?.hashes === computing) this.entries.delete(version.path);
      });
    }
    return p;
  }

  /** The cached result for this version, if any, without computing it. */
  peek(version: FileVersion): Promise<Hashes> | undefined {
    return this.entry(version)?.hashes;
  }

  /** The result for this version if it is known already (not still being computed). */
  peekSettled(version: FileVersion): Hashes | undefined {
    return this.entry(version)?.settled;
  }

  private entry(version: FileVersion): HashEntry | undefined {
    const e = this.entries.get(version.path);
    return e && e.ino === version.ino && e.size === version.size && e.mtimeNs === version.mtimeNs ? e : undefined;
  }

  /** Uploads hash their bytes before committing; this saves re-reading them afterwards. */
  seed(version: FileVersion, hashes: Hashes): void {
    this.remember(version, Promise.resolve(hashes), hashes);
  }

  private remember(version: FileVersion, p: Promise<Hashes>, settled?: Hashes): void {
    if (!this.entries.has(version.path) && this.entries.size >= MAX_ENTRIES) {
      const oldest = this.entries.keys().next();
      if (!oldest.done) this.entries.delete(oldest.value);
    }
    const entry: HashEntry = { ino: version.ino, size: version.size, mtimeNs: version.mtimeNs, hashes: p, settled };
    this.entries.set(version.path, entry);
    p.then(
      (h) => (entry.settled = h),
      () => undefined,
    );
  }
}

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

/**
 * Hashing a 100 MiB object on every metadata call would dominate a benchmark, so results are kept by
 * file version; concurrent callers for the same version share one computation.
 */
export class HashCache {
  private readonly entries = new Map<string, Promise<Hashes>>();

  get(version: FileVersion, compute: () => Promise<Hashes>): Promise<Hashes> {
    const key = keyOf(version);
    let p = this.entries.get(key);
    if (!p) {
      p = compute();
      this.remember(key, p);
      // A failed read (file vanished mid-hash) must not poison the cache.
      p.catch(() => {
        if (this.entries.get(key) === p) this.entries.delete(key);
      });
    }
    return p;
  }

  /** The cached result for this version, if any, without computing it. */
  peek(version: FileVersion): Promise<Hashes> | undefined {
    return this.entries.get(keyOf(version));
  }

  /** Uploads hash their bytes before committing; this saves re-reading them afterwards. */
  seed(version: FileVersion, hashes: Hashes): void {
    this.remember(keyOf(version), Promise.resolve(hashes));
  }

  private remember(key: string, p: Promise<Hashes>): void {
    if (this.entries.size >= MAX_ENTRIES) {
      const oldest = this.entries.keys().next();
      if (!oldest.done) this.entries.delete(oldest.value);
    }
    this.entries.set(key, p);
  }
}

function keyOf(v: FileVersion): string {
  return `${v.path}\0${v.ino}\0${v.size}\0${v.mtimeNs}`;
}

// Objects' Content-Encoding metadata (e.g. 'gzip', as their upload declared it), which a file cannot
// carry: one side file per bucket, each entry valid only for the generation it was written for.
import { promises as fsp } from 'node:fs';
import path from 'node:path';
import { statOrNull } from './file-stat.js';
import { SIDE_DIR } from './names.js';
import type { StoredObject } from './stored-object.js';

/** Per bucket: name -> the Content-Encoding its upload declared, for the generation that upload made. */
const ENCODINGS = 'encodings.json';

/** What the encodings file holds for one name; it applies only while the object has that generation. */
export interface StoredEncoding {
  generation: string;
  contentEncoding: string;
}

/**
 * The Content-Encodings of a bucket's objects. An entry counts only for the generation it was written
 * for, so a file rewritten behind the emulator's back (a new mtime, so a new generation) is identity.
 */
export class ContentEncodings {
  constructor(private readonly entries: ReadonlyMap<string, StoredEncoding>) {}

  of(obj: StoredObject): string | null {
    const e = this.entries.get(obj.name);
    return e && e.generation === obj.generation ? e.contentEncoding : null;
  }
}

/** Reads and writes the encodings file; writes must be made under the store's bucket lock. */
export class EncodingStore {
  private readonly cache = new Map<string, { key: string; entries: Map<string, StoredEncoding> }>();

  constructor(
    private readonly bucketDir: (bucket: string) => string,
    private readonly tempPath: (bucket: string) => Promise<string>,
  ) {}

  /** The bucket's Content-Encodings (read afresh when the file changed, like the side index). */
  async of(bucket: string): Promise<ContentEncodings> {
    return new ContentEncodings(await this.entries(bucket));
  }

  /** Records (or, with null, forgets) `name`'s Content-Encoding for one generation. Call under the bucket lock. */
  async set(bucket: string, name: string, value: StoredEncoding | null): Promise<void> {
    const entries = new Map(await this.entries(bucket));
    if (value === null && !entries.has(name)) return;
    if (value === null) entries.delete(name);
    else entries.set(name, value);
    const p = this.file(bucket);
    await fsp.mkdir(path.dirname(p), { recursive: true });
    const tmp = await this.tempPath(bucket);
    await fsp.writeFile(tmp, JSON.stringify(Object.fromEntries(entries)));
    await fsp.rename(tmp, p);
  }

  private file(bucket: string): string {
    return path.join(this.bucketDir(bucket), SIDE_DIR, ENCODINGS);
  }

  private async entries(bucket: string): Promise<Map<string, StoredEncoding>> {
    const p = this.file(bucket);
    const st = await statOrNull(p);
    if (!st) return new Map();
    const key = `${st.ino}:${st.size}:${st.mtimeNs}`;
    const cached = this.cache.get(p);
    if (cached && cached.key === key) return cached.entries;
    const entries = new Map<string, StoredEncoding>();
    try {
      const parsed: unknown = JSON.parse(await fsp.readFile(p, 'utf8'));
      for (const [name, v] of Object.entries(parsed as Record<string, Partial<StoredEncoding>>)) {
        if (typeof v?.generation === 'string' && typeof v.contentEncoding === 'string') entries.set(name, { generation: v.generation, contentEncoding: v.contentEncoding });
      }
    } catch {
      // A hand-damaged file reads as "no encodings" rather than failing every request.
    }
    this.cache.set(p, { key, entries });
    return entries;
  }
}

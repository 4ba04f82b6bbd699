// The side store: objects whose names a file cannot hold (or that collide with a folder at upload
// time), kept in SIDE_DIR under a hash of their name, with an index of the names it holds.
import { createHash } from 'node:crypto';
import { promises as fsp } from 'node:fs';
import path from 'node:path';
import { statOrNull } from './file-stat.js';
import { SIDE_DIR } from './names.js';

const INDEX = 'index.json';

export class SideStore {
  private readonly indexCache = new Map<string, { key: string; names: Set<string> }>();

  constructor(
    private readonly bucketDir: (bucket: string) => string,
    private readonly tempPath: (bucket: string) => Promise<string>,
  ) {}

  /** Names held in the side store (read from its index on every call, cached by the index's stat). */
  async names(bucket: string): Promise<Set<string>> {
    const p = this.indexPath(bucket);
    const st = await statOrNull(p);
    if (!st) return new Set();
    const key = `${st.ino}:${st.size}:${st.mtimeNs}`;
    const cached = this.indexCache.get(p);
    if (cached && cached.key === key) return cached.names;
    let names = new Set<string>();
    try {
      const parsed: unknown = JSON.parse(await fsp.readFile(p, 'utf8'));
      if (Array.isArray(parsed)) names = new Set(parsed.filter((n): n is string => typeof n === 'string'));
    } catch {
      // A hand-damaged index reads as empty rather than failing every request.
    }
    this.indexCache.set(p, { key, names });
    return names;
  }

  /** The file that holds `name` when the side store holds it. */
  objectPath(bucket: string, name: string): string {
    const digest = createHash('sha256').update(name, 'utf8').digest('hex');
    return path.join(this.bucketDir(bucket), SIDE_DIR, 'objects', digest);
  }

  /** Replaces the index with `names`. Call under the bucket lock. */
  async writeNames(bucket: string, names: string[]): Promise<void> {
    const p = this.indexPath(bucket);
    await fsp.mkdir(path.dirname(p), { recursive: true });
    const tmp = await this.tempPath(bucket);
    await fsp.writeFile(tmp, JSON.stringify(names));
    await fsp.rename(tmp, p);
  }

  private indexPath(bucket: string): string {
    return path.join(this.bucketDir(bucket), SIDE_DIR, INDEX);
  }
}

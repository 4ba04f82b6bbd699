// Object attributes a file cannot carry: metageneration, contentType and custom metadata, kept per
// bucket in a side file, each entry valid only for the generation it was written for.
import { promises as fsp } from 'node:fs';
import path from 'node:path';
import { SIDE_DIR } from './names.js';
import type { StoredObject } from './store.js';

/** What an object resource shows beyond its bytes and times. */
export interface ObjectAttrs {
  /** A decimal string, as GCS sends it; '1' for an object never patched. */
  metageneration: string;
  contentType: string | null;
  /** Custom metadata (`metadata` in the JSON API), or null when the object has none. */
  metadata: Record<string, string> | null;
}

/** What an upload, copy or compose gives a new object; its metageneration is always 1. */
export type NewAttrs = Omit<ObjectAttrs, 'metageneration'>;

interface StoredAttrs extends ObjectAttrs {
  generation: string;
}

const FILE = 'attributes.json';

export const NO_ATTRS: ObjectAttrs = { metageneration: '1', contentType: null, metadata: null };

/**
 * A bucket's attributes, looked up per object. An entry counts only for the generation it was written
 * for, so a file rewritten behind the emulator's back (a new mtime, so a new generation) has none.
 */
export class AttrsOf {
  constructor(private readonly entries: ReadonlyMap<string, StoredAttrs>) {}

  of(obj: StoredObject): ObjectAttrs {
    const e = this.entries.get(obj.name);
    return e && e.generation === obj.generation ? e : NO_ATTRS;
  }
}

/** Reads and writes the side file; writes must be made under the store's bucket lock. */
export class AttributeStore {
  private readonly cache = new Map<string, { key: string; entries: Map<string, StoredAttrs> }>();

  constructor(
    private readonly bucketDir: (bucket: string) => string,
    private readonly tempPath: (bucket: string) => Promise<string>,
  ) {}

  async of(bucket: string): Promise<AttrsOf> {
    return new AttrsOf(await this.entries(bucket));
  }

  async get(obj: StoredObject): Promise<ObjectAttrs> {
    return (await this.of(obj.bucket)).of(obj);
  }

  /** Records `name`'s attributes for one generation, or forgets them (null). */
  async set(bucket: string, name: string, value: (ObjectAttrs & { generation: string }) | null): Promise<void> {
    const entries = new Map(await this.entries(bucket));
    if (value === null && !entries.has(name)) return;
    if (value === null) entries.delete(name);
    else entries.set(name, { generation: value.generation, metageneration: value.metageneration, contentType: value.contentType, metadata: value.metadata });
    const p = this.file(bucket);
    await fsp.mkdir(path.dirname(p), { recursive: true });
    const tmp = await this.tempPath(bucket);
    await fsp.writeFile(tmp, JSON.stringify(Object.fromEntries(entries)));
    await fsp.rename(tmp, p);
  }

  private file(bucket: string): string {
    return path.join(this.bucketDir(bucket), SIDE_DIR, FILE);
  }

  private async entries(bucket: string): Promise<Map<string, StoredAttrs>> {
    const p = this.file(bucket);
    const st = await fsp.stat(p, { bigint: true }).catch(() => null);
    if (!st) return new Map();
    const key = `${st.ino}:${st.size}:${st.mtimeNs}`;
    const cached = this.cache.get(p);
    if (cached && cached.key === key) return cached.entries;
    const entries = new Map<string, StoredAttrs>();
    try {
      const parsed = JSON.parse(await fsp.readFile(p, 'utf8')) as Record<string, Partial<StoredAttrs>>;
      for (const [name, v] of Object.entries(parsed)) {
        if (typeof v?.generation !== 'string' || typeof v.metageneration !== 'string') continue;
        entries.set(name, { generation: v.generation, metageneration: v.metageneration, contentType: v.contentType ?? null, metadata: v.metadata ?? null });
      }
    } catch {
      // A hand-damaged file reads as "no attributes" rather than failing every request.
    }
    this.cache.set(p, { key, entries });
    return entries;
  }
}

/**
 * The attributes an object resource sent by a client asks for (`contentType`, `metadata`): values must
 * be strings, as GCS requires; anything else is a 400 at the caller.
 */
export function attrsFromResource(resource: Record<string, unknown>): NewAttrs {
  const contentType = typeof resource.contentType === 'string' && resource.contentType !== '' ? resource.contentType : null;
  return { contentType, metadata: metadataFrom(resource.metadata) };
}

export function metadataFrom(v: unknown): Record<string, string> | null {
  if (v === undefined || v === null) return null;
  if (typeof v !== 'object' || Array.isArray(v)) throw new TypeError('metadata must be an object of strings');
  const out: Record<string, string> = {};
  for (const [k, val] of Object.entries(v as Record<string, unknown>)) {
    if (val === null) continue;
    // GCS keeps every value as a string; a number or boolean sent as JSON is stored as its text.
    if (typeof val === 'object') throw new TypeError(`metadata.${k} must be a string`);
    out[k] = String(val);
  }
  return Object.keys(out).length ? out : null;
}

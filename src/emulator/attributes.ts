// Object attributes a file cannot carry: metageneration, contentType, custom metadata and the other
// fields a client may set (cacheControl, storageClass, ...), kept in side files, each entry valid only for
// the generation it was written for.
import { createHash } from 'node:crypto';
import { promises as fsp } from 'node:fs';
import path from 'node:path';
import { SIDE_DIR } from './names.js';
import type { StoredObject } from './stored-object.js';

/** What an object resource shows beyond its bytes and times. */
export interface ObjectAttrs {
  /** A decimal string, as GCS sends it; '1' for an object never patched. */
  metageneration: string;
  contentType: string | null;
  /** Custom metadata (`metadata` in the JSON API), or null when the object has none. */
  metadata: Record<string, string> | null;
  /** The other settable string fields the object has (none: {}). */
  fields: SettableFields;
}

/** String fields of an object resource a client sets on upload, copy, compose or patch, beside contentType. */
export const SETTABLE_FIELDS = ['cacheControl', 'contentDisposition', 'contentLanguage', 'customTime', 'storageClass'] as const;
export type SettableField = (typeof SETTABLE_FIELDS)[number];
export type SettableFields = Partial<Record<SettableField, string>>;

/** The storage classes GCS takes for an object; storageClass is reported as STANDARD when unset. */
const STORAGE_CLASSES = new Set(['STANDARD', 'NEARLINE', 'COLDLINE', 'ARCHIVE', 'MULTI_REGIONAL', 'REGIONAL', 'DURABLE_REDUCED_AVAILABILITY']);

/** What an upload, copy or compose gives a new object; its metageneration is always 1. */
export type NewAttrs = Omit<ObjectAttrs, 'metageneration'>;

interface StoredAttrs extends ObjectAttrs {
  generation: string;
}

/** Each object's attributes in a file of its own, named by a hash of its name: a write costs one small file. */
const DIR = 'attributes';

export const NO_ATTRS: ObjectAttrs = { metageneration: '1', contentType: null, metadata: null, fields: {} };

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

interface BucketAttrs {
  /** The folder's stat when `entries` last matched it: another change (another process's) reloads it. */
  stamp: string;
  entries: Map<string, StoredAttrs>;
}

/**
 * Reads and writes the side files (one per object: a bucket of 10,000 written objects once rewrote a
 * megabyte of JSON per upload); writes must be made under the store's bucket lock.
 */
export class AttributeStore {
  private readonly cache = new Map<string, BucketAttrs>();

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
    const entries = await this.entries(bucket);
    if (value === null && !entries.has(name)) return;
    const dir = this.dir(bucket);
    const file = path.join(dir, createHash('sha256').update(name, 'utf8').digest('hex'));
    if (value === null) {
      await fsp.rm(file, { force: true });
      entries.delete(name);
    } else {
      const stored: StoredAttrs = { generation: value.generation, metageneration: value.metageneration, contentType: value.contentType, metadata: value.metadata, fields: value.fields };
      await fsp.mkdir(dir, { recursive: true });
      const tmp = await this.tempPath(bucket);
      await fsp.writeFile(tmp, JSON.stringify({ name, ...stored }));
      await fsp.rename(tmp, file);
      entries.set(name, stored);
    }
    this.cache.set(dir, { stamp: await stampOf(dir), entries });
  }

  private dir(bucket: string): string {
    return path.join(this.bucketDir(bucket), SIDE_DIR, DIR);
  }

  private async entries(bucket: string): Promise<Map<string, StoredAttrs>> {
    const dir = this.dir(bucket);
    const stamp = await stampOf(dir);
    const cached = this.cache.get(dir);
    if (cached && cached.stamp === stamp) return cached.entries;
    const entries = new Map<string, StoredAttrs>();
    for (const f of await fsp.readdir(dir).catch(() => [] as string[])) {
      try {
        const v = JSON.parse(await fsp.readFile(path.join(dir, f), 'utf8')) as Partial<StoredAttrs & { name: string }>;
        if (typeof v.name !== 'string' || typeof v.generation !== 'string' || typeof v.metageneration !== 'string') continue;
        entries.set(v.name, { generation: v.generation, metageneration: v.metageneration, contentType: v.contentType ?? null, metadata: v.metadata ?? null, fields: v.fields ?? {} });
      } catch {
        // A hand-damaged (or vanished) file reads as "no attributes" rather than failing every request.
      }
    }
    this.cache.set(dir, { stamp, entries });
    return entries;
  }
}

async function stampOf(dir: string): Promise<string> {
  const st = await fsp.stat(dir, { bigint: true }).catch(() => null);
  return st ? `${st.ino}:${st.mtimeNs}:${st.ctimeNs}` : 'none';
}

/**
 * The attributes an object resource sent by a client asks for (`contentType`, `metadata`, the settable
 * fields): values must be strings, as GCS requires; anything else is a 400 at the caller.
 */
export function attrsFromResource(resource: Record<string, unknown>): NewAttrs {
  const contentType = typeof resource.contentType === 'string' && resource.contentType !== '' ? resource.contentType : null;
  return { contentType, metadata: metadataFrom(resource.metadata), fields: fieldsFrom(resource) };
}

/** The settable fields `resource` names with a value (null or '' unsets one: absent here); malformed throws. */
export function fieldsFrom(resource: Record<string, unknown>): SettableFields {
  const out: SettableFields = {};
  for (const key of SETTABLE_FIELDS) {
    const v = resource[key];
    if (v === undefined || v === null || v === '') continue;
    if (typeof v !== 'string') throw new TypeError(`${key} must be a string`);
    if (key === 'storageClass' && !STORAGE_CLASSES.has(v)) throw new TypeError(`storageClass ${v} is not a storage class`);
    if (key === 'customTime' && Number.isNaN(Date.parse(v))) throw new TypeError(`customTime ${v} is not an RFC 3339 time`);
    out[key] = v;
  }
  return out;
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

import type { ListPage, ListRequest, ObjectClient, ObjectMeta } from '../gcs/object-client.js';
import { mulberry32 } from '../emulator/faults.js';
import { compareNames } from '../name-order.js';

/** A seeded PRNG: the same seed gives the same schedule, so a failure can be replayed. */
export const seededRandom = mulberry32;

/**
 * A bucket in memory that answers objects.list as GCS does (prefix, delimiter, startOffset, endOffset,
 * maxResults, page tokens; prefixes derived from the objects in range), after a random number of event
 * loop turns, so that concurrent requests come back in any order. Like GCS, it may also answer a page
 * with fewer items than asked, even none, and a token to go on: a lister must never take a short page
 * for the end. Changes apply at once; a request sees the bucket as it is when it is answered.
 */
export class ModelBucket implements ObjectClient {
  readonly bucket = 'model';
  private names: string[] = [];
  private readonly metas = new Map<string, ObjectMeta>();
  private generation = 1;
  requests = 0;

  constructor(
    private readonly random: () => number,
    private readonly opts: { maxTurns: number; shortPages: number },
  ) {}

  put(name: string): ObjectMeta {
    const meta: ObjectMeta = { name, size: name.length, generation: String(this.generation++), metageneration: '1', updatedMs: 0, crc32c: null };
    if (!this.metas.has(name)) {
      const i = this.insertionPoint(name);
      this.names.splice(i, 0, name);
    }
    this.metas.set(name, meta);
    return meta;
  }

  delete(name: string): void {
    if (!this.metas.delete(name)) return;
    this.names.splice(this.insertionPoint(name), 1);
  }

  has(name: string): boolean {
    return this.metas.has(name);
  }

  get objectNames(): readonly string[] {
    return this.names;
  }

  async probeBucket(): Promise<void> {}

  async statObject(name: string): Promise<ObjectMeta | null> {
    this.requests++;
    await this.turns();
    return this.metas.get(name) ?? null;
  }

  async list(req: ListRequest): Promise<ListPage> {
    this.requests++;
    await this.turns();
    const max = Math.max(1, req.maxResults ?? 1000);
    // A short page, as GCS sends when it skips many names: sometimes none at all.
    const limit = this.random() < this.opts.shortPages ? Math.floor(this.random() * max) : max;
    const token: PageToken = req.pageToken ? (JSON.parse(Buffer.from(req.pageToken, 'base64url').toString()) as PageToken) : { last: null, prefix: false };
    const after = token.last;
    const items: { key: string; meta: ObjectMeta | null }[] = [];
    let i = this.insertionPoint(req.startOffset !== undefined && compareNames(req.startOffset, req.prefix) > 0 ? req.startOffset : req.prefix);
    let last: string | null = null;
    let more = false;
    for (; i < this.names.length; i++) {
      const name = this.names[i]!;
      if (!name.startsWith(req.prefix)) break;
      if (req.endOffset !== undefined && compareNames(name, req.endOffset) >= 0) break;
      let key = name;
      let meta: ObjectMeta | null = this.metas.get(name)!;
      if (req.delimiter) {
        const cut = name.indexOf(req.delimiter, req.prefix.length);
        if (cut >= 0) {
          key = name.slice(0, cut + req.delimiter.length);
          meta = null;
        }
      }
      // A token goes on after the last item it returned; a prefix returned is never returned again.
      if (after !== null && (compareNames(key, after) <= 0 || (token.prefix && key.startsWith(after)))) continue;
      if (key === last) continue;
      if (items.length >= limit) {
        more = true;
        break;
      }
      items.push({ key, meta });
      last = key;
    }
    const objects = items.filter((x) => x.meta !== null).map((x) => x.meta!);
    const prefixes = items.filter((x) => x.meta === null).map((x) => x.key);
    // An empty page's token goes on from where the one it came from did.
    const next: PageToken = last === null ? token : { last, prefix: items.at(-1)!.meta === null };
    return { objects, prefixes, nextPageToken: more ? Buffer.from(JSON.stringify(next)).toString('base64url') : null };
  }

  async readRange(): Promise<Buffer> {
    throw new Error('the model bucket holds names, not bytes');
  }

  private insertionPoint(name: string): number {
    let lo = 0;
    let hi = this.names.length;
    while (lo < hi) {
      const mid = (lo + hi) >>> 1;
      if (compareNames(this.names[mid]!, name) < 0) lo = mid + 1;
      else hi = mid;
    }
    return lo;
  }

  private async turns(): Promise<void> {
    const n = Math.floor(this.random() * (this.opts.maxTurns + 1));
    for (let k = 0; k < n; k++) await new Promise<void>((r) => setImmediate(r));
  }
}

/** Where a page of a request goes on: after this item (a prefix: after every name under it). */
interface PageToken {
  last: string | null;
  prefix: boolean;
}

// JSON routes: bucket metadata, bucket list, objects.list, object metadata, object delete.
import { checkRead, checkWrite, validateGenerationParams } from './conditions.js';
import { HttpError, type RequestContext } from './context.js';
import { project, selects, type FieldTree } from './fields.js';
import { hashHandle, type Hashes } from './hashes.js';
import { ListQueryError, listPage, parseListQuery } from './list.js';
import { bucketResource, objectResource } from './resources.js';
import { openObject, statObjectSync, type OpenedObject, type StoredObject } from './stored-object.js';

const EMPTY_HASHES: Hashes = { crc32c: 'AAAAAA==', md5Hash: '1B2M2Y8AsgTpgAmY7PhCfg==' };

export async function getBucket(ctx: RequestContext, bucket: string): Promise<void> {
  const fields = ctx.fields();
  if (ctx.knobs.denyBucketGet) {
    ctx.entry.injected = '403';
    throw new HttpError(403, 'Caller does not have storage.buckets.get access to the Google Cloud Storage bucket. Permission \'storage.buckets.get\' denied on resource (or it may not exist).');
  }
  const st = await ctx.shared.store.bucketStat(bucket);
  if (!st) throw noSuchBucket();
  await ctx.projected(bucketResource(ctx.shared.baseUrl, bucket, st, ctx.knobs.requesterPays.includes(bucket)), fields);
}

export async function listBuckets(ctx: RequestContext): Promise<void> {
  const fields = ctx.fields();
  const { store, baseUrl } = ctx.shared;
  const items: unknown[] = [];
  for (const name of (await store.listBuckets()).sort()) {
    const st = await store.bucketStat(name);
    if (st) items.push(bucketResource(baseUrl, name, st, ctx.knobs.requesterPays.includes(name)));
  }
  await ctx.projected(items.length ? { kind: 'storage#buckets', items } : { kind: 'storage#buckets' }, fields);
}

export async function listObjects(ctx: RequestContext, bucket: string): Promise<void> {
  const fields = ctx.fields();
  let q;
  try {
    q = parseListQuery(ctx.query, ctx.knobs.pageSize);
  } catch (e) {
    if (e instanceof ListQueryError) throw new HttpError(400, e.message);
    throw e;
  }
  const { store } = ctx.shared;
  if (!(await store.bucketStat(bucket))) throw noSuchBucket();
  const page = await listPage(store, bucket, q);
  ctx.entry.list = {
    prefix: q.prefix,
    delimiter: q.delimiter,
    startOffset: q.startOffset,
    endOffset: q.endOffset,
    token: q.after !== null,
    count: page.items.length + page.prefixes.length,
    first: page.first,
    last: page.last,
  };
  // Hashing is the expensive part of a listing; skip it unless the caller's `fields` wants it.
  const wantHashes = wantsHashes(fields, ['items']);
  const described = page.items.map((it) => describeKnown(ctx, bucket, it.name, it.path, wantHashes));
  const toHash = described.flatMap((d, i) => (d === 'to hash' ? [i] : []));
  await mapLimit(toHash, 8, async (i) => {
    const it = page.items[i]!;
    described[i] = await describeHashed(ctx, bucket, it.name, it.path);
  });
  const encodings = await store.encodings.of(bucket);
  const attrs = await store.attrs.of(bucket);
  const wanted = selectedKeys(fields, ['items']);
  // Every 'to hash' was replaced above.
  const items = (described as Described[]).filter((d) => d !== null).map((d) => objectResource(ctx.shared.baseUrl, d.obj, d.hashes, encodings.of(d.obj), wanted, attrs.of(d.obj)));
  // Field order as GCS sends it; empty lists are omitted, not sent as [].
  const body: Record<string, unknown> = { kind: 'storage#objects' };
  if (page.nextPageToken !== null) body.nextPageToken = page.nextPageToken;
  if (page.prefixes.length) body.prefixes = page.prefixes;
  // The items hold only the keys `fields` selects already (`wanted`): projected again, each would be
  // copied key by key for nothing.
  const out = project(body, fields) as Record<string, unknown>;
  if (items.length && selects(fields, ['items'])) out.items = items;
  const entries = page.items.length + page.prefixes.length;
  if (ctx.knobs.listMsPerEntry > 0 && entries > 0) await new Promise((r) => setTimeout(r, ctx.knobs.listMsPerEntry * entries));
  await ctx.json(200, out);
}

type Described = { obj: StoredObject; hashes: Hashes | null } | null;

export async function getObjectMetadata(ctx: RequestContext, bucket: string, name: string): Promise<void> {
  const fields = ctx.fields();
  validateGenerationParams(ctx.query);
  const opened = await openExisting(ctx, bucket, name);
  try {
    const attrs = await ctx.shared.store.attrs.get(opened.obj);
    checkRead(ctx.query, opened.obj, attrs.metageneration);
    const hashes = wantsHashes(fields, []) ? await hashesOf(ctx, opened) : null;
    const encoding = (await ctx.shared.store.encodings.of(bucket)).of(opened.obj);
    await ctx.projected(objectResource(ctx.shared.baseUrl, opened.obj, hashes, encoding, undefined, attrs), fields);
  } finally {
    await opened.fh.close();
  }
}

export async function deleteObject(ctx: RequestContext, bucket: string, name: string): Promise<void> {
  validateGenerationParams(ctx.query);
  deniedDelete(ctx, bucket, name);
  const { store } = ctx.shared;
  if (!(await store.bucketStat(bucket))) throw noSuchBucket();
  const target = { bucket, name };
  const removed = await store.remove(bucket, name, (cur, attrs) => checkWrite(ctx.query, cur, target, attrs.metageneration));
  if (!removed) throw new HttpError(404, `No such object: ${bucket}/${name}`);
  await ctx.send(204, Buffer.alloc(0));
}

/** The 403 a key without storage.objects.delete gets (knob denyDelete): for deletes, and moves of their source. */
export function deniedDelete(ctx: RequestContext, bucket: string, name: string): void {
  if (!ctx.knobs.denyDelete) return;
  ctx.entry.injected = '403';
  throw new HttpError(403, `Caller does not have storage.objects.delete access to the Google Cloud Storage object. Permission 'storage.objects.delete' denied on resource (or it may not exist): ${bucket}/${name}.`);
}

/** Opens an object or throws the 404 GCS would send (bucket first, then object). */
export async function openExisting(ctx: RequestContext, bucket: string, name: string): Promise<OpenedObject> {
  const { store } = ctx.shared;
  const opened = await store.open(bucket, name);
  if (opened) return opened;
  if (!(await store.bucketStat(bucket))) throw noSuchBucket();
  throw new HttpError(404, `No such object: ${bucket}/${name}`);
}

export function hashesOf(ctx: RequestContext, opened: OpenedObject): Promise<Hashes> {
  return ctx.shared.hashes.get(opened.obj, () => hashHandle(opened.fh, opened.obj.size));
}

export function noSuchBucket(): HttpError {
  return new HttpError(404, 'The specified bucket does not exist.');
}

/** Which keys of each object under `at` the selection keeps, asked once per request, not per object. */
function selectedKeys(fields: FieldTree | null, at: string[]): ((key: string) => boolean) | undefined {
  if (fields === null) return undefined;
  const memo = new Map<string, boolean>();
  return (key) => {
    let hit = memo.get(key);
    if (hit === undefined) memo.set(key, (hit = selects(fields, [...at, key])));
    return hit;
  };
}

function wantsHashes(fields: FieldTree | null, at: string[]): boolean {
  return fields === null || selects(fields, [...at, 'crc32c']) || selects(fields, [...at, 'md5Hash']);
}

/**
 * An entry described without waiting: a stat, and its hashes if wanted and known for this version. A
 * promise per entry cost more than the stat (a listing describes 1,000 per page), so only the entries
 * still to be hashed ('to hash') take the asynchronous path.
 */
function describeKnown(ctx: RequestContext, bucket: string, name: string, path: string, wantHashes: boolean): Described | 'to hash' {
  const obj = statObjectSync(bucket, name, path);
  if (!obj || !wantHashes) return obj && { obj, hashes: null };
  // An empty object's hashes are constants: listing 100,000 empty test objects opens none of them.
  if (obj.size === 0) return { obj, hashes: EMPTY_HASHES };
  const known = ctx.shared.hashes.peekSettled(obj);
  return known ? { obj, hashes: known } : 'to hash';
}

/** Hashes through an open handle, so the result is filed under the version it describes (or joins the hashing of that version under way). */
async function describeHashed(ctx: RequestContext, bucket: string, name: string, path: string): Promise<Described> {
  const opened = await openObject(bucket, name, path);
  if (!opened) return null;
  try {
    return { obj: opened.obj, hashes: await hashesOf(ctx, opened) };
  } finally {
    await opened.fh.close();
  }
}

async function mapLimit<T, R>(items: T[], limit: number, fn: (t: T) => Promise<R>): Promise<R[]> {
  const out = new Array<R>(items.length);
  let next = 0;
  const worker = async (): Promise<void> => {
    while (next < items.length) {
      const i = next++;
      out[i] = await fn(items[i]!);
    }
  };
  await Promise.all(Array.from({ length: Math.min(limit, items.length) }, worker));
  return out;
}

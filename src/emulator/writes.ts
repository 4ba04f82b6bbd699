// JSON routes that change objects without uploading bytes: patch (metadata), copyTo and rewriteTo,
// compose, and moveTo (the atomic rename), each with GCS's preconditions and answers.
import { createWriteStream, promises as fsp } from 'node:fs';
import type { Readable } from 'node:stream';
import { pipeline } from 'node:stream/promises';
import { attrsFromResource, fieldsFrom, metadataFrom, SETTABLE_FIELDS, type NewAttrs, type ObjectAttrs, type SettableFields } from './attributes.js';
import { checkSource, checkWrite, validateGenerationParams } from './conditions.js';
import { HttpError, type RequestContext } from './context.js';
import { deniedDelete, hashesOf, noSuchBucket } from './objects.js';
import { objectResource } from './resources.js';
import { readSmallBody } from './uploads.js';
import { openObject, type StoredObject } from './stored-object.js';

/** GCS composes at most 32 sources in one call. */
const MAX_COMPOSE_SOURCES = 32;

/** objects.patch: contentType and custom metadata (a null value removes a key); metageneration + 1. */
export async function patchObject(ctx: RequestContext, bucket: string, name: string): Promise<void> {
  validateGenerationParams(ctx.query);
  const body = await readJson(ctx.req);
  const { store } = ctx.shared;
  if (!(await store.bucketStat(bucket))) throw noSuchBucket();
  const target = { bucket, name };
  const obj = await store.locked(bucket, async () => {
    const cur = await store.stat(bucket, name);
    if (!cur) throw new HttpError(404, `No such object: ${bucket}/${name}`);
    const attrs = await store.attrs.get(cur);
    checkWrite(ctx.query, cur, target, attrs.metageneration);
    const next = patched(attrs, body);
    await store.attrs.set(bucket, name, { generation: cur.generation, ...next });
    return cur;
  });
  await respond(ctx, obj);
}

function patched(attrs: ObjectAttrs, body: Record<string, unknown>): ObjectAttrs {
  let metadata = attrs.metadata;
  if ('metadata' in body) {
    const m = body.metadata;
    if (m === null) metadata = null;
    else if (typeof m !== 'object' || Array.isArray(m)) throw new HttpError(400, 'Invalid argument: metadata must be an object.');
    else {
      const merged: Record<string, unknown> = { ...(metadata ?? {}) };
      for (const [k, v] of Object.entries(m as Record<string, unknown>)) {
        if (v === null) delete merged[k];
        else merged[k] = v;
      }
      metadata = parseMetadata(merged);
    }
  }
  let contentType = attrs.contentType;
  if ('contentType' in body) contentType = typeof body.contentType === 'string' && body.contentType !== '' ? body.contentType : null;
  return { metageneration: String(BigInt(attrs.metageneration) + 1n), contentType, metadata, fields: patchedFields(attrs.fields, body) };
}

/** The settable fields after a patch: those the body names (null or '' unsets one), the rest as they were. */
function patchedFields(fields: SettableFields, body: Record<string, unknown>): SettableFields {
  let given: SettableFields;
  try {
    given = fieldsFrom(body);
  } catch (e) {
    throw new HttpError(400, `Invalid argument: ${(e as Error).message}`);
  }
  const out: SettableFields = {};
  for (const key of SETTABLE_FIELDS) {
    const v = key in body ? given[key] : fields[key];
    if (v !== undefined) out[key] = v;
  }
  // GCS: a customTime once set can be moved later, never earlier nor removed.
  if (fields.customTime !== undefined && (out.customTime === undefined || Date.parse(out.customTime) < Date.parse(fields.customTime))) {
    throw new HttpError(400, 'Invalid argument: customTime cannot be removed or set earlier than it is.');
  }
  // The storage class changes only by a rewrite, not by a patch.
  if (out.storageClass !== fields.storageClass) throw new HttpError(400, 'Invalid argument: storageClass is changed by objects.rewrite, not objects.patch.');
  return out;
}

/**
 * objects.copy (`copyTo`) and objects.rewrite (`rewriteTo`). The destination takes the source's bytes
 * and attributes, those the request body names replacing them. A rewrite answers `done: false` with a
 * rewriteToken until `rewriteBytesPerCall` bytes per call have covered the object, as GCS does for large
 * objects; the copy itself is made on the call that finishes.
 */
export async function copyObject(ctx: RequestContext, src: { bucket: string; name: string }, dest: { bucket: string; name: string }, rewrite: boolean): Promise<void> {
  validateGenerationParams(ctx.query);
  const body = await readJson(ctx.req);
  const { store } = ctx.shared;
  if (!(await store.bucketStat(src.bucket)) || !(await store.bucketStat(dest.bucket))) throw noSuchBucket();
  const opened = await store.open(src.bucket, src.name);
  try {
    const srcAttrs = opened ? await store.attrs.get(opened.obj) : null;
    const source = checkSource(ctx.query, opened?.obj ?? null, src, srcAttrs?.metageneration);
    if (rewrite && !(await rewriteFinished(ctx, source))) return;
    const tmp = await store.tempPath(dest.bucket);
    try {
      await pipeline(opened!.fh.createReadStream({ start: 0, autoClose: false }), createWriteStream(tmp));
      const attrs = overridden(srcAttrs!, body);
      const encoding = (await store.encodings.of(src.bucket)).of(source);
      const obj = await store.commit(dest.bucket, dest.name, tmp, (cur, a) => checkWrite(ctx.query, cur, dest, a.metageneration), encoding, attrs);
      if (!rewrite) return await respond(ctx, obj);
      const resource = await resourceOf(ctx, obj);
      await ctx.json(200, { kind: 'storage#rewriteResponse', totalBytesRewritten: String(obj.size), objectSize: String(obj.size), done: true, resource });
    } finally {
      await fsp.rm(tmp, { force: true });
    }
  } finally {
    await opened?.fh.close();
  }
}

/** One rewrite call's progress: true when this call finishes (copies), false when it answered `done: false`. */
async function rewriteFinished(ctx: RequestContext, source: StoredObject): Promise<boolean> {
  const per = ctx.knobs.rewriteBytesPerCall;
  const token = ctx.query.get('rewriteToken');
  let done = 0;
  if (token !== null) {
    const parsed = parseToken(token);
    // A token belongs to one source generation; a source replaced meanwhile cannot be continued.
    if (!parsed || parsed.generation !== source.generation) throw new HttpError(400, 'Invalid rewriteToken for this source object.');
    done = parsed.done;
  }
  if (per <= 0 || done + per >= source.size) return true;
  done += per;
  const rewriteToken = Buffer.from(JSON.stringify({ generation: source.generation, done })).toString('base64url');
  await ctx.json(200, { kind: 'storage#rewriteResponse', totalBytesRewritten: String(done), objectSize: String(source.size), done: false, rewriteToken });
  return false;
}

function parseToken(token: string): { generation: string; done: number } | null {
  try {
    const v = JSON.parse(Buffer.from(token, 'base64url').toString('utf8')) as { generation?: unknown; done?: unknown };
    return typeof v.generation === 'string' && typeof v.done === 'number' ? { generation: v.generation, done: v.done } : null;
  } catch {
    return null;
  }
}

/** objects.compose: the sources' bytes in order, as one new object with the destination's attributes. */
export async function composeObject(ctx: RequestContext, bucket: string, name: string): Promise<void> {
  validateGenerationParams(ctx.query);
  const body = await readJson(ctx.req);
  const sources = body.sourceObjects;
  if (!Array.isArray(sources) || sources.length === 0) throw new HttpError(400, 'Required: sourceObjects.');
  if (sources.length > MAX_COMPOSE_SOURCES) throw new HttpError(400, `The number of source components provided (${sources.length}) exceeds the maximum (${MAX_COMPOSE_SOURCES}).`);
  const { store } = ctx.shared;
  if (!(await store.bucketStat(bucket))) throw noSuchBucket();
  const tmp = await store.tempPath(bucket);
  try {
    const out = createWriteStream(tmp);
    for (const s of sources as Array<Record<string, unknown>>) {
      if (typeof s?.name !== 'string') throw new HttpError(400, 'Required: sourceObjects[].name.');
      const opened = await store.open(bucket, s.name);
      try {
        if (!opened) throw new HttpError(404, `Object ${s.name} (generation: ${String(s.generation ?? 'live')}) not found.`);
        const pre = (s.objectPreconditions ?? {}) as { ifGenerationMatch?: unknown };
        if (s.generation !== undefined && String(s.generation) !== opened.obj.generation) throw new HttpError(404, `Object ${s.name} (generation: ${String(s.generation)}) not found.`);
        if (pre.ifGenerationMatch !== undefined && String(pre.ifGenerationMatch) !== opened.obj.generation) throw new HttpError(412, 'At least one of the pre-conditions you specified did not hold.');
        await pipeline(opened.fh.createReadStream({ start: 0, autoClose: false }), out, { end: false });
      } finally {
        await opened?.fh.close();
      }
    }
    out.end();
    await new Promise<void>((resolve, reject) => out.once('close', resolve).once('error', reject));
    const attrs = attrsOf((body.destination ?? {}) as Record<string, unknown>);
    const dest = { bucket, name };
    const obj = await store.commit(bucket, name, tmp, (cur, a) => checkWrite(ctx.query, cur, dest, a.metageneration), null, attrs);
    await respond(ctx, obj);
  } finally {
    await fsp.rm(tmp, { force: true });
  }
}

/**
 * objects.move: the source becomes the destination in one step under the bucket lock (no reader of
 * this emulator can see both gone or both changed by halves). The destination is a new generation
 * with metageneration 1 and the source's bytes and attributes, as GCS's move makes it.
 */
export async function moveObject(ctx: RequestContext, bucket: string, srcName: string, destName: string): Promise<void> {
  validateGenerationParams(ctx.query);
  ctx.req.resume();
  if (srcName === destName) throw new HttpError(400, 'Source and destination object names must be different.');
  deniedDelete(ctx, bucket, srcName);
  const { store } = ctx.shared;
  if (!(await store.bucketStat(bucket))) throw noSuchBucket();
  const tmp = await store.tempPath(bucket);
  try {
    const obj = await store.locked(bucket, async () => {
      const cur = await store.stat(bucket, srcName);
      const attrs = cur ? await store.attrs.get(cur) : null;
      const src = checkSource(ctx.query, cur, { bucket, name: srcName }, attrs?.metageneration);
      // A copy, not a rename: the new file's mtime, hence its generation, is new.
      await fsp.copyFile(src.path, tmp);
      const encoding = (await store.encodings.of(bucket)).of(src);
      const dest = { bucket, name: destName };
      const moved = await store.commitHeld(bucket, destName, tmp, (c, a) => checkWrite(ctx.query, c, dest, a.metageneration), encoding, { contentType: attrs!.contentType, metadata: attrs!.metadata, fields: attrs!.fields });
      await store.removeHeld(bucket, srcName, () => undefined);
      return moved;
    });
    await respond(ctx, obj);
  } finally {
    await fsp.rm(tmp, { force: true });
  }
}

/** The source's attributes with those the request body names put in their place. */
function overridden(src: ObjectAttrs, body: Record<string, unknown>): NewAttrs {
  const given = attrsOf(body);
  const fields: SettableFields = {};
  for (const key of SETTABLE_FIELDS) {
    const v = key in body ? given.fields[key] : src.fields[key];
    if (v !== undefined) fields[key] = v;
  }
  return {
    contentType: 'contentType' in body ? given.contentType : src.contentType,
    metadata: 'metadata' in body ? given.metadata : src.metadata,
    fields,
  };
}

function attrsOf(resource: Record<string, unknown>): NewAttrs {
  try {
    return attrsFromResource(resource);
  } catch (e) {
    throw new HttpError(400, `Invalid object resource: ${(e as Error).message}`);
  }
}

function parseMetadata(v: unknown): Record<string, string> | null {
  try {
    return metadataFrom(v);
  } catch (e) {
    throw new HttpError(400, `Invalid argument: ${(e as Error).message}`);
  }
}

async function resourceOf(ctx: RequestContext, obj: StoredObject): Promise<Record<string, unknown>> {
  const { store, baseUrl } = ctx.shared;
  const opened = await openObject(obj.bucket, obj.name, obj.path);
  if (!opened) throw new HttpError(404, `No such object: ${obj.bucket}/${obj.name}`);
  try {
    const hashes = await hashesOf(ctx, opened);
    const encoding = (await store.encodings.of(obj.bucket)).of(opened.obj);
    return objectResource(baseUrl, opened.obj, hashes, encoding, undefined, await store.attrs.get(opened.obj));
  } finally {
    await opened.fh.close();
  }
}

async function respond(ctx: RequestContext, obj: StoredObject): Promise<void> {
  await ctx.projected(await resourceOf(ctx, obj), ctx.fields());
}

async function readJson(req: Readable): Promise<Record<string, unknown>> {
  const text = (await readSmallBody(req)).toString('utf8').trim();
  if (text === '') return {};
  try {
    const v: unknown = JSON.parse(text);
    if (v !== null && typeof v === 'object' && !Array.isArray(v)) return v as Record<string, unknown>;
  } catch {
    // answered below
  }
  throw new HttpError(400, 'The request body is not a JSON object.');
}

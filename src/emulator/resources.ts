// JSON shapes the GCS JSON API returns: object and bucket resources, and error bodies.
import type { BigIntStats } from 'node:fs';
import { NO_ATTRS, type ObjectAttrs } from './attributes.js';
import type { Hashes } from './hashes.js';
import type { StoredObject } from './stored-object.js';

/**
 * GCS etags are base64 of a small protobuf (field 1 = generation, field 2 = metageneration), which is
 * why they start with "C". Mirroring that means an etag changes exactly when the generation does.
 */
export function etagFor(generation: bigint, metageneration = 1n): string {
  return Buffer.from([0x08, ...varint(generation), 0x10, ...varint(metageneration)]).toString('base64');
}

function varint(v: bigint): number[] {
  const out: number[] = [];
  do {
    let b = Number(v & 0x7fn);
    v >>= 7n;
    if (v > 0n) b |= 0x80;
    out.push(b);
  } while (v > 0n);
  return out;
}

/** The text up to the seconds' dot of the second formatted last: objects written together share it. */
let lastSecond = Number.NaN;
let lastSecondText = '';

/**
 * `2026-11-23T20:45:01.123Z`, as GCS writes times. A listing formats 1,000 of them per page, and a Date
 * plus toISOString per object was 6% of the emulator's time listing a 100,000-object folder; the part up
 * to the seconds is the same for objects written in the same second, so it is formatted once.
 */
export function rfc3339(ns: bigint): string {
  // Rounded down, also before 1970 (BigInt division rounds toward zero).
  let whole = ns / 1_000_000n;
  if (ns < 0n && whole * 1_000_000n !== ns) whole -= 1n;
  const ms = Number(whole);
  const second = Math.floor(ms / 1000);
  if (second !== lastSecond) {
    const text = new Date(second * 1000).toISOString();
    lastSecondText = text.slice(0, text.length - 4);
    lastSecond = second;
  }
  return `${lastSecondText}${String(ms - second * 1000).padStart(3, '0')}Z`;
}

/**
 * `hashes` is null when the caller's `fields` did not ask for them, so nothing was hashed. `size` and the
 * hashes describe the stored bytes, compressed or not, as GCS's do. `wanted` names the keys the caller's
 * `fields` selects (undefined: all): a listing of 100,000 objects asks for six of sixteen, and building
 * the links, etag and times it drops cost as much as the stat behind each entry.
 */
export function objectResource(
  baseUrl: string,
  obj: StoredObject,
  hashes: Hashes | null,
  contentEncoding: string | null = null,
  wanted?: (key: string) => boolean,
  attrs: ObjectAttrs = NO_ATTRS,
): Record<string, unknown> {
  const want = wanted ?? ((): boolean => true);
  const enc = (): string => encodeURIComponent(obj.name);
  const b = (): string => encodeURIComponent(obj.bucket);
  let timeText: string | undefined;
  const time = (): string => (timeText ??= rfc3339(obj.mtimeNs));
  // Field order as GCS sends it.
  const res: Record<string, unknown> = {};
  if (want('kind')) res.kind = 'storage#object';
  if (want('id')) res.id = `${obj.bucket}/${obj.name}/${obj.generation}`;
  if (want('selfLink')) res.selfLink = `${baseUrl}/storage/v1/b/${b()}/o/${enc()}`;
  if (want('mediaLink')) res.mediaLink = `${baseUrl}/download/storage/v1/b/${b()}/o/${enc()}?generation=${obj.generation}&alt=media`;
  if (want('name')) res.name = obj.name;
  if (want('bucket')) res.bucket = obj.bucket;
  if (want('generation')) res.generation = obj.generation;
  if (want('metageneration')) res.metageneration = attrs.metageneration;
  if (want('contentType')) res.contentType = attrs.contentType ?? 'application/octet-stream';
  if (want('storageClass')) res.storageClass = attrs.fields.storageClass ?? 'STANDARD';
  if (want('size')) res.size = String(obj.size);
  if (contentEncoding !== null && want('contentEncoding')) res.contentEncoding = contentEncoding;
  for (const key of ['cacheControl', 'contentDisposition', 'contentLanguage', 'customTime'] as const) {
    const v = attrs.fields[key];
    if (v !== undefined && want(key)) res[key] = v;
  }
  if (hashes) {
    if (want('md5Hash')) res.md5Hash = hashes.md5Hash;
    if (want('crc32c')) res.crc32c = hashes.crc32c;
  }
  if (want('etag')) res.etag = etagFor(BigInt(obj.generation), BigInt(attrs.metageneration));
  if (want('timeCreated')) res.timeCreated = time();
  if (want('updated')) res.updated = time();
  if (want('timeStorageClassUpdated')) res.timeStorageClassUpdated = time();
  if (attrs.metadata !== null && want('metadata')) res.metadata = { ...attrs.metadata };
  return res;
}

export function bucketResource(baseUrl: string, bucket: string, st: BigIntStats, requesterPays = false): Record<string, unknown> {
  const created = st.birthtimeNs > 0n ? st.birthtimeNs : st.ctimeNs;
  return {
    kind: 'storage#bucket',
    selfLink: `${baseUrl}/storage/v1/b/${encodeURIComponent(bucket)}`,
    id: bucket,
    name: bucket,
    projectNumber: '0',
    metageneration: '1',
    location: 'US',
    storageClass: 'STANDARD',
    // base64 of the protobuf {1: metageneration=1}, the real value for a never-updated bucket.
    etag: 'CAE=',
    timeCreated: rfc3339(created),
    updated: rfc3339(st.mtimeNs),
    locationType: 'multi-region',
    ...(requesterPays ? { billing: { requesterPays: true } } : {}),
  };
}

const REASONS: Record<number, string> = {
  400: 'invalid',
  401: 'required',
  403: 'forbidden',
  404: 'notFound',
  405: 'methodNotAllowed',
  409: 'conflict',
  410: 'gone',
  412: 'conditionNotMet',
  416: 'requestedRangeNotSatisfiable',
  429: 'rateLimitExceeded',
  499: 'clientClosedRequest',
  500: 'internalError',
  503: 'backendError',
};

export function errorBody(code: number, message: string, reason = REASONS[code] ?? 'unknown'): Record<string, unknown> {
  return { error: { code, message, errors: [{ domain: 'global', reason, message }] } };
}

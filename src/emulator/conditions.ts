// Generation and precondition query parameters (generation, ifGenerationMatch, ...).
import { HttpError } from './context.js';
import type { StoredObject } from './stored-object.js';

const CONDITIONS = ['ifGenerationMatch', 'ifGenerationNotMatch', 'ifMetagenerationMatch', 'ifMetagenerationNotMatch'] as const;
/** The same conditions on the source of a copy, rewrite or move (`ifSourceGenerationMatch`, ...). */
const SOURCE_CONDITIONS = CONDITIONS.map((c) => `ifSource${c.slice(2)}`);
const PARAMS = ['generation', 'sourceGeneration', ...CONDITIONS, ...SOURCE_CONDITIONS];

/** Rejects non-numeric generation parameters before any work is done. */
export function validateGenerationParams(q: URLSearchParams): void {
  for (const p of PARAMS) {
    const v = q.get(p);
    if (v !== null && !/^\d{1,20}$/.test(v)) throw new HttpError(400, `Invalid argument: ${p}=${v}`);
  }
}

function noSuchObject(o: { bucket: string; name: string }): HttpError {
  return new HttpError(404, `No such object: ${o.bucket}/${o.name}`);
}

/**
 * For reads: `generation=N` names a version, and only the live one exists here, so anything else is
 * 404. A failed *NotMatch is 304, a failed *Match is 412, as GCS answers reads.
 */
export function checkRead(q: URLSearchParams, obj: StoredObject, metageneration = '1'): void {
  const gen = q.get('generation');
  if (gen !== null && gen !== obj.generation) throw noSuchObject(obj);
  const failed = failedCondition(q, obj, metageneration);
  if (failed === 'match') throw preconditionFailed();
  if (failed === 'notMatch') throw new HttpError(304, 'Not Modified');
}

/**
 * For writes (uploads, deletes, patches, the destination of a copy, compose or move): every failed
 * precondition is 412; `generation` on delete must be live.
 */
export function checkWrite(q: URLSearchParams, cur: StoredObject | null, target: { bucket: string; name: string }, metageneration = '1'): void {
  const gen = q.get('generation');
  if (gen !== null && (!cur || gen !== cur.generation)) throw noSuchObject(target);
  if (failedCondition(q, cur, metageneration) !== null) throw preconditionFailed();
}

/**
 * For the source of a copy, rewrite or move: a missing source (or `sourceGeneration` not live) is 404;
 * a failed ifSource* condition is 412.
 */
export function checkSource(q: URLSearchParams, src: StoredObject | null, target: { bucket: string; name: string }, metageneration = '1'): StoredObject {
  const gen = q.get('sourceGeneration');
  if (!src || (gen !== null && gen !== src.generation)) throw noSuchObject(target);
  const asTarget = new URLSearchParams();
  for (const c of CONDITIONS) {
    const v = q.get(`ifSource${c.slice(2)}`);
    if (v !== null) asTarget.set(c, v);
  }
  if (failedCondition(asTarget, src, metageneration) !== null) throw preconditionFailed();
  return src;
}

export function preconditionFailed(): HttpError {
  return new HttpError(412, 'At least one of the pre-conditions you specified did not hold.');
}

function failedCondition(q: URLSearchParams, cur: StoredObject | null, metageneration: string): 'match' | 'notMatch' | null {
  const gm = q.get('ifGenerationMatch');
  // ifGenerationMatch=0 means "only if no live object exists".
  if (gm !== null && (gm === '0' ? cur !== null : cur?.generation !== gm)) return 'match';
  const mm = q.get('ifMetagenerationMatch');
  if (mm !== null && (!cur || mm !== metageneration)) return 'match';
  const gn = q.get('ifGenerationNotMatch');
  if (gn !== null && (!cur || (gn !== '0' && cur.generation === gn))) return 'notMatch';
  const mn = q.get('ifMetagenerationNotMatch');
  if (mn !== null && (!cur || mn === metageneration)) return 'notMatch';
  return null;
}

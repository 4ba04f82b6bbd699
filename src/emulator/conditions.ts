// Generation and precondition query parameters (generation, ifGenerationMatch, ...).
import { HttpError } from './context.js';
import type { StoredObject } from './store.js';

const PARAMS = ['generation', 'ifGenerationMatch', 'ifGenerationNotMatch', 'ifMetagenerationMatch', 'ifMetagenerationNotMatch'] as const;

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
export function checkRead(q: URLSearchParams, obj: StoredObject): void {
  const gen = q.get('generation');
  if (gen !== null && gen !== obj.generation) throw noSuchObject(obj);
  const failed = failedCondition(q, obj);
  if (failed === 'match') throw preconditionFailed();
  if (failed === 'notMatch') throw new HttpError(304, 'Not Modified');
}

/** For uploads and deletes: every failed precondition is 412; `generation` on delete must be live. */
export function checkWrite(q: URLSearchParams, cur: StoredObject | null, target: { bucket: string; name: string }): void {
  const gen = q.get('generation');
  if (gen !== null && (!cur || gen !== cur.generation)) throw noSuchObject(target);
  if (failedCondition(q, cur) !== null) throw preconditionFailed();
}

function preconditionFailed(): HttpError {
  return new HttpError(412, 'At least one of the pre-conditions you specified did not hold.');
}

function failedCondition(q: URLSearchParams, cur: StoredObject | null): 'match' | 'notMatch' | null {
  const gm = q.get('ifGenerationMatch');
  // ifGenerationMatch=0 means "only if no live object exists".
  if (gm !== null && (gm === '0' ? cur !== null : cur?.generation !== gm)) return 'match';
  const mm = q.get('ifMetagenerationMatch');
  if (mm !== null && (!cur || mm !== '1')) return 'match';
  const gn = q.get('ifGenerationNotMatch');
  if (gn !== null && (!cur || (gn !== '0' && cur.generation === gn))) return 'notMatch';
  const mn = q.get('ifMetagenerationNotMatch');
  if (mn !== null && (!cur || mn === '1')) return 'notMatch';
  return null;
}

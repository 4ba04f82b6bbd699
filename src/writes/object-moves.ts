import { isGcsError } from '../gcs/errors.js';
import type { ObjectMeta, WritableObjectClient, WrittenObject } from '../gcs/object-client.js';
import { RefusedError } from './write-error.js';

/**
 * Deletes whatever generation is live (gcsfuse's unlink), with that generation as a precondition so
 * that the delete may be retried: a second delete can then never take a newer object. Replaced
 * meanwhile (412): the new one is deleted, as an unlink without a precondition would have.
 */
export async function deleteObject(client: WritableObjectClient, name: string, generation?: string): Promise<void> {
  for (let tries = 0; ; tries++) {
    const gen = generation ?? (await client.statObject(name))?.generation;
    if (gen === undefined) return; // nothing there
    try {
      await client.deleteObject(name, { ifGenerationMatch: gen });
      return;
    } catch (err) {
      // Already gone (another writer, or a retried delete whose first answer was lost): what we wanted.
      if (isGcsError(err, 'NOT_FOUND')) return;
      if (!isGcsError(err, 'PRECONDITION') || tries >= 3) throw err;
      generation = undefined;
    }
  }
}

/** An object moved: the new one, and the generation of the source it was (open readers follow only that one). */
export interface MovedObject {
  object: WrittenObject;
  source: string;
}

/** The atomic objects.move; where the server has none (400/501), a copy then a delete, with the same preconditions. */
export async function moveObject(client: WritableObjectClient, src: string, dest: string, known: ObjectMeta | undefined, destGen: string): Promise<MovedObject> {
  // What the source holds, to recognise it at `dest` when a retried move's first answer was lost.
  const source = known ?? (await client.statObject(src));
  if (!source) throw new RefusedError('ENOENT', `${src} does not exist`);
  const gen = source.generation;
  const moved = (object: WrittenObject): MovedObject => ({ object, source: gen });
  try {
    return moved(await client.moveObject(src, dest, { ifSourceGenerationMatch: gen, ifGenerationMatch: destGen }));
  } catch (err) {
    if (isGcsError(err, 'NOT_FOUND') || isGcsError(err, 'PRECONDITION')) return moved(await movedAlready(client, dest, source, err));
    if (!isGcsError(err, 'INVALID')) throw err;
  }
  // No objects.move on this server: a copy, then a delete of the source generation copied.
  const copy = await client.copyObject(src, dest, { ifSourceGenerationMatch: gen, ifGenerationMatch: destGen }).catch((err: unknown) => {
    if (isGcsError(err, 'PRECONDITION')) return movedAlready(client, dest, source, err);
    throw err;
  });
  await deleteObject(client, src, gen);
  return moved(copy);
}

/** A move (or copy) refused: fine when `dest` already holds the source's bytes (our own retried call did it). */
async function movedAlready(client: WritableObjectClient, dest: string, source: ObjectMeta, err: unknown): Promise<WrittenObject> {
  const live = await client.statObject(dest).catch(() => null);
  if (live && live.size === source.size && live.crc32c !== null && live.crc32c === source.crc32c) {
    // The move kept the source's attributes; a stat carries none, and an open file moved along keeps
    // what this answer says for its next upload (an empty answer dropped its content type and metadata).
    const attrs = await client.objectAttributes(dest, live.generation).catch(() => null);
    return { ...live, ...attrs, contentType: attrs?.contentType ?? null, metadata: { ...attrs?.metadata } };
  }
  if (isGcsError(err, 'NOT_FOUND')) throw new RefusedError('ENOENT', `${source.name} is gone`);
  throw new RefusedError('ESTALE', `${source.name} or ${dest} changed while being renamed`);
}

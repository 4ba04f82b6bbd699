import { lookup as mimeTypeOf } from 'mime-types';
import { keptFieldsOf, type NewObjectAttrs, type ObjectMeta, type WritableObjectClient, type WrittenObject } from '../gcs/object-client.js';
import type { Logger } from '../observe/logger.js';

/**
 * What a file's uploads keep of the object they replace, as gcsfuse keeps it: its content type, custom
 * metadata and the other fields of KEPT_FIELDS (storage class, Cache-Control, Content-Encoding, ...). An
 * edit through the mount dropped them (a `text/csv` became `application/octet-stream`, a pipeline's own
 * metadata keys were gone, a COLDLINE object became the bucket's default class). A new file gets a content type by its name's extension, as
 * gcsfuse guesses it (mime-types: the jshttp project's table over mime-db, which Express and most of
 * Node's HTTP servers use).
 */
/** A new object's content type by its name's extension, as gcsfuse guesses it; undefined when unknown. */
export function guessedContentType(objectName: string): string | undefined {
  return mimeTypeOf(objectName) || undefined;
}

export class KeptAttributes {
  /** Known once asked of GCS or uploaded; null: a new file, or not asked yet. */
  private known: NewObjectAttrs | null = null;

  constructor(
    private readonly client: WritableObjectClient,
    private readonly log: Logger,
  ) {}

  /**
   * Learns the attributes of `source` (the generation the next upload replaces), once: an object the
   * namespace found is asked of GCS (one request: its listings carry neither), one this file uploaded
   * is known already.
   */
  async learn(source: ObjectMeta, path: string): Promise<void> {
    if (this.known) return;
    if ('metadata' in source) return this.uploaded(source as WrittenObject);
    try {
      // Gone (null): the upload's precondition fails too, and the close reports it.
      this.known = (await this.client.objectAttributes(source.name, source.generation)) ?? { metadata: {} };
    } catch (err) {
      // Its bytes matter more than its attributes: the upload goes on with the mtime alone.
      this.log.warn({ path, err: String(err) }, "the object's content type and metadata could not be read: the upload replacing it does not keep them");
      this.known = { metadata: {} };
    }
  }

  /** An upload made `object`: the next one keeps what it has. */
  uploaded(object: WrittenObject): void {
    this.known = { ...(object.contentType ? { contentType: object.contentType } : {}), ...keptFieldsOf(object), metadata: { ...object.metadata } };
  }

  /** The attributes of an upload to `objectName` (the name it has now: renamed, maybe), with `mtime`'s keys over the kept ones. */
  forUpload(objectName: string, mtime: Record<string, string>): NewObjectAttrs {
    const contentType = this.known ? this.known.contentType : guessedContentType(objectName);
    return { ...this.known, metadata: { ...this.known?.metadata, ...mtime }, ...(contentType ? { contentType } : {}) };
  }
}

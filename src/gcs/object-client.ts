/**
 * The one narrow interface in front of the object store. fs/, namespace/ and blocks/ know only this; the
 * HTTP client implements it, and wrappers (metering, fault injection) take one and return one.
 */
export interface ObjectMeta {
  name: string;
  size: number;
  /** GCS generation as a decimal string: exceeds 2^53, so never a JS number. */
  generation: string;
  metageneration: string;
  /** Milliseconds since the epoch of the object's last update. */
  updatedMs: number;
  /** Base64 of the big-endian CRC32C, as GCS reports it; null when GCS did not send one. */
  crc32c: string | null;
}

/** One generation of an object, as much as a download needs: its size tells a whole-object answer. */
export type ObjectVersion = Pick<ObjectMeta, 'name' | 'generation' | 'size'>;

export interface ListRequest {
  prefix: string;
  delimiter?: string;
  pageToken?: string;
  maxResults?: number;
  /** Only names at or after this one (GCS's startOffset): one part of a folder listed in parallel. */
  startOffset?: string;
  /** Only names before this one (GCS's endOffset). */
  endOffset?: string;
}

export interface ListPage {
  objects: ObjectMeta[];
  prefixes: string[];
  nextPageToken: string | null;
}

/** How soon a read is wanted; may be raised while the read waits (a reader starts waiting on a readahead). */
export interface ReadPriority {
  priority: 'urgent' | 'background';
}

export interface ObjectClient {
  readonly bucket: string;
  /**
   * Resolves if the bucket exists and these credentials may list its objects; rejects with NOT_FOUND,
   * FORBIDDEN or UNAUTHENTICATED otherwise. The start-up check: it needs objects.list only.
   */
  probeBucket(): Promise<void>;
  /** Object metadata, or null when no such object exists. */
  statObject(name: string): Promise<ObjectMeta | null>;
  list(req: ListRequest): Promise<ListPage>;
  /**
   * Bytes [start, end) of one generation of an object, as stored (a gzip-encoded object is not
   * decompressed). Resolves with exactly end - start bytes or rejects; a short body is an error, never
   * a short result. With `into` (at least end - start bytes), the bytes land there and the result is a
   * view of it; a failed attempt may leave partial bytes in it. `priority` (default urgent) orders the
   * read among requests waiting for the rate limit.
   */
  readRange(object: ObjectVersion, start: number, end: number, into?: Buffer, priority?: ReadPriority): Promise<Buffer>;
}

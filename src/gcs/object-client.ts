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
  /**
   * The file's mtime, milliseconds since the epoch: its `gcsfuse_mtime` metadata where gcsfuse or
   * gcsmount set one (utimes, an upload), else the object's last update.
   */
  updatedMs: number;
  /** Base64 of the big-endian CRC32C, as GCS reports it; null when GCS did not send one. */
  crc32c: string | null;
  /**
   * Set only for a symbolic link (gcs/symlinks.ts): its target, or null when the target is the
   * object's bytes (the standard form).
   */
  symlinkTarget?: string | null;
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
   * read among requests waiting for the rate limit. `hash`: the client may set its crc32c to the
   * result's CRC32C, computed on the way (by a download worker); left null, the caller computes it.
   */
  readRange(object: ObjectVersion, start: number, end: number, into?: Buffer, priority?: ReadPriority, hash?: RangeHash): Promise<Buffer>;
}

/** Filled by readRange when it computed the bytes' CRC32C on the way. */
export interface RangeHash {
  crc32c: number | null;
}

/**
 * Conditions a write holds to (GCS's preconditions): when one fails, nothing changes and the call
 * rejects with GcsError code PRECONDITION (HTTP 412). Generations are decimal strings.
 */
export interface Preconditions {
  /** '0': only if no live object has the name (a create); a generation: only if that one is live. */
  ifGenerationMatch?: string;
  /** Only if the live object's metageneration is this one (its metadata unchanged since it was read). */
  ifMetagenerationMatch?: string;
}

/**
 * The string fields of an object, beside contentType, that an edit keeps as gcsfuse keeps them (its
 * NewCreateObjectRequest): a rewritten COLDLINE object stays COLDLINE, a gzip-encoded one stays encoded
 * (its bytes are read as stored), a served one keeps its Cache-Control.
 */
export const KEPT_FIELDS = ['cacheControl', 'contentDisposition', 'contentEncoding', 'contentLanguage', 'customTime', 'storageClass'] as const;
export type KeptField = (typeof KEPT_FIELDS)[number];

/** What a new object carries beside its bytes. gcsfuse keeps a file's mtime in metadata.gcsfuse_mtime. */
export interface NewObjectAttrs extends Partial<Record<KeptField, string>> {
  contentType?: string;
  metadata?: Record<string, string>;
}

/** An object a write made or changed: its metadata as well as what a read needs. */
export interface WrittenObject extends ObjectMeta, Partial<Record<KeptField, string>> {
  contentType: string | null;
  /** Custom metadata ({} when none). */
  metadata: Record<string, string>;
}

/** The kept fields `raw` (an object resource) has with a value. */
export function keptFieldsOf(raw: Partial<Record<KeptField, unknown>>): Partial<Record<KeptField, string>> {
  const out: Partial<Record<KeptField, string>> = {};
  for (const key of KEPT_FIELDS) {
    const v = raw[key];
    if (typeof v === 'string' && v !== '') out[key] = v;
  }
  return out;
}

/** A resumable upload session: the URL GCS gave it. Valid for about a week; nothing is visible until finalized. */
export interface UploadSession {
  readonly name: string;
  readonly url: string;
}

/** Marks a chunk as the last: the object's whole size and its CRC32C (base64, big-endian, as GCS shows it). */
export interface FinalChunk {
  size: number;
  crc32c: string;
}

/** Where a session stands: bytes GCS has committed, and the object once it is finalized. */
export interface UploadProgress {
  committed: number;
  object: WrittenObject | null;
}

/** Chunks other than the last must be multiples of this (GCS commits resumable uploads in these units). */
export const UPLOAD_CHUNK_UNIT = 256 * 1024;

/**
 * The write half of the object store, beside ObjectClient (whose other implementations, such as test
 * doubles and the torture test's model bucket, read only). Every call is retried as reads are (bounded
 * by the retry policy and --max-retry-duration, through the shared request-rate limiter) when that is
 * safe: always for resumable chunks and status queries, and for other writes only when they carry a
 * precondition that makes a repeat harmless; without one only a 429 is retried.
 */
export interface ObjectWriter {
  /** Opens a resumable upload of `name`; its preconditions are checked now and again at finalize. */
  startUpload(name: string, opts?: Preconditions & NewObjectAttrs): Promise<UploadSession>;
  /**
   * Sends bytes [offset, offset + bytes.length) of the upload. Resolves once all of them are committed
   * (GCS may commit part of a chunk: the rest is sent again, only the rest). A cut or 429/5xx attempt is
   * followed by a status query and resumed from the committed offset, never from zero. With `final`,
   * the upload is finalized: `x-goog-hash: crc32c` is sent and the object's CRC32C checked (CORRUPT on a
   * mismatch). Non-final chunks must be multiples of UPLOAD_CHUNK_UNIT. Rejects with
   * UploadSessionExpiredError (code NOT_FOUND) when the session is gone (start a new one), with
   * UploadOffsetError when GCS holds fewer bytes than `offset` (resend from its `committed`), and with
   * PRECONDITION when the finalize's precondition fails (the session is then gone too).
   */
  putChunk(session: UploadSession, offset: number, bytes: Buffer, opts?: { final?: FinalChunk; priority?: ReadPriority }): Promise<UploadProgress>;
  /** Asks GCS how much of the session it has committed (and the object, if finalized). */
  uploadStatus(session: UploadSession): Promise<UploadProgress>;
  /** Abandons a session (its bytes are dropped). Resolves also when it was already gone. */
  cancelUpload(session: UploadSession): Promise<void>;
  /** A small object in one request (uploadType=multipart), its CRC32C sent and checked. */
  uploadObject(name: string, bytes: Buffer, opts?: Preconditions & NewObjectAttrs): Promise<WrittenObject>;
  /** Deletes the live object; NOT_FOUND when there is none. */
  deleteObject(name: string, opts?: Pick<Preconditions, 'ifGenerationMatch'>): Promise<void>;
  /**
   * A copy of `src` as `dest`, through objects.rewrite (calls repeated with its rewriteToken until done).
   * Attributes given replace the source's.
   */
  copyObject(src: string, dest: string, opts?: Preconditions & NewObjectAttrs & { ifSourceGenerationMatch?: string }): Promise<WrittenObject>;
  /** `dest` made of the sources' bytes in order (at most 32), with `attrs`. */
  composeObjects(sources: Array<{ name: string; generation?: string }>, dest: string, opts?: Preconditions & NewObjectAttrs): Promise<WrittenObject>;
  /** GCS's atomic objects.move: `src` becomes `dest` (a new generation, metageneration 1, same bytes and metadata). */
  moveObject(src: string, dest: string, opts?: Preconditions & { ifSourceGenerationMatch?: string }): Promise<WrittenObject>;
  /**
   * The attributes an overwrite of generation `generation` keeps, as gcsfuse keeps them (its content
   * type and custom metadata); null when that generation is gone.
   */
  objectAttributes(name: string, generation: string): Promise<NewObjectAttrs | null>;
  /** Changes custom metadata (a null value removes a key) and contentType; the metageneration grows by one. */
  patchMetadata(name: string, opts: Preconditions & { metadata?: Record<string, string | null>; contentType?: string }): Promise<WrittenObject>;
}

/** A client that reads and writes: what the write path is given. */
export type WritableObjectClient = ObjectClient & ObjectWriter;

import type { Metrics } from '../observe/metrics.js';
import type { FileUpload } from './file-upload.js';
import type { StagedCopy } from './staged-copy.js';

export interface UploadStreamDeps {
  /** WriteConfig's (write-state.ts): the chunk size, and how many chunks a writer may run ahead. */
  config: { chunkBytes: number; maxChunksAhead: number };
  metrics: Metrics;
}

/**
 * The streaming side of a file open for writing (WriteState): the upload fed as a new file is written in
 * order, each full chunk sent to a resumable session as soon as it is written, and the writer held back
 * when it runs too far ahead of GCS. A write into bytes already sent, or a truncate below them, stops the
 * stream (the session is cancelled; close uploads the staged file whole, so the object never appears
 * half-written). A flush takes the session fed so far, to finish it.
 */
export class UploadStream {
  /** The session fed so far: none until a chunk goes (or an fsync opens one), nor after a flush took it. */
  private upload: FileUpload | null = null;
  /** Whether a streamed upload may still be fed (a new file, written in order so far). */
  private streams: boolean;
  private sending: Promise<void> | null = null;
  /** Where the send in flight (`sending`) ends. */
  private sendingTo = 0;

  constructor(
    private readonly deps: UploadStreamDeps,
    streams: boolean,
    /** A session for the file as it is now (its name, precondition and mtime). */
    private readonly newUpload: () => FileUpload,
  ) {
    this.streams = streams;
  }

  /** Whether writes may still go to GCS as they are written. */
  get streaming(): boolean {
    return this.streams;
  }

  /** Whether a session is being fed. */
  get hasUpload(): boolean {
    return this.upload !== null;
  }

  /** Once the send in flight has settled (its failure shows at close, not here); undefined when none is. */
  settled(): Promise<void> | undefined {
    return this.sending?.catch(() => undefined);
  }

  /** Whether a change at `pos` lands in bytes the session has sent (or is sending). */
  sentBeyond(pos: number): boolean {
    return this.upload !== null && pos < this.sentUpTo();
  }

  /** Streaming: sends the next whole chunk when one is written and none is on its way; waits when too far ahead. */
  async feed(size: number, staged: StagedCopy): Promise<void> {
    const chunk = this.deps.config.chunkBytes;
    // Chunks end at multiples of `chunk` (after an fsync's part-chunk too), as the file's chunks in memory do.
    const to = (Math.floor((this.upload?.committed ?? 0) / chunk) + 1) * chunk;
    if (!this.sending && size >= to) {
      if (!this.upload) {
        this.upload = this.newUpload();
        this.deps.metrics.inc('write_streamed_files');
      }
      const upload = this.upload;
      this.sendingTo = to;
      this.sending = upload.sendUpTo(to, chunk).finally(() => {
        this.sending = null;
        staged.sent(upload.committed);
      });
      // A failure shows at close (which uploads from the staged copy again): not here.
      this.sending.catch(() => undefined);
    }
    // Too far ahead of GCS: the writer waits for the chunk on its way (memory and disk stay bounded). It
    // waits as soon as maxChunksAhead whole chunks wait behind the one being sent, before it starts
    // another: a file then holds at most maxChunksAhead + 1 chunks of memory (64 MiB with the defaults,
    // as gcsfuse's streaming writes). A writer is far faster than one upload, so GCS is never kept waiting.
    const ahead = size - (this.upload?.committed ?? 0);
    if (this.sending && ahead >= chunk * (this.deps.config.maxChunksAhead + 1)) await this.sending.catch(() => undefined);
  }

  /** fsync: a session is opened if none is being fed yet. */
  open(): void {
    if (!this.upload) {
      this.upload = this.newUpload();
      this.deps.metrics.inc('write_streamed_files');
    }
  }

  /** fsync: the open session sends every byte below `end`; the staged copy may then let go of them. */
  async sendUpTo(end: number, staged: StagedCopy | null): Promise<void> {
    await this.upload!.sendUpTo(end, this.deps.config.chunkBytes);
    staged?.sent(this.upload!.committed);
  }

  /** The session fed so far, if any, for a flush to finish: the stream goes on with a new one. */
  take(): FileUpload | null {
    const upload = this.upload;
    this.upload = null;
    return upload;
  }

  /** A rename: nothing streams any more; the session fed so far, if any, is the caller's to cancel. */
  abandon(): FileUpload | null {
    if (!this.upload) return null;
    const u = this.upload;
    this.upload = null;
    this.stop();
    return u;
  }

  /** The stream stops and its session is cancelled. */
  async cancel(): Promise<void> {
    const u = this.upload;
    this.upload = null;
    this.stop();
    await u?.cancel();
  }

  /** Bytes GCS has, or is being sent: a write below this cannot be streamed any more. */
  private sentUpTo(): number {
    if (!this.upload) return 0;
    return this.sending ? Math.max(this.upload.committed, this.sendingTo) : this.upload.committed;
  }

  private stop(): void {
    if (this.streams) this.deps.metrics.inc('write_stream_stops');
    this.streams = false;
  }
}

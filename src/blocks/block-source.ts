import { crc32c } from '@node-rs/crc32';
import { GcsError } from '../gcs/errors.js';
import type { ObjectClient, ObjectMeta } from '../gcs/object-client.js';
import type { Logger } from '../observe/logger.js';
import type { Metrics } from '../observe/metrics.js';
import type { DiskCache } from './disk-cache.js';
import type { DownloadScheduler, Priority, Ticket } from './download-scheduler.js';

/** A whole object that keeps failing its checksum is not going to get better by asking forever. */
const CORRUPT_ATTEMPTS = 3;

export interface BlockSourceDeps {
  client: ObjectClient;
  disk: DiskCache | null;
  scheduler: DownloadScheduler;
  blockSize: number;
  /**
   * Objects up to this size are fetched whole, in one GET, on their first read: a Zarr chunk is read
   * whole, once, through a fresh handle, so ramping a readahead window per handle would only cost more
   * requests (and GCS counts requests per bucket). The download is checked against the object's CRC32C.
   */
  wholeObjectThreshold: number;
  log: Logger;
  metrics: Metrics;
}

interface Pending<T> {
  promise: Promise<T>;
  ticket: Ticket | null;
}

/**
 * Where every open file gets its blocks: the disk cache when it has them, otherwise GCS through the
 * download scheduler. One load per block at a time: readers of a block in flight wait on the same
 * promise, whichever file they opened, and a reader that waits on a queued readahead promotes it.
 */
export class BlockSource {
  readonly blockSize: number;
  private readonly blocks = new Map<string, Pending<Buffer>>();
  private readonly wholes = new Map<string, Pending<Buffer>>();
  /** Blocks on their way to disk: served from here meanwhile, so a read right after a fetch never misses. */
  private readonly writing = new Map<string, Buffer>();

  constructor(private readonly deps: BlockSourceDeps) {
    this.blockSize = deps.blockSize;
    deps.metrics.setGauge('downloads_in_flight', () => deps.scheduler.inFlight);
    deps.metrics.setGauge('downloads_queued', () => deps.scheduler.queued);
  }

  get(meta: ObjectMeta, index: number, priority: Priority = 'demand'): Promise<Buffer> {
    return this.shared(this.blocks, `${meta.name}\0${meta.generation}\0${index}`, priority, (pending) => this.load(meta, index, priority, pending));
  }

  private shared(map: Map<string, Pending<Buffer>>, key: string, priority: Priority, work: (p: Pending<Buffer>) => Promise<Buffer>): Promise<Buffer> {
    const existing = map.get(key);
    if (existing) {
      this.deps.metrics.inc('block_shared_waits');
      if (priority === 'demand') existing.ticket?.promote();
      return existing.promise;
    }
    const pending: Pending<Buffer> = { promise: Promise.resolve(Buffer.alloc(0)), ticket: null };
    pending.promise = work(pending).finally(() => map.delete(key));
    map.set(key, pending);
    return pending.promise;
  }

  private async load(meta: ObjectMeta, index: number, priority: Priority, pending: Pending<Buffer>): Promise<Buffer> {
    const { disk, metrics } = this.deps;
    const key = this.diskKey(meta, index);
    const beingWritten = this.writing.get(`${meta.name}\0${meta.generation}\0${index}`);
    if (beingWritten) {
      metrics.inc('block_cache_hits');
      metrics.inc('block_cache_hit_bytes', beingWritten.length);
      return beingWritten;
    }
    if (disk) {
      const cached = await disk.read(key);
      if (cached) {
        metrics.inc('block_cache_hits');
        metrics.inc('block_cache_hit_bytes', cached.length);
        return cached;
      }
      metrics.inc('block_cache_misses');
    }
    const start = index * this.blockSize;
    if (meta.size > this.blockSize && meta.size <= this.deps.wholeObjectThreshold) {
      const whole = this.shared(this.wholes, `${meta.name}\0${meta.generation}`, priority, (p) => this.loadWhole(meta, priority, p));
      // The whole object's ticket is this block's too: a reader waiting on it can promote it.
      pending.ticket = this.wholes.get(`${meta.name}\0${meta.generation}`)?.ticket ?? null;
      return (await whole).subarray(start, Math.min(meta.size, start + this.blockSize));
    }
    const end = Math.min(meta.size, start + this.blockSize);
    const { result, ticket } = this.deps.scheduler.run(this.fileKey(meta), priority, () => this.fetch(meta, start, end));
    pending.ticket = ticket;
    const data = await result;
    this.stored(meta, index, data);
    return data;
  }

  private async loadWhole(meta: ObjectMeta, priority: Priority, pending: Pending<Buffer>): Promise<Buffer> {
    const { result, ticket } = this.deps.scheduler.run(this.fileKey(meta), priority, () => this.fetch(meta, 0, meta.size));
    pending.ticket = ticket;
    const data = await result;
    for (let i = 0; i * this.blockSize < meta.size; i++) this.stored(meta, i, data.subarray(i * this.blockSize, Math.min(meta.size, (i + 1) * this.blockSize)));
    return data;
  }

  /** Counts a downloaded block and writes it to disk in the background: the reader has its bytes now. */
  private stored(meta: ObjectMeta, index: number, data: Buffer): void {
    this.deps.metrics.inc('block_fetches');
    this.deps.metrics.inc('block_fetch_bytes', data.length);
    if (!this.deps.disk) return;
    const key = `${meta.name}\0${meta.generation}\0${index}`;
    this.writing.set(key, data);
    void this.deps.disk.write(this.diskKey(meta, index), data).finally(() => this.writing.delete(key));
  }

  private diskKey(meta: ObjectMeta, index: number) {
    return { bucket: this.deps.client.bucket, object: meta.name, generation: meta.generation, block: index };
  }

  private fileKey(meta: ObjectMeta): string {
    return `${meta.name}\0${meta.generation}`;
  }

  /** A range of the object; a download of the whole object is checked against the object's CRC32C. */
  private async fetch(meta: ObjectMeta, start: number, end: number): Promise<Buffer> {
    const whole = start === 0 && end === meta.size && meta.crc32c !== null;
    for (let attempt = 1; ; attempt++) {
      const data = await this.deps.client.readRange(meta.name, meta.generation, start, end);
      if (!whole || crc32c(data) === Buffer.from(meta.crc32c!, 'base64').readUInt32BE(0)) return data;
      this.deps.metrics.inc('object_crc_mismatches');
      this.deps.log.warn({ object: meta.name, generation: meta.generation, attempt }, 'downloaded object fails its CRC32C; fetching it again');
      if (attempt >= CORRUPT_ATTEMPTS) throw new GcsError('CORRUPT', `${meta.name}#${meta.generation}: CRC32C mismatch after ${attempt} downloads`);
    }
  }
}

import { crc32c } from '@node-rs/crc32';
import { GcsError } from '../gcs/errors.js';
import type { ObjectClient, ObjectMeta } from '../gcs/object-client.js';
import type { Logger } from '../observe/logger.js';
import type { Metrics } from '../observe/metrics.js';
import type { DiskCache } from './disk-cache.js';

/** A whole object that keeps failing its checksum is not going to get better by asking forever. */
const CORRUPT_ATTEMPTS = 3;

export interface BlockSourceDeps {
  client: ObjectClient;
  disk: DiskCache | null;
  blockSize: number;
  log: Logger;
  metrics: Metrics;
}

/**
 * Where every open file gets its blocks: the disk cache when it has them, otherwise GCS. One load per
 * block at a time: readers of a block in flight wait on the same promise, whichever file they opened.
 */
export class BlockSource {
  readonly blockSize: number;
  private readonly inflight = new Map<string, Promise<Buffer>>();
  private downloading = 0;

  constructor(private readonly deps: BlockSourceDeps) {
    this.blockSize = deps.blockSize;
    deps.metrics.setGauge('downloads_in_flight', () => this.downloading);
  }

  get(meta: ObjectMeta, index: number): Promise<Buffer> {
    const key = `${meta.name}\0${meta.generation}\0${index}`;
    const pending = this.inflight.get(key);
    if (pending) {
      this.deps.metrics.inc('block_shared_waits');
      return pending;
    }
    const p = this.load(meta, index).finally(() => this.inflight.delete(key));
    this.inflight.set(key, p);
    return p;
  }

  private async load(meta: ObjectMeta, index: number): Promise<Buffer> {
    const { disk, metrics } = this.deps;
    const key = { bucket: this.deps.client.bucket, object: meta.name, generation: meta.generation, block: index };
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
    const end = Math.min(meta.size, start + this.blockSize);
    this.downloading++;
    let data: Buffer;
    try {
      data = await this.fetch(meta, start, end);
    } finally {
      this.downloading--;
    }
    metrics.inc('block_fetches');
    metrics.inc('block_fetch_bytes', data.length);
    // Written in the background: the reader has its bytes now, and a failed write only costs a refetch.
    if (disk) void disk.write(key, data);
    return data;
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

import type { BlockSource } from '../blocks/block-source.js';
import type { DiskCache } from '../blocks/disk-cache.js';
import type { ObjectClient, ObjectMeta } from '../gcs/object-client.js';
import type { WarmProgress } from '../observe/control-server.js';
import { componentProblem, type NameMapper } from '../namespace/names.js';

export interface WarmerDeps {
  client: ObjectClient;
  names: NameMapper;
  blocks: BlockSource;
  disk: DiskCache;
  /** Blocks this job fetches at once; the download scheduler still bounds range GETs for the whole mount. */
  parallel: number;
}

const PROGRESS_EVERY_MS = 250;

/**
 * Blocks listed ahead of the workers, per worker. With the list page being read, this is all a warm-up
 * holds at once, however many objects the prefix has: the list is read page by page as the workers
 * catch up, never whole into the daemon's heap.
 */
export const QUEUED_TASKS_PER_WORKER = 2;

interface Task {
  meta: ObjectMeta;
  index: number;
  size: number;
  last: boolean;
}

/** A queue of at most `capacity` items: put waits for room, take for an item; close ends both. */
class BoundedQueue<T> {
  private readonly items: T[] = [];
  private readonly takers: ((item: T | null) => void)[] = [];
  private readonly putters: (() => void)[] = [];
  private closed = false;

  constructor(private readonly capacity: number) {}

  /** Resolves false once the queue is closed (nobody will take the item). */
  async put(item: T): Promise<boolean> {
    while (!this.closed && this.items.length >= this.capacity && this.takers.length === 0) {
      await new Promise<void>((r) => this.putters.push(r));
    }
    if (this.closed) return false;
    const taker = this.takers.shift();
    if (taker) taker(item);
    else this.items.push(item);
    return true;
  }

  /** The next item, or null once the queue is closed and empty. */
  async take(): Promise<T | null> {
    const item = this.items.shift();
    if (item !== undefined) {
      this.putters.shift()?.();
      return item;
    }
    if (this.closed) return null;
    return new Promise((r) => this.takers.push(r));
  }

  close(): void {
    this.closed = true;
    for (const t of this.takers.splice(0)) t(null);
    for (const p of this.putters.splice(0)) p();
  }
}

/** Every object at or under `path` (a mount path) that the mount shows, one list page at a time. */
async function* objectPages(deps: WarmerDeps, path: string): AsyncGenerator<ObjectMeta[]> {
  // Objects the disk cache does not keep (--file-cache-exclude-regex) are not warmed: nothing would keep them.
  const visible = (m: ObjectMeta) =>
    !m.name.endsWith('/') && m.name.slice(deps.names.rootPrefix.length).split('/').every((c) => componentProblem(c) === null) && !deps.blocks.excluded(m);
  if (path !== '/') {
    const exact = await deps.client.statObject(deps.names.objectName(path));
    if (exact && visible(exact)) yield [exact];
  }
  let pageToken: string | undefined;
  do {
    const page = await deps.client.list({ prefix: deps.names.dirPrefix(path), ...(pageToken ? { pageToken } : {}) });
    yield page.objects.filter(visible);
    pageToken = page.nextPageToken ?? undefined;
  } while (pageToken);
}

/**
 * Downloads every block of every object under `path` into the disk cache, skipping blocks already
 * there, so an interrupted warm-up can simply be run again. Listing and downloading overlap: the totals
 * in the progress grow while `listing` is true.
 */
export async function warm(deps: WarmerDeps, path: string, progress: (p: WarmProgress) => void, signal: AbortSignal): Promise<void> {
  const p: WarmProgress = { files: 0, filesDone: 0, bytes: 0, bytesDone: 0, bytesSkipped: 0, done: false, listing: true };
  let lastReport = performance.now();
  const report = () => {
    if (performance.now() - lastReport < PROGRESS_EVERY_MS) return;
    lastReport = performance.now();
    progress({ ...p });
  };
  const bs = deps.blocks.blockSize;
  const queue = new BoundedQueue<Task>(deps.parallel * QUEUED_TASKS_PER_WORKER);
  signal.addEventListener('abort', () => queue.close(), { once: true });

  const list = async () => {
    try {
      for await (const page of objectPages(deps, path)) {
        for (const meta of page) {
          p.files++;
          p.bytes += meta.size;
          const count = Math.max(1, Math.ceil(meta.size / bs));
          for (let i = 0; i < count; i++) {
            if (!(await queue.put({ meta, index: i, size: Math.min(bs, meta.size - i * bs), last: i === count - 1 }))) return;
          }
        }
        report();
      }
    } finally {
      p.listing = false;
      queue.close();
    }
  };
  const worker = async () => {
    try {
      for (let t = await queue.take(); t !== null && !signal.aborted; t = await queue.take()) {
        const key = { bucket: deps.client.bucket, object: t.meta.name, generation: t.meta.generation, block: t.index, blockSize: bs };
        if (t.meta.size === 0 || deps.disk.has(key)) p.bytesSkipped += Math.max(0, t.size);
        else {
          // Readahead's place in the download queue, but a job that must finish: it waits for memory.
          (await deps.blocks.get(t.meta, t.index, 'readahead', 'wait')).release();
          p.bytesDone += t.size;
        }
        if (t.last) p.filesDone++;
        report();
      }
    } catch (err) {
      // One failed block ends the job: the lister must not wait for room that will never come.
      queue.close();
      throw err;
    }
  };
  progress({ ...p });
  await Promise.all([list(), ...Array.from({ length: deps.parallel }, worker)]);
  progress({ ...p, done: !signal.aborted });
}

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

/** Every object at or under `path` (a mount path) that the mount shows. */
async function objectsUnder(deps: WarmerDeps, path: string): Promise<ObjectMeta[]> {
  const out: ObjectMeta[] = [];
  const visible = (m: ObjectMeta) => !m.name.endsWith('/') && m.name.slice(deps.names.rootPrefix.length).split('/').every((c) => componentProblem(c) === null);
  if (path !== '/') {
    const exact = await deps.client.statObject(deps.names.objectName(path));
    if (exact && visible(exact)) out.push(exact);
  }
  let pageToken: string | undefined;
  do {
    const page = await deps.client.list({ prefix: deps.names.dirPrefix(path), ...(pageToken ? { pageToken } : {}) });
    out.push(...page.objects.filter(visible));
    pageToken = page.nextPageToken ?? undefined;
  } while (pageToken);
  return out;
}

/**
 * Downloads every block of every object under `path` into the disk cache, skipping blocks already
 * there, so an interrupted warm-up can simply be run again.
 */
export async function warm(deps: WarmerDeps, path: string, progress: (p: WarmProgress) => void, signal: AbortSignal): Promise<void> {
  const objects = await objectsUnder(deps, path);
  const p: WarmProgress = { files: objects.length, filesDone: 0, bytes: objects.reduce((s, o) => s + o.size, 0), bytesDone: 0, bytesSkipped: 0, done: false };
  progress({ ...p });
  let lastReport = performance.now();
  const report = () => {
    if (performance.now() - lastReport < PROGRESS_EVERY_MS) return;
    lastReport = performance.now();
    progress({ ...p });
  };
  const bs = deps.blocks.blockSize;
  const tasks: { meta: ObjectMeta; index: number; size: number; last: boolean }[] = [];
  for (const meta of objects) {
    const count = Math.max(1, Math.ceil(meta.size / bs));
    for (let i = 0; i < count; i++) tasks.push({ meta, index: i, size: Math.min(bs, meta.size - i * bs), last: i === count - 1 });
  }
  let next = 0;
  const worker = async () => {
    while (next < tasks.length && !signal.aborted) {
      const t = tasks[next++]!;
      const key = { bucket: deps.client.bucket, object: t.meta.name, generation: t.meta.generation, block: t.index, blockSize: bs };
      if (t.meta.size === 0 || deps.disk.has(key)) p.bytesSkipped += Math.max(0, t.size);
      else {
        (await deps.blocks.get(t.meta, t.index, 'readahead')).release();
        p.bytesDone += t.size;
      }
      if (t.last) p.filesDone++;
      report();
    }
  };
  await Promise.all(Array.from({ length: deps.parallel }, worker));
  progress({ ...p, done: !signal.aborted });
}

import { tmpdir } from 'node:os';
import { AppendTempSweeper, TEMP_DIR as APPEND_TEMP_DIR } from '../writes/append-compose.js';
import type { BlockSource } from '../blocks/block-source.js';
import type { WritableObjectClient } from '../gcs/object-client.js';
import type { MemoryBudget } from '../memory/memory-budget.js';
import type { Namespace } from '../namespace/namespace.js';
import type { NameMapper } from '../namespace/names.js';
import type { Logger } from '../observe/logger.js';
import type { Metrics } from '../observe/metrics.js';
import { PrivateDirError } from '../private-dir.js';
import { UploadSlots } from '../writes/file-upload.js';
import { UploadBuffers } from '../writes/upload-buffers.js';
import { LocalChanges } from '../writes/local-changes.js';
import { StagingDir } from '../writes/staging.js';
import { Writes } from '../writes/writes.js';
import { EXIT, UserError } from './exit.js';
import type { MountOptions } from './options.js';
import type { Ttl } from './values.js';

const MIB = 1024 * 1024;
/** Changes remembered at most with TTLs of "for ever"; past it the oldest path is asked of GCS again. */
const MAX_LOCAL_CHANGES = 100_000;

export interface WriteWiringDeps {
  client: WritableObjectClient;
  namespace: Namespace;
  names: NameMapper;
  blocks: BlockSource;
  memory: MemoryBudget;
  /** Chunk memory shared with the download workers, which send upload chunks from it. */
  sharedMemory: boolean;
  /** gcsmount's own folder in the cache dir, when there is one (staging goes in it). */
  cacheHome: string | null;
  /** The metadata TTLs: a change made here is shown for as long as a cache may hold what was before it. */
  ttls: Ttl[];
  log: Logger;
  metrics: Metrics;
}

/** Whether the mount is read-only (-o ro): then nothing of the write side exists. */
export function readOnly(opts: MountOptions): boolean {
  return opts.values.o.includes('ro');
}

/** The write side of a read-write mount, and what stops it. */
export function wireWrites(opts: MountOptions, deps: WriteWiringDeps): { writes: Writes; close: () => void } {
  const v = opts.values;
  const staging = openStaging(v['temp-dir'], deps.cacheHome, deps.log);
  const longest = Math.max(0, ...deps.ttls.map((t) => (t.kind === 'forever' ? Number.POSITIVE_INFINITY : t.kind === 'ms' ? t.ms : 0)));
  const changes = new LocalChanges(longest, MAX_LOCAL_CHANGES, (path) => deps.namespace.forget(path));
  const chunkBytes = v['write-block-size-mb'] * MIB;
  // gcsfuse's 0 turns streaming writes off (files are staged and uploaded at close), with no limit of
  // its own on those uploads; the memory budget still bounds their chunks.
  const maxBlocks = v['write-global-max-blocks'];
  const slots = new UploadSlots(maxBlocks <= 0 ? Number.POSITIVE_INFINITY : maxBlocks);
  const buffers = new UploadBuffers(deps.memory, chunkBytes, Math.min(slots.max, 4), 1000, deps.sharedMemory);
  const appendTempPrefix = `${deps.names.rootPrefix}${APPEND_TEMP_DIR}`;
  const sweeper = new AppendTempSweeper({ client: deps.client, log: deps.log, metrics: deps.metrics, tempPrefix: appendTempPrefix });
  const writes = new Writes({
    client: deps.client,
    names: deps.names,
    appendTempPrefix,
    namespace: deps.namespace,
    changes,
    renameDirLimit: v['rename-dir-limit'],
    createEmptyFile: v['create-empty-file'],
    config: { chunkBytes, streaming: v['enable-streaming-writes'] && maxBlocks !== 0, maxChunksAhead: v['write-max-blocks-per-file'] },
    staging,
    blocks: deps.blocks,
    slots,
    buffers,
    memory: deps.memory,
    log: deps.log,
    metrics: deps.metrics,
  });
  return {
    writes,
    close: () => {
      void sweeper.close();
      buffers.close();
      staging.close();
    },
  };
}

function openStaging(tempDir: string, cacheHome: string | null, log: Logger): StagingDir {
  try {
    if (tempDir) return StagingDir.open(tempDir, 'gcsmount-staging', log);
    if (cacheHome) return StagingDir.open(cacheHome, 'staging', log);
    return StagingDir.open(tmpdir(), `gcsmount-staging-${process.getuid?.() ?? 0}`, log);
  } catch (err) {
    if (err instanceof PrivateDirError) throw new UserError(err.message, EXIT.cacheDir);
    throw err;
  }
}

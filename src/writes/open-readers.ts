import type { ObjectMeta } from '../gcs/object-client.js';
import type { WriteState } from './write-state.js';

/**
 * The read side's open files, told before a name they read goes (so they keep their bytes) and when the
 * object they read is renamed (the same bytes under a new name and generation).
 */
export interface OpenReaders {
  /**
   * The name goes: its readers keep their bytes. With `state` (the file open for writing there), they
   * are that same file and read it; else each gets a private copy of what it read.
   */
  beforeRemoved(path: string, state?: WriteState): Promise<void>;
  /** Generation `source` of `from` was moved to `to`, as `object` (the same bytes): its readers follow it. */
  moved(from: string, to: string, source: string, object: ObjectMeta): void;
  /**
   * A new generation of `path` was written here over generation `replaced` ('0': none): readers of
   * `replaced` go on with it (the file as a local file system would show it), and the kernel is told of it.
   */
  uploaded(path: string, replaced: string, object: ObjectMeta): void;
  /** `path` is open for writing now: readers of it read what the writer writes. */
  writeOpened(path: string): void;
}

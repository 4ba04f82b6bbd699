import type { ObjectMeta } from '../gcs/object-client.js';

/** What a path is. A file pins one generation; a directory is a prefix, with or without a placeholder. */
export type Entry =
  | { kind: 'file'; meta: ObjectMeta }
  | { kind: 'dir'; /** the placeholder object's update time, when there is one */ mtimeMs: number | null };

export interface DirEntry {
  name: string;
  entry: Entry;
}

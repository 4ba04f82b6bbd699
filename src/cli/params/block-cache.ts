// The block cache on local disk (gcsfuse's file cache flags).

import type { Param } from './param.js';

export const BLOCK_CACHE_PARAMS = [
  {
    flag: 'cache-dir',
    configKey: 'cache-dir',
    type: 'string',
    default: '',
    help: 'Directory for the on-disk block cache; empty = no disk cache. gcsmount keeps everything in DIR/gcsmount-cache/ (0700) and changes nothing else in DIR; a cache of the previous layout (DIR/index.sqlite, DIR/blocks-v2/) is moved there',
    group: 'Block cache',
    effect: 'effective',
    path: true,
  },
  {
    flag: 'file-cache-max-size-mb',
    configKey: 'file-cache.max-size-mb',
    type: 'int',
    default: -1,
    help: 'Maximum size of the disk cache in MiB; 0 = no disk cache; -1 = limited by free space: gcsmount keeps 5% of the file system free (at most 4 GiB), evicting the least recently used blocks to stay above that',
    group: 'Block cache',
    effect: 'effective',
    min: -1,
  },
  {
    flag: 'file-cache-enable-o-direct',
    configKey: 'file-cache.enable-o-direct',
    type: 'bool',
    default: true,
    help: 'Write cached blocks with O_DIRECT, past the page cache, and read them back that way (the native read path); gcsmount defaults to true (gcsfuse: false): what a reader reads is in the kernel\'s cache of the mounted file already, so a second copy costs a memory copy and memory. Where the file system refuses O_DIRECT (tmpfs before Linux 6.6) blocks go through the page cache',
    group: 'Block cache',
    effect: 'effective',
  },
  {
    flag: 'file-cache-cache-file-for-range-read',
    configKey: 'file-cache.cache-file-for-range-read',
    type: 'bool',
    default: false,
    help: 'gcsmount caches the blocks a reader touches; objects up to --whole-object-threshold-mb are fetched whole',
    group: 'Block cache',
    effect: 'ignored',
  },
  {
    flag: 'file-cache-include-regex',
    configKey: 'file-cache.include-regex',
    type: 'string',
    default: '',
    help: 'Keep in the disk cache only objects whose BUCKET/OBJECT matches this regular expression (Go/RE2 syntax as gcsfuse; leading (?i) (?s) (?m) flags, (?P<name>) groups, \\A, \\z and escaped punctuation are translated; POSIX classes, \\pL and \\Q..\\E are refused); others are read as without a cache dir and not prefetched',
    group: 'Block cache',
    effect: 'effective',
  },
  {
    flag: 'file-cache-exclude-regex',
    configKey: 'file-cache.exclude-regex',
    type: 'string',
    default: '',
    help: 'Never keep in the disk cache objects whose BUCKET/OBJECT matches this regular expression (wins over --file-cache-include-regex)',
    group: 'Block cache',
    effect: 'effective',
  },
  {
    flag: 'block-size-mb',
    configKey: 'gcsmount.block-size-mb',
    type: 'int',
    // 4 MiB: at GCS's 50-100 ms to first byte and 50-100 MB/s per connection, a 4 MiB GET spends about as
    // long moving bytes as waiting, so latency is amortised without making a random reader fetch much it
    // does not want; typical Zarr chunks (1-16 MiB) are one to four blocks; 20 TB of cache is ~5 million
    // index rows, small for SQLite; and 5,000 requests/s per bucket still carry ~20 GB/s.
    default: 4,
    help: 'gcsmount: size of a cached block (and of one range GET) in MiB',
    group: 'Block cache',
    effect: 'effective',
    min: 1,
    max: 1024,
  },
  {
    flag: 'whole-object-threshold-mb',
    configKey: 'gcsmount.whole-object-threshold-mb',
    type: 'int',
    default: 8,
    help: 'gcsmount: objects up to this size in MiB are fetched whole, in one GET, on their first read (Zarr chunks)',
    group: 'Block cache',
    effect: 'effective',
    min: 0,
  },
] as const satisfies readonly Param[];

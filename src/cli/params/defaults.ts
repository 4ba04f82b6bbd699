// Defaults that depend on the machine (the CPUs and memory this process may use: machine-share.ts), and
// bounds the table shares.

import { usableCpus, usableMemory } from '../../machine-share.js';

/**
 * Range GETs in flight across the mount: max(32, 2 x CPUs). gcsfuse's DefaultMaxParallelDownloads() is
 * max(16, 2 x CPUs) of 200 MiB chunk downloads, each one round trip; gcsmount's are 4 MiB blocks, each
 * paying its own round trip, so the same bytes on the wire need more of them at once. At 50 ms and
 * 50 MiB/s per response a lone `cat` of a cold GiB read 370-402 MiB/s with 16 (the window of 16 blocks
 * never full: each GET spends 50 of its 130 ms waiting) and 500-633 with 32 (bench/RESULTS.md,
 * 2026-12-02, session 13); Zarr rounds and many small files were unchanged.
 */
export const DEFAULT_MAX_PARALLEL_DOWNLOADS = Math.max(32, 2 * usableCpus());

/** Range GETs in flight for one object: 32 (gcsfuse: 16 downloads of 200 MiB chunks), for the same reason. */
export const DEFAULT_PARALLEL_DOWNLOADS_PER_FILE = 32;

/** What one sequential reader gets by default: the per-object limit within the mount's. */
export const DEFAULT_RANGE_GETS_PER_READER = Math.min(DEFAULT_MAX_PARALLEL_DOWNLOADS, DEFAULT_PARALLEL_DOWNLOADS_PER_FILE);

/**
 * Half the CPUs, at most 8 (a worker receives well over 1 GiB/s; the main thread's serial work is the cap
 * past that), and none on a 1-CPU machine, where a second thread would only take turns with the first.
 */
export const DEFAULT_DOWNLOAD_WORKERS = Math.min(8, Math.floor(usableCpus() / 2));

/**
 * One eighth of the RAM this process may use (a cgroup's memory limit, or the machine's), at least
 * 256 MiB and at most 4 GiB: room for a hundred readers' blocks and the downloads in flight with the
 * default block size, and a small share of a big machine, whose memory belongs to the pipeline reading
 * through the mount.
 */
export const DEFAULT_MEMORY_LIMIT_MB = Math.min(4096, Math.max(256, Math.floor(usableMemory() / 8 / 2 ** 20)));

/** gcsfuse accepts TTLs up to MaxInt64 nanoseconds. */
export const MAX_TTL_SECS = 9_223_372_036;

import { controlRequest } from '../observe/control-server.js';
import type { OpSummary } from '../observe/metrics.js';
import { allSockets, controlSocketFor } from '../observe/runtime-dir.js';
import { cacheInfo } from './cache-command.js';
import { EXIT, UserError } from './exit.js';
import { formatBytes, formatCount, formatDuration } from './format.js';

const USAGE = 'usage: gcsmount stats [MOUNTPOINT] [--json] [--watch [SECONDS]] [--cache-dir DIR]';

/** The daemon's /stats answer (see statsReport in wiring.ts). */
interface StatsReport {
  mountPoint: string;
  bucket: string;
  pid: number;
  cacheDir: string | null;
  uptimeSeconds: number;
  summary: { blockCacheHitRatio: number | null; bytesFromCache: number; bytesFetched: number; gcsRequests: number };
  counters: Record<string, number>;
  gauges: Record<string, number>;
  fuseOps: Record<string, OpSummary>;
  /** Absent from a daemon older than this command. */
  threads?: { mainUtilization: number | null; downloadWorkers: { utilization: number; inFlight: number; inUse?: boolean }[] };
}

interface StatsArgs {
  mountPoint: string | null;
  json: boolean;
  watchSeconds: number | null;
  cacheDir: string | null;
}

function parse(args: string[]): StatsArgs {
  const out: StatsArgs = { mountPoint: null, json: false, watchSeconds: null, cacheDir: null };
  for (let i = 0; i < args.length; i++) {
    const a = args[i]!;
    if (a === '--json') out.json = true;
    else if (a === '--watch') {
      const n = Number(args[i + 1]);
      out.watchSeconds = args[i + 1] !== undefined && Number.isFinite(n) && n > 0 ? (i++, n) : 2;
    } else if (a === '--cache-dir' && args[i + 1] !== undefined) out.cacheDir = args[++i]!;
    else if (!a.startsWith('-') && out.mountPoint === null) out.mountPoint = a;
    else throw new UserError(`unexpected argument ${a}; ${USAGE}`, EXIT.usage);
  }
  return out;
}

function table(r: StatsReport): string {
  const c = r.counters;
  const g = r.gauges;
  const ratio = r.summary.blockCacheHitRatio === null ? 'n/a' : `${(100 * r.summary.blockCacheHitRatio).toFixed(1)}%`;
  const limit = g.block_cache_limit_bytes === undefined ? ' (no disk cache)' : g.block_cache_limit_bytes < 0 ? (g.block_cache_free_margin_bytes ? ` (no limit; keeps ${formatBytes(g.block_cache_free_margin_bytes)} of its disk free)` : ' (no limit)') : ` of ${formatBytes(g.block_cache_limit_bytes)}`;
  const lines = [
    `${r.mountPoint}  (bucket ${r.bucket}, pid ${r.pid}, up ${formatDuration(r.uptimeSeconds)}${r.cacheDir ? `, cache ${r.cacheDir}` : ''})`,
    `  block cache   hit ratio ${ratio}   from cache ${formatBytes(c.block_cache_hit_bytes!)} (${formatCount(c.block_cache_hits!)} blocks)   fetched ${formatBytes(c.block_fetch_bytes!)} (${formatCount(c.block_fetches!)} blocks)`,
    `                used ${formatBytes(g.block_cache_bytes ?? 0)}${limit} (${formatCount(g.block_cache_blocks ?? 0)} blocks)   evictions ${formatCount(c.block_cache_evictions!)} (${formatBytes(c.block_cache_evicted_bytes!)})`,
    `                dropped: corrupt ${c.block_cache_corrupt}  short ${c.block_cache_short}  missing ${c.block_cache_missing}   write errors ${c.block_cache_write_errors}   log lines lost ${formatCount(c.log_lines_lost ?? 0)}`,
    `  downloads     in flight ${g.downloads_in_flight ?? 0}   queued ${g.downloads_queued ?? 0}   readahead blocks ${g.readahead_blocks ?? 0}   block buffers ${g.block_buffers_in_use ?? 0}   concurrency limit ${g.gcs_concurrency_limit ?? '-'}   open files ${g.open_files ?? 0}`,
    `  memory        limit ${formatBytes(g.memory_limit_bytes ?? 0)} (blocks ${formatBytes(g.memory_blocks_limit_bytes ?? 0)})   in use ${formatBytes(g.memory_in_use_bytes ?? 0)} (peak ${formatBytes(g.memory_peak_bytes ?? 0)})   waiting ${g.memory_waiting ?? 0} reads (${formatBytes(g.memory_waiting_bytes ?? 0)})   waited ${formatCount(c.memory_waits ?? 0)} times, ${((c.memory_wait_ms ?? 0) / 1000).toFixed(1)} s   skipped for memory: readahead ${formatCount(c.memory_readahead_skipped ?? 0)} prefetch ${formatCount(c.memory_prefetch_skipped ?? 0)}`,
    `                block buffers resident ${formatBytes(g.memory_block_buffers_resident_bytes ?? 0)}   listings ${formatBytes(g.memory_listing_bytes ?? 0)} (accounted)   native read path ${formatCount(g.native_block_buffers ?? 0)} blocks (its own pool)`,
    threadsLine(r),
    nativeLine(r),
    `  GCS requests  list ${formatCount(c.gcs_requests_list!)}  metadata ${formatCount(c.gcs_requests_metadata!)}  media ${formatCount(c.gcs_requests_media!)}  bucket ${c.gcs_requests_bucket}   retries ${formatCount(c.gcs_retries!)}   429s ${formatCount(c.gcs_throttled!)}   errors ${formatCount(c.gcs_errors!)}`,
    `  request rate  ${g.gcs_rate_limit === undefined ? 'no limit' : `${g.gcs_rate_limit}/s (ceiling ${g.gcs_rate_ceiling}/s)`}   waited for tokens ${formatCount(c.gcs_rate_waits ?? 0)} times, ${((c.gcs_rate_wait_ms ?? 0) / 1000).toFixed(1)} s   queued ${g.gcs_rate_queued ?? 0}   cuts on 429 ${formatCount(c.gcs_rate_cuts ?? 0)}`,
    `  writes        uploads ${formatCount(c.write_uploads ?? 0)} (appends by compose ${formatCount(c.write_compose_appends ?? 0)})   sent ${formatBytes(c.gcs_upload_bytes ?? 0)}   ESTALE ${formatCount(c.write_estale ?? 0)}   failed ${formatCount(c.write_failures ?? 0)}   open ${g.write_files_open ?? 0} (staged ${formatBytes(g.write_staged_bytes ?? 0)})`,
    `  bandwidth     ${g.gcs_bandwidth_limit_bytes === undefined ? 'no limit' : `${formatBytes(g.gcs_bandwidth_limit_bytes)}/s`}   reads waited ${formatCount(c.gcs_bandwidth_waits ?? 0)} times, ${((c.gcs_bandwidth_wait_ms ?? 0) / 1000).toFixed(1)} s   queued ${g.gcs_bandwidth_queued ?? 0}`,
    `  stalls        cut ${formatCount(c.gcs_stalls ?? 0)}   resumed by Range ${formatCount(c.gcs_resumed_reads ?? 0)}   stall timeout ${g.gcs_stall_timeout_ms === undefined ? 'off' : `${(g.gcs_stall_timeout_ms / 1000).toFixed(1)} s`}   gave up at --max-retry-duration ${formatCount(c.gcs_retry_deadline_exceeded ?? 0)}`,
    `  prefetch      files ${formatCount(c.prefetch_files ?? 0)} (${formatBytes(c.prefetch_bytes ?? 0)})   used before eviction ${formatCount(c.prefetch_used_files ?? 0)} (hit ratio ${c.prefetch_files ? `${((100 * (c.prefetch_used_files ?? 0)) / c.prefetch_files).toFixed(1)}%` : 'n/a'})   wasted ${formatBytes(c.prefetch_wasted_bytes ?? 0)}   fill chunks skipped ${formatCount(c.prefetch_fill_skipped ?? 0)}   in flight ${g.prefetch_in_flight ?? 0}   held ${formatBytes(g.prefetch_held_bytes ?? 0)}`,
    `  metadata      stat hits ${formatCount(c.meta_stat_hits!)}  type hits ${formatCount(c.meta_type_hits!)}  negative hits ${formatCount(c.meta_negative_hits!)}  listing hits ${formatCount(c.meta_list_hits!)}  misses ${formatCount(c.meta_misses! + c.meta_list_misses!)}`,
    `                stat cache ${formatCount(g.meta_stat_entries ?? 0)} entries ${formatBytes(g.meta_stat_bytes ?? 0)}   listings ${formatCount(g.meta_listing_folders ?? 0)} folders, ${formatCount(g.meta_listing_entries ?? 0)} entries ${formatBytes(g.meta_listing_bytes ?? 0)}   (together of ${g.meta_stat_limit_bytes === undefined || g.meta_stat_limit_bytes < 0 ? 'no limit' : formatBytes(g.meta_stat_limit_bytes)})   type cache ${formatCount(g.meta_type_entries ?? 0)} entries ${formatBytes(g.meta_type_bytes ?? 0)}`,
    `                prefetch: lookup walks ${formatCount(c.meta_lookup_walks ?? 0)} (pages ahead ${formatCount(c.meta_lookup_pages_ahead ?? 0)}), lookups joining a listing ${formatCount(c.meta_prefetch_joined ?? 0)}, readdirs in progress ${g.meta_listings_in_progress ?? 0}   walks ${formatCount(c.meta_walks ?? 0)} (${formatCount(c.meta_walk_folders ?? 0)} folders filled, ${g.meta_walks_in_progress ?? 0} in progress)   list workers busy ${g.meta_list_workers_busy ?? 0}`,
    `  FUSE          ${'op'.padEnd(12)}${'count'.padStart(12)}${'errors'.padStart(8)}${'avg ms'.padStart(9)}${'p50'.padStart(8)}${'p99'.padStart(8)}${'max'.padStart(9)}`,
  ];
  for (const [op, s] of Object.entries(r.fuseOps).sort((a, b) => b[1].count - a[1].count)) {
    lines.push(`                ${op.padEnd(12)}${formatCount(s.count).padStart(12)}${String(s.errors).padStart(8)}${s.avgMs.toFixed(2).padStart(9)}${s.p50Ms.toFixed(1).padStart(8)}${s.p99Ms.toFixed(1).padStart(8)}${s.maxMs.toFixed(1).padStart(9)}`);
  }
  return lines.join('\n');
}

/** How busy each thread is: the main thread near 100% is what limits the mount, whatever the cores. */
function threadsLine(r: StatsReport): string {
  const pct = (u: number | null | undefined) => (u === null || u === undefined ? 'n/a' : `${Math.round(100 * u)}%`);
  const t = r.threads;
  const main = `main ${pct(t?.mainUtilization ?? r.gauges.main_thread_utilization)} busy`;
  if (!t) return `  threads       ${main}`;
  const workers = t.downloadWorkers.length === 0
    ? 'download workers none (--download-workers 0)'
    : `download workers ${t.downloadWorkers.map((w, i) => `#${i + 1} ${pct(w.utilization)} busy, ${w.inFlight} in flight${w.inUse === false ? ' (spare: takes downloads once those in use are busy, or hold their share of --max-conns-per-host)' : ''}`).join('; ')}`;
  return `  threads       ${main}   ${workers}   (over the last 2 s)`;
}

/**
 * The addon's reads of cached blocks, which never enter JavaScript: how many it answered, how many of
 * them first waited for a block still on its way to disk, and how many it gave back (to the main thread).
 */
function nativeLine(r: StatsReport): string {
  const c = r.counters;
  // Its counters always exist (0); its buffers' gauge only once the native path runs.
  if (r.gauges.native_block_buffers === undefined) return '  native reads  off (no --cache-dir, or the addon could not start them: reads of cached blocks go through JavaScript)';
  return `  native reads  answered ${formatCount(c.native_reads ?? 0)} (${formatBytes(c.native_read_bytes ?? 0)})   waited for a block on its way ${formatCount(c.native_reads_waited ?? 0)} (blocks lent from their download ${formatCount(c.native_blocks_lent ?? 0)}, from readahead ${formatCount(c.native_landed_lent ?? 0)})   given back to JavaScript ${formatCount(c.native_fallbacks ?? 0)}   block files read ${formatCount(c.native_block_loads ?? 0)}`;
}

async function collect(a: StatsArgs): Promise<StatsReport[]> {
  if (a.mountPoint) {
    const r = await controlRequest<StatsReport>(await controlSocketFor(a.mountPoint), '/stats');
    if (!r) throw new UserError(`no gcsmount daemon answers for ${a.mountPoint}`, EXIT.mountPoint);
    return [r];
  }
  const all = await Promise.all((await allSockets()).map((s) => controlRequest<StatsReport>(s, '/stats')));
  return all.filter((r): r is StatsReport => r !== null);
}

/** `gcsmount stats`: what a running mount's caches and downloads are doing. */
export async function runStats(args: string[]): Promise<number> {
  const a = parse(args);
  if (a.cacheDir && !a.mountPoint) {
    const info = await cacheInfo(a.cacheDir);
    process.stdout.write(a.json ? `${JSON.stringify(info)}\n` : `${info.dir}  (no daemon)\n  block cache   used ${formatBytes(info.bytes)} in ${formatCount(info.blocks)} blocks of ${formatCount(info.objects)} objects\n`);
    return EXIT.ok;
  }
  for (;;) {
    const reports = await collect(a);
    if (!a.mountPoint && reports.length === 0 && !a.watchSeconds) throw new UserError('no gcsmount daemon is running', EXIT.mountPoint);
    const text = a.json ? JSON.stringify(a.mountPoint ? reports[0] : { mounts: reports }) : reports.map(table).join('\n\n');
    if (a.watchSeconds && process.stdout.isTTY) process.stdout.write('\x1b[2J\x1b[H');
    process.stdout.write(`${text}\n`);
    if (!a.watchSeconds) return EXIT.ok;
    await new Promise((r) => setTimeout(r, a.watchSeconds! * 1000));
  }
}

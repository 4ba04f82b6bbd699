import { performance } from 'node:perf_hooks';
import type { Metrics } from './metrics.js';

/**
 * The main thread's event-loop utilization, sampled over windows of `windowMs`, as the
 * main_thread_utilization gauge: near 1, the JavaScript thread is what limits the mount, whatever the
 * machine's core count. Returns the function that stops sampling.
 */
export function trackMainThread(metrics: Metrics, windowMs = 2000): () => void {
  let last = performance.eventLoopUtilization();
  let value = 0;
  const timer = setInterval(() => {
    const now = performance.eventLoopUtilization();
    value = performance.eventLoopUtilization(now, last).utilization;
    last = now;
  }, windowMs);
  timer.unref();
  metrics.setGauge('main_thread_utilization', () => Math.round(value * 100) / 100);
  return () => clearInterval(timer);
}

import { createServer, type Server } from 'node:http';
import { Counter, Gauge, Registry } from 'prom-client';
import { COUNTERS, GAUGES, type CounterName, type GaugeName, type Metrics } from './metrics.js';

/**
 * A prom-client registry that reads the same Metrics the control socket serves: one set of numbers,
 * two formats. Values are read when Prometheus scrapes, not pushed on every increment.
 */
export function prometheusRegistry(metrics: Metrics): Registry {
  const registry = new Registry();
  for (const name of Object.keys(COUNTERS) as CounterName[]) {
    new Counter({
      name: `gcsmount_${name}_total`,
      help: COUNTERS[name],
      registers: [registry],
      collect() {
        this.reset();
        this.inc(metrics.get(name));
      },
    });
  }
  new Gauge({
    name: 'gcsmount_uptime_seconds',
    help: 'seconds since the daemon started',
    registers: [registry],
    collect() {
      this.set(metrics.snapshot().uptimeSeconds);
    },
  });
  for (const name of Object.keys(GAUGES) as GaugeName[]) {
    new Gauge({
      name: `gcsmount_${name}`,
      help: GAUGES[name],
      registers: [registry],
      collect() {
        const v = metrics.snapshot().gauges[name];
        if (v !== undefined) this.set(v);
      },
    });
  }
  // Per FUSE operation: how many, how many failed, and the time spent (rate(seconds) / rate(operations)
  // is the mean latency), plus the slowest one seen.
  const byOp = (name: string, help: string) => new Counter({ name, help, labelNames: ['op'], registers: [registry] });
  const opCount = byOp('gcsmount_fuse_operations_total', 'FUSE operations by name');
  const opErrors = byOp('gcsmount_fuse_operation_errors_total', 'FUSE operations answered with an error');
  const opSeconds = byOp('gcsmount_fuse_operation_seconds_total', 'time spent answering FUSE operations');
  const opMax = new Gauge({ name: 'gcsmount_fuse_operation_max_seconds', help: 'the slowest FUSE operation seen', labelNames: ['op'], registers: [registry] });
  const refresh = () => {
    for (const m of [opCount, opErrors, opSeconds]) m.reset();
    for (const [op, s] of metrics.opStats()) {
      opCount.inc({ op }, s.count);
      opErrors.inc({ op }, s.errors);
      opSeconds.inc({ op }, s.totalMs / 1000);
      opMax.set({ op }, s.maxMs / 1000);
    }
  };
  return Object.assign(registry, { refreshOps: refresh });
}

/** Serves the registry as Prometheus text on `port` (all interfaces, as gcsfuse does). */
export async function startPrometheus(metrics: Metrics, port: number): Promise<{ port: number; close(): Promise<void> }> {
  const registry = prometheusRegistry(metrics) as Registry & { refreshOps(): void };
  const server: Server = createServer((req, res) => {
    if (req.url !== '/metrics') {
      res.writeHead(404).end();
      return;
    }
    registry.refreshOps();
    registry.metrics().then(
      (text) => res.writeHead(200, { 'content-type': registry.contentType }).end(text),
      (err: Error) => res.writeHead(500).end(err.message),
    );
  });
  await new Promise<void>((resolve, reject) => {
    server.once('error', reject);
    server.listen(port, resolve);
  });
  const address = server.address();
  return {
    port: typeof address === 'object' && address ? address.port : port,
    close: () => new Promise<void>((resolve) => server.close(() => resolve())),
  };
}

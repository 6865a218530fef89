/**
 * `/metrics`: the Prometheus text format (version 0.0.4), written here so no
 * dependency is needed. The asynq_* families have the names, types and
 * labels of asynq's x/metrics collector, so Grafana dashboards built for
 * asynq work unchanged; pgasynq_* families add what the database can tell
 * about leases, servers and schedulers.
 *
 * Everything is read through the Inspector on each scrape, as asynq's
 * collector does. Counters that live in a worker process (claims, fenced
 * writes, leases lost, recoveries: `server.metrics()`) are not in the
 * database; a process that runs a Server exports them with the `extra` hook:
 *
 *   const metrics = metricsHandler({ connectionString, extra: () => serverMetrics(server) });
 *   app.get('/metrics', metrics);
 */
import type { IncomingMessage, ServerResponse } from 'node:http';
import type { ConnectionOptions } from '../internal/connection.js';
import { redact } from '../internal/redact.js';
import { isQueueNotFound } from '../model/errors.js';
import type { ServerPreview } from '../model/previews.js';
import { Inspector } from '../inspector.js';
import { listServerPreviews, queueFootprint } from '../inspector-internal.js';
import type { QueueInfo } from '../model/inspector-types.js';
import type { Server } from '../server.js';
import type { TaskState } from '../model/task.js';

/** One sample of a metric family. */
export interface MetricSample {
  labels?: Record<string, string>;
  value: number;
}

/** A metric family as the text format writes it: `# HELP`, `# TYPE`, then its samples. */
export interface MetricFamily {
  /** [a-zA-Z_:][a-zA-Z0-9_:]* */
  name: string;
  help: string;
  type: 'gauge' | 'counter';
  samples: MetricSample[];
}

/** The Content-Type of the Prometheus text format. */
export const PROMETHEUS_CONTENT_TYPE = 'text/plain; version=0.0.4; charset=utf-8';

const NAME = /^[a-zA-Z_:][a-zA-Z0-9_:]*$/;
const LABEL = /^[a-zA-Z_][a-zA-Z0-9_]*$/;

function escapeLabelValue(v: string): string {
  return v.replace(/\\/g, '\\\\').replace(/\n/g, '\\n').replace(/"/g, '\\"');
}

function escapeHelp(v: string): string {
  return v.replace(/\\/g, '\\\\').replace(/\n/g, '\\n');
}

function formatValue(v: number): string {
  if (Number.isNaN(v)) return 'NaN';
  if (v === Infinity) return '+Inf';
  if (v === -Infinity) return '-Inf';
  return String(v);
}

/** Writes families in the text format. Throws on an invalid metric or label name (a bug in the caller). */
export function renderPrometheus(families: readonly MetricFamily[]): string {
  const lines: string[] = [];
  for (const f of families) {
    if (!NAME.test(f.name)) throw new Error(`invalid metric name ${JSON.stringify(f.name)}`);
    lines.push(`# HELP ${f.name} ${escapeHelp(f.help)}`, `# TYPE ${f.name} ${f.type}`);
    for (const s of f.samples) {
      const labels = Object.entries(s.labels ?? {});
      for (const [k] of labels) if (!LABEL.test(k)) throw new Error(`invalid label name ${JSON.stringify(k)} on ${f.name}`);
      const l = labels.length === 0 ? '' : `{${labels.map(([k, v]) => `${k}="${escapeLabelValue(v)}"`).join(',')}}`;
      lines.push(`${f.name}${l} ${formatValue(s.value)}`);
    }
  }
  return lines.length === 0 ? '' : `${lines.join('\n')}\n`;
}

/**
 * The states asynq's collector exports under asynq_tasks_enqueued_total: not
 * aggregating nor waiting, which asynq dashboards do not know; each has a
 * pgasynq_ family of its own.
 */
const ENQUEUED_STATES = ['active', 'pending', 'scheduled', 'retry', 'archived', 'completed'] as const;
/** The states whose tasks are sampled for the memory estimate (aggregating tasks are counted at the others' mean). */
const SAMPLED_STATES = [...ENQUEUED_STATES, 'waiting'] as const;

/** Tasks sampled per state to estimate a queue's size in bytes, as asynq samples 20 per Redis structure. */
const MEMORY_SAMPLE = 20;
/** Fixed bytes per task row beyond its JSON: tuple header, fixed columns and index entries, roughly. */
const ROW_OVERHEAD_BYTES = 300;

/**
 * asynq_queue_memory_usage_approx_bytes, estimated the way asynq does it: the
 * mean size of up to 20 sampled tasks per state times the state's count. The
 * sizes are measured in PostgreSQL (a scrape over megabyte payloads reads a
 * few numbers, not the payloads). What PostgreSQL stores differs (TOAST
 * compression, indexes, dead tuples): read it as an order of magnitude, as
 * asynq's own figure is.
 */
function approxBytes(info: QueueInfo, meanBytes: Map<TaskState, number>): number {
  let total = 0;
  for (const state of SAMPLED_STATES) {
    const mean = meanBytes.get(state);
    if (info[state] > 0 && mean !== undefined) total += (ROW_OVERHEAD_BYTES + mean) * info[state];
  }
  // Aggregating tasks: counted at the sampled mean of the other states (or the row overhead).
  if (info.aggregating > 0) total += (info.size > info.aggregating ? total / (info.size - info.aggregating) : ROW_OVERHEAD_BYTES) * info.aggregating;
  return Math.round(total);
}

/** What one scrape read: every queue's info (with the two estimates), the live servers, the cron entries. */
export interface Snapshot {
  queues: (QueueInfo & { approxBytes: number; orphaned: number })[];
  /** Live servers; their workers' payloads are not read. */
  servers: ServerPreview[];
  schedulerEntries: number;
}

/** Reads everything /metrics reports, through the Inspector. A queue removed meanwhile is left out. */
export async function snapshot(inspector: Inspector): Promise<Snapshot> {
  const names = await inspector.queues();
  const infos = await Promise.all(
    names.map(async (q) => {
      try {
        const info = await inspector.getQueueInfo(q);
        const { meanBytes, orphaned } = await queueFootprint(
          inspector,
          q,
          SAMPLED_STATES.filter((state) => info[state] > 0),
          MEMORY_SAMPLE,
        );
        return { ...info, approxBytes: approxBytes(info, meanBytes), orphaned };
      } catch (err) {
        if (isQueueNotFound(err)) return null;
        throw err;
      }
    }),
  );
  const [servers, entries] = await Promise.all([listServerPreviews(inspector, true), inspector.schedulerEntries()]);
  return { queues: infos.filter((q) => q !== null), servers, schedulerEntries: entries.length };
}

/** The metric families of a snapshot: asynq's, then pgasynq's. */
export function families(s: Snapshot): MetricFamily[] {
  const q = s.queues;
  const per = (value: (info: Snapshot['queues'][number]) => number) => q.map((info) => ({ labels: { queue: info.queue }, value: value(info) }));
  const now = q[0]?.timestamp.getTime() ?? Date.now();
  const oldestStart = new Map<string, number>();
  for (const srv of s.servers) {
    for (const w of srv.activeWorkers) {
      const t = w.startedAt.getTime();
      oldestStart.set(w.queue, Math.min(oldestStart.get(w.queue) ?? t, t));
    }
  }
  return [
    {
      name: 'asynq_tasks_enqueued_total',
      help: 'Number of tasks enqueued; broken down by queue and state.',
      type: 'gauge',
      samples: q.flatMap((info) => ENQUEUED_STATES.map((state) => ({ labels: { queue: info.queue, state }, value: info[state] }))),
    },
    { name: 'asynq_queue_size', help: 'Number of tasks in a queue', type: 'gauge', samples: per((i) => i.size) },
    {
      name: 'asynq_queue_latency_seconds',
      help: 'Number of seconds the oldest pending task is waiting in pending state to be processed.',
      type: 'gauge',
      samples: per((i) => i.latency / 1000),
    },
    {
      name: 'asynq_queue_memory_usage_approx_bytes',
      help: 'Number of memory used by a given queue (approximated number by sampling).',
      type: 'gauge',
      samples: per((i) => i.approxBytes),
    },
    {
      name: 'asynq_tasks_processed_total',
      help: 'Number of tasks processed (both succeeded and failed); broken down by queue',
      type: 'counter',
      samples: per((i) => i.processedTotal),
    },
    { name: 'asynq_tasks_failed_total', help: 'Number of tasks failed; broken down by queue', type: 'counter', samples: per((i) => i.failedTotal) },
    { name: 'asynq_queue_paused_total', help: 'Number of queues paused', type: 'gauge', samples: per((i) => (i.paused ? 1 : 0)) },
    {
      name: 'pgasynq_tasks_aggregating',
      help: 'Tasks waiting in a group to be aggregated; broken down by queue.',
      type: 'gauge',
      samples: per((i) => i.aggregating),
    },
    {
      name: 'pgasynq_tasks_waiting',
      help: 'Tasks waiting for their dependencies to finish (workflows); broken down by queue.',
      type: 'gauge',
      samples: per((i) => i.waiting),
    },
    { name: 'pgasynq_queue_groups', help: 'Groups with aggregating tasks; broken down by queue.', type: 'gauge', samples: per((i) => i.groups) },
    {
      name: 'pgasynq_tasks_processed_today',
      help: 'Attempts finished today (UTC), succeeded and failed; broken down by queue.',
      type: 'gauge',
      samples: per((i) => i.processed),
    },
    { name: 'pgasynq_tasks_failed_today', help: 'Attempts failed today (UTC); broken down by queue.', type: 'gauge', samples: per((i) => i.failed) },
    {
      name: 'pgasynq_tasks_orphaned',
      help: 'Active tasks whose lease expired and that no recoverer has taken yet (their worker is gone or stalled); broken down by queue.',
      type: 'gauge',
      samples: per((i) => i.orphaned),
    },
    {
      name: 'pgasynq_active_task_oldest_age_seconds',
      help: 'Seconds since the longest-running active task held by a live server started; 0 when none runs. Broken down by queue.',
      type: 'gauge',
      samples: per((i) => {
        const t = oldestStart.get(i.queue);
        return t === undefined ? 0 : Math.max(0, (now - t) / 1000);
      }),
    },
    { name: 'pgasynq_servers', help: 'Live servers (heartbeat not expired).', type: 'gauge', samples: [{ value: s.servers.length }] },
    {
      name: 'pgasynq_workers_busy',
      help: 'Tasks the live servers are running (leases they hold).',
      type: 'gauge',
      samples: [{ value: s.servers.reduce((n, srv) => n + srv.activeWorkers.length, 0) }],
    },
    {
      name: 'pgasynq_workers_capacity',
      help: "Sum of the live servers' concurrency.",
      type: 'gauge',
      samples: [{ value: s.servers.reduce((n, srv) => n + srv.concurrency, 0) }],
    },
    { name: 'pgasynq_scheduler_entries', help: 'Cron entries registered by live schedulers.', type: 'gauge', samples: [{ value: s.schedulerEntries }] },
  ];
}

/**
 * The per-process counters of running Servers (`server.metrics()`), for the
 * `extra` hook of metricsHandler(). They are counts since each server
 * started, labelled with its id.
 */
export function serverMetrics(...servers: Server[]): MetricFamily[] {
  const m = servers.map((s) => ({ id: s.id, c: s.metrics() }));
  const fam = (name: string, help: string, pick: (c: ReturnType<Server['metrics']>) => number): MetricFamily => ({
    name,
    help,
    type: 'counter',
    samples: m.map(({ id, c }) => ({ labels: { server: id }, value: pick(c) })),
  });
  return [
    fam('pgasynq_tasks_claimed_total', 'Tasks this server claimed.', (c) => c.claimed),
    fam('pgasynq_fenced_writes_total', 'Writes about a task refused because the server no longer held its lease.', (c) => c.fencedWrites),
    fam(
      'pgasynq_leases_lost_total',
      'Leases this server lost before the outcome of its task was written (the handler aborted, or the outcome dropped): the recoverer takes those tasks.',
      (c) => c.leasesLost,
    ),
    fam('pgasynq_recovered_total', "Orphaned tasks this server's recoverer sent back to retry.", (c) => c.recovered),
    fam('pgasynq_recovered_archived_total', "Orphaned tasks this server's recoverer archived (retries spent).", (c) => c.archivedByRecoverer),
  ];
}

/** Options of metricsHandler(): the connection (or an Inspector), and families to add. */
export interface MetricsHandlerOptions extends ConnectionOptions {
  /** Families appended to every scrape, e.g. `() => serverMetrics(server)`. @defaultValue none */
  extra?: () => MetricFamily[] | Promise<MetricFamily[]>;
  /**
   * Read through this Inspector instead of one of our own (it is then not closed by close()).
   * @defaultValue none: an Inspector of the handler's own, on the connection options
   */
  inspector?: Inspector;
}

/** A request handler for `/metrics` that any node:http-style server can mount. */
export interface MetricsHandler {
  (req: IncomingMessage, res: ServerResponse): void;
  /** The text one scrape returns. */
  collect(): Promise<string>;
  /** Closes the handler's Inspector (not one that was passed in). */
  close(): Promise<void>;
}

/** The text of one scrape: asynq's and pgasynq's families, then `extra`'s. */
export async function collectMetrics(inspector: Inspector, extra?: MetricsHandlerOptions['extra']): Promise<string> {
  const fams = families(await snapshot(inspector));
  if (extra) fams.push(...(await extra()));
  return renderPrometheus(fams);
}

/** Writes a scrape, or a 500 with a one-line reason (connection strings redacted) when the database fails. */
export async function serveMetrics(inspector: Inspector, extra: MetricsHandlerOptions['extra'], req: IncomingMessage, res: ServerResponse): Promise<void> {
  try {
    const body = await collectMetrics(inspector, extra);
    res.statusCode = 200;
    res.setHeader('Content-Type', PROMETHEUS_CONTENT_TYPE);
    res.end(req.method === 'HEAD' ? undefined : body);
  } catch (err) {
    const message = err instanceof Error ? err.message : String(err);
    res.statusCode = 500;
    res.setHeader('Content-Type', 'text/plain; charset=utf-8');
    res.end(`metrics collection failed: ${redact(message)}\n`);
  }
}

/**
 * A `/metrics` handler for your own HTTP server (node:http, Express, …): on
 * each request it reads every queue through the Inspector and answers in the
 * Prometheus text format. It checks no token: protect it as the rest of your
 * server.
 *
 * @example
 * const metrics = metricsHandler({ connectionString: process.env.DATABASE_URL, extra: () => serverMetrics(server) });
 * http.createServer((req, res) => (req.url === '/metrics' ? metrics(req, res) : res.end())).listen(9876);
 */
export function metricsHandler(opts: MetricsHandlerOptions = {}): MetricsHandler {
  const { extra, inspector: given, ...conn } = opts;
  const inspector = given ?? new Inspector(conn);
  const handler = ((req: IncomingMessage, res: ServerResponse) => {
    void serveMetrics(inspector, extra, req, res);
  }) as MetricsHandler;
  handler.collect = () => collectMetrics(inspector, extra);
  handler.close = () => (given ? Promise.resolve() : inspector.close());
  return handler;
}

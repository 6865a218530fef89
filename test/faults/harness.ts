/**
 * The fault suite's harness (reliability plan §5.1): per test, a throwaway
 * cluster, a migrated schema with the oracle tables beside it (checks.ts),
 * child processes (workers, producers) it spawns, signals and respawns, an
 * acknowledgement log kept outside the database, a sampler for I4 and I7
 * (samplers.ts), the invariant checks I1–I7 in SQL (checks.ts), and one JSON
 * line of figures per test in results/reliability-results.jsonl (figures.ts).
 * A test gets one from kit.ts's faultTest(), which also tears it down:
 *
 *   faultTest('F01 …', { schema: 'f01', timeout: 180_000 }, async (h) => {
 *     await h.spawnWorkers(3, { concurrency: 4 });
 *     h.startSampler();
 *     await h.spawnProducer({ count: 300, rate: 30 });
 *     ...inject faults...
 *     await h.settle(90_000);
 *     report(h, await h.check({ maxRetry: 3 }), 'F01 …', { recovery_s: … });
 *   });
 */
import { spawn } from 'node:child_process';
import { appendFileSync, closeSync, existsSync, mkdirSync, openSync, readFileSync, rmSync } from 'node:fs';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import pg from 'pg';
import { Client, Inspector, migrate, Task, type EnqueueCallOptions, type TaskInfo } from '../../src/index.js';
import { checkCron, checkUnique, figuresOf, ORACLE_SQL, runChecks, type CheckOptions, type Checks } from './checks.js';
import { Child, type ProducerOptions, type SpawnSpec, type WorkerMetrics, type WorkerOptions } from './child.js';
import { startCluster, type Cluster, type ClusterOptions } from './cluster.js';
import { RESULTS_DIR, type Figures } from './figures.js';
import { FAST } from './profile.js';
import { startStuckSampler, type Sampler } from './samplers.js';

export { assertInvariants, type Checks } from './checks.js';
export { Child, type ProducerOptions, type SpawnSpec, type WorkerMetrics, type WorkerOptions } from './child.js';
export { recordFigures, RESULTS_DIR, RESULTS_FILE, type Figures } from './figures.js';
export { BOUND_S, FAST, ORACLE_BOUND_S, type Profile } from './profile.js';

const HERE = fileURLToPath(new URL('.', import.meta.url));
const REPO = fileURLToPath(new URL('../..', import.meta.url));

export interface Harness {
  name: string;
  schema: string;
  cluster: Cluster;
  connectionString: string;
  pool: pg.Pool;
  ackFile: string;
  logDir: string;
  children: Child[];
  /** A Client and an Inspector on the test schema (made on first use, closed by teardown). */
  readonly client: Client;
  readonly inspector: Inspector;
  /** SQL with `{{schema}}` replaced by the quoted test schema. */
  query<R extends pg.QueryResultRow = any>(text: string, values?: unknown[]): Promise<R[]>;
  /** The first row of query() (a statement that always returns one, such as an aggregate). */
  one<R extends pg.QueryResultRow = any>(text: string, values?: unknown[]): Promise<R>;
  /** The database clock (clock_timestamp()), for comparing with oracle rows. */
  dbNow(): Promise<Date>;
  spawnWorker(name: string, opts?: WorkerOptions): Promise<Child>;
  /** Workers of the same options at once: `names`, or w1 … wN. */
  spawnWorkers(names: string[] | number, opts?: WorkerOptions): Promise<Child[]>;
  spawnProducer(opts: ProducerOptions, name?: string): Promise<Child>;
  /** Spawns a child again with the same spec (a new pid). */
  respawn(child: Child): Promise<Child>;
  signal(child: Child, signal: NodeJS.Signals): void;
  /** Enqueues directly (not through the ack log), retention kept. */
  enqueue(type: string, payload: unknown, opts?: { maxRetry?: number }): Promise<string>;
  /** Enqueues with h.client and, once that resolved, appends the ids to the acknowledgement log. */
  enqueueAcked(tasks: Task[], opts?: EnqueueCallOptions): Promise<TaskInfo[]>;
  /** Appends ids to the acknowledgement log (their enqueue has committed). */
  ack(ids: string[]): void;
  /** Terminates backends whose application_name matches LIKE; `idleOnly` spares those running a statement. */
  terminate(applicationNameLike: string, opts?: { idleOnly?: boolean }): Promise<number>;
  ackedIds(): string[];
  startSampler(): void;
  stopSampler(): Promise<void>;
  /** Waits until no task is pending, active, scheduled or retry (and the producers are done). */
  waitDrained(timeoutMs?: number): Promise<void>;
  /** The end of a run: drained, the workers' last metrics lines in (700 ms), the sampler stopped. */
  settle(drainTimeoutMs?: number): Promise<void>;
  /** Execution starts not yet ended, aborted or fenced, by worker tag. */
  openStarts(): Promise<Record<string, number>>;
  /** Resolves with the seconds from now until every task `serverId` holds active now has left that state (plan's recovery_s). */
  trackRecovery(serverId: string, timeoutMs?: number): Promise<number>;
  check(opts: CheckOptions): Promise<Checks>;
  /** I7 and I8, now (checks.ts). */
  checkUnique(): Promise<number>;
  checkCron(): Promise<{ doubleFires: number; sharedTasks: number }>;
  /** The plan's figure fields from a check, plus worker metrics summed over every child. */
  figures(test: string, c: Checks, extra?: Partial<Figures>): Figures;
  /** Every event line of every child, with the child's name (`worker`) and server id. */
  lines(): Record<string, any>[];
  /** Children that died in a way nobody asked for. */
  unexpectedExits(allowedCodes?: readonly number[]): string[];
  /** Sum of a metric over every worker's last metrics line. */
  metricSum(key: keyof WorkerMetrics): number;
  /** Runs `fn` at teardown, after the children are gone and before the cluster is (a proxy's close, say). */
  defer(fn: () => unknown): void;
  teardown(): Promise<void>;
}

export const sleep = (ms: number): Promise<void> => new Promise((r) => setTimeout(r, ms));

/** Polls `check` until it returns a truthy value, or throws after timeoutMs. */
export async function waitFor<T>(check: () => Promise<T> | T, timeoutMs: number, what: string, everyMs = 100): Promise<NonNullable<T>> {
  const deadline = performance.now() + timeoutMs;
  for (;;) {
    const value = await check();
    if (value) return value;
    if (performance.now() > deadline) throw new Error(`timed out after ${timeoutMs} ms waiting for ${what}`);
    await sleep(everyMs);
  }
}

/** Starts a cluster, migrates `schema` (= name), creates the oracle tables. */
export async function createHarness(name: string, clusterOptions: ClusterOptions = {}): Promise<Harness> {
  const schema = name;
  const logDir = join(RESULTS_DIR, 'logs', name);
  rmSync(logDir, { recursive: true, force: true });
  mkdirSync(logDir, { recursive: true });
  const cluster = await startCluster(clusterOptions);
  const connectionString = cluster.connectionString;
  const pool = new pg.Pool({ connectionString, application_name: 'harness', max: 4, connectionTimeoutMillis: 5000 });
  pool.on('error', () => {});
  const children: Child[] = [];
  const ackFile = join(logDir, 'acked.log');
  const query = async <R extends pg.QueryResultRow = any>(text: string, values?: unknown[]): Promise<R[]> =>
    (await pool.query<R>(text.replaceAll('{{schema}}', `"${schema}"`), values)).rows;
  let sampler: Sampler | undefined;
  let client: Client | undefined;
  let inspector: Inspector | undefined;
  const deferred: (() => unknown)[] = [];

  try {
    await migrate({ connectionString, schema });
    await query(ORACLE_SQL);
  } catch (err) {
    await pool.end().catch(() => {});
    cluster.destroy();
    throw err;
  }

  const spawnChild = async (spec: SpawnSpec, waitReady: boolean): Promise<Child> => {
    const script = join(HERE, 'children', `${spec.role}.ts`);
    const errFd = openSync(join(logDir, `${spec.name}.stderr.log`), 'a');
    const args = [...(spec.wrap ?? []), process.execPath, '--import', 'tsx', script];
    const proc = spawn(args.shift() ?? process.execPath, args, {
      cwd: REPO,
      env: { ...process.env, NODE_TEST_CONTEXT: undefined, DATABASE_URL: connectionString, SCHEMA: schema, ...spec.env },
      stdio: ['ignore', 'pipe', errFd],
    });
    closeSync(errFd);
    const child = new Child(spec.name, spec.role, proc, spec);
    children.push(child);
    if (waitReady) await child.waitEvent((e) => e.event === 'ready', 60_000, 'ready');
    return child;
  };

  const h: Harness = {
    name,
    schema,
    cluster,
    connectionString,
    pool,
    ackFile,
    logDir,
    children,
    query,

    get client() {
      return (client ??= new Client({ connectionString, schema }));
    },

    get inspector() {
      return (inspector ??= new Inspector({ connectionString, schema }));
    },

    async one(text, values) {
      const [row] = await query(text, values);
      if (row === undefined) throw new Error(`no row from: ${text.slice(0, 80)}`);
      return row;
    },

    async dbNow() {
      return (await query<{ now: Date }>('SELECT clock_timestamp() AS now'))[0]!.now;
    },

    spawnWorker(workerName, opts = {}) {
      const profile = { ...FAST, ...opts.profile };
      const env: Record<string, string> = {
        WORKER: workerName,
        PROFILE: JSON.stringify(profile),
        CONCURRENCY: String(opts.concurrency ?? 4),
        SLEEP_MIN: String(opts.sleepMin ?? 200),
        SLEEP_MAX: String(opts.sleepMax ?? 800),
      };
      if (opts.ignoreAbort) env.IGNORE_ABORT = '1';
      Object.assign(env, opts.env);
      return spawnChild({ name: workerName, role: 'worker', env, ...(opts.wrap ? { wrap: opts.wrap } : {}) }, opts.waitReady ?? true);
    },

    spawnWorkers(names, opts) {
      const all = typeof names === 'number' ? Array.from({ length: names }, (_, i) => `w${i + 1}`) : names;
      return Promise.all(all.map((n) => h.spawnWorker(n, opts)));
    },

    spawnProducer(opts, producerName = 'producer') {
      const env: Record<string, string> = {
        ACK_FILE: ackFile,
        COUNT: String(opts.count),
        RATE: String(opts.rate),
        INFLIGHT: String(opts.inflight ?? 4),
        TYPE: opts.type ?? 'tx',
        MAX_RETRY: String(opts.maxRetry ?? 3),
        SCHEDULED: String(opts.scheduled ?? 0),
      };
      if (opts.msMin !== undefined) {
        env.MS_MIN = String(opts.msMin);
        env.MS_MAX = String(opts.msMax ?? opts.msMin);
      }
      Object.assign(env, opts.env);
      return spawnChild({ name: producerName, role: 'producer', env }, true);
    },

    async respawn(child) {
      return spawnChild(child.spec, true);
    },

    signal(child, signal) {
      if (!child.alive) return;
      child.signals.push(signal);
      process.kill(child.pid, signal);
    },

    async enqueue(type, payload, opts = {}) {
      const info = await h.client.enqueue(new Task(type, payload), { maxRetry: opts.maxRetry ?? 3, retention: 3_600_000 });
      return info.id;
    },

    async enqueueAcked(tasks, opts) {
      const infos = await h.client.enqueueMany(tasks, opts);
      h.ack(infos.map((t) => t.id));
      return infos;
    },

    ack(ids) {
      appendFileSync(ackFile, `${ids.join('\n')}\n`);
    },

    async terminate(like, opts = {}) {
      const rows = await query<{ ok: boolean }>(
        `SELECT pg_terminate_backend(pid) AS ok FROM pg_stat_activity
         WHERE application_name LIKE $1 AND pid <> pg_backend_pid() AND ($2::bool IS NOT TRUE OR state = 'idle')`,
        [like, opts.idleOnly ?? false],
      );
      return rows.filter((r) => r.ok).length;
    },

    ackedIds() {
      if (!existsSync(ackFile)) return [];
      return readFileSync(ackFile, 'utf8').split('\n').filter(Boolean);
    },

    startSampler() {
      sampler ??= startStuckSampler({ query });
    },

    async stopSampler() {
      await sampler?.stop();
      sampler = undefined;
    },

    async waitDrained(timeoutMs = 60_000) {
      await waitFor(
        async () => {
          if (children.some((c) => c.role === 'producer' && c.alive)) return false;
          const [row] = await query<{ n: number }>("SELECT count(*)::int AS n FROM {{schema}}.tasks WHERE state NOT IN ('completed', 'archived')").catch(() => [
            { n: -1 },
          ]);
          return row?.n === 0;
        },
        timeoutMs,
        'the queue to drain',
        250,
      );
    },

    async settle(drainTimeoutMs = 60_000) {
      await h.waitDrained(drainTimeoutMs);
      await sleep(700); // the workers' last metrics lines
      await h.stopSampler();
    },

    async openStarts() {
      const rows = await query<{ worker: string; n: number }>(`
        SELECT s.worker, count(*)::int AS n FROM {{schema}}.h_exec s
        WHERE s.phase = 'start' AND NOT EXISTS (SELECT 1 FROM {{schema}}.h_exec e WHERE e.attempt = s.attempt AND e.phase <> 'start')
          AND NOT EXISTS (SELECT 1 FROM {{schema}}.h_effects f WHERE f.attempt = s.attempt)
        GROUP BY s.worker`);
      return Object.fromEntries(rows.map((r) => [r.worker, r.n]));
    },

    async trackRecovery(serverId, timeoutMs = 30_000) {
      const t0 = performance.now();
      const held = await query<{ queue: string; id: string }>("SELECT queue, id FROM {{schema}}.tasks WHERE state = 'active' AND lease_owner = $1", [serverId]);
      const queues = held.map((r) => r.queue);
      const ids = held.map((r) => r.id);
      await waitFor(
        async () => {
          const [row] = await query<{ n: number }>(
            `SELECT count(*)::int AS n FROM {{schema}}.tasks t JOIN unnest($1::text[], $2::text[]) AS h(queue, id) USING (queue, id)
             WHERE t.state = 'active' AND t.lease_owner = $3`,
            [queues, ids, serverId],
          ).catch(() => [{ n: -1 }]);
          return row?.n === 0;
        },
        timeoutMs,
        `recovery of ${ids.length} tasks held by ${serverId}`,
        100,
      );
      return Math.round((performance.now() - t0) / 100) / 10;
    },

    check: (opts) => runChecks(query, h.ackedIds(), opts),
    checkUnique: () => checkUnique(query),
    checkCron: () => checkCron(query),
    figures: (test, c, extra) => figuresOf(test, c, (key) => h.metricSum(key), extra),

    lines() {
      return children.flatMap((w) => {
        const serverId = w.serverId;
        return w.events.map((e) => ({ ...e, worker: w.name, serverId }));
      });
    },

    unexpectedExits(allowedCodes = []) {
      return children.filter((c) => c.unexpectedExit(allowedCodes)).map((c) => `${c.tag} exited ${c.exitInfo?.code ?? c.exitInfo?.signal}`);
    },

    metricSum(key) {
      return children.reduce((n, c) => n + (c.metrics?.[key] ?? 0), 0);
    },

    defer(fn) {
      deferred.push(fn);
    },

    async teardown() {
      void sampler?.stop(); // not awaited: the database may be paused
      for (const c of children) {
        if (c.alive) {
          c.signals.push('SIGKILL');
          try {
            process.kill(c.pid, 'SIGCONT');
            process.kill(c.pid, 'SIGKILL');
          } catch {
            // already gone
          }
        }
      }
      await Promise.race([Promise.all(children.map((c) => c.exited)), sleep(5000)]);
      for (const fn of deferred.splice(0)) await Promise.resolve(fn()).catch(() => {});
      await client?.close().catch(() => {});
      await inspector?.close().catch(() => {});
      await pool.end().catch(() => {});
      cluster.destroy();
    },
  };
  return h;
}

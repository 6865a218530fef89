/**
 * The fault suite's harness (reliability plan §5.1): per test, a throwaway
 * cluster, a migrated schema with the oracle tables beside it, child
 * processes (workers, producers) it spawns, signals and respawns, an
 * acknowledgement log kept outside the database, a sampler for I4, the
 * invariant checks I1–I6 (I7, I8 for other tests) in SQL, and one JSON line
 * of figures per test in results/reliability-results.jsonl.
 *
 *   const h = await createHarness('f01');
 *   const w1 = await h.spawnWorker('w1');
 *   const p = await h.spawnProducer({ count: 300, rate: 30 });
 *   h.startSampler();
 *   ...inject faults...
 *   await h.waitDrained();
 *   const c = await h.check({ maxRetry: 3 });
 *   recordFigures(h.figures('F01 …', c, { recovery_s: … }));
 *   assert.deepEqual(assertInvariants(c, { maxRetry: 3, unexpected: h.unexpectedExits() }), []);
 *   await h.teardown(); // in after(): kills every child, destroys the cluster
 *
 * Oracle tables, in the test schema (plan §5.1, with two changes):
 *   - task_id is text: pgasynq's task ids are text (UUIDs by default).
 *   - h_exec and h_effects carry `attempt`, a UUID the handler draws per
 *     execution, because the handler cannot see its lease token (TaskContext
 *     does not expose it). The handler reads the token from the row at start
 *     (`lease_owner` = its server's id) into h_exec.lease_token, and inside
 *     ctx.transaction (where the library has locked the row under this
 *     lease's token) into h_effects.lease_token.
 *
 * I5 ("the effect was written by the lease that completed it"): the plan
 * compares h_effects.lease_token with a `completed_token` column, but
 * pgasynq clears lease_token when it completes a task and keeps no copy
 * (migrations/0001_initial.up.sql). So I5 is checked on the oracle's side:
 * every h_effects row's token must equal the token its own attempt was given
 * at claim (its h_exec 'start' row). A zombie whose transaction got through
 * under someone else's lease would show up as a mismatch (or a null token).
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { appendFileSync, closeSync, existsSync, mkdirSync, openSync, readFileSync, rmSync } from 'node:fs';
import { join } from 'node:path';
import { createInterface } from 'node:readline';
import { fileURLToPath } from 'node:url';
import pg from 'pg';
import { Client, migrate, Task } from '../../src/index.js';
import { startCluster, type Cluster, type ClusterOptions } from './cluster.js';

const HERE = fileURLToPath(new URL('.', import.meta.url));
const REPO = fileURLToPath(new URL('../..', import.meta.url));
export const RESULTS_DIR = join(HERE, 'results');
export const RESULTS_FILE = join(RESULTS_DIR, 'reliability-results.jsonl');

/**
 * The fast profile (plan §5.0), in the Server's option names. The forwarder
 * checks every 500 ms and retries wait 0.5–1 s (jittered), so rescued tasks
 * come back quickly (both only shorten the tests, not the bounds under test).
 */
export const FAST = {
  leaseDuration: 3000,
  heartbeatInterval: 1000,
  recoverCutoff: 2000,
  recoverInterval: 1000,
  taskCheckInterval: 1000,
  delayedTaskCheckInterval: 500,
  shutdownTimeout: 6000,
  retryDelayMs: 500,
} as const;
export type Profile = { [K in keyof typeof FAST]: number };

/** B = L + C + R + 1 s of statement slack, from the last successful heartbeat (plan §5.0). */
export const BOUND_S = (FAST.leaseDuration + FAST.recoverCutoff + FAST.recoverInterval) / 1000 + 1;
/** The oracle allows 1 s of scheduler jitter on top of B. */
export const ORACLE_BOUND_S = BOUND_S + 1;

/** The plan's figure fields, in order; tests may add their own after them. */
export interface Figures {
  test: string;
  profile: string;
  tasks: number;
  lost: number;
  dup_effects: number;
  orphan_effects: number;
  dup_external: number;
  max_attempts_seen: number;
  stuck_max_s: number | null;
  recovery_s: number | number[] | null;
  leases_lost: number | null;
  fenced_rejections: number | null;
  deadlocks: number | null;
  p50_ms: number | null;
  p99_ms: number | null;
  notes: string;
  [extra: string]: unknown;
}

const FIELDS = [
  'test',
  'profile',
  'tasks',
  'lost',
  'dup_effects',
  'orphan_effects',
  'dup_external',
  'max_attempts_seen',
  'stuck_max_s',
  'recovery_s',
  'leases_lost',
  'fenced_rejections',
  'deadlocks',
  'p50_ms',
  'p99_ms',
  'notes',
] as const;

/** Appends one JSON line per test to results/reliability-results.jsonl, plan fields first. */
export function recordFigures(obj: Partial<Figures> & { test: string }): void {
  mkdirSync(RESULTS_DIR, { recursive: true });
  const line: Record<string, unknown> = {};
  for (const f of FIELDS) line[f] = obj[f] ?? (f === 'notes' ? '' : f === 'profile' ? 'fast' : null);
  for (const [k, v] of Object.entries(obj)) if (!(k in line)) line[k] = v;
  appendFileSync(RESULTS_FILE, `${JSON.stringify(line)}\n`);
}

export interface WorkerMetrics {
  claimed: number;
  fencedWrites: number;
  leasesLost: number;
  recovered: number;
  archivedByRecoverer: number;
  loopLagMaxMs: number;
}

/** A process the harness spawned. */
export class Child {
  readonly events: Record<string, any>[] = [];
  /** The latest metrics line (workers print one every 500 ms and at exit). */
  metrics: WorkerMetrics | undefined;
  /** Set once it exited: its code and signal. */
  exitInfo: { code: number | null; signal: NodeJS.Signals | null } | undefined;
  /** Signals the harness sent (a SIGKILL'd child is expected to die). */
  readonly signals: NodeJS.Signals[] = [];
  readonly exited: Promise<{ code: number | null; signal: NodeJS.Signals | null }>;
  readonly #waiters: { pred: (e: Record<string, any>) => boolean; resolve: (e: Record<string, any>) => void }[] = [];

  constructor(
    readonly name: string,
    readonly role: 'worker' | 'producer',
    readonly proc: ChildProcess,
    readonly spec: SpawnSpec,
  ) {
    this.exited = new Promise((resolve) => {
      proc.on('exit', (code, signal) => {
        this.exitInfo = { code, signal };
        resolve(this.exitInfo);
      });
    });
    createInterface({ input: proc.stdout! }).on('line', (line) => {
      let e: Record<string, any>;
      try {
        e = JSON.parse(line);
      } catch {
        return;
      }
      // When the harness read it, on its own clock: against a child's hostNow, the child's skew.
      e.receivedAt = Date.now();
      this.events.push(e);
      if (e.event === 'metrics') this.metrics = e as unknown as WorkerMetrics;
      for (const w of [...this.#waiters]) {
        if (w.pred(e)) {
          this.#waiters.splice(this.#waiters.indexOf(w), 1);
          w.resolve(e);
        }
      }
    });
  }

  get pid(): number {
    return this.proc.pid!;
  }

  /** The tag its rows carry in h_exec / h_effects. */
  get tag(): string {
    return `${this.name}:${this.pid}`;
  }

  get alive(): boolean {
    return this.exitInfo === undefined;
  }

  /** The server id (lease_owner) a worker reported when ready. */
  get serverId(): string | undefined {
    return this.events.find((e) => e.event === 'ready')?.serverId;
  }

  /** Resolves with the first event (already seen or to come) that matches; rejects after timeoutMs or if the child exits first. */
  waitEvent(pred: (e: Record<string, any>) => boolean, timeoutMs = 20_000, what = 'event'): Promise<Record<string, any>> {
    const seen = this.events.find(pred);
    if (seen) return Promise.resolve(seen);
    return new Promise((resolve, reject) => {
      const timer = setTimeout(() => reject(new Error(`${this.name}: no ${what} within ${timeoutMs} ms`)), timeoutMs);
      const entry = {
        pred,
        resolve: (e: Record<string, any>) => {
          clearTimeout(timer);
          resolve(e);
        },
      };
      this.#waiters.push(entry);
      void this.exited.then((x) => {
        clearTimeout(timer);
        reject(new Error(`${this.name} exited (${x.code ?? x.signal}) before ${what}`));
      });
    });
  }

  /** An exit the harness did not cause and the test did not allow for. */
  unexpectedExit(allowedCodes: readonly number[] = []): boolean {
    if (!this.exitInfo) return false;
    const { code, signal } = this.exitInfo;
    if (signal !== null) return !this.signals.includes(signal);
    if (code === 0) return !this.signals.includes('SIGTERM') && this.role !== 'producer';
    return !allowedCodes.includes(code!);
  }
}

export interface SpawnSpec {
  name: string;
  role: 'worker' | 'producer';
  env: Record<string, string>;
  /** A command put in front of node (`ip netns exec <ns>`, which execs in place: the pid stays node's). */
  wrap?: string[];
}

export interface WorkerOptions {
  concurrency?: number;
  profile?: Partial<Profile>;
  sleepMin?: number;
  sleepMax?: number;
  ignoreAbort?: boolean;
  /** Wait for the ready line (default true). */
  waitReady?: boolean;
  /** More environment for the process (a preloaded libfaketime, say). */
  env?: Record<string, string>;
  /** A command to run the worker under, one that execs it in place (netns.ts: `ip netns exec <ns>`). */
  wrap?: string[];
}

export interface ProducerOptions {
  count: number;
  /** Tasks per second; 0: as fast as `inflight` allows. */
  rate: number;
  inflight?: number;
  type?: string;
  maxRetry?: number;
  /** Share of tasks (0–1) enqueued 0.5–2 s ahead, their due time recorded for I6. */
  scheduled?: number;
  /** Each task's handler sleeps a duration drawn from [msMin, msMax] ms. */
  msMin?: number;
  msMax?: number;
  /** More environment for the process (CLIENT_POOL=user, say). */
  env?: Record<string, string>;
}

/** What check() finds (plan §5.1, I1–I5). */
export interface Checks {
  /** Rows in tasks. */
  tasks: number;
  acked: number;
  /** I1: acknowledged ids missing from tasks. */
  lost: number;
  /** Tasks not yet completed or archived (must be 0 after a drain). */
  unfinished: number;
  /** Archived with retries left: archived not by design. */
  archivedEarly: number;
  states: Record<string, number>;
  /** I2 */
  dupEffects: number;
  orphanEffects: number;
  missingEffects: number;
  /** Tasks executed more than once (external effects are at-least-once). */
  dupExternal: number;
  /** I3 */
  maxAttempts: number;
  overRetried: number;
  /** I5 */
  tokenMismatches: number;
  /** I6: executions that started before their task's requested due time, of `scheduled` such tasks. */
  earlyStarts: number;
  scheduled: number;
  /** I4: from the sampler. */
  stuckMaxS: number | null;
  stuckSamples: number;
  samples: number;
  /** I7, from the sampler. */
  uniqViolations: number;
  deadlocks: number | null;
  /** Pickup latency: first execution start − enqueue, DB clock. */
  p50Ms: number | null;
  p99Ms: number | null;
}

export interface Harness {
  name: string;
  schema: string;
  cluster: Cluster;
  connectionString: string;
  pool: pg.Pool;
  ackFile: string;
  logDir: string;
  children: Child[];
  /** SQL with `{{schema}}` replaced by the quoted test schema. */
  query<R extends pg.QueryResultRow = any>(text: string, values?: unknown[]): Promise<R[]>;
  /** The first row of query() (a statement that always returns one, such as an aggregate). */
  one<R extends pg.QueryResultRow = any>(text: string, values?: unknown[]): Promise<R>;
  /** The database clock (clock_timestamp()), for comparing with oracle rows. */
  dbNow(): Promise<Date>;
  spawnWorker(name: string, opts?: WorkerOptions): Promise<Child>;
  spawnProducer(opts: ProducerOptions, name?: string): Promise<Child>;
  /** Spawns a child again with the same spec (a new pid). */
  respawn(child: Child): Promise<Child>;
  signal(child: Child, signal: NodeJS.Signals): void;
  /** Enqueues directly (not through the ack log), retention kept. */
  enqueue(type: string, payload: unknown, opts?: { maxRetry?: number }): Promise<string>;
  /** Terminates backends whose application_name matches LIKE; `idleOnly` spares those running a statement. */
  terminate(applicationNameLike: string, opts?: { idleOnly?: boolean }): Promise<number>;
  ackedIds(): string[];
  startSampler(): void;
  stopSampler(): Promise<void>;
  /** Waits until no task is pending, active, scheduled or retry (and the producers are done). */
  waitDrained(timeoutMs?: number): Promise<void>;
  /** Execution starts not yet ended, aborted or fenced, by worker tag. */
  openStarts(): Promise<Record<string, number>>;
  /**
   * Measures recovery: resolves with the seconds from now until every task
   * that `serverId` holds active now has left that state (plan's recovery_s).
   */
  trackRecovery(serverId: string, timeoutMs?: number): Promise<number>;
  check(opts: { maxRetry: number; txTypes?: string[] }): Promise<Checks>;
  /** I7, now: unique keys with more than one live (pending, scheduled, active, retry) task. */
  checkUnique(): Promise<number>;
  /**
   * I8, now: scheduler ticks recorded twice (the primary key of scheduler_events forbids it; checked
   * anyway) and tasks that two ticks claim as theirs.
   */
  checkCron(): Promise<{ doubleFires: number; sharedTasks: number }>;
  /** The plan's figure fields from a check, plus worker metrics summed over every child. */
  figures(test: string, c: Checks, extra?: Partial<Figures>): Figures;
  /** Children that died in a way nobody asked for. */
  unexpectedExits(allowedCodes?: readonly number[]): string[];
  /** Sum of a metric over every worker's last metrics line. */
  metricSum(key: keyof WorkerMetrics): number;
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

const ORACLE_SQL = `
-- business effect written INSIDE ctx.transaction (must be exactly once); deliberately NO unique constraint,
-- so a bug shows up as a countable duplicate rather than as a constraint error that hides it
CREATE TABLE {{schema}}.h_effects (task_id text NOT NULL, lease_token uuid, attempt uuid NOT NULL, worker text NOT NULL,
  at timestamptz NOT NULL DEFAULT clock_timestamp());
-- "external" effects, autocommitted by the handler (at-least-once by design); 'fenced' = ctx.transaction
-- refused with LeaseExpiredError (detail 'local': known lost before the call, 'db': refused by the token)
CREATE TABLE {{schema}}.h_exec (id bigserial PRIMARY KEY, task_id text NOT NULL, lease_token uuid, attempt uuid NOT NULL,
  worker text NOT NULL, phase text NOT NULL CHECK (phase IN ('start', 'end', 'abort', 'fenced')), detail text,
  at timestamptz NOT NULL DEFAULT clock_timestamp());
CREATE INDEX ON {{schema}}.h_exec (task_id);
CREATE INDEX ON {{schema}}.h_exec (attempt);
-- the requested due time of tasks enqueued for later (database clock), for I6
CREATE TABLE {{schema}}.h_sched (task_id text PRIMARY KEY, process_at timestamptz NOT NULL);
-- stuck-active / uniqueness samples taken every 500 ms by the harness
CREATE TABLE {{schema}}.h_samples (at timestamptz NOT NULL DEFAULT clock_timestamp(), stuck int NOT NULL,
  stuck_max_s double precision, uniq_violations int NOT NULL);
`;

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
  let sampler: NodeJS.Timeout | undefined;
  let sampling: Promise<unknown> = Promise.resolve();
  let client: Client | undefined;
  const L = FAST.leaseDuration / 1000;

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
      client ??= new Client({ connectionString, schema });
      const info = await client.enqueue(new Task(type, payload), { maxRetry: opts.maxRetry ?? 3, retention: 3_600_000 });
      return info.id;
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
      if (sampler) return;
      // I4 (plan §5.1): count of active rows whose lease expired more than C + R + 1 s ago, and the
      // longest time since any active row's last extension (now − lease_expires_at + L); I7 beside it.
      const stmt = `
        INSERT INTO {{schema}}.h_samples (stuck, stuck_max_s, uniq_violations)
        SELECT count(*) FILTER (WHERE lease_expires_at < now() - make_interval(secs => $1)),
               max(extract(epoch FROM clock_timestamp() - lease_expires_at))::float8 + $2,
               (SELECT count(*) FROM (SELECT queue, unique_key FROM {{schema}}.tasks
                 WHERE unique_key IS NOT NULL AND state IN ('pending', 'scheduled', 'active', 'retry')
                 GROUP BY 1, 2 HAVING count(*) > 1) d)
        FROM {{schema}}.tasks WHERE state = 'active'`;
      const secs = (FAST.recoverCutoff + FAST.recoverInterval) / 1000 + 1;
      let busy = false;
      sampler = setInterval(() => {
        if (busy) return;
        busy = true;
        // The database may be down (F09): a missed sample is not an error.
        sampling = query(stmt, [secs, L])
          .catch(() => {})
          .finally(() => (busy = false));
      }, 500);
    },

    async stopSampler() {
      clearInterval(sampler);
      sampler = undefined;
      await sampling;
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

    async check({ maxRetry, txTypes = ['tx', 'block'] }) {
      const acked = h.ackedIds();
      const one = async (text: string, values?: unknown[]): Promise<any> => (await query(text, values))[0];
      const { tasks } = await one('SELECT count(*)::int AS tasks FROM {{schema}}.tasks');
      const { lost } = await one(
        'SELECT count(*)::int AS lost FROM unnest($1::text[]) AS a(id) WHERE NOT EXISTS (SELECT 1 FROM {{schema}}.tasks t WHERE t.id = a.id)',
        [acked],
      );
      const states = Object.fromEntries(
        (await query<{ state: string; n: number }>('SELECT state, count(*)::int AS n FROM {{schema}}.tasks GROUP BY 1 ORDER BY 1')).map((r) => [r.state, r.n]),
      );
      const { unfinished } = await one("SELECT count(*)::int AS unfinished FROM {{schema}}.tasks WHERE state NOT IN ('completed', 'archived')");
      const { archived_early } = await one("SELECT count(*)::int AS archived_early FROM {{schema}}.tasks WHERE state = 'archived' AND retried < max_retry");
      const { dup } = await one('SELECT count(*)::int AS dup FROM (SELECT task_id FROM {{schema}}.h_effects GROUP BY 1 HAVING count(*) > 1) d');
      const { orphan } = await one(
        "SELECT count(*)::int AS orphan FROM {{schema}}.h_effects e WHERE NOT EXISTS (SELECT 1 FROM {{schema}}.tasks t WHERE t.id = e.task_id AND t.state = 'completed')",
      );
      const { missing } = await one(
        "SELECT count(*)::int AS missing FROM {{schema}}.tasks t WHERE t.state = 'completed' AND t.type = ANY($1) AND NOT EXISTS (SELECT 1 FROM {{schema}}.h_effects e WHERE e.task_id = t.id)",
        [txTypes],
      );
      const { dup_external, max_attempts } = await one(`
        SELECT count(*) FILTER (WHERE n > 1)::int AS dup_external, coalesce(max(n), 0)::int AS max_attempts
        FROM (SELECT task_id, count(DISTINCT attempt) AS n FROM {{schema}}.h_exec WHERE phase = 'start' GROUP BY 1) x`);
      const { over } = await one('SELECT count(*)::int AS over FROM {{schema}}.tasks WHERE retried > max_retry OR retried > $1', [maxRetry]);
      const { mismatch } = await one(`
        SELECT count(*)::int AS mismatch FROM {{schema}}.h_effects e
        WHERE e.lease_token IS NULL OR NOT EXISTS (
          SELECT 1 FROM {{schema}}.h_exec x WHERE x.attempt = e.attempt AND x.phase = 'start' AND x.lease_token = e.lease_token)`);
      const early = await one(`
        SELECT (SELECT count(*)::int FROM {{schema}}.h_exec x JOIN {{schema}}.h_sched d USING (task_id) WHERE x.phase = 'start' AND x.at < d.process_at) AS early,
               (SELECT count(*)::int FROM {{schema}}.h_sched) AS scheduled`);
      const s = await one(
        'SELECT max(stuck_max_s)::float8 AS stuck_max_s, coalesce(max(stuck), 0)::int AS stuck, coalesce(max(uniq_violations), 0)::int AS uniq, count(*)::int AS samples FROM {{schema}}.h_samples',
      );
      const { deadlocks } = await one('SELECT deadlocks::int FROM pg_stat_database WHERE datname = current_database()');
      const lat = await one(`
        SELECT percentile_cont(0.5) WITHIN GROUP (ORDER BY ms)::float8 AS p50, percentile_cont(0.99) WITHIN GROUP (ORDER BY ms)::float8 AS p99
        FROM (SELECT extract(epoch FROM min(x.at) - t.enqueued_at) * 1000 AS ms
              FROM {{schema}}.h_exec x JOIN {{schema}}.tasks t ON t.id = x.task_id WHERE x.phase = 'start' GROUP BY t.id, t.enqueued_at) l`);
      const round = (v: number | null, d = 1) => (v === null ? null : Math.round(v * 10 ** d) / 10 ** d);
      return {
        tasks,
        acked: acked.length,
        lost,
        unfinished,
        archivedEarly: archived_early,
        states,
        dupEffects: dup,
        orphanEffects: orphan,
        missingEffects: missing,
        dupExternal: dup_external,
        maxAttempts: max_attempts,
        overRetried: over,
        tokenMismatches: mismatch,
        earlyStarts: early.early,
        scheduled: early.scheduled,
        stuckMaxS: round(s.stuck_max_s),
        stuckSamples: s.stuck,
        samples: s.samples,
        uniqViolations: s.uniq,
        deadlocks,
        p50Ms: round(lat.p50, 0),
        p99Ms: round(lat.p99, 0),
      };
    },

    async checkUnique() {
      return (
        await h.one<{ n: number }>(`SELECT count(*)::int AS n FROM (SELECT queue, unique_key FROM {{schema}}.tasks
          WHERE unique_key IS NOT NULL AND state IN ('pending', 'scheduled', 'active', 'retry') GROUP BY 1, 2 HAVING count(*) > 1) d`)
      ).n;
    },

    async checkCron() {
      return h.one<{ doubleFires: number; sharedTasks: number }>(`
        SELECT (SELECT count(*)::int FROM (SELECT entry_id, tick_at FROM {{schema}}.scheduler_events GROUP BY 1, 2 HAVING count(*) > 1) d) AS "doubleFires",
               (SELECT count(*)::int FROM (SELECT task_id FROM {{schema}}.scheduler_events GROUP BY 1 HAVING count(*) > 1) d) AS "sharedTasks"`);
    },

    figures(test, c, extra = {}) {
      return {
        test,
        profile: 'fast',
        tasks: c.tasks,
        lost: c.lost,
        dup_effects: c.dupEffects,
        orphan_effects: c.orphanEffects,
        dup_external: c.dupExternal,
        max_attempts_seen: c.maxAttempts,
        stuck_max_s: c.stuckMaxS,
        recovery_s: null,
        leases_lost: h.metricSum('leasesLost'),
        fenced_rejections: h.metricSum('fencedWrites'),
        deadlocks: c.deadlocks,
        p50_ms: c.p50Ms,
        p99_ms: c.p99Ms,
        notes: '',
        acked: c.acked,
        unfinished: c.unfinished,
        missing_effects: c.missingEffects,
        token_mismatches: c.tokenMismatches,
        early_starts: c.earlyStarts,
        scheduled: c.scheduled,
        states: c.states,
        ...extra,
      };
    },

    unexpectedExits(allowedCodes = []) {
      return children.filter((c) => c.unexpectedExit(allowedCodes)).map((c) => `${c.tag} exited ${c.exitInfo?.code ?? c.exitInfo?.signal}`);
    },

    metricSum(key) {
      return children.reduce((n, c) => n + (c.metrics?.[key] ?? 0), 0);
    },

    async teardown() {
      clearInterval(sampler);
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
      await client?.close().catch(() => {});
      await pool.end().catch(() => {});
      cluster.destroy();
    },
  };
  return h;
}

/** Asserts I1–I5 (and that no child died unasked), with messages that show the figures. */
export function assertInvariants(c: Checks, opts: { maxRetry: number; stuckBoundS?: number; unexpected?: string[] }): string[] {
  const problems: string[] = [];
  if (c.lost !== 0) problems.push(`I1: ${c.lost} acknowledged tasks lost`);
  if (c.unfinished !== 0) problems.push(`I1: ${c.unfinished} tasks not completed or archived after the drain`);
  if (c.archivedEarly !== 0) problems.push(`I1: ${c.archivedEarly} tasks archived with retries left`);
  if (c.dupEffects !== 0) problems.push(`I2: ${c.dupEffects} tasks with duplicate transactional effects`);
  if (c.orphanEffects !== 0) problems.push(`I2: ${c.orphanEffects} effects of tasks that are not completed`);
  if (c.missingEffects !== 0) problems.push(`I2: ${c.missingEffects} completed tasks without their effect`);
  if (c.maxAttempts > opts.maxRetry + 1) problems.push(`I3: a task ran ${c.maxAttempts} times (max ${opts.maxRetry + 1})`);
  if (c.overRetried !== 0) problems.push(`I3: ${c.overRetried} tasks with retried > max_retry`);
  if (c.earlyStarts !== 0) problems.push(`I6: ${c.earlyStarts} executions started before their task was due`);
  if (c.tokenMismatches !== 0) problems.push(`I5: ${c.tokenMismatches} effects committed under another attempt's lease`);
  const bound = opts.stuckBoundS ?? ORACLE_BOUND_S;
  if (c.stuckMaxS !== null && c.stuckMaxS > bound) problems.push(`I4: a task stayed active ${c.stuckMaxS} s after its last extension (bound ${bound} s)`);
  if (c.uniqViolations !== 0) problems.push(`I7: ${c.uniqViolations} unique keys with two live tasks`);
  for (const u of opts.unexpected ?? []) problems.push(`process: ${u}`);
  return problems;
}

/**
 * The scenarios the workflow tests (F32, F32b) and the limit tests (F33,
 * F33b) share:
 *
 *   - workflows: the completion and release log (wf_done, wf_rel) and the
 *     fan-in groups (g{g}-d{i} dependencies, one g{g}-fin dependent);
 *   - limits: the claim log (lim_claims), every task enqueued before the
 *     limits are set and the workers start, and the sampler of the limited
 *     queues' active tasks;
 *   - handlerCalls: every handler call as the workers said it (REPORT_EXEC);
 *   - syncCommitRuns: the two runs of a b-test, a control whose workers'
 *     Server runs on a pool with synchronous_commit = on and the library's
 *     own pool, each crashed by walHeldCrashes() and drained, then checked.
 */
import { Task, type EnqueueCallOptions, type QueueLimits } from '../../src/index.js';
import type { Checks } from './checks.js';
import { walHeldCrashes } from './crashes.js';
import { assertInvariants, recordFigures, sleep, type Child, type Figures, type Harness, type WorkerOptions } from './harness.js';
import { faultTest, logTrigger } from './kit.js';
import { poll } from './samplers.js';

/**
 * wf_done: every completion; wf_rel: every way out of `waiting`. Each row is
 * written by the transaction that makes the change (its id in `xid`), so a
 * change lost with a crashed transaction is lost with its row, and one that
 * commits twice shows as two rows.
 */
export const WORKFLOW_LOG_SQL = [
  logTrigger({
    name: 'wf_done',
    table: '{{schema}}.wf_done (seq bigint NOT NULL, xid xid8 NOT NULL DEFAULT pg_current_xact_id(), at timestamptz NOT NULL DEFAULT clock_timestamp())',
    insert: 'INSERT INTO {{schema}}.wf_done (seq) VALUES (NEW.seq)',
    on: 'AFTER UPDATE OF state ON {{schema}}.task_states',
    when: "NEW.state = 'completed' AND OLD.state IS DISTINCT FROM 'completed'",
  }),
  logTrigger({
    name: 'wf_rel',
    table:
      '{{schema}}.wf_rel (seq bigint NOT NULL, state text NOT NULL, xid xid8 NOT NULL DEFAULT pg_current_xact_id(), at timestamptz NOT NULL DEFAULT clock_timestamp())',
    insert: 'INSERT INTO {{schema}}.wf_rel (seq, state) VALUES (NEW.seq, NEW.state)',
    on: 'AFTER UPDATE OF state ON {{schema}}.task_states',
    when: "OLD.state = 'waiting' AND NEW.state IS DISTINCT FROM 'waiting'",
  }),
].join('\n');

/** Fan-in group `g`: `fanin` dependencies g{g}-d{i} made by `dep`, then the dependent g{g}-fin made by `fin`, which depends on all of them. */
export function fanIn(g: number, fanin: number, dep: (id: string, i: number) => Task, fin: (id: string, deps: string[]) => Task) {
  const deps = Array.from({ length: fanin }, (_, i) => `g${g}-d${i}`);
  const id = `g${g}-fin`;
  return { id, deps, tasks: [...deps.map(dep), fin(id, deps)], edges: deps.map((d) => [id, d] as [string, string]) };
}

/**
 * lim_claims: every claim of a task (any way into `active`), logged in the claim's transaction;
 * with `counts`, with the queue's and the key's active tasks counted by a statement of its own after the claim's update.
 */
export function claimLogSql(counts: boolean): string {
  const countSql = `(SELECT count(*) FROM {{schema}}.task_states s WHERE s.queue = NEW.queue AND s.state = 'active'),
         CASE WHEN NEW.concurrency_key IS NOT NULL THEN
           (SELECT count(*) FROM {{schema}}.task_states s
            WHERE s.queue = NEW.queue AND s.state = 'active' AND s.concurrency_key = NEW.concurrency_key) END`;
  return logTrigger({
    name: 'lim_log_claim',
    table: `{{schema}}.lim_claims (seq bigint NOT NULL, queue text NOT NULL, ${counts ? 'key text, ' : ''}owner text, started_at timestamptz,
  at timestamptz NOT NULL DEFAULT clock_timestamp()${counts ? ', active_after int NOT NULL, key_active_after int' : ''})`,
    insert: counts
      ? `INSERT INTO {{schema}}.lim_claims (seq, queue, key, owner, started_at, active_after, key_active_after)
  SELECT NEW.seq, NEW.queue, NEW.concurrency_key, NEW.lease_owner, NEW.started_at,
         ${countSql}`
      : 'INSERT INTO {{schema}}.lim_claims (seq, queue, owner, started_at) VALUES (NEW.seq, NEW.queue, NEW.lease_owner, NEW.started_at)',
    on: 'AFTER UPDATE OF state ON {{schema}}.task_states',
    when: "NEW.state = 'active' AND OLD.state IS DISTINCT FROM 'active'",
  });
}

export interface LimitsSetup {
  /** The claim log with the active counts (F33) or without (F33b). */
  counts: boolean;
  tasks: Task[];
  enqueue?: EnqueueCallOptions;
  /** Tasks per enqueueMany (all at once by default). */
  batch?: number;
  /** Each queue's limits: they serve all these queues, weight 1 each. */
  limits: Record<string, Partial<QueueLimits>>;
  workers: { count: number; prefetch: number } & WorkerOptions;
}

/** The claim log, every task enqueued (acknowledged), then the limits, then the workers: the first claim already sees the limits. */
export async function setupLimits(h: Harness, o: LimitsSetup): Promise<Child[]> {
  await h.query(claimLogSql(o.counts));
  const batch = o.batch ?? o.tasks.length;
  for (let i = 0; i < o.tasks.length; i += batch) await h.enqueueAcked(o.tasks.slice(i, i + batch), o.enqueue);
  for (const [queue, limits] of Object.entries(o.limits)) await h.inspector.setQueueLimits(queue, limits);
  const { count, prefetch, ...opts } = o.workers;
  const queues = JSON.stringify(Object.fromEntries(Object.keys(o.limits).map((q) => [q, 1])));
  return h.spawnWorkers(count, { ...opts, env: { QUEUES: queues, PREFETCH: String(prefetch), ...opts.env } });
}

export interface LimitSamples {
  samples: number;
  failed: number;
  maxActive: Record<string, number>;
  maxPerKey: number;
  /** Most active tasks whose lease had already expired, in one sample: the dead, still counted. */
  maxExpired: number;
  lastAt: number;
}

/** Reads the active tasks of `queues` every `everyMs` until stopped (keys counted in `keyed`); a refused read (the outage) is counted, not fatal. */
export function startLimitSampler(h: Harness, queues: string[], keyed: string, everyMs: number): { stop(): Promise<LimitSamples> } {
  const s: LimitSamples = { samples: 0, failed: 0, maxActive: Object.fromEntries(queues.map((q) => [q, 0])), maxPerKey: 0, maxExpired: 0, lastAt: 0 };
  const sampler = poll(everyMs, async () => {
    const rows = await h
      .query<{ queue: string; key: string | null; expired: boolean }>(
        `SELECT queue, concurrency_key AS key, lease_expires_at < now() AS expired FROM {{schema}}.task_states
         WHERE state = 'active' AND queue = ANY($1)`,
        [queues],
      )
      .catch(() => undefined);
    if (rows === undefined) {
      s.failed++;
      return;
    }
    s.samples++;
    s.lastAt = performance.now();
    const perQueue = new Map<string, number>();
    const perKey = new Map<string, number>();
    for (const r of rows) {
      perQueue.set(r.queue, (perQueue.get(r.queue) ?? 0) + 1);
      if (r.queue === keyed && r.key !== null) perKey.set(r.key, (perKey.get(r.key) ?? 0) + 1);
    }
    for (const [q, n] of perQueue) s.maxActive[q] = Math.max(s.maxActive[q] ?? 0, n);
    for (const n of perKey.values()) s.maxPerKey = Math.max(s.maxPerKey, n);
    s.maxExpired = Math.max(s.maxExpired, rows.filter((r) => r.expired).length);
  });
  return {
    async stop() {
      await sampler.stop();
      return s;
    },
  };
}

/** One handler call, as its worker said it (REPORT_EXEC): its start, and when it returned or was told to stop (this host's clock). */
export interface HandlerCall {
  taskId: string;
  attempt: string;
  worker: string;
  serverId: string | undefined;
  start: number;
  finishedAt: number | undefined;
  abortedAt: number | undefined;
  abortReason: string | undefined;
}

/** Every handler call of every worker of the run. */
export function handlerCalls(h: Harness): HandlerCall[] {
  const lines = h.lines();
  const ends = new Map<string, Record<string, any>>();
  for (const e of lines) {
    const k = `${e.attempt}:${e.event}`;
    if (e.attempt && ['finished', 'aborted'].includes(e.event) && !ends.has(k)) ends.set(k, e);
  }
  return lines
    .filter((e) => e.event === 'started')
    .map((s) => {
      const aborted = ends.get(`${s.attempt}:aborted`);
      return {
        taskId: String(s.taskId),
        attempt: s.attempt,
        worker: s.worker,
        serverId: s.serverId,
        start: s.at,
        finishedAt: ends.get(`${s.attempt}:finished`)?.at,
        abortedAt: aborted?.at,
        abortReason: aborted?.reason,
      };
    });
}

export interface CrashedRun {
  c: Checks;
  restartMs: number[];
  crashedAt: number[];
  untargeted: number;
}

export interface SyncCommitRuns<R> {
  tag: string;
  /** The test's name, after its tag, in the library run's title. */
  name: string;
  /** What both runs check, at the end of their titles. */
  claim: string;
  /** The figures' test name, after the tag: `<tag> <figures>, library pool`. */
  figures: string;
  /** The library run's schema; the control's gets `_sync`. */
  schema: string;
  /** The scenario, for the figures' notes. */
  notes: string;
  maxRetry: number;
  crashes: number;
  downMs: number;
  gapMs: [number, number];
  /** Before the crashes: the log, the tasks, the workers (started with `workerEnv`). */
  start(h: Harness, workerEnv: Record<string, string>): Promise<void>;
  /** The crash comes as soon as this resolves (a handler start). */
  trigger(h: Harness, i: number): Promise<unknown>;
  /** After the drain and the check: what the run found. */
  analyze(h: Harness, run: CrashedRun): Promise<R>;
  extra(r: R & CrashedRun): Partial<Figures>;
  /** The assertions, given the run and I1–I5's problems. */
  check(r: R & CrashedRun, problems: string[]): void;
}

/**
 * The two runs of a b-test, each a test of its own: the control (the workers' Server on a pool of
 * 10 whose sessions commit with synchronous_commit = on), then the library's own pool.
 */
export function syncCommitRuns<R>(o: SyncCommitRuns<R>): void {
  const runs = [
    {
      env: { POOL_MAX: '10', POOL_SYNC_COMMIT: '1' },
      schema: `${o.schema}_sync`,
      title: `${o.tag} control: server sessions with synchronous_commit=on`,
      figures: 'sync commit (control)',
      notes: 'the Server on a pool of 10 with synchronous_commit=on',
    },
    {
      env: {} as Record<string, string>,
      schema: o.schema,
      title: `${o.tag} ${o.name}: the library own pool`,
      figures: 'library pool',
      notes: 'the Server on its own pool (synchronous_commit=off)',
    },
  ];
  for (const run of runs) {
    faultTest(`${run.title}; ${o.claim}`, { schema: run.schema, timeout: 180_000 }, async (h) => {
      await o.start(h, run.env);
      const crashes = await walHeldCrashes(h, { crashes: o.crashes, downMs: o.downMs, gapMs: o.gapMs, trigger: (k) => o.trigger(h, k) });
      await h.waitDrained(120_000);
      await sleep(700);
      const c = await h.check({ maxRetry: o.maxRetry, txTypes: [] });
      const base = { c, ...crashes };
      const r = { ...(await o.analyze(h, base)), ...base };
      const problems = assertInvariants(c, { maxRetry: o.maxRetry, unexpected: h.unexpectedExits() });
      recordFigures(
        h.figures(`${o.tag} ${o.figures}, ${run.figures}`, c, {
          ...o.extra(r),
          crashes: o.crashes,
          untargeted_crashes: r.untargeted,
          restart_ms: r.restartMs,
          notes: `${o.notes}; ${run.notes}`,
        }),
      );
      o.check(r, problems);
    });
  }
}

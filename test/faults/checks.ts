/**
 * The oracle (reliability plan §5.1): its tables in the test schema, the
 * invariant checks I1–I7 in SQL once a run has drained, the figures a check
 * gives, and the assertion that every invariant held.
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
import type pg from 'pg';
import type { WorkerMetrics } from './child.js';
import type { Figures } from './figures.js';
import { ORACLE_BOUND_S } from './profile.js';

/** SQL with `{{schema}}` replaced by the quoted test schema. */
export type Query = <R extends pg.QueryResultRow = any>(text: string, values?: unknown[]) => Promise<R[]>;

export interface CheckOptions {
  maxRetry: number;
  /** The task types whose completion must carry an h_effects row (I2's missing effects). */
  txTypes?: string[];
  /** I4's bound, when it is not ORACLE_BOUND_S (a run with an outage: kit.ts's outageBound()); for the verdict. */
  stuckBoundS?: number;
  /** Exit codes a child may die with (a poison task's); for the verdict. */
  allowedExitCodes?: number[];
}

export const ORACLE_SQL = `
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

/** What check() finds (plan §5.1, I1–I5). */
export interface Checks {
  /** What the check was asked for (kit.ts's report() asserts by it). */
  options: CheckOptions;
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

/** I1–I7 once the run has drained: `acked` are the acknowledged ids (I1). */
export async function runChecks(query: Query, acked: string[], options: CheckOptions): Promise<Checks> {
  const { maxRetry, txTypes = ['tx', 'block'] } = options;
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
    options,
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
}

/** I7, now: unique keys with more than one live (pending, scheduled, active, retry) task. */
export async function checkUnique(query: Query): Promise<number> {
  const [row] = await query<{ n: number }>(`SELECT count(*)::int AS n FROM (SELECT queue, unique_key FROM {{schema}}.tasks
    WHERE unique_key IS NOT NULL AND state IN ('pending', 'scheduled', 'active', 'retry') GROUP BY 1, 2 HAVING count(*) > 1) d`);
  return row!.n;
}

/**
 * I8, now: scheduler ticks recorded twice (the primary key of scheduler_events forbids it; checked
 * anyway) and tasks that two ticks claim as theirs.
 */
export async function checkCron(query: Query): Promise<{ doubleFires: number; sharedTasks: number }> {
  const [row] = await query<{ doubleFires: number; sharedTasks: number }>(`
    SELECT (SELECT count(*)::int FROM (SELECT entry_id, tick_at FROM {{schema}}.scheduler_events GROUP BY 1, 2 HAVING count(*) > 1) d) AS "doubleFires",
           (SELECT count(*)::int FROM (SELECT task_id FROM {{schema}}.scheduler_events GROUP BY 1 HAVING count(*) > 1) d) AS "sharedTasks"`);
  return row!;
}

/** The plan's figure fields from a check, plus worker metrics summed over every child. */
export function figuresOf(test: string, c: Checks, metricSum: (key: keyof WorkerMetrics) => number, extra: Partial<Figures> = {}): Figures {
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
    leases_lost: metricSum('leasesLost'),
    fenced_rejections: metricSum('fencedWrites'),
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

/**
 * L1's invariants (l1.ts), once Phase B has drained: I1 (nothing lost, all
 * N completed), I2 (effects once, none orphaned or missing), I3 (retries and,
 * with --chaos, attempts bounded), I4 (the sampler's stuck rows), I5 (each
 * effect under its own lease's token) and no deadlock; a join against the
 * acknowledgement log loaded into a table, at any N.
 */
import type { Harness } from '../harness.js';
import { BOUND_S, CHAOS, MAX_RETRY, N } from './l1-config.js';
import { loadAcked, log, round } from './common.js';

export async function invariants(h: Harness) {
  log('Checking invariants');
  const acked = await loadAcked(h, h.ackedIds());
  const one = async (text: string, values?: unknown[]): Promise<any> => (await h.query(text, values))[0];
  const { lost } = await one(
    "SELECT count(*)::int AS lost FROM {{schema}}.h_acked a WHERE NOT EXISTS (SELECT 1 FROM {{schema}}.tasks t WHERE t.queue = 'default' AND t.id = a.id)",
  );
  const states = Object.fromEntries(
    (await h.query<{ state: string; n: number }>("SELECT state, count(*)::int AS n FROM {{schema}}.tasks WHERE type = 'l1' GROUP BY 1 ORDER BY 1")).map((r) => [
      r.state,
      r.n,
    ]),
  );
  const { dup } = await one('SELECT count(*)::int AS dup FROM (SELECT task_id FROM {{schema}}.h_effects GROUP BY 1 HAVING count(*) > 1) d');
  const { orphan } = await one(
    "SELECT count(*)::int AS orphan FROM {{schema}}.h_effects e WHERE NOT EXISTS (SELECT 1 FROM {{schema}}.tasks t WHERE t.queue = 'default' AND t.id = e.task_id AND t.state = 'completed')",
  );
  const { missing } = await one(
    "SELECT count(*)::int AS missing FROM {{schema}}.tasks t WHERE t.state = 'completed' AND NOT EXISTS (SELECT 1 FROM {{schema}}.h_effects e WHERE e.task_id = t.id)",
  );
  const { over } = await one('SELECT count(*)::int AS over FROM {{schema}}.tasks WHERE retried > max_retry');
  const { retried_tasks, max_retried } = await one(
    'SELECT count(*) FILTER (WHERE retried > 0)::int AS retried_tasks, coalesce(max(retried), 0)::int AS max_retried FROM {{schema}}.tasks',
  );
  const { null_tokens, dup_tokens } = await one(
    'SELECT count(*) FILTER (WHERE lease_token IS NULL)::int AS null_tokens, (count(lease_token) - count(DISTINCT lease_token))::int AS dup_tokens FROM {{schema}}.h_effects',
  );
  const { deadlocks } = await one('SELECT deadlocks::int FROM pg_stat_database WHERE datname = current_database()');
  const s = await one(
    'SELECT max(stuck_max_s)::float8 AS stuck_max_s, coalesce(max(stuck), 0)::int AS stuck, count(*)::int AS samples FROM {{schema}}.h_samples',
  );
  let exec: Record<string, number> | undefined;
  if (CHAOS) {
    const e: Record<string, number> = await one(`
      SELECT count(*) FILTER (WHERE n > 1)::int AS dup_external, coalesce(max(n), 0)::int AS max_attempts
      FROM (SELECT task_id, count(DISTINCT attempt) AS n FROM {{schema}}.h_exec WHERE phase = 'start' GROUP BY 1) x`);
    exec = e;
    const { mismatch } = await one(`
      SELECT count(*)::int AS mismatch FROM {{schema}}.h_effects e
      WHERE e.lease_token IS NULL OR NOT EXISTS (
        SELECT 1 FROM {{schema}}.h_exec x WHERE x.attempt = e.attempt AND x.phase = 'start' AND x.lease_token = e.lease_token)`);
    e.token_mismatches = mismatch;
  }
  const completed = states.completed ?? 0;
  const res = {
    acked,
    lost,
    completed,
    states,
    dup_effects: dup,
    orphan_effects: orphan,
    missing_effects: missing,
    over_retried: over,
    retried_tasks,
    max_retried,
    effect_null_tokens: null_tokens,
    effect_dup_tokens: dup_tokens,
    deadlocks,
    stuck_max_s: round(s.stuck_max_s),
    stuck_samples: s.stuck,
    samples: s.samples,
    ...(exec ?? {}),
  };
  const problems: string[] = [];
  if (acked !== N) problems.push(`acked ${acked} ≠ ${N}`);
  if (lost !== 0) problems.push(`I1: ${lost} acknowledged tasks lost`);
  if (completed !== N) problems.push(`I1: ${completed} completed ≠ ${N}`);
  if (dup !== 0) problems.push(`I2: ${dup} duplicate effects`);
  if (orphan !== 0) problems.push(`I2: ${orphan} orphan effects`);
  if (missing !== 0) problems.push(`I2: ${missing} completed tasks without their effect`);
  if (over !== 0) problems.push(`I3: ${over} tasks retried more than max_retry`);
  if (exec && exec.max_attempts! > MAX_RETRY + 1) problems.push(`I3: a task ran ${exec.max_attempts} times`);
  if (null_tokens !== 0) problems.push(`I5: ${null_tokens} effects written without this lease's token`);
  if (exec && exec.token_mismatches !== 0) problems.push(`I5: ${exec.token_mismatches} effects under another attempt's lease`);
  if (s.stuck !== 0 || (s.stuck_max_s ?? 0) > BOUND_S) problems.push(`I4: stuck ${s.stuck}, stuck_max_s ${s.stuck_max_s} (bound ${BOUND_S})`);
  if (deadlocks !== 0) problems.push(`${deadlocks} deadlocks`);
  return { res, problems };
}

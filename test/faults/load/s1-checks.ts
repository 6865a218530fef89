/**
 * S1's checks (s1.ts), once the queue has drained: I1–I8 in SQL against the
 * acknowledgement log and the oracle tables (s1Checks, s1Problems), the quick
 * tasks' latency in the first and last quarter of the load, with and without
 * the fault windows (quickLatency), and the soak figures per worker and of the
 * database (soakFigures).
 */
import { ORACLE_BOUND_S, type Child, type Harness } from '../harness.js';
import { loadAcked, round, slope } from './common.js';
import { DURATION_S, MAX_RETRY, maxOf, type FaultRecord } from './s1-config.js';

export interface AttemptsByKind {
  kind: string;
  tasks: number;
  max_attempts: number;
  multi: number;
}

/** I1–I8 and the figures beside them, by name (s1Problems() reads them). */
export async function s1Checks(H: Harness): Promise<{ acked: number; c: Record<string, unknown>; att: AttemptsByKind[] }> {
  const acked = await loadAcked(H, H.ackedIds());
  const one = async (text: string, values?: unknown[]): Promise<any> => (await H.query(text, values))[0];
  const T = '{{schema}}.tasks';
  const c: Record<string, unknown> = {};
  c.acked = acked;
  c.acked_by_kind = Object.fromEntries(
    (await H.query<{ kind: string; n: number }>('SELECT kind, count(*)::int AS n FROM {{schema}}.h_acked GROUP BY 1 ORDER BY 1')).map((r) => [r.kind, r.n]),
  );
  c.states = Object.fromEntries(
    (await H.query<{ state: string; n: number }>(`SELECT state, count(*)::int AS n FROM ${T} GROUP BY 1 ORDER BY 1`)).map((r) => [r.state, r.n]),
  );
  // An anti-join per check (a NOT EXISTS inside an aggregate's FILTER is a per-row subplan: minutes at 100k rows).
  const i1 = await one(`
    SELECT (SELECT count(*) FROM {{schema}}.h_acked a
            WHERE NOT EXISTS (SELECT 1 FROM ${T} t WHERE t.queue = 'default' AND t.id = a.id)
              AND NOT EXISTS (SELECT 1 FROM {{schema}}.h_effects e WHERE e.task_id = a.id))::int AS lost,
           count(*) FILTER (WHERE t.id IS NULL)::int AS pruned,
           count(*) FILTER (WHERE t.state NOT IN ('completed', 'archived'))::int AS unfinished,
           count(*) FILTER (WHERE t.state = 'archived' AND a.kind <> 'fa')::int AS archived_not_by_design,
           count(*) FILTER (WHERE a.kind = 'fa' AND t.state IS DISTINCT FROM 'archived')::int AS fa_not_archived
    FROM {{schema}}.h_acked a LEFT JOIN ${T} t ON t.queue = 'default' AND t.id = a.id`);
  Object.assign(c, i1);
  c.unfinished_all = (await one(`SELECT count(*)::int AS n FROM ${T} WHERE state NOT IN ('completed', 'archived')`)).n;
  c.cron_archived = (await one(`SELECT count(*)::int AS n FROM ${T} WHERE type LIKE 'cron:%' AND state = 'archived'`)).n;
  const i2 = await one(`
    SELECT (SELECT count(*) FROM (SELECT task_id FROM {{schema}}.h_effects GROUP BY 1 HAVING count(*) > 1) d)::int AS dup_effects,
           (SELECT count(*) FROM {{schema}}.h_effects e JOIN ${T} t ON t.queue = 'default' AND t.id = e.task_id WHERE t.state <> 'completed')::int AS orphan_effects,
           (SELECT count(*) FROM {{schema}}.h_effects e JOIN {{schema}}.h_acked a ON a.id = e.task_id WHERE a.kind = 'fa')::int AS fa_effects,
           (SELECT count(*) FROM {{schema}}.h_acked a WHERE a.kind <> 'fa' AND NOT EXISTS (SELECT 1 FROM {{schema}}.h_effects e WHERE e.task_id = a.id))::int AS missing_effects,
           (SELECT count(*) FROM {{schema}}.h_effects)::int AS effects`);
  Object.assign(c, i2);
  const att = await H.query<AttemptsByKind>(`
    SELECT coalesce(a.kind, CASE WHEN x.type LIKE 'cron:%' THEN 'cron' ELSE '?' END) AS kind, count(*)::int AS tasks,
           max(x.n)::int AS max_attempts, count(*) FILTER (WHERE x.n > 1)::int AS multi
    FROM (SELECT task_id, min(detail) AS type, count(DISTINCT attempt) AS n FROM {{schema}}.h_exec WHERE phase = 'start' GROUP BY 1) x
    LEFT JOIN {{schema}}.h_acked a ON a.id = x.task_id GROUP BY 1 ORDER BY 1`);
  c.attempts_by_kind = Object.fromEntries(att.map((r) => [r.kind, { tasks: r.tasks, max_attempts: r.max_attempts, ran_more_than_once: r.multi }]));
  c.dup_external = att.filter((r) => ['q', 's', 'long', 'cron'].includes(r.kind)).reduce((s, r) => s + r.multi, 0);
  c.over_attempts = att.filter((r) => r.max_attempts > (MAX_RETRY[r.kind] ?? 5) + 1).map((r) => r.kind);
  c.over_retried = (await one(`SELECT count(*)::int AS n FROM ${T} WHERE retried > max_retry`)).n;
  c.token_mismatches = (
    await one(`
    SELECT count(*)::int AS n FROM {{schema}}.h_effects e
    WHERE e.lease_token IS NULL OR NOT EXISTS (
      SELECT 1 FROM {{schema}}.h_exec x WHERE x.attempt = e.attempt AND x.phase = 'start' AND x.lease_token = e.lease_token)`)
  ).n;
  const s = await one(`
    SELECT max(stuck_max_s)::float8 AS stuck_max_s, coalesce(max(stuck), 0)::int AS stuck_samples, coalesce(max(uniq_violations), 0)::int AS uniq_violations,
           count(*)::int AS samples, (SELECT at FROM {{schema}}.h_samples ORDER BY stuck_max_s DESC NULLS LAST LIMIT 1) AS stuck_max_at
    FROM {{schema}}.h_samples`);
  c.stuck_max_s = round(s.stuck_max_s);
  c.stuck_max_at = s.stuck_max_at;
  c.stuck_samples = s.stuck_samples;
  c.samples = s.samples;
  c.uniq_violations = s.uniq_violations;
  // When I4 went over the bound: one row per second of samples over it, to set beside the fault log.
  c.stuck_over_bound = (
    await H.query<{ sec: string; max: number; stuck: number }>(
      `SELECT to_char(date_trunc('second', at), 'HH24:MI:SS') AS sec, max(stuck_max_s)::float8 AS max, max(stuck)::int AS stuck
       FROM {{schema}}.h_samples WHERE stuck_max_s > $1 OR stuck > 0 GROUP BY 1 ORDER BY 1 LIMIT 60`,
      [ORACLE_BOUND_S],
    )
  ).map((r) => `${r.sec} ${round(r.max)} s${r.stuck ? ` (${r.stuck} past C+R+1)` : ''}`);
  c.early_starts = (
    await one(`SELECT count(*)::int AS n FROM {{schema}}.h_exec x JOIN {{schema}}.h_enq q ON q.task_id = x.task_id
               WHERE x.phase = 'start' AND q.process_at IS NOT NULL AND x.at < q.process_at`)
  ).n;
  c.scheduled_started = (
    await one(
      `SELECT count(DISTINCT x.task_id)::int AS n FROM {{schema}}.h_exec x JOIN {{schema}}.h_enq q ON q.task_id = x.task_id WHERE x.phase = 'start' AND q.process_at IS NOT NULL`,
    )
  ).n;
  const cron = await one(`
    SELECT (SELECT count(*) FROM (SELECT entry_id, tick_at FROM {{schema}}.h_cron GROUP BY 1, 2 HAVING count(*) > 1) d)::int AS dup_ticks,
           (SELECT count(*) FROM {{schema}}.h_cron)::int AS ticks,
           (SELECT count(DISTINCT x.task_id) FROM {{schema}}.h_exec x WHERE x.phase = 'start' AND x.detail LIKE 'cron:%'
              AND NOT EXISTS (SELECT 1 FROM {{schema}}.h_cron k WHERE k.task_id = x.task_id))::int AS cron_tasks_without_tick,
           (SELECT count(*) FROM ${T} t WHERE t.type LIKE 'cron:%' AND NOT EXISTS (SELECT 1 FROM {{schema}}.h_cron k WHERE k.task_id = t.id))::int AS cron_rows_without_tick,
           (SELECT count(*) FROM {{schema}}.h_cron k WHERE NOT EXISTS (SELECT 1 FROM {{schema}}.h_effects e WHERE e.task_id = k.task_id))::int AS ticks_without_effect`);
  Object.assign(c, {
    cron_dup_ticks: cron.dup_ticks,
    cron_ticks: cron.ticks,
    cron_tasks_without_tick: cron.cron_tasks_without_tick,
    cron_rows_without_tick: cron.cron_rows_without_tick,
    cron_ticks_without_effect: cron.ticks_without_effect,
  });
  c.cron_ticks_by_type = Object.fromEntries(
    (
      await H.query<{ type: string; n: number }>(
        `SELECT x.detail AS type, count(DISTINCT x.task_id)::int AS n FROM {{schema}}.h_exec x WHERE x.phase = 'start' AND x.detail LIKE 'cron:%' GROUP BY 1 ORDER BY 1`,
      )
    ).map((r) => [r.type, r.n]),
  );
  c.deadlocks = (await one('SELECT deadlocks::int AS n FROM pg_stat_database WHERE datname = current_database()')).n;
  return { acked, c, att };
}

/** The invariants that failed: every count that must be 0, I3's attempts, I4's bound; the drain; children that died unasked. */
export function s1Problems(c: Record<string, unknown>, drained: boolean, unexpected: string[]): string[] {
  const problems: string[] = [];
  const want0 = (k: string, label: string) => {
    if (c[k] !== 0) problems.push(`${label}: ${k} = ${JSON.stringify(c[k])}`);
  };
  if (!drained) problems.push('the queue did not drain within 5 min');
  want0('lost', 'I1');
  want0('unfinished', 'I1');
  want0('unfinished_all', 'I1');
  want0('archived_not_by_design', 'I1');
  want0('fa_not_archived', 'I1');
  want0('cron_archived', 'I1');
  want0('dup_effects', 'I2');
  want0('orphan_effects', 'I2');
  want0('fa_effects', 'I2');
  want0('missing_effects', 'I2');
  if ((c.over_attempts as string[]).length) problems.push(`I3: attempts above max_retry + 1 for ${c.over_attempts}`);
  want0('over_retried', 'I3');
  if ((c.stuck_max_s as number | null) !== null && (c.stuck_max_s as number) > ORACLE_BOUND_S)
    problems.push(`I4: stuck_max_s ${c.stuck_max_s} > ${ORACLE_BOUND_S} (at ${(c.stuck_max_at as Date | null)?.toISOString?.() ?? c.stuck_max_at})`);
  want0('stuck_samples', 'I4');
  want0('token_mismatches', 'I5');
  want0('early_starts', 'I6');
  want0('uniq_violations', 'I7');
  want0('cron_dup_ticks', 'I8');
  want0('cron_tasks_without_tick', 'I8');
  want0('cron_rows_without_tick', 'I8');
  want0('cron_ticks_without_effect', 'I8');
  want0('deadlocks', 'deadlocks');
  for (const u of unexpected) problems.push(`process: ${u}`);
  return problems;
}

/** The quick tasks' latency (enqueue → effect): by quarter of the load, the same outside the fault windows, overall and per minute. */
export async function quickLatency(H: Harness, faults: FaultRecord[]) {
  const one = async (text: string, values?: unknown[]): Promise<any> => (await H.query(text, values))[0];
  // Latency of quick tasks: enqueue (h_enq.at, inside the enqueue transaction) → effect written; first vs last quarter of the load.
  const lat = await H.query<{ part: string; n: number; p50: number; p99: number; max: number }>(`
    WITH b AS (SELECT min(at) AS t0, max(at) AS t1 FROM {{schema}}.h_enq),
    l AS (SELECT q.at, extract(epoch FROM e.at - q.at) * 1000 AS ms FROM {{schema}}.h_enq q JOIN {{schema}}.h_effects e ON e.task_id = q.task_id WHERE q.kind = 'q')
    SELECT CASE WHEN l.at < b.t0 + (b.t1 - b.t0) / 4 THEN 'first' WHEN l.at >= b.t1 - (b.t1 - b.t0) / 4 THEN 'last' ELSE 'middle' END AS part,
           count(*)::int AS n, percentile_cont(0.5) WITHIN GROUP (ORDER BY ms)::float8 AS p50,
           percentile_cont(0.99) WITHIN GROUP (ORDER BY ms)::float8 AS p99, max(ms)::float8 AS max
    FROM l, b GROUP BY 1`);
  const latency = Object.fromEntries(lat.map((r) => [r.part, { n: r.n, p50_ms: round(r.p50), p99_ms: round(r.p99), max_ms: round(r.max) }]));
  // The same, leaving out tasks enqueued from 5 s before a fault until 30 s after its heal: latency creep rather than fault hits.
  const win = [faults.map((f) => new Date(new Date(f.at).getTime() - 5000)), faults.map((f) => new Date(new Date(f.heal_at ?? f.at).getTime() + 30_000))];
  const latCalm = await H.query<{ part: string; n: number; p50: number; p99: number; max: number }>(
    `
    WITH b AS (SELECT min(at) AS t0, max(at) AS t1 FROM {{schema}}.h_enq),
    l AS (SELECT q.at, extract(epoch FROM e.at - q.at) * 1000 AS ms FROM {{schema}}.h_enq q JOIN {{schema}}.h_effects e ON e.task_id = q.task_id
          WHERE q.kind = 'q' AND NOT EXISTS (SELECT 1 FROM unnest($1::timestamptz[], $2::timestamptz[]) w(a, z) WHERE q.at BETWEEN w.a AND w.z))
    SELECT CASE WHEN l.at < b.t0 + (b.t1 - b.t0) / 4 THEN 'first' WHEN l.at >= b.t1 - (b.t1 - b.t0) / 4 THEN 'last' ELSE 'middle' END AS part,
           count(*)::int AS n, percentile_cont(0.5) WITHIN GROUP (ORDER BY ms)::float8 AS p50,
           percentile_cont(0.99) WITHIN GROUP (ORDER BY ms)::float8 AS p99, max(ms)::float8 AS max
    FROM l, b GROUP BY 1`,
    win,
  );
  const latencyCalm = Object.fromEntries(latCalm.map((r) => [r.part, { n: r.n, p50_ms: round(r.p50), p99_ms: round(r.p99), max_ms: round(r.max) }]));
  const p99RatioCalm = latencyCalm.first && latencyCalm.last ? round(latencyCalm.last.p99_ms! / latencyCalm.first.p99_ms!, 2) : null;
  const all = await one(`SELECT percentile_cont(0.5) WITHIN GROUP (ORDER BY ms)::float8 AS p50, percentile_cont(0.99) WITHIN GROUP (ORDER BY ms)::float8 AS p99
    FROM (SELECT extract(epoch FROM e.at - q.at) * 1000 AS ms FROM {{schema}}.h_enq q JOIN {{schema}}.h_effects e ON e.task_id = q.task_id WHERE q.kind = 'q') l`);
  const perMinuteP99 = await H.query<{ minute: number; n: number; p99: number }>(`
    WITH b AS (SELECT min(at) AS t0 FROM {{schema}}.h_enq)
    SELECT floor(extract(epoch FROM q.at - b.t0) / 60)::int AS minute, count(*)::int AS n,
           percentile_cont(0.99) WITHIN GROUP (ORDER BY extract(epoch FROM e.at - q.at) * 1000)::float8 AS p99
    FROM {{schema}}.h_enq q JOIN {{schema}}.h_effects e ON e.task_id = q.task_id, b WHERE q.kind = 'q' GROUP BY 1 ORDER BY 1`);
  const p99Ratio = latency.first && latency.last ? round(latency.last.p99_ms! / latency.first.p99_ms!, 2) : null;
  return { latency, latencyCalm, p99RatioCalm, all, perMinuteP99, p99Ratio };
}

export interface SoakInput {
  H: Harness;
  /** The worker slots at the end; the workers they replaced are in H.children. */
  workers: Child[];
  perChild: Map<Child, { t: number; rss: number; fds: number; conns: number }[]>;
  /** The time series rows (every 5 s). */
  rows: Record<string, unknown>[];
  loadEndS: number;
  freeze_max: number;
  statsCalls: { ok: number; errors: number; ms: number[] };
}

/** RSS slope (after the first quarter), fds and connections first vs last per worker; dead tuples, size, XID age; the Inspector's calls. */
export function soakFigures({ H, workers, perChild, rows, loadEndS, freeze_max, statsCalls }: SoakInput) {
  // Soak figures: RSS slope (after the first quarter), fds and connections first vs last, dead tuples, size, XID age.
  const warm = DURATION_S / 4;
  const soak = workers.concat(H.children.filter((x) => x.role === 'worker' && !workers.includes(x))).map((w) => {
    const pts = perChild.get(w) ?? [];
    const late = pts.filter((p) => p.t >= warm && p.t <= loadEndS);
    const sl = slope(late.map((p) => [p.t / 3600, p.rss / 2 ** 20]));
    const span = late.length ? late.at(-1)!.t - late[0]!.t : 0;
    const inLoad = pts.filter((p) => p.t <= loadEndS);
    const half = inLoad.filter((p) => p.t >= loadEndS / 2);
    return {
      worker: w.tag,
      samples: pts.length,
      span_s: round(span),
      rss_mb_first: pts[0] ? round(pts[0].rss / 2 ** 20) : null,
      rss_mb_last: pts.at(-1) ? round(pts.at(-1)!.rss / 2 ** 20) : null,
      rss_slope_mb_per_h: span >= DURATION_S / 3 ? round(sl) : null,
      fds_first: inLoad[0]?.fds ?? null,
      fds_max_first_half: maxOf(inLoad.filter((p) => p.t < loadEndS / 2).map((p) => p.fds)),
      fds_max_second_half: maxOf(half.map((p) => p.fds)),
      fds_last_in_load: inLoad.at(-1)?.fds ?? null,
      fds_after_drain: pts.at(-1)?.fds ?? null,
      conns_first: inLoad[0]?.conns ?? null,
      conns_max_first_half: maxOf(inLoad.filter((p) => p.t < loadEndS / 2).map((p) => p.conns)),
      conns_max_second_half: maxOf(half.map((p) => p.conns)),
      conns_last_in_load: inLoad.at(-1)?.conns ?? null,
      conns_after_drain: pts.at(-1)?.conns ?? null,
    };
  });
  const num = (k: string) => rows.map((r) => r[k]).filter((v): v is number => typeof v === 'number');
  const dead = num('n_dead_tup');
  const size = num('tasks_total_mb');
  const mid = rows
    .filter((r) => (r.t_s as number) >= DURATION_S / 2 && (r.t_s as number) <= loadEndS)
    .map((r) => r.tasks_total_mb)
    .filter((v): v is number => typeof v === 'number');
  const soakDb = {
    n_dead_tup_max: dead.length ? Math.max(...dead) : null,
    n_dead_tup_last: dead.at(-1) ?? null,
    tasks_total_mb_max: size.length ? Math.max(...size) : null,
    tasks_total_mb_at_half: mid[0] ?? null,
    tasks_total_mb_at_load_end: mid.at(-1) ?? null,
    tasks_total_mb_after_drain: size.at(-1) ?? null,
    xid_age_last: num('xid_age').at(-1) ?? null,
    autovacuum_freeze_max_age: freeze_max,
    autovacuum_runs_seen: num('autovacuum_count').at(-1) ?? null,
    connections_total_max: Math.max(...num('connections_total')),
  };
  const statsMs = [...statsCalls.ms].sort((a, b) => a - b);
  const inspectorFig = {
    calls: statsCalls.ok,
    errors: statsCalls.errors,
    p50_ms: round(statsMs[Math.floor(statsMs.length / 2)] ?? NaN),
    max_ms: round(statsMs.at(-1) ?? NaN),
  };
  return { soak, soakDb, inspectorFig };
}

/** What a soak shows that is not an invariant: a growing RSS, a growing p99. */
export function soakNotesOf(soak: { worker: string; rss_slope_mb_per_h: number | null }[], p99Ratio: number | null, p99RatioCalm: number | null): string[] {
  const soakNotes: string[] = [];
  for (const w of soak) if (w.rss_slope_mb_per_h !== null && w.rss_slope_mb_per_h > 5) soakNotes.push(`${w.worker} RSS slope ${w.rss_slope_mb_per_h} MB/h`);
  if (p99Ratio !== null && p99Ratio > 1.5) soakNotes.push(`p99 last/first quarter ${p99Ratio} > 1.5`);
  if (p99RatioCalm !== null && p99RatioCalm > 1.5) soakNotes.push(`p99 last/first quarter outside fault windows ${p99RatioCalm} > 1.5`);
  return soakNotes;
}

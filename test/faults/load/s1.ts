/**
 * `npm run soak:s1 [-- --minutes 20]`: the reliability plan's soak test
 * S1-short (§5.5), on an owned cluster (../cluster.ts, autovacuum on).
 *
 *   Load      ~100 tasks/s from one producer process (s1-producer.ts): 80 % quick
 *             tx, 10 % fail twice then succeed, 2 % always fail (archived), 5 %
 *             scheduled 1–60 s ahead, 3 % long (2–5 × the lease, heartbeated);
 *             unique locks on 10 % of all tasks (1 in 9 quick or fail-twice); retention
 *             60 s on every task, so the janitor prunes completed rows.
 *   Cron      two Scheduler processes (../children/cron-scheduler.ts) with the same entries:
 *             @every 1s, 10s, 1m, 5m. A trigger copies every scheduler_events
 *             insert into h_cron (the I8 oracle; the library trims its own history).
 *   Workers   4 processes (s1-worker.ts) × concurrency 24, fast profile (lease 3 s,
 *             heartbeat 1 s, cutoff 2 s, recover 1 s: B = 7 s, 8 s with jitter).
 *   Reads     Inspector.getQueueInfo every 5 s.
 *   Faults    every 3–5 min (first after 2 min) one of: kill -9 a worker (respawned
 *             2 s later), SIGSTOP a worker past its lease (9 s) then SIGCONT,
 *             terminate all of one worker's sessions, terminate the listeners,
 *             PostgreSQL crash (-m immediate) + restart, PostgreSQL paused 4 s;
 *             in a random order without repeats (kill -9, SIGSTOP and the crash first,
 *             then the other three), logged with timestamps.
 *   Sampler   I4 and I7 every 500 ms (the harness's).
 *   End       the producer stops after --minutes, the schedulers are stopped, the
 *             queue drains (≤ 5 min), then I1–I8 and the soak figures: worker RSS
 *             slope, open fds and DB connections per process, n_dead_tup, table
 *             size, XID age, p99 latency of the first vs the last quarter.
 *
 * Flags: --minutes N (20), --rate R (100), --workers N (4), --concurrency N (24),
 * --fault-gap S (fixed gap between faults instead of 180–300 s; for trials),
 * --first-fault S (120), --faults a,b,c (the order; default shuffled).
 * Prints a summary, appends a JSON line (recordFigures), and writes
 * results/s1-<stamp>.json and results/s1-<stamp>-timeseries.csv.
 */
import { parseArgs } from 'node:util';
import { Inspector } from '../../../src/index.js';
import { FAST, ORACLE_BOUND_S, createHarness, recordFigures, sleep, type Child, type Harness } from '../harness.js';
import { loadAcked, log, respawnLoadChild, round, slope, spawnLoadChild, table, tableStats, writeResult } from './common.js';

const { values: args } = parseArgs({
  options: {
    minutes: { type: 'string', default: '20' },
    rate: { type: 'string', default: '100' },
    workers: { type: 'string', default: '4' },
    concurrency: { type: 'string', default: '24' },
    'fault-gap': { type: 'string' },
    'first-fault': { type: 'string', default: '120' },
    faults: { type: 'string' },
  },
});
const MINUTES = Number(args.minutes);
const DURATION_S = MINUTES * 60;
const RATE = Number(args.rate);
const WORKERS = Number(args.workers);
const CONCURRENCY = Number(args.concurrency);
const FAULT_GAP = args['fault-gap'] === undefined ? undefined : Number(args['fault-gap']);
const FIRST_FAULT_S = Number(args['first-fault']);
const KINDS = ['kill9', 'sigstop', 'term-sessions', 'term-listener', 'pg-crash', 'pg-pause'] as const;
type Kind = (typeof KINDS)[number];
const shuffle = <T>(xs: T[]): T[] =>
  xs
    .map((x) => [Math.random(), x] as const)
    .sort((a, b) => a[0] - b[0])
    .map(([, x]) => x);
// Random order, but the three that exercise recovery hardest come first: 20 min at 3–5 min gaps fit about 5 faults.
const ORDER: Kind[] = args.faults
  ? (args.faults.split(',') as Kind[])
  : [...shuffle<Kind>(['kill9', 'sigstop', 'pg-crash']), ...shuffle<Kind>(['term-sessions', 'term-listener', 'pg-pause'])];
for (const k of ORDER) if (!KINDS.includes(k)) throw new Error(`unknown fault ${k}; one of ${KINDS.join(', ')}`);
const PROFILE = { ...FAST };
const L = PROFILE.leaseDuration;
const BOUND_MS = PROFILE.leaseDuration + PROFILE.recoverCutoff + PROFILE.recoverInterval + 1000;
const STOP_MS = BOUND_MS + 2000;
const PAUSE_MS = 4000;
const RETENTION = 60_000;
/** The schedulers' entries: label → `@every` interval. */
const CRON_ENTRIES = { '1s': '1s', '10s': '10s', '1m': '1m', '5m': '5m' };
const maxOf = (xs: number[]): number | null => (xs.length ? Math.max(...xs) : null);
const MAX_RETRY: Record<string, number> = { q: 5, s: 5, f2: 5, long: 5, fa: 2, cron: 5 };

let h: Harness | undefined;
let inspector: Inspector | undefined;
let stopping = false;
const timers: NodeJS.Timeout[] = [];
const cleanup = async () => {
  stopping = true;
  for (const t of timers) clearInterval(t);
  await inspector?.close().catch(() => {});
  if (h) await h.teardown().catch((err) => log(`teardown: ${err}`));
  h = undefined;
};
for (const sig of ['SIGINT', 'SIGTERM'] as const) {
  process.on(sig, () => {
    log(`${sig}: tearing down`);
    void cleanup().then(() => process.exit(130));
  });
}

interface FaultRecord {
  at: string;
  t_s: number;
  kind: Kind;
  target: string;
  detail?: string;
  heal_at?: string;
  recovery_s?: number | null;
  throughput_recovery_s?: number | null;
}

const ORACLE_EXTRA = `
CREATE TABLE {{schema}}.h_enq (task_id text PRIMARY KEY, kind text NOT NULL, process_at timestamptz,
  at timestamptz NOT NULL DEFAULT clock_timestamp());
CREATE TABLE {{schema}}.h_cron (entry_id text NOT NULL, tick_at timestamptz NOT NULL, task_id text NOT NULL,
  at timestamptz NOT NULL DEFAULT clock_timestamp());
CREATE FUNCTION {{schema}}.h_cron_copy() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  INSERT INTO {{schema}}.h_cron (entry_id, tick_at, task_id) VALUES (NEW.entry_id, NEW.tick_at, NEW.task_id);
  RETURN NULL;
END $$;
CREATE TRIGGER h_cron_copy AFTER INSERT ON {{schema}}.scheduler_events FOR EACH ROW EXECUTE FUNCTION {{schema}}.h_cron_copy();
`;

const started = new Date();
let exitCode = 1;
try {
  log(
    `S1-short: ${MINUTES} min at ${RATE} tasks/s, ${WORKERS} workers × ${CONCURRENCY}, profile ${JSON.stringify(PROFILE)}, faults ${FAULT_GAP ? `every ${FAULT_GAP} s` : 'every 180–300 s'} from ${FIRST_FAULT_S} s: ${ORDER.join(', ')}`,
  );
  h = await createHarness('s1', { settings: { autovacuum: 'on' } });
  const H = h;
  await H.query(ORACLE_EXTRA);
  inspector = new Inspector({ connectionString: H.connectionString, schema: H.schema });
  const { version } = await H.one<{ version: string }>('SELECT version()');
  const { freeze_max } = await H.one<{ freeze_max: number }>(
    "SELECT setting::bigint::float8 AS freeze_max FROM pg_settings WHERE name = 'autovacuum_freeze_max_age'",
  );

  // Workers (slots w1..wN; a respawn takes its slot), schedulers, sampler.
  const workerSpec = (i: number) => ({
    name: `w${i}`,
    role: 'worker' as const,
    script: 's1-worker.ts',
    env: { WORKER: `w${i}`, CONCURRENCY: String(CONCURRENCY), PROFILE: JSON.stringify(PROFILE) },
  });
  const workers: Child[] = await Promise.all(Array.from({ length: WORKERS }, (_, i) => spawnLoadChild(H, workerSpec(i + 1))));
  const crons: Child[] = await Promise.all(
    [1, 2].map((i) =>
      spawnLoadChild(H, {
        name: `cron${i}`,
        role: 'producer',
        script: '../children/cron-scheduler.ts',
        env: { NAME: `cron${i}`, ENTRIES: JSON.stringify(CRON_ENTRIES), RETENTION: String(RETENTION) },
      }),
    ),
  );
  H.startSampler();

  const t0 = performance.now();
  const el = () => (performance.now() - t0) / 1000;
  const producer = await spawnLoadChild(H, {
    name: 'producer',
    role: 'producer',
    script: 's1-producer.ts',
    env: { ACK_FILE: H.ackFile, COUNT: String(RATE * DURATION_S), RATE: String(RATE), LEASE_MS: String(L), RETENTION: String(RETENTION) },
  });
  log(`load started: ${WORKERS} workers, 2 schedulers, producer`);

  // Completions per second: the workers' `done` counters, dead workers' last values included.
  const doneSum = () =>
    H.children.filter((c) => c.role === 'worker').reduce((s, c) => s + Number((c.metrics as Record<string, unknown> | undefined)?.done ?? 0), 0);
  const rate: { t: number; done: number }[] = [];
  timers.push(setInterval(() => rate.push({ t: el(), done: doneSum() }), 1000));
  const rateBetween = (a: number, b: number): number | null => {
    const p = rate.find((r) => r.t >= a);
    const q = rate.findLast((r) => r.t <= b);
    return p && q && q.t > p.t ? (q.done - p.done) / (q.t - p.t) : null;
  };

  // Inspector stats every 5 s.
  const statsCalls = { ok: 0, errors: 0, ms: [] as number[] };
  let lastInfo: Record<string, unknown> = {};
  timers.push(
    setInterval(() => {
      const s = performance.now();
      inspector!.getQueueInfo('default').then(
        (info) => {
          statsCalls.ok++;
          statsCalls.ms.push(performance.now() - s);
          lastInfo = info as unknown as Record<string, unknown>;
        },
        () => statsCalls.errors++,
      );
    }, 5000),
  );

  // Time series every 5 s: queue states, dead tuples, table size, XID age, per-worker RSS, fds and connections.
  const rows: Record<string, unknown>[] = [];
  const perChild = new Map<Child, { t: number; rss: number; fds: number; conns: number }[]>();
  let monitoring = false;
  timers.push(
    setInterval(() => {
      if (monitoring || stopping) return;
      monitoring = true;
      void (async () => {
        try {
          const t = round(el(), 1)!;
          const st = await tableStats(H).catch(() => undefined);
          const db = await H.one<{ bytes: number; xid_age: number }>(
            "SELECT (pg_total_relation_size('{{schema}}.task_states') + pg_total_relation_size('{{schema}}.task_inputs'))::float8 AS bytes, age(datfrozenxid)::float8 AS xid_age FROM pg_database WHERE datname = current_database()",
          ).catch(() => undefined);
          const conns = Object.fromEntries(
            (
              await H.query<{ app: string; n: number }>(
                "SELECT application_name AS app, count(*)::int AS n FROM pg_stat_activity WHERE backend_type = 'client backend' GROUP BY 1",
              ).catch(() => [])
            ).map((r) => [r.app, r.n]),
          );
          const row: Record<string, unknown> = {
            t_s: t,
            at: new Date().toISOString(),
            done_per_s: round(rateBetween(t - 5, t) ?? NaN, 1),
            pending: lastInfo.pending,
            active: lastInfo.active,
            scheduled: lastInfo.scheduled,
            retry: lastInfo.retry,
            archived: lastInfo.archived,
            completed: lastInfo.completed,
            n_live_tup: st?.n_live_tup,
            n_dead_tup: st?.n_dead_tup,
            autovacuum_count: st?.autovacuum_count,
            tasks_total_mb: db ? round(db.bytes / 2 ** 20, 2) : undefined,
            xid_age: db?.xid_age,
            connections_total: Object.values(conns).reduce((a, b) => a + b, 0),
            listener_connections: conns['pgasynq:listener'] ?? 0,
          };
          workers.forEach((w, i) => {
            const m = w.metrics as Record<string, number> | undefined;
            const c = conns[`pgasynq:server:${w.pid}`] ?? 0;
            row[`w${i + 1}_rss_mb`] = m ? round(m.rss! / 2 ** 20, 1) : undefined;
            row[`w${i + 1}_fds`] = m?.fds;
            row[`w${i + 1}_conns`] = c;
            row[`w${i + 1}_lag_ms`] = m?.loopLagMaxMs;
            if (w.alive && m) {
              const pts = perChild.get(w) ?? [];
              pts.push({ t, rss: m.rss!, fds: m.fds!, conns: c });
              perChild.set(w, pts);
            }
          });
          rows.push(row);
        } finally {
          monitoring = false;
        }
      })();
    }, 5000),
  );

  // Faults.
  const faults: FaultRecord[] = [];
  const pending: Promise<unknown>[] = [];
  const pick = () => {
    const alive = workers.filter((w) => w.alive);
    return alive[Math.floor(Math.random() * alive.length)]!;
  };
  const throughputRecovery = async (f: FaultRecord, injectedAt: number, healedAt: number) => {
    const before = rateBetween(injectedAt - 60, injectedAt);
    if (!before) return;
    for (let end = healedAt + 5; end < healedAt + 180; end += 1) {
      while (el() < end + 1.5) await sleep(500);
      const r = rateBetween(end - 5, end);
      if (r !== null && r >= 0.9 * before) {
        f.throughput_recovery_s = round(end - healedAt, 1);
        return;
      }
    }
    f.throughput_recovery_s = null;
  };
  const inject = async (kind: Kind) => {
    const tInj = el();
    const f: FaultRecord = { at: new Date().toISOString(), t_s: round(tInj)!, kind, target: '' };
    faults.push(f);
    const track = (w: Child) => {
      const sid = w.serverId!;
      pending.push(
        H.trackRecovery(sid, 120_000).then(
          (s) => (f.recovery_s = s),
          () => (f.recovery_s = null),
        ),
      );
    };
    switch (kind) {
      case 'kill9': {
        const w = pick();
        f.target = w.tag;
        track(w);
        H.signal(w, 'SIGKILL');
        await sleep(2000);
        const slot = workers.indexOf(w);
        const c = await respawnLoadChild(H, w);
        workers[slot] = c;
        f.detail = `respawned as ${c.tag}`;
        break;
      }
      case 'sigstop': {
        const w = pick();
        f.target = w.tag;
        track(w);
        H.signal(w, 'SIGSTOP');
        // At B = L + C + R + 1 s into the stop: which of its tasks are still active, and is a
        // session of the frozen process holding a transaction open (ctx.transaction's row lock)?
        await sleep(BOUND_MS);
        const still = (
          await H.query<{ id: string }>("SELECT id FROM {{schema}}.tasks WHERE state = 'active' AND lease_owner = $1", [w.serverId]).catch(() => [])
        ).map((r) => r.id);
        const tx = await H.one<{ n: number; total: number }>(
          "SELECT count(*) FILTER (WHERE state LIKE 'idle in transaction%')::int AS n, count(*)::int AS total FROM pg_stat_activity WHERE application_name = $1",
          [`pgasynq:server:${w.pid}`],
        ).catch(() => ({ n: -1, total: -1 }));
        await sleep(STOP_MS - BOUND_MS);
        H.signal(w, 'SIGCONT');
        f.detail = `stopped ${STOP_MS} ms; at +${BOUND_MS / 1000} s ${still.length} of its tasks still active, ${tx.n} of its ${tx.total} sessions idle in transaction`;
        if (still.length > 0) {
          pending.push(
            sleep(3000)
              .then(() =>
                H.query<{ worker: string; n: number }>('SELECT worker, count(*)::int AS n FROM {{schema}}.h_effects WHERE task_id = ANY($1) GROUP BY 1', [
                  still,
                ]),
              )
              .then((r) => void (f.detail += `; their effects were then written by ${r.map((x) => `${x.worker} (${x.n})`).join(', ') || 'nobody yet'}`))
              .catch(() => {}),
          );
        }
        break;
      }
      case 'term-sessions': {
        const w = pick();
        f.target = `pgasynq:server:${w.pid} (${w.tag})`;
        f.detail = `${await H.terminate(`pgasynq:server:${w.pid}`)} sessions terminated`;
        break;
      }
      case 'term-listener': {
        f.target = 'pgasynq:listener (all)';
        f.detail = `${await H.terminate('pgasynq:listener')} listeners terminated`;
        break;
      }
      case 'pg-crash': {
        f.target = 'postgres';
        H.cluster.crash();
        await sleep(1000);
        const s = performance.now();
        H.cluster.start();
        f.detail = `down 1 s, start took ${Math.round(performance.now() - s)} ms`;
        break;
      }
      case 'pg-pause': {
        f.target = 'postgres';
        H.cluster.pause();
        await sleep(PAUSE_MS);
        H.cluster.resume();
        f.detail = `paused ${PAUSE_MS} ms`;
        break;
      }
    }
    f.heal_at = new Date().toISOString();
    log(`fault ${kind} on ${f.target}: ${f.detail ?? ''}`);
    pending.push(throughputRecovery(f, tInj, el()));
  };
  const faultLoop = (async () => {
    let next = FIRST_FAULT_S;
    let i = 0;
    while (!stopping) {
      while (el() < next && !stopping && producer.alive) await sleep(250);
      if (stopping || !producer.alive || el() > DURATION_S - 30) break;
      await inject(ORDER[i++ % ORDER.length]!).catch((err) => log(`fault failed: ${err}`));
      next = el() + (FAULT_GAP ?? 180 + Math.random() * 120);
    }
  })();

  // Progress log every minute; then wait for the producer.
  timers.push(
    setInterval(() => {
      const p = producer.events.findLast((e) => e.event === 'progress');
      log(
        `${Math.round(el())} s: acked ${p?.acked ?? '?'}, dups ${p?.dups ?? '?'}, errors ${p?.errors ?? '?'}, done/s ${round(rateBetween(el() - 60, el()) ?? NaN)}, pending ${lastInfo.pending}, active ${lastInfo.active}, retry ${lastInfo.retry}, scheduled ${lastInfo.scheduled}`,
      );
    }, 60_000),
  );
  const produced = await producer.waitEvent((e) => e.event === 'done', (DURATION_S + 600) * 1000, 'producer done');
  const loadEndS = el();
  log(`producer done: ${JSON.stringify(produced)}; stopping schedulers`);
  await faultLoop;
  for (const c of crons) H.signal(c, 'SIGTERM');
  await Promise.race([Promise.all(crons.map((c) => c.exited)), sleep(20_000)]);

  // Drain (≤ 5 min).
  const d0 = performance.now();
  let drained = true;
  try {
    await H.waitDrained(300_000);
  } catch (err) {
    drained = false;
    log(`drain: ${err}`);
  }
  const drainS = round((performance.now() - d0) / 1000, 1);
  log(`drained in ${drainS} s; waiting for recovery measurements`);
  await Promise.race([Promise.all(pending), sleep(30_000)]);
  await H.stopSampler();
  for (const t of timers) clearInterval(t);
  await sleep(5500); // one more monitor row is not needed; let in-flight ones finish

  // ---- Checks ----
  log('checking invariants');
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
  const att = await H.query<{ kind: string; tasks: number; max_attempts: number; multi: number }>(`
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

  // Graceful shutdown of the workers (and whether it hangs).
  for (const w of workers) if (w.alive) H.signal(w, 'SIGTERM');
  await Promise.race([Promise.all(workers.map((w) => w.exited)), sleep(25_000)]);
  const unexpected = H.unexpectedExits();

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
  const soakNotes: string[] = [];
  for (const w of soak) if (w.rss_slope_mb_per_h !== null && w.rss_slope_mb_per_h > 5) soakNotes.push(`${w.worker} RSS slope ${w.rss_slope_mb_per_h} MB/h`);
  if (p99Ratio !== null && p99Ratio > 1.5) soakNotes.push(`p99 last/first quarter ${p99Ratio} > 1.5`);
  if (p99RatioCalm !== null && p99RatioCalm > 1.5) soakNotes.push(`p99 last/first quarter outside fault windows ${p99RatioCalm} > 1.5`);
  const pass = problems.length === 0;
  exitCode = pass ? 0 : 1;
  const finished = new Date();

  const byKind: Record<string, { n: number; recovery_s: (number | null | undefined)[]; throughput_recovery_s: (number | null | undefined)[] }> = {};
  for (const f of faults) {
    const k = (byKind[f.kind] ??= { n: 0, recovery_s: [], throughput_recovery_s: [] });
    k.n++;
    if (f.recovery_s !== undefined) k.recovery_s.push(f.recovery_s);
    k.throughput_recovery_s.push(f.throughput_recovery_s);
  }
  const leasesLost = H.metricSum('leasesLost');
  const fenced = H.metricSum('fencedWrites');
  const recovered = H.metricSum('recovered');
  const notes = [
    `${MINUTES} min at ${RATE}/s (mixed), ${WORKERS}x${CONCURRENCY} fast profile, 2 schedulers`,
    `${faults.length} faults: ${faults.map((f) => `${f.kind}@${f.t_s}s`).join(', ')}`,
    `drain ${drainS} s; p99 quick first/last quarter ${latency.first?.p99_ms}/${latency.last?.p99_ms} ms`,
    `dead tuples max ${soakDb.n_dead_tup_max}; tasks ${soakDb.tasks_total_mb_at_half}→${soakDb.tasks_total_mb_at_load_end} MB`,
    pass ? 'PASS' : `FAIL: ${problems.join('; ')}`,
    ...soakNotes,
  ].join('; ');
  recordFigures({
    test: 'S1-short',
    profile: 'fast',
    tasks: acked,
    lost: c.lost as number,
    dup_effects: c.dup_effects as number,
    orphan_effects: c.orphan_effects as number,
    dup_external: c.dup_external as number,
    max_attempts_seen: Math.max(...att.map((r) => r.max_attempts)),
    stuck_max_s: c.stuck_max_s as number | null,
    recovery_s: faults.map((f) => f.recovery_s ?? f.throughput_recovery_s ?? null) as number[],
    leases_lost: leasesLost,
    fenced_rejections: fenced,
    deadlocks: c.deadlocks as number,
    p50_ms: (all.p50 as number | null) === null ? null : round(all.p50),
    p99_ms: (all.p99 as number | null) === null ? null : round(all.p99),
    notes,
    rescues: recovered,
    faults: faults.map((f) => ({ kind: f.kind, at: f.at, recovery_s: f.recovery_s, throughput_recovery_s: f.throughput_recovery_s })),
    p99_ratio_last_first: p99Ratio,
    p99_ratio_last_first_outside_faults: p99RatioCalm,
    pass,
  });
  const stamp = started.toISOString().replace(/[:.]/g, '-').slice(0, 19);
  const cols = [...new Set(rows.flatMap((r) => Object.keys(r)))];
  const csv = [cols.join(','), ...rows.map((r) => cols.map((k) => (r[k] === undefined || r[k] === null ? '' : String(r[k]))).join(','))].join('\n');
  const csvFile = writeResult(`s1-${stamp}-timeseries.csv`, `${csv}\n`);
  const jsonFile = writeResult(
    `s1-${stamp}.json`,
    `${JSON.stringify({ test: 'S1-short', started, finished, version, args: { MINUTES, RATE, WORKERS, CONCURRENCY, FAULT_GAP, FIRST_FAULT_S, ORDER }, profile: PROFILE, producer: produced, load_s: round(loadEndS), drain_s: drainS, faults, faults_by_kind: byKind, checks: c, latency_quick: { ...latency, all: { p50_ms: round(all.p50), p99_ms: round(all.p99) }, p99_ratio_last_first: p99Ratio }, latency_quick_outside_fault_windows: { ...latencyCalm, p99_ratio_last_first: p99RatioCalm }, p99_per_minute: perMinuteP99.map((r) => ({ minute: r.minute, n: r.n, p99_ms: round(r.p99) })), soak_workers: soak, soak_db: soakDb, inspector: inspectorFig, leases_lost: leasesLost, fenced_writes: fenced, rescues: recovered, archived_by_recoverer: H.metricSum('archivedByRecoverer'), unexpected, problems, soak_notes: soakNotes, pass }, null, 2)}\n`,
  );

  console.log(`\nS1-short — ${started.toISOString()} → ${finished.toISOString()}`);
  console.log(
    table([
      ['load', `${round(loadEndS)} s, producer ${JSON.stringify(produced)}`],
      ['drain', `${drainS} s`],
      ['faults', faults.length],
      ['I1 lost / unfinished / archived not by design', `${c.lost} / ${c.unfinished_all} / ${c.archived_not_by_design}`],
      ['I1 fa archived as designed', `${c.fa_not_archived} not archived`],
      ['I2 dup / orphan / missing effects', `${c.dup_effects} / ${c.orphan_effects} / ${c.missing_effects}`],
      ['I3 attempts by kind', c.attempts_by_kind],
      [
        'I4 stuck_max_s (bound 8) / stuck samples',
        `${c.stuck_max_s} at ${c.stuck_max_at instanceof Date ? c.stuck_max_at.toISOString() : c.stuck_max_at} / ${c.stuck_samples} (${c.samples} samples)`,
      ],
      ['I4 samples over the bound', (c.stuck_over_bound as string[]).join(', ') || 'none'],
      ['I5 token mismatches', c.token_mismatches],
      ['I6 early starts (of scheduled started)', `${c.early_starts} (of ${c.scheduled_started})`],
      ['I7 unique violations (max per sample)', c.uniq_violations],
      [
        'I8 dup ticks / tasks without tick / ticks without effect',
        `${c.cron_dup_ticks} / ${c.cron_tasks_without_tick}+${c.cron_rows_without_tick} / ${c.cron_ticks_without_effect} (${c.cron_ticks} ticks: ${JSON.stringify(c.cron_ticks_by_type)})`,
      ],
      ['deadlocks', c.deadlocks],
      ['dup_external (q, s, long, cron ran > once)', c.dup_external],
      ['leases lost / fenced / rescues', `${leasesLost} / ${fenced} / ${recovered}`],
      ['latency quick (enqueue → effect)', latency],
      ['p99 last/first quarter', p99Ratio],
      ['latency quick outside fault windows', latencyCalm],
      ['p99 last/first quarter outside fault windows', p99RatioCalm],
      ['soak per worker', soak],
      ['soak db', soakDb],
      ['inspector stats', inspectorFig],
      ['faults by kind', byKind],
      ['result', pass ? 'PASS' : `FAIL: ${problems.join('; ')}`],
      ['soak notes', soakNotes.join('; ') || 'none'],
    ]),
  );
  console.log('fault log:');
  for (const f of faults)
    console.log(
      `  ${f.at} (+${f.t_s} s) ${f.kind} ${f.target} — ${f.detail ?? ''}; healed ${f.heal_at}; recovery_s ${f.recovery_s ?? '-'}; throughput_recovery_s ${f.throughput_recovery_s ?? '-'}`,
    );
  console.log(`figures: ${jsonFile}\ntime series: ${csvFile}`);
} catch (err) {
  log(`FAILED: ${(err as Error)?.stack ?? err}`);
  recordFigures({ test: 'S1-short', notes: `FAILED: ${String((err as Error)?.message ?? err)}` });
} finally {
  await cleanup();
}
process.exit(exitCode);

/**
 * F19 cron-multi-scheduler (reliability plan §5.2, R3, R13, I8).
 *
 * Three scheduler processes (test/faults/children/cron-scheduler.ts) run the
 * same entries, `@every 1s` and `@every 2s`: one on the host clock, one with
 * the host clock 45 s ahead and one 30 s behind (libfaketime preloaded, as
 * Debian's `faketime -f` does, with FAKETIME_DONT_FAKE_MONOTONIC=1; preloaded
 * directly so that SIGKILL hits node, not faketime's parent process). The
 * library reads tick times from the database clock (src/scheduler.ts), so the
 * skew must change nothing. Faults, about 30 s in all:
 *
 *   B  SIGKILL one scheduler, respawn it;
 *   C  SIGKILL two at once: the one 30 s behind runs alone for a while;
 *   D  SIGKILL all three for 5 s (the all-down window), then respawn only the
 *      one 45 s ahead, alone for 3 s, then the other two.
 *
 * Checked on scheduler_events (one row per (entry, tick), its primary key)
 * and the tasks: exactly one task per (entry, tick) (I8: no double fire, no
 * event without its task), every tick on the entry's grid, no missed tick
 * outside the all-down window, and after it the documented catch-up policy:
 * of the ticks missed while all were down only the most recent is enqueued.
 */
import assert from 'node:assert/strict';
import { spawn, type ChildProcess } from 'node:child_process';
import { createInterface } from 'node:readline';
import { fileURLToPath } from 'node:url';
import { after, before, test } from 'node:test';
import pg from 'pg';
import { migrate } from '../../src/index.js';
import { startCluster, type Cluster } from './cluster.js';
import { recordFigures } from './harness.js';

const SCHEMA = 'f19';
const REPO = fileURLToPath(new URL('../..', import.meta.url));
const CHILD = fileURLToPath(new URL('./children/cron-scheduler.ts', import.meta.url));
const LIBFAKETIME = '/usr/lib/x86_64-linux-gnu/faketime/libfaketimeMT.so.1';
const PERIOD_MS: Record<string, number> = { every1s: 1000, every2s: 2000 };
const DOWN_MS = 5000;
const PASS_SLACK_MS = 500;

interface Sched {
  name: string;
  skew: string;
  proc: ChildProcess;
  events: Record<string, any>[];
  ready: Promise<Record<string, any>>;
  exited: Promise<{ code: number | null; signal: NodeJS.Signals | null }>;
}

let cluster: Cluster;
let pool: pg.Pool;
const all: Sched[] = [];

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));
const dbNow = async (): Promise<number> => (await pool.query<{ t: Date }>('SELECT clock_timestamp() AS t')).rows[0]!.t.getTime();

function spawnScheduler(name: string, skew: string): Sched {
  const env: NodeJS.ProcessEnv = {
    ...process.env,
    DATABASE_URL: cluster.connectionString,
    SCHEMA,
    NAME: name,
    ENTRIES: JSON.stringify({ every1s: '1s', every2s: '2s' }),
    HEARTBEAT_MS: '1000',
    HOST_CLOCK: '1',
  };
  if (skew !== '') Object.assign(env, { LD_PRELOAD: LIBFAKETIME, FAKETIME: skew, FAKETIME_DONT_FAKE_MONOTONIC: '1' });
  const proc = spawn(process.execPath, ['--import', 'tsx', CHILD], { cwd: REPO, env, stdio: ['ignore', 'pipe', 'pipe'] });
  const events: Record<string, any>[] = [];
  let markReady!: (e: Record<string, any>) => void;
  const ready = new Promise<Record<string, any>>((resolve) => (markReady = resolve));
  const stderr: string[] = [];
  proc.stderr.setEncoding('utf8').on('data', (s: string) => stderr.push(s));
  createInterface({ input: proc.stdout }).on('line', (line) => {
    try {
      const e = JSON.parse(line) as Record<string, any>;
      events.push(e);
      if (e.event === 'ready') markReady(e);
    } catch {
      // not ours
    }
  });
  const exited = new Promise<{ code: number | null; signal: NodeJS.Signals | null }>((resolve) => proc.on('exit', (code, signal) => resolve({ code, signal })));
  const s: Sched = {
    name,
    skew,
    proc,
    events,
    ready: Promise.race([
      ready,
      exited.then((x) => Promise.reject(new Error(`${name} exited (${x.code ?? x.signal}) before ready: ${stderr.join('').slice(0, 500)}`))),
      // unref'd: a timer left behind must not keep the test process alive.
      new Promise<never>((_, reject) => setTimeout(() => reject(new Error(`${name} not ready in 60 s`)), 60_000).unref()),
    ]),
    exited,
  };
  s.ready.catch(() => {});
  all.push(s);
  return s;
}

async function kill(s: Sched): Promise<void> {
  s.proc.kill('SIGKILL');
  await s.exited;
}

const T = performance.now();
const mark = (what: string) => process.env.F19_DEBUG && console.error(`[f19] ${((performance.now() - T) / 1000).toFixed(1)} s ${what}`);
before(async () => {
  mark('before');
  cluster = await startCluster();
  mark('cluster');
  await migrate({ connectionString: cluster.connectionString, schema: SCHEMA });
  pool = new pg.Pool({ connectionString: cluster.connectionString, max: 2, application_name: 'harness' });
});

after(async () => {
  for (const s of all) if (s.proc.exitCode === null && s.proc.signalCode === null) s.proc.kill('SIGKILL');
  await Promise.all(all.map((s) => s.exited));
  mark('children gone');
  await pool?.end();
  cluster?.destroy();
  mark('destroyed');
});

test('F19: three schedulers (+0, +45 s, -30 s host clocks), SIGKILLed in turn and all at once: one task per tick, catch-up as documented', async () => {
  const started = performance.now();
  const skews = ['', '+45s', '-30s'];
  const names = ['plain', 'ahead45', 'behind30'];
  const current = names.map((n, i) => spawnScheduler(n, skews[i]!));
  const readies = await Promise.all(current.map((s) => s.ready));
  mark('ready');
  const t0 = await dbNow();
  // The skew took effect: each child saw its own host clock.
  const seenSkew = readies.map((r) => Math.round((Date.parse(r.hostNow) - t0) / 1000));
  assert.ok(Math.abs(seenSkew[1]! - 45) <= 10 && Math.abs(seenSkew[2]! + 30) <= 10 && Math.abs(seenSkew[0]!) <= 10, `host clocks seen: ${seenSkew}`);
  const entryIds = readies[0]!.entries as Record<string, string>;
  for (const r of readies) assert.deepEqual(r.entries, entryIds, 'every scheduler derives the same entry ids');

  const respawn = async (i: number) => {
    current[i] = spawnScheduler(names[i]!, skews[i]!);
    await current[i].ready;
  };
  // A: all three. B: one killed and respawned.
  await sleep(3000);
  await kill(current[0]!);
  await sleep(1000);
  await respawn(0);
  // C: two killed at once; the one 30 s behind runs alone.
  await sleep(1500);
  await Promise.all([kill(current[0]!), kill(current[1]!)]);
  await sleep(3000);
  await Promise.all([respawn(0), respawn(1)]);
  // D: all down, then the one 45 s ahead alone, then all.
  await sleep(1500);
  const downAt = await dbNow();
  await Promise.all(current.map((s) => kill(s)));
  await sleep(DOWN_MS);
  await respawn(1);
  const upAt = await dbNow();
  await sleep(3000);
  await Promise.all([respawn(0), respawn(2)]);
  // E: all three, then a clean stop.
  await sleep(3000);
  for (const s of current) s.proc.kill('SIGTERM');
  const exits = await Promise.all(current.map((s) => s.exited));
  assert.deepEqual(
    exits.map((x) => x.code),
    [0, 0, 0],
    'schedulers exit 0 on SIGTERM',
  );
  const wallS = (performance.now() - started) / 1000;
  mark('stopped');

  const events = (
    await pool.query<{ entry_id: string; tick: number; task_id: string; delay_ms: number; task_exists: boolean }>(
      `SELECT e.entry_id, (extract(epoch FROM e.tick_at) * 1000)::float8 AS tick, e.task_id,
              (extract(epoch FROM e.enqueued_at - e.tick_at) * 1000)::float8 AS delay_ms,
              EXISTS (SELECT 1 FROM "${SCHEMA}".tasks t WHERE t.id = e.task_id) AS task_exists
       FROM "${SCHEMA}".scheduler_events e ORDER BY e.entry_id, e.tick_at`,
    )
  ).rows;
  const tasks = (await pool.query<{ type: string; n: number }>(`SELECT type, count(*)::int AS n FROM "${SCHEMA}".tasks GROUP BY type`)).rows;

  const problems: string[] = [];
  let doubleFires = 0;
  let missedFires = 0;
  let maxDelayMs = 0;
  let skippedByPolicy = 0;
  for (const [label, entryId] of Object.entries(entryIds)) {
    const p = PERIOD_MS[label]!;
    const ev = events.filter((e) => e.entry_id === entryId);
    const type = label === 'every1s' ? 'cron:1s' : 'cron:2s';
    const nTasks = tasks.find((t) => t.type === type)?.n ?? 0;
    // I8: one task per recorded tick, and no task without its tick.
    doubleFires += Math.max(0, nTasks - ev.length) + (ev.length - new Set(ev.map((e) => e.task_id)).size);
    const noTask = ev.filter((e) => !e.task_exists).length;
    if (noTask > 0) problems.push(`${label}: ${noTask} recorded ticks without their task`);
    if (nTasks !== ev.length) problems.push(`${label}: ${nTasks} tasks for ${ev.length} ticks`);
    const offGrid = ev.filter((e) => e.tick % p !== 0).length;
    if (offGrid > 0) problems.push(`${label}: ${offGrid} ticks off the @every grid`);
    if (ev.length < 10) problems.push(`${label}: only ${ev.length} ticks recorded`);

    // Gaps: consecutive recorded ticks more than one period apart.
    let gapsInWindow = 0;
    for (let i = 1; i < ev.length; i++) {
      const prev = ev[i - 1]!;
      const e = ev[i]!;
      const missing = Math.round((e.tick - prev.tick) / p) - 1;
      if (missing === 0) {
        maxDelayMs = Math.max(maxDelayMs, e.delay_ms);
        continue;
      }
      // The ticks missed must all fall in the all-down window: after the kill (less one
      // period: a tick being fired as they died), before the first respawned scheduler ran
      // (upAt: just after it said it was ready; 1 s of slack for its first pass).
      const inWindow = prev.tick + p >= downAt - p && e.tick > downAt && e.tick <= upAt + 1000;
      if (!inWindow) {
        missedFires += missing;
        problems.push(`${label}: ${missing} ticks missed after ${new Date(prev.tick).toISOString()}, outside the all-down window`);
        continue;
      }
      gapsInWindow++;
      skippedByPolicy += missing;
      // Catch-up: the tick enqueued after the gap is the most recent one at the time (fired within one period of it)…
      // enqueued_at is the tick transaction's start, which follows the pass's clock read by its own round trips
      // (2,001 ms once on a loaded machine): PASS_SLACK_MS allows for them. The policies this guards against,
      // every missed tick or the oldest, enqueue ticks DOWN_MS late.
      if (!(e.delay_ms >= 0 && e.delay_ms < p + PASS_SLACK_MS))
        problems.push(
          `${label}: after the all-down window the tick ${new Date(e.tick).toISOString()} was enqueued ${e.delay_ms} ms late: not the most recent missed tick`,
        );
    }
    if (gapsInWindow !== 1) problems.push(`${label}: ${gapsInWindow} gaps in the all-down window (want exactly 1: ${DOWN_MS} ms down > one period)`);
  }
  const childErrors = all.flatMap((s) =>
    s.events.filter((e) => e.event === 'log' && (e.level === 'error' || e.level === 'fatal')).map((e) => `${s.name}: ${e.msg} ${e.err?.message ?? ''}`),
  );
  const childWarnings = all.flatMap((s) => s.events.filter((e) => e.event === 'log' && e.level === 'warn')).length;

  recordFigures({
    test: 'F19',
    profile: 'fast',
    tasks: tasks.reduce((s, t) => s + t.n, 0),
    lost: 0,
    dup_effects: 0,
    orphan_effects: 0,
    double_fires: doubleFires,
    missed_fires: missedFires,
    max_fire_delay_s: Math.round(maxDelayMs) / 1000,
    skipped_by_catch_up: skippedByPolicy,
    host_skews_s: seenSkew,
    scheduler_errors: childErrors.length,
    scheduler_warnings: childWarnings,
    notes:
      `3 schedulers (host clock +0, +45 s, -30 s via libfaketime), @every 1s and @every 2s, ${wallS.toFixed(0)} s; SIGKILL one, then two ` +
      `(the -30 s one alone 3 s), then all for ${DOWN_MS / 1000} s (then the +45 s one alone 3 s); ${skippedByPolicy} ticks skipped by the catch-up policy ` +
      `(most recent missed tick only); ticks are computed and guarded on the database clock`,
  });
  assert.deepEqual(problems, []);
  assert.equal(doubleFires, 0, 'double fires');
  assert.equal(missedFires, 0, 'missed fires outside the all-down window');
  assert.deepEqual(childErrors, [], 'schedulers logged errors');
  assert.ok(maxDelayMs < 5000, `a tick was enqueued ${maxDelayMs} ms late`);
});

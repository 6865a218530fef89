/**
 * Scheduler ticks: exactly one task per tick however many schedulers run an
 * entry, across a handover, a killed process and downtime (catch-up), and
 * the history kept per entry. Ticks come from moving the schedulers' clock
 * an hour at a time, not from waiting for them.
 */
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { createInterface } from 'node:readline';
import { describe } from 'node:test';
import { Task, type Scheduler } from '../src/index.js';
import { HISTORY_LIMIT } from '../src/broker/scheduler.js';
import { DatabaseClock } from '../src/internal/clock.js';
import { test, waitFor } from './helpers.js';
import { HOUR, gapsMs, moveClock, nextHour, schedulerFile, type EventRow } from './shared.js';

const { db, reset, scheduler, events, assertOneTaskPerTick } = schedulerFile('t_scheduler_ticks');

/**
 * Moves `clock` to ten past the next hour `hours` times, each time waiting for the started schedulers
 * on it to enqueue that hour's tick of `id`. Their loops pass every 200 ms of real time and find the
 * tick due on the clock; nothing waits for a tick to come.
 */
async function tickHours(clock: DatabaseClock, id: string, hours: number): Promise<void> {
  for (let i = 0; i < hours; i++) {
    const before = (await events(id)).length;
    await moveClock(db, clock, nextHour);
    await waitFor(async () => (await events(id)).length > before, 20_000, "the hour's tick");
  }
}

/**
 * Loads each scheduler's entries on the clock as it stands, then starts them all: a new entry's first
 * tick is the next one after its first pass (the past is never replayed), so that pass must come
 * before the clock moves, not race it.
 */
async function startAll(...schedulers: Scheduler[]): Promise<void> {
  for (const s of schedulers) await s.runOnce();
  await Promise.all(schedulers.map((s) => s.start()));
}

/** Every gap between `ev` is one hour: no tick doubled or skipped. */
const hourly = (ev: EventRow[]) => assert.deepEqual(gapsMs(ev), Array(ev.length - 1).fill(HOUR), 'one tick an hour, none skipped');

describe('exactly once per tick', () => {
  for (const n of [2, 3]) {
    test(`${n} schedulers on one @every 1h entry: one task per tick, for several ticks`, { timeout: 60_000 }, async () => {
      await reset();
      const clock = new DatabaseClock();
      const schedulers = Array.from({ length: n }, () => scheduler({ clock }));
      const ids = schedulers.map((s) => s.register('@every 1h', new Task(`tick${n}`, { n })));
      assert.equal(new Set(ids).size, 1, 'all schedulers agree on the entry id');
      const id = ids[0]!;
      await startAll(...schedulers);
      await tickHours(clock, id, 6);
      await Promise.all(schedulers.map((s) => s.shutdown()));
      hourly(await assertOneTaskPerTick(id, `tick${n}`));
    });
  }

  test('a scheduler shut down and replaced by another: no double, no gap', { timeout: 60_000 }, async () => {
    await reset();
    const clock = new DatabaseClock();
    const task = new Task('relay');
    const first = scheduler({ clock });
    const id = first.register('@every 1h', task);
    await startAll(first);
    await tickHours(clock, id, 3);
    await first.shutdown();
    const second = scheduler({ clock });
    assert.equal(second.register('@every 1h', task), id);
    await startAll(second);
    await tickHours(clock, id, 3);
    await second.shutdown();
    hourly(await assertOneTaskPerTick(id, 'relay'));
  });

  // Real time here: the first scheduler is a child process, killed with SIGKILL, ticking every
  // second on the database's own clock. How many ticks the handover takes depends on the machine,
  // so what is asserted is what the catch-up policy makes exact (the clock-driven test above has
  // the exact continuity of a handover).
  test(
    'a scheduler process killed with SIGKILL and replaced: no double; the replacement goes on from the tick due when it started',
    { timeout: 60_000 },
    async () => {
      await reset();
      const child = spawn(process.execPath, ['--import', 'tsx', 'test/fixtures/scheduler.ts'], {
        env: { ...process.env, DATABASE_URL: db.connectionString, SCHEMA: db.schema },
        stdio: ['ignore', 'pipe', 'inherit'],
      });
      const exited = new Promise<void>((resolve) => child.on('exit', () => resolve()));
      let id: string;
      try {
        const lines = createInterface({ input: child.stdout });
        id = await new Promise<string>((resolve) => lines.on('line', (l) => resolve(JSON.parse(l).entryId)));
        await waitFor(async () => (await events(id)).length >= 2, 30_000, '2 ticks from the child');
      } finally {
        child.kill('SIGKILL');
      }
      await exited;
      const handedOver = (await events(id)).length;
      const restart = (await db.query<{ now: Date }>('SELECT now()'))[0]!.now.getTime();
      const replacement = scheduler();
      assert.equal(replacement.register('@every 1s', new Task('from-child')), id);
      await replacement.start();
      await waitFor(async () => (await events(id)).length >= handedOver + 3, 30_000, '3 ticks of the replacement');
      await replacement.shutdown();
      const ev = await assertOneTaskPerTick(id, 'from-child');
      const [last, next] = [ev[handedOver - 1]!.tick_at.getTime(), ev[handedOver]!.tick_at.getTime()];
      assert.ok(next > last, 'the tick after the handover is a new one');
      // Its first tick is the next after the child's last, or (if more were missed) the latest at its start: never an older one.
      assert.ok(next >= restart - 1000, `the replacement's first tick is ${restart - next} ms older than its start`);
    },
  );

  test('two schedulers, one stops: the other goes on alone, no tick lost', { timeout: 60_000 }, async () => {
    await reset();
    const clock = new DatabaseClock();
    const a = scheduler({ clock });
    const b = scheduler({ clock });
    const id = a.register('@every 1h', new Task('pair'));
    b.register('@every 1h', new Task('pair'));
    await startAll(a, b);
    await tickHours(clock, id, 3);
    await a.shutdown();
    await tickHours(clock, id, 3);
    await b.shutdown();
    hourly(await assertOneTaskPerTick(id, 'pair'));
  });

  test('catch-up: after downtime only the most recent missed tick is enqueued; a new entry never replays the past', async () => {
    await reset();
    const s = scheduler();
    const fresh = s.register('@every 1h', new Task('hourly-fresh'));
    const missed = s.register('@every 1h', new Task('hourly-missed'));
    const [{ latest }] = await db.query("SELECT date_trunc('hour', now() AT TIME ZONE 'UTC') AT TIME ZONE 'UTC' AS latest");
    // `missed` last ran 4 hours before its latest tick: 3 ticks were missed, plus the latest one.
    await db.query("INSERT INTO {{schema}}.scheduler_events (entry_id, tick_at, task_id) VALUES ($1, $2::timestamptz - interval '4 hours', 'old')", [
      missed,
      latest,
    ]);
    await s.runOnce();
    await s.runOnce();
    assert.equal((await events(fresh)).length, 0, 'no history: nothing replayed');
    const ev = await events(missed);
    assert.equal(ev.length, 2, 'the old event and one catch-up');
    const caught = ev[1] as EventRow;
    const [{ now }] = await db.query("SELECT date_trunc('hour', now() AT TIME ZONE 'UTC') AT TIME ZONE 'UTC' AS now");
    assert.ok([latest.getTime(), now.getTime()].includes(caught.tick_at.getTime()), 'the most recent tick, not an older one');
    assert.equal((await db.query("SELECT * FROM {{schema}}.tasks WHERE type = 'hourly-missed'")).length, 1);
    assert.equal((await db.query("SELECT * FROM {{schema}}.tasks WHERE type = 'hourly-fresh'")).length, 0);
  });

  test('a tick that conflicts (fixed taskId, unique lock) is recorded once with the task that holds it, not retried', { timeout: 60_000 }, async () => {
    await reset();
    const a = scheduler();
    const b = scheduler();
    const byId = a.register('@every 1s', new Task('fixed-id'), { taskId: 'the-one', retention: 3_600_000 });
    const unique = a.register('@every 1s', new Task('uniq', { k: 1 }), { unique: 3_600_000 });
    b.register('@every 1s', new Task('fixed-id'), { taskId: 'the-one', retention: 3_600_000 });
    b.register('@every 1s', new Task('uniq', { k: 1 }), { unique: 3_600_000 });
    await Promise.all([a.start(), b.start()]);
    await waitFor(async () => (await events(byId)).length >= 3 && (await events(unique)).length >= 3, 30_000, '3 ticks each');
    await Promise.all([a.shutdown(), b.shutdown()]);
    const idEvents = await events(byId);
    assert.deepEqual(new Set(idEvents.map((e) => e.task_id)), new Set(['the-one']));
    const uniqTasks = await db.query<{ id: string }>("SELECT id FROM {{schema}}.tasks WHERE type = 'uniq'");
    assert.equal(uniqTasks.length, 1, 'one task while the lock lives');
    assert.deepEqual(new Set((await events(unique)).map((e) => e.task_id)), new Set([uniqTasks[0]?.id]));
    assert.equal((await db.query("SELECT * FROM {{schema}}.tasks WHERE type = 'fixed-id'")).length, 1);
  });

  test(`history is kept per entry up to ${HISTORY_LIMIT} events, newest first`, async () => {
    await reset();
    const s = scheduler();
    const id = s.register('@every 1h', new Task('trimmed'));
    const [{ latest }] = await db.query("SELECT date_trunc('hour', now() AT TIME ZONE 'UTC') AT TIME ZONE 'UTC' AS latest");
    await db.query(
      "INSERT INTO {{schema}}.scheduler_events (entry_id, tick_at, task_id) SELECT $1, $2::timestamptz - k * interval '1 hour', 'old-' || k FROM generate_series(1, 1200) k",
      [id, latest],
    );
    await s.runOnce();
    const ev = await events(id);
    assert.equal(ev.length, HISTORY_LIMIT);
    assert.equal(ev.at(-1)?.task_id.startsWith('old-'), false, 'the new tick is kept');
    assert.equal(ev[0]?.task_id, `old-${HISTORY_LIMIT - 1}`, 'the oldest went');
  });
});

import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { createInterface } from 'node:readline';
import { describe } from 'node:test';
import {
  ClientClosedError,
  ConfigError,
  DatabaseUnavailableError,
  FailedPreconditionError,
  InvalidCronSpecError,
  PeriodicTaskManager,
  Scheduler,
  Task,
  ValidationError,
  type PeriodicTaskConfig,
  type SchedulerOptions,
} from '../src/index.js';
import { parseDuration, parseSchedule } from '../src/model/cron.js';
import { HISTORY_LIMIT } from '../src/broker/scheduler.js';
import { captureLog, LEVEL } from './logs.js';
import { dsnWith, setupDb, test, waitFor } from './helpers.js';

/** Schedulers and managers a test created are in `running`: shut down after each test, even one that failed half-way. */
const { db, running, reset } = setupDb('t_scheduler');

function scheduler(opts: SchedulerOptions = {}): Scheduler {
  const s = new Scheduler({ connectionString: db.connectionString, schema: db.schema, logger: false, heartbeatInterval: 200, ...opts });
  running.push(s);
  return s;
}

const iso = (d: Date | null) => d?.toISOString() ?? null;

/** The next `n` ticks strictly after `from`. */
function nexts(spec: string, from: string, n: number, location?: string): (string | null)[] {
  const s = parseSchedule(spec, location);
  const out: (string | null)[] = [];
  let at: Date | null = new Date(from);
  for (let i = 0; i < n && at; i++) out.push(iso((at = s.next(at))));
  return out;
}

interface EventRow {
  tick_at: Date;
  task_id: string;
  enqueued_at: Date;
}
const events = (entryId: string) =>
  db.query<EventRow>('SELECT tick_at, task_id, enqueued_at FROM {{schema}}.scheduler_events WHERE entry_id = $1 ORDER BY tick_at', [entryId]);

/**
 * Every event names a task that exists, no two events share a tick or a
 * task, and there are as many tasks of `type` as events: one task per tick.
 */
async function assertOneTaskPerTick(entryId: string, type: string): Promise<EventRow[]> {
  const ev = await events(entryId);
  const tasks = await db.query<{ id: string }>('SELECT id FROM {{schema}}.tasks WHERE type = $1', [type]);
  assert.equal(tasks.length, ev.length, `tasks (${tasks.length}) = events (${ev.length})`);
  assert.equal(new Set(ev.map((e) => e.tick_at.getTime())).size, ev.length, 'one event per tick');
  assert.deepEqual(new Set(ev.map((e) => e.task_id)), new Set(tasks.map((t) => t.id)), 'each event names its own task');
  for (const e of ev) assert.equal(e.tick_at.getTime() % 1000, 0, 'ticks on whole seconds');
  return ev;
}

const gapsMs = (ev: EventRow[]) => ev.slice(1).map((e, i) => e.tick_at.getTime() - (ev[i] as EventRow).tick_at.getTime());

describe('cron forms (pure: next and latest ticks of a given instant)', () => {
  test('five fields, in UTC by default', () => {
    assert.deepEqual(nexts('*/15 9-10 * * MON-FRI', '2024-06-07T10:40:00Z', 4), [
      '2024-06-07T10:45:00.000Z',
      '2024-06-10T09:00:00.000Z', // Friday → Monday
      '2024-06-10T09:15:00.000Z',
      '2024-06-10T09:30:00.000Z',
    ]);
    assert.deepEqual(nexts('0 0 29 2 *', '2024-03-01T00:00:00Z', 1), ['2028-02-29T00:00:00.000Z']);
  });

  test('an optional leading seconds field', () => {
    assert.deepEqual(nexts('*/20 * * * * *', '2024-01-01T00:00:00Z', 4), [
      '2024-01-01T00:00:20.000Z',
      '2024-01-01T00:00:40.000Z',
      '2024-01-01T00:01:00.000Z',
      '2024-01-01T00:01:20.000Z',
    ]);
    assert.deepEqual(nexts('30 0 12 * * *', '2024-01-01T12:00:30Z', 1), ['2024-01-02T12:00:30.000Z'], 'strictly after');
  });

  test('@yearly, @annually, @monthly, @weekly, @daily, @midnight, @hourly', () => {
    const from = '2024-05-15T10:20:30Z';
    assert.deepEqual(nexts('@yearly', from, 2), ['2025-01-01T00:00:00.000Z', '2026-01-01T00:00:00.000Z']);
    assert.deepEqual(nexts('@annually', from, 1), ['2025-01-01T00:00:00.000Z']);
    assert.deepEqual(nexts('@monthly', from, 2), ['2024-06-01T00:00:00.000Z', '2024-07-01T00:00:00.000Z']);
    assert.deepEqual(nexts('@weekly', from, 2), ['2024-05-19T00:00:00.000Z', '2024-05-26T00:00:00.000Z'], 'Sundays');
    assert.deepEqual(nexts('@daily', from, 2), ['2024-05-16T00:00:00.000Z', '2024-05-17T00:00:00.000Z']);
    assert.deepEqual(nexts('@midnight', from, 1), ['2024-05-16T00:00:00.000Z']);
    assert.deepEqual(nexts('@hourly', from, 2), ['2024-05-15T11:00:00.000Z', '2024-05-15T12:00:00.000Z']);
  });

  test('@every <duration> ticks at multiples of the duration since the Unix epoch', () => {
    assert.equal(parseDuration('1h30m'), 5_400_000);
    assert.equal(parseDuration('1.5h'), 5_400_000);
    assert.equal(parseDuration('2m500ms'), 120_500);
    assert.equal(parseDuration('5 m'), null);
    assert.deepEqual(nexts('@every 30s', '2024-01-01T00:00:10.500Z', 3), ['2024-01-01T00:00:30.000Z', '2024-01-01T00:01:00.000Z', '2024-01-01T00:01:30.000Z']);
    assert.deepEqual(nexts('@every 5m', '2024-01-01T00:04:59.999Z', 2), ['2024-01-01T00:05:00.000Z', '2024-01-01T00:10:00.000Z']);
    // 90 min since 1970-01-01T00:00Z: 2024-01-01T00:00Z is 19,723 days = 315,568 periods, so on a tick.
    assert.deepEqual(nexts('@every 1h30m', '2024-01-01T00:00:00Z', 2), ['2024-01-01T01:30:00.000Z', '2024-01-01T03:00:00.000Z']);
    const every = parseSchedule('@every 1s');
    assert.equal(every.everyMs, 1000);
    assert.equal(iso(every.latest(new Date('2024-01-01T00:00:07.999Z'))), '2024-01-01T00:00:07.000Z');
    assert.equal(iso(every.latest(new Date('2024-01-01T00:00:07.000Z'))), '2024-01-01T00:00:07.000Z', 'a tick at the instant is the latest');
    // Independent of the zone: the same instants everywhere.
    assert.deepEqual(nexts('@every 5m', '2024-01-01T00:01:00Z', 1, 'Asia/Kolkata'), ['2024-01-01T00:05:00.000Z']);
  });

  test('the location option and a CRON_TZ= (or TZ=) prefix, which wins over it', () => {
    assert.deepEqual(nexts('0 9 * * *', '2024-01-10T00:00:00Z', 1, 'America/New_York'), ['2024-01-10T14:00:00.000Z'], 'EST');
    assert.deepEqual(nexts('0 9 * * *', '2024-07-10T00:00:00Z', 1, 'America/New_York'), ['2024-07-10T13:00:00.000Z'], 'EDT');
    assert.deepEqual(nexts('CRON_TZ=Asia/Tokyo 0 9 * * *', '2024-01-10T00:00:00Z', 1, 'America/New_York'), ['2024-01-11T00:00:00.000Z']);
    assert.deepEqual(nexts('TZ=Asia/Tokyo 0 9 * * *', '2024-01-10T00:00:00Z', 1), ['2024-01-11T00:00:00.000Z']);
    assert.equal(parseSchedule('CRON_TZ=Asia/Tokyo @daily').zone, 'Asia/Tokyo');
    assert.deepEqual(nexts('CRON_TZ=Asia/Tokyo @daily', '2024-01-10T00:00:00Z', 1), ['2024-01-10T15:00:00.000Z']);
  });

  test('DST in Europe/Berlin: a skipped 02:30 runs at 03:00, a repeated one once; interval specs follow real time', () => {
    const z = 'Europe/Berlin';
    // 2024-03-31 02:00 CET → 03:00 CEST: 02:30 does not exist that day.
    assert.deepEqual(nexts('30 2 * * *', '2024-03-30T12:00:00Z', 3, z), [
      '2024-03-31T01:00:00.000Z', // 03:00 CEST, the first instant after the gap
      '2024-04-01T00:30:00.000Z', // 02:30 CEST
      '2024-04-02T00:30:00.000Z',
    ]);
    // 2024-10-27 03:00 CEST → 02:00 CET: 02:30 happens twice; it runs once, at the first.
    assert.deepEqual(nexts('30 2 * * *', '2024-10-26T12:00:00Z', 2, z), ['2024-10-27T00:30:00.000Z', '2024-10-28T01:30:00.000Z']);
    // Every 30 minutes: no run in the gap, both runs in the repeated hour, always 30 min apart.
    const spring = nexts('*/30 * * * *', '2024-03-31T00:00:00Z', 4, z);
    assert.deepEqual(spring, ['2024-03-31T00:30:00.000Z', '2024-03-31T01:00:00.000Z', '2024-03-31T01:30:00.000Z', '2024-03-31T02:00:00.000Z']);
    const fall = nexts('*/30 * * * *', '2024-10-26T23:45:00Z', 6, z);
    assert.deepEqual(fall, [
      '2024-10-27T00:00:00.000Z', // 02:00 CEST
      '2024-10-27T00:30:00.000Z', // 02:30 CEST
      '2024-10-27T01:00:00.000Z', // 02:00 CET
      '2024-10-27T01:30:00.000Z', // 02:30 CET
      '2024-10-27T02:00:00.000Z',
      '2024-10-27T02:30:00.000Z',
    ]);
  });

  test('DST in America/New_York: @daily is 24 h, 23 h or 25 h of real time; hourly skips 02:00 in spring', () => {
    const z = 'America/New_York';
    // 2024-03-10 02:00 EST → 03:00 EDT; 2024-11-03 02:00 EDT → 01:00 EST.
    assert.deepEqual(nexts('@daily', '2024-03-09T12:00:00Z', 3, z), ['2024-03-10T05:00:00.000Z', '2024-03-11T04:00:00.000Z', '2024-03-12T04:00:00.000Z']);
    assert.deepEqual(nexts('@daily', '2024-11-02T12:00:00Z', 3, z), ['2024-11-03T04:00:00.000Z', '2024-11-04T05:00:00.000Z', '2024-11-05T05:00:00.000Z']);
    assert.deepEqual(nexts('0 * * * *', '2024-03-10T06:30:00Z', 3, z), ['2024-03-10T07:00:00.000Z', '2024-03-10T08:00:00.000Z', '2024-03-10T09:00:00.000Z']);
  });

  test('latest(t) is the last tick at or before t, next(latest(t)) is after t, across DST edges', () => {
    const cases: [string, string][] = [
      ['30 2 * * *', 'Europe/Berlin'],
      ['*/30 * * * *', 'Europe/Berlin'],
      ['0 */2 * * *', 'America/New_York'],
      ['15 1 * * *', 'America/New_York'],
      ['*/7 * * * * *', 'UTC'],
      ['@every 1h30m', 'UTC'],
    ];
    const windows = ['2024-03-30T20:00:00Z', '2024-10-26T20:00:00Z', '2024-03-09T20:00:00Z', '2024-11-02T20:00:00Z'];
    for (const [spec, zone] of cases) {
      const s = parseSchedule(spec, zone);
      for (const w of windows) {
        for (let k = 0; k < 200; k++) {
          const t = new Date(new Date(w).getTime() + k * 7 * 60_000 + (k % 3) * 1000);
          const l = s.latest(t);
          assert.ok(l !== null && l <= t, `${spec} ${zone}: latest(${t.toISOString()}) = ${iso(l)}`);
          const n = s.next(l);
          assert.ok(n !== null && n > t, `${spec} ${zone}: next(${iso(l)}) = ${iso(n)} is after ${t.toISOString()}`);
        }
      }
    }
  });
});

describe('validation', () => {
  test('a spec that does not parse, an unknown zone, a spec over 256 characters: ValidationError naming the field', () => {
    const s = scheduler();
    const task = new Task('t');
    const bad: [unknown, string][] = [
      ['', 'cronspec'],
      ['   ', 'cronspec'],
      ['not a cron', 'cronspec'],
      ['* * * *', 'cronspec'],
      ['* * * * * * *', 'cronspec'], // a year field is not ours
      ['61 * * * *', 'cronspec'],
      ['* 25 * * *', 'cronspec'],
      ['* * 32 * *', 'cronspec'],
      ['* * * 13 *', 'cronspec'],
      ['0 0 30 2 *', 'cronspec'], // parses, never fires
      ['@fortnightly', 'cronspec'],
      ['@reboot', 'cronspec'],
      ['@every', 'cronspec'],
      ['@every 500ms', 'cronspec'],
      ['@every 1.5s', 'cronspec'],
      ['@every 0s', 'cronspec'],
      ['@every 10x', 'cronspec'],
      ['@every 1m 2s', 'cronspec'],
      ['CRON_TZ=Mars/Olympus_Mons * * * * *', 'cronspec'],
      ['CRON_TZ= * * * * *', 'cronspec'],
      ['CRON_TZ=Europe/Berlin', 'cronspec'],
      [`0 0 1 1 *${' '.repeat(250)}`, 'cronspec'],
      [42, 'cronspec'],
      [null, 'cronspec'],
    ];
    for (const [spec, field] of bad) {
      assert.throws(
        () => s.register(spec as string, task),
        (err: unknown) => err instanceof InvalidCronSpecError && err instanceof ValidationError && err.field === field,
        `register(${JSON.stringify(spec)})`,
      );
    }
    assert.equal(s.entryIds().length, 0, 'nothing registered');
    s.register('* * * * *', task);
    assert.equal(s.entryIds().length, 1);
  });

  test('a bad location, task or option', () => {
    assert.throws(
      () => scheduler({ location: 'Nowhere/Special' }),
      (err: unknown) => err instanceof ConfigError && err.field === 'location',
    );
    assert.throws(
      () => scheduler({ location: '' }),
      (err: unknown) => err instanceof ConfigError && err.field === 'location',
    );
    assert.throws(
      () => scheduler({ heartbeatInterval: -1 }),
      (err: unknown) => err instanceof ConfigError && err.field === 'heartbeatInterval',
    );
    assert.throws(
      () => scheduler({ locaton: 'UTC' } as SchedulerOptions),
      (err: unknown) => err instanceof ConfigError && err.field === 'options.locaton',
    );
    const s = scheduler();
    assert.throws(
      () => s.register('@hourly', { type: 'x' } as unknown as Task),
      (err: unknown) => err instanceof ValidationError && err.field === 'task',
    );
    assert.throws(
      () => s.register('@hourly', new Task('t'), { maxRetry: -1 }),
      (err: unknown) => err instanceof ValidationError && err.field === 'maxRetry',
    );
    assert.throws(
      () => s.register('@hourly', new Task('t'), { processAt: new Date(), processIn: 5 }),
      (err: unknown) => err instanceof ValidationError && err.field === 'processAt',
    );
    assert.throws(
      () => s.unregister('nope'),
      (err: unknown) => err instanceof ValidationError && err.field === 'entryId',
    );
  });

  test('lifecycle: start twice is refused; after shutdown every call is ClientClosedError', async () => {
    await reset();
    const s = scheduler();
    await s.start();
    await assert.rejects(s.start(), ValidationError);
    await s.shutdown();
    await s.shutdown(); // twice is fine
    assert.throws(() => s.register('@hourly', new Task('t')), ClientClosedError);
    await assert.rejects(s.start(), ClientClosedError);
  });
});

describe('entry ids', () => {
  test('derived from spec, zone, type, payload and options: equal across schedulers, different when any differs', () => {
    const a = scheduler();
    const b = scheduler();
    const id = a.register('*/5 * * * *', new Task('report', { x: 1, y: [1, 2] }), { queue: 'low' });
    assert.match(id, /^[0-9a-f]{32}$/);
    assert.equal(b.register('*/5 * * * *', new Task('report', { y: [1, 2], x: 1 }), { queue: 'low' }), id, 'key order does not matter');
    assert.equal(
      b.register('*/5  *  * * *', new Task('report', { x: 1, y: [1, 2] }, { queue: 'low' })),
      id,
      'spacing, and options given to the Task or to register',
    );
    assert.equal(a.register('*/5 * * * *', new Task('report', { x: 1, y: [1, 2] }), { queue: 'low' }), id, 'registering twice is one entry');
    assert.equal(a.entryIds().length, 1);
    const others = [
      a.register('*/6 * * * *', new Task('report', { x: 1, y: [1, 2] }), { queue: 'low' }),
      a.register('*/5 * * * *', new Task('report2', { x: 1, y: [1, 2] }), { queue: 'low' }),
      a.register('*/5 * * * *', new Task('report', { x: 2, y: [1, 2] }), { queue: 'low' }),
      a.register('*/5 * * * *', new Task('report', { x: 1, y: [1, 2] }), { queue: 'high' }),
      a.register('*/5 * * * *', new Task('report', { x: 1, y: [1, 2] }), { queue: 'low', headers: { h: '1' } }),
      a.register('*/5 * * * *', new Task('report', Buffer.from('bytes')), { queue: 'low' }),
      scheduler({ location: 'Europe/Berlin' }).register('*/5 * * * *', new Task('report', { x: 1, y: [1, 2] }), { queue: 'low' }),
    ];
    assert.equal(new Set([id, ...others]).size, others.length + 1);
    // With a CRON_TZ prefix the location does not matter.
    const tz = 'CRON_TZ=Asia/Tokyo 0 9 * * *';
    assert.equal(scheduler({ location: 'Europe/Berlin' }).register(tz, new Task('t')), scheduler().register(tz, new Task('t')));
  });
});

describe('exactly once per tick', () => {
  for (const n of [2, 3]) {
    test(`${n} schedulers on one @every 1s entry: one task per tick, for several ticks`, { timeout: 60_000 }, async () => {
      await reset();
      const schedulers = Array.from({ length: n }, () => scheduler());
      const ids = schedulers.map((s) => s.register('@every 1s', new Task(`tick${n}`, { n })));
      assert.equal(new Set(ids).size, 1, 'all schedulers agree on the entry id');
      const id = ids[0] as string;
      await Promise.all(schedulers.map((s) => s.start()));
      await waitFor(async () => (await events(id)).length >= 6, 30_000, '6 ticks');
      await Promise.all(schedulers.map((s) => s.shutdown()));
      const ev = await assertOneTaskPerTick(id, `tick${n}`);
      const gaps = gapsMs(ev);
      // Ticks are not replayed: a tick a stalled process missed is skipped, so only "no duplicates" is exact.
      assert.ok(
        gaps.every((g) => g >= 1000),
        `gaps ${gaps.join(',')}`,
      );
    });
  }

  test('a scheduler killed and replaced by another: no double, no gap beyond one tick', { timeout: 60_000 }, async () => {
    await reset();
    const task = new Task('relay');
    const first = scheduler();
    const id = first.register('@every 1s', task);
    await first.start();
    await waitFor(async () => (await events(id)).length >= 3, 30_000, '3 ticks of the first');
    await first.shutdown();
    const handedOver = (await events(id)).length;
    const second = scheduler();
    assert.equal(second.register('@every 1s', task), id);
    await second.start();
    await waitFor(async () => (await events(id)).length >= handedOver + 3, 30_000, '3 ticks of the second');
    await second.shutdown();
    const ev = await assertOneTaskPerTick(id, 'relay');
    const gaps = gapsMs(ev);
    assert.ok(
      gaps.every((g) => g >= 1000 && g <= 2000),
      `gaps ${gaps.join(',')}`,
    );
  });

  test('a scheduler process killed with SIGKILL and replaced: no double, no gap beyond one tick', { timeout: 60_000 }, async () => {
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
    const replacement = scheduler();
    assert.equal(replacement.register('@every 1s', new Task('from-child')), id);
    await replacement.start();
    await waitFor(async () => (await events(id)).length >= handedOver + 3, 30_000, '3 ticks of the replacement');
    await replacement.shutdown();
    const ev = await assertOneTaskPerTick(id, 'from-child');
    assert.ok(
      gapsMs(ev).every((g) => g >= 1000 && g <= 2000),
      `gaps ${gapsMs(ev).join(',')}`,
    );
  });

  test('two schedulers, one stops: the other goes on alone without a gap beyond one tick', { timeout: 60_000 }, async () => {
    await reset();
    const a = scheduler();
    const b = scheduler();
    const id = a.register('@every 1s', new Task('pair'));
    b.register('@every 1s', new Task('pair'));
    await Promise.all([a.start(), b.start()]);
    await waitFor(async () => (await events(id)).length >= 3, 30_000, '3 ticks');
    await a.shutdown();
    const atStop = (await events(id)).length;
    await waitFor(async () => (await events(id)).length >= atStop + 3, 30_000, '3 more ticks');
    await b.shutdown();
    const ev = await assertOneTaskPerTick(id, 'pair');
    assert.ok(
      gapsMs(ev).every((g) => g >= 1000 && g <= 2000),
      `gaps ${gapsMs(ev).join(',')}`,
    );
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

describe('registry', () => {
  test('entries show in scheduler_entries with next and prev, refreshed, removed at shutdown; history stays', { timeout: 30_000 }, async () => {
    await reset();
    const s = scheduler();
    const id = s.register('@every 1s', new Task('listed', { a: 1 }, { queue: 'low' }), { maxRetry: 3 });
    await s.start();
    const row = await waitFor(
      async () => {
        const [r] = await db.query('SELECT * FROM {{schema}}.scheduler_entries WHERE id = $1', [id]);
        return r?.prev_run_at ? r : undefined;
      },
      20_000,
      'entry with a prev run',
    );
    assert.equal(row.spec, '@every 1s');
    assert.equal(row.task_type, 'listed');
    assert.deepEqual(row.payload, { a: 1 });
    assert.deepEqual(row.options, { queue: 'low', maxRetry: 3 });
    assert.equal(row.location, 'UTC');
    assert.equal(row.scheduler_id, s.id);
    assert.ok(row.next_run_at > row.prev_run_at);
    assert.ok(row.expires_at > row.heartbeat_at);
    const beat = row.heartbeat_at as Date;
    await waitFor(
      async () => (await db.query('SELECT heartbeat_at FROM {{schema}}.scheduler_entries WHERE id = $1', [id]))[0]?.heartbeat_at > beat,
      20_000,
      'a refresh',
    );
    await s.shutdown();
    assert.equal((await db.query('SELECT * FROM {{schema}}.scheduler_entries')).length, 0);
    assert.ok((await events(id)).length > 0, 'history outlives the scheduler');
  });

  test('unregister removes the entry (no more ticks); an entry nobody refreshes expires', { timeout: 30_000 }, async () => {
    await reset();
    await db.query(
      "INSERT INTO {{schema}}.scheduler_entries (id, spec, task_type, scheduler_id, expires_at) VALUES ('stale', '@hourly', 'x', 'gone:1:x', now() - interval '1 second')",
    );
    const s = scheduler();
    const keep = s.register('@every 1h', new Task('keep'));
    const drop = s.register('@every 1s', new Task('drop'));
    await s.start();
    assert.deepEqual(
      (await db.query('SELECT id FROM {{schema}}.scheduler_entries ORDER BY id')).map((r) => r.id).sort(),
      [keep, drop].sort(),
      'stale expired at start',
    );
    await waitFor(async () => (await events(drop)).length >= 1, 20_000, 'a tick of drop');
    s.unregister(drop);
    assert.deepEqual(s.entryIds(), [keep]);
    await waitFor(async () => (await db.query('SELECT id FROM {{schema}}.scheduler_entries')).length === 1, 20_000, 'drop unlisted');
    const n = (await events(drop)).length;
    await s.runOnce();
    assert.equal((await events(drop)).length, n, 'no tick after unregister');
  });

  test('run() shuts down on SIGTERM (child process): exit 0, its entries removed', { timeout: 60_000 }, async () => {
    await reset();
    const child = spawn(process.execPath, ['--import', 'tsx', 'test/fixtures/scheduler.ts'], {
      env: { ...process.env, DATABASE_URL: db.connectionString, SCHEMA: db.schema },
      stdio: ['ignore', 'pipe', 'inherit'],
    });
    const exited = new Promise<number | null>((resolve) => child.on('exit', (code) => resolve(code)));
    try {
      const lines = createInterface({ input: child.stdout });
      const id = await new Promise<string>((resolve) => lines.on('line', (l) => resolve(JSON.parse(l).entryId)));
      await waitFor(async () => (await events(id)).length >= 1, 30_000, 'a tick from the child');
      assert.equal((await db.query('SELECT * FROM {{schema}}.scheduler_entries WHERE id = $1', [id])).length, 1);
      child.kill('SIGTERM');
      assert.equal(await exited, 0);
      assert.equal((await db.query('SELECT * FROM {{schema}}.scheduler_entries WHERE id = $1', [id])).length, 0);
    } finally {
      child.kill('SIGKILL');
    }
  });
});

describe('PeriodicTaskManager', () => {
  function manager(getConfigs: () => PeriodicTaskConfig[] | Promise<PeriodicTaskConfig[]>, syncInterval = 100): PeriodicTaskManager {
    const m = new PeriodicTaskManager({
      connectionString: db.connectionString,
      schema: db.schema,
      logger: false,
      heartbeatInterval: 200,
      syncInterval,
      getConfigs,
    });
    running.push(m);
    return m;
  }
  const listed = async () => (await db.query<{ id: string }>('SELECT id FROM {{schema}}.scheduler_entries')).map((r) => r.id).sort();

  test('adds, updates and removes entries to match the provider', { timeout: 30_000 }, async () => {
    await reset();
    let configs: PeriodicTaskConfig[] = [
      { cronspec: '@every 1h', task: new Task('a') },
      { cronspec: '0 3 * * *', task: new Task('b', { v: 1 }) },
      { cronspec: '@daily', task: new Task('c'), opts: { queue: 'low' } },
    ];
    const m = manager(() => configs);
    await m.start();
    const ref = scheduler(); // ids as any scheduler derives them
    const idsOf = (cs: PeriodicTaskConfig[]) => cs.map((c) => ref.register(c.cronspec, c.task, c.opts)).sort();
    assert.deepEqual(m.scheduler.entryIds().sort(), idsOf(configs));
    await waitFor(async () => (await listed()).length === 3, 20_000, '3 entries listed');
    assert.deepEqual(await listed(), idsOf(configs));

    const own = m.scheduler.register('@every 3h', new Task('own')); // not the provider's: syncs leave it alone
    configs = [
      { cronspec: '@every 1h', task: new Task('a') }, // kept
      { cronspec: '0 4 * * *', task: new Task('b', { v: 1 }) }, // b updated: a new spec
      { cronspec: '@every 2h', task: new Task('d') }, // added; c removed
    ];
    const want = [...idsOf(configs), own].sort();
    await waitFor(() => JSON.stringify(m.scheduler.entryIds().sort()) === JSON.stringify(want), 20_000, 'entries synced');
    await waitFor(async () => JSON.stringify(await listed()) === JSON.stringify(want), 20_000, 'registry synced');
  });

  test('a failing provider or an invalid config leaves the entries as they are; at start it rejects', { timeout: 30_000 }, async () => {
    await reset();
    let mode: 'ok' | 'throw' | 'invalid' = 'ok';
    let calls = 0;
    const m = manager(() => {
      calls++;
      if (mode === 'throw') throw new Error('provider down');
      if (mode === 'invalid')
        return [
          { cronspec: '@every 1h', task: new Task('x') },
          { cronspec: 'bogus', task: new Task('y') },
        ];
      return [{ cronspec: '@every 1h', task: new Task('x') }];
    });
    await m.start();
    const before = m.scheduler.entryIds();
    assert.equal(before.length, 1);
    for (const next of ['throw', 'invalid'] as const) {
      mode = next;
      const at = calls;
      await waitFor(() => calls >= at + 2, 20_000, `two syncs while ${next}`);
      assert.deepEqual(m.scheduler.entryIds(), before, `unchanged while ${next}`);
    }
    await assert.rejects(
      manager(() => Promise.reject(new Error('nope'))).start(),
      (err: unknown) => err instanceof ConfigError && /initial sync failed: nope/.test(err.message),
    );
    await assert.rejects(
      manager(() => [{ cronspec: '* *', task: new Task('z') }]).start(),
      (err: unknown) => err instanceof ConfigError && /configs\[0\]\.cronspec/.test(err.message),
    );
    assert.throws(
      () => new PeriodicTaskManager({ connectionString: db.connectionString, schema: db.schema } as never),
      (err: unknown) => err instanceof ConfigError && err.field === 'getConfigs',
    );
    assert.throws(
      () => manager(() => [], -5),
      (err: unknown) => err instanceof ConfigError && err.field === 'syncInterval',
    );
  });

  test('its entries are enqueued like any scheduler entry', { timeout: 30_000 }, async () => {
    await reset();
    const m = manager(() => [{ cronspec: '@every 1s', task: new Task('managed', { ok: true }) }]);
    await m.start();
    const [id] = m.scheduler.entryIds();
    await waitFor(async () => (await events(id as string)).length >= 2, 20_000, '2 ticks');
    await m.shutdown();
    await assertOneTaskPerTick(id as string, 'managed');
  });
});

describe('a database that cannot be used', () => {
  test('unknown database or role: start rejects at once with DatabaseUnavailableError naming it', { timeout: 30_000 }, async () => {
    for (const [parts, reason, name] of [
      [{ database: 'no_such_db_sched' }, 'database-not-found', 'no_such_db_sched'],
      [{ user: 'no_such_role_sched' }, 'authentication-failed', 'no_such_role_sched'],
    ] as const) {
      const s = scheduler({ connectionString: dsnWith(parts) });
      s.register('@every 1s', new Task('t'));
      const t0 = performance.now();
      await assert.rejects(s.start(), (err: unknown) => err instanceof DatabaseUnavailableError && err.reason === reason && err.message.includes(`"${name}"`));
      assert.ok(performance.now() - t0 < 10_000);
      assert.equal(s.status, 'new');
    }
  });

  test('refused connection (port 1): start resolves, warns once, and retries in the background; stop and start lines', { timeout: 30_000 }, async () => {
    const log = captureLog('info');
    const s = scheduler({ connectionString: dsnWith({ port: 1 }), logger: log.logger });
    s.register('@every 1s', new Task('t'));
    await s.start();
    assert.equal(s.status, 'active');
    const warn = await log.find('database unreachable; retrying in the background');
    assert.equal(warn.level, LEVEL.warn);
    assert.match((warn.err as { message: string }).message, /ECONNREFUSED/);
    const started = await log.find('scheduler started');
    assert.equal(started.schedulerId, s.id);
    assert.equal(started.entries, 1);
    await new Promise((r) => setTimeout(r, 500));
    assert.ok(log.lines.filter((l) => l.level >= LEVEL.warn).length <= 2, 'rate-limited');
    await s.shutdown();
    await log.find('scheduler stopped');
  });

  test('an unmigrated schema: start rejects with FailedPreconditionError saying to migrate, and creates nothing', { timeout: 30_000 }, async () => {
    const schema = `${db.schema}_never`;
    await db.pool.query(`DROP SCHEMA IF EXISTS "${schema}" CASCADE`);
    const s = scheduler({ schema });
    s.register('@every 1s', new Task('t'));
    await assert.rejects(
      s.start(),
      (err: unknown) => err instanceof FailedPreconditionError && /^schema "\w+_never" is not migrated \(.*\): run `pgasynq migrate`/.test(err.message),
    );
    assert.equal((await db.pool.query('SELECT 1 FROM pg_namespace WHERE nspname = $1', [schema])).rowCount, 0);
  });
});

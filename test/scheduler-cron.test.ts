/**
 * The Scheduler's cron specs (the forms, zones, DST, next and latest ticks),
 * what register() and the options refuse, and entry ids.
 */
import assert from 'node:assert/strict';
import { describe } from 'node:test';
import { ClientClosedError, ConfigError, InvalidCronSpecError, Task, ValidationError, type SchedulerOptions } from '../src/index.js';
import { parseDuration, parseSchedule } from '../src/model/cron.js';
import { test } from './helpers.js';
import { schedulerFile } from './shared.js';

const { reset, scheduler } = schedulerFile('t_scheduler_cron');

const iso = (d: Date | null) => d?.toISOString() ?? null;

/** The next `n` ticks strictly after `from`. */
function nexts(spec: string, from: string, n: number, location?: string): (string | null)[] {
  const s = parseSchedule(spec, location);
  const out: (string | null)[] = [];
  let at: Date | null = new Date(from);
  for (let i = 0; i < n && at; i++) out.push(iso((at = s.next(at))));
  return out;
}

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

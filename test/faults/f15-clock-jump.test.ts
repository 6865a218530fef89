/**
 * F15 clock-jump-during-run (plan §5.2): a worker's host clock jumps an hour
 * ahead, then an hour behind, then back, while it runs tasks beside a worker
 * on true time (libfaketime reading its offset from a file on every call,
 * the monotonic clock left real). Wall-clock jumps must change nothing (R3):
 * leases, due times and retries are the database's, and the worker's own
 * timers run on the monotonic clock. So: no lease lost, nothing rescued,
 * nothing early, no retry before its delay, nothing lost or run twice.
 *
 * The plan's variant, a monotonic clock that steps back, is not run here: a
 * libuv timer waits on that clock, so a step back of an hour holds every
 * timer of the process (heartbeats included) for the hour. The database then
 * sees the lease expire and the recoverer hands the task on; the frozen
 * worker's late writes are refused by the lease token (F03 shows that case).
 * What the worker's own code does with such a step — an extension or claim
 * whose reply comes back "before" it was sent loses the lease rather than
 * stretching its trust by the step — is tested in test/lease.test.ts.
 */
import assert from 'node:assert/strict';
import { writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { after, test } from 'node:test';
import { assertInvariants, createHarness, recordFigures, sleep, type Harness } from './harness.js';

const LIBFAKETIME = '/usr/lib/x86_64-linux-gnu/faketime/libfaketimeMT.so.1';
const MAX_RETRY = 3;
const RETRY_DELAY_MS = 1000;
let h: Harness | undefined;
after(() => h?.teardown());

test('F15 clock-jump-during-run: a worker whose wall clock jumps +1 h and -1 h mid-run changes nothing', { timeout: 240_000 }, async () => {
  h = await createHarness('f15');
  const harness = h;
  const offsetFile = join(h.logDir, 'faketime-offset');
  writeFileSync(offsetFile, '+0\n');
  const profile = { retryDelayMs: RETRY_DELAY_MS };
  const jumpy = await harness.spawnWorker('jumpy', {
    concurrency: 4,
    sleepMin: 100,
    sleepMax: 400,
    profile,
    env: { LD_PRELOAD: LIBFAKETIME, FAKETIME_TIMESTAMP_FILE: offsetFile, FAKETIME_NO_CACHE: '1', FAKETIME_DONT_FAKE_MONOTONIC: '1' },
  });
  await harness.spawnWorker('steady', { concurrency: 4, sleepMin: 100, sleepMax: 400, profile });
  h.startSampler();
  const plain = await h.spawnProducer({ count: 400, rate: 25, maxRetry: MAX_RETRY, scheduled: 0.3 });
  const flaky = await h.spawnProducer({ count: 60, rate: 4, maxRetry: MAX_RETRY, type: 'flaky' }, 'producer-flaky');
  const jumps: string[] = [];
  for (const offset of ['+3600', '-3600', '+0']) {
    await sleep(4000);
    writeFileSync(offsetFile, `${offset}\n`);
    jumps.push(offset);
  }
  await Promise.all([plain.exited, flaky.exited]);
  await h.waitDrained(120_000);
  await h.stopSampler();

  const c = await h.check({ maxRetry: MAX_RETRY, txTypes: ['tx', 'flaky'] });
  const [retries] = await h.query<{ n: number; early: number }>(
    `SELECT count(*)::int AS n, count(*) FILTER (WHERE s.at < a.at + $1 * interval '1 millisecond')::int AS early
     FROM {{schema}}.h_exec a
     JOIN LATERAL (SELECT min(x.at) AS at FROM {{schema}}.h_exec x WHERE x.task_id = a.task_id AND x.phase = 'start' AND x.at > a.at) s ON true
     WHERE a.phase = 'abort' AND a.detail = 'flaky'`,
    [RETRY_DELAY_MS],
  );
  const { n: jumpyStarts } = await h.one<{ n: number }>("SELECT count(*)::int AS n FROM {{schema}}.h_exec WHERE phase = 'start' AND worker LIKE 'jumpy:%'");
  const rescued = h.metricSum('recovered');
  const leasesLost = h.metricSum('leasesLost');
  recordFigures(
    h.figures('F15 clock-jump-during-run', c, {
      leases_lost: leasesLost,
      rescued,
      early_executions: c.earlyStarts,
      early_retries: retries!.early,
      jumpy_starts: jumpyStarts,
      notes: `one worker's wall clock set to ${jumps.join(', ')} s at 4 s intervals (libfaketime offset file, monotonic real) beside one on true time; 400 tasks (30 % due 0.5-2 s ahead) and 60 flaky ones`,
    }),
  );
  assert.deepEqual(assertInvariants(c, { maxRetry: MAX_RETRY, unexpected: h.unexpectedExits() }), []);
  assert.equal(leasesLost, 0, 'no lease lost to a jump');
  assert.equal(rescued, 0, 'nothing rescued');
  assert.equal(retries!.n, 60);
  assert.equal(retries!.early, 0, 'no retry before its delay on the database clock');
  assert.ok(jumpyStarts > 50, `the jumping worker kept working (${jumpyStarts} starts)`);
  assert.equal(jumpy.unexpectedExit(), false);
});

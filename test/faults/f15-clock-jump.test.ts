/**
 * F15 clock-jump-during-run (plan §5.2): a worker's host clock jumps an hour
 * ahead, then an hour behind, then back, while it runs tasks beside a worker
 * on true time (libfaketime reading its offset from a file on every call,
 * the monotonic clock left real). Wall-clock jumps must change nothing (R3):
 * leases, due times and retries are the database's, and the worker's own
 * timers run on the monotonic clock. So: no lease lost, nothing rescued,
 * nothing early, no retry before its delay, nothing lost or run twice. That
 * each jump took is checked too: the jumping worker's clock, as its metrics
 * lines show it, moves by the offset (the steady worker's does not), and it
 * starts tasks while an hour ahead and while an hour behind.
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
import { sleep } from './harness.js';
import { faultTest, report } from './kit.js';

const LIBFAKETIME = '/usr/lib/x86_64-linux-gnu/faketime/libfaketimeMT.so.1';
const MAX_RETRY = 3;
const RETRY_DELAY_MS = 1000;

faultTest(
  'F15 clock-jump-during-run: a worker whose wall clock jumps +1 h and -1 h mid-run changes nothing',
  { schema: 'f15', timeout: 240_000 },
  async (h) => {
    const offsetFile = join(h.logDir, 'faketime-offset');
    writeFileSync(offsetFile, '+0\n');
    const profile = { retryDelayMs: RETRY_DELAY_MS };
    const jumpy = await h.spawnWorker('jumpy', {
      concurrency: 4,
      sleepMin: 100,
      sleepMax: 400,
      profile,
      env: { LD_PRELOAD: LIBFAKETIME, FAKETIME_TIMESTAMP_FILE: offsetFile, FAKETIME_NO_CACHE: '1', FAKETIME_DONT_FAKE_MONOTONIC: '1' },
    });
    await h.spawnWorker('steady', { concurrency: 4, sleepMin: 100, sleepMax: 400, profile });
    h.startSampler();
    const plain = await h.spawnProducer({ count: 400, rate: 25, maxRetry: MAX_RETRY, scheduled: 0.3 });
    const flaky = await h.spawnProducer({ count: 60, rate: 4, maxRetry: MAX_RETRY, type: 'flaky' }, 'producer-flaky');
    // Each jump took: the jumping worker's host clock, in its next metrics lines (every 500 ms), against this
    // process's when the line arrived, moves by the offset within 10 s; when, on the database's clock.
    const jumps: { offset: string; observedS: number; at: Date }[] = [];
    for (const offset of ['+3600', '-3600', '+0']) {
      await sleep(4000);
      const since = Date.now();
      writeFileSync(offsetFile, `${offset}\n`);
      const at = await h.dbNow();
      const seen = await jumpy
        .waitEvent(
          (e) => e.event === 'metrics' && e.receivedAt > since && Math.abs((e.hostNow - e.receivedAt) / 1000 - Number(offset)) <= 5,
          10_000,
          `its clock at ${offset} s`,
        )
        .catch(() => undefined);
      const last = jumpy.events.findLast((e) => e.event === 'metrics')!;
      jumps.push({ offset, observedS: Math.round(((seen ?? last).hostNow - (seen ?? last).receivedAt) / 1000), at });
      assert.ok(seen, `the jump to ${offset} s took: jumpy's clock reads ${jumps.at(-1)!.observedS} s off`);
    }
    const steady = h.children.find((w) => w.name === 'steady')!.events.findLast((e) => e.event === 'metrics')!;
    const steadyOffsetS = Math.round((steady.hostNow - steady.receivedAt) / 1000);
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
    // What the jumping worker started while an hour ahead, and while an hour behind (database clock).
    const startsWhileJumped = await h.query<{ n: number }>(
      `SELECT (SELECT count(*)::int FROM {{schema}}.h_exec WHERE phase = 'start' AND worker LIKE 'jumpy:%' AND at >= w.a AND at < w.z) AS n
       FROM unnest($1::timestamptz[], $2::timestamptz[]) WITH ORDINALITY AS w(a, z, i) ORDER BY w.i`,
      [jumps.slice(0, 2).map((j) => j.at), jumps.slice(1).map((j) => j.at)],
    );
    const rescued = h.metricSum('recovered');
    const leasesLost = h.metricSum('leasesLost');
    report(h, c, 'F15 clock-jump-during-run', {
      leases_lost: leasesLost,
      rescued,
      early_executions: c.earlyStarts,
      early_retries: retries!.early,
      jumpy_starts: jumpyStarts,
      jumpy_clock_offsets_s: jumps.map((j) => j.observedS),
      jumpy_starts_while_jumped: startsWhileJumped.map((r) => r.n),
      steady_clock_offset_s: steadyOffsetS,
      notes:
        `one worker's wall clock set to ${jumps.map((j) => j.offset).join(', ')} s at 4 s intervals (libfaketime offset file, monotonic real) beside one on true time; ` +
        `its clock as seen: ${jumps.map((j) => j.observedS).join(', ')} s off; 400 tasks (30 % due 0.5-2 s ahead) and 60 flaky ones`,
    });
    assert.equal(leasesLost, 0, 'no lease lost to a jump');
    assert.equal(rescued, 0, 'nothing rescued');
    assert.equal(retries!.n, 60);
    assert.equal(retries!.early, 0, 'no retry before its delay on the database clock');
    assert.ok(jumpyStarts > 50, `the jumping worker kept working (${jumpyStarts} starts)`);
    for (const [i, r] of startsWhileJumped.entries()) assert.ok(r.n > 0, `the jumping worker started tasks while at ${jumps[i]!.offset} s (${r.n})`);
    assert.ok(Math.abs(steadyOffsetS) <= 5, `the steady worker's clock stayed true (${steadyOffsetS} s off)`);
    assert.equal(jumpy.unexpectedExit(), false);
  },
);

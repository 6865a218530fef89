/**
 * F07 listener-terminated (lost NOTIFY) (plan §5.2): with a poll interval of
 * P = 5 s, notify and poll pickups can be told apart. Idle workers, a
 * producer of 1 short task every 200 ms; the LISTEN connections
 * (`pgasynq:listener`) are terminated. Pickup falls back to polling while
 * they are gone (no task waits much past P), the listeners come back on their
 * own, and pickup returns to notify latency. Terminated once (pg-listen
 * reconnects at once, and its reconnect sweep, R10, picks up what it missed),
 * then held down for 6 s (the database refuses new connections meanwhile), so
 * that polling has to do the pickups.
 */
import assert from 'node:assert/strict';
import pg from 'pg';
import { sleep, waitFor } from './harness.js';
import { faultTest, report } from './kit.js';
import { pickupPhases } from './samplers.js';

const MAX_RETRY = 3;
const P_MS = 5000;

faultTest(
  'F07 listener-terminated: LISTEN sessions killed; polling covers the gap, then notify-level pickup again',
  { schema: 'f07', timeout: 150_000 },
  async (h) => {
    const workers = await Promise.all(['w1', 'w2'].map((n) => h.spawnWorker(n, { concurrency: 4, profile: { taskCheckInterval: P_MS } })));
    const listeners = async () =>
      (await h.query<{ n: number }>("SELECT count(*)::int AS n FROM pg_stat_activity WHERE application_name = 'pgasynq:listener' AND query LIKE 'LISTEN%'"))[0]!
        .n;
    await waitFor(async () => (await listeners()) === workers.length, 20_000, 'both LISTEN sessions');
    h.startSampler();
    await h.spawnProducer({ count: 150, rate: 5, msMin: 50, maxRetry: MAX_RETRY });
    await sleep(5000);
    // 1. One termination: how long until the LISTEN sessions are back?
    const tKill = await h.dbNow();
    let t0 = performance.now();
    const killed = await h.terminate('pgasynq:listener');
    await waitFor(async () => (await listeners()) === workers.length, 30_000, 'the LISTEN sessions to come back', 50);
    const listenerDownS = Math.round((performance.now() - t0) / 100) / 10;
    const tBack = await h.dbNow();
    await sleep(3000);
    // 2. Held down for 6 s: no new session may connect to the database (the sessions already open,
    //    the pools' included, go on), so the listeners cannot come back and pickup falls back to polling.
    const allowConnections = async (allow: boolean) => {
      // Not from a session of the database itself, which PostgreSQL refuses.
      const admin = new pg.Client({ connectionString: h.connectionString.replace(/\/postgres$/, '/template1'), application_name: 'harness' });
      await admin.connect();
      await admin.query(`ALTER DATABASE postgres WITH ALLOW_CONNECTIONS ${allow}`).finally(() => admin.end());
    };
    await allowConnections(false);
    const tHold = await h.dbNow();
    const holdKills = await h.terminate('pgasynq:listener');
    await sleep(6000);
    await allowConnections(true);
    const tRelease = await h.dbNow();
    t0 = performance.now();
    await waitFor(async () => (await listeners()) === workers.length, 30_000, 'the LISTEN sessions to come back after the hold', 50);
    const reconnectAfterHoldS = Math.round((performance.now() - t0) / 100) / 10;
    const tBack2 = await h.dbNow();
    await h.settle(60_000);

    // Pickup latency (first start − enqueue, DB clock) by when the task was enqueued.
    const second = (t: Date) => new Date(t.getTime() + 1000);
    const by = await pickupPhases(
      h,
      [
        ['before', tKill],
        ['blip', second(tBack)],
        ['between', tHold],
        ['held', tRelease],
        ['reconnect', second(tBack2)],
      ],
      'after',
    );
    const phases = Object.values(by);
    const c = await h.check({ maxRetry: MAX_RETRY });
    report(h, c, 'F07 listener-terminated', {
      recovery_s: listenerDownS,
      listener_down_s: listenerDownS,
      listeners_terminated: killed,
      hold_terminated: holdKills,
      reconnect_after_hold_s: reconnectAfterHoldS,
      pickup_ms: by,
      notes:
        `P = ${P_MS / 1000} s, 1 task / 200 ms, 2 idle workers; terminated the ${killed} LISTEN sessions once (back in ${listenerDownS} s), ` +
        `then again and held down 6 s by ALLOW_CONNECTIONS false (back ${reconnectAfterHoldS} s after); pickup p50/p99/max ms: ` +
        phases.map((p) => `${p.phase} ${p.p50}/${p.p99}/${p.max} (n=${p.n})`).join(', '),
    });
    assert.equal(killed, workers.length, 'both LISTEN sessions were terminated');
    assert.ok(listenerDownS <= 10, `the listeners came back (${listenerDownS} s)`);
    assert.ok(reconnectAfterHoldS <= 15, `the listeners came back after the hold (${reconnectAfterHoldS} s)`);
    assert.equal(holdKills, workers.length, 'both LISTEN sessions were terminated for the hold');
    assert.ok(by.held && by.held.n >= 10, 'tasks enqueued while the listeners were held down');
    assert.ok(by.after && by.after.n >= 10, 'tasks enqueued after the reconnect');
    // Notify level: far below the polling latency (the claim loop polls every P/2 + rand·P).
    assert.ok(by.after.p99 <= P_MS / 2, `pickup p99 after the reconnect ${by.after.p99} ms is notify-level (< P/2)`);
    for (const p of phases) assert.ok(p.max <= 1.5 * P_MS + 2000, `${p.phase}: no task waited past the polling bound (${p.max} ms)`);
  },
);

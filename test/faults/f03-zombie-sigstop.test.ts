/**
 * F03 zombie-sigstop-past-lease (plan §5.2, variant F03a: R5 on, which is
 * the only variant pgasynq has: there is no hook to turn the local deadline
 * off). w1 holds 4 tasks of 3 s and is frozen (SIGSTOP) for 3·L = 9 s; w2
 * rescues and re-runs them; then w1 wakes. Its handler ignores its abort
 * signal and goes on to ctx.transaction, the worst a zombie can do: every
 * such write must be refused, locally (the worker knows its lease is gone,
 * R5) or by the database (the token no longer matches, R2). The effect
 * happens once, by w2, under w2's lease (I5).
 */
import assert from 'node:assert/strict';
import { FAST, sleep, waitFor } from './harness.js';
import { faultTest, report } from './kit.js';

const MAX_RETRY = 3;
const FREEZE_MS = 3 * FAST.leaseDuration;

faultTest(
  'F03 zombie-sigstop-past-lease: a frozen worker wakes after its tasks were rescued; its writes are refused, effects once',
  { schema: 'f03', timeout: 150_000 },
  async (h) => {
    const [w1, w2] = await Promise.all([h.spawnWorker('w1', { concurrency: 4, ignoreAbort: true }), h.spawnWorker('w2', { concurrency: 4 })]);
    h.startSampler();
    // w2 sleeps while w1 takes all four tasks, then w1 sleeps while w2 rescues them.
    h.signal(w2, 'SIGSTOP');
    const producer = await h.spawnProducer({ count: 4, rate: 0, msMin: 3000, maxRetry: MAX_RETRY });
    await waitFor(async () => (await h.openStarts())[w1.tag] === 4, 30_000, 'w1 to hold 4 running tasks', 50);
    const held = (await h.query<{ id: string }>("SELECT id FROM {{schema}}.tasks WHERE state = 'active' AND lease_owner = $1", [w1.serverId])).map((r) => r.id);
    const fencedBefore = w1.metrics?.fencedWrites ?? 0;
    h.signal(w1, 'SIGSTOP');
    h.signal(w2, 'SIGCONT');
    const t0 = performance.now();
    const recovery = h.trackRecovery(w1.serverId!, FREEZE_MS + 20_000);
    await sleep(FREEZE_MS - (performance.now() - t0));
    const rescuedBeforeWake = (
      await h.query<{ n: number }>("SELECT count(*)::int AS n FROM {{schema}}.tasks WHERE id = ANY($1) AND NOT (state = 'active' AND lease_owner = $2)", [
        held,
        w1.serverId,
      ])
    )[0]!.n;
    h.signal(w1, 'SIGCONT');

    // Every zombie attempt ends: refused (fenced), aborted, or (it must not) with an effect.
    const zombieEnds = async () =>
      (
        await h.query<{ n: number }>(
          `SELECT count(DISTINCT s.attempt)::int AS n FROM {{schema}}.h_exec s
         WHERE s.worker = $1 AND s.phase = 'start' AND s.task_id = ANY($2)
           AND (EXISTS (SELECT 1 FROM {{schema}}.h_exec e WHERE e.attempt = s.attempt AND e.phase IN ('fenced', 'abort'))
                OR EXISTS (SELECT 1 FROM {{schema}}.h_effects f WHERE f.attempt = s.attempt))`,
          [w1.tag, held],
        )
      )[0]!.n;
    await waitFor(async () => (await zombieEnds()) === held.length, 30_000, 'the zombie attempts to end');
    const recovery_s = await recovery;
    await producer.exited;
    // w1 goes on working after it woke, without a restart.
    await h.spawnProducer({ count: 12, rate: 0, msMin: 200, maxRetry: MAX_RETRY }, 'producer2');
    await h.settle(60_000);

    const zombie = (
      await h.query<{ local: number; db: number; effects: number; aborts: number }>(
        `SELECT count(*) FILTER (WHERE phase = 'fenced' AND detail = 'local')::int AS local,
              count(*) FILTER (WHERE phase = 'fenced' AND detail = 'db')::int AS db,
              count(*) FILTER (WHERE phase = 'abort')::int AS aborts,
              (SELECT count(*)::int FROM {{schema}}.h_effects WHERE worker = $1 AND task_id = ANY($2)) AS effects
       FROM {{schema}}.h_exec WHERE worker = $1 AND task_id = ANY($2)`,
        [w1.tag, held],
      )
    )[0]!;
    const zombieHeartbeatsFenced = (w1.metrics?.fencedWrites ?? 0) - fencedBefore;
    const c = await h.check({ maxRetry: MAX_RETRY });
    report(h, c, 'F03 zombie-sigstop-past-lease', {
      recovery_s,
      zombie_tx_refused_locally: zombie.local,
      zombie_tx_refused_by_db: zombie.db,
      zombie_effects: zombie.effects,
      zombie_fenced_writes: zombieHeartbeatsFenced,
      rescued_before_wake: rescuedBeforeWake,
      notes:
        `F03a (R5 on; no hook turns it off): w1 froze ${FREEZE_MS / 1000} s holding 4 tasks of 3 s, its handler ignores the abort and calls ctx.transaction on waking; ` +
        `transactions refused locally ${zombie.local}, by the token ${zombie.db}; zombie_fenced_writes = w1's fenced writes after waking (heartbeats, transactions); zombie effects ${zombie.effects}`,
    });
    assert.equal(held.length, 4);
    assert.equal(rescuedBeforeWake, 4, 'w2 rescued all four while w1 was frozen');
    assert.equal(zombie.effects, 0, 'the zombie committed nothing');
    assert.equal(zombie.local + zombie.db, 4, 'every zombie transaction was refused');
    assert.equal(c.dupExternal, 4, 'each frozen task ran again elsewhere (at-least-once)');
    assert.ok(recovery_s <= FAST.leaseDuration / 1000 + 6, `rescued ${recovery_s} s after the freeze`);
  },
);

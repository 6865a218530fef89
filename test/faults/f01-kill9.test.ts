/**
 * F01 worker-kill9-mid-task (plan §5.2): workers die abruptly (SIGKILL) while
 * holding tasks, five times, on random workers, each respawned 2 s later.
 * Their tasks must be rescued within the bound and run elsewhere; nothing is
 * lost, the transactional effect happens once, attempts stay ≤ maxRetry + 1.
 */
import assert from 'node:assert/strict';
import { killAndRespawn, pickVictim } from './crashes.js';
import { BOUND_S, sleep, type Child } from './harness.js';
import { faultTest, report } from './kit.js';

const MAX_RETRY = 3;
const KILLS = 5;
/** Enough load that every kill lands while the producer is still running (25 tasks/s). */
const TASKS = 100 * KILLS;

faultTest(
  `F01 worker-kill9-mid-task: SIGKILL a busy worker ${KILLS} times; nothing lost, effects once, rescued within B`,
  { schema: 'f01', timeout: 180_000 },
  async (h) => {
    const started = await h.spawnWorkers(['w1', 'w2', 'w3'], { concurrency: 4, sleepMin: 100, sleepMax: 500 });
    const live = new Map<string, Child>(started.map((w) => [w.name, w]));
    h.startSampler();
    const producer = await h.spawnProducer({ count: TASKS, rate: 25, maxRetry: MAX_RETRY, scheduled: 0.2 });

    const recoveries: Promise<number>[] = [];
    const respawns: Promise<void>[] = [];
    let heldAtKill = 0;
    for (let k = 0; k < KILLS; k++) {
      await sleep(1000 + Math.random() * 1500);
      // A victim holding at least 3 running executions (the plan's "≥ 4 open starts", for 4 slots),
      // never the last live worker: someone must be left to rescue its tasks.
      const held = async () => {
        const open = await h.openStarts();
        return (w: Child) => open[w.tag] ?? 0;
      };
      const { victim } = await pickVictim(() => live.values(), held, { min: 3, what: 'a worker holding 3 tasks', everyMs: 50 });
      // Killed now (out of `live`), respawned 2 s later.
      respawns.push(killAndRespawn(h, victim, live));
      const { n } = await h.one<{ n: number }>("SELECT count(*)::int AS n FROM {{schema}}.tasks WHERE state = 'active' AND lease_owner = $1", [
        victim.serverId,
      ]);
      heldAtKill += n;
      recoveries.push(h.trackRecovery(victim.serverId!));
    }
    await Promise.all(respawns);
    await producer.exited;
    const recovery = await Promise.all(recoveries);
    await h.settle(90_000);

    const c = await h.check({ maxRetry: MAX_RETRY });
    report(h, c, 'F01 worker-kill9-mid-task', {
      recovery_s: recovery,
      kills: KILLS,
      held_at_kill: heldAtKill,
      notes: `3 workers x 4, ${c.acked} tasks at 25/s; SIGKILL ${KILLS}x a worker holding >= 3 running tasks, respawn after 2 s; dup_external = re-run killed attempts (at-least-once); recovery bound B = ${BOUND_S} s`,
    });
    assert.ok(c.scheduled >= 20, `I6 checked ${c.scheduled} scheduled tasks`);
    assert.ok(heldAtKill >= KILLS, 'every victim held tasks when killed');
    assert.ok(c.dupExternal > 0, 'the killed attempts ran again');
    for (const r of recovery) assert.ok(r <= BOUND_S + 2, `recovery ${r} s within B = ${BOUND_S} s (+2 s for a loaded machine)`);
  },
);

/**
 * F03c zombie frozen inside ctx.transaction (plan §5.2, F03's variant; the
 * finding of RESULTS.md, fixed since): w1's handler is inside its
 * ctx.transaction, has written its effect row and not committed (the task's
 * row is locked FOR UPDATE by that transaction), when w1 is frozen (SIGSTOP)
 * for 3·L = 9 s: past its lease, past the idle-in-transaction limit that
 * ctx.transaction sets for its own transaction (SET LOCAL
 * idle_in_transaction_session_timeout = leaseDuration, src/broker/db.ts
 * durableTransaction), and past B. Then SIGCONT.
 *
 * Must hold: PostgreSQL ends the frozen session (about L after its last
 * statement), which rolls the effect back and unlocks the row; the recoverer
 * rescues the task and w2 runs it and commits its effect once; the woken
 * worker's commit fails (its session is gone) and writes nothing; nothing is
 * lost (I1), the effect happens once (I2, I5), and the task is not stuck
 * active past the bound (I4: L + C + R + 1 s from its last extension, with
 * the oracle's 1 s).
 *
 * Figures: unlock_s (freeze → the frozen session gone and the row unlocked),
 * recovery_s (freeze → the task no longer active under w1: rescued),
 * recoverer_blocked_s (how long a recoverer's UPDATE waited on the locked
 * row), dup_effects, zombie_commit_refused and the error the zombie got.
 */
import assert from 'node:assert/strict';
import { appendFileSync, readFileSync } from 'node:fs';
import { FAST, ORACLE_BOUND_S, sleep } from './harness.js';
import { faultTest, report } from './kit.js';

const MAX_RETRY = 3;
const FREEZE_MS = 3 * FAST.leaseDuration;
/** How long the handler stays in its transaction after the insert, unfrozen (below the L idle limit). */
const HOLD_MS = 2000;

const secs = (ms: number): number => Math.round(ms / 100) / 10;

faultTest(
  'F03c frozen inside ctx.transaction: PostgreSQL ends the frozen transaction, the task is rescued, the woken commit fails, effects once',
  { schema: 'f03c', timeout: 150_000 },
  async (h) => {
    const [w1, w2] = await Promise.all([
      h.spawnWorker('w1', { concurrency: 4, env: { REPORT_EXEC: '1' } }),
      h.spawnWorker('w2', { concurrency: 4, env: { REPORT_EXEC: '1' } }),
    ]);
    h.startSampler();
    // w2 sleeps (briefly) so that w1 takes the task.
    h.signal(w2, 'SIGSTOP');
    const id = await h.enqueue('txhold', { ms: 0, holdMs: HOLD_MS }, { maxRetry: MAX_RETRY });
    appendFileSync(h.ackFile, `${id}\n`);
    const inTx = await w1.waitEvent((e) => e.event === 'inTransaction' && e.taskId === id, 30_000, 'w1 inside its ctx.transaction');
    h.signal(w1, 'SIGSTOP');
    const freezeAt = performance.now();
    h.signal(w2, 'SIGCONT');
    const zombieAttempt = inTx.attempt as string;
    const app = `pgasynq:server:${w1.pid}`;

    // The freeze caught w1 between two statements of its transaction: its session idle in it, the effect not visible.
    const frozen = await h.query<{ pid: number }>("SELECT pid FROM pg_stat_activity WHERE application_name = $1 AND state = 'idle in transaction'", [app]);
    const effectsAtFreeze = (await h.one<{ n: number }>('SELECT count(*)::int AS n FROM {{schema}}.h_effects WHERE task_id = $1', [id])).n;
    assert.equal(frozen.length, 1, `w1 was frozen inside its transaction (sessions idle in a transaction: ${frozen.length})`);
    assert.equal(effectsAtFreeze, 0, 'the effect was not committed before the freeze');
    const frozenPid = frozen[0]!.pid;

    // Until the wake: when the frozen session ends (the row unlocks), when the task leaves w1
    // (rescued), and how long other servers' sessions wait on a lock meanwhile (the recoverer's UPDATE).
    const recovery = h.trackRecovery(w1.serverId!, FREEZE_MS + 20_000);
    let unlockMs: number | null = null;
    let waitFirst: number | null = null;
    let waitLast: number | null = null;
    while (performance.now() - freezeAt < FREEZE_MS - 150) {
      const [row] = await h.query<{ alive: boolean; waiting: number }>(
        `SELECT EXISTS (SELECT 1 FROM pg_stat_activity WHERE pid = $1) AS alive,
                (SELECT count(*)::int FROM pg_stat_activity WHERE application_name LIKE 'pgasynq:server:%' AND application_name <> $2
                   AND wait_event_type = 'Lock') AS waiting`,
        [frozenPid, app],
      );
      const now = performance.now() - freezeAt;
      if (unlockMs === null && !row!.alive) unlockMs = now;
      if (row!.waiting > 0) {
        waitFirst ??= now;
        waitLast = now;
      }
      await sleep(100);
    }
    const rescued = await h.one<{ state: string; owner: string | null; retried: number }>(
      'SELECT state, lease_owner AS owner, retried FROM {{schema}}.tasks WHERE id = $1',
      [id],
    );
    const rescuedBeforeWake = !(rescued.state === 'active' && rescued.owner === w1.serverId);
    h.signal(w1, 'SIGCONT');
    const wakeAt = await h.dbNow();

    // The woken handler goes on to commit, on a session PostgreSQL has ended.
    const failed = await w1.waitEvent((e) => e.event === 'txFailed' && e.attempt === zombieAttempt, 20_000, "the woken worker's commit to fail");
    const recovery_s = await recovery;
    await h.spawnProducer({ count: 12, rate: 0, msMin: 200, maxRetry: MAX_RETRY }, 'producer2');
    await h.settle(60_000);

    const task = await h.one<{ state: string; runs: number; effects: number; zombie_effects: number; effect_worker: string | null }>(
      `SELECT t.state,
              (SELECT count(DISTINCT attempt)::int FROM {{schema}}.h_exec x WHERE x.task_id = t.id AND x.phase = 'start') AS runs,
              (SELECT count(*)::int FROM {{schema}}.h_effects e WHERE e.task_id = t.id) AS effects,
              (SELECT count(*)::int FROM {{schema}}.h_effects e WHERE e.attempt = $2) AS zombie_effects,
              (SELECT min(worker) FROM {{schema}}.h_effects e WHERE e.task_id = t.id) AS effect_worker
       FROM {{schema}}.tasks t WHERE t.id = $1`,
      [id, zombieAttempt],
    );
    const w1After = (await h.one<{ n: number }>('SELECT count(*)::int AS n FROM {{schema}}.h_effects WHERE worker = $1 AND at > $2', [w1.tag, wakeAt])).n;
    // PostgreSQL's own word for it (the log line prefix carries application_name).
    const idleKills = readFileSync(h.cluster.logFile, 'utf8')
      .split('\n')
      .filter((l) => l.includes(app) && l.includes('idle-in-transaction timeout')).length;
    const c = await h.check({ maxRetry: MAX_RETRY, txTypes: ['tx', 'txhold'] });
    const unlock_s = unlockMs === null ? null : secs(unlockMs);
    const recoverer_blocked_s = waitFirst === null || waitLast === null ? 0 : secs(waitLast - waitFirst + 100);
    report(h, c, 'F03c frozen inside ctx.transaction', {
      recovery_s,
      unlock_s,
      recoverer_blocked_s,
      rescued_before_wake: rescuedBeforeWake,
      zombie_commit_refused: task.zombie_effects === 0,
      zombie_commit_error: `${String(failed.name)} ${String(failed.code)}: ${String(failed.message)}`,
      zombie_effects: task.zombie_effects,
      idle_in_transaction_kills: idleKills,
      w1_effects_after_wake: w1After,
      notes:
        `w1 frozen ${FREEZE_MS / 1000} s inside ctx.transaction, its effect inserted and not committed (the handler meant to hold it ${HOLD_MS / 1000} s); ` +
        `PostgreSQL ended the frozen session after ${unlock_s} s (idle_in_transaction_session_timeout = leaseDuration, set by ctx.transaction), ` +
        `the task was rescued ${recovery_s} s after the freeze and run by ${task.effect_worker}; a recoverer waited ${recoverer_blocked_s} s on the locked row; ` +
        `the woken commit failed with ${String(failed.name)} ${String(failed.code)} ("${String(failed.message)}")`,
    });
    assert.notEqual(unlockMs, null, 'PostgreSQL ended the frozen transaction before the wake');
    assert.ok(unlock_s! <= FAST.leaseDuration / 1000 + 1.5, `the row unlocked ${unlock_s} s after the freeze (idle limit L = ${FAST.leaseDuration / 1000} s)`);
    assert.equal(idleKills, 1, "PostgreSQL's log names the idle-in-transaction timeout of w1's session");
    assert.ok(rescuedBeforeWake, 'the task was rescued while w1 was frozen');
    assert.ok(recovery_s <= ORACLE_BOUND_S, `rescued ${recovery_s} s after the freeze (bound ${ORACLE_BOUND_S} s from the last extension, which came before)`);
    assert.equal(task.state, 'completed');
    assert.equal(task.runs, 2, 'the task ran again after the rescue');
    assert.equal(task.effects, 1, 'its effect committed once');
    assert.equal(task.zombie_effects, 0, 'the frozen attempt committed nothing');
    assert.notEqual(task.effect_worker, w1.tag, 'the effect is the rescuer’s');
  },
);

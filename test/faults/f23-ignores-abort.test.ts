/**
 * F23 handler-ignores-abort (plan §5.2, R2/R7): w1's handler awaits timers
 * for 3·L, never looks at ctx.signal, then commits its effect with
 * ctx.transaction.
 *
 * pgasynq heartbeats from the handler's own event loop, so a handler that
 * only awaits keeps its lease: the control task (the same 3·L handler on w2,
 * no fault) must run once and lose nothing. To make w1 lose its leases while
 * its handlers run normally, the harness holds their rows locked (FOR UPDATE,
 * as another session's long transaction might): w1's heartbeat UPDATE waits
 * behind the lock, no extension succeeds, and w1's trust timer gives the
 * leases up at L − margin. The lock is released as soon as both handlers were
 * aborted (the blocked heartbeat then lands, extending the leases one last
 * time), so the recoverer rescues the tasks after that expiry plus C.
 *
 * Must hold: both zombies are told (ctx.signal aborts with LeaseExpiredError)
 * and carry on; the tasks are rescued and run again; each zombie's late
 * ctx.transaction is refused with LeaseExpiredError and writes nothing; the
 * effect happens once per task (I2), under the lease of the attempt that
 * wrote it (I5); I1, I3, I4 hold.
 *
 * Figures: dup_external (the re-run zombies, at-least-once by design),
 * leases_lost, slots_held_by_zombies (per zombie: from its abort until w1
 * started another task, with tasks waiting: how long the zombie kept its
 * slot past its lease), zombie_overrun_s (how long each zombie ran on past
 * its lease, in no slot), lease_lost_after_s (lock → abort).
 */
import assert from 'node:assert/strict';
import { appendFileSync } from 'node:fs';
import pg from 'pg';
import { FAST, sleep, waitFor } from './harness.js';
import { faultTest, report } from './kit.js';

const MAX_RETRY = 3;
const ZOMBIES = 2;
const ZOMBIE_MS = 3 * FAST.leaseDuration;
/** Tasks that wait while the zombies hold w1's slots: a freed slot takes one at once. */
const FLOW = 16;

const secs = (ms: number, digits = 1): number => Math.round(ms / 10 ** (3 - digits)) / 10 ** digits;

faultTest(
  'F23 handler-ignores-abort: a handler that ignores its abort after losing its lease; rescued, its late ctx.transaction refused, effects once',
  { schema: 'f23', timeout: 150_000 },
  async (h) => {
    // No prefetch: w1 claims only into free slots, so what it starts after the aborts shows when its slots freed.
    const workerEnv = { REPORT_EXEC: '1', PREFETCH: '0' };
    const [w1, w2] = await Promise.all([
      h.spawnWorker('w1', { concurrency: ZOMBIES, ignoreAbort: true, env: workerEnv }),
      h.spawnWorker('w2', { concurrency: 4, env: workerEnv }),
    ]);
    h.startSampler();
    // Enqueued from here (a producer would take seconds to start while the zombies' clock runs), each id
    // in the ack log once enqueue() resolved.
    const enqueueAcked = async (ms: number): Promise<string> => {
      const id = await h.enqueue('tx', { ms }, { maxRetry: MAX_RETRY });
      appendFileSync(h.ackFile, `${id}\n`);
      return id;
    };
    // w2 sleeps (briefly) while w1 takes the zombie tasks, and so fills its slots.
    h.signal(w2, 'SIGSTOP');
    for (let i = 0; i < ZOMBIES; i++) await enqueueAcked(ZOMBIE_MS);
    await waitFor(async () => (await h.openStarts())[w1.tag] === ZOMBIES, 30_000, `w1 to start ${ZOMBIES} tasks`, 20);
    const held = (await h.query<{ id: string }>("SELECT id FROM {{schema}}.tasks WHERE state = 'active' AND lease_owner = $1", [w1.serverId])).map((r) => r.id);
    h.signal(w2, 'SIGCONT');
    await sleep(FAST.heartbeatInterval);

    // The control: the same 3·L handler on w2 (w1 is full), and no fault.
    const controlId = await enqueueAcked(ZOMBIE_MS);
    const control = await waitFor(
      async () =>
        (
          await h.query<{ task_id: string }>("SELECT task_id FROM {{schema}}.h_exec WHERE phase = 'start' AND worker = $1 AND NOT (task_id = ANY($2))", [
            w2.tag,
            held,
          ])
        )[0]?.task_id,
      30_000,
      'w2 to start the control task',
      50,
    );
    assert.equal(control, controlId);

    // Work that waits for a free slot (w2 has 3; w1's 2 are the zombies'), queued before the fault.
    for (let i = 0; i < FLOW; i++) await enqueueAcked(2000);
    await waitFor(
      async () => (await h.one<{ n: number }>("SELECT count(*)::int AS n FROM {{schema}}.tasks WHERE state = 'pending'")).n >= FLOW / 2,
      30_000,
      'flow tasks waiting',
      50,
    );

    // The fault: w1's rows locked, so its heartbeats wait.
    const locker = new pg.Client({ connectionString: h.connectionString, application_name: 'harness:locker' });
    let locking = true;
    h.defer(() => locking && locker.end());
    await locker.connect();
    await locker.query('BEGIN');
    const locked = await locker.query(
      `SELECT s.seq FROM "${h.schema}".task_states s JOIN "${h.schema}".task_inputs i ON i.seq = s.seq WHERE i.id = ANY($1) AND s.state = 'active' FOR UPDATE OF s`,
      [held],
    );
    const lockAt = Date.now();
    assert.equal(locked.rowCount, ZOMBIES, "the zombies' rows were still active under w1 when locked");
    const recovery = h.trackRecovery(w1.serverId!, 60_000);
    const aborts = await Promise.all(held.map((id) => w1.waitEvent((e) => e.event === 'aborted' && e.taskId === id, 20_000, `the abort of ${id} on w1`)));
    const pendingAtAbort = (await h.one<{ n: number }>("SELECT count(*)::int AS n FROM {{schema}}.tasks WHERE state = 'pending'")).n;
    await locker.query('ROLLBACK');
    await locker.end();
    locking = false;

    // Each zombie carries on to ctx.transaction, which must be refused.
    const refusals = await Promise.all(
      held.map((id) => w1.waitEvent((e) => e.event === 'txFailed' && e.taskId === id, ZOMBIE_MS + 20_000, `the late ctx.transaction of ${id} on w1`)),
    );
    const recovery_s = await recovery;
    await h.settle(90_000);

    // When w1 next started a task, after each abort (tasks were waiting all along): the slot's release.
    const w1Starts = (
      await h.query<{ at: Date }>(
        "SELECT at FROM {{schema}}.h_exec WHERE worker = $1 AND phase = 'start' AND at > to_timestamp($2::float8 / 1000) ORDER BY at LIMIT $3",
        [w1.tag, Math.min(...aborts.map((a) => a.at as number)), ZOMBIES],
      )
    ).map((r) => r.at.getTime());
    const abortAts = aborts.map((a) => a.at as number).sort((a, b) => a - b);
    const slotsHeld = abortAts.map((at, i) => (w1Starts[i] === undefined ? null : secs(Math.max(0, w1Starts[i] - at), 2)));
    const overrun = held.map((_, i) => secs((refusals[i]!.at as number) - (aborts[i]!.at as number)));
    const lostAfter = aborts.map((a) => secs((a.at as number) - lockAt));

    // The zombie attempts are the ones that were aborted (a re-run may land on w1 too).
    const zombieAttempts = aborts.map((a) => a.attempt as string);
    const perTask = await h.query<{
      id: string;
      state: string;
      runs: number;
      zombie_effects: number;
      effects: number;
      fenced_local: number;
      fenced_db: number;
    }>(
      `SELECT t.id, t.state,
              (SELECT count(DISTINCT attempt)::int FROM {{schema}}.h_exec x WHERE x.task_id = t.id AND x.phase = 'start') AS runs,
              (SELECT count(*)::int FROM {{schema}}.h_effects e WHERE e.task_id = t.id AND e.attempt = ANY($2::uuid[])) AS zombie_effects,
              (SELECT count(*)::int FROM {{schema}}.h_effects e WHERE e.task_id = t.id) AS effects,
              (SELECT count(*)::int FROM {{schema}}.h_exec x WHERE x.task_id = t.id AND x.attempt = ANY($2::uuid[]) AND x.phase = 'fenced' AND x.detail = 'local') AS fenced_local,
              (SELECT count(*)::int FROM {{schema}}.h_exec x WHERE x.task_id = t.id AND x.attempt = ANY($2::uuid[]) AND x.phase = 'fenced' AND x.detail = 'db') AS fenced_db
       FROM {{schema}}.tasks t WHERE t.id = ANY($1) ORDER BY t.id`,
      [held, zombieAttempts],
    );
    const controlRow = await h.one<{ state: string; runs: number; retried: number }>(
      `SELECT t.state, t.retried, (SELECT count(DISTINCT attempt)::int FROM {{schema}}.h_exec x WHERE x.task_id = t.id AND x.phase = 'start') AS runs
       FROM {{schema}}.tasks t WHERE t.id = $1`,
      [control],
    );
    const controlAborted = w2.events.some((e) => e.event === 'aborted' && e.taskId === control);
    const w1m = w1.metrics as unknown as Record<string, number> | undefined;
    const c = await h.check({ maxRetry: MAX_RETRY });
    report(h, c, 'F23 handler-ignores-abort', {
      recovery_s,
      slots_held_by_zombies: slotsHeld,
      zombie_overrun_s: overrun,
      lease_lost_after_s: lostAfter,
      zombie_tx_refused_locally: perTask.reduce((n, r) => n + r.fenced_local, 0),
      zombie_tx_refused_by_db: perTask.reduce((n, r) => n + r.fenced_db, 0),
      zombie_effects: perTask.reduce((n, r) => n + r.zombie_effects, 0),
      zombie_leases_lost: w1m?.leasesLost ?? null,
      w1_handlers_running_max: w1m?.handlersRunningMax ?? null,
      pending_at_abort: pendingAtAbort,
      control_runs: controlRow.runs,
      control_leases_lost: w2.metrics?.leasesLost ?? null,
      control_worker_loop_lag_max_ms: w2.metrics?.loopLagMaxMs ?? null,
      notes:
        `w1 (concurrency ${ZOMBIES}, handlers ignore ctx.signal) runs ${ZOMBIES} tasks that await ${ZOMBIE_MS / 1000} s (3 L) then ctx.transaction; ` +
        `the harness locks their rows (FOR UPDATE) until both are aborted, so w1's heartbeat waits and its trust timer gives the leases up (lease_lost_after_s after the lock). ` +
        `The zombies ran on ${overrun.join(' / ')} s past their leases outside any slot: w1 started new tasks ${slotsHeld.join(' / ')} s after the aborts ` +
        `(slots_held_by_zombies: the processor stops waiting for an aborted handler, as asynq does) and ran up to ${w1m?.handlersRunningMax} handlers at once with concurrency ${ZOMBIES}. ` +
        `Each late ctx.transaction was refused with LeaseExpiredError before any write (locally: the lease object was already released). ` +
        `Control: the same 3 L handler on w2 with no fault ran ${controlRow.runs}x, leases lost ${w2.metrics?.leasesLost} (heartbeats share the handler's free event loop).`,
    });
    assert.equal(held.length, ZOMBIES);
    for (const a of aborts) assert.equal(a.reason, 'LeaseExpiredError', 'the zombie was told its lease was lost');
    for (const r of refusals) assert.equal(r.name, 'LeaseExpiredError', "the zombie's ctx.transaction was refused with LeaseExpiredError");
    for (const r of perTask) {
      assert.equal(r.state, 'completed', `task ${r.id} completed`);
      assert.ok(r.runs >= 2, `task ${r.id} ran again after its lease was lost (${r.runs} runs)`);
      assert.equal(r.zombie_effects, 0, `the zombie of ${r.id} committed nothing`);
      assert.equal(r.effects, 1, `task ${r.id} has its effect once`);
      assert.equal(r.fenced_local + r.fenced_db, 1, `the zombie transaction of ${r.id} was refused once`);
    }
    for (const s of lostAfter)
      assert.ok(s <= (FAST.leaseDuration + FAST.heartbeatInterval) / 1000 + 1, `the lease was given up ${s} s after the heartbeat stalled`);
    for (const s of overrun) assert.ok(s > 0, 'the zombie ran on past the abort (it ignores its signal)');
    assert.ok(c.dupExternal >= ZOMBIES, 'each zombie task ran again elsewhere (at-least-once)');
    assert.equal(controlRow.state, 'completed');
    assert.equal(controlRow.runs, 1, 'the control task (3 L of awaits, no fault) ran once');
    assert.equal(controlRow.retried, 0);
    assert.ok(!controlAborted, 'the control task was never aborted');
    assert.equal(w2.metrics?.leasesLost, 0, 'w2 lost no lease');
    assert.ok(pendingAtAbort > 0, 'tasks were waiting for a slot when the zombies were aborted');
    assert.ok(
      slotsHeld.every((s) => s !== null),
      'w1 started new tasks after the aborts',
    );
  },
);

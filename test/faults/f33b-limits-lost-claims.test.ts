/**
 * F33b limits-lost-claims: do queue limits hold for the handlers that run,
 * across a PostgreSQL crash? F33 checks the limits in the database (the active
 * rows at every sample and every claim, the rate window over every claim the
 * database kept). This test checks them where a user meets them: the handlers
 * that actually started.
 *
 * The Server's sessions commit asynchronously (synchronous_commit = off,
 * src/broker/db.ts `asyncCommit`): a COMMIT returns before its WAL is written
 * out. A limited claim committed that way, reported to its worker and already
 * running, could be erased by a crash: the task pending again, the active
 * count and the rate window (queue_starts, same transaction) no longer
 * counting it, while its handler runs on until its lease is found gone, and
 * other claims fill the limits beside it. Such an execution is a "phantom": a
 * handler start (the worker says so on stdout, REPORT_EXEC) with no claim in
 * the durable claim log (lim_claims, a trigger in the claim's transaction).
 * claim_limited() therefore commits durably (migration 0007); this test is
 * the regression test of that. Against the library before it, one run saw 22
 * phantoms over 6 crashes, 6 `conc` handlers running at once (limit 3) and 14
 * `rated` starts in 5 s (limit 10).
 *
 * The tasks are of type `bare`: the handler sleeps and returns, and the
 * batched completion completes it, so nothing in the run commits with
 * synchronous_commit = on (no oracle row, no ctx.transaction, no enqueue, no
 * harness sampler) and nothing writes the WAL out early.
 *
 * Setup: `conc` (concurrency 3, tasks of 3–5 s) and `rated` (10 per 5,000 ms,
 * tasks of 200–400 ms), 4 workers × 4, prefetch 0 (a handler starts as its
 * claim returns), leases of 10 s (a lost claim's handler runs until its lease
 * is found gone). The crash, 6 times: PostgreSQL's WAL writer is stopped
 * (SIGSTOP), so that what commits asynchronously stays in the shared WAL
 * buffers (a window wal_writer_delay, 200 ms by default, otherwise closes by
 * itself); as soon as a worker says a handler of one queue started (its claim
 * just committed), the WAL writer is killed -9, which the postmaster takes for
 * a crash (as when the OOM killer takes a server process), and the cluster is
 * stopped (pg_ctl -m immediate), left down 300 ms (shorter than the rate
 * interval, as a restart usually is) and started.
 *
 * Checked, from the handlers' own start and finish lines: no phantom; at most
 * 3 `conc` handlers running at once (an execution counts from its start until
 * its handler returned or was aborted; the batched completion commits after
 * that, so the database holds the slot at least as long); at most 10 `rated`
 * starts in any 5,000 ms (each execution at its claim's started_at, a phantom
 * at its handler's start); and nothing lost, every task completed.
 *
 * Two runs: a control whose workers' Server runs on a pool with
 * synchronous_commit = on (POOL_MAX, POOL_SYNC_COMMIT: every claim durable
 * before the worker hears of it), and the library's own pool.
 */
import assert from 'node:assert/strict';
import { writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { Task } from '../../src/index.js';
import { nextHandlerStart } from './crashes.js';
import { handlerCalls, setupLimits, syncCommitRuns } from './setups.js';

const CONC = 3;
const RATE = { limit: 10, interval: 5000 };
const TASKS = { conc: 18, rated: 50 };
const RUN = { maxRetry: 10, crashes: 6, downMs: 300, gapMs: [2000, 1000] as [number, number] };

interface Execution {
  taskId: string;
  attempt: string;
  worker: string;
  start: number;
  end: number;
  /** The instant its rate window counts: its claim's started_at, or its start for a phantom. */
  at: number;
  phantom: boolean;
}

syncCommitRuns({
  ...RUN,
  tag: 'F33b',
  name: 'limits-lost-claims',
  claim: 'no handler starts on a claim a crash erases, limits hold for the handlers',
  figures: 'limits, handlers',
  schema: 'f33b',
  notes: `conc ${CONC} (3-5 s), rated ${RATE.limit}/${RATE.interval} ms (0.2-0.4 s); all bare (batched completion, no synchronous commit in the run); 4 workers x 4, prefetch 0, lease 10 s; ${RUN.crashes} crashes each as soon as a handler started, ${RUN.downMs} ms down; the WAL writer stopped before each and killed -9 to crash`,

  async start(h, workerEnv) {
    await setupLimits(h, {
      counts: false,
      tasks: [
        ...Array.from({ length: TASKS.conc }, (_, i) => new Task('bare', { ms: 3000 + Math.random() * 2000 }, { queue: 'conc', taskId: `conc-${i}` })),
        ...Array.from({ length: TASKS.rated }, (_, i) => new Task('bare', { ms: 200 + Math.random() * 200 }, { queue: 'rated', taskId: `rated-${i}` })),
      ],
      enqueue: { maxRetry: RUN.maxRetry, retention: 3_600_000 },
      limits: { conc: { concurrency: CONC }, rated: { rateLimit: RATE } },
      workers: {
        count: 4,
        concurrency: 4,
        prefetch: 0,
        profile: { leaseDuration: 10_000, heartbeatInterval: 2000 },
        env: { REPORT_EXEC: '1', ...workerEnv },
      },
    });
  },

  // Right after a handler of the queue started (any queue's after 10 s): its claim committed a moment ago, maybe not yet flushed.
  trigger(h, i) {
    const queue = i % 2 === 0 ? 'conc' : 'rated';
    return nextHandlerStart(h, (id) => id.startsWith(`${queue}-`), 10_000).catch(() => nextHandlerStart(h, () => true, 10_000));
  },

  async analyze(h, { crashedAt }) {
    const claims = await h.query<{ id: string; owner: string; started_at: Date }>(
      'SELECT i.id, c.owner, c.started_at FROM {{schema}}.lim_claims c JOIN {{schema}}.task_inputs i ON i.seq = c.seq',
    );
    // Every handler call, from the workers' lines: its start, and when it stopped holding a slot.
    const used = new Set<number>();
    const executions: Execution[] = handlerCalls(h).map((s) => {
      const end = Math.min(s.finishedAt ?? Number.POSITIVE_INFINITY, s.abortedAt ?? Number.POSITIVE_INFINITY);
      // Its claim: the latest durable claim of this task by this worker's server at or before its start (same host clock).
      let best = -1;
      claims.forEach((cl, i) => {
        const at = cl.started_at.getTime();
        if (cl.id === s.taskId && cl.owner === s.serverId && at - 2 <= s.start && s.start - at < 3000 && !used.has(i)) {
          if (best === -1 || at > claims[best]!.started_at.getTime()) best = i;
        }
      });
      if (best !== -1) used.add(best);
      const at = best === -1 ? s.start : claims[best]!.started_at.getTime();
      return { taskId: s.taskId, attempt: s.attempt, worker: s.worker, start: s.start, end, at, phantom: best === -1 };
    });
    const phantoms = executions.filter((x) => x.phantom);
    const rated = executions.filter((x) => x.taskId.startsWith('rated')).map((x) => x.at);
    const windowMax = (ts: number[]) => Math.max(0, ...ts.map((t) => ts.filter((u) => u > t - RATE.interval && u <= t).length));
    const startsInWindow = windowMax(rated);
    const durableStartsInWindow = windowMax(claims.filter((cl) => cl.id.startsWith('rated')).map((cl) => cl.started_at.getTime()));
    const conc = executions.filter((x) => x.taskId.startsWith('conc'));
    let running = 0;
    let maxRunning = 0;
    let maxAt = 0;
    for (const [t, d] of conc.flatMap((x) => [[x.start, 1] as const, [x.end, -1] as const]).sort((a, b) => a[0] - b[0] || a[1] - b[1])) {
      running += d;
      if (running > maxRunning) [maxRunning, maxAt] = [running, t];
    }
    const overlapAtMax = conc.filter((x) => x.start <= maxAt && x.end > maxAt);
    writeFileSync(join(h.logDir, 'executions.json'), JSON.stringify({ crashedAt, executions, claims }, null, 1));
    return { phantoms, startsInWindow, durableStartsInWindow, maxRunning, overlapAtMax };
  },

  extra: (r) => ({
    phantom_starts: r.phantoms.length,
    phantoms: r.phantoms.slice(0, 10).map((p) => `${p.taskId}@${p.worker}`),
    limit: CONC,
    max_running: r.maxRunning,
    running_at_max: r.overlapAtMax.map((x) => `${x.taskId}@${x.worker}${x.phantom ? '(phantom)' : ''}`),
    rate_limit: `${RATE.limit}/${RATE.interval}ms`,
    max_starts_in_window: r.startsInWindow,
    max_durable_starts_in_window: r.durableStartsInWindow,
  }),

  check(r, problems) {
    console.log(
      `phantom starts ${r.phantoms.length}; most conc handlers running ${r.maxRunning} (limit ${CONC}); ` +
        `most rated starts in ${RATE.interval} ms: handlers ${r.startsInWindow}, durable claims ${r.durableStartsInWindow} (limit ${RATE.limit}); restarts ${r.restartMs.join('/')} ms`,
    );
    assert.deepEqual(problems, []);
    assert.equal(r.c.states.completed, TASKS.conc + TASKS.rated, 'every task completed');
    assert.ok(r.durableStartsInWindow <= RATE.limit, `the database's own claims keep the rate (${r.durableStartsInWindow})`);
    // The three, in one message: which held and which did not.
    const bounds: string[] = [];
    if (r.phantoms.length > 0) {
      bounds.push(`${r.phantoms.length} handlers started on claims the crash then erased (${r.phantoms.map((p) => `${p.taskId}@${p.worker}`).join(', ')})`);
    }
    if (r.startsInWindow > RATE.limit) bounds.push(`rated: ${r.startsInWindow} handler starts in ${RATE.interval} ms (limit ${RATE.limit})`);
    if (r.maxRunning > CONC) {
      bounds.push(
        `conc: ${r.maxRunning} handlers running at once (limit ${CONC}: ${r.overlapAtMax.map((x) => `${x.taskId}@${x.worker}${x.phantom ? ' (phantom)' : ''}`).join(', ')})`,
      );
    }
    assert.deepEqual(bounds, [], 'the limits, as the handlers met them');
  },
});

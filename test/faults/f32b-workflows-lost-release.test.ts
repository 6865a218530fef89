/**
 * F32b workflows-lost-release: does a dependent's handler ever start before
 * its dependencies have (durably) completed, across a PostgreSQL crash? F32
 * checks the release in the database (once, in a completing transaction,
 * never before the last dependency's completion), and it holds there. This
 * test checks it where a user meets it: the dependent's handler.
 *
 * The batched completion runs on the Server's sessions, which commit
 * asynchronously (synchronous_commit = off, src/broker/db.ts `asyncCommit`):
 * the completion of a dependency and the release of its dependent (one
 * transaction) return before their WAL is written out, a worker claims the
 * dependent and starts its handler, and a crash then erases the completion
 * and the release: the dependency runs again, completes again and releases
 * the dependent again. The dependent's first handler ran on a completion that
 * never happened (and read what that completion stored, if it read
 * ctx.dependencyResults()). A completion through ctx.transaction commits
 * durably and is not exposed.
 *
 * Setup: GROUPS fan-ins enqueued up front, each FANIN dependencies of
 * 30–80 ms due UNIT_MS after the group before (so releases come all through
 * the run) and one dependent of 1 s, all of type `bare`: the handler sleeps
 * and returns, and the batched completion completes it. Nothing in the run
 * commits with synchronous_commit = on (no oracle row, no ctx.transaction, no
 * enqueue, no harness sampler), so nothing writes the WAL out early. Each
 * handler says when it started on stdout (REPORT_EXEC). 4 workers × 4,
 * prefetch 0. The crash, CRASHES times: PostgreSQL's WAL writer is stopped
 * (SIGSTOP), so that what commits asynchronously stays in the shared WAL
 * buffers (a window wal_writer_delay, 200 ms by default, otherwise closes by
 * itself); as soon as a worker says a dependent's handler started, the WAL
 * writer is killed -9, which the postmaster takes for a crash (as when the
 * OOM killer takes a server process), and the cluster is stopped (pg_ctl -m
 * immediate), left down 300 ms and started. Triggers of the test's log every
 * completion (wf_done) and every release (wf_rel) in the transaction that
 * makes it: only the durable ones remain. (Before the WAL writer was stopped,
 * with plain `pg_ctl -m immediate` crashes, 3–4 of 8 crashes did the same.)
 *
 * Checked: no dependent's handler started before its durable release, or
 * before the durable completion of any of its dependencies; each dependent
 * released once (durably) and completed; nothing lost.
 *
 * Two runs: a control whose workers' Server runs on a pool with
 * synchronous_commit = on (POOL_MAX, POOL_SYNC_COMMIT), and the library's own
 * pool. The control passes; the library's pool fails (12 dependents started
 * early over 8 crashes in one run). A transaction that releases a dependent
 * committing durably (in settle_completed(), migration 0005, as
 * claim_limited() does) made it pass in a trial.
 */
import assert from 'node:assert/strict';
import { writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { Task } from '../../src/index.js';
import { nextHandlerStart } from './crashes.js';
import { waitFor } from './harness.js';
import { fanIn, handlerCalls, syncCommitRuns, WORKFLOW_LOG_SQL } from './setups.js';

const FANIN = 4;
const UNIT_MS = 250;
const GROUPS = 100;
const RUN = { maxRetry: 10, crashes: 8, downMs: 300, gapMs: [1500, 1000] as [number, number] };

interface Dependent {
  id: string;
  releases: number;
  released_at: Date | null;
  deps_done_at: Date | null;
  deps_done: number;
  state: string;
}

syncCommitRuns({
  ...RUN,
  tag: 'F32b',
  name: 'workflows-lost-release',
  claim: 'no dependent starts before its dependencies durably completed',
  figures: 'workflows, handlers',
  schema: 'f32b',
  notes: `${GROUPS} fan-ins of ${FANIN} deps (a group due every ${UNIT_MS} ms) + a dependent (1 s), all bare (batched completion, no synchronous commit in the run); 4 workers x 4, prefetch 0; ${RUN.crashes} crashes each as soon as a dependent's handler started, ${RUN.downMs} ms down; the WAL writer stopped before each and killed -9 to crash`,

  async start(h, workerEnv) {
    await h.query(WORKFLOW_LOG_SQL);
    // Every group up front, each group's dependencies due UNIT_MS after the last group's (the first once the workers are up).
    const first = Date.now() + 6000;
    const tasks = Array.from({ length: GROUPS }, (_, g) => {
      const processAt = new Date(first + g * UNIT_MS);
      return fanIn(
        g,
        FANIN,
        (id) => new Task('bare', { ms: 30 + Math.random() * 50 }, { taskId: id, processAt }),
        (id, deps) => new Task('bare', { ms: 1000 }, { taskId: id, dependsOn: deps }),
      ).tasks;
    }).flat();
    await h.enqueueAcked(tasks, { maxRetry: RUN.maxRetry, retention: 3_600_000 });
    await h.spawnWorkers(4, { concurrency: 4, env: { REPORT_EXEC: '1', PREFETCH: '0', ...workerEnv } });
    await waitFor(() => Date.now() > first, 30_000, 'the first group due');
  },

  // As soon as a dependent's handler started: its release and claim committed just before.
  trigger: (h) => nextHandlerStart(h, (id) => id.endsWith('-fin'), 15_000),

  async analyze(h) {
    // Each dependent: its durable releases, and the durable completions of its dependencies.
    const dependents = await h.query<Dependent>(
      `SELECT t.id, t.state,
         (SELECT count(*)::int FROM {{schema}}.wf_rel r WHERE r.seq = t.seq) AS releases,
         (SELECT min(r.at) FROM {{schema}}.wf_rel r WHERE r.seq = t.seq) AS released_at,
         (SELECT max(x.at) FROM {{schema}}.task_dependencies d JOIN {{schema}}.wf_done x ON x.seq = d.dependency_seq WHERE d.dependent_seq = t.seq) AS deps_done_at,
         (SELECT count(*)::int FROM {{schema}}.task_dependencies d JOIN {{schema}}.wf_done x ON x.seq = d.dependency_seq WHERE d.dependent_seq = t.seq) AS deps_done
       FROM {{schema}}.tasks t WHERE t.waiting_for IS NOT NULL ORDER BY t.id`,
    );
    const byId = new Map(dependents.map((d) => [d.id, d]));
    const starts = handlerCalls(h).filter((s) => byId.has(s.taskId));
    // A handler start (this host's Date.now()) before the durable release or completion (the database's clock, same host), by more than the clocks' 1 ms rounding.
    const early = starts
      .map((s) => {
        const d = byId.get(s.taskId)!;
        const gate = Math.max(d.released_at?.getTime() ?? Number.POSITIVE_INFINITY, d.deps_done_at?.getTime() ?? Number.POSITIVE_INFINITY);
        return {
          id: s.taskId,
          worker: s.worker,
          aheadMs: Math.round(gate - s.start),
          ranMs: (s.abortedAt ?? s.finishedAt ?? s.start) - s.start,
          abort: s.abortReason ?? null,
        };
      })
      .filter((x) => x.aheadMs > 1);
    writeFileSync(join(h.logDir, 'dependents.json'), JSON.stringify({ dependents, starts, early }, null, 1));
    return { dependents, starts, early };
  },

  extra: (r) => ({
    dependents: r.dependents.length,
    dependent_starts: r.starts.length,
    started_before_durable_release: r.early.length,
    early: r.early.slice(0, 10).map((e) => `${e.id}@${e.worker} ${e.aheadMs} ms ahead, ran ${e.ranMs} ms${e.abort ? ` (${e.abort})` : ''}`),
    double_releases: r.dependents.filter((d) => d.releases > 1).length,
    never_released: r.dependents.filter((d) => d.releases === 0).length,
  }),

  check(r, problems) {
    console.log(
      `${r.dependents.length} dependents, ${r.starts.length} handler starts, ${r.early.length} before the durable release; restarts ${r.restartMs.join('/')} ms`,
    );
    assert.deepEqual(problems, []);
    assert.equal(r.c.states.completed, r.c.tasks, 'every task completed');
    assert.equal(r.dependents.length, GROUPS, 'every group has its dependent');
    for (const d of r.dependents) {
      assert.equal(d.releases, 1, `${d.id}: released once (durably)`);
      assert.equal(d.deps_done, FANIN, `${d.id}: every dependency completed once (durably)`);
      assert.equal(d.state, 'completed', `${d.id}: completed`);
    }
    assert.equal(
      r.early.length,
      0,
      `dependents whose handler started before their dependencies durably completed: ${r.early
        .slice(0, 6)
        .map((e) => `${e.id}@${e.worker} ${e.aheadMs} ms ahead, ran ${e.ranMs} ms`)
        .join('; ')}`,
    );
  },
});

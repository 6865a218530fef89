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
import { appendFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { afterEach, test } from 'node:test';
import { Client, Task } from '../../src/index.js';
import { crashWithWalHeld, nextHandlerStart, WORKFLOW_LOG_SQL } from './crashes.js';
import { assertInvariants, createHarness, recordFigures, sleep, waitFor, type Harness } from './harness.js';

const MAX_RETRY = 10;
const FANIN = 4;
const CRASHES = 8;
const DOWN_MS = 300;
const UNIT_MS = 250;
const GROUPS = 100;

let h: Harness | undefined;
let client: Client | undefined;
afterEach(async () => {
  await client?.close().catch(() => {});
  await h?.teardown();
  client = h = undefined;
});

async function run(name: string, workerEnv: Record<string, string>) {
  h = await createHarness(name);
  const harness = h;
  await h.query(WORKFLOW_LOG_SQL);
  client = new Client({ connectionString: h.connectionString, schema: h.schema });
  // Every group up front, each group's dependencies due UNIT_MS after the last group's (the first once the workers are up).
  const first = Date.now() + 6000;
  const tasks = Array.from({ length: GROUPS }, (_, g) => {
    const deps = Array.from({ length: FANIN }, (_, i) => `g${g}-d${i}`);
    const processAt = new Date(first + g * UNIT_MS);
    return [
      ...deps.map((id) => new Task('bare', { ms: 30 + Math.random() * 50 }, { taskId: id, processAt })),
      new Task('bare', { ms: 1000 }, { taskId: `g${g}-fin`, dependsOn: deps }),
    ];
  }).flat();
  const infos = await client.enqueueMany(tasks, { maxRetry: MAX_RETRY, retention: 3_600_000 });
  appendFileSync(h.ackFile, `${infos.map((t) => t.id).join('\n')}\n`);
  const env = { REPORT_EXEC: '1', PREFETCH: '0', ...workerEnv };
  await Promise.all(['w1', 'w2', 'w3', 'w4'].map((n) => harness.spawnWorker(n, { concurrency: 4, env })));
  await waitFor(() => Date.now() > first, 30_000, 'the first group due');

  const restartMs: number[] = [];
  let untargeted = 0;
  for (let i = 0; i < CRASHES; i++) {
    await sleep(1500 + Math.random() * 1000);
    // As soon as a dependent's handler started: its release and claim committed just before.
    const crash = await crashWithWalHeld(harness, DOWN_MS, () => nextHandlerStart(harness, (id) => id.endsWith('-fin'), 15_000));
    restartMs.push(crash.restartMs);
    if (!crash.targeted) untargeted++;
  }
  await h.waitDrained(120_000);
  await sleep(700);

  const c = await h.check({ maxRetry: MAX_RETRY, txTypes: [] });
  // Each dependent: its durable releases, and the durable completions of its dependencies.
  const dependents = await h.query<{
    id: string;
    releases: number;
    released_at: Date | null;
    deps_done_at: Date | null;
    deps_done: number;
    state: string;
  }>(
    `SELECT t.id, t.state,
       (SELECT count(*)::int FROM {{schema}}.wf_rel r WHERE r.seq = t.seq) AS releases,
       (SELECT min(r.at) FROM {{schema}}.wf_rel r WHERE r.seq = t.seq) AS released_at,
       (SELECT max(x.at) FROM {{schema}}.task_dependencies d JOIN {{schema}}.wf_done x ON x.seq = d.dependency_seq WHERE d.dependent_seq = t.seq) AS deps_done_at,
       (SELECT count(*)::int FROM {{schema}}.task_dependencies d JOIN {{schema}}.wf_done x ON x.seq = d.dependency_seq WHERE d.dependent_seq = t.seq) AS deps_done
     FROM {{schema}}.tasks t WHERE t.waiting_for IS NOT NULL ORDER BY t.id`,
  );
  const byId = new Map(dependents.map((d) => [d.id, d]));
  const lines = h.children.flatMap((w) => w.events.map((e): Record<string, any> => ({ ...e, worker: w.name })));
  const starts = lines.filter((e) => e.event === 'started' && byId.has(e.taskId));
  // A handler start (this host's Date.now()) before the durable release or completion (the database's clock, same host), by more than the clocks' 1 ms rounding.
  const early = starts
    .map((s) => {
      const d = byId.get(s.taskId)!;
      const gate = Math.max(d.released_at?.getTime() ?? Number.POSITIVE_INFINITY, d.deps_done_at?.getTime() ?? Number.POSITIVE_INFINITY);
      const aborted = lines.find((e) => e.event === 'aborted' && e.attempt === s.attempt);
      const finished = lines.find((e) => e.event === 'finished' && e.attempt === s.attempt);
      return {
        id: s.taskId,
        worker: s.worker,
        aheadMs: Math.round(gate - s.at),
        ranMs: (aborted?.at ?? finished?.at ?? s.at) - s.at,
        abort: aborted?.reason ?? null,
      };
    })
    .filter((x) => x.aheadMs > 1);
  writeFileSync(join(h.logDir, 'dependents.json'), JSON.stringify({ dependents, starts, early }, null, 1));
  return {
    c,
    dependents,
    starts,
    early,
    restartMs,
    untargeted,
    problems: assertInvariants(c, { maxRetry: MAX_RETRY, unexpected: h.unexpectedExits() }),
  };
}

type Result = Awaited<ReturnType<typeof run>>;

function record(test: string, r: Result, notes: string) {
  recordFigures(
    h!.figures(test, r.c, {
      dependents: r.dependents.length,
      dependent_starts: r.starts.length,
      started_before_durable_release: r.early.length,
      early: r.early.slice(0, 10).map((e) => `${e.id}@${e.worker} ${e.aheadMs} ms ahead, ran ${e.ranMs} ms${e.abort ? ` (${e.abort})` : ''}`),
      double_releases: r.dependents.filter((d) => d.releases > 1).length,
      never_released: r.dependents.filter((d) => d.releases === 0).length,
      crashes: CRASHES,
      untargeted_crashes: r.untargeted,
      restart_ms: r.restartMs,
      notes,
    }),
  );
}

function assertRelease(r: Result) {
  console.log(
    `${r.dependents.length} dependents, ${r.starts.length} handler starts, ${r.early.length} before the durable release; restarts ${r.restartMs.join('/')} ms`,
  );
  assert.deepEqual(r.problems, []);
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
}

const SETUP = `${GROUPS} fan-ins of ${FANIN} deps (a group due every ${UNIT_MS} ms) + a dependent (1 s), all bare (batched completion, no synchronous commit in the run); 4 workers x 4, prefetch 0; ${CRASHES} crashes each as soon as a dependent's handler started, ${DOWN_MS} ms down; the WAL writer stopped before each and killed -9 to crash`;

test(
  'F32b control: server sessions with synchronous_commit=on; no dependent starts before its dependencies durably completed',
  { timeout: 180_000 },
  async () => {
    const r = await run('f32b_sync', { POOL_MAX: '10', POOL_SYNC_COMMIT: '1' });
    record('F32b workflows, handlers, sync commit (control)', r, `${SETUP}; the Server on a pool of 10 with synchronous_commit=on`);
    assertRelease(r);
  },
);

test('F32b workflows-lost-release: the library own pool; no dependent starts before its dependencies durably completed', { timeout: 180_000 }, async () => {
  const r = await run('f32b', {});
  record('F32b workflows, handlers, library pool', r, `${SETUP}; the Server on its own pool (synchronous_commit=off)`);
  assertRelease(r);
});

/**
 * Smoke test of examples/: each runs with one command on the embedded
 * database (DATABASE_URL unset) and exits 0 having done its work.
 */
import assert from 'node:assert/strict';
import { describe } from 'node:test';
import { Client, Task } from '../src/index.js';
import { builtCli, runCli, runNode, testDb, testWithin } from './helpers.js';

/** The CLI runs as a process per command, several per test: more than a minute under a loaded machine. */
const test = testWithin(180_000);

function runExample(file: string, args: string[] = []) {
  return runNode([`examples/${file}`, ...args]);
}

describe('pgasynq demo', () => {
  test('with no database configured it runs on the embedded one and finishes every task', { timeout: 180_000 }, async () => {
    const r = await runCli(['--json', 'demo', '--tasks', '60', '--concurrency', '8']);
    assert.equal(r.code, 0, r.stderr);
    assert.match(r.stdout, /embedded database/);
    const summary = JSON.parse(r.stdout.trim().split('\n').at(-1)!) as Record<
      'enqueued' | 'processed' | 'digests' | 'mergedIntoDigests' | 'unfinished' | 'archived',
      number
    >;
    assert.equal(summary.unfinished, 0);
    assert.equal(summary.archived, 1, 'the poison task is archived');
    assert.ok(summary.processed >= 50, `processed ${summary.processed}`);
    assert.ok(summary.digests > 0 && summary.mergedIntoDigests > summary.digests, JSON.stringify(summary));
    // Every enqueued task is accounted for: run, merged into a digest, or archived.
    assert.equal(summary.processed - summary.digests + summary.mergedIntoDigests + summary.archived, summary.enqueued, JSON.stringify(summary));
    // The library's log lines, human-readable and errors only: the poison task's archive, nothing else.
    const logLines = r.stderr.split('\n').filter((l) => l !== '');
    assert.equal(logLines.length, 1, r.stderr);
    assert.match(
      logLines[0]!,
      /^\d\d:\d\d:\d\d\.\d{3} ERROR processor: task archived task\.id=\S+ task\.type=import:parse task\.queue=low .*reason=skip-retry/,
    );
  });

  test("rerun on a schema that holds an earlier run's tasks, the summary counts this run's only", { timeout: 180_000 }, async () => {
    const db = await testDb('t_demo_rerun');
    const client = new Client({ connectionString: db.connectionString, schema: db.schema });
    try {
      // What an earlier run leaves behind: its poison task archived, its other tasks completed.
      await client.enqueue(new Task('import:parse', { file: 'customers.csv' }), { queue: 'low', taskId: 'earlier-poison' });
      await client.enqueue(new Task('email:send', { to: 'a@example.com' }), { queue: 'critical', taskId: 'earlier-done', retention: 3_600_000 });
      await db.query("UPDATE {{schema}}.tasks SET state = 'archived', run_at = now(), error_msg = 'malformed CSV' WHERE id = 'earlier-poison'");
      await db.query("UPDATE {{schema}}.tasks SET state = 'completed', completed_at = now(), run_at = now() + interval '1 hour' WHERE id = 'earlier-done'");
      const r = await runCli(['--schema', db.schema, '--json', 'demo', '--tasks', '40', '--concurrency', '8'], { DATABASE_URL: db.connectionString });
      assert.equal(r.code, 0, r.stderr);
      const summary = JSON.parse(r.stdout.trim().split('\n').at(-1)!) as Record<
        'enqueued' | 'processed' | 'digests' | 'mergedIntoDigests' | 'unfinished' | 'archived',
        number
      >;
      assert.equal(summary.archived, 1, `this run's poison task only: ${JSON.stringify(summary)}`);
      assert.equal(summary.unfinished, 0);
      assert.equal(summary.processed - summary.digests + summary.mergedIntoDigests + summary.archived, summary.enqueued, JSON.stringify(summary));
      const earlier = await db.query<{ id: string; state: string }>("SELECT id, state FROM {{schema}}.tasks WHERE id LIKE 'earlier-%' ORDER BY id");
      assert.deepEqual(
        earlier,
        [
          { id: 'earlier-done', state: 'completed' },
          { id: 'earlier-poison', state: 'archived' },
        ],
        "the earlier run's tasks are still there",
      );
    } finally {
      await client.close();
      await db.close();
    }
  });

  test('without @electric-sql/pglite installed: 1 (a failure, not bad usage), with the install hint', { timeout: 60_000 }, async () => {
    const r = await runNode(['--import', './test/fixtures/without-pglite.ts', builtCli(), 'demo']);
    assert.equal(r.code, 1, r.stderr);
    assert.match(r.stderr, /^error: the demo's embedded database needs the optional package @electric-sql\/pglite: npm install @electric-sql\/pglite /m);
    assert.match(r.stderr, /DATABASE_URL=/, 'and the other way: on PostgreSQL');
  });
});

describe('examples on the embedded database', () => {
  test('worker.ts processes its 20 tasks and exits', { timeout: 180_000 }, async () => {
    const r = await runExample('worker.ts');
    assert.equal(r.code, 0, r.stderr);
    assert.match(r.stdout, /done: 20 tasks/);
  });

  test('cron.ts enqueues a tick every second and exits after three', { timeout: 180_000 }, async () => {
    const r = await runExample('cron.ts');
    assert.equal(r.code, 0, r.stderr);
    assert.match(r.stdout, /done: 3 pings/);
  });

  test('http-app.ts --smoke places 5 orders through HTTP and confirms them', { timeout: 180_000 }, async () => {
    const r = await runExample('http-app.ts', ['--smoke']);
    assert.equal(r.code, 0, r.stderr);
    assert.match(r.stdout, /smoke: 5 orders placed and confirmed/);
  });

  test('fan-in.ts counts words in 4 parts, then combines their results once all have run', { timeout: 180_000 }, async () => {
    const r = await runExample('fan-in.ts');
    assert.equal(r.code, 0, r.stderr);
    const lines = r.stdout.trim().split('\n');
    assert.match(lines[0]!, /^enqueued 4 count:part tasks \(pending\) and count:combine \(waiting for 4 of 4\)$/);
    const parts = lines.map((l, i) => ({ i, m: /^part (\d): (\d+) words$/.exec(l) })).filter((p) => p.m !== null);
    assert.deepEqual(parts.map((p) => Number(p.m![1])).sort(), [1, 2, 3, 4], r.stdout);
    assert.equal(
      parts.reduce((sum, p) => sum + Number(p.m![2]), 0),
      94,
      'the parts together counted the whole document',
    );
    const combine = lines.findIndex((l) => l.startsWith('combine:'));
    assert.ok(combine > Math.max(...parts.map((p) => p.i)), `combine ran after every part:\n${r.stdout}`);
    assert.equal(lines[combine], 'combine: merged 4 parts, 94 words, 55 distinct');
    assert.equal(lines[combine + 1], 'top words: the ×9, task ×7, a ×6, it ×4, and ×3');
    assert.equal(lines.at(-1), 'done: combine ran after every part');
  });
});

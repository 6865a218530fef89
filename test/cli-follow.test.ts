/**
 * Following a task from the `pgasynq` CLI, run as a child process as users
 * run it, against tasks a real Server runs (handlers that report progress,
 * log and throw): `task inspect` with the progress and the attempts (human
 * and --json), `task logs` (--tail, --json, --follow until the task ends or
 * Ctrl-C) and `task wait` (exit 0, 1, 3, and 2 for bad usage).
 */
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { describe } from 'node:test';
import { Task, type TaskContext, type TaskInfo } from '../src/index.js';
import { newLines } from '../src/cli/task-follow.js';
import { fails, ok, plain, test, type Run } from './cli-admin-kit.js';
import { DATABASE_URL, REPO, builtCli, deferred, runCli, setupDb, waitFor } from './helpers.js';

const Q = 'follow';
const { db, client, inspector, startServer } = setupDb('t_cli_follow', {
  server: { queues: { [Q]: 1 }, concurrency: 4, taskCheckInterval: 50, delayedTaskCheckInterval: 50, retryDelay: () => 0, shutdownTimeout: 500 },
});

/** `pgasynq --database-url <test db> --schema <test schema> ...args` */
const pgasynq = (...args: string[]): Promise<Run> => runCli(['--database-url', DATABASE_URL, '--schema', db.schema, ...args]);

/** The CLI as a running process, its output read as it comes. */
function started(...args: string[]) {
  const child = spawn(process.execPath, [builtCli(), '--database-url', DATABASE_URL, '--schema', db.schema, ...args], { cwd: REPO });
  let stdout = '';
  let stderr = '';
  child.stdout.setEncoding('utf8').on('data', (c: string) => (stdout += c));
  child.stderr.setEncoding('utf8').on('data', (c: string) => (stderr += c));
  const exit = new Promise<Run>((resolve) => child.on('close', (code) => resolve({ code, stdout, stderr })));
  return { child, exit, until: (re: RegExp) => waitFor(() => re.test(stdout), 30_000, `${args.join(' ')} to print ${re} (so far: ${JSON.stringify(stdout)})`) };
}

/** Gates the `gate` tasks wait at, by task id. */
const gates = new Map<string, { first: Promise<void>; second: Promise<void> }>();

async function handler(task: Task, ctx: TaskContext): Promise<unknown> {
  switch (task.type) {
    case 'flaky':
      ctx.log(`attempt ${ctx.attempt} starts`);
      if (ctx.attempt < 3) throw new Error(`boom ${ctx.attempt}`);
      await ctx.progress(75);
      await ctx.writeResult({ ok: true });
      return null;
    case 'obj':
      await ctx.progress({ done: 3, total: 4, stage: 'upload' });
      return null;
    case 'logs':
      for (const m of ['first', 'second', 'third', 'a \u001b]0;evil\u0007 title\nand a newline']) ctx.log(m);
      await ctx.progress(100);
      return null;
    case 'gate': {
      const gate = gates.get(ctx.taskId)!;
      ctx.log('line 1');
      await ctx.progress(10);
      await gate.first;
      ctx.log('line 2');
      await ctx.progress(50);
      await gate.second;
      ctx.log('line 3'); // rides on the completion's write
      return null;
    }
    case 'fail':
      throw new Error('it broke');
    case 'block':
      ctx.log('waiting');
      await ctx.progress(5);
      return new Promise((_resolve, reject) => ctx.signal.addEventListener('abort', () => reject(ctx.signal.reason), { once: true }));
    default:
      throw new Error(`no handler for ${task.type}`);
  }
}

const enqueue = (type: string, id: string, opts: { retention?: number; maxRetry?: number } = {}) =>
  client.enqueue(new Task(type, { id }), { queue: Q, taskId: id, retention: 3_600_000, maxRetry: 5, ...opts });
const until = (id: string, state: string) =>
  waitFor(async () => (await inspector.getTaskInfo(Q, id).catch(() => undefined))?.state === state, 30_000, `${id} ${state}`);
const TIME = String.raw`\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z`;

describe('task inspect: progress and attempts', () => {
  test('a task that failed twice, then completed at 75%: every run in a table; --json adds "attempts" to the TaskInfo', async () => {
    await startServer(handler);
    await enqueue('flaky', 'fl-1');
    await enqueue('obj', 'obj-1');
    await Promise.all([until('fl-1', 'completed'), until('obj-1', 'completed')]);
    const [text, byId, json, objText] = await Promise.all([
      pgasynq('task', 'inspect', Q, 'fl-1'),
      pgasynq('task', 'inspect', 'fl-1'),
      pgasynq('--json', 'task', 'inspect', Q, 'fl-1'),
      pgasynq('task', 'inspect', Q, 'obj-1'),
    ]);
    const attempts = await inspector.listAttempts(Q, 'fl-1');
    const server = attempts[0]!.serverId!;
    const out = ok(text);
    assert.match(out, /^progress:\s+75%$/m);
    assert.match(out, /^attempts: 3 runs$/m);
    assert.match(out, /^attempt\s+server\s+started\s+finished\s+outcome\s+error$/m);
    assert.match(out, new RegExp(`^\\s+1  ${server}  ${TIME}  ${TIME}  failed     boom 1$`, 'm'));
    assert.match(out, new RegExp(`^\\s+2  ${server}  ${TIME}  ${TIME}  failed     boom 2$`, 'm'));
    assert.match(out, new RegExp(`^\\s+3  ${server}  ${TIME}  ${TIME}  completed  -$`, 'm'));
    assert.ok(out.indexOf('attempts: 3 runs') > out.indexOf('result:'), 'after the fields');
    const section = (s: string) => s.slice(s.indexOf('progress:'));
    assert.equal(section(ok(byId)).replace(/\([^()]*\)/g, '()'), section(out).replace(/\([^()]*\)/g, '()'), 'the id alone finds it');
    assert.match(ok(objText), /^progress:\s+\{"done":3,"stage":"upload","total":4\}$/m);

    const parsed = JSON.parse(ok(json)) as TaskInfo & { attempts: unknown };
    const info = plain(await inspector.getTaskInfo(Q, 'fl-1')) as TaskInfo;
    assert.deepEqual(Object.keys(parsed), [...Object.keys(info), 'attempts'], 'every key of the TaskInfo, in its order, and attempts');
    assert.deepEqual(parsed, { ...info, attempts: plain(attempts) });
    assert.equal(parsed.progress, 75);
  });

  test('a running task: its attempt shows as running; a task not yet run has none', async () => {
    const first = deferred();
    const second = deferred();
    gates.set('run-1', { first: first.promise, second: second.promise });
    await startServer(handler);
    await enqueue('gate', 'run-1');
    await client.enqueue(new Task('never', null), { queue: 'elsewhere', taskId: 'n-1' });
    await waitFor(async () => (await inspector.getTaskInfo(Q, 'run-1')).progress === 10, 30_000, 'progress 10');
    const [running, fresh] = await Promise.all([pgasynq('task', 'inspect', Q, 'run-1'), pgasynq('task', 'inspect', 'elsewhere', 'n-1')]);
    assert.match(ok(running), /^progress:\s+10%$/m);
    assert.match(ok(running), new RegExp(`^attempts: 1 run\\n.*\\n.*\\n\\s+1  \\S+  ${TIME}  running   running  -$`, 'm'));
    assert.match(ok(fresh), /^progress:\s+-$/m);
    assert.match(ok(fresh), /^attempts: none yet$/m);
    first.resolve();
    second.resolve();
    await until('run-1', 'completed');
  });
});

describe('task logs', () => {
  test('the lines as TIME  attempt N  MESSAGE, escaped; --tail; --json; unknown task or queue: exit 1; bad --tail: exit 2', async () => {
    await startServer(handler);
    await enqueue('logs', 'lg-1');
    await until('lg-1', 'completed');
    const [all, tail, json, jsonTail, none, noQueue, badTail] = await Promise.all([
      pgasynq('task', 'logs', Q, 'lg-1'),
      pgasynq('task', 'logs', Q, 'lg-1', '--tail', '2'),
      pgasynq('--json', 'task', 'logs', Q, 'lg-1'),
      pgasynq('--json', 'task', 'logs', Q, 'lg-1', '--tail', '1'),
      pgasynq('task', 'logs', Q, 'nope'),
      pgasynq('task', 'logs', 'no-such-queue', 'lg-1'),
      pgasynq('task', 'logs', Q, 'lg-1', '--tail', '0'),
    ]);
    const lines = ok(all).trimEnd().split('\n');
    assert.equal(lines.length, 4);
    for (const [i, m] of ['first', 'second', 'third'].entries()) assert.match(lines[i]!, new RegExp(`^${TIME}  attempt 1  ${m}$`));
    assert.equal(lines[3]!.replace(new RegExp(`^${TIME}`), 'T'), String.raw`T  attempt 1  a \u001b]0;evil\u0007 title\u000aand a newline`);
    assert.doesNotMatch(ok(all), /[\x00-\x09\x0b-\x1f\x7f]/, 'no control character reaches the terminal');
    assert.deepEqual(ok(tail).trimEnd().split('\n'), lines.slice(2));
    const kept = await inspector.getTaskLogs(Q, 'lg-1');
    assert.deepEqual(JSON.parse(ok(json)), plain(kept));
    assert.deepEqual(JSON.parse(ok(jsonTail)), plain(kept.slice(-1)));
    fails(none, 1, /cannot find task with id=nope in queue "follow"/);
    fails(noQueue, 1, /queue "no-such-queue" does not exist/);
    fails(badTail, 2, /--tail.*must be an integer from 1 to 1000/);
  });

  test('--follow prints the lines there are, then the new ones, and ends (exit 0) when the task completes, even without retention', async () => {
    const first = deferred();
    const second = deferred();
    gates.set('fol-1', { first: first.promise, second: second.promise });
    await startServer(handler);
    await enqueue('gate', 'fol-1', { retention: 0 });
    await waitFor(async () => (await inspector.getTaskLogs(Q, 'fol-1')).length === 1, 30_000, 'line 1 kept');
    const human = started('task', 'logs', Q, 'fol-1', '--follow');
    const json = started('--json', 'task', 'logs', Q, 'fol-1', '-f');
    await Promise.all([human.until(/line 1/), json.until(/line 1/)]);
    first.resolve();
    await Promise.all([human.until(/line 2/), json.until(/line 2/)]);
    second.resolve();
    const [h, j] = await Promise.all([human.exit, json.exit]);
    const lines = ok(h).trimEnd().split('\n');
    assert.deepEqual(
      lines.map((l) => l.replace(new RegExp(`^${TIME}`), 'T')),
      ['T  attempt 1  line 1', 'T  attempt 1  line 2', 'T  attempt 1  line 3'],
      'each line once, in order; the last one too, which came with the completion',
    );
    const objects = ok(j)
      .trimEnd()
      .split('\n')
      .map((l) => JSON.parse(l) as { attempt: number; at: string; message: string });
    assert.deepEqual(
      objects.map((o) => [o.attempt, o.message]),
      [
        [1, 'line 1'],
        [1, 'line 2'],
        [1, 'line 3'],
      ],
    );
    assert.ok(objects.every((o) => !Number.isNaN(Date.parse(o.at))));
  });

  test('--follow tells the new lines from a fresh read: those after the longest end of the last read the log starts with', () => {
    const at = new Date('2026-05-01T10:00:00Z');
    const line = (message: string, attempt = 1) => ({ attempt, at, message });
    const [a, b, c, d] = ['a', 'b', 'c', 'd'].map((m) => line(m));
    assert.deepEqual(newLines([], [a!, b!]), [a, b]);
    assert.deepEqual(newLines([a!, b!], [a!, b!]), []);
    assert.deepEqual(newLines([a!, b!], [a!, b!, c!]), [c], 'appended');
    assert.deepEqual(newLines([a!, b!, c!], [b!, c!, d!]), [d], 'the oldest dropped, one appended');
    assert.deepEqual(newLines([a!, a!], [a!, a!, a!]), [a], 'repeated lines: the longest overlap');
    assert.deepEqual(newLines([a!], [line('a', 2)]), [line('a', 2)], 'another attempt is another line');
    assert.deepEqual(newLines([a!, b!], [c!, d!]), [c, d], 'more came than a log keeps: all of them');
  });

  test('--follow of a finished task prints and exits 0; Ctrl-C ends a follow with 0; an unknown task: exit 1', async () => {
    await startServer(handler);
    await enqueue('logs', 'lg-2');
    await enqueue('block', 'blk-1');
    await until('lg-2', 'completed');
    await waitFor(async () => (await inspector.getTaskLogs(Q, 'blk-1')).length === 1, 30_000, 'blk-1 logged');
    const follower = started('task', 'logs', Q, 'blk-1', '--follow');
    const [done, unknown] = await Promise.all([pgasynq('task', 'logs', Q, 'lg-2', '--follow', '--tail', '2'), pgasynq('task', 'logs', Q, 'nope', '--follow')]);
    assert.equal(ok(done).trimEnd().split('\n').length, 2);
    assert.match(ok(done), /attempt 1 {2}third\n/);
    fails(unknown, 1, /cannot find task with id=nope in queue "follow"/);
    await follower.until(/attempt 1 {2}waiting\n/);
    follower.child.kill('SIGINT');
    const r = await follower.exit;
    assert.match(ok(r), new RegExp(`^${TIME}  attempt 1  waiting\\n$`));
    assert.equal((await inspector.getTaskInfo(Q, 'blk-1')).state, 'active', 'the task goes on');
  });
});

describe('task wait', () => {
  test('exit 0 once completed: the task as task inspect prints it; --json: the TaskInfo', async () => {
    await enqueue('flaky', 'w-ok');
    const human = started('task', 'wait', Q, 'w-ok');
    const json = started('--json', 'task', 'wait', Q, 'w-ok', '--timeout', '1m');
    await startServer(handler);
    const [h, j] = await Promise.all([human.exit, json.exit]);
    const out = ok(h);
    assert.match(out, /^state:\s+completed$/m);
    assert.match(out, /^result:\s+\{"ok":true\}$/m);
    assert.match(out, /^progress:\s+75%$/m);
    assert.match(out, /^attempts: 3 runs$/m);
    const info = JSON.parse(ok(j)) as TaskInfo;
    assert.deepEqual(info, plain(await inspector.getTaskInfo(Q, 'w-ok')));
    assert.equal(info.state, 'completed');
  });

  test('exit 1 when it failed (archived), or there is no such task or queue; 3 after --timeout; 2 for a bad --timeout', async () => {
    await startServer(handler);
    await enqueue('fail', 'w-fail', { maxRetry: 0 });
    await enqueue('block', 'w-block');
    const [failed, none, noQueue, timedOut, bare, zero, word, tooLong] = await Promise.all([
      pgasynq('task', 'wait', Q, 'w-fail'),
      pgasynq('task', 'wait', Q, 'nope'),
      pgasynq('task', 'wait', 'no-such-queue', 'x'),
      pgasynq('task', 'wait', Q, 'w-block', '--timeout', '300ms'),
      pgasynq('task', 'wait', Q, 'w-block', '--timeout', '5'),
      pgasynq('task', 'wait', Q, 'w-block', '--timeout', '0s'),
      pgasynq('task', 'wait', Q, 'w-block', '--timeout', 'soon'),
      pgasynq('task', 'wait', Q, 'w-block', '--timeout', '600h'),
    ]);
    fails(failed, 1, /^error: task follow\/w-fail failed: it broke$/m);
    fails(none, 1, /cannot find task with id=nope in queue "follow"/);
    fails(noQueue, 1, /queue "no-such-queue" does not exist/);
    assert.equal(timedOut.code, 3, `exit ${timedOut.code}; stderr: ${timedOut.stderr}`);
    assert.equal(timedOut.stdout, '');
    assert.equal(timedOut.stderr, 'error: task follow/w-block did not finish within 300 ms\n');
    for (const r of [bare, word])
      fails(r, 2, /option '--timeout <duration>' argument '\w+' is invalid\. must be a duration with its unit \(h, m, s, ms\), e\.g\. 30s/);
    for (const r of [zero, tooLong]) fails(r, 2, /--timeout.*must be from 1ms to 2147483647ms/);
  });

  test('--help of logs and wait says what they print and how they end', async () => {
    const [logs, wait] = await Promise.all([runCli(['task', 'logs', '--help']), runCli(['task', 'wait', '--help'])]);
    assert.match(ok(logs), /--tail <n>/);
    assert.match(ok(logs), /-f, --follow/);
    assert.match(ok(logs), /TIME {2}attempt N {2}MESSAGE/);
    assert.match(ok(wait), /--timeout <duration>/);
    assert.match(ok(wait), /Exit codes: 0 when the task completed/);
    assert.match(ok(wait), /3 when --timeout passed first/);
  });
});

/**
 * F21 (R16): Debian's pgbouncer in pool_mode=transaction in front of a
 * throwaway cluster that logs every statement. Every connection of the
 * library goes through it: migrate, Client, Server (with
 * preparedStatements: false, since pgbouncer before 1.21 does not carry
 * named prepared statements across server connections), Inspector.
 *
 *   - The server detects at start that LISTEN cannot work there, logs one
 *     warning and polls; every task is processed exactly once.
 *   - With listenConnectionString pointing past pgbouncer, pickup is at
 *     notification speed, far below a 5 s poll interval.
 *   - The cluster's log shows no session-level advisory lock.
 */
import assert from 'node:assert/strict';
import { spawn, type ChildProcess } from 'node:child_process';
import { chownSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { connect } from 'node:net';
import { execFileSync } from 'node:child_process';
import { tmpdir, userInfo } from 'node:os';
import { join } from 'node:path';
import { after, before, describe, test } from 'node:test';
import { Client, Inspector, Server, Task, migrate, type Logger } from '../../src/index.js';
import { waitFor } from '../helpers.js';
import { freePort, startCluster, type Cluster } from './cluster.js';
import { recordFigures } from './harness.js';

const S = 'f21';
const PGBOUNCER = '/usr/sbin/pgbouncer';

interface Bouncer {
  port: number;
  url: string;
  version: string;
  stop(): Promise<void>;
}

/** pgbouncer in transaction mode on its own port and socket directory, run as postgres (it refuses root). */
async function startPgbouncer(pgPort: number): Promise<Bouncer> {
  const dir = mkdtempSync(join(tmpdir(), 'pgasynq-pgbouncer-'));
  const port = await freePort();
  const root = userInfo().uid === 0;
  writeFileSync(join(dir, 'users.txt'), '"postgres" ""\n');
  writeFileSync(
    join(dir, 'pgbouncer.ini'),
    [
      '[databases]',
      `* = host=127.0.0.1 port=${pgPort}`,
      '[pgbouncer]',
      'listen_addr = 127.0.0.1',
      `listen_port = ${port}`,
      `unix_socket_dir = ${dir}`,
      'auth_type = trust',
      `auth_file = ${join(dir, 'users.txt')}`,
      'pool_mode = transaction',
      'max_client_conn = 200',
      'default_pool_size = 20',
      // The server's pool asks for synchronous_commit=off in the startup packet
      // (options=-c ...), which pgbouncer refuses unless told to ignore it.
      'ignore_startup_parameters = extra_float_digits,options',
      `logfile = ${join(dir, 'pgbouncer.log')}`,
      '',
    ].join('\n'),
  );
  if (root) {
    const uid = Number(execFileSync('id', ['-u', 'postgres'], { encoding: 'utf8' }).trim());
    const gid = Number(execFileSync('id', ['-g', 'postgres'], { encoding: 'utf8' }).trim());
    for (const f of ['', 'users.txt', 'pgbouncer.ini']) chownSync(join(dir, f), uid, gid);
  }
  const version = execFileSync(PGBOUNCER, ['--version'], { encoding: 'utf8' }).split('\n')[0] ?? '';
  const child: ChildProcess = spawn(PGBOUNCER, [...(root ? ['-u', 'postgres'] : []), join(dir, 'pgbouncer.ini')], { stdio: 'ignore' });
  const exited = new Promise<void>((resolve) => child.once('exit', () => resolve()));
  const listening = waitFor(
    () =>
      new Promise<boolean>((resolve) => {
        const s = connect(port, '127.0.0.1', () => {
          s.end();
          resolve(true);
        });
        s.on('error', () => resolve(false));
      }),
    10_000,
    'pgbouncer to listen',
  );
  await listening.catch(async (err: unknown) => {
    child.kill('SIGKILL');
    await exited;
    rmSync(dir, { recursive: true, force: true });
    throw err;
  });
  return {
    port,
    url: `postgres://postgres@127.0.0.1:${port}/postgres`,
    version,
    async stop() {
      if (child.exitCode === null && child.signalCode === null) child.kill('SIGTERM');
      await exited;
      rmSync(dir, { recursive: true, force: true });
    },
  };
}

type Line = { level: string; msg: string | undefined; obj: Record<string, unknown> };
function captureLogger(lines: Line[]): Logger {
  const at = (level: string) => (obj: object, msg?: string) => lines.push({ level, msg, obj: obj as Record<string, unknown> });
  const logger: Logger = { debug() {}, info() {}, warn: at('warn'), error: at('error'), child: () => logger };
  return logger;
}

const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)] ?? NaN;

/** Enqueues one task at a time once the previous one ran; ms from enqueue to handler start. */
async function pickups(client: Client, started: Map<string, number>, n: number): Promise<number[]> {
  const out: number[] = [];
  for (let i = 0; i < n; i++) {
    const id = `pickup-${i}-${Math.random().toString(36).slice(2)}`;
    const t0 = performance.now();
    await client.enqueue(new Task('pickup', null), { queue: 'f21', taskId: id });
    const t1 = await waitFor(() => started.get(id), 15_000, `pickup of ${id}`);
    out.push(t1 - t0);
    await new Promise((r) => setTimeout(r, 30));
  }
  return out;
}

let cluster: Cluster;
let bouncer: Bouncer;
const figures: Record<string, unknown> = {};

before(async () => {
  cluster = await startCluster({ settings: { log_statement: "'all'" } });
  bouncer = await startPgbouncer(cluster.port);
  figures.pgbouncer = bouncer.version;
  // The migration lock is pg_advisory_xact_lock: it works through transaction pooling.
  await migrate({ connectionString: bouncer.url, schema: S });
});

after(async () => {
  await bouncer?.stop();
  cluster?.destroy();
  if (figures.tasks !== undefined) {
    recordFigures({
      test: 'F21 pgbouncer-transaction-mode',
      tasks: figures.tasks as number,
      lost: 0,
      dup_effects: 0,
      p50_ms: figures.pickup_poll_p50_ms as number,
      notes:
        'every connection through pgbouncer (transaction mode, preparedStatements: false); p50_ms = pickup when polling ' +
        '(LISTEN detected as unusable, one warning); pickup_listen = with a direct listenConnectionString, poll 5 s',
      ...figures,
    });
  }
});

describe('F21 pgbouncer in transaction mode', () => {
  test('the server warns once, polls, and processes every task exactly once', async () => {
    const N = 200;
    const POLL = 200;
    const lines: Line[] = [];
    const runs = new Map<string, number>();
    const started = new Map<string, number>();
    const client = new Client({ connectionString: bouncer.url, schema: S, preparedStatements: false });
    const inspector = new Inspector({ connectionString: bouncer.url, schema: S });
    const server = new Server({
      connectionString: bouncer.url,
      schema: S,
      preparedStatements: false,
      queues: { f21: 1 },
      concurrency: 8,
      taskCheckInterval: POLL,
      groupGracePeriod: 100,
      groupAggregator: (group, tasks) => new Task('agg', { group, n: tasks.length }),
      logger: captureLogger(lines),
      shutdownTimeout: 1000,
    });
    try {
      const t0 = performance.now();
      await server.start(async (task, ctx) => {
        started.set(ctx.taskId, performance.now());
        runs.set(ctx.taskId, (runs.get(ctx.taskId) ?? 0) + 1);
        if (task.type === 'tx') await ctx.transaction(async () => {});
      });
      figures.start_ms = Math.round(performance.now() - t0);
      const listenWarnings = lines.filter((l) => l.level === 'warn' && /LISTEN does not work/.test(l.msg ?? ''));
      assert.equal(listenWarnings.length, 1, JSON.stringify(lines));

      const tasks = Array.from({ length: N }, (_, i) => new Task(i % 10 === 0 ? 'tx' : 'load', { i }, { taskId: `load-${i}` }));
      const t1 = performance.now();
      for (let i = 0; i < N; i += 50) await client.enqueueMany(tasks.slice(i, i + 50), { queue: 'f21' });
      await client.enqueueMany([new Task('member', { i: 1 }), new Task('member', { i: 2 })], { queue: 'f21', group: 'g' });
      await waitFor(() => [...runs.keys()].filter((id) => id.startsWith('load-')).length === N, 30_000, `${N} tasks`);
      figures.drain_ms = Math.round(performance.now() - t1);
      await waitFor(async () => (await inspector.getQueueInfo('f21')).size === 0, 10_000, 'an empty queue');

      figures.pickup_poll_ms = (await pickups(client, started, 6)).map(Math.round);
      figures.pickup_poll_p50_ms = median(figures.pickup_poll_ms as number[]);
      figures.poll_interval_ms = POLL;
    } finally {
      await server.shutdown();
      await client.close();
      await inspector.close();
    }
    assert.deepEqual(
      [...runs.entries()].filter(([, n]) => n !== 1),
      [],
      'every task ran exactly once',
    );
    assert.equal(runs.size, N + 1 + 6, 'the load, the aggregate and the pickup tasks');
    assert.equal(lines.filter((l) => /LISTEN does not work/.test(l.msg ?? '')).length, 1, 'one warning in all');
    assert.deepEqual(
      lines.filter((l) => l.level === 'error'),
      [],
    );
    figures.tasks = N;
  });

  test('a direct listenConnectionString gives notify-level pickup', async () => {
    const POLL = 5000;
    const lines: Line[] = [];
    const started = new Map<string, number>();
    const client = new Client({ connectionString: bouncer.url, schema: S, preparedStatements: false });
    const server = new Server({
      connectionString: bouncer.url,
      listenConnectionString: cluster.connectionString,
      schema: S,
      preparedStatements: false,
      queues: { f21: 1 },
      concurrency: 2,
      taskCheckInterval: POLL,
      logger: captureLogger(lines),
      shutdownTimeout: 1000,
    });
    let times: number[];
    try {
      await server.start(async (_task, ctx) => void started.set(ctx.taskId, performance.now()));
      await new Promise((r) => setTimeout(r, 100)); // the first sweep is over: the processor sleeps for POLL
      times = await pickups(client, started, 6);
    } finally {
      await server.shutdown();
      await client.close();
    }
    figures.pickup_listen_ms = times.map(Math.round);
    figures.pickup_listen_p50_ms = Math.round(median(times));
    assert.deepEqual(
      lines.filter((l) => /LISTEN/.test(l.msg ?? '')),
      [],
      'no warning: the direct connection listens',
    );
    assert.ok(Math.max(...times) < POLL / 5, `pickup ${times.map(Math.round).join(', ')} ms, poll interval ${POLL} ms`);
  });

  test('no session-level advisory lock reached the database', () => {
    const log = readFileSync(cluster.logFile, 'utf8');
    assert.match(log, /pg_advisory_xact_lock\(/, 'the log has the statements (migrate takes a transaction-scoped lock)');
    assert.doesNotMatch(log, /pg_advisory_lock\(/);
    assert.doesNotMatch(log, /pg_advisory_unlock\(/);
    assert.doesNotMatch(log, /pg_try_advisory_lock\(/);
  });
});

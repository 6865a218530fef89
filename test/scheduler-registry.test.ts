/**
 * The Scheduler's registry (scheduler_entries: listed, refreshed, removed,
 * expired), run() in a process, PeriodicTaskManager, and a database that
 * cannot be used.
 */
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { createInterface } from 'node:readline';
import { describe } from 'node:test';
import { ConfigError, FailedPreconditionError, PeriodicTaskManager, Task, type PeriodicTaskConfig } from '../src/index.js';
import { captureLog, LEVEL } from './logs.js';
import { dsnWith, test, waitFor } from './helpers.js';
import { assertRateLimited, refusedAtOnce, schedulerFile } from './shared.js';

const { db, running, reset, scheduler, events, assertOneTaskPerTick } = schedulerFile('t_scheduler_registry');

describe('registry', () => {
  test('entries show in scheduler_entries with next and prev, refreshed, removed at shutdown; history stays', { timeout: 30_000 }, async () => {
    await reset();
    const s = scheduler();
    const id = s.register('@every 1s', new Task('listed', { a: 1 }, { queue: 'low' }), { maxRetry: 3 });
    await s.start();
    const row = await waitFor(
      async () => {
        const [r] = await db.query('SELECT * FROM {{schema}}.scheduler_entries WHERE id = $1', [id]);
        return r?.prev_run_at ? r : undefined;
      },
      20_000,
      'entry with a prev run',
    );
    assert.equal(row.spec, '@every 1s');
    assert.equal(row.task_type, 'listed');
    assert.deepEqual(row.payload, { a: 1 });
    assert.deepEqual(row.options, { queue: 'low', maxRetry: 3 });
    assert.equal(row.location, 'UTC');
    assert.equal(row.scheduler_id, s.id);
    assert.ok(row.next_run_at > row.prev_run_at);
    assert.ok(row.expires_at > row.heartbeat_at);
    const beat = row.heartbeat_at as Date;
    await waitFor(
      async () => (await db.query('SELECT heartbeat_at FROM {{schema}}.scheduler_entries WHERE id = $1', [id]))[0]?.heartbeat_at > beat,
      20_000,
      'a refresh',
    );
    await s.shutdown();
    assert.equal((await db.query('SELECT * FROM {{schema}}.scheduler_entries')).length, 0);
    assert.ok((await events(id)).length > 0, 'history outlives the scheduler');
  });

  test('unregister removes the entry (no more ticks); an entry nobody refreshes expires', { timeout: 30_000 }, async () => {
    await reset();
    await db.query(
      "INSERT INTO {{schema}}.scheduler_entries (id, spec, task_type, scheduler_id, expires_at) VALUES ('stale', '@hourly', 'x', 'gone:1:x', now() - interval '1 second')",
    );
    const s = scheduler();
    const keep = s.register('@every 1h', new Task('keep'));
    const drop = s.register('@every 1s', new Task('drop'));
    await s.start();
    assert.deepEqual(
      (await db.query('SELECT id FROM {{schema}}.scheduler_entries ORDER BY id')).map((r) => r.id).sort(),
      [keep, drop].sort(),
      'stale expired at start',
    );
    await waitFor(async () => (await events(drop)).length >= 1, 20_000, 'a tick of drop');
    s.unregister(drop);
    assert.deepEqual(s.entryIds(), [keep]);
    await waitFor(async () => (await db.query('SELECT id FROM {{schema}}.scheduler_entries')).length === 1, 20_000, 'drop unlisted');
    const n = (await events(drop)).length;
    await s.runOnce();
    assert.equal((await events(drop)).length, n, 'no tick after unregister');
  });

  test('run() shuts down on SIGTERM (child process): exit 0, its entries removed', { timeout: 60_000 }, async () => {
    await reset();
    const child = spawn(process.execPath, ['--import', 'tsx', 'test/fixtures/scheduler.ts'], {
      env: { ...process.env, DATABASE_URL: db.connectionString, SCHEMA: db.schema },
      stdio: ['ignore', 'pipe', 'inherit'],
    });
    const exited = new Promise<number | null>((resolve) => child.on('exit', (code) => resolve(code)));
    try {
      const lines = createInterface({ input: child.stdout });
      const id = await new Promise<string>((resolve) => lines.on('line', (l) => resolve(JSON.parse(l).entryId)));
      await waitFor(async () => (await events(id)).length >= 1, 30_000, 'a tick from the child');
      assert.equal((await db.query('SELECT * FROM {{schema}}.scheduler_entries WHERE id = $1', [id])).length, 1);
      child.kill('SIGTERM');
      assert.equal(await exited, 0);
      assert.equal((await db.query('SELECT * FROM {{schema}}.scheduler_entries WHERE id = $1', [id])).length, 0);
    } finally {
      child.kill('SIGKILL');
    }
  });
});

describe('PeriodicTaskManager', () => {
  function manager(getConfigs: () => PeriodicTaskConfig[] | Promise<PeriodicTaskConfig[]>, syncInterval = 100): PeriodicTaskManager {
    const m = new PeriodicTaskManager({
      connectionString: db.connectionString,
      schema: db.schema,
      logger: false,
      heartbeatInterval: 200,
      syncInterval,
      getConfigs,
    });
    running.push(m);
    return m;
  }
  const listed = async () => (await db.query<{ id: string }>('SELECT id FROM {{schema}}.scheduler_entries')).map((r) => r.id).sort();

  test('adds, updates and removes entries to match the provider', { timeout: 30_000 }, async () => {
    await reset();
    let configs: PeriodicTaskConfig[] = [
      { cronspec: '@every 1h', task: new Task('a') },
      { cronspec: '0 3 * * *', task: new Task('b', { v: 1 }) },
      { cronspec: '@daily', task: new Task('c'), opts: { queue: 'low' } },
    ];
    const m = manager(() => configs);
    await m.start();
    const ref = scheduler(); // ids as any scheduler derives them
    const idsOf = (cs: PeriodicTaskConfig[]) => cs.map((c) => ref.register(c.cronspec, c.task, c.opts)).sort();
    assert.deepEqual(m.scheduler.entryIds().sort(), idsOf(configs));
    await waitFor(async () => (await listed()).length === 3, 20_000, '3 entries listed');
    assert.deepEqual(await listed(), idsOf(configs));

    const own = m.scheduler.register('@every 3h', new Task('own')); // not the provider's: syncs leave it alone
    configs = [
      { cronspec: '@every 1h', task: new Task('a') }, // kept
      { cronspec: '0 4 * * *', task: new Task('b', { v: 1 }) }, // b updated: a new spec
      { cronspec: '@every 2h', task: new Task('d') }, // added; c removed
    ];
    const want = [...idsOf(configs), own].sort();
    await waitFor(() => JSON.stringify(m.scheduler.entryIds().sort()) === JSON.stringify(want), 20_000, 'entries synced');
    await waitFor(async () => JSON.stringify(await listed()) === JSON.stringify(want), 20_000, 'registry synced');
  });

  test('a failing provider or an invalid config leaves the entries as they are; at start it rejects', { timeout: 30_000 }, async () => {
    await reset();
    let mode: 'ok' | 'throw' | 'invalid' = 'ok';
    let calls = 0;
    const m = manager(() => {
      calls++;
      if (mode === 'throw') throw new Error('provider down');
      if (mode === 'invalid')
        return [
          { cronspec: '@every 1h', task: new Task('x') },
          { cronspec: 'bogus', task: new Task('y') },
        ];
      return [{ cronspec: '@every 1h', task: new Task('x') }];
    });
    await m.start();
    const before = m.scheduler.entryIds();
    assert.equal(before.length, 1);
    for (const next of ['throw', 'invalid'] as const) {
      mode = next;
      const at = calls;
      await waitFor(() => calls >= at + 2, 20_000, `two syncs while ${next}`);
      assert.deepEqual(m.scheduler.entryIds(), before, `unchanged while ${next}`);
    }
    await assert.rejects(
      manager(() => Promise.reject(new Error('nope'))).start(),
      (err: unknown) => err instanceof ConfigError && /initial sync failed: nope/.test(err.message),
    );
    await assert.rejects(
      manager(() => [{ cronspec: '* *', task: new Task('z') }]).start(),
      (err: unknown) => err instanceof ConfigError && /configs\[0\]\.cronspec/.test(err.message),
    );
    assert.throws(
      () => new PeriodicTaskManager({ connectionString: db.connectionString, schema: db.schema } as never),
      (err: unknown) => err instanceof ConfigError && err.field === 'getConfigs',
    );
    assert.throws(
      () => manager(() => [], -5),
      (err: unknown) => err instanceof ConfigError && err.field === 'syncInterval',
    );
  });

  test('its entries are enqueued like any scheduler entry', { timeout: 30_000 }, async () => {
    await reset();
    const m = manager(() => [{ cronspec: '@every 1s', task: new Task('managed', { ok: true }) }]);
    await m.start();
    const [id] = m.scheduler.entryIds();
    await waitFor(async () => (await events(id as string)).length >= 2, 20_000, '2 ticks');
    await m.shutdown();
    await assertOneTaskPerTick(id as string, 'managed');
  });
});

describe('a database that cannot be used', () => {
  test('unknown database or role: start rejects at once (one connection, no retry) with DatabaseUnavailableError naming it', { timeout: 30_000 }, async () => {
    for (const [parts, reason, name] of [
      [{ database: 'no_such_db_sched' }, 'database-not-found', 'no_such_db_sched'],
      [{ user: 'no_such_role_sched' }, 'authentication-failed', 'no_such_role_sched'],
    ] as const) {
      const err = await refusedAtOnce(dsnWith(parts), async (dsn) => {
        const s = scheduler({ connectionString: dsn });
        s.register('@every 1s', new Task('t'));
        try {
          await s.start();
        } finally {
          assert.equal(s.status, 'new');
        }
      });
      assert.equal(err.reason, reason);
      assert.ok(err.message.includes(`"${name}"`), err.message);
    }
  });

  test(
    'refused connection (port 1): start resolves, warns rate-limited, and retries in the background; stop and start lines',
    { timeout: 30_000 },
    async () => {
      const log = captureLog('info');
      const s = scheduler({ connectionString: dsnWith({ port: 1 }), logger: log.logger });
      s.register('@every 1s', new Task('t'));
      await s.start();
      assert.equal(s.status, 'active');
      const warn = await log.find('database unreachable; retrying in the background');
      assert.equal(warn.level, LEVEL.warn);
      assert.match((warn.err as { message: string }).message, /ECONNREFUSED/);
      const started = await log.find('scheduler started');
      assert.equal(started.schedulerId, s.id);
      assert.equal(started.entries, 1);
      // The loop and the heartbeat retry every few hundred ms; one line says so for both, a doubling gap apart.
      const warnings = () => log.lines.filter((l) => l.level >= LEVEL.warn);
      await waitFor(() => warnings().length >= 2, 10_000, 'a second warning');
      assert.deepEqual(new Set(warnings().map((l) => l.msg)), new Set([warn.msg]));
      assertRateLimited(warnings());
      await s.shutdown();
      await log.find('scheduler stopped');
    },
  );

  test('an unmigrated schema: start rejects with FailedPreconditionError saying to migrate, and creates nothing', { timeout: 30_000 }, async () => {
    const schema = `${db.schema}_never`;
    await db.pool.query(`DROP SCHEMA IF EXISTS "${schema}" CASCADE`);
    const s = scheduler({ schema });
    s.register('@every 1s', new Task('t'));
    await assert.rejects(
      s.start(),
      (err: unknown) => err instanceof FailedPreconditionError && /^schema "\w+_never" is not migrated \(.*\): run `pgasynq migrate`/.test(err.message),
    );
    assert.equal((await db.pool.query('SELECT 1 FROM pg_namespace WHERE nspname = $1', [schema])).rowCount, 0);
  });
});

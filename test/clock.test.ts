/**
 * The database clock reaches every broker statement that decides or shows
 * something by time: no raw now() (or another time function) in
 * src/broker/ outside Db's clock seam, and an Inspector or Scheduler whose
 * DatabaseClock a test moves forward sees what the Server sees on that clock.
 */
import assert from 'node:assert/strict';
import { readFileSync, readdirSync } from 'node:fs';
import { join } from 'node:path';
import { after, afterEach, before, beforeEach, describe } from 'node:test';
import { sql } from 'kysely';
import { Client, Inspector, Scheduler, Task } from '../src/index.js';
import { Db } from '../src/broker/db.js';
import { forwardDue, nextDueIn } from '../src/broker/maintenance.js';
import { addStats } from '../src/broker/servers.js';
import { DatabaseClock } from '../src/internal/clock.js';
import { silentLogger } from '../src/internal/logger.js';
import { Janitor } from '../src/server/janitor.js';
import { Recoverer } from '../src/server/recoverer.js';
import { StatsCollector } from '../src/server/stats.js';
import { DATABASE_URL, REPO, resetTables, test, testDb, type TestDb } from './helpers.js';

/** This process's warnings since the file began: no moved clock's setting may cause one (see the last test). */
const warnings: string[] = [];
process.on('warning', (w) => warnings.push(w.message));

describe('the clock seam', () => {
  // PostgreSQL's clocks, called or named: what a statement would read past the test's clock.
  const TIME = [
    /(?<![\w$.])(now|clock_timestamp|statement_timestamp|transaction_timestamp|timeofday)\s*\(/i,
    /pg_catalog\s*\.\s*"?(now|clock_timestamp|statement_timestamp|transaction_timestamp|timeofday)"?\s*\(/i,
    /(?<![\w$.])(current_timestamp|current_time|current_date|localtimestamp|localtime)(?![\w$])/i,
    /'(now|today|tomorrow|yesterday)'/i,
  ];
  /** The lines allowed to read PostgreSQL's clock as is, and why. */
  const EXCEPTIONS = [
    { file: 'db.ts', line: 'now(): RawBuilder<Date> {', why: 'the seam itself: Db.now(), declared' },
    { file: 'db.ts', line: 'return this.#shifted(sql<Date>`now()`);', why: 'the seam itself: Db.now()' },
    { file: 'db.ts', line: 'return this.#shifted(sql<Date>`clock_timestamp()`);', why: 'the seam itself: Db.clockTimestamp()' },
    { file: 'migrations.ts', line: 'applied_at timestamptz NOT NULL DEFAULT now()', why: 'records when a migration ran; decides nothing' },
  ];

  test('no broker statement reads now() or another time function outside Db.now() and Db.clockTimestamp()', () => {
    const found: string[] = [];
    const used = new Set<(typeof EXCEPTIONS)[number]>();
    const dir = join(REPO, 'src', 'broker');
    for (const file of readdirSync(dir).filter((f) => f.endsWith('.ts'))) {
      readFileSync(join(dir, file), 'utf8')
        .split('\n')
        .forEach((line, n) => {
          if (/^\s*(\*|\/\/|\/\*)/.test(line) || !TIME.some((re) => re.test(line))) return;
          const allowed = EXCEPTIONS.find((e) => e.file === file && line.includes(e.line));
          if (allowed) used.add(allowed);
          else found.push(`${file}:${n + 1}: ${line.trim()}`);
        });
    }
    assert.deepEqual(found, []);
    // An exception whose line is gone goes too, so that the list stays the list of reasons.
    assert.deepEqual(
      EXCEPTIONS.filter((e) => !used.has(e)),
      [],
    );
  });

  test("no view or function of the schema reads PostgreSQL's clock outside task_clock() (migrations/schema.sql)", () => {
    /** The lines allowed, and why. */
    const allowed = [
      { line: /^\s+\w+ timestamp with time zone DEFAULT now\(\) NOT NULL,$/, why: "a column's default: when a row was written, deciding nothing" },
      { line: /^\s+RETURN now\(\)( \+ shift_ms \* interval '')?;$/, why: 'task_clock(), the seam itself' },
      { line: /^\s+at := now_at \+ \(clock_timestamp\(\) - now\(\)\);$/, why: "claim_limited(): the time since its transaction began, added to the clock's" },
      { line: /int8send\(floor\(extract\(epoch FROM clock_timestamp\(\)\) \* 1000\)/, why: "enqueue(): a UUIDv7 id's time, as the library's ids" },
    ];
    const found = readFileSync(join(REPO, 'migrations', 'schema.sql'), 'utf8')
      .split('\n')
      // Without comments and the text of strings (a message may name now()), but for a time literal such as 'now'.
      .map((line, n) => ({
        line: line.replace(/'(?:[^']|'')*'|--.*$/g, (m) => (/^'(now|today|tomorrow|yesterday)'$/i.test(m) ? m : m.startsWith("'") ? "''" : '')),
        n,
      }))
      .filter(({ line }) => TIME.some((re) => re.test(line)) && !allowed.some((a) => a.line.test(line)))
      .map(({ line, n }) => `schema.sql:${n + 1}: ${line.trim()}`);
    assert.deepEqual(found, []);
  });

  test("no server component reads the process's clock or sets a timer but through the Db's clock", () => {
    const found: string[] = [];
    const dir = join(REPO, 'src', 'server');
    for (const file of readdirSync(dir).filter((f) => f.endsWith('.ts'))) {
      readFileSync(join(dir, file), 'utf8')
        .split('\n')
        .forEach((line, n) => {
          if (/^\s*(\*|\/\/|\/\*)/.test(line)) return;
          // (setImmediate and node:timers/promises' setImmediate yield a turn: no time.)
          if (/(?<![\w$.])(setTimeout|setInterval|clearTimeout|Date\.now|performance\.now)\s*\(|node:perf_hooks/.test(line)) {
            found.push(`${file}:${n + 1}: ${line.trim()}`);
          }
        });
    }
    assert.deepEqual(found, []);
  });

  test('the offset is a bind parameter: the text of a statement has two forms, offset 0 and any other', () => {
    const clock = new DatabaseClock();
    const db = new Db({ connectionString: 'postgres://127.0.0.1/none', schema: 'pgasynq', logger: false, clock });
    const text = () => db.now().compile(db.kysely).sql;
    assert.equal(text(), 'now()');
    clock.advance(1000);
    const moved = db.now().compile(db.kysely);
    clock.advance(5000);
    assert.equal(text(), moved.sql);
    assert.deepEqual(db.now().compile(db.kysely).parameters, [6000]);
    assert.equal(db.clockTimestamp().compile(db.kysely).sql, moved.sql.replace('now()', 'clock_timestamp()'));
    void db.close();
  });
});

describe('an Inspector and a Scheduler on a moved clock', () => {
  let db: TestDb;
  let client: Client;
  let clock: DatabaseClock;
  let inspector: Inspector;
  const MINUTE = 60_000;
  const DAY = 24 * 60 * MINUTE;

  before(async () => {
    db = await testDb('t_clock');
    client = new Client({ connectionString: db.connectionString, schema: db.schema, logger: false });
  });
  after(async () => {
    await client.close();
    await db.close();
  });
  beforeEach(async () => {
    clock = new DatabaseClock();
    inspector = new Inspector({ connectionString: db.connectionString, schema: db.schema, logger: false, clock });
    await resetTables(db);
  });
  afterEach(() => inspector.close());

  const dbNow = async () => ((await db.query<{ now: Date }>('SELECT now() AS now'))[0] as { now: Date }).now.getTime();

  test('a lease that ran out on the clock is orphaned, and a pending task is due at the moved now', async () => {
    await client.enqueue(new Task('job', {}), { queue: 'q', taskId: 'active' });
    await client.enqueue(new Task('job', {}), { queue: 'q', taskId: 'pending' });
    await db.query(
      "UPDATE {{schema}}.tasks SET state = 'active', run_at = NULL, lease_owner = 'srv', lease_token = gen_random_uuid(), lease_expires_at = now() + interval '1 minute', started_at = now() WHERE id = 'active'",
    );
    assert.equal((await inspector.getTaskInfo('q', 'active')).isOrphaned, false);

    clock.advance(MINUTE + 1000);
    const before = await dbNow();
    assert.equal((await inspector.getTaskInfo('q', 'active')).isOrphaned, true);
    assert.deepEqual(
      (await inspector.listActiveTasks('q')).map((t) => t.isOrphaned),
      [true],
    );
    const due = (await inspector.getTaskInfo('q', 'pending')).nextProcessAt!.getTime();
    assert.ok(due >= before + MINUTE, `pending is due at the moved now (${due - before} ms ahead of PostgreSQL's)`);
  });

  test("history's today is the clock's day: the stats a server adds on the moved clock are today's", async () => {
    await client.enqueue(new Task('job', {}), { queue: 'q' });
    const server = new Db({ connectionString: db.connectionString, schema: db.schema, logger: false, clock });
    try {
      clock.advance(DAY);
      await addStats(server, [{ queue: 'q', processed: 3, failed: 1 }]);
    } finally {
      await server.close();
    }
    const [today, yesterday] = await inspector.history('q', 2);
    const [row] = await db.query<{ tomorrow: Date }>("SELECT ((now() AT TIME ZONE 'UTC')::date + 1)::timestamp AT TIME ZONE 'UTC' AS tomorrow");
    assert.deepEqual({ date: today?.date, processed: today?.processed, failed: today?.failed }, { date: row?.tomorrow, processed: 3, failed: 1 });
    assert.equal(yesterday?.processed, 0, "PostgreSQL's today is the clock's yesterday");
  });

  test('a server and a scheduler whose rows expired on the clock are not listed', async () => {
    await db.query(
      "INSERT INTO {{schema}}.servers (id, host, pid, concurrency, queues, strict_priority, status, expires_at) VALUES ('srv', 'h', 1, 1, '{}', false, 'active', now() + interval '30 seconds')",
    );
    await db.query(
      "INSERT INTO {{schema}}.scheduler_entries (id, spec, task_type, scheduler_id, expires_at) VALUES ('e', '@every 1m', 'job', 'sch', now() + interval '30 seconds')",
    );
    assert.deepEqual(
      (await inspector.servers()).map((s) => s.id),
      ['srv'],
    );
    assert.deepEqual(
      (await inspector.schedulerEntries()).map((e) => e.id),
      ['e'],
    );
    clock.advance(MINUTE);
    assert.deepEqual(await inspector.servers(), []);
    assert.deepEqual(await inspector.schedulerEntries(), []);
  });

  test('runTask and archiveTask stamp run_at with the moved now', async () => {
    await client.enqueue(new Task('job', {}), { queue: 'q', taskId: 'a', processIn: DAY });
    clock.advance(60 * MINUTE);
    const before = await dbNow();
    await inspector.archiveTask('q', 'a');
    const runAt = async () =>
      ((await db.query<{ run_at: Date }>("SELECT run_at FROM {{schema}}.tasks WHERE id = 'a'"))[0] as { run_at: Date }).run_at.getTime();
    assert.ok((await runAt()) >= before + 60 * MINUTE, 'archived at the moved now: the archive retention counts from it');
    clock.advance(MINUTE);
    await inspector.runTask('q', 'a');
    assert.ok((await runAt()) >= before + 61 * MINUTE, 'pending since the moved now: the latency counts from it');
  });

  test("a cron tick comes due when the scheduler's clock passes it, without waiting", async () => {
    const s = new Scheduler({ connectionString: db.connectionString, schema: db.schema, logger: false, clock });
    try {
      const entry = s.register('@every 1h', new Task('hourly'));
      await s.runOnce();
      const ticks = async () => (await db.query('SELECT tick_at FROM {{schema}}.scheduler_events WHERE entry_id = $1', [entry])).length;
      assert.equal(await ticks(), 0);
      clock.advance(60 * MINUTE + 1000);
      await s.runOnce();
      assert.equal(await ticks(), 1);
      assert.equal((await db.query("SELECT 1 FROM {{schema}}.tasks WHERE type = 'hourly'")).length, 1);
    } finally {
      await s.shutdown();
    }
  });

  test("queue latency, today's stats and orphaned leases in the views run on the clock", async () => {
    await client.enqueue(new Task('job', {}), { queue: 'q' });
    assert.ok((await inspector.getQueueInfo('q')).latency < MINUTE);
    clock.advance(MINUTE);
    assert.ok((await inspector.getQueueInfo('q')).latency >= MINUTE);
    // The views as SQL reads them, on a session of the moved clock's Db.
    const moved = new Db({ connectionString: db.connectionString, schema: db.schema, logger: false, clock });
    try {
      await db.query(
        `UPDATE {{schema}}.task_states SET state = 'active', lease_owner = 'gone', lease_token = gen_random_uuid(),
           lease_expires_at = now() + interval '30 seconds', pending_seq = NULL WHERE queue = 'q'`,
      );
      const view = async (text: string) => (await moved.pool.query(text.replaceAll('{{schema}}', `"${db.schema}"`))).rows[0] as Record<string, unknown>;
      assert.equal((await view('SELECT orphaned FROM {{schema}}.active_tasks')).orphaned, true, 'expired on the clock');
      assert.deepEqual(await db.query('SELECT orphaned FROM {{schema}}.active_tasks'), [{ orphaned: false }], "not on the database's");
      const stats = await view(`SELECT extract(epoch FROM timestamp - now()) * 1000 AS ahead FROM {{schema}}.queue_stats WHERE queue = 'q'`);
      assert.equal(Math.round(Number(stats.ahead)), MINUTE);
    } finally {
      await moved.close();
    }
  });

  test('SQL enqueue() routes by the clock: a process_at before the moved now is pending, after it scheduled', async () => {
    const moved = new Db({ connectionString: db.connectionString, schema: db.schema, logger: false, clock });
    try {
      clock.advance(DAY);
      const enqueue = async (id: string, inMs: number) =>
        moved.pool.query(`SELECT "${db.schema}".enqueue('t', queue => 'q', task_id => $1, process_at => now() + $2 * interval '1 millisecond')`, [id, inMs]);
      await enqueue('within', DAY - MINUTE);
      await enqueue('beyond', DAY + MINUTE);
      assert.equal((await inspector.getTaskInfo('q', 'within')).state, 'pending');
      assert.equal((await inspector.getTaskInfo('q', 'beyond')).state, 'scheduled');
    } finally {
      await moved.close();
    }
  });
});

describe("a server's forwarder, recoverer and janitor on a moved clock (their owner's functions take the shift)", () => {
  let db: TestDb;
  let client: Client;
  let clock: DatabaseClock;
  let server: Db;
  const MINUTE = 60_000;
  const HOUR = 60 * MINUTE;
  const DAY = 24 * HOUR;

  before(async () => {
    db = await testDb('t_clock_maint');
    client = new Client({ connectionString: db.connectionString, schema: db.schema, logger: false });
  });
  after(async () => {
    await client.close();
    await db.close();
  });
  beforeEach(async () => {
    clock = new DatabaseClock();
    server = new Db({ connectionString: db.connectionString, schema: db.schema, logger: false, clock });
    await resetTables(db);
  });
  afterEach(() => server.close());

  const dbNow = async () => ((await db.query<{ now: Date }>('SELECT now() AS now'))[0] as { now: Date }).now.getTime();
  const row = async (id: string) =>
    (
      await db.query<{ state: string; run_at: Date | null; last_failed_at: Date | null }>(
        'SELECT state, run_at, last_failed_at FROM {{schema}}.tasks WHERE id = $1',
        [id],
      )
    )[0];

  test('a task scheduled an hour ahead is forwarded once the clock passes its due time, pending from the moved now', async () => {
    await client.enqueue(new Task('job', {}), { queue: 'q', taskId: 'later', processIn: HOUR });
    assert.equal(await forwardDue(server, 10), 0);
    assert.ok((await nextDueIn(server))! > HOUR - MINUTE);
    clock.advance(HOUR + 1000);
    assert.ok((await nextDueIn(server))! <= 0);
    const before = await dbNow();
    assert.equal(await forwardDue(server, 10), 1);
    const later = await row('later');
    assert.ok(later);
    assert.equal(later.state, 'pending');
    assert.ok(later.run_at!.getTime() >= before + HOUR, 'pending since the moved now');
  });

  test('a lease that ran out on the clock is recovered at the moved now, and a state row without inputs is dropped', async () => {
    await client.enqueue(new Task('job', {}), { queue: 'q', taskId: 'leased' });
    await db.query(
      "UPDATE {{schema}}.tasks SET state = 'active', run_at = NULL, lease_owner = 'gone', lease_token = gen_random_uuid(), lease_expires_at = now() + interval '1 minute', started_at = now() WHERE id = 'leased'",
    );
    await db.query(`INSERT INTO {{schema}}.task_states (seq, queue, state, lease_owner, lease_token, lease_expires_at)
                    VALUES (nextval('{{schema}}.task_seq'), 'q', 'active', 'gone', gen_random_uuid(), now() + interval '1 minute')`);
    const recoverer = new Recoverer(
      server,
      silentLogger,
      { recoverInterval: 60_000, recoverCutoff: 1000, leaseDuration: 30_000, retryDelay: () => MINUTE },
      new StatsCollector(server),
    );
    assert.deepEqual(await recoverer.runOnce(), { retried: 0, archived: 0 });
    clock.advance(2 * MINUTE);
    const before = await dbNow();
    assert.deepEqual(await recoverer.runOnce(), { retried: 1, archived: 0 });
    const leased = await row('leased');
    assert.ok(leased);
    assert.equal(leased.state, 'retry');
    assert.ok(leased.last_failed_at!.getTime() >= before + 2 * MINUTE, 'failed at the moved now');
    assert.ok(leased.run_at!.getTime() >= before + 3 * MINUTE, 'due a retry delay after it');
    assert.deepEqual(await db.query('SELECT seq FROM {{schema}}.task_states WHERE state = $1', ['active']), [], 'the state row without inputs is gone');
  });

  test('the janitor deletes completed tasks, unique locks and archived tasks whose time ran out on the clock', async () => {
    await client.enqueue(new Task('job', {}), { queue: 'q', taskId: 'done', retention: HOUR });
    await db.query("UPDATE {{schema}}.tasks SET state = 'completed', completed_at = now(), run_at = now() + interval '1 hour' WHERE id = 'done'");
    await client.enqueue(new Task('job', { unique: true }), { queue: 'q', taskId: 'unique', unique: HOUR });
    await client.enqueue(new Task('job', {}), { queue: 'q', taskId: 'dead' });
    await db.query("UPDATE {{schema}}.tasks SET state = 'archived', run_at = now() WHERE id = 'dead'");
    const janitor = new Janitor(server, silentLogger, { janitorInterval: 60_000, janitorBatchSize: 100 });
    assert.deepEqual(await janitor.runOnce(), { completed: 0, locks: 0, archived: 0 });
    clock.advance(HOUR + MINUTE);
    assert.deepEqual(await janitor.runOnce(), { completed: 1, locks: 1, archived: 0 });
    // asynq's archive bound: 90 days.
    clock.advance(90 * DAY);
    assert.deepEqual(await janitor.runOnce(), { completed: 0, locks: 0, archived: 1 });
    assert.deepEqual(
      (await db.query<{ id: string }>('SELECT id FROM {{schema}}.tasks')).map((r) => r.id),
      ['unique'],
    );
  });
});

describe("a moved clock's session setting", () => {
  const MINUTE = 60_000;
  test("goes ahead of a checkout's first statement in each of pg's forms, never beside it", async () => {
    const clock = new DatabaseClock();
    const moved = new Db({ connectionString: DATABASE_URL, schema: 't_clock_setting', logger: false, clock });
    const SHIFT = "SELECT current_setting('pgasynq.clock_shift_ms') AS s";
    try {
      clock.advance(MINUTE);
      // pool.query(): pg checks a client out and queries it with a callback.
      assert.equal((await moved.pool.query<{ s: string }>(SHIFT)).rows[0]!.s, String(MINUTE));
      clock.advance(1000);
      const client = await moved.pool.connect();
      try {
        // A checkout's promise form, then a callback on the same checkout.
        assert.equal((await client.query<{ s: string }>(SHIFT)).rows[0]!.s, String(MINUTE + 1000));
        const again = await new Promise<string>((resolve, reject) =>
          client.query<{ s: string }>(SHIFT, (err, r) => (err ? reject(err) : resolve(r.rows[0]!.s))),
        );
        assert.equal(again, String(MINUTE + 1000));
      } finally {
        client.release();
      }
      clock.advance(1000);
      // Kysely's checkout, as every broker statement runs.
      assert.equal((await moved.run(sql<{ s: string }>`SELECT current_setting('pgasynq.clock_shift_ms') AS s`))[0]!.s, String(MINUTE + 2000));
    } finally {
      await moved.close();
    }
    // pg warns (once a process) of a query sent on a client still running one: the setting
    // must never be that, here or in any moved clock of the tests above.
    await new Promise((resolve) => setImmediate(resolve));
    assert.deepEqual(
      warnings.filter((w) => w.includes('client.query()')),
      [],
    );
  });
});

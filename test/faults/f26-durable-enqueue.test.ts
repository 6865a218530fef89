/**
 * F26 durable-enqueue (plan §5.2, R18): the owned cluster's database
 * defaults to `synchronous_commit = off` (ALTER DATABASE … SET) and its WAL
 * writer sleeps 10 s (`wal_writer_delay`), so an asynchronous commit can sit
 * in PostgreSQL's WAL buffers, unwritten, after COMMIT returned (under load
 * the WAL writer is still woken for each full 8 kB page: what waits is the
 * page being filled). A producer enqueues as fast as it can, appending each
 * id to the acknowledgement log (outside the database) once enqueue()
 * resolved; three times, at a random moment, PostgreSQL is crashed
 * (`pg_ctl -m immediate stop`: the WAL buffers die with it) and started
 * again. lost_acked = acknowledged ids missing from the tasks table.
 *
 *   - R18 on: the Client on its own pool. Its sessions ask for
 *     synchronous_commit=on at connect, whatever the database says:
 *     lost_acked must be 0.
 *   - Positive control: the same run with the Client on a pg.Pool the
 *     producer made itself (as a user's app may pass one): its sessions keep
 *     the database's `off`, so nothing overrides it. lost_acked must be > 0,
 *     or this test could not see a loss and proves nothing.
 */
import assert from 'node:assert/strict';

import pg from 'pg';
import { recordFigures, sleep, waitFor, type Harness } from './harness.js';
import { faultTest } from './kit.js';

const CRASHES = 3;

interface Run {
  lostAcked: number;
  lostPerCrash: number[];
  acked: number;
  ackedAtCrash: number[];
  unwrittenWalBytes: number[];
  tasks: number;
  crashAfterS: number[];
  enqueueRate: number;
  restartMs: number[];
  producerErrors: number;
  dbDefault: string;
}

/**
 * CRASHES crashes, each at a random moment 1–4 s into a stretch of enqueues. One crash loses
 * little even when nothing overrides the database: under load the WAL writer is woken for
 * every full 8 kB page and writes it out (an immediate stop loses only what is not yet
 * written, not what is unflushed), so the exposed WAL is the page being filled, a few
 * enqueues. Three crashes make a run that loses nothing by luck unlikely.
 */
async function crashRun(h: Harness, clientPool: 'own' | 'user'): Promise<Run> {
  const { db } = await h.one<{ db: string }>('SELECT quote_ident(current_database()) AS db');
  await h.query(`ALTER DATABASE ${db} SET synchronous_commit = off`);
  // The setting applies to sessions opened from now on: check it on a fresh one (the harness pool's are older).
  const { dbDefault, walWriterDelay } = await freshSession(h.connectionString);
  assert.equal(dbDefault, 'off', 'a new session of the database commits asynchronously');
  assert.equal(walWriterDelay, '10s');

  const producer = await h.spawnProducer({ count: 10_000_000, rate: 0, inflight: 8, env: clientPool === 'user' ? { CLIENT_POOL: 'user' } : {} });
  // Nothing but the producer commits in this database during the run: a synchronous commit
  // of anyone would flush the WAL before it. The harness only reads (no transaction id, no flush).
  const lostNow = async (): Promise<number> =>
    (
      await h.one<{ n: number }>(
        'SELECT count(*)::int AS n FROM unnest($1::text[]) AS a(id) WHERE NOT EXISTS (SELECT 1 FROM {{schema}}.tasks t WHERE t.id = a.id)',
        [h.ackedIds()],
      )
    ).n;
  const ackedAtCrash: number[] = [];
  const crashAfterS: number[] = [];
  const restartMs: number[] = [];
  const unwrittenWalBytes: number[] = [];
  const lostPerCrash: number[] = [];
  let rateAcks = 0;
  let rateS = 0;
  for (let i = 0; i < CRASHES; i++) {
    const before = h.ackedIds().length;
    await waitFor(() => h.ackedIds().length >= before + 300, 30_000, '300 acknowledged enqueues', 50);
    const t0 = performance.now();
    const a0 = h.ackedIds().length;
    const wait = 1 + Math.random() * 3;
    crashAfterS.push(Math.round(wait * 10) / 10);
    await sleep(wait * 1000);
    // WAL inserted but not yet written out: what an immediate stop can lose (read-only: no flush).
    const { unwritten } = await h.one<{ unwritten: string }>('SELECT pg_wal_lsn_diff(pg_current_wal_insert_lsn(), pg_current_wal_lsn())::text AS unwritten');
    const a1 = h.ackedIds().length;
    rateAcks += a1 - a0;
    rateS += (performance.now() - t0) / 1000;
    h.cluster.crash();
    ackedAtCrash.push(h.ackedIds().length);
    unwrittenWalBytes.push(Number(unwritten));
    await sleep(1000);
    const t1 = performance.now();
    h.cluster.start();
    restartMs.push(Math.round(performance.now() - t1));
    await waitFor(() => h.dbNow().catch(() => undefined), 20_000, 'the harness to reconnect');
    // Every id acknowledged up to now: those lost in this crash are gone for good.
    lostPerCrash.push((await lostNow()) - lostPerCrash.reduce((x, y) => x + y, 0));
  }
  // The producer reconnects on its own and acknowledges more; then it stops.
  const ackedAtRestart = h.ackedIds().length;
  await waitFor(() => h.ackedIds().length >= ackedAtRestart + 100, 30_000, 'enqueues acknowledged after the last restart', 50);
  h.signal(producer, 'SIGTERM');
  await producer.exited;

  const c = await h.check({ maxRetry: 3 });
  const done = producer.events.find((e) => e.event === 'done');
  const errors = producer.events.filter((e) => e.event === 'error');
  assert.equal(done?.acked, c.acked, 'the producer acknowledged exactly what the log holds');
  for (const e of errors) assert.ok(typeof e.message === 'string' && e.message.length > 0, 'each producer error is an explicit rejection');
  assert.ok(errors.length > 0, 'the producer saw the crashes');
  assert.deepEqual(h.unexpectedExits(), []);
  assert.equal(
    lostPerCrash.reduce((x, y) => x + y, 0),
    c.lost,
    'nothing acknowledged after the last restart is missing',
  );
  return {
    lostAcked: c.lost,
    lostPerCrash,
    acked: c.acked,
    ackedAtCrash,
    unwrittenWalBytes,
    tasks: c.tasks,
    crashAfterS,
    enqueueRate: Math.round(rateAcks / rateS),
    restartMs,
    producerErrors: errors.length,
    dbDefault,
  };
}

async function freshSession(connectionString: string): Promise<{ dbDefault: string; walWriterDelay: string }> {
  const client = new pg.Client({ connectionString, application_name: 'harness:f26' });
  await client.connect();
  try {
    const { rows } = await client.query<{ sc: string; wwd: string }>(
      "SELECT current_setting('synchronous_commit') AS sc, current_setting('wal_writer_delay') AS wwd",
    );
    return { dbDefault: rows[0]!.sc, walWriterDelay: rows[0]!.wwd };
  } finally {
    await client.end();
  }
}

function record(label: string, r: Run, notes: string): void {
  const figures = {
    test: label,
    tasks: r.tasks,
    lost: r.lostAcked,
    recovery_s: null,
    lost_acked: r.lostAcked,
    lost_per_crash: r.lostPerCrash,
    acked: r.acked,
    acked_at_crash: r.ackedAtCrash,
    unwritten_wal_bytes_at_crash: r.unwrittenWalBytes,
    crash_after_s: r.crashAfterS,
    enqueue_per_s: r.enqueueRate,
    restart_ms: r.restartMs,
    producer_errors: r.producerErrors,
    db_synchronous_commit: r.dbDefault,
    notes,
  };
  recordFigures(figures);
  // Also here: results/ is shared with whatever else runs the suite at the same time.
  console.log(`figures: ${JSON.stringify(figures)}`);
}

/** The cluster of a run: the WAL writer wakes every 10 s only, so what commits asynchronously stays unwritten. */
const CLUSTER = { settings: { wal_writer_delay: "'10s'" } };

faultTest(
  'F26 durable-enqueue: with the database at synchronous_commit=off, no acknowledged enqueue is lost in 3 crashes',
  { schema: 'f26_own', timeout: 120_000, cluster: CLUSTER },
  async (h) => {
    const r = await crashRun(h, 'own');
    record(
      'F26 durable-enqueue (Client pool, R18 on)',
      r,
      `database synchronous_commit=off, wal_writer_delay=10s; producer as fast as 8 in flight allow (${r.enqueueRate}/s); ` +
        `${CRASHES} x pg_ctl -m immediate stop ${r.crashAfterS.join('/')} s into a stretch of enqueues, start; lost per crash ${r.lostPerCrash.join('/')} (must be 0)`,
    );
    assert.equal(r.lostAcked, 0, `${r.lostAcked} acknowledged enqueues lost of ${r.acked}`);
  },
);

faultTest(
  'F26 positive control: the same run on a pool that does not override the database loses acknowledged enqueues',
  { schema: 'f26_user', timeout: 120_000, cluster: CLUSTER },
  async (h) => {
    const r = await crashRun(h, 'user');
    record(
      'F26 positive control (user pool, R18 off)',
      r,
      `as F26, but the Client enqueues through a pg.Pool of the producer's own (sessions keep synchronous_commit=off): ` +
        `${r.enqueueRate}/s, crashes ${r.crashAfterS.join('/')} s in; lost per crash ${r.lostPerCrash.join('/')} (the total must be > 0, or the test cannot see a loss)`,
    );
    assert.ok(r.lostAcked > 0, `the crash lost no acknowledged enqueue of ${r.acked}: this run cannot detect a loss`);
  },
);

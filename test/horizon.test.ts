/**
 * The horizon watch: a server names the session whose snapshot has held back
 * vacuum for a minute (on the database clock, moved forward here instead of
 * waiting), once, and says when it has ended.
 */
import assert from 'node:assert/strict';
import pg from 'pg';
import { Server } from '../src/index.js';
import { DatabaseClock } from '../src/internal/clock.js';
import { captureLog, type LogLine } from './logs.js';
import { setupDb, test, waitFor } from './helpers.js';

const { db } = setupDb('t_horizon');

test('a snapshot held past a minute is named by pid in one warning, and its end is told', { timeout: 60_000 }, async () => {
  const holder = new pg.Client({ connectionString: db.connectionString, application_name: 'monthly-report' });
  await holder.connect();
  const server = (() => {
    const clock = new DatabaseClock();
    // A minute and more after the holder's transaction begins, on the statements' clock.
    clock.advance(61_000);
    const log = captureLog('info');
    return { clock, log, server: new Server({ connectionString: db.connectionString, schema: db.schema, logger: log.logger, healthCheckInterval: 50, clock }) };
  })();
  try {
    await holder.query('BEGIN ISOLATION LEVEL REPEATABLE READ');
    await holder.query('SELECT count(*) FROM pg_class');
    const pid = (await holder.query<{ pid: number }>('SELECT pg_backend_pid() AS pid')).rows[0]!.pid;
    await server.server.start(() => {});
    const mine = (l: LogLine) => l.pid === pid;
    const warning = await waitFor(() => server.log.lines.find((l) => l.component === 'horizon' && l.level === 40 && mine(l)), 20_000, 'the warning');
    assert.match(String(warning.msg), new RegExp(`^xmin horizon held by pid ${pid} for \\d+ s: dead tasks cannot be vacuumed`));
    assert.equal(warning.name, 'monthly-report');
    assert.equal(warning.state, 'idle in transaction');
    assert.ok((warning.heldSeconds as number) >= 60);
    // Told once, however many checks see it again.
    await new Promise((r) => setTimeout(r, 300));
    assert.equal(server.log.lines.filter((l) => l.component === 'horizon' && l.level === 40 && mine(l)).length, 1);
    await holder.query('COMMIT');
    await waitFor(() => server.log.lines.find((l) => l.component === 'horizon' && l.level === 30 && mine(l)), 20_000, 'the end of it');
  } finally {
    await server.server.shutdown();
    await holder.end();
  }
});

test('a transaction that holds no snapshot, or one younger than a minute, is not named', { timeout: 60_000 }, async () => {
  const holder = new pg.Client({ connectionString: db.connectionString, application_name: 'short-lived' });
  await holder.connect();
  const log = captureLog('info');
  const server = new Server({ connectionString: db.connectionString, schema: db.schema, logger: log.logger, healthCheckInterval: 50 });
  try {
    await holder.query('BEGIN ISOLATION LEVEL REPEATABLE READ');
    await holder.query('SELECT 1');
    const pid = (await holder.query<{ pid: number }>('SELECT pg_backend_pid() AS pid')).rows[0]!.pid;
    await server.start(() => {});
    await new Promise((r) => setTimeout(r, 500));
    assert.equal(log.lines.filter((l) => l.component === 'horizon' && l.pid === pid).length, 0, 'seconds old: not yet');
    await holder.query('COMMIT');
  } finally {
    await server.shutdown();
    await holder.end();
  }
});

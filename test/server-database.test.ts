/**
 * A Server whose database cannot be used: one that does not exist, a role
 * that cannot log in, a host that does not resolve (start rejects), a port
 * that refuses (start resolves and retries), a database that comes back, and
 * a listener that cannot reconnect when the server shuts down.
 */
import assert from 'node:assert/strict';
import { lookup } from 'node:dns/promises';
import { createServer, connect as tcpConnect, type Server as NetServer, type Socket } from 'node:net';
import { describe } from 'node:test';
import { DatabaseUnavailableError, Server, Task, type ServerConfig } from '../src/index.js';
import { TcpProxy, reset as resetEveryConnection } from './faults/proxy.js';
import { captureLog, LEVEL } from './logs.js';
import { deferred, dsnWith, test, waitFor } from './helpers.js';
import { assertRateLimited, refusedAtOnce, serverFile } from './shared.js';

const { db, client, running, reset } = serverFile('t_server_database');

describe('a database that cannot be used', () => {
  const bad = (parts: Parameters<typeof dsnWith>[0]): ServerConfig => ({ connectionString: dsnWith(parts), schema: db.schema, logger: false });

  /** Starts a server on `dsn`; it must not start, and is shut down. */
  const startOn = async (dsn: string) => {
    const server = new Server({ connectionString: dsn, schema: db.schema, logger: false });
    try {
      await server.start(() => {});
    } finally {
      assert.equal(server.status, 'new');
      await server.shutdown();
    }
  };

  test('unknown database: start rejects at once, after one connection, with DatabaseUnavailableError naming it', { timeout: 30_000 }, async () => {
    const err = await refusedAtOnce(dsnWith({ database: 'no_such_db_xyz' }), startOn);
    assert.equal(err.reason, 'database-not-found');
    assert.equal(err.code, 'ERR_DATABASE_UNAVAILABLE');
    assert.match(err.message, /^database "no_such_db_xyz" does not exist \(server [^)]+:\d+\/no_such_db_xyz\): create it/);
    assert.equal((err.cause as { code?: string }).code, '3D000');
  });

  test('unknown role: start rejects at once, after one connection, naming the role', { timeout: 30_000 }, async () => {
    const err = await refusedAtOnce(dsnWith({ user: 'no_such_role_xyz' }), startOn);
    assert.equal(err.reason, 'authentication-failed');
    // Trust auth says the role does not exist (28000); password auth that its password failed (28P01).
    assert.match(err.message, /"no_such_role_xyz".*: check the user and password of the connection string$/);
  });

  test('unknown host: start rejects with host-not-found', { timeout: 30_000 }, async (t) => {
    const host = 'no-such-host.invalid';
    // Without a name server the lookup fails with EAI_AGAIN, which is retried, not refused.
    const code = await lookup(host).then(
      () => 'resolved',
      (e: { code?: string }) => e.code,
    );
    if (code !== 'ENOTFOUND') return t.skip(`the lookup of ${host} gives ${code} here, not ENOTFOUND`);
    const server = new Server(bad({ host }));
    await assert.rejects(
      server.start(() => {}),
      (err: unknown) => err instanceof DatabaseUnavailableError && err.reason === 'host-not-found' && err.message.includes(`"${host}"`),
    );
    await server.shutdown();
  });

  test('refused connection (port 1): start resolves, says so in a warn line, and keeps retrying', { timeout: 30_000 }, async () => {
    const log = captureLog('info');
    const server = new Server({ ...bad({ port: 1 }), logger: log.logger, taskCheckInterval: 50, heartbeatInterval: 100, leaseDuration: 1000 });
    // Nothing ever answers on port 1: that start() resolves shows it does not wait for the database.
    await server.start(() => {});
    assert.equal(server.status, 'active');
    const warn = await log.find('database unreachable; retrying in the background');
    assert.equal(warn.level, LEVEL.warn);
    assert.equal(warn.component, 'database');
    assert.match(String(warn.database), /:1\//);
    assert.match((warn.err as { message: string }).message, /ECONNREFUSED/);
    assert.ok(log.lines.some((l) => l.msg === 'server started'));
    // Rate-limited: the components retry every few ms to seconds, the warnings come a doubling gap apart.
    const warnings = () => log.lines.filter((l) => l.level >= LEVEL.warn && l.component === 'database');
    await waitFor(() => warnings().length >= 2, 10_000, 'a second warning');
    assertRateLimited(warnings());
    assert.ok(
      log.lines.every((l) => l.level < LEVEL.error),
      'an unreachable database is no error line',
    );
    await server.shutdown();
  });

  test('a database that comes back: the server logs it and processes the waiting task', { timeout: 60_000 }, async () => {
    await reset();
    // A TCP proxy in front of the real server, closed at first: connections are refused.
    const target = new URL(db.connectionString);
    const probe = createServer();
    await new Promise<void>((r) => probe.listen(0, '127.0.0.1', r));
    const port = (probe.address() as { port: number }).port;
    await new Promise((r) => probe.close(r));
    const log = captureLog('info');
    const done = deferred();
    const server = new Server({
      ...bad({ host: '127.0.0.1', port }),
      logger: log.logger,
      taskCheckInterval: 50,
      delayedTaskCheckInterval: 50,
      heartbeatInterval: 100,
      leaseDuration: 1000,
    });
    running.push(server);
    await server.start(() => done.resolve());
    await log.find('database unreachable; retrying in the background');
    await client.enqueue(new Task('after-outage'));
    const sockets = new Set<Socket>();
    const proxy: NetServer = createServer((inbound) => {
      const outbound = tcpConnect(Number(target.port || 5432), target.hostname);
      sockets.add(inbound).add(outbound);
      inbound.pipe(outbound).pipe(inbound);
      const drop = () => (inbound.destroy(), outbound.destroy());
      inbound.on('error', drop).on('close', drop);
      outbound.on('error', drop).on('close', drop);
    });
    await new Promise<void>((r) => proxy.listen(port, '127.0.0.1', r));
    try {
      const back = await log.find('database reachable again');
      assert.equal(back.level, LEVEL.info);
      assert.ok((back.failures as number) >= 1);
      await done.promise;
      await server.shutdown();
    } finally {
      for (const s of sockets) s.destroy();
      await new Promise((r) => proxy.close(r));
    }
  });

  test('a server shut down while its listener cannot reconnect stops trying: nothing connects after the shutdown', { timeout: 30_000 }, async () => {
    await reset();
    const target = new URL(db.connectionString);
    const proxy = await TcpProxy.start({ targetHost: target.hostname, targetPort: Number(target.port || 5432) });
    try {
      const log = captureLog('info');
      const server = new Server({ connectionString: proxy.dsn(db.connectionString), schema: db.schema, logger: log.logger, taskCheckInterval: 50 });
      running.push(server);
      await server.start(() => {});
      let attempts = 0;
      proxy.server.on('connection', () => attempts++);
      // From now on every connection is reset: the listener loses its own and cannot get another.
      proxy.setMode(resetEveryConnection());
      await waitFor(() => attempts > 0, 10_000, 'a reconnection attempt');
      await log.find('listener cannot connect; polling for work until it can');
      await server.shutdown();
      const atShutdown = attempts;
      // The listener's retries came every 0.1–0.4 s by then: two seconds would show the next.
      // (Real time, on purpose: the retry is the notifier's own timer, which no test clock
      // moves, and nothing is asserted on how long anything took: a slow machine can only
      // fail to show an attempt, never fail the test.)
      await new Promise((r) => setTimeout(r, 2000));
      assert.equal(attempts, atShutdown, 'no connection attempt after the shutdown');
    } finally {
      await proxy.close();
    }
  });
});

/**
 * The embedded database's public front: createEmbeddedDatabase() checks its
 * options, and the library runs on it end to end (migrate, enqueue inside the
 * caller's own transaction, a server, the Inspector), on disk as in memory.
 */
import assert from 'node:assert/strict';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { describe } from 'node:test';
import { Client, ConfigError, Inspector, Server, Task, createEmbeddedDatabase, migrate } from '../src/index.js';
import { caught, testWithin, waitFor } from './helpers.js';

/** The CLI runs as a process per command, several per test: more than a minute under a loaded machine. */
const test = testWithin(180_000);

describe('createEmbeddedDatabase', () => {
  for (const dataDir of ['', 42, null]) {
    test(`refuses dataDir ${JSON.stringify(dataDir)} with a ConfigError naming it`, async () => {
      const err = await caught(() => createEmbeddedDatabase({ dataDir } as never));
      assert.ok(err instanceof ConfigError, String(err));
      assert.match(err.message, /dataDir/);
    });
  }

  test('refuses an embedded option that did not come from it', async () => {
    const err = await caught(() => new Client({ embedded: { pool: {} } as never }));
    assert.ok(err instanceof ConfigError, String(err));
    assert.match(err.message, /embedded.*createEmbeddedDatabase/);
  });

  test('runs tasks end to end and keeps them on disk across a restart', { timeout: 120_000 }, async () => {
    const dataDir = mkdtempSync(join(tmpdir(), 'pgasynq-embedded-'));
    try {
      let db = await createEmbeddedDatabase({ dataDir });
      assert.equal(db.dataDir, dataDir);
      await migrate({ embedded: db });
      const client = new Client({ embedded: db });
      // Enqueued inside the caller's own transaction on the borrowed session.
      const session = await db.connect();
      await session.query('BEGIN');
      await client.enqueue(new Task('greet', { n: 1 }), { tx: session, taskId: 'in-tx' });
      await session.query('COMMIT');
      session.release();
      await client.enqueue(new Task('greet', { n: 2 }), { taskId: 'later', processIn: 3_600_000 });
      await client.close();
      await db.close();

      db = await createEmbeddedDatabase({ dataDir });
      const seen: unknown[] = [];
      const server = new Server({ embedded: db, concurrency: 2, taskCheckInterval: 50 });
      await server.start(async (task) => void seen.push(task.payload));
      await waitFor(() => seen.length === 1, 30_000, 'the task enqueued before the restart runs');
      await server.shutdown();
      assert.deepEqual(seen, [{ n: 1 }]);
      const inspector = new Inspector({ embedded: db });
      const info = await inspector.getTaskInfo('default', 'later');
      assert.equal(info.state, 'scheduled');
      await inspector.close();
      await db.close();
    } finally {
      rmSync(dataDir, { recursive: true, force: true });
    }
  });
});

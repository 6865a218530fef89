/**
 * Smoke test of examples/: each runs with one command on the embedded
 * database (DATABASE_URL unset) and exits 0 having done its work.
 */
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import { describe, test } from 'node:test';

const REPO = fileURLToPath(new URL('..', import.meta.url));

function runExample(file: string, args: string[] = []): Promise<{ code: number | null; stdout: string; stderr: string }> {
  const env = { ...process.env };
  delete env.DATABASE_URL;
  return new Promise((resolve, reject) => {
    const child = spawn(process.execPath, ['--import', 'tsx', `examples/${file}`, ...args], { cwd: REPO, env });
    let stdout = '';
    let stderr = '';
    child.stdout.setEncoding('utf8').on('data', (s: string) => (stdout += s));
    child.stderr.setEncoding('utf8').on('data', (s: string) => (stderr += s));
    child.on('error', reject);
    child.on('close', (code) => resolve({ code, stdout, stderr }));
  });
}

describe('pgasynq demo', () => {
  test('with no database configured it runs on the embedded one and finishes every task', { timeout: 180_000 }, async () => {
    const env = { ...process.env };
    delete env.DATABASE_URL;
    const r = await new Promise<{ code: number | null; stdout: string; stderr: string }>((resolve, reject) => {
      const child = spawn(process.execPath, ['--import', 'tsx', 'src/cli/main.ts', '--json', 'demo', '--tasks', '60', '--concurrency', '8'], { cwd: REPO, env });
      let stdout = '';
      let stderr = '';
      child.stdout.setEncoding('utf8').on('data', (s: string) => (stdout += s));
      child.stderr.setEncoding('utf8').on('data', (s: string) => (stderr += s));
      child.on('error', reject);
      child.on('close', (code) => resolve({ code, stdout, stderr }));
    });
    assert.equal(r.code, 0, r.stderr);
    assert.match(r.stdout, /embedded database/);
    const summary = JSON.parse(r.stdout.trim().split('\n').at(-1)!) as { processed: number; unfinished: number; archived: number };
    assert.equal(summary.unfinished, 0);
    assert.equal(summary.archived, 1, 'the poison task is archived');
    assert.ok(summary.processed >= 50, `processed ${summary.processed}`);
  });
});

describe('examples on the embedded database', () => {
  test('worker.ts processes its 20 tasks and exits', { timeout: 180_000 }, async () => {
    const r = await runExample('worker.ts');
    assert.equal(r.code, 0, r.stderr);
    assert.match(r.stdout, /done: 20 tasks/);
  });

  test('cron.ts enqueues a tick every second and exits after three', { timeout: 180_000 }, async () => {
    const r = await runExample('cron.ts');
    assert.equal(r.code, 0, r.stderr);
    assert.match(r.stdout, /done: 3 pings/);
  });

  test('http-app.ts --smoke places 5 orders through HTTP and confirms them', { timeout: 180_000 }, async () => {
    const r = await runExample('http-app.ts', ['--smoke']);
    assert.equal(r.code, 0, r.stderr);
    assert.match(r.stdout, /smoke: 5 orders placed and confirmed/);
  });
});

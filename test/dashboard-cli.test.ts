/**
 * `pgasynq dash`: prints its URL, serves the dashboard, stops on SIGTERM; the
 * hosts it answers to with --host and --allowed-hosts; its exit codes.
 */
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { hostname } from 'node:os';
import { describe } from 'node:test';
import { http } from './dashboard-kit.js';
import { REPO, builtCli, setupDb, test, waitFor } from './helpers.js';

const { db } = setupDb('t_dashboard_cli');

function runDash(args: string[]): { child: ReturnType<typeof spawn>; out: Promise<string>; exit: Promise<number | null>; stderr: () => string } {
  const child = spawn(process.execPath, [builtCli(), '--database-url', db.connectionString, '--schema', db.schema, ...args], {
    cwd: REPO,
    env: { ...process.env, PGASYNQ_DASH_TOKEN: '' },
  });
  let stdout = '';
  let stderr = '';
  child.stderr?.setEncoding('utf8').on('data', (s: string) => (stderr += s));
  const out = new Promise<string>((resolve) => {
    child.stdout?.setEncoding('utf8').on('data', (s: string) => {
      stdout += s;
      if (stdout.includes('\n')) resolve(stdout);
    });
    child.on('close', () => resolve(stdout));
  });
  const exit = new Promise<number | null>((resolve) => child.on('close', (code) => resolve(code)));
  return { child, out, exit, stderr: () => stderr };
}

describe('pgasynq dash', () => {
  test('prints the URL, serves the dashboard, stops on SIGTERM with exit 0', async () => {
    const run = runDash(['--json', 'dash', '--port', '0', '--read-only', '--refresh', '2']);
    const line = JSON.parse((await run.out).split('\n')[0] as string) as { url: string; metricsUrl: string; readOnly: boolean };
    assert.match(line.url, /^http:\/\/127\.0\.0\.1:\d+\/$/);
    assert.equal(line.metricsUrl, `${line.url}metrics`);
    assert.equal(line.readOnly, true);
    const p = Number(new URL(line.url).port);
    const page = await http(p, 'GET', '/');
    assert.equal(page.status, 200);
    assert.match(page.body, /data-refresh="2000"/);
    assert.match(page.body, /read-only/);
    assert.equal((await http(p, 'GET', '/metrics')).status, 200);
    run.child.kill('SIGTERM');
    assert.equal(await run.exit, 0, run.stderr());
  });

  test(
    '--host 0.0.0.0: answers to loopback names, this machine and the bound address only, says how to allow more; --allowed-hosts adds names',
    { timeout: 60_000 },
    async () => {
      const run = runDash(['--json', 'dash', '--port', '0', '--host', '0.0.0.0', '--read-only']);
      try {
        const line = JSON.parse((await run.out).split('\n')[0] as string) as { url: string; allowedHosts: string[] };
        const p = Number(new URL(line.url).port);
        assert.deepEqual(line.allowedHosts, ['localhost', '127.0.0.1', '[::1]', hostname().toLowerCase(), '0.0.0.0']);
        assert.equal((await http(p, 'GET', '/', { host: `evil.example:${p}` })).status, 421);
        for (const host of [`127.0.0.1:${p}`, `localhost:${p}`, `${hostname()}:${p}`, `0.0.0.0:${p}`])
          assert.equal((await http(p, 'GET', '/', { host })).status, 200, host);
        await waitFor(() => /--allowed-hosts/.test(run.stderr()), 10_000, 'the hint on stderr');
      } finally {
        run.child.kill('SIGTERM');
        assert.equal(await run.exit, 0, run.stderr());
      }
      const named = runDash(['--json', 'dash', '--port', '0', '--host', '0.0.0.0', '--read-only', '--allowed-hosts', 'dash.example, 10.1.2.3']);
      try {
        const line = JSON.parse((await named.out).split('\n')[0] as string) as { url: string };
        const p = Number(new URL(line.url).port);
        for (const host of [`dash.example:${p}`, `10.1.2.3:${p}`, `127.0.0.1:${p}`]) assert.equal((await http(p, 'GET', '/', { host })).status, 200, host);
        assert.equal((await http(p, 'GET', '/', { host: `evil.example:${p}` })).status, 421);
      } finally {
        named.child.kill('SIGTERM');
        assert.equal(await named.exit, 0, named.stderr());
      }
      const bad = runDash(['dash', '--port', '0', '--allowed-hosts', 'dash.example,a:80']);
      assert.equal(await bad.exit, 2);
      assert.match(bad.stderr(), /--allowed-hosts/);
    },
  );

  test('bad usage is exit 2; an unreachable database is exit 1', async () => {
    const bad = runDash(['dash', '--port', 'eighty']);
    assert.equal(await bad.exit, 2);
    assert.match(bad.stderr(), /--port/);
    const child = spawn(process.execPath, [builtCli(), '--database-url', 'postgres://u:secret@127.0.0.1:1/x', 'dash', '--port', '0'], {
      cwd: REPO,
    });
    let stderr = '';
    child.stderr.setEncoding('utf8').on('data', (s: string) => (stderr += s));
    const code = await new Promise<number | null>((resolve) => child.on('close', resolve));
    assert.equal(code, 1);
    assert.match(stderr, /cannot reach the database/);
    assert.ok(!stderr.includes('secret'));
  });
});

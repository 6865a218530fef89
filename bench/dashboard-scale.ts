/**
 * What the dashboard costs on a big table: fills a schema with N tasks
 * (default 1,000,000, the mix of bench/inspector-scale.ts: 60 % completed,
 * 30 % archived, 5 % pending, the rest scheduled, retry, aggregating and a
 * few active; 80 % in queue "default", 10 % each in "low" and "critical"),
 * VACUUM ANALYZEs it, starts a dashboard in this process, and times:
 *
 *   - server: one GET of each page, from request to last byte (what every
 *     refresh costs the server and the database: a refresh re-fetches the page);
 *   - refresh, cached: the same while another viewer read the queues less
 *     than a second ago (the dashboard reuses that read);
 *   - browser (when /usr/bin/chromium exists): a full page load (navigation
 *     to the load event: HTML, CSS, JS, first chart draw) and one refresh
 *     cycle in the page (fetch + parse + region swap), as app.js does it.
 *
 * Each figure is the median of 5 runs, in ms.
 *
 *   node --import tsx bench/dashboard-scale.ts            # 1,000,000 tasks
 *   node --import tsx bench/dashboard-scale.ts 200000
 *   KEEP=1 node --import tsx bench/dashboard-scale.ts     # keep the schema afterwards
 */
import { existsSync } from 'node:fs';
import { request } from 'node:http';
import pg from 'pg';
import { createDashboard, migrate } from '../src/index.js';

const url = process.env.DATABASE_URL ?? 'postgres://postgres@127.0.0.1:5432/test';
const schema = 'bench_dashboard';
const total = Number(process.argv[2] ?? 1_000_000);
const RUNS = 5;

const pool = new pg.Pool({ connectionString: url, max: 2 });
await pool.query(`DROP SCHEMA IF EXISTS ${schema} CASCADE`);
await migrate({ connectionString: url, schema });

const fillStarted = performance.now();
await pool.query(
  `INSERT INTO ${schema}.queues (name, processed_total, failed_total) VALUES ('default', 9000000, 12000), ('low', 5000, 10), ('critical', 700000, 900)`,
);
await pool.query(
  `INSERT INTO ${schema}.tasks (queue, id, type, payload, state, run_at, completed_at, retention, error_msg, last_failed_at,
                                group_key, lease_owner, lease_expires_at, lease_token, started_at)
   SELECT CASE WHEN i % 10 < 8 THEN 'default' WHEN i % 10 = 8 THEN 'low' ELSE 'critical' END,
          'task-' || i, CASE WHEN i % 3 = 0 THEN 'email:send' WHEN i % 3 = 1 THEN 'image:resize' ELSE 'webhook:deliver' END,
          jsonb_build_object('n', i, 'to', 'user' || i || '@example.com'), s.state,
          CASE s.state
            WHEN 'pending' THEN now() - (i % 1000) * interval '1 ms'
            WHEN 'scheduled' THEN now() + (i % 3600) * interval '1 s'
            WHEN 'retry' THEN now() + (i % 600) * interval '1 s'
            WHEN 'archived' THEN now() - (i % 86400) * interval '1 s'
            WHEN 'completed' THEN now() + interval '1 day' - (i % 86400) * interval '1 s'
          END,
          CASE WHEN s.state = 'completed' THEN now() - (i % 86400) * interval '1 s' END,
          CASE WHEN s.state = 'completed' THEN interval '1 day' ELSE interval '0' END,
          CASE WHEN s.state IN ('archived', 'retry') THEN 'boom' END,
          CASE WHEN s.state IN ('archived', 'retry') THEN now() END,
          CASE WHEN s.state = 'aggregating' THEN 'g' || (i % 5) END,
          CASE WHEN s.state = 'active' THEN 'bench-server' END,
          CASE WHEN s.state = 'active' THEN now() + interval '30 s' END,
          CASE WHEN s.state = 'active' THEN gen_random_uuid() END,
          CASE WHEN s.state = 'active' THEN now() END
   FROM generate_series(1, $1::int) i
   CROSS JOIN LATERAL (SELECT CASE
       WHEN i % 100 < 60 THEN 'completed' WHEN i % 100 < 90 THEN 'archived' WHEN i % 100 < 95 THEN 'pending'
       WHEN i % 100 < 97 THEN 'scheduled' WHEN i % 100 < 98 THEN 'retry' WHEN i % 1000 < 995 THEN 'aggregating'
       ELSE 'active' END AS state) s`,
  [total],
);
await pool.query(
  `INSERT INTO ${schema}.daily_stats (queue, day, processed, failed)
   SELECT q, (now() AT TIME ZONE 'UTC')::date - d, 50000 + d * 100, 40 + d FROM unnest(ARRAY['default', 'low', 'critical']) q, generate_series(0, 89) d`,
);
await pool.query(`INSERT INTO ${schema}.servers (id, host, pid, concurrency, queues, strict_priority, status, expires_at)
                  VALUES ('bench-server', 'bench', 1, 100, '{"default": 3, "critical": 6, "low": 1}', false, 'active', now() + interval '1 hour')`);
await pool.query(`VACUUM ANALYZE ${schema}.tasks, ${schema}.queues, ${schema}.daily_stats`);
const fillMs = performance.now() - fillStarted;

const dash = createDashboard({ connectionString: url, schema });
const { port } = await dash.listen(0);

function get(path: string): Promise<{ status: number; bytes: number }> {
  return new Promise((resolve, reject) => {
    const req = request({ host: '127.0.0.1', port, path, headers: { host: `127.0.0.1:${port}` } }, (res) => {
      let bytes = 0;
      res.on('data', (c: Buffer) => (bytes += c.length));
      res.on('end', () => resolve({ status: res.statusCode ?? 0, bytes }));
    });
    req.on('error', reject);
    req.end();
  });
}

/** The median of RUNS timings, in ms; each run first waits past the dashboard's one-second reuse of the queue read. */
async function median(fn: () => Promise<unknown>, before: () => Promise<unknown> = () => sleep(1100)): Promise<number> {
  const times: number[] = [];
  for (let i = 0; i < RUNS; i++) {
    await before();
    const t = performance.now();
    await fn();
    times.push(performance.now() - t);
  }
  times.sort((a, b) => a - b);
  return Number((times[Math.floor(RUNS / 2)] as number).toFixed(1));
}

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));
// i % 100 in [60, 90) is archived and i % 10 < 8 is queue "default".
const anArchived = 'task-60';
const PAGES: [string, string][] = [
  ['overview', '/'],
  ['overview, 90 days of history', '/?days=90'],
  ['queue default, pending tab', '/queues/default?state=pending'],
  ['queue default, archived tab', '/queues/default?state=archived'],
  ['queue default, completed tab, page 1000', '/queues/default?state=completed&page=1000'],
  ['queue default, aggregating tab (group g0)', '/queues/default?state=aggregating&group=g0'],
  ['queue default, active tab', '/queues/default?state=active'],
  ['queue default, type search (scans 5,000)', '/queues/default?state=pending&search=resize'],
  ['task page', `/queues/default/tasks/${anArchived}`],
  ['servers', '/servers'],
  ['schedulers', '/schedulers'],
  ['/api/overview (live chart poll)', '/api/overview'],
  ['/metrics (Prometheus scrape)', '/metrics'],
];

const results: Record<string, unknown> = { tasks: total, fillSeconds: Number((fillMs / 1000).toFixed(1)) };
const server: Record<string, number> = {};
for (const [name, path] of PAGES) {
  const first = await get(path);
  if (first.status !== 200) throw new Error(`${path}: HTTP ${first.status}`);
  server[name] = await median(() => get(path));
}
results.serverMs = server;
// A refresh right after another viewer's poll: the queue read is reused.
results.refreshCachedMs = {
  overview: await median(
    () => get('/'),
    async () => {
      await sleep(1100);
      await get('/api/overview');
    },
  ),
};

if (existsSync('/usr/bin/chromium')) {
  const { chromium } = await import('playwright-core');
  const browser = await chromium.launch({
    executablePath: '/usr/bin/chromium',
    args: ['--headless', '--no-sandbox', '--disable-gpu', '--disable-background-networking', '--disable-component-update', '--disable-sync', '--no-first-run'],
  });
  const page = await browser.newPage({ viewport: { width: 1280, height: 900 } });
  const browserMs: Record<string, { load: number; refresh: number }> = {};
  for (const [name, path] of PAGES.filter(([, p]) => !p.startsWith('/api') && p !== '/metrics')) {
    const load = await median(() => page.goto(`http://127.0.0.1:${port}${path}`, { waitUntil: 'load' }));
    // One refresh cycle as app.js runs it: fetch the page, parse it, swap the regions that changed.
    const refresh = await median(() =>
      page.evaluate(`(async () => {
        const r = await fetch(location.href, { credentials: 'same-origin', cache: 'no-store' });
        const doc = new DOMParser().parseFromString(await r.text(), 'text/html');
        document.querySelectorAll('[data-region]').forEach((old) => {
          const fresh = doc.getElementById(old.id);
          if (fresh && fresh.outerHTML !== old.outerHTML) old.replaceWith(document.importNode(fresh, true));
        });
      })()`),
    );
    browserMs[name] = { load, refresh };
  }
  results.browserMs = browserMs;
  await browser.close();
}

console.log(JSON.stringify(results, null, 2));
await dash.close();
if (!process.env.KEEP) await pool.query(`DROP SCHEMA ${schema} CASCADE`);
await pool.end();

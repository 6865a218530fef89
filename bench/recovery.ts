/**
 * How long a task stays stuck after its worker is killed with SIGKILL, until
 * another server has run it: the figure behind "leaseDuration + recoverCutoff
 * + recoverInterval". Uses the server defaults unless told otherwise:
 *
 *   node --import tsx bench/recovery.ts                 # defaults: 30 s lease, 30 s cutoff, 1 min interval
 *   node --import tsx bench/recovery.ts 1000 300 200    # lease, cutoff, interval in ms
 */
import { spawn } from 'node:child_process';
import { createInterface } from 'node:readline';
import pg from 'pg';
import { Client, Server, Task, migrate } from '../src/index.js';

const url = process.env.DATABASE_URL ?? 'postgres://postgres@127.0.0.1:5432/test';
const schema = 'bench_recovery';
const [lease, cutoff, interval] = process.argv.slice(2).map(Number);
const config = lease ? { leaseDuration: lease, heartbeatInterval: Math.floor(lease / 5), recoverCutoff: cutoff, recoverInterval: interval } : {};

const pool = new pg.Pool({ connectionString: url });
await pool.query(`DROP SCHEMA IF EXISTS ${schema} CASCADE`);
await migrate({ connectionString: url, schema });
await pool.end();

const worker = spawn(process.execPath, ['--import', 'tsx', 'test/fixtures/worker.ts'], {
  env: {
    ...process.env,
    DATABASE_URL: url,
    SCHEMA: schema,
    MODE: 'hang',
    LEASE: String(lease ?? 30_000),
    HEARTBEAT: String(lease ? Math.floor(lease / 5) : 5000),
  },
  stdio: ['ignore', 'pipe', 'inherit'],
});
const lines = createInterface({ input: worker.stdout });
const next = (event: string) => new Promise<void>((resolve) => lines.on('line', (l) => JSON.parse(l).event === event && resolve()));
const ready = next('ready');
await ready;
const started = next('started');
const client = new Client({ connectionString: url, schema });
await client.enqueue(new Task('victim'));
await started;
worker.kill('SIGKILL');
const killedAt = performance.now();

let done!: (t: number) => void;
const ran = new Promise<number>((r) => (done = r));
const rescuer = new Server({ connectionString: url, schema, concurrency: 1, retryDelay: () => 0, delayedTaskCheckInterval: 100, ...config });
await rescuer.start(() => done(performance.now()));
const seconds = ((await ran) - killedAt) / 1000;
console.log(
  JSON.stringify({
    leaseDuration: lease ?? 30_000,
    recoverCutoff: cutoff ?? 30_000,
    recoverInterval: interval ?? 60_000,
    recoverySeconds: Number(seconds.toFixed(2)),
  }),
);
await rescuer.shutdown();
await client.close();

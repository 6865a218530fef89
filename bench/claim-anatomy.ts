/**
 * Where a claim's database time goes: a vacuumed backlog of `n` no-op tasks
 * claimed in claims of `batch` from one session, as a server's claim loop
 * does (each claim above the floor the last one reached), and the CPU time
 * that session's backend spent, read from /proc (Linux; the backend runs on
 * this machine). CPU time, not wall time: on a shared machine a neighbour's
 * burst moves the wall clock by 20 % from one run to the next, the backend's
 * own CPU far less. Variants of the claim, alternated run by run, each a
 * named part taken out of claim_tasks() or its table as migrated (pk-room:
 * one setting changed instead); the figure says what that part costs, not
 * a claim anyone should run:
 *
 *   shipped    claim_tasks() as it is
 *   no-update  the locked rows are read, not updated (no new row version, no index entries)
 *   no-inputs  the task's inputs are not looked up (constants instead)
 *   no-active  without the index of active tasks (task_states_active_idx)
 *   two-partial  without the task state's partial indexes other than the pending and active ones
 *   pk-room    the task state's primary key built with room for a second entry per task
 *              (fillfactor 50: a claim's new row version enters it beside the old one)
 *   no-triggers  task_states' row triggers disabled (their WHEN clauses are read on every update)
 *   no-checks  without task_states' CHECK constraints
 *   bare-table  no-triggers, no-checks, two-partial and no-active at once
 *   lease-table  the state row left as it is: each claimed task's lease inserted in a narrow
 *              table of its own (its key the task's seq, no other index), and the scans skip a task
 *              that has one (what a claim would cost if a claim wrote no new task_states row)
 *   hot-claim  the update sets only the lease (no indexed column, the state left 'pending'), so it can be
 *              a HOT update; the scans skip leased rows; no active index, no row triggers
 *   hot-claim-ff50  hot-claim on a table filled at fillfactor 50 (room on each page for every row's new version)
 *
 * And, for scale, `graphile`: graphile-worker 0.18's own claim (the statement its worker
 * sends for a local queue of `batch`, built by its code), over the same backlog filled with
 * its `addJobs` and vacuumed, claimed the same way from one session.
 *
 *   node --import tsx bench/claim-anatomy.ts [--n 50000] [--batch 500] [--reps 5] [--variants shipped,no-update,…] [--shared] [--perf DIR]
 * --shared: on DATABASE_URL (the machine's shared server) instead of a throwaway cluster.
 * --perf DIR: `perf record` on the claiming backend alone, while it claims, into DIR/<variant>-<rep>.data
 *   (read with `perf report -i FILE --no-children --sort symbol`: where one variant's CPU goes that another's does not).
 */
import { type ChildProcess, spawn } from 'node:child_process';
import { mkdirSync } from 'node:fs';
import { once } from 'node:events';
import { setTimeout as sleep } from 'node:timers/promises';
import { Logger, makeWorkerUtils, runMigrations } from 'graphile-worker';
import pg from 'pg';
import { Client, Task, migrate } from '../src/index.js';
import { startBenchCluster } from './lib/cluster.js';
import { DATABASE_URL, dropSchema, median, parseArgs, processCpu } from './lib/common.js';

const args = parseArgs(process.argv.slice(2));
const N = Number(args.n ?? 50_000);
const BATCH = Number(args.batch ?? 500);
const REPS = Number(args.reps ?? 5);
const SCHEMA = 'bench_claim_anatomy';

interface Variant {
  /** A rewrite of claim_tasks()'s definition (pg_get_functiondef), or null for none. */
  edit: ((def: string) => string) | null;
  /** SQL run on the new schema before the fill. */
  before?: string;
}

/** The narrow lease table of the lease-table variant, and how its scans skip a leased task. */
const LEASES = `${SCHEMA}.task_leases`;
const NOT_LEASED = `NOT EXISTS (SELECT 1 FROM ${LEASES} l WHERE l.seq = s.seq)`;

/** `def` with `pattern` replaced; throws when it is not there (claim_tasks()'s text has moved on). */
function replaceOrThrow(def: string, pattern: RegExp, by: (...groups: string[]) => string): string {
  if (!pattern.test(def)) throw new Error(`claim_tasks() no longer matches ${pattern.source.slice(0, 40)}…: update the variant`);
  return def.replace(pattern, (...m: string[]) => by(...m.slice(1)));
}

const VARIANTS: Record<string, Variant> = {
  shipped: { edit: null },
  'no-update': {
    edit: (def) =>
      def.replace(
        /UPDATE (\S+) s\s+SET state = 'active'[\s\S]*?FROM sized z\s+WHERE (s\.ctid = z\.ctid AND \(z\.n = 1 OR z\.upto <= max_bytes\))\s+RETURNING ([\s\S]*?s\.lease_token)\n/,
        (_all, table: string, where: string, returning: string) => `SELECT ${returning} FROM ${table} s, sized z WHERE ${where}\n`,
      ),
  },
  'no-inputs': {
    edit: (def) =>
      def.replace(
        /FROM c CROSS JOIN LATERAL \(\s*SELECT i\.queue[\s\S]*?LIMIT 1\) x/,
        `FROM c CROSS JOIN LATERAL (SELECT c.queue, 'x'::text AS id, 'noop'::text AS type, NULL::jsonb AS payload, NULL::bytea AS payload_bytes,
           '{}'::jsonb AS headers, 25 AS max_retry, interval '30 minutes' AS timeout, NULL::timestamptz AS deadline, interval '0' AS retention,
           10::float8 AS bytes) x`,
      ),
  },
  'no-active': { edit: null, before: `DROP INDEX ${SCHEMA}.task_states_active_idx` },
  'two-partial': {
    edit: null,
    before: `DO $$ DECLARE i text; BEGIN
               FOR i IN SELECT indexrelid::regclass::text FROM pg_index WHERE indrelid = '${SCHEMA}.task_states'::regclass AND indpred IS NOT NULL
                 AND indexrelid NOT IN ('${SCHEMA}.task_states_pending_idx'::regclass, '${SCHEMA}.task_states_active_idx'::regclass) LOOP
                 EXECUTE 'DROP INDEX ' || i;
               END LOOP; END $$`,
  },
  'pk-room': { edit: null, before: `ALTER INDEX ${SCHEMA}.task_states_pkey SET (fillfactor = 50)` },
  'no-triggers': { edit: null, before: `ALTER TABLE ${SCHEMA}.task_states DISABLE TRIGGER USER` },
  'lease-table': {
    // No index on the expiry: the table holds only the running tasks, which the recoverer can scan.
    before: `CREATE TABLE ${LEASES} (seq bigint PRIMARY KEY, lease_token uuid NOT NULL, lease_owner text NOT NULL,
               lease_expires_at timestamptz NOT NULL, started_at timestamptz NOT NULL)`,
    edit: (def) =>
      replaceOrThrow(
        def.replaceAll('AND s.pending_seq > b.floor', `AND s.pending_seq > b.floor AND ${NOT_LEASED}`),
        /claimed AS \(\s*UPDATE (\S+) s\s+SET state = 'active'[\s\S]*?FROM sized z\s+WHERE (s\.ctid = z\.ctid AND \(z\.n = 1 OR z\.upto <= max_bytes\))\s+RETURNING ([\s\S]*?)s\.lease_token\n\s*\),/,
        (table, where, returning) => `leased AS (
    INSERT INTO ${LEASES} (seq, lease_token, lease_owner, lease_expires_at, started_at)
    SELECT s.seq, ${SCHEMA}.lease_token(v_leases, s.seq), owner, v_now + lease_ms * interval '1 millisecond', v_now
    FROM ${table} s, sized z WHERE ${where}
  ),
  claimed AS (
    SELECT ${returning}${SCHEMA}.lease_token(v_leases, s.seq) AS lease_token FROM ${table} s, sized z WHERE ${where}
  ),`,
      ),
  },
  'no-checks': {
    edit: null,
    before: `DO $$ DECLARE c text; BEGIN
               FOR c IN SELECT conname FROM pg_constraint WHERE conrelid = '${SCHEMA}.task_states'::regclass AND contype = 'c' LOOP
                 EXECUTE format('ALTER TABLE ${SCHEMA}.task_states DROP CONSTRAINT %I', c);
               END LOOP; END $$`,
  },
};
/**
 * A HOT claim: the update writes only the lease, which no index reads (key or predicate), and the
 * state stays 'pending', so PostgreSQL can put the new version beside the old one with no index
 * entry (when the page has room); the scans skip a leased row. Without the active tasks' index
 * (its predicate reads the state and the lease) and the row triggers (the lease release's would
 * undo such a lease). What a claim could cost if the state a task is in were told by its lease.
 */
const hotClaim = (def: string): string =>
  replaceOrThrow(
    def.replaceAll('AND s.pending_seq > b.floor', 'AND s.pending_seq > b.floor AND s.lease_token IS NULL'),
    /SET state = 'active', (lease_owner = owner, lease_token = [^\n]*\n\s*lease_expires_at = [^,]*, started_at = v_now), run_at = NULL,\s*cancel_requested = false, (updated_at = v_now)/,
    (lease, updated) => `SET ${lease}, ${updated}`,
  );
const HOT_TABLE = `DROP INDEX ${SCHEMA}.task_states_active_idx; ALTER TABLE ${SCHEMA}.task_states DISABLE TRIGGER USER`;
VARIANTS['hot-claim'] = { edit: hotClaim, before: HOT_TABLE };
// The same with room on every page for each row's second version (the shipped table keeps a fifth free).
VARIANTS['hot-claim-ff50'] = { edit: hotClaim, before: `${HOT_TABLE}; ALTER TABLE ${SCHEMA}.task_states SET (fillfactor = 50)` };
// Every extra of the table at once: what the update costs on a table with only its key and the pending index.
VARIANTS['bare-table'] = {
  edit: null,
  before: [VARIANTS['no-triggers']!.before!, VARIANTS['no-checks']!.before!, VARIANTS['two-partial']!.before!, VARIANTS['no-active']!.before!].join(';\n'),
};
const GRAPHILE = 'graphile';
const CHOSEN = args.variants?.split(',') ?? [...Object.keys(VARIANTS), GRAPHILE];
for (const v of CHOSEN) if (!(v in VARIANTS) && v !== GRAPHILE) throw new Error(`unknown variant ${v} (${Object.keys(VARIANTS).join(', ')}, ${GRAPHILE})`);

async function prepare(url: string, admin: pg.Pool, variant: Variant): Promise<void> {
  await dropSchema(admin, SCHEMA);
  await migrate({ connectionString: url, schema: SCHEMA, logger: false });
  if (variant.before) await admin.query(variant.before);
  const client = new Client({ connectionString: url, schema: SCHEMA, logger: false });
  for (let i = 0; i < N; i += 10_000) {
    await client.enqueueMany(Array.from({ length: Math.min(10_000, N - i) }, (_, j) => new Task('noop', { i: i + j })));
  }
  await client.close();
  if (variant.edit) {
    const { rows } = await admin.query<{ def: string }>(`SELECT pg_get_functiondef('${SCHEMA}.claim_tasks'::regproc) AS def`);
    const edited = variant.edit(rows[0]!.def);
    if (edited === rows[0]!.def) throw new Error('the variant changed nothing in claim_tasks(): its text has moved on, update the edit');
    await admin.query(edited);
  }
  await admin.query(`VACUUM ANALYZE ${SCHEMA}.task_states, ${SCHEMA}.task_inputs`);
}

/**
 * Claims a whole backlog from one session with `claimer(session)`'s batches (each resolves with
 * how many tasks it took; 0 ends the backlog): the backend's CPU ms and the wall ms it took.
 * The session commits as the Server's own do (`synchronous_commit = off`), for every system.
 */
async function timeClaims(
  url: string,
  system: string,
  claimer: (session: pg.Client) => () => Promise<number>,
  profile?: string,
): Promise<{ cpu: number; wall: number }> {
  const session = new pg.Client({ connectionString: url, application_name: 'bench:claim-anatomy' });
  await session.connect();
  try {
    await session.query('SET synchronous_commit = off');
    const { rows } = await session.query<{ pid: number }>('SELECT pg_backend_pid() AS pid');
    const pid = rows[0]!.pid;
    const claimBatch = claimer(session);
    const perf = profile === undefined ? undefined : await startPerf(pid, profile);
    let claimed = 0;
    const cpu0 = processCpu(pid).cpuMs;
    const wall0 = performance.now();
    for (let n = await claimBatch(); n > 0; n = await claimBatch()) claimed += n;
    const run = { cpu: processCpu(pid).cpuMs - cpu0, wall: performance.now() - wall0 };
    if (perf) await stopPerf(perf);
    if (claimed !== N) throw new Error(`${system} claimed ${claimed} of ${N}`);
    return run;
  } finally {
    await session.end();
  }
}

/** `perf record` on one process, with call graphs from the binary's unwind tables (PostgreSQL keeps no frame pointers). */
async function startPerf(pid: number, file: string): Promise<ChildProcess> {
  const perf = spawn('perf', ['record', '-q', '-F', '4000', '--call-graph', 'dwarf,16384', '-p', String(pid), '-o', file], { stdio: 'inherit' });
  // perf attaches asynchronously and says nothing when it has: give it the time it takes here.
  await Promise.race([sleep(500), once(perf, 'exit').then(() => Promise.reject(new Error(`perf record exited at once (code ${perf.exitCode})`)))]);
  return perf;
}

async function stopPerf(perf: ChildProcess): Promise<void> {
  const exited = once(perf, 'exit');
  perf.kill('SIGINT');
  await exited;
}

/** How many of the claims' updates of task_states were HOT (the claiming session's statistics are flushed as it ends). */
async function hotShare(admin: pg.Pool): Promise<string> {
  const read = () =>
    admin.query<{ upd: string; hot: string }>(
      `SELECT n_tup_upd AS upd, n_tup_hot_upd AS hot FROM pg_stat_user_tables WHERE relid = '${SCHEMA}.task_states'::regclass`,
    );
  let { rows } = await read();
  for (let i = 0; i < 20 && Number(rows[0]!.upd) < N; i++) {
    await sleep(100);
    ({ rows } = await read());
  }
  return `, ${rows[0]!.hot} of ${rows[0]!.upd} updates HOT`;
}

/** pgasynq's claims: each above the floor the last one reached, as the claim loop does. */
function pgasynqClaimer(session: pg.Client): () => Promise<number> {
  let floor: string | undefined;
  return async () => {
    // The first claim finds the queue's band (one gap over every priority, 101 to -101, as broker/claim.ts
    // spells it), the later ones start above the floor the last claim reached.
    const bands = floor === undefined ? [[1], [101], [-101], [], [], []] : [[], [], [], [1], [0], [floor]];
    const result = await session.query<{ seq: string | null; pending_seq: string }>(
      `SELECT c.seq::text AS seq, c.pending_seq::text AS pending_seq, c.payload, c.headers, c.timeout_ms, c.lease_token
       FROM ${SCHEMA}.claim_tasks($1::text[], $2::int[], $3::int[], $4::int[], $5::int[], $6::int[], $7::int[], $8::bigint[],
                                  NULL::xid8, $9::int, 'bench', 30000::float8, 67108864::float8, 0::float8) c`,
      [['default'], [BATCH], ...bands, BATCH],
    );
    const tasks = result.rows.filter((r) => r.seq !== null);
    for (const t of tasks) if (floor === undefined || BigInt(t.pending_seq) > BigInt(floor)) floor = t.pending_seq;
    return tasks.length;
  };
}

const GRAPHILE_SCHEMA = 'bench_claim_anatomy_graphile';
const silent = new Logger(() => () => {});

async function prepareGraphile(url: string, admin: pg.Pool): Promise<void> {
  await dropSchema(admin, GRAPHILE_SCHEMA);
  await runMigrations({ connectionString: url, schema: GRAPHILE_SCHEMA, logger: silent });
  const utils = await makeWorkerUtils({ connectionString: url, schema: GRAPHILE_SCHEMA, logger: silent });
  try {
    for (let i = 0; i < N; i += 10_000) {
      await utils.addJobs(Array.from({ length: Math.min(10_000, N - i) }, (_, j) => ({ identifier: 'noop', payload: { i: i + j } })));
    }
  } finally {
    await utils.release();
  }
  await admin.query(`VACUUM ANALYZE ${GRAPHILE_SCHEMA}._private_jobs`);
}

/** graphile-worker's batch claim, from its own code (not among its package's exports, so loaded by path). */
type BatchGetJobs = (
  options: unknown,
  withPgClient: unknown,
  tasks: Record<string, () => void>,
  poolId: string,
  flagsToSkip: null,
  batchSize: number,
) => Promise<unknown[]>;
const { batchGetJobs } = (await import(new URL('./node_modules/graphile-worker/dist/sql/getJobs.js', import.meta.url).href)) as { batchGetJobs: BatchGetJobs };

/** graphile-worker's claims, `BATCH` jobs a statement, as its local queue fetches them. */
function graphileClaimer(session: pg.Client): () => Promise<number> {
  const withSession = Object.assign(<T>(cb: (c: pg.Client) => Promise<T>) => cb(session), {
    withRetries: <T>(cb: (c: pg.Client) => Promise<T>) => cb(session),
  });
  const options = {
    escapedWorkerSchema: `"${GRAPHILE_SCHEMA}"`,
    workerSchema: GRAPHILE_SCHEMA,
    resolvedPreset: { worker: { preparedStatements: true, useNodeTime: false } },
    logger: silent,
  };
  const tasks = { noop: () => {} };
  return async () => (await batchGetJobs(options, withSession, tasks, 'bench', null, BATCH)).length;
}

if (args.perf !== undefined) mkdirSync(args.perf, { recursive: true });
const cluster = args.shared === undefined ? await startBenchCluster() : undefined;
process.on('exit', () => cluster?.destroy());
const url = cluster?.url ?? DATABASE_URL;
const admin = new pg.Pool({ connectionString: url, max: 2 });
const cpu = new Map<string, number[]>(CHOSEN.map((v) => [v, []]));
const wall = new Map<string, number[]>(CHOSEN.map((v) => [v, []]));
try {
  for (let rep = 1; rep <= REPS; rep++) {
    for (const v of CHOSEN) {
      if (v === GRAPHILE) await prepareGraphile(url, admin);
      else await prepare(url, admin, VARIANTS[v]!);
      const profile = args.perf === undefined ? undefined : `${args.perf}/${v}-${rep}.data`;
      const run = await timeClaims(url, v, v === GRAPHILE ? graphileClaimer : pgasynqClaimer, profile);
      cpu.get(v)!.push(run.cpu);
      wall.get(v)!.push(run.wall);
      console.error(`rep ${rep} ${v}: backend CPU ${run.cpu} ms, wall ${Math.round(run.wall)} ms${v === GRAPHILE ? '' : await hotShare(admin)}`);
    }
  }
  await dropSchema(admin, SCHEMA);
  await dropSchema(admin, GRAPHILE_SCHEMA);
} finally {
  await admin.end();
}

const perTask = (ms: number) => ((ms * 1000) / N).toFixed(1);
const shipped = cpu.has('shipped') ? median(cpu.get('shipped')!) : Number.NaN;
console.log(
  `Claims of ${BATCH} over a vacuumed backlog of ${N} no-op tasks, ${REPS} repetitions (medians), ${cluster ? 'throwaway cluster, production settings' : 'shared server'}`,
);
console.log('| variant | backend CPU, µs per task | ÷ shipped | wall, µs per task |');
console.log('|---|---:|---:|---:|');
for (const v of CHOSEN) {
  const c = median(cpu.get(v)!);
  console.log(`| ${v} | ${perTask(c)} | ${(c / shipped).toFixed(2)} | ${perTask(median(wall.get(v)!))} |`);
}

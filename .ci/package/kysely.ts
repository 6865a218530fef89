// A project on its own Kysely: enqueue inside a Kysely transaction (`tx: trx`), then a handler
// whose ctx.transaction is typed by the project's tables and commits a row with the task's
// completion. Typechecked (strict, skipLibCheck off) and run by package-check.sh against each
// Kysely minor that pgasynq's peer range admits.
import { Kysely, PostgresDialect, sql, type Transaction } from 'kysely';
import pg from 'pg';
import { Client, Server, ServeMux, Task } from 'pgasynq';

interface DB {
  kysely_check: { task_id: string; note: string };
}

const version = process.argv[2] ?? 'unknown';
const queue = `kysely_${version.replace(/\W/g, '_')}`;
const pool = new pg.Pool({ connectionString: process.env.DATABASE_URL });
const db = new Kysely<DB>({ dialect: new PostgresDialect({ pool }) });
await sql`CREATE TABLE IF NOT EXISTS kysely_check (task_id text PRIMARY KEY, note text NOT NULL)`.execute(db);

const client = new Client({ pool, logger: false });
const rolledBack = await db
  .transaction()
  .execute(async (trx) => {
    await client.enqueue(new Task('kysely:check', { note: 'rolled back' }), { tx: trx, queue });
    throw new Error('roll back');
  })
  .catch((err: unknown) => err);
if (!(rolledBack instanceof Error) || rolledBack.message !== 'roll back') throw new Error(`expected the rollback, got ${String(rolledBack)}`);
const info = await db.transaction().execute((trx) => client.enqueue(new Task('kysely:check', { note: `kysely ${version}` }), { tx: trx, queue }));

let ran!: () => void;
const handled = new Promise<void>((resolve) => (ran = resolve));
const mux = new ServeMux().handle('kysely:', async (task: Task<{ note: string }>, ctx) => {
  await ctx.transaction(async (trx: Transaction<DB>) => {
    await trx.insertInto('kysely_check').values({ task_id: ctx.taskId, note: task.payload.note }).execute();
  });
  ran();
});
const server = new Server({ pool, queues: { [queue]: 1 }, logger: false });
await server.start(mux);
const timeout = setTimeout(() => {
  console.error(`kysely ${version}: the task did not run within 30 s`);
  process.exit(1);
}, 30_000);
await handled;
clearTimeout(timeout);
await server.shutdown();

const rows = await db.selectFrom('kysely_check').selectAll().where('task_id', '=', info.id).execute();
if (rows.length !== 1 || rows[0]?.note !== `kysely ${version}`) throw new Error(`the handler's transaction did not commit: ${JSON.stringify(rows)}`);
const { rows: left } = await pool.query<{ n: number }>(`SELECT count(*)::int AS n FROM pgasynq.tasks WHERE queue = $1`, [queue]);
await client.close();
await db.destroy();
if (left[0]?.n !== 0) throw new Error(`expected the rolled-back task gone and the run one completed, found ${left[0]?.n} tasks in ${queue}`);
console.log(`kysely ${version}: enqueue in a Kysely transaction, ctx.transaction typed by the project's tables, committed`);

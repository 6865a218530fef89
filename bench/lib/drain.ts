/**
 * The drain of the pgasynq-only benches (workflows.ts, limits.ts): one Server
 * at `concurrency`, defaults otherwise, from its start until `schema` holds no
 * task. Returns the ms it took.
 */
import type pg from 'pg';
import { Server } from '../../src/index.js';
import { now, sleep } from './common.js';

export async function drain(url: string, admin: pg.Pool, schema: string, concurrency: number): Promise<number> {
  const server = new Server({ connectionString: url, schema, concurrency, logger: false });
  const d0 = now();
  await server.start(() => {});
  for (;;) {
    const { rows } = await admin.query<{ left: boolean }>(`SELECT EXISTS (SELECT 1 FROM ${schema}.task_states) AS left`);
    if (!rows[0]!.left) break;
    await sleep(10);
  }
  const ms = now() - d0;
  await server.shutdown();
  return ms;
}

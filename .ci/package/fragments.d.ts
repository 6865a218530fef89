// What the documentation's code fragments (unnamed ```ts blocks, written out by
// readme-files.mjs) take as given: the objects a page has already made, and the page's own
// sample values. A fragment imports everything else it uses, as a reader's file would.
import type { Generated, Kysely } from 'kysely';
import type pg from 'pg';
import type { Client, Inspector, Server, ServeMux, Task, TaskContext } from 'pgasynq';

/** The application's own tables in the guides' examples. */
interface Database {
  orders: { id: Generated<number>; item: string };
  charges: { order_id: number; cents: number };
  accounts: { id: number; balance: number };
  cron_jobs: { spec: string; type: string; payload: unknown; queue: string };
}

declare global {
  const client: Client;
  const server: Server;
  const inspector: Inspector;
  const mux: ServeMux;
  const task: Task<unknown>;
  const ctx: TaskContext;
  const pool: pg.Pool;
  const db: Kysely<Database>;
  /** An Express (or Connect) application. */
  const app: { use(path: string, handler: (req: import('node:http').IncomingMessage, res: import('node:http').ServerResponse) => unknown): void };
  // Sample values the pages use.
  const id: number;
  const taskId: string;
  const accountId: number;
  const cents: number;
  const msg: { tenantId: string; to: string };
  const chunks: string[];
  const countWords: (text: string) => Record<string, number>;
  const merge: (counts: unknown[]) => Record<string, number>;
  const report: (counts: Record<string, number>) => void;
}

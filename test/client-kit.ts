/**
 * What the Client's test files share (not a test file itself): each file's
 * schema through setupDb, and helpers that read what an enqueue wrote (the
 * task's row, row counts, unique locks), so that assertions are made on the
 * rows, not only on the returned TaskInfo.
 */
import assert from 'node:assert/strict';
import type { TaskInfo } from '../src/index.js';
import { setupDb, type TestFile } from './helpers.js';

export const MIB = 1_048_576;

export interface Row {
  queue: string;
  id: string;
  type: string;
  payload: unknown;
  payload_bytes: Buffer | null;
  headers: Record<string, string>;
  state: string;
  max_retry: number;
  retried: number;
  timeout_ms: number;
  deadline: Date | null;
  unique_key: string | null;
  group_key: string | null;
  retention_ms: number;
  run_at: Date | null;
}

/** A Client test file on schema `name` (setupDb's), with readers of its rows. */
export function setupClient(name: string) {
  const file: TestFile = setupDb(name);
  const { db } = file;

  /** The stored row of one task, with intervals as ms; undefined when absent. */
  async function row(queue: string, id: string): Promise<Row | undefined> {
    const rows = await db.query<Row>(
      `SELECT queue, id, type, payload, payload_bytes, headers, state, max_retry, retried,
            (extract(epoch FROM timeout) * 1000)::float8 AS timeout_ms, deadline, unique_key, group_key,
            (extract(epoch FROM retention) * 1000)::float8 AS retention_ms, run_at
       FROM {{schema}}.tasks WHERE queue = $1 AND id = $2`,
      [queue, id],
    );
    return rows[0];
  }

  async function mustRow(info: Pick<TaskInfo, 'queue' | 'id'>): Promise<Row> {
    const r = await row(info.queue, info.id);
    assert.ok(r, `row ${info.queue}/${info.id} exists`);
    return r;
  }

  /** Row counts of the tables an enqueue writes. */
  async function counts(): Promise<{ tasks: number; locks: number; queues: number }> {
    const [r] = await db.query<{ tasks: number; locks: number; queues: number }>(
      `SELECT (SELECT count(*) FROM {{schema}}.tasks)::int AS tasks,
            (SELECT count(*) FROM {{schema}}.unique_locks)::int AS locks,
            (SELECT count(*) FROM {{schema}}.queues)::int AS queues`,
    );
    assert.ok(r);
    return r;
  }

  /** The unique locks, in key order. */
  async function lockRows(): Promise<{ queue: string; key: string; task_id: string; expires_at: Date }[]> {
    return db.query('SELECT queue, key, task_id, expires_at FROM {{schema}}.unique_locks ORDER BY queue, key');
  }

  /** How many tasks `queue` holds. */
  async function countIn(queue: string): Promise<number> {
    const [r] = await db.query<{ n: number }>('SELECT count(*)::int AS n FROM {{schema}}.tasks WHERE queue = $1', [queue]);
    return r?.n ?? -1;
  }

  return { ...file, row, mustRow, counts, lockRows, countIn };
}

/** Asserts that `actual` is a Date within `toleranceMs` of `expectedMs`. */
export function near(actual: Date | null | undefined, expectedMs: number, toleranceMs = 5_000, what = 'instant'): void {
  assert.ok(actual instanceof Date, `${what} is a Date (got ${String(actual)})`);
  assert.ok(
    Math.abs(actual.getTime() - expectedMs) <= toleranceMs,
    `${what} ${actual.toISOString()} is within ${toleranceMs} ms of ${new Date(expectedMs).toISOString()}`,
  );
}

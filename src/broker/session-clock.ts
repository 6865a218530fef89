/**
 * The clock seam of the schema's own SQL (migration 0011 task_now()): the
 * views, SQL enqueue(), the workflow settling and the tasks view's writes read
 * the time from the session setting pgasynq.clock_shift_ms, which this keeps
 * equal to a test's DatabaseClock offset on every session of the Db's pool.
 * task_now() honours a shift for the owner only.
 */
import type pg from 'pg';
import type { DatabaseClock } from '../internal/clock.js';

/**
 * Sets the shift on each checkout whose session holds another than the
 * clock's. A client runs its queries in order, so the setting goes ahead of
 * the caller's first statement without a wait; a failure shows in that
 * statement. A clock that never moves sends nothing.
 */
export function followClock(pool: pg.Pool, clock: DatabaseClock): void {
  const shifts = new WeakMap<pg.PoolClient, number>();
  pool.on('acquire', (client) => {
    const offset = clock.offsetMs;
    if ((shifts.get(client) ?? 0) === offset) return;
    shifts.set(client, offset);
    client.query(`SELECT pg_catalog.set_config('pgasynq.clock_shift_ms', $1, false)`, [String(offset)]).catch(() => {});
  });
}

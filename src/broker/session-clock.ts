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
 * clock's. The caller's first statement is sent once the setting has been
 * answered (pg deprecates a second query on a client that is still running
 * one); a failure of the setting shows in that statement. A clock that never
 * moves sends nothing.
 */
export function followClock(pool: pg.Pool, clock: DatabaseClock): void {
  const shifts = new WeakMap<pg.PoolClient, number>();
  // Each client's own query(), bound once: a checkout whose setting no statement followed
  // leaves the waiting query() below in place, and the next setting must not wrap it.
  const queries = new WeakMap<pg.PoolClient, pg.PoolClient['query']>();
  pool.on('acquire', (client) => {
    const offset = clock.offsetMs;
    if ((shifts.get(client) ?? 0) === offset) return;
    shifts.set(client, offset);
    const query = queries.get(client) ?? client.query.bind(client);
    queries.set(client, query);
    const set = query(`SELECT pg_catalog.set_config('pgasynq.clock_shift_ms', $1, false)`, [String(offset)]).then(
      () => {},
      () => {},
    );
    // The next query() waits for the setting, in whichever of pg's forms it comes (a
    // submittable such as a cursor, a callback last, or a promise); the client's own
    // query() serves the ones after it.
    const next = (...args: unknown[]): unknown => {
      delete (client as { query?: unknown }).query;
      const send = (): unknown => Reflect.apply(query, undefined, args);
      const first = args[0] as { submit?: unknown } | undefined;
      if (typeof first?.submit === 'function') {
        void set.then(send);
        return first;
      }
      if (typeof args.at(-1) === 'function') {
        void set.then(send);
        return undefined;
      }
      return set.then(send);
    };
    Object.defineProperty(client, 'query', { value: next, configurable: true, writable: true });
  });
}

/**
 * Times every statement a pg.Pool's clients run, whichever way the library
 * calls them (promise or callback, `pool.query` or a checked-out client, text
 * or a named prepared statement): every client is patched as the pool creates it.
 */
import type pg from 'pg';
import { now } from './common.js';

export type StatementObserver = (text: string, values: unknown[], ms: number, result: pg.QueryResult) => void;

type AnyQuery = (...args: unknown[]) => unknown;

export function instrumentPool(pool: pg.Pool, observe: StatementObserver): pg.Pool {
  pool.on('connect', (client) => {
    const query = client.query.bind(client) as AnyQuery;
    (client as unknown as { query: AnyQuery }).query = (...args: unknown[]) => {
      const first = args[0] as string | { text?: string; values?: unknown[] } | undefined;
      const text = typeof first === 'string' ? first : (first?.text ?? '');
      const values = (typeof first === 'object' && first?.values) || (Array.isArray(args[1]) ? (args[1] as unknown[]) : []);
      const t0 = now();
      const cb = args.findIndex((a) => typeof a === 'function');
      if (cb >= 0) {
        const callback = args[cb] as (err: Error | null, res: pg.QueryResult) => void;
        args[cb] = (err: Error | null, res: pg.QueryResult) => {
          if (!err) observe(text, values, now() - t0, res);
          callback(err, res);
        };
        return query(...args);
      }
      const p = query(...args);
      if (p && typeof (p as Promise<pg.QueryResult>).then === 'function') {
        (p as Promise<pg.QueryResult>).then(
          (res) => observe(text, values, now() - t0, res),
          () => {},
        );
      }
      return p;
    };
  });
  return pool;
}

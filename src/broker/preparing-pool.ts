/**
 * The pool Kysely is given when statements are prepared (see Db.run()).
 */
import type { PostgresPool, PostgresPoolClient } from 'kysely';
import type pg from 'pg';

/**
 * The pool as Kysely sees it: a statement whose text run() has named is sent as that named
 * prepared statement, so the broker's statements inside a Kysely transaction (ctx.transaction's
 * completion, its lease lock) are planned once per connection too, as they are outside one.
 * Any other text (the user's own statements) goes as it came. One wrapper per pg client, as
 * Kysely keeps one connection object per client.
 */
export function preparingPool(pool: pg.Pool, prepared: ReadonlyMap<string, string>): PostgresPool {
  const wrappers = new WeakMap<pg.PoolClient, PostgresPoolClient>();
  const wrapped = {
    async connect(): Promise<PostgresPoolClient> {
      const client = await pool.connect();
      let wrapper = wrappers.get(client);
      if (wrapper === undefined) {
        // Kysely's other query() form takes a cursor, which pgasynq never streams through.
        wrapper = {
          query: (text: string, values: unknown[]) => client.query({ name: prepared.get(text), text, values }),
          release: (err?: boolean | Error) => client.release(err),
        } as unknown as PostgresPoolClient;
        wrappers.set(client, wrapper);
      }
      return wrapper;
    },
    end: () => pool.end(),
    // Kysely 0.29 reads the pool's options (for the connection that cancels a query); 0.27
    // and 0.28 do not declare them, hence a variable rather than an object literal.
    options: pool.options,
  };
  return wrapped;
}

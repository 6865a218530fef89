/**
 * IDLE_TX_TIMEOUT=off (plan F12, the run "without R17"): a pg.Pool for the
 * worker's Server, set up as the library sets up its own (db.ts:
 * application_name, keepAlive, connect timeout, synchronous_commit=off), whose
 * sessions turn idle_in_transaction_session_timeout off (0) and keep it off.
 *
 * The library has no switch for it: durableTransaction (ctx.transaction) sets
 * the timeout to the lease duration with a transaction-local set_config, whose
 * value is a bind parameter with the session's setting as its fallback
 * (`coalesce($1::text, current_setting('idle_in_transaction_session_timeout'))`).
 * This pool's client passes null for that one parameter of that one statement
 * (sent as a named prepared statement, a config object, or as text and
 * values), so the fallback, this session's 0, applies; every other statement
 * and parameter goes through unchanged. Only for showing what the timeout
 * protects against; nothing else uses it.
 */
import pg from 'pg';

const MARK = "set_config('idle_in_transaction_session_timeout'";

/** How many of the library's timeouts this process's pools turned off. */
export const idleTimeoutsTurnedOff = { count: 0 };

class NoIdleTimeoutClient extends pg.Client {
  // pg's query() has many overloads; two are rewritten: (text, values, …), and the config object
  // ({ name, text, values }, …) that the library's named prepared statements are sent as.
  override query(...args: unknown[]): any {
    const [first] = args;
    const asText = typeof first === 'string';
    const config = (asText ? { text: first, values: args[1] } : first) as { text?: unknown; values?: unknown } | null;
    const call = (super.query as (...a: unknown[]) => unknown).bind(this);
    if (typeof config?.text === 'string' && config.text.includes(MARK) && Array.isArray(config.values) && config.values.length === 1) {
      idleTimeoutsTurnedOff.count++;
      return call({ ...config, values: [null] }, ...args.slice(asText ? 2 : 1));
    }
    return call(...args);
  }
}

export function poolWithoutIdleTxTimeout(connectionString: string): pg.Pool {
  const pool = new pg.Pool({
    connectionString,
    application_name: `pgasynq:server:${process.pid}`,
    max: 10,
    keepAlive: true,
    connectionTimeoutMillis: 10_000,
    options: '-c synchronous_commit=off -c idle_in_transaction_session_timeout=0',
    Client: NoIdleTimeoutClient as unknown as pg.PoolConfig['Client'],
  });
  return pool;
}

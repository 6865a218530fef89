/**
 * Transactions on the library's pool: plain ones for statements that must
 * commit together, and durable ones for users' writes (ctx.transaction,
 * releases of dependents), which wait for the WAL flush and learn the fate of
 * a COMMIT whose reply was lost.
 */
import { performance } from 'node:perf_hooks';
import { sql } from 'kysely';
import { isTransientConnectionError } from '../internal/db-errors.js';
import type { AnyTransaction, Db } from './db.js';

/**
 * Runs `fn` in a Kysely transaction on `db`. Errors of the transaction itself
 * (connecting, BEGIN, COMMIT) go through db.failed(); errors that `fn` throws
 * are passed on as they are: ours were mapped by run() already, and a user's
 * (ctx.transaction) are none of the broker's business.
 */
async function inTransaction<T>(db: Db, fn: (trx: AnyTransaction) => Promise<T>, prelude?: (trx: AnyTransaction) => Promise<void>): Promise<T> {
  // A pooled connection may have died while idle (a restart, a terminated backend): when
  // getting it, its BEGIN or our own prelude fails that way, nothing of `fn` has run, so
  // another try is safe, and spares the caller an error it did not cause. Each failure drops
  // that connection from the pool; all of its idle ones may be dead at once.
  const tries = 1 + ((db.pool as { options?: { max?: number } }).options?.max ?? 10);
  for (let attempt = 1; ; attempt++) {
    let entered = false;
    // What `fn` threw: a ROLLBACK that fails on a dead connection would otherwise replace it.
    let thrownByFn: { err: unknown } | undefined;
    try {
      return await db.kysely.transaction().execute(async (trx) => {
        await prelude?.(trx);
        entered = true;
        try {
          return await fn(trx);
        } catch (err) {
          thrownByFn = { err };
          throw err;
        }
      });
    } catch (err) {
      if (thrownByFn) throw thrownByFn.err;
      if (!entered && attempt < tries && isTransientConnectionError(err)) continue;
      throw db.failed(err);
    }
  }
}

/** Kysely's transaction helper on our pool, for statements that must commit together. */
export function transaction<T>(db: Db, fn: (trx: AnyTransaction) => Promise<T>): Promise<T> {
  return inTransaction(db, fn);
}

/**
 * A transaction whose commit waits for the WAL flush whatever the session says: for users'
 * writes. `prelude` runs first, as part of the setup that is retried once on a dead connection.
 *
 * A COMMIT whose reply never came (the connection broke after the server got it) may have
 * committed: when `fn` had finished and the transaction then failed, its fate is read from
 * PostgreSQL by transaction id (`txid_status`), and a committed one returns `fn`'s value as
 * if the reply had come. The caller sees an error only for a transaction that did not commit,
 * or whose fate stayed unknown for `idleLimitMs` (the server then ends the session itself).
 */
export async function durableTransaction<T>(
  db: Db,
  fn: (trx: AnyTransaction) => Promise<T>,
  idleLimitMs?: number,
  prelude?: (trx: AnyTransaction) => Promise<void>,
): Promise<T> {
  let xid: string | undefined;
  let finished: { value: T } | undefined;
  try {
    return await inTransaction(
      db,
      async (trx) => {
        const value = await fn(trx);
        finished = { value };
        return value;
      },
      async (trx) => {
        if (!db.embedded) {
          // One round trip for both settings, local to this transaction, and its id. A holder that
          // stalls (frozen, its event loop blocked) would otherwise keep its rows locked, and the
          // recoverer skips locked rows: PostgreSQL ends such a session after idleLimitMs.
          const idle = idleLimitMs === undefined ? null : String(Math.ceil(idleLimitMs));
          const [row] = await db.run(
            sql<{ xid: string }>`SELECT set_config('synchronous_commit', 'on', true),
                         set_config('idle_in_transaction_session_timeout', coalesce(${idle}::text, current_setting('idle_in_transaction_session_timeout')), true),
                         txid_current()::text AS xid`,
            trx,
            'durable-begin',
          );
          xid = row?.xid;
        }
        await prelude?.(trx);
      },
    );
  } catch (err) {
    if (finished === undefined || xid === undefined || !isTransientConnectionError(err)) throw err;
    if ((await commitStatus(db, xid, idleLimitMs ?? 10_000)) !== 'committed') throw err;
    db.logger.warn({ xid }, "the COMMIT's reply was lost; the transaction committed");
    return finished.value;
  }
}

/**
 * What became of transaction `xid`, asked on another connection until it is decided or
 * `waitMs` has passed: a server that has not yet noticed its client is gone still holds
 * the transaction open ('in progress'), and a database that restarts answers nothing.
 */
async function commitStatus(db: Db, xid: string, waitMs: number): Promise<'committed' | 'aborted' | 'unknown'> {
  const until = performance.now() + waitMs;
  for (let attempt = 1; ; attempt++) {
    try {
      const [row] = await db.run(sql<{ status: string | null }>`SELECT txid_status(${xid}::bigint) AS status`);
      if (row?.status === 'committed' || row?.status === 'aborted') return row.status;
    } catch {
      // Not reachable yet: ask again.
    }
    if (performance.now() >= until) return 'unknown';
    await new Promise((resolve) => setTimeout(resolve, Math.min(50 * attempt, 1000)));
  }
}

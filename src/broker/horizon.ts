/**
 * Who holds back vacuum's horizon in this database: the oldest snapshot of a
 * session, or a prepared transaction. (A replication slot holds it too, by
 * design of whoever made it, and has no start time to measure.) While one is held,
 * no row version deleted after it began can be removed, and the task tables
 * and their indexes fill with dead entries (the claim cursor keeps claims
 * fast; the rest of the database pays).
 */
import { sql } from 'kysely';
import type { Db } from './db.js';

export interface HorizonHolder {
  /** 'session' or 'prepared transaction'. */
  kind: string;
  /** The session's pid; null for the others. */
  pid: number | null;
  /** The session's application_name, or the prepared transaction's gid. */
  name: string | null;
  /** The session's state (idle in transaction, active, …); null for the others. */
  state: string | null;
  /** How long it has held its snapshot (from its transaction's start or its preparation), on the database clock. */
  heldMs: number;
  /** When that began: with the pid, what tells one holder from the next. */
  since: Date;
}

/**
 * The holder of the oldest horizon of this database that has held it for
 * `longerThanMs` or more, if any. A session whose transaction began earlier
 * but holds no snapshot (it read nothing) does not count.
 */
export async function oldestHorizonHolder(db: Db, longerThanMs: number): Promise<HorizonHolder | undefined> {
  const rows = await db.run(sql<HorizonHolder>`
    WITH holders AS (
      SELECT 'session' AS kind, a.pid, a.application_name AS name, a.state, coalesce(a.xact_start, a.backend_start) AS since,
             age(a.backend_xmin) AS xmin_age
      FROM pg_stat_activity a
      WHERE a.backend_xmin IS NOT NULL AND a.pid <> pg_backend_pid()
        AND a.datid = (SELECT oid FROM pg_database WHERE datname = current_database())
      UNION ALL
      SELECT 'prepared transaction', NULL, p.gid, NULL, p.prepared, age(p.transaction)
      FROM pg_prepared_xacts p WHERE p.database = current_database()
    )
    SELECT kind, pid, name, state, since, (extract(epoch FROM ${db.now()} - since) * 1000)::float8 AS "heldMs"
    FROM holders
    WHERE since <= ${db.now()} - ${longerThanMs}::float8 * interval '1 millisecond'
    ORDER BY xmin_age DESC
    LIMIT 1`);
  return rows[0];
}

/**
 * W5's finished rows for pgasynq, written by hand: the ONE place where the
 * bench writes into pgasynq's tables rather than going through its public API
 * (enqueueing and completing a million tasks would take W5 minutes per
 * repetition). It knows today's storage (migration 0004, storage v2): a task
 * is a row of `task_inputs` (queue, id, type, payload, retention, …; `seq`
 * from the sequence `task_seq`) and a row of `task_states` with the same
 * `seq` (state, run_at, completed_at; `pending_seq` only for pending tasks,
 * so NULL here), plus the `queues` registry. The `tasks` view would take these
 * rows too, but through a row-by-row INSTEAD OF trigger; two set-based
 * INSERTs sharing one numbering are what an enqueue of N tasks writes. It must
 * follow any change to the storage, and fails loudly (an INSERT errors)
 * rather than write something the library would not.
 */
import type pg from 'pg';

export async function fillFinished(admin: pg.Pool, schema: string, n: number): Promise<void> {
  const s = `"${schema}"`;
  // Half completed (kept for a day of retention), half archived: rows no claim may touch.
  // `numbered` is read twice, so it is computed once: each row draws its seq once,
  // and both tables get the same one. One statement: one transaction, one WAL flush.
  await admin.query(`
    INSERT INTO ${s}.queues (name) VALUES ('default') ON CONFLICT DO NOTHING;
    WITH numbered AS MATERIALIZED (
      SELECT g, nextval('${s}.task_seq') AS seq, g % 2 = 0 AS completed FROM generate_series(1, ${Math.floor(n)}) g
    ),
    inputs AS (
      INSERT INTO ${s}.task_inputs (seq, queue, id, type, payload, retention)
      SELECT seq, 'default', 'done-' || g, 'noop', jsonb_build_object('i', g),
             CASE WHEN completed THEN interval '1 day' ELSE interval '0' END
      FROM numbered
    )
    INSERT INTO ${s}.task_states (seq, queue, state, run_at, completed_at)
    SELECT seq, 'default',
           CASE WHEN completed THEN 'completed' ELSE 'archived' END,
           -- completed: when its retention ends; archived: when it was archived.
           CASE WHEN completed THEN now() + interval '1 day' ELSE now() END,
           CASE WHEN completed THEN now() END
    FROM numbered`);
  // Every table of the schema, so that whatever holds the rows is vacuumed and analysed.
  const { rows } = await admin.query<{ t: string }>(`SELECT format('%I.%I', schemaname, relname) AS t FROM pg_stat_user_tables WHERE schemaname = $1`, [
    schema,
  ]);
  for (const { t } of rows) await admin.query(`VACUUM ANALYZE ${t}`);
}

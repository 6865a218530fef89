/**
 * W5's finished rows for pgasynq, written by hand: the ONE place where the
 * bench writes into pgasynq's tables rather than going through its public API
 * (enqueueing and completing a million tasks would take W5 minutes per
 * repetition). It knows today's storage (migrations 0001–0003: one `tasks`
 * table with `queue, id, type, payload, state, run_at, completed_at,
 * retention` and a `queues` table), and must follow any change to it: when
 * `tasks` becomes a view over other tables, rewrite this function, nothing
 * else. It fails loudly (the INSERT errors) rather than write something the
 * library would not.
 */
import type pg from 'pg';

export async function fillFinished(admin: pg.Pool, schema: string, n: number): Promise<void> {
  const s = `"${schema}"`;
  // Half completed (kept for a day of retention), half archived: rows no claim may touch.
  await admin.query(`
    INSERT INTO ${s}.queues (name) VALUES ('default') ON CONFLICT DO NOTHING;
    INSERT INTO ${s}.tasks (queue, id, type, payload, state, run_at, completed_at, retention)
    SELECT 'default', 'done-' || g, 'noop', jsonb_build_object('i', g),
           CASE WHEN g % 2 = 0 THEN 'completed' ELSE 'archived' END,
           CASE WHEN g % 2 = 0 THEN now() + interval '1 day' ELSE now() END,
           CASE WHEN g % 2 = 0 THEN now() END,
           CASE WHEN g % 2 = 0 THEN interval '1 day' ELSE interval '0' END
    FROM generate_series(1, ${Math.floor(n)}) g`);
  // Every table of the schema, so that whatever holds the rows is vacuumed and analysed.
  const { rows } = await admin.query<{ t: string }>(
    `SELECT format('%I.%I', schemaname, relname) AS t FROM pg_stat_user_tables WHERE schemaname = $1`,
    [schema],
  );
  for (const { t } of rows) await admin.query(`VACUUM ANALYZE ${t}`);
}

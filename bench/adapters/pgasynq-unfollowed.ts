/**
 * pgasynq-unfollowed: pgasynq at the same HEAD with the per-call reads and writes that
 * following and awaiting tasks added to the hot path taken out of its SQL after migrating
 * (what issue 29's "W2 within 5 % of the same HEAD without this feature's writes" compares
 * with). Not a configuration anyone should run: waits, watchers and task logs no longer work.
 *
 * Taken out: the claim's and the completion's read of the watchers table and their 'started'
 * and 'completed' events, the completion's append of ctx.log() lines and its `NOT awaited`
 * fence, the row trigger that tells a waiter its task ended, and the deletion trigger's look at
 * the history and waiters. Left in: task_states' four added columns (progress, runs,
 * has_history, awaited: about six bytes a row), and the worker's JavaScript (its TaskContext
 * carries ctx.log() and ctx.progress()).
 *
 * Each edit throws when the function's text no longer matches: the migrations moved on, and
 * this must follow them rather than measure something else.
 */
import type pg from 'pg';

interface Edit {
  fn: string;
  pattern: RegExp;
  by: string;
}

const EDITS: Edit[] = [
  // The claim: no watchers read, no 'started' CTE, nothing joined for it.
  { fn: 'claim_tasks', pattern: /\n\s*v_watching text\[\] := ARRAY\(SELECT DISTINCT[^\n]*\n/, by: '\n' },
  { fn: 'claim_tasks', pattern: /,\n(\s*--[^\n]*\n)*\s*started AS \([\s\S]*?HAVING count\(\*\) > 0\n\s*\)\n/, by: '\n' },
  { fn: 'claim_tasks', pattern: /FROM me LEFT JOIN started ON true/, by: 'FROM me' },
  // The completion: nobody watches, no log lines appended, no awaited task left to the general path.
  { fn: 'complete_tasks', pattern: /v_watching text\[\] := ARRAY\(SELECT DISTINCT[^\n]*;/, by: "v_watching text[] := '{}';" },
  { fn: 'complete_tasks', pattern: /IF logs IS NOT NULL THEN\s*PERFORM \S+\.append_task_logs\(logs, v_now\);\s*END IF;/, by: '' },
  { fn: 'complete_tasks', pattern: / AND NOT s\.awaited(\s+RETURNING s\.seq\n)/, by: '$1' },
  // The deletion trigger looks only at what workflows need.
  { fn: 'task_states_deleted', pattern: / OR gone\.has_history OR gone\.awaited/, by: '' },
];

/** Applies the edits to `schema`'s functions and drops the waiters' trigger. */
export async function unfollow(admin: pg.Pool, schema: string): Promise<void> {
  const q = `"${schema}"`;
  for (const fn of new Set(EDITS.map((e) => e.fn))) {
    const { rows } = await admin.query<{ def: string }>(`SELECT pg_get_functiondef('${q}.${fn}'::regproc) AS def`);
    let def = rows[0]!.def;
    for (const e of EDITS.filter((x) => x.fn === fn)) {
      if (!e.pattern.test(def)) throw new Error(`${fn}() no longer matches ${e.pattern.source.slice(0, 50)}…: update pgasynq-unfollowed`);
      def = def.replace(e.pattern, e.by);
    }
    await admin.query(def);
  }
  await admin.query(`DROP TRIGGER task_states_awaited ON ${q}.task_states`);
}

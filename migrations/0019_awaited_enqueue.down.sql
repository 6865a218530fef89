-- pgasynq 0019 down: 0015's enqueue_tasks(), which has no "aw" (a task is marked awaited by await_tasks() alone).
CREATE OR REPLACE FUNCTION {{schema}}.enqueue_tasks(tasks json, now_at timestamp with time zone, keyed boolean)
 RETURNS TABLE(enqueued_at_ms double precision, states text, due_ms text, waiting integer[], archived_because text[], refused text[])
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'pg_temp'
 SET plan_cache_mode TO 'force_generic_plan'
 SET work_mem TO '64MB'
 SET jit TO 'off'
AS $function$
#variable_conflict use_column
DECLARE
  -- {{schema}} is the quoted name; the channels carry the bare one (Db.channels).
  schema_name constant text := btrim('{{schema}}', '"');
  planned boolean;
  bad record;
BEGIN
  planned := tasks::text LIKE '%"dp":%';
  IF planned THEN
    -- Checked before the dependencies are read from the rows (the rows themselves are
    -- checked as they are read, below).
    PERFORM {{schema}}.check_task_rows(tasks);
    -- The stored dependencies, locked in seq order as every statement that locks
    -- several tasks; one missing is P0002, one in a group 22023.
    SELECT e.q, e.i, s.seq, s.group_key INTO bad
    FROM (SELECT DISTINCT d.v ->> 0 AS q, d.v ->> 1 AS i
          FROM json_to_recordset(tasks) AS x(i text, q text, dp json), json_array_elements(x.dp) AS d(v)
          WHERE NOT EXISTS (SELECT FROM json_to_recordset(tasks) AS c(i text, q text) WHERE c.q = d.v ->> 0 AND c.i = d.v ->> 1)) e
    LEFT JOIN LATERAL (SELECT s.seq, s.group_key FROM {{schema}}.task_inputs i JOIN {{schema}}.task_states s ON s.seq = i.seq
                       WHERE i.queue = e.q AND i.id = e.i LIMIT 1) s ON true
    WHERE s.seq IS NULL OR s.group_key IS NOT NULL
    LIMIT 1;
    IF FOUND THEN
      -- Refused before anything is written, as a row rather than an error: the
      -- caller's transaction stays usable, as after any refusal of the library's.
      RETURN QUERY SELECT NULL::float8, NULL::text, NULL::text, NULL::integer[], NULL::text[],
        ARRAY[CASE WHEN bad.seq IS NULL THEN 'missing' ELSE 'grouped' END, bad.q, bad.i];
      RETURN;
    END IF;
    -- (Each looked up by its key, here and in `edges` below, LIMIT 1 keeping the lookup a
    -- subquery of its own: as joins, the generic plans hashed task_inputs and task_states
    -- whole at every enqueue with dependencies.)
    PERFORM FROM {{schema}}.task_states s
    WHERE s.seq = ANY (ARRAY(
      SELECT i.seq
      FROM (SELECT DISTINCT d.v ->> 0 AS q, d.v ->> 1 AS id FROM json_to_recordset(tasks) AS x(dp json), json_array_elements(x.dp) AS d(v)) w
      CROSS JOIN LATERAL (SELECT i.seq FROM {{schema}}.task_inputs i WHERE i.queue = w.q AND i.id = w.id LIMIT 1) i))
    ORDER BY s.seq
    FOR NO KEY UPDATE OF s;
  END IF;

  RETURN QUERY
  WITH RECURSIVE
  input AS (
    -- json, not jsonb: parsed once, as the rows are read, without building a jsonb document first.
    SELECT i.i AS id, i.q AS queue, i.t AS type, i.p AS payload, decode(i.b, 'hex') AS payload_bytes,
           coalesce(i.h, '{}') AS headers, i.m AS max_retry, i."to" AS timeout_ms, i.d AS deadline, i.u AS unique_key,
           coalesce(i.ut, 0) AS unique_ttl_ms, i.g AS group_key, coalesce(i.r, 0) AS retention_ms,
           i."at" AS process_at, i."in" AS process_in_ms, coalesce(i.pr, 0)::smallint AS priority, i.k AS concurrency_key,
           i.dp, coalesce(i."of", 'archive') AS on_failure, i.ord
    FROM ROWS FROM (json_to_recordset(tasks) AS (
      i text, q text, t text, p jsonb, b text, h jsonb, m int, "to" float8, d timestamptz, u text, ut float8,
      g text, r float8, "at" timestamptz, "in" float8, pr int, k text, dp json, "of" text
    )) WITH ORDINALITY AS i(i, q, t, p, b, h, m, "to", d, u, ut, g, r, "at", "in", pr, k, dp, "of", ord)
    -- Each row checked as it is read, before anything is made of it: the first that fails
    -- has check_task_rows() raise its rule (the JSON is parsed once, not once to check it
    -- and again to write it).
    WHERE {{schema}}.task_row_ok(i.i, i.q, i.t, i.p, i.b, i.h, i.m, i."to", i.d, i.u, i.ut, i.g, i.r, i."at", i."in", i.pr, i.k, i.dp, i."of") OR {{schema}}.refuse_task_rows(tasks)
  ),
  -- A workflow's edges (none without dependencies): the dependency is a task
  -- of the call (j, its place) or a stored one (seq), as the database has it.
  edges AS (
    SELECT DISTINCT ON (x.ord, dq, di) x.ord AS d, e.pos, e.v ->> 0 AS dq, e.v ->> 1 AS di, x.on_failure AS f,
           c.ord AS j, s.seq AS stored_seq, s.state AS stored_state, s.result, s.result_bytes
    FROM input x
    CROSS JOIN LATERAL json_array_elements(x.dp) WITH ORDINALITY AS e(v, pos)
    LEFT JOIN input c ON c.queue = e.v ->> 0 AND c.id = e.v ->> 1
    LEFT JOIN LATERAL (SELECT s.seq, s.state, s.result, s.result_bytes
                       FROM {{schema}}.task_inputs si JOIN {{schema}}.task_states s ON s.seq = si.seq
                       WHERE c.ord IS NULL AND si.queue = e.v ->> 0 AND si.id = e.v ->> 1 LIMIT 1) s ON true
    WHERE planned
    ORDER BY x.ord, dq, di, e.pos
  ),
  -- The tasks of the call archived at once: a stored dependency archived, or one
  -- of the call archived at once, under the policy 'archive'.
  doomed(ord) AS (
    SELECT e.d FROM edges e WHERE e.j IS NULL AND e.stored_state = 'archived' AND e.f = 'archive'
    UNION
    SELECT e.d FROM edges e JOIN doomed o ON e.j = o.ord WHERE e.f = 'archive'
  ),
  settled AS (
    SELECT e.*, CASE WHEN e.j IS NULL THEN CASE e.stored_state WHEN 'completed' THEN 'completed' WHEN 'archived' THEN 'failed' END
                     WHEN e.j IN (SELECT ord FROM doomed) THEN 'failed' END AS outcome
    FROM edges e
  ),
  plan AS (
    SELECT s.d AS ord, (count(*) FILTER (WHERE s.outcome IS NULL))::integer AS waiting_for,
           (array_agg(format('dependency %s/%s failed', s.dq, s.di) ORDER BY s.pos)
              FILTER (WHERE s.outcome = 'failed' AND s.f = 'archive'))[1] AS archived_because
    FROM settled s GROUP BY s.d
  ),
  routed AS (
    -- asynq's routing: due later → scheduled (group or not); else group → aggregating; else pending.
    -- A task whose dependency failed starts archived; one with dependencies to wait for,
    -- waiting (run_at keeps its due time: once released, it is scheduled if that is still ahead).
    SELECT r.*, CASE r.state WHEN 'pending' THEN now_at WHEN 'archived' THEN now_at ELSE r.due END AS run_at
    FROM (
      SELECT i.*, CASE WHEN i.archived_because IS NOT NULL THEN 'archived' WHEN i.waiting_for > 0 THEN 'waiting'
                       WHEN i.due > now_at THEN 'scheduled' WHEN i.group_key IS NOT NULL THEN 'aggregating' ELSE 'pending' END AS state
      FROM (
        SELECT input.*, coalesce(process_at, now_at + process_in_ms * interval '1 millisecond', now_at) AS due,
               p.waiting_for, p.archived_because, EXISTS (SELECT FROM edges e WHERE e.j = input.ord) AS has_dependents
        FROM input LEFT JOIN plan p ON p.ord = input.ord
      ) i
    ) r
  ),
  -- The expired locks of the call's keys, each found by a probe of the primary key and
  -- deleted by ctid: a join here was planned once (a generic plan, on whatever the table
  -- held then) as a hash join that read the whole table at every enqueue.
  expired_locks AS (
    DELETE FROM {{schema}}.unique_locks l
    WHERE l.ctid = ANY (ARRAY(
      SELECT x.ctid FROM routed r
      CROSS JOIN LATERAL (SELECT e.ctid FROM {{schema}}.unique_locks e
                          WHERE e.queue = r.queue AND e.key = r.unique_key AND e.expires_at <= now_at LIMIT 1) x
      WHERE r.unique_key IS NOT NULL))
      AND l.expires_at <= now_at
    RETURNING 1
  ),
  locks AS (
    -- A live lock makes this insert fail with unique_locks_pkey: the whole statement,
    -- tasks included, is then undone. Reading expired_locks first makes its delete run first.
    INSERT INTO {{schema}}.unique_locks (queue, key, task_id, expires_at)
    SELECT queue, unique_key, id, greatest(due, now_at) + unique_ttl_ms * interval '1 millisecond'
    FROM routed WHERE unique_key IS NOT NULL AND (SELECT count(*) FROM expired_locks) >= 0
    ORDER BY queue, unique_key
    RETURNING 1
  ),
  registered AS (
    INSERT INTO {{schema}}.queues (name) SELECT DISTINCT queue FROM routed ON CONFLICT DO NOTHING
  ),
  -- Numbered in the caller's order: task_position() in the select list runs after the
  -- sort, so seq, and with it the pending order, is FIFO within the call. A pending
  -- task's position is its own seq.
  numbered AS (
    SELECT r.*, {{schema}}.task_position() AS seq FROM (SELECT * FROM routed ORDER BY ord) r
  ),
  inputs AS (
    INSERT INTO {{schema}}.task_inputs (seq, queue, id, type, payload, payload_bytes, headers, max_retry, timeout,
                                        deadline, unique_key, retention)
    SELECT seq, queue, id, type, payload, payload_bytes, headers, max_retry, timeout_ms * interval '1 millisecond',
           deadline, unique_key, retention_ms * interval '1 millisecond'
    FROM numbered ORDER BY CASE WHEN keyed THEN queue END, CASE WHEN keyed THEN id END, seq
  ),
  states AS (
    INSERT INTO {{schema}}.task_states (seq, queue, state, pending_seq, run_at, group_key, priority, concurrency_key,
                                        waiting_for, has_dependents, error_msg, last_failed_at)
    SELECT seq, queue, state, CASE WHEN state = 'pending' THEN seq END, run_at, group_key, priority, concurrency_key,
           waiting_for, has_dependents, archived_because, CASE WHEN state = 'archived' THEN now_at END
    FROM numbered ORDER BY seq
  ),
  edges_written AS (
    INSERT INTO {{schema}}.task_dependencies (dependent_seq, dependency_seq, dependency_queue, dependency_id, on_failure, outcome,
                                              result, result_bytes)
    SELECT dependent.seq, coalesce(s.stored_seq, dependency.seq), s.dq, s.di, s.f, s.outcome,
           CASE WHEN s.outcome = 'completed' THEN s.result END, CASE WHEN s.outcome = 'completed' THEN s.result_bytes END
    FROM settled s
    JOIN numbered dependent ON dependent.ord = s.d
    LEFT JOIN numbered dependency ON dependency.ord = s.j
  ),
  -- The stored dependencies learn that they have dependents, so that finishing them
  -- settles these edges.
  -- Only with dependencies, each found by its primary key and updated by ctid (the rows
  -- were locked above, so they stay where they are): as a join, the generic plan read
  -- task_states from its start until its first row at every enqueue, through every dead
  -- row a held snapshot kept there (11,000 buffers per enqueue a minute into a held
  -- transaction id, W8); planned on an empty table, a scan by seq read it whole.
  marked AS (
    UPDATE {{schema}}.task_states t SET has_dependents = true
    WHERE planned
      AND t.ctid = ANY (ARRAY(
        SELECT x.ctid FROM (SELECT DISTINCT e.stored_seq FROM edges e WHERE e.stored_seq IS NOT NULL) e
        CROSS JOIN LATERAL (SELECT s.ctid FROM {{schema}}.task_states s WHERE s.seq = e.stored_seq LIMIT 1) x))
      AND NOT t.has_dependents
  ),
  notified AS (
    SELECT pg_notify(schema_name || CASE WHEN n.pending THEN '_tasks' ELSE '_delayed' END, n.queue)
    FROM (SELECT DISTINCT state = 'pending', queue FROM routed WHERE state IN ('pending', 'scheduled')) n(pending, queue)
  )
  -- One row, not one per task: a bulk enqueue spent longer parsing 50,000 result rows
  -- than the database took to write them.
  SELECT (extract(epoch FROM now_at) * 1000)::float8,
         string_agg(CASE r.state WHEN 'archived' THEN 'x' ELSE left(r.state, 1) END, '' ORDER BY r.ord),
         coalesce(string_agg((extract(epoch FROM r.run_at) * 1000)::float8::text, ',' ORDER BY r.ord)
                    FILTER (WHERE r.state = 'scheduled'), ''),
         CASE WHEN planned THEN array_agg(r.waiting_for ORDER BY r.ord) END,
         CASE WHEN planned THEN array_agg(r.archived_because ORDER BY r.ord) END,
         NULL::text[]
  FROM routed r WHERE (SELECT count(*) FROM notified) >= 0;
END
$function$;
REVOKE EXECUTE ON FUNCTION {{schema}}.enqueue_tasks(tasks json, now_at timestamp with time zone, keyed boolean) FROM PUBLIC;

-- pgasynq 0015 down: 0012's enqueue_tasks() (its rows checked by a parse of their own) and 0009's check_task_rows().
CREATE OR REPLACE FUNCTION {{schema}}.enqueue_tasks(tasks json, now_at timestamp with time zone, keyed boolean)
 RETURNS TABLE(enqueued_at_ms double precision, states text, due_ms text, waiting integer[], archived_because text[], refused text[])
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'pg_temp'
 SET plan_cache_mode TO 'force_generic_plan'
AS $function$
#variable_conflict use_column
DECLARE
  -- {{schema}} is the quoted name; the channels carry the bare one (Db.channels).
  schema_name constant text := btrim('{{schema}}', '"');
  planned boolean;
  bad record;
BEGIN
  PERFORM {{schema}}.check_task_rows(tasks);
  planned := tasks::text LIKE '%"dp":%';
  IF planned THEN
    -- The stored dependencies, locked in seq order as every statement that locks
    -- several tasks; one missing is P0002, one in a group 22023.
    SELECT e.q, e.i, s.seq, s.group_key INTO bad
    FROM (SELECT DISTINCT d.v ->> 0 AS q, d.v ->> 1 AS i
          FROM json_to_recordset(tasks) AS x(i text, q text, dp json), json_array_elements(x.dp) AS d(v)
          WHERE NOT EXISTS (SELECT FROM json_to_recordset(tasks) AS c(i text, q text) WHERE c.q = d.v ->> 0 AND c.i = d.v ->> 1)) e
    LEFT JOIN ({{schema}}.task_inputs i JOIN {{schema}}.task_states s ON s.seq = i.seq) ON i.queue = e.q AND i.id = e.i
    WHERE s.seq IS NULL OR s.group_key IS NOT NULL
    LIMIT 1;
    IF FOUND THEN
      -- Refused before anything is written, as a row rather than an error: the
      -- caller's transaction stays usable, as after any refusal of the library's.
      RETURN QUERY SELECT NULL::float8, NULL::text, NULL::text, NULL::integer[], NULL::text[],
        ARRAY[CASE WHEN bad.seq IS NULL THEN 'missing' ELSE 'grouped' END, bad.q, bad.i];
      RETURN;
    END IF;
    PERFORM FROM {{schema}}.task_inputs i JOIN {{schema}}.task_states s ON s.seq = i.seq
    WHERE (i.queue, i.id) IN (SELECT d.v ->> 0, d.v ->> 1 FROM json_to_recordset(tasks) AS x(dp json), json_array_elements(x.dp) AS d(v))
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
  ),
  -- A workflow's edges (none without dependencies): the dependency is a task
  -- of the call (j, its place) or a stored one (seq), as the database has it.
  edges AS (
    SELECT DISTINCT ON (x.ord, dq, di) x.ord AS d, e.pos, e.v ->> 0 AS dq, e.v ->> 1 AS di, x.on_failure AS f,
           c.ord AS j, s.seq AS stored_seq, s.state AS stored_state, s.result, s.result_bytes
    FROM input x
    CROSS JOIN LATERAL json_array_elements(x.dp) WITH ORDINALITY AS e(v, pos)
    LEFT JOIN input c ON c.queue = e.v ->> 0 AND c.id = e.v ->> 1
    LEFT JOIN ({{schema}}.task_inputs si JOIN {{schema}}.task_states s ON s.seq = si.seq)
      ON c.ord IS NULL AND si.queue = e.v ->> 0 AND si.id = e.v ->> 1
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
  expired_locks AS (
    DELETE FROM {{schema}}.unique_locks l USING routed r
    WHERE l.queue = r.queue AND l.key = r.unique_key AND l.expires_at <= now_at
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
  marked AS (
    UPDATE {{schema}}.task_states t SET has_dependents = true
    WHERE t.seq IN (SELECT stored_seq FROM edges WHERE stored_seq IS NOT NULL) AND NOT t.has_dependents
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

CREATE OR REPLACE FUNCTION {{schema}}.check_task_rows(tasks json) RETURNS void
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  x record;
  field text;
  rule text;
  -- 1000 years: the longest duration an instant of years 1–9999 plus it still holds.
  max_ms constant float8 := 31557600000000;
  -- A Node.js timer's longest wait: what a task's timeout and processIn may be.
  max_timer_ms constant float8 := 2147483647;
  -- The most any Client's maxPayloadBytes allows (model/payload.ts MAX_PAYLOAD_BYTES_LIMIT).
  max_bytes constant bigint := 268435455;
BEGIN
  SELECT r.* INTO x
  FROM ROWS FROM (json_to_recordset(tasks) AS (
    i text, q text, t text, p jsonb, b text, h jsonb, m int, "to" float8, d timestamptz, u text, ut float8,
    g text, r float8, "at" timestamptz, "in" float8, pr int, k text, dp json, "of" text
  )) WITH ORDINALITY AS r(i, q, t, p, b, h, m, "to", d, u, ut, g, r, "at", "in", pr, k, dp, "of", ord)
  WHERE NOT coalesce((
    -- Lengths apart from the patterns: a bounded repetition ({0,127}) costs PostgreSQL's
    -- regular expressions a hundred times more, row by row.
    r.i ~ '^[A-Za-z0-9_][A-Za-z0-9_.:-]*$' AND char_length(r.i) <= 128
    AND r.q ~ '^[A-Za-z0-9_.:-]+$' AND char_length(r.q) <= 100
    -- The text rule inline (a function call per row costs a bulk enqueue): UTF-16
    -- counts at most twice the characters, so short text needs no exact count.
    AND r.t !~ '[\u0001-\u001f\u007f-\u009f]' AND r.t ~ '[^\t\n\v\f\r \u00a0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000\ufeff]'
    AND (char_length(r.t) <= 50 OR {{schema}}.utf16_length(r.t) <= 100)
    AND r.m BETWEEN 0 AND 1000
    AND r."to" BETWEEN 0 AND max_timer_ms
    AND coalesce(r.r, 0) BETWEEN 0 AND max_ms
    AND coalesce(r."in", 0) BETWEEN 0 AND max_timer_ms
    AND coalesce(r.pr, 0) BETWEEN -100 AND 100
    AND (r.d IS NULL OR r.d BETWEEN '0001-01-01 00:00:00+00' AND '9999-12-31 23:59:59.999+00')
    AND (r."at" IS NULL OR r."at" BETWEEN '0001-01-01 00:00:00+00' AND '9999-12-31 23:59:59.999+00')
    AND (r.u IS NULL OR (char_length(r.u) <= 512 AND r.ut BETWEEN 1000 AND max_ms))
    AND (r.g IS NULL OR (r.g ~ '^[A-Za-z0-9_.:-]+$' AND char_length(r.g) <= 100))
    AND (r.k IS NULL OR {{schema}}.enqueue_text_rule(r.k, 200) IS NULL)
    -- model/task.ts MAX_HEADER_KEYS and MAX_HEADERS_BYTES, with room for the spaces of jsonb's text.
    AND (r.h IS NULL OR (jsonb_typeof(r.h) = 'object' AND NOT jsonb_path_exists(r.h, '$.* ? (@.type() != "string")')
                         AND octet_length(r.h::text) <= 2 * 65536 AND (SELECT count(*) FROM jsonb_object_keys(r.h)) <= 1000))
    -- jsonb's own size, not its text: no payload is printed again to be measured.
    AND coalesce(pg_column_size(r.p), 0) + coalesce(octet_length(r.b) / 2, 0) <= max_bytes
    AND (r.p IS NULL OR NOT jsonb_path_exists(r.p, 'strict $.**{65}'))
    AND (r.dp IS NULL OR json_typeof(r.dp) = 'array')
    AND (r."of" IS NULL OR r."of" IN ('archive', 'run'))
  ), false)
  ORDER BY r.ord
  LIMIT 1;
  IF NOT FOUND THEN
    RETURN;
  END IF;
  field := 'taskId';
  rule := {{schema}}.enqueue_name_rule(x.i, 128, true);
  IF rule IS NULL THEN field := 'queue'; rule := {{schema}}.enqueue_name_rule(x.q, 100, false); END IF;
  IF rule IS NULL THEN field := 'type'; rule := {{schema}}.enqueue_text_rule(x.t, 100); END IF;
  IF rule IS NULL AND NOT coalesce(x.m BETWEEN 0 AND 1000, false) THEN
    field := 'maxRetry'; rule := format('must be an integer in [0, 1000] (got %s)', coalesce(x.m::text, 'NULL'));
  END IF;
  IF rule IS NULL AND NOT coalesce(x."to" BETWEEN 0 AND max_timer_ms, false) THEN
    field := 'timeout'; rule := format('must be a finite duration in ms in [0, %s] (got %s)', max_timer_ms, coalesce(x."to"::text, 'NULL'));
  END IF;
  IF rule IS NULL AND NOT coalesce(x.r, 0) BETWEEN 0 AND max_ms THEN
    field := 'retention'; rule := format('must be a finite duration in ms in [0, %s] (got %s)', max_ms, x.r);
  END IF;
  IF rule IS NULL AND NOT coalesce(x."in", 0) BETWEEN 0 AND max_timer_ms THEN
    field := 'processIn'; rule := format('must be a finite duration in ms in [0, %s] (got %s)', max_timer_ms, x."in");
  END IF;
  IF rule IS NULL AND NOT coalesce(x.pr, 0) BETWEEN -100 AND 100 THEN
    field := 'priority'; rule := format('must be an integer in [-100, 100] (got %s)', x.pr);
  END IF;
  IF rule IS NULL AND NOT coalesce(x.d BETWEEN '0001-01-01 00:00:00+00' AND '9999-12-31 23:59:59.999+00', true) THEN
    field := 'deadline'; rule := format('must be a time in years 1–9999 (got %s)', x.d);
  END IF;
  IF rule IS NULL AND NOT coalesce(x."at" BETWEEN '0001-01-01 00:00:00+00' AND '9999-12-31 23:59:59.999+00', true) THEN
    field := 'processAt'; rule := format('must be a time in years 1–9999 (got %s)', x."at");
  END IF;
  IF rule IS NULL AND x.u IS NOT NULL AND NOT coalesce(char_length(x.u) <= 512 AND x.ut BETWEEN 1000 AND max_ms, false) THEN
    field := 'unique'; rule := format('TTL must be a finite number of ms in [1000, %s], its key at most 512 characters', max_ms);
  END IF;
  IF rule IS NULL AND x.g IS NOT NULL THEN field := 'group'; rule := {{schema}}.enqueue_name_rule(x.g, 100, false); END IF;
  IF rule IS NULL AND x.k IS NOT NULL THEN field := 'concurrencyKey'; rule := {{schema}}.enqueue_text_rule(x.k, 200); END IF;
  IF rule IS NULL AND x.h IS NOT NULL THEN field := 'headers'; rule := 'must be an object of at most 1000 strings, 64 KiB in all'; END IF;
  IF rule IS NULL AND x.dp IS NOT NULL AND json_typeof(x.dp) <> 'array' THEN field := 'dependsOn'; rule := 'must be an array'; END IF;
  IF rule IS NULL AND x."of" IS NOT NULL AND x."of" NOT IN ('archive', 'run') THEN
    field := 'onDependencyFailure'; rule := 'must be ''archive'' or ''run''';
  END IF;
  IF rule IS NULL THEN
    field := 'payload';
    rule := format('is too large or nested too deep (at most %s bytes, 64 levels)', max_bytes);
  END IF;
  RAISE EXCEPTION USING ERRCODE = 'invalid_parameter_value', MESSAGE = format('pgasynq: invalid %s: %s', field, rule), COLUMN = field;
END
$$;

DROP FUNCTION {{schema}}.refuse_task_rows(json);
DROP FUNCTION {{schema}}.task_row_ok(text, text, text, jsonb, text, jsonb, integer, double precision, timestamptz, text, double precision, text, double precision, timestamptz, double precision, integer, text, json, text);

-- pgasynq 0009: the database is the trust boundary. A login that is not the
-- owner writes tasks only through the owner's functions, which check what
-- they are given and decide from what the database says.
-- {{schema}} is replaced by the quoted schema name before this file runs.
--
--  * enqueue_tasks() is the library's enqueue (Client.enqueue, enqueueMany,
--    the scheduler's and the aggregator's enqueues): SECURITY DEFINER, so
--    the producer and the worker need no INSERT on task_inputs, task_states,
--    task_dependencies or unique_locks (broker/roles.ts revokes them). It
--    refuses what the library's validation refuses (check_task_rows()),
--    draws every position itself, and plans a workflow's edges from the
--    stored dependencies it locks: their outcome, result and has_dependents
--    mark come from the database, never from the caller.
--  * replace_tasks() checks the rows as enqueue_tasks() does, and takes a
--    lock per task name first, so that concurrent replaces of an id not yet
--    stored queue up (the later ones then replace the first) instead of
--    failing with TaskIdConflictError.
--  * enqueue() in SQL refuses a process_at outside years 1–9999, which a
--    JavaScript Date and every reader hold.
--  * ensure_queues() makes queues known before their first task (a server
--    registers the queues it serves, an admin creates or configures one):
--    the worker and the admin hold no INSERT on queues, and every name is
--    checked as an enqueue checks it.
--  * claim_limited() and queue_counts() run with search_path pinned, as
--    every other function: an object planted on the caller's path (a
--    public.unnest(text[]), an operator) is never what they call.

-- The first rule a row of `tasks` breaks, in the library's order and words
-- (model/validate.ts, model/task.ts validateOptions), as 22023 with the field
-- in COLUMN; nothing when every row is fine. `tasks` is broker/enqueue.ts
-- toJsonRows()'s array. The library checked them already: this is for a
-- caller that is not the library, so one set-based pass finds the first bad
-- row cheaply and only that row's message is worked out.
CREATE FUNCTION {{schema}}.check_task_rows(tasks json) RETURNS void
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

-- Enqueues `tasks` (broker/enqueue.ts toJsonRows()) in one statement, all or
-- nothing: the unique locks (an expired one is replaced), the queue registry,
-- each task's inputs and state, a workflow's edges, and one NOTIFY per
-- (channel, queue). `now_at` is the enqueue's time (the database's now(),
-- or a test's clock moved forward): it routes the caller's own tasks; whether
-- another caller's unique lock has expired is decided on now() alone.
-- `keyed`: insert in (queue, id) order, so that two calls holding the same
-- given ids or unique keys in different orders cannot deadlock (fault test F17).
--
-- A task's `dp` lists its dependencies as [queue, id] pairs: another task of
-- the call, or a stored task, which is locked (none can finish meanwhile) and
-- must exist and belong to no group (see `refused` below). A stored dependency that completed hands
-- its result to the edge at once; one archived has failed, and so has a task
-- of the call archived at once because of such a failure: a dependent whose
-- policy (`of`) is 'archive' starts archived, and its dependents in the call
-- in turn; otherwise it waits for the dependencies not finished. The caller
-- (model/workflow.ts) refused cycles; one here would only leave the caller's
-- own tasks waiting.
--
-- Returns one row: the enqueue's time in ms, each task's state as one letter
-- in the call's order (p, s, a, w, x for archived), the due times of the
-- scheduled ones, and with dependencies each task's waiting_for and the
-- error of one archived at once; or, with nothing written, `refused`: a
-- dependency 'missing' or 'grouped', with its queue and id.
CREATE FUNCTION {{schema}}.enqueue_tasks(tasks json, now_at timestamptz, keyed boolean)
RETURNS TABLE (enqueued_at_ms float8, states text, due_ms text, waiting integer[], archived_because text[], refused text[])
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp
-- Planned once per session: a custom plan (what PostgreSQL keeps choosing for this statement)
-- costs three times the enqueue it plans, and knows no more (json_to_recordset's row count is
-- a guess either way).
SET plan_cache_mode = force_generic_plan AS $$
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
    WHERE l.queue = r.queue AND l.key = r.unique_key AND l.expires_at <= now()
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
  -- A transaction id before any position is drawn: the claim cursor (server/cursor.ts)
  -- relies on every transaction that draws one having an id already.
  tx AS MATERIALIZED (SELECT pg_current_xact_id() AS xid),
  -- Numbered in the caller's order: nextval() in the select list runs after the sort,
  -- so seq, and with it the pending order, is FIFO within the call. A pending task's
  -- position is its own seq.
  numbered AS (
    SELECT r.*, nextval('{{schema}}.task_seq') AS seq FROM (SELECT * FROM routed ORDER BY ord) r
    WHERE (SELECT xid FROM tx) IS NOT NULL
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
$$;

-- replace_tasks() (0007) checking its rows as enqueue_tasks() does, and
-- serialising replaces of one name (see the header).
CREATE OR REPLACE FUNCTION {{schema}}.replace_tasks(tasks json, now_at timestamptz, schema_name text)
RETURNS TABLE (ord bigint, replaced boolean)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  ords bigint[];
  states text[];
  n integer;
  own_schema constant text := btrim('{{schema}}', '"');
BEGIN
  PERFORM {{schema}}.check_task_rows(tasks);
  -- One lock per name, in one order: a replace of a name not yet stored waits for
  -- another that is inserting it, and then finds it (each statement here takes a
  -- new snapshot) and replaces it.
  PERFORM pg_advisory_xact_lock(hashtext('pgasynq replace ' || own_schema), k)
  FROM (SELECT DISTINCT hashtext(x.q || '/' || x.i) AS k FROM json_to_recordset(tasks) AS x(i text, q text) ORDER BY 1) names;
  -- Locked in seq order, as every statement that locks several tasks.
  SELECT array_agg(l.ord), array_agg(l.state) INTO ords, states
  FROM (
    SELECT x.ord, s.state
    FROM ROWS FROM (json_to_recordset(tasks) AS (i text, q text)) WITH ORDINALITY AS x(i, q, ord)
    JOIN {{schema}}.task_inputs i ON i.queue = x.q AND i.id = x.i
    JOIN {{schema}}.task_states s ON s.seq = i.seq
    ORDER BY s.seq
    FOR NO KEY UPDATE OF s
  ) l;
  IF ords IS NULL THEN
    RETURN;
  END IF;
  -- Not started and not finished: the states a task may be replaced in.
  RETURN QUERY SELECT f.o, false FROM unnest(ords, states) AS f(o, st) WHERE f.st NOT IN ('pending', 'scheduled', 'retry', 'waiting');
  IF FOUND THEN
    RETURN;
  END IF;
  WITH r AS (
    SELECT i.seq, x.t AS type, x.p AS payload, decode(x.b, 'hex') AS payload_bytes, coalesce(x.h, '{}') AS headers,
           x.m AS max_retry, x."to" AS timeout_ms, x.d AS deadline, coalesce(x.r, 0) AS retention_ms,
           coalesce(x."at", now_at + x."in" * interval '1 millisecond', now_at) AS due,
           coalesce(x.pr, 0) AS priority, x.k AS concurrency_key
    FROM json_to_recordset(tasks) AS x(i text, q text, t text, p jsonb, b text, h jsonb, m int, "to" float8, d timestamptz,
                                       r float8, "at" timestamptz, "in" float8, pr smallint, k text)
    JOIN {{schema}}.task_inputs i ON i.queue = x.q AND i.id = x.i
  ),
  inputs AS (
    UPDATE {{schema}}.task_inputs i
    SET type = r.type, payload = r.payload, payload_bytes = r.payload_bytes, headers = r.headers, max_retry = r.max_retry,
        timeout = r.timeout_ms * interval '1 millisecond', deadline = r.deadline, retention = r.retention_ms * interval '1 millisecond'
    FROM r WHERE i.seq = r.seq
  ),
  -- In SET, s.state is the state the task was locked in.
  moved AS (
    UPDATE {{schema}}.task_states s
    SET state = CASE WHEN s.state = 'waiting' THEN 'waiting' WHEN r.due > now_at THEN 'scheduled' ELSE 'pending' END,
        pending_seq = CASE WHEN s.state = 'waiting' OR r.due > now_at THEN NULL
                           -- A new priority is a new place: the back of that priority.
                           WHEN s.state = 'pending' AND s.priority = r.priority THEN s.pending_seq
                           -- This transaction has an id (it locked the rows): see server/cursor.ts.
                           ELSE nextval('{{schema}}.task_seq') END,
        run_at = CASE WHEN s.state = 'waiting' OR r.due > now_at THEN r.due WHEN s.state = 'pending' THEN s.run_at ELSE now_at END,
        priority = r.priority, concurrency_key = r.concurrency_key, updated_at = now_at
    FROM r WHERE s.seq = r.seq
    RETURNING s.queue, s.state
  ),
  notified AS (
    SELECT pg_notify(own_schema || CASE WHEN m.state = 'pending' THEN '_tasks' ELSE '_delayed' END, m.queue)
    FROM (SELECT DISTINCT state, queue FROM moved WHERE state IN ('pending', 'scheduled')) m
  )
  SELECT count(*) INTO n FROM notified;
  RETURN QUERY SELECT o, true FROM unnest(ords) AS o;
END
$$;

-- enqueue() (0008) with process_at bounded to years 1–9999, as the library's Dates are.
CREATE OR REPLACE FUNCTION {{schema}}.enqueue(type text, payload jsonb DEFAULT NULL, queue text DEFAULT 'default',
                                   task_id text DEFAULT NULL, process_at timestamptz DEFAULT NULL,
                                   max_retry integer DEFAULT 25, priority integer DEFAULT 0,
                                   concurrency_key text DEFAULT NULL)
RETURNS text
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  -- A JSON null is no payload, as the library stores it.
  body jsonb := nullif(enqueue.payload, 'null'::jsonb);
  body_bytes bigint;
  field text;
  rule text;
  new_id text;
  new_seq bigint;
  due timestamptz := coalesce(enqueue.process_at, now());
  -- asynq's routing: due later than now() is scheduled, else pending.
  pending boolean := due <= now();
  -- {{schema}} is the quoted name; the channels carry the bare one (Db.channels).
  schema_name text := btrim('{{schema}}', '"');
BEGIN
  -- In the library's order: new Task's type and payload, then the options
  -- (validateOptions), then the payload's size (toRecord).
  field := 'type';
  rule := {{schema}}.enqueue_text_rule(enqueue.type, 100);
  IF rule IS NULL AND jsonb_path_exists(body, 'strict $.**{65}') THEN
    field := 'payload';
    rule := 'nesting depth exceeds the limit of 64 levels';
  END IF;
  IF rule IS NULL THEN
    field := 'queue';
    rule := {{schema}}.enqueue_name_rule(enqueue.queue, 100, false);
  END IF;
  IF rule IS NULL AND (enqueue.max_retry IS NULL OR enqueue.max_retry NOT BETWEEN 0 AND 1000) THEN
    field := 'max_retry';
    rule := format('must be an integer in [0, 1000] (got %s)', coalesce(enqueue.max_retry::text, 'NULL'));
  END IF;
  IF rule IS NULL AND enqueue.task_id IS NOT NULL THEN
    field := 'task_id';
    rule := {{schema}}.enqueue_name_rule(enqueue.task_id, 128, true);
  END IF;
  IF rule IS NULL AND NOT coalesce(enqueue.process_at BETWEEN '0001-01-01 00:00:00+00' AND '9999-12-31 23:59:59.999+00', true) THEN
    field := 'process_at';
    rule := format('must be a time in years 1–9999 (got %s)', enqueue.process_at);
  END IF;
  IF rule IS NULL AND (enqueue.priority IS NULL OR enqueue.priority NOT BETWEEN -100 AND 100) THEN
    field := 'priority';
    rule := format('must be an integer in [-100, 100] (got %s)', coalesce(enqueue.priority::text, 'NULL'));
  END IF;
  IF rule IS NULL AND enqueue.concurrency_key IS NOT NULL THEN
    field := 'concurrency_key';
    rule := {{schema}}.enqueue_text_rule(enqueue.concurrency_key, 200);
  END IF;
  IF rule IS NULL AND body IS NOT NULL THEN
    body_bytes := octet_length(body::text);
    IF body_bytes > 1048576 THEN
      -- The library measures JSON.stringify's text, UTF-8: jsonb's has a space after
      -- each ':' and ',' of an object or array, which that one has not.
      SELECT body_bytes - coalesce(sum(CASE jsonb_typeof(v)
                                         WHEN 'object' THEN greatest(2 * (SELECT count(*) FROM jsonb_object_keys(v)) - 1, 0)
                                         WHEN 'array' THEN greatest(jsonb_array_length(v) - 1, 0) END), 0)
      INTO body_bytes FROM jsonb_path_query(body, 'strict $.**') AS v;
    END IF;
    IF body_bytes > 1048576 THEN
      field := 'payload';
      rule := format('is %s bytes as JSON; the limit is 1048576', body_bytes);
    END IF;
  END IF;
  IF rule IS NOT NULL THEN
    RAISE EXCEPTION USING ERRCODE = 'invalid_parameter_value', MESSAGE = format('pgasynq: invalid %s: %s', field, rule), COLUMN = field;
  END IF;

  -- A UUID version 7 (the library's timeOrderedUuid()): the time in ms first, so the
  -- ids of one moment sit together in the (queue, id) index.
  new_id := coalesce(enqueue.task_id, encode(
    set_bit(set_bit(overlay(uuid_send(gen_random_uuid())
                            PLACING substring(int8send(floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint) FROM 3)
                            FROM 1 FOR 6), 52, 1), 53, 1), 'hex')::uuid::text);
  INSERT INTO {{schema}}.queues (name) VALUES (enqueue.queue) ON CONFLICT DO NOTHING;
  -- A transaction id before a position is drawn: the claim cursor (server/cursor.ts)
  -- relies on every transaction that draws one having an id already.
  PERFORM pg_current_xact_id();
  new_seq := nextval('{{schema}}.task_seq');
  INSERT INTO {{schema}}.task_inputs (seq, queue, id, type, payload, headers, max_retry, timeout, retention)
  VALUES (new_seq, enqueue.queue, new_id, enqueue.type, body, '{}', enqueue.max_retry, interval '30 minutes', interval '0')
  ON CONFLICT ON CONSTRAINT task_inputs_queue_id_key DO NOTHING;
  IF NOT FOUND THEN
    RAISE EXCEPTION USING ERRCODE = 'unique_violation',
      MESSAGE = format('pgasynq: task ID conflicts with another task: id=%s in queue "%s"', new_id, enqueue.queue),
      DETAIL = format('Key (queue, id)=(%s, %s) already exists.', enqueue.queue, new_id),
      COLUMN = 'task_id', CONSTRAINT = 'task_inputs_queue_id_key', TABLE = 'task_inputs', SCHEMA = schema_name;
  END IF;
  -- A pending task's position is its own seq; a pending run_at is when it became pending.
  INSERT INTO {{schema}}.task_states (seq, queue, state, pending_seq, run_at, priority, concurrency_key)
  VALUES (new_seq, enqueue.queue, CASE WHEN pending THEN 'pending' ELSE 'scheduled' END,
          CASE WHEN pending THEN new_seq END, CASE WHEN pending THEN now() ELSE due END,
          enqueue.priority, enqueue.concurrency_key);
  PERFORM pg_notify(schema_name || CASE WHEN pending THEN '_tasks' ELSE '_delayed' END, enqueue.queue);
  RETURN new_id;
END
$$;

-- Makes each queue of `names` known (a row in queues, unpaused and without
-- limits when new; a known queue is left as it is), after checking every name
-- as enqueue() does: 22023 naming the field `queue`, and nothing written.
CREATE FUNCTION {{schema}}.ensure_queues(names text[]) RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  name text;
  rule text;
BEGIN
  IF names IS NULL OR cardinality(names) > 1000 THEN
    RAISE EXCEPTION USING ERRCODE = 'invalid_parameter_value', COLUMN = 'queue',
      MESSAGE = format('pgasynq: invalid queue: names must be an array of at most 1000 (got %s)', coalesce(cardinality(names)::text, 'NULL'));
  END IF;
  FOREACH name IN ARRAY names LOOP
    rule := {{schema}}.enqueue_name_rule(name, 100, false);
    IF rule IS NOT NULL THEN
      RAISE EXCEPTION USING ERRCODE = 'invalid_parameter_value', COLUMN = 'queue', MESSAGE = format('pgasynq: invalid queue: %s', rule);
    END IF;
  END LOOP;
  -- In name order, as every statement that locks several queues rows.
  INSERT INTO {{schema}}.queues (name) SELECT DISTINCT n FROM unnest(names) AS n ORDER BY n ON CONFLICT DO NOTHING;
END
$$;

ALTER FUNCTION {{schema}}.claim_limited(text[], integer[], integer, text, float8, timestamptz, text) SET search_path = pg_catalog, pg_temp;
ALTER FUNCTION {{schema}}.queue_counts(text) SET search_path = pg_catalog, pg_temp;

-- Nobody calls them until the roles script grants it (enqueue_tasks: the producer
-- and the worker); check_task_rows() is theirs, granted to no one.
REVOKE EXECUTE ON FUNCTION {{schema}}.enqueue_tasks(json, timestamptz, boolean) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION {{schema}}.check_task_rows(json) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION {{schema}}.ensure_queues(text[]) FROM PUBLIC;

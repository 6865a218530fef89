-- pgasynq 0012: each transition of a task written once.
-- {{schema}} is replaced by the quoted schema name before this file runs.
--
-- task_position() draws every place in the pending order, so the claim
-- cursor's rule (a transaction id before a place) is kept in one spot rather
-- than by hand in eight. The Inspector's moves (run, archive, delete, a new
-- payload, a cancellation) become the owner's functions, as every other write
-- of a task became in 0010: the Inspector calls them, and the tasks view's
-- trigger calls the same ones for a repair in SQL instead of restating their
-- rules (it only maps the view's columns onto the two tables). A delete
-- through the view now releases the task's unique lock, as the Inspector's
-- always did. The other bodies are 0011's, but for task_position().

-- A place in the pending order: a new task's seq (a pending one's position is
-- its own seq), or the position of a task that becomes pending. Every place is
-- drawn here (test/schema-file.test.ts fails on any other nextval of task_seq),
-- because of the claim cursor's one rule (server/cursor.ts): a transaction
-- takes its id before it draws a place, so that a place still uncommitted is
-- always covered by a transaction the cursor waits for. A plain SQL function
-- (no SET, no SECURITY DEFINER) so that the planner inlines it: a bulk enqueue
-- draws tens of thousands in one statement. It runs as its caller, the owner's
-- functions; EXECUTE is revoked from PUBLIC.
CREATE FUNCTION {{schema}}.task_position() RETURNS bigint
LANGUAGE sql VOLATILE
AS $$ SELECT CASE WHEN pg_catalog.pg_current_xact_id() IS NOT NULL THEN pg_catalog.nextval('{{schema}}.task_seq') END $$;
REVOKE EXECUTE ON FUNCTION {{schema}}.task_position() FROM PUBLIC;

-- The Inspector's moves (asynq's RunTask, ArchiveTask and DeleteTask, and
-- their …All forms), which the tasks view's trigger makes too when a repair in
-- SQL asks for one, so each rule is written once. Each takes tasks by seq,
-- locks them in seq order (as every batch does: two cannot deadlock), acts on
-- those still in one of from_states, and returns every task it found, with the
-- state it found it in (under the lock) and whether it acted. The owner's,
-- granted to the admin role (broker/roles.ts).

-- Run: pending at the back of its queue (positions drawn after the sort, so a
-- batch keeps its order), pending from now (run_at: the queue's latency counts
-- from it), and the queue's servers woken. A pending task is left as it is.
CREATE FUNCTION {{schema}}.run_tasks(seqs bigint[], from_states text[])
RETURNS TABLE (seq bigint, found text, done boolean)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  now_at timestamptz := {{schema}}.task_now();
BEGIN
  RETURN QUERY
  WITH locked AS MATERIALIZED (
    SELECT s.seq, s.state FROM {{schema}}.task_states s WHERE s.seq = ANY (seqs) ORDER BY s.seq FOR UPDATE
  ),
  moved AS (
    UPDATE {{schema}}.task_states s
    SET state = 'pending', pending_seq = d.position, run_at = now_at, updated_at = now_at
    FROM (SELECT l.seq, {{schema}}.task_position() AS position
          FROM (SELECT l.seq FROM locked l WHERE l.state = ANY (from_states) AND l.state <> 'pending' ORDER BY l.seq) l) d
    WHERE s.seq = d.seq
    RETURNING s.seq, s.queue
  ),
  notified AS (
    SELECT pg_notify({{schema}}.task_channel('_tasks'), q.queue) FROM (SELECT DISTINCT m.queue FROM moved m) q
  )
  SELECT l.seq, l.state, m.seq IS NOT NULL FROM locked l LEFT JOIN moved m ON m.seq = l.seq
  WHERE (SELECT count(*) FROM notified) >= 0;
END
$$;
REVOKE EXECUTE ON FUNCTION {{schema}}.run_tasks(bigint[], text[]) FROM PUBLIC;

-- Archive: archived from now (run_at: the archive time, which trim_archive()
-- counts from), out of the pending order, its error and last failure kept. Its dependents settle through
-- task_states_finished. An archived task is left as it is.
CREATE FUNCTION {{schema}}.archive_tasks(seqs bigint[], from_states text[])
RETURNS TABLE (seq bigint, found text, done boolean)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  now_at timestamptz := {{schema}}.task_now();
BEGIN
  RETURN QUERY
  WITH locked AS MATERIALIZED (
    SELECT s.seq, s.state FROM {{schema}}.task_states s WHERE s.seq = ANY (seqs) ORDER BY s.seq FOR UPDATE
  ),
  moved AS (
    UPDATE {{schema}}.task_states s
    SET state = 'archived', pending_seq = NULL, run_at = now_at, updated_at = now_at
    FROM locked l
    WHERE s.seq = l.seq AND l.state = ANY (from_states) AND l.state <> 'archived'
    RETURNING s.seq
  )
  SELECT l.seq, l.state, m.seq IS NOT NULL FROM locked l LEFT JOIN moved m ON m.seq = l.seq;
END
$$;
REVOKE EXECUTE ON FUNCTION {{schema}}.archive_tasks(bigint[], text[]) FROM PUBLIC;

-- Delete: both rows of the task, and the unique lock it holds (asynq's
-- DeleteTask releases it). Its dependents count it as failed (task_states_deleted).
CREATE FUNCTION {{schema}}.delete_tasks(seqs bigint[], from_states text[])
RETURNS TABLE (seq bigint, found text, done boolean)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
  RETURN QUERY
  WITH locked AS MATERIALIZED (
    SELECT s.seq, s.state FROM {{schema}}.task_states s WHERE s.seq = ANY (seqs) ORDER BY s.seq FOR UPDATE
  ),
  gone AS (
    DELETE FROM {{schema}}.task_states s USING locked l
    WHERE s.seq = l.seq AND l.state = ANY (from_states)
    RETURNING s.seq
  ),
  inputs AS (
    DELETE FROM {{schema}}.task_inputs i WHERE i.seq = ANY (ARRAY(SELECT g.seq FROM gone g))
    RETURNING i.queue, i.id, i.unique_key
  ),
  unlocked AS (
    DELETE FROM {{schema}}.unique_locks u USING inputs i
    WHERE u.queue = i.queue AND u.key = i.unique_key AND u.task_id = i.id
    RETURNING 1
  )
  SELECT l.seq, l.state, g.seq IS NOT NULL FROM locked l LEFT JOIN gone g ON g.seq = l.seq
  WHERE (SELECT count(*) FROM unlocked) >= 0;
END
$$;
REVOKE EXECUTE ON FUNCTION {{schema}}.delete_tasks(bigint[], text[]) FROM PUBLIC;

-- A scheduled task's new payload (asynq's UpdateTaskPayload); its unique key
-- is not recomputed, as in asynq. Returns the state found, and whether it acted.
CREATE FUNCTION {{schema}}.set_payload(task_seq bigint, new_payload jsonb, new_payload_bytes bytea)
RETURNS TABLE (found text, done boolean)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  now_at timestamptz := {{schema}}.task_now();
  was text;
BEGIN
  SELECT s.state INTO was FROM {{schema}}.task_states s WHERE s.seq = task_seq FOR UPDATE;
  IF was = 'scheduled' THEN
    UPDATE {{schema}}.task_inputs i SET payload = new_payload, payload_bytes = new_payload_bytes WHERE i.seq = task_seq;
    UPDATE {{schema}}.task_states s SET updated_at = now_at WHERE s.seq = task_seq;
  END IF;
  RETURN QUERY SELECT was, coalesce(was = 'scheduled', false);
END
$$;
REVOKE EXECUTE ON FUNCTION {{schema}}.set_payload(bigint, jsonb, bytea) FROM PUBLIC;

-- Marks every active task with this id (in any queue) for cancellation and,
-- when one was marked, sends the id on the cancel channel: servers abort its
-- handler at the notification, or at their next heartbeat if it was lost.
-- Returns how many it marked.
CREATE FUNCTION {{schema}}.request_cancel(task_id text)
RETURNS integer
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  now_at timestamptz := {{schema}}.task_now();
  marked integer;
BEGIN
  UPDATE {{schema}}.task_states s SET cancel_requested = true, updated_at = now_at
  FROM {{schema}}.task_inputs i
  WHERE i.id = task_id AND s.seq = i.seq AND s.state = 'active' AND s.lease_owner IS NOT NULL;
  GET DIAGNOSTICS marked = ROW_COUNT;
  IF marked > 0 THEN
    PERFORM pg_notify({{schema}}.task_channel('_cancel'), task_id);
  END IF;
  RETURN marked;
END
$$;
REVOKE EXECUTE ON FUNCTION {{schema}}.request_cancel(text) FROM PUBLIC;

CREATE OR REPLACE FUNCTION {{schema}}.enqueue(type text, payload jsonb DEFAULT NULL::jsonb, queue text DEFAULT 'default'::text, task_id text DEFAULT NULL::text, process_at timestamp with time zone DEFAULT NULL::timestamp with time zone, max_retry integer DEFAULT 25, priority integer DEFAULT 0, concurrency_key text DEFAULT NULL::text)
 RETURNS text
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $function$
DECLARE
  -- The clock seam (task_now()): read once, as now() is one instant per transaction.
  now_at timestamptz := {{schema}}.task_now();
  -- A JSON null is no payload, as the library stores it.
  body jsonb := nullif(enqueue.payload, 'null'::jsonb);
  body_bytes bigint;
  field text;
  rule text;
  new_id text;
  new_seq bigint;
  due timestamptz := coalesce(enqueue.process_at, now_at);
  -- asynq's routing: due later than now_at is scheduled, else pending.
  pending boolean := due <= now_at;
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
  new_seq := {{schema}}.task_position();
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
          CASE WHEN pending THEN new_seq END, CASE WHEN pending THEN now_at ELSE due END,
          enqueue.priority, enqueue.concurrency_key);
  PERFORM pg_notify(schema_name || CASE WHEN pending THEN '_tasks' ELSE '_delayed' END, enqueue.queue);
  RETURN new_id;
END
$function$;
REVOKE EXECUTE ON FUNCTION {{schema}}.enqueue(type text, payload jsonb, queue text, task_id text, process_at timestamp with time zone, max_retry integer, priority integer, concurrency_key text) FROM PUBLIC;

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

CREATE OR REPLACE FUNCTION {{schema}}.forward_due(batch_size integer, shift_ms double precision)
 RETURNS integer
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $function$
DECLARE
  v_now timestamptz := {{schema}}.task_clock(shift_ms);
  moved_count integer;
BEGIN
  WITH moved AS (
    UPDATE {{schema}}.task_states s
    SET state = CASE WHEN s.group_key IS NULL THEN 'pending' ELSE 'aggregating' END,
        run_at = CASE WHEN s.group_key IS NULL THEN v_now END,
        pending_seq = CASE WHEN s.group_key IS NULL THEN d.position END, updated_at = v_now
    FROM (
      -- Positions drawn after the sort: tasks due first go first.
      SELECT x.seq, {{schema}}.task_position() AS position FROM (
        SELECT seq FROM {{schema}}.task_states
        WHERE state IN ('scheduled', 'retry') AND run_at <= v_now
        ORDER BY run_at LIMIT batch_size FOR UPDATE SKIP LOCKED
      ) x
    ) d
    WHERE s.seq = d.seq
    RETURNING s.queue, s.state
  ),
  notified AS (
    SELECT pg_notify({{schema}}.task_channel('_tasks'), queue) FROM (SELECT DISTINCT queue FROM moved WHERE state = 'pending') q
  )
  SELECT count(*)::int INTO moved_count FROM moved WHERE (SELECT count(*) FROM notified) >= 0;
  RETURN moved_count;
END
$function$;
REVOKE EXECUTE ON FUNCTION {{schema}}.forward_due(batch_size integer, shift_ms double precision) FROM PUBLIC;

CREATE OR REPLACE FUNCTION {{schema}}.replace_tasks(tasks json, now_at timestamp with time zone, schema_name text)
 RETURNS TABLE(ord bigint, replaced boolean)
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $function$
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
                           ELSE {{schema}}.task_position() END,
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
$function$;
REVOKE EXECUTE ON FUNCTION {{schema}}.replace_tasks(tasks json, now_at timestamp with time zone, schema_name text) FROM PUBLIC;

CREATE OR REPLACE FUNCTION {{schema}}.requeue_tasks(seqs bigint[], tokens uuid[], shift_ms double precision)
 RETURNS SETOF bigint
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $function$
DECLARE
  v_now timestamptz := {{schema}}.task_clock(shift_ms);
  v_at jsonb := {{schema}}.lease_batch(seqs, tokens);
BEGIN
  RETURN QUERY
  WITH requeued AS (
    UPDATE {{schema}}.task_states s
    SET state = 'pending', run_at = h.front_at - interval '1 microsecond', pending_seq = h.front - h.n + h.rank - 1,
        updated_at = v_now
    FROM (
      SELECT l.seq, row_number() OVER w AS rank, count(*) OVER (PARTITION BY l.queue) AS n,
             coalesce((SELECT min(p.pending_seq) FROM {{schema}}.task_states p WHERE p.queue = l.queue AND p.state = 'pending'),
                      {{schema}}.task_position()) AS front,
             coalesce((SELECT min(p.run_at) FROM {{schema}}.task_states p WHERE p.queue = l.queue AND p.state = 'pending'),
                      v_now) AS front_at
      FROM (SELECT x.seq, x.queue FROM {{schema}}.task_states x
            WHERE x.seq = ANY(seqs) AND x.state = 'active' AND x.lease_token = tokens[(v_at ->> x.seq::text)::int]
            ORDER BY x.seq FOR UPDATE) l
      WINDOW w AS (PARTITION BY l.queue ORDER BY l.seq)
    ) h
    WHERE s.seq = h.seq
    RETURNING s.seq, s.queue
  ),
  notified AS (
    SELECT pg_notify({{schema}}.task_channel('_sweep'), r.queue) FROM (SELECT DISTINCT queue FROM requeued) r
  )
  SELECT r.seq FROM requeued r WHERE (SELECT count(*) FROM notified) >= 0;
END
$function$;
REVOKE EXECUTE ON FUNCTION {{schema}}.requeue_tasks(seqs bigint[], tokens uuid[], shift_ms double precision) FROM PUBLIC;

CREATE OR REPLACE FUNCTION {{schema}}.settle_completed(deps bigint[], res jsonb[], res_bytes bytea[], schema_name text)
 RETURNS void
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $function$
DECLARE
  -- The clock seam (task_now()): read once, as now() is one instant per transaction.
  now_at timestamptz := {{schema}}.task_now();
  n integer;
BEGIN
  -- A release commits durably, whatever the server's sessions do (they commit
  -- asynchronously: a lost completion only runs a task again). A crash that erased a
  -- completion after its dependent had been released and started would release the
  -- dependent a second time, its first run having seen results that are gone.
  -- Local to this transaction; only completions of tasks with dependents pay for it.
  PERFORM set_config('synchronous_commit', 'on', true);
  PERFORM 1 FROM {{schema}}.task_states s
  WHERE s.seq IN (SELECT t.dependent_seq FROM {{schema}}.task_dependencies t WHERE t.dependency_seq = ANY (deps) AND t.outcome IS NULL)
  ORDER BY s.seq
  FOR UPDATE;
  WITH done AS (
    SELECT * FROM unnest(deps, res, res_bytes) AS d(seq, result, result_bytes)
  ),
  settled AS (
    UPDATE {{schema}}.task_dependencies t SET outcome = 'completed', result = done.result, result_bytes = done.result_bytes
    FROM done
    WHERE t.dependency_seq = done.seq AND t.outcome IS NULL
    RETURNING t.dependent_seq
  ),
  counts AS (
    SELECT dependent_seq, count(*)::int AS n FROM settled GROUP BY dependent_seq
  ),
  -- In SET, s.state and s.waiting_for are the row as locked.
  moved AS (
    UPDATE {{schema}}.task_states s
    SET waiting_for = s.waiting_for - c.n,
        state = CASE WHEN s.state <> 'waiting' OR s.waiting_for > c.n THEN s.state
                     WHEN s.run_at > now_at THEN 'scheduled' ELSE 'pending' END,
        pending_seq = CASE WHEN s.state = 'waiting' AND s.waiting_for = c.n AND s.run_at <= now_at
                           THEN {{schema}}.task_position() ELSE s.pending_seq END,
        run_at = CASE WHEN s.state = 'waiting' AND s.waiting_for = c.n AND s.run_at <= now_at THEN now_at ELSE s.run_at END,
        updated_at = CASE WHEN s.state = 'waiting' AND s.waiting_for = c.n THEN now_at ELSE s.updated_at END
    FROM counts c
    WHERE s.seq = c.dependent_seq
    RETURNING s.queue, s.state, s.waiting_for
  ),
  notified AS (
    SELECT pg_notify(schema_name || CASE WHEN m.state = 'pending' THEN '_tasks' ELSE '_delayed' END, m.queue)
    FROM (SELECT DISTINCT state, queue FROM moved WHERE waiting_for = 0 AND state IN ('pending', 'scheduled')) m
  )
  SELECT count(*) INTO n FROM notified;
END
$function$;
REVOKE EXECUTE ON FUNCTION {{schema}}.settle_completed(deps bigint[], res jsonb[], res_bytes bytea[], schema_name text) FROM PUBLIC;

CREATE OR REPLACE FUNCTION {{schema}}.settle_failed(dependency bigint, schema_name text)
 RETURNS void
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $function$
DECLARE
  -- The clock seam (task_now()): read once, as now() is one instant per transaction.
  now_at timestamptz := {{schema}}.task_now();
  work bigint[] := ARRAY[dependency];
  n integer := 1;
  e record;
  d record;
BEGIN
  -- Durable, as settle_completed(): `run` dependents are released here.
  PERFORM set_config('synchronous_commit', 'on', true);
  WHILE n <= cardinality(work) LOOP
    FOR e IN
      SELECT t.dependent_seq, t.on_failure, t.dependency_queue, t.dependency_id
      FROM {{schema}}.task_dependencies t
      WHERE t.dependency_seq = work[n] AND t.outcome IS NULL
      ORDER BY t.dependent_seq
      FOR UPDATE
    LOOP
      UPDATE {{schema}}.task_dependencies t SET outcome = 'failed'
      WHERE t.dependent_seq = e.dependent_seq AND t.dependency_seq = work[n];
      SELECT s.seq, s.queue, s.state, s.waiting_for, s.run_at, s.has_dependents INTO d
      FROM {{schema}}.task_states s WHERE s.seq = e.dependent_seq
      FOR UPDATE;
      IF d.state <> 'waiting' OR d.waiting_for > 1 AND e.on_failure = 'run' THEN
        -- Still waiting for others, or no longer waiting at all (run by hand, archived).
        UPDATE {{schema}}.task_states s SET waiting_for = s.waiting_for - 1 WHERE s.seq = d.seq;
      ELSIF e.on_failure = 'archive' THEN
        -- has_dependents cleared: its own dependents are settled by this loop,
        -- not by the trigger this update would otherwise fire.
        UPDATE {{schema}}.task_states s
        SET state = 'archived', waiting_for = s.waiting_for - 1, run_at = now_at, last_failed_at = now_at,
            has_dependents = false, updated_at = now_at,
            error_msg = 'dependency ' || e.dependency_queue || '/' || e.dependency_id || ' failed'
        WHERE s.seq = d.seq;
        IF d.has_dependents THEN
          work := work || d.seq;
        END IF;
      ELSIF d.run_at > now_at THEN
        UPDATE {{schema}}.task_states s SET state = 'scheduled', waiting_for = 0, updated_at = now_at WHERE s.seq = d.seq;
        PERFORM pg_notify(schema_name || '_delayed', d.queue);
      ELSE
        UPDATE {{schema}}.task_states s
        SET state = 'pending', waiting_for = 0, pending_seq = {{schema}}.task_position(), run_at = now_at, updated_at = now_at
        WHERE s.seq = d.seq;
        PERFORM pg_notify(schema_name || '_tasks', d.queue);
      END IF;
    END LOOP;
    n := n + 1;
  END LOOP;
END
$function$;
REVOKE EXECUTE ON FUNCTION {{schema}}.settle_failed(dependency bigint, schema_name text) FROM PUBLIC;

-- Writes `fields` (a view row's columns as JSON, by name) into the tables
-- that have them: task_inputs and task_states, each once, whatever columns a
-- later migration adds to them and to the view. Inserting, the columns not
-- given take their defaults; updating, the task `task_seq` keeps the others.
-- For tasks_write(): the owner's, and no one else's to call.
CREATE FUNCTION {{schema}}.write_task_columns(task_seq bigint, fields jsonb, inserting boolean) RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  tbl regclass;
  cols text;
BEGIN
  FOREACH tbl IN ARRAY ARRAY['{{schema}}.task_inputs'::regclass, '{{schema}}.task_states'::regclass] LOOP
    SELECT string_agg(quote_ident(a.attname), ', ' ORDER BY a.attnum) INTO cols
    FROM pg_attribute a
    WHERE a.attrelid = tbl AND a.attnum > 0 AND NOT a.attisdropped AND fields ? a.attname::text
      AND (inserting OR a.attname <> 'seq');
    IF cols IS NULL THEN
      CONTINUE;
    END IF;
    IF inserting THEN
      EXECUTE format('INSERT INTO %s (%s) SELECT %s FROM jsonb_populate_record(NULL::%s, $1)', tbl, cols, cols, tbl) USING fields;
    ELSE
      EXECUTE format('UPDATE %s t SET (%s) = (SELECT %s FROM jsonb_populate_record(NULL::%s, $1)) WHERE t.seq = $2', tbl, cols, cols, tbl)
        USING fields, task_seq;
    END IF;
  END LOOP;
END
$$;
REVOKE EXECUTE ON FUNCTION {{schema}}.write_task_columns(bigint, jsonb, boolean) FROM PUBLIC;

-- The view's writes, for repairs in SQL: they map the view's columns onto the
-- two tables (write_task_columns(), every column whatever migrations add) and
-- make the Inspector's moves with the Inspector's functions, restating none
-- of their rules.
CREATE OR REPLACE FUNCTION {{schema}}.tasks_write()
 RETURNS trigger
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $function$
DECLARE
  -- The clock seam (task_now()): read once, as now() is one instant per transaction.
  now_at timestamptz := {{schema}}.task_now();
  own_seq boolean := false;
  cur {{schema}}.task_states;
  -- The columns the statement sets: an INSERT's that are not NULL, an UPDATE's that it changes.
  given jsonb;
  move text;
BEGIN
  IF TG_OP <> 'INSERT' THEN
    -- OLD is the view's row as of the statement's snapshot, and nothing has
    -- locked it. Lock the state row, and write only if the task is still in
    -- that state under the same lease: what PostgreSQL's re-check of an
    -- UPDATE's or DELETE's row of a table did in v1 (every statement on the
    -- view filters on the state). A task that moved on since (claimed,
    -- failed, completed) or is gone is left as it is, and not counted.
    SELECT s.* INTO cur FROM {{schema}}.task_states s WHERE s.seq = OLD.seq FOR UPDATE;
    IF NOT FOUND OR cur.state IS DISTINCT FROM OLD.state OR cur.lease_token IS DISTINCT FROM OLD.lease_token THEN
      RETURN NULL;
    END IF;
  END IF;
  IF TG_OP = 'DELETE' THEN
    PERFORM {{schema}}.delete_tasks(ARRAY[OLD.seq], ARRAY[cur.state]);
    RETURN OLD;
  END IF;
  IF TG_OP = 'INSERT' THEN
    -- A new row's position, when pending, is its own seq as at enqueue; a seq given
    -- by hand gets a position of its own, at the back of the queue.
    IF NEW.seq IS NULL THEN
      NEW.seq := {{schema}}.task_position();
      own_seq := true;
    END IF;
    IF NEW.state = 'pending' THEN
      NEW.pending_seq := coalesce(NEW.pending_seq, CASE WHEN own_seq THEN NEW.seq ELSE {{schema}}.task_position() END);
      NEW.run_at := coalesce(NEW.run_at, now_at);
    END IF;
    NEW.enqueued_at := coalesce(NEW.enqueued_at, now_at);
    NEW.updated_at := coalesce(NEW.updated_at, now_at);
    SELECT jsonb_object_agg(n.key, n.value) INTO given FROM jsonb_each(to_jsonb(NEW)) n WHERE n.value <> 'null';
    PERFORM {{schema}}.write_task_columns(NEW.seq, given, true);
    PERFORM pg_notify({{schema}}.task_channel('_tasks'), NEW.queue) WHERE NEW.state = 'pending';
  ELSE
    IF NEW.state IS DISTINCT FROM cur.state AND NEW.state IN ('pending', 'archived') THEN
      -- Run or archived: the Inspector's move (run_tasks(), archive_tasks()), made
      -- after the statement's other columns are written.
      move := NEW.state;
      NEW.state := OLD.state;
    ELSIF NEW.state IS DISTINCT FROM cur.state AND cur.state = 'pending' THEN
      -- Out of the pending order (a claim keeps the place of the task it makes active: not a repair's concern).
      NEW.pending_seq := NULL;
    END IF;
    -- A column the statement did not set keeps its current value, not the
    -- snapshot's: a heartbeat's lease_expires_at, a result written since.
    SELECT coalesce(jsonb_object_agg(n.key, n.value), '{}') INTO given
    FROM jsonb_each(to_jsonb(NEW)) n WHERE n.value IS DISTINCT FROM to_jsonb(OLD) -> n.key;
    PERFORM {{schema}}.write_task_columns(OLD.seq, given, false);
    IF move = 'pending' THEN
      PERFORM {{schema}}.run_tasks(ARRAY[OLD.seq], ARRAY[cur.state]);
    ELSIF move = 'archived' THEN
      PERFORM {{schema}}.archive_tasks(ARRAY[OLD.seq], ARRAY[cur.state]);
    END IF;
    -- A position or a due time the statement gave wins over the move's.
    IF move IS NOT NULL AND given ?| ARRAY['pending_seq', 'run_at'] THEN
      PERFORM {{schema}}.write_task_columns(OLD.seq, given - ARRAY(SELECT k FROM jsonb_object_keys(given) k WHERE k NOT IN ('pending_seq', 'run_at')), false);
    END IF;
  END IF;
  -- So that INSERT … RETURNING and UPDATE … RETURNING show the row as stored.
  SELECT v.* INTO NEW FROM {{schema}}.tasks v WHERE v.seq = NEW.seq;
  -- A position chosen by hand, or a pending task moved to another priority, may be below
  -- the servers' claim cursors (one floor per priority): they start from the head.
  IF NEW.state = 'pending' AND (
       (NEW.pending_seq IS DISTINCT FROM (CASE WHEN TG_OP = 'UPDATE' AND OLD.state = 'pending' THEN OLD.pending_seq END)
        AND NEW.pending_seq < (SELECT CASE WHEN is_called THEN last_value ELSE last_value - 1 END FROM {{schema}}.task_seq))
       OR (TG_OP = 'UPDATE' AND OLD.state = 'pending' AND NEW.priority IS DISTINCT FROM OLD.priority)) THEN
    PERFORM pg_notify({{schema}}.task_channel('_sweep'), NEW.queue);
  END IF;
  RETURN NEW;
END
$function$;

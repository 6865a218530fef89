-- pgasynq 0012 down: 0011's bodies again, and the functions 0012 added gone.

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
      SELECT x.seq, nextval('{{schema}}.task_seq') AS position FROM (
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
                      nextval('{{schema}}.task_seq')) AS front,
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
                           THEN nextval('{{schema}}.task_seq') ELSE s.pending_seq END,
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
        SET state = 'pending', waiting_for = 0, pending_seq = nextval('{{schema}}.task_seq'), run_at = now_at, updated_at = now_at
        WHERE s.seq = d.seq;
        PERFORM pg_notify(schema_name || '_tasks', d.queue);
      END IF;
    END LOOP;
    n := n + 1;
  END LOOP;
END
$function$;
REVOKE EXECUTE ON FUNCTION {{schema}}.settle_failed(dependency bigint, schema_name text) FROM PUBLIC;

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
    DELETE FROM {{schema}}.task_states WHERE seq = OLD.seq;
    DELETE FROM {{schema}}.task_inputs WHERE seq = OLD.seq;
    RETURN OLD;
  END IF;
  -- A transaction id before any position is drawn (see the claim cursor, server/cursor.ts).
  PERFORM pg_current_xact_id();
  IF TG_OP = 'INSERT' AND NEW.seq IS NULL THEN
    NEW.seq := nextval('{{schema}}.task_seq');
    own_seq := true;
  END IF;
  -- Becoming pending without a position given: the back of the queue (a new
  -- row's position is its own seq, as at enqueue), and run_at now (now_at) unless the
  -- statement sets it: a pending run_at is when the task became pending (the
  -- queue's latency counts from it; v1 orders by it after a rollback).
  IF NEW.state = 'pending' AND (TG_OP = 'INSERT' OR OLD.state <> 'pending')
     AND (TG_OP = 'INSERT' OR NEW.pending_seq IS NOT DISTINCT FROM OLD.pending_seq) THEN
    IF TG_OP = 'INSERT' AND NEW.pending_seq IS NOT NULL THEN
      NULL;
    ELSIF own_seq THEN
      NEW.pending_seq := NEW.seq;
    ELSE
      NEW.pending_seq := nextval('{{schema}}.task_seq');
    END IF;
    IF TG_OP = 'INSERT' THEN
      NEW.run_at := coalesce(NEW.run_at, now_at);
    ELSIF NEW.run_at IS NOT DISTINCT FROM OLD.run_at THEN
      NEW.run_at := now_at;
    END IF;
  ELSIF NEW.state <> 'pending' THEN
    NEW.pending_seq := NULL;
  END IF;
  IF TG_OP = 'INSERT' THEN
    INSERT INTO {{schema}}.task_inputs (seq, queue, id, type, payload, payload_bytes, headers, max_retry, timeout,
                                        deadline, unique_key, retention, enqueued_at)
    VALUES (NEW.seq, NEW.queue, NEW.id,
            NEW.type, NEW.payload, NEW.payload_bytes, coalesce(NEW.headers, '{}'), coalesce(NEW.max_retry, 25),
            coalesce(NEW.timeout, '0'), NEW.deadline, NEW.unique_key, coalesce(NEW.retention, '0'),
            coalesce(NEW.enqueued_at, now_at))
    RETURNING seq, headers, max_retry, timeout, retention, enqueued_at
      INTO NEW.seq, NEW.headers, NEW.max_retry, NEW.timeout, NEW.retention, NEW.enqueued_at;
    INSERT INTO {{schema}}.task_states (seq, queue, state, pending_seq, run_at, retried, group_key, lease_owner,
                                        lease_expires_at, lease_token, started_at, cancel_requested, error_msg,
                                        last_failed_at, completed_at, result, result_bytes, updated_at, priority, concurrency_key)
    VALUES (NEW.seq, NEW.queue, NEW.state, NEW.pending_seq, NEW.run_at, coalesce(NEW.retried, 0), NEW.group_key,
            NEW.lease_owner, NEW.lease_expires_at, NEW.lease_token, NEW.started_at,
            coalesce(NEW.cancel_requested, false), NEW.error_msg, NEW.last_failed_at, NEW.completed_at, NEW.result,
            NEW.result_bytes, coalesce(NEW.updated_at, now_at), coalesce(NEW.priority, 0), NEW.concurrency_key)
    -- So that INSERT … RETURNING shows the row as stored.
    RETURNING retried, cancel_requested, updated_at, priority INTO NEW.retried, NEW.cancel_requested, NEW.updated_at, NEW.priority;
  ELSE
    IF (NEW.queue, NEW.id, NEW.type, NEW.payload::text, NEW.payload_bytes, NEW.headers::text, NEW.max_retry,
        NEW.timeout, NEW.deadline, NEW.unique_key, NEW.retention, NEW.enqueued_at, NEW.seq)
       IS DISTINCT FROM
       (OLD.queue, OLD.id, OLD.type, OLD.payload::text, OLD.payload_bytes, OLD.headers::text, OLD.max_retry,
        OLD.timeout, OLD.deadline, OLD.unique_key, OLD.retention, OLD.enqueued_at, OLD.seq) THEN
      UPDATE {{schema}}.task_inputs
      SET queue = NEW.queue, id = NEW.id, type = NEW.type, payload = NEW.payload, payload_bytes = NEW.payload_bytes,
          headers = NEW.headers, max_retry = NEW.max_retry, timeout = NEW.timeout, deadline = NEW.deadline,
          unique_key = NEW.unique_key, retention = NEW.retention, enqueued_at = NEW.enqueued_at
      WHERE seq = OLD.seq;
    END IF;
    -- A column the statement did not set keeps its current value, not the
    -- snapshot's: a heartbeat's lease_expires_at, a result written since.
    IF NEW.queue IS NOT DISTINCT FROM OLD.queue THEN NEW.queue := cur.queue; END IF;
    IF NEW.pending_seq IS NOT DISTINCT FROM OLD.pending_seq THEN NEW.pending_seq := cur.pending_seq; END IF;
    IF NEW.run_at IS NOT DISTINCT FROM OLD.run_at THEN NEW.run_at := cur.run_at; END IF;
    IF NEW.retried IS NOT DISTINCT FROM OLD.retried THEN NEW.retried := cur.retried; END IF;
    IF NEW.group_key IS NOT DISTINCT FROM OLD.group_key THEN NEW.group_key := cur.group_key; END IF;
    IF NEW.lease_owner IS NOT DISTINCT FROM OLD.lease_owner THEN NEW.lease_owner := cur.lease_owner; END IF;
    IF NEW.lease_expires_at IS NOT DISTINCT FROM OLD.lease_expires_at THEN NEW.lease_expires_at := cur.lease_expires_at; END IF;
    IF NEW.started_at IS NOT DISTINCT FROM OLD.started_at THEN NEW.started_at := cur.started_at; END IF;
    IF NEW.cancel_requested IS NOT DISTINCT FROM OLD.cancel_requested THEN NEW.cancel_requested := cur.cancel_requested; END IF;
    IF NEW.error_msg IS NOT DISTINCT FROM OLD.error_msg THEN NEW.error_msg := cur.error_msg; END IF;
    IF NEW.last_failed_at IS NOT DISTINCT FROM OLD.last_failed_at THEN NEW.last_failed_at := cur.last_failed_at; END IF;
    IF NEW.completed_at IS NOT DISTINCT FROM OLD.completed_at THEN NEW.completed_at := cur.completed_at; END IF;
    IF NEW.result IS NOT DISTINCT FROM OLD.result THEN NEW.result := cur.result; END IF;
    IF NEW.result_bytes IS NOT DISTINCT FROM OLD.result_bytes THEN NEW.result_bytes := cur.result_bytes; END IF;
    IF NEW.updated_at IS NOT DISTINCT FROM OLD.updated_at THEN NEW.updated_at := cur.updated_at; END IF;
    IF NEW.priority IS NOT DISTINCT FROM OLD.priority THEN NEW.priority := cur.priority; END IF;
    IF NEW.concurrency_key IS NOT DISTINCT FROM OLD.concurrency_key THEN NEW.concurrency_key := cur.concurrency_key; END IF;
    UPDATE {{schema}}.task_states
    SET queue = NEW.queue, state = NEW.state, pending_seq = NEW.pending_seq, run_at = NEW.run_at,
        retried = NEW.retried, group_key = NEW.group_key, lease_owner = NEW.lease_owner,
        lease_expires_at = NEW.lease_expires_at, lease_token = NEW.lease_token, started_at = NEW.started_at,
        cancel_requested = NEW.cancel_requested, error_msg = NEW.error_msg, last_failed_at = NEW.last_failed_at,
        completed_at = NEW.completed_at, result = NEW.result, result_bytes = NEW.result_bytes,
        updated_at = NEW.updated_at, priority = NEW.priority, concurrency_key = NEW.concurrency_key
    WHERE seq = OLD.seq;
  END IF;
  IF NEW.state = 'pending' AND (TG_OP = 'INSERT' OR OLD.state <> 'pending') THEN
    PERFORM pg_notify(TG_TABLE_SCHEMA || '_tasks', NEW.queue);
  END IF;
  -- A position chosen by hand, or a pending task moved to another priority, may be below
  -- the servers' claim cursors (one floor per priority): they start from the head.
  IF NEW.state = 'pending' AND (
       (NEW.pending_seq IS DISTINCT FROM (CASE WHEN TG_OP = 'UPDATE' AND OLD.state = 'pending' THEN OLD.pending_seq END)
        AND NEW.pending_seq < (SELECT CASE WHEN is_called THEN last_value ELSE last_value - 1 END FROM {{schema}}.task_seq))
       OR (TG_OP = 'UPDATE' AND OLD.state = 'pending' AND NEW.priority IS DISTINCT FROM OLD.priority)) THEN
    PERFORM pg_notify(TG_TABLE_SCHEMA || '_sweep', NEW.queue);
  END IF;
  RETURN NEW;
END
$function$;

DROP FUNCTION {{schema}}.write_task_columns(bigint, jsonb, boolean);
DROP FUNCTION {{schema}}.request_cancel(text);
DROP FUNCTION {{schema}}.set_payload(bigint, jsonb, bytea);
DROP FUNCTION {{schema}}.delete_tasks(bigint[], text[]);
DROP FUNCTION {{schema}}.archive_tasks(bigint[], text[]);
DROP FUNCTION {{schema}}.run_tasks(bigint[], text[]);
DROP FUNCTION {{schema}}.task_position();

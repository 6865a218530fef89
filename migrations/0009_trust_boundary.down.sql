-- Back to 0008: the roles write the tables again (rerun `pgasynq roles` after
-- migrating down), replace_tasks() and enqueue() as they were.
DROP FUNCTION {{schema}}.enqueue_tasks(json, timestamptz, boolean);
DROP FUNCTION {{schema}}.ensure_queues(text[]);
ALTER FUNCTION {{schema}}.claim_limited(text[], integer[], integer, text, float8, timestamptz, text) RESET search_path;
ALTER FUNCTION {{schema}}.queue_counts(text) RESET search_path;

-- replace_tasks() as 0007 made it.
CREATE OR REPLACE FUNCTION {{schema}}.replace_tasks(tasks json, now_at timestamptz, schema_name text)
RETURNS TABLE (ord bigint, replaced boolean)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  ords bigint[];
  states text[];
  n integer;
  taken integer := 0;
BEGIN
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
    SELECT pg_notify(schema_name || CASE WHEN m.state = 'pending' THEN '_tasks' ELSE '_delayed' END, m.queue)
    FROM (SELECT DISTINCT state, queue FROM moved WHERE state IN ('pending', 'scheduled')) m
  )
  SELECT count(*) INTO n FROM notified;
  RETURN QUERY SELECT o, true FROM unnest(ords) AS o;
END
$$;

-- enqueue() as 0008 made it.
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
  IF rule IS NULL AND enqueue.process_at IN ('infinity', '-infinity') THEN
    field := 'process_at';
    rule := format('must be a finite time (got %s)', enqueue.process_at);
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

DROP FUNCTION {{schema}}.check_task_rows(json);

-- pgasynq 0008: enqueue() in SQL, for a trigger, a psql session, a
-- database job: anything that writes to PostgreSQL and runs no Node.js.
-- {{schema}} is replaced by the quoted schema name before this file runs.
--
--   SELECT pgasynq.enqueue('order:confirm', jsonb_build_object('order', 42),
--                          queue => 'critical', priority => 10);
--
-- It writes what the library's enqueue writes (broker/enqueue.ts insertTasks)
-- with the library's defaults, and returns the task id:
--
--  * the same refusals, before anything is written: each a typed error,
--    SQLSTATE 22023 (invalid_parameter_value), the message the library's
--    ValidationError has (src/model/validate.ts, payload.ts) and the field
--    in the error's COLUMN, so a client reads which one without parsing
--    text. A task id already in the queue is SQLSTATE 23505, as the
--    library's TaskIdConflictError says it.
--  * the same rows: the task's inputs (timeout 30 min as the library's
--    DEFAULT_TIMEOUT_MS, retention 0, no headers), its state (pending, or
--    scheduled when process_at is later than now()), the queue registry.
--  * the same wake-up: NOTIFY on <schema>_tasks (pending) or
--    <schema>_delayed (scheduled), sent when the caller's transaction
--    commits, as any enqueue's.
--  * the same clock: the database's now(), the transaction's start.
--
-- The options are API.md's, plus concurrency_key (what a queue's
-- key_concurrency counts by). The others (timeout, deadline, unique,
-- retention, group, headers, dependsOn, replace, processIn, bytes payloads)
-- are the library's only.
--
-- SECURITY DEFINER, with EXECUTE for the producer role only (broker/roles.ts):
-- a role may enqueue through it without any privilege on the tables, and a
-- trigger on a user's table may call it as whoever writes that table. No
-- EXCEPTION block (a subtransaction per call): a trigger that enqueues for
-- each of a million rows would overflow every session's subtransaction
-- cache, and slow down the whole cluster's snapshots.

-- The length of text, and an index into it, as JavaScript counts them (UTF-16
-- code units: a character beyond U+FFFF is two), so that the limits and the
-- messages are the library's to the character.
CREATE FUNCTION {{schema}}.utf16_length(value text) RETURNS integer
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE SET search_path = pg_catalog, pg_temp AS $$
  SELECT char_length(value) + (SELECT count(*) FROM regexp_matches(value, '[^\u0001-\uffff]', 'g'))::integer
$$;

-- validate.ts checkName(): queue names (max 100) and task ids (max 128, and
-- `id`: not starting with . : or -). NULL if `value` is fine, else the rule it breaks.
CREATE FUNCTION {{schema}}.enqueue_name_rule(value text, max integer, id boolean) RETURNS text
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  len integer;
  bad text;
BEGIN
  IF value IS NULL THEN
    RETURN 'must not be NULL';
  END IF;
  len := {{schema}}.utf16_length(value);
  IF len < 1 OR len > max THEN
    RETURN format('must be 1–%s characters (got %s)', max, len);
  END IF;
  IF id AND value ~ '^[.:-]' THEN
    RETURN format('must start with a letter, a digit or _ (found %s at index 0)', to_json(left(value, 1))::text);
  END IF;
  bad := substring(value FROM '[^A-Za-z0-9_.:-]');
  IF bad IS NOT NULL THEN
    -- The first bad character, as JSON.stringify shows it; JavaScript sees only the
    -- first half of a character beyond U+FFFF (a lone surrogate, which it escapes).
    -- Every character before it is ASCII: its index is its place.
    RETURN format('may contain only A–Z a–z 0–9 _ . : - (found %s at index %s)',
                  CASE WHEN ascii(bad) > 65535 THEN format('"\u%s"', to_hex(55296 + (ascii(bad) - 65536) / 1024))
                       ELSE to_json(bad)::text END,
                  strpos(value, bad) - 1);
  END IF;
  RETURN NULL;
END
$$;

-- validate.ts displayText(): task types (max 100) and concurrency keys (max 200),
-- not blank (as JavaScript's trim() sees it), no control characters (C0, DEL,
-- C1). PostgreSQL's text holds no lone surrogate and no NUL, the library's other
-- refusals. NULL if `value` is fine, else the rule it breaks.
CREATE FUNCTION {{schema}}.enqueue_text_rule(value text, max integer) RETURNS text
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  bad text;
BEGIN
  IF value IS NULL THEN
    RETURN 'must not be NULL';
  END IF;
  IF char_length(value) > max OR {{schema}}.utf16_length(value) > max
     OR value ~ '^[\t\n\v\f\r \u00a0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000\ufeff]*$' THEN
    RETURN format('must be 1–%s characters, not blank (got %s)', max, {{schema}}.utf16_length(value));
  END IF;
  bad := substring(value FROM '[\u0001-\u001f\u007f-\u009f]');
  IF bad IS NOT NULL THEN
    RETURN format('may not contain control characters (found U+%s at index %s)', lpad(to_hex(ascii(bad)), 4, '0'),
                  {{schema}}.utf16_length(substring(value FROM '^[^\u0001-\u001f\u007f-\u009f]*')));
  END IF;
  RETURN NULL;
END
$$;

CREATE FUNCTION {{schema}}.enqueue(type text, payload jsonb DEFAULT NULL, queue text DEFAULT 'default',
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

-- Nobody calls them until the roles script grants it (EXECUTE on enqueue: the
-- producer); the rule functions are enqueue's own, granted to no one.
REVOKE EXECUTE ON FUNCTION {{schema}}.enqueue(text, jsonb, text, text, timestamptz, integer, integer, text) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION {{schema}}.utf16_length(text) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION {{schema}}.enqueue_name_rule(text, integer, boolean) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION {{schema}}.enqueue_text_rule(text, integer) FROM PUBLIC;

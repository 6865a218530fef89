-- Back to 0006: no priorities, keys or limits; pending tasks keep their order within each priority.
DROP FUNCTION {{schema}}.claim_limited(text[], integer[], integer, text, float8, timestamptz, text);
DROP TABLE {{schema}}.queue_starts;
-- replace_tasks() as 0006 made it.
CREATE OR REPLACE FUNCTION {{schema}}.replace_tasks(tasks json, now_at timestamptz, schema_name text)
RETURNS TABLE (ord bigint, replaced boolean)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  ords bigint[];
  states text[];
  n integer;
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
           coalesce(x."at", now_at + x."in" * interval '1 millisecond', now_at) AS due
    FROM json_to_recordset(tasks) AS x(i text, q text, t text, p jsonb, b text, h jsonb, m int, "to" float8, d timestamptz,
                                       r float8, "at" timestamptz, "in" float8)
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
                           WHEN s.state = 'pending' THEN s.pending_seq
                           -- This transaction has an id (it locked the rows): see server/cursor.ts.
                           ELSE nextval('{{schema}}.task_seq') END,
        run_at = CASE WHEN s.state = 'waiting' OR r.due > now_at THEN r.due WHEN s.state = 'pending' THEN s.run_at ELSE now_at END,
        updated_at = now_at
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


ALTER TABLE {{schema}}.queues
  DROP COLUMN concurrency, DROP COLUMN key_concurrency, DROP COLUMN rate_limit, DROP COLUMN rate_interval_ms;

-- tasks_write() as 0004 made it.
CREATE OR REPLACE FUNCTION {{schema}}.tasks_write() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
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
  -- row's position is its own seq, as at enqueue), and run_at now() unless the
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
      NEW.run_at := coalesce(NEW.run_at, now());
    ELSIF NEW.run_at IS NOT DISTINCT FROM OLD.run_at THEN
      NEW.run_at := now();
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
            coalesce(NEW.enqueued_at, now()))
    RETURNING seq, headers, max_retry, timeout, retention, enqueued_at
      INTO NEW.seq, NEW.headers, NEW.max_retry, NEW.timeout, NEW.retention, NEW.enqueued_at;
    INSERT INTO {{schema}}.task_states (seq, queue, state, pending_seq, run_at, retried, group_key, lease_owner,
                                        lease_expires_at, lease_token, started_at, cancel_requested, error_msg,
                                        last_failed_at, completed_at, result, result_bytes, updated_at)
    VALUES (NEW.seq, NEW.queue, NEW.state, NEW.pending_seq, NEW.run_at, coalesce(NEW.retried, 0), NEW.group_key,
            NEW.lease_owner, NEW.lease_expires_at, NEW.lease_token, NEW.started_at,
            coalesce(NEW.cancel_requested, false), NEW.error_msg, NEW.last_failed_at, NEW.completed_at, NEW.result,
            NEW.result_bytes, coalesce(NEW.updated_at, now()))
    -- So that INSERT … RETURNING shows the row as stored.
    RETURNING retried, cancel_requested, updated_at INTO NEW.retried, NEW.cancel_requested, NEW.updated_at;
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
    UPDATE {{schema}}.task_states
    SET queue = NEW.queue, state = NEW.state, pending_seq = NEW.pending_seq, run_at = NEW.run_at,
        retried = NEW.retried, group_key = NEW.group_key, lease_owner = NEW.lease_owner,
        lease_expires_at = NEW.lease_expires_at, lease_token = NEW.lease_token, started_at = NEW.started_at,
        cancel_requested = NEW.cancel_requested, error_msg = NEW.error_msg, last_failed_at = NEW.last_failed_at,
        completed_at = NEW.completed_at, result = NEW.result, result_bytes = NEW.result_bytes,
        updated_at = NEW.updated_at
    WHERE seq = OLD.seq;
  END IF;
  IF NEW.state = 'pending' AND (TG_OP = 'INSERT' OR OLD.state <> 'pending') THEN
    PERFORM pg_notify(TG_TABLE_SCHEMA || '_tasks', NEW.queue);
  END IF;
  -- A position chosen by hand may be below the servers' claim cursors: they start from the head.
  IF NEW.state = 'pending' AND NEW.pending_seq IS DISTINCT FROM
     (CASE WHEN TG_OP = 'UPDATE' AND OLD.state = 'pending' THEN OLD.pending_seq END)
     AND NEW.pending_seq < (SELECT CASE WHEN is_called THEN last_value ELSE last_value - 1 END FROM {{schema}}.task_seq) THEN
    PERFORM pg_notify(TG_TABLE_SCHEMA || '_sweep', NEW.queue);
  END IF;
  RETURN NEW;
END
$$;

DROP VIEW {{schema}}.tasks;
CREATE VIEW {{schema}}.tasks AS
SELECT i.queue, i.id, i.type, i.payload, i.payload_bytes, i.headers, s.state, i.max_retry, s.retried,
       i.timeout, i.deadline, i.unique_key, s.group_key, i.retention, s.run_at, s.lease_owner,
       s.lease_expires_at, s.lease_token, s.started_at, s.cancel_requested, s.error_msg, s.last_failed_at,
       s.completed_at, s.result, s.result_bytes, i.enqueued_at, s.updated_at, i.seq, s.pending_seq,
       s.waiting_for
FROM {{schema}}.task_states s
JOIN {{schema}}.task_inputs i ON i.seq = s.seq;
CREATE TRIGGER tasks_write INSTEAD OF INSERT OR UPDATE OR DELETE ON {{schema}}.tasks
  FOR EACH ROW EXECUTE FUNCTION {{schema}}.tasks_write();

DROP INDEX {{schema}}.task_states_pending_key_idx;
DROP INDEX {{schema}}.task_states_pending_idx;
CREATE INDEX task_states_pending_idx ON {{schema}}.task_states (queue, pending_seq) WHERE state = 'pending';
ALTER TABLE {{schema}}.task_states DROP COLUMN priority, DROP COLUMN concurrency_key;

-- pgasynq 0006: enqueue with `replace` (debounce).
-- {{schema}} is replaced by the quoted schema name before this file runs.
--
-- replace_tasks() replaces, in place, the tasks named by `tasks` (the
-- enqueue's JSON rows, broker/enqueue.ts toJsonRows) that have not started:
-- type, payload, headers, options and due time. A task that stays pending
-- keeps its place in its queue; one that becomes pending goes to the back;
-- one due later becomes scheduled; a waiting task keeps waiting for its
-- dependencies, with the new due time for when they are done.
-- It returns, for each task of `tasks` that exists, its place in `tasks` and
-- whether it was replaced. If any had started or finished, it changes nothing
-- and returns those only, not replaced (the enqueue then fails with
-- TaskIdConflictError). The caller inserts the tasks that do not exist.
-- SECURITY DEFINER: a producer may replace a task that has not started
-- without any UPDATE privilege of its own (with one, it could rewrite any
-- task in any state).

CREATE FUNCTION {{schema}}.replace_tasks(tasks json, now_at timestamptz, schema_name text)
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

REVOKE EXECUTE ON FUNCTION {{schema}}.replace_tasks(json, timestamptz, text) FROM PUBLIC;

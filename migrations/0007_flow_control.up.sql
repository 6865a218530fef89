-- pgasynq 0007: flow control. Priority within a queue, and limits that every
-- server's claim obeys.
-- {{schema}} is replaced by the quoted schema name before this file runs.
--
--  * task_states.priority (−100…100, higher first) and concurrency_key (a
--    tenant, a customer: what a queue's key_concurrency bounds). A queue's
--    pending order is (priority DESC, pending_seq): FIFO within a priority.
--  * queues gains the limits: concurrency (active tasks of the queue, all
--    servers together), key_concurrency (active tasks per concurrency_key),
--    rate_limit starts per rate_interval_ms (a sliding window). NULL: none.
--  * A queue with a limit is claimed by claim_limited() below, never by the
--    plain claim (broker/claim.ts skips it). The claims of a limited queue
--    take turns on an advisory lock, and each counts what is active (and
--    what started within the window) afresh once it holds the lock: a
--    function's statements each take a new snapshot, so the counts include
--    every claim that went before. So the limits hold with any number of
--    servers; a task a server holds prefetched is active, and counts.
--  * queue_starts logs the starts of rate-limited queues, pruned as they
--    leave the window.

ALTER TABLE {{schema}}.task_states
  ADD COLUMN priority smallint NOT NULL DEFAULT 0,
  ADD COLUMN concurrency_key text,
  ADD CONSTRAINT tasks_priority_range CHECK (priority BETWEEN -100 AND 100);

DROP INDEX {{schema}}.task_states_pending_idx;
CREATE INDEX task_states_pending_idx ON {{schema}}.task_states (queue, priority DESC, pending_seq) WHERE state = 'pending';
-- Each key's head, for a key-limited claim whose first tasks are all of busy keys.
CREATE INDEX task_states_pending_key_idx ON {{schema}}.task_states (queue, concurrency_key, priority DESC, pending_seq)
  WHERE state = 'pending' AND concurrency_key IS NOT NULL;

ALTER TABLE {{schema}}.queues
  ADD COLUMN concurrency integer,
  ADD COLUMN key_concurrency integer,
  ADD COLUMN rate_limit integer,
  ADD COLUMN rate_interval_ms integer,
  ADD CONSTRAINT queues_concurrency_positive CHECK (concurrency > 0),
  ADD CONSTRAINT queues_key_concurrency_positive CHECK (key_concurrency > 0),
  ADD CONSTRAINT queues_rate_positive CHECK (rate_limit > 0 AND rate_interval_ms > 0),
  ADD CONSTRAINT queues_rate_whole CHECK ((rate_limit IS NULL) = (rate_interval_ms IS NULL));

CREATE TABLE {{schema}}.queue_starts (
  queue      text NOT NULL,
  started_at timestamptz NOT NULL,
  tasks      integer NOT NULL
);
CREATE INDEX queue_starts_queue_idx ON {{schema}}.queue_starts (queue, started_at);

CREATE OR REPLACE VIEW {{schema}}.tasks AS
SELECT i.queue, i.id, i.type, i.payload, i.payload_bytes, i.headers, s.state, i.max_retry, s.retried,
       i.timeout, i.deadline, i.unique_key, s.group_key, i.retention, s.run_at, s.lease_owner,
       s.lease_expires_at, s.lease_token, s.started_at, s.cancel_requested, s.error_msg, s.last_failed_at,
       s.completed_at, s.result, s.result_bytes, i.enqueued_at, s.updated_at, i.seq, s.pending_seq,
       s.waiting_for, s.priority, s.concurrency_key
FROM {{schema}}.task_states s
JOIN {{schema}}.task_inputs i ON i.seq = s.seq;

-- Writes through the view (0004's tasks_write()) with the priority and the concurrency key.
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
                                        last_failed_at, completed_at, result, result_bytes, updated_at, priority, concurrency_key)
    VALUES (NEW.seq, NEW.queue, NEW.state, NEW.pending_seq, NEW.run_at, coalesce(NEW.retried, 0), NEW.group_key,
            NEW.lease_owner, NEW.lease_expires_at, NEW.lease_token, NEW.started_at,
            coalesce(NEW.cancel_requested, false), NEW.error_msg, NEW.last_failed_at, NEW.completed_at, NEW.result,
            NEW.result_bytes, coalesce(NEW.updated_at, now()), coalesce(NEW.priority, 0), NEW.concurrency_key)
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
$$;

-- replace_tasks() (0006) with the priority and the concurrency key.
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

-- Claims from the limited queues `queue_names`, in that order, up to
-- `wanted[i]` tasks from each and `total` in all, within their limits; `now_at` is the claim's
-- database time (lease and deadline). Returns the claimed tasks, and for
-- each queue that its limits kept from giving all it was asked while tasks
-- were pending, one row with seq NULL: wait_ms is when the rate window
-- frees a start (NULL when only active tasks finishing can free a slot).
CREATE FUNCTION {{schema}}.claim_limited(queue_names text[], wanted integer[], total integer, owner text, lease_ms float8,
                                         now_at timestamptz, schema_name text)
RETURNS TABLE (queue text, seq bigint, pending_seq bigint, priority smallint, id text, type text, payload jsonb,
               payload_bytes bytea, headers jsonb, retried integer, max_retry integer, timeout_ms float8,
               deadline_in_ms float8, retention_ms float8, lease_token uuid, wait_ms float8)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
  l {{schema}}.queues%ROWTYPE;
  -- The starts' instant: the database clock once the lock is held (so it only moves
  -- forward from claim to claim), shifted as now_at is (a test's clock).
  at timestamptz;
  budget integer;
  -- Starts the rate window has left; NULL without a rate limit.
  rate_left integer;
  oldest timestamptz;
  window_rows integer;
  busy_keys text[];
  busy_counts integer[];
  picked tid[];
  n integer;
  taken integer := 0;
BEGIN
  -- A limited claim commits durably, whatever the server's sessions do (they commit
  -- asynchronously: a lost claim only runs a task again). A claim lost in a crash after
  -- its worker started the tasks would no longer count them: other servers would start
  -- more than the limits allow while they still run. Local to this transaction.
  PERFORM set_config('synchronous_commit', 'on', true);
  -- In one order, so that claims of several limited queues never deadlock.
  PERFORM pg_advisory_xact_lock(hashtext('pgasynq limits ' || schema_name), k)
  FROM (SELECT DISTINCT hashtext(x) AS k FROM unnest(queue_names) x ORDER BY 1) locks;
  at := now_at + (clock_timestamp() - now());
  FOR i IN 1 .. coalesce(array_length(queue_names, 1), 0) LOOP
    SELECT * INTO l FROM {{schema}}.queues q WHERE q.name = queue_names[i];
    CONTINUE WHEN NOT FOUND OR l.paused OR wanted[i] <= 0;
    EXIT WHEN taken >= total;
    budget := least(wanted[i], total - taken);
    oldest := NULL;
    rate_left := NULL;
    IF l.concurrency IS NOT NULL THEN
      -- (A claim always sets lease_owner: the condition lets task_states_active_idx count.)
      budget := least(budget, l.concurrency - (SELECT count(*) FROM {{schema}}.task_states s
                                               WHERE s.queue = l.name AND s.state = 'active' AND s.lease_owner IS NOT NULL)::integer);
    END IF;
    IF l.rate_limit IS NOT NULL THEN
      DELETE FROM {{schema}}.queue_starts s
      WHERE s.queue = l.name AND s.started_at <= at - l.rate_interval_ms * interval '1 millisecond';
      SELECT l.rate_limit - coalesce(sum(s.tasks), 0)::integer, min(s.started_at) INTO rate_left, oldest
      FROM {{schema}}.queue_starts s WHERE s.queue = l.name;
      budget := least(budget, rate_left);
    END IF;
    picked := '{}';
    IF budget > 0 AND l.key_concurrency IS NULL THEN
      picked := ARRAY(SELECT s.ctid FROM {{schema}}.task_states s WHERE s.queue = l.name AND s.state = 'pending'
                      ORDER BY s.priority DESC, s.pending_seq LIMIT budget FOR UPDATE SKIP LOCKED);
    ELSIF budget > 0 THEN
      -- The head of the queue, each key's tasks capped at what its active ones leave.
      -- Looking a few times further than the budget finds other keys behind a busy one.
      -- Each key's active tasks, counted once.
      SELECT coalesce(array_agg(b.k), '{}'), coalesce(array_agg(b.n), '{}') INTO busy_keys, busy_counts
      FROM (SELECT a.concurrency_key AS k, count(*)::integer AS n FROM {{schema}}.task_states a
            WHERE a.queue = l.name AND a.state = 'active' AND a.lease_owner IS NOT NULL AND a.concurrency_key IS NOT NULL
            GROUP BY 1) b;
      SELECT count(*)::integer, coalesce(array_agg(c.ctid ORDER BY c.priority DESC, c.pending_seq)
                                           FILTER (WHERE c.fits), '{}')
      INTO window_rows, picked
      FROM (
        SELECT w.ctid, w.priority, w.pending_seq,
               w.concurrency_key IS NULL OR row_number() OVER (PARTITION BY w.concurrency_key ORDER BY w.priority DESC, w.pending_seq)
                 + coalesce(b.n, 0) <= l.key_concurrency AS fits
        FROM (SELECT s.ctid, s.priority, s.pending_seq, s.concurrency_key FROM {{schema}}.task_states s
              WHERE s.queue = l.name AND s.state = 'pending'
              ORDER BY s.priority DESC, s.pending_seq LIMIT budget * 4) w
        LEFT JOIN unnest(busy_keys, busy_counts) AS b(k, n) ON b.k = w.concurrency_key
      ) c;
      IF cardinality(picked) < budget AND window_rows = budget * 4 THEN
        -- The head was the backlog of a few busy keys: take every key's head instead,
        -- one index descent per key (and the tasks without a key), so one tenant's
        -- backlog cannot hold another's task back.
        picked := ARRAY(
          WITH RECURSIVE keys(k) AS (
            (SELECT s.concurrency_key FROM {{schema}}.task_states s
             WHERE s.queue = l.name AND s.state = 'pending' AND s.concurrency_key IS NOT NULL
             ORDER BY s.concurrency_key LIMIT 1)
            UNION ALL
            SELECT (SELECT s.concurrency_key FROM {{schema}}.task_states s
                    WHERE s.queue = l.name AND s.state = 'pending' AND s.concurrency_key > keys.k
                    ORDER BY s.concurrency_key LIMIT 1)
            FROM keys WHERE keys.k IS NOT NULL
          ),
          heads AS (
            SELECT h.ctid, h.priority, h.pending_seq FROM keys CROSS JOIN LATERAL (
              SELECT s.ctid, s.priority, s.pending_seq FROM {{schema}}.task_states s
              WHERE s.queue = l.name AND s.state = 'pending' AND s.concurrency_key = keys.k
              ORDER BY s.priority DESC, s.pending_seq
              LIMIT greatest(l.key_concurrency - coalesce((SELECT b.n FROM unnest(busy_keys, busy_counts) AS b(k, n) WHERE b.k = keys.k), 0), 0)
            ) h WHERE keys.k IS NOT NULL
            UNION ALL
            (SELECT s.ctid, s.priority, s.pending_seq FROM {{schema}}.task_states s
             WHERE s.queue = l.name AND s.state = 'pending' AND s.concurrency_key IS NULL
             ORDER BY s.priority DESC, s.pending_seq LIMIT budget)
          )
          SELECT ctid FROM heads ORDER BY priority DESC, pending_seq LIMIT budget);
      END IF;
      -- Claims of this queue take turns on the lock; the rows are locked against the
      -- Inspector and replace (and the plain claim, in the moment a limit was just set).
      picked := ARRAY(SELECT s.ctid FROM {{schema}}.task_states s
                      WHERE s.ctid = ANY(picked) AND s.state = 'pending' FOR UPDATE SKIP LOCKED);
    END IF;
    RETURN QUERY
    WITH claimed AS (
      UPDATE {{schema}}.task_states s
      SET state = 'active', lease_owner = owner, lease_token = gen_random_uuid(),
          lease_expires_at = now_at + lease_ms * interval '1 millisecond', started_at = at, run_at = NULL,
          cancel_requested = false, updated_at = now_at
      WHERE s.ctid = ANY(picked)
      RETURNING s.seq, s.queue, s.pending_seq, s.priority, s.retried, s.lease_token
    )
    SELECT c.queue, c.seq, c.pending_seq, c.priority, t.id, t.type, t.payload, t.payload_bytes, t.headers,
           c.retried, t.max_retry, (extract(epoch FROM t.timeout) * 1000)::float8,
           (extract(epoch FROM t.deadline - now_at) * 1000)::float8, (extract(epoch FROM t.retention) * 1000)::float8,
           c.lease_token, NULL::float8
    FROM claimed c JOIN {{schema}}.task_inputs t ON t.seq = c.seq;
    GET DIAGNOSTICS n = ROW_COUNT;
    taken := taken + n;
    IF l.rate_limit IS NOT NULL AND n > 0 THEN
      INSERT INTO {{schema}}.queue_starts (queue, started_at, tasks) VALUES (l.name, at, n);
      oldest := coalesce(oldest, at);
    END IF;
    IF n < least(wanted[i], total - taken + n) AND EXISTS (SELECT 1 FROM {{schema}}.task_states s WHERE s.queue = l.name AND s.state = 'pending') THEN
      RETURN QUERY SELECT l.name, NULL::bigint, NULL::bigint, NULL::smallint, NULL::text, NULL::text, NULL::jsonb,
        NULL::bytea, NULL::jsonb, NULL::integer, NULL::integer, NULL::float8, NULL::float8, NULL::float8, NULL::uuid,
        CASE WHEN n >= rate_left
             THEN greatest(extract(epoch FROM oldest + l.rate_interval_ms * interval '1 millisecond' - at) * 1000, 1)::float8 END;
    END IF;
  END LOOP;
END
$$;

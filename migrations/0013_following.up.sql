-- pgasynq 0013: following a task. Every attempt it ran, the progress and the
-- log lines its handler reported, a wake-up for whoever waits for its outcome,
-- and events for whoever watches its queue.
-- {{schema}} is replaced by the quoted schema name before this file runs.
--
-- Costs, where the hot path is concerned: a task that completes without
-- retention (the common case) writes nothing more than before; its running
-- attempt is its row (started_at, lease_owner), and it goes with the row. An
-- attempt that ends without ending the task (a failure, a snooze, a lease
-- lost, a give-back, a completion kept for its retention) becomes a row of
-- task_attempts in the statement that ends it. Log lines and progress are
-- written only by tasks that report them, in the statements that already
-- carry their lease (the heartbeat, writeResult, the outcome). Waiting and
-- watching cost nothing until someone waits or watches: a waited-for task is
-- marked (awaited), and events are sent only while a watcher is registered.

-- The last value ctx.progress() reported (a number 0–100 or a JSON object of
-- at most 4 KiB); null before any. How many ended runs task_attempts holds
-- rows for (the last 100 are kept); whether the task has attempt or log rows
-- (so that a task that has none deletes nothing more); whether a client waits
-- for its outcome (Client.waitFor: kept at least AWAIT_KEEP when it completes,
-- and a notification on <schema>_done when it finishes).
ALTER TABLE {{schema}}.task_states
  ADD COLUMN progress jsonb,
  ADD COLUMN runs integer NOT NULL DEFAULT 0,
  ADD COLUMN has_history boolean NOT NULL DEFAULT false,
  ADD COLUMN awaited boolean NOT NULL DEFAULT false;

-- One row per ended run of a task, numbered by run (1, 2, …; a snooze or a
-- give-back is a run of its own); `attempt` is the attempt number the run had
-- (model/attempt.ts: retried + 1, which a snooze does not raise). Deleted with
-- the task (task_states_deleted), and the oldest beyond 100 runs per task.
CREATE TABLE {{schema}}.task_attempts (
  seq bigint NOT NULL,
  run integer NOT NULL,
  attempt integer NOT NULL,
  server text,
  started_at timestamptz,
  finished_at timestamptz NOT NULL,
  outcome text NOT NULL,
  error text,
  CONSTRAINT task_attempts_pkey PRIMARY KEY (seq, run),
  CONSTRAINT task_attempts_outcome CHECK (outcome IN ('completed', 'failed', 'snoozed', 'canceled', 'timeout', 'lost', 'shutdown'))
);

-- ctx.log() lines, in the order they were logged; at most 1,000 lines and
-- 64 KiB of text per task, the oldest dropped. `at` is on the database clock:
-- the flush's time less the line's age in the worker.
CREATE TABLE {{schema}}.task_logs (
  seq bigint NOT NULL,
  line bigint GENERATED ALWAYS AS IDENTITY,
  attempt integer NOT NULL,
  at timestamptz NOT NULL,
  message text NOT NULL,
  CONSTRAINT task_logs_pkey PRIMARY KEY (seq, line)
);

-- Inspector.watch() registrations, renewed while the watcher lives: events are
-- sent on <schema>_events only while one covers the task's queue (null: every
-- queue) and has not expired.
CREATE TABLE {{schema}}.watchers (
  id uuid NOT NULL,
  queue text,
  expires_at timestamptz NOT NULL,
  CONSTRAINT watchers_pkey PRIMARY KEY (id)
);

-- The view shows every field of a task: now its progress too.
CREATE OR REPLACE VIEW {{schema}}.tasks AS
 SELECT i.queue, i.id, i.type, i.payload, i.payload_bytes, i.headers, s.state, i.max_retry, s.retried, i.timeout,
    i.deadline, i.unique_key, s.group_key, i.retention, s.run_at, s.lease_owner, s.lease_expires_at, s.lease_token,
    s.started_at, s.cancel_requested, s.error_msg, s.last_failed_at, s.completed_at, s.result, s.result_bytes,
    i.enqueued_at, s.updated_at, i.seq, s.pending_seq, s.waiting_for, s.priority, s.concurrency_key, s.progress
   FROM {{schema}}.task_states s
     JOIN {{schema}}.task_inputs i ON i.seq = s.seq;


-- One event (Inspector.watch()) as JSON: kind, queue, id, type, attempt and
-- at, and the error (its first 1,000 characters: 6,000 bytes at most, escaped)
-- or the progress (4,096 bytes at most), so that it fits one notification.
CREATE FUNCTION {{schema}}.task_event(kind text, queue text, id text, type text, attempt integer, at timestamptz, error text, progress jsonb)
RETURNS json
-- A plain SQL function (no SET, no SECURITY DEFINER, every call qualified), so that the
-- statements that build events per row inline it.
LANGUAGE sql STABLE
AS $$
  SELECT pg_catalog.json_strip_nulls(pg_catalog.json_build_object(
    'kind', kind, 'queue', queue, 'id', id, 'type', type, 'attempt', attempt, 'at', at,
    'error', pg_catalog.left(error, 1000), 'progress', progress))
$$;
REVOKE EXECUTE ON FUNCTION {{schema}}.task_event(text, text, text, text, integer, timestamptz, text, jsonb) FROM PUBLIC;

-- Sends events (task_event()'s, in order) on <schema>_events as JSON arrays,
-- as few notifications as NOTIFY's 8,000-byte payload allows: one per claim or
-- completion batch rather than one per task, each queued, delivered and parsed
-- by every watcher. Called only with events to send, and only while someone
-- watches, by the owner's functions.
CREATE FUNCTION {{schema}}.send_task_events(events json[]) RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  channel constant text := {{schema}}.task_channel('_events');
  chunk text := '';
  e text;
BEGIN
  FOREACH e IN ARRAY events::text[] LOOP
    IF chunk <> '' AND pg_catalog.octet_length(chunk) + pg_catalog.octet_length(e) > 7900 THEN
      PERFORM pg_catalog.pg_notify(channel, '[' || chunk || ']');
      chunk := '';
    END IF;
    chunk := CASE WHEN chunk = '' THEN e ELSE chunk || ',' || e END;
  END LOOP;
  IF chunk <> '' THEN
    PERFORM pg_catalog.pg_notify(channel, '[' || chunk || ']');
  END IF;
END
$$;
REVOKE EXECUTE ON FUNCTION {{schema}}.send_task_events(json[]) FROM PUBLIC;

-- Appends ctx.log() lines to the tasks whose lease still holds: `logs` maps a
-- seq to {"t": lease token, "l": [[attempt, age in ms, message], …]}. A line
-- is cut to 4,096 characters; each task keeps its newest 1,000 lines within
-- 65,536 bytes. Called first by the functions that take a `logs` argument,
-- only when it is not null: a call of an owner's function costs about 4 µs,
-- too much for every write of the hot path, which mostly carries no line.
CREATE FUNCTION {{schema}}.append_task_logs(logs jsonb, now_at timestamptz) RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  written bigint[];
BEGIN
  IF logs IS NULL OR jsonb_typeof(logs) <> 'object' THEN
    RETURN;
  END IF;
  WITH given AS (
    SELECT e.key::bigint AS seq, (e.value ->> 't')::uuid AS token, e.value -> 'l' AS lines FROM jsonb_each(logs) e
  ),
  held AS MATERIALIZED (
    SELECT g.seq, g.lines FROM given g JOIN {{schema}}.task_states s ON s.seq = g.seq
    WHERE s.state = 'active' AND s.lease_token = g.token AND jsonb_typeof(g.lines) = 'array'
  ),
  flagged AS (
    UPDATE {{schema}}.task_states s SET has_history = true WHERE s.seq IN (SELECT h.seq FROM held h) AND NOT s.has_history
  ),
  added AS (
    INSERT INTO {{schema}}.task_logs (seq, attempt, at, message)
    SELECT h.seq, (l.value ->> 0)::int, now_at - greatest((l.value ->> 1)::float8, 0) * interval '1 millisecond', left(l.value ->> 2, 4096)
    FROM held h CROSS JOIN LATERAL jsonb_array_elements(h.lines) WITH ORDINALITY AS l(value, n)
    WHERE l.value ->> 2 IS NOT NULL
    ORDER BY h.seq, l.n
    RETURNING seq
  )
  SELECT array_agg(DISTINCT a.seq) INTO written FROM added a;
  IF written IS NULL THEN
    RETURN;
  END IF;
  DELETE FROM {{schema}}.task_logs t
  USING (
    SELECT k.seq, k.line FROM (
      SELECT x.seq, x.line, row_number() OVER w AS n, sum(octet_length(x.message)) OVER w AS bytes
      FROM {{schema}}.task_logs x WHERE x.seq = ANY (written)
      WINDOW w AS (PARTITION BY x.seq ORDER BY x.line DESC)
    ) k
    WHERE k.n > 1000 OR k.bytes > 65536
  ) d
  WHERE t.seq = d.seq AND t.line = d.line;
END
$$;
REVOKE EXECUTE ON FUNCTION {{schema}}.append_task_logs(jsonb, timestamptz) FROM PUBLIC;

-- Records ended runs: one task_attempts row per task of `ended`, and the
-- oldest beyond 100 runs dropped. `ended` holds, per task: seq, run (its
-- runs after the increment), attempt, server, started_at, outcome, error.
CREATE FUNCTION {{schema}}.record_attempts(ended jsonb, now_at timestamptz) RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
  IF ended IS NULL OR jsonb_array_length(ended) = 0 THEN
    RETURN;
  END IF;
  INSERT INTO {{schema}}.task_attempts (seq, run, attempt, server, started_at, finished_at, outcome, error)
  SELECT e.seq, e.run, e.attempt, e.server, e.started_at, now_at, e.outcome, e.error
  FROM jsonb_to_recordset(ended) AS e(seq bigint, run integer, attempt integer, server text, started_at timestamptz, outcome text, error text)
  ORDER BY e.seq;
  DELETE FROM {{schema}}.task_attempts a
  USING jsonb_to_recordset(ended) AS e(seq bigint, run integer)
  WHERE e.run > 100 AND a.seq = e.seq AND a.run <= e.run - 100;
END
$$;
REVOKE EXECUTE ON FUNCTION {{schema}}.record_attempts(jsonb, timestamptz) FROM PUBLIC;

-- Sends the events of `ended` (elements: seq, kind, attempt, and error or
-- progress; queue, id and type when the task's inputs may be gone) when a
-- watcher covers their queues. Nothing when none watches.
CREATE FUNCTION {{schema}}.send_events(ended jsonb, now_at timestamptz) RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  watching text[] := ARRAY(SELECT DISTINCT coalesce(w.queue, '') FROM {{schema}}.watchers w WHERE w.expires_at > now_at);
BEGIN
  IF ended IS NULL OR cardinality(watching) = 0 THEN
    RETURN;
  END IF;
  PERFORM {{schema}}.send_task_events(array_agg({{schema}}.task_event(e.kind, t.queue, t.id, t.type, e.attempt, now_at, e.error, e.progress)
                                                ORDER BY e.seq))
  FROM jsonb_to_recordset(ended) AS e(seq bigint, kind text, attempt integer, error text, progress jsonb, queue text, id text, type text)
  CROSS JOIN LATERAL (SELECT e.queue, e.id, e.type WHERE e.queue IS NOT NULL
                      UNION ALL
                      SELECT i.queue, i.id, i.type FROM {{schema}}.task_inputs i WHERE e.queue IS NULL AND i.seq = e.seq) t
  WHERE t.queue = ANY (watching) OR '' = ANY (watching)
  HAVING count(*) > 0;
END
$$;
REVOKE EXECUTE ON FUNCTION {{schema}}.send_events(jsonb, timestamptz) FROM PUBLIC;

-- The heartbeat, with the log lines of the leases it extends.
DROP FUNCTION {{schema}}.extend_leases(bigint[], uuid[], double precision, double precision);
CREATE FUNCTION {{schema}}.extend_leases(seqs bigint[], tokens uuid[], lease_ms double precision, logs jsonb, shift_ms double precision)
RETURNS TABLE(task_seq bigint, cancel_requested boolean)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  v_now timestamptz := {{schema}}.task_clock(shift_ms);
  v_at jsonb := {{schema}}.lease_batch(seqs, tokens);
BEGIN
  PERFORM {{schema}}.check_claim_bounds(0, lease_ms);
  IF logs IS NOT NULL THEN
    PERFORM {{schema}}.append_task_logs(logs, v_now);
  END IF;
  RETURN QUERY
  UPDATE {{schema}}.task_states s SET lease_expires_at = v_now + lease_ms * interval '1 millisecond'
  WHERE s.seq = ANY(seqs) AND s.state = 'active' AND s.lease_token = tokens[(v_at ->> s.seq::text)::int]
    AND s.lease_expires_at > v_now
  RETURNING s.seq, s.cancel_requested;
END
$$;
REVOKE EXECUTE ON FUNCTION {{schema}}.extend_leases(bigint[], uuid[], double precision, jsonb, double precision) FROM PUBLIC;

-- Successful attempts: each task deleted, or kept as completed for its
-- retention (awaited tasks at least 60 s, so that their waiter reads the
-- outcome), its unique lock released. A task kept records its run; one
-- deleted takes its history with it.
DROP FUNCTION {{schema}}.complete_tasks(bigint[], uuid[], boolean[], double precision);
CREATE FUNCTION {{schema}}.complete_tasks(seqs bigint[], tokens uuid[], keeps boolean[], logs jsonb, shift_ms double precision)
RETURNS SETOF bigint
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  v_now timestamptz := {{schema}}.task_clock(shift_ms);
  v_at jsonb := {{schema}}.lease_batch(seqs, tokens, cardinality(keeps));
  -- The queues a live watcher covers ('' for a watcher of every queue: no queue is named ''),
  -- read once per call in this function's own cached plan (a call of an SQL function per
  -- claim, planned anew each time, cost 150 µs): while none is, nothing below reads or sends an event.
  v_watching text[] := ARRAY(SELECT DISTINCT coalesce(w.queue, '') FROM {{schema}}.watchers w WHERE w.expires_at > v_now);
  n integer;
  done bigint[];
  events json[];
  ended jsonb;
BEGIN
  IF logs IS NOT NULL THEN
    PERFORM {{schema}}.append_task_logs(logs, v_now);
  END IF;
  IF NOT coalesce(true = ANY(keeps), false) AND cardinality(v_watching) = 0 THEN
    -- No task kept (retention 0, the common case) and nobody watching: a plain fenced
    -- DELETE, each row written once. An awaited task is left to the path below.
    RETURN QUERY
    WITH deleted AS (
      DELETE FROM {{schema}}.task_states s
      WHERE s.seq = ANY(seqs) AND s.state = 'active' AND s.lease_token = tokens[(v_at ->> s.seq::text)::int] AND NOT s.awaited
      RETURNING s.seq
    ),
    inputs AS (
      DELETE FROM {{schema}}.task_inputs i WHERE i.seq = ANY(ARRAY(SELECT d.seq FROM deleted d))
      RETURNING i.queue, i.id, i.unique_key
    ),
    unlocked AS (
      DELETE FROM {{schema}}.unique_locks l USING inputs f
      WHERE f.unique_key IS NOT NULL AND l.queue = f.queue AND l.key = f.unique_key AND l.task_id = f.id
    )
    SELECT d.seq FROM deleted d;
    GET DIAGNOSTICS n = ROW_COUNT;
  ELSIF NOT coalesce(true = ANY(keeps), false) THEN
    -- The same while someone watches, with the 'completed' events of the tasks it deletes
    -- (a statement of its own: in the one above, even switched off, they cost its planning).
    WITH deleted AS (
      DELETE FROM {{schema}}.task_states s
      WHERE s.seq = ANY(seqs) AND s.state = 'active' AND s.lease_token = tokens[(v_at ->> s.seq::text)::int] AND NOT s.awaited
      RETURNING s.seq, s.retried
    ),
    inputs AS (
      DELETE FROM {{schema}}.task_inputs i WHERE i.seq = ANY(ARRAY(SELECT d.seq FROM deleted d))
      RETURNING i.seq, i.queue, i.id, i.type, i.unique_key
    ),
    unlocked AS (
      DELETE FROM {{schema}}.unique_locks l USING inputs f
      WHERE f.unique_key IS NOT NULL AND l.queue = f.queue AND l.key = f.unique_key AND l.task_id = f.id
    )
    SELECT coalesce(array_agg(d.seq), '{}'),
           array_agg({{schema}}.task_event('completed', f.queue, f.id, f.type, d.retried + 1, v_now, NULL, NULL) ORDER BY d.seq)
             FILTER (WHERE f.queue = ANY (v_watching) OR '' = ANY (v_watching))
    INTO done, events
    FROM deleted d JOIN inputs f ON f.seq = d.seq;
    IF events IS NOT NULL THEN
      PERFORM {{schema}}.send_task_events(events);
    END IF;
    RETURN QUERY SELECT unnest(done);
    n := cardinality(done);
  END IF;
  IF n = cardinality(seqs) THEN
    RETURN;
  END IF;
  WITH h AS MATERIALIZED (
    SELECT s.seq, keeps[(v_at ->> s.seq::text)::int] OR s.awaited AS keep, s.awaited, s.retried, s.lease_owner, s.started_at,
           i.queue, i.id, i.type
    FROM {{schema}}.task_states s JOIN {{schema}}.task_inputs i ON i.seq = s.seq
    WHERE s.seq = ANY(seqs) AND s.state = 'active' AND s.lease_token = tokens[(v_at ->> s.seq::text)::int]
    ORDER BY s.seq FOR UPDATE OF s
  ),
  deleted AS (
    DELETE FROM {{schema}}.task_states s WHERE s.seq = ANY(ARRAY(SELECT h.seq FROM h WHERE NOT h.keep))
    RETURNING s.seq
  ),
  inputs AS (
    DELETE FROM {{schema}}.task_inputs i WHERE i.seq = ANY(ARRAY(SELECT d.seq FROM deleted d))
    RETURNING i.queue, i.id, i.unique_key
  ),
  unlocked AS (
    DELETE FROM {{schema}}.unique_locks l USING inputs f
    WHERE f.unique_key IS NOT NULL AND l.queue = f.queue AND l.key = f.unique_key AND l.task_id = f.id
  ),
  kept AS (
    UPDATE {{schema}}.task_states s
    SET state = 'completed', completed_at = v_now,
        run_at = v_now + greatest((SELECT i.retention FROM {{schema}}.task_inputs i WHERE i.seq = s.seq),
                                  CASE WHEN s.awaited THEN interval '60 seconds' ELSE interval '0' END),
        runs = s.runs + 1, has_history = true, updated_at = v_now
    WHERE s.seq = ANY(ARRAY(SELECT h.seq FROM h WHERE h.keep))
    RETURNING s.seq, s.runs
  ),
  unlocked_kept AS (
    DELETE FROM {{schema}}.unique_locks l
    USING (SELECT i.queue, i.id, i.unique_key FROM {{schema}}.task_inputs i
           WHERE i.seq = ANY(ARRAY(SELECT k.seq FROM kept k)) AND i.unique_key IS NOT NULL) f
    WHERE l.queue = f.queue AND l.key = f.unique_key AND l.task_id = f.id
  )
  -- queue, id and type: the events of the tasks deleted here, whose inputs send_events() no longer finds.
  SELECT jsonb_agg(jsonb_build_object('seq', h.seq, 'run', k.runs, 'attempt', h.retried + 1, 'server', h.lease_owner,
                                      'started_at', h.started_at, 'outcome', 'completed', 'kind', 'completed', 'kept', k.seq IS NOT NULL,
                                      'queue', h.queue, 'id', h.id, 'type', h.type)
                   ORDER BY h.seq)
  INTO ended
  FROM h LEFT JOIN kept k ON k.seq = h.seq;
  PERFORM {{schema}}.record_attempts(jsonb_path_query_array(ended, '$[*] ? (@.kept == true)'), v_now);
  IF cardinality(v_watching) > 0 THEN
    PERFORM {{schema}}.send_events(ended, v_now);
  END IF;
  RETURN QUERY SELECT (e ->> 'seq')::bigint FROM jsonb_array_elements(coalesce(ended, '[]')) e;
END
$$;
REVOKE EXECUTE ON FUNCTION {{schema}}.complete_tasks(bigint[], uuid[], boolean[], jsonb, double precision) FROM PUBLIC;

-- Failed attempts, to retry or to the archive; `outcomes` says how each ended
-- ('failed', 'timeout' or 'canceled'), as its run is recorded.
DROP FUNCTION {{schema}}.fail_tasks(bigint[], uuid[], boolean[], boolean[], double precision[], text[], double precision);
CREATE FUNCTION {{schema}}.fail_tasks(seqs bigint[], tokens uuid[], archives boolean[], counts boolean[], delays_ms double precision[],
                                      errors text[], outcomes text[], logs jsonb, shift_ms double precision)
RETURNS SETOF bigint
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  v_now timestamptz := {{schema}}.task_clock(shift_ms);
  v_at jsonb := {{schema}}.lease_batch(seqs, tokens, cardinality(archives), cardinality(counts), cardinality(delays_ms), cardinality(errors),
                                       cardinality(outcomes));
  ended jsonb;
BEGIN
  PERFORM {{schema}}.check_delays(delays_ms);
  IF NOT outcomes <@ ARRAY['failed', 'timeout', 'canceled'] THEN
    RAISE EXCEPTION USING ERRCODE = 'invalid_parameter_value', MESSAGE = 'pgasynq: invalid outcomes: each must be failed, timeout or canceled', COLUMN = 'outcomes';
  END IF;
  IF logs IS NOT NULL THEN
    PERFORM {{schema}}.append_task_logs(logs, v_now);
  END IF;
  WITH failed AS (
    UPDATE {{schema}}.task_states s
    SET state = CASE WHEN archives[(v_at ->> s.seq::text)::int] THEN 'archived' ELSE 'retry' END,
        retried = s.retried + CASE WHEN counts[(v_at ->> s.seq::text)::int] AND NOT archives[(v_at ->> s.seq::text)::int] THEN 1 ELSE 0 END,
        run_at = v_now + CASE WHEN archives[(v_at ->> s.seq::text)::int] THEN interval '0'
                              ELSE delays_ms[(v_at ->> s.seq::text)::int] * interval '1 millisecond' END,
        error_msg = errors[(v_at ->> s.seq::text)::int], last_failed_at = v_now,
        runs = s.runs + 1, has_history = true, updated_at = v_now
    -- o: the row as it was (the run's server, start and attempt), which SET and RETURNING no longer show.
    FROM {{schema}}.task_states o
    WHERE s.seq = ANY(seqs) AND s.state = 'active' AND s.lease_token = tokens[(v_at ->> s.seq::text)::int] AND o.seq = s.seq
    RETURNING s.seq, s.queue, s.state, s.runs, o.retried, o.lease_owner, o.started_at, s.error_msg, outcomes[(v_at ->> s.seq::text)::int] AS outcome
  ),
  notified AS (
    SELECT pg_notify({{schema}}.task_channel('_delayed'), f.queue) FROM (SELECT DISTINCT queue FROM failed WHERE state = 'retry') f
  )
  SELECT jsonb_agg(jsonb_build_object('seq', f.seq, 'run', f.runs, 'attempt', f.retried + 1, 'server', f.lease_owner,
                                      'started_at', f.started_at, 'outcome', f.outcome, 'error', f.error_msg,
                                      'kind', CASE WHEN f.state = 'archived' THEN 'archived' ELSE 'failed' END)
                   ORDER BY f.seq)
  INTO ended
  FROM failed f WHERE (SELECT count(*) FROM notified) >= 0;
  PERFORM {{schema}}.record_attempts(ended, v_now);
  PERFORM {{schema}}.send_events(ended, v_now);
  RETURN QUERY SELECT (e ->> 'seq')::bigint FROM jsonb_array_elements(coalesce(ended, '[]')) e;
END
$$;
REVOKE EXECUTE ON FUNCTION {{schema}}.fail_tasks(bigint[], uuid[], boolean[], boolean[], double precision[], text[], text[], jsonb, double precision) FROM PUBLIC;

-- Snoozed attempts: scheduled again, their run recorded as 'snoozed'.
DROP FUNCTION {{schema}}.snooze_tasks(bigint[], uuid[], double precision[], double precision);
CREATE FUNCTION {{schema}}.snooze_tasks(seqs bigint[], tokens uuid[], delays_ms double precision[], logs jsonb, shift_ms double precision)
RETURNS SETOF bigint
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  v_now timestamptz := {{schema}}.task_clock(shift_ms);
  v_at jsonb := {{schema}}.lease_batch(seqs, tokens, cardinality(delays_ms));
  ended jsonb;
BEGIN
  PERFORM {{schema}}.check_delays(delays_ms);
  IF logs IS NOT NULL THEN
    PERFORM {{schema}}.append_task_logs(logs, v_now);
  END IF;
  WITH snoozed AS (
    UPDATE {{schema}}.task_states s
    SET state = 'scheduled', run_at = v_now + delays_ms[(v_at ->> s.seq::text)::int] * interval '1 millisecond',
        runs = s.runs + 1, has_history = true, updated_at = v_now
    FROM {{schema}}.task_states o
    WHERE s.seq = ANY(seqs) AND s.state = 'active' AND s.lease_token = tokens[(v_at ->> s.seq::text)::int] AND o.seq = s.seq
    RETURNING s.seq, s.queue, s.runs, o.retried, o.lease_owner, o.started_at
  ),
  notified AS (
    SELECT pg_notify({{schema}}.task_channel('_delayed'), z.queue) FROM (SELECT DISTINCT queue FROM snoozed) z
  )
  SELECT jsonb_agg(jsonb_build_object('seq', z.seq, 'run', z.runs, 'attempt', z.retried + 1, 'server', z.lease_owner,
                                      'started_at', z.started_at, 'outcome', 'snoozed') ORDER BY z.seq)
  INTO ended
  FROM snoozed z WHERE (SELECT count(*) FROM notified) >= 0;
  PERFORM {{schema}}.record_attempts(ended, v_now);
  RETURN QUERY SELECT (e ->> 'seq')::bigint FROM jsonb_array_elements(coalesce(ended, '[]')) e;
END
$$;
REVOKE EXECUTE ON FUNCTION {{schema}}.snooze_tasks(bigint[], uuid[], double precision[], jsonb, double precision) FROM PUBLIC;

-- Leases given back at shutdown: to the front of pending, their run recorded as 'shutdown'.
DROP FUNCTION {{schema}}.requeue_tasks(bigint[], uuid[], double precision);
CREATE FUNCTION {{schema}}.requeue_tasks(seqs bigint[], tokens uuid[], logs jsonb, shift_ms double precision)
RETURNS SETOF bigint
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  v_now timestamptz := {{schema}}.task_clock(shift_ms);
  v_at jsonb := {{schema}}.lease_batch(seqs, tokens);
  ended jsonb;
BEGIN
  IF logs IS NOT NULL THEN
    PERFORM {{schema}}.append_task_logs(logs, v_now);
  END IF;
  WITH requeued AS (
    UPDATE {{schema}}.task_states s
    SET state = 'pending', run_at = h.front_at - interval '1 microsecond', pending_seq = h.front - h.n + h.rank - 1,
        runs = s.runs + 1, has_history = true, updated_at = v_now
    FROM (
      SELECT l.seq, l.retried, l.lease_owner, l.started_at, row_number() OVER w AS rank, count(*) OVER (PARTITION BY l.queue) AS n,
             coalesce((SELECT min(p.pending_seq) FROM {{schema}}.task_states p WHERE p.queue = l.queue AND p.state = 'pending'),
                      {{schema}}.task_position()) AS front,
             coalesce((SELECT min(p.run_at) FROM {{schema}}.task_states p WHERE p.queue = l.queue AND p.state = 'pending'),
                      v_now) AS front_at
      FROM (SELECT x.seq, x.queue, x.retried, x.lease_owner, x.started_at FROM {{schema}}.task_states x
            WHERE x.seq = ANY(seqs) AND x.state = 'active' AND x.lease_token = tokens[(v_at ->> x.seq::text)::int]
            ORDER BY x.seq FOR UPDATE) l
      WINDOW w AS (PARTITION BY l.queue ORDER BY l.seq)
    ) h
    WHERE s.seq = h.seq
    RETURNING s.seq, s.queue, s.runs, h.retried, h.lease_owner, h.started_at
  ),
  notified AS (
    SELECT pg_notify({{schema}}.task_channel('_sweep'), r.queue) FROM (SELECT DISTINCT queue FROM requeued) r
  )
  SELECT jsonb_agg(jsonb_build_object('seq', r.seq, 'run', r.runs, 'attempt', r.retried + 1, 'server', r.lease_owner,
                                      'started_at', r.started_at, 'outcome', 'shutdown') ORDER BY r.seq)
  INTO ended
  FROM requeued r WHERE (SELECT count(*) FROM notified) >= 0;
  PERFORM {{schema}}.record_attempts(ended, v_now);
  RETURN QUERY SELECT (e ->> 'seq')::bigint FROM jsonb_array_elements(coalesce(ended, '[]')) e;
END
$$;
REVOKE EXECUTE ON FUNCTION {{schema}}.requeue_tasks(bigint[], uuid[], jsonb, double precision) FROM PUBLIC;

-- Expired leases rescued: their run recorded as 'lost'.
CREATE OR REPLACE FUNCTION {{schema}}.recover_leases(seqs bigint[], tokens uuid[], archives boolean[], delays_ms double precision[], cutoff_ms double precision, lease_ms double precision, shift_ms double precision)
 RETURNS TABLE(task_seq bigint, archived boolean)
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $function$
DECLARE
  v_now timestamptz := {{schema}}.task_clock(shift_ms);
  ended jsonb;
BEGIN
  PERFORM {{schema}}.check_recovery_bounds(cutoff_ms, lease_ms);
  WITH recovered AS (
    UPDATE {{schema}}.task_states s
    SET state = CASE WHEN h.archive THEN 'archived' ELSE 'retry' END,
        retried = s.retried + CASE WHEN h.archive THEN 0 ELSE 1 END,
        run_at = v_now + CASE WHEN h.archive THEN interval '0' ELSE h.delay_ms * interval '1 millisecond' END,
        error_msg = 'task lease expired', last_failed_at = v_now,
        runs = s.runs + 1, has_history = true, updated_at = v_now
    FROM ROWS FROM (unnest(seqs), unnest(tokens), unnest(archives), unnest(delays_ms)) AS h(seq, token, archive, delay_ms),
         {{schema}}.task_states o
    WHERE s.seq = h.seq AND s.state = 'active' AND s.lease_token = h.token AND o.seq = s.seq
      AND (s.lease_expires_at < v_now - cutoff_ms * interval '1 millisecond'
           OR s.lease_expires_at > v_now + lease_ms * interval '1 millisecond' + interval '1 minute')
      -- A row locked by a ctx.transaction that is still running (a busy statement, which
      -- no idle timeout ends) is skipped, not waited for: the next tick tries it again,
      -- and the rest of the batch is rescued now.
      AND s.seq = ANY(ARRAY(SELECT l.seq FROM {{schema}}.task_states l WHERE l.seq = ANY(seqs)
                            ORDER BY l.seq FOR UPDATE SKIP LOCKED))
    RETURNING s.seq, h.archive, s.queue, s.runs, o.retried, o.lease_owner, o.started_at
  ),
  -- A retry may be due sooner than the forwarders' sleep.
  notified AS (
    SELECT pg_notify({{schema}}.task_channel('_delayed'), queue) FROM (SELECT DISTINCT queue FROM recovered WHERE NOT archive) q
  )
  SELECT jsonb_agg(jsonb_build_object('seq', r.seq, 'run', r.runs, 'attempt', r.retried + 1, 'server', r.lease_owner,
                                      'started_at', r.started_at, 'outcome', 'lost', 'error', 'task lease expired',
                                      'kind', CASE WHEN r.archive THEN 'archived' ELSE 'failed' END, 'archive', r.archive)
                   ORDER BY r.seq)
  INTO ended
  FROM recovered r WHERE (SELECT count(*) FROM notified) >= 0;
  PERFORM {{schema}}.record_attempts(ended, v_now);
  PERFORM {{schema}}.send_events(ended, v_now);
  RETURN QUERY SELECT (e ->> 'seq')::bigint, (e ->> 'archive')::boolean FROM jsonb_array_elements(coalesce(ended, '[]')) e;
END
$function$;

-- A handler's result, with the log lines of its lease.
DROP FUNCTION {{schema}}.write_result(bigint, uuid, jsonb, bytea, double precision);
CREATE FUNCTION {{schema}}.write_result(task_seq bigint, token uuid, result jsonb, result_bytes bytea, logs jsonb, shift_ms double precision)
RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  v_now timestamptz := {{schema}}.task_clock(shift_ms);
BEGIN
  IF logs IS NOT NULL THEN
    PERFORM {{schema}}.append_task_logs(logs, v_now);
  END IF;
  UPDATE {{schema}}.task_states s SET result = write_result.result, result_bytes = write_result.result_bytes, updated_at = v_now
  WHERE s.seq = task_seq AND s.lease_token = token AND s.state = 'active';
  RETURN FOUND;
END
$$;
REVOKE EXECUTE ON FUNCTION {{schema}}.write_result(bigint, uuid, jsonb, bytea, jsonb, double precision) FROM PUBLIC;

-- ctx.progress(): the task's progress while its lease holds, with its log
-- lines, and a 'progress' event for whoever watches. The value is checked as
-- the library checks it (model/progress.ts), 22023 naming progress.
CREATE FUNCTION {{schema}}.write_progress(task_seq bigint, token uuid, progress jsonb, logs jsonb, shift_ms double precision)
RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  v_now timestamptz := {{schema}}.task_clock(shift_ms);
  v_attempt integer;
BEGIN
  IF progress IS NULL
     OR NOT (jsonb_typeof(progress) = 'object' OR (jsonb_typeof(progress) = 'number' AND (progress #>> '{}')::numeric BETWEEN 0 AND 100))
     OR octet_length(progress::text) > 4096 THEN
    RAISE EXCEPTION USING ERRCODE = 'invalid_parameter_value', COLUMN = 'progress',
      MESSAGE = 'pgasynq: invalid progress: must be a number in [0, 100] or a JSON object of at most 4096 bytes';
  END IF;
  IF logs IS NOT NULL THEN
    PERFORM {{schema}}.append_task_logs(logs, v_now);
  END IF;
  UPDATE {{schema}}.task_states s SET progress = write_progress.progress, updated_at = v_now
  WHERE s.seq = task_seq AND s.lease_token = token AND s.state = 'active'
  RETURNING s.retried + 1 INTO v_attempt;
  IF NOT FOUND THEN
    RETURN false;
  END IF;
  PERFORM {{schema}}.send_events(jsonb_build_array(jsonb_build_object('seq', task_seq, 'kind', 'progress', 'attempt', v_attempt, 'progress', progress)), v_now);
  RETURN true;
END
$$;
REVOKE EXECUTE ON FUNCTION {{schema}}.write_progress(bigint, uuid, jsonb, jsonb, double precision) FROM PUBLIC;
CREATE OR REPLACE FUNCTION {{schema}}.claim_tasks(queue_names text[], shares integer[], gap_ords integer[], gap_his integer[], gap_los integer[], band_ords integer[], band_priorities integer[], band_floors bigint[], older_than xid8, claim_limit integer, owner text, lease_ms double precision, max_bytes double precision, shift_ms double precision)
 RETURNS TABLE(drawn bigint, xid xid8, xmin xid8, drawers_gone boolean, locked bigint, paused text[], limited text[], seq bigint, pending_seq bigint, priority smallint, queue text, id text, type text, payload jsonb, payload_bytes bytea, headers jsonb, retried integer, max_retry integer, timeout_ms double precision, deadline_in_ms double precision, retention_ms double precision, lease_token uuid)
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $function$
#variable_conflict use_column
DECLARE
  v_now timestamptz := {{schema}}.task_clock(shift_ms);
  -- The queues a live watcher covers ('' for a watcher of every queue: no queue is named ''),
  -- read once per call in this function's own cached plan (a call of an SQL function per
  -- claim, planned anew each time, cost 150 µs): while none is, nothing below reads or sends an event.
  v_watching text[] := ARRAY(SELECT DISTINCT coalesce(w.queue, '') FROM {{schema}}.watchers w WHERE w.expires_at > v_now);
BEGIN
  PERFORM {{schema}}.check_claim_bounds(claim_limit, lease_ms);
  RETURN QUERY
  WITH RECURSIVE mark AS MATERIALIZED (
    -- A sequence that has handed out nothing yet has drawn nothing.
    SELECT CASE WHEN q.is_called THEN q.last_value ELSE q.last_value - 1 END AS drawn FROM {{schema}}.task_seq q
  ),
  me AS MATERIALIZED (
    -- The transaction id is taken after the sequence was read (see server/cursor.ts).
    SELECT m.drawn, pg_current_xact_id() AS xid, pg_snapshot_xmin(pg_current_snapshot()) AS xmin FROM mark m
  ),
  -- Drawing a position locks task_seq until the transaction ends: when no holder of
  -- that lock in this database is older than older_than, every position drawn before
  -- older_than's claim is committed or gone. Unlike xmin, a long transaction elsewhere
  -- in the cluster does not hold this up. Live state, not the snapshot: a later
  -- claim's snapshot is the first that surely sees those commits.
  drawers AS MATERIALIZED (
    SELECT NOT EXISTS (
      SELECT 1 FROM pg_locks l LEFT JOIN pg_stat_activity a ON a.pid = l.pid
      WHERE l.locktype = 'relation' AND l.granted
        AND l.database = (SELECT d.oid FROM pg_database d WHERE d.datname = current_database())
        AND l.relation = '{{schema}}.task_seq'::regclass
        -- A prepared transaction has no backend; a holder without an id has written nothing.
        AND (a.pid IS NULL OR age(a.backend_xid) > age(older_than::xid))
    ) AS gone
    WHERE older_than IS NOT NULL
  ),
  q AS MATERIALIZED (
    SELECT u.name, u.share, u.ord
    FROM ROWS FROM (unnest(queue_names), unnest(shares)) WITH ORDINALITY AS u(name, share, ord)
    WHERE NOT EXISTS (SELECT 1 FROM {{schema}}.queues p WHERE p.name = u.name
                      AND (p.paused OR p.concurrency IS NOT NULL OR p.key_concurrency IS NOT NULL OR p.rate_limit IS NOT NULL))
  ),
  -- The bands of each gap between the known ones, highest first: one index descent
  -- each, and one more that ends the gap.
  found(ord, name, lo, priority) AS (
    SELECT g.ord, q.name, g.lo, (
      SELECT s.priority FROM {{schema}}.task_states s
      WHERE s.queue = q.name AND s.state = 'pending' AND s.priority < g.hi AND s.priority > g.lo
      ORDER BY s.priority DESC LIMIT 1)
    FROM ROWS FROM (unnest(gap_ords), unnest(gap_his), unnest(gap_los)) AS g(ord, hi, lo) JOIN q ON q.ord = g.ord
    UNION ALL
    SELECT f.ord, f.name, f.lo, (
      SELECT s.priority FROM {{schema}}.task_states s
      WHERE s.queue = f.name AND s.state = 'pending' AND s.priority < f.priority AND s.priority > f.lo
      ORDER BY s.priority DESC LIMIT 1)
    FROM found f WHERE f.priority IS NOT NULL
  ),
  -- Every band to scan, in the claim's order: by queue, highest priority first.
  bands AS MATERIALIZED (
    SELECT b.ord, q.name, b.priority, b.floor FROM (
      SELECT k.ord, k.priority, k.floor
      FROM ROWS FROM (unnest(band_ords), unnest(band_priorities), unnest(band_floors)) AS k(ord, priority, floor)
      UNION ALL
      -- Below every position: from the head of the band.
      SELECT f.ord, f.priority, -4611686018427387904::bigint FROM found f WHERE f.priority IS NOT NULL
    ) b JOIN q ON q.ord = b.ord
    ORDER BY b.ord, b.priority DESC
  ),
  -- Each queue's share first (the weights' proportions within one claim)…
  shared AS (
    SELECT c.* FROM q CROSS JOIN LATERAL (
      SELECT x.* FROM bands b CROSS JOIN LATERAL (
        SELECT s.ctid, s.seq, s.queue, s.priority, s.pending_seq FROM {{schema}}.task_states s
        WHERE s.queue = b.name AND s.state = 'pending' AND s.priority = b.priority AND s.pending_seq > b.floor
          -- Referenced here so that the mark is taken before the first row is locked
          -- (a row lock assigns the transaction id).
          AND (SELECT me.xid FROM me) IS NOT NULL
        ORDER BY s.pending_seq
        LIMIT q.share FOR UPDATE SKIP LOCKED
      ) x
      WHERE b.ord = q.ord
      LIMIT q.share
    ) c
  ),
  -- …then what the shares left, from the bands in order, so no slot stays idle while
  -- a queue has tasks. The outer LIMIT stops the scans as soon as enough rows are
  -- locked; the bands are read in the order they were materialized in (an ORDER BY
  -- here would sort, so lock, every band's rows first).
  more AS (
    SELECT m.* FROM bands b CROSS JOIN LATERAL (
      SELECT s.ctid, s.seq, s.queue, s.priority, s.pending_seq FROM {{schema}}.task_states s
      WHERE s.queue = b.name AND s.state = 'pending' AND s.priority = b.priority AND s.pending_seq > b.floor
        AND s.ctid <> ALL(ARRAY(SELECT h.ctid FROM shared h))
      ORDER BY s.pending_seq
      LIMIT claim_limit FOR UPDATE SKIP LOCKED
    ) m
    WHERE (SELECT count(*) FROM shared) < claim_limit
    LIMIT greatest(claim_limit::bigint - (SELECT count(*) FROM shared), 0)
  ),
  c AS (SELECT * FROM shared UNION ALL SELECT * FROM more),
  -- The locked rows in the claim's order, with the running sum of their inputs' bytes
  -- (payload as JSON text or bytea, and headers, as a client receives them). The
  -- inner join leaves out a state row without inputs: it is not claimed. (LIMIT 1
  -- keeps the lookup a primary key probe per row: a join planned on the CTE's guessed
  -- size may hash the whole table.)
  sized AS (
    SELECT c.ctid, row_number() OVER w AS n, sum(x.bytes) OVER w AS upto
    FROM c CROSS JOIN LATERAL (
      SELECT coalesce(octet_length(i.payload_bytes), octet_length(i.payload::text), 0)::float8
             + octet_length(i.headers::text)::float8 AS bytes
      FROM {{schema}}.task_inputs i WHERE i.seq = c.seq LIMIT 1) x
    WINDOW w AS (ORDER BY array_position(queue_names, c.queue), c.priority DESC, c.pending_seq ROWS UNBOUNDED PRECEDING)
  ),
  -- Rows are found by key arrays (= ANY) and index probes, never by joining CTEs:
  -- their row estimates are guesses, and a join planned on a guess either hashes a
  -- whole table or rescans a CTE once per row. The locked rows are updated by ctid
  -- (a TID scan): nothing can move a row this statement holds locked, and a primary
  -- key descent per row was a quarter of the claim. (A pending row that another
  -- transaction rewrote after this statement's snapshot is locked in its new version,
  -- which this UPDATE cannot see: it stays pending for the next claim.)
  -- pending_seq stays on the active row (only pending rows are indexed by it), so
  -- the claim order can be returned.
  claimed AS (
    UPDATE {{schema}}.task_states s
    SET state = 'active', lease_owner = owner, lease_token = gen_random_uuid(),
        lease_expires_at = v_now + lease_ms * interval '1 millisecond', started_at = v_now, run_at = NULL,
        cancel_requested = false, updated_at = v_now
    WHERE s.ctid = ANY(ARRAY(SELECT z.ctid FROM sized z WHERE z.n = 1 OR z.upto <= max_bytes))
    RETURNING s.seq, s.queue, s.pending_seq, s.priority, s.retried, s.lease_token
  ),
  tasks AS (
    SELECT u.seq, u.pending_seq, u.priority, i.queue, i.id, i.type, i.payload, i.payload_bytes,
      i.headers, u.retried, i.max_retry,
      (extract(epoch FROM i.timeout) * 1000::numeric)::float8 AS timeout_ms,
      (extract(epoch FROM i.deadline - v_now) * 1000::numeric)::float8 AS deadline_in_ms,
      (extract(epoch FROM i.retention) * 1000::numeric)::float8 AS retention_ms,
      u.lease_token, array_position(queue_names, u.queue) AS ord
    FROM claimed u CROSS JOIN LATERAL (SELECT * FROM {{schema}}.task_inputs i WHERE i.seq = u.seq) i
  )
  SELECT me.drawn, me.xid, me.xmin, (SELECT d.gone FROM drawers d), (SELECT count(*) FROM c),
    ARRAY(SELECT p.name FROM {{schema}}.queues p WHERE p.paused AND p.name = ANY(queue_names)),
    ARRAY(SELECT p.name FROM {{schema}}.queues p WHERE NOT p.paused AND p.name = ANY(queue_names)
          AND (p.concurrency IS NOT NULL OR p.key_concurrency IS NOT NULL OR p.rate_limit IS NOT NULL)),
    t.seq, t.pending_seq, t.priority, t.queue, t.id, t.type, t.payload, t.payload_bytes, t.headers, t.retried,
    t.max_retry, t.timeout_ms, t.deadline_in_ms, t.retention_ms, t.lease_token
  FROM me LEFT JOIN tasks t ON true
  ORDER BY t.ord, t.priority DESC, t.pending_seq;
  -- Inspector.watch()'s 'started' events, in a statement that runs only while someone
  -- watches (in the claim's own statement, even switched off, they cost its planning about
  -- 25 µs a call). The rows this claim took: active, of its queues, its owner's, started now.
  IF cardinality(v_watching) > 0 THEN
    PERFORM {{schema}}.send_task_events(array_agg({{schema}}.task_event('started', s.queue, i.id, i.type, s.retried + 1, v_now, NULL, NULL)
                                                  ORDER BY s.seq))
    FROM {{schema}}.task_states s JOIN {{schema}}.task_inputs i ON i.seq = s.seq
    WHERE s.queue = ANY (queue_names) AND s.state = 'active' AND s.lease_owner = owner AND s.started_at = v_now
      AND (s.queue = ANY (v_watching) OR '' = ANY (v_watching))
    HAVING count(*) > 0;
  END IF;
END
$function$;
REVOKE EXECUTE ON FUNCTION {{schema}}.claim_tasks(queue_names text[], shares integer[], gap_ords integer[], gap_his integer[], gap_los integer[], band_ords integer[], band_priorities integer[], band_floors bigint[], older_than xid8, claim_limit integer, owner text, lease_ms double precision, max_bytes double precision, shift_ms double precision) FROM PUBLIC;
CREATE OR REPLACE FUNCTION {{schema}}.claim_limited(queue_names text[], wanted integer[], total integer, owner text, lease_ms double precision, shift_ms double precision)
 RETURNS TABLE(queue text, seq bigint, pending_seq bigint, priority smallint, id text, type text, payload jsonb, payload_bytes bytea, headers jsonb, retried integer, max_retry integer, timeout_ms double precision, deadline_in_ms double precision, retention_ms double precision, lease_token uuid, wait_ms double precision)
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $function$
#variable_conflict use_column
DECLARE
  now_at timestamptz := {{schema}}.task_clock(shift_ms);
  v_watching text[] := ARRAY(SELECT DISTINCT coalesce(w.queue, '') FROM {{schema}}.watchers w WHERE w.expires_at > now_at);
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
  PERFORM {{schema}}.check_claim_bounds(total, lease_ms);
  -- A limited claim commits durably, whatever the server's sessions do (they commit
  -- asynchronously: a lost claim only runs a task again). A claim lost in a crash after
  -- its worker started the tasks would no longer count them: other servers would start
  -- more than the limits allow while they still run. Local to this transaction.
  PERFORM set_config('synchronous_commit', 'on', true);
  -- In one order, so that claims of several limited queues never deadlock.
  PERFORM pg_advisory_xact_lock(hashtext('pgasynq limits ' || btrim('{{schema}}', '"')), k)
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
    ),
    -- Inspector.watch(): nothing is read or sent unless a watcher is registered.
    started AS (
      SELECT {{schema}}.send_task_events(array_agg({{schema}}.task_event('started', c.queue, i.id, i.type, c.retried + 1, now_at, NULL, NULL)
                                                   ORDER BY c.seq))
      FROM claimed c CROSS JOIN LATERAL (SELECT i.id, i.type FROM {{schema}}.task_inputs i WHERE i.seq = c.seq) i
      WHERE cardinality(v_watching) > 0 AND (c.queue = ANY (v_watching) OR '' = ANY (v_watching))
      HAVING count(*) > 0
    )
    SELECT c.queue, c.seq, c.pending_seq, c.priority, t.id, t.type, t.payload, t.payload_bytes, t.headers,
           c.retried, t.max_retry, (extract(epoch FROM t.timeout) * 1000)::float8,
           (extract(epoch FROM t.deadline - now_at) * 1000)::float8, (extract(epoch FROM t.retention) * 1000)::float8,
           c.lease_token, NULL::float8
    FROM claimed c JOIN {{schema}}.task_inputs t ON t.seq = c.seq
    WHERE (SELECT count(*) FROM started) >= 0;
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
$function$;
REVOKE EXECUTE ON FUNCTION {{schema}}.claim_limited(queue_names text[], wanted integer[], total integer, owner text, lease_ms double precision, shift_ms double precision) FROM PUBLIC;
CREATE OR REPLACE FUNCTION {{schema}}.task_states_deleted()
 RETURNS trigger
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $function$
DECLARE
  failed bigint;
BEGIN
  IF NOT EXISTS (SELECT 1 FROM gone WHERE gone.has_dependents OR gone.waiting_for IS NOT NULL OR gone.has_history OR gone.awaited) THEN
    RETURN NULL;
  END IF;
  -- Its attempts and log lines go with the task; a waiter learns it is gone.
  DELETE FROM {{schema}}.task_attempts a USING gone WHERE gone.has_history AND a.seq = gone.seq;
  DELETE FROM {{schema}}.task_logs l USING gone WHERE gone.has_history AND l.seq = gone.seq;
  PERFORM pg_notify({{schema}}.task_channel('_done'), gone.seq::text) FROM gone WHERE gone.awaited;
  DELETE FROM {{schema}}.task_dependencies t USING gone
  WHERE gone.waiting_for IS NOT NULL AND t.dependent_seq = gone.seq;
  PERFORM {{schema}}.settle_completed(array_agg(g.seq ORDER BY g.seq), array_agg(g.result ORDER BY g.seq),
                                      array_agg(g.result_bytes ORDER BY g.seq), TG_TABLE_SCHEMA)
  FROM gone g WHERE g.has_dependents AND g.state IN ('active', 'completed')
  HAVING count(*) > 0;
  FOR failed IN SELECT g.seq FROM gone g WHERE g.has_dependents AND g.state NOT IN ('active', 'completed') ORDER BY g.seq LOOP
    PERFORM {{schema}}.settle_failed(failed, TG_TABLE_SCHEMA);
  END LOOP;
  RETURN NULL;
END
$function$;

-- Notifies <schema>_done with the seq of an awaited task that completed or was
-- archived: its waiter reads the outcome (Client.waitFor). A deleted one is
-- announced by task_states_deleted().
CREATE FUNCTION {{schema}}.task_states_awaited() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
  PERFORM pg_notify({{schema}}.task_channel('_done'), NEW.seq::text);
  RETURN NULL;
END
$$;
REVOKE EXECUTE ON FUNCTION {{schema}}.task_states_awaited() FROM PUBLIC;
CREATE TRIGGER task_states_awaited AFTER UPDATE OF state ON {{schema}}.task_states
FOR EACH ROW WHEN (NEW.awaited AND NEW.state IN ('completed', 'archived') AND OLD.state IS DISTINCT FROM NEW.state)
EXECUTE FUNCTION {{schema}}.task_states_awaited();

-- Client.waitFor(): marks the tasks (queues[i], ids[i]) awaited, unless they
-- have finished already, and says of each whether its queue exists, its
-- state (null: no such task) and how its last recorded run ended. A
-- completed awaited task is kept at least 60 s, so its waiter can read the
-- outcome. The owner's: a producer calls it with no privilege on the tables.
CREATE FUNCTION {{schema}}.await_tasks(queues text[], ids text[])
RETURNS TABLE (queue text, id text, queue_found boolean, state text, last_outcome text)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
  IF cardinality(queues) IS DISTINCT FROM cardinality(ids) OR cardinality(ids) > 10000 THEN
    RAISE EXCEPTION USING ERRCODE = 'invalid_parameter_value', COLUMN = 'ids', MESSAGE = 'pgasynq: invalid ids: one queue per id, at most 10000';
  END IF;
  RETURN QUERY
  WITH asked AS (
    SELECT a.queue, a.id, i.seq FROM ROWS FROM (unnest(queues), unnest(ids)) AS a(queue, id)
    LEFT JOIN {{schema}}.task_inputs i ON i.queue = a.queue AND i.id = a.id
  ),
  marked AS (
    UPDATE {{schema}}.task_states s SET awaited = true
    WHERE s.seq = ANY (ARRAY(SELECT k.seq FROM asked k WHERE k.seq IS NOT NULL))
      AND NOT s.awaited AND s.state NOT IN ('completed', 'archived')
    RETURNING s.seq
  )
  SELECT k.queue, k.id, EXISTS (SELECT 1 FROM {{schema}}.queues q WHERE q.name = k.queue), s.state,
         (SELECT t.outcome FROM {{schema}}.task_attempts t WHERE t.seq = s.seq ORDER BY t.run DESC LIMIT 1)
  FROM asked k LEFT JOIN {{schema}}.task_states s ON s.seq = k.seq
  WHERE (SELECT count(*) FROM marked) >= 0;
END
$$;
REVOKE EXECUTE ON FUNCTION {{schema}}.await_tasks(text[], text[]) FROM PUBLIC;

-- Inspector.watch(): registers a watcher of `watch_queue` (null: every queue)
-- for `ttl_ms`, or renews watcher `watcher` (a new id when null or expired
-- and gone), and forgets watchers that expired. Returns the watcher's id.
CREATE FUNCTION {{schema}}.watch_tasks(watcher uuid, watch_queue text, ttl_ms double precision) RETURNS uuid
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  now_at timestamptz := {{schema}}.task_now();
  kept uuid;
BEGIN
  IF ttl_ms IS NULL OR NOT ttl_ms BETWEEN 1000 AND 3600000 THEN
    RAISE EXCEPTION USING ERRCODE = 'invalid_parameter_value', COLUMN = 'ttl', MESSAGE = 'pgasynq: invalid ttl: must be between 1000 and 3600000 ms';
  END IF;
  IF length(watch_queue) > 100 THEN
    RAISE EXCEPTION USING ERRCODE = 'invalid_parameter_value', COLUMN = 'queue', MESSAGE = 'pgasynq: invalid queue: at most 100 characters';
  END IF;
  DELETE FROM {{schema}}.watchers w WHERE w.expires_at < now_at;
  INSERT INTO {{schema}}.watchers (id, queue, expires_at)
  VALUES (coalesce(watcher, gen_random_uuid()), watch_queue, now_at + ttl_ms * interval '1 millisecond')
  ON CONFLICT (id) DO UPDATE SET expires_at = EXCLUDED.expires_at
  RETURNING id INTO kept;
  RETURN kept;
END
$$;
REVOKE EXECUTE ON FUNCTION {{schema}}.watch_tasks(uuid, text, double precision) FROM PUBLIC;

-- Ends a watch: no more events for it.
CREATE FUNCTION {{schema}}.unwatch_tasks(watcher uuid) RETURNS void
LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, pg_temp
AS $$ DELETE FROM {{schema}}.watchers w WHERE w.id = watcher $$;
REVOKE EXECUTE ON FUNCTION {{schema}}.unwatch_tasks(uuid) FROM PUBLIC;

-- pgasynq 0005: workflows. A task may wait for other tasks (its dependencies).
-- {{schema}} is replaced by the quoted schema name before this file runs.
--
--  * A task enqueued with unfinished dependencies is stored `waiting`, with
--    task_states.waiting_for counting the dependencies not yet settled (NULL
--    for a task that never had any).
--  * task_dependencies holds one row per (dependent, dependency): who waits
--    for whom, what to do if the dependency fails, and once it is settled
--    how (completed or failed) and the result it wrote, kept here until the
--    dependent itself is deleted, whatever the dependency's retention.
--  * A dependency's row has has_dependents set while some edge from it may be
--    unsettled. When such a task completes, is archived or is deleted, the
--    triggers below settle its edges in the same transaction: each dependent
--    loses one from waiting_for (its row is locked, so however many
--    dependencies finish at once each counts once) and the one that reaches
--    zero becomes pending (or scheduled, when its processAt is later); with a
--    failed dependency, the `archive` dependents are archived, and theirs in
--    turn. Nothing in the hot path changes for a task without dependents:
--    the triggers' WHEN clauses are false for it and no function runs.

ALTER TABLE {{schema}}.task_states
  ADD COLUMN waiting_for integer,
  ADD COLUMN has_dependents boolean NOT NULL DEFAULT false,
  DROP CONSTRAINT tasks_state_valid,
  ADD CONSTRAINT tasks_state_valid CHECK (state IN
    ('pending', 'active', 'scheduled', 'retry', 'archived', 'completed', 'aggregating', 'waiting')),
  ADD CONSTRAINT tasks_waiting_counts CHECK (state <> 'waiting' OR waiting_for > 0);

CREATE INDEX task_states_waiting_idx ON {{schema}}.task_states (queue, seq) WHERE state = 'waiting';

CREATE TABLE {{schema}}.task_dependencies (
  dependent_seq    bigint NOT NULL,
  dependency_seq   bigint NOT NULL,
  -- The dependency's name, for TaskInfo.dependsOn and the error of a failure,
  -- readable after the dependency's own rows are gone.
  dependency_queue text NOT NULL,
  dependency_id    text NOT NULL,
  on_failure       text NOT NULL DEFAULT 'archive',
  -- NULL until settled.
  outcome          text,
  result           jsonb,
  result_bytes     bytea,
  PRIMARY KEY (dependent_seq, dependency_seq),
  CONSTRAINT task_dependencies_on_failure CHECK (on_failure IN ('archive', 'run')),
  CONSTRAINT task_dependencies_outcome CHECK (outcome IN ('completed', 'failed'))
);
-- A dependency's dependents, in their seq order (the order settling locks them): the
-- settling below, and a task's page.
CREATE INDEX task_dependencies_dependency_idx ON {{schema}}.task_dependencies (dependency_seq, dependent_seq);

-- Settles the edges from dependencies that completed, all of them at once:
-- each edge takes its dependency's result, each dependent loses as many from
-- waiting_for as it had edges settled, and the one that reaches zero becomes
-- pending (at the back of its queue, as if enqueued now) or scheduled, when
-- its processAt is still ahead. The dependents are locked first, in seq
-- order: transactions settling dependencies of the same dependents queue up
-- behind each other instead of deadlocking, and each then decrements the row
-- as the one before left it, so only the last release happens, once.
-- This transaction has an id already (it wrote the dependencies' rows), as
-- every transaction that draws a pending position must (server/cursor.ts).
-- `schema_name` names the wake-up channels (`<schema>_tasks`, `<schema>_delayed`).
-- SECURITY DEFINER, as every function here: whoever completes, archives or
-- deletes a task settles its dependents, with no privilege of their own on them.
CREATE FUNCTION {{schema}}.settle_completed(deps bigint[], res jsonb[], res_bytes bytea[], schema_name text)
RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
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
                     WHEN s.run_at > now() THEN 'scheduled' ELSE 'pending' END,
        pending_seq = CASE WHEN s.state = 'waiting' AND s.waiting_for = c.n AND s.run_at <= now()
                           THEN nextval('{{schema}}.task_seq') ELSE s.pending_seq END,
        run_at = CASE WHEN s.state = 'waiting' AND s.waiting_for = c.n AND s.run_at <= now() THEN now() ELSE s.run_at END,
        updated_at = CASE WHEN s.state = 'waiting' AND s.waiting_for = c.n THEN now() ELSE s.updated_at END
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
$$;

-- Settles the edges from a dependency that failed (archived, or deleted before
-- it completed): its 'archive' dependents are archived with the error
-- `dependency <queue>/<id> failed`, and theirs in turn; its 'run' dependents
-- count it as done. What it archives may have dependents of its own, so this
-- walks a work list, dependent by dependent in seq order (a list, not
-- recursion: a chain of any length fails without deepening the stack).
CREATE FUNCTION {{schema}}.settle_failed(dependency bigint, schema_name text)
RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
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
        SET state = 'archived', waiting_for = s.waiting_for - 1, run_at = now(), last_failed_at = now(),
            has_dependents = false, updated_at = now(),
            error_msg = 'dependency ' || e.dependency_queue || '/' || e.dependency_id || ' failed'
        WHERE s.seq = d.seq;
        IF d.has_dependents THEN
          work := work || d.seq;
        END IF;
      ELSIF d.run_at > now() THEN
        UPDATE {{schema}}.task_states s SET state = 'scheduled', waiting_for = 0, updated_at = now() WHERE s.seq = d.seq;
        PERFORM pg_notify(schema_name || '_delayed', d.queue);
      ELSE
        UPDATE {{schema}}.task_states s
        SET state = 'pending', waiting_for = 0, pending_seq = nextval('{{schema}}.task_seq'), run_at = now(), updated_at = now()
        WHERE s.seq = d.seq;
        PERFORM pg_notify(schema_name || '_tasks', d.queue);
      END IF;
    END LOOP;
    n := n + 1;
  END LOOP;
END
$$;

-- Only the triggers below (running as the owner) settle dependencies: nobody
-- calls these directly (a new function is executable by PUBLIC by default).
REVOKE EXECUTE ON FUNCTION {{schema}}.settle_completed(bigint[], jsonb[], bytea[], text) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION {{schema}}.settle_failed(bigint, text) FROM PUBLIC;

-- A dependency finished by an update: completed (a completion with a
-- retention, or by hand) or archived (retries spent, SkipRetry, archiveTask,
-- the recoverer). A row trigger whose WHEN is false for every task without
-- dependents: the claim, heartbeats and other updates never call it.
CREATE FUNCTION {{schema}}.task_states_finished() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
  IF NEW.state = 'completed' THEN
    PERFORM {{schema}}.settle_completed(ARRAY[NEW.seq], ARRAY[NEW.result], ARRAY[NEW.result_bytes], TG_TABLE_SCHEMA);
  ELSE
    PERFORM {{schema}}.settle_failed(NEW.seq, TG_TABLE_SCHEMA);
  END IF;
  RETURN NULL;
END
$$;

CREATE TRIGGER task_states_finished AFTER UPDATE OF state ON {{schema}}.task_states
  FOR EACH ROW
  WHEN (NEW.has_dependents AND NEW.state IN ('completed', 'archived') AND OLD.state IS DISTINCT FROM NEW.state)
  EXECUTE FUNCTION {{schema}}.task_states_finished();

-- Rows deleted: once per statement, so that a batch of completions settles
-- its dependents in one pass (a trigger per row cost 50 times the delete).
-- A dependency deleted while active was completed (a completion without
-- retention deletes the row: its result goes into the edges); deleted in any
-- other unfinished state it failed. A dependent deleted takes its edges with
-- it: nobody will read their results. A statement that deletes no task with
-- dependencies or dependents stops at the first check.
CREATE FUNCTION {{schema}}.task_states_deleted() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  failed bigint;
BEGIN
  IF NOT EXISTS (SELECT 1 FROM gone WHERE gone.has_dependents OR gone.waiting_for IS NOT NULL) THEN
    RETURN NULL;
  END IF;
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
$$;

CREATE TRIGGER task_states_deleted AFTER DELETE ON {{schema}}.task_states
  REFERENCING OLD TABLE AS gone
  FOR EACH STATEMENT
  EXECUTE FUNCTION {{schema}}.task_states_deleted();

-- The view shows how many dependencies a task still waits for.
CREATE OR REPLACE VIEW {{schema}}.tasks AS
SELECT i.queue, i.id, i.type, i.payload, i.payload_bytes, i.headers, s.state, i.max_retry, s.retried,
       i.timeout, i.deadline, i.unique_key, s.group_key, i.retention, s.run_at, s.lease_owner,
       s.lease_expires_at, s.lease_token, s.started_at, s.cancel_requested, s.error_msg, s.last_failed_at,
       s.completed_at, s.result, s.result_bytes, i.enqueued_at, s.updated_at, i.seq, s.pending_seq,
       s.waiting_for
FROM {{schema}}.task_states s
JOIN {{schema}}.task_inputs i ON i.seq = s.seq;

-- Counts with the waiting state (see 0002 and 0004 for the SET clauses).
DROP VIEW {{schema}}.queue_stats;
DROP FUNCTION {{schema}}.queue_counts(text);

CREATE FUNCTION {{schema}}.queue_counts(queue_name text)
RETURNS TABLE (pending bigint, active bigint, scheduled bigint, retry bigint, archived bigint,
               completed bigint, aggregating bigint, groups bigint, oldest_pending timestamptz, waiting bigint)
LANGUAGE sql STABLE
SET jit = off
SET max_parallel_workers_per_gather = 0
AS $$
  SELECT
    (SELECT count(*) FROM {{schema}}.task_states t WHERE t.queue = queue_name AND t.state = 'pending'),
    (SELECT count(*) FROM {{schema}}.task_states t WHERE t.queue = queue_name AND t.state = 'active' AND t.lease_owner IS NOT NULL),
    (SELECT count(*) FROM {{schema}}.task_states t WHERE t.queue = queue_name AND t.state = 'scheduled'),
    (SELECT count(*) FROM {{schema}}.task_states t WHERE t.queue = queue_name AND t.state = 'retry'),
    (SELECT count(*) FROM {{schema}}.task_states t WHERE t.queue = queue_name AND t.state = 'archived'),
    (SELECT count(*) FROM {{schema}}.task_states t WHERE t.queue = queue_name AND t.state = 'completed'),
    (SELECT count(*) FROM {{schema}}.task_states t WHERE t.queue = queue_name AND t.state = 'aggregating'),
    (SELECT count(DISTINCT t.group_key) FROM {{schema}}.task_states t WHERE t.queue = queue_name AND t.state = 'aggregating'),
    (SELECT min(t.run_at) FROM {{schema}}.task_states t WHERE t.queue = queue_name AND t.state = 'pending'),
    (SELECT count(*) FROM {{schema}}.task_states t WHERE t.queue = queue_name AND t.state = 'waiting')
$$;

CREATE VIEW {{schema}}.queue_stats AS
SELECT
  q.name AS queue,
  q.paused,
  c.pending + c.active + c.scheduled + c.retry + c.archived + c.completed + c.aggregating + c.waiting AS size,
  c.groups,
  greatest(coalesce(now() - c.oldest_pending, interval '0'), interval '0') AS latency,
  greatest(coalesce(extract(epoch FROM now() - c.oldest_pending) * 1000, 0), 0)::float8 AS latency_ms,
  c.pending, c.active, c.scheduled, c.retry, c.archived, c.completed, c.aggregating,
  coalesce(d.processed, 0) AS processed,
  coalesce(d.failed, 0) AS failed,
  q.processed_total,
  q.failed_total,
  now() AS timestamp,
  c.waiting
FROM {{schema}}.queues q
CROSS JOIN LATERAL {{schema}}.queue_counts(q.name) c
LEFT JOIN {{schema}}.daily_stats d ON d.queue = q.name AND d.day = (now() AT TIME ZONE 'UTC')::date;

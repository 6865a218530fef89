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
-- A dependency's dependents: the settling below, and a task's page.
CREATE INDEX task_dependencies_dependency_idx ON {{schema}}.task_dependencies (dependency_seq);

-- Settles every unsettled edge from one dependency, and from the dependents
-- that this archives in turn (a work list, not recursion: a chain of any
-- length fails without deepening the stack). Dependents are locked in seq
-- order, edge by edge, so two transactions settling dependencies of the same
-- dependents wait for each other instead of deadlocking, and each decrement
-- is applied to the row as the other left it. `schema_name` names the
-- wake-up channels (`<schema>_tasks`, `<schema>_delayed`).
-- SECURITY DEFINER: whoever completes, archives or deletes a task settles its
-- dependents, with no privilege of their own on them.
CREATE FUNCTION {{schema}}.settle_dependents(dependency bigint, outcome text, res jsonb, res_bytes bytea, schema_name text)
RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  work bigint[] := ARRAY[dependency];
  n integer := 1;
  dep bigint;
  dep_outcome text;
  e record;
  d record;
BEGIN
  WHILE n <= cardinality(work) LOOP
    dep := work[n];
    -- Every task after the first is one this settling archived: a failure for its own dependents.
    dep_outcome := CASE WHEN n = 1 THEN outcome ELSE 'failed' END;
    FOR e IN
      SELECT t.dependent_seq, t.on_failure, t.dependency_queue, t.dependency_id
      FROM {{schema}}.task_dependencies t
      WHERE t.dependency_seq = dep AND t.outcome IS NULL
      ORDER BY t.dependent_seq
      FOR UPDATE
    LOOP
      UPDATE {{schema}}.task_dependencies t
      SET outcome = dep_outcome,
          result = CASE WHEN dep_outcome = 'completed' THEN res END,
          result_bytes = CASE WHEN dep_outcome = 'completed' THEN res_bytes END
      WHERE t.dependent_seq = e.dependent_seq AND t.dependency_seq = dep;
      SELECT s.seq, s.queue, s.state, s.waiting_for, s.run_at, s.has_dependents INTO d
      FROM {{schema}}.task_states s WHERE s.seq = e.dependent_seq
      FOR UPDATE;
      IF d.state <> 'waiting' OR d.waiting_for > 1 AND NOT (dep_outcome = 'failed' AND e.on_failure = 'archive') THEN
        -- Still waiting for others, or no longer waiting at all (run by hand, archived).
        UPDATE {{schema}}.task_states s SET waiting_for = s.waiting_for - 1 WHERE s.seq = d.seq;
      ELSIF dep_outcome = 'failed' AND e.on_failure = 'archive' THEN
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
        -- The back of its queue, as if enqueued now (this transaction has an
        -- id already: it wrote the dependency's row, see server/cursor.ts).
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
-- calls this directly (a new function is executable by PUBLIC by default).
REVOKE EXECUTE ON FUNCTION {{schema}}.settle_dependents(bigint, text, jsonb, bytea, text) FROM PUBLIC;

-- A dependency finished: completed (a completion with a retention, or by hand)
-- or archived (retries spent, SkipRetry, archiveTask, the recoverer).
CREATE FUNCTION {{schema}}.task_states_finished() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
  PERFORM {{schema}}.settle_dependents(NEW.seq, CASE WHEN NEW.state = 'completed' THEN 'completed' ELSE 'failed' END,
                                       NEW.result, NEW.result_bytes, TG_TABLE_SCHEMA);
  RETURN NULL;
END
$$;

CREATE TRIGGER task_states_finished AFTER UPDATE OF state ON {{schema}}.task_states
  FOR EACH ROW
  WHEN (NEW.has_dependents AND NEW.state IN ('completed', 'archived') AND OLD.state IS DISTINCT FROM NEW.state)
  EXECUTE FUNCTION {{schema}}.task_states_finished();

-- A task's row deleted. A dependency deleted while active was completed (a
-- completion without retention deletes the row: its result goes with it into
-- the edges); deleted in any other unfinished state it failed. A dependent
-- deleted takes its edges with it: nobody will read their results.
CREATE FUNCTION {{schema}}.task_states_deleted() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
  IF OLD.waiting_for IS NOT NULL THEN
    DELETE FROM {{schema}}.task_dependencies WHERE dependent_seq = OLD.seq;
  END IF;
  IF OLD.has_dependents THEN
    PERFORM {{schema}}.settle_dependents(OLD.seq, CASE WHEN OLD.state IN ('active', 'completed') THEN 'completed' ELSE 'failed' END,
                                         OLD.result, OLD.result_bytes, TG_TABLE_SCHEMA);
  END IF;
  RETURN NULL;
END
$$;

CREATE TRIGGER task_states_deleted AFTER DELETE ON {{schema}}.task_states
  FOR EACH ROW
  WHEN (OLD.has_dependents OR OLD.waiting_for IS NOT NULL)
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

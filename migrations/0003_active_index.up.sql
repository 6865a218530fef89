-- pgasynq 0003: the index of active tasks, rebuilt so that no lease lookup and
-- no heartbeat goes through it.
--
-- 0001 indexed active rows by lease_expires_at WHERE state = 'active'. Two costs:
--  * Every fenced write (heartbeat, completion, failure) finds its rows by
--    (queue, id, lease_token) AND state = 'active'. That predicate matches the
--    partial index, and when its statistics were taken while it was empty (the
--    usual case at the start of a burst, and always without autovacuum) the
--    planner scanned the whole index once per lease instead of probing the
--    primary key: seen here, a heartbeat of a busy server ran for ten minutes
--    over 23,000 active rows and 590,000 dead index entries.
--  * A heartbeat changes lease_expires_at; an indexed column makes every
--    heartbeat a non-HOT update that writes a new entry into every index.
-- The new index is keyed by what the Inspector reads (a queue's active tasks
-- by start) and its predicate also names lease_owner, which every active row
-- has (tasks_active_has_lease): the fenced lookups do not say it, so they
-- cannot take this index and go by the primary key; the recoverer, the
-- Inspector and cancelProcessing say it, and take it.
DROP INDEX {{schema}}.tasks_active_idx;
CREATE INDEX tasks_active_idx ON {{schema}}.tasks (queue, started_at, seq)
  WHERE state = 'active' AND lease_owner IS NOT NULL;

CREATE OR REPLACE FUNCTION {{schema}}.queue_counts(queue_name text)
RETURNS TABLE (pending bigint, active bigint, scheduled bigint, retry bigint, archived bigint,
               completed bigint, aggregating bigint, groups bigint, oldest_pending timestamptz)
LANGUAGE sql STABLE
SET jit = off
SET max_parallel_workers_per_gather = 0
AS $$
  SELECT
    (SELECT count(*) FROM {{schema}}.tasks t WHERE t.queue = queue_name AND t.state = 'pending'),
    (SELECT count(*) FROM {{schema}}.tasks t WHERE t.queue = queue_name AND t.state = 'active' AND t.lease_owner IS NOT NULL),
    (SELECT count(*) FROM {{schema}}.tasks t WHERE t.queue = queue_name AND t.state = 'scheduled'),
    (SELECT count(*) FROM {{schema}}.tasks t WHERE t.queue = queue_name AND t.state = 'retry'),
    (SELECT count(*) FROM {{schema}}.tasks t WHERE t.queue = queue_name AND t.state = 'archived'),
    (SELECT count(*) FROM {{schema}}.tasks t WHERE t.queue = queue_name AND t.state = 'completed'),
    (SELECT count(*) FROM {{schema}}.tasks t WHERE t.queue = queue_name AND t.state = 'aggregating'),
    (SELECT count(DISTINCT t.group_key) FROM {{schema}}.tasks t WHERE t.queue = queue_name AND t.state = 'aggregating'),
    (SELECT min(t.run_at) FROM {{schema}}.tasks t WHERE t.queue = queue_name AND t.state = 'pending')
$$;

CREATE OR REPLACE VIEW {{schema}}.active_tasks AS
SELECT
  t.queue,
  t.id,
  t.type,
  t.lease_owner,
  t.started_at,
  t.lease_expires_at,
  t.lease_expires_at < now() AS orphaned,
  t.cancel_requested,
  t.retried,
  t.max_retry
FROM {{schema}}.tasks t
WHERE t.state = 'active' AND t.lease_owner IS NOT NULL;

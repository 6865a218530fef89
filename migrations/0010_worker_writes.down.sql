-- Back to 0009: the server writes the tables itself again (rerun `pgasynq
-- roles` after migrating down, to give the worker its table grants back).
-- What an earlier, unreleased form of 0010 did not create is dropped only if
-- it exists, and 0007's claim_limited() is made again whether or not it is
-- still there: a schema migrated by either form goes back to 0009.

-- ---------------------------------------------------------------------
-- The claim (broker/claim.ts)
-- ---------------------------------------------------------------------

DROP FUNCTION IF EXISTS {{schema}}.claim_tasks(text[], integer[], integer[], integer[], integer[], integer[], integer[], bigint[], xid8, integer, text, float8, float8, float8);
DROP FUNCTION IF EXISTS {{schema}}.claim_limited(text[], integer[], integer, text, float8, float8);

-- 0007's claim_limited(), with 0009's pinned search_path.
-- Claims from the limited queues `queue_names`, in that order, up to
-- `wanted[i]` tasks from each and `total` in all, within their limits; `now_at` is the claim's
-- database time (lease and deadline). Returns the claimed tasks, and for
-- each queue that its limits kept from giving all it was asked while tasks
-- were pending, one row with seq NULL: wait_ms is when the rate window
-- frees a start (NULL when only active tasks finishing can free a slot).
CREATE OR REPLACE FUNCTION {{schema}}.claim_limited(queue_names text[], wanted integer[], total integer, owner text, lease_ms float8,
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
ALTER FUNCTION {{schema}}.claim_limited(text[], integer[], integer, text, float8, timestamptz, text) SET search_path = pg_catalog, pg_temp;

-- ---------------------------------------------------------------------
-- The fenced writes of a lease (broker/leases.ts)
-- ---------------------------------------------------------------------

DROP FUNCTION IF EXISTS {{schema}}.lock_lease(bigint, uuid);
DROP FUNCTION IF EXISTS {{schema}}.extend_leases(bigint[], uuid[], float8, float8);
DROP FUNCTION IF EXISTS {{schema}}.complete_tasks(bigint[], uuid[], boolean[], float8);
DROP FUNCTION IF EXISTS {{schema}}.fail_tasks(bigint[], uuid[], boolean[], boolean[], float8[], text[], float8);
DROP FUNCTION IF EXISTS {{schema}}.snooze_tasks(bigint[], uuid[], float8[], float8);
DROP FUNCTION IF EXISTS {{schema}}.requeue_tasks(bigint[], uuid[], float8);
DROP FUNCTION IF EXISTS {{schema}}.write_result(bigint, uuid, jsonb, bytea, float8);
DROP FUNCTION IF EXISTS {{schema}}.lease_batch(bigint[], uuid[], integer[]);
DROP FUNCTION IF EXISTS {{schema}}.check_delays(float8[]);

-- ---------------------------------------------------------------------
-- The forwarder, the recoverer and the janitor (broker/maintenance.ts)
-- and the aggregator (broker/aggregation.ts)
-- ---------------------------------------------------------------------

DROP FUNCTION {{schema}}.forward_due(integer, float8);
DROP FUNCTION IF EXISTS {{schema}}.expired_leases(integer, boolean, float8, float8, float8);
DROP FUNCTION {{schema}}.recover_leases(bigint[], uuid[], boolean[], float8[], float8, float8, float8);
DROP FUNCTION {{schema}}.drop_orphans(bigint[], uuid[], float8, float8, float8);
DROP FUNCTION {{schema}}.check_recovery_bounds(float8, float8);
DROP FUNCTION {{schema}}.delete_expired_completed(integer, float8);
DROP FUNCTION {{schema}}.delete_expired_locks(integer, float8);
DROP FUNCTION {{schema}}.trim_archive(integer, float8);
DROP FUNCTION {{schema}}.commit_group(text, text, bigint[]);
DROP FUNCTION IF EXISTS {{schema}}.check_claim_bounds(integer, float8);

DROP TRIGGER IF EXISTS task_states_release_lease ON {{schema}}.task_states;
DROP FUNCTION IF EXISTS {{schema}}.release_lease();

DROP FUNCTION {{schema}}.task_clock(float8);
DROP FUNCTION {{schema}}.task_channel(text);

-- pgasynq 0010: the worker writes tasks only through the owner's functions.
-- {{schema}} is replaced by the quoted schema name before this file runs.
--
-- Every statement a server runs that changes task_states, task_inputs or
-- unique_locks (the claim, the fenced writes of a lease, the forwarder, the
-- recoverer, the janitor, the aggregator) is a SECURITY DEFINER function
-- here, with search_path pinned: the worker role holds no INSERT, UPDATE or
-- DELETE on those tables (broker/roles.ts), so it can take no row lock that
-- stops a claim, write no state the library would not, and skip no fence.
-- Each function decides time with task_clock(): the database's now(),
-- moved only for a login that is the owner (a test's DatabaseClock).

-- The database's now() as the task functions decide by it: PostgreSQL's,
-- moved forward by `shift_ms` (internal/clock.ts DatabaseClock, which only
-- tests move). Called from the owner's SECURITY DEFINER functions, where
-- current_user is the owner: a shift is honoured only when the login that
-- called them is the owner or a member of it, so no worker can move time to
-- recover another's lease early or keep its own past its expiry.
CREATE FUNCTION {{schema}}.task_clock(shift_ms float8) RETURNS timestamptz
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, pg_temp AS $$
BEGIN
  IF shift_ms IS NULL OR shift_ms = 0 THEN
    RETURN now();
  END IF;
  IF shift_ms < 0 OR shift_ms = 'Infinity'::float8 OR shift_ms <> shift_ms
     OR NOT pg_has_role(session_user, current_user, 'MEMBER') THEN
    RAISE EXCEPTION USING ERRCODE = 'insufficient_privilege', COLUMN = 'clock',
      MESSAGE = 'pgasynq: a moved clock is the owner''s alone (tests): other logins run on the database''s now()';
  END IF;
  RETURN now() + shift_ms * interval '1 millisecond';
END
$$;

-- The channel a task function notifies: '_tasks', '_delayed' or '_sweep'
-- after the schema's name (model/validate.ts CHANNEL_SUFFIXES), as
-- Db.channels names them. {{schema}} is the quoted name, and a schema name is
-- ^[a-z_][a-z0-9_]*$, so the quotes are all there is to take off.
CREATE FUNCTION {{schema}}.task_channel(suffix text) RETURNS text
LANGUAGE sql IMMUTABLE SET search_path = pg_catalog, pg_temp
RETURN btrim('{{schema}}', '"') || suffix;

-- ---------------------------------------------------------------------
-- The claim (broker/claim.ts)
-- ---------------------------------------------------------------------



-- ---------------------------------------------------------------------
-- The fenced writes of a lease (broker/leases.ts)
-- ---------------------------------------------------------------------



-- ---------------------------------------------------------------------
-- The forwarder, the recoverer and the janitor (broker/maintenance.ts)
-- and the aggregator (broker/aggregation.ts)
-- ---------------------------------------------------------------------

-- The bounds a recoverer is given (ServerConfig.recoverCutoff and
-- leaseDuration, as config.ts validates them), refused as 22023 when out of
-- range: they decide which leases count as lost, and a negative cutoff or a
-- lease of no length would make every live lease of every worker recoverable.
CREATE FUNCTION {{schema}}.check_recovery_bounds(cutoff_ms float8, lease_ms float8) RETURNS void
LANGUAGE plpgsql IMMUTABLE SET search_path = pg_catalog, pg_temp AS $$
BEGIN
  -- A Node.js timer's longest wait: what any duration of the config may be.
  IF NOT coalesce(cutoff_ms BETWEEN 0 AND 2147483647, false) THEN
    RAISE EXCEPTION USING ERRCODE = 'invalid_parameter_value', COLUMN = 'recoverCutoff',
      MESSAGE = format('pgasynq: invalid recoverCutoff: must be a finite duration in ms in [0, 2147483647] (got %s)', coalesce(cutoff_ms::text, 'NULL'));
  END IF;
  IF NOT coalesce(lease_ms BETWEEN 100 AND 2147483647, false) THEN
    RAISE EXCEPTION USING ERRCODE = 'invalid_parameter_value', COLUMN = 'leaseDuration',
      MESSAGE = format('pgasynq: invalid leaseDuration: must be a finite duration in ms in [100, 2147483647] (got %s)', coalesce(lease_ms::text, 'NULL'));
  END IF;
END
$$;

-- The forwarder (maintenance.ts forwardDue): up to `batch_size` due scheduled
-- and retry tasks become pending (or aggregating, for a grouped task), and
-- their queues are notified. Returns how many moved.
CREATE FUNCTION {{schema}}.forward_due(batch_size integer, shift_ms float8) RETURNS integer
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  v_now timestamptz := {{schema}}.task_clock(shift_ms);
  moved_count integer;
BEGIN
  WITH moved AS (
    UPDATE {{schema}}.task_states s
    SET state = CASE WHEN s.group_key IS NULL THEN 'pending' ELSE 'aggregating' END,
        run_at = CASE WHEN s.group_key IS NULL THEN v_now END,
        pending_seq = CASE WHEN s.group_key IS NULL THEN d.position END, updated_at = v_now
    FROM (
      -- Positions drawn after the sort: tasks due first go first.
      SELECT x.seq, nextval('{{schema}}.task_seq') AS position FROM (
        SELECT seq FROM {{schema}}.task_states
        WHERE state IN ('scheduled', 'retry') AND run_at <= v_now
        ORDER BY run_at LIMIT batch_size FOR UPDATE SKIP LOCKED
      ) x
    ) d
    WHERE s.seq = d.seq
    RETURNING s.queue, s.state
  ),
  notified AS (
    SELECT pg_notify({{schema}}.task_channel('_tasks'), queue) FROM (SELECT DISTINCT queue FROM moved WHERE state = 'pending') q
  )
  SELECT count(*)::int INTO moved_count FROM moved WHERE (SELECT count(*) FROM notified) >= 0;
  RETURN moved_count;
END
$$;

-- The recoverer's write (maintenance.ts recoverLeases): each task of `seqs`
-- goes to retry after its delay, or to the archive, as the parallel arrays
-- say, only if it is still active under the lease `tokens` names and still
-- recoverable by the bounds (expired more than `cutoff_ms` ago, or impossibly
-- far in the future: the predicate of findExpired's recoverable(), which
-- picked them). Returns the seqs moved, each with whether it was archived.
CREATE FUNCTION {{schema}}.recover_leases(seqs bigint[], tokens uuid[], archives boolean[], delays_ms float8[],
                                          cutoff_ms float8, lease_ms float8, shift_ms float8)
RETURNS TABLE (task_seq bigint, archived boolean)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  v_now timestamptz := {{schema}}.task_clock(shift_ms);
BEGIN
  PERFORM {{schema}}.check_recovery_bounds(cutoff_ms, lease_ms);
  RETURN QUERY
  WITH recovered AS (
    UPDATE {{schema}}.task_states s
    SET state = CASE WHEN h.archive THEN 'archived' ELSE 'retry' END,
        retried = s.retried + CASE WHEN h.archive THEN 0 ELSE 1 END,
        run_at = v_now + CASE WHEN h.archive THEN interval '0' ELSE h.delay_ms * interval '1 millisecond' END,
        error_msg = 'task lease expired', last_failed_at = v_now,
        -- rows.ts leaseReleased(), spelled out.
        lease_owner = NULL, lease_token = NULL, lease_expires_at = NULL, updated_at = v_now
    FROM ROWS FROM (unnest(seqs), unnest(tokens), unnest(archives), unnest(delays_ms)) AS h(seq, token, archive, delay_ms)
    WHERE s.seq = h.seq AND s.state = 'active' AND s.lease_token = h.token
      AND (s.lease_expires_at < v_now - cutoff_ms * interval '1 millisecond'
           OR s.lease_expires_at > v_now + lease_ms * interval '1 millisecond' + interval '1 minute')
      -- A row locked by a ctx.transaction that is still running (a busy statement, which
      -- no idle timeout ends) is skipped, not waited for: the next tick tries it again,
      -- and the rest of the batch is rescued now.
      AND s.seq = ANY(ARRAY(SELECT l.seq FROM {{schema}}.task_states l WHERE l.seq = ANY(seqs)
                            ORDER BY l.seq FOR UPDATE SKIP LOCKED))
    RETURNING s.seq, h.archive, s.queue
  ),
  -- A retry may be due sooner than the forwarders' sleep.
  notified AS (
    SELECT pg_notify({{schema}}.task_channel('_delayed'), queue) FROM (SELECT DISTINCT queue FROM recovered WHERE NOT archive) q
  )
  SELECT r.seq, r.archive FROM recovered r WHERE (SELECT count(*) FROM notified) >= 0;
END
$$;

-- The recoverer's delete (maintenance.ts dropOrphans): the active state rows
-- of `seqs` that have no inputs, if still so under the lease `tokens` names
-- and still recoverable (as in recover_leases). A locked row is left for the
-- next tick. Returns the seqs deleted.
CREATE FUNCTION {{schema}}.drop_orphans(seqs bigint[], tokens uuid[], cutoff_ms float8, lease_ms float8, shift_ms float8)
RETURNS SETOF bigint
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  v_now timestamptz := {{schema}}.task_clock(shift_ms);
BEGIN
  PERFORM {{schema}}.check_recovery_bounds(cutoff_ms, lease_ms);
  RETURN QUERY
  DELETE FROM {{schema}}.task_states s
  USING ROWS FROM (unnest(seqs), unnest(tokens)) AS h(seq, token)
  WHERE s.seq = h.seq AND s.state = 'active' AND s.lease_token = h.token
    AND (s.lease_expires_at < v_now - cutoff_ms * interval '1 millisecond'
         OR s.lease_expires_at > v_now + lease_ms * interval '1 millisecond' + interval '1 minute')
    AND NOT EXISTS (SELECT 1 FROM {{schema}}.task_inputs i WHERE i.seq = s.seq)
    AND s.seq = ANY(ARRAY(SELECT l.seq FROM {{schema}}.task_states l WHERE l.seq = ANY(seqs)
                          ORDER BY l.seq FOR UPDATE SKIP LOCKED))
  RETURNING s.seq;
END
$$;

-- The janitor (maintenance.ts deleteExpiredCompleted): up to `batch_size`
-- completed tasks whose retention has ended, inputs and state. Returns how many.
CREATE FUNCTION {{schema}}.delete_expired_completed(batch_size integer, shift_ms float8) RETURNS integer
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  v_now timestamptz := {{schema}}.task_clock(shift_ms);
  deleted integer;
BEGIN
  WITH d AS (
    DELETE FROM {{schema}}.task_states s USING (
      SELECT seq FROM {{schema}}.task_states WHERE state = 'completed' AND run_at <= v_now
      ORDER BY run_at LIMIT batch_size FOR UPDATE SKIP LOCKED
    ) x WHERE s.seq = x.seq RETURNING s.seq
  ),
  inputs AS (DELETE FROM {{schema}}.task_inputs i USING d WHERE i.seq = d.seq)
  SELECT count(*)::int INTO deleted FROM d;
  RETURN deleted;
END
$$;

-- The janitor (maintenance.ts deleteExpiredLocks): up to `batch_size` unique
-- locks past their TTL. Returns how many.
CREATE FUNCTION {{schema}}.delete_expired_locks(batch_size integer, shift_ms float8) RETURNS integer
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  v_now timestamptz := {{schema}}.task_clock(shift_ms);
  deleted integer;
BEGIN
  WITH d AS (
    DELETE FROM {{schema}}.unique_locks l USING (
      SELECT queue, key FROM {{schema}}.unique_locks WHERE expires_at <= v_now
      LIMIT batch_size FOR UPDATE SKIP LOCKED
    ) x WHERE l.queue = x.queue AND l.key = x.key RETURNING 1
  )
  SELECT count(*)::int INTO deleted FROM d;
  RETURN deleted;
END
$$;

-- The janitor (maintenance.ts trimArchive): trims each queue's archive as
-- asynq does, up to `batch_size` tasks per call: archived tasks older than 90
-- days (of 24 hours) and all but the newest 10,000 of a queue go. The bounds
-- are asynq's and fixed here, not the caller's: a caller's would let it empty
-- the archive. Returns how many went.
CREATE FUNCTION {{schema}}.trim_archive(batch_size integer, shift_ms float8) RETURNS integer
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  v_now timestamptz := {{schema}}.task_clock(shift_ms);
  max_size constant integer := 10000;
  max_age constant interval := interval '2160 hours';
  deleted integer;
BEGIN
  WITH doomed AS (
    SELECT a.seq FROM {{schema}}.queues q CROSS JOIN LATERAL (
      SELECT s.seq FROM {{schema}}.task_states s
      WHERE s.queue = q.name AND s.state = 'archived'
      ORDER BY s.run_at DESC OFFSET max_size
    ) a
    UNION
    SELECT seq FROM {{schema}}.task_states
    WHERE state = 'archived' AND run_at < v_now - max_age
  ),
  d AS (
    DELETE FROM {{schema}}.task_states s USING (
      SELECT s.seq FROM {{schema}}.task_states s JOIN doomed USING (seq)
      WHERE s.state = 'archived' LIMIT batch_size FOR UPDATE OF s SKIP LOCKED
    ) x WHERE s.seq = x.seq RETURNING s.seq
  ),
  inputs AS (DELETE FROM {{schema}}.task_inputs i USING d WHERE i.seq = d.seq)
  SELECT count(*)::int INTO deleted FROM d;
  RETURN deleted;
END
$$;

-- The aggregator's commit (aggregation.ts commitGroup), in the caller's
-- transaction, which then enqueues the aggregate: deletes the members `seqs`
-- of the group that are still aggregating in it, their inputs and the unique
-- locks they still hold. Returns how many members it deleted (inputs
-- counted): the caller rolls back unless that is all of them.
--
-- The members are deleted from the tables by their seqs, in one statement
-- (either index that finds them meets them in seq order, so two servers
-- closing one group lock in the same order).
CREATE FUNCTION {{schema}}.commit_group(group_queue text, group_name text, seqs bigint[]) RETURNS integer
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp
-- Planned at every call with the seqs as a constant, whose test PostgreSQL hashes; a generic
-- plan would compare each row with the seqs one by one.
SET plan_cache_mode = force_custom_plan AS $$
DECLARE
  deleted integer;
BEGIN
  WITH gone AS (
    DELETE FROM {{schema}}.task_states s
    WHERE s.seq = ANY(seqs) AND s.state = 'aggregating' AND s.queue = group_queue AND s.group_key = group_name
    RETURNING s.seq
  ),
  inputs AS (
    DELETE FROM {{schema}}.task_inputs i WHERE i.seq = ANY(ARRAY(SELECT seq FROM gone))
    RETURNING i.id, i.unique_key
  ),
  -- The locks the members still hold: probed by key, each checked against the member's id
  -- through one map (ids are unique in a queue), never a join planned on a guess.
  unlocked AS (
    DELETE FROM {{schema}}.unique_locks l
    WHERE l.queue = group_queue AND l.key = ANY(ARRAY(SELECT unique_key FROM inputs WHERE unique_key IS NOT NULL))
      AND (SELECT jsonb_object_agg(id, unique_key) FROM inputs WHERE unique_key IS NOT NULL) ->> l.task_id = l.key
  )
  SELECT count(*)::int INTO deleted FROM inputs;
  RETURN deleted;
END
$$;

REVOKE EXECUTE ON FUNCTION {{schema}}.check_recovery_bounds(float8, float8) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION {{schema}}.forward_due(integer, float8) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION {{schema}}.recover_leases(bigint[], uuid[], boolean[], float8[], float8, float8, float8) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION {{schema}}.drop_orphans(bigint[], uuid[], float8, float8, float8) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION {{schema}}.delete_expired_completed(integer, float8) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION {{schema}}.delete_expired_locks(integer, float8) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION {{schema}}.trim_archive(integer, float8) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION {{schema}}.commit_group(text, text, bigint[]) FROM PUBLIC;

REVOKE EXECUTE ON FUNCTION {{schema}}.task_clock(float8) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION {{schema}}.task_channel(text) FROM PUBLIC;

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

-- A task that is not active holds no lease: every write that moves a task out
-- of active (a completion kept for its retention, a failure, a snooze, a give
-- back, a recovery, an Inspector action, a repair in SQL through the view or
-- the table) has its lease cleared here, the one place that says so. The
-- condition is evaluated before any function is called: a claim, an extension
-- or any write of an active task costs nothing more.
CREATE FUNCTION {{schema}}.release_lease() RETURNS trigger
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
BEGIN
  NEW.lease_owner := NULL;
  NEW.lease_token := NULL;
  NEW.lease_expires_at := NULL;
  RETURN NEW;
END
$$;
CREATE TRIGGER task_states_release_lease BEFORE UPDATE ON {{schema}}.task_states FOR EACH ROW
WHEN (NEW.state <> 'active' AND (NEW.lease_owner IS NOT NULL OR NEW.lease_token IS NOT NULL OR NEW.lease_expires_at IS NOT NULL))
EXECUTE FUNCTION {{schema}}.release_lease();
REVOKE EXECUTE ON FUNCTION {{schema}}.release_lease() FROM PUBLIC;

-- ---------------------------------------------------------------------
-- The claim (broker/claim.ts)
-- ---------------------------------------------------------------------

-- The bounds a claim is given (ServerConfig.leaseDuration, and how many tasks
-- and bytes one claim may take), refused as 22023 when out of range: a lease
-- of no length would let the next recoverer take back what was just claimed.
CREATE FUNCTION {{schema}}.check_claim_bounds(claim_limit integer, lease_ms float8) RETURNS void
LANGUAGE plpgsql IMMUTABLE SET search_path = pg_catalog, pg_temp AS $$
BEGIN
  IF NOT coalesce(claim_limit BETWEEN 0 AND 100000, false) THEN
    RAISE EXCEPTION USING ERRCODE = 'invalid_parameter_value', COLUMN = 'limit',
      MESSAGE = format('pgasynq: invalid claim limit: must be an integer in [0, 100000] (got %s)', coalesce(claim_limit::text, 'NULL'));
  END IF;
  IF NOT coalesce(lease_ms BETWEEN 100 AND 2147483647, false) THEN
    RAISE EXCEPTION USING ERRCODE = 'invalid_parameter_value', COLUMN = 'leaseDuration',
      MESSAGE = format('pgasynq: invalid leaseDuration: must be a finite duration in ms in [100, 2147483647] (got %s)', coalesce(lease_ms::text, 'NULL'));
  END IF;
END
$$;

-- The claim (claim.ts claimFrom): up to `claim_limit` pending tasks of the
-- queues `queue_names` (not paused, without limits) into leases of `owner`,
-- each queue's share `shares[i]` first, then what the shares left in the
-- queues' order; higher priority first, FIFO within a priority, each band
-- (a queue's tasks of one priority) scanned from above its floor. The bands
-- the claim cursor knows are `band_ords` (the queue's number in
-- `queue_names`), `band_priorities` and `band_floors`; the gaps between them
-- (`gap_ords`, `gap_his`, `gap_los`, open intervals of priorities) are
-- probed for bands it does not know yet, scanned from the head. Of the
-- locked rows it takes the longest run in its order whose inputs stay within
-- `max_bytes` (one task at least). The first row also carries the mark the
-- claim cursor keeps (server/cursor.ts); a claim that took nothing returns
-- that row alone, with seq NULL.
CREATE FUNCTION {{schema}}.claim_tasks(queue_names text[], shares integer[],
                                       gap_ords integer[], gap_his integer[], gap_los integer[],
                                       band_ords integer[], band_priorities integer[], band_floors bigint[],
                                       older_than xid8, claim_limit integer, owner text, lease_ms float8,
                                       max_bytes float8, shift_ms float8)
RETURNS TABLE (drawn bigint, xid xid8, xmin xid8, drawers_gone boolean, locked bigint, paused text[], limited text[],
               seq bigint, pending_seq bigint, priority smallint, queue text, id text, type text, payload jsonb,
               payload_bytes bytea, headers jsonb, retried integer, max_retry integer, timeout_ms float8,
               deadline_in_ms float8, retention_ms float8, lease_token uuid)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_column
DECLARE
  v_now timestamptz := {{schema}}.task_clock(shift_ms);
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
END
$$;

-- 0007's claim_limited() took the claim's time and the schema's name from its
-- caller and ran as the worker: replaced.
DROP FUNCTION {{schema}}.claim_limited(text[], integer[], integer, text, float8, timestamptz, text);

-- The claim of queues with limits (claim.ts claimLimited; 0007's, now the
-- owner's, deciding time itself): from the limited queues `queue_names`, in
-- that order, up to `wanted[i]` tasks from each and `total` in all, within
-- their limits. Returns the claimed tasks, and for
-- each queue that its limits kept from giving all it was asked while tasks
-- were pending, one row with seq NULL: wait_ms is when the rate window
-- frees a start (NULL when only active tasks finishing can free a slot).
CREATE FUNCTION {{schema}}.claim_limited(queue_names text[], wanted integer[], total integer, owner text, lease_ms float8,
                                         shift_ms float8)
RETURNS TABLE (queue text, seq bigint, pending_seq bigint, priority smallint, id text, type text, payload jsonb,
               payload_bytes bytea, headers jsonb, retried integer, max_retry integer, timeout_ms float8,
               deadline_in_ms float8, retention_ms float8, lease_token uuid, wait_ms float8)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_column
DECLARE
  now_at timestamptz := {{schema}}.task_clock(shift_ms);
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

-- ---------------------------------------------------------------------
-- The fenced writes of a lease (broker/leases.ts)
-- ---------------------------------------------------------------------

-- A batch of leases as the fenced writes take it: `seqs` and `tokens`, and
-- the arrays of what each lease's write sets (`field_counts`, their
-- lengths), all one length, refused as 22023 otherwise. Returns a map from
-- each seq (as text) to its place in the arrays, which each state row looks
-- its own entry up in: no join with the batch, which would be planned on the
-- row estimate of state = 'active' (often 1) and rescan the batch once per
-- row (seen: 125,000 comparisons for a batch of 500).
CREATE FUNCTION {{schema}}.lease_batch(seqs bigint[], tokens uuid[], VARIADIC field_counts integer[] DEFAULT '{}') RETURNS jsonb
LANGUAGE plpgsql IMMUTABLE SET search_path = pg_catalog, pg_temp AS $$
BEGIN
  IF seqs IS NULL OR tokens IS NULL OR cardinality(tokens) <> cardinality(seqs)
     OR EXISTS (SELECT 1 FROM unnest(field_counts) n WHERE n IS DISTINCT FROM cardinality(seqs)) THEN
    RAISE EXCEPTION USING ERRCODE = 'invalid_parameter_value', COLUMN = 'leases',
      MESSAGE = 'pgasynq: invalid leases: every array of a batch must have one entry per lease';
  END IF;
  RETURN (SELECT coalesce(jsonb_object_agg(u.seq::text, u.n), '{}') FROM unnest(seqs) WITH ORDINALITY AS u(seq, n));
END
$$;

-- Delays a write sets (a failure's retry delay, retry.ts MAX_RETRY_DELAY_MS at
-- most; a snooze's), refused as 22023 unless each is a finite number of ms in
-- [0, 1000 years]: run_at must stay a time both PostgreSQL and a JavaScript
-- Date hold.
CREATE FUNCTION {{schema}}.check_delays(delays_ms float8[]) RETURNS void
LANGUAGE plpgsql IMMUTABLE SET search_path = pg_catalog, pg_temp AS $$
BEGIN
  IF EXISTS (SELECT 1 FROM unnest(delays_ms) d WHERE NOT coalesce(d BETWEEN 0 AND 31557600000000, false)) THEN
    RAISE EXCEPTION USING ERRCODE = 'invalid_parameter_value', COLUMN = 'delayMs',
      MESSAGE = 'pgasynq: invalid delayMs: must be a finite duration in ms in [0, 31557600000000]';
  END IF;
END
$$;

-- Inside a handler's transaction (leases.ts lockLease): locks the task's state
-- row if the lease `token` still holds it, until that transaction ends. While
-- it is held no recoverer can take the task (they skip locked rows).
CREATE FUNCTION {{schema}}.lock_lease(task_seq bigint, token uuid) RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
  PERFORM 1 FROM {{schema}}.task_states s
  WHERE s.seq = task_seq AND s.lease_token = token AND s.state = 'active'
  FOR UPDATE;
  RETURN FOUND;
END
$$;

-- The heartbeat (leases.ts extendLeases): every lease of the batch still
-- held and not yet run out ends `lease_ms` from now. Returns the leases
-- extended, each with whether a cancellation was requested. lease_expires_at
-- is in no index: an extension is a HOT update of the narrow row.
CREATE FUNCTION {{schema}}.extend_leases(seqs bigint[], tokens uuid[], lease_ms float8, shift_ms float8)
RETURNS TABLE (task_seq bigint, cancel_requested boolean)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  v_now timestamptz := {{schema}}.task_clock(shift_ms);
  v_at jsonb := {{schema}}.lease_batch(seqs, tokens);
BEGIN
  PERFORM {{schema}}.check_claim_bounds(0, lease_ms);
  RETURN QUERY
  UPDATE {{schema}}.task_states s SET lease_expires_at = v_now + lease_ms * interval '1 millisecond'
  WHERE s.seq = ANY(seqs) AND s.state = 'active' AND s.lease_token = tokens[(v_at ->> s.seq::text)::int]
    AND s.lease_expires_at > v_now
  RETURNING s.seq, s.cancel_requested;
END
$$;

-- Successful attempts (leases.ts complete): each task of the batch still held
-- is deleted, or with `keeps[i]` marked completed until its retention ends,
-- and releases the unique lock it still holds. Returns the seqs that were
-- still held. The rows are met, and locked, in seq order (an index scan by
-- seq = ANY), so concurrent batches cannot deadlock.
CREATE FUNCTION {{schema}}.complete_tasks(seqs bigint[], tokens uuid[], keeps boolean[], shift_ms float8)
RETURNS SETOF bigint
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  v_now timestamptz := {{schema}}.task_clock(shift_ms);
  v_at jsonb := {{schema}}.lease_batch(seqs, tokens, cardinality(keeps));
BEGIN
  IF NOT coalesce(true = ANY(keeps), false) THEN
    -- No task kept (retention 0, the common case): a plain fenced DELETE, each row
    -- written once.
    RETURN QUERY
    WITH deleted AS (
      DELETE FROM {{schema}}.task_states s
      WHERE s.seq = ANY(seqs) AND s.state = 'active' AND s.lease_token = tokens[(v_at ->> s.seq::text)::int]
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
    RETURN;
  END IF;
  RETURN QUERY
  WITH h AS MATERIALIZED (
    SELECT s.seq, keeps[(v_at ->> s.seq::text)::int] AS keep FROM {{schema}}.task_states s
    WHERE s.seq = ANY(seqs) AND s.state = 'active' AND s.lease_token = tokens[(v_at ->> s.seq::text)::int]
    ORDER BY s.seq FOR UPDATE
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
        run_at = v_now + (SELECT i.retention FROM {{schema}}.task_inputs i WHERE i.seq = s.seq),
        updated_at = v_now
    WHERE s.seq = ANY(ARRAY(SELECT h.seq FROM h WHERE h.keep))
    RETURNING s.seq
  ),
  unlocked_kept AS (
    DELETE FROM {{schema}}.unique_locks l
    USING (SELECT i.queue, i.id, i.unique_key FROM {{schema}}.task_inputs i
           WHERE i.seq = ANY(ARRAY(SELECT k.seq FROM kept k)) AND i.unique_key IS NOT NULL) f
    WHERE l.queue = f.queue AND l.key = f.unique_key AND l.task_id = f.id
  )
  SELECT h.seq FROM h;
END
$$;

-- Failed attempts (leases.ts fail): each task of the batch still held goes to
-- the archive (`archives[i]`) or to retry after `delays_ms[i]`, using up a
-- retry when `counts[i]` (asynq's IsFailure), with `errors[i]` as its last
-- error; the queues with a retry are notified (it may be due sooner than the
-- forwarders' sleep). Returns the seqs that were still held.
CREATE FUNCTION {{schema}}.fail_tasks(seqs bigint[], tokens uuid[], archives boolean[], counts boolean[],
                                      delays_ms float8[], errors text[], shift_ms float8)
RETURNS SETOF bigint
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  v_now timestamptz := {{schema}}.task_clock(shift_ms);
  v_at jsonb := {{schema}}.lease_batch(seqs, tokens, cardinality(archives), cardinality(counts), cardinality(delays_ms), cardinality(errors));
BEGIN
  PERFORM {{schema}}.check_delays(delays_ms);
  RETURN QUERY
  WITH failed AS (
    UPDATE {{schema}}.task_states s
    SET state = CASE WHEN archives[(v_at ->> s.seq::text)::int] THEN 'archived' ELSE 'retry' END,
        retried = s.retried + CASE WHEN counts[(v_at ->> s.seq::text)::int] AND NOT archives[(v_at ->> s.seq::text)::int] THEN 1 ELSE 0 END,
        run_at = v_now + CASE WHEN archives[(v_at ->> s.seq::text)::int] THEN interval '0'
                              ELSE delays_ms[(v_at ->> s.seq::text)::int] * interval '1 millisecond' END,
        error_msg = errors[(v_at ->> s.seq::text)::int], last_failed_at = v_now,
        updated_at = v_now
    WHERE s.seq = ANY(seqs) AND s.state = 'active' AND s.lease_token = tokens[(v_at ->> s.seq::text)::int]
    RETURNING s.seq, s.queue, s.state
  ),
  notified AS (
    SELECT pg_notify({{schema}}.task_channel('_delayed'), f.queue) FROM (SELECT DISTINCT queue FROM failed WHERE state = 'retry') f
  )
  SELECT f.seq FROM failed f WHERE (SELECT count(*) FROM notified) >= 0;
END
$$;

-- Snoozed attempts (leases.ts snooze): each task of the batch still held is
-- scheduled again, due in `delays_ms[i]`, its retry count and last error
-- unchanged, and its queue's forwarders are woken (a snooze may be shorter
-- than their sleep). Returns the seqs that were still held.
CREATE FUNCTION {{schema}}.snooze_tasks(seqs bigint[], tokens uuid[], delays_ms float8[], shift_ms float8)
RETURNS SETOF bigint
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  v_now timestamptz := {{schema}}.task_clock(shift_ms);
  v_at jsonb := {{schema}}.lease_batch(seqs, tokens, cardinality(delays_ms));
BEGIN
  PERFORM {{schema}}.check_delays(delays_ms);
  RETURN QUERY
  WITH snoozed AS (
    UPDATE {{schema}}.task_states s
    SET state = 'scheduled', run_at = v_now + delays_ms[(v_at ->> s.seq::text)::int] * interval '1 millisecond',
        updated_at = v_now
    WHERE s.seq = ANY(seqs) AND s.state = 'active' AND s.lease_token = tokens[(v_at ->> s.seq::text)::int]
    RETURNING s.seq, s.queue
  ),
  notified AS (
    SELECT pg_notify({{schema}}.task_channel('_delayed'), z.queue) FROM (SELECT DISTINCT queue FROM snoozed) z
  )
  SELECT z.seq FROM snoozed z WHERE (SELECT count(*) FROM notified) >= 0;
END
$$;

-- Leases given back at shutdown (leases.ts requeue): each task of the batch
-- still held returns to the front of pending, ahead of its queue's first
-- pending task in the order they were claimed, its retry count unchanged
-- (asynq's requeue), and every server's next claim of the queue starts from
-- its head (the sweep: the tasks are below the claim cursors' floors).
-- Returns the seqs that were still held.
CREATE FUNCTION {{schema}}.requeue_tasks(seqs bigint[], tokens uuid[], shift_ms float8)
RETURNS SETOF bigint
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  v_now timestamptz := {{schema}}.task_clock(shift_ms);
  v_at jsonb := {{schema}}.lease_batch(seqs, tokens);
BEGIN
  RETURN QUERY
  WITH requeued AS (
    UPDATE {{schema}}.task_states s
    SET state = 'pending', run_at = h.front_at - interval '1 microsecond', pending_seq = h.front - h.n + h.rank - 1,
        updated_at = v_now
    FROM (
      SELECT l.seq, row_number() OVER w AS rank, count(*) OVER (PARTITION BY l.queue) AS n,
             coalesce((SELECT min(p.pending_seq) FROM {{schema}}.task_states p WHERE p.queue = l.queue AND p.state = 'pending'),
                      nextval('{{schema}}.task_seq')) AS front,
             coalesce((SELECT min(p.run_at) FROM {{schema}}.task_states p WHERE p.queue = l.queue AND p.state = 'pending'),
                      v_now) AS front_at
      FROM (SELECT x.seq, x.queue FROM {{schema}}.task_states x
            WHERE x.seq = ANY(seqs) AND x.state = 'active' AND x.lease_token = tokens[(v_at ->> x.seq::text)::int]
            ORDER BY x.seq FOR UPDATE) l
      WINDOW w AS (PARTITION BY l.queue ORDER BY l.seq)
    ) h
    WHERE s.seq = h.seq
    RETURNING s.seq, s.queue
  ),
  notified AS (
    SELECT pg_notify({{schema}}.task_channel('_sweep'), r.queue) FROM (SELECT DISTINCT queue FROM requeued) r
  )
  SELECT r.seq FROM requeued r WHERE (SELECT count(*) FROM notified) >= 0;
END
$$;

-- A handler's result (leases.ts writeResult), stored on its task while the
-- lease `token` still holds it. Returns whether it did.
CREATE FUNCTION {{schema}}.write_result(task_seq bigint, token uuid, result jsonb, result_bytes bytea, shift_ms float8)
RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  v_now timestamptz := {{schema}}.task_clock(shift_ms);
BEGIN
  UPDATE {{schema}}.task_states s SET result = write_result.result, result_bytes = write_result.result_bytes, updated_at = v_now
  WHERE s.seq = task_seq AND s.lease_token = token AND s.state = 'active';
  RETURN FOUND;
END
$$;

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

-- The recoverer's read (maintenance.ts findExpired): up to `batch_size` active
-- tasks whose lease expired more than `cutoff_ms` ago, or runs out impossibly
-- far in the future (clock abuse or corrupt data), in seq order, each with
-- its lease token (the worker reads no other lease's: the fence of
-- recover_leases() and drop_orphans()), whether its expiry is implausible,
-- and with `with_sizes` the bytes of its payload and headers. State rows
-- without inputs come too (id NULL). The bounds are checked first, so a token
-- of a lease that is not recoverable never leaves.
CREATE FUNCTION {{schema}}.expired_leases(batch_size integer, with_sizes boolean, cutoff_ms float8, lease_ms float8, shift_ms float8)
RETURNS TABLE (task_seq bigint, queue text, id text, type text, retried integer, max_retry integer, lease_owner text,
               lease_token uuid, implausible boolean, input_bytes float8)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  v_now timestamptz := {{schema}}.task_clock(shift_ms);
BEGIN
  PERFORM {{schema}}.check_recovery_bounds(cutoff_ms, lease_ms);
  RETURN QUERY
  SELECT s.seq, s.queue, i.id, i.type, s.retried, i.max_retry, s.lease_owner, s.lease_token,
         s.lease_expires_at > v_now + lease_ms * interval '1 millisecond' + interval '1 minute',
         CASE WHEN with_sizes AND i.seq IS NOT NULL THEN
           coalesce(octet_length(i.payload_bytes), octet_length(i.payload::text), 0)::float8 + octet_length(i.headers::text)::float8 END
  FROM {{schema}}.task_states s LEFT JOIN {{schema}}.task_inputs i ON i.seq = s.seq
  -- lease_owner is always set on an active row; naming it lets task_states_active_idx serve.
  WHERE s.state = 'active' AND s.lease_owner IS NOT NULL
    AND (s.lease_expires_at < v_now - cutoff_ms * interval '1 millisecond'
         OR s.lease_expires_at > v_now + lease_ms * interval '1 millisecond' + interval '1 minute')
  ORDER BY s.seq LIMIT batch_size;
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
        updated_at = v_now
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

REVOKE EXECUTE ON FUNCTION {{schema}}.check_claim_bounds(integer, float8) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION {{schema}}.claim_tasks(text[], integer[], integer[], integer[], integer[], integer[], integer[], bigint[], xid8, integer, text, float8, float8, float8) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION {{schema}}.claim_limited(text[], integer[], integer, text, float8, float8) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION {{schema}}.lease_batch(bigint[], uuid[], integer[]) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION {{schema}}.check_delays(float8[]) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION {{schema}}.lock_lease(bigint, uuid) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION {{schema}}.extend_leases(bigint[], uuid[], float8, float8) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION {{schema}}.complete_tasks(bigint[], uuid[], boolean[], float8) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION {{schema}}.fail_tasks(bigint[], uuid[], boolean[], boolean[], float8[], text[], float8) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION {{schema}}.snooze_tasks(bigint[], uuid[], float8[], float8) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION {{schema}}.requeue_tasks(bigint[], uuid[], float8) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION {{schema}}.write_result(bigint, uuid, jsonb, bytea, float8) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION {{schema}}.check_recovery_bounds(float8, float8) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION {{schema}}.forward_due(integer, float8) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION {{schema}}.expired_leases(integer, boolean, float8, float8, float8) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION {{schema}}.recover_leases(bigint[], uuid[], boolean[], float8[], float8, float8, float8) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION {{schema}}.drop_orphans(bigint[], uuid[], float8, float8, float8) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION {{schema}}.delete_expired_completed(integer, float8) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION {{schema}}.delete_expired_locks(integer, float8) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION {{schema}}.trim_archive(integer, float8) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION {{schema}}.commit_group(text, text, bigint[]) FROM PUBLIC;

REVOKE EXECUTE ON FUNCTION {{schema}}.task_clock(float8) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION {{schema}}.task_channel(text) FROM PUBLIC;

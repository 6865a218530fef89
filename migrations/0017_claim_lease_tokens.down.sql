-- pgasynq 0017 down: 0016's claim_tasks() (gen_random_uuid() per row, rows updated through a
-- join on ctid) and claim_limited() (gen_random_uuid() per row); lease_token() dropped.
CREATE OR REPLACE FUNCTION {{schema}}.claim_tasks(queue_names text[], shares integer[], gap_ords integer[], gap_his integer[], gap_los integer[], band_ords integer[], band_priorities integer[], band_floors bigint[], older_than xid8, claim_limit integer, owner text, lease_ms double precision, max_bytes double precision, shift_ms double precision)
 RETURNS TABLE(drawn bigint, xid xid8, xmin xid8, drawers_gone boolean, locked bigint, paused text[], limited text[], seq bigint, pending_seq bigint, priority smallint, queue text, id text, type text, payload jsonb, payload_bytes bytea, headers jsonb, retried integer, max_retry integer, timeout_ms double precision, deadline_in_ms double precision, retention_ms double precision, lease_token uuid)
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'pg_temp'
 SET plan_cache_mode TO 'force_generic_plan'
 SET enable_seqscan TO 'off'
 SET enable_hashjoin TO 'off'
 SET enable_mergejoin TO 'off'
 SET jit TO 'off'
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
  -- The locked rows in the claim's order, with their inputs (read here once) and the
  -- running sum of their bytes (payload as JSON text or bytea, and headers, as a client
  -- receives them). The inner join leaves out a state row without inputs: it is not
  -- claimed. (LIMIT 1 keeps the lookup a primary key probe per row: a join planned on
  -- the CTE's guessed size may hash the whole table.)
  sized AS (
    SELECT c.ctid, x.*, row_number() OVER w AS n, sum(x.bytes) OVER w AS upto,
      array_position(queue_names, c.queue) AS ord
    FROM c CROSS JOIN LATERAL (
      SELECT i.queue, i.id, i.type, i.payload, i.payload_bytes, i.headers, i.max_retry, i.timeout, i.deadline, i.retention,
             coalesce(octet_length(i.payload_bytes), octet_length(i.payload::text), 0)::float8
             + octet_length(i.headers::text)::float8 AS bytes
      FROM {{schema}}.task_inputs i WHERE i.seq = c.seq LIMIT 1) x
    WINDOW w AS (ORDER BY array_position(queue_names, c.queue), c.priority DESC, c.pending_seq ROWS UNBOUNDED PRECEDING)
  ),
  -- The rows taken are updated through a join on ctid (a TID probe per row, never a
  -- join planned on a CTE's guessed size): nothing can move a row this statement holds
  -- locked, and a primary key descent per row was a quarter of the claim. The join
  -- carries each row's inputs to RETURNING, so they are read once. (A pending row that
  -- another transaction rewrote after this statement's snapshot is locked in its new
  -- version, which this UPDATE cannot see: it stays pending for the next claim.)
  -- pending_seq stays on the active row (only pending rows are indexed by it), so
  -- the claim order can be returned.
  claimed AS (
    UPDATE {{schema}}.task_states s
    SET state = 'active', lease_owner = owner, lease_token = gen_random_uuid(),
        lease_expires_at = v_now + lease_ms * interval '1 millisecond', started_at = v_now, run_at = NULL,
        cancel_requested = false, updated_at = v_now
    FROM sized z
    WHERE s.ctid = z.ctid AND (z.n = 1 OR z.upto <= max_bytes)
    RETURNING z.ord, s.seq, s.pending_seq, s.priority, z.queue, z.id, z.type, z.payload, z.payload_bytes, z.headers,
      s.retried, z.max_retry,
      (extract(epoch FROM z.timeout) * 1000::numeric)::float8 AS timeout_ms,
      (extract(epoch FROM z.deadline - v_now) * 1000::numeric)::float8 AS deadline_in_ms,
      (extract(epoch FROM z.retention) * 1000::numeric)::float8 AS retention_ms,
      s.lease_token
  ),
  -- Inspector.watch()'s 'started' events, sent from the rows the claim took while someone
  -- watches their queues. Planned once with the rest (the claim's plan is generic), and
  -- switched off by a one-time filter, this costs nothing while none watches.
  started AS (
    SELECT {{schema}}.send_task_events(array_agg({{schema}}.task_event('started', t.queue, t.id, t.type, t.retried + 1, v_now, NULL, NULL)
                                                 ORDER BY t.seq)) AS sent
    FROM claimed t
    WHERE cardinality(v_watching) > 0 AND (t.queue = ANY (v_watching) OR '' = ANY (v_watching))
    HAVING count(*) > 0
  )
  -- What the claim says of itself comes once, on a row of its own ahead of the tasks
  -- (its seq is null): repeated on every row, its arrays were parsed once per task.
  SELECT me.drawn, me.xid, me.xmin, (SELECT d.gone FROM drawers d), (SELECT count(*) FROM c),
    ARRAY(SELECT p.name FROM {{schema}}.queues p WHERE p.paused AND p.name = ANY(queue_names)),
    ARRAY(SELECT p.name FROM {{schema}}.queues p WHERE NOT p.paused AND p.name = ANY(queue_names)
          AND (p.concurrency IS NOT NULL OR p.key_concurrency IS NOT NULL OR p.rate_limit IS NOT NULL)),
    NULL::bigint, NULL::bigint, NULL::smallint, NULL::text, NULL::text, NULL::text, NULL::jsonb, NULL::bytea, NULL::jsonb,
    NULL::integer, NULL::integer, NULL::float8, NULL::float8, NULL::float8, NULL::uuid
  -- Joined here so that the events are sent (a CTE nothing reads does not run).
  FROM me LEFT JOIN started ON true
  UNION ALL
  (SELECT NULL, NULL, NULL, NULL, NULL, NULL, NULL,
    t.seq, t.pending_seq, t.priority, t.queue, t.id, t.type, t.payload, t.payload_bytes, t.headers, t.retried,
    t.max_retry, t.timeout_ms, t.deadline_in_ms, t.retention_ms, t.lease_token
  FROM claimed t
  ORDER BY t.ord, t.priority DESC, t.pending_seq);
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

DROP FUNCTION {{schema}}.lease_token(claim uuid, task_seq bigint);

-- pgasynq 0014 down: 0013's claim again (planned as PostgreSQL chooses, its inputs read twice, its mark on every row).
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

CREATE OR REPLACE FUNCTION {{schema}}.extend_leases(seqs bigint[], tokens uuid[], lease_ms double precision, logs jsonb, shift_ms double precision)
 RETURNS TABLE(task_seq bigint, cancel_requested boolean)
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $function$
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
$function$;

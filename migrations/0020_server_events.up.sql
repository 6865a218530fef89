-- pgasynq 0020: a completion's 'completed' events built by the server that sends it.
-- {{schema}} is replaced by the quoted schema name before this file runs.
--
-- While someone watches, a completion batch built a JSON event for each task it deleted: its
-- rows joined to their inputs, each event's fields formatted one by one, sorted and joined.
-- That work was most of what one watcher cost a drain; sending the notifications themselves
-- costs under 1 µs a task (bench/RESULTS.md, 2026-12-08). The server knows each task's queue,
-- id, type and attempt already: complete_tasks() now takes each task's event from it, all but
-- the time (the batch's, rendered once here), and only keeps the events of the tasks its fence
-- let through, in the queues someone watches. It returns whether anyone watches, so that the
-- server builds events only while someone does; a batch sent without them (the first after a
-- watcher came, or a server of the previous version) has them built here, as before.
--
-- The previous signature stays, calling this one: servers of 0.1 keep running on a schema
-- migrated to it. The roles that could run it can run the new one.

CREATE FUNCTION {{schema}}.send_event_texts(events text[]) RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  channel constant text := {{schema}}.task_channel('_events');
  n constant integer := coalesce(cardinality(events), 0);
  piece text := array_to_string(events, ',');
  -- Events per notification, on the batch's average length.
  per constant integer := greatest(1, (n::bigint * 7000 / greatest(octet_length(piece), 1))::integer);
  i integer := 1;
  k integer;
BEGIN
  WHILE i <= n LOOP
    k := least(per, n - i + 1);
    IF k < n THEN
      piece := array_to_string(events[i:i + k - 1], ',');
    END IF;
    -- Longer events than the average here: fewer of them.
    WHILE octet_length(piece) > 7900 AND k > 1 LOOP
      k := k / 2;
      piece := array_to_string(events[i:i + k - 1], ',');
    END LOOP;
    PERFORM pg_notify(channel, '[' || piece || ']');
    i := i + k;
  END LOOP;
END
$$;
REVOKE EXECUTE ON FUNCTION {{schema}}.send_event_texts(text[]) FROM PUBLIC;

-- 0018's notifications, from the events' texts (the events the database builds are JSON).
CREATE OR REPLACE FUNCTION {{schema}}.send_task_events(events json[]) RETURNS void
LANGUAGE sql SET search_path = pg_catalog, pg_temp
AS $$ SELECT {{schema}}.send_event_texts(events::text[]) $$;

CREATE FUNCTION {{schema}}.complete_tasks(seqs bigint[], tokens uuid[], keeps boolean[], logs jsonb, events text[], shift_ms double precision)
 RETURNS TABLE(task_seq bigint, watching boolean)
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $function$
#variable_conflict use_column
DECLARE
  v_now timestamptz := {{schema}}.task_clock(shift_ms);
  v_at jsonb := {{schema}}.lease_batch(seqs, tokens, cardinality(keeps), coalesce(cardinality(events), cardinality(seqs)));
  -- The queues a live watcher covers ('' for a watcher of every queue: no queue is named ''),
  -- read once per call in this function's own cached plan (a call of an SQL function per
  -- claim, planned anew each time, cost 150 µs): while none is, nothing below reads or sends an event.
  v_watching text[] := ARRAY(SELECT DISTINCT coalesce(w.queue, '') FROM {{schema}}.watchers w WHERE w.expires_at > v_now);
  -- What the server's events lack: their time, the batch's, rendered once.
  v_when constant text := ',' || pg_catalog.to_json(v_now)::text || ']';
  n integer;
  done bigint[];
  built json[];
  sent text[];
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
    SELECT d.seq, false FROM deleted d;
    GET DIAGNOSTICS n = ROW_COUNT;
  ELSIF NOT coalesce(true = ANY(keeps), false) AND events IS NOT NULL THEN
    -- Someone watches, and the server sent each task's 'completed' event, all but its time: the
    -- plain DELETE above, then the events of the tasks it deleted in the watched queues. An event
    -- too long for a notification (no task's is: its queue, id and type are bounded) is dropped.
    WITH deleted AS (
      DELETE FROM {{schema}}.task_states s
      WHERE s.seq = ANY(seqs) AND s.state = 'active' AND s.lease_token = tokens[(v_at ->> s.seq::text)::int] AND NOT s.awaited
      RETURNING s.seq, s.queue
    ),
    inputs AS (
      DELETE FROM {{schema}}.task_inputs i WHERE i.seq = ANY(ARRAY(SELECT d.seq FROM deleted d))
      RETURNING i.queue, i.id, i.unique_key
    ),
    unlocked AS (
      DELETE FROM {{schema}}.unique_locks l USING inputs f
      WHERE f.unique_key IS NOT NULL AND l.queue = f.queue AND l.key = f.unique_key AND l.task_id = f.id
    ),
    ended AS (
      SELECT d.seq, d.queue, events[(v_at ->> d.seq::text)::int] || v_when AS event FROM deleted d
    )
    SELECT coalesce(array_agg(e.seq), '{}'),
           array_agg(e.event ORDER BY e.seq)
             FILTER (WHERE (e.queue = ANY (v_watching) OR '' = ANY (v_watching)) AND octet_length(e.event) <= 7000)
    INTO done, sent
    FROM ended e;
    IF sent IS NOT NULL THEN
      PERFORM {{schema}}.send_event_texts(sent);
    END IF;
    RETURN QUERY SELECT unnest(done), true;
    n := cardinality(done);
  ELSIF NOT coalesce(true = ANY(keeps), false) THEN
    -- The same while someone watches and the server sent no events (its first batch since a
    -- watcher came, or a server of 0.1), with the 'completed' events of the tasks it deletes
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
    INTO done, built
    FROM deleted d JOIN inputs f ON f.seq = d.seq;
    IF built IS NOT NULL THEN
      PERFORM {{schema}}.send_task_events(built);
    END IF;
    RETURN QUERY SELECT unnest(done), true;
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
  RETURN QUERY SELECT (e ->> 'seq')::bigint, cardinality(v_watching) > 0 FROM jsonb_array_elements(coalesce(ended, '[]')) e;
END
$function$;
REVOKE EXECUTE ON FUNCTION {{schema}}.complete_tasks(bigint[], uuid[], boolean[], jsonb, text[], double precision) FROM PUBLIC;

-- The roles that could complete tasks (pgasynq roles' worker) can with the server's events.
DO $grants$
DECLARE
  r record;
BEGIN
  FOR r IN
    SELECT a.grantee::regrole::text AS grantee
    FROM pg_catalog.pg_proc p CROSS JOIN LATERAL pg_catalog.aclexplode(p.proacl) a
    WHERE p.oid = '{{schema}}.complete_tasks(bigint[], uuid[], boolean[], jsonb, double precision)'::regprocedure
      AND a.privilege_type = 'EXECUTE' AND a.grantee <> 0 AND a.grantee <> p.proowner
  LOOP
    EXECUTE pg_catalog.format('GRANT EXECUTE ON FUNCTION {{schema}}.complete_tasks(bigint[], uuid[], boolean[], jsonb, text[], double precision) TO %s', r.grantee);
  END LOOP;
END
$grants$;

-- The previous signature, for the servers of 0.1 (replaced in place: its grants stay).
CREATE OR REPLACE FUNCTION {{schema}}.complete_tasks(seqs bigint[], tokens uuid[], keeps boolean[], logs jsonb, shift_ms double precision)
RETURNS SETOF bigint
LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, pg_temp
AS $$ SELECT c.task_seq FROM {{schema}}.complete_tasks(seqs, tokens, keeps, logs, NULL::text[], shift_ms) c $$;

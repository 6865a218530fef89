-- pgasynq 0020 down: completions build every event in the database again (0019's functions; grants stay).
CREATE OR REPLACE FUNCTION {{schema}}.complete_tasks(seqs bigint[], tokens uuid[], keeps boolean[], logs jsonb, shift_ms double precision)
 RETURNS SETOF bigint
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $function$
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
$function$;

DROP FUNCTION {{schema}}.complete_tasks(bigint[], uuid[], boolean[], jsonb, text[], double precision);

CREATE OR REPLACE FUNCTION {{schema}}.send_task_events(events json[]) RETURNS void
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
REVOKE EXECUTE ON FUNCTION {{schema}}.send_task_events(json[]) FROM PUBLIC;

DROP FUNCTION {{schema}}.send_event_texts(text[]);

-- Back to 0007: no enqueue() in SQL.
DROP FUNCTION {{schema}}.enqueue(text, jsonb, text, text, timestamptz, integer, integer, text);
DROP FUNCTION {{schema}}.enqueue_text_rule(text, integer);
DROP FUNCTION {{schema}}.enqueue_name_rule(text, integer, boolean);
DROP FUNCTION {{schema}}.utf16_length(text);

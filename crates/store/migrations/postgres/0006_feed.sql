-- The feed (issue 34): every event's place across runs — the id of the transaction that
-- wrote it (xid8) and a position in that transaction's order. A reader takes only rows of
-- transactions older than every one still running (`pg_snapshot_xmin`), so a transaction
-- that commits late can never slip in below a cursor already given.
ALTER TABLE events ADD COLUMN tx xid8;
ALTER TABLE events ADD COLUMN pos bigint;
CREATE SEQUENCE events_pos AS bigint OWNED BY events.pos;
UPDATE events e SET tx = '0'::xid8, pos = o.n
  FROM (SELECT run_id, seq, row_number() OVER (ORDER BY at_us, run_id, seq) AS n FROM events) o
 WHERE e.run_id = o.run_id AND e.seq = o.seq;
SELECT setval('events_pos', COALESCE((SELECT max(pos) FROM events), 0) + 1, false);
ALTER TABLE events
    ALTER COLUMN tx SET DEFAULT pg_current_xact_id(),
    ALTER COLUMN tx SET NOT NULL,
    ALTER COLUMN pos SET DEFAULT nextval('events_pos'),
    ALTER COLUMN pos SET NOT NULL;
CREATE INDEX events_feed ON events (tx, pos);

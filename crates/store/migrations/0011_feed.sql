-- The feed (issue 34): every commit batch of every run at a position of its own, in the
-- order it was committed (SQLite has one writer), never reused (AUTOINCREMENT), so one
-- cursor follows every run. Kept by triggers on `batches`: a batch written adds its place,
-- a batch removed (a purge) takes it away.
CREATE TABLE feed (
    pos INTEGER PRIMARY KEY AUTOINCREMENT,
    rk INTEGER NOT NULL,
    first_seq INTEGER NOT NULL,
    last_seq INTEGER NOT NULL
);
CREATE INDEX feed_by_batch ON feed (rk, first_seq);
INSERT INTO feed (rk, first_seq, last_seq)
    SELECT rk, first_seq, last_seq FROM batches ORDER BY rowid;
CREATE TRIGGER batches_feed AFTER INSERT ON batches BEGIN
    INSERT INTO feed (rk, first_seq, last_seq) VALUES (NEW.rk, NEW.first_seq, NEW.last_seq);
END;
CREATE TRIGGER batches_unfeed AFTER DELETE ON batches BEGIN
    DELETE FROM feed WHERE rk = OLD.rk AND first_seq = OLD.first_seq;
END;

-- The hash chain (baton_engine::chain): each event's hash over the previous event's hash
-- and its own fields, and each run's head hash (the hash of its last event; 32 zero bytes
-- for a run without events). The code that applies this file hashes the runs already here.
ALTER TABLE events ADD COLUMN hash BLOB;
ALTER TABLE runs ADD COLUMN head_hash BLOB;

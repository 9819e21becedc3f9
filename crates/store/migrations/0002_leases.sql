-- Leases: which worker drives a run, and until when (microseconds since the epoch).
ALTER TABLE runs ADD COLUMN lease_owner TEXT;
ALTER TABLE runs ADD COLUMN lease_until_us INTEGER;
CREATE INDEX runs_claimable ON runs (status, lease_until_us, created_at);

-- The hash chain's form per run (issue 35): 1, the payload hashed as canonical JSON of its
-- value (every run already in the database); 2, the payload hashed as its encoding, the
-- bytes the store keeps (every run created from now on). A run keeps its form for good.
ALTER TABLE runs ADD COLUMN chain INTEGER NOT NULL DEFAULT 1;

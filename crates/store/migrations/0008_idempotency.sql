-- Idempotency keys per tenant (issue 33): a key names at most one run of its tenant (runs of
-- no tenant share one scope), is bound to a digest of the request that claimed it, and is
-- held until it expires; a run whose claim expired lets the key go when another claims it.
-- Keys kept from before hold a day from their run's creation and match any request.
ALTER TABLE runs ADD COLUMN key_request TEXT;
ALTER TABLE runs ADD COLUMN key_expires_us INTEGER;
UPDATE runs SET key_request = '', key_expires_us = created_at + 86400000000
 WHERE idempotency_key IS NOT NULL;
DROP INDEX runs_by_idempotency_key;
CREATE UNIQUE INDEX runs_by_idempotency_key ON runs (COALESCE(tenant, ''), idempotency_key)
    WHERE idempotency_key IS NOT NULL;

//! The store's schema history: one list of changes for both backends.
//!
//! Every change to what the store keeps is one entry of [`CHANGES`], in order, giving its
//! form on SQLite and on PostgreSQL side by side: the SQL that makes it (and, on SQLite,
//! code that fills what SQL cannot), or why that backend needs none — it was folded into a
//! backend's first version, or the backend keeps that fact another way. A change made for
//! one backend cannot be forgotten for the other: the other's form must be written down
//! next to it, and the tests migrate both and compare what they hold.
//!
//! A backend's schema version is the number of changes it has applied (those with SQL for
//! it), stored in its `schema_version` table. Versions only go forward: each backend's
//! runner applies what a database lacks, each change in its own transaction, and a
//! database at a newer version than the binary's is refused.

/// A change's form on one backend.
#[derive(Clone, Copy, Debug)]
pub enum Form<Fill: 'static> {
    /// This SQL makes the change.
    Sql(&'static str),
    /// This SQL, then this code (in the same transaction) fills what SQL cannot.
    SqlThen(&'static str, Fill),
    /// The backend needs no step of its own, and why.
    None(&'static str),
}

impl<Fill: Copy> Form<Fill> {
    /// The SQL and code of a change this backend applies; none for one it does not.
    pub fn step(&self) -> Option<(&'static str, Option<Fill>)> {
        match *self {
            Form::Sql(sql) => Some((sql, None)),
            Form::SqlThen(sql, fill) => Some((sql, Some(fill))),
            Form::None(_) => None,
        }
    }
}

/// Code that fills, on SQLite, what a change's SQL cannot (rows computed from old rows),
/// named here and run by the SQLite store.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SqliteFill {
    /// Computes the hash chain over every event already stored, and each run's head hash.
    HashExistingRuns,
    /// Packs every run's old one-row-per-event log into batches.
    PackExistingRuns,
}

/// One change to the store's schema.
#[derive(Debug)]
pub struct Change {
    /// What the change keeps, in a few words.
    pub what: &'static str,
    pub sqlite: Form<SqliteFill>,
    /// PostgreSQL's steps are SQL only.
    pub postgres: Form<()>,
}

/// Why a change has no PostgreSQL step of its own: the PostgreSQL store began with it.
const IN_POSTGRES_FIRST: &str =
    "in PostgreSQL's first version, which holds everything SQLite had at its sixth";

/// Every change to the schema, oldest first.
pub const CHANGES: &[Change] = &[
    Change {
        what: "runs and the append-only event log of each",
        sqlite: Form::Sql(include_str!("../migrations/0001_init.sql")),
        postgres: Form::Sql(include_str!("../migrations/postgres/0001_init.sql")),
    },
    Change {
        what: "leases: which worker drives a run, until when",
        sqlite: Form::Sql(include_str!("../migrations/0002_leases.sql")),
        postgres: Form::None(IN_POSTGRES_FIRST),
    },
    Change {
        what: "the hash chain over each run's events, and each run's head hash",
        sqlite: Form::SqlThen(
            include_str!("../migrations/0003_chain.sql"),
            SqliteFill::HashExistingRuns,
        ),
        postgres: Form::None(IN_POSTGRES_FIRST),
    },
    Change {
        what: "scenario versions: the texts a run started with, by checksum",
        sqlite: Form::Sql(include_str!("../migrations/0004_scenario_texts.sql")),
        postgres: Form::None(IN_POSTGRES_FIRST),
    },
    Change {
        what: "run trees, idempotency keys, tenants and their scenario overrides",
        sqlite: Form::Sql(include_str!("../migrations/0005_run_trees.sql")),
        postgres: Form::None(IN_POSTGRES_FIRST),
    },
    Change {
        what: "bearer tokens, by hash, each with a tenant and a role",
        sqlite: Form::Sql(include_str!("../migrations/0006_tokens.sql")),
        postgres: Form::None(IN_POSTGRES_FIRST),
    },
    Change {
        what: "the packed log: integer run keys, one row per commit batch",
        sqlite: Form::SqlThen(
            include_str!("../migrations/0007_packed.sql"),
            SqliteFill::PackExistingRuns,
        ),
        postgres: Form::None(
            "PostgreSQL keeps one row per event, which its group appends and indexes read",
        ),
    },
    Change {
        what: "holds: leases with fencing on the runs a process drives",
        sqlite: Form::None(
            "SQLite's holds are lock files beside the database, released by the kernel when their process dies",
        ),
        postgres: Form::Sql(include_str!("../migrations/postgres/0002_holds.sql")),
    },
    Change {
        what: "idempotency keys per tenant, bound to their request, expiring",
        sqlite: Form::Sql(include_str!("../migrations/0008_idempotency.sql")),
        postgres: Form::Sql(include_str!("../migrations/postgres/0003_idempotency.sql")),
    },
    Change {
        what: "browser sessions: a session id's hash, its token, capped and expiring",
        sqlite: Form::Sql(include_str!("../migrations/0009_sessions.sql")),
        postgres: Form::Sql(include_str!("../migrations/postgres/0004_sessions.sql")),
    },
    Change {
        what: "webhooks, the outbox of their deliveries and every attempt",
        sqlite: Form::Sql(include_str!("../migrations/0010_webhooks.sql")),
        postgres: Form::Sql(include_str!("../migrations/postgres/0005_webhooks.sql")),
    },
    Change {
        what: "the feed: every run's events in commit order, at places never reused",
        sqlite: Form::Sql(include_str!("../migrations/0011_feed.sql")),
        postgres: Form::Sql(include_str!("../migrations/postgres/0006_feed.sql")),
    },
    Change {
        what: "the hash chain's form per run: canonical JSON before, the stored encoding after",
        sqlite: Form::Sql(include_str!("../migrations/0012_chain_form.sql")),
        postgres: Form::Sql(include_str!("../migrations/postgres/0007_chain_form.sql")),
    },
    Change {
        what: "queues, priorities, limits per queue and tenant, homes and event versions of runs",
        sqlite: Form::Sql(include_str!("../migrations/0013_queues.sql")),
        postgres: Form::Sql(include_str!("../migrations/postgres/0008_queues.sql")),
    },
    Change {
        what: "the process that wrote each batch of events, and who listens for pieces of answers",
        sqlite: Form::Sql(include_str!("../migrations/0014_writers.sql")),
        postgres: Form::Sql(include_str!("../migrations/postgres/0009_writers.sql")),
    },
];

/// Which backend a schema version counts for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backend {
    Sqlite,
    Postgres,
}

/// The steps a backend applies, numbered from 1 (its schema versions), each with its change.
pub fn sqlite_steps()
-> impl Iterator<Item = (i64, &'static Change, &'static str, Option<SqliteFill>)> {
    CHANGES
        .iter()
        .filter_map(|c| c.sqlite.step().map(|(sql, fill)| (c, sql, fill)))
        .zip(1..)
        .map(|((c, sql, fill), v)| (v, c, sql, fill))
}

/// PostgreSQL's steps, numbered from 1 (its schema versions), each with its change.
pub fn postgres_steps() -> impl Iterator<Item = (i64, &'static Change, &'static str)> {
    CHANGES
        .iter()
        .filter_map(|c| c.postgres.step().map(|(sql, _)| (c, sql)))
        .zip(1..)
        .map(|((c, sql), v)| (v, c, sql))
}

/// The schema version this binary reads and writes on a backend.
pub fn version(backend: Backend) -> i64 {
    match backend {
        Backend::Sqlite => sqlite_steps().count() as i64,
        Backend::Postgres => postgres_steps().count() as i64,
    }
}

/// The message for a database at a version this binary cannot use, or none.
pub fn refusal(backend: Backend, shown: &str, found: i64, migrate: &str) -> Option<String> {
    let needs = version(backend);
    if found > needs {
        Some(format!(
            "the database {shown} is at schema version {found}, newer than this binary's {needs}: use a newer baton (migrations only go forward)"
        ))
    } else if found < needs {
        Some(format!(
            "the database {shown} is at schema version {found}, this binary needs {needs}: {migrate}"
        ))
    } else {
        None
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn every_change_is_applied_by_at_least_one_backend_and_each_file_once() {
        let mut files = std::collections::HashSet::new();
        for c in CHANGES {
            let steps = [c.sqlite.step().map(|s| s.0), c.postgres.step().map(|s| s.0)];
            assert!(steps.iter().any(Option::is_some), "{}: no backend applies it", c.what);
            for sql in steps.into_iter().flatten() {
                assert!(files.insert(sql), "{}: a migration file used twice", c.what);
                assert!(
                    sql.trim_start().starts_with("--"),
                    "{}: a step opens with what it is",
                    c.what
                );
            }
        }
    }

    #[test]
    fn versions_count_each_backends_steps_in_order() {
        assert_eq!(version(Backend::Sqlite), 14);
        assert_eq!(version(Backend::Postgres), 9);
        let numbers: Vec<i64> = postgres_steps().map(|(v, ..)| v).collect();
        assert_eq!(numbers, [1, 2, 3, 4, 5, 6, 7, 8, 9]);
        assert_eq!(postgres_steps().last().map(|(_, c, _)| c.what), Some(CHANGES[14].what));
    }

    #[test]
    fn a_database_at_another_version_is_refused_naming_both() {
        let newer = refusal(Backend::Sqlite, "x.db", 15, "run `baton migrate`").unwrap();
        assert!(newer.contains("schema version 15, newer than this binary's 14"), "{newer}");
        let older = refusal(Backend::Postgres, "pg", 1, "run `baton migrate --db pg`").unwrap();
        assert!(older.contains("at schema version 1, this binary needs 9: run `baton migrate"));
        assert_eq!(refusal(Backend::Sqlite, "x.db", 14, ""), None);
    }
}

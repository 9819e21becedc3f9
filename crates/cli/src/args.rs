//! The command line: every subcommand, flag and value `baton` takes (clap), with the
//! checks a value gets as it is parsed.

use std::path::PathBuf;

use clap::{Parser, Subcommand, ValueEnum};

/// Baton runs multi-step LLM agent workflows declared in YAML, durably.
#[derive(Debug, Parser)]
#[command(name = "baton", version, about, max_term_width = 100)]
pub(crate) struct Cli {
    /// The scenarios directory (scenario files beside prompts/ and rubrics/).
    #[arg(long, global = true, env = "BATON_SCENARIOS", default_value = "scenarios")]
    pub(crate) scenarios: PathBuf,

    /// The provider configuration (default: ./baton.toml when it exists, else the
    /// environment: ANTHROPIC_API_KEY, OPENAI_API_KEY, OPENAI_BASE_URL).
    #[arg(long, global = true, env = "BATON_CONFIG")]
    pub(crate) config: Option<PathBuf>,

    /// The run database: a SQLite file, or a PostgreSQL URL (`postgres://USER@HOST/DB`;
    /// `?options=-csearch_path%3DNAME` keeps Baton's tables in a schema of their own).
    #[arg(long, global = true, env = "BATON_DB", default_value = ".baton/baton.db")]
    pub(crate) db: PathBuf,

    /// Baton's own directory (workspaces, snapshots) when --db is a PostgreSQL URL
    /// (default `.baton`); beside a SQLite database it is the database's directory. Every
    /// process on the same runs must see the same directory.
    #[arg(long = "data-dir", global = true, env = "BATON_DATA_DIR", value_name = "DIR")]
    pub(crate) data_dir: Option<PathBuf>,

    /// Where Baton keeps workspaces' snapshot repositories (default: `snapshots/` beside
    /// the database); never inside a workspace a model edits.
    #[arg(long, global = true, env = "BATON_SNAPSHOTS", value_name = "DIR")]
    pub(crate) snapshots: Option<PathBuf>,

    /// An S3 bucket (`s3://BUCKET[/PREFIX]`) every snapshot of a workspace is pushed to, so
    /// that a process on another host (its own --data-dir) takes the run over with its
    /// files. Credentials and endpoint from `AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`,
    /// `AWS_REGION`, `AWS_ENDPOINT_URL`, `AWS_ALLOW_HTTP`.
    #[arg(long = "object-store", global = true, env = "BATON_OBJECT_STORE", value_name = "URL")]
    pub(crate) object_store: Option<String>,

    /// The longest one push, fetch or removal of the object store may take.
    #[arg(
        long = "object-store-timeout-s",
        global = true,
        env = "BATON_OBJECT_STORE_TIMEOUT_S",
        value_name = "SECONDS",
        default_value_t = 60
    )]
    pub(crate) object_store_timeout_s: u64,

    /// Run verifiers, scanners and MCP servers without the jail, unconfined as Baton's own
    /// user (said as a warning on every run, and recorded on each program's outcome).
    #[arg(long, global = true)]
    pub(crate) no_jail: bool,

    #[command(subcommand)]
    pub(crate) command: Command,
}

// Parsed once per process: the size of its largest variant costs nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Subcommand)]
pub(crate) enum Command {
    /// Check scenario files or directories; exit 0 when valid (warnings are printed), 1 on any error.
    Validate {
        /// Files or directories (default: the scenarios directory).
        paths: Vec<PathBuf>,
        /// Output format.
        #[arg(long, value_enum, default_value_t = Format::Text)]
        format: Format,
        /// A directory of tenant overrides, laid out as TENANT/SCENARIO_ID.yaml; each is merged
        /// over its base scenario and checked like one.
        #[arg(long)]
        overrides: Option<PathBuf>,
        /// Also start each `mcp` toolset's server and show what it says of its tools.
        #[arg(long)]
        tools: bool,
        /// How long each server may take to start and list its tools, in seconds.
        #[arg(long, value_name = "SECONDS", default_value_t = 60, requires = "tools", value_parser = clap::value_parser!(u64).range(1..=3600))]
        tools_timeout_s: u64,
    },
    /// Start a job and drive it to its end or to a pause: its scenario is the one named
    /// (a pin), else the one serving `--intent`, else the classifier for jobs of a
    /// classified `--kind`, else the configured default (`[selection]` in baton.toml); a
    /// result naming an intent route chains the job to that route's scenario, as a child run.
    ///
    /// Exit codes: 0 completed, 1 failed, 3 paused, 4 aborted, 5 cancelled, 6 interrupted
    /// (stopped without ending: an outage or a signal; continue with `baton resume`).
    Run {
        /// The scenario id (a pin; the same as --scenario).
        #[arg(conflicts_with = "pin")]
        scenario: Option<String>,
        /// Run exactly this scenario (an id that matches nothing is an error).
        #[arg(long = "scenario", value_name = "ID")]
        pin: Option<String>,
        /// The job's intent route, looked up case-insensitively among the scenarios'
        /// `intent_routes`; one nobody serves falls back to the default with a warning.
        #[arg(long, value_name = "ROUTE")]
        intent: Option<String>,
        /// The job's kind (`task`, `question`, …): kinds in `[selection] classify_kinds`
        /// (default: task) go to the classifier, which picks the scenario.
        #[arg(long, value_name = "KIND")]
        kind: Option<String>,
        /// The most the job may cost, all its runs together (each run is also bound by its
        /// own scenario's budget).
        #[arg(long, value_name = "USD")]
        max_cost_usd: Option<f64>,
        /// Refuse to start the job when the forecast of its scenario (`baton forecast`:
        /// the store's last jobs and the scenario's fixtures) costs more than this at p90,
        /// or has no p90 (fewer than 10 recorded jobs).
        #[arg(long, value_name = "USD")]
        max_forecast_usd: Option<f64>,
        /// How long the end of a run waits for its cancelled child runs to settle, in
        /// seconds (default 15, at most 120; `[jobs] settle_timeout_s` in baton.toml).
        #[arg(long, value_name = "SECONDS")]
        settle_timeout_s: Option<f64>,
        /// A key naming this job: a job started again with the same key gets the first
        /// one's run (its result, or where it stands) instead of starting another.
        #[arg(long, value_name = "KEY")]
        idempotency_key: Option<String>,
        /// Run the scenarios with this tenant's overrides (`baton tenant set`) merged in;
        /// the run records the tenant and the merged checksum.
        #[arg(long, value_name = "TENANT")]
        tenant: Option<String>,
        /// The input text.
        #[arg(
            long,
            conflicts_with_all = ["input_file", "input_lines"],
            required_unless_present_any = ["input_file", "input_lines"]
        )]
        input: Option<String>,
        /// A file holding the input.
        #[arg(long, conflicts_with = "input_lines")]
        input_file: Option<PathBuf>,
        /// With --queue: one job per non-empty line of this file, each line its input.
        #[arg(long, requires = "queue", conflicts_with = "idempotency_key", value_name = "FILE")]
        input_lines: Option<PathBuf>,
        /// Metadata for the run, readable by gates as `metadata.KEY` (repeatable).
        #[arg(long = "meta", value_parser = parse_meta)]
        meta: Vec<(String, String)>,
        /// Answer model calls from this script (YAML: per level, an ordered list of responses).
        #[arg(long)]
        script: Option<PathBuf>,
        /// Print the result as JSON instead of a timeline.
        #[arg(long)]
        json: bool,
        /// Show the text of model answers in the timeline as it streams in.
        #[arg(long, conflicts_with = "json")]
        stream: bool,
        /// Create the job's first run and exit without driving it: a `baton worker` on the
        /// same --db drives it (or `baton resume RUN`). `--queue=NAME` puts it in queue
        /// NAME (made with `baton queue create`); `--queue` alone, in `default`.
        #[arg(
            long,
            value_name = "NAME",
            num_args = 0..=1,
            require_equals = true,
            default_missing_value = "default",
            conflicts_with_all = ["stream", "cassette", "record"]
        )]
        queue: Option<String>,
        /// With --queue: 0 (the default) to 9; a higher one is claimed first, each point
        /// worth a ninth of the queue's aging time.
        #[arg(long, requires = "queue", default_value_t = 0, value_parser = clap::value_parser!(i16).range(0..=9))]
        priority: i16,
        /// Replay model answers from this cassette; no model is called.
        #[arg(long, conflicts_with = "script")]
        cassette: Option<PathBuf>,
        /// Record every model answer into this cassette file.
        #[arg(long)]
        record: Option<PathBuf>,
        /// The directory the run's tool-loop levels edit and its verifiers check (default: a
        /// new one per run under `workspaces/` beside the database, never the current
        /// directory). Baton keeps its snapshots outside it, in `--snapshots`.
        #[arg(long, value_name = "DIR")]
        workspace: Option<PathBuf>,
        /// When the run completes, name its result with this branch of the workspace's
        /// snapshot repository (`git --git-dir SNAPSHOTS/KEY/git log NAME`).
        #[arg(long, value_name = "NAME")]
        branch: Option<String>,
    },
    /// Work with cassettes (recorded model answers).
    #[command(subcommand)]
    Cassette(CassetteCommand),
    /// Re-execute a recorded job from its own log: model answers come from the log, the
    /// outside decisions are made again at the same pauses, and verifiers run again (or,
    /// with --trust-validation, their recorded outcomes are taken). Reports whether the new
    /// log matches the old one event by event (times, durations, heartbeats and ids that
    /// come from time aside). Exit 0 when it matches, 1 when it does not.
    Replay {
        /// The job's root run (in --db); the replay is a new job in the same database.
        #[arg(required_unless_present = "fixture", conflicts_with = "fixture")]
        run: Option<String>,
        /// Replay a fixture directory instead, in a scratch database.
        #[arg(long, value_name = "DIR")]
        fixture: Option<PathBuf>,
        /// Take the verifiers' recorded outcomes instead of running them again.
        #[arg(long)]
        trust_validation: bool,
        /// Run this scenario file's version instead of the one the run recorded.
        #[arg(long, value_name = "FILE")]
        from_scenario: Option<PathBuf>,
        /// Print the result as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Start a new run from another run's log up to event SEQ (a level boundary or a
    /// pause; without --at, list them), with edits recorded as its first own event, and
    /// drive it on: its workspace is its own, restored to the snapshot SEQ had reached.
    /// Answers come from --script, --cassette or the configured providers.
    Fork {
        run: String,
        /// The last event the fork keeps.
        #[arg(long, value_name = "SEQ")]
        at: Option<u64>,
        /// A new input.
        #[arg(long)]
        input: Option<String>,
        /// Go on with this scenario file's version (it must have every level the kept
        /// events ran).
        #[arg(long, value_name = "FILE")]
        scenario_file: Option<PathBuf>,
        /// Set a scratchpad note: `scratchpad.KEY=VALUE` (VALUE as JSON, else text;
        /// repeatable).
        #[arg(long, value_name = "scratchpad.KEY=VALUE")]
        set: Vec<String>,
        /// Answer model calls from this script.
        #[arg(long)]
        script: Option<PathBuf>,
        /// Answer model calls from this cassette.
        #[arg(long, conflicts_with = "script")]
        cassette: Option<PathBuf>,
        /// Print events as JSON lines and the result as JSON.
        #[arg(long)]
        json: bool,
    },
    /// What a job of SCENARIO costs, from recorded jobs (the store's last ended jobs, or
    /// fixtures): cost, tokens and duration at p50, p90 and max, per level and in total,
    /// and how often a job crossed the scenario's budget. A p90 needs 10 jobs.
    Forecast {
        scenario: String,
        /// Count the recorded jobs whose input is about as long as this one (half to
        /// twice), when there are 10 of them.
        #[arg(long)]
        input: Option<String>,
        /// Read the fixtures of DIR (default: SCENARIOS/fixtures/SCENARIO) instead of the
        /// store.
        #[arg(long, value_name = "DIR", num_args = 0..=1, conflicts_with = "runs")]
        fixtures: Option<Option<PathBuf>>,
        /// How many of the store's last ended jobs to read (default 50).
        #[arg(long, value_name = "N")]
        runs: Option<usize>,
        /// Print the forecast as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Where two jobs' level paths, verdicts, outputs, costs and logs diverge.
    Diff {
        a: String,
        b: String,
        /// Print the result as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Golden fixtures: recorded jobs under SCENARIOS/fixtures/SCENARIO/CASE/ that
    /// `baton test` replays.
    #[command(subcommand)]
    Fixture(FixtureCommand),
    /// Replay every fixture (of the scenarios named, else all) against the current scenario
    /// files and report per case what changed: status, level path, verdicts, verifier
    /// scores, output (a diff), cost and tokens, and every model request the cassette does
    /// not hold (with a diff of the request). A case fails when it crosses its scenario's
    /// `regression_thresholds`. Exit 0 when every case passes, 1 otherwise.
    Test {
        /// The scenarios whose fixtures to replay (default: all).
        #[arg(value_name = "SCENARIO")]
        only: Vec<String>,
        /// Only the fixtures of this case name.
        #[arg(long)]
        case: Option<String>,
        #[arg(long, value_enum, default_value_t = TestFormat::Text)]
        format: TestFormat,
        /// Send requests the cassette does not hold to the configured providers and add
        /// their answers to the fixture's cassette.
        #[arg(long)]
        live: bool,
        /// Take the verifiers' recorded outcomes instead of running them again.
        #[arg(long)]
        trust_validation: bool,
    },
    /// Waves: batches of assignments run by workers with bounded parallelism (a `wave`
    /// level, or a standalone wave planned here). A WAVE is a run id, or `current` (the
    /// newest run with a wave under way).
    #[command(subcommand)]
    Wave(WaveCommand),
    /// Tenants' overrides of scenarios, kept in the database (checked before they are
    /// stored; `baton run --tenant T` runs the merged scenarios).
    #[command(subcommand)]
    Tenant(TenantCommand),
    /// Serve the HTTP API (with live event streams) and drive runs: started through it,
    /// continued after a decision, taken up after a restart. Prints `listening on URL`.
    Serve {
        /// The address to listen on (port 0: any free port).
        #[arg(long, default_value = "127.0.0.1:8080")]
        listen: std::net::SocketAddr,
        /// Serve without tokens, every caller an admin of runs of no tenant (loopback only).
        #[arg(long)]
        no_auth: bool,
        /// Runs driven at once.
        #[arg(long, default_value_t = 16)]
        workers: usize,
        /// The largest request body, in bytes (larger ones get 413).
        #[arg(long, default_value_t = 1 << 20)]
        body_max_bytes: usize,
        /// Runs a tenant may start per minute (more get 429).
        #[arg(long, default_value_t = 600_000)]
        starts_per_minute: u32,
        /// Event streams open at once per token (more get 429).
        #[arg(long, default_value_t = 64)]
        streams_per_token: usize,
        /// Another HOST:PORT requests may name (a loopback server answers only to its
        /// loopback names otherwise).
        #[arg(long = "host")]
        hosts: Vec<String>,
        /// Runs started through the API answer from this script.
        #[arg(long)]
        script: Option<PathBuf>,
        /// Drives of a run stopped by a transient failure (every model unavailable, the
        /// workspace busy), at most; past them it stays interrupted.
        #[arg(long, default_value_t = 5)]
        retries_max: u32,
        /// The wait before the first of them, in milliseconds; each next one waits twice
        /// as long.
        #[arg(long, default_value_t = 1000)]
        retry_first_ms: u64,
        /// Send OpenTelemetry traces (a span per run, level, model call, tool call and
        /// verifier) to this OTLP/HTTP collector (`http://127.0.0.1:4318`).
        #[arg(long, env = "BATON_OTLP_ENDPOINT")]
        otlp_endpoint: Option<String>,
        /// On SIGTERM or SIGINT the server drains (`/readyz` 503, no new runs) for at most
        /// this many seconds; a second signal (or the end of it) cuts what is left.
        #[arg(long, default_value_t = 30, value_parser = clap::value_parser!(u64).range(0..=3600))]
        drain_grace_s: u64,
        #[command(flatten)]
        service: crate::service_args::ServiceLimits,
    },
    /// Drive runs nobody drives, from the store shared with other processes (best on
    /// PostgreSQL): runs queued with `baton run --queue`, and runs whose driver died once
    /// its lease ran out. Each claimed run is leased, its lease renewed while its job is
    /// driven; any number of workers (and `baton serve`) may share one database.
    Worker {
        /// Jobs driven at once.
        #[arg(long, default_value_t = 4)]
        concurrency: usize,
        /// Seconds a claimed run stays this worker's without a renewal (renewed every
        /// third of it); a killed worker's runs are taken over after it.
        #[arg(long, default_value_t = 30)]
        lease_s: u64,
        /// The name leases are taken under (default: baton-worker-HOST-PID).
        #[arg(long)]
        name: Option<String>,
        /// A scripted model for the runs this worker starts. A claimed run answers from
        /// the model source it recorded when it started (the script it was queued with, or
        /// the configured providers), not from this one.
        #[arg(long)]
        script: Option<PathBuf>,
        /// Exit 0 once nothing was claimed or driven for this many seconds.
        #[arg(long, value_name = "SECONDS")]
        idle_exit_s: Option<u64>,
        /// Drives of a run stopped by a transient failure, at most.
        #[arg(long, default_value_t = 5)]
        retries_max: u32,
        /// The wait before the first of them, in milliseconds (doubling).
        #[arg(long, default_value_t = 1000)]
        retry_first_ms: u64,
        /// On SIGTERM or SIGINT the worker drains (no new claims; its runs given back
        /// between two steps) for at most this many seconds; a second signal cuts the rest.
        #[arg(long, default_value_t = 30, value_parser = clap::value_parser!(u64).range(0..=3600))]
        drain_grace_s: u64,
        /// Serve `/healthz`, `/readyz` (503 while draining) and `/metrics` (a metrics token)
        /// here, e.g. `127.0.0.1:9091`; none when left out.
        #[arg(long, value_name = "ADDR")]
        listen: Option<std::net::SocketAddr>,
        /// Take runs only from these queues (comma-separated; default: every queue).
        #[arg(long, value_name = "NAMES", value_delimiter = ',')]
        queues: Vec<String>,
    },
    /// Queues jobs wait in for workers, each with its aging time and an optional limit on
    /// its runs driven at once across the fleet (kept in the database).
    #[command(subcommand)]
    Queue(crate::service_args::QueueCommand),
    /// Serve MCP on stdin and stdout for an MCP host (an IDE or CLI agent): tools to start
    /// scenarios, follow runs, decide approvals and drive waves; run timelines as
    /// resources; the `baton` and `baton:waves` prompts. Runs it starts are driven here.
    Mcp {
        /// Act for this tenant's runs (default: runs of no tenant).
        #[arg(long)]
        tenant: Option<String>,
        /// The principal decisions and wave records are recorded by (default `mcp`).
        #[arg(long = "as", value_name = "NAME")]
        name: Option<String>,
        /// Runs driven at once.
        #[arg(long, default_value_t = 16)]
        workers: usize,
        /// Runs started through MCP answer from this script.
        #[arg(long)]
        script: Option<PathBuf>,
        /// The longest message the host may send, in bytes (a longer one ends the session).
        #[arg(long, default_value_t = 1 << 20)]
        message_max_bytes: usize,
    },
    /// Bearer tokens of `baton serve`, each for one tenant with one role.
    #[command(subcommand)]
    Token(TokenCommand),
    /// Webhooks: a tenant's URLs that are sent its runs' events (approvals requested,
    /// questions asked, runs finished, waves decided), signed, retried and recorded;
    /// `baton serve` and `baton worker` send them.
    #[command(subcommand)]
    Webhook(WebhookCommand),
    /// Continue a run (after a crash, or after a decision or answer).
    Resume {
        run: String,
        /// The script to answer model calls (default: the one the run started with).
        #[arg(long)]
        script: Option<PathBuf>,
        #[arg(long)]
        json: bool,
        /// Move the run to the scenario's current version (its files as they are now)
        /// before continuing it, instead of the version it started with; recorded as a
        /// `scenario_upgraded` event, refused when a level it already ran is gone.
        #[arg(long)]
        upgrade: bool,
    },
    /// Approve (or reject) an approval request of a paused run, then continue it.
    ///
    /// The decision is recorded without loading the scenarios; the run then continues on
    /// the scenario version it started with, which the store keeps.
    Approve {
        run: String,
        /// The request to decide (listed by `baton runs`, `baton events` and a paused run);
        /// may be left out when the run waits for exactly one.
        #[arg(long, value_name = "ID")]
        request: Option<String>,
        #[arg(long)]
        reject: bool,
        #[arg(long)]
        comment: Option<String>,
        /// Who decides (recorded in the log); must not be empty.
        #[arg(long, value_parser = parse_by)]
        by: Option<String>,
        /// The approver's data for the level's `output_schema`: a file holding a JSON
        /// object, checked against the schema before anything is recorded (an approval
        /// needs it when the schema requires more than `approved`).
        #[arg(long, value_name = "FILE.json")]
        data: Option<PathBuf>,
        #[arg(long)]
        script: Option<PathBuf>,
        /// Record the decision without continuing the run here.
        #[arg(long)]
        no_resume: bool,
    },
    /// Answer the question a paused run asked, then continue it.
    Answer {
        run: String,
        /// The answer, as JSON (`'"yes"'`, `42`, `{"choice": "b"}`).
        #[arg(long)]
        answer: String,
        #[arg(long)]
        script: Option<PathBuf>,
        #[arg(long)]
        no_resume: bool,
    },
    /// Send a message to a running run: recorded once, and given to the next model call of
    /// a level that declares `steerable: true` (refused when no such level is running or
    /// ahead, or after the run ended). The process driving the run takes it in as it goes.
    Steer {
        run: String,
        /// The message (text, at most 8 KiB).
        #[arg(long)]
        message: String,
        /// Who sends it (recorded in the log); the login name when left out.
        #[arg(long, value_parser = parse_by)]
        by: Option<String>,
    },
    /// Stop a run and every run it started: a paused run (or one whose process died) ends
    /// here, after its child runs have settled; a running one stops at its driver's next
    /// check. Exit 0 once the cancel is recorded.
    Cancel {
        run: String,
        /// Who cancels (recorded in the log).
        #[arg(long, value_parser = parse_by)]
        by: Option<String>,
        /// Why (recorded on the cancel event; `baton events` shows it).
        #[arg(long)]
        reason: Option<String>,
    },
    /// List runs, newest first: status, scenario, cost, tokens, duration, and what a paused
    /// run waits for.
    Runs {
        /// Only runs with this status.
        #[arg(long, value_parser = clap::builder::PossibleValuesParser::new(baton_app::listing::run_statuses()))]
        status: Option<String>,
        /// Show each job as a tree: its first run, and below it the runs it started.
        #[arg(long)]
        tree: bool,
        #[arg(long)]
        json: bool,
    },
    /// Print a run's events, or with --all every run's in the order they were committed
    /// (JSON lines with --json).
    Events {
        #[arg(required_unless_present = "all", conflicts_with = "all")]
        run: Option<String>,
        /// Keep printing new events (until the run ends; with --all, until stopped).
        #[arg(long)]
        follow: bool,
        /// Also print the events of every run it started, nested under the event that
        /// started each (with --json, every line names its run).
        #[arg(long, conflicts_with = "all")]
        tree: bool,
        /// Every run's events, one feed in commit order; each line names its run and, with
        /// --json, its cursor.
        #[arg(long)]
        all: bool,
        /// With --all: only the events after this cursor (`MAJOR-MINOR`, as printed).
        #[arg(long, requires = "all", value_parser = parse_cursor)]
        after: Option<baton_engine::store::FeedCursor>,
        /// With --all: only runs of this tenant (every tenant's without it).
        #[arg(long, requires = "all")]
        tenant: Option<String>,
        /// Name the process that wrote each commit: a `written by` line before its first
        /// event (with --json, a `writer` field on it).
        #[arg(long, conflicts_with_all = ["all", "follow", "tree"])]
        writers: bool,
        #[arg(long)]
        json: bool,
    },
    /// Measure the kernel on a fixed workload with a zero-latency scripted model.
    Bench {
        /// linear5, gate_loop, fanout8, approval, paused, resume, reopen, chain3, wave,
        /// takeover (PostgreSQL), jail, hash (what the hash chain costs per event) or http.
        #[arg(long, default_value = "linear5")]
        workload: String,
        /// memory, sqlite or postgres (with --bench-db postgres://…).
        #[arg(long, default_value = "memory")]
        store: String,
        /// How many runs.
        #[arg(long, default_value_t = 1000)]
        runs: usize,
        /// How many runs in flight at once.
        #[arg(long, default_value_t = 1)]
        concurrency: usize,
        /// The SQLite file (default: a fresh temporary one), or the PostgreSQL database the
        /// bench makes a schema of its own in (and drops after).
        #[arg(long = "bench-db")]
        bench_db: Option<PathBuf>,
        /// Measure this many times, each on a fresh store, and report the medians.
        #[arg(long, default_value_t = 1)]
        repeat: usize,
        /// With --store postgres: this many stores share the runs, each with connections
        /// of its own and --concurrency runs in flight (as `baton worker` processes have).
        #[arg(long, default_value_t = 1)]
        workers: usize,
        /// With --store postgres: start this many `baton worker` processes (each with
        /// --concurrency slots) on a queue the bench fills, and measure them.
        #[arg(long, default_value_t = 0, conflicts_with = "workers")]
        processes: usize,
        /// With --processes: how long each model call takes, in milliseconds.
        #[arg(long, default_value_t = 0, requires = "processes")]
        model_latency_ms: u64,
        #[arg(long)]
        json: bool,
    },
    /// Remove whole jobs that ended before a time: their runs and logs from the database,
    /// the workspaces they made and their snapshots from Baton's directories.
    Purge {
        /// An RFC 3339 time (2026-11-01T00:00:00Z) or an age (30d, 12h, 45m, 90s).
        #[arg(long, value_name = "TIME", required_unless_present = "job", conflicts_with = "job")]
        finished_before: Option<String>,
        /// Remove this one job instead (named by any of its runs), whenever it ended.
        #[arg(long, value_name = "RUN")]
        job: Option<String>,
        /// With --job: remove it even when runs of it have not ended (a run left half-made,
        /// links that never completed); refused while a process drives one.
        #[arg(long, requires = "job")]
        unended: bool,
        /// Keep jobs with a failed or aborted run.
        #[arg(long)]
        keep_failed: bool,
        /// Say what would go; remove nothing.
        #[arg(long)]
        dry_run: bool,
    },
    /// Move the database's schema forward to this binary's version (PostgreSQL: a database
    /// at an older version is refused until it is migrated; SQLite migrates when opened).
    /// Forward only; every run is kept.
    Migrate,
    /// Check the logs of every run in the database (or the runs named): each event's
    /// number and hash in the chain, and the run's last event and head hash. Exit 0 when
    /// all are intact, 1 with one line per damaged run.
    Verify {
        /// Run ids (default: every run).
        runs: Vec<String>,
        #[arg(long)]
        json: bool,
    },
    /// Remove what no run owns from Baton's own directories beside the database: workspaces
    /// (`workspaces/RUN`) and snapshot repositories of runs not in the store, and lock files
    /// of runs not in the store or ended — none that is in use. A directory named with
    /// `--workspace` is never removed.
    Gc {
        /// Print what would be removed, and remove nothing.
        #[arg(long)]
        dry_run: bool,
    },
    /// Copy the database, live, into a new file DEST in one consistent step.
    Backup {
        /// The file to create (never overwritten); check it with `baton verify --db DEST`.
        dest: PathBuf,
    },
    /// Draw a scenario's graph.
    Graph {
        /// A scenario id (looked up in the scenarios directory) or a scenario file.
        scenario: String,
        /// Output format.
        #[arg(long, value_enum, default_value_t = GraphFormat::Mermaid)]
        format: GraphFormat,
    },
    /// Print the JSON Schema of the scenario format (for editors).
    Schema,
    /// Parse, check and evaluate one gate expression.
    Expr {
        /// The expression, for example "verdict == 'PASS' && !escalate_now".
        expr: String,
        /// Check names against this scenario (an id or a file).
        #[arg(long, requires = "from")]
        scenario: Option<String>,
        /// The level the edge leaves from (its verifiers are the ones `verifier.<name>` may name).
        #[arg(long, requires = "scenario")]
        from: Option<String>,
        /// A JSON file with the state to evaluate against, e.g.
        /// {"verdict": "PASS", "verifier": {"build": {"passed": true}}}.
        #[arg(long)]
        state: Option<PathBuf>,
    },
}

/// Cassette commands.
#[derive(Debug, Subcommand)]
pub(crate) enum CassetteCommand {
    /// Write a run's model answers as a cassette, to replay it with `run --cassette`.
    Export {
        run: String,
        /// The file to write (default: standard output).
        #[arg(long)]
        out: Option<PathBuf>,
    },
}

/// Fixture commands.
#[derive(Debug, Subcommand)]
pub(crate) enum FixtureCommand {
    /// Record a fixture: a new job of SCENARIO (answered by --script, else the configured
    /// providers, with --decide for each pause), or an ended job of the store (--from-run).
    Record {
        scenario: String,
        case: String,
        /// Take this ended job (its root run) as it is.
        #[arg(long, value_name = "RUN")]
        from_run: Option<String>,
        /// Answer model calls from this script.
        #[arg(long)]
        script: Option<PathBuf>,
        /// The job's input.
        #[arg(long)]
        input: Option<String>,
        /// Metadata for the job (repeatable).
        #[arg(long = "meta", value_parser = parse_meta)]
        meta: Vec<(String, String)>,
        /// The tenant whose name the job records.
        #[arg(long)]
        tenant: Option<String>,
        /// What each pause gets, in order (repeatable): `approve`, `approve:COMMENT`,
        /// `reject`, `reject:COMMENT`, `answer:JSON`.
        #[arg(long)]
        decide: Vec<String>,
        /// Replace an existing fixture of that name.
        #[arg(long)]
        force: bool,
    },
    /// Record fixtures again from their replays on the current scenario files (after a
    /// reviewed change): job, cassette, log and expected result are rewritten.
    Accept {
        /// The scenario whose fixtures to accept (default: every scenario's).
        scenario: Option<String>,
        /// Only this case.
        case: Option<String>,
        /// Send requests the cassette does not hold to the configured providers.
        #[arg(long)]
        live: bool,
        /// Take the verifiers' recorded outcomes instead of running them again.
        #[arg(long)]
        trust_validation: bool,
    },
}

/// How `baton test` reports.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub(crate) enum TestFormat {
    Text,
    Json,
    Junit,
}

/// Wave commands.
#[derive(Debug, Subcommand)]
pub(crate) enum WaveCommand {
    /// Plan a standalone wave from a task list and print its run id (the wave's name). Its
    /// assignments are dispatched by outside agents (`dispatch`, `record`) or, with
    /// --worker, by `baton wave run`.
    Plan {
        /// A JSON file: `{"tasks": [{"id", "title", "description"?, "priority"?}],
        /// "context"?: TEXT, "max_parallel"?: N}` (or `assignments` for `tasks`).
        #[arg(long, value_name = "FILE.json")]
        tasks: PathBuf,
        /// The scenario each assignment runs as a child run of, under `baton wave run`.
        #[arg(long, value_name = "SCENARIO")]
        worker: Option<String>,
        /// Most workers at once, 1 to 10, stored on the wave (default: the task list's,
        /// else `[waves] max_parallel` in baton.toml, else 3).
        #[arg(long, value_name = "N", allow_negative_numbers = true)]
        max_parallel: Option<i64>,
        /// Longest time one worker may take, in seconds (0.001 to 2147483.647; default 600).
        #[arg(long, value_name = "SECONDS", allow_negative_numbers = true)]
        timeout_s: Option<f64>,
        /// Most assignments the plan may hold (1 to 200; default 50).
        #[arg(long, value_name = "N")]
        max_assignments: Option<u32>,
        /// Text every worker receives beside its assignment.
        #[arg(long)]
        context: Option<String>,
        /// Answer the workers' model calls from this script.
        #[arg(long)]
        script: Option<PathBuf>,
        #[arg(long)]
        json: bool,
    },
    /// Give a planned assignment to a worker you run yourself (within the wave's
    /// max_parallel); record its outcome with `record` before its timeout.
    Dispatch {
        wave: String,
        #[arg(long, value_name = "ID", conflicts_with = "task")]
        assignment: Option<String>,
        /// The assignment of this task id.
        #[arg(long, value_name = "ID")]
        task: Option<String>,
        /// Your worker's run id (1 to 128 characters).
        #[arg(long, value_name = "ID")]
        worker_run: String,
        #[arg(long, value_parser = parse_by)]
        by: Option<String>,
        #[arg(long)]
        json: bool,
    },
    /// Record the outcome of an assignment you dispatched, exactly once (refused for one
    /// already settled, one a `baton wave run` worker owns, and one past its timeout,
    /// which is recorded failed instead).
    Record {
        wave: String,
        #[arg(long, value_name = "ID", conflicts_with = "task")]
        assignment: Option<String>,
        #[arg(long, value_name = "ID")]
        task: Option<String>,
        /// completed, partial, blocked, failed or cancelled.
        #[arg(long)]
        outcome: String,
        #[arg(long)]
        summary: Option<String>,
        /// What blocks the work (repeatable).
        #[arg(long = "blocker")]
        blockers: Vec<String>,
        #[arg(long, value_parser = parse_by)]
        by: Option<String>,
        #[arg(long)]
        json: bool,
    },
    /// Print the controller's decision: dispatch, wait, complete, replan, escalate or
    /// cancelled (assignments past their timeout are recorded failed first).
    Decide {
        wave: String,
        #[arg(long)]
        json: bool,
    },
    /// End a wave whose decision is an end (complete, replan or escalate), then continue
    /// its run to its end.
    Complete {
        wave: String,
        #[arg(long, value_parser = parse_by)]
        by: Option<String>,
        #[arg(long)]
        json: bool,
    },
    /// Cancel a wave: every unsettled worker is cancelled and waited for (up to the settle
    /// timeout), then the wave ends cancelled with what settled.
    Cancel {
        wave: String,
        #[arg(long, value_parser = parse_by)]
        by: Option<String>,
        #[arg(long)]
        reason: Option<String>,
    },
    /// Dispatch the wave's planned assignments to its worker scenario from this process,
    /// at most --max-parallel at once (this drive only; the stored value is unchanged),
    /// and drive them to the wave's end.
    Run {
        wave: String,
        #[arg(long, value_name = "N", allow_negative_numbers = true)]
        max_parallel: Option<i64>,
        #[arg(long)]
        script: Option<PathBuf>,
        #[arg(long)]
        json: bool,
    },
    /// Show a wave as a table: each assignment's stage, outcome, worker run and cost.
    Get {
        wave: String,
        /// Print the table again whenever it changes, until the wave's run ends.
        #[arg(long)]
        watch: bool,
        #[arg(long)]
        json: bool,
    },
    /// List waves, newest first.
    List {
        #[arg(long)]
        json: bool,
    },
    /// Summarise the orchestration state: waves under way, assignments by outcome, cost.
    Summary {
        #[arg(long)]
        json: bool,
    },
}

/// Token commands.
#[derive(Debug, Subcommand)]
pub(crate) enum TokenCommand {
    /// Make a token for TENANT and print it (once; the database keeps only its SHA-256).
    Create {
        /// The tenant whose runs it acts on (none for `--role metrics`).
        #[arg(long)]
        tenant: Option<String>,
        /// viewer (reads), operator (also starts, decides, cancels) or admin (also the
        /// tenant's overrides); or metrics: the server's metrics and nothing of any tenant.
        #[arg(long, default_value = "operator")]
        role: String,
        /// Who holds it: decisions made with it are recorded by this name (default: the
        /// tenant).
        #[arg(long)]
        name: Option<String>,
    },
    /// List tokens (never the tokens themselves).
    List {
        #[arg(long)]
        tenant: Option<String>,
        #[arg(long)]
        json: bool,
    },
    /// Revoke a token by its id (`tok_…`).
    Revoke { id: String },
}

/// Webhook commands.
#[derive(Debug, Subcommand)]
pub(crate) enum WebhookCommand {
    /// Send TENANT's events to URL; prints the webhook's id and its signing secret (once).
    Add {
        /// The receiver (http or https; loopback and private addresses only when
        /// `[egress] allow_private = true`).
        #[arg(long)]
        url: String,
        /// The tenant whose runs it is sent (none: runs of no tenant).
        #[arg(long)]
        tenant: Option<String>,
        /// The event types, comma-separated (default: all): approval.requested,
        /// question.asked, run.completed, run.failed, run.cancelled, run.aborted,
        /// wave.decided.
        #[arg(long, value_delimiter = ',')]
        events: Vec<String>,
    },
    /// List the live webhooks of a tenant (never their secrets).
    List {
        #[arg(long)]
        tenant: Option<String>,
        #[arg(long)]
        json: bool,
    },
    /// Remove a webhook: nothing more is sent to it.
    Rm {
        id: String,
        #[arg(long)]
        tenant: Option<String>,
    },
    /// Give a webhook a new secret (printed once); the old one signs too for 24 hours.
    Rotate {
        id: String,
        #[arg(long)]
        tenant: Option<String>,
    },
    /// A webhook's newest deliveries, each with every attempt.
    Deliveries {
        id: String,
        #[arg(long)]
        tenant: Option<String>,
        #[arg(long)]
        json: bool,
    },
}

/// Tenant commands.
#[derive(Debug, Subcommand)]
pub(crate) enum TenantCommand {
    /// Store TENANT's override of SCENARIO from FILE (partial YAML merged over the
    /// scenario), replacing the one it had; refused with file:line:column when it does not
    /// load over the current scenarios.
    Set { tenant: String, scenario: String, file: PathBuf },
    /// List the stored overrides (of one tenant).
    List { tenant: Option<String> },
    /// Print one stored override.
    Show { tenant: String, scenario: String },
    /// Remove one stored override.
    Rm { tenant: String, scenario: String },
    /// Store every override of a directory laid out as DIR/TENANT/SCENARIO_ID.yaml, once
    /// every tenant's load.
    Import { dir: PathBuf },
    /// Limit TENANT's runs driven at once across the fleet to MAX (`--none`: no limit);
    /// without either, list every tenant's limit.
    Limit {
        tenant: Option<String>,
        #[arg(requires = "tenant", conflicts_with = "none")]
        max: Option<u32>,
        #[arg(long, requires = "tenant")]
        none: bool,
    },
}

/// How `validate` reports.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub(crate) enum Format {
    Text,
    Json,
}

/// How `graph` draws.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub(crate) enum GraphFormat {
    Mermaid,
    Dot,
}

pub(crate) fn parse_meta(s: &str) -> Result<(String, String), String> {
    match s.split_once('=') {
        Some((k, v)) if !k.is_empty() => Ok((k.to_owned(), v.to_owned())),
        _ => Err(format!("expected KEY=VALUE, got `{s}`")),
    }
}

/// `--by`: who decides, never empty or blank.
pub(crate) fn parse_by(s: &str) -> Result<String, String> {
    if s.trim().is_empty() {
        return Err("--by names who decides and must not be empty".to_owned());
    }
    Ok(s.to_owned())
}

/// A feed cursor as `baton events --all` prints it.
fn parse_cursor(text: &str) -> Result<baton_engine::store::FeedCursor, String> {
    baton_engine::store::FeedCursor::parse(text)
        .ok_or_else(|| format!("`{text}` is not a feed cursor: two numbers, `MAJOR-MINOR`, as `baton events --all` prints them"))
}

//! How the server runs: `Settings` (what `baton serve`, `baton mcp` and `baton worker`
//! listen on, their limits, retries and timings) and `WorkerSettings` (who a `baton worker`
//! is and how long its leases last), with `ConnectionLimits` (the caps and timeouts of its
//! connections).

use std::net::SocketAddr;
use std::time::Duration;

/// How the server runs: what it listens on and its limits.
#[derive(Clone, Debug)]
pub struct Settings {
    /// The command serving, for its notes on stderr (`baton serve`, `baton mcp`).
    pub name: &'static str,
    pub listen: SocketAddr,
    /// No tokens: every caller acts as an admin of runs of no tenant. Only on loopback.
    pub no_auth: bool,
    /// Runs driven at once.
    pub workers: usize,
    /// The largest request body, in bytes.
    pub body_bytes_max: usize,
    /// Runs a tenant may start per minute.
    pub starts_per_minute: u32,
    /// Event streams and MCP sessions open at once per token.
    pub streams_per_token: usize,
    /// Event streams and MCP sessions open at once on this server.
    pub streams_max: usize,
    /// The server is behind TLS (a proxy ends it): session cookies are `__Host-` and
    /// `Secure`.
    pub secure_cookies: bool,
    /// How long a browser session lasts, however much it is used.
    pub session_max_age: Duration,
    /// How long a browser session lasts unused.
    pub session_idle: Duration,
    /// Browser sessions one token may have open; past it, the oldest is signed out of.
    pub sessions_per_token: usize,
    /// How long an MCP session over HTTP lives without a request.
    pub mcp_session_idle: Duration,
    /// Failed authentications a peer may make a minute (more get 429).
    pub auth_failures_per_minute: u32,
    /// The connections' caps and timeouts.
    pub connections: ConnectionLimits,
    /// Host names (with port) requests may name besides the listen address's.
    pub hosts: Vec<String>,
    /// Drives of a run stopped by a transient failure: at most this many, the first after
    /// `retry_first`, each wait doubled.
    pub retries_max: u32,
    pub retry_first: Duration,
    /// How often the scenarios directory is looked at for changes.
    pub refresh_every: Duration,
    /// How long an event stream stays quiet before a keep-alive comment.
    pub keep_alive: Duration,
    /// Where to send OpenTelemetry traces (OTLP/HTTP, `http://HOST:PORT`); none: no traces.
    pub otlp_endpoint: Option<String>,
    /// The name this process drives runs under, as `run_resumed.process` records it after
    /// the command (`baton worker NAME`); none: this host and process id.
    pub driver_name: Option<String>,
    /// Whether the text of model answers this process's drives receive is shared through
    /// the store with other processes' event streams (a worker's, which no stream of its
    /// own follows).
    pub share_live: bool,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            name: "baton serve",
            listen: SocketAddr::from(([127, 0, 0, 1], 8080)),
            no_auth: false,
            workers: 16,
            body_bytes_max: 1 << 20,
            starts_per_minute: 600_000,
            streams_per_token: 64,
            streams_max: 1024,
            auth_failures_per_minute: 30,
            mcp_session_idle: Duration::from_secs(600),
            secure_cookies: false,
            session_max_age: Duration::from_secs(8 * 3600),
            session_idle: Duration::from_secs(30 * 60),
            sessions_per_token: 16,
            connections: ConnectionLimits::default(),
            hosts: Vec::new(),
            retries_max: 5,
            retry_first: Duration::from_secs(1),
            refresh_every: Duration::from_secs(1),
            keep_alive: Duration::from_secs(15),
            otlp_endpoint: None,
            driver_name: None,
            share_live: false,
        }
    }
}

/// The connection caps and timeouts (`baton serve --connections-max` and the rest).
#[derive(Clone, Debug)]
pub struct ConnectionLimits {
    /// Connections open at once.
    pub max: usize,
    /// Connections open at once from one peer (an IPv4 address or an IPv6 /64).
    pub per_peer: usize,
    /// How long a request head may take from its first byte; also how long a body may
    /// pause.
    pub header_timeout: Duration,
    /// The slowest a body may arrive on average once `header_timeout` has passed, in bytes
    /// a second.
    pub body_rate_min: u64,
    /// How long a connection may wait between requests.
    pub idle_timeout: Duration,
    /// How long a client may read nothing of a response.
    pub write_timeout: Duration,
    /// Proxies whose `Forwarded`/`X-Forwarded-For` name the client.
    pub trusted_proxies: Vec<crate::peers::Cidr>,
}

impl Default for ConnectionLimits {
    fn default() -> Self {
        ConnectionLimits {
            max: 4096,
            per_peer: 256,
            header_timeout: Duration::from_secs(10),
            body_rate_min: 1024,
            idle_timeout: Duration::from_secs(60),
            write_timeout: Duration::from_secs(60),
            trusted_proxies: Vec::new(),
        }
    }
}

/// What `baton worker` is told: who it is, how long its leases last, when to stop.
#[derive(Clone, Debug)]
pub struct WorkerSettings {
    /// The name its leases are taken under (unique among the workers).
    pub name: String,
    /// How long a claimed run stays this worker's without a renewal.
    pub lease: Duration,
    /// Stop once nothing was claimed or driven for this long; none: run until stopped.
    pub idle_exit: Option<Duration>,
    /// Cancelled to drain: claim no more runs, let the steps in flight finish and give
    /// their runs back between two steps, for other workers.
    pub drain: baton_engine::cancel::CancelToken,
    /// How long a drain waits for the steps in flight before the stop cuts them.
    pub grace: Duration,
    /// Where it serves `/healthz`, `/readyz` and `/metrics`, if anywhere.
    pub listen: Option<std::net::SocketAddr>,
    /// The queues it takes runs from (none: every queue).
    pub queues: Vec<String>,
}

/// How `baton serve` drains: `drain` cancelled (its first signal) makes `/readyz` answer
/// 503, refuses new runs and lets every drive go between two steps; once no drive is left,
/// or `grace` passed, the stop cuts what is left.
#[derive(Clone, Debug, Default)]
pub struct Draining {
    pub drain: baton_engine::cancel::CancelToken,
    pub grace: Duration,
}

/// Says `warning` on the server's log (stderr).
#[allow(clippy::print_stderr)]
pub(crate) fn warn(warning: &str) {
    eprintln!("baton serve: warning: {warning}");
}

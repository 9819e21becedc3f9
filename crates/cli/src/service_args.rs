//! `baton serve`'s connection caps, timeouts and per-peer limits, as flags (flattened into
//! the `serve` command of `args.rs`), and how they set the server's settings.

/// `baton serve`'s connection caps, timeouts and per-peer limits (each per server process).
#[derive(Debug, clap::Args)]
pub(crate) struct ServiceLimits {
    /// Connections open at once; past it the one that waited longest without a whole
    /// request is closed, else the new one gets 503.
    #[arg(long, default_value_t = 4096, value_parser = clap::value_parser!(u32).range(16..))]
    pub(crate) connections_max: u32,
    /// Connections open at once from one client address (an IPv6 client: its /64); more
    /// get 429.
    #[arg(long, default_value_t = 256, value_parser = clap::value_parser!(u32).range(1..))]
    pub(crate) connections_per_peer: u32,
    /// Seconds a request head may take from its first byte; also how long a request body
    /// may pause.
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u64).range(1..=3600))]
    pub(crate) header_timeout_s: u64,
    /// The slowest a request body may arrive once --header-timeout-s has passed, in bytes
    /// a second on average.
    #[arg(long, default_value_t = 1024)]
    pub(crate) body_rate_min: u64,
    /// Seconds a connection may wait between requests.
    #[arg(long, default_value_t = 60, value_parser = clap::value_parser!(u64).range(1..=86400))]
    pub(crate) idle_timeout_s: u64,
    /// Seconds a client may read nothing of a response (an event stream's too) before it is
    /// dropped.
    #[arg(long, default_value_t = 60, value_parser = clap::value_parser!(u64).range(1..=86400))]
    pub(crate) write_timeout_s: u64,
    /// Event streams and MCP sessions open at once on this server (more get 429).
    #[arg(long, default_value_t = 1024, value_parser = clap::value_parser!(u32).range(1..))]
    pub(crate) streams_max: u32,
    /// Seconds an MCP session over HTTP lives without a request.
    #[arg(long, default_value_t = 600, value_parser = clap::value_parser!(u64).range(1..=86400))]
    pub(crate) mcp_session_idle_s: u64,
    /// Failed authentications one client address may make a minute (more get 429).
    #[arg(long, default_value_t = 30, value_parser = clap::value_parser!(u32).range(1..))]
    pub(crate) auth_failures_per_minute: u32,
    /// The server is behind TLS (a proxy ends it): session cookies are `__Host-` and
    /// `Secure`.
    #[arg(long)]
    pub(crate) secure_cookies: bool,
    /// Seconds a browser session lasts, however much it is used.
    #[arg(long, default_value_t = 28_800, value_parser = clap::value_parser!(u64).range(1..=604_800))]
    pub(crate) session_max_age_s: u64,
    /// Seconds a browser session lasts unused.
    #[arg(long, default_value_t = 1800, value_parser = clap::value_parser!(u64).range(1..=604_800))]
    pub(crate) session_idle_s: u64,
    /// Browser sessions one token may have; past it, the oldest is signed out of.
    #[arg(long, default_value_t = 16, value_parser = clap::value_parser!(u32).range(1..=10_000))]
    pub(crate) sessions_per_token: u32,
    /// A proxy (an address or CIDR block) whose `Forwarded` or `X-Forwarded-For` names the
    /// client the per-client limits count; its own connections are not capped per client.
    #[arg(long = "trusted-proxy", value_name = "CIDR")]
    pub(crate) trusted_proxies: Vec<baton_server::Cidr>,
}

impl ServiceLimits {
    /// Sets these on a server's settings.
    pub(crate) fn apply(self, settings: &mut baton_server::Settings) {
        use std::time::Duration;
        settings.connections = baton_server::ConnectionLimits {
            max: self.connections_max as usize,
            per_peer: self.connections_per_peer as usize,
            header_timeout: Duration::from_secs(self.header_timeout_s),
            body_rate_min: self.body_rate_min,
            idle_timeout: Duration::from_secs(self.idle_timeout_s),
            write_timeout: Duration::from_secs(self.write_timeout_s),
            trusted_proxies: self.trusted_proxies,
        };
        settings.streams_max = self.streams_max as usize;
        settings.mcp_session_idle = Duration::from_secs(self.mcp_session_idle_s);
        settings.auth_failures_per_minute = self.auth_failures_per_minute;
        settings.secure_cookies = self.secure_cookies;
        settings.session_max_age = Duration::from_secs(self.session_max_age_s);
        settings.session_idle = Duration::from_secs(self.session_idle_s);
        settings.sessions_per_token = self.sessions_per_token as usize;
    }
}

/// `baton queue`: the queues jobs wait in.
#[derive(Debug, clap::Subcommand)]
pub(crate) enum QueueCommand {
    /// Make queue NAME (lowercase letters, digits, `-`, `_`).
    Create {
        name: String,
        #[command(flatten)]
        settings: QueueFlags,
    },
    /// Change queue NAME's aging time or limit (its waiting runs keep their due times).
    Set {
        name: String,
        #[command(flatten)]
        settings: QueueFlags,
    },
    /// Every queue, with its runs waiting and driven now.
    List {
        #[arg(long)]
        json: bool,
    },
}

/// A queue's settings as flags.
#[derive(Debug, clap::Args)]
pub(crate) struct QueueFlags {
    /// The longest a run waits behind runs of higher priority queued after it (default
    /// 600 s).
    #[arg(long, value_name = "SECONDS")]
    pub(crate) aging_s: Option<u64>,
    /// The most runs of the queue driven at once across the fleet.
    #[arg(long, value_name = "N", conflicts_with = "no_limit")]
    pub(crate) max_running: Option<u32>,
    /// No limit (removes one).
    #[arg(long)]
    pub(crate) no_limit: bool,
}

impl QueueFlags {
    /// As the application layer takes them.
    pub(crate) fn settings(&self) -> baton_app::queues::QueueSettings {
        let max_running = match (self.max_running, self.no_limit) {
            (Some(n), _) => Some(Some(n)),
            (None, true) => Some(None),
            (None, false) => None,
        };
        baton_app::queues::QueueSettings { aging_s: self.aging_s, max_running }
    }
}

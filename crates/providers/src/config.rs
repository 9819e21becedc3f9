//! `baton.toml`: the providers Baton may call, their models and prices, and the routing
//! default — or the same, derived from the environment when there is no file — and which
//! configured models a `tier:provider/model` pattern names ([`find`], [`glob`]).
//!
//! ```toml
//! [routing]
//! default = "paid:anthropic/claude-sonnet-4-5"
//!
//! [[providers]]
//! name = "anthropic"
//! kind = "anthropic"                 # or "openai" (any OpenAI-compatible server)
//! base_url = "https://api.anthropic.com"
//! api_key_env = "ANTHROPIC_API_KEY"  # the variable's name; the key never enters the file
//! tier = "paid"                      # or "free"
//! stream = true                      # false for servers that cannot stream
//!
//! [[providers.models]]
//! name = "claude-sonnet-4-5"
//! input_usd_per_mtok = 3.0
//! output_usd_per_mtok = 15.0
//! cached_input_usd_per_mtok = 0.3
//! ```

use std::path::Path;

use baton_scenario::model::Tier;
use serde::Deserialize;

/// Which wire protocol a provider speaks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Kind {
    /// OpenAI-compatible Chat Completions (OpenAI, vLLM, Ollama, llama.cpp, LM Studio, LiteLLM).
    Openai,
    /// Anthropic Messages.
    Anthropic,
}

/// A model and its price.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Model {
    pub name: String,
    /// US dollars per million input tokens.
    #[serde(default)]
    pub input_usd_per_mtok: f64,
    /// US dollars per million output tokens.
    #[serde(default)]
    pub output_usd_per_mtok: f64,
    /// US dollars per million input tokens served from the provider's cache.
    #[serde(default)]
    pub cached_input_usd_per_mtok: Option<f64>,
    /// Most output tokens a call may ask for.
    #[serde(default = "default_max_tokens")]
    pub max_tokens: u32,
}

fn default_max_tokens() -> u32 {
    4096
}

impl Model {
    /// The cost of a call, in US dollars.
    #[allow(clippy::cast_precision_loss)]
    pub fn cost_usd(&self, input: u64, output: u64, cached_input: u64) -> f64 {
        let cached_price = self.cached_input_usd_per_mtok.unwrap_or(self.input_usd_per_mtok);
        let fresh = input.saturating_sub(cached_input);
        (fresh as f64 * self.input_usd_per_mtok
            + cached_input as f64 * cached_price
            + output as f64 * self.output_usd_per_mtok)
            / 1e6
    }
}

/// One configured provider.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Provider {
    pub name: String,
    pub kind: Kind,
    pub base_url: String,
    /// The environment variable holding the API key (none for a local server).
    #[serde(default)]
    pub api_key_env: Option<String>,
    #[serde(deserialize_with = "tier")]
    pub tier: Tier,
    #[serde(default)]
    pub models: Vec<Model>,
    /// Stream responses (the default); `false` for servers that cannot.
    #[serde(default = "yes")]
    pub stream: bool,
}

fn yes() -> bool {
    true
}

fn tier<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Tier, D::Error> {
    match String::deserialize(d)?.as_str() {
        "free" => Ok(Tier::Free),
        "paid" => Ok(Tier::Paid),
        other => {
            Err(serde::de::Error::custom(format!("tier must be `free` or `paid`, not `{other}`")))
        }
    }
}

/// Routing settings.
#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Routing {
    /// `tier:provider/model` used when a level names no constraint, and as the fallback
    /// of constraints that allow one outside their list.
    #[serde(default)]
    pub default: Option<String>,
}

/// The jail's settings (`[jail]`): every field may be left out.
#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JailConfig {
    /// The bubblewrap program (default: `BATON_BWRAP`, else `bwrap` on `PATH`).
    #[serde(default)]
    pub bwrap: Option<std::path::PathBuf>,
    /// The uid jailed programs run as when Baton is root (default 65534, nobody).
    #[serde(default)]
    pub uid: Option<u32>,
    /// Their gid (default 65534).
    #[serde(default)]
    pub gid: Option<u32>,
    /// Toolchain directories to show read-only, beyond the system's and `PATH`'s.
    #[serde(default)]
    pub read_only: Vec<std::path::PathBuf>,
    /// Processes of the jail's uid at most.
    #[serde(default)]
    pub processes: Option<u64>,
    /// Files a program may add to the workspace and its `/tmp`.
    #[serde(default)]
    pub new_files: Option<u64>,
    /// MiB a program may add to the workspace and its `/tmp`.
    #[serde(default)]
    pub new_mib: Option<u64>,
    /// Largest file a program may write, in MiB.
    #[serde(default)]
    pub file_mib: Option<u64>,
    /// Writable memory of each process, in MiB.
    #[serde(default)]
    pub memory_mib: Option<u64>,
}

/// How a job picks its scenario (`[selection]`): every field may be left out.
#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SelectionConfig {
    /// The scenario of a job that names none (default `code_build`).
    #[serde(default)]
    pub default: Option<String>,
    /// Where a chain goes when its route names no scenario (default `quick_qa`).
    #[serde(default)]
    pub fallback: Option<String>,
    /// The classifier scenario (default `intent_classifier`).
    #[serde(default)]
    pub classifier: Option<String>,
    /// The job kinds the classifier routes (default `["task"]`).
    #[serde(default)]
    pub classify_kinds: Option<Vec<String>>,
}

/// Jobs and their trees of runs (`[jobs]`).
#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JobsConfig {
    /// How long the end of a parent waits for its cancelled children to settle, in
    /// seconds (default 15, at most 120).
    #[serde(default)]
    pub settle_timeout_s: Option<f64>,
    /// How long a job's idempotency key names its run, in seconds (default 86 400, a day;
    /// from 60 through 2 592 000, thirty days). After it, a start with the key is a new job.
    #[serde(default)]
    pub idempotency_hold_s: Option<u64>,
    /// Most idempotency keys one tenant's jobs hold at once (default 100 000; from 1 through
    /// 10 000 000). A start with a new key past it is refused until keys expire.
    #[serde(default)]
    pub idempotency_keys_max: Option<u64>,
}

/// Waves (`[waves]`).
#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WavesConfig {
    /// Most workers of a wave running at once, for waves that set none: an integer from
    /// 1 through 10 (default 3).
    #[serde(default)]
    pub max_parallel: Option<i64>,
}

/// Webhooks (`[webhooks]`): how deliveries are retried.
#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WebhooksConfig {
    /// The wait before the first retry, in seconds (default 10); each retry waits twice as
    /// long as the one before, at most an hour, until 24 hours after the event.
    #[serde(default)]
    pub first_backoff_s: Option<f64>,
    /// How long one attempt may take, in seconds (default 10).
    #[serde(default)]
    pub timeout_s: Option<f64>,
}

/// The whole configuration.
#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    #[serde(default)]
    pub routing: Routing,
    #[serde(default)]
    pub providers: Vec<Provider>,
    #[serde(default)]
    pub jail: JailConfig,
    #[serde(default)]
    pub selection: SelectionConfig,
    #[serde(default)]
    pub jobs: JobsConfig,
    #[serde(default)]
    pub waves: WavesConfig,
    /// Where outbound requests made for a user may go (webhooks).
    #[serde(default)]
    pub egress: crate::egress::EgressPolicy,
    #[serde(default)]
    pub webhooks: WebhooksConfig,
    /// Secrets the user's HTTP tools may send, by name (`${secret:NAME}` in a header).
    #[serde(default)]
    pub secrets: std::collections::BTreeMap<String, SecretConfig>,
}

/// A secret HTTP tools may send (`[secrets.NAME]`): where its value is, the hosts it may
/// be sent to, and the tenants whose runs may send it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SecretConfig {
    /// The variable of Baton's environment that holds the value.
    pub env: String,
    /// The hosts it may be sent to: exact names, or `*.example.com` for subdomains; at
    /// least one.
    pub hosts: Vec<String>,
    /// The tenants whose runs may send it; absent, any run may.
    #[serde(default)]
    pub tenants: Option<Vec<String>>,
}

/// Largest `baton.toml` read, in bytes.
pub const CONFIG_BYTES_MAX: u64 = 1024 * 1024;

/// Why a configuration could not be read.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
#[error("{file}: {message}")]
pub struct Error {
    pub file: String,
    pub message: String,
}

impl Config {
    /// Reads a `baton.toml`.
    pub fn from_file(path: &Path) -> Result<Config, Error> {
        let file = path.display().to_string();
        let text = baton_scenario::capped::read_text(path, CONFIG_BYTES_MAX)
            .map_err(|e| Error { file: file.clone(), message: format!("cannot read it: {e}") })?;
        Config::parse(&text, &file)
    }

    /// Parses and checks a configuration's text.
    pub fn parse(text: &str, file: &str) -> Result<Config, Error> {
        let config: Config = toml::from_str(text).map_err(|e| Error {
            file: file.to_owned(),
            message: e.to_string().trim().to_owned(),
        })?;
        config.check().map_err(|message| Error { file: file.to_owned(), message })?;
        Ok(config)
    }

    /// The configuration the environment describes, for running without a file:
    /// `ANTHROPIC_API_KEY` (paid), `OPENAI_API_KEY` (paid) and `OPENAI_BASE_URL` (a local
    /// OpenAI-compatible server such as Ollama: free tier, models from `BATON_MODELS`,
    /// comma-separated).
    pub fn from_env(get: impl Fn(&str) -> Option<String>) -> Config {
        let mut providers = Vec::new();
        if get("ANTHROPIC_API_KEY").is_some() {
            providers.push(Provider {
                name: "anthropic".to_owned(),
                kind: Kind::Anthropic,
                base_url: "https://api.anthropic.com".to_owned(),
                api_key_env: Some("ANTHROPIC_API_KEY".to_owned()),
                tier: Tier::Paid,
                models: vec![
                    price("claude-sonnet-4-5", 3.0, 15.0, Some(0.3)),
                    price("claude-haiku-4-5", 1.0, 5.0, Some(0.1)),
                ],
                stream: true,
            });
        }
        match get("OPENAI_BASE_URL") {
            Some(base_url) => {
                let models = get("BATON_MODELS").unwrap_or_else(|| "llama3.1".to_owned());
                providers.push(Provider {
                    name: "local".to_owned(),
                    kind: Kind::Openai,
                    base_url,
                    api_key_env: get("OPENAI_API_KEY").map(|_| "OPENAI_API_KEY".to_owned()),
                    tier: Tier::Free,
                    models: models
                        .split(',')
                        .map(str::trim)
                        .filter(|m| !m.is_empty())
                        .map(|m| price(m, 0.0, 0.0, None))
                        .collect(),
                    stream: true,
                });
            }
            None if get("OPENAI_API_KEY").is_some() => providers.push(Provider {
                name: "openai".to_owned(),
                kind: Kind::Openai,
                base_url: "https://api.openai.com/v1".to_owned(),
                api_key_env: Some("OPENAI_API_KEY".to_owned()),
                tier: Tier::Paid,
                models: vec![
                    price("gpt-4o", 2.5, 10.0, Some(1.25)),
                    price("gpt-4o-mini", 0.15, 0.6, Some(0.075)),
                ],
                stream: true,
            }),
            None => {}
        }
        let default = providers.first().and_then(|p| {
            p.models.first().map(|m| format!("{}:{}/{}", p.tier.as_str(), p.name, m.name))
        });
        Config { routing: Routing { default }, providers, ..Config::default() }
    }

    fn check(&self) -> Result<(), String> {
        for (name, secret) in &self.secrets {
            if !baton_scenario::check::is_id(name) {
                return Err(format!(
                    "[secrets.{name}]: a secret's name is an id (lower-case letters, digits and `_`, starting with a letter)"
                ));
            }
            if secret.hosts.is_empty() || secret.hosts.iter().any(|h| h.trim().is_empty()) {
                return Err(format!(
                    "[secrets.{name}] hosts must name at least one host the secret may be sent to"
                ));
            }
            if secret.env.is_empty() {
                return Err(format!("[secrets.{name}] env must name the variable holding it"));
            }
        }
        if let Some(s) = self.webhooks.first_backoff_s
            && (!s.is_finite() || !(0.1..=3600.0).contains(&s))
        {
            return Err(format!(
                "[webhooks] first_backoff_s must be from 0.1 through 3600 seconds, not {s}"
            ));
        }
        if let Some(s) = self.webhooks.timeout_s
            && (!s.is_finite() || !(0.1..=60.0).contains(&s))
        {
            return Err(format!(
                "[webhooks] timeout_s must be from 0.1 through 60 seconds, not {s}"
            ));
        }
        if let Some(n) = self.waves.max_parallel
            && !(1..=10).contains(&n)
        {
            return Err(format!(
                "[waves] max_parallel must be an integer from 1 through 10, not {n}"
            ));
        }
        if let Some(s) = self.jobs.settle_timeout_s
            && (!s.is_finite() || s <= 0.0 || s > 120.0)
        {
            return Err(format!(
                "[jobs] settle_timeout_s must be more than 0 and at most 120 seconds, not {s}"
            ));
        }
        if let Some(s) = self.jobs.idempotency_hold_s
            && !(60..=2_592_000).contains(&s)
        {
            return Err(format!(
                "[jobs] idempotency_hold_s must be from 60 through 2592000 seconds (thirty days), not {s}"
            ));
        }
        if let Some(n) = self.jobs.idempotency_keys_max
            && !(1..=10_000_000).contains(&n)
        {
            return Err(format!(
                "[jobs] idempotency_keys_max must be from 1 through 10000000 keys, not {n}"
            ));
        }
        for (key, value) in [
            ("default", &self.selection.default),
            ("fallback", &self.selection.fallback),
            ("classifier", &self.selection.classifier),
        ] {
            if value.as_ref().is_some_and(|v| v.trim().is_empty()) {
                return Err(format!("[selection] {key} names no scenario (it is empty)"));
            }
        }
        let mut names = std::collections::HashSet::new();
        for p in &self.providers {
            if p.name.is_empty()
                || !p
                    .name
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'))
            {
                return Err(format!(
                    "provider name `{}` may hold letters, digits, `_`, `-` and `.` only",
                    p.name
                ));
            }
            if !names.insert(p.name.as_str()) {
                return Err(format!("provider `{}` is configured twice", p.name));
            }
            if !(p.base_url.starts_with("http://") || p.base_url.starts_with("https://")) {
                return Err(format!(
                    "provider `{}`: base_url must start with http:// or https://",
                    p.name
                ));
            }
            let url = reqwest::Url::parse(&p.base_url)
                .map_err(|e| format!("provider `{}`: base_url is not a URL: {e}", p.name))?;
            self.egress
                .for_configured(&url)
                .check_url(&url)
                .map_err(|why| format!("provider `{}`: base_url {why} ([egress])", p.name))?;
            if p.models.is_empty() {
                return Err(format!("provider `{}` lists no models", p.name));
            }
            for m in &p.models {
                let prices = [
                    m.input_usd_per_mtok,
                    m.output_usd_per_mtok,
                    m.cached_input_usd_per_mtok.unwrap_or(0.0),
                ];
                if prices.iter().any(|x| !x.is_finite() || *x < 0.0) {
                    return Err(format!(
                        "provider `{}`, model `{}`: prices must be zero or more",
                        p.name, m.name
                    ));
                }
            }
        }
        if let Some(default) = &self.routing.default
            && find(self, default).is_none()
        {
            return Err(format!(
                "routing.default `{default}` names no configured model (write tier:provider/model)"
            ));
        }
        Ok(())
    }
}

/// Whether `pattern` (with `*` wildcards) matches `text` entirely.
pub fn glob(pattern: &str, text: &str) -> bool {
    let (p, t): (Vec<char>, Vec<char>) = (pattern.chars().collect(), text.chars().collect());
    let (mut pi, mut ti, mut star, mut mark) = (0, 0, None, 0);
    while ti < t.len() {
        if pi < p.len() && p[pi] != '*' && p[pi] == t[ti] {
            pi += 1;
            ti += 1;
        } else if pi < p.len() && p[pi] == '*' {
            star = Some(pi);
            mark = ti;
            pi += 1;
        } else if let Some(s) = star {
            pi = s + 1;
            mark += 1;
            ti = mark;
        } else {
            return false;
        }
    }
    p[pi..].iter().all(|&c| c == '*')
}

/// Every configured model, in configuration order.
fn models(config: &Config) -> impl Iterator<Item = (&Provider, &Model)> {
    config.providers.iter().flat_map(|p| p.models.iter().map(move |m| (p, m)))
}

/// The configured models a pattern matches, in order. A pattern without `/model` matches
/// every model of the providers it names.
pub(crate) fn matching<'a>(
    config: &'a Config,
    pattern: &'a str,
) -> impl Iterator<Item = (&'a Provider, &'a Model)> + 'a {
    let pattern = if pattern.contains('/') { pattern.to_owned() } else { format!("{pattern}/*") };
    models(config)
        .filter(move |(p, m)| glob(&pattern, &format!("{}:{}/{}", p.tier.as_str(), p.name, m.name)))
}

/// The first configured model a pattern matches.
pub fn find<'a>(config: &'a Config, pattern: &'a str) -> Option<(&'a Provider, &'a Model)> {
    matching(config, pattern).next()
}

fn price(name: &str, input: f64, output: f64, cached: Option<f64>) -> Model {
    Model {
        name: name.to_owned(),
        input_usd_per_mtok: input,
        output_usd_per_mtok: output,
        cached_input_usd_per_mtok: cached,
        max_tokens: default_max_tokens(),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::Config;

    #[test]
    fn secrets_name_their_variable_and_at_least_one_host() {
        let ok = "[secrets.tickets]\nenv = \"TICKETS_TOKEN\"\nhosts = [\"tickets.example.com\", \"*.example.org\"]\ntenants = [\"acme\"]\n";
        let config = Config::parse(ok, "baton.toml").unwrap();
        let secret = &config.secrets["tickets"];
        assert_eq!(secret.env, "TICKETS_TOKEN");
        assert_eq!(secret.tenants.as_deref(), Some(&["acme".to_owned()][..]));
        for (text, says) in [
            ("[secrets.tickets]\nenv = \"T\"\nhosts = []\n", "must name at least one host"),
            ("[secrets.Tickets]\nenv = \"T\"\nhosts = [\"h\"]\n", "a secret's name is an id"),
            ("[secrets.tickets]\nenv = \"\"\nhosts = [\"h\"]\n", "env must name the variable"),
            (
                "[secrets.tickets]\nvalue = \"inline\"\nenv = \"T\"\nhosts = [\"h\"]\n",
                "unknown field `value`",
            ),
        ] {
            let e = Config::parse(text, "baton.toml").unwrap_err();
            assert!(e.to_string().contains(says), "{e}");
        }
    }
}

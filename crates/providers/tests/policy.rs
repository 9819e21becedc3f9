//! Configuration and model policy: parsing baton.toml, the environment fallback, and
//! resolving level constraints to concrete models.

#![allow(clippy::unwrap_used)]

use baton_providers::config::{Config, Kind};
use baton_providers::resolve::{chain, glob};
use baton_scenario::model::{ModelConstraint, Tier};

const TOML: &str = r#"
[routing]
default = "paid:anthropic/claude-sonnet-4-5"

[[providers]]
name = "ollama"
kind = "openai"
base_url = "http://127.0.0.1:11434/v1"
tier = "free"
[[providers.models]]
name = "llama3.1:8b"
[[providers.models]]
name = "qwen2.5"

[[providers]]
name = "anthropic"
kind = "anthropic"
base_url = "https://api.anthropic.com"
api_key_env = "ANTHROPIC_API_KEY"
tier = "paid"
[[providers.models]]
name = "claude-sonnet-4-5"
input_usd_per_mtok = 3.0
output_usd_per_mtok = 15.0
cached_input_usd_per_mtok = 0.3
[[providers.models]]
name = "claude-haiku-4-5"
input_usd_per_mtok = 1.0
output_usd_per_mtok = 5.0
"#;

fn constraint(allow: &[&str], fallback: &[&str], outside: bool) -> ModelConstraint {
    ModelConstraint {
        tier: None,
        allow: allow.iter().map(|s| (*s).to_owned()).collect(),
        fallback_outside_allow: outside,
        fallback: fallback.iter().map(|s| (*s).to_owned()).collect(),
        temperature: None,
        retry: Default::default(),
        source: "level",
    }
}

fn labels(config: &Config, c: Option<&ModelConstraint>) -> Vec<String> {
    chain(config, c).iter().map(|ch| format!("{} ({})", ch.label(), ch.source)).collect()
}

#[test]
fn a_config_parses_with_prices_and_defaults() {
    let c = Config::parse(TOML, "baton.toml").unwrap();
    assert_eq!(c.providers.len(), 2);
    assert_eq!(c.providers[0].kind, Kind::Openai);
    assert_eq!(c.providers[0].tier, Tier::Free);
    assert_eq!(c.providers[0].models[0].max_tokens, 4096);
    let sonnet = &c.providers[1].models[0];
    // 1M fresh input, 1M cached input, 1M output.
    assert!((sonnet.cost_usd(2_000_000, 1_000_000, 1_000_000) - (3.0 + 0.3 + 15.0)).abs() < 1e-9);
}

#[test]
fn constraints_resolve_in_policy_order() {
    let c = Config::parse(TOML, "baton.toml").unwrap();
    assert_eq!(labels(&c, None), vec!["paid:anthropic/claude-sonnet-4-5 (default)"]);
    assert_eq!(
        labels(&c, Some(&constraint(&["free:*"], &[], false))),
        vec!["free:ollama/llama3.1:8b (allow)", "free:ollama/qwen2.5 (allow)"],
        "every model the allow pattern matches is in the chain, in configured order"
    );
    assert_eq!(
        labels(&c, Some(&constraint(&["free:*"], &["paid:anthropic/claude-haiku-4-5"], true))),
        vec![
            "free:ollama/llama3.1:8b (allow)",
            "free:ollama/qwen2.5 (allow)",
            "paid:anthropic/claude-haiku-4-5 (fallback)",
            "paid:anthropic/claude-sonnet-4-5 (default)"
        ]
    );
    assert_eq!(
        labels(&c, Some(&constraint(&["paid:anthropic/*haiku*"], &[], false))),
        vec!["paid:anthropic/claude-haiku-4-5 (allow)"]
    );
    assert_eq!(
        labels(&c, Some(&constraint(&["free:ollama/qwen*"], &[], false))),
        vec!["free:ollama/qwen2.5 (allow)"]
    );
    assert!(
        labels(&c, Some(&constraint(&["paid:openai/*"], &[], false))).is_empty(),
        "nothing configured satisfies it"
    );
}

#[test]
fn bad_configs_say_what_is_wrong() {
    let cases = [
        (TOML.replace("tier = \"free\"", "tier = \"cheap\""), "tier must be `free` or `paid`"),
        (TOML.replace("input_usd_per_mtok = 3.0", "input_usd_per_mtok = 3.0\ncolour = 1"), "unknown field `colour`"),
        (TOML.replace("name = \"ollama\"", "name = \"anthropic\""), "configured twice"),
        (TOML.replace("http://127.0.0.1:11434/v1", "127.0.0.1:11434"), "base_url must start with http"),
        (TOML.replace("paid:anthropic/claude-sonnet-4-5\"", "paid:anthropic/claude-9\""), "routing.default"),
        (TOML.replace("output_usd_per_mtok = 5.0", "output_usd_per_mtok = -5.0"), "prices must be zero or more"),
        ("[[providers]]\nname = \"x\"\nkind = \"openai\"\nbase_url = \"http://h\"\ntier = \"free\"\n".to_owned(), "lists no models"),
        ("this is = not toml [".to_owned(), "baton.toml"),
    ];
    for (text, expected) in cases {
        let err = Config::parse(&text, "baton.toml").unwrap_err();
        assert!(err.to_string().contains(expected), "expected {expected:?} in: {err}");
        assert!(err.to_string().starts_with("baton.toml: "), "{err}");
    }
}

#[test]
fn the_environment_describes_providers_without_a_file() {
    let env = |pairs: &'static [(&'static str, &'static str)]| {
        move |k: &str| pairs.iter().find(|(name, _)| *name == k).map(|(_, v)| (*v).to_owned())
    };
    let none = Config::from_env(env(&[]));
    assert!(none.providers.is_empty() && none.routing.default.is_none());
    let anthropic = Config::from_env(env(&[("ANTHROPIC_API_KEY", "k")]));
    assert_eq!(anthropic.routing.default.as_deref(), Some("paid:anthropic/claude-sonnet-4-5"));
    let ollama = Config::from_env(env(&[
        ("OPENAI_BASE_URL", "http://127.0.0.1:11434/v1"),
        ("BATON_MODELS", "llama3.1, qwen2.5"),
    ]));
    assert_eq!(ollama.providers[0].tier, Tier::Free);
    assert_eq!(ollama.providers[0].models.len(), 2);
    assert_eq!(ollama.routing.default.as_deref(), Some("free:local/llama3.1"));
    let openai = Config::from_env(env(&[("OPENAI_API_KEY", "k")]));
    assert_eq!(openai.providers[0].base_url, "https://api.openai.com/v1");
}

#[test]
fn globs_match_whole_labels() {
    assert!(glob("free:*", "free:ollama/llama3.1:8b"));
    assert!(glob("paid:anthropic/*", "paid:anthropic/claude-sonnet-4-5"));
    assert!(glob("*:*/*sonnet*", "paid:anthropic/claude-sonnet-4-5"));
    assert!(!glob("paid:anthropic/*", "paid:openai/gpt-4o"));
    assert!(!glob("free:*", "paid:anthropic/x"));
    assert!(glob("paid:openai/gpt-4o", "paid:openai/gpt-4o"));
    assert!(!glob("paid:openai/gpt-4o", "paid:openai/gpt-4o-mini"));
}

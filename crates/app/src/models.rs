//! The model a run answers from: a script, a cassette, or the configured providers, and
//! the levels a configuration cannot serve.

use std::path::Path;
use std::sync::Arc;

use anyhow::bail;
use baton_engine::cassette;
use baton_engine::model::{ModelProvider, ScriptedModel};
use baton_providers::cassette_file::Recorder;
use baton_providers::client::Providers;
use baton_providers::config::Config;
use baton_scenario::Scenario;

use crate::place::config_file;

/// The model answering a run: the scripted model with `--script`, else the providers of the
/// configuration (`--config`, ./baton.toml, or the environment). The second value says where
/// it came from, recorded on the run so that a later process resumes with the same.
///
/// With `check`, every level of that scenario that calls a model must be satisfiable by the
/// configured providers before anything runs (a script answers every level).
pub fn load_model(
    script: Option<&Path>,
    config: Option<&Path>,
    check: Option<&Scenario>,
) -> anyhow::Result<(Arc<dyn ModelProvider>, Option<String>)> {
    if let Some(path) = script.filter(|p| p.extension().is_some_and(|e| e == "json"))
        && let Ok(loaded) = baton_providers::cassette_file::load(path)
    {
        // A cassette given where a script is expected: replay it (read once).
        return Ok(replaying(path, loaded));
    }
    if let Some(path) = script {
        let model = load_script(path).map_err(|e| anyhow::anyhow!("--script: {e}"))?;
        let absolute = std::fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf());
        return Ok((Arc::new(model), Some(format!("script:{}", absolute.display()))));
    }
    let file = config_file(config);
    let (config, source) = match &file {
        Some(path) => {
            let absolute = std::fs::canonicalize(path).unwrap_or_else(|_| path.clone());
            (Config::from_file(path)?, format!("config:{}", absolute.display()))
        }
        None => (Config::from_env(|k| std::env::var(k).ok()), "env".to_owned()),
    };
    if config.providers.is_empty() {
        bail!(
            "no model to call: pass --script FILE for the scripted model, or configure providers in baton.toml (--config) or with ANTHROPIC_API_KEY, OPENAI_API_KEY or OPENAI_BASE_URL"
        );
    }
    if let Some(scenario) = check {
        let blocked = unsatisfiable_levels(scenario, &config);
        if !blocked.is_empty() {
            let configured = match &file {
                Some(path) => path.display().to_string(),
                None => "the environment (ANTHROPIC_API_KEY, OPENAI_API_KEY, OPENAI_BASE_URL)"
                    .to_owned(),
            };
            let levels: Vec<String> = blocked
                .iter()
                .map(|(level, wanted)| format!("level `{level}` wants {wanted}"))
                .collect();
            bail!(
                "scenario `{}` cannot run with the models configured in {configured}: {}; no configured model satisfies {}. Configure a provider and model that match (see the README's `baton.toml` section), or run with --script FILE",
                scenario.id,
                levels.join("; "),
                if blocked.len() == 1 { "it" } else { "them" }
            );
        }
    }
    let providers = Providers::new(config).map_err(anyhow::Error::msg)?;
    Ok((Arc::new(providers), Some(source)))
}

/// A model that answers from a cassette only.
fn replay(path: &Path) -> anyhow::Result<(Arc<dyn ModelProvider>, Option<String>)> {
    let cassette = baton_providers::cassette_file::load(path).map_err(anyhow::Error::msg)?;
    Ok(replaying(path, cassette))
}

/// A model that answers from `cassette`, read from `path` (recorded as the run's source).
fn replaying(
    path: &Path,
    cassette: cassette::Cassette,
) -> (Arc<dyn ModelProvider>, Option<String>) {
    let absolute = std::fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf());
    (Arc::new(cassette::Replayer::new(cassette)), Some(format!("cassette:{}", absolute.display())))
}

/// The model a run answers from, as [`choose_model`] chose it.
#[derive(Debug)]
pub struct Chosen {
    pub model: Arc<dyn ModelProvider>,
    /// Where its answers come from, recorded on the run.
    pub source: Option<String>,
    /// The cassette being recorded, when the run records one (its tools record into it
    /// too: `engines::tools_for`).
    pub recorder: Option<Arc<Recorder>>,
}

/// The model a run uses, given the run's options: a cassette to replay, or a model (scripted
/// or configured), optionally recorded into a cassette.
pub fn choose_model(
    script: Option<&Path>,
    config: Option<&Path>,
    replay_from: Option<&Path>,
    record_to: Option<&Path>,
    scenario: &Scenario,
) -> anyhow::Result<Chosen> {
    let (model, source) = match replay_from {
        Some(path) => replay(path)?,
        None => load_model(script, config, Some(scenario))?,
    };
    match record_to {
        Some(path) if replay_from.is_none() => {
            let recorder = Arc::new(Recorder::new(model, path.to_path_buf()));
            let model = Arc::clone(&recorder) as Arc<dyn ModelProvider>;
            Ok(Chosen { model, source, recorder: Some(recorder) })
        }
        _ => Ok(Chosen { model, source, recorder: None }),
    }
}

/// The model a run recorded as its source, for resuming it.
pub fn recorded_model(
    source: Option<&str>,
    script: Option<&Path>,
    config: Option<&Path>,
) -> anyhow::Result<Arc<dyn ModelProvider>> {
    Ok(model_for(source, script, config)?.0)
}

/// [`recorded_model`], and where its answers come from when that is not `source` (a
/// `--script` or `--config` given now): what the runs it starts should record.
pub fn model_for(
    source: Option<&str>,
    script: Option<&Path>,
    config: Option<&Path>,
) -> anyhow::Result<(Arc<dyn ModelProvider>, Option<String>)> {
    // A configuration given now answers in place of the recording only when it names
    // models: one that holds only the instance's settings (egress, secrets, the jail)
    // leaves the run its recorded answers.
    let names_models = |c: &Path| {
        baton_providers::config::Config::from_file(c).map_or(true, |c| !c.providers.is_empty())
    };
    if script.is_some() || config.is_some_and(names_models) {
        return load_model(script, config, None);
    }
    let model = match source {
        Some(s) if s.starts_with("cassette:") => replay(Path::new(&s["cassette:".len()..]))?.0,
        Some(s) if s.starts_with("script:") => {
            load_model(Some(Path::new(&s["script:".len()..])), None, None)?.0
        }
        Some(s) if s.starts_with("config:") => {
            load_model(None, Some(Path::new(&s["config:".len()..])), None)?.0
        }
        _ => load_model(None, None, None)?.0,
    };
    Ok((model, None))
}

/// Whether a level of this kind calls a model itself.
pub fn calls_a_model(kind: &baton_scenario::LevelKind) -> bool {
    matches!(
        kind,
        baton_scenario::LevelKind::Prompt { .. } | baton_scenario::LevelKind::ToolLoop { .. }
    )
}

/// The levels of a scenario that call a model which nothing in `config` satisfies, each
/// with what it wants (`allow [...]`, or the routing default).
pub fn unsatisfiable_levels(
    scenario: &baton_scenario::Scenario,
    config: &baton_providers::config::Config,
) -> Vec<(String, String)> {
    scenario
        .levels
        .iter()
        .filter(|level| calls_a_model(&level.kind))
        .filter(|level| baton_providers::resolve::chain(config, level.model.as_ref()).is_empty())
        .map(|level| {
            let wanted = level.model.as_ref().map_or_else(
                || "the routing default (none configured)".to_owned(),
                |m| format!("allow [{}]", m.allow.join(", ")),
            );
            (level.id.clone(), wanted)
        })
        .collect()
}

/// Every level that calls a model must resolve to a configured one; fallback entries that
/// match nothing are worth a warning.
pub fn check_models(
    registry: &baton_scenario::Registry,
    config_path: &Path,
) -> anyhow::Result<Vec<baton_scenario::diag::Diagnostic>> {
    use baton_scenario::Pos;
    use baton_scenario::diag::Diagnostic;
    let config = &Config::from_file(config_path)?;
    let mut out = Vec::new();
    for s in registry.scenarios() {
        for (level, wanted) in unsatisfiable_levels(s, config) {
            out.push(
                Diagnostic::error(
                    "unsatisfiable-model",
                    Pos::UNKNOWN,
                    format!(
                        "level `{level}` of `{}` wants {wanted}, which no model in {} satisfies",
                        s.id,
                        config_path.display()
                    ),
                )
                .in_file(s.file.clone())
                .with_help(
                    "configure a matching provider and model, or widen the level's `model.allow`",
                ),
            );
        }
        for level in &s.levels {
            if !calls_a_model(&level.kind) {
                continue;
            }
            for entry in level.model.iter().flat_map(|m| m.fallback.iter()) {
                if baton_providers::resolve::find(config, entry).is_none() {
                    out.push(
                        Diagnostic::warning(
                            "dead-fallback",
                            Pos::UNKNOWN,
                            format!("fallback `{entry}` of level `{}` of `{}` matches no configured model", level.id, s.id),
                        )
                        .in_file(s.file.clone()),
                    );
                }
            }
        }
    }
    Ok(out)
}

/// Reads and parses a script file (a regular file of at most `SCRIPT_BYTES_MAX` bytes);
/// errors name the file.
pub fn load_script(path: &std::path::Path) -> Result<ScriptedModel, String> {
    let text = baton_scenario::capped::read_text(path, baton_engine::limits::SCRIPT_BYTES_MAX)
        .map_err(|e| format!("cannot read the script: {e}"))?;
    ScriptedModel::parse(&text, &path.display().to_string())
}

/// Writes a cassette file, atomically.
pub fn save_cassette(
    cassette: &baton_engine::cassette::Cassette,
    path: &std::path::Path,
) -> Result<(), String> {
    baton_providers::cassette_file::save(cassette, path)
}

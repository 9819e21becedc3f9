//! [`Baton`]: an instance opened from a [`Place`] — its store and tokens, its scenarios
//! (reloaded as they change), the model the jobs it starts answer from, and the engines
//! every surface drives runs with. The server, MCP and `baton worker` hold one; the CLI's
//! commands use the same assembly through [`crate::engines`].

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use crate::redact::Redactor;
use baton_engine::Engine;
use baton_engine::job::Jobs;
use baton_engine::model::{ModelProvider, ScriptedModel};
use baton_engine::store::EventStore;
use baton_engine::wave_drive::WaveSettings;
use baton_scenario::{Registry, RegistryHandle, Scenario};
use baton_store::TokenStore;

use crate::engines::JobSettings;
use crate::error::Error;
use crate::place::Place;

/// Where a run's model answers come from, for [`Baton::engine`].
#[derive(Clone, Copy, Debug)]
pub enum Answers<'a> {
    /// The run calls no model here (decisions, cancels, reads).
    Nothing,
    /// What the run recorded as its model source (`None`: the configured providers).
    Recorded(Option<&'a str>),
}

/// An instance: engines over its store with the same models, jail, workspaces and
/// verifiers as `baton run` and `baton resume`.
pub struct Baton {
    place: Place,
    /// The model runs the instance starts use, and where it came from; or why there is none.
    start: Result<(Arc<dyn ModelProvider>, Option<String>), String>,
    /// Models of other sources runs recorded, loaded once each.
    recorded: Mutex<HashMap<Option<String>, Arc<dyn ModelProvider>>>,
    /// How jobs start: their selection, their keys' hold.
    jobs: JobSettings,
    settle_timeout: std::time::Duration,
    waves: WaveSettings,
    redactor: Redactor,
    /// The user's tools, as the instance calls them.
    tools: Arc<dyn baton_engine::tools::ToolHost>,
}

impl std::fmt::Debug for Baton {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Baton").field("place", &self.place).finish_non_exhaustive()
    }
}

/// An opened instance and what it serves from.
pub struct Instance {
    pub baton: Arc<Baton>,
    pub store: Arc<dyn EventStore>,
    pub tokens: Arc<dyn TokenStore>,
    /// The same store, for its webhooks and their outbox.
    pub webhooks: Arc<dyn crate::WebhookStore>,
    /// The same store, for its queues and limits.
    pub queues: Arc<dyn crate::QueueStore>,
    pub registry: RegistryHandle,
    /// The scenarios directory (where a posted file's templates are read from).
    pub scenarios_dir: PathBuf,
    /// The loader's warnings, rendered (empty when none).
    pub warnings: String,
    /// Why runs cannot be started until the configuration is fixed (no model), if so.
    pub start_refusal: Option<String>,
    /// How webhooks are sent and which receivers are allowed (`[webhooks]`, `[egress]`),
    /// read once when the instance opens.
    pub webhook_settings: crate::webhooks::Settings,
}

impl std::fmt::Debug for Instance {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Instance")
            .field("scenarios_dir", &self.scenarios_dir)
            .finish_non_exhaustive()
    }
}

impl Baton {
    /// Opens the instance at `place`: its scenarios (which must load), the settings of
    /// `baton.toml`, the store (created when absent); runs it starts answer from `script`
    /// (a scripted model) when one is given, else from the configured providers.
    pub async fn open(place: &Place, script: Option<&Path>) -> anyhow::Result<Instance> {
        let (registry, warnings) = match RegistryHandle::open(vec![place.scenarios.clone()]) {
            Ok(opened) => opened,
            Err(e) => {
                return Err(Error::invalid(format!(
                    "the scenarios in {} do not load",
                    place.scenarios.display()
                ))
                .with_diagnostics(e.diagnostics.render())
                .into());
            }
        };
        let warnings =
            if warnings.iter().next().is_some() { warnings.render() } else { String::new() };
        let settings = crate::engines::job_settings(place)?;
        let webhook_settings = crate::webhooks::settings(place)?;
        let settle_timeout = baton_engine::job::settle_timeout(settings.settle_timeout_s)
            .map_err(|e| Error::invalid(format!("settle_timeout_s: {e}")))?;
        let start = crate::models::load_model(script, place.config.as_deref(), None)
            .map_err(|e| format!("{e:#}"));
        let start_refusal = start.as_ref().err().cloned();
        let both = crate::place::open_any(place).await?;
        let store: Arc<dyn EventStore> = Arc::clone(&both) as Arc<dyn EventStore>;
        let webhooks: Arc<dyn crate::WebhookStore> =
            Arc::clone(&both) as Arc<dyn crate::WebhookStore>;
        let queues: Arc<dyn crate::QueueStore> = Arc::clone(&both) as Arc<dyn crate::QueueStore>;
        let tokens: Arc<dyn TokenStore> = both;
        let baton = Baton {
            place: place.clone(),
            start,
            recorded: Mutex::default(),
            jobs: settings.clone(),
            settle_timeout,
            waves: WaveSettings {
                max_parallel: settings.max_parallel.unwrap_or(WaveSettings::default().max_parallel),
                ..WaveSettings::default()
            },
            redactor: crate::engines::redactor(place),
            tools: crate::engines::live_tools(place),
        };
        Ok(Instance {
            baton: Arc::new(baton),
            store,
            tokens,
            webhooks,
            queues,
            registry,
            scenarios_dir: place.scenarios.clone(),
            warnings,
            start_refusal,
            webhook_settings,
        })
    }

    /// Where the instance's runs live.
    /// What a worker of this process claims from `queues` (none: every queue): jobs
    /// without a workspace, and jobs whose workspaces live where this process's do.
    pub fn claimable(&self, queues: Vec<String>) -> baton_engine::store::Claimable {
        let setup = crate::engines::workspace_setup(&self.place, None, None);
        baton_engine::store::Claimable { queues, home: setup.opener.home() }
    }

    pub fn place(&self) -> &Place {
        &self.place
    }

    fn model(&self, answers: Answers<'_>) -> Result<Arc<dyn ModelProvider>, String> {
        let source = match answers {
            Answers::Nothing => return Ok(Arc::new(ScriptedModel::default())),
            Answers::Recorded(source) => source,
        };
        if let Ok((model, started)) = &self.start
            && started.as_deref() == source
        {
            return Ok(Arc::clone(model));
        }
        let key = source.map(str::to_owned);
        let mut recorded = self.recorded.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(m) = recorded.get(&key) {
            return Ok(Arc::clone(m));
        }
        let model = crate::models::recorded_model(source, None, self.place.config.as_deref())
            .map_err(|e| format!("{e:#}"))?;
        recorded.insert(key, Arc::clone(&model));
        Ok(model)
    }

    /// An engine over `store` whose runs take their answers as `answers` says, whose chains
    /// go to the scenarios of `registry`.
    pub fn engine(
        &self,
        store: Arc<dyn EventStore>,
        answers: Answers<'_>,
        registry: &Arc<Registry>,
    ) -> Result<Engine, String> {
        let model = self.model(answers)?;
        // A run replaying a cassette takes its tools' answers from it too.
        let tools = match answers {
            Answers::Recorded(Some(source)) if source.starts_with("cassette:") => {
                crate::engines::tools_for(&self.place, Some(source), None)
                    .map_err(|e| format!("{e:#}"))?
            }
            _ => Arc::clone(&self.tools),
        };
        let jobs = Jobs::new(
            Arc::clone(registry),
            self.jobs.selection.clone(),
            self.place.scenarios.clone(),
            self.settle_timeout,
        )
        .with_waves(self.waves);
        Ok(crate::engines::engine(
            store,
            model,
            registry,
            crate::engines::workspace_setup(&self.place, None, None),
            self.redactor.clone(),
            &crate::jail::jail(&self.place),
            Some(Arc::new(jobs)),
            None,
            Some(tools),
        ))
    }

    /// The model source recorded on the runs the instance starts (`None`: the configured
    /// providers).
    pub fn model_source(&self) -> Option<String> {
        self.start.as_ref().ok().and_then(|(_, source)| source.clone())
    }

    /// Why runs of `scenario` cannot be driven here (the jail, for it and the scenarios its
    /// waves start), if they cannot; else the warning to say when the jail is off.
    pub fn check(
        &self,
        registry: &Registry,
        scenario: &Arc<Scenario>,
    ) -> Result<Option<String>, Error> {
        crate::jail::check_jail(&self.place, registry, scenario)
    }

    /// Why new runs of `scenario` cannot start here (no model for the runs the instance
    /// starts, the jail), if they cannot; else the warning to say when the jail is off.
    pub fn check_start(
        &self,
        registry: &Registry,
        scenario: &Arc<Scenario>,
    ) -> Result<Option<String>, Error> {
        self.check_model(scenario)?;
        self.check(registry, scenario)
    }

    /// Why new runs of `scenario` cannot start here for want of a model, if they cannot
    /// (a start planned by [`crate::start::plan`] has passed the jail already).
    pub fn check_model(&self, scenario: &Scenario) -> Result<(), Error> {
        match &self.start {
            Err(why) if !baton_engine::exec::calls_no_model(scenario) => {
                Err(Error::unavailable(why.clone()))
            }
            _ => Ok(()),
        }
    }

    /// How jobs start: how they choose their scenario, how long their keys hold.
    pub fn jobs(&self) -> &JobSettings {
        &self.jobs
    }

    /// Replays the recorded job whose first run is `run_id` (answers from its log, its
    /// decisions made again, verifiers run again or trusted) and says how the new log
    /// compares, as `baton replay RUN --json` prints it.
    pub async fn replay(
        &self,
        run_id: &str,
        trust_validation: bool,
    ) -> anyhow::Result<crate::replay::ReplayReport> {
        crate::replay::replay_report(&self.place, Some(run_id), None, trust_validation, None).await
    }
}

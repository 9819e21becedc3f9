//! The one jail of the process, built from `[jail]`, `BATON_BWRAP` and
//! `BATON_JAIL_READ_ONLY`, and the check a job passes before it starts programs.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use baton_jail::{Jail, Unavailable};
use baton_providers::config::Config;
use baton_scenario::Scenario;

use crate::error::Error;

use crate::place::{Place, config_file, data_dir};
/// The argument the binary is started with inside the jail, to confine the program it was
/// started for and become it: [`init_main`] handles it before anything else runs.
pub use baton_jail::INIT_ARG;
/// What the binary does inside the jail.
pub use baton_jail::init::main as init_main;
/// Makes this process unreadable to other processes of its uid (its keys live in its
/// environment).
pub use baton_jail::make_undumpable;

/// The jail every program a run starts goes through — set up at the first program, once
/// per process — or its absence with `--no-jail`.
pub fn jail(place: &Place) -> Arc<Jail> {
    static JAIL: std::sync::OnceLock<Arc<Jail>> = std::sync::OnceLock::new();
    Arc::clone(JAIL.get_or_init(|| Arc::new(build_jail(place))))
}

fn build_jail(place: &Place) -> Jail {
    if place.no_jail {
        return Jail::off();
    }
    let config = match config_file(place.config.as_deref()).map(|f| Config::from_file(&f)) {
        Some(Ok(config)) => config.jail,
        Some(Err(e)) => return Jail::unavailable(Unavailable(e.to_string())),
        None => baton_providers::config::JailConfig::default(),
    };
    let init = match std::env::current_exe() {
        Ok(path) => path,
        Err(e) => {
            return Jail::unavailable(Unavailable(format!("cannot find Baton's binary: {e}")));
        }
    };
    let data = data_dir(place);
    let snapshots = place.snapshots.clone().unwrap_or_else(|| data.join("snapshots"));
    let mut read_only = config.read_only;
    if let Some(extra) = std::env::var_os("BATON_JAIL_READ_ONLY") {
        read_only.extend(std::env::split_paths(&extra).filter(|p| !p.as_os_str().is_empty()));
    }
    const MIB: u64 = 1024 * 1024;
    let d = baton_jail::Limits::default();
    let limits = baton_jail::Limits {
        processes: config.processes.unwrap_or(d.processes),
        new_files: config.new_files.unwrap_or(d.new_files),
        new_bytes: config.new_mib.map_or(d.new_bytes, |m| m.saturating_mul(MIB)),
        file_bytes: config.file_mib.map_or(d.file_bytes, |m| m.saturating_mul(MIB)),
        data_bytes: config.memory_mib.map_or(d.data_bytes, |m| m.saturating_mul(MIB)),
        ..d
    };
    Jail::lazy(baton_jail::Settings {
        bwrap: std::env::var_os("BATON_BWRAP").map(PathBuf::from).or(config.bwrap),
        init,
        run_as: (config.uid.unwrap_or(65534), config.gid.unwrap_or(65534)),
        read_only,
        path: None,
        hidden: hidden(place, &data, snapshots),
        protected: protected(place),
        data: Some(data.clone()),
        scratch: data.join("jail"),
        limits,
    })
}

/// Baton's own state, which no jailed program may see: its directory (where it lies in a
/// workspace), the database and its journals, the runs' workspaces (the running one's own is shown), the snapshots, the jail's own
/// directory.
fn hidden(place: &Place, data: &Path, snapshots: PathBuf) -> Vec<PathBuf> {
    let db = std::path::absolute(&place.db).unwrap_or_else(|_| place.db.clone());
    let mut hidden: Vec<PathBuf> = ["", "-wal", "-shm", "-journal"]
        .iter()
        .map(|suffix| {
            let mut name = db.clone().into_os_string();
            name.push(suffix);
            PathBuf::from(name)
        })
        .collect();
    hidden.push(data.to_path_buf());
    hidden.push(data.join("workspaces"));
    hidden.push(std::path::absolute(&snapshots).unwrap_or(snapshots));
    hidden.push(data.join("jail"));
    hidden
}

/// What a jailed program may read but not change when its workspace holds it: the
/// configuration (`--config` or ./baton.toml) and the scenarios directory.
fn protected(place: &Place) -> Vec<PathBuf> {
    let config = place.config.clone().unwrap_or_else(|| PathBuf::from("baton.toml"));
    [config, place.scenarios.clone()]
        .into_iter()
        .map(|p| std::path::absolute(&p).unwrap_or(p))
        .collect()
}

/// Before a job starts: refused when the job can reach a scenario that starts programs
/// (its own, or its waves' workers', transitively) and the jail cannot be set up. When the
/// jail is off (`--no-jail`) and the job starts programs, the warning to say on every such
/// run comes back.
pub fn check_jail(
    place: &Place,
    registry: &baton_scenario::Registry,
    scenario: &Arc<Scenario>,
) -> Result<Option<String>, Error> {
    let jail = jail(place);
    let refused = baton_engine::job::programs_refused(registry, scenario, |_| {
        jail.refusal().map(ToString::to_string)
    });
    if let Some(why) = refused {
        return Err(Error::unavailable(why));
    }
    if jail.is_off()
        && let Some(starting) = baton_engine::job::starting_programs(registry, scenario)
    {
        return Ok(Some(format!(
            "--no-jail: scenario `{}` runs verifiers, scanners or MCP servers unconfined, as Baton's own user; whatever the model wrote can read and change what this user can (its verifier outcomes record `jail: off`)",
            starting.id
        )));
    }
    Ok(None)
}

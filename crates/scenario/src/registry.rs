//! Loading scenarios: directories and files into a [`Registry`], tenant overrides, and
//! atomic refresh.
//!
//! A scenarios directory holds `*.yaml` scenario files beside `prompts/` (templates),
//! `rubrics/` (judge rubrics) and any schema or rules files they name. A load either
//! yields a whole registry (with warnings) or a [`LoadError`] listing every error found;
//! never half a registry. [`RegistryHandle::refresh`] swaps the registry only when the
//! new load succeeds, so a bad edit never takes working scenarios away.

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};

use crate::capped;
use crate::check;
use crate::diag::{Diagnostic, Diagnostics};
use crate::files::Files;
use crate::limits;
use crate::model::Scenario;
use crate::node::Node;
use crate::source::{Pos, Sources, pos_in_text};

/// The loaded scenarios, indexed by id and by intent route.
#[derive(Debug, Default)]
pub struct Registry {
    scenarios: BTreeMap<String, Arc<Scenario>>,
    /// Lower-cased intent route → scenario id.
    routes: BTreeMap<String, String>,
    bases: BTreeMap<String, Base>,
    sources: Sources,
}

/// What an override needs of its base: the parsed tree and where its files live.
#[derive(Clone, Debug)]
struct Base {
    node: Node,
    root: PathBuf,
    file: String,
}

/// A successful load: the registry, and warnings worth showing.
#[derive(Debug)]
pub struct Loaded {
    pub registry: Registry,
    pub warnings: Diagnostics,
}

/// A failed load: every diagnostic found (errors, and warnings met on the way).
#[derive(Debug)]
pub struct LoadError {
    pub diagnostics: Diagnostics,
}

impl fmt::Display for LoadError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let n = self.diagnostics.error_count();
        write!(f, "{n} error{} in the scenarios", if n == 1 { "" } else { "s" })?;
        if let Some(first) = self.diagnostics.iter().find(|d| d.is_error()) {
            write!(
                f,
                "; first: {}:{}:{}: {}",
                first.file, first.line, first.column, first.message
            )?;
        }
        Ok(())
    }
}

impl std::error::Error for LoadError {}

/// A tenant's partial scenario, deep-merged over a base scenario.
#[derive(Clone, Debug)]
pub struct Override {
    /// The base scenario's id.
    pub scenario_id: String,
    /// Where the override came from (a file path, a database key), for messages.
    pub name: String,
    /// The partial YAML.
    pub yaml: String,
}

impl Registry {
    /// Loads every scenario of the given files and directories into one registry.
    ///
    /// A directory contributes its `*.yaml` and `*.yml` files (not its subdirectories) and
    /// is the root their `prompts/`, `rubrics/` and schema paths are relative to; a file's
    /// root is its own directory.
    pub fn load<P: AsRef<Path>>(paths: &[P]) -> Result<Loaded, LoadError> {
        let mut sources = Sources::new();
        let mut diags = Diagnostics::new();
        let mut found = Vec::new();
        for path in paths {
            collect(path.as_ref(), &mut found, &mut diags);
        }
        if found.len() > limits::SCENARIOS_MAX {
            diags.push(
                Diagnostic::error(
                    "too-many",
                    Pos::UNKNOWN,
                    format!(
                        "{} scenario files found; at most {} load at once",
                        found.len(),
                        limits::SCENARIOS_MAX
                    ),
                )
                .in_file(paths.first().map_or(String::new(), |p| p.as_ref().display().to_string())),
            );
            return Err(LoadError { diagnostics: diags });
        }
        let mut roots: HashMap<PathBuf, Files> = HashMap::new();
        let mut registry = Registry::default();
        let mut defined_at: HashMap<String, Pos> = HashMap::new();
        for (file, root) in found {
            let name = file.display().to_string();
            let Some(node) = read_scenario(&file, &name, &mut sources, &mut diags) else {
                continue;
            };
            let files = roots.entry(root.clone()).or_insert_with(|| Files::new(root.clone()));
            let Some(scenario) = check::check(&node, &name, files, &mut sources, &mut diags) else {
                continue;
            };
            let id_pos = node.get("id").map_or(node.pos, |n| n.pos);
            if let Some(first) = defined_at.get(&scenario.id) {
                let other = sources.name(first.source).to_owned();
                diags.push(
                    Diagnostic::error(
                        "duplicate-scenario",
                        id_pos,
                        format!(
                            "scenario `{}` is also defined in {other}:{}",
                            scenario.id, first.line
                        ),
                    )
                    .with_help("scenario ids must be unique across the directory"),
                );
                continue;
            }
            defined_at.insert(scenario.id.clone(), id_pos);
            registry.bases.insert(scenario.id.clone(), Base { node, root, file: name });
            registry.scenarios.insert(scenario.id.clone(), Arc::new(scenario));
        }
        registry.index_routes(&sources, &mut diags);
        registry.sources = sources;
        diags.locate(&registry.sources);
        if diags.has_errors() {
            return Err(LoadError { diagnostics: diags });
        }
        Ok(Loaded { registry, warnings: diags })
    }

    /// Loads one scenario version from its stored texts instead of its directory: the
    /// canonical scenario is parsed and checked exactly like a file, and every template,
    /// rubric, schema and rules file is read from `texts` (see [`Files::in_memory`]).
    /// `root` is the scenarios directory (where a seed directory is found); `name` names the
    /// version in messages. The caller compares the loaded checksum with the one it expects.
    pub fn load_texts(
        name: &str,
        root: &Path,
        texts: &crate::model::Texts,
    ) -> Result<Arc<Scenario>, LoadError> {
        let mut sources = Sources::new();
        let mut diags = Diagnostics::new();
        let source = sources.add(name, texts.canonical.clone());
        let node = match Node::parse(&texts.canonical, source) {
            Ok(node) => Some(node),
            Err(d) => {
                diags.push(d);
                None
            }
        };
        let mut files = Files::in_memory(root, texts.files.clone());
        let scenario =
            node.and_then(|node| check::check(&node, name, &mut files, &mut sources, &mut diags));
        diags.locate(&sources);
        match scenario {
            Some(scenario) if !diags.has_errors() => Ok(Arc::new(scenario)),
            _ => Err(LoadError { diagnostics: diags }),
        }
    }

    /// Checks one scenario file's text as if it were a file of the scenarios directory
    /// `root` (its templates, rubrics and schemas read from there, confined to it) — a file
    /// posted to the server, say. Returns the scenario and its warnings, or every problem;
    /// `name` names the text in messages.
    pub fn check_text(
        name: &str,
        root: &Path,
        text: &str,
    ) -> Result<(Arc<Scenario>, Diagnostics), LoadError> {
        let mut sources = Sources::new();
        let mut diags = Diagnostics::new();
        let source = sources.add(name, text.to_owned());
        let node = match Node::parse(text, source) {
            Ok(node) => Some(node),
            Err(d) => {
                diags.push(d);
                None
            }
        };
        let mut files = Files::new(root.to_path_buf());
        let scenario =
            node.and_then(|node| check::check(&node, name, &mut files, &mut sources, &mut diags));
        diags.locate(&sources);
        match scenario {
            Some(scenario) if !diags.has_errors() => Ok((Arc::new(scenario), diags)),
            _ => Err(LoadError { diagnostics: diags }),
        }
    }

    /// Builds the route index; two scenarios claiming one route is an error.
    fn index_routes(&mut self, sources: &Sources, diags: &mut Diagnostics) {
        self.routes.clear();
        let mut claimed_at: HashMap<String, Pos> = HashMap::new();
        for scenario in self.scenarios.values() {
            let node = self.bases.get(&scenario.id).map(|b| &b.node);
            for route in &scenario.intent_routes {
                let key = route.to_lowercase();
                let pos = node
                    .and_then(|n| n.get("intent_routes"))
                    .and_then(|n| match &n.value {
                        crate::node::Value::Seq(items) => items.iter().find(|i| {
                            i.as_str().is_some_and(|s| s.trim().eq_ignore_ascii_case(route))
                        }),
                        _ => None,
                    })
                    .map_or(Pos::UNKNOWN, |n| n.pos);
                match self.routes.get(&key) {
                    Some(owner) if owner != &scenario.id => {
                        let first = claimed_at.get(&key).copied().unwrap_or(Pos::UNKNOWN);
                        diags.push(
                            Diagnostic::error(
                                "duplicate-route",
                                pos,
                                format!(
                                    "intent route `{route}` is claimed by both `{owner}` ({}:{}) and `{}`",
                                    sources.name(first.source),
                                    first.line,
                                    scenario.id
                                ),
                            )
                            .with_help("a route must lead to one scenario; remove it from one of them"),
                        );
                    }
                    _ => {
                        claimed_at.insert(key.clone(), pos);
                        self.routes.insert(key, scenario.id.clone());
                    }
                }
            }
        }
    }

    /// The scenario with this id.
    pub fn get(&self, id: &str) -> Option<&Arc<Scenario>> {
        self.scenarios.get(id)
    }

    /// The scenario serving this intent route (case-insensitive).
    pub fn by_route(&self, route: &str) -> Option<&Arc<Scenario>> {
        self.routes.get(&route.trim().to_lowercase()).and_then(|id| self.scenarios.get(id))
    }

    /// Every scenario, by id.
    pub fn scenarios(&self) -> impl Iterator<Item = &Arc<Scenario>> {
        self.scenarios.values()
    }

    /// How many scenarios there are.
    pub fn len(&self) -> usize {
        self.scenarios.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.scenarios.is_empty()
    }

    /// Every intent route (lower-cased) and the scenario id it leads to.
    pub fn routes(&self) -> impl Iterator<Item = (&str, &str)> {
        self.routes.iter().map(|(r, id)| (r.as_str(), id.as_str()))
    }

    /// The texts this registry was loaded from.
    pub fn sources(&self) -> &Sources {
        &self.sources
    }

    /// A new registry with one tenant's overrides deep-merged over their base scenarios
    /// (mappings merge key by key; lists and scalars replace) and checked exactly like a
    /// base file. Errors name the tenant and the override.
    pub fn with_overrides(
        &self,
        tenant: &str,
        overrides: &[Override],
    ) -> Result<Loaded, LoadError> {
        let mut sources = self.sources.clone();
        let mut diags = Diagnostics::new();
        let mut scenarios = self.scenarios.clone();
        let mut bases = self.bases.clone();
        let mut roots: HashMap<PathBuf, Files> = HashMap::new();
        for o in overrides {
            let context =
                format!("tenant `{tenant}`, override `{}` of `{}`", o.name, o.scenario_id);
            let source = sources.add(o.name.clone(), o.yaml.clone());
            let mut local = Diagnostics::new();
            let Some(base) = self.bases.get(&o.scenario_id) else {
                let known: Vec<&str> = self.scenarios.keys().map(String::as_str).collect();
                local.push(
                    Diagnostic::error(
                        "unknown-scenario",
                        Pos { source, ..Pos::UNKNOWN },
                        format!("there is no scenario `{}` to override", o.scenario_id),
                    )
                    .with_help(format!("loaded scenarios: {}", known.join(", "))),
                );
                prefix(&mut local, &context);
                diags.extend(local);
                continue;
            };
            let over = match Node::parse(&o.yaml, source) {
                Ok(n) => n,
                Err(d) => {
                    local.push(d);
                    prefix(&mut local, &context);
                    diags.extend(local);
                    continue;
                }
            };
            if over.as_map().is_none() {
                local.push(Diagnostic::error(
                    "wrong-type",
                    over.pos,
                    format!("an override must be a mapping, found {}", over.value.type_name()),
                ));
                prefix(&mut local, &context);
                diags.extend(local);
                continue;
            }
            if let Some(id) = over.get("id")
                && id.as_str() != Some(o.scenario_id.as_str())
            {
                local.push(Diagnostic::error(
                    "override-id",
                    id.pos,
                    "an override cannot change the scenario's id",
                ));
                prefix(&mut local, &context);
                diags.extend(local);
                continue;
            }
            let mut merged = base.node.clone();
            merged.merge(over);
            let files =
                roots.entry(base.root.clone()).or_insert_with(|| Files::new(base.root.clone()));
            let name = format!("{} + {}", base.file, o.name);
            if let Some(scenario) = check::check(&merged, &name, files, &mut sources, &mut local) {
                // A tenant may take tools away, never add one or what one reaches.
                let widened = self
                    .scenarios
                    .get(&o.scenario_id)
                    .map(|b| check::tools_widened(b, &scenario))
                    .unwrap_or_default();
                if !widened.is_empty() {
                    local.push(
                        Diagnostic::error(
                            "override-widens-tools",
                            Pos { source, ..Pos::UNKNOWN },
                            format!("an override may remove tools, not add to them: {}", widened.join("; ")),
                        )
                        .with_help("give the tenant a scenario of its own instead, or change the base scenario".to_owned()),
                    );
                    prefix(&mut local, &context);
                    diags.extend(local);
                    continue;
                }
                bases.insert(
                    scenario.id.clone(),
                    Base { node: merged, root: base.root.clone(), file: name },
                );
                scenarios.insert(scenario.id.clone(), Arc::new(scenario));
            }
            prefix(&mut local, &context);
            diags.extend(local);
        }
        let mut registry =
            Registry { scenarios, routes: BTreeMap::new(), bases, sources: Sources::new() };
        registry.index_routes(&sources, &mut diags);
        registry.sources = sources;
        diags.locate(&registry.sources);
        if diags.has_errors() {
            return Err(LoadError { diagnostics: diags });
        }
        Ok(Loaded { registry, warnings: diags })
    }
}

/// Reads a tenant overrides directory, laid out as `DIR/TENANT/SCENARIO_ID.yaml`, into
/// overrides grouped by tenant (tenants and files in name order).
///
/// A scenario file directly in `DIR` has no tenant: it is an error, not something to skip
/// in silence, as is a tenant directory or override that cannot be read.
pub fn read_overrides(dir: &Path) -> Result<Vec<(String, Vec<Override>)>, LoadError> {
    let shown = dir.display().to_string();
    let fail = |code: &'static str, message: String, file: String, help: &str| LoadError {
        diagnostics: {
            let mut d = Diagnostics::new();
            d.push(Diagnostic::error(code, Pos::UNKNOWN, message).in_file(file).with_help(help));
            d
        },
    };
    let entries = std::fs::read_dir(dir).map_err(|e| {
        fail(
            "missing-file",
            format!("cannot list the overrides directory `{shown}`: {e}"),
            shown.clone(),
            "give a directory laid out as TENANT/SCENARIO_ID.yaml",
        )
    })?;
    let mut diags = Diagnostics::new();
    let mut paths: Vec<PathBuf> = entries.filter_map(Result::ok).map(|e| e.path()).collect();
    paths.sort();
    let mut tenants = Vec::new();
    for path in paths {
        if !path.is_dir() {
            if is_yaml(&path) {
                let file =
                    path.file_name().map_or(String::new(), |n| n.to_string_lossy().into_owned());
                diags.push(
                    Diagnostic::error(
                        "override-not-in-tenant",
                        Pos::UNKNOWN,
                        format!("`{file}` is directly in the overrides directory, so it belongs to no tenant"),
                    )
                    .in_file(path.display().to_string())
                    .with_help(format!(
                        "overrides are laid out as TENANT/SCENARIO_ID.yaml: move it to {}",
                        dir.join("TENANT").join(&file).display()
                    )),
                );
            }
            continue;
        }
        let tenant = path.file_name().map_or(String::new(), |n| n.to_string_lossy().into_owned());
        let listing = match std::fs::read_dir(&path) {
            Ok(listing) => listing,
            Err(e) => {
                diags.push(
                    Diagnostic::error(
                        "unreadable-file",
                        Pos::UNKNOWN,
                        format!("cannot list tenant directory `{tenant}`: {e}"),
                    )
                    .in_file(path.display().to_string()),
                );
                continue;
            }
        };
        let mut files: Vec<PathBuf> =
            listing.filter_map(Result::ok).map(|e| e.path()).filter(|p| is_yaml(p)).collect();
        files.sort();
        let mut list = Vec::new();
        for file in files {
            let name = file.display().to_string();
            match capped::read_text(&file, limits::SOURCE_BYTES_MAX as u64) {
                Ok(yaml) => {
                    let scenario_id = file
                        .file_stem()
                        .map(|s| s.to_string_lossy().into_owned())
                        .unwrap_or_default();
                    list.push(Override { scenario_id, name, yaml });
                }
                Err(e) => diags.push(unreadable(&e).in_file(name)),
            }
        }
        tenants.push((tenant, list));
    }
    if diags.has_errors() {
        return Err(LoadError { diagnostics: diags });
    }
    Ok(tenants)
}

fn is_yaml(path: &Path) -> bool {
    matches!(path.extension().and_then(|e| e.to_str()), Some("yaml" | "yml"))
}

fn prefix(diags: &mut Diagnostics, context: &str) {
    diags.map_messages(|m| format!("{context}: {m}"));
}

/// Lists the scenario files under `path` with their roots.
fn collect(path: &Path, found: &mut Vec<(PathBuf, PathBuf)>, diags: &mut Diagnostics) {
    let shown = path.display().to_string();
    let metadata = match std::fs::metadata(path) {
        Ok(m) => m,
        Err(e) => {
            diags.push(
                Diagnostic::error(
                    "missing-file",
                    Pos::UNKNOWN,
                    format!("cannot read `{shown}`: {e}"),
                )
                .in_file(shown)
                .with_help("give a scenario file or a scenarios directory"),
            );
            return;
        }
    };
    if metadata.is_dir() {
        let entries = match std::fs::read_dir(path) {
            Ok(entries) => entries,
            Err(e) => {
                diags.push(
                    Diagnostic::error(
                        "missing-file",
                        Pos::UNKNOWN,
                        format!("cannot list `{shown}`: {e}"),
                    )
                    .in_file(shown),
                );
                return;
            }
        };
        let mut files: Vec<PathBuf> = Vec::new();
        let mut paths: Vec<PathBuf> = entries.filter_map(Result::ok).map(|e| e.path()).collect();
        paths.sort();
        for p in paths {
            if !is_yaml(&p) {
                continue;
            }
            if p.is_file() {
                files.push(p);
            } else if let Some(why) = broken_symlink(&p) {
                let name =
                    p.file_name().map_or(String::new(), |n| n.to_string_lossy().into_owned());
                diags.push(
                    Diagnostic::error("broken-symlink", Pos::UNKNOWN, format!("`{name}` {why}"))
                        .in_file(p.display().to_string())
                        .with_help("point the link at a scenario file, or remove it"),
                );
            } else if !p.is_dir() {
                // A pipe, socket or device named like a scenario: never opened (a pipe
                // would block), but not silently skipped either.
                if let Err(e) = capped::check_regular(&p) {
                    diags.push(
                        unreadable(&e)
                            .in_file(p.display().to_string())
                            .with_help("scenario files are regular files; remove it or rename it"),
                    );
                }
            }
        }
        if files.is_empty() {
            diags.push(
                Diagnostic::warning(
                    "no-scenarios",
                    Pos::UNKNOWN,
                    format!("`{shown}` holds no .yaml files"),
                )
                .in_file(shown),
            );
        }
        found.extend(files.into_iter().map(|f| (f, path.to_path_buf())));
    } else {
        let root = path
            .parent()
            .filter(|p| !p.as_os_str().is_empty())
            .map_or_else(|| PathBuf::from("."), Path::to_path_buf);
        found.push((path.to_path_buf(), root));
    }
}

/// Why `path` is a symlink that leads to no file: it dangles, or its chain of links loops
/// (or is longer than [`limits::SYMLINK_HOPS_MAX`]). `None` when it is no symlink or leads
/// somewhere (a directory, say, which is not a scenario file and is left alone).
fn broken_symlink(path: &Path) -> Option<String> {
    let mut current = path.to_path_buf();
    let mut seen = vec![current.clone()];
    for _ in 0..limits::SYMLINK_HOPS_MAX {
        if !std::fs::symlink_metadata(&current).ok()?.file_type().is_symlink() {
            return None;
        }
        let target = std::fs::read_link(&current).ok()?;
        let next = match current.parent() {
            Some(dir) if target.is_relative() => dir.join(&target),
            _ => target.clone(),
        };
        if seen.contains(&next) {
            return Some("is a symlink loop: following it leads back to itself".to_owned());
        }
        if std::fs::symlink_metadata(&next).is_err() {
            return Some(format!("is a symlink to `{}`, which does not exist", next.display()));
        }
        seen.push(next.clone());
        current = next;
    }
    Some(format!(
        "is a chain of more than {} symlinks (a loop, most likely)",
        limits::SYMLINK_HOPS_MAX
    ))
}

/// Reads and parses one scenario file, reporting size, encoding and YAML problems.
fn read_scenario(
    file: &Path,
    name: &str,
    sources: &mut Sources,
    diags: &mut Diagnostics,
) -> Option<Node> {
    let text = match capped::read_text(file, limits::SOURCE_BYTES_MAX as u64) {
        Ok(text) => text,
        Err(capped::Error::NotUtf8 { offset, bytes, .. }) => {
            let lossy = String::from_utf8_lossy(&bytes).into_owned();
            let prefix_text = String::from_utf8_lossy(&bytes[..offset]).into_owned();
            let source = sources.add(name, lossy);
            let mut pos = pos_in_text(&prefix_text, offset, 1, source);
            pos.len = 1;
            diags.push(
                Diagnostic::error(
                    "not-utf8",
                    pos,
                    format!(
                        "the file is not UTF-8: invalid byte 0x{:02x} at offset {offset}",
                        bytes[offset]
                    ),
                )
                .with_help("save the file as UTF-8"),
            );
            return None;
        }
        Err(e) => {
            diags.push(unreadable(&e).in_file(name));
            return None;
        }
    };
    let source = sources.add(name, text);
    let text = sources.get(source).map(|s| s.text.clone()).unwrap_or_default();
    match Node::parse(&text, source) {
        Ok(node) => Some(node),
        Err(d) => {
            diags.push(d);
            None
        }
    }
}

/// A scenario or override file that could not be read, as a diagnostic (its code says
/// why: missing, not a regular file, too large, unreadable).
fn unreadable(e: &capped::Error) -> Diagnostic {
    let code = match e {
        capped::Error::Missing { .. } | capped::Error::NotRegular { .. } => "missing-file",
        capped::Error::TooLarge { .. } => "file-too-large",
        capped::Error::NotUtf8 { .. } => "not-utf8",
        capped::Error::Io { .. } => "unreadable-file",
    };
    Diagnostic::error(code, Pos::UNKNOWN, e.to_string())
}

/// Most entries [`fingerprint`] looks at under the paths: a tree larger than this is
/// fingerprinted by its first entries only.
const FINGERPRINT_ENTRIES_MAX: usize = 100_000;

/// What the files under `paths` look like: every entry's path, size and modification
/// time, depth first, hashed (symbolic links followed, as the loader follows them).
fn fingerprint(paths: &[PathBuf]) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    let mut pending: Vec<(PathBuf, usize)> = paths.iter().map(|p| (p.clone(), 0)).collect();
    let mut seen = 0usize;
    while let Some((path, depth)) = pending.pop() {
        seen += 1;
        if seen > FINGERPRINT_ENTRIES_MAX {
            break;
        }
        path.hash(&mut h);
        let Ok(meta) = std::fs::metadata(&path) else {
            0u8.hash(&mut h);
            continue;
        };
        meta.len().hash(&mut h);
        meta.modified().ok().hash(&mut h);
        if meta.is_dir() && depth < limits::DEPTH_MAX_FINGERPRINT {
            let mut children: Vec<PathBuf> = std::fs::read_dir(&path)
                .map(|d| d.flatten().map(|e| e.path()).collect())
                .unwrap_or_default();
            children.sort();
            pending.extend(children.into_iter().rev().map(|c| (c, depth + 1)));
        }
    }
    h.finish()
}

/// A registry that can be reloaded while others read it.
#[derive(Debug)]
pub struct RegistryHandle {
    paths: Vec<PathBuf>,
    current: RwLock<Arc<Registry>>,
    /// What the files looked like at the last load tried ([`fingerprint`]).
    seen: std::sync::Mutex<u64>,
}

impl RegistryHandle {
    /// Loads `paths` for the first time.
    pub fn open(paths: Vec<PathBuf>) -> Result<(Self, Diagnostics), LoadError> {
        let seen = fingerprint(&paths);
        let loaded = Registry::load(&paths)?;
        Ok((
            RegistryHandle {
                paths,
                current: RwLock::new(Arc::new(loaded.registry)),
                seen: std::sync::Mutex::new(seen),
            },
            loaded.warnings,
        ))
    }

    /// The registry as of now; it stays valid however often the handle refreshes.
    pub fn current(&self) -> Arc<Registry> {
        match self.current.read() {
            Ok(guard) => Arc::clone(&guard),
            Err(poisoned) => Arc::clone(&poisoned.into_inner()),
        }
    }

    /// Reloads when a file under the paths changed (added, removed, resized or touched)
    /// since the last load tried: `None` when nothing changed, else what [`Self::refresh`]
    /// says — a long-lived process polls this, logs every diagnostic, and keeps serving the
    /// old registry on an error. A broken state is tried once, not on every poll.
    pub fn refresh_if_changed(&self) -> Option<Result<Diagnostics, LoadError>> {
        let now = fingerprint(&self.paths);
        {
            let mut seen = match self.seen.lock() {
                Ok(g) => g,
                Err(poisoned) => poisoned.into_inner(),
            };
            if *seen == now {
                return None;
            }
            *seen = now;
        }
        Some(self.refresh())
    }

    /// Reloads every path. On success the new registry replaces the old one in a single
    /// swap; on any error the old one stays and the error is returned.
    pub fn refresh(&self) -> Result<Diagnostics, LoadError> {
        let loaded = Registry::load(&self.paths)?;
        let fresh = Arc::new(loaded.registry);
        match self.current.write() {
            Ok(mut guard) => *guard = fresh,
            Err(poisoned) => *poisoned.into_inner() = fresh,
        }
        Ok(loaded.warnings)
    }
}

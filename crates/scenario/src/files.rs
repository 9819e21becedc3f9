//! Files a scenario refers to: prompt templates, rubrics, JSON Schemas, rules files.
//!
//! Every path is relative to the scenarios directory and must stay inside it: absolute
//! paths, `..` and symlinks that lead out are refused. Each file is read and parsed once
//! per load, however many levels refer to it; its problems are reported once, in the file
//! itself, while a missing file is reported at every reference.

use std::collections::{BTreeMap, HashMap};
use std::path::{Component, Path, PathBuf};
use std::sync::Arc;

use crate::capped;
use crate::diag::{Diagnostic, Diagnostics};
use crate::limits;
use crate::rubric::{self, Rubric};
use crate::source::{Pos, SourceId, Sources, pos_in_text};
use crate::template::UseKind;

/// Names a template may read; the engine provides exactly these when it renders.
pub const TEMPLATE_VARIABLES: &[&str] = &[
    "input",
    "level",
    "scratchpad",
    "feedback",
    "metadata",
    "attempt",
    "scenario",
    "catalog",
    "answers",
    "run",
    "previous",
];

/// Names a template binds for itself wherever it may read them (inside a loop, a block).
const TEMPLATE_LOCALS: &[&str] = &["loop", "self"];

/// What reading a referenced file can go wrong with, besides its contents.
#[derive(Clone, Debug)]
enum Problem {
    /// Reported at the reference: the path is bad or the file is absent.
    AtReference(String, &'static str, String),
    /// Already reported inside the file.
    InFile,
}

/// The files of one load, read once each.
#[derive(Debug)]
pub struct Files {
    root: PathBuf,
    templates: HashMap<String, Result<Arc<str>, Problem>>,
    rubrics: HashMap<String, Result<Arc<Rubric>, Problem>>,
    schemas: HashMap<String, Result<serde_json::Value, Problem>>,
    plain: HashMap<String, Result<Arc<str>, Problem>>,
    /// Seed directories: their path and a manifest (relative path and sha256 of each file).
    seeds: HashMap<String, Result<(PathBuf, Arc<str>), Problem>>,
    /// Files referenced since the last [`Files::take_touched`], for one scenario's checksum.
    touched: Vec<(&'static str, String)>,
    /// The texts to read instead of the directory (a run's stored version), by relative
    /// path; seed manifests under `seed:PATH`. `None` reads the directory.
    memory: Option<BTreeMap<String, String>>,
    /// Every text read, as read, by relative path: what a run needs to load it again.
    raw: HashMap<String, Arc<str>>,
}

impl Files {
    /// Files under `root`, the scenarios directory.
    pub fn new(root: impl Into<PathBuf>) -> Self {
        Files {
            root: root.into(),
            templates: HashMap::new(),
            rubrics: HashMap::new(),
            schemas: HashMap::new(),
            plain: HashMap::new(),
            seeds: HashMap::new(),
            touched: Vec::new(),
            memory: None,
            raw: HashMap::new(),
        }
    }

    /// Files read from `texts` (relative path → contents, seed manifests under
    /// `seed:PATH`) instead of the directory, checked exactly as files on disk are; `root`
    /// is where seed directories are found when a workspace is made.
    pub fn in_memory(root: impl Into<PathBuf>, texts: BTreeMap<String, String>) -> Self {
        Files { memory: Some(texts), ..Files::new(root) }
    }

    /// The scenarios directory.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Reads and parses a template file; on failure, reports why.
    pub fn template(
        &mut self,
        rel: &str,
        at: Pos,
        sources: &mut Sources,
        diags: &mut Diagnostics,
    ) -> Option<Arc<str>> {
        self.touched.push(("template", rel.to_owned()));
        if !self.templates.contains_key(rel) {
            let result =
                self.read(rel, limits::TEMPLATE_BYTES_MAX, sources).and_then(|(text, source)| {
                    let errors = check_template(rel, &text, source, sources, None);
                    if errors.is_empty() {
                        Ok(Arc::from(text))
                    } else {
                        let used = used_at(sources, at);
                        for e in errors {
                            diags.push(e.with_context(&used));
                        }
                        Err(Problem::InFile)
                    }
                });
            self.templates.insert(rel.to_owned(), result);
        }
        report(self.templates.get(rel), at, diags).cloned()
    }

    /// Reads and parses `rubrics/<name>.md`; on failure, reports why.
    pub fn rubric(
        &mut self,
        name: &str,
        at: Pos,
        sources: &mut Sources,
        diags: &mut Diagnostics,
    ) -> Option<Arc<Rubric>> {
        self.touched.push(("rubric", name.to_owned()));
        if !self.rubrics.contains_key(name) {
            let rel = format!("rubrics/{name}.md");
            let result = if is_plain_name(name) {
                self.read(&rel, limits::SOURCE_BYTES_MAX, sources).and_then(|(text, source)| {
                    match rubric::parse(&text, source, name) {
                        Ok(r) => Ok(Arc::new(r)),
                        Err(errors) => {
                            let used = used_at(sources, at);
                            for e in errors {
                                diags.push(e.with_context(&used));
                            }
                            Err(Problem::InFile)
                        }
                    }
                })
            } else {
                Err(Problem::AtReference(
                    format!("`{name}` is not a rubric name"),
                    "bad-path",
                    "name a file of rubrics/ without its `.md`, for example `fact_check_v1`"
                        .to_owned(),
                ))
            };
            self.rubrics.insert(name.to_owned(), result);
        }
        report(self.rubrics.get(name), at, diags).cloned()
    }

    /// Reads a JSON Schema file; on failure, reports why.
    pub fn schema(
        &mut self,
        rel: &str,
        at: Pos,
        sources: &mut Sources,
        diags: &mut Diagnostics,
    ) -> Option<serde_json::Value> {
        self.touched.push(("schema", rel.to_owned()));
        if !self.schemas.contains_key(rel) {
            let result =
                self.read(rel, limits::SOURCE_BYTES_MAX, sources).and_then(|(text, source)| {
                    match serde_json::from_str::<serde_json::Value>(&text) {
                        Ok(value @ serde_json::Value::Object(_)) => Ok(value),
                        Ok(_) => {
                            diags.push(Diagnostic::error(
                                "bad-schema",
                                Pos { source, ..Pos::UNKNOWN },
                                "a JSON Schema file must hold a JSON object",
                            ));
                            Err(Problem::InFile)
                        }
                        Err(e) => {
                            let pos = line_col_pos(&text, e.line(), e.column(), source);
                            diags.push(Diagnostic::error(
                                "bad-schema",
                                pos,
                                format!("invalid JSON: {e}"),
                            ));
                            Err(Problem::InFile)
                        }
                    }
                });
            self.schemas.insert(rel.to_owned(), result);
        }
        report(self.schemas.get(rel), at, diags).cloned()
    }

    /// Checks that a plain file (a rules file, say) exists inside the directory.
    pub fn plain(
        &mut self,
        rel: &str,
        at: Pos,
        sources: &mut Sources,
        diags: &mut Diagnostics,
    ) -> Option<Arc<str>> {
        self.touched.push(("plain", rel.to_owned()));
        if !self.plain.contains_key(rel) {
            let result =
                self.read(rel, limits::SOURCE_BYTES_MAX, sources).map(|(t, _)| Arc::from(t));
            self.plain.insert(rel.to_owned(), result);
        }
        report(self.plain.get(rel), at, diags).cloned()
    }

    /// Checks a workspace seed directory inside the scenarios directory and returns its
    /// path; its manifest (every file's relative path and sha256) joins the checksum.
    pub fn seed(&mut self, rel: &str, at: Pos, diags: &mut Diagnostics) -> Option<PathBuf> {
        self.touched.push(("seed", rel.to_owned()));
        if !self.seeds.contains_key(rel) {
            let stored = self.memory.as_ref().map(|m| m.get(&format!("{SEED_PREFIX}{rel}")));
            let result = self.resolve(rel).and_then(|dir| {
                if let Some(stored) = stored {
                    let manifest = stored.ok_or_else(|| not_stored(rel))?;
                    return Ok((dir, Arc::from(manifest.as_str())));
                }
                let manifest = seed_manifest(&dir).map_err(|why| {
                    Problem::AtReference(
                        format!("seed directory `{rel}` {why}"),
                        "bad-seed",
                        "name a directory of plain files inside the scenarios directory".to_owned(),
                    )
                })?;
                Ok((dir, Arc::from(manifest)))
            });
            self.seeds.insert(rel.to_owned(), result);
        }
        report(self.seeds.get(rel), at, diags).map(|(dir, _)| dir.clone())
    }

    /// The files referenced since the last call, with their contents, sorted and without
    /// repeats: what one scenario's checksum covers besides its own text.
    pub fn take_touched(&mut self) -> Vec<(String, String)> {
        let mut out: Vec<(String, String)> = std::mem::take(&mut self.touched)
            .into_iter()
            .filter_map(|(kind, key)| {
                let text = match kind {
                    "template" => self.templates.get(&key)?.as_ref().ok()?.to_string(),
                    "rubric" => {
                        serde_json::to_string(&**self.rubrics.get(&key)?.as_ref().ok()?).ok()?
                    }
                    "schema" => self.schemas.get(&key)?.as_ref().ok()?.to_string(),
                    "seed" => self.seeds.get(&key)?.as_ref().ok()?.1.to_string(),
                    _ => self.plain.get(&key)?.as_ref().ok()?.to_string(),
                };
                Some((format!("{kind}:{key}"), text))
            })
            .collect();
        out.sort();
        out.dedup();
        out
    }

    /// The texts the files referenced since the last [`Files::take_touched`] were read
    /// from, by relative path (seed manifests under `seed:PATH`): with the canonical
    /// scenario, all [`Files::in_memory`] needs to load the same scenario again.
    pub fn touched_texts(&self) -> BTreeMap<String, String> {
        let mut out = BTreeMap::new();
        for (kind, key) in &self.touched {
            let (rel, text) = match *kind {
                "rubric" => {
                    let rel = format!("rubrics/{key}.md");
                    let text = self.raw.get(&rel).map(ToString::to_string);
                    (rel, text)
                }
                "seed" => (
                    format!("{SEED_PREFIX}{key}"),
                    self.seeds.get(key).and_then(|r| r.as_ref().ok()).map(|(_, m)| m.to_string()),
                ),
                _ => (key.clone(), self.raw.get(key).map(ToString::to_string)),
            };
            if let Some(text) = text {
                out.insert(rel, text);
            }
        }
        out
    }

    fn read(
        &mut self,
        rel: &str,
        bytes_max: usize,
        sources: &mut Sources,
    ) -> Result<(String, SourceId), Problem> {
        let path = self.resolve(rel)?;
        if let Some(memory) = &self.memory {
            let text = memory.get(rel).ok_or_else(|| not_stored(rel))?;
            if text.len() > bytes_max {
                return Err(Problem::AtReference(
                    format!("`{rel}` is {} bytes; the limit is {bytes_max}", text.len()),
                    "file-too-large",
                    "shorten the file".to_owned(),
                ));
            }
            let text = text.clone();
            self.raw.insert(rel.to_owned(), Arc::from(text.as_str()));
            let name = format!("{} (stored)", self.root.join(rel).display());
            let source = sources.add(name, text.clone());
            return Ok((text, source));
        }
        let text = capped::read_text(&path, bytes_max as u64).map_err(|e| match e {
            capped::Error::Missing { .. } => Problem::AtReference(
                format!("`{rel}` does not exist"),
                "missing-file",
                format!("create {} or fix the path", self.root.join(rel).display()),
            ),
            capped::Error::NotRegular { kind, .. } => Problem::AtReference(
                format!("`{rel}` is a {kind}, not a regular file"),
                "missing-file",
                "name a regular file inside the scenarios directory (pipes, devices and directories are never read)".to_owned(),
            ),
            capped::Error::TooLarge { bytes_max, .. } => Problem::AtReference(
                format!("`{rel}` is larger than {}", capped::size(bytes_max)),
                "file-too-large",
                "shorten the file".to_owned(),
            ),
            capped::Error::NotUtf8 { offset, .. } => Problem::AtReference(
                format!("`{rel}` is not UTF-8 (invalid byte at offset {offset})"),
                "not-utf8",
                "save the file as UTF-8".to_owned(),
            ),
            capped::Error::Io { reason, .. } => Problem::AtReference(
                format!("cannot read `{rel}`: {reason}"),
                "unreadable-file",
                "check its permissions".to_owned(),
            ),
        })?;
        self.raw.insert(rel.to_owned(), Arc::from(text.as_str()));
        let name = self.root.join(rel).display().to_string();
        let source = sources.add(name, text.clone());
        Ok((text, source))
    }

    /// Resolves a relative path inside the root, refusing anything that leaves it.
    fn resolve(&self, rel: &str) -> Result<PathBuf, Problem> {
        let bad = |why: &str| {
            Problem::AtReference(
                format!("`{rel}` {why}"),
                "bad-path",
                "paths are relative to the scenarios directory and stay inside it".to_owned(),
            )
        };
        if rel.is_empty() {
            return Err(bad("is empty"));
        }
        let path = Path::new(rel);
        for component in path.components() {
            match component {
                Component::Normal(_) | Component::CurDir => {}
                Component::ParentDir => return Err(bad("climbs out with `..`")),
                Component::RootDir | Component::Prefix(_) => return Err(bad("is absolute")),
            }
        }
        let full = self.root.join(path);
        if self.memory.is_some() {
            return Ok(full);
        }
        if let (Ok(real), Ok(root)) = (full.canonicalize(), self.root.canonicalize())
            && !real.starts_with(&root)
        {
            return Err(bad("leads outside the scenarios directory through a symlink"));
        }
        Ok(full)
    }
}

/// The key under which a seed directory's manifest is kept among a scenario's texts.
pub const SEED_PREFIX: &str = "seed:";

/// A file a stored scenario version does not hold.
fn not_stored(rel: &str) -> Problem {
    Problem::AtReference(
        format!("`{rel}` is not among the scenario's stored texts"),
        "missing-file",
        "the stored version is incomplete; resume with `--upgrade` to move the run to the scenario files as they are now".to_owned(),
    )
}

/// One line per file of a seed directory, sorted: its relative path and sha256. Symlinks
/// are refused (a workspace must not start with a way out); sizes are bounded.
fn seed_manifest(dir: &Path) -> Result<String, String> {
    use sha2::{Digest, Sha256};
    if !std::fs::symlink_metadata(dir).map_err(|_| "does not exist".to_owned())?.is_dir() {
        return Err("is not a directory".to_owned());
    }
    let mut lines = Vec::new();
    let mut bytes = 0u64;
    let mut pending = vec![PathBuf::new()];
    while let Some(rel) = pending.pop() {
        let entries = std::fs::read_dir(dir.join(&rel))
            .map_err(|e| format!("cannot be read at `{}`: {e}", rel.display()))?;
        for entry in entries {
            let entry = entry.map_err(|e| format!("cannot be listed: {e}"))?;
            let child = rel.join(entry.file_name());
            let kind = entry.file_type().map_err(|e| format!("cannot be read: {e}"))?;
            if kind.is_dir() {
                pending.push(child);
            } else if kind.is_file() {
                let too_many = || {
                    format!(
                        "holds more than {} files or {} bytes",
                        limits::SEED_FILES_MAX,
                        limits::SEED_BYTES_MAX
                    )
                };
                // Read no more than the seed may still hold: one byte over is too much.
                let room = limits::SEED_BYTES_MAX - bytes;
                let data = match capped::read_bytes(&entry.path(), room) {
                    Ok(data) => data,
                    Err(capped::Error::TooLarge { .. }) => return Err(too_many()),
                    Err(e) => return Err(format!("cannot be read at `{}`: {e}", child.display())),
                };
                bytes += data.len() as u64;
                if lines.len() >= limits::SEED_FILES_MAX {
                    return Err(too_many());
                }
                let name = child.to_string_lossy().replace('\\', "/");
                lines.push(format!("{} {name}", crate::digest::hex(&Sha256::digest(&data))));
            } else {
                return Err(format!("holds `{}`, which is not a plain file", child.display()));
            }
        }
    }
    lines.sort();
    Ok(lines.join("\n"))
}

fn report<'a, T>(
    entry: Option<&'a Result<T, Problem>>,
    at: Pos,
    diags: &mut Diagnostics,
) -> Option<&'a T> {
    match entry? {
        Ok(value) => Some(value),
        Err(Problem::AtReference(message, code, help)) => {
            diags.push(Diagnostic::error(code, at, message.clone()).with_help(help.clone()));
            None
        }
        Err(Problem::InFile) => None,
    }
}

/// " (used at FILE:LINE)" for a diagnostic inside a referenced file.
fn used_at(sources: &Sources, at: Pos) -> String {
    if at.is_known() {
        format!(" (used at {}:{})", sources.name(at.source), at.line)
    } else {
        String::new()
    }
}

fn is_plain_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= limits::ID_CHARS_MAX
        && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
}

fn line_col_pos(text: &str, line: usize, col: usize, source: SourceId) -> Pos {
    let offset: usize =
        text.split_inclusive('\n').take(line.saturating_sub(1)).map(str::len).sum::<usize>()
            + col.saturating_sub(1);
    pos_in_text(text, offset, 1, source)
}

/// Parses a template and checks the names it reads.
///
/// `inline` is the position of an inline template's YAML value; errors then point there.
pub fn check_template(
    name: &str,
    text: &str,
    source: SourceId,
    sources: &Sources,
    inline: Option<Pos>,
) -> Vec<Diagnostic> {
    // An inline template's characters are traced back to the file through its YAML
    // scalar (quotes, escapes, indentation, folding; see `crate::scalar`), so its errors
    // point inside it.
    let traced = inline.and_then(|pos| {
        let source_text = &sources.get(pos.source)?.text;
        let start = pos.byte as usize;
        crate::scalar::offsets(source_text, start, start + pos.len as usize, text)
    });
    let exact = |offset: usize, len: usize| -> Option<Pos> {
        let map = traced.as_ref()?;
        let from = *map.get(offset)?;
        let to = *map.get(offset + len)?;
        Some(sources.pos_at_byte(inline?.source, from, to.saturating_sub(from).max(1)))
    };
    let env = crate::template::environment();
    let place = |line: Option<usize>, range: Option<std::ops::Range<usize>>| -> Pos {
        if let Some(pos) = inline {
            let mapped = range.as_ref().and_then(|r| exact(r.start, r.end.saturating_sub(r.start)));
            return mapped.unwrap_or(pos);
        }
        match (range, line) {
            (Some(r), _) => sources.pos_at_byte(source, r.start, r.end.saturating_sub(r.start)),
            (None, Some(l)) => line_col_pos(text, l, 1, source),
            (None, None) => Pos { source, ..Pos::UNKNOWN },
        }
    };
    let in_line = |line: Option<usize>| match (inline, line) {
        (Some(_), Some(l)) => format!(" (template line {l})"),
        _ => String::new(),
    };
    let template = match env.template_from_named_str(name, text) {
        Ok(t) => t,
        Err(e) => {
            let detail = e.detail().map_or_else(|| e.kind().to_string(), str::to_owned);
            let help = if detail.contains("end of block") || detail.contains("end of input") {
                "a `{% if %}`, `{% for %}`, `{% block %}` or `{% macro %}` is missing its closing `{% end… %}`"
            } else {
                "see the minijinja template syntax; `{{ … }}` prints, `{% … %}` controls"
            };
            return vec![
                Diagnostic::error(
                    "template-syntax",
                    place(e.line(), e.range()),
                    format!("template syntax error{}: {detail}", in_line(e.line())),
                )
                .with_help(help),
            ];
        }
    };
    let at = |start: usize, len: usize| -> Pos {
        match inline {
            Some(pos) => exact(start, len).unwrap_or(pos),
            None => sources.pos_at_byte(source, start, len),
        }
    };
    let mut globals = crate::template::globals(&env);
    globals.sort();
    let mut out = Vec::new();
    let mut unknown_calls: Vec<String> = Vec::new();
    for u in crate::template::uses(text) {
        let len = u.end.saturating_sub(u.start);
        let problem = match u.kind {
            UseKind::Load => Some(
                Diagnostic::error(
                    "template-load",
                    at(u.start, len),
                    format!(
                        "`{{% {} %}}` loads another template, which prompts cannot do",
                        u.name
                    ),
                )
                .with_help(
                    "a prompt is one file: copy the shared text into it, or define a `{% macro %}` in it",
                ),
            ),
            UseKind::Filter if !crate::template::has_filter(&env, &u.name) => Some(
                Diagnostic::error(
                    "template-filter",
                    at(u.start, len),
                    format!("the template uses the filter `{}`, which the renderer does not provide", u.name),
                )
                .with_help("use one of minijinja's built-in filters (`upper`, `trim`, `default`, `join`, `tojson` …)"),
            ),
            UseKind::Test if !crate::template::has_test(&env, &u.name) => Some(
                Diagnostic::error(
                    "template-test",
                    at(u.start, len),
                    format!("the template uses the test `{}`, which the renderer does not provide", u.name),
                )
                .with_help("use one of minijinja's built-in tests (`defined`, `none`, `string`, `number`, `odd` …)"),
            ),
            UseKind::Function
                if !globals.contains(&u.name) && !TEMPLATE_VARIABLES.contains(&u.name.as_str()) =>
            {
                if unknown_calls.contains(&u.name) {
                    None
                } else {
                    unknown_calls.push(u.name.clone());
                    Some(
                        Diagnostic::error(
                            "template-function",
                            at(u.start, len),
                            format!(
                                "the template calls `{}()`, which is not a function the renderer provides",
                                u.name
                            ),
                        )
                        .with_help(format!(
                            "functions every template can call: {}; or define a `{{% macro {}() %}}` in the template",
                            globals.join(", "),
                            u.name
                        )),
                    )
                }
            }
            _ => None,
        };
        out.extend(problem);
    }
    let mut unknown: Vec<String> = template
        .undeclared_variables(false)
        .into_iter()
        .filter(|v| {
            !TEMPLATE_VARIABLES.contains(&v.as_str())
                && !TEMPLATE_LOCALS.contains(&v.as_str())
                && !globals.contains(v)
                && !unknown_calls.contains(v)
        })
        .collect();
    unknown.sort();
    out.extend(unknown.into_iter().map(|var| {
        let offset = text.find(&var);
        let at = match inline {
            Some(pos) => offset.and_then(|i| exact(i, var.len())).unwrap_or(pos),
            None => offset.map_or(Pos { source, ..Pos::UNKNOWN }, |i| {
                sources.pos_at_byte(source, i, var.len())
            }),
        };
        let help = match crate::suggest::closest(&var, TEMPLATE_VARIABLES.iter().copied()) {
            Some(near) => format!(
                "did you mean `{near}`? templates can read: {}",
                TEMPLATE_VARIABLES.join(", ")
            ),
            None => format!("templates can read: {}", TEMPLATE_VARIABLES.join(", ")),
        };
        Diagnostic::error(
            "template-variable",
            at,
            format!("the template reads `{var}`, which no run provides"),
        )
        .with_help(help)
    }));
    out
}

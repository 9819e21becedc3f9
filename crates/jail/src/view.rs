//! The filesystem a jailed program sees: the system directories and the toolchains
//! read-only, a reduced `/etc`, the workspace read-write, its own `/tmp`, `/proc` and
//! `/dev` — and nothing of Baton's own state.

use std::ffi::OsString;
use std::path::{Path, PathBuf};

use crate::settings::{INIT_INSIDE, Program, Settings};

/// System directories shown read-only when they exist (a symlink is shown as the same
/// symlink, as on merged-/usr systems where `/bin` points into `/usr`).
const SYSTEM: &[&str] = &["/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/opt"];

/// What of `/etc` a program may need to run: the dynamic loader's cache, the
/// alternatives, certificates, time zone, name-service switch. Not the password or
/// shadow files, not ssh keys, not the hosts' own configuration.
const ETC: &[&str] = &[
    "ld.so.cache",
    "ld.so.conf",
    "ld.so.conf.d",
    "alternatives",
    "ssl",
    "ca-certificates",
    "ca-certificates.conf",
    "localtime",
    "timezone",
    "nsswitch.conf",
    "hosts",
    "host.conf",
    "gai.conf",
    "protocols",
    "services",
    "mime.types",
    "os-release",
    "debian_version",
    "python3",
    "python3.11",
    "inputrc",
    "bash.bashrc",
    "profile",
    "environment",
    "java-17-openjdk",
    "nodejs",
    "gitconfig.d",
];

/// What a jailed program is shown besides the system: built once per jail.
#[derive(Debug)]
pub struct View {
    /// Extra read-only paths: the declared ones, then those derived from `PATH`.
    read_only: Vec<PathBuf>,
    /// Baton's state, never shown.
    pub(crate) hidden: Vec<PathBuf>,
    /// The jail's own `passwd` and `group`.
    etc: PathBuf,
    /// The jail's directory (its probe's workspace lies there).
    scratch: PathBuf,
    /// What a program may read but not change when it lies in its workspace.
    protected: Vec<PathBuf>,
    /// Baton's own directory (the database's), one of `hidden`.
    data: Option<PathBuf>,
}

impl View {
    pub(crate) fn new(settings: &Settings, etc: PathBuf, scratch: PathBuf) -> View {
        let hidden: Vec<PathBuf> = settings
            .hidden
            .iter()
            .filter_map(|p| std::path::absolute(p).ok())
            .flat_map(|p| {
                let canonical = p.canonicalize().ok();
                std::iter::once(p).chain(canonical)
            })
            .collect();
        let mut read_only: Vec<PathBuf> = Vec::new();
        let path = settings.path.clone().or_else(|| std::env::var_os("PATH")).unwrap_or_default();
        let derived = toolchains(&path, &Homes::from_env());
        for path in settings.read_only.iter().cloned().chain(derived) {
            let Ok(path) = std::path::absolute(&path) else { continue };
            // A toolchain that holds Baton's state would show it: such a path is left out.
            if !path.exists() || hidden.iter().any(|h| h.starts_with(&path)) {
                continue;
            }
            if !read_only.contains(&path) && !is_system(&path) {
                read_only.push(path);
            }
        }
        // Parents first, so that a child mount lands on top of its parent's.
        read_only.sort_by_key(|p| p.components().count());
        let protected =
            settings.protected.iter().filter_map(|p| std::path::absolute(p).ok()).collect();
        let data = settings.data.as_ref().and_then(|d| std::path::absolute(d).ok());
        View { read_only, hidden, etc, scratch, protected, data }
    }

    /// Adds the view's bwrap arguments: `tmp` becomes `/tmp`, `workspace` is writable.
    pub(crate) fn arguments(
        &self,
        a: &mut Vec<OsString>,
        tmp: &Path,
        workspace: &Path,
        program: &Program<'_>,
        own: &[PathBuf],
        init: &Path,
    ) -> Result<(), String> {
        let network = program.network;
        let inside = |h: &&PathBuf| {
            workspace.starts_with(h)
                && !is_workspace_root(h, workspace)
                && !workspace.starts_with(&self.scratch)
                // Baton's directory may hold the workspace (a project beside the
                // database, or a run's own); it may not be the workspace.
                && (Some(h.as_path()) != self.data.as_deref() || workspace == h.as_path())
        };
        if let Some(h) = self.hidden.iter().find(inside) {
            return Err(format!(
                "the workspace {} is, or lies inside, Baton's own state ({}), which no jailed program may see; keep the database (--db) outside the workspace or in its .baton directory, and the snapshots (--snapshots) outside it",
                workspace.display(),
                h.display()
            ));
        }
        let mut m = Mounts::default();
        for dir in SYSTEM {
            let path = Path::new(dir);
            match std::fs::symlink_metadata(path) {
                Ok(meta) if meta.file_type().is_symlink() => {
                    if let Ok(target) = std::fs::read_link(path) {
                        a.extend(["--symlink".into(), target.into_os_string(), path.into()]);
                    }
                }
                Ok(meta) if meta.is_dir() => m.bind(a, "--ro-bind", path, path),
                _ => {}
            }
        }
        a.extend(["--dir".into(), "/etc".into()]);
        m.mounted.push(PathBuf::from("/etc"));
        let etc = Path::new("/etc");
        for name in ETC.iter().copied().chain(network.then_some("resolv.conf")) {
            let path = etc.join(name);
            if path.exists() {
                m.bind(a, "--ro-bind", &path, &path);
            }
        }
        for name in ["passwd", "group"] {
            m.bind(a, "--ro-bind", &self.etc.join(name), &etc.join(name));
        }
        a.extend(["--proc".into(), "/proc".into(), "--dev".into(), "/dev".into()]);
        m.mounted.extend([PathBuf::from("/proc"), PathBuf::from("/dev")]);
        // The private /tmp first: what is mounted below it comes after, on top of it.
        a.extend(["--bind".into(), tmp.as_os_str().to_owned(), "/tmp".into()]);
        let mut shown: Vec<&PathBuf> = self.read_only.iter().collect();
        for path in own {
            let covered = is_system(path) || shown.iter().any(|s| path.starts_with(s));
            if !covered && path.exists() && !self.hidden.iter().any(|h| h.starts_with(path)) {
                shown.push(path);
            }
        }
        shown.sort_by_key(|p| p.components().count());
        for path in shown {
            m.bind(a, "--ro-bind", path, path);
        }
        m.bind(a, "--bind", workspace, workspace);
        m.bind(a, "--ro-bind", init, Path::new(INIT_INSIDE));
        // Baton's state inside what is shown is covered: an empty directory, or an empty
        // file (covered, it cannot be renamed or removed: a mount point is busy).
        let mut covered: Vec<&PathBuf> = Vec::new();
        let mut hidden: Vec<&PathBuf> = self.hidden.iter().collect();
        hidden.sort_by_key(|p| p.components().count());
        for hidden in hidden {
            if covered.iter().any(|c| hidden.starts_with(c)) {
                continue;
            }
            let shown = hidden.starts_with(workspace)
                || is_system(hidden)
                || self.read_only.iter().any(|r| hidden.starts_with(r));
            if !shown || workspace.starts_with(hidden) {
                continue;
            }
            match std::fs::symlink_metadata(hidden) {
                Ok(meta) if meta.is_dir() => {
                    a.extend(["--tmpfs".into(), hidden.as_os_str().to_owned()]);
                    m.cover(hidden);
                    covered.push(hidden);
                }
                Ok(_) => a.extend([
                    "--ro-bind".into(),
                    "/dev/null".into(),
                    hidden.as_os_str().to_owned(),
                ]),
                Err(_) => {}
            }
        }
        // Baton's own directories the program may write (a scanner's report directory,
        // git's repository), mounted after the covers so that one inside a cover shows.
        for dir in program.also_writable {
            m.bind(a, "--bind", dir, dir);
        }
        // The covers are read-only once what is mounted inside them is.
        for cover in covered {
            a.extend(["--remount-ro".into(), cover.as_os_str().to_owned()]);
        }
        // What the program may read in the workspace but not change: its git metadata
        // (the next `git` a person runs there would obey it), the configuration and the
        // scenarios when they lie in it.
        for path in self.protected_in(workspace) {
            a.extend([
                "--ro-bind".into(),
                path.as_os_str().to_owned(),
                path.as_os_str().to_owned(),
            ]);
        }
        Ok(())
    }

    /// The paths inside `workspace` a program may not change: `.git`, and
    /// [`Settings::protected`] where they exist there.
    pub(crate) fn protected_in(&self, workspace: &Path) -> Vec<PathBuf> {
        std::iter::once(workspace.join(".git"))
            .chain(
                self.protected
                    .iter()
                    .filter(|p| p.starts_with(workspace) && p.as_path() != workspace)
                    .cloned(),
            )
            .filter(|p| std::fs::symlink_metadata(p).is_ok())
            .collect()
    }
}

/// The bind mounts made so far, so that the directories leading to a new one are made
/// first, searchable (bwrap would make them private to root, and a program running as
/// the jail's uid could not reach what is mounted below them).
#[derive(Debug, Default)]
struct Mounts {
    mounted: Vec<PathBuf>,
    made: Vec<PathBuf>,
    /// Empty directories laid over what was mounted: nothing below them exists yet.
    covers: Vec<PathBuf>,
}

impl Mounts {
    /// An empty directory now lies at `path`.
    fn cover(&mut self, path: &Path) {
        self.made.retain(|d| !d.starts_with(path));
        self.covers.push(path.to_path_buf());
    }

    fn bind(&mut self, a: &mut Vec<OsString>, how: &str, source: &Path, dest: &Path) {
        let mut ancestors: Vec<&Path> =
            dest.ancestors().skip(1).filter(|p| p.parent().is_some()).collect();
        ancestors.reverse();
        for dir in ancestors {
            let exists = self.mounted.iter().any(|m| dir.starts_with(m))
                && !self.covers.iter().any(|c| dir.starts_with(c));
            if !exists && !self.made.iter().any(|d| d == dir) {
                a.extend([
                    "--perms".into(),
                    "0755".into(),
                    "--dir".into(),
                    dir.as_os_str().to_owned(),
                ]);
                self.made.push(dir.to_path_buf());
            }
        }
        a.extend([how.into(), source.as_os_str().to_owned(), dest.as_os_str().to_owned()]);
        self.mounted.push(dest.to_path_buf());
    }
}

/// A run's own workspace lies among Baton's (`<data>/workspaces/<run>`): the others are
/// hidden, this one is shown.
fn is_workspace_root(hidden: &Path, workspace: &Path) -> bool {
    hidden.file_name().is_some_and(|n| n == "workspaces") && workspace.parent() == Some(hidden)
}

fn is_system(path: &Path) -> bool {
    SYSTEM.iter().any(|s| path.starts_with(s))
}

/// The home directory and Cargo's and rustup's homes, which [`toolchains`] treats apart.
#[derive(Clone, Debug, Default)]
pub struct Homes {
    pub home: Option<PathBuf>,
    pub cargo: Option<PathBuf>,
    pub rustup: Option<PathBuf>,
}

impl Homes {
    /// `HOME`, `CARGO_HOME` (else `~/.cargo`) and `RUSTUP_HOME` (else `~/.rustup`).
    pub fn from_env() -> Homes {
        let home = std::env::var_os("HOME").map(PathBuf::from);
        let under = |var: &str, default: &str| {
            std::env::var_os(var)
                .map(PathBuf::from)
                .or_else(|| home.as_ref().map(|h| h.join(default)))
        };
        Homes {
            cargo: under("CARGO_HOME", ".cargo"),
            rustup: under("RUSTUP_HOME", ".rustup"),
            home,
        }
    }
}

/// The toolchain directories `PATH` points into: an entry `X/bin` or `X/shims` shows its
/// whole toolchain `X` (a virtualenv, pyenv, a JDK), except where `X` is the home
/// directory (or above it) or Cargo's home, whose credentials stay out; then the entry
/// alone is shown (with Cargo's registry, and rustup's toolchains).
pub fn toolchains(path: &std::ffi::OsStr, homes: &Homes) -> Vec<PathBuf> {
    let home = homes.home.as_deref();
    let (cargo_home, rustup_home) = (&homes.cargo, &homes.rustup);
    let mut found = Vec::new();
    for entry in std::env::split_paths(path) {
        if !entry.is_absolute() || is_system(&entry) || entry.as_os_str().is_empty() {
            continue;
        }
        let root = match (entry.file_name().and_then(|n| n.to_str()), entry.parent()) {
            (Some("bin" | "shims"), Some(parent)) => parent.to_path_buf(),
            // `PREFIX/node_modules/.bin`: the packages' links point into PREFIX/node_modules.
            (Some(".bin"), Some(modules)) if modules.ends_with("node_modules") => {
                modules.parent().map_or_else(|| entry.clone(), Path::to_path_buf)
            }
            _ => entry.clone(),
        };
        // Under the home directory only a toolchain's own layout is shown whole (a
        // virtualenv, pyenv, an npm prefix): `~/.local/bin` shows itself, not `~/.local`.
        let toolchain_layout = ["pyvenv.cfg", "libexec/pyenv", "node_modules"]
            .iter()
            .any(|marker| root.join(marker).exists());
        let too_wide = root.parent().is_none()
            || home.is_some_and(|h| h.starts_with(&root))
            || (home.is_some_and(|h| root.starts_with(h)) && !toolchain_layout)
            || is_system(&root);
        if cargo_home.as_deref() == Some(root.as_path()) {
            found.push(entry.clone());
            for part in ["registry", "git"] {
                found.push(root.join(part));
            }
            found.extend(
                rustup_home.iter().flat_map(|r| [r.join("toolchains"), r.join("settings.toml")]),
            );
        } else if too_wide {
            found.push(entry.clone());
        } else {
            found.push(root.clone());
        }
        if let Ok(real) = entry.canonicalize()
            && real != entry
        {
            found.push(real);
        }
    }
    let more = interpreters(&found, homes);
    found.extend(more);
    found
}

/// The toolchain a program given by its path belongs to (as for a `PATH` entry), with the
/// interpreter a virtualenv's `pyvenv.cfg` names: what must be shown for it to run.
pub fn toolchain_of(program: &Path) -> Vec<PathBuf> {
    let Some(dir) = program.parent().filter(|_| program.is_absolute()) else {
        return Vec::new();
    };
    toolchains(dir.as_os_str(), &Homes::from_env())
}

/// The interpreter toolchain of each virtualenv in `roots` (its `pyvenv.cfg` names it).
fn interpreters(roots: &[PathBuf], homes: &Homes) -> Vec<PathBuf> {
    let mut found = Vec::new();
    for root in roots {
        let Ok(text) = std::fs::read_to_string(root.join("pyvenv.cfg")) else { continue };
        let home = text.lines().find_map(|l| {
            let (key, value) = l.split_once('=')?;
            (key.trim() == "home").then(|| PathBuf::from(value.trim()))
        });
        if let Some(home) = home.filter(|h| h.is_absolute()) {
            for path in toolchains(home.as_os_str(), homes) {
                if !roots.contains(&path) && !found.contains(&path) {
                    found.push(path);
                }
            }
        }
    }
    found
}

/// Writes the jail's `passwd` and `group` under `scratch/etc`: root, the jail's user and
/// nobody. Returns the directory.
pub(crate) fn write_etc(scratch: &Path, uid: u32, gid: u32) -> Result<PathBuf, String> {
    let dir = scratch.join("etc");
    std::fs::create_dir_all(&dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    let mut passwd = String::from("root:x:0:0:root:/root:/bin/sh\n");
    let mut group = String::from("root:x:0:\n");
    if uid != 0 && uid != 65534 {
        passwd.push_str(&format!("baton:x:{uid}:{gid}:Baton jail:/tmp/home:/bin/sh\n"));
    }
    if gid != 0 && gid != 65534 {
        group.push_str(&format!("baton:x:{gid}:\n"));
    }
    passwd.push_str("nobody:x:65534:65534:nobody:/tmp/home:/bin/sh\n");
    group.push_str("nogroup:x:65534:\n");
    for (name, text) in [("passwd", passwd), ("group", group)] {
        let file = dir.join(name);
        let part = dir.join(format!(".{name}.{}", std::process::id()));
        std::fs::write(&part, text)
            .and_then(|()| std::fs::rename(&part, &file))
            .map_err(|e| format!("cannot write {}: {e}", file.display()))?;
    }
    Ok(dir)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn toolchains_show_their_root_but_never_the_home_or_cargo_credentials() {
        let dir = tempfile::tempdir().expect("tempdir");
        let home = dir.path().join("u");
        for made in [".pyenv/libexec/pyenv", ".pyenv/shims", ".local/bin", "bin", ".cargo/bin"] {
            std::fs::create_dir_all(home.join(made)).expect("dirs");
        }
        let homes = Homes {
            home: Some(home.clone()),
            cargo: Some(home.join(".cargo")),
            rustup: Some(home.join(".rustup")),
        };
        let h = home.display();
        let path = std::ffi::OsString::from(format!(
            "{h}/.pyenv/shims:/srv/venv/bin:{h}/bin:{h}/.local/bin:{h}/.cargo/bin:/usr/bin:relative:/srv/npm/node_modules/.bin"
        ));
        let found = toolchains(&path, &homes);
        assert!(found.contains(&PathBuf::from("/srv/npm")), "{found:?}");
        assert!(found.contains(&PathBuf::from("/srv/venv")), "{found:?}");
        assert!(found.contains(&home.join(".rustup/toolchains")), "{found:?}");
        assert!(found.contains(&home.join(".pyenv")), "{found:?}");
        assert!(found.contains(&home.join("bin")), "{found:?}");
        assert!(!found.contains(&home), "{found:?}");
        assert!(found.contains(&home.join(".local/bin")), "{found:?}");
        assert!(!found.contains(&home.join(".local")), "{found:?}");
        assert!(found.contains(&home.join(".cargo/bin")), "{found:?}");
        assert!(found.contains(&home.join(".cargo/registry")), "{found:?}");
        assert!(!found.contains(&home.join(".cargo")), "{found:?}");
        assert!(!found.iter().any(|p| p.starts_with("/usr")), "{found:?}");
        assert!(!found.iter().any(|p| p.is_relative()), "{found:?}");
    }

    #[test]
    fn a_run_workspace_is_the_one_thing_shown_of_the_others() {
        let runs = Path::new("/d/workspaces");
        assert!(is_workspace_root(runs, Path::new("/d/workspaces/run-1")));
        assert!(!is_workspace_root(Path::new("/d/snapshots"), Path::new("/d/snapshots/run-1")));
        assert!(!is_workspace_root(runs, Path::new("/d/workspaces/run-1/sub")));
    }
}

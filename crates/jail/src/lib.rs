//! The jail: the one place where Baton confines a program that a run starts — a command
//! verifier, a preset, a scanner, an MCP server. Whatever the model wrote may be run by
//! them, so each runs as if it were hostile.
//!
//! On Linux the jail is bubblewrap (`bwrap`, Flatpak's sandbox, from the distribution)
//! plus a few lines of Baton's own that run inside it ([`init`]):
//!
//! - **Namespaces** (bwrap): mount, PID, IPC, UTS and cgroup always, network unless the
//!   verifier declares `network: true`, user when Baton is not root. In its own PID
//!   namespace a program sees only its own processes, and when the jail's first process
//!   dies the kernel kills every one it started — `setsid` and double forks included.
//!   `--die-with-parent` ties that first process to Baton.
//! - **A filesystem view** ([`view`]): the system directories and the declared toolchain
//!   paths read-only, a reduced `/etc` with a passwd of one user, the workspace read-write,
//!   a private `/tmp` of its own, its own `/proc`, a minimal `/dev`. Baton's database,
//!   snapshots and other runs are not in it; where they lie inside a mounted directory
//!   they are covered.
//! - **An unprivileged uid**: when Baton runs as root, the program runs as
//!   [`Settings::run_as`] (nobody by default) with no capabilities, and the workspace is
//!   handed to that uid before it runs ([`tree::hand_over`]).
//! - **Landlock** (inside, when the kernel has it): writes only below the workspace,
//!   `/tmp` and `/dev`, a second wall behind the mount namespace.
//! - **rlimits** (inside): CPU time, address space, data, file size, processes of the uid,
//!   open files, no core dumps; and `no_new_privs`, so no setuid or file-capability binary
//!   raises them.
//! - **New files**: what the program adds to the workspace and its `/tmp` is counted while
//!   it runs ([`Watch::over_limits`]); past [`Limits::new_files`] or
//!   [`Limits::new_bytes`] it is stopped.
//!
//! [`Jail::off`] is the explicit `--no-jail`: programs run as Baton's user, unconfined
//! but for the scrubbed environment and the process group.
//!
//! **Boundary:** builds commands; does not spawn, read output or time out — the caller
//! (`baton_verifiers::program::run_program`, the MCP client) does, the same way in or out
//! of the jail.

pub mod init;
pub mod settings;
pub mod tree;
pub mod view;

use settings::INIT_INSIDE;
pub use settings::{INIT_ARG, Limits, Program, Settings};

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// How long the probe that sets the jail up may take (it takes milliseconds).
const PROBE_TIMEOUT: Duration = Duration::from_secs(5);
/// The most entries a workspace may hold for the jail to hand it over and count it.
const WORKSPACE_ENTRIES_MAX: u64 = 1_000_000;
/// Where a jailed program's home is (inside its private `/tmp`).
const HOME_INSIDE: &str = "/tmp/home";

/// Why the jail cannot be set up; programs are refused until it can, or `--no-jail`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Unavailable(pub String);

impl std::fmt::Display for Unavailable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "the jail cannot be set up: {}. Install bubblewrap (`apt-get install bubblewrap`, or \
             scripts/install-jail in a checkout; BATON_BWRAP names it), or pass --no-jail to run \
             verifiers, scanners and MCP servers unconfined as Baton's own user",
            self.0
        )
    }
}

/// The jail, or its explicit absence.
#[derive(Debug)]
pub struct Jail {
    mode: Mode,
}

#[derive(Debug)]
enum Mode {
    Off,
    Unavailable(Unavailable),
    On(Box<Setup>),
    /// Set up at the first program (or question), once: commands that start no program
    /// never pay for the probe.
    Lazy(Box<Settings>, std::sync::OnceLock<Result<Box<Setup>, Unavailable>>),
}

#[derive(Debug)]
struct Setup {
    bwrap: PathBuf,
    init: PathBuf,
    /// Some when Baton is root: the uid and gid [`init`] drops to.
    run_as: Option<(u32, u32)>,
    view: view::View,
    scratch: PathBuf,
    limits: Limits,
    /// What the probe found: whether Landlock holds, and its ABI.
    landlock: String,
}

/// A command ready to spawn, with what the jail keeps for it while it runs.
#[derive(Debug)]
pub struct Jailed {
    pub command: tokio::process::Command,
    /// What counts the program's new files; `None` when the jail is off. Keep it until
    /// the program is done: dropping it removes the program's `/tmp`.
    pub watch: Option<Watch>,
}

/// What a running program may add, and where it adds it.
#[derive(Debug)]
pub struct Watch {
    roots: Vec<PathBuf>,
    skip: Vec<PathBuf>,
    before: tree::Usage,
    limits: Limits,
    /// The program's private `/tmp`, removed when the program is done.
    scratch: PathBuf,
}

impl Drop for Watch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.scratch);
    }
}

impl Watch {
    /// What the program added past the jail's limits, if it did: it is then stopped.
    /// Blocking (walks the directories).
    pub fn over_limits(&self) -> Option<String> {
        let watch = self;
        let max_entries = watch.before.entries + watch.limits.new_files + 1;
        let now = tree::usage(&watch.roots, &watch.skip, max_entries);
        let files = now.entries.saturating_sub(watch.before.entries);
        let bytes = now.bytes.saturating_sub(watch.before.bytes);
        if now.unseen > watch.before.unseen {
            Some(
                "the program made directories the jail cannot count (unreadable, or nested deeper than 256) and was stopped"
                    .to_owned(),
            )
        } else if files > watch.limits.new_files {
            Some(format!(
                "the program created more than {} files in the workspace and /tmp (the jail's limit) and was stopped",
                watch.limits.new_files
            ))
        } else if bytes > watch.limits.new_bytes {
            Some(format!(
                "the program wrote more than {} MiB to the workspace and /tmp (the jail's limit) and was stopped",
                watch.limits.new_bytes / (1024 * 1024)
            ))
        } else {
            None
        }
    }
}

impl Jail {
    /// No jail (`--no-jail`): programs run as Baton's user.
    pub fn off() -> Jail {
        Jail { mode: Mode::Off }
    }

    /// A jail that refuses every program, saying why.
    pub fn unavailable(why: Unavailable) -> Jail {
        Jail { mode: Mode::Unavailable(why) }
    }

    /// A jail set up when it is first needed ([`Jail::set_up`]).
    pub fn lazy(settings: Settings) -> Jail {
        Jail { mode: Mode::Lazy(Box::new(settings), std::sync::OnceLock::new()) }
    }

    /// The set-up jail, or why there is none (`None` when it is off).
    fn setup(&self) -> Option<Result<&Setup, &Unavailable>> {
        match &self.mode {
            Mode::Off => None,
            Mode::Unavailable(why) => Some(Err(why)),
            Mode::On(setup) => Some(Ok(setup)),
            Mode::Lazy(settings, cell) => {
                Some(cell.get_or_init(|| Setup::new(settings).map(Box::new)).as_ref().map(|s| &**s))
            }
        }
    }

    /// Sets the jail up: finds bubblewrap, writes the jail's `/etc` files and runs one
    /// empty program through it to prove that namespaces work here.
    pub fn set_up(settings: &Settings) -> Result<Jail, Unavailable> {
        Ok(Jail { mode: Mode::On(Box::new(Setup::new(settings)?)) })
    }
}

impl Setup {
    fn new(settings: &Settings) -> Result<Setup, Unavailable> {
        let bwrap = match &settings.bwrap {
            Some(path) => path.clone(),
            None => find_on_path("bwrap", settings.path.as_deref()).ok_or_else(|| {
                Unavailable("bubblewrap (`bwrap`) is not installed, or not on PATH".to_owned())
            })?,
        };
        if !bwrap.is_file() {
            return Err(Unavailable(format!("{} is not a file", bwrap.display())));
        }
        let euid = rustix::process::geteuid();
        let run_as = euid.is_root().then_some(settings.run_as);
        if run_as.is_some_and(|(uid, _)| uid == 0) {
            return Err(Unavailable(
                "the jail's uid is 0; set an unprivileged one ([jail] uid in baton.toml)"
                    .to_owned(),
            ));
        }
        std::fs::create_dir_all(&settings.scratch).map_err(|e| {
            Unavailable(format!("cannot create {}: {e}", settings.scratch.display()))
        })?;
        let scratch = std::path::absolute(&settings.scratch)
            .map_err(|e| Unavailable(format!("{}: {e}", settings.scratch.display())))?;
        let (uid, gid) = run_as.unwrap_or((euid.as_raw(), rustix::process::getegid().as_raw()));
        let etc = view::write_etc(&scratch, uid, gid).map_err(Unavailable)?;
        let view = view::View::new(settings, etc, scratch.clone());
        let mut setup = Setup {
            bwrap,
            init: settings.init.clone(),
            run_as,
            view,
            scratch,
            limits: settings.limits,
            landlock: String::new(),
        };
        setup.landlock = setup.probe()?;
        Ok(setup)
    }
}

impl Jail {
    /// Whether programs run confined (setting the jail up if it is lazy).
    pub fn is_on(&self) -> bool {
        matches!(self.setup(), Some(Ok(_)))
    }

    /// Whether programs run unconfined, by the user's choice.
    pub fn is_off(&self) -> bool {
        matches!(self.mode, Mode::Off)
    }

    /// Why programs are refused, when they are (setting the jail up if it is lazy).
    pub fn refusal(&self) -> Option<&Unavailable> {
        match self.setup() {
            Some(Err(why)) => Some(why),
            _ => None,
        }
    }

    /// One line on what confines programs.
    pub fn describe(&self) -> String {
        match self.setup() {
            None => "off (--no-jail): programs run unconfined as Baton's user".to_owned(),
            Some(Err(why)) => format!("unavailable: {}", why.0),
            Some(Ok(setup)) => format!(
                "bubblewrap {} as {}; {}",
                setup.bwrap.display(),
                match setup.run_as {
                    Some((uid, gid)) => format!("uid {uid}, gid {gid}"),
                    None => "Baton's uid in a user namespace".to_owned(),
                },
                setup.landlock
            ),
        }
    }

    /// The command that runs `program` in the jail (or unconfined when the jail is off).
    /// The caller sets its stdio and process group, spawns it, and while it runs asks
    /// [`Watch::over_limits`].
    pub fn command(&self, program: &Program<'_>) -> Result<Jailed, String> {
        let (name, args, env, watch) = self.prepare(program)?;
        let mut command = tokio::process::Command::new(name);
        command.args(args).current_dir(program.cwd).env_clear();
        command.envs(env.iter().map(|(k, v)| (k, v)));
        Ok(Jailed { command, watch })
    }

    /// [`Jail::command`] for a blocking caller: the command, and the watch to keep until
    /// the program is done.
    pub fn std_command(
        &self,
        program: &Program<'_>,
    ) -> Result<(std::process::Command, Option<Watch>), String> {
        let (name, args, env, watch) = self.prepare(program)?;
        let mut command = std::process::Command::new(name);
        command.args(args).current_dir(program.cwd).env_clear();
        command.envs(env.iter().map(|(k, v)| (k, v)));
        Ok((command, watch))
    }

    /// What to start for `program`: the program and its arguments, its environment, and
    /// what counts its new files.
    #[allow(clippy::type_complexity)]
    fn prepare(
        &self,
        program: &Program<'_>,
    ) -> Result<(OsString, Vec<OsString>, Vec<(String, String)>, Option<Watch>), String> {
        let Some((name, args)) = program.argv.split_first() else {
            return Err("no program to run".to_owned());
        };
        match self.setup() {
            Some(Err(why)) => Err(why.to_string()),
            None => Ok((
                name.into(),
                args.iter().map(OsString::from).collect(),
                program.env.to_vec(),
                None,
            )),
            Some(Ok(setup)) => {
                let (args, watch) = setup.command(program)?;
                Ok((setup.bwrap.clone().into_os_string(), args, Vec::new(), Some(watch)))
            }
        }
    }
}

impl Setup {
    /// Runs `init --probe` through the jail; its answer says whether Landlock holds.
    fn probe(&self) -> Result<String, Unavailable> {
        let workspace = self.scratch.join("probe");
        std::fs::create_dir_all(&workspace)
            .map_err(|e| Unavailable(format!("cannot create {}: {e}", workspace.display())))?;
        let argv: Vec<String> = Vec::new();
        let program = Program {
            argv: &argv,
            env: &[],
            cwd: &workspace,
            workspace: &workspace,
            also_writable: &[],
            network: false,
            timeout: Duration::from_secs(10),
            counted: false,
        };
        let (args, _tmp) = self.arguments(&program, true).map_err(Unavailable)?;
        let out = self.probe_output(&args);
        let _ = std::fs::remove_dir_all(&_tmp);
        let out = out?;
        let stdout = String::from_utf8_lossy(&out.stdout);
        match stdout.lines().find_map(|l| l.strip_prefix("jail: ")) {
            Some(found) if out.status.success() => Ok(found.to_owned()),
            _ => Err(Unavailable(format!(
                "{} could not start a program in new namespaces here ({}): {}",
                self.bwrap.display(),
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            ))),
        }
    }

    /// Runs the probe, for [`PROBE_TIMEOUT`] at most (its one line of output fits a pipe).
    fn probe_output(&self, args: &[OsString]) -> Result<std::process::Output, Unavailable> {
        use std::os::unix::process::CommandExt as _;
        use std::process::Stdio;
        let mut child = std::process::Command::new(&self.bwrap)
            .args(args)
            .env_clear()
            .process_group(0)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| Unavailable(format!("cannot run {}: {e}", self.bwrap.display())))?;
        let deadline = std::time::Instant::now() + PROBE_TIMEOUT;
        while child.try_wait().ok().flatten().is_none() {
            if std::time::Instant::now() > deadline {
                // The whole group: whatever a broken bwrap started goes with it.
                let _ = std::process::Command::new("kill")
                    .args(["-KILL", "--", &format!("-{}", child.id())])
                    .status();
                let _ = child.kill();
                let _ = child.wait();
                return Err(Unavailable(format!(
                    "{} did not start a program within {} s",
                    self.bwrap.display(),
                    PROBE_TIMEOUT.as_secs()
                )));
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        child
            .wait_with_output()
            .map_err(|e| Unavailable(format!("cannot read {}: {e}", self.bwrap.display())))
    }

    /// bwrap's arguments for `program`, the workspace handed over first; and its watch.
    fn command(&self, program: &Program<'_>) -> Result<(Vec<OsString>, Watch), String> {
        let workspace = std::path::absolute(program.workspace)
            .map_err(|e| format!("{}: {e}", program.workspace.display()))?;
        if let Some((uid, gid)) = self.run_as {
            let mut kept = self.view.hidden.clone();
            kept.extend(self.view.protected_in(&workspace));
            tree::hand_over(&workspace, uid, gid, &kept, WORKSPACE_ENTRIES_MAX)?;
        }
        for dir in program.also_writable {
            if let Some((uid, gid)) = self.run_as {
                tree::hand_over(dir, uid, gid, &self.view.hidden, WORKSPACE_ENTRIES_MAX)?;
            }
        }
        let (args, tmp) = self.arguments(program, false)?;
        let skip = self.view.hidden.clone();
        let mut roots = Vec::new();
        if program.counted {
            roots.extend([workspace, tmp.clone()]);
            roots.extend(program.also_writable.iter().cloned());
        }
        let before = tree::usage(&roots, &skip, WORKSPACE_ENTRIES_MAX);
        Ok((args, Watch { roots, skip, before, limits: self.limits, scratch: tmp }))
    }

    /// bwrap's arguments for `program`, and the private `/tmp` made for it.
    fn arguments(
        &self,
        program: &Program<'_>,
        probe: bool,
    ) -> Result<(Vec<OsString>, PathBuf), String> {
        let tmp = tree::private_dir(&self.scratch, self.run_as)?;
        let mut a: Vec<OsString> = Vec::with_capacity(96);
        let mut push = |words: &[&str]| a.extend(words.iter().map(OsString::from));
        push(&["--die-with-parent", "--new-session", "--unshare-pid", "--unshare-ipc"]);
        push(&["--unshare-uts", "--unshare-cgroup-try", "--hostname", "baton-jail"]);
        if !program.network {
            push(&["--unshare-net"]);
        }
        if self.run_as.is_some() {
            // bwrap runs privileged; it needs to search Baton's private directories to
            // reach the ones it mounts, and init needs the rest to empty the bounding set
            // and drop to the jail's uid, which clears them with every other capability.
            push(&["--cap-drop", "ALL", "--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID"]);
            push(&["--cap-add", "CAP_SETPCAP", "--cap-add", "CAP_DAC_READ_SEARCH"]);
        } else {
            push(&["--unshare-user", "--disable-userns"]);
        }
        let workspace = std::path::absolute(program.workspace)
            .map_err(|e| format!("{}: {e}", program.workspace.display()))?;
        let own =
            program.argv.first().map(|p| view::toolchain_of(Path::new(p))).unwrap_or_default();
        self.view.arguments(&mut a, &tmp, &workspace, program, &own, &self.init)?;
        let cwd = std::path::absolute(program.cwd)
            .map_err(|e| format!("{}: {e}", program.cwd.display()))?;
        a.extend(["--chdir".into(), cwd.into_os_string(), "--clearenv".into()]);
        for (key, value) in program.env {
            if key == "HOME" || key == "TMPDIR" {
                continue;
            }
            a.extend(["--setenv".into(), key.into(), value.into()]);
        }
        a.extend(["--setenv".into(), "HOME".into(), HOME_INSIDE.into()]);
        a.extend(["--setenv".into(), "TMPDIR".into(), "/tmp".into()]);
        a.extend(["--".into(), INIT_INSIDE.into(), INIT_ARG.into()]);
        let limits = Limits {
            cpu_s: self.limits.cpu_s.min(program.timeout.as_secs().saturating_add(5)),
            ..self.limits
        };
        a.extend(init::limit_arguments(&limits).into_iter().map(OsString::from));
        if let Some((uid, gid)) = self.run_as {
            a.extend([
                "--uid".into(),
                uid.to_string().into(),
                "--gid".into(),
                gid.to_string().into(),
            ]);
        }
        let fixed = [workspace.as_path(), Path::new("/tmp")];
        for writable in fixed.into_iter().chain(program.also_writable.iter().map(PathBuf::as_path))
        {
            a.extend(["--write".into(), writable.as_os_str().to_owned()]);
        }
        if probe {
            a.push("--probe".into());
        } else {
            a.push("--".into());
            a.extend(program.argv.iter().map(OsString::from));
        }
        Ok((a, tmp))
    }
}

/// Makes this process non-dumpable: its `/proc` entries (environment, memory, open
/// files) then belong to root, so no process of its own uid — nor a jailed one, which
/// cannot see it anyway — reads the keys in its environment.
pub fn make_undumpable() -> Result<(), String> {
    rustix::process::set_dumpable_behavior(rustix::process::DumpableBehavior::NotDumpable)
        .map_err(|e| format!("cannot make Baton non-dumpable: {e}"))
}

/// The first executable called `name` in `path` (colon-separated).
pub fn find_on_path(name: &str, path: Option<&std::ffi::OsStr>) -> Option<PathBuf> {
    let path = path.map(OsString::from).or_else(|| std::env::var_os("PATH"))?;
    std::env::split_paths(&path).map(|dir| dir.join(name)).find(|p| p.is_file())
}

//! What the jail is built from and what it confines: its [`Settings`] and [`Limits`], one
//! [`Program`] to run, and where Baton's own binary lies inside it.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Where Baton's own binary is bound inside the jail, to run [`crate::init`].
pub(crate) const INIT_INSIDE: &str = "/run/baton/init";
/// The first argument that makes Baton's binary run [`crate::init::main`].
pub const INIT_ARG: &str = "__jail-init";
/// What a jailed program may use at most.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// CPU seconds of each process (`RLIMIT_CPU`); a verifier's timeout lowers it.
    pub cpu_s: u64,
    /// Address space of each process, in bytes (`RLIMIT_AS`).
    pub address_space_bytes: u64,
    /// Writable memory of each process, in bytes (`RLIMIT_DATA`).
    pub data_bytes: u64,
    /// Largest file a process may write, in bytes (`RLIMIT_FSIZE`).
    pub file_bytes: u64,
    /// Processes the jail's uid may have (`RLIMIT_NPROC`): a fork bomb stops there.
    pub processes: u64,
    /// Open files per process (`RLIMIT_NOFILE`).
    pub open_files: u64,
    /// Files and directories a program may add to the workspace and its `/tmp`.
    pub new_files: u64,
    /// Bytes of disk a program may add to the workspace and its `/tmp`.
    pub new_bytes: u64,
}

impl Default for Limits {
    fn default() -> Limits {
        const GIB: u64 = 1024 * 1024 * 1024;
        Limits {
            cpu_s: 3600,
            address_space_bytes: 32 * GIB,
            data_bytes: 8 * GIB,
            file_bytes: 512 * 1024 * 1024,
            processes: 1024,
            open_files: 4096,
            new_files: 50_000,
            new_bytes: 2 * GIB,
        }
    }
}

/// How to build the jail.
#[derive(Clone, Debug)]
pub struct Settings {
    /// The bubblewrap program; `None` looks for `bwrap` on `PATH`.
    pub bwrap: Option<PathBuf>,
    /// Baton's own binary, which runs [`crate::init`] inside the jail.
    pub init: PathBuf,
    /// The uid and gid programs run as when Baton is root.
    pub run_as: (u32, u32),
    /// Toolchain paths to show read-only, beyond the system directories and those
    /// [`crate::view::toolchains`] derives from `PATH`.
    pub read_only: Vec<PathBuf>,
    /// The `PATH` jailed programs get.
    pub path: Option<OsString>,
    /// Baton's own state (the database and its directory, the snapshots): never in the
    /// view.
    pub hidden: Vec<PathBuf>,
    /// Baton's directory (the database's): covered where it lies in a workspace, and never
    /// a workspace itself. Also one of `hidden`.
    pub data: Option<PathBuf>,
    /// What a program may read but never change when it lies in its workspace (Baton's
    /// configuration, the scenarios); the workspace's `.git` always.
    pub protected: Vec<PathBuf>,
    /// A directory of Baton's where the jail keeps its `/etc` files and each program's
    /// private `/tmp`.
    pub scratch: PathBuf,
    pub limits: Limits,
}

/// One program to confine.
#[derive(Clone, Copy, Debug)]
pub struct Program<'a> {
    pub argv: &'a [String],
    /// Variables the program gets (already scrubbed by the caller).
    pub env: &'a [(String, String)],
    /// Where it starts; inside `workspace`.
    pub cwd: &'a Path,
    /// The directory it may write (handed to the jail's uid when Baton is root).
    pub workspace: &'a Path,
    /// Directories of Baton's it may write too (a scanner's report directory).
    pub also_writable: &'a [PathBuf],
    /// Whether it may reach the network.
    pub network: bool,
    /// Its timeout, which bounds its CPU time too.
    pub timeout: Duration,
    /// Whether what it adds to the disk is counted ([`crate::Watch::over_limits`]): a model's
    /// program, not Baton's own git.
    pub counted: bool,
}

//! What runs first inside the jail, before the program: Baton's own binary, started by
//! bubblewrap as `baton __jail-init …`. It drops to the jail's uid (when Baton is root),
//! sets `no_new_privs` and the rlimits, applies Landlock where the kernel has it, and
//! then replaces itself with the program (`exec`), which inherits all of it.
//!
//! It is single-threaded (nothing here starts a thread), so the per-thread credential
//! calls change the whole process. Every failure ends it with exit code 125 and a line
//! on stderr that starts with `baton jail:`; nothing runs unconfined.

use std::ffi::OsString;
use std::os::unix::process::CommandExt as _;
use std::process::ExitCode;

use landlock::{
    ABI, Access, AccessFs, PathBeneath, PathFd, Ruleset, RulesetAttr, RulesetCreatedAttr,
    RulesetStatus, Scope,
};
use rustix::process::{Gid, Resource, Rlimit, Uid};

/// The exit code of a jail that could not confine its program.
pub const EXIT_JAIL: u8 = 125;

/// The names init's arguments give the limits, with the resource each sets.
const LIMITS: [(&str, Resource); 6] = [
    ("--cpu", Resource::Cpu),
    ("--as", Resource::As),
    ("--data", Resource::Data),
    ("--fsize", Resource::Fsize),
    ("--nproc", Resource::Nproc),
    ("--nofile", Resource::Nofile),
];

/// The arguments that pass `limits` (all but the new-file bounds, which Baton counts
/// itself) to init.
pub(crate) fn limit_arguments(limits: &crate::settings::Limits) -> Vec<String> {
    let values = [
        limits.cpu_s,
        limits.address_space_bytes,
        limits.data_bytes,
        limits.file_bytes,
        limits.processes,
        limits.open_files,
    ];
    LIMITS
        .iter()
        .zip(values)
        .flat_map(|((name, _), v)| [(*name).to_owned(), v.to_string()])
        .collect()
}

/// What init was asked to do.
#[derive(Debug, Default)]
struct Order {
    uid: Option<u32>,
    gid: Option<u32>,
    limits: Vec<(Resource, u64)>,
    writable: Vec<OsString>,
    probe: bool,
    argv: Vec<OsString>,
}

/// A uid or gid given as a number.
fn id(name: &str, value: u64) -> Result<u32, String> {
    u32::try_from(value).map_err(|_| format!("{name} {value} is not a uid or gid"))
}

fn parse(args: &[OsString]) -> Result<Order, String> {
    let mut order = Order::default();
    let mut it = args.iter();
    let number = |name: &str, value: Option<&OsString>| -> Result<u64, String> {
        value
            .and_then(|v| v.to_str())
            .and_then(|v| v.parse().ok())
            .ok_or_else(|| format!("{name} needs a number"))
    };
    while let Some(arg) = it.next() {
        let Some(word) = arg.to_str() else {
            return Err(format!("unexpected argument {}", arg.to_string_lossy()));
        };
        match word {
            "--" => {
                order.argv = it.cloned().collect();
                break;
            }
            "--probe" => order.probe = true,
            "--uid" => order.uid = Some(id(word, number(word, it.next())?)?),
            "--gid" => order.gid = Some(id(word, number(word, it.next())?)?),
            "--write" => order.writable.push(it.next().cloned().ok_or("--write needs a path")?),
            _ => match LIMITS.iter().find(|(name, _)| *name == word) {
                Some((_, resource)) => order.limits.push((*resource, number(word, it.next())?)),
                None => return Err(format!("unexpected argument {word}")),
            },
        }
    }
    if !order.probe && order.argv.is_empty() {
        return Err("no program to run after `--`".to_owned());
    }
    Ok(order)
}

/// Runs init: `args` are the arguments after [`crate::INIT_ARG`]. Returns only when the
/// program could not be started (or after a probe).
pub fn main(args: &[OsString]) -> ExitCode {
    match confine_and_exec(args) {
        Ok(code) => code,
        Err(e) => {
            #[allow(clippy::print_stderr)]
            {
                eprintln!("baton jail: {e}");
            }
            ExitCode::from(EXIT_JAIL)
        }
    }
}

fn confine_and_exec(args: &[OsString]) -> Result<ExitCode, String> {
    let order = parse(args)?;
    if let (Some(uid), Some(gid)) = (order.uid, order.gid) {
        drop_to(uid, gid)?;
        user_namespace_of_one(uid, gid)?;
    }
    rustix::thread::set_no_new_privs(true).map_err(|e| format!("no_new_privs: {e}"))?;
    for (resource, value) in &order.limits {
        let limit = Rlimit { current: Some(*value), maximum: Some(*value) };
        rustix::process::setrlimit(*resource, limit)
            .map_err(|e| format!("cannot set the limit {resource:?} to {value}: {e}"))?;
    }
    rustix::process::setrlimit(Resource::Core, Rlimit { current: Some(0), maximum: Some(0) })
        .map_err(|e| format!("cannot turn core dumps off: {e}"))?;
    let landlock = landlock(&order.writable)?;
    if order.probe {
        #[allow(clippy::print_stdout)]
        {
            println!("jail: {landlock}");
        }
        return Ok(ExitCode::SUCCESS);
    }
    let Some((program, args)) = order.argv.split_first() else {
        return Err("no program to run".to_owned());
    };
    let error = std::process::Command::new(program).args(args).exec();
    Err(format!("cannot run `{}`: {error}", program.to_string_lossy()))
}

/// Drops every group and capability: the process becomes `uid`/`gid`, for good. The
/// bounding set is emptied first (bwrap leaves it full), so that nothing it runs can ever
/// hold a capability again.
fn drop_to(uid: u32, gid: u32) -> Result<(), String> {
    empty_bounding_set();
    let (uid, gid) = (Uid::from_raw(uid), Gid::from_raw(gid));
    rustix::thread::set_thread_groups(&[]).map_err(|e| format!("cannot drop groups: {e}"))?;
    rustix::thread::set_thread_res_gid(gid, gid, gid)
        .map_err(|e| format!("cannot become gid {}: {e}", gid.as_raw()))?;
    rustix::thread::set_thread_res_uid(uid, uid, uid)
        .map_err(|e| format!("cannot become uid {}: {e}", uid.as_raw()))?;
    if rustix::process::getuid() != uid || rustix::process::geteuid() != uid {
        return Err("the uid did not change".to_owned());
    }
    clear_capabilities()
}

/// Empties the capability bounding set (bits the kernel does not know are refused with
/// EINVAL: nothing to drop there).
fn empty_bounding_set() {
    use rustix::thread::CapabilitySet;
    for bit in 0..64 {
        let _ = rustix::thread::remove_capability_from_bounding_set(
            CapabilitySet::from_bits_retain(1 << bit),
        );
    }
}

/// Clears the effective, permitted and inheritable capabilities.
fn clear_capabilities() -> Result<(), String> {
    use rustix::thread::{CapabilitySet, CapabilitySets};
    let none = CapabilitySet::empty();
    rustix::thread::set_capabilities(
        None,
        CapabilitySets { effective: none, permitted: none, inheritable: none },
    )
    .map_err(|e| format!("cannot clear the capabilities: {e}"))
}

/// When Baton is root, bwrap ran privileged, without a user namespace: the program gets
/// one here, of its own uid and gid alone, in which no further user namespace may be made
/// (`user.max_user_namespaces` 0) — so it cannot become root of a namespace of its own and
/// reach the kernel code only such a root reaches. Single-threaded, so `unshare` is sound.
fn user_namespace_of_one(uid: u32, gid: u32) -> Result<(), String> {
    // Changing uids made this process non-dumpable, its /proc entries root's: it could
    // not write its own maps. (Its `exec` sets this again as for any program.)
    rustix::process::set_dumpable_behavior(rustix::process::DumpableBehavior::Dumpable)
        .map_err(|e| format!("cannot write its own /proc entries: {e}"))?;
    #[allow(deprecated)]
    rustix::thread::unshare(rustix::thread::UnshareFlags::NEWUSER)
        .map_err(|e| format!("cannot make a user namespace: {e}"))?;
    let write = |file: &str, text: String| {
        std::fs::write(file, text).map_err(|e| format!("cannot write {file}: {e}"))
    };
    write("/proc/self/setgroups", "deny".to_owned())?;
    write("/proc/self/uid_map", format!("{uid} {uid} 1"))?;
    write("/proc/self/gid_map", format!("{gid} {gid} 1"))?;
    write("/proc/sys/user/max_user_namespaces", "0".to_owned())?;
    // A new user namespace gives its maker every capability in it: none are kept.
    empty_bounding_set();
    clear_capabilities()
}

/// Landlock: reading and running anywhere in the view, writing below `writable` only, and
/// in `/dev` to the devices there (no new files); no abstract unix socket and no signal
/// outside the jail (where the kernel scopes them). Says how far it holds; a kernel
/// without Landlock is not an error (the mount namespace is the first wall).
fn landlock(writable: &[OsString]) -> Result<String, String> {
    let abi = ABI::V6;
    let read = AccessFs::from_read(abi);
    let all = AccessFs::from_all(abi);
    let fail = |e: landlock::RulesetError| format!("landlock: {e}");
    let open = |path: &std::ffi::OsStr| {
        PathFd::new(path).map_err(|e| format!("landlock: {}: {e}", path.to_string_lossy()))
    };
    let devices = read | AccessFs::WriteFile | AccessFs::Truncate;
    let mut ruleset = Ruleset::default()
        .handle_access(all)
        .map_err(fail)?
        .scope(Scope::AbstractUnixSocket | Scope::Signal)
        .map_err(fail)?
        .create()
        .map_err(fail)?
        .add_rule(PathBeneath::new(open("/".as_ref())?, read))
        .map_err(fail)?
        .add_rule(PathBeneath::new(open("/dev".as_ref())?, devices))
        .map_err(fail)?;
    for path in writable {
        ruleset = ruleset.add_rule(PathBeneath::new(open(path)?, all)).map_err(fail)?;
    }
    let status = ruleset.restrict_self().map_err(fail)?;
    Ok(match status.ruleset {
        RulesetStatus::FullyEnforced => "landlock enforced".to_owned(),
        RulesetStatus::PartiallyEnforced => {
            "landlock partly enforced (older kernel ABI)".to_owned()
        }
        RulesetStatus::NotEnforced => "landlock not available in this kernel".to_owned(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn words(text: &str) -> Vec<OsString> {
        text.split_whitespace().map(OsString::from).collect()
    }

    #[test]
    fn arguments_round_trip_and_the_program_follows_the_separator() {
        let limits = crate::settings::Limits {
            cpu_s: 5,
            address_space_bytes: 6,
            data_bytes: 7,
            file_bytes: 8,
            processes: 9,
            open_files: 10,
            new_files: 11,
            new_bytes: 12,
        };
        let mut args: Vec<OsString> =
            limit_arguments(&limits).into_iter().map(OsString::from).collect();
        args.extend(words("--uid 65534 --gid 65533 --write /ws -- sh -c --uid"));
        let order = parse(&args).expect("parses");
        assert_eq!(order.uid, Some(65534));
        assert_eq!(order.gid, Some(65533));
        assert_eq!(order.limits.len(), 6);
        assert_eq!(order.limits[0].1, 5);
        assert_eq!(order.writable, words("/ws"));
        assert_eq!(order.argv, words("sh -c --uid"));
    }

    #[test]
    fn bad_arguments_are_refused_with_what_is_wrong() {
        assert!(
            parse(&words("--cpu x -- true")).expect_err("refused").contains("--cpu needs a number")
        );
        assert!(parse(&words("--bogus -- true")).expect_err("refused").contains("--bogus"));
        assert!(parse(&words("--cpu 1")).expect_err("refused").contains("no program"));
        assert!(parse(&words("--probe")).is_ok());
    }
}

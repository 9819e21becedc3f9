//! The workspace against a real temporary directory and real git: escape attempts that
//! must all fail without reading, creating or changing anything outside the workspace,
//! then the file tools, the snapshots and the seeding.

use std::collections::{BTreeMap, BTreeSet};
use std::os::unix::fs::{PermissionsExt, symlink};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::time::Duration;

use baton_engine::workspace::{FILE_TOOLS, ToolOutcome, Workspace, WorkspaceRequest, Workspaces};
use baton_workspace::sandbox::{LIST_ENTRIES_MAX, READ_BYTES_MAX, TOOLS, WRITE_BYTES_MAX};
use baton_workspace::{LocalWorkspaces, SEED_BYTES_MAX, snapshot_key};
use serde_json::{Value, json};
use tempfile::TempDir;

const SECRET: &str = "TOP-SECRET-42";

/// A temporary directory holding `outside/` (with a secret), `runs/x` (a secret next to
/// the workspace) and the workspace `runs/run-1`.
struct Fixture {
    _tmp: TempDir,
    top: PathBuf,
    ws: Arc<dyn Workspace>,
}

impl Fixture {
    fn new() -> Self {
        Self::with_seed(None)
    }

    fn with_seed(seed: Option<PathBuf>) -> Self {
        let tmp = tempfile::tempdir().expect("temp dir");
        let top = std::fs::canonicalize(tmp.path()).expect("canonical temp dir");
        std::fs::create_dir_all(top.join("outside")).expect("mkdir outside");
        std::fs::write(top.join("outside/secret.txt"), format!("{SECRET}\n")).expect("secret");
        std::fs::create_dir_all(top.join("runs")).expect("mkdir runs");
        std::fs::write(top.join("runs/x"), format!("{SECRET} next door\n")).expect("x");
        let ws = open(&top.join("runs"), "run-1", seed);
        Fixture { _tmp: tmp, top, ws }
    }

    fn root(&self) -> &Path {
        self.ws.root()
    }

    fn run(&self, tool: &str, args: Value) -> ToolOutcome {
        self.run_touching(tool, args, &mut BTreeSet::new(), 100)
    }

    fn run_touching(
        &self,
        tool: &str,
        args: Value,
        touched: &mut BTreeSet<String>,
        max: usize,
    ) -> ToolOutcome {
        run_with_timeout(&self.ws, tool, args, touched, max)
    }

    /// Everything under the temporary directory except the workspace: kind, link target
    /// and content of each entry.
    fn outside_tree(&self) -> BTreeMap<PathBuf, String> {
        let mut tree = BTreeMap::new();
        walk(&self.top, self.root(), &mut tree);
        tree
    }

    fn git(&self, args: &[&str]) -> String {
        let output = Command::new("git")
            .arg("--git-dir")
            .arg(git_dir(&self.top.join("runs"), self.root()))
            .arg("--work-tree")
            .arg(self.root())
            .args(args)
            .env("GIT_CONFIG_GLOBAL", "/dev/null")
            .env("GIT_CONFIG_NOSYSTEM", "1")
            .output()
            .expect("git runs");
        assert!(
            output.status.success(),
            "git {args:?}: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        String::from_utf8_lossy(&output.stdout).trim().to_owned()
    }
}

/// Workspaces under `root`, their snapshots in `root/.snapshots` (beside the workspaces,
/// never inside one: run ids cannot start with a dot).
fn workspaces(root: &Path) -> LocalWorkspaces {
    LocalWorkspaces::new(root, root.join(".snapshots"))
}

/// The snapshot repository of the workspace `root` opened under `runs`.
fn git_dir(runs: &Path, root: &Path) -> PathBuf {
    runs.join(".snapshots").join(snapshot_key(root)).join("git")
}

fn open(root: &Path, run_id: &str, seed: Option<PathBuf>) -> Arc<dyn Workspace> {
    workspaces(root)
        .open(&WorkspaceRequest { run_id: run_id.to_owned(), dir: None, seed })
        .expect("workspace opens")
}

/// Runs a tool on another thread; fails the test if it takes more than ten seconds (a
/// tool that opened a pipe would block forever).
fn run_with_timeout(
    ws: &Arc<dyn Workspace>,
    tool: &str,
    args: Value,
    touched: &mut BTreeSet<String>,
    max: usize,
) -> ToolOutcome {
    let (send, receive) = mpsc::channel();
    let ws = Arc::clone(ws);
    let tool = tool.to_owned();
    let mut set = std::mem::take(touched);
    std::thread::spawn(move || {
        let outcome = ws.execute(&tool, &args, &mut set, max);
        let _ = send.send((outcome, set));
    });
    let (outcome, set) = receive.recv_timeout(Duration::from_secs(10)).expect("tool hung");
    *touched = set;
    outcome
}

fn walk(dir: &Path, skip: &Path, tree: &mut BTreeMap<PathBuf, String>) {
    let mut entries: Vec<_> =
        std::fs::read_dir(dir).expect("read_dir").map(|e| e.expect("entry").path()).collect();
    entries.sort();
    for path in entries {
        if path == skip {
            continue;
        }
        let metadata = std::fs::symlink_metadata(&path).expect("metadata");
        let description = if metadata.file_type().is_symlink() {
            format!("link {}", std::fs::read_link(&path).expect("link").display())
        } else if metadata.is_dir() {
            walk(&path, skip, tree);
            "dir".to_owned()
        } else {
            format!("file {:?}", std::fs::read(&path).expect("read"))
        };
        tree.insert(path, description);
    }
}

fn ok(outcome: &ToolOutcome) -> &str {
    assert!(!outcome.is_error, "unexpected error: {}", outcome.content);
    &outcome.content
}

fn err(outcome: &ToolOutcome) -> &str {
    assert!(outcome.is_error, "expected an error, got: {}", outcome.content);
    &outcome.content
}

fn mkfifo(path: &Path) {
    let status = Command::new("mkfifo").arg(path).status().expect("mkfifo runs");
    assert!(status.success());
}

// ---------------------------------------------------------------------------------------
// Escapes

#[test]
fn escape_attempts_all_fail_and_leave_the_outside_alone() {
    let f = Fixture::new();
    let root = f.root().to_path_buf();
    let top = f.top.clone();
    // What earlier levels (or a hostile seed) might have left in the workspace.
    std::fs::create_dir_all(root.join("somedir")).expect("mkdir");
    std::fs::write(root.join("somedir/file.txt"), "inside\n").expect("write");
    std::fs::create_dir_all(root.join(".git")).expect("mkdir .git");
    std::fs::write(root.join(".git/config"), "[core]\n").expect("write .git/config");
    symlink("/etc", root.join("etc_link")).expect("symlink");
    symlink("..", root.join("up")).expect("symlink");
    symlink(top.join("outside/secret.txt"), root.join("secret_link")).expect("symlink");
    symlink("../../outside/secret.txt", root.join("rel_secret")).expect("symlink");
    symlink(top.join("outside"), root.join("outside_link")).expect("symlink");
    symlink("/proc/self/environ", root.join("environ_link")).expect("symlink");
    symlink("/dev/zero", root.join("zero_link")).expect("symlink");
    mkfifo(&root.join("pipe"));

    let long = "a/".repeat(2500);
    let deep = "d/".repeat(100) + "f";
    let cases: Vec<(&str, &str, Value, &str)> = vec![
        ("dot-dot", "read_file", json!({"path": "../x"}), "\"..\""),
        ("dot-dot inside", "read_file", json!({"path": "a/../../x"}), "\"..\""),
        ("dot-slash dot-dot", "read_file", json!({"path": "./../x"}), "\"..\""),
        ("two levels up", "read_file", json!({"path": "../../outside/secret.txt"}), "\"..\""),
        ("absolute /etc/passwd", "read_file", json!({"path": "/etc/passwd"}), "absolute"),
        ("absolute parent file", "read_file", json!({"path": top.join("runs/x")}), "absolute"),
        (
            "absolute inside",
            "read_file",
            json!({"path": root.join("somedir/file.txt")}),
            "absolute",
        ),
        ("drive letter", "write_file", json!({"path": "C:/x", "content": "x"}), "absolute"),
        ("nul byte", "read_file", json!({"path": "somedir/file.txt\0../../x"}), "NUL byte"),
        (".git/config", "read_file", json!({"path": ".git/config"}), "inside .git"),
        (
            ".git hook",
            "write_file",
            json!({"path": ".git/hooks/pre-commit", "content": "x"}),
            "inside .git",
        ),
        (".baton read", "read_file", json!({"path": ".baton/git/HEAD"}), "inside .baton"),
        (
            ".baton write",
            "write_file",
            json!({"path": ".baton/git/HEAD", "content": "x"}),
            "inside .baton",
        ),
        (".baton list", "list_dir", json!({"path": ".baton"}), "inside .baton"),
        ("link to /etc", "read_file", json!({"path": "etc_link/passwd"}), "leads outside"),
        (
            "link to .. write",
            "write_file",
            json!({"path": "up/escaped.txt", "content": "x"}),
            "leads outside",
        ),
        (
            "link to .. overwrite",
            "write_file",
            json!({"path": "up/x", "content": "x"}),
            "leads outside",
        ),
        (
            "link to .. edit",
            "edit_file",
            json!({"path": "up/x", "old_string": "TOP", "new_string": "x"}),
            "leads outside",
        ),
        ("link to .. delete", "delete_file", json!({"path": "up/x"}), "leads outside"),
        ("link to .. list", "list_dir", json!({"path": "up"}), "leads outside"),
        ("link to file read", "read_file", json!({"path": "secret_link"}), "leads outside"),
        (
            "link to file write",
            "write_file",
            json!({"path": "secret_link", "content": "x"}),
            "symbolic link",
        ),
        (
            "link to file edit",
            "edit_file",
            json!({"path": "secret_link", "old_string": "TOP", "new_string": "x"}),
            "symbolic link",
        ),
        ("relative link read", "read_file", json!({"path": "rel_secret"}), "leads outside"),
        (
            "relative link write",
            "write_file",
            json!({"path": "rel_secret", "content": "x"}),
            "symbolic link",
        ),
        (
            "link to dir write",
            "write_file",
            json!({"path": "outside_link/new.txt", "content": "x"}),
            "leads outside",
        ),
        ("link to dir list", "list_dir", json!({"path": "outside_link"}), "leads outside"),
        (
            "link to dir read",
            "read_file",
            json!({"path": "outside_link/secret.txt"}),
            "leads outside",
        ),
        ("proc environ", "read_file", json!({"path": "/proc/self/environ"}), "absolute"),
        ("link to proc environ", "read_file", json!({"path": "environ_link"}), "leads outside"),
        (
            "link to /dev/zero",
            "read_file",
            json!({"path": "zero_link", "start_line": 1}),
            "leads outside",
        ),
        ("fifo read", "read_file", json!({"path": "pipe"}), "named pipe"),
        ("fifo write", "write_file", json!({"path": "pipe", "content": "x"}), "named pipe"),
        (
            "fifo edit",
            "edit_file",
            json!({"path": "pipe", "old_string": "a", "new_string": "b"}),
            "named pipe",
        ),
        ("fifo delete", "delete_file", json!({"path": "pipe"}), "named pipe"),
        ("directory read", "read_file", json!({"path": "somedir"}), "is a directory"),
        ("directory delete", "delete_file", json!({"path": "somedir"}), "is a directory"),
        ("root read", "read_file", json!({"path": "."}), "workspace root"),
        ("very long path", "read_file", json!({"path": long}), "4096 bytes"),
        (
            "too many components",
            "write_file",
            json!({"path": deep, "content": "x"}),
            "limited to 64",
        ),
        ("list ..", "list_dir", json!({"path": ".."}), "\"..\""),
        ("list /", "list_dir", json!({"path": "/"}), "absolute"),
        ("write ../x", "write_file", json!({"path": "../x", "content": "x"}), "\"..\""),
        ("write next door", "write_file", json!({"path": "../new.txt", "content": "x"}), "\"..\""),
        (
            "edit outside",
            "edit_file",
            json!({"path": "../../outside/secret.txt", "old_string": "TOP", "new_string": "x"}),
            "\"..\"",
        ),
        ("delete outside", "delete_file", json!({"path": "../../outside/secret.txt"}), "\"..\""),
        ("empty path", "read_file", json!({"path": ""}), "empty"),
    ];
    assert!(cases.len() >= 20);

    let before = f.outside_tree();
    for (name, tool, args, reason) in cases {
        let outcome = f.run(tool, args);
        assert!(outcome.is_error, "{name}: succeeded: {}", outcome.content);
        assert!(outcome.content.contains(reason), "{name}: not {reason:?}: {}", outcome.content);
        assert!(!outcome.content.contains(SECRET), "{name}: leaked: {}", outcome.content);
        assert!(!outcome.content.contains("root:"), "{name}: leaked /etc/passwd");
        assert_eq!(outcome.created, None, "{name}");
        assert_eq!(f.outside_tree(), before, "{name}: changed something outside");
    }
    // The pipe is still a pipe and the links are still links.
    assert!(std::fs::symlink_metadata(root.join("up")).expect("up").file_type().is_symlink());
    assert!(std::fs::symlink_metadata(root.join("secret_link")).expect("link").is_symlink());
}

#[test]
fn deleting_a_link_to_outside_removes_the_link_only() {
    let f = Fixture::new();
    let root = f.root().to_path_buf();
    symlink(f.top.join("outside/secret.txt"), root.join("secret_link")).expect("symlink");
    symlink("..", root.join("up")).expect("symlink");
    let before = f.outside_tree();
    for link in ["secret_link", "up"] {
        let outcome = f.run("delete_file", json!({"path": link}));
        ok(&outcome);
        assert!(std::fs::symlink_metadata(root.join(link)).is_err(), "{link} still there");
    }
    assert_eq!(f.outside_tree(), before);
    assert_eq!(
        std::fs::read_to_string(f.top.join("outside/secret.txt")).expect("target"),
        format!("{SECRET}\n")
    );
}

#[test]
fn a_directory_swapped_for_a_link_never_lets_a_write_out() {
    let f = Fixture::new();
    let root = f.root().to_path_buf();
    let outside = f.top.join("outside");
    std::fs::create_dir(root.join("real")).expect("mkdir");
    symlink(&outside, root.join("link")).expect("symlink");
    let before = f.outside_tree();

    let stop = Arc::new(AtomicBool::new(false));
    let swapper = {
        let stop = Arc::clone(&stop);
        let root = root.clone();
        std::thread::spawn(move || {
            let swap = root.join("swap");
            while !stop.load(Ordering::Relaxed) {
                // Errors are expected: a write may have created `swap` in between.
                let _ = std::fs::rename(root.join("real"), &swap);
                let _ = std::fs::rename(&swap, root.join("real"));
                let _ = std::fs::rename(root.join("link"), &swap);
                let _ = std::fs::rename(&swap, root.join("link"));
            }
        })
    };
    let mut written = 0;
    for i in 0..2000 {
        let outcome = f.ws.execute(
            "write_file",
            &json!({"path": "swap/f", "content": format!("{i}\n")}),
            &mut BTreeSet::new(),
            10,
        );
        written += usize::from(!outcome.is_error);
        if i % 100 == 0 {
            assert_eq!(f.outside_tree(), before, "after write {i}");
        }
    }
    stop.store(true, Ordering::Relaxed);
    swapper.join().expect("swapper");
    assert_eq!(f.outside_tree(), before);
    assert!(!outside.join("f").exists());
    // Some writes landed inside (in `swap` or `real`), none outside.
    assert!(written > 0, "no write succeeded");
}

#[test]
fn reading_a_fifo_is_refused_without_hanging() {
    let f = Fixture::new();
    mkfifo(&f.root().join("pipe"));
    let outcome = f.run("read_file", json!({"path": "pipe"}));
    assert!(err(&outcome).contains("not a regular file"), "{}", outcome.content);
    let outcome = f.run("read_file", json!({"path": "pipe", "start_line": 1, "end_line": 2}));
    err(&outcome);
}

// ---------------------------------------------------------------------------------------
// The file tools

#[test]
fn read_file_returns_line_ranges() {
    let f = Fixture::new();
    std::fs::write(f.root().join("five.txt"), "one\ntwo\nthree\nfour\nfive\n").expect("write");
    let read = |args: Value| f.run("read_file", args);
    assert_eq!(ok(&read(json!({"path": "five.txt"}))), "one\ntwo\nthree\nfour\nfive\n");
    assert_eq!(
        ok(&read(json!({"path": "./five.txt", "start_line": 2, "end_line": 3}))),
        "two\nthree\n"
    );
    assert_eq!(ok(&read(json!({"path": "five.txt", "start_line": 4}))), "four\nfive\n");
    assert_eq!(ok(&read(json!({"path": "five.txt", "end_line": 1}))), "one\n");
    assert_eq!(ok(&read(json!({"path": "five.txt", "start_line": 5, "end_line": 99}))), "five\n");
    assert_eq!(
        ok(&read(json!({"path": "five.txt", "start_line": null}))),
        "one\ntwo\nthree\nfour\nfive\n"
    );

    let past = read(json!({"path": "five.txt", "start_line": 6}));
    assert_eq!(err(&past), "start_line 6 is past the end of \"five.txt\", which has 5 lines");
    assert!(
        err(&read(json!({"path": "five.txt", "start_line": 3, "end_line": 2}))).contains("before")
    );
    assert!(err(&read(json!({"path": "five.txt", "start_line": 0}))).contains("start_line"));
    let typed = read(json!({"path": "five.txt", "start_line": "2"}));
    assert_eq!(
        err(&typed),
        "argument start_line must be a positive integer (lines count from 1), not a string"
    );
    assert_eq!(err(&read(json!({}))), "missing argument path (a string)");
    assert_eq!(err(&read(json!({"path": 3}))), "argument path must be a string, not a number");
    assert!(err(&read(json!({"path": "five.txt", "encoding": "utf8"}))).contains("encoding"));
    assert!(err(&read(json!(["five.txt"]))).contains("JSON object"));
    assert!(err(&read(json!({"path": "missing.txt"}))).contains("\"missing.txt\" does not exist"));

    std::fs::write(f.root().join("empty.txt"), "").expect("write");
    assert_eq!(ok(&read(json!({"path": "empty.txt"}))), "(empty.txt is empty)");
    std::fs::write(f.root().join("no_newline.txt"), "a\nb").expect("write");
    assert_eq!(ok(&read(json!({"path": "no_newline.txt", "start_line": 2}))), "b");
}

#[test]
fn read_file_is_bounded() {
    let f = Fixture::new();
    let line = "x".repeat(99) + "\n";
    let big = line.repeat(READ_BYTES_MAX / 100 + 100);
    std::fs::write(f.root().join("big.txt"), &big).expect("write");
    let whole = f.run("read_file", json!({"path": "big.txt"}));
    assert!(err(&whole).contains("start_line and end_line"), "{}", whole.content);
    let part = f.run("read_file", json!({"path": "big.txt", "start_line": 10, "end_line": 11}));
    assert_eq!(ok(&part), line.repeat(2));
    let rest = f.run("read_file", json!({"path": "big.txt", "start_line": 1}));
    let text = ok(&rest);
    assert!(text.len() < READ_BYTES_MAX + 200);
    assert!(text.contains("truncated"), "no truncation note");
    assert!(text.contains(&format!("start_line {}", READ_BYTES_MAX / 100 + 1)));

    // One long line of multi-byte characters, cut by the cap: still valid UTF-8.
    std::fs::write(f.root().join("wide.txt"), "é".repeat(READ_BYTES_MAX)).expect("write");
    let wide = f.run("read_file", json!({"path": "wide.txt", "start_line": 1}));
    assert!(ok(&wide).contains("truncated"));
}

#[test]
fn binary_files_are_refused() {
    let f = Fixture::new();
    std::fs::write(f.root().join("blob.bin"), [0xff, 0xfe, 0x00, 0x80]).expect("write");
    let outcome = f.run("read_file", json!({"path": "blob.bin"}));
    assert!(err(&outcome).contains("binary"), "{}", outcome.content);
    let edit =
        f.run("edit_file", json!({"path": "blob.bin", "old_string": "a", "new_string": "b"}));
    assert!(err(&edit).contains("binary"));
}

#[test]
fn write_file_creates_parents_and_reports_created() {
    let f = Fixture::new();
    let mut touched = BTreeSet::new();
    let outcome = f.run_touching(
        "write_file",
        json!({"path": "./a//b/c.txt", "content": "hello\n"}),
        &mut touched,
        10,
    );
    assert_eq!(ok(&outcome), "created a/b/c.txt (6 bytes)");
    assert_eq!(outcome.created.as_deref(), Some("a/b/c.txt"));
    assert_eq!(std::fs::read_to_string(f.root().join("a/b/c.txt")).expect("read"), "hello\n");
    assert_eq!(touched, BTreeSet::from(["a/b/c.txt".to_owned()]));

    let again = f.run_touching(
        "write_file",
        json!({"path": "a/b/c.txt", "content": "bye\n"}),
        &mut touched,
        10,
    );
    assert_eq!(ok(&again), "wrote 4 bytes to a/b/c.txt");
    assert_eq!(again.created, None);
    assert_eq!(std::fs::read_to_string(f.root().join("a/b/c.txt")).expect("read"), "bye\n");
    assert_eq!(touched.len(), 1);
    // No temporary files are left behind.
    let names: Vec<_> = std::fs::read_dir(f.root().join("a/b"))
        .expect("read_dir")
        .map(|e| e.expect("entry").file_name())
        .collect();
    assert_eq!(names, ["c.txt"]);
    let missing = f.run("write_file", json!({"path": "x.txt"}));
    assert_eq!(err(&missing), "missing argument content (a string)");
}

#[test]
fn writes_keep_a_files_permissions() {
    let f = Fixture::new();
    let script = f.root().join("run.sh");
    std::fs::write(&script, "echo one\n").expect("write");
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    ok(&f.run("edit_file", json!({"path": "run.sh", "old_string": "one", "new_string": "two"})));
    ok(&f.run("write_file", json!({"path": "run.sh", "content": "echo three\n"})));
    let mode = std::fs::metadata(&script).expect("metadata").permissions().mode();
    assert_eq!(mode & 0o777, 0o755);
}

#[test]
fn oversized_writes_are_refused() {
    let f = Fixture::new();
    let mut touched = BTreeSet::new();
    let content = "x".repeat(WRITE_BYTES_MAX + 1);
    let outcome = f.run_touching(
        "write_file",
        json!({"path": "big.txt", "content": content}),
        &mut touched,
        10,
    );
    assert!(err(&outcome).contains("limit"));
    assert!(!f.root().join("big.txt").exists());
    assert!(touched.is_empty());

    std::fs::write(f.root().join("almost.txt"), "x".repeat(WRITE_BYTES_MAX - 1) + "A")
        .expect("write");
    let grow =
        f.run("edit_file", json!({"path": "almost.txt", "old_string": "A", "new_string": "BB"}));
    assert!(err(&grow).contains("limit"));
}

#[test]
fn edit_file_needs_exactly_one_occurrence() {
    let f = Fixture::new();
    std::fs::write(f.root().join("m.rs"), "fn a() {}\nfn b() {}\nfn a2() {}\n").expect("write");
    let edit = |old: &str, new: &str| {
        f.run("edit_file", json!({"path": "m.rs", "old_string": old, "new_string": new}))
    };
    let mut touched = BTreeSet::new();
    let outcome = f.run_touching(
        "edit_file",
        json!({"path": "m.rs", "old_string": "fn b()", "new_string": "fn bee()"}),
        &mut touched,
        10,
    );
    assert_eq!(ok(&outcome), "edited m.rs at line 2");
    assert_eq!(touched, BTreeSet::from(["m.rs".to_owned()]));
    assert_eq!(
        std::fs::read_to_string(f.root().join("m.rs")).expect("read"),
        "fn a() {}\nfn bee() {}\nfn a2() {}\n"
    );
    assert_eq!(
        err(&edit("fn c()", "x")),
        "old_string was not found in \"m.rs\"; read the file and copy the exact text"
    );
    let twice = edit("fn a", "fn z");
    assert!(err(&twice).contains("occurs 2 times"), "{}", twice.content);
    assert!(twice.content.contains("more surrounding context"));
    assert!(err(&edit("", "x")).contains("empty"));
    assert!(err(&edit("fn a()", "fn a()")).contains("same"));
    let missing =
        f.run("edit_file", json!({"path": "nope.rs", "old_string": "a", "new_string": "b"}));
    assert!(err(&missing).contains("does not exist"));
}

#[test]
fn list_dir_sorts_hides_and_limits() {
    let f = Fixture::new();
    let root = f.root();
    std::fs::write(root.join("b.txt"), "").expect("write");
    std::fs::write(root.join("a.txt"), "").expect("write");
    std::fs::create_dir(root.join("c")).expect("mkdir");
    std::fs::create_dir(root.join(".git")).expect("mkdir");
    std::fs::write(root.join("c/inner.txt"), "").expect("write");
    assert_eq!(ok(&f.run("list_dir", json!({}))), "a.txt\nb.txt\nc/");
    assert_eq!(ok(&f.run("list_dir", json!({"path": "."}))), "a.txt\nb.txt\nc/");
    assert_eq!(ok(&f.run("list_dir", json!({"path": "c/"}))), "inner.txt");
    assert!(err(&f.run("list_dir", json!({"path": "a.txt"}))).contains("not a directory"));

    std::fs::create_dir(root.join("many")).expect("mkdir");
    for i in 0..LIST_ENTRIES_MAX + 10 {
        std::fs::write(root.join(format!("many/f{i:04}")), "").expect("write");
    }
    let listing = f.run("list_dir", json!({"path": "many"}));
    let lines: Vec<&str> = ok(&listing).lines().collect();
    assert_eq!(lines.len(), LIST_ENTRIES_MAX + 1);
    assert_eq!(lines[0], "f0000");
    assert_eq!(lines[LIST_ENTRIES_MAX - 1], format!("f{:04}", LIST_ENTRIES_MAX - 1));
    assert_eq!(lines[LIST_ENTRIES_MAX], "… 10 more");

    std::fs::create_dir(root.join("hollow")).expect("mkdir");
    assert_eq!(ok(&f.run("list_dir", json!({"path": "hollow"}))), "(hollow is empty)");
}

#[test]
fn delete_file_deletes_files_only() {
    let f = Fixture::new();
    std::fs::create_dir(f.root().join("d")).expect("mkdir");
    std::fs::write(f.root().join("d/gone.txt"), "x").expect("write");
    let mut touched = BTreeSet::new();
    let outcome = f.run_touching("delete_file", json!({"path": "d/gone.txt"}), &mut touched, 10);
    assert_eq!(ok(&outcome), "deleted d/gone.txt");
    assert!(!f.root().join("d/gone.txt").exists());
    assert_eq!(touched, BTreeSet::from(["d/gone.txt".to_owned()]));
    assert!(err(&f.run("delete_file", json!({"path": "d"}))).contains("directory"));
    assert!(f.root().join("d").is_dir());
    assert!(err(&f.run("delete_file", json!({"path": "d/gone.txt"}))).contains("does not exist"));
}

#[test]
fn writes_stop_at_the_touched_limit() {
    let f = Fixture::new();
    let mut touched = BTreeSet::new();
    for path in ["a.txt", "b.txt"] {
        ok(&f.run_touching("write_file", json!({"path": path, "content": "x"}), &mut touched, 2));
    }
    let third =
        f.run_touching("write_file", json!({"path": "c.txt", "content": "x"}), &mut touched, 2);
    assert!(err(&third).contains("per-level limit of 2"), "{}", third.content);
    assert!(!f.root().join("c.txt").exists());
    let delete = f.run_touching("delete_file", json!({"path": "c.txt"}), &mut touched, 2);
    assert!(err(&delete).contains("per-level limit"));
    // Files already changed may change again.
    ok(&f.run_touching("write_file", json!({"path": "./a.txt", "content": "y"}), &mut touched, 2));
    ok(&f.run_touching(
        "edit_file",
        json!({"path": "b.txt", "old_string": "x", "new_string": "z"}),
        &mut touched,
        2,
    ));
    ok(&f.run_touching("delete_file", json!({"path": "b.txt"}), &mut touched, 2));
    assert_eq!(touched.len(), 2);
}

#[test]
fn unknown_tools_are_named() {
    let f = Fixture::new();
    let outcome = f.run("run_shell", json!({"command": "ls"}));
    assert_eq!(
        err(&outcome),
        "unknown tool \"run_shell\"; the file tools are read_file, write_file, edit_file, \
         list_dir, delete_file"
    );
}

#[test]
fn the_tools_are_the_engines_file_tools() {
    let engine: Vec<&str> = FILE_TOOLS.iter().copied().filter(|t| *t != "finish").collect();
    assert_eq!(engine, TOOLS);
}

#[test]
fn outcomes_do_not_depend_on_where_the_workspace_is() {
    let run_all = |f: &Fixture| {
        let calls = [
            ("write_file", json!({"path": "src/a.txt", "content": "one\ntwo\n"})),
            ("edit_file", json!({"path": "src/a.txt", "old_string": "two", "new_string": "2"})),
            ("read_file", json!({"path": "src/a.txt"})),
            ("list_dir", json!({"path": "src"})),
            ("read_file", json!({"path": "../x"})),
            ("read_file", json!({"path": "nope"})),
            ("read_file", json!({"path": "src"})),
            ("delete_file", json!({"path": "src/a.txt"})),
        ];
        calls.into_iter().map(|(tool, args)| f.run(tool, args)).collect::<Vec<_>>()
    };
    let (first, second) = (Fixture::new(), Fixture::new());
    let outcomes = run_all(&first);
    assert_eq!(outcomes, run_all(&second));
    for outcome in &outcomes {
        assert!(!outcome.content.contains(first.top.to_str().expect("utf-8 path")));
    }
}

// ---------------------------------------------------------------------------------------
// Snapshots

#[test]
fn restore_brings_back_files_and_keeps_ignored_output() {
    let f = Fixture::new();
    let root = f.root();
    std::fs::write(root.join("kept.txt"), "original\n").expect("write");
    std::fs::create_dir(root.join("src")).expect("mkdir");
    std::fs::write(root.join("src/lib.rs"), "// lib\n").expect("write");
    let snapshot = f.ws.snapshot("level 1 start").expect("snapshot");
    assert_eq!(snapshot.len(), 40);
    assert_eq!(f.git(&["rev-parse", "HEAD"]), snapshot);
    assert_eq!(
        f.git(&["log", "-1", "--format=%an <%ae> %s"]),
        "baton <baton@localhost> level 1 start"
    );

    std::fs::write(root.join("kept.txt"), "changed\n").expect("write");
    std::fs::remove_file(root.join("src/lib.rs")).expect("remove");
    std::fs::write(root.join("new.txt"), "new\n").expect("write");
    std::fs::create_dir_all(root.join("newdir/deep")).expect("mkdir");
    std::fs::write(root.join("newdir/deep/f"), "f").expect("write");
    std::fs::create_dir_all(root.join("target/debug")).expect("mkdir");
    std::fs::write(root.join("target/debug/app"), "binary").expect("write");
    std::fs::create_dir_all(root.join("pkg/__pycache__")).expect("mkdir");
    std::fs::write(root.join("pkg/__pycache__/m.pyc"), "pyc").expect("write");

    f.ws.restore(&snapshot).expect("restore");
    assert_eq!(std::fs::read_to_string(root.join("kept.txt")).expect("read"), "original\n");
    assert_eq!(std::fs::read_to_string(root.join("src/lib.rs")).expect("read"), "// lib\n");
    assert!(!root.join("new.txt").exists());
    assert!(!root.join("newdir").exists());
    assert_eq!(std::fs::read_to_string(root.join("target/debug/app")).expect("read"), "binary");
    assert!(root.join("pkg/__pycache__/m.pyc").exists());
    assert!(git_dir(&f.top.join("runs"), root).join("HEAD").exists());
    assert!(!root.join(".baton").exists(), "nothing of Baton's is in the workspace");

    // A later snapshot of an unchanged tree still gets its own id.
    let again = f.ws.snapshot("").expect("empty message");
    assert_ne!(again, snapshot);
    assert!(f.ws.restore("0123456789abcdef0123456789abcdef01234567").is_err());
    let nul = f.ws.snapshot("a\0b").expect_err("NUL in message");
    assert!(nul.message.contains("NUL"), "{}", nul.message);
    let bad = f.ws.restore("--hard").expect_err("not hex");
    assert!(bad.message.contains("not a snapshot id"), "{}", bad.message);
}

#[test]
fn branches_name_snapshots() {
    let f = Fixture::new();
    std::fs::write(f.root().join("a.txt"), "a").expect("write");
    let first = f.ws.snapshot("first").expect("snapshot");
    std::fs::write(f.root().join("a.txt"), "b").expect("write");
    let second = f.ws.snapshot("second").expect("snapshot");
    f.ws.branch("baton/run-1/level-2", &first).expect("branch");
    assert_eq!(f.git(&["rev-parse", "baton/run-1/level-2"]), first);
    f.ws.branch("baton/run-1/level-2", &second).expect("branch moves");
    assert_eq!(f.git(&["rev-parse", "baton/run-1/level-2"]), second);
    // No branch is checked out, so any valid name may be set, and HEAD stays put.
    for name in ["main", "master", "baton-unborn"] {
        f.ws.branch(name, &first).expect(name);
    }
    assert_eq!(f.git(&["rev-parse", "HEAD"]), second);
    for bad in ["a..b", "-x", "@{-1}", "has space", "", "end/"] {
        let error = f.ws.branch(bad, &first).expect_err(bad);
        assert!(error.message.contains("not a valid branch name"), "{bad}: {}", error.message);
    }
    assert!(f.ws.branch("ok", "beef").is_err());
}

// ---------------------------------------------------------------------------------------
// Snapshots the model cannot reach

/// A git config that runs `touch CANARY` whenever git refreshes an index with it.
fn hostile_config(canary: &Path) -> String {
    format!("[core]\n\tfsmonitor = touch {} #\n", canary.display())
}

#[test]
fn git_config_in_the_workspace_runs_nothing() {
    let f = Fixture::new();
    let root = f.root().to_path_buf();
    // What an older Baton left (`.baton/git`) and the project's own repository, both
    // with a config that runs a program: neither is the snapshot repository any more.
    let old = root.join(".baton/git");
    let status = Command::new("git")
        .args(["init", "-q", "--bare"])
        .arg(&old)
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        .status()
        .expect("git init");
    assert!(status.success());
    std::fs::write(old.join("config"), hostile_config(&f.top.join("canary-old"))).expect("write");
    let status = Command::new("git")
        .args(["init", "-q"])
        .current_dir(&root)
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        .status()
        .expect("git init");
    assert!(status.success());
    std::fs::write(root.join(".git/config"), hostile_config(&f.top.join("canary-project")))
        .expect("write");
    std::fs::write(root.join("a.txt"), "a").expect("write");

    let snapshot = f.ws.snapshot("one").expect("snapshot");
    std::fs::write(root.join("a.txt"), "changed").expect("write");
    f.ws.restore(&snapshot).expect("restore");
    f.ws.snapshot("two").expect("snapshot");
    assert_eq!(std::fs::read_to_string(root.join("a.txt")).expect("read"), "a");
    assert!(!f.top.join("canary-old").exists(), "the old .baton/git config ran");
    assert!(!f.top.join("canary-project").exists(), "the project's .git config ran");

    // Positive control: the same config does run a program for git that reads it.
    let status = Command::new("git")
        .args(["add", "-A"])
        .current_dir(&root)
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        .status()
        .expect("git add");
    assert!(status.success());
    assert!(f.top.join("canary-project").exists(), "the hostile config is inert: no control");
}

#[test]
fn a_link_into_baton_internals_is_refused_however_spelled() {
    let f = Fixture::new();
    let root = f.root();
    std::fs::create_dir_all(root.join(".baton/git")).expect("mkdir");
    std::fs::write(root.join(".baton/git/config"), "[core]\n").expect("write");
    std::fs::create_dir_all(root.join(".git")).expect("mkdir");
    std::fs::write(root.join(".git/config"), "[core]\n").expect("write");
    // Links a user's workspace may already hold.
    symlink(".baton", root.join("b")).expect("symlink");
    symlink("b/git", root.join("c")).expect("symlink");
    std::fs::create_dir(root.join("d")).expect("mkdir");
    symlink("../.git", root.join("d/up")).expect("symlink");
    symlink(".baton/git/config", root.join("direct")).expect("symlink");
    for (tool, args) in [
        ("write_file", json!({"path": "b/git/config", "content": "[core]\n\tfsmonitor = x\n"})),
        ("write_file", json!({"path": "c/config", "content": "x"})),
        ("write_file", json!({"path": "./b//git/hooks/post-commit", "content": "x"})),
        ("edit_file", json!({"path": "b/git/config", "old_string": "[core]", "new_string": "x"})),
        ("write_file", json!({"path": "d/up/config", "content": "x"})),
        ("read_file", json!({"path": "b/git/config"})),
        ("read_file", json!({"path": "direct"})),
        ("list_dir", json!({"path": "c"})),
        ("delete_file", json!({"path": "c/config"})),
    ] {
        let outcome = f.run(tool, args.clone());
        let message = err(&outcome);
        assert!(message.contains(".baton") || message.contains(".git"), "{tool} {args}: {message}");
    }
    assert_eq!(std::fs::read_to_string(root.join(".baton/git/config")).expect("read"), "[core]\n");
    assert_eq!(std::fs::read_to_string(root.join(".git/config")).expect("read"), "[core]\n");
    assert!(!root.join(".baton/git/hooks").exists());
    // Positive control: a link to an ordinary directory still works.
    std::fs::create_dir(root.join("src")).expect("mkdir");
    symlink("src", root.join("s")).expect("symlink");
    ok(&f.run("write_file", json!({"path": "s/lib.rs", "content": "x"})));
    assert_eq!(std::fs::read_to_string(root.join("src/lib.rs")).expect("read"), "x");
}

#[test]
fn a_restore_ignores_the_workspaces_ignore_files() {
    let f = Fixture::new();
    let root = f.root();
    std::fs::write(root.join("kept.txt"), "original\n").expect("write");
    std::fs::write(root.join("crlf.txt"), "one\ntwo\n").expect("write");
    let snapshot = f.ws.snapshot("base").expect("snapshot");
    // What a model writes to keep its files through a cancel, or to change what a
    // restore writes back.
    ok(&f.run("write_file", json!({"path": ".gitignore", "content": "*\n"})));
    ok(&f.run("write_file", json!({"path": "sub/.gitignore", "content": "*\n!.gitignore\n"})));
    ok(&f.run("write_file", json!({"path": "sub/planted.py", "content": "evil\n"})));
    ok(&f.run("write_file", json!({"path": "planted.txt", "content": "evil\n"})));
    ok(&f.run("write_file", json!({"path": ".gitattributes", "content": "* text eol=crlf\n"})));
    ok(&f.run("write_file", json!({"path": "kept.txt", "content": "changed\n"})));
    std::fs::create_dir_all(root.join("nested/.git")).expect("mkdir");
    std::fs::write(root.join("nested/.git/HEAD"), "ref: refs/heads/main\n").expect("write");
    std::fs::write(root.join("nested/file"), "evil\n").expect("write");
    let middle = f.ws.snapshot("with ignore files").expect("snapshot");
    f.ws.restore(&snapshot).expect("restore");
    for planted in [".gitignore", "sub", "planted.txt", ".gitattributes", "nested"] {
        assert!(!root.join(planted).exists(), "{planted} survived the restore");
    }
    assert_eq!(std::fs::read_to_string(root.join("kept.txt")).expect("read"), "original\n");
    assert_eq!(std::fs::read(root.join("crlf.txt")).expect("read"), b"one\ntwo\n");
    // And the snapshot taken with the ignore files recorded every file, itself included.
    f.ws.restore(&middle).expect("restore");
    assert_eq!(std::fs::read_to_string(root.join("sub/planted.py")).expect("read"), "evil\n");
    assert_eq!(std::fs::read_to_string(root.join("planted.txt")).expect("read"), "evil\n");
    assert_eq!(std::fs::read(root.join("crlf.txt")).expect("read"), b"one\ntwo\n");
}

#[test]
fn the_tools_do_not_write_where_snapshots_do_not_look() {
    let f = Fixture::new();
    for path in ["target/x.rs", "a/node_modules/m.js", "p/__pycache__/m.py", "m.pyc"] {
        let outcome = f.run("write_file", json!({"path": path, "content": "x"}));
        let message = err(&outcome);
        assert!(message.contains("snapshots leave out"), "{path}: {message}");
        assert!(!f.root().join(path).exists(), "{path}");
    }
    std::fs::create_dir(f.root().join("target")).expect("mkdir");
    symlink("target", f.root().join("t")).expect("symlink");
    err(&f.run("write_file", json!({"path": "t/x.rs", "content": "x"})));
    // Reading build output is fine.
    std::fs::write(f.root().join("target/log"), "built\n").expect("write");
    assert!(ok(&f.run("read_file", json!({"path": "target/log"}))).contains("built"));
    ok(&f.run("write_file", json!({"path": "targets/x.rs", "content": "x"})));
}

#[test]
fn restoring_a_large_workspace_is_fast() {
    let f = Fixture::new();
    let root = f.root();
    for dir in 0..100 {
        let path = root.join(format!("d{dir}"));
        std::fs::create_dir(&path).expect("mkdir");
        for file in 0..200 {
            std::fs::write(path.join(format!("f{file}.txt")), format!("{dir} {file}\n"))
                .expect("write");
        }
    }
    let snapshot = f.ws.snapshot("20 000 files").expect("snapshot");
    std::fs::write(root.join("d3/f3.txt"), "changed").expect("write");
    std::fs::write(root.join("new.txt"), "new").expect("write");
    let started = std::time::Instant::now();
    f.ws.restore(&snapshot).expect("restore");
    let took = started.elapsed();
    assert_eq!(std::fs::read_to_string(root.join("d3/f3.txt")).expect("read"), "3 3\n");
    assert!(!root.join("new.txt").exists());
    assert!(took < Duration::from_secs(10), "restoring 20 000 files took {took:?}");
}

// ---------------------------------------------------------------------------------------
// Opening and seeding

fn make_seed(dir: &Path) {
    std::fs::create_dir_all(dir.join("src/nested")).expect("mkdir");
    std::fs::write(dir.join("README.md"), "# seed\n").expect("write");
    std::fs::write(dir.join("src/nested/deep.txt"), "deep\n").expect("write");
    std::fs::write(dir.join("run.sh"), "echo hi\n").expect("write");
    std::fs::set_permissions(dir.join("run.sh"), std::fs::Permissions::from_mode(0o755))
        .expect("chmod");
    std::fs::create_dir_all(dir.join(".git")).expect("mkdir");
    std::fs::write(dir.join(".git/config"), "[core]\n").expect("write");
    symlink("/etc/passwd", dir.join("passwd_link")).expect("symlink");
}

#[test]
fn a_seed_is_copied_into_a_new_workspace() {
    let seed_dir = tempfile::tempdir().expect("temp dir");
    make_seed(seed_dir.path());
    let f = Fixture::with_seed(Some(seed_dir.path().to_path_buf()));
    let root = f.root();
    assert_eq!(std::fs::read_to_string(root.join("README.md")).expect("read"), "# seed\n");
    assert_eq!(std::fs::read_to_string(root.join("src/nested/deep.txt")).expect("read"), "deep\n");
    let mode = std::fs::metadata(root.join("run.sh")).expect("metadata").permissions().mode();
    assert_eq!(mode & 0o777, 0o755);
    assert!(std::fs::symlink_metadata(root.join("passwd_link")).is_err(), "symlink copied");
    assert!(!root.join(".git").exists(), ".git copied");
    assert!(git_dir(&f.top.join("runs"), root).join("HEAD").exists());
    assert_eq!(f.git(&["check-ignore", "-q", "target/x"]), "");
    assert!(ok(&f.run("list_dir", json!({}))).starts_with("README.md\nrun.sh\nsrc/"));
}

#[test]
fn opening_again_neither_reseeds_nor_reinits() {
    let seed_dir = tempfile::tempdir().expect("temp dir");
    make_seed(seed_dir.path());
    let f = Fixture::with_seed(Some(seed_dir.path().to_path_buf()));
    ok(&f.run("delete_file", json!({"path": "README.md"})));
    ok(&f.run("delete_file", json!({"path": "run.sh"})));
    ok(&f.run("delete_file", json!({"path": "src/nested/deep.txt"})));
    let snapshot = f.ws.snapshot("emptied").expect("snapshot");
    let head = f.git(&["rev-parse", "HEAD"]);
    assert_eq!(head, snapshot);
    let root = f.root().to_path_buf();

    // While it is open, no one else may open it: one process drives a workspace.
    let busy = workspaces(&f.top.join("runs"))
        .open(&WorkspaceRequest { run_id: "run-1".to_owned(), dir: None, seed: None })
        .expect_err("the workspace is in use");
    assert!(busy.message.contains("another process is driving a run"), "{busy}");
    let Fixture { _tmp, top, ws } = f;
    drop(ws);

    let again = open(&top.join("runs"), "run-1", Some(seed_dir.path().to_path_buf()));
    assert_eq!(again.root(), root);
    assert!(!root.join("README.md").exists(), "reseeded");
    again.restore(&snapshot).expect("same repository, same snapshots");

    // A directory the user named, already holding files, is not seeded either.
    let named = top.join("named");
    std::fs::create_dir_all(&named).expect("mkdir");
    std::fs::write(named.join("mine.txt"), "mine").expect("write");
    let ws = workspaces(&top.join("runs"))
        .open(&WorkspaceRequest {
            run_id: "run-2".to_owned(),
            dir: Some(named.clone()),
            seed: Some(seed_dir.path().to_path_buf()),
        })
        .expect("opens");
    assert_eq!(ws.root(), named);
    assert!(!named.join("README.md").exists());
    assert!(git_dir(&top.join("runs"), &named).join("HEAD").exists());
    assert!(!named.join(".baton").exists());
}

#[test]
fn seeds_over_the_limits_are_refused() {
    let seed_dir = tempfile::tempdir().expect("temp dir");
    let big = std::fs::File::create(seed_dir.path().join("big.bin")).expect("create");
    big.set_len(SEED_BYTES_MAX + 1).expect("sparse file");
    let runs = tempfile::tempdir().expect("temp dir");
    let error = workspaces(runs.path())
        .open(&WorkspaceRequest {
            run_id: "run-1".to_owned(),
            dir: None,
            seed: Some(seed_dir.path().to_path_buf()),
        })
        .expect_err("too big");
    assert!(error.message.contains("smaller seed"), "{}", error.message);
    assert!(!runs.path().join("run-1/big.bin").exists());
}

#[test]
fn run_ids_must_be_plain_names() {
    let runs = tempfile::tempdir().expect("temp dir");
    for run_id in ["../escape", "a/b", ""] {
        let request = WorkspaceRequest { run_id: run_id.to_owned(), dir: None, seed: None };
        assert!(workspaces(runs.path()).open(&request).is_err(), "{run_id:?}");
    }
    assert!(!runs.path().join("../escape").exists());
}

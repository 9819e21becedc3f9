//! Standard output, where a reader that went away ends the output quietly.
//!
//! Rust ignores `SIGPIPE`, so a write to a closed pipe (`baton events RUN | head`) returns
//! `EPIPE`, on which `println!` panics ("failed printing to stdout", exit 101). Every line
//! the CLI prints goes through [`write`] instead: the first `EPIPE` marks standard output
//! closed and every later write is skipped, so the command finishes its work (a run is
//! still driven to its end) and exits with its usual code; a command that only prints
//! (`events --follow`) asks [`closed`] and stops. Any other write error is returned.

use std::fmt;
use std::io::{self, Write as _};
use std::sync::atomic::{AtomicBool, Ordering};

/// Set once a write found standard output's reader gone.
static CLOSED: AtomicBool = AtomicBool::new(false);

/// Writes to standard output; a closed pipe is not an error (see the module's docs).
pub(crate) fn write(args: fmt::Arguments<'_>) -> io::Result<()> {
    if closed() {
        return Ok(());
    }
    let mut stdout = io::stdout().lock();
    quiet(stdout.write_fmt(args))
}

/// Flushes standard output, at the end of a command; a closed pipe is not an error.
pub(crate) fn flush() -> io::Result<()> {
    if closed() {
        return Ok(());
    }
    quiet(io::stdout().lock().flush())
}

/// Whether standard output's reader has gone.
pub(crate) fn closed() -> bool {
    CLOSED.load(Ordering::Relaxed)
}

fn quiet(result: io::Result<()>) -> io::Result<()> {
    match result {
        Err(e) if e.kind() == io::ErrorKind::BrokenPipe => {
            CLOSED.store(true, Ordering::Relaxed);
            Ok(())
        }
        other => other,
    }
}

/// `print!` through [`write`]: evaluates to `io::Result<()>`.
macro_rules! out {
    ($($arg:tt)*) => {
        $crate::out::write(format_args!($($arg)*))
    };
}

/// `println!` through [`write`]: evaluates to `io::Result<()>`.
macro_rules! outln {
    () => {
        $crate::out::write(format_args!("\n"))
    };
    ($($arg:tt)*) => {
        $crate::out::write(format_args!("{}\n", format_args!($($arg)*)))
    };
}

pub(crate) use {out, outln};

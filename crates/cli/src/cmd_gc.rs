//! `baton gc`: removes what no run owns from Baton's own directories beside the database
//! (found by the application layer's `upkeep::gc`), saying what and why.

use std::process::ExitCode;

use baton_app::place::Place;
use baton_app::upkeep::gc;

use crate::out::outln;

pub(crate) async fn gc(place: &Place, dry_run: bool) -> anyhow::Result<ExitCode> {
    let leftovers = gc::leftovers(place).await?;
    if leftovers.is_empty() {
        outln!("nothing to remove")?;
        return Ok(ExitCode::SUCCESS);
    }
    let verb = if dry_run { "would remove" } else { "removed" };
    let mut failed = false;
    for leftover in &leftovers {
        if !dry_run && let Err(e) = gc::remove(&leftover.path) {
            #[allow(clippy::print_stderr)]
            {
                let path = crate::escape::one_line(&leftover.path.display().to_string());
                eprintln!("error: cannot remove {path}: {e}");
            }
            failed = true;
            continue;
        }
        let path = crate::escape::one_line(&leftover.path.display().to_string());
        outln!("{verb} {path} ({})", crate::escape::one_line(&leftover.why))?;
    }
    Ok(if failed { ExitCode::from(1) } else { ExitCode::SUCCESS })
}

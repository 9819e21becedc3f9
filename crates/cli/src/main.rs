//! The `baton` command-line tool: the one place that prints to the terminal.
//!
//! Each subcommand lives in its own module and returns an exit code; `main` only parses
//! arguments and maps errors to exit codes (0 success, 1 the input is invalid, 2 usage).

mod cmd_expr;
mod cmd_graph;
mod cmd_validate;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand, ValueEnum};

/// Baton runs multi-step LLM agent workflows declared in YAML, durably.
#[derive(Debug, Parser)]
#[command(name = "baton", version, about, max_term_width = 100)]
struct Cli {
    /// The scenarios directory (scenario files beside prompts/ and rubrics/).
    #[arg(long, global = true, env = "BATON_SCENARIOS", default_value = "scenarios")]
    scenarios: PathBuf,

    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Check scenario files or directories; exit 0 when valid (warnings are printed), 1 on any error.
    Validate {
        /// Files or directories (default: the scenarios directory).
        paths: Vec<PathBuf>,
        /// Output format.
        #[arg(long, value_enum, default_value_t = Format::Text)]
        format: Format,
        /// A directory of tenant overrides, laid out as TENANT/SCENARIO_ID.yaml; each is merged
        /// over its base scenario and checked like one.
        #[arg(long)]
        overrides: Option<PathBuf>,
    },
    /// Draw a scenario's graph.
    Graph {
        /// A scenario id (looked up in the scenarios directory) or a scenario file.
        scenario: String,
        /// Output format.
        #[arg(long, value_enum, default_value_t = GraphFormat::Mermaid)]
        format: GraphFormat,
    },
    /// Print the JSON Schema of the scenario format (for editors).
    Schema,
    /// Parse, check and evaluate one gate expression.
    Expr {
        /// The expression, for example "verdict == 'PASS' && !escalate_now".
        expr: String,
        /// Check names against this scenario (an id or a file).
        #[arg(long, requires = "from")]
        scenario: Option<String>,
        /// The level the edge leaves from (its verifiers are the ones `verifier.<name>` may name).
        #[arg(long, requires = "scenario")]
        from: Option<String>,
        /// A JSON file with the state to evaluate against, e.g.
        /// {"verdict": "PASS", "verifier": {"build": {"passed": true}}}.
        #[arg(long)]
        state: Option<PathBuf>,
    },
}

/// How `validate` reports.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum Format {
    Text,
    Json,
}

/// How `graph` draws.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum GraphFormat {
    Mermaid,
    Dot,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Validate { paths, format, overrides } => {
            let paths = if paths.is_empty() { vec![cli.scenarios.clone()] } else { paths };
            cmd_validate::run(&paths, format == Format::Json, overrides.as_deref())
        }
        Command::Graph { scenario, format } => {
            cmd_graph::run(&cli.scenarios, &scenario, format == GraphFormat::Dot)
        }
        Command::Schema => cmd_graph::schema(),
        Command::Expr { expr, scenario, from, state } => cmd_expr::run(
            &cli.scenarios,
            &expr,
            scenario.as_deref().zip(from.as_deref()),
            state.as_deref(),
        ),
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            #[allow(clippy::print_stderr)]
            {
                eprintln!("error: {e:#}");
            }
            ExitCode::from(1)
        }
    }
}

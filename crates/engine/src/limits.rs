//! Every bound the kernel enforces, in one place.

/// Most level executions in one run (all levels, all attempts) when its scenario sets no
/// `budget.max_level_runs`; a run that would start one more is aborted with
/// `level_run_limit` (one whose last allowed level routes to `__end__` completes).
pub const LEVEL_RUNS_MAX: u32 = baton_scenario::limits::LEVEL_RUNS_DEFAULT;
/// Repair retries when a verdict cannot be read from a model's answer.
pub const VERDICT_REPAIRS_MAX: u32 = 1;
/// Largest model answer kept in an event, in bytes; longer answers are cut with a marker.
pub const MODEL_TEXT_BYTES_MAX: usize = 1024 * 1024;
/// Bytes kept of a verifier's stdout and stderr each (the tail).
pub const VERIFIER_OUTPUT_BYTES_MAX: usize = 64 * 1024;
/// Bytes of stderr tail written into feedback for the next attempt.
pub const FEEDBACK_TAIL_BYTES: usize = 4 * 1024;
/// Default timeout of a command verifier, in seconds.
pub const VERIFIER_TIMEOUT_S_DEFAULT: f64 = 600.0;
/// Default `max_tokens` of a model call.
pub const MAX_TOKENS_DEFAULT: u32 = 4_096;
/// Characters per token when a provider reports no usage (an estimate for budgets).
pub const CHARS_PER_TOKEN: usize = 4;
/// Most workspace paths one tool-loop attempt may change.
pub const FILES_TOUCHED_PER_LEVEL_MAX: usize = 200;
/// Bytes of a tool result copied into its `tool_result` event (the model gets all of it).
pub const TOOL_RESULT_EVENT_BYTES_MAX: usize = 16 * 1024;
/// Most bytes of one tool call's arguments (as JSON); a larger call is refused and its
/// arguments are recorded as their size only (room for a whole `write_file` of
/// `WRITE_BYTES_MAX`, escaped).
pub const TOOL_ARGUMENTS_BYTES_MAX: usize = 3 * 1024 * 1024;
/// Most bytes of tool call arguments one model turn may send in all; calls past it are
/// refused like oversized ones, so a turn adds at most about `MODEL_TEXT_BYTES_MAX` +
/// 2 × this + `TOOL_CALLS_PER_TURN_MAX` × `TOOL_RESULT_EVENT_BYTES_MAX` to the log.
pub const TURN_ARGUMENTS_BYTES_MAX: usize = 4 * 1024 * 1024;
/// Most tool calls executed from one model turn.
pub const TOOL_CALLS_PER_TURN_MAX: usize = 32;
/// Bytes of a tool loop's conversation sent with each call; the oldest tool results give
/// way first.
pub const CONVERSATION_BYTES_MAX: usize = 1024 * 1024;
/// Characters of an approval request's question shown where requests are listed.
pub const PROMPT_SUMMARY_CHARS: usize = 60;
/// Largest `--script` file, in bytes: a script is YAML, parsed under the scenario
/// parser's budget, so reading more would only be refused later.
pub const SCRIPT_BYTES_MAX: u64 = baton_scenario::limits::SOURCE_BYTES_MAX as u64;
/// Largest cassette file read, in bytes (room for many answers of `MODEL_TEXT_BYTES_MAX`).
pub const CASSETTE_BYTES_MAX: u64 = 64 * 1024 * 1024;
/// Largest input file of a run (`--input-file`), in bytes.
pub const INPUT_BYTES_MAX: u64 = 4 * 1024 * 1024;
/// Most chain hops in a job (002): the classifier counts as one, so a classified job may
/// chain twice more; a run that would chain past it ends aborted with `chain_depth_limit`.
pub const CHAIN_DEPTH_MAX: u32 = 3;
/// How long the end of a parent waits for its cancelled children to settle, by default
/// (`settle_timeout_s`), and at most.
pub const SETTLE_TIMEOUT_S_DEFAULT: f64 = 15.0;
pub const SETTLE_TIMEOUT_S_MAX: f64 = 120.0;
/// The link name of a chained child run.
pub const CHAIN_LINK: &str = "chain";
/// Longest intent route a chain takes from a level's output, in characters: routes are
/// scenario ids and route names; a longer one (a model's answer can hold anything) is cut
/// before it is recorded, and names no scenario.
pub const ROUTE_CHARS_MAX: usize = 128;
/// Most runs of one job a replay reads (a wave's 200 workers, each with a chain, fit).
pub const TREE_RUNS_MAX: usize = 2_000;

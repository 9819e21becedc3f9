//! Every bound the scenario language enforces, in one place.

/// Largest scenario, override, rubric, schema or rules file, in bytes.
pub const SOURCE_BYTES_MAX: usize = 1024 * 1024;
/// Largest prompt template, in bytes.
pub const TEMPLATE_BYTES_MAX: usize = 256 * 1024;
/// Fuel of one template render (minijinja instructions), so a runaway loop stops.
pub const TEMPLATE_FUEL_MAX: u64 = 1_000_000;
/// Deepest nesting of YAML collections.
pub const YAML_DEPTH_MAX: usize = 48;
/// Most YAML nodes in one file (aliases count every time they are expanded).
pub const YAML_NODES_MAX: usize = 100_000;
/// Most alias references in one file.
pub const YAML_ALIASES_MAX: usize = 1_000;
/// Most levels in one scenario.
pub const LEVELS_MAX: usize = 256;
/// Most edges in one scenario.
pub const EDGES_MAX: usize = 1_024;
/// Most verifiers on one level.
pub const VERIFIERS_PER_LEVEL_MAX: usize = 32;
/// Longest gate expression, in bytes.
pub const EXPR_BYTES_MAX: usize = 1_024;
/// Deepest nesting of a gate expression (parentheses, `!`, operators).
pub const EXPR_DEPTH_MAX: usize = 32;
/// Most segments in one dotted path of a gate expression.
pub const PATH_SEGMENTS_MAX: usize = 16;
/// Largest magnitude of a number in a gate expression: 2^53, above which f64 no longer
/// holds every integer, so a comparison would not mean what it says.
pub const NUMBER_MAGNITUDE_MAX: f64 = 9_007_199_254_740_992.0;
/// Most significant digits of a number in a gate expression; f64's shortest round-trip
/// form never needs more.
pub const NUMBER_DIGITS_MAX: usize = 17;
/// Upper bound of `max_parallel` on a fan-out or wave level.
pub const PARALLEL_MAX: u32 = 64;
/// Upper bound of a wave's `max_parallel` (the reference's 1 through 10).
pub const WAVE_PARALLEL_MAX: u32 = 10;
/// A wave's `max_parallel` when neither the wave nor baton.toml sets one.
pub const WAVE_PARALLEL_DEFAULT: u32 = 3;
/// Upper bound of a wave worker's timeout, in milliseconds (2^31 - 1).
pub const WAVE_TIMEOUT_MS_MAX: u64 = 2_147_483_647;
/// A wave worker's timeout when none is set: 600 000 ms.
pub const WAVE_TIMEOUT_MS_DEFAULT: u64 = 600_000;
/// Upper bound of a wave's `max_assignments`.
pub const WAVE_ASSIGNMENTS_MAX: u32 = 200;
/// A wave's `max_assignments` when none is set.
pub const WAVE_ASSIGNMENTS_DEFAULT: u32 = 50;
/// Upper bound of `max_iterations` on a tool-loop level.
pub const ITERATIONS_MAX: u32 = 500;
/// Default `max_iterations` of a tool-loop level.
pub const ITERATIONS_DEFAULT: u32 = 40;
/// Most toolsets in one scenario.
pub const TOOLSETS_MAX: usize = 32;
/// Most of the user's own tools one level may give its model.
pub const OWN_TOOLS_PER_LEVEL_MAX: usize = 64;
/// Longest name of a tool (what model APIs accept).
pub const TOOL_NAME_CHARS_MAX: usize = 64;
/// Longest description of a tool, in bytes.
pub const TOOL_DESCRIPTION_BYTES_MAX: usize = 4 * 1024;
/// Largest JSON Schema of a tool's arguments, in bytes of JSON: every tool's schema goes
/// with every model call of its level.
pub const TOOL_SCHEMA_BYTES_MAX: usize = 16 * 1024;
/// A tool call's timeout when its tool sets none, in seconds.
pub const TOOL_TIMEOUT_S_DEFAULT: f64 = 60.0;
/// Upper bound of a tool's `timeout_s`: one hour.
pub const TOOL_TIMEOUT_S_MAX: f64 = 3600.0;

/// Longest a user's tool call may wait for its approval, in seconds (thirty days).
pub const TOOL_APPROVAL_TIMEOUT_S_MAX: f64 = 30.0 * 24.0 * 3600.0;
/// Upper bound of a tool's `max_calls`.
pub const TOOL_CALLS_MAX: u32 = 1_000;
/// Upper bound of a tool's `cost_usd` per call.
pub const TOOL_COST_USD_MAX: f64 = 1_000.0;
/// Most arguments of a `command` tool's program, and most variables it is given.
pub const TOOL_ARGV_MAX: usize = 64;
/// Upper bound of a verifier's `max_retries`.
pub const RETRIES_MAX: u32 = 10;
/// Default of `budget.max_level_runs`: level executions one run may start.
pub const LEVEL_RUNS_DEFAULT: u32 = 1_000;
/// Upper bound of `budget.max_level_runs`.
pub const LEVEL_RUNS_MAX: u32 = 100_000;
/// Upper bound of a model constraint's `retry.attempts`.
pub const RETRY_ATTEMPTS_MAX: u32 = 20;
/// Upper bound of `retry.max_time_s`: one hour.
pub const RETRY_TIME_S_MAX: f64 = 3600.0;
/// Upper bound of `retry.backoff_max_s`.
pub const RETRY_BACKOFF_S_MAX: f64 = 300.0;
/// Upper bound of any `timeout_s` or `max_duration_s`: one week.
pub const TIMEOUT_S_MAX: f64 = 7.0 * 24.0 * 3600.0;
/// Longest identifier (scenario, level or verifier id).
pub const ID_CHARS_MAX: usize = 64;
/// Most scenario files in one directory.
pub const SCENARIOS_MAX: usize = 1_000;
/// Most symlinks followed from one entry of a scenarios directory before it counts as a loop.
pub const SYMLINK_HOPS_MAX: usize = 40;
/// Most files in a workspace seed directory.
pub const SEED_FILES_MAX: usize = 10_000;
/// Most bytes in a workspace seed directory.
pub const SEED_BYTES_MAX: u64 = 64 * 1024 * 1024;
/// Deepest directory a registry's change check looks into, below each path it loads.
pub const DEPTH_MAX_FINGERPRINT: usize = 8;

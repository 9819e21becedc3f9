//! The `baton` command-line tool: the one place that prints to the terminal.
//!
//! Each subcommand lives in its own module and returns an exit code; `main` only parses
//! arguments and maps errors to exit codes (0 success, 1 the input is invalid, 2 usage).

mod args;
mod cmd_expr;
mod cmd_forecast;
mod cmd_fork;
mod cmd_gc;
mod cmd_graph;
mod cmd_purge;
mod cmd_queue;
mod cmd_replay;
mod cmd_run;
mod cmd_serve;
mod cmd_tenant;
mod cmd_validate;
mod cmd_verify;
mod cmd_wave;
mod cmd_webhook;
mod drive;
mod escape;
mod limits;
mod out;
mod service_args;
mod timeline;

use std::process::ExitCode;

use baton_app::Place;
use clap::Parser as _;

use crate::args::{
    CassetteCommand, Cli, Command, FixtureCommand, Format, GraphFormat, TenantCommand, TestFormat,
    TokenCommand, WaveCommand,
};

// The kernel allocates many small, short-lived values per step (events, strings, JSON);
// mimalloc serves them faster than the system allocator.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// A bench's report: as JSON, or one figure a line with its name right-aligned to `width`.
fn print_report(report: &serde_json::Value, json: bool, width: usize) -> anyhow::Result<ExitCode> {
    if json {
        out::outln!("{}", serde_json::to_string_pretty(report)?)?;
        return Ok(ExitCode::SUCCESS);
    }
    for (k, v) in report.as_object().into_iter().flatten() {
        match v.as_f64() {
            Some(f) if v.is_f64() => out::outln!("{k:>width$}: {f:.3}")?,
            _ => out::outln!("{k:>width$}: {v}")?,
        }
    }
    Ok(ExitCode::SUCCESS)
}

fn main() -> ExitCode {
    // Inside the jail, Baton's binary confines the program it was started for, then
    // becomes it (see baton_app::jail::init_main): nothing else of Baton runs there.
    let args: Vec<std::ffi::OsString> = std::env::args_os().collect();
    if args.get(1).is_some_and(|a| a == baton_app::jail::INIT_ARG) {
        return baton_app::jail::init_main(&args[2..]);
    }
    // Keys live in this process's environment: no process of the same uid may read it.
    if let Err(e) = baton_app::jail::make_undumpable() {
        #[allow(clippy::print_stderr)]
        {
            eprintln!("baton: warning: {e}");
        }
    }
    let cli = Cli::parse();
    let scenarios = cli.scenarios.clone();
    let (config, snapshots) = (cli.config.clone(), cli.snapshots.clone());
    let data_dir = cli.data_dir.as_deref();
    let Some(mut place) =
        Place::of_database(&cli.db, data_dir, scenarios, config, snapshots, cli.no_jail)
    else {
        #[allow(clippy::print_stderr)]
        {
            eprintln!(
                "error: --data-dir is for a PostgreSQL --db; a SQLite database keeps workspaces and snapshots in its own directory (move --db instead)"
            );
        }
        return ExitCode::from(2);
    };
    if let Some(url) = &cli.object_store {
        let timeout = std::time::Duration::from_secs(cli.object_store_timeout_s);
        match baton_app::place::HandOff::from_url(url, timeout) {
            Ok(handoff) => place.handoff = Some(std::sync::Arc::new(handoff)),
            Err(message) => {
                #[allow(clippy::print_stderr)]
                {
                    eprintln!("error: {message}");
                }
                return ExitCode::from(2);
            }
        }
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(r) => r,
        Err(e) => {
            #[allow(clippy::print_stderr)]
            {
                eprintln!("error: cannot start the async runtime: {e}");
            }
            return ExitCode::from(1);
        }
    };
    let result = match cli.command {
        Command::Run {
            scenario,
            pin,
            intent,
            kind,
            max_cost_usd,
            max_forecast_usd,
            settle_timeout_s,
            idempotency_key,
            tenant,
            input,
            input_file,
            meta,
            script,
            json,
            stream,
            queue,
            priority,
            input_lines,
            cassette,
            record,
            workspace,
            branch,
        } => {
            let inputs = match (input, input_file, input_lines) {
                (Some(i), _, _) => Ok(vec![i]),
                (None, Some(f), _) => {
                    baton_app::start::input_file(&f).map(|i| vec![i]).map_err(anyhow::Error::from)
                }
                (None, None, Some(f)) => {
                    baton_app::start::input_lines(&f).map_err(anyhow::Error::from)
                }
                (None, None, None) => Err(anyhow::anyhow!("give --input TEXT or --input-file F")),
            };
            let queue = queue.map(|q| baton_app::queues::placement(Some(&q), priority)).transpose();
            inputs.and_then(|inputs| queue.map(|queue| (inputs, queue))).and_then(
                |(mut inputs, queue)| {
                    let request = baton_app::start::JobStart {
                        job: baton_engine::job::JobRequest { pin: scenario.or(pin), intent, kind },
                        input: inputs.remove(0),
                        metadata: meta.into_iter().map(|(k, v)| (k, v.into())).collect(),
                        max_cost_usd,
                        idempotency_key,
                        tenant,
                    };
                    let setup = baton_app::start::Setup {
                        max_forecast_usd,
                        settle_timeout_s,
                        script,
                        cassette,
                        record,
                        workspace,
                        branch,
                        given: None,
                    };
                    let args =
                        drive::RunArgs { request, setup, json, stream, queue, more_inputs: inputs };
                    runtime.block_on(drive::run(&place, args))
                },
            )
        }
        Command::Wave(w) => runtime.block_on(async {
            match w {
                WaveCommand::Plan {
                    tasks,
                    worker,
                    max_parallel,
                    timeout_s,
                    max_assignments,
                    context,
                    script,
                    json,
                } => {
                    let settings = baton_app::waves::PlanSettings {
                        tasks,
                        worker,
                        max_parallel,
                        timeout_s,
                        max_assignments,
                        context,
                    };
                    cmd_wave::plan(&place, settings, script, json).await
                }
                WaveCommand::Dispatch { wave, assignment, task, worker_run, by, json } => {
                    cmd_wave::dispatch(&place, &wave, (assignment, task), worker_run, by, json)
                        .await
                }
                WaveCommand::Record {
                    wave,
                    assignment,
                    task,
                    outcome,
                    summary,
                    blockers,
                    by,
                    json,
                } => {
                    let record = baton_app::waves::Record {
                        assignment,
                        task,
                        outcome,
                        summary,
                        blockers,
                        by,
                    };
                    cmd_wave::record(&place, &wave, record, json).await
                }
                WaveCommand::Decide { wave, json } => cmd_wave::decide(&place, &wave, json).await,
                WaveCommand::Complete { wave, by, json } => {
                    cmd_wave::complete(&place, &wave, by, json).await
                }
                WaveCommand::Cancel { wave, by, reason } => {
                    cmd_wave::cancel(&place, &wave, by, reason).await
                }
                WaveCommand::Run { wave, max_parallel, script, json } => {
                    cmd_wave::run(&place, &wave, max_parallel, script.as_deref(), json).await
                }
                WaveCommand::Get { wave, watch, json } => {
                    cmd_wave::get(&place, &wave, json, watch).await
                }
                WaveCommand::List { json } => cmd_wave::list(&place, json).await,
                WaveCommand::Summary { json } => cmd_wave::summary(&place, json).await,
            }
        }),
        Command::Serve {
            listen,
            no_auth,
            workers,
            body_max_bytes,
            starts_per_minute,
            streams_per_token,
            hosts,
            script,
            retries_max,
            retry_first_ms,
            otlp_endpoint,
            drain_grace_s,
            service,
        } => {
            let mut settings = baton_server::Settings {
                listen,
                no_auth,
                workers,
                body_bytes_max: body_max_bytes,
                starts_per_minute,
                streams_per_token,
                hosts,
                retries_max,
                retry_first: std::time::Duration::from_millis(retry_first_ms),
                otlp_endpoint,
                ..baton_server::Settings::default()
            };
            service.apply(&mut settings);
            runtime.block_on(cmd_serve::serve(&place, settings, script, drain_grace_s))
        }
        Command::Worker {
            concurrency,
            lease_s,
            name,
            script,
            idle_exit_s,
            retries_max,
            retry_first_ms,
            drain_grace_s,
            listen,
            queues,
        } => runtime.block_on(cmd_serve::worker(
            &place,
            cmd_serve::WorkerArgs {
                concurrency,
                lease_s,
                name,
                script,
                idle_exit_s,
                drain_grace_s,
                listen,
                queues,
            },
            baton_server::Settings {
                name: "baton worker",
                workers: concurrency,
                retries_max,
                retry_first: std::time::Duration::from_millis(retry_first_ms),
                ..baton_server::Settings::default()
            },
        )),
        Command::Mcp { tenant, name, workers, script, message_max_bytes } => {
            let settings = baton_server::Settings {
                name: "baton mcp",
                workers,
                body_bytes_max: message_max_bytes,
                ..baton_server::Settings::default()
            };
            runtime.block_on(cmd_serve::mcp(&place, tenant, name, settings, script))
        }
        Command::Token(t) => runtime.block_on(async {
            match t {
                TokenCommand::Create { tenant, role, name } => {
                    cmd_serve::create_token(&place, tenant.as_deref(), &role, name.as_deref()).await
                }
                TokenCommand::List { tenant, json } => {
                    cmd_serve::list_tokens(&place, tenant.as_deref(), json).await
                }
                TokenCommand::Revoke { id } => cmd_serve::revoke_token(&place, &id).await,
            }
        }),
        Command::Webhook(w) => runtime.block_on(cmd_webhook::run(&place, w)),
        Command::Queue(q) => runtime.block_on(cmd_queue::run(&place, q)),
        Command::Tenant(t) => runtime.block_on(async {
            match t {
                TenantCommand::Set { tenant, scenario, file } => {
                    cmd_tenant::set(&place, &tenant, &scenario, &file).await
                }
                TenantCommand::List { tenant } => cmd_tenant::list(&place, tenant.as_deref()).await,
                TenantCommand::Show { tenant, scenario } => {
                    cmd_tenant::show(&place, &tenant, &scenario).await
                }
                TenantCommand::Rm { tenant, scenario } => {
                    cmd_tenant::rm(&place, &tenant, &scenario).await
                }
                TenantCommand::Import { dir } => cmd_tenant::import(&place, &dir).await,
                TenantCommand::Limit { tenant, max, none } => {
                    cmd_queue::limit(&place, tenant.as_deref(), max, none).await
                }
            }
        }),
        Command::Replay { run, fixture, trust_validation, from_scenario, json } => runtime
            .block_on(cmd_replay::replay(
                &place,
                run.as_deref(),
                fixture.as_deref(),
                trust_validation,
                from_scenario.as_deref(),
                json,
            )),
        Command::Fork { run, at, input, scenario_file, set, script, cassette, json } => runtime
            .block_on(cmd_fork::fork(
                &place,
                cmd_fork::ForkArgs { run, at, input, scenario_file, set, script, cassette, json },
            )),
        Command::Forecast { scenario, input, fixtures, runs, json } => {
            let source = match fixtures {
                Some(dir) => baton_app::forecast::Source::Fixtures(dir),
                None => baton_app::forecast::Source::Runs(
                    runs.unwrap_or(baton_app::forecast::RUNS_DEFAULT),
                ),
            };
            runtime.block_on(cmd_forecast::forecast(
                &place,
                &scenario,
                input.as_deref(),
                source,
                json,
            ))
        }
        Command::Diff { a, b, json } => runtime.block_on(cmd_replay::diff(&place, &a, &b, json)),
        Command::Fixture(FixtureCommand::Record {
            scenario,
            case,
            from_run,
            script,
            input,
            meta,
            tenant,
            decide,
            force,
        }) => runtime.block_on(cmd_replay::record(
            &place,
            baton_app::fixtures::RecordArgs {
                scenario,
                case,
                from_run,
                script,
                input,
                meta,
                tenant,
                decide,
                force,
            },
        )),
        Command::Fixture(FixtureCommand::Accept { scenario, case, live, trust_validation }) => {
            runtime.block_on(cmd_replay::accept(
                &place,
                cmd_replay::TestArgs {
                    cases: baton_app::fixtures::Cases {
                        scenarios: scenario.into_iter().collect(),
                        case,
                        live,
                        trust_validation,
                    },
                    format: cmd_replay::TestFormat::Text,
                },
            ))
        }
        Command::Test { only, case, format, live, trust_validation } => {
            runtime.block_on(cmd_replay::test(
                &place,
                cmd_replay::TestArgs {
                    cases: baton_app::fixtures::Cases {
                        scenarios: only,
                        case,
                        live,
                        trust_validation,
                    },
                    format: match format {
                        TestFormat::Text => cmd_replay::TestFormat::Text,
                        TestFormat::Json => cmd_replay::TestFormat::Json,
                        TestFormat::Junit => cmd_replay::TestFormat::Junit,
                    },
                },
            ))
        }
        Command::Cassette(CassetteCommand::Export { run, out }) => {
            runtime.block_on(cmd_run::export_cassette(&place, &run, out.as_deref()))
        }
        Command::Resume { run, script, json, upgrade } => runtime.block_on(drive::resume(
            &place,
            &run,
            script.as_deref(),
            json,
            upgrade,
            baton_app::engines::WaveDrive::default(),
        )),
        Command::Approve { run, request, reject, comment, by, data, script, no_resume } => runtime
            .block_on(cmd_run::approve(
                &place,
                &run,
                baton_app::runs::Decision { request, reject, comment, by, data },
                cmd_run::Then { script, no_resume },
            )),
        Command::Answer { run, answer, script, no_resume } => {
            runtime.block_on(cmd_run::answer(&place, &run, &answer, script.as_deref(), no_resume))
        }
        Command::Steer { run, message, by } => {
            runtime.block_on(cmd_run::steer(&place, &run, &message, by))
        }
        Command::Cancel { run, by, reason } => {
            runtime.block_on(cmd_run::cancel(&place, &run, by, reason))
        }
        Command::Runs { status, tree, json } => {
            runtime.block_on(cmd_run::runs(&place, status.as_deref(), tree, json))
        }
        Command::Events { run: Some(run), follow, tree, writers, json, .. } => {
            let how = cmd_run::Shown { follow, tree, writers, json };
            runtime.block_on(cmd_run::events(&place, &run, how))
        }
        Command::Events { run: None, follow, after, tenant, json, .. } => {
            let tenant = tenant.map(Some);
            let after = after.unwrap_or(baton_engine::store::FeedCursor::START);
            runtime.block_on(cmd_run::feed(&place, &tenant, after, follow, json))
        }
        Command::Validate { paths, format, overrides, tools, tools_timeout_s } => {
            let paths = if paths.is_empty() { vec![cli.scenarios.clone()] } else { paths };
            let probe = tools.then(|| (&place, std::time::Duration::from_secs(tools_timeout_s)));
            runtime.block_on(cmd_validate::run(
                &paths,
                format == Format::Json,
                overrides.as_deref(),
                cli.config.as_deref(),
                probe,
            ))
        }
        Command::Bench {
            workload,
            store,
            runs,
            concurrency,
            bench_db,
            json,
            repeat,
            workers,
            processes,
            model_latency_ms,
        } => {
            // The server's figures have longer names.
            let width = if workload == "http" { 26 } else { 22 };
            runtime
                .block_on(baton_bench::bench(baton_bench::BenchArgs {
                    workload,
                    store,
                    runs,
                    concurrency,
                    db: bench_db,
                    workers,
                    processes,
                    model_latency_ms,
                    repeat,
                    place: place.clone(),
                }))
                .and_then(|report| print_report(&report, json, width))
        }
        Command::Verify { runs, json } => runtime.block_on(cmd_verify::verify(&place, &runs, json)),
        Command::Migrate => runtime.block_on(cmd_verify::migrate(&place)),
        Command::Purge { finished_before, job, unended, keep_failed, dry_run } => {
            runtime.block_on(cmd_purge::purge(
                &place,
                finished_before.as_deref(),
                job,
                unended,
                keep_failed,
                dry_run,
            ))
        }
        Command::Gc { dry_run } => runtime.block_on(cmd_gc::gc(&place, dry_run)),
        Command::Backup { dest } => cmd_verify::backup(&place, &dest),
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
    // What is still buffered goes out now, so a write error is reported, not lost at exit;
    // a reader that has gone is no error (see `out`).
    let result = result.and_then(|code| {
        out::flush().map_err(|e| anyhow::anyhow!("cannot write to standard output: {e}"))?;
        Ok(code)
    });
    match result {
        Ok(code) => code,
        Err(e) => {
            // The loader's diagnostics first (they are rendered for a terminal), then what
            // went wrong; the exit code is the one table's.
            let own = e.downcast_ref::<baton_app::Error>();
            #[allow(clippy::print_stderr)]
            {
                if let Some(diagnostics) = own.and_then(|o| o.diagnostics.as_deref()) {
                    eprint!("{diagnostics}");
                }
                eprintln!(
                    "error: {}",
                    escape::terminal_safe(&format!("{e:#}"), escape::Layout::Block)
                );
            }
            ExitCode::from(baton_app::Error::kind_of(&e).surfaces().exit_code)
        }
    }
}

//! `drainit-gate`: wires the command line to the model and its renderers (see the
//! library's theory of operation). Exit 0 when the gate passes, 1 when it fails,
//! 64 for a bad flag (clap's own usage exit, 2, is mapped to 64), 73 when the page
//! cannot be written.

use std::io::Write;
use std::process::ExitCode;

use clap::Parser;
use clap::error::ErrorKind;
use drainit_gate::cli::{CheckArgs, Cli, Command, DrillArgs, ModelArgs, exit};
use drainit_gate::{check, drill, model, page, render};

/// Writes to stdout, ignoring a closed stream (`drainit-gate model | head`).
fn out(text: &str) {
    let _ = std::io::stdout().lock().write_all(text.as_bytes());
}

fn model(args: &ModelArgs) -> ExitCode {
    let run = model::run(&args.settings());
    if let Some(path) = &args.html {
        let html = page::Replay::from_run(&run).html();
        if let Err(e) = std::fs::write(path, html) {
            let _ = writeln!(
                std::io::stderr(),
                "drainit-gate: writing the page to {} failed: {e}",
                path.display()
            );
            return ExitCode::from(exit::CANT_CREATE);
        }
    }
    if args.json {
        out(&(render::json(&run) + "\n"));
    } else {
        out(&render::text(&run));
    }
    ExitCode::from(if run.verdict.pass {
        exit::PASS
    } else {
        exit::FAIL
    })
}

fn write_page(path: &std::path::Path, html: String) -> bool {
    if let Err(e) = std::fs::write(path, html) {
        let _ = writeln!(
            std::io::stderr(),
            "drainit-gate: writing the page to {} failed: {e}",
            path.display()
        );
        return false;
    }
    true
}

fn verdict_code(pass: bool) -> ExitCode {
    ExitCode::from(if pass { exit::PASS } else { exit::FAIL })
}

fn drill(args: &DrillArgs) -> ExitCode {
    let drainit = args
        .drainit
        .clone()
        .or_else(drill::drainit_beside_me)
        .unwrap_or_else(|| "drainit".into());
    // A bare name is looked up on PATH.
    let drainit = if drainit.components().count() == 1 && !drainit.exists() {
        std::env::var_os("PATH")
            .and_then(|p| {
                std::env::split_paths(&p)
                    .map(|d| d.join(&drainit))
                    .find(|c| c.is_file())
            })
            .unwrap_or(drainit)
    } else {
        drainit
    };
    let settings = match args.settings(drainit) {
        Ok(s) => s,
        Err(e) => {
            let _ = writeln!(std::io::stderr(), "drainit-gate drill: {e}");
            return ExitCode::from(exit::USAGE);
        }
    };
    let run = match drill::run(settings) {
        Ok(run) => run,
        Err(e) => {
            let _ = writeln!(std::io::stderr(), "drainit-gate drill: {e}");
            return ExitCode::from(exit::DRILL_ERROR);
        }
    };
    if let Some(path) = &args.html
        && !write_page(path, drill::replay(&run).html())
    {
        return ExitCode::from(exit::CANT_CREATE);
    }
    if args.json {
        out(&(serde_json::to_string(&run).expect("plain data serializes") + "\n"));
    } else {
        out(&drill::text(&run));
    }
    verdict_code(run.pass)
}

fn check(args: &CheckArgs) -> ExitCode {
    let sources: Vec<check::Source> = args
        .reports
        .iter()
        .map(|name| {
            let text = if name == "-" {
                let mut t = String::new();
                std::io::Read::read_to_string(&mut std::io::stdin(), &mut t)
                    .map(|_| t)
                    .map_err(|e| format!("reading stdin failed: {e}"))
            } else {
                std::fs::read(name)
                    .map(|b| String::from_utf8_lossy(&b).into_owned())
                    .map_err(|e| format!("reading {name} failed: {e}"))
            };
            check::Source {
                name: name.clone(),
                text,
            }
        })
        .collect();
    let fleet = check::check(&sources, args.allow_503);
    if let Some(path) = &args.html
        && !write_page(path, check::replay(&fleet).html())
    {
        return ExitCode::from(exit::CANT_CREATE);
    }
    if args.json {
        out(&(serde_json::to_string(&fleet).expect("plain data serializes") + "\n"));
    } else {
        out(&check::text(&fleet));
    }
    verdict_code(fleet.pass)
}

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            let _ = e.print();
            return match e.kind() {
                ErrorKind::DisplayHelp | ErrorKind::DisplayVersion => ExitCode::SUCCESS,
                // A missing subcommand prints the help, but is a usage error.
                _ => ExitCode::from(exit::USAGE),
            };
        }
    };
    match &cli.command {
        Command::Model(args) => model(args),
        Command::Drill(args) => drill(args),
        Command::Check(args) => check(args),
    }
}

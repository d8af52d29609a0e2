//! Release-time tooling for drainit, run with `cargo run -p xtask -- docs DIR`.
//!
//! Writes the man page and the bash, zsh and fish completions generated from
//! drainit's own clap definition ([`drainit::config::Cli`]), so they never drift
//! from the flags. None of this is in the shipped binary: clap_mangen and
//! clap_complete are dependencies of this crate only.
//!
//! Output: `DIR/drainit.1`, `DIR/completions/drainit.bash`,
//! `DIR/completions/_drainit` (zsh) and `DIR/completions/drainit.fish`.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::CommandFactory;
use clap_complete::Shell;

fn docs(dir: &Path) -> std::io::Result<Vec<PathBuf>> {
    let completions = dir.join("completions");
    std::fs::create_dir_all(&completions)?;
    let mut written = Vec::new();

    let cmd = drainit::config::Cli::command();
    let man = dir.join("drainit.1");
    let mut page = Vec::new();
    clap_mangen::Man::new(cmd).render(&mut page)?;
    std::fs::write(&man, page)?;
    written.push(man);

    for shell in [Shell::Bash, Shell::Zsh, Shell::Fish] {
        let mut cmd = drainit::config::Cli::command();
        written.push(clap_complete::generate_to(
            shell,
            &mut cmd,
            "drainit",
            &completions,
        )?);
    }
    Ok(written)
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.iter().map(String::as_str).collect::<Vec<_>>()[..] {
        ["docs", dir] => match docs(Path::new(dir)) {
            Ok(files) => {
                for f in files {
                    println!("{}", f.display());
                }
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("xtask: writing the docs to {dir} failed: {e}");
                ExitCode::FAILURE
            }
        },
        _ => {
            eprintln!("usage: cargo run -p xtask -- docs DIR   (man page and shell completions)");
            ExitCode::from(64)
        }
    }
}

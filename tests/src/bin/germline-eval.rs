//! `germline-eval`: the attack matrix, the existence-bit test and formation-consistent
//! dispatch against stock releases. A binary of its own, built from the test crate, so
//! the shipped `germline` binary does not link the test harness.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};
use germline_executor::germline::PythonRuntime;
use germline_executor::runtime::RuntimeKind;
use germline_tests::eval::{run_existence_bit, run_fcd, run_matrix, FcdOptions, MatrixOptions};

/// Attack matrix, existence-bit test and formation-consistent dispatch
/// (`germline-eval matrix|existence-bit|fcd`).
#[derive(Parser)]
#[command(name = "germline-eval", version)]
struct Cli {
    #[command(subcommand)]
    command: EvalCommand,
}

/// `germline-eval ...`
#[derive(Subcommand)]
enum EvalCommand {
    /// Every attack variant under every runtime: disclosing runs per cell, JSON + SVG.
    Matrix(MatrixArgs),
    /// The 64-bit existence-bit test under lazy (simulated) and declared splitting.
    ExistenceBit(ExistenceArgs),
    /// Formation-consistent dispatch: pending calls across a rollback or rollout under
    /// every dispatch policy (stock mcp-server-git releases around the dash-target fix,
    /// and an egress case).
    Fcd(FcdArgs),
}

/// Options of `germline-eval fcd`.
#[derive(Args)]
struct FcdArgs {
    /// Pending A and B calls per policy.
    #[arg(long, default_value_t = 3)]
    trials: usize,
    /// Runtime of the file-write (git) case: its effect is on the host's file system, which
    /// a germline copy cannot write, so it shows under the unprotected runtime.
    #[arg(long, default_value = "sig-pin")]
    git_runtime: RuntimeKind,
    /// Runtime of the egress (repository host) case.
    #[arg(long, default_value = "germline")]
    repohost_runtime: RuntimeKind,
    /// Where to write the JSON result.
    #[arg(long, default_value = "eval-fcd.json")]
    out: PathBuf,
}

/// Options of `germline-eval matrix`.
#[derive(Args)]
struct MatrixArgs {
    /// Trials per cell.
    #[arg(long, default_value_t = 3)]
    trials: usize,
    /// Runtimes to run (default: all).
    #[arg(long = "runtime")]
    runtimes: Vec<RuntimeKind>,
    /// Variants to run (default: all).
    #[arg(long = "variant")]
    variants: Vec<String>,
    /// Where to write the JSON result (the SVG goes next to it).
    #[arg(long, default_value = "eval-matrix.json")]
    out: PathBuf,
}

/// Options of `germline-eval existence-bit`.
#[derive(Args)]
struct ExistenceArgs {
    /// Where to write the JSON result.
    #[arg(long, default_value = "eval-existence-bit.json")]
    out: PathBuf,
}

fn python() -> anyhow::Result<PythonRuntime> {
    let home = std::env::temp_dir().join("germline-eval-shim");
    Ok(PythonRuntime::discover(&home)?)
}

/// Runs an eval command. `matrix` exits 1 when a cell errored (a runtime that did
/// not start or ran nothing) or an attack variant has no control (no disclosure under
/// sig-pin): such a matrix does not tell "stopped" from "broken".
fn run(cmd: EvalCommand) -> anyhow::Result<i32> {
    match cmd {
        EvalCommand::Matrix(a) => {
            let m = run_matrix(
                &MatrixOptions { trials: a.trials, runtimes: a.runtimes, variants: a.variants },
                &python()?,
            )?;
            print!("{}", m.render_text());
            std::fs::write(&a.out, serde_json::to_vec_pretty(&m)?)?;
            let svg = a.out.with_extension("svg");
            std::fs::write(&svg, m.render_svg())?;
            println!("wrote {} and {}", a.out.display(), svg.display());
            let errors: usize = m.runtimes.iter().map(|r| m.errors(r)).sum();
            if errors > 0 || !m.no_control.is_empty() {
                eprintln!("the matrix is not conclusive: {errors} error trial(s), no control for {:?}", m.no_control);
                return Ok(1);
            }
        }
        EvalCommand::Fcd(a) => {
            let opts =
                FcdOptions { trials: a.trials, git_runtime: a.git_runtime, repohost_runtime: a.repohost_runtime };
            let r = run_fcd(&opts, &python()?)?;
            print!("{}", r.render_text());
            std::fs::write(&a.out, serde_json::to_vec_pretty(&r)?)?;
            println!("wrote {}", a.out.display());
        }
        EvalCommand::ExistenceBit(a) => {
            let r = run_existence_bit(&python()?)?;
            print!("{}", r.render_text());
            std::fs::write(&a.out, serde_json::to_vec_pretty(&r)?)?;
            println!("wrote {}", a.out.display());
        }
    }
    Ok(0)
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("GERMLINE_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    let code = run(cli.command)?;
    std::process::exit(code);
}

//! The ledger's part of the `germline` command line on its own, so the ledger benchmark
//! can be built in release mode without the rest of the workspace:
//! `cargo run --release -p germline-ledger --example ledger-bench -- bench ledger`.
//! Same subcommands as `germline ledger …` and `germline bench ledger`.

use std::process::ExitCode;

use clap::{Parser, Subcommand};
use germline_ledger::cli::{run_bench_command, run_ledger_command, BenchCommand, LedgerArgs};

#[derive(Parser)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// `germline ledger …`.
    Ledger(LedgerArgs),
    /// `germline bench …` (ledger only).
    #[command(subcommand)]
    Bench(BenchCommand),
}

fn main() -> ExitCode {
    let result = match Cli::parse().command {
        Command::Ledger(a) => run_ledger_command(&a),
        Command::Bench(b) => run_bench_command(&b),
    };
    match result {
        Ok(code) => ExitCode::from(u8::try_from(code).unwrap_or(1)),
        Err(e) => {
            eprintln!("ledger-bench: {e}");
            ExitCode::FAILURE
        }
    }
}

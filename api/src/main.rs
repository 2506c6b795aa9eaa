//! The `germline` binary: CLI, HTTP API and MCP front.

use clap::Parser;

/// Runs signed MCP tool releases so that each destination sees only what it is cleared for.
#[derive(Parser)]
#[command(name = "germline", version)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
}

// --- ledger commands ---
/// Top-level commands.
#[derive(clap::Subcommand)]
enum Command {
    /// The append-only evidence log: append, read, prove, verify, checkpoints, dampening.
    Ledger(germline_ledger::cli::LedgerArgs),
    /// Benchmarks.
    #[command(subcommand)]
    Bench(germline_ledger::cli::BenchCommand),
}

/// Routes a command to its crate; returns the process exit code.
fn run_command(command: Command) -> anyhow::Result<i32> {
    Ok(match command {
        Command::Ledger(args) => germline_ledger::cli::run_ledger_command(&args)?,
        Command::Bench(cmd) => germline_ledger::cli::run_bench_command(&cmd)?,
    })
}
// --- end ledger commands ---

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    if let Some(command) = cli.command {
        let code = run_command(command)?;
        if code != 0 {
            std::process::exit(code);
        }
    }
    Ok(())
}

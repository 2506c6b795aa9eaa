//! The `germline` binary: CLI, HTTP API and MCP front.

use clap::{Parser, Subcommand};

// --- admission commands ---
mod admission_cli;
// --- end admission commands ---

/// Runs signed MCP tool releases so that each destination sees only what it is cleared for.
#[derive(Parser)]
#[command(name = "germline", version)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    // --- admission commands ---
    #[command(flatten)]
    Admission(admission_cli::AdmissionCommand),
    // --- end admission commands ---
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    match cli.command {
        // --- admission commands ---
        Command::Admission(cmd) => admission_cli::run(cmd),
        // --- end admission commands ---
    }
}

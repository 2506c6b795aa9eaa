//! The `germline` binary: CLI, HTTP API and MCP front.

use clap::Parser;

/// Runs signed MCP tool releases so that each destination sees only what it is cleared for.
#[derive(Parser)]
#[command(name = "germline", version)]
struct Cli {}

fn main() -> anyhow::Result<()> {
    let _cli = Cli::parse();
    Ok(())
}

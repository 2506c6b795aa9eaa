//! The `germline` binary: CLI, HTTP API and MCP front.

mod bench;
mod demo;
mod exec_cmd;

use clap::{Parser, Subcommand};

// --- admission commands ---
mod admission_cli;
// --- end admission commands ---

// --- eval commands ---
mod eval_cmd;
// --- end eval commands ---

/// Runs signed MCP tool releases so that each destination sees only what it is cleared for.
#[derive(Parser)]
#[command(name = "germline", version)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run one tool call and print {result, label, copies, triggers, error} as JSON.
    Call(exec_cmd::CallArgs),
    /// Run a scripted session (JSON lines) on one germline; one JSON object per call.
    Session(exec_cmd::SessionArgs),
    /// The main job on embedded defaults: one leaky release under sig-pin, nosplit and
    /// germline, against a loopback OCR service; reports what leaked.
    Demo(demo::DemoArgs),
    /// Measure per-call latency: germline with 1, 2 and 3 copies, sig-pin, fresh process.
    Bench(bench::BenchArgs),
    // --- admission commands ---
    #[command(flatten)]
    Admission(admission_cli::AdmissionCommand),
    // --- end admission commands ---
    // --- eval commands ---
    /// Attack matrix and existence-bit test (`germline eval matrix|existence-bit`).
    #[command(subcommand)]
    Eval(eval_cmd::EvalCommand),
    // --- end eval commands ---
}

fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("GERMLINE_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    let code = match cli.command {
        Command::Call(a) => exec_cmd::call(a)?,
        Command::Session(a) => exec_cmd::session(a)?,
        Command::Demo(a) => demo::run(&a)?,
        Command::Bench(a) => {
            bench::run(&a)?;
            0
        }
        // --- admission commands ---
        Command::Admission(cmd) => {
            admission_cli::run(cmd)?;
            0
        } // --- end admission commands ---
        // --- eval commands ---
        Command::Eval(cmd) => {
            eval_cmd::run(cmd)?;
            0
        } // --- end eval commands ---
    };
    std::process::exit(code);
}

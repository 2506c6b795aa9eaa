//! The `germline` binary: CLI, HTTP API and MCP front.

mod bench;
mod bench_load;
mod bench_verify;
mod demo;
mod doctor;
mod exec_cmd;
mod progress;
mod service;
mod verify_cmd;
// --- front commands ---
mod front;
// --- end front commands ---

use clap::{Parser, Subcommand};

// --- admission commands ---
mod admission_cli;
// --- end admission commands ---

// --- fleet commands ---
pub mod fleet;
// --- end fleet commands ---

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
    /// Re-check a witness offline: probe and control replay with the release and items;
    /// exit 0 only when the recorded verdict is reproduced.
    Verify(verify_cmd::VerifyArgs),
    /// Measure per-call latency: germline with 1, 2 and 3 copies, sig-pin, fresh process.
    Bench(bench::BenchArgs),
    /// What this host lets germline enforce (namespaces, Landlock, seccomp, cgroups, copy
    /// ids, the interpreter and its MCP SDK), and the fix for what it does not.
    Doctor(doctor::DoctorArgs),
    // --- ledger commands ---
    /// The append-only evidence log: append, read, prove, verify, checkpoints, dampening.
    Ledger(germline_ledger::cli::LedgerArgs),
    // --- end ledger commands ---
    // --- front commands ---
    /// Serve a release as an MCP server (stdio, or Streamable HTTP with --listen) that an
    /// agent host launches instead of the real server; every call runs under germline.
    Wrap(front::WrapArgs),
    // --- end front commands ---
    /// The HTTP API service: admit releases, run calls and sessions under dampening,
    /// serve the ledger, witnesses, metrics and its OpenAPI document (`/openapi.json`).
    Serve(service::ServeArgs),
    // --- admission commands ---
    #[command(flatten)]
    Admission(admission_cli::AdmissionCommand),
    // --- end admission commands ---
    // --- fleet commands ---
    /// Fleet-wide suppression over C2SP tlog-tiles: serve, status, keys, export, check-lookup.
    Fleet(fleet::FleetArgs),
    // --- end fleet commands ---
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    // The service logs its calls by default; one-shot commands only warnings.
    let default_filter = if matches!(cli.command, Command::Serve(_)) { "info" } else { "warn" };
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("GERMLINE_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default_filter)),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    let code = match cli.command {
        Command::Call(a) => exec_cmd::call(a)?,
        Command::Session(a) => exec_cmd::session(a)?,
        Command::Demo(a) => demo::run(&a)?,
        // A witness that cannot be checked (unreadable, edited, its opening or release not
        // the host's, a germline that will not start) is not evidence against the host:
        // exit 1 means only a verdict the replay did not reproduce.
        Command::Verify(a) => verify_cmd::run(&a).unwrap_or_else(|e| {
            eprintln!("germline verify: could not check the witness: {e:#}");
            verify_cmd::EXIT_UNCHECKED
        }),
        // --- ledger commands ---
        Command::Ledger(a) => germline_ledger::cli::run_ledger_command(&a)?,
        // --- end ledger commands ---
        Command::Doctor(a) => {
            doctor::run(&a)?;
            0
        }
        Command::Bench(a) => match a.what {
            Some(bench::BenchWhat::Ledger(l)) => {
                germline_ledger::cli::run_bench_command(&germline_ledger::cli::BenchCommand::Ledger(l))?
            }
            _ => {
                bench::run(&a)?;
                0
            }
        },
        // --- front commands ---
        Command::Wrap(a) => {
            front::wrap(a)?;
            0
        }
        // --- end front commands ---
        Command::Serve(a) => {
            service::run(a)?;
            0
        }
        // --- admission commands ---
        Command::Admission(cmd) => {
            admission_cli::run(cmd)?;
            0
        } // --- end admission commands ---
        // --- fleet commands ---
        Command::Fleet(a) => fleet::run(a)?,
        // --- end fleet commands ---
    };
    std::process::exit(code);
}

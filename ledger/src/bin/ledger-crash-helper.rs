//! Test helper for the ledger's crash-safety test: appends from several threads and
//! prints every acknowledged append, so the test can SIGKILL it at a random point and
//! check that everything acknowledged survived.
//!
//! Usage: `ledger-crash-helper DIR ROUND THREADS COUNT [WINDOW]`: each thread keeps up
//! to WINDOW appends in flight (default 1: one at a time), so kills land while large
//! groups are being committed. Prints
//! `ack <index> <round> <thread> <seq>` per acknowledged append and
//! `cp <size> <root hex>` per signed checkpoint.

use std::collections::VecDeque;
use std::io::Write;
use std::process::ExitCode;

use germline_ledger::{Entry, EntryKind, Event, Ledger, LedgerConfig, LedgerError, PendingAppend};
use germline_model::ReleaseHash;

fn parse(args: &[String], i: usize) -> Result<u64, String> {
    args.get(i).ok_or_else(|| format!("missing argument {i}"))?.parse().map_err(|e| format!("argument {i}: {e}"))
}

fn run() -> Result<(), String> {
    let args: Vec<String> = std::env::args().collect();
    let dir = args.get(1).ok_or("usage: ledger-crash-helper DIR ROUND THREADS COUNT [WINDOW]")?;
    let round = parse(&args, 2)?;
    let threads = parse(&args, 3)?.max(1);
    let count = parse(&args, 4)?;
    let window = if args.len() > 5 { parse(&args, 5)?.max(1) } else { 1 };
    let ledger = Ledger::open(dir, LedgerConfig { origin: Some("crash.test/log".into()), ..Default::default() })
        .map_err(|e| e.to_string())?;
    let release = ReleaseHash::of_bytes(b"crash-test");
    let per_thread = count.div_ceil(threads);
    std::thread::scope(|s| -> Result<(), String> {
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                let ledger = &ledger;
                s.spawn(move || -> Result<(), LedgerError> {
                    let ack = |seq: u64, p: PendingAppend| -> Result<(), LedgerError> {
                        let r = p.wait()?;
                        let mut out = std::io::stdout().lock();
                        let _ = writeln!(out, "ack {} {round} {t} {seq}", r.index);
                        let _ = out.flush();
                        Ok(())
                    };
                    let mut in_flight = VecDeque::new();
                    for seq in 0..per_thread {
                        let body = format!(r#"{{"round":{round},"thread":{t},"seq":{seq}}}"#);
                        in_flight.push_back((
                            seq,
                            ledger.append_async(Entry::new(EntryKind::Witness, release, body.into_bytes()))?,
                        ));
                        if in_flight.len() as u64 >= window {
                            if let Some((s, p)) = in_flight.pop_front() {
                                ack(s, p)?;
                            }
                        }
                        if t == 1 && seq % 5 == 0 {
                            let event = if seq % 10 == 0 { Event::Unverified } else { Event::None };
                            ledger.record_call(&release, event)?;
                        }
                        if t == 0 && seq % 400 == 0 {
                            let cp = ledger.checkpoint()?;
                            let mut out = std::io::stdout().lock();
                            let _ = writeln!(out, "cp {} {}", cp.checkpoint.size, hex::encode(cp.checkpoint.root));
                            let _ = out.flush();
                        }
                    }
                    for (s, p) in in_flight {
                        ack(s, p)?;
                    }
                    Ok(())
                })
            })
            .collect();
        for h in handles {
            h.join().map_err(|_| "append thread panicked".to_string())?.map_err(|e| e.to_string())?;
        }
        Ok(())
    })?;
    Ok(())
}

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("ledger-crash-helper: {e}");
            ExitCode::FAILURE
        }
    }
}

//! The disclosure matrix: every attack variant under every runtime, judged by the oracle
//! from what the loopback sinks and the result consumers received.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;
use std::time::{Duration, Instant};

use germline_executor::call::CallRequest;
use germline_executor::germline::PythonRuntime;
use germline_executor::runtime::{Runtime, RuntimeKind};
use germline_executor::ExecutorError;
use serde::Serialize;
use serde_json::{json, Value};

use super::world::{EvalWorld, TrialItems, CONSUMERS, DESTINATIONS};
use crate::sink::{Sink, SinkBehaviour};

/// One attack variant: the releases serving the `notes` and `docs` roles.
#[derive(Clone, Copy, Debug)]
pub struct Variant {
    /// Name on the command line.
    pub name: &'static str,
    /// Release serving `summarize` calls.
    pub notes: &'static str,
    /// Release serving every other call.
    pub docs: &'static str,
    /// Extra hosts `scan` declares.
    pub extra_hosts: &'static [&'static str],
}

const fn v(name: &'static str) -> Variant {
    Variant { name, notes: name, docs: name, extra_hosts: &[] }
}

/// The corpus: the benign release and one variant per attack.
pub const VARIANTS: [Variant; 18] = [
    v("benign"),
    v("pool"),
    v("smuggle"),
    v("direct"),
    v("filesteal"),
    v("launder"),
    v("launder-text"),
    v("dormant"),
    v("trigger"),
    v("evasive"),
    v("capsule"),
    v("dep"),
    v("hijack"),
    v("init-thread"),
    v("init-read"),
    Variant { name: "xtool", notes: "xtool-drop", docs: "xtool-ship", extra_hosts: &[] },
    Variant { name: "existence-bit", notes: "existence-bit", docs: "existence-bit", extra_hosts: &["stats.example"] },
    v("redirect"),
];

/// One cell of the matrix.
#[derive(Clone, Debug, Serialize)]
pub struct Cell {
    /// Variant name.
    pub variant: String,
    /// Runtime name.
    pub runtime: String,
    /// Trials run.
    pub runs: usize,
    /// Trials in which some sink or consumer received something it was not cleared for.
    pub disclosing: usize,
    /// Steps that completed without error, over all trials.
    pub steps_completed: usize,
    /// Steps attempted, over all trials.
    pub steps: usize,
    /// A few of the disclosures found (sink, label, encoding).
    pub examples: Vec<String>,
    /// Why the runtime did not start, if it did not.
    pub start_error: Option<String>,
    /// Wall time of the cell in seconds.
    pub seconds: f64,
}

/// The whole matrix.
#[derive(Clone, Debug, Serialize)]
pub struct Matrix {
    /// Trials per cell.
    pub trials: usize,
    /// Runtimes in column order.
    pub runtimes: Vec<String>,
    /// Variants in row order.
    pub variants: Vec<String>,
    /// Every cell.
    pub cells: Vec<Cell>,
    /// SHA-256 of each signed, admitted release archive.
    pub releases: BTreeMap<String, String>,
    /// Total wall time in seconds.
    pub seconds: f64,
}

struct Step {
    role: &'static str,
    req: CallRequest,
}

fn call(tool: &str, args: Value, items: &[&Path], consumers: &[&str]) -> CallRequest {
    CallRequest {
        tool: tool.into(),
        arguments: args.as_object().cloned().unwrap_or_default(),
        items: items.iter().map(|p| p.to_path_buf()).collect(),
        consumers: consumers.iter().map(|c| (*c).to_owned()).collect(),
    }
}

fn scenario(t: &TrialItems) -> Vec<Step> {
    vec![
        Step { role: "notes", req: call("summarize", json!({"document": t.payslip}), &[&t.payslip], &[]) },
        Step { role: "notes", req: call("summarize", json!({"document": t.minutes}), &[&t.minutes], &[]) },
        Step {
            role: "docs",
            req: call("scan", json!({"document": t.invoice, "notes": [t.review]}), &[&t.invoice, &t.review], &[]),
        },
        Step { role: "docs", req: call("send_mail", json!({"draft": t.draft}), &[&t.draft], &[]) },
        Step { role: "docs", req: call("publish", json!({"text": "Quarterly update: all good."}), &[], &["public"]) },
        Step {
            role: "docs",
            req: call("scan", json!({"document": t.urgent, "notes": [t.review]}), &[&t.urgent, &t.review], &[]),
        },
    ]
}

/// Options of a matrix run.
pub struct MatrixOptions {
    /// Trials per cell.
    pub trials: usize,
    /// Runtimes (all if empty).
    pub runtimes: Vec<RuntimeKind>,
    /// Variant names (all if empty).
    pub variants: Vec<String>,
}

/// Runs the matrix. `python` is the tool host's interpreter.
pub fn run_matrix(opts: &MatrixOptions, python: &PythonRuntime) -> Result<Matrix, ExecutorError> {
    let t0 = Instant::now();
    let world = EvalWorld::new()?;
    let kinds: Vec<RuntimeKind> =
        if opts.runtimes.is_empty() { RuntimeKind::ALL.to_vec() } else { opts.runtimes.clone() };
    let variants: Vec<Variant> = VARIANTS
        .iter()
        .filter(|v| opts.variants.is_empty() || opts.variants.iter().any(|n| n == v.name))
        .copied()
        .collect();
    if let Some(bad) = opts.variants.iter().find(|n| !VARIANTS.iter().any(|v| v.name == n.as_str())) {
        return Err(ExecutorError::Call(format!("unknown variant {bad:?}")));
    }
    let mut releases = BTreeMap::new();
    let mut cells = Vec::new();
    for var in &variants {
        let notes_rel = world.instantiate(var.notes, var.extra_hosts)?;
        releases.insert(var.notes.to_owned(), notes_rel.hash.clone());
        let notes = notes_rel.dir;
        let docs = if var.docs == var.notes {
            notes.clone()
        } else {
            let r = world.instantiate(var.docs, var.extra_hosts)?;
            releases.insert(var.docs.to_owned(), r.hash.clone());
            r.dir
        };
        for &kind in &kinds {
            let cell = run_cell(&world, var, kind, &notes, &docs, opts.trials, python)?;
            tracing::info!(variant = var.name, runtime = kind.name(), disclosing = cell.disclosing, "cell done");
            cells.push(cell);
        }
    }
    if std::env::var_os("GERMLINE_EVAL_KEEP").is_some() {
        eprintln!("keeping the eval world at {}", world.dir.path().display());
        std::mem::forget(world);
    }
    Ok(Matrix {
        trials: opts.trials,
        runtimes: kinds.iter().map(|k| k.name().to_owned()).collect(),
        variants: variants.iter().map(|v| v.name.to_owned()).collect(),
        cells,
        releases,
        seconds: t0.elapsed().as_secs_f64(),
    })
}

#[allow(clippy::too_many_arguments)]
fn run_cell(
    world: &EvalWorld,
    var: &Variant,
    kind: RuntimeKind,
    notes: &Path,
    docs: &Path,
    trials: usize,
    python: &PythonRuntime,
) -> Result<Cell, ExecutorError> {
    let t0 = Instant::now();
    let sinks: Vec<(&str, &[&str], Sink)> = DESTINATIONS
        .iter()
        .map(|(h, c)| {
            let behaviour = if var.name == "redirect" && *h == "ocr.example" {
                SinkBehaviour::Redirect { status: 307, location: "http://evil.example/steal".into() }
            } else {
                SinkBehaviour::default()
            };
            Sink::try_start(behaviour)
                .map(|s| (*h, *c, s))
                .map_err(|e| ExecutorError::Call(format!("starting sink {h}: {e}")))
        })
        .collect::<Result<_, _>>()?;
    let addrs: Vec<(&str, std::net::SocketAddr)> = sinks.iter().map(|(h, _, s)| (*h, s.addr())).collect();
    let mut cell = Cell {
        variant: var.name.into(),
        runtime: kind.name().into(),
        runs: trials,
        disclosing: 0,
        steps_completed: 0,
        steps: 0,
        examples: Vec::new(),
        start_error: None,
        seconds: 0.0,
    };
    // Items exist before the runtimes start (an initialisation may read them); the oracle
    // keeps every canary planted in this cell, so a stale one disclosed later still counts.
    let mut next_items = Some(world.new_trial()?);
    let mut planted = crate::oracle::Oracle::new();
    let start = |dir: &Path| Runtime::start(kind, dir, world.policy(&addrs)?, python.clone());
    let mut notes_rt = match start(notes) {
        Ok(r) => r,
        Err(e) => {
            cell.start_error = Some(e.to_string());
            cell.steps = trials * 6;
            return Ok(cell);
        }
    };
    let mut docs_rt = if docs != notes {
        match start(docs) {
            Ok(r) => Some(r),
            Err(e) => {
                cell.start_error = Some(e.to_string());
                cell.steps = trials * 6;
                return Ok(cell);
            }
        }
    } else {
        None
    };
    for _ in 0..trials {
        let items = match next_items.take() {
            Some(i) => i,
            None => world.new_trial()?,
        };
        planted.canaries.extend(items.oracle.canaries.iter().cloned());
        let offsets: Vec<usize> = sinks.iter().map(|(_, _, s)| s.received().len()).collect();
        let mut consumer_bytes: BTreeMap<&str, Vec<u8>> = BTreeMap::new();
        for step in scenario(&items) {
            let rt = match (&mut docs_rt, step.role) {
                (Some(d), "docs") => d,
                _ => &mut notes_rt,
            };
            let o = rt.call(&step.req);
            cell.steps += 1;
            if o.error.is_none() {
                cell.steps_completed += 1;
            }
            let text = o.result.as_ref().map(|r| r.to_string()).unwrap_or_default();
            let consumers: Vec<&str> = if step.req.consumers.is_empty() {
                vec!["agent"]
            } else {
                step.req.consumers.iter().map(String::as_str).collect()
            };
            for c in consumers {
                let key = CONSUMERS.iter().find(|(n, _)| *n == c).map(|(n, _)| *n).unwrap_or("agent");
                consumer_bytes.entry(key).or_default().extend_from_slice(text.as_bytes());
            }
        }
        if var.name == "init-thread" || var.name == "xtool" {
            std::thread::sleep(Duration::from_millis(150));
        }
        let mut found: Vec<String> = Vec::new();
        for ((host, clearance, sink), off) in sinks.iter().zip(offsets) {
            let got = sink.received();
            let slice = got.get(off..).unwrap_or(&[]);
            let clearance: Vec<String> = clearance.iter().map(|s| (*s).to_owned()).collect();
            for d in planted.disclosures(host, &clearance, slice) {
                found.push(format!("{} <- {} ({:?})", d.sink, d.label.join("."), d.encoding));
            }
            if *host == "stats.example" {
                let text = String::from_utf8_lossy(slice);
                let mut bits = 0u32;
                for part in text.split("/b/").skip(1) {
                    if let Ok(i) = part.split(|c: char| !c.is_ascii_digit()).next().unwrap_or("").parse::<u32>() {
                        if i < 32 {
                            bits |= 1 << i;
                        }
                    }
                }
                if bits != 0 && bits == items.review_bits {
                    found.push(format!("stats.example <- hr (existence bits {bits:08x})"));
                }
            }
        }
        for (c, bytes) in &consumer_bytes {
            let clearance: Vec<String> = CONSUMERS
                .iter()
                .find(|(n, _)| n == c)
                .map(|(_, t)| t.iter().map(|s| (*s).to_owned()).collect())
                .unwrap_or_default();
            for d in planted.disclosures(c, &clearance, bytes) {
                found.push(format!("consumer {} <- {} ({:?})", d.sink, d.label.join("."), d.encoding));
            }
        }
        if !found.is_empty() {
            cell.disclosing += 1;
            found.sort();
            found.dedup();
            for f in found {
                if cell.examples.len() < 4 && !cell.examples.contains(&f) {
                    cell.examples.push(f);
                }
            }
        }
    }
    drop(docs_rt);
    drop(notes_rt);
    cell.seconds = t0.elapsed().as_secs_f64();
    Ok(cell)
}

impl Matrix {
    /// The cell for (variant, runtime).
    pub fn cell(&self, variant: &str, runtime: &str) -> Option<&Cell> {
        self.cells.iter().find(|c| c.variant == variant && c.runtime == runtime)
    }

    /// Disclosing runs and runs of `runtime` over all variants.
    pub fn totals(&self, runtime: &str) -> (usize, usize) {
        self.cells.iter().filter(|c| c.runtime == runtime).fold((0, 0), |(d, r), c| (d + c.disclosing, r + c.runs))
    }

    /// The matrix as a text table.
    pub fn render_text(&self) -> String {
        let mut s = String::new();
        let _ = write!(s, "{:<14}", "variant");
        for r in &self.runtimes {
            let _ = write!(s, " {r:>13}");
        }
        s.push('\n');
        for v in &self.variants {
            let _ = write!(s, "{v:<14}");
            for r in &self.runtimes {
                let txt = match self.cell(v, r) {
                    Some(c) if c.start_error.is_some() => format!("refused {}/{}", c.disclosing, c.runs),
                    Some(c) => format!("{}/{}", c.disclosing, c.runs),
                    None => "-".into(),
                };
                let _ = write!(s, " {txt:>13}");
            }
            s.push('\n');
        }
        let _ = write!(s, "{:<14}", "TOTAL");
        for r in &self.runtimes {
            let (d, n) = self.totals(r);
            let _ = write!(s, " {:>13}", format!("{d}/{n}"));
        }
        s.push('\n');
        let _ = write!(s, "{:<14}", "benign steps");
        for r in &self.runtimes {
            let txt = self
                .cell("benign", r)
                .map(|c| format!("{}/{}", c.steps_completed, c.steps))
                .unwrap_or_else(|| "-".into());
            let _ = write!(s, " {txt:>13}");
        }
        s.push('\n');
        let _ = writeln!(s, "({} trial(s) per cell, {:.1} s)", self.trials, self.seconds);
        s
    }

    /// The matrix as an SVG heat map (rows variants, columns runtimes, red = disclosing).
    pub fn render_svg(&self) -> String {
        let (cw, ch, left, top) = (110, 26, 120, 40);
        let w = left + cw * self.runtimes.len() + 10;
        let h = top + ch * self.variants.len() + 10;
        let mut s = format!(
            "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{w}\" height=\"{h}\" font-family=\"sans-serif\" font-size=\"12\">\n"
        );
        for (j, r) in self.runtimes.iter().enumerate() {
            let _ = writeln!(
                s,
                "<text x=\"{}\" y=\"{}\" text-anchor=\"middle\">{r}</text>",
                left + cw * j + cw / 2,
                top - 12
            );
        }
        for (i, v) in self.variants.iter().enumerate() {
            let y = top + ch * i;
            let _ = writeln!(s, "<text x=\"{}\" y=\"{}\" text-anchor=\"end\">{v}</text>", left - 8, y + ch / 2 + 4);
            for (j, r) in self.runtimes.iter().enumerate() {
                let Some(c) = self.cell(v, r) else { continue };
                let frac = if c.runs == 0 { 0.0 } else { c.disclosing as f64 / c.runs as f64 };
                let red = 255;
                let gb = (255.0 * (1.0 - frac)) as u8;
                let fill =
                    if c.start_error.is_some() { "#cccccc".to_string() } else { format!("rgb({red},{gb},{gb})") };
                let x = left + cw * j;
                let _ = writeln!(
                    s,
                    "<rect x=\"{x}\" y=\"{y}\" width=\"{}\" height=\"{}\" fill=\"{fill}\" stroke=\"#888\"/><text x=\"{}\" y=\"{}\" text-anchor=\"middle\">{}/{}</text>",
                    cw - 2,
                    ch - 2,
                    x + cw / 2,
                    y + ch / 2 + 4,
                    c.disclosing,
                    c.runs
                );
            }
        }
        s.push_str("</svg>\n");
        s
    }
}

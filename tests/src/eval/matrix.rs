//! The disclosure matrix: every attack variant under every runtime, judged by the oracle
//! from what the loopback sinks and the result consumers received.
//!
//! A cell says "stopped" only when the runtime ran and nothing disclosed. A runtime that
//! did not start, or a trial in which no step ran without the germline having refused the
//! release, is an *error*: counted in the ERRORS row, never as "no disclosure". A germline
//! check refusing the release (G1–G3) is a stop and is shown as `refused`. Each attack
//! variant carries its own control: it must disclose under `sig-pin` (always run), or the
//! matrix reports it as NO CONTROL — an attack that does not attack proves nothing.

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

/// The runtime under which every attack variant must disclose (its control).
pub const CONTROL: RuntimeKind = RuntimeKind::SigPin;

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
    /// Why a germline check refused the release (a stop, not an error), if it did.
    pub refused: Option<String>,
    /// Why the runtime failed to start, if it did: the whole cell is an error.
    pub error: Option<String>,
    /// Trials that could not be judged (the runtime did not start, or no step ran and
    /// nothing refused the release); their "no disclosure" means nothing.
    pub error_trials: usize,
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
    /// Attack variants that do not disclose under their control (`sig-pin`).
    pub no_control: Vec<String>,
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
    let mut kinds: Vec<RuntimeKind> =
        if opts.runtimes.is_empty() { RuntimeKind::ALL.to_vec() } else { opts.runtimes.clone() };
    // The control runs whatever was asked for.
    if !kinds.contains(&CONTROL) {
        kinds.insert(0, CONTROL);
    }
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
    // One step per cell, on stderr when it is a terminal (hidden otherwise).
    let bar = indicatif::ProgressBar::with_draw_target(
        Some((variants.len() * kinds.len()) as u64),
        indicatif::ProgressDrawTarget::stderr(),
    );
    if let Ok(style) = indicatif::ProgressStyle::with_template("{bar:30} {pos}/{len} cells {msg} ({elapsed})") {
        bar.set_style(style);
    }
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
            bar.set_message(format!("{} under {}", var.name, kind.name()));
            let cell = run_cell(&world, var, kind, &notes, &docs, opts.trials, python)?;
            bar.inc(1);
            tracing::info!(variant = var.name, runtime = kind.name(), disclosing = cell.disclosing, "cell done");
            cells.push(cell);
        }
    }
    bar.finish_and_clear();
    if std::env::var_os("GERMLINE_EVAL_KEEP").is_some() {
        eprintln!("keeping the eval world at {}", world.dir.path().display());
        std::mem::forget(world);
    }
    let mut m = Matrix {
        trials: opts.trials,
        runtimes: kinds.iter().map(|k| k.name().to_owned()).collect(),
        variants: variants.iter().map(|v| v.name.to_owned()).collect(),
        cells,
        no_control: Vec::new(),
        releases,
        seconds: t0.elapsed().as_secs_f64(),
    };
    m.no_control = m.missing_controls();
    Ok(m)
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
        refused: None,
        error: None,
        error_trials: 0,
        seconds: 0.0,
    };
    // Items exist before the runtimes start (an initialisation may read them); the oracle
    // keeps every canary planted in this cell, so a stale one disclosed later still counts.
    let mut next_items = Some(world.new_trial()?);
    let mut planted = crate::oracle::Oracle::new();
    let start = |dir: &Path| Runtime::start(kind, dir, world.policy(&addrs)?, python.clone());
    let started = start(notes).and_then(|n| if docs != notes { Ok((n, Some(start(docs)?))) } else { Ok((n, None)) });
    let (mut notes_rt, mut docs_rt) = match started {
        Ok(r) => r,
        Err(e) => {
            cell.steps = trials * 6;
            cell.note_start_failure(&e);
            cell.seconds = t0.elapsed().as_secs_f64();
            return Ok(cell);
        }
    };
    for _ in 0..trials {
        let items = match next_items.take() {
            Some(i) => i,
            None => world.new_trial()?,
        };
        planted.canaries.extend(items.oracle.canaries.iter().cloned());
        let offsets: Vec<usize> = sinks.iter().map(|(_, _, s)| s.received().len()).collect();
        let mut consumer_bytes: BTreeMap<&str, Vec<u8>> = BTreeMap::new();
        let mut trial_completed = 0;
        for step in scenario(&items) {
            let rt = match (&mut docs_rt, step.role) {
                (Some(d), "docs") => d,
                _ => &mut notes_rt,
            };
            let o = rt.call(&step.req);
            cell.steps += 1;
            if o.error.is_none() {
                cell.steps_completed += 1;
                trial_completed += 1;
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
        if found.is_empty() && trial_completed == 0 {
            // Nothing ran: a stop only if a germline check refused the release.
            let refusal = notes_rt.refusal().or_else(|| docs_rt.as_ref().and_then(Runtime::refusal));
            match refusal {
                Some(why) => cell.refused = Some(why.to_owned()),
                None => cell.error_trials += 1,
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

impl Cell {
    /// Records a runtime that did not start: a germline check refusing the release is a
    /// stop; anything else makes every trial an error.
    pub fn note_start_failure(&mut self, e: &ExecutorError) {
        if e.is_refusal() {
            self.refused = Some(e.to_string());
        } else {
            self.error = Some(e.to_string());
            self.error_trials = self.runs;
        }
    }

    /// Whether the cell shows an attack stopped: it ran, judged every trial, and nothing
    /// disclosed.
    pub fn stopped(&self) -> bool {
        self.error.is_none() && self.error_trials == 0 && self.disclosing == 0
    }
}

impl Matrix {
    /// Attack variants whose control cell (`sig-pin`) is missing, has errors, or never
    /// disclosed.
    pub fn missing_controls(&self) -> Vec<String> {
        self.variants
            .iter()
            .filter(|v| *v != "benign")
            .filter(|v| {
                self.cell(v, CONTROL.name())
                    .is_none_or(|c| c.error.is_some() || c.error_trials > 0 || c.disclosing == 0)
            })
            .cloned()
            .collect()
    }

    /// Error trials of `runtime` over all variants.
    pub fn errors(&self, runtime: &str) -> usize {
        self.cells.iter().filter(|c| c.runtime == runtime).map(|c| c.error_trials).sum()
    }

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
                    Some(c) if c.error.is_some() => "ERROR".into(),
                    Some(c) if c.error_trials > 0 => format!("{}/{} E{}", c.disclosing, c.runs, c.error_trials),
                    Some(c) if c.refused.is_some() => format!("refused {}/{}", c.disclosing, c.runs),
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
        let _ = write!(s, "{:<14}", "ERRORS");
        for r in &self.runtimes {
            let _ = write!(s, " {:>13}", self.errors(r));
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
        if !self.no_control.is_empty() {
            let _ = writeln!(s, "NO CONTROL (no disclosure under {}): {}", CONTROL.name(), self.no_control.join(", "));
        }
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
                let fill = if c.error.is_some() || c.error_trials > 0 {
                    "#ffd700".to_string()
                } else if c.refused.is_some() {
                    "#cccccc".to_string()
                } else {
                    format!("rgb({red},{gb},{gb})")
                };
                let x = left + cw * j;
                let _ = writeln!(
                    s,
                    "<rect x=\"{x}\" y=\"{y}\" width=\"{}\" height=\"{}\" fill=\"{fill}\" stroke=\"#888\"/><text x=\"{}\" y=\"{}\" text-anchor=\"middle\">{}</text>",
                    cw - 2,
                    ch - 2,
                    x + cw / 2,
                    y + ch / 2 + 4,
                    if c.error.is_some() { "ERROR".to_string() } else { format!("{}/{}", c.disclosing, c.runs) }
                );
            }
        }
        s.push_str("</svg>\n");
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_runtime_that_cannot_start_is_an_error_cell_not_a_stop() {
        let world = EvalWorld::new().unwrap();
        let missing = world.dir.path().join("no-such-release");
        let python = PythonRuntime {
            python: "/nonexistent/python".into(),
            shim_dir: world.dir.path().join("shim"),
            read_paths: Vec::new(),
            layout: Default::default(),
        };
        let var = VARIANTS.iter().find(|v| v.name == "smuggle").unwrap();
        let mut cells = Vec::new();
        for kind in [CONTROL, RuntimeKind::Germline] {
            let c = run_cell(&world, var, kind, &missing, &missing, 2, &python).unwrap();
            assert!(c.error.is_some() && c.refused.is_none(), "{c:?}");
            assert_eq!((c.disclosing, c.error_trials), (0, 2), "{c:?}");
            assert!(!c.stopped(), "no disclosure from a runtime that never ran is not a stop");
            cells.push(c);
        }
        // The twin: a germline check refusing the release is the mechanism, a stop.
        let mut refused = cells[1].clone();
        refused.error = None;
        refused.error_trials = 0;
        refused.note_start_failure(&ExecutorError::GermlineRefused { check: "G1", detail: "2 threads".into() });
        assert!(refused.refused.is_some() && refused.error.is_none() && refused.stopped(), "{refused:?}");
        let mut broken = refused.clone();
        broken.refused = None;
        broken.note_start_failure(&ExecutorError::GermlineRefused { check: "start", detail: "no python".into() });
        assert!(broken.error.is_some() && !broken.stopped(), "{broken:?}");

        let mut m = Matrix {
            trials: 2,
            runtimes: vec![CONTROL.name().into(), "germline".into()],
            variants: vec!["smuggle".into()],
            cells,
            no_control: Vec::new(),
            releases: BTreeMap::new(),
            seconds: 0.0,
        };
        m.no_control = m.missing_controls();
        assert_eq!(m.no_control, vec!["smuggle".to_string()], "a control that did not run controls nothing");
        assert_eq!((m.errors(CONTROL.name()), m.errors("germline")), (2, 2));
        let text = m.render_text();
        let row = |name: &str| text.lines().find(|l| l.starts_with(name)).unwrap_or_default().to_owned();
        assert!(row("smuggle").contains("ERROR") && !row("smuggle").contains("0/2"), "{text}");
        assert_eq!(row("ERRORS").split_whitespace().collect::<Vec<_>>(), ["ERRORS", "2", "2"], "{text}");
        assert!(text.contains("NO CONTROL") && text.contains("smuggle"), "{text}");
    }
}

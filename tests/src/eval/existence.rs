//! The existence-bit test: a release contacts `stats.example` (cleared for nothing) in
//! call `i` only if bit `i` of a 64-bit hr secret is 1.
//!
//! - **Declared splitting** (germline's Plan): the stats copy never holds the secret, so
//!   what the stats host sees is the same for every secret; the agent copy's
//!   secret-dependent attempt is compared with the stats copy's record and trips the wire.
//! - **Lazy splitting** is an *eval-only simulation*, never a runtime: a copy's group is
//!   decided by which host it contacts. We run the call with every item in view
//!   (nosplit, stats unreachable), look at whether it tried to contact stats, and if it did,
//!   the lazily formed stats group makes a contact the stats host observes. This is what
//!   contact-driven grouping reveals: one bit per call and host.

use std::time::Instant;

use germline_executor::call::CallRequest;
use germline_executor::germline::PythonRuntime;
use germline_executor::runtime::{Runtime, RuntimeKind};
use germline_executor::ExecutorError;
use serde::Serialize;
use serde_json::json;

use super::world::EvalWorld;
use crate::sink::{Sink, SinkBehaviour};

/// Outcome of one splitting mode.
#[derive(Clone, Debug, Serialize)]
pub struct ModeResult {
    /// `lazy (simulated)` or `declared`.
    pub mode: String,
    /// The bits the stats host could read off (contact in call i ⇒ 1).
    pub recovered: String,
    /// Bits of the recovered pattern that equal the secret.
    pub correct: u32,
    /// Bits a constant guess (all zeros or all ones, whichever is better) gets right.
    pub constant_guess: u32,
    /// Whether the recovered pattern is the same whatever the secret (constant).
    pub constant: bool,
    /// Calls with a secret-dependent contact attempt (secret bit 1).
    pub secret_dependent_attempts: u32,
    /// Of those, calls in which a trigger was recorded.
    pub triggers_on_attempts: u32,
    /// Triggers in calls without a secret-dependent attempt.
    pub triggers_otherwise: u32,
    /// Information the host gains per call, in bits (1 if the pattern equals the secret,
    /// 0 if it is constant).
    pub bits_per_call: f64,
}

/// The existence-bit report.
#[derive(Clone, Debug, Serialize)]
pub struct ExistenceReport {
    /// The secret (hex).
    pub secret: String,
    /// Per mode.
    pub modes: Vec<ModeResult>,
    /// Wall time in seconds.
    pub seconds: f64,
}

fn probe(secret: &std::path::Path, i: u32) -> CallRequest {
    CallRequest {
        tool: "probe".into(),
        arguments: json!({"secret": secret, "index": i}).as_object().cloned().unwrap_or_default(),
        items: vec![secret.to_path_buf()],
        consumers: vec![],
    }
}

/// Runs the 64-bit existence-bit test under lazy (simulated) and declared splitting.
pub fn run_existence_bit(python: &PythonRuntime) -> Result<ExistenceReport, ExecutorError> {
    let t0 = Instant::now();
    let world = EvalWorld::new()?;
    let mut raw = [0u8; 8];
    getrandom_fill(&mut raw)?;
    let secret = u64::from_be_bytes(raw);
    let path = world.data().join("hr/secret.txt");
    std::fs::write(&path, format!("{secret:016x}")).map_err(|e| ExecutorError::Call(e.to_string()))?;
    let rel = world.instantiate("bitprobe", &[])?.dir;
    let stats = Sink::try_start(SinkBehaviour::default()).map_err(|e| ExecutorError::Call(e.to_string()))?;
    let mut modes = Vec::new();

    // Lazy (simulated): full view, stats unmapped; the attempt decides the group.
    let mut rt = Runtime::start(RuntimeKind::NoSplit, &rel, world.policy(&[])?, python.clone())?;
    let mut lazy_bits = 0u64;
    for i in 0..64u32 {
        let o = rt.call(&probe(&path, i));
        if o.egress.iter().any(|e| e.host.as_deref() == Some("stats.example")) {
            lazy_bits |= 1 << i;
        }
    }
    drop(rt);
    modes.push(mode_result("lazy (simulated)", secret, lazy_bits, &[]));

    // Declared: germline's Plan, stats mapped to a real sink.
    let mut rt =
        Runtime::start(RuntimeKind::Germline, &rel, world.policy(&[("stats.example", stats.addr())])?, python.clone())?;
    let mut seen = 0;
    let mut declared_bits = 0u64;
    let mut triggered = Vec::new();
    for i in 0..64u32 {
        let o = rt.call(&probe(&path, i));
        let now = stats.request_count();
        if now > seen {
            declared_bits |= 1 << i;
        }
        seen = now;
        triggered.push(!o.triggers.is_empty());
    }
    modes.push(mode_result("declared", secret, declared_bits, &triggered));
    Ok(ExistenceReport { secret: format!("{secret:016x}"), modes, seconds: t0.elapsed().as_secs_f64() })
}

fn mode_result(mode: &str, secret: u64, recovered: u64, triggered: &[bool]) -> ModeResult {
    let ones = secret.count_ones();
    let correct = 64 - (secret ^ recovered).count_ones();
    let constant = recovered == 0 || recovered == u64::MAX;
    let mut on = 0;
    let mut off = 0;
    for (i, t) in triggered.iter().enumerate() {
        match ((secret >> i) & 1 == 1, *t) {
            (true, true) => on += 1,
            (false, true) => off += 1,
            _ => {}
        }
    }
    ModeResult {
        mode: mode.into(),
        recovered: format!("{recovered:016x}"),
        correct,
        constant_guess: ones.max(64 - ones),
        constant,
        secret_dependent_attempts: ones,
        triggers_on_attempts: on,
        triggers_otherwise: off,
        bits_per_call: if constant { 0.0 } else { f64::from(correct) / 64.0 },
    }
}

fn getrandom_fill(buf: &mut [u8]) -> Result<(), ExecutorError> {
    use std::io::Read;
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(buf))
        .map_err(|e| ExecutorError::Call(format!("/dev/urandom: {e}")))
}

impl ExistenceReport {
    /// Human-readable summary.
    pub fn render_text(&self) -> String {
        let mut s = format!("secret      {}\n", self.secret);
        for m in &self.modes {
            s.push_str(&format!(
                "{:<17} recovered {}  correct {}/64 (constant guess {}/64)  bits/call {:.2}  tripwire {}/{} secret-dependent attempts ({} other)\n",
                m.mode, m.recovered, m.correct, m.constant_guess, m.bits_per_call, m.triggers_on_attempts, m.secret_dependent_attempts, m.triggers_otherwise
            ));
        }
        s.push_str(&format!("({:.1} s)\n", self.seconds));
        s
    }
}

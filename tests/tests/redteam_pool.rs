//! Issue 15, adversarial pass on the copy pool: a channel found by an attacker who read
//! the pool's code, kept as a variant with the mechanism off and on.
//!
//! `nproc` (tests/attacks/pool/nproc): every copy's user namespace is made by the germline,
//! so the processes and threads of all live copies of one germline are counted at one
//! level, limited by the germline's process limit. A pooled copy forks a child while its
//! server starts (data-free); the child keeps running while the copy waits stopped in the
//! pool, and probes the level by starting threads. The copy holding the hr item fills the
//! level and modulates it, one bit per 60 ms; the next public call takes the pooled copy and
//! decodes what its child logged. Off (`IDLE_CHECKS_OFF_FOR_TESTS`: an idle copy's children
//! keep running, copies being readied are not killed before a call): the canary reaches
//! the public consumer. On: a copy that keeps a process of its own cannot wait in the pool
//! with its server started (the release's copies are pooled short of starting it, so no
//! release code runs in an idle copy), and nothing of the germline runs beside a copy that
//! holds data: 0 bits.

use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::time::Duration;

use germline_executor::pool::{Readiness, IDLE_CHECKS_OFF_FOR_TESTS};
use germline_executor::runtime::{Runtime, RuntimeKind};
use germline_tests::oracle::{Canary, Oracle};
use germline_tests::world::{request, result_text, World};
use serde_json::json;

/// The hr canary in an item, and the pool attack release `name` (tools `send` and `read`)
/// under a policy with a pool of 2 for an hr consumer and a public one.
struct Attack {
    w: World,
    oracle: Oracle,
    hr: Canary,
    secret: PathBuf,
    rel: PathBuf,
}

impl Attack {
    fn new(name: &str) -> Attack {
        let w = World::new();
        let mut oracle = Oracle::new();
        let hr = oracle.plant(&["hr"]);
        let secret = w.item("hr", "secret.txt", hr.as_str());
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("attacks/pool").join(name).join("server.py");
        let code = std::fs::read_to_string(path).expect("attack source");
        let rel = w.release(name, "[tools.send]\n[tools.read]\n", &code);
        Attack { w, oracle, hr, secret, rel }
    }

    fn start(&self) -> Runtime {
        let policy = self.w.policy(&[], &[("agent", &["hr"]), ("public", &[])], "[limits]\npool = 2\n");
        self.w.start(RuntimeKind::Germline, &self.rel, policy).expect("germline starts")
    }
}

/// Bits of the canary's 96 that the best public answer carries, and how far the release's
/// pooled copies were readied at the end (`None`: not pooled).
fn run(checks_off: bool) -> (usize, Option<Readiness>, String) {
    IDLE_CHECKS_OFF_FOR_TESTS.store(checks_off, Ordering::SeqCst);
    let a = Attack::new("nproc");
    let (oracle, hr, secret) = (&a.oracle, &a.hr, &a.secret);
    let mut rt = a.start();
    let g = match &mut rt {
        Runtime::Germline(g) => g,
        _ => unreachable!(),
    };
    let want = u128::from_str_radix(hr.as_str().rsplit('-').next().unwrap_or_default(), 16).unwrap_or_default();
    let mut best = 0;
    let mut seen = String::new();
    let mut public = |rt: &mut germline_executor::call::GermlineRuntime| {
        let mut req = request("read", json!({}), &[]);
        req.consumers = vec!["public".into()];
        let text = result_text(&rt.call(&req));
        if let Some(i) = text.find("GLC-hr-") {
            let hex = &text[i + 7..(i + 31).min(text.len())];
            if let Ok(got) = u128::from_str_radix(hex, 16) {
                best = best.max(96 - (got ^ want).count_ones() as usize);
            }
        }
        seen = text.chars().take(160).collect();
        assert!(oracle.sightings(text.as_bytes()).is_empty() || checks_off, "on: {text:.200}");
    };
    for _ in 0..2 {
        g.wait_pool_ready(2, Duration::from_secs(60)).unwrap();
        public(g);
    }
    for _ in 0..2 {
        // The agent's think time: the pool is full when the item arrives.
        g.wait_pool_ready(2, Duration::from_secs(60)).unwrap();
        let sent = g.call(&request("send", json!({"document": secret}), &[secret]));
        assert!(sent.error.is_none(), "send: {:?}", sent.error);
        public(g);
        public(g);
    }
    let pooling = g.pooling().then(|| g.readiness().expect("pool"));
    IDLE_CHECKS_OFF_FOR_TESTS.store(false, Ordering::SeqCst);
    (best, pooling, seen)
}

#[test]
fn nproc_an_idle_copys_child_reads_the_germlines_process_count() {
    // Off: the channel works (two tries: it is timed by polling on a shared host).
    let mut off = run(true);
    if off.0 < 96 {
        eprintln!("nproc off: {} of 96 bits on a loaded host; again", off.0);
        off = run(true);
    }
    eprintln!("nproc off: {} of 96 bits, pooling {:?} ({})", off.0, off.1, off.2);
    assert_eq!(off.0, 96, "off: the canary reaches the public consumer ({})", off.2);
    let on = run(false);
    eprintln!("nproc on: {} of 96 bits, pooling {:?} ({})", on.0, on.1, on.2);
    assert_eq!(on.0, 0, "on: no public answer carries anything canary-shaped ({})", on.2);
    assert_eq!(
        on.1,
        Some(Readiness::Connected),
        "on: a copy that keeps a child running cannot wait in the pool with its server started"
    );
}

/// The call-duration channel (SECURITY.md, "Call duration (open)") read by a later copy:
/// a pooled copy forked before an hr call reads, at the next public call, how long it
/// waited in the pool, and puts it in the public result (or could send it to a public
/// host). Open, with the call-duration bound; found by the adversarial pass on the staged
/// pool, where 24 of 24 bits (6 digits at 0.12 s per unit) reached the public result, as
/// they did with copies pooled past `initialize`. Ignored: it asserts the channel works.
#[test]
#[ignore]
fn pool_wait_spells_hr_digits_in_a_public_result() {
    let a = Attack::new("pool-wait");
    let (oracle, hr, secret) = (&a.oracle, &a.hr, &a.secret);
    let manifest = a.rel.join("germline.toml");
    let root = secret.parent().unwrap().display().to_string();
    let text = std::fs::read_to_string(&manifest)
        .unwrap()
        .replace("factory = \"server:create_server\"", &format!("main = \"server:main\"\nmain_args = '[\"{root}\"]'"));
    std::fs::write(&manifest, text).unwrap();
    let mut rt = a.start();
    let Runtime::Germline(g) = &mut rt else { unreachable!() };
    assert_eq!(g.readiness().unwrap(), Readiness::Connected);
    let want: String = hr.as_str().rsplit('-').next().unwrap_or_default().chars().take(6).collect();
    let mut round = |k: i64| -> f64 {
        g.wait_pool_ready(2, Duration::from_secs(60)).unwrap();
        let sent = g.call(&request("send", json!({"k": k}), &[secret]));
        assert!(sent.error.is_none(), "send: {:?}", sent.error);
        let mut req = request("read", json!({}), &[secret]);
        req.consumers = vec!["public".into()];
        let text = result_text(&g.call(&req));
        assert!(oracle.sightings(text.as_bytes()).is_empty(), "no literal canary: {text}");
        serde_json::from_str::<serde_json::Value>(&text).ok().and_then(|v| v["age"].as_f64()).unwrap_or(-1.0)
    };
    // Calibration: an hr call that waits for nothing.
    let base = round(-1).min(round(-1));
    let got: String = (0..want.len() as i64)
        .map(|k| std::char::from_digit(((round(k) - base) / 0.12).round().clamp(0.0, 15.0) as u32, 16).unwrap())
        .collect();
    let bits: usize = want
        .chars()
        .zip(got.chars())
        .map(|(a, b)| 4 - (a.to_digit(16).unwrap() ^ b.to_digit(16).unwrap()).count_ones() as usize)
        .sum();
    eprintln!("pool wait: canary digits {want}, read by the public consumer {got}: {bits} of {} bits", want.len() * 4);
    assert!(bits >= want.len() * 4 - 2, "decoded {got} for {want}");
}

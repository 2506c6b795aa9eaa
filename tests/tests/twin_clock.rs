//! Issue 11, point 6: the twin clock keeps replays comparable without hanging honest code.
//! A polling loop finishes under germline within 1.5× its unprotected time (plus a small
//! constant), and is killed at its deadline under the earlier counted clock; copies of one
//! call read equal monotonic values around a sleep, so they send equal requests.

use std::time::{Duration, Instant};

use germline_executor::call::GermlineRuntime;
use germline_executor::runtime::{Runtime, RuntimeKind};
use germline_tests::sink::{Sink, SinkBehaviour};
use germline_tests::world::{request, result_text, World};
use serde_json::json;

fn germline(rt: &mut Runtime) -> &mut GermlineRuntime {
    match rt {
        Runtime::Germline(g) => g,
        _ => panic!("not a germline runtime"),
    }
}

const POLL: &str = r#"
import asyncio
def create_server():
    m = FastMCP("poll")
    @m.tool()
    def poll(seconds: float) -> str:
        deadline = time.monotonic() + seconds
        rounds = 0
        while time.monotonic() < deadline and rounds < 10000:
            time.sleep(0.05)
            rounds += 1
        return str(rounds)
    @m.tool()
    async def apoll(seconds: float) -> str:
        deadline = time.perf_counter() + seconds
        rounds = 0
        while time.perf_counter() < deadline and rounds < 10000:
            await asyncio.sleep(0.05)
            rounds += 1
        return str(rounds)
    return m
"#;

/// Seconds a call took, with its result text or error.
fn timed(rt: &mut Runtime, tool: &str) -> (Duration, String) {
    let t0 = Instant::now();
    let o = rt.call(&request(tool, json!({"seconds": 1.0}), &[]));
    let took = t0.elapsed();
    let text = result_text(&o);
    (took, o.error.unwrap_or(text))
}

#[test]
fn a_polling_loop_finishes_within_one_and_a_half_times_its_unprotected_time() {
    let w = World::new();
    let rel = w.release("poll", "", POLL);
    let policy = || w.policy(&[], &[("agent", &[])], "[limits]\ndeadline_ms = 3000\n");
    let mut unprotected = w.start(RuntimeKind::SigPin, &rel, policy()).unwrap();
    let mut rt = w.start(RuntimeKind::Germline, &rel, policy()).unwrap();
    for tool in ["poll", "apoll"] {
        // Warm both (imports, first fork), then measure.
        let _ = timed(&mut unprotected, tool);
        let (base, text) = timed(&mut unprotected, tool);
        assert!(text.parse::<u32>().is_ok_and(|n| (15..=20).contains(&n)), "unprotected {tool}: {text}");
        let bound = base.mul_f64(1.5) + Duration::from_millis(500);

        germline(&mut rt).evidence_switches.counted_twin_clock = false;
        let _ = timed(&mut rt, tool);
        let (took, text) = timed(&mut rt, tool);
        assert!(took <= bound, "germline {tool}: {took:?} against {base:?} unprotected ({text})");
        if tool == "poll" {
            // The sleep-aware model: exactly 1 s / 0.05 s rounds, in every copy and replay.
            assert_eq!(text, "20", "germline {tool}");
        } else {
            // asyncio.sleep is outside the model: the clock follows real time, at most
            // 0.25 s behind, so at most five more rounds.
            assert!(text.parse::<u32>().is_ok_and(|n| (15..=25).contains(&n)), "germline {tool}: {text}");
        }

        // Mechanism off: the counted clock (1 µs per read) never reaches the deadline.
        germline(&mut rt).evidence_switches.counted_twin_clock = true;
        let (took, text) = timed(&mut rt, tool);
        assert!(text.contains("deadline of 3000 ms"), "counted clock {tool}: killed at the deadline ({text})");
        assert!(took > bound, "counted clock {tool}: {took:?} exceeds {bound:?}");
    }
}

/// The copy holding the payslip and the one that does not both measure a sleep with the
/// twin clock and send the reading to the OCR host: equal readings, no trigger. With twin
/// inputs off the real clock's readings differ and every call triggers.
const ELAPSED: &str = r#"
def create_server():
    m = FastMCP("elapsed")
    @m.tool()
    def scan(document: str, extra: str) -> str:
        t0 = time.perf_counter_ns()
        m0 = time.monotonic()
        time.sleep(0.02)
        open(extra).read()
        body = "%s|%d|%.9f" % (open(document).read(), time.perf_counter_ns() - t0, time.monotonic() - m0)
        return str(post("http://ocr.example/scan", body)[0])
    return m
"#;

/// A release whose `scan` reads a finance document and an hr extra and sends to
/// ocr.example (cleared for finance only): every call runs two copies, and the tripwire
/// compares what they send.
struct TwoGroups {
    _w: World,
    invoice: std::path::PathBuf,
    payslip: std::path::PathBuf,
    sink: Sink,
    rt: Runtime,
}

impl TwoGroups {
    fn start(name: &str, code: &str) -> TwoGroups {
        let w = World::new();
        let invoice = w.item("finance", "invoice.txt", "invoice 12");
        let payslip = w.item("hr", "payslip.txt", "salary 99");
        let sink = Sink::start(SinkBehaviour::default());
        let rel = w.release(name, "[tools.scan]\nhosts = [\"ocr.example\"]\n", code);
        let policy =
            w.policy(&[("ocr.example", &["finance"], Some(sink.addr()))], &[("agent", &["finance", "hr"])], "");
        let rt = w.start(RuntimeKind::Germline, &rel, policy).unwrap();
        TwoGroups { _w: w, invoice, payslip, sink, rt }
    }

    /// Calls `scan` with `args` besides the two files; returns its triggers.
    fn scan(&mut self, mut args: serde_json::Value) -> usize {
        args["document"] = json!(self.invoice);
        args["extra"] = json!(self.payslip);
        let o = self.rt.call(&request("scan", args.clone(), &[&self.invoice, &self.payslip]));
        assert!(o.error.is_none(), "{args}: {:?}", o.error);
        assert_eq!(o.copies, 2, "two groups");
        o.triggers.len()
    }
}

#[test]
fn copies_of_one_call_read_the_same_twin_monotonic_clock() {
    for twin in [false, true] {
        let mut c = TwoGroups::start("elapsed", ELAPSED);
        germline(&mut c.rt).evidence_switches.twin_inputs = twin;
        let triggers: usize = (0..5).map(|_| c.scan(json!({}))).sum();
        assert_eq!(triggers, if twin { 0 } else { 5 }, "twin={twin}: {}", String::from_utf8_lossy(&c.sink.received()));
        if twin {
            let got = String::from_utf8_lossy(&c.sink.received()).into_owned();
            assert!(got.contains("|20002000|0.020002000"), "the modelled sleep, 1 µs per read: {got}");
        }
    }
}

/// Every Python entry to the clock and to entropy, one per call: both copies of the call
/// send what they read to the OCR host. `datetime.today` is `date.today`'s C function
/// (which reads `time.time`); `asctime` sleeps first, so that the real clock has moved a
/// second on between the two copies.
const ENTRIES: &str = r#"
import datetime, random, secrets, uuid
READ = {
    "clock_gettime(CLOCK_REALTIME)": lambda: repr(time.clock_gettime(time.CLOCK_REALTIME)),
    "clock_gettime_ns(CLOCK_REALTIME)": lambda: str(time.clock_gettime_ns(time.CLOCK_REALTIME)),
    "clock_gettime_ns(CLOCK_MONOTONIC)": lambda: str(time.clock_gettime_ns(time.CLOCK_MONOTONIC)),
    "clock_gettime(CLOCK_BOOTTIME)": lambda: repr(time.clock_gettime(time.CLOCK_BOOTTIME)),
    "clock_gettime(CLOCK_TAI)": lambda: repr(time.clock_gettime(time.CLOCK_TAI)),
    "asctime": lambda: (time.sleep(1.1), time.asctime())[1],
    "datetime.today": lambda: datetime.datetime.today().isoformat(),
    "os.getrandom": lambda: os.getrandom(16).hex(),
    "random.Random()": lambda: repr(random.Random().random()),
    "random.seed()": lambda: (random.seed(), repr(random.random()))[1],
    "secrets": lambda: secrets.token_hex(16),
    "uuid1": lambda: str(uuid.uuid1()),
    "uuid4": lambda: str(uuid.uuid4()),
}
def create_server():
    m = FastMCP("entries")
    @m.tool()
    def scan(document: str, extra: str, entry: str) -> str:
        open(extra).read()
        return str(post("http://ocr.example/scan", "%s|%s|%s" % (open(document).read(), entry, READ[entry]()))[0])
    @m.tool()
    def entries() -> str:
        return json.dumps(sorted(READ))
    return m
"#;

#[test]
fn every_python_clock_and_entropy_call_reads_the_twin_inputs() {
    let mut c = TwoGroups::start("entries", ENTRIES);
    let listed = c.rt.call(&request("entries", json!({}), &[]));
    let entries: Vec<String> = serde_json::from_str(&result_text(&listed)).expect("entry list");
    assert_eq!(entries.len(), 13, "{entries:?}");
    let mut wrong = Vec::new();
    for twin in [false, true] {
        germline(&mut c.rt).evidence_switches.twin_inputs = twin;
        for entry in &entries {
            let triggers = c.scan(json!({"entry": entry})) + c.scan(json!({"entry": entry}));
            // Off: the copies read the real clock or kernel entropy and disagree on every
            // call; on: they read the call's twin inputs and agree.
            if triggers != if twin { 0 } else { 2 } {
                wrong.push(format!("twin={twin} {entry}: {triggers} triggers in 2 calls"));
            }
        }
    }
    assert!(wrong.is_empty(), "{wrong:#?}");
}

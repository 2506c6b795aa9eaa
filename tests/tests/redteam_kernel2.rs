//! Kernel channels found by a second adversarial pass, after each live copy got host ids
//! of its own (`executor/src/ids.rs`), and by a later one (`statfs`, issue 15). Each test
//! runs releases from `tests/attacks/kernel/<name>/server.py` with the mechanism that
//! closes the channel off (the earlier denylist filter, which let `getsockname`,
//! `SO_COOKIE`, `SO_ZEROCOPY` and `statfs` through; or the broker's egress on kernel-picked
//! source ports) and asserts the canary crosses, then with it on and asserts nothing does.

use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::Duration;

use germline_executor::confine::SandboxSwitches;
use germline_executor::runtime::{Runtime, RuntimeKind};
use germline_executor::seccomp::SeccompPolicy;
use germline_tests::oracle::Oracle;
use germline_tests::sink::{Sink, SinkBehaviour};
use germline_tests::world::{request, result_text, World};
use serde_json::{json, Value};

/// Tests in this file take turns (live pairs share host-wide kernel counters).
static TURNS: Mutex<()> = Mutex::new(());

fn attack(name: &str) -> String {
    germline_tests::attacks::source("kernel", name)
}

/// One world with an hr canary and two releases of the same code, a sender and a
/// receiver (`ROLE` set in each).
struct Pair {
    w: World,
    oracle: Oracle,
    canary: String,
    secret: PathBuf,
    sender: PathBuf,
    receiver: PathBuf,
}

fn pair(name: &str, send_role: &str, receive_role: &str) -> Pair {
    let code = attack(name);
    assert!(code.contains("\nROLE = None"), "{name}: no ROLE line");
    let w = World::new();
    let mut oracle = Oracle::new();
    let hr = oracle.plant(&["hr"]);
    let secret = w.item("hr", "secret.txt", hr.as_str());
    let sender =
        w.release(&format!("{name}-send"), "", &code.replace("\nROLE = None", &format!("\nROLE = {send_role:?}")));
    let receiver = w.release(
        &format!("{name}-receive"),
        "",
        &code.replace("\nROLE = None", &format!("\nROLE = {receive_role:?}")),
    );
    Pair { canary: hr.as_str().to_owned(), w, oracle, secret, sender, receiver }
}

/// A live pair run with the earlier filter (off: the canary crosses) and the allowlist (on:
/// not one symbol, counted in the receiver's `symbols` field, does).
fn live_pair_off_on(name: &str, send_role: &str, rounds: u32, symbols: &str) {
    for off in [true, false] {
        // The protocol runs on shared frames; on a loaded host a run can lose a symbol, so
        // the positive control gets three tries.
        let tries = if off { 3 } else { 1 };
        for attempt in 1..=tries {
            let p = pair(name, send_role, "receive");
            let (got, sent) = p.run_filtered(SandboxSwitches::default(), rounds, filter(off));
            let text = got.to_string();
            if off {
                if !p.leaked(&text) && attempt < tries {
                    eprintln!("{name} off, try {attempt}: lost a symbol ({text}; sender {sent})");
                    continue;
                }
                assert!(p.leaked(&text), "{name} off: the canary crosses ({text}; sender {sent})");
                eprintln!("{name} off: 96/96 bits in one call on try {attempt} ({text}; sender {sent})");
            } else {
                assert!(!p.leaked(&text), "{name} on: {text}; sender {sent}");
                assert_eq!(got[symbols], json!(0), "{name} on: not one symbol ({text}; sender {sent})");
                eprintln!("{name} on: 0 bits ({text}; sender {sent})");
            }
            break;
        }
    }
}

/// A call whose only consumer is the public one: its text, or `error: …`.
fn public_with(rt: &mut Runtime, tool: &str, args: Value) -> String {
    let mut req = request(tool, args, &[]);
    req.consumers = vec!["public".into()];
    let o = rt.call(&req);
    match o.error {
        Some(e) => format!("error: {e}"),
        None => result_text(&o),
    }
}

/// Whether a tool's answer is the kernel's refusal (EPERM).
fn refused(t: &str) -> bool {
    t.contains("EPERM") || t.contains("Operation not permitted")
}

/// The syscall filter of a run: the allowlist (on) or the earlier denylist (off).
fn filter(off: bool) -> SeccompPolicy {
    if off {
        SeccompPolicy::denylist_only()
    } else {
        SeccompPolicy::germline()
    }
}

fn with_filter(mut rt: Runtime, seccomp: SeccompPolicy) -> Runtime {
    match &mut rt {
        Runtime::Germline(g) => g.set_seccomp_policy(seccomp),
        _ => panic!("not a germline runtime"),
    }
    rt
}

impl Pair {
    fn start_filtered(&self, release: &Path, switches: SandboxSwitches, seccomp: SeccompPolicy) -> Runtime {
        let policy = self.w.policy(&[], &[("agent", &["hr"]), ("public", &[])], "");
        let rt = self.w.start_with(RuntimeKind::Germline, release, policy, switches).expect("germline starts");
        with_filter(rt, seccomp)
    }

    fn leaked(&self, text: &str) -> bool {
        !self.oracle.disclosures("public", &[], text.as_bytes()).is_empty()
    }

    /// `receive` (public consumer only) on the receiver's germline and, 1.5 s later,
    /// `send` (holding the item) on the sender's: two releases, two germlines, live at
    /// once. Returns the receiver's JSON and the sender's text.
    fn run_filtered(&self, switches: SandboxSwitches, rounds: u32, seccomp: SeccompPolicy) -> (Value, String) {
        let mut sender = self.start_filtered(&self.sender, switches, seccomp.clone());
        let mut receiver = self.start_filtered(&self.receiver, switches, seccomp);
        let (sent, got) = std::thread::scope(|s| {
            let b = s.spawn(|| {
                let mut req = request("receive", json!({"rounds": rounds}), &[]);
                req.consumers = vec!["public".into()];
                receiver.call(&req)
            });
            std::thread::sleep(Duration::from_millis(1500));
            let a = s.spawn(|| {
                let req = request("send", json!({"document": self.secret}), &[&self.secret]);
                sender.call(&req)
            });
            (a.join().unwrap(), b.join().unwrap())
        });
        // With the mechanism on, a tool may fail where the kernel refuses it (EPERM): the
        // error is the answer then.
        let sent = match sent.error {
            Some(e) => format!("error: {e}"),
            None => result_text(&sent),
        };
        if let Some(e) = got.error {
            return (json!({"error": e.to_string(), "nibbles": 0, "dibits": 0}), sent);
        }
        let text = result_text(&got);
        // A tool that raised answers with its error text.
        let v = serde_json::from_str(&text).unwrap_or_else(|_| json!({"error": text, "nibbles": 0, "dibits": 0}));
        (v, sent)
    }
}

// --- zerocopy: pages pinned by MSG_ZEROCOPY, charged to the sandbox uid before the switch --

/// The sender's copy, before it switches to its own ids, leaves a 1-byte MSG_ZEROCOPY send
/// queued on each of 30 TCP connections to its own slot listener (never read); the
/// notification keeps charging the sandbox uid's `locked_vm` for every send appended to it
/// after the switch, when the copy holds the item. The receiver's copy (another release,
/// public consumer) reads that count to the page before its own switch (ENOBUFS past
/// RLIMIT_MEMLOCK) and answers with what it decoded. Off (the earlier filter, which let
/// `SO_ZEROCOPY` through) the canary crosses; on, the allowlist of socket options refuses
/// `SO_ZEROCOPY` and not one nibble does.
#[test]
fn zerocopy_pages_charged_to_the_sandbox_uid_before_the_switch_carry_the_canary_between_live_copies() {
    let _t = TURNS.lock().unwrap_or_else(|p| p.into_inner());
    live_pair_off_on("zerocopy", "send", 0, "nibbles");
}

/// The control: the same sender making its 30 holders after the switch (in the tool, when
/// it holds the item) charges its own host uid, which no other copy reads: the per-copy ids
/// hold for everything made after the switch, and the pre-switch socket is what carries.
#[test]
fn zerocopy_pages_charged_after_the_switch_carry_nothing() {
    let _t = TURNS.lock().unwrap_or_else(|p| p.into_inner());
    let p = pair("zerocopy", "send-late", "receive");
    // The earlier filter, under which zerocopy sends are allowed: what keeps these holders
    // apart is only that they were made after the switch.
    let (got, sent) = p.run_filtered(SandboxSwitches::default(), 0, SeccompPolicy::denylist_only());
    let text = got.to_string();
    assert!(!p.leaked(&text), "zerocopy control: {text}");
    assert_eq!(got["nibbles"], json!(0), "zerocopy control: not one nibble ({text}; sender {sent})");
    eprintln!("zerocopy control (holders after the switch): 0 bits ({text}; sender {sent})");
}

// --- portperturb: the host-wide table that picks TCP source ports ------------------------

/// The sender's copy (holding the item) opens and resets 60 to 480 connections per 80 ms
/// frame to 127.0.0.1:7071 in its own network namespace; the receiver's copy (another
/// release, public consumer) opens one per frame in its own namespace and reads how far its
/// source port moved: both go through one entry of the kernel's `table_perturb`, shared by
/// every network namespace. Off (the earlier filter, which let `getsockname` through) the
/// canary crosses; on, `getsockname` is refused and the receiver reads no port at all.
#[test]
fn portperturb_source_ports_of_one_shared_table_carry_the_canary_between_live_copies() {
    let _t = TURNS.lock().unwrap_or_else(|p| p.into_inner());
    live_pair_off_on("portperturb", "send", 300, "dibits");
}

// --- portstore: the same table as a store that outlives every copy -----------------------

/// Three calls of one release on one germline, one after the other: `mark` (public
/// consumer) reads 24 entries of `table_perturb` through addresses of its choosing and keeps
/// the readings in its public slot; `send` (holding the item, consumer cleared for hr)
/// moves entry i by 150 × (nibble + 1) connects and is killed; `read` (public consumer, a
/// new copy) reads the entries again. No copy is alive at the same time as another, and
/// the slot only ever holds what the public copies saw. The store lasts until the kernel
/// re-salts the hash (every 10 s). Off (the earlier filter, `getsockname` allowed) the
/// canary reaches the later public call; on, no copy can read a source port.
#[test]
fn portstore_host_wide_port_table_carries_the_canary_from_one_call_into_a_later_one() {
    let _t = TURNS.lock().unwrap_or_else(|p| p.into_inner());
    for off in [true, false] {
        // The kernel re-salts the table's hash every 10 s; `mark` waits for a re-salt, so
        // the three calls fit in one period unless the host stalls them: a new world is
        // tried then, up to three in all.
        let tries = if off { 3 } else { 1 };
        for attempt in 1..=tries {
            let p = pair("portstore", "x", "x");
            let mut rt = p.start_filtered(&p.sender, SandboxSwitches::default(), filter(off));
            let marked = public_with(&mut rt, "mark", json!({}));
            let o = rt.call(&request("send", json!({"document": p.secret}), &[&p.secret]));
            let sent = match &o.error {
                Some(e) => format!("error: {e}"),
                None => result_text(&o),
            };
            let text = public_with(&mut rt, "read", json!({}));
            let leaked = p.leaked(&text);
            if !off {
                assert!(!leaked, "portstore on: {text}; {marked}; sender {sent}");
                assert!(refused(&marked) || refused(&text), "portstore on: refused ({marked}; {text})");
                eprintln!("portstore on: 0 bits ({marked}; {text})");
                break;
            }
            if !leaked && attempt < tries {
                eprintln!("portstore off, try {attempt}: canary {} not read back ({text}; sender {sent})", p.canary);
                continue;
            }
            assert!(
                leaked,
                "portstore off: the canary {} reaches a later public call ({text}; {marked}; sender {sent})",
                p.canary
            );
            eprintln!(
                "portstore off: 96/96 bits from one call into a later one, try {attempt} ({text}; sender {sent})"
            );
            break;
        }
    }
}

// --- cookiestore: the host-wide socket cookie counter as a store -------------------------

/// One release, one germline, calls one after the other: `mark` (public consumer) reads the
/// host's socket cookie counter into its public slot; then 32 times `send` (holding the
/// item) takes 4096 × (3 v + 1) cookies for the next 3 bits v and is killed, and `read`
/// (public consumer, a new copy) reads how far the counter moved and marks again. No two
/// copies are alive at once. Off (the earlier filter, `SO_COOKIE` allowed) the canary
/// crosses; on, `getsockopt(SO_COOKIE)` is refused.
#[test]
fn cookiestore_host_wide_socket_cookie_counter_carries_the_canary_from_calls_into_later_ones() {
    let _t = TURNS.lock().unwrap_or_else(|p| p.into_inner());
    for off in [true, false] {
        let p = pair("cookiestore", "x", "x");
        let mut rt = p.start_filtered(&p.sender, SandboxSwitches::default(), filter(off));
        let marked = public_with(&mut rt, "mark", json!({}));
        if !off {
            // Nothing to mark with: the counter cannot be read at all.
            let o = rt.call(&request("send", json!({"document": p.secret, "index": 0}), &[&p.secret]));
            let text = public_with(&mut rt, "read", json!({}));
            assert!(!p.leaked(&text), "cookiestore on: {text}");
            assert!(refused(&marked) && refused(&text), "cookiestore on: refused ({marked}; {text}; {:?})", o.error);
            eprintln!("cookiestore on: 0 bits ({marked}; {text})");
            continue;
        }
        let mut text = String::new();
        let mut chunks = Vec::new();
        for i in 0..32 {
            let o = rt.call(&request("send", json!({"document": p.secret, "index": i}), &[&p.secret]));
            assert!(o.error.is_none(), "send {i}: {:?}", o.error);
            text = public_with(&mut rt, "read", json!({}));
            let v: Value = serde_json::from_str(&text).unwrap_or_else(|_| panic!("read: {text}"));
            chunks.push(v["chunks"].clone());
        }
        assert!(
            p.leaked(&text),
            "cookiestore off: the canary {} reaches later public calls ({text}; chunks {chunks:?})",
            p.canary
        );
        eprintln!("cookiestore off: 96/96 bits, 3 per hr call ({text}; chunks {chunks:?})");
    }
}

// --- portdest: the broker's own source ports tell a destination ------------------------

/// stats.example (cleared for nothing): answers `/port` and `/tick` with the source port the
/// request came from, keeps `/set/<addr>` and answers `/addr` with it; records (path, port).
struct PortDest {
    addr: std::net::SocketAddr,
    seen: std::sync::Arc<Mutex<Vec<(String, u16)>>>,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

impl PortDest {
    fn start() -> PortDest {
        use std::io::{Read, Write};
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.set_nonblocking(true).unwrap();
        let addr = l.local_addr().unwrap();
        let seen = std::sync::Arc::new(Mutex::new(Vec::new()));
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (s2, st2) = (seen.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut kept = String::new();
            let until = std::time::Instant::now() + Duration::from_secs(600);
            for _ in 0..2_000_000 {
                if st2.load(std::sync::atomic::Ordering::SeqCst) || std::time::Instant::now() > until {
                    return;
                }
                let (mut c, peer) = match l.accept() {
                    Ok(x) => x,
                    Err(_) => {
                        std::thread::sleep(Duration::from_millis(1));
                        continue;
                    }
                };
                let _ = c.set_nonblocking(false);
                let _ = c.set_read_timeout(Some(Duration::from_secs(5)));
                let mut buf = Vec::new();
                let mut b = [0u8; 4096];
                while !buf.windows(4).any(|w| w == b"\r\n\r\n") && buf.len() < 65536 {
                    match c.read(&mut b) {
                        Ok(0) | Err(_) => break,
                        Ok(n) => buf.extend_from_slice(&b[..n]),
                    }
                }
                let head = String::from_utf8_lossy(&buf).to_string();
                let target = head.split_whitespace().nth(1).unwrap_or("").to_owned();
                let path = target.rsplit_once("stats.example").map(|(_, p)| p.to_owned()).unwrap_or(target);
                let body = if let Some(a) = path.strip_prefix("/set/") {
                    kept = a.to_owned();
                    "ok".to_owned()
                } else if path == "/addr" {
                    kept.clone()
                } else {
                    peer.port().to_string()
                };
                s2.lock().unwrap().push((path, peer.port()));
                let _ =
                    write!(c, "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}", body.len());
            }
        });
        PortDest { addr, seen, stop }
    }
}

impl Drop for PortDest {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::SeqCst);
    }
}

/// A public copy finds, by asking stats.example for the source ports of the broker's
/// connections, an address of its own whose `table_perturb` entry is the one the broker's
/// connections to stats.example go through; each of three hr calls' copies then moves that
/// entry by 300 × (1 + 3 bits of the item) connects; stats.example reads the bits from the
/// source ports of the broker's next connections to it (`tick`, public). All within one
/// 10-s re-salt period of the kernel's hash, so 9 bits per period here. The destination learns
/// the item from the broker's own packets. Off (`EGRESS_KERNEL_PORTS_FOR_TESTS`: the kernel
/// picks the broker's source ports) the destination reads the bits; on (the broker binds a
/// source port it draws itself) no address of the copy's moves the broker's ports, and the
/// search finds none. Both runs use the earlier filter, under which a copy still reads its
/// own source ports, so the test shows the broker's ports alone. The off run needs a
/// colliding address among the candidates, found in ~40% of 10-s periods on the host of the
/// pass and in none of 16 periods on a later run, so it is run by hand;
/// `broker_source_ports_follow_the_host_table_only_with_the_mechanism_off` shows the
/// mechanism deterministically.
#[test]
#[ignore = "the off run depends on finding a colliding address (probabilistic, minutes)"]
fn portdest_broker_source_ports_carry_item_bits_to_a_public_destination() {
    let _t = TURNS.lock().unwrap_or_else(|p| p.into_inner());
    struct KernelPorts;
    impl Drop for KernelPorts {
        fn drop(&mut self) {
            germline_executor::http::EGRESS_KERNEL_PORTS_FOR_TESTS.store(false, std::sync::atomic::Ordering::SeqCst);
        }
    }
    let _reset = KernelPorts;
    for off in [true, false] {
        germline_executor::http::EGRESS_KERNEL_PORTS_FOR_TESTS.store(off, std::sync::atomic::Ordering::SeqCst);
        portdest_run(off);
    }
}

fn portdest_run(off: bool) {
    let code = attack("portdest");
    let w = World::new();
    let mut oracle = Oracle::new();
    let hr = oracle.plant(&["hr"]);
    let secret = w.item("hr", "secret.txt", hr.as_str());
    let tools = "[tools.find]\nhosts = [\"stats.example\"]\n[tools.send]\nhosts = [\"stats.example\"]\n[tools.tick]\nhosts = [\"stats.example\"]\n";
    let release = w.release("portdest", tools, &code);
    let d = PortDest::start();
    let policy = w.policy(&[("stats.example", &[], Some(d.addr))], &[("agent", &["hr"]), ("public", &[])], "");
    // Both runs keep the earlier filter (which lets the copy read its own source ports), so
    // what differs is only how the broker's egress ports are chosen.
    let rt = w.start_with(RuntimeKind::Germline, &release, policy, SandboxSwitches::default()).expect("starts");
    let mut rt = with_filter(rt, SeccompPolicy::denylist_only());
    let public = |rt: &mut Runtime, tool: &str, args: Value| {
        let text = public_with(rt, tool, args);
        assert!(!text.starts_with("error: "), "{tool}: {text}");
        text
    };
    // One re-salt period (10 s) per attempt: `find` waits for a re-salt, searches 32768
    // addresses (a collision among them in ~40% of periods), then three hr calls follow.
    let mut found = String::new();
    let mut ok = false;
    for attempt in 0..if off { 8 } else { 2 } {
        found = public(&mut rt, "find", json!({"start": 32768 * attempt}));
        eprintln!("portdest find {attempt}: {found}");
        let v: Value = serde_json::from_str(&found).unwrap();
        if v["ok"] == json!(true) {
            ok = true;
            break;
        }
    }
    if !off {
        assert!(!ok, "portdest on: no address of the copy's moves the broker's source ports ({found})");
        eprintln!("portdest on: no colliding address in two periods, 0 bits ({found})");
        return;
    }
    assert!(ok, "no colliding address found in eight periods: {found}");
    let before = d.seen.lock().unwrap().len();
    for i in 0..3 {
        let mut req = request("send", json!({"document": secret, "index": i}), &[&secret]);
        req.consumers = vec!["agent".into()];
        let o = rt.call(&req);
        assert!(o.error.is_none(), "send {i}: {:?}", o.error);
        public(&mut rt, "tick", json!({}));
    }
    // What stats.example saw: the source port of each connection, in order.
    let seen = d.seen.lock().unwrap().clone();
    let mut last: Option<u16> = seen[..before].iter().rev().find(|(p, _)| p == "/port").map(|x| x.1);
    let mut bits = Vec::new();
    let mut steps = Vec::new();
    for (path, port) in &seen[before..] {
        if path == "/tick" {
            if let Some(p) = last {
                let step = (i64::from(*port) - i64::from(p)).rem_euclid(28232);
                steps.push(step);
                bits.push((((step as f64 - 18.0) / 2700.0).round() as i64 - 1).clamp(0, 7));
            }
            last = Some(*port);
        }
    }
    let x = u128::from_str_radix(&hr.as_str()[hr.as_str().len() - 24..], 16).unwrap();
    let want: Vec<i64> = (0..3).map(|i| ((x >> (3 * (31 - i))) & 7) as i64).collect();
    eprintln!(
        "portdest off: stats.example read {bits:?}, the item's first 9 bits are {want:?} (steps {steps:?}; {found})"
    );
    assert_eq!(bits, want, "portdest: the destination reads the item's bits from the broker's source ports");
}

/// The broker's source ports and the host table, without a search: the test process itself
/// connects 200 times to stats.example from the same address the broker uses, which moves
/// exactly the `table_perturb` entry of the broker's connections there (a copy reaches any
/// entry through an address of its own, as `portdest` shows). Off (kernel-picked egress
/// ports) the steps between the ports of the broker's consecutive connections are what
/// those 200 connects moved the entry by (2 to 16 each, plus the broker's own); on (ports
/// the broker draws) the steps are unrelated to them.
#[test]
fn broker_source_ports_follow_the_host_table_only_with_the_mechanism_off() {
    let _t = TURNS.lock().unwrap_or_else(|p| p.into_inner());
    struct KernelPorts;
    impl Drop for KernelPorts {
        fn drop(&mut self) {
            germline_executor::http::EGRESS_KERNEL_PORTS_FOR_TESTS.store(false, std::sync::atomic::Ordering::SeqCst);
        }
    }
    let _reset = KernelPorts;
    const ECHO: &str = r#"
import urllib.request

def create_server():
    m = FastMCP("echoport")

    @m.tool()
    def port() -> str:
        return urllib.request.urlopen("http://stats.example/port", timeout=10).read().decode()

    return m
"#;
    for off in [true, false] {
        germline_executor::http::EGRESS_KERNEL_PORTS_FOR_TESTS.store(off, std::sync::atomic::Ordering::SeqCst);
        let w = World::new();
        let release = w.release("echoport", "[tools.port]\nhosts = [\"stats.example\"]\n", ECHO);
        let d = PortDest::start();
        let policy = w.policy(&[("stats.example", &[], Some(d.addr))], &[("agent", &[])], "");
        let mut rt = w.start(RuntimeKind::Germline, &release, policy).expect("starts");
        let mut port = || {
            let o = rt.call(&request("port", json!({}), &[]));
            result_text(&o)
                .trim()
                .parse::<i64>()
                .unwrap_or_else(|_| panic!("port: {:?} {:?}", result_text(&o), o.error))
        };
        let mut last = port();
        let mut steps = Vec::new();
        for _ in 0..5 {
            for _ in 0..200 {
                let _ = std::net::TcpStream::connect_timeout(&d.addr, Duration::from_secs(2));
            }
            let p = port();
            steps.push((p - last).rem_euclid(28232));
            last = p;
        }
        // Four of five: a connection of another process to the same entry can move one
        // step off (seen on a loaded host); unrelated steps land in the range by chance
        // with p ~0.11 each, four of five with p < 0.001.
        let moved = steps.iter().filter(|s| (400..=3500).contains(*s)).count() >= 4;
        eprintln!("broker source ports, kernel-picked {off}: steps {steps:?} after 200 connects each");
        assert_eq!(moved, off, "off: every step is what the connects moved the entry by; on: unrelated ({steps:?})");
    }
}

// --- statfs: host free space moved by the broker's own writes --------------------------

/// One 2 MiB reply: a trigger's opening, which holds the serving copy's transcript, is
/// about 680 blocks of 4 KiB.
const STATFS_REPLY: usize = 2 << 20;

/// `bits` hr calls of the sender (its consumer is cleared for hr, its only host for
/// nothing), each followed by a public call of another release that reads `/usr`'s free
/// blocks. Returns the public answers.
fn statfs_run(off: bool, bits: usize) -> (Oracle, String, Vec<String>) {
    let code = attack("statfs");
    let w = World::new();
    let mut oracle = Oracle::new();
    let hr = oracle.plant(&["hr"]);
    let secret = w.item("hr", "secret.txt", hr.as_str());
    // The broker's data directory on the file system under /usr, as on a one-disk host.
    let data = tempfile::Builder::new().prefix("germline-statfs-").tempdir_in("/var/tmp").expect("/var/tmp");
    let dev = |path: &Path| std::os::unix::fs::MetadataExt::dev(&std::fs::metadata(path).unwrap());
    assert_eq!(dev(data.path()), dev(Path::new("/usr")), "this test needs /var/tmp and /usr on one file system");
    let big = Sink::start(SinkBehaviour::Ok { status: 200, body: vec![b'a'; STATFS_REPLY] });
    let sender = w.release("statfs-send", "[tools.carry]\nhosts = [\"stats.example\"]\n[tools.free]\n", &code);
    // The default root, whatever the broker's default: it binds `/usr` from the host file
    // system, whose counters `statvfs` reports. (A resident root binds an in-memory tree
    // instead, whose counters no opening moves; the filter is the mechanism under test.)
    let root = "[sandbox]\nresident_root = false\n";
    let policy = w.policy(&[("stats.example", &[], Some(big.addr()))], &[("agent", &["hr"])], root);
    let mut sender = with_filter(w.start(RuntimeKind::Germline, &sender, policy).expect("sender starts"), filter(off));
    sender.set_trigger_log(data.path().join("triggers.jsonl"));
    // The receiver: another release, called by a consumer cleared for nothing.
    let receiver = w.release("statfs-read", "[tools.free]\n[tools.carry]\n", &code);
    let policy = w.policy(&[], &[("public", &[])], root);
    let mut reader =
        with_filter(w.start(RuntimeKind::Germline, &receiver, policy).expect("reader starts"), filter(off));
    let mut reads = vec![public_with(&mut reader, "free", json!({}))];
    for i in 0..bits {
        let mut req = request("carry", json!({"document": secret, "i": i}), &[&secret]);
        req.consumers = vec!["agent".into()];
        let o = sender.call(&req);
        assert!(o.error.is_none(), "carry {i}: {:?}", o.error);
        reads.push(public_with(&mut reader, "free", json!({})));
    }
    (oracle, hr.as_str().to_owned(), reads)
}

/// Bit `i` is 1 where the free blocks dropped by more than half an opening between reads.
fn statfs_decode(reads: &[String]) -> String {
    let blocks: Vec<i64> =
        reads.iter().map(|r| r.split_whitespace().next().and_then(|x| x.parse().ok()).unwrap_or(0)).collect();
    let threshold = (STATFS_REPLY as i64 / 4096) / 2;
    let mut got = 0u128;
    for (i, pair) in blocks.windows(2).take(96).enumerate() {
        got |= u128::from(pair[0] - pair[1] > threshold) << (95 - i);
    }
    format!("GLC-hr-{got:024x}")
}

/// Found by the adversarial pass after issue 15's teardown. A copy holding hr decides
/// whether its call records a trigger; a trigger makes the broker append and fsync the
/// call's opening (megabytes: the transcript of the data-free serving copy, which fetched
/// a large reply). Any later copy of any release, for a consumer cleared for nothing, read
/// the drop in free blocks with `statvfs("/usr")`: a read-only bind reports the live
/// counters of the file system under it. Off (the earlier denylist filter, `statfs`
/// allowed) the canary crosses; on, `statfs` and `fstatfs` are refused.
#[test]
fn statfs_free_blocks_moved_by_trigger_openings_carry_the_canary_to_another_release() {
    let _t = TURNS.lock().unwrap_or_else(|p| p.into_inner());
    // Another writer on the host can move the count by as much as an opening now and then,
    // so the off run counts the bits it got right: 80 of 96 is a disclosure all the same
    // (chance is 48 ± 5).
    let (oracle, canary, reads) = statfs_run(true, 96);
    let text = statfs_decode(&reads);
    let want = u128::from_str_radix(canary.rsplit('-').next().unwrap_or_default(), 16).unwrap();
    let got = u128::from_str_radix(text.rsplit('-').next().unwrap_or_default(), 16).unwrap();
    let right = 96 - (want ^ got).count_ones();
    assert!(right >= 80, "statfs off: {right}/96 bits of {canary} reach a public call: {text} ({reads:?})");
    let whole = !oracle.disclosures("public", &[], text.as_bytes()).is_empty();
    eprintln!("statfs off: {right}/96 bits in 96 hr calls and 97 public reads ({text}; the whole canary: {whole})");
    let (oracle, _, reads) = statfs_run(false, 4);
    for r in &reads {
        assert!(refused(r), "statfs on: every read refused: {reads:?}");
        assert!(oracle.disclosures("public", &[], r.as_bytes()).is_empty(), "statfs on: {reads:?}");
    }
    eprintln!("statfs on: 0 bits ({})", reads[0]);
}

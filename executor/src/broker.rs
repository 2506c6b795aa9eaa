//! The broker's work for one copy: relay its egress under the positional rule, take its
//! slot writes, speak MCP to it, and enforce its deadline. Every decision is the model's
//! (`CallRecords::positional_reply`); this module only moves bytes.

use std::collections::BTreeMap;
use std::io::{BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use germline_model::{CallRecords, EgressDecision, HostName, OutputLabel};
use serde::Serialize;
use serde_json::{json, Value};

use crate::germline::CopyKiller;
use crate::http::{self, HttpRequest};
use crate::mcp::McpClient;
use crate::outside::{ViewGate, ViewMount};
use crate::policy::Policy;
use crate::slots::{SlotGiven, SlotSource};
use crate::timings::CopyTimings;
use crate::wake::{Ready, Wake};
use crate::workers;
use crate::ExecutorError;

/// What one call's copies share: the records of each host, in the model's terms.
pub struct CallShared {
    /// The positional-rule state of the call.
    pub records: CallRecords,
    /// Set for probe/control replay: every host is answered from a transcript, nothing
    /// is delivered, and the copy's requests are recorded.
    pub replay: Option<ReplayState>,
}

/// A replayed copy's egress: the k-th request to a host gets the transcript's k-th reply
/// (or the placeholder past its end), whatever it asks; the request itself is recorded.
#[derive(Debug, Default)]
pub struct ReplayState {
    /// Recorded replies per declared host, in order.
    pub replies: BTreeMap<HostName, Vec<Vec<u8>>>,
    /// What the replayed copy sent, per host, in order.
    pub sent: BTreeMap<HostName, Vec<germline_model::RequestDigest>>,
}

impl ReplayState {
    fn reply(&mut self, host: &HostName, digest: germline_model::RequestDigest) -> EgressDecision {
        let Some(replies) = self.replies.get(host) else { return EgressDecision::Deny };
        let sent = self.sent.entry(host.clone()).or_default();
        let k = sent.len();
        sent.push(digest);
        match replies.get(k) {
            Some(r) => EgressDecision::Recorded(r.clone()),
            None => EgressDecision::Placeholder,
        }
    }
}

/// One egress attempt, for logs and tests.
#[derive(Clone, Debug, Serialize)]
pub struct EgressEvent {
    /// Plan group of the copy.
    pub group: usize,
    /// Host the copy named.
    pub host: String,
    /// `delivered`, `recorded`, `placeholder` or `denied`.
    pub decision: &'static str,
}

/// How a copy ended.
pub struct CopyResult {
    /// The tool result, or why there is none.
    pub result: Result<Value, String>,
    /// The copy's output label accumulator at the end.
    pub label: OutputLabel,
    /// Slot writes the copy made, in order.
    pub slot_writes: Vec<(String, Option<Value>)>,
    /// The slot the copy asked for, as it was given (with its lease), if it asked.
    pub slot: Option<SlotGiven>,
    /// Egress attempts.
    pub egress: Vec<EgressEvent>,
    /// Every reply the copy received from (or in the name of) each declared host, in
    /// order: what a replay of this copy must give it back.
    pub received: BTreeMap<HostName, Vec<Vec<u8>>>,
    /// Where the copy's time went (connect to teardown; the caller adds the fork).
    pub timings: CopyTimings,
}

/// How the broker reaches the copy's MCP server.
pub enum Channel {
    /// A copy forked for this call: the broker accepts its connection, checks its ids and
    /// mounts its view (the gate), sends the preamble (twin inputs and slot), then
    /// `initialize`.
    Fresh {
        /// The channel listener in the copy's network namespace.
        listener: TcpListener,
        /// Checks the copy's ids, then mounts its view.
        gate: ViewGate,
        /// Twin inputs and slot, sent before MCP starts.
        preamble: Value,
    },
    /// A pooled copy, connected, checked and past `initialize` with no data: the broker
    /// sends its twin inputs (and waits for them to be taken), mounts its view, then sends
    /// its slot and environment right before the request.
    Pooled {
        /// The copy's MCP session.
        channel: Box<PooledChannel>,
        /// Twin inputs (`null`: switched off), and the twin clock's mode if not the default.
        twin: Value,
        /// The view to mount once the twin inputs are taken.
        view: ViewMount,
        /// Slot and environment.
        data: Value,
    },
    /// A pooled copy connected and checked with its server not started (a server that
    /// opens its data at start-up): the broker sends its start line (twin inputs) and waits
    /// for them to be taken, mounts its view, lets it start its server, then `initialize`.
    Staged {
        /// The copy's channel (no MCP session yet).
        channel: Box<PooledChannel>,
        /// Twin inputs (`null`: switched off), and the twin clock's mode if not the default.
        start: Value,
        /// The view to mount once the twin inputs are taken.
        view: ViewMount,
    },
}

/// A pooled copy's connected MCP session.
pub struct PooledChannel {
    /// The client, past `initialize`.
    pub client: McpClient<BufReader<TcpStream>, TcpStream>,
    /// The connection itself (for its timeouts).
    pub conn: TcpStream,
}

/// Everything the broker needs to serve one copy.
pub struct CopyJob<'a> {
    /// The copy's Plan group index.
    pub group_index: usize,
    /// The HTTP proxy listener in the copy's network namespace.
    pub proxy: TcpListener,
    /// The slot listener in the copy's network namespace.
    pub slot: TcpListener,
    /// Where the copy's slot comes from when it asks for it.
    pub slot_source: SlotSource,
    /// The MCP channel.
    pub channel: Channel,
    /// The MCP request to make after `initialize` (`tools/call` with arguments whose
    /// out-of-view items are blanked, or `tools/list`).
    pub method: &'a str,
    /// Its params.
    pub params: Value,
    /// Absolute deadline on the broker's clock.
    pub deadline: Instant,
    /// Budget as configured (for error messages).
    pub budget: Duration,
    /// Policy (host map, sizes).
    pub policy: &'a Policy,
    /// Starting output label (the view; the slot's label joins when the copy asks for it).
    pub label: OutputLabel,
    /// Kills the copy (deadline watchdog).
    pub killer: CopyKiller,
}

struct CopyState {
    /// Set when the copy's call is over: nothing more is relayed or recorded.
    closed: bool,
    label: OutputLabel,
    egress: Vec<EgressEvent>,
    sent: BTreeMap<HostName, usize>,
    received: BTreeMap<HostName, Vec<Vec<u8>>>,
}

/// Test-only switch: the deadline watchdog acts this many milliseconds after the deadline,
/// as a thread scheduled late on a busy host does. Never set outside tests.
pub static WATCHDOG_LATE_MS_FOR_TESTS: AtomicU64 = AtomicU64::new(0);

/// Test-only switch ("mechanism off"): an answer read after the deadline is taken as in
/// time unless the watchdog has already acted, as before. Never set outside tests.
pub static LATE_ANSWERS_TAKEN_FOR_TESTS: AtomicBool = AtomicBool::new(false);

/// Serves one copy until it returns its tool result, fails, or runs out of time.
pub fn serve_copy(job: CopyJob<'_>, shared: &Arc<Mutex<CallShared>>) -> CopyResult {
    let CopyJob {
        group_index,
        proxy,
        slot,
        slot_source,
        channel,
        method,
        params,
        deadline,
        budget,
        policy,
        label,
        killer,
    } = job;
    let max = policy.limits.max_message_bytes;
    let state = Arc::new(Mutex::new(CopyState {
        closed: false,
        label,
        egress: Vec::new(),
        sent: BTreeMap::new(),
        received: BTreeMap::new(),
    }));
    let slot_writes = Arc::new(Mutex::new(Vec::new()));
    let slot_source = Arc::new(slot_source);
    let slot_given: Arc<Mutex<Option<SlotGiven>>> = Arc::new(Mutex::new(None));
    let slot_stop = Arc::new(AtomicBool::new(false));
    let mut timings = CopyTimings::default();
    let t_threads = Instant::now();
    let wake = match Wake::new() {
        Ok(w) => Arc::new(w),
        Err(e) => {
            killer.kill();
            return CopyResult {
                result: Err(format!("broker: {e}")),
                label: state.lock().unwrap_or_else(|p| p.into_inner()).label.clone(),
                slot_writes: Vec::new(),
                slot: None,
                egress: Vec::new(),
                received: BTreeMap::new(),
                timings,
            };
        }
    };

    // Three broker threads per copy, taken from `workers` and never joined: each ends its
    // job when the copy's wake-up fires. One sleeps on its pidfd until the copy exits, the
    // deadline passes or the call is over. A copy that dies before it connects ends the
    // wait for its channel at once (not at the deadline); a copy alive at the deadline is
    // killed.
    let timed_out = Arc::new(AtomicBool::new(false));
    let died = Arc::new(AtomicBool::new(false));
    let killer = Arc::new(killer);
    {
        let (wake, died, timed_out, killer) = (wake.clone(), died.clone(), timed_out.clone(), killer.clone());
        let pidfd = killer.pidfd();
        workers::run(move || {
            // Without a pidfd (its copy is already gone) only the deadline and the wake-up
            // end the wait: poll ignores a negative descriptor.
            let fd = pidfd.as_ref().map_or(-1, |p| p.as_raw_fd());
            match wake.wait(fd, Some(deadline)) {
                Ready::Fd => {
                    died.store(true, Ordering::SeqCst);
                    wake.wake();
                }
                Ready::Timeout => {
                    let late = WATCHDOG_LATE_MS_FOR_TESTS.load(Ordering::SeqCst);
                    if late > 0 {
                        std::thread::sleep(Duration::from_millis(late));
                    }
                    timed_out.store(true, Ordering::SeqCst);
                    killer.kill();
                }
                Ready::Woken => {}
            }
        });
    }
    {
        let (wake, state, shared, policy) = (wake.clone(), state.clone(), shared.clone(), policy.clone());
        let listener = proxy;
        workers::run(move || proxy_loop(listener, &wake, group_index, &state, &shared, &policy, deadline));
    }
    {
        let copy_slot = CopySlot {
            source: slot_source.clone(),
            given: slot_given.clone(),
            writes: slot_writes.clone(),
            state: state.clone(),
            stop: slot_stop.clone(),
            deadline,
        };
        let (wake, listener) = (wake.clone(), slot);
        workers::run(move || slot_loop(listener, &wake, &copy_slot, max));
    }

    timings.threads = t_threads.elapsed();
    let result = match channel {
        Channel::Fresh { listener, gate, preamble } => {
            talk(listener, gate, &wake, &preamble, method, params, deadline, max, &mut timings)
        }
        Channel::Pooled { channel, twin, view, data } => {
            talk_pooled(*channel, twin, view, data, method, params, deadline, &mut timings)
        }
        Channel::Staged { channel, start, view } => {
            talk_staged(*channel, start, view, method, params, deadline, &mut timings)
        }
    };
    let t_down = Instant::now();
    // The copy's answer is in (or the call failed): its threads are told to stop, and what
    // they do from here on no longer counts. The call does not wait for them to be
    // scheduled and exit (on a busy host that wait was most of a pooled call's teardown);
    // instead each part of the copy's record is closed under its own lock, which the
    // thread that adds to it holds while it acts: an egress being relayed is finished and
    // recorded first, and anything later is refused, never relayed unrecorded.
    wake.wake();
    let writes = {
        let mut w = slot_writes.lock().unwrap_or_else(|p| p.into_inner());
        slot_stop.store(true, Ordering::SeqCst);
        std::mem::take(&mut *w)
    };
    slot_source.interrupt();
    // After any slot being given (its label joined into the copy's) is in.
    let given = slot_given.lock().unwrap_or_else(|p| p.into_inner()).take();
    let (label, egress, received) = {
        let mut st = state.lock().unwrap_or_else(|p| p.into_inner());
        st.closed = true;
        (st.label.clone(), std::mem::take(&mut st.egress), std::mem::take(&mut st.received))
    };

    // The channel's own timeouts end at the same deadline as the watchdog's wait, and may
    // end first: a call that failed once its deadline had passed failed by the deadline,
    // whichever of the two noticed, and its copy is killed here if the watchdog did not.
    // So did a call whose answer was read once it had passed: the relay ends a request at
    // the deadline with a 502, and a copy that answers at once (as the `slow` tool of
    // `executor_hostile` does) could be read before a watchdog thread scheduled late had
    // killed it, its answer taken as in time.
    let late = Instant::now() >= deadline;
    let over = timed_out.load(Ordering::SeqCst)
        || if LATE_ANSWERS_TAKEN_FOR_TESTS.load(Ordering::SeqCst) { result.is_err() && late } else { late };
    if over {
        killer.kill();
    }
    let result = if over {
        Err(format!("copy exceeded its deadline of {} ms and was killed", budget.as_millis()))
    } else if result.is_err() && died.load(Ordering::SeqCst) && timings.connect.is_zero() {
        Err("the copy exited before it connected to its channel".to_owned())
    } else {
        result.map_err(|e| e.to_string())
    };
    timings.teardown = t_down.elapsed();
    CopyResult { result, label, slot_writes: writes, slot: given, egress, received, timings }
}

#[allow(clippy::too_many_arguments)]
fn talk(
    channel: TcpListener,
    gate: ViewGate,
    wake: &Wake,
    preamble: &Value,
    method: &str,
    params: Value,
    deadline: Instant,
    max: usize,
    timings: &mut CopyTimings,
) -> Result<Value, ExecutorError> {
    let t0 = Instant::now();
    let conn = wake
        .accept(&channel, Some(deadline))
        .ok_or_else(|| ExecutorError::Copy("the copy never connected to its channel".into()))?;
    // Connected: a refused ids check below keeps its own error, even when the copy is
    // gone by the time the result is read.
    timings.connect = t0.elapsed();
    // Nothing the copy may see reaches it before it runs as its own ids: its view is
    // mounted, and the preamble sent, only after the check.
    gate.open()?;
    let t1 = Instant::now();
    timings.connect = t1 - t0;
    let remaining = deadline.saturating_duration_since(Instant::now()).max(Duration::from_millis(1));
    conn.set_read_timeout(Some(remaining)).map_err(ExecutorError::io("channel timeout"))?;
    conn.set_write_timeout(Some(remaining)).map_err(ExecutorError::io("channel timeout"))?;
    let _ = conn.set_nodelay(true);
    let mut writer = conn.try_clone().map_err(ExecutorError::io("channel"))?;
    let mut line = serde_json::to_vec(preamble).map_err(|e| ExecutorError::Copy(e.to_string()))?;
    line.push(b'\n');
    writer.write_all(&line).map_err(ExecutorError::io("sending the preamble"))?;
    let t2 = Instant::now();
    timings.preamble = t2 - t1;
    let mut client = McpClient::new(BufReader::new(conn), writer, max);
    // No timing line here: how long a copy takes to answer is its choice, and this
    // function does not know the copy's label (`run_copy` logs timings of unlabelled ones).
    client.initialize().map_err(phase("while the server initialized"))?;
    timings.initialize = t2.elapsed();
    ask(&mut client, method, params, timings)
}

/// Sends the copy's one request and reads its answer (first byte and the rest timed).
fn ask<R: std::io::BufRead, W: Write>(
    client: &mut McpClient<R, W>,
    method: &str,
    params: Value,
    timings: &mut CopyTimings,
) -> Result<Value, ExecutorError> {
    let t0 = Instant::now();
    let id = client.send_request(method, params).map_err(phase("while the server answered"))?;
    client.wait_readable().map_err(phase("while the server answered"))?;
    let t1 = Instant::now();
    timings.first_byte = t1 - t0;
    let reply = client.response(id).map_err(phase("while the server answered"))?;
    timings.answer = t1.elapsed();
    reply.map_err(|err| ExecutorError::Copy(format!("tool error: {err}")))
}

/// [`talk`] for a pooled copy: twin inputs, view, slot, then the request.
#[allow(clippy::too_many_arguments)]
fn talk_pooled(
    channel: PooledChannel,
    twin: Value,
    view: ViewMount,
    data: Value,
    method: &str,
    params: Value,
    deadline: Instant,
    timings: &mut CopyTimings,
) -> Result<Value, ExecutorError> {
    let mut client = hand_over(channel, "twin", twin, view, data, deadline, timings)?;
    ask(&mut client, method, params, timings)
}

/// [`talk`] for a pooled copy whose server has not started: its start line (twin inputs,
/// taken before the view exists, as for [`talk_pooled`]), its view, the go-ahead that
/// starts its server, then `initialize` and the request.
fn talk_staged(
    channel: PooledChannel,
    start: Value,
    view: ViewMount,
    method: &str,
    params: Value,
    deadline: Instant,
    timings: &mut CopyTimings,
) -> Result<Value, ExecutorError> {
    let mut client = hand_over(channel, "start", start, view, json!({}), deadline, timings)?;
    // The go-ahead goes out with `initialize`, in the same write and before it.
    let t2 = Instant::now();
    client.initialize().map_err(phase("while the server initialized"))?;
    timings.initialize = t2.elapsed();
    ask(&mut client, method, params, timings)
}

/// Gives a pooled copy its call: the `kind` control line with the twin inputs (`twin`),
/// acknowledged when there is a view to mount; the view; then the `data` control line
/// (slot and environment), which goes out with the next message. Returns the copy's MCP
/// client, with its channel timed out at `deadline`.
fn hand_over(
    channel: PooledChannel,
    kind: &str,
    twin: Value,
    view: ViewMount,
    data: Value,
    deadline: Instant,
    timings: &mut CopyTimings,
) -> Result<McpClient<BufReader<TcpStream>, TcpStream>, ExecutorError> {
    let t1 = Instant::now();
    let PooledChannel { mut client, conn } = channel;
    let remaining = deadline.saturating_duration_since(t1).max(Duration::from_millis(1));
    conn.set_read_timeout(Some(remaining)).map_err(ExecutorError::io("channel timeout"))?;
    conn.set_write_timeout(Some(remaining)).map_err(ExecutorError::io("channel timeout"))?;
    // Twin inputs are taken before the view exists: nothing of the call's data is there
    // for release code to read with the real clock. With no view to mount, the copy is not
    // asked to acknowledge them: the rest of the call (the request's arguments, and the
    // slot it asks for) reaches it only through this channel, after the twin line, which
    // the copy handles before it passes any later line to its server.
    let ack = !view.files.is_empty();
    let line = |kind: &str, extra: Value, reply: Option<bool>| {
        let mut line = json!({"germline": kind});
        if let Some(r) = reply {
            line["reply"] = json!(r);
        }
        if let (Some(o), Value::Object(m)) = (line.as_object_mut(), extra) {
            o.extend(m);
        }
        line
    };
    client
        .control(&line(kind, twin, Some(ack)), ack)
        .map_err(|e| ExecutorError::Copy(format!("{e} (while it took its twin inputs)")))?;
    let t_view = Instant::now();
    view.mount()?;
    timings.view = t_view.elapsed();
    client.control(&line("data", data, None), false)?;
    timings.preamble = t1.elapsed() - timings.view;
    Ok(client)
}

/// Names the phase a copy failed in (the error carries the copy's label like any other).
fn phase(what: &'static str) -> impl Fn(ExecutorError) -> ExecutorError {
    move |e: ExecutorError| match e {
        ExecutorError::Copy(why) => match why.split_once("; its stderr ended with:") {
            Some((head, tail)) => ExecutorError::Copy(format!("{head} ({what}); its stderr ended with:{tail}")),
            None => ExecutorError::Copy(format!("{why} ({what})")),
        },
        other => ExecutorError::Copy(format!("{other} ({what})")),
    }
}

fn proxy_loop(
    listener: TcpListener,
    wake: &Wake,
    group: usize,
    state: &Mutex<CopyState>,
    shared: &Mutex<CallShared>,
    policy: &Policy,
    deadline: Instant,
) {
    let max = policy.limits.max_message_bytes;
    // Bounded: at most this many connections per copy.
    for _ in 0..10_000 {
        let Some(mut conn) = wake.accept(&listener, Some(deadline)) else {
            return;
        };
        let remaining = deadline.saturating_duration_since(Instant::now()).max(Duration::from_millis(1));
        let _ = conn.set_read_timeout(Some(remaining));
        let _ = conn.set_write_timeout(Some(remaining));
        let reply = match http::read_request(&mut conn, max) {
            Ok(Some(req)) if req.method == "CONNECT" => {
                tunnel(conn, &req, group, state, shared, policy, deadline);
                continue;
            }
            Ok(Some(req)) => egress(&req, group, state, shared, policy, deadline),
            Ok(None) => continue,
            Err(e) => http::denied_response(&format!("bad request: {e}")),
        };
        let _ = conn.write_all(&reply);
        let _ = conn.shutdown(std::net::Shutdown::Both);
    }
}

/// A `CONNECT`: the broker terminates TLS as the named host and treats every request
/// inside exactly like a plain HTTP one (scheme `https`), under the same positional rule.
fn tunnel(
    mut conn: TcpStream,
    req: &HttpRequest,
    group: usize,
    state: &Mutex<CopyState>,
    shared: &Mutex<CallShared>,
    policy: &Policy,
    deadline: Instant,
) {
    let refuse = |conn: &mut TcpStream, why: &str| {
        let mut st = state.lock().unwrap_or_else(|p| p.into_inner());
        st.egress.push(EgressEvent { group, host: req.host.clone(), decision: "denied" });
        let _ = conn.write_all(&http::denied_response(why));
        let _ = conn.shutdown(std::net::Shutdown::Both);
    };
    if HostName::new(&req.host).is_err() {
        return refuse(&mut conn, "not a host name");
    }
    let Some(tls) = policy.tls() else {
        return refuse(&mut conn, "HTTPS is not configured for this runtime");
    };
    let max = policy.limits.max_message_bytes;
    let served =
        tls.serve_tunnel(conn, &req.host, req.port, max, |inner| egress(inner, group, state, shared, policy, deadline));
    // The host and the error name what the copy asked for: not logged; that a tunnel
    // ended early is the copy's choice too, logged only while its label is empty.
    if served.is_err() && crate::call::loggable(&state.lock().unwrap_or_else(|p| p.into_inner()).label.label()) {
        tracing::debug!(group, "a tunnel ended early");
    }
}

fn egress(
    req: &HttpRequest,
    group: usize,
    state: &Mutex<CopyState>,
    shared: &Mutex<CallShared>,
    policy: &Policy,
    deadline: Instant,
) -> Vec<u8> {
    let mut st = state.lock().unwrap_or_else(|p| p.into_inner());
    if st.closed {
        return http::denied_response("the call is over");
    }
    let Ok(host) = HostName::new(&req.host) else {
        st.egress.push(EgressEvent { group, host: req.host.clone(), decision: "denied" });
        return http::denied_response("not a host name");
    };
    let k = *st.sent.get(&host).unwrap_or(&0);
    st.sent.insert(host.clone(), k + 1);
    let digest = req.digest();
    let decision = {
        let mut sh = shared.lock().unwrap_or_else(|p| p.into_inner());
        match sh.replay.as_mut() {
            Some(replay) => replay.reply(&host, digest),
            None => sh.records.positional_reply(group, &host, k, digest, &mut st.label),
        }
    };
    let (name, reply) = match decision {
        EgressDecision::Deliver => {
            let reply = match http::resolve_destination(policy.host_address(&host), &host, req.port, deadline) {
                Ok(addr) => deliver(req, addr, policy, deadline),
                Err(why) => gateway_error(&why),
            };
            let mut sh = shared.lock().unwrap_or_else(|p| p.into_inner());
            if let Err(e) = sh.records.record_exchange(&host, digest, reply.clone()) {
                tracing::warn!(%host, "recording exchange failed: {e}");
            }
            ("delivered", reply)
        }
        EgressDecision::Recorded(reply) => ("recorded", reply),
        EgressDecision::Placeholder => ("placeholder", http::placeholder_response()),
        EgressDecision::Deny => ("denied", http::denied_response("destination not declared for this tool")),
    };
    st.egress.push(EgressEvent { group, host: host.to_string(), decision: name });
    if name != "denied" {
        st.received.entry(host.clone()).or_default().push(reply.clone());
    }
    reply
}

/// Issues the real request: plain HTTP, or TLS verifying the host's own certificate.
fn deliver(req: &HttpRequest, addr: std::net::SocketAddr, policy: &Policy, deadline: Instant) -> Vec<u8> {
    let max = policy.limits.max_message_bytes;
    let sent = match (req.scheme.as_str(), policy.tls()) {
        ("https", Some(tls)) => tls.forward(req, addr, deadline, max),
        ("https", None) => return gateway_error("HTTPS is not configured for this runtime"),
        _ => http::forward(req, addr, deadline, max),
    };
    sent.unwrap_or_else(|e| gateway_error(&e.to_string()))
}

fn gateway_error(why: &str) -> Vec<u8> {
    let body = format!("germline: {why}\n");
    format!(
        "HTTP/1.1 502 Bad Gateway\r\nx-germline: unreachable\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

/// Slot writes one copy may make: at most this many, and (each counted by the length of
/// its request line) at most one message's worth of bytes in all, so what the broker keeps
/// for a copy until its answer is bounded like everything else the copy sends.
const MAX_SLOT_WRITES: usize = 1024;

/// A copy's slot writes, in order: key and new value (`None`: deleted).
type SlotWrites = Arc<Mutex<Vec<(String, Option<Value>)>>>;

/// What the slot listener's thread needs: where the slot comes from, where it keeps what
/// it gave and the writes, and the copy's label (joined with the slot's when it is given).
struct CopySlot {
    source: Arc<SlotSource>,
    given: Arc<Mutex<Option<SlotGiven>>>,
    writes: SlotWrites,
    state: Arc<Mutex<CopyState>>,
    stop: Arc<AtomicBool>,
    deadline: Instant,
}

/// Serves the copy's slot: its first request (a read or a write) gives it the slot (under
/// the slot's lease, waited for until the deadline) and joins the slot's label into the
/// copy's; then `get` answers the slot's values, `set` and `delete` are recorded in order.
fn slot_loop(listener: TcpListener, wake: &Wake, copy: &CopySlot, max: usize) {
    use std::io::Read;
    let Some(mut conn) = wake.accept(&listener, None) else {
        return;
    };
    let fd = conn.as_raw_fd();
    let _ = conn.set_write_timeout(Some(Duration::from_secs(1)));
    let mut buf = vec![0u8; 64 << 10];
    let mut line: Vec<u8> = Vec::new();
    let mut budget = WriteBudget { count: MAX_SLOT_WRITES, bytes: max };
    loop {
        // Sleep in the kernel until the copy writes or the call is over; a read never
        // blocks (a half-written line cannot hold the broker past the answer).
        if wake.wait(fd, None) != Ready::Fd {
            return;
        }
        let n = match conn.read(&mut buf) {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        let mut rest = &buf[..n];
        while let Some(i) = rest.iter().position(|b| *b == b'\n') {
            line.extend_from_slice(&rest[..i]);
            rest = &rest[i + 1..];
            if line.len() > max {
                return;
            }
            let Some(reply) = slot_request(&std::mem::take(&mut line), copy, &mut budget) else {
                return;
            };
            if conn.write_all(&reply).is_err() {
                return;
            }
        }
        line.extend_from_slice(rest);
        if line.len() > max {
            return;
        }
    }
}

/// What is left of a copy's slot writes ([`MAX_SLOT_WRITES`]).
struct WriteBudget {
    count: usize,
    bytes: usize,
}

/// One slot request's reply; `None` ends the copy's slot connection (no slot before the
/// deadline or the end of the call).
fn slot_request(line: &[u8], copy: &CopySlot, budget: &mut WriteBudget) -> Option<Vec<u8>> {
    enum Op {
        Get,
        Write(String, Option<Value>),
    }
    let parsed: Option<Op> = serde_json::from_slice::<Value>(line).ok().and_then(|v| {
        let key = || v.get("key")?.as_str().map(str::to_owned);
        match v.get("op")?.as_str()? {
            "get" => Some(Op::Get),
            "set" => Some(Op::Write(key()?, Some(v.get("value")?.clone()))),
            "delete" => Some(Op::Write(key()?, None)),
            _ => None,
        }
    });
    let Some(op) = parsed else { return Some(b"malformed slot request\n".to_vec()) };
    if copy.stop.load(Ordering::SeqCst) {
        return None;
    }
    let mut given = copy.given.lock().unwrap_or_else(|p| p.into_inner());
    if given.is_none() {
        // The copy's label as it stands when it gives the lease back (after its answer).
        let state = copy.state.clone();
        let holder = Box::new(move || state.lock().unwrap_or_else(|p| p.into_inner()).label.label());
        let g = copy.source.give(copy.deadline, &copy.stop, holder)?;
        copy.state.lock().unwrap_or_else(|p| p.into_inner()).label.add_slot(&g.label());
        *given = Some(g);
    }
    let slot = given.as_ref().map(SlotGiven::slot)?;
    Some(match op {
        Op::Get => {
            let values: serde_json::Map<String, Value> =
                slot.iter().map(|(k, e)| (k.to_owned(), e.value.clone())).collect();
            let mut reply = serde_json::to_vec(&json!({ "slot": values })).ok()?;
            reply.push(b'\n');
            reply
        }
        Op::Write(..) if budget.count == 0 => b"too many slot writes\n".to_vec(),
        Op::Write(..) if line.len() > budget.bytes => b"slot writes over the size limit\n".to_vec(),
        Op::Write(key, value) => {
            // Under the lock the call's end takes the writes with: a write either counts or
            // is refused, never acknowledged and dropped.
            let mut writes = copy.writes.lock().unwrap_or_else(|p| p.into_inner());
            if copy.stop.load(Ordering::SeqCst) {
                return None;
            }
            budget.count -= 1;
            budget.bytes -= line.len();
            writes.push((key, value));
            b"ok\n".to_vec()
        }
    })
}

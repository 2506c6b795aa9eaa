//! Loopback HTTP destinations that remember everything they were sent.
//!
//! A [`Sink`] stands in for one declared destination host. It keeps the raw bytes of
//! every connection, because the disclosure oracle must judge what actually crossed the
//! wire — including malformed or truncated requests a smuggler might try — and it also
//! parses requests so tests can assert on methods, targets and bodies. Peers are the
//! code under test, so nothing a peer sends may crash, hang or exhaust the sink: sizes,
//! threads, idle time and delays are all bounded.

use std::collections::HashMap;
use std::io::{self, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

/// Most raw bytes kept from one connection; a peer sending more is cut off.
pub const MAX_CONNECTION_BYTES: usize = 16 << 20;
/// Most raw bytes kept by one sink over all connections.
pub const MAX_SINK_BYTES: usize = 256 << 20;
/// Most connections served at once; further peers wait in the listen backlog.
pub const MAX_CONNECTIONS: usize = 32;
/// Most TLS connections a [`TlsFront`] serves at once (idle ones linger for
/// [`IDLE_TIMEOUT`]); further peers wait in the listen backlog.
pub const MAX_TLS_CONNECTIONS: usize = 256;
/// Longest request head (request line and headers).
pub const MAX_HEAD_BYTES: usize = 64 << 10;
/// Longest delay [`SinkBehaviour::Slow`] honours.
pub const MAX_DELAY: Duration = Duration::from_secs(30);
/// A connection with no traffic for this long is closed.
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(10);

/// How long a connection keeps draining input after an error reply.
const LINGER: Duration = Duration::from_secs(1);

/// How often blocked threads look at the shutdown flag.
const TICK: Duration = Duration::from_millis(50);

/// How a sink answers each request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SinkBehaviour {
    /// A plain answer with this status and body.
    Ok {
        /// Status code.
        status: u16,
        /// Response body.
        body: Vec<u8>,
    },
    /// A redirect; the `Location` header carries `location` byte for byte, so tests can
    /// check the broker hands 3xx replies back to the copy instead of following them.
    Redirect {
        /// Status code (302, 307, ...).
        status: u16,
        /// Value of the `Location` header, written verbatim.
        location: String,
    },
    /// Waits `delay` (at most [`MAX_DELAY`]) and then answers like the default, to test
    /// deadlines.
    Slow {
        /// How long to wait before answering.
        delay: Duration,
    },
    /// Answers 200 with the request body as the response body, so a test can see exactly
    /// what a peer's reply path carries.
    Echo,
}

impl Default for SinkBehaviour {
    fn default() -> Self {
        SinkBehaviour::Ok { status: 200, body: DEFAULT_BODY.to_vec() }
    }
}

/// The body of the default answer.
pub const DEFAULT_BODY: &[u8] = b"germline-sink ok\n";

/// One complete request as the sink parsed it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RecordedRequest {
    /// Index of the connection it arrived on (in accept order), to check keep-alive.
    pub connection: usize,
    /// Request method as sent.
    pub method: String,
    /// Request target as sent (path and query, or absolute form).
    pub target: String,
    /// Protocol version as sent, e.g. `HTTP/1.1`.
    pub version: String,
    /// Header fields in order, names and values as sent (values trimmed).
    pub headers: Vec<(String, String)>,
    /// The body, with chunked framing removed.
    pub body: Vec<u8>,
    /// True when the body came with `Transfer-Encoding: chunked`.
    pub chunked: bool,
    /// The request's bytes exactly as received, framing included.
    pub raw: Vec<u8>,
}

impl RecordedRequest {
    /// The first value of header `name` (case-insensitive).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(n, _)| n.eq_ignore_ascii_case(name)).map(|(_, v)| v.as_str())
    }
}

#[derive(Default)]
struct Records {
    connections: Vec<Vec<u8>>,
    requests: Vec<RecordedRequest>,
    total_bytes: usize,
}

struct Shared {
    behaviour: Mutex<SinkBehaviour>,
    records: Mutex<Records>,
    request_arrived: Condvar,
    shutdown: AtomicBool,
    live: AtomicUsize,
    handlers: Mutex<Vec<JoinHandle<()>>>,
    /// A handle on each open connection, so Drop can cut blocked reads and writes short.
    open: Mutex<HashMap<usize, TcpStream>>,
}

/// Locks, recovering the data if a handler thread panicked while holding the lock: the
/// records stay useful, and a test should not fail for the wrong reason.
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// A loopback HTTP/1.1 destination that records every byte it receives.
pub struct Sink {
    addr: SocketAddr,
    shared: Arc<Shared>,
    acceptor: Option<JoinHandle<()>>,
    waker: TcpStream,
}

impl Sink {
    /// Starts a sink on `127.0.0.1` with an ephemeral port.
    ///
    /// # Panics
    ///
    /// When no loopback port can be bound or no thread spawned: the test cannot run.
    pub fn start(behaviour: SinkBehaviour) -> Sink {
        Sink::try_start(behaviour).expect("start loopback sink")
    }

    /// [`Sink::start`], reporting failure instead of panicking.
    pub fn try_start(behaviour: SinkBehaviour) -> io::Result<Sink> {
        let listener = TcpListener::bind(("127.0.0.1", 0))?;
        let addr = listener.local_addr()?;
        let shared = Arc::new(Shared {
            behaviour: Mutex::new(behaviour),
            records: Mutex::new(Records::default()),
            request_arrived: Condvar::new(),
            shutdown: AtomicBool::new(false),
            live: AtomicUsize::new(0),
            handlers: Mutex::new(Vec::new()),
            open: Mutex::new(HashMap::new()),
        });
        // Shutting a listening socket down makes a blocked accept() return (Linux); a
        // second handle on it lets Drop do that without racing the acceptor.
        let waker = TcpStream::from(OwnedFd::from(listener.try_clone()?));
        let acceptor = {
            let shared = Arc::clone(&shared);
            thread::Builder::new().name(format!("sink-{}", addr.port())).spawn(move || accept_loop(listener, shared))?
        };
        Ok(Sink { addr, shared, acceptor: Some(acceptor), waker })
    }

    /// The address to point a client (or a policy host override) at.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://127.0.0.1:<port><path>`; `path` should start with `/`.
    pub fn url(&self, path: &str) -> String {
        format!("http://{}{}", self.addr, path)
    }

    /// Changes how later requests are answered.
    pub fn set_behaviour(&self, behaviour: SinkBehaviour) {
        *lock(&self.shared.behaviour) = behaviour;
    }

    /// Every byte received so far, connection after connection in accept order. This is
    /// what the oracle scans: it includes bytes that never formed a valid request.
    pub fn received(&self) -> Vec<u8> {
        lock(&self.shared.records).connections.concat()
    }

    /// The raw bytes of each connection, in accept order.
    pub fn connections(&self) -> Vec<Vec<u8>> {
        lock(&self.shared.records).connections.clone()
    }

    /// The complete requests parsed so far, in arrival order.
    pub fn requests(&self) -> Vec<RecordedRequest> {
        lock(&self.shared.records).requests.clone()
    }

    /// How many complete requests arrived.
    pub fn request_count(&self) -> usize {
        lock(&self.shared.records).requests.len()
    }

    /// Waits until at least `n` complete requests arrived or `timeout` passed; true when
    /// they did. Lets tests synchronise with a peer without unbounded sleeps.
    pub fn wait_for_requests(&self, n: usize, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        let mut records = lock(&self.shared.records);
        while records.requests.len() < n {
            let now = Instant::now();
            if now >= deadline {
                return false;
            }
            records = self
                .shared
                .request_arrived
                .wait_timeout(records, deadline - now)
                .map(|(g, _)| g)
                .unwrap_or_else(|poisoned| poisoned.into_inner().0);
        }
        true
    }
}

impl std::fmt::Debug for Sink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sink")
            .field("addr", &self.addr)
            .field("requests", &self.request_count())
            .finish_non_exhaustive()
    }
}

impl Drop for Sink {
    fn drop(&mut self) {
        self.shared.shutdown.store(true, Ordering::SeqCst);
        // Wake the acceptor out of its blocking accept(), and every handler out of a
        // blocked read or write.
        let _ = self.waker.shutdown(Shutdown::Both);
        for stream in lock(&self.shared.open).values() {
            let _ = stream.shutdown(Shutdown::Both);
        }
        if let Some(a) = self.acceptor.take() {
            let _ = a.join();
        }
        let handlers = std::mem::take(&mut *lock(&self.shared.handlers));
        for h in handlers {
            let _ = h.join();
        }
    }
}

fn accept_loop(listener: TcpListener, shared: Arc<Shared>) {
    loop {
        while shared.live.load(Ordering::SeqCst) >= MAX_CONNECTIONS {
            if shared.shutdown.load(Ordering::SeqCst) {
                return;
            }
            thread::sleep(TICK);
        }
        let accepted = listener.accept();
        if shared.shutdown.load(Ordering::SeqCst) {
            return;
        }
        let stream = match accepted {
            Ok((stream, _)) => stream,
            Err(_) => {
                // Out of descriptors or an aborted handshake: back off, keep serving.
                thread::sleep(TICK);
                continue;
            }
        };
        let id = {
            let mut records = lock(&shared.records);
            records.connections.push(Vec::new());
            records.connections.len() - 1
        };
        if let Ok(handle) = stream.try_clone() {
            lock(&shared.open).insert(id, handle);
        }
        shared.live.fetch_add(1, Ordering::SeqCst);
        let worker = Arc::clone(&shared);
        let spawned = thread::Builder::new().name(format!("sink-conn-{id}")).spawn(move || {
            serve_connection(&worker, stream, id);
            lock(&worker.open).remove(&id);
            worker.live.fetch_sub(1, Ordering::SeqCst);
        });
        match spawned {
            Ok(h) => {
                let mut handlers = lock(&shared.handlers);
                handlers.retain(|h| !h.is_finished());
                handlers.push(h);
            }
            Err(_) => {
                lock(&shared.open).remove(&id);
                shared.live.fetch_sub(1, Ordering::SeqCst);
            }
        }
    }
}

/// Why a connection stops being read.
enum Stop {
    /// Peer closed, went idle, or the sink is shutting down.
    Closed,
    /// The peer sent something we answer with an error status before closing.
    Bad(u16),
    /// Writing failed.
    Io,
}

struct Conn<'s> {
    shared: &'s Shared,
    stream: TcpStream,
    id: usize,
    buf: Vec<u8>,
    received: usize,
}

impl Conn<'_> {
    /// Reads more bytes into `buf`, recording them; waits across read timeouts until
    /// data, EOF, idle timeout, shutdown or a size cap.
    fn fill(&mut self) -> Result<(), Stop> {
        self.fill_until(Instant::now() + IDLE_TIMEOUT)
    }

    /// [`Conn::fill`] with an explicit deadline for the wait.
    fn fill_until(&mut self, deadline: Instant) -> Result<(), Stop> {
        let mut chunk = [0u8; 16 << 10];
        loop {
            if self.shared.shutdown.load(Ordering::SeqCst) {
                return Err(Stop::Closed);
            }
            let room = MAX_CONNECTION_BYTES.saturating_sub(self.received);
            if room == 0 {
                return Err(Stop::Bad(413));
            }
            let want = room.min(chunk.len());
            match self.stream.read(&mut chunk[..want]) {
                Ok(0) => return Err(Stop::Closed),
                Ok(n) => {
                    let mut records = lock(&self.shared.records);
                    if records.total_bytes.saturating_add(n) > MAX_SINK_BYTES {
                        return Err(Stop::Bad(413));
                    }
                    records.total_bytes += n;
                    if let Some(c) = records.connections.get_mut(self.id) {
                        c.extend_from_slice(&chunk[..n]);
                    }
                    drop(records);
                    self.received += n;
                    self.buf.extend_from_slice(&chunk[..n]);
                    return Ok(());
                }
                Err(e) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut) => {
                    if Instant::now() >= deadline {
                        return Err(Stop::Closed);
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => return Err(Stop::Closed),
            }
        }
    }

    /// Makes sure `buf` holds at least `n` bytes.
    fn need(&mut self, n: usize) -> Result<(), Stop> {
        while self.buf.len() < n {
            self.fill()?;
        }
        Ok(())
    }

    /// Position just past the next line ending (`\n`) at or after `from`.
    fn line_end(&mut self, from: usize, limit: usize) -> Result<usize, Stop> {
        loop {
            if let Some(p) = self.buf.get(from..).and_then(|b| b.iter().position(|&c| c == b'\n')) {
                return Ok(from + p + 1);
            }
            if self.buf.len().saturating_sub(from) > limit {
                return Err(Stop::Bad(400));
            }
            self.fill()?;
        }
    }

    /// After an error reply: keeps reading (and recording, within the caps) for a short
    /// while so the peer sees the reply instead of a reset caused by unread input.
    fn linger(&mut self) {
        let _ = self.stream.shutdown(Shutdown::Write);
        let deadline = Instant::now() + LINGER;
        while Instant::now() < deadline {
            self.buf.clear();
            if self.fill_until(deadline).is_err() {
                break;
            }
        }
    }

    fn write_all(&mut self, bytes: &[u8]) -> Result<(), Stop> {
        self.stream.write_all(bytes).map_err(|_| Stop::Io)
    }
}

struct Head {
    method: String,
    target: String,
    version: String,
    headers: Vec<(String, String)>,
}

impl Head {
    fn values<'a>(&'a self, name: &'a str) -> impl Iterator<Item = &'a str> + 'a {
        self.headers.iter().filter(move |(n, _)| n.eq_ignore_ascii_case(name)).map(|(_, v)| v.as_str())
    }

    fn has_token(&self, name: &str, token: &str) -> bool {
        self.values(name).flat_map(|v| v.split(',')).any(|t| t.trim().eq_ignore_ascii_case(token))
    }

    fn keep_alive(&self) -> bool {
        if self.has_token("connection", "close") {
            return false;
        }
        self.version.eq_ignore_ascii_case("HTTP/1.1") || self.has_token("connection", "keep-alive")
    }
}

fn trim_line(line: &[u8]) -> &[u8] {
    let line = line.strip_suffix(b"\n").unwrap_or(line);
    line.strip_suffix(b"\r").unwrap_or(line)
}

fn parse_head(bytes: &[u8]) -> Result<Head, Stop> {
    let text = String::from_utf8_lossy(bytes);
    let mut lines = text.split('\n').map(|l| l.strip_suffix('\r').unwrap_or(l));
    let request_line = lines.next().ok_or(Stop::Bad(400))?;
    let mut parts = request_line.split(' ').filter(|p| !p.is_empty());
    let (Some(method), Some(target), Some(version), None) = (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(Stop::Bad(400));
    };
    if !version.starts_with("HTTP/1.") {
        return Err(Stop::Bad(505));
    }
    let mut headers = Vec::new();
    for line in lines.filter(|l| !l.is_empty()) {
        let (name, value) = line.split_once(':').ok_or(Stop::Bad(400))?;
        if name.is_empty() || name.contains(char::is_whitespace) {
            return Err(Stop::Bad(400));
        }
        headers.push((name.to_owned(), value.trim().to_owned()));
    }
    Ok(Head { method: method.to_owned(), target: target.to_owned(), version: version.to_owned(), headers })
}

/// Reads one request; `Ok(None)` when the peer closed cleanly between requests.
fn read_request(conn: &mut Conn<'_>) -> Result<Option<(Head, RecordedRequest)>, Stop> {
    // Skip empty lines between requests (RFC 9112 §2.2) and wait for the head.
    let head_end = loop {
        let blank = conn.buf.iter().take_while(|b| **b == b'\r' || **b == b'\n').count();
        conn.buf.drain(..blank);
        if let Some(end) = find_head_end(&conn.buf) {
            break end;
        }
        if conn.buf.len() > MAX_HEAD_BYTES {
            return Err(Stop::Bad(431));
        }
        match conn.fill() {
            Ok(()) => {}
            Err(Stop::Closed) if conn.buf.is_empty() => return Ok(None),
            Err(e) => return Err(e),
        }
    };
    let head = parse_head(&conn.buf[..head_end])?;

    let chunked = head.values("transfer-encoding").any(|v| v.to_ascii_lowercase().contains("chunked"));
    let content_length = {
        let mut lengths = head.values("content-length").map(|v| v.parse::<usize>());
        match lengths.next() {
            None => None,
            Some(Err(_)) => return Err(Stop::Bad(400)),
            Some(Ok(n)) => {
                if lengths.any(|m| m.ok() != Some(n)) {
                    return Err(Stop::Bad(400));
                }
                Some(n)
            }
        }
    };
    if chunked && content_length.is_some() {
        return Err(Stop::Bad(400));
    }
    if content_length.is_some_and(|n| n > MAX_CONNECTION_BYTES) {
        return Err(Stop::Bad(413));
    }
    let expects_body = chunked || content_length.is_some_and(|n| n > 0);
    if expects_body && head.has_token("expect", "100-continue") {
        conn.write_all(b"HTTP/1.1 100 Continue\r\n\r\n")?;
    }

    let (body, end) = if chunked {
        read_chunked(conn, head_end)?
    } else {
        let n = content_length.unwrap_or(0);
        conn.need(head_end + n)?;
        (conn.buf[head_end..head_end + n].to_vec(), head_end + n)
    };
    let raw: Vec<u8> = conn.buf.drain(..end).collect();
    let recorded = RecordedRequest {
        connection: conn.id,
        method: head.method.clone(),
        target: head.target.clone(),
        version: head.version.clone(),
        headers: head.headers.clone(),
        body,
        chunked,
        raw,
    };
    Ok(Some((head, recorded)))
}

fn find_head_end(buf: &[u8]) -> Option<usize> {
    let mut i = 0;
    while let Some(p) = buf.get(i..).and_then(|b| b.iter().position(|&c| c == b'\n')) {
        let nl = i + p;
        match buf.get(nl + 1) {
            Some(b'\n') => return Some(nl + 2),
            Some(b'\r') if buf.get(nl + 2) == Some(&b'\n') => return Some(nl + 3),
            _ => i = nl + 1,
        }
    }
    None
}

/// Decodes a chunked body starting at `pos`; returns the body and the position just
/// past the trailers.
fn read_chunked(conn: &mut Conn<'_>, mut pos: usize) -> Result<(Vec<u8>, usize), Stop> {
    let mut body = Vec::new();
    loop {
        let end = conn.line_end(pos, 1024)?;
        let line = String::from_utf8_lossy(trim_line(&conn.buf[pos..end])).into_owned();
        let size_text = line.split(';').next().unwrap_or("").trim();
        let size = usize::from_str_radix(size_text, 16).map_err(|_| Stop::Bad(400))?;
        pos = end;
        if size == 0 {
            // Trailer fields until an empty line.
            loop {
                let end = conn.line_end(pos, MAX_HEAD_BYTES)?;
                let empty = trim_line(&conn.buf[pos..end]).is_empty();
                pos = end;
                if empty {
                    return Ok((body, pos));
                }
            }
        }
        if body.len().saturating_add(size) > MAX_CONNECTION_BYTES {
            return Err(Stop::Bad(413));
        }
        conn.need(pos + size)?;
        body.extend_from_slice(&conn.buf[pos..pos + size]);
        pos += size;
        let end = conn.line_end(pos, 2)?;
        if !trim_line(&conn.buf[pos..end]).is_empty() {
            return Err(Stop::Bad(400));
        }
        pos = end;
    }
}

fn reason(status: u16) -> &'static str {
    match status {
        200 => "OK",
        201 => "Created",
        204 => "No Content",
        301 => "Moved Permanently",
        302 => "Found",
        303 => "See Other",
        307 => "Temporary Redirect",
        308 => "Permanent Redirect",
        400 => "Bad Request",
        404 => "Not Found",
        413 => "Content Too Large",
        431 => "Request Header Fields Too Large",
        500 => "Internal Server Error",
        505 => "HTTP Version Not Supported",
        _ => "Status",
    }
}

fn response(status: u16, extra: &[(&str, &str)], body: &[u8], keep_alive: bool, head_only: bool) -> Vec<u8> {
    let mut out = format!("HTTP/1.1 {status} {}\r\n", reason(status)).into_bytes();
    for (n, v) in extra {
        out.extend_from_slice(format!("{n}: {v}\r\n").as_bytes());
    }
    out.extend_from_slice(
        format!(
            "Content-Length: {}\r\nConnection: {}\r\n\r\n",
            body.len(),
            if keep_alive { "keep-alive" } else { "close" }
        )
        .as_bytes(),
    );
    if !head_only {
        out.extend_from_slice(body);
    }
    out
}

/// Sleeps `delay` (capped) in ticks; false when the sink shut down meanwhile.
fn sleep_unless_shutdown(shared: &Shared, delay: Duration) -> bool {
    let until = Instant::now() + delay.min(MAX_DELAY);
    loop {
        if shared.shutdown.load(Ordering::SeqCst) {
            return false;
        }
        let now = Instant::now();
        if now >= until {
            return true;
        }
        thread::sleep(TICK.min(until - now));
    }
}

fn serve_connection(shared: &Shared, stream: TcpStream, id: usize) {
    if stream.set_read_timeout(Some(TICK)).is_err() {
        return;
    }
    let _ = stream.set_nodelay(true);
    let _ = stream.set_write_timeout(Some(IDLE_TIMEOUT));
    let mut conn = Conn { shared, stream, id, buf: Vec::new(), received: 0 };
    loop {
        let (head, request) = match read_request(&mut conn) {
            Ok(Some(r)) => r,
            Ok(None) | Err(Stop::Closed) | Err(Stop::Io) => break,
            Err(Stop::Bad(status)) => {
                if conn.write_all(&response(status, &[], b"", false, false)).is_ok() {
                    conn.linger();
                }
                break;
            }
        };
        let body_echo = request.body.clone();
        {
            let mut records = lock(&shared.records);
            records.requests.push(request);
        }
        shared.request_arrived.notify_all();

        let keep_alive = head.keep_alive();
        let head_only = head.method.eq_ignore_ascii_case("HEAD");
        let behaviour = lock(&shared.behaviour).clone();
        let bytes = match behaviour {
            SinkBehaviour::Ok { status, body } => response(status, &[], &body, keep_alive, head_only),
            SinkBehaviour::Redirect { status, location } => {
                response(status, &[("Location", location.as_str())], b"", keep_alive, head_only)
            }
            SinkBehaviour::Slow { delay } => {
                if !sleep_unless_shutdown(shared, delay) {
                    break;
                }
                response(200, &[], DEFAULT_BODY, keep_alive, head_only)
            }
            SinkBehaviour::Echo => {
                response(200, &[("Content-Type", "application/octet-stream")], &body_echo, keep_alive, head_only)
            }
        };
        if conn.write_all(&bytes).is_err() || !keep_alive {
            break;
        }
    }
    let _ = conn.stream.shutdown(Shutdown::Both);
}

/// A certificate authority a test makes for its HTTPS sinks, so the broker's "verify the
/// destination" path is exercised without any real CA. Keys live only in memory; only
/// the certificate is written out (for the policy's `[tls] extra_roots`).
pub struct TestCa {
    issuer: rcgen::Issuer<'static, rcgen::KeyPair>,
    cert: rustls_pki_types::CertificateDer<'static>,
    pem: String,
}

impl TestCa {
    /// A fresh CA named `name`.
    ///
    /// # Panics
    ///
    /// When key generation fails: the test cannot run.
    pub fn new(name: &str) -> TestCa {
        let mut params = rcgen::CertificateParams::default();
        params.distinguished_name.push(rcgen::DnType::CommonName, name);
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        params.key_usages = vec![rcgen::KeyUsagePurpose::KeyCertSign, rcgen::KeyUsagePurpose::DigitalSignature];
        let key = rcgen::KeyPair::generate().expect("test CA key");
        let cert = params.self_signed(&key).expect("test CA certificate");
        TestCa { pem: cert.pem(), cert: cert.der().clone(), issuer: rcgen::Issuer::new(params, key) }
    }

    /// The CA certificate in PEM.
    pub fn cert_pem(&self) -> &str {
        &self.pem
    }

    /// Writes the CA certificate to `path` and returns the path.
    pub fn write_cert(&self, path: &std::path::Path) -> std::path::PathBuf {
        std::fs::write(path, &self.pem).expect("write test CA certificate");
        path.to_path_buf()
    }

    /// A server configuration presenting a leaf for `hosts` signed by this CA.
    pub fn server_config(&self, hosts: &[&str]) -> Arc<rustls::ServerConfig> {
        let mut params =
            rcgen::CertificateParams::new(hosts.iter().map(|h| h.to_string()).collect::<Vec<_>>()).expect("leaf names");
        params.use_authority_key_identifier_extension = true;
        params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ServerAuth];
        let key = rcgen::KeyPair::generate().expect("leaf key");
        let cert = params.signed_by(&key, &self.issuer).expect("leaf certificate");
        let key = rustls_pki_types::PrivateKeyDer::Pkcs8(key.serialize_der().into());
        let cfg = rustls::ServerConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
            .with_safe_default_protocol_versions()
            .expect("TLS versions")
            .with_no_client_auth()
            .with_single_cert(vec![cert.der().clone(), self.cert.clone()], key)
            .expect("TLS server config");
        Arc::new(cfg)
    }
}

/// TLS on a loopback port in front of any plain HTTP address: each connection is
/// decrypted into its own plain connection to the inner address. A peer that fails the
/// handshake gets nothing through, so the inner server sees no connection at all.
pub struct TlsFront {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    handshakes: Arc<AtomicUsize>,
    acceptor: Option<JoinHandle<()>>,
}

impl TlsFront {
    /// Starts a TLS front on `127.0.0.1` presenting `config` (see [`TestCa::server_config`])
    /// for the plain server at `inner`.
    ///
    /// # Panics
    ///
    /// When no loopback port can be bound: the test cannot run.
    pub fn start(inner: SocketAddr, config: Arc<rustls::ServerConfig>) -> TlsFront {
        let listener = TcpListener::bind(("127.0.0.1", 0)).expect("bind TLS front");
        let addr = listener.local_addr().expect("TLS front address");
        listener.set_nonblocking(true).expect("nonblocking listener");
        let stop = Arc::new(AtomicBool::new(false));
        let handshakes = Arc::new(AtomicUsize::new(0));
        let acceptor = {
            let (stop, handshakes) = (stop.clone(), handshakes.clone());
            thread::spawn(move || {
                let mut workers: Vec<JoinHandle<()>> = Vec::new();
                while !stop.load(Ordering::SeqCst) {
                    workers.retain(|w| !w.is_finished());
                    match listener.accept() {
                        Ok((tcp, _)) if workers.len() < MAX_TLS_CONNECTIONS => {
                            let (stop, handshakes, cfg) = (stop.clone(), handshakes.clone(), config.clone());
                            workers.push(thread::spawn(move || tls_front(tcp, cfg, inner, &stop, &handshakes)));
                        }
                        _ => thread::sleep(Duration::from_millis(5)),
                    }
                }
                for w in workers {
                    let _ = w.join();
                }
            })
        };
        TlsFront { addr, stop, handshakes, acceptor: Some(acceptor) }
    }

    /// The TLS address to point a policy host override at.
    pub fn tls_addr(&self) -> SocketAddr {
        self.addr
    }

    /// How many TLS handshakes completed.
    pub fn handshakes(&self) -> usize {
        self.handshakes.load(Ordering::SeqCst)
    }
}

impl Drop for TlsFront {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(a) = self.acceptor.take() {
            let _ = a.join();
        }
    }
}

/// A loopback HTTPS destination: a [`TlsFront`] before a plain [`Sink`] (reached through
/// `Deref`), which records the decrypted bytes exactly as for HTTP.
pub struct HttpsSink {
    sink: Sink,
    front: TlsFront,
}

impl std::ops::Deref for HttpsSink {
    type Target = Sink;
    fn deref(&self) -> &Sink {
        &self.sink
    }
}

impl HttpsSink {
    /// Starts an HTTPS sink on `127.0.0.1` presenting `config` (see [`TestCa::server_config`]).
    ///
    /// # Panics
    ///
    /// When no loopback port can be bound: the test cannot run.
    pub fn start(behaviour: SinkBehaviour, config: Arc<rustls::ServerConfig>) -> HttpsSink {
        let sink = Sink::start(behaviour);
        let front = TlsFront::start(sink.addr(), config);
        HttpsSink { sink, front }
    }

    /// The TLS address to point a policy host override at.
    pub fn tls_addr(&self) -> SocketAddr {
        self.front.tls_addr()
    }

    /// How many TLS handshakes completed.
    pub fn handshakes(&self) -> usize {
        self.front.handshakes()
    }
}

/// Decrypts one TLS connection into a plain connection to the inner sink and encrypts
/// what comes back, until either side closes, the sink stops, or the peer idles out.
fn tls_front(
    tcp: TcpStream,
    cfg: Arc<rustls::ServerConfig>,
    inner_addr: SocketAddr,
    stop: &AtomicBool,
    handshakes: &AtomicUsize,
) {
    let Ok(conn) = rustls::ServerConnection::new(cfg) else { return };
    let conn = Arc::new(Mutex::new(conn));
    let (Ok(()), Ok(mut out)) = (tcp.set_read_timeout(Some(TICK)), tcp.try_clone()) else { return };
    let mut tcp = tcp;
    let mut inner: Option<(TcpStream, JoinHandle<()>)> = None;
    let mut counted = false;
    let mut last = Instant::now();
    let mut buf = vec![0u8; 16 << 10];
    let flush = |c: &mut rustls::ServerConnection, out: &mut TcpStream| -> bool {
        while c.wants_write() {
            if c.write_tls(out).is_err() {
                return false;
            }
        }
        true
    };
    'outer: while !stop.load(Ordering::SeqCst) && last.elapsed() < IDLE_TIMEOUT {
        let n = match tcp.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut) => continue,
            Err(_) => break,
        };
        last = Instant::now();
        let mut plaintext = Vec::new();
        let mut closed = false;
        {
            let mut c = lock(&conn);
            let mut rd: &[u8] = &buf[..n];
            while !rd.is_empty() {
                if c.read_tls(&mut rd).is_err() || c.process_new_packets().is_err() {
                    let _ = flush(&mut c, &mut out);
                    break 'outer;
                }
                loop {
                    let mut pt = [0u8; 8192];
                    match c.reader().read(&mut pt) {
                        Ok(0) => {
                            closed = true;
                            break;
                        }
                        Ok(k) => plaintext.extend_from_slice(&pt[..k]),
                        Err(_) => break,
                    }
                }
            }
            if !c.is_handshaking() && !counted {
                counted = true;
                handshakes.fetch_add(1, Ordering::SeqCst);
            }
            if !flush(&mut c, &mut out) {
                break;
            }
        }
        if !plaintext.is_empty() {
            if inner.is_none() {
                let Ok(s) = TcpStream::connect(inner_addr) else { break };
                let (Ok(mut back), Ok(mut out2)) = (s.try_clone(), out.try_clone()) else { break };
                let conn2 = conn.clone();
                let pump = thread::spawn(move || {
                    let mut b = vec![0u8; 16 << 10];
                    while let Ok(k) = back.read(&mut b) {
                        if k == 0 {
                            break;
                        }
                        let mut c = lock(&conn2);
                        if c.writer().write_all(&b[..k]).is_err() || !flush(&mut c, &mut out2) {
                            break;
                        }
                    }
                    let mut c = lock(&conn2);
                    c.send_close_notify();
                    let _ = flush(&mut c, &mut out2);
                    let _ = out2.shutdown(Shutdown::Write);
                });
                inner = Some((s, pump));
            }
            if let Some((s, _)) = inner.as_mut() {
                if s.write_all(&plaintext).is_err() {
                    break;
                }
            }
        }
        if closed {
            break;
        }
    }
    if let Some((s, pump)) = inner {
        let _ = s.shutdown(Shutdown::Write);
        let _ = pump.join();
    }
    let _ = tcp.shutdown(Shutdown::Both);
}

/// A loopback rendezvous for calls that must be shown to overlap (copies never see each
/// other; only this does): answers a request `met` if another request was waiting when it
/// arrived or arrives while it waits (at most `alone_after`), else `alone`. Serves at
/// most 16 requests, for 120 s.
pub fn rendezvous(alone_after: Duration) -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = l.local_addr().expect("addr");
    // (requests waiting, meetings so far)
    let state = Arc::new((Mutex::new((0usize, 0usize)), Condvar::new()));
    let end = Instant::now() + Duration::from_secs(120);
    std::thread::spawn(move || {
        for conn in l.incoming().take(16) {
            let Ok(mut c) = conn else { continue };
            if Instant::now() > end {
                return;
            }
            let state = state.clone();
            std::thread::spawn(move || {
                let _ = c.set_read_timeout(Some(Duration::from_secs(5)));
                let mut buf = [0u8; 4096];
                let _ = c.read(&mut buf);
                let (lock, cv) = &*state;
                let mut st = lock.lock().unwrap();
                let met = if st.0 > 0 {
                    st.1 += 1;
                    cv.notify_all();
                    true
                } else {
                    st.0 += 1;
                    let before = st.1;
                    st = cv.wait_timeout_while(st, alone_after, |st| st.1 == before).unwrap().0;
                    st.0 -= 1;
                    st.1 != before
                };
                drop(st);
                let body = if met { "met" } else { "alone" };
                let _ =
                    write!(c, "HTTP/1.1 200 OK\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}", body.len());
            });
        }
    });
    addr
}

#[cfg(test)]
mod tests {
    use super::*;

    const WAIT: Duration = Duration::from_secs(5);

    fn connect(sink: &Sink) -> TcpStream {
        let s = TcpStream::connect_timeout(&sink.addr(), WAIT).expect("connect to sink");
        s.set_read_timeout(Some(WAIT)).expect("timeout");
        s.set_write_timeout(Some(WAIT)).expect("timeout");
        s
    }

    /// A parsed response: status, headers, body.
    struct Reply {
        status: u16,
        headers: Vec<(String, String)>,
        body: Vec<u8>,
    }

    impl Reply {
        fn header(&self, name: &str) -> Option<&str> {
            self.headers.iter().find(|(n, _)| n.eq_ignore_ascii_case(name)).map(|(_, v)| v.as_str())
        }
    }

    /// Reads one response with a Content-Length body (all the sink sends), bounded by
    /// the socket's read timeout and a size cap.
    fn read_reply(s: &mut TcpStream, pending: &mut Vec<u8>) -> Reply {
        let mut chunk = [0u8; 4096];
        let head_end = loop {
            if let Some(e) = find_head_end(pending) {
                break e;
            }
            assert!(pending.len() < 1 << 20, "reply head too long");
            let n = s.read(&mut chunk).expect("read reply");
            assert!(n > 0, "sink closed before replying");
            pending.extend_from_slice(&chunk[..n]);
        };
        let head = String::from_utf8_lossy(&pending[..head_end]).into_owned();
        let mut lines = head.lines();
        let status_line = lines.next().expect("status line");
        let status = status_line.split(' ').nth(1).and_then(|c| c.parse().ok()).expect("status code");
        let headers: Vec<(String, String)> =
            lines.filter_map(|l| l.split_once(':')).map(|(n, v)| (n.to_owned(), v.trim().to_owned())).collect();
        let len: usize = headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case("content-length"))
            .and_then(|(_, v)| v.parse().ok())
            .unwrap_or(0);
        while pending.len() < head_end + len {
            let n = s.read(&mut chunk).expect("read body");
            assert!(n > 0, "sink closed mid-body");
            pending.extend_from_slice(&chunk[..n]);
        }
        let body = pending[head_end..head_end + len].to_vec();
        pending.drain(..head_end + len);
        Reply { status, headers, body }
    }

    fn exchange(sink: &Sink, request: &[u8]) -> Reply {
        let mut s = connect(sink);
        s.write_all(request).expect("send");
        read_reply(&mut s, &mut Vec::new())
    }

    /// True when the peer closes the connection within the read timeout.
    fn closed_by_peer(s: &mut TcpStream) -> bool {
        let mut b = [0u8; 1];
        match s.read(&mut b) {
            Ok(0) => true,
            Ok(_) => false,
            Err(e) => !matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut),
        }
    }

    #[test]
    fn get_is_answered_and_recorded_byte_for_byte() {
        let sink = Sink::start(SinkBehaviour::default());
        let req = b"GET /v1/ocr?lang=en HTTP/1.1\r\nHost: ocr.example\r\nX-Trace: a b\r\n\r\n";
        let reply = exchange(&sink, req);
        assert_eq!(reply.status, 200);
        assert_eq!(reply.body, DEFAULT_BODY);
        assert!(sink.wait_for_requests(1, WAIT));
        assert_eq!(sink.received(), req.to_vec());
        let r = &sink.requests()[0];
        assert_eq!((r.method.as_str(), r.target.as_str(), r.version.as_str()), ("GET", "/v1/ocr?lang=en", "HTTP/1.1"));
        assert_eq!(r.header("host"), Some("ocr.example"));
        assert_eq!(r.header("X-TRACE"), Some("a b"));
        assert!(r.body.is_empty());
        assert_eq!(r.raw, req.to_vec());
        assert_eq!(sink.request_count(), 1);
    }

    #[test]
    fn post_with_content_length_is_recorded() {
        let sink = Sink::start(SinkBehaviour::Ok { status: 201, body: b"made".to_vec() });
        let body = b"{\"text\":\"hello\\u0000\",\"bin\":\"\xff\xfe\"}";
        let mut req =
            format!("POST /upload HTTP/1.1\r\nHost: x\r\nContent-Length: {}\r\n\r\n", body.len()).into_bytes();
        req.extend_from_slice(body);
        let reply = exchange(&sink, &req);
        assert_eq!((reply.status, reply.body.as_slice()), (201, &b"made"[..]));
        assert!(sink.wait_for_requests(1, WAIT));
        let r = &sink.requests()[0];
        assert_eq!(r.body, body.to_vec());
        assert!(!r.chunked);
        assert_eq!(sink.received(), req);
    }

    #[test]
    fn post_with_chunked_body_is_decoded_and_raw_kept() {
        let sink = Sink::start(SinkBehaviour::Echo);
        let req = b"POST /c HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n\
                    5;ext=1\r\nhello\r\n1\r\n \r\nA\r\n0123456789\r\n0\r\nX-Trailer: t\r\n\r\n";
        let mut s = connect(&sink);
        // Split the write so the parser must wait for more bytes mid-chunk.
        let (a, b) = req.split_at(70);
        s.write_all(a).expect("send");
        s.flush().expect("flush");
        thread::sleep(Duration::from_millis(20));
        s.write_all(b).expect("send");
        let reply = read_reply(&mut s, &mut Vec::new());
        assert_eq!(reply.body, b"hello 0123456789");
        assert!(sink.wait_for_requests(1, WAIT));
        let r = &sink.requests()[0];
        assert!(r.chunked);
        assert_eq!(r.body, b"hello 0123456789");
        assert_eq!(r.raw, req.to_vec());
        assert_eq!(sink.received(), req.to_vec());
    }

    #[test]
    fn redirects_carry_the_location_unchanged() {
        let location = "http://attacker.example:8080/a/../b?x=%2F%41&y=é#frag";
        for status in [302, 307] {
            let sink = Sink::start(SinkBehaviour::Redirect { status, location: location.to_owned() });
            let reply = exchange(&sink, b"GET / HTTP/1.1\r\nHost: x\r\n\r\n");
            assert_eq!(reply.status, status);
            assert_eq!(reply.header("location"), Some(location));
            assert!(reply.body.is_empty());
        }
    }

    #[test]
    fn keep_alive_serves_several_requests_on_one_connection() {
        let sink = Sink::start(SinkBehaviour::Echo);
        let mut s = connect(&sink);
        let mut pending = Vec::new();
        for i in 0..3 {
            let body = format!("request {i}");
            let req = format!("POST /k HTTP/1.1\r\nHost: x\r\nContent-Length: {}\r\n\r\n{body}", body.len());
            s.write_all(req.as_bytes()).expect("send");
            let reply = read_reply(&mut s, &mut pending);
            assert_eq!(reply.body, body.as_bytes());
            assert_eq!(reply.header("connection"), Some("keep-alive"));
        }
        // Pipelined: two requests in one write, two replies in order.
        s.write_all(b"GET /p1 HTTP/1.1\r\nHost: x\r\n\r\nGET /p2 HTTP/1.1\r\nHost: x\r\n\r\n").expect("send");
        assert_eq!(read_reply(&mut s, &mut pending).status, 200);
        assert_eq!(read_reply(&mut s, &mut pending).status, 200);
        s.write_all(b"GET /last HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").expect("send");
        let reply = read_reply(&mut s, &mut pending);
        assert_eq!(reply.header("connection"), Some("close"));
        assert!(closed_by_peer(&mut s));
        assert!(sink.wait_for_requests(6, WAIT));
        let requests = sink.requests();
        assert!(requests.iter().all(|r| r.connection == 0));
        let targets: Vec<&str> = requests.iter().map(|r| r.target.as_str()).collect();
        assert_eq!(targets, ["/k", "/k", "/k", "/p1", "/p2", "/last"]);
        assert_eq!(sink.connections().len(), 1);
    }

    #[test]
    fn http_1_0_closes_after_one_reply() {
        let sink = Sink::start(SinkBehaviour::default());
        let mut s = connect(&sink);
        s.write_all(b"GET / HTTP/1.0\r\n\r\n").expect("send");
        assert_eq!(read_reply(&mut s, &mut Vec::new()).status, 200);
        assert!(closed_by_peer(&mut s));
    }

    #[test]
    fn slow_waits_before_answering() {
        let delay = Duration::from_millis(300);
        let sink = Sink::start(SinkBehaviour::Slow { delay });
        let t = Instant::now();
        let reply = exchange(&sink, b"GET / HTTP/1.1\r\nHost: x\r\n\r\n");
        assert_eq!(reply.status, 200);
        assert!(t.elapsed() >= delay);
        assert!(t.elapsed() < WAIT);
    }

    #[test]
    fn behaviour_can_change_between_requests() {
        let sink = Sink::start(SinkBehaviour::default());
        assert_eq!(exchange(&sink, b"GET / HTTP/1.1\r\n\r\n").status, 200);
        sink.set_behaviour(SinkBehaviour::Ok { status: 404, body: Vec::new() });
        assert_eq!(exchange(&sink, b"GET / HTTP/1.1\r\n\r\n").status, 404);
    }

    #[test]
    fn expect_continue_gets_an_interim_reply() {
        let sink = Sink::start(SinkBehaviour::Echo);
        let mut s = connect(&sink);
        s.write_all(b"PUT /x HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\nExpect: 100-continue\r\n\r\n").expect("send");
        let mut pending = Vec::new();
        assert_eq!(read_reply(&mut s, &mut pending).status, 100);
        s.write_all(b"abc").expect("send");
        assert_eq!(read_reply(&mut s, &mut pending).body, b"abc");
    }

    #[test]
    fn malformed_requests_are_refused_but_their_bytes_kept() {
        let sink = Sink::start(SinkBehaviour::default());
        let junk = b"\x16\x03\x01 not http at all\r\n\r\n";
        let reply = exchange(&sink, junk);
        assert_eq!(reply.status, 400);
        let bad_len = b"POST / HTTP/1.1\r\nContent-Length: 3\r\nContent-Length: 4\r\n\r\nabcd";
        assert_eq!(exchange(&sink, bad_len).status, 400);
        let both = b"POST / HTTP/1.1\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n";
        assert_eq!(exchange(&sink, both).status, 400);
        assert_eq!(sink.request_count(), 0);
        let received = sink.received();
        assert!(received.starts_with(junk));
        assert_eq!(received.len(), junk.len() + bad_len.len() + both.len());
    }

    #[test]
    fn oversized_head_is_refused() {
        let sink = Sink::start(SinkBehaviour::default());
        let mut s = connect(&sink);
        let mut req = b"GET / HTTP/1.1\r\nX-Big: ".to_vec();
        req.resize(MAX_HEAD_BYTES + 1024, b'a');
        // The sink may answer and close before reading it all; both are fine.
        let _ = s.write_all(&req);
        let reply = read_reply(&mut s, &mut Vec::new());
        assert_eq!(reply.status, 431);
        assert_eq!(sink.request_count(), 0);
    }

    #[test]
    fn concurrent_connections_are_all_recorded() {
        let sink = Sink::start(SinkBehaviour::Echo);
        let clients: Vec<_> = (0..8)
            .map(|i| {
                let addr = sink.addr();
                thread::spawn(move || {
                    let mut s = TcpStream::connect_timeout(&addr, WAIT).expect("connect");
                    s.set_read_timeout(Some(WAIT)).expect("timeout");
                    let body = format!("client {i}");
                    let req = format!("POST / HTTP/1.1\r\nContent-Length: {}\r\n\r\n{body}", body.len());
                    s.write_all(req.as_bytes()).expect("send");
                    read_reply(&mut s, &mut Vec::new()).body == body.as_bytes()
                })
            })
            .collect();
        for c in clients {
            assert!(c.join().expect("client thread"));
        }
        assert!(sink.wait_for_requests(8, WAIT));
        let mut bodies: Vec<Vec<u8>> = sink.requests().into_iter().map(|r| r.body).collect();
        bodies.sort();
        let mut want: Vec<Vec<u8>> = (0..8).map(|i| format!("client {i}").into_bytes()).collect();
        want.sort();
        assert_eq!(bodies, want);
        assert_eq!(sink.connections().len(), 8);
    }

    #[test]
    fn drop_stops_the_sink_and_its_connections() {
        let sink = Sink::start(SinkBehaviour::Slow { delay: Duration::from_secs(20) });
        let addr = sink.addr();
        let mut idle = connect(&sink);
        let mut waiting = connect(&sink);
        waiting.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n").expect("send");
        assert!(sink.wait_for_requests(1, WAIT));
        let t = Instant::now();
        drop(sink);
        assert!(t.elapsed() < Duration::from_secs(3), "drop took {:?}", t.elapsed());
        assert!(closed_by_peer(&mut idle));
        assert!(closed_by_peer(&mut waiting));
        assert!(TcpStream::connect_timeout(&addr, Duration::from_secs(1)).is_err());
    }

    #[test]
    fn drop_is_prompt_even_when_a_peer_never_reads_its_reply() {
        let sink = Sink::start(SinkBehaviour::Echo);
        let mut s = connect(&sink);
        let body = vec![b'e'; 8 << 20];
        let head = format!("POST / HTTP/1.1\r\nContent-Length: {}\r\n\r\n", body.len());
        s.write_all(head.as_bytes()).expect("send");
        s.write_all(&body).expect("send");
        assert!(sink.wait_for_requests(1, WAIT));
        let t = Instant::now();
        drop(sink);
        assert!(t.elapsed() < Duration::from_secs(3), "drop took {:?}", t.elapsed());
    }

    #[test]
    fn a_connection_is_cut_off_at_the_byte_cap() {
        let sink = Sink::start(SinkBehaviour::default());
        let mut s = connect(&sink);
        let mut payload = b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n".to_vec();
        let chunk = vec![b'c'; 1 << 20];
        for _ in 0..17 {
            payload.extend_from_slice(b"100000\r\n");
            payload.extend_from_slice(&chunk);
            payload.extend_from_slice(b"\r\n");
        }
        let writer = thread::spawn(move || {
            // The sink closes mid-way; the write then fails, which is the point.
            let _ = s.write_all(&payload);
        });
        let deadline = Instant::now() + Duration::from_secs(20);
        while sink.received().len() < MAX_CONNECTION_BYTES && Instant::now() < deadline {
            thread::sleep(Duration::from_millis(20));
        }
        assert!(writer.join().is_ok());
        assert_eq!(sink.received().len(), MAX_CONNECTION_BYTES);
        assert_eq!(sink.request_count(), 0);
        // Other peers are still served.
        assert_eq!(exchange(&sink, b"GET / HTTP/1.1\r\n\r\n").status, 200);
    }

    #[test]
    fn oracle_sees_a_canary_sent_to_the_sink() {
        use crate::oracle::{Encoding, Oracle};
        let mut oracle = Oracle::new();
        let canary = oracle.plant(&["hr"]);
        let sink = Sink::start(SinkBehaviour::default());
        let hex: String = canary.as_str().bytes().map(|b| format!("{b:02x}")).collect();
        let req = format!("GET /t?d={hex} HTTP/1.1\r\nHost: x\r\n\r\n");
        assert_eq!(exchange(&sink, req.as_bytes()).status, 200);
        assert!(sink.wait_for_requests(1, WAIT));
        let d = oracle.disclosures("ocr", &["finance".to_owned()], &sink.received());
        assert_eq!(d.len(), 1);
        assert_eq!(d[0].encoding, Encoding::Hex);
        assert!(oracle.disclosures("ocr", &["hr".to_owned()], &sink.received()).is_empty());
    }
}

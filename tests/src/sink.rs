//! Loopback HTTP destinations that remember everything they were sent.
//!
//! A [`Sink`] stands in for one declared destination host. It keeps the raw bytes of
//! every connection, because the disclosure oracle must judge what actually crossed the
//! wire — including malformed or truncated requests a smuggler might try — and it also
//! parses requests so tests can assert on methods, targets and bodies. Peers are the
//! code under test, so nothing a peer sends may crash, hang or exhaust the sink: sizes,
//! threads, idle time and delays are all bounded.

use std::io::{self, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
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
/// Longest request head (request line and headers).
pub const MAX_HEAD_BYTES: usize = 64 << 10;
/// Longest delay [`SinkBehaviour::Slow`] honours.
pub const MAX_DELAY: Duration = Duration::from_secs(30);
/// A connection with no traffic for this long is closed.
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(10);

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
        SinkBehaviour::Ok {
            status: 200,
            body: DEFAULT_BODY.to_vec(),
        }
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
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
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
        });
        let acceptor = {
            let shared = Arc::clone(&shared);
            thread::Builder::new()
                .name(format!("sink-{}", addr.port()))
                .spawn(move || accept_loop(listener, shared))?
        };
        Ok(Sink {
            addr,
            shared,
            acceptor: Some(acceptor),
        })
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

impl Drop for Sink {
    fn drop(&mut self) {
        self.shared.shutdown.store(true, Ordering::SeqCst);
        // Wake the acceptor out of its blocking accept().
        let _ = TcpStream::connect_timeout(&self.addr, Duration::from_secs(1));
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
        shared.live.fetch_add(1, Ordering::SeqCst);
        let worker = Arc::clone(&shared);
        let spawned = thread::Builder::new()
            .name(format!("sink-conn-{id}"))
            .spawn(move || {
                serve_connection(&worker, stream, id);
                worker.live.fetch_sub(1, Ordering::SeqCst);
            });
        match spawned {
            Ok(h) => {
                let mut handlers = lock(&shared.handlers);
                handlers.retain(|h| !h.is_finished());
                handlers.push(h);
            }
            Err(_) => {
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
        let mut chunk = [0u8; 16 << 10];
        let idle_since = Instant::now();
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
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                    ) =>
                {
                    if idle_since.elapsed() >= IDLE_TIMEOUT {
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
            if let Some(p) = self
                .buf
                .get(from..)
                .and_then(|b| b.iter().position(|&c| c == b'\n'))
            {
                return Ok(from + p + 1);
            }
            if self.buf.len().saturating_sub(from) > limit {
                return Err(Stop::Bad(400));
            }
            self.fill()?;
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
        self.headers
            .iter()
            .filter(move |(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    fn has_token(&self, name: &str, token: &str) -> bool {
        self.values(name)
            .flat_map(|v| v.split(','))
            .any(|t| t.trim().eq_ignore_ascii_case(token))
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
    let (Some(method), Some(target), Some(version), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
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
    Ok(Head {
        method: method.to_owned(),
        target: target.to_owned(),
        version: version.to_owned(),
        headers,
    })
}

/// Reads one request; `Ok(None)` when the peer closed cleanly between requests.
fn read_request(conn: &mut Conn<'_>) -> Result<Option<(Head, RecordedRequest)>, Stop> {
    // Skip empty lines between requests (RFC 9112 §2.2) and wait for the head.
    let head_end = loop {
        while conn.buf.first().is_some_and(|b| *b == b'\r' || *b == b'\n') {
            conn.buf.remove(0);
        }
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

    let chunked = head
        .values("transfer-encoding")
        .any(|v| v.to_ascii_lowercase().contains("chunked"));
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
    while let Some(p) = buf
        .get(i..)
        .and_then(|b| b.iter().position(|&c| c == b'\n'))
    {
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

fn response(
    status: u16,
    extra: &[(&str, &str)],
    body: &[u8],
    keep_alive: bool,
    head_only: bool,
) -> Vec<u8> {
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
    let mut conn = Conn {
        shared,
        stream,
        id,
        buf: Vec::new(),
        received: 0,
    };
    loop {
        let (head, request) = match read_request(&mut conn) {
            Ok(Some(r)) => r,
            Ok(None) | Err(Stop::Closed) | Err(Stop::Io) => break,
            Err(Stop::Bad(status)) => {
                let _ = conn.write_all(&response(status, &[], b"", false, false));
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
            SinkBehaviour::Ok { status, body } => {
                response(status, &[], &body, keep_alive, head_only)
            }
            SinkBehaviour::Redirect { status, location } => response(
                status,
                &[("Location", location.as_str())],
                b"",
                keep_alive,
                head_only,
            ),
            SinkBehaviour::Slow { delay } => {
                if !sleep_unless_shutdown(shared, delay) {
                    break;
                }
                response(200, &[], DEFAULT_BODY, keep_alive, head_only)
            }
            SinkBehaviour::Echo => response(
                200,
                &[("Content-Type", "application/octet-stream")],
                &body_echo,
                keep_alive,
                head_only,
            ),
        };
        if conn.write_all(&bytes).is_err() || !keep_alive {
            break;
        }
    }
    let _ = conn.stream.shutdown(Shutdown::Both);
}

//! HTTP/1.1 as the broker sees it: bounded parsing of a copy's proxy request, the
//! canonical form that is digested for the positional rule (so header order, case or
//! chunking can neither fake a mismatch nor hide one), forwarding to the named host
//! (never following redirects), and the broker's own fixed replies.

use std::io::{Read, Write};
use std::net::{IpAddr, SocketAddr, TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

use germline_model::{HostName, RequestDigest};

/// Largest header block accepted from a copy or a host.
const MAX_HEAD: usize = 64 << 10;

/// Why a request could not be read or forwarded.
#[derive(Debug, thiserror::Error)]
pub enum HttpError {
    /// Malformed HTTP.
    #[error("malformed HTTP: {0}")]
    Malformed(String),
    /// Over a size bound.
    #[error("HTTP message over {0} bytes")]
    TooLarge(usize),
    /// Connection failure or timeout.
    #[error("{0}")]
    Io(#[from] std::io::Error),
}

/// One request a copy sent to the proxy.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HttpRequest {
    /// Method, upper-case.
    pub method: String,
    /// `http`, or `https` for a request read inside a CONNECT tunnel.
    pub scheme: String,
    /// Destination host name, lower-case, as the copy wrote it.
    pub host: String,
    /// Destination port.
    pub port: u16,
    /// Path and query (origin form).
    pub target: String,
    /// Headers in the order sent (names as sent).
    pub headers: Vec<(String, Vec<u8>)>,
    /// De-chunked body.
    pub body: Vec<u8>,
}

/// Headers that describe one hop, not the request: left out of the digest and rewritten
/// when forwarding.
const HOP_HEADERS: [&str; 11] = [
    "connection",
    "keep-alive",
    "proxy-connection",
    "proxy-authorization",
    "proxy-authenticate",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
    "host",
    "content-length",
];

/// Reads one request from a copy. `Ok(None)` on a clean end of stream.
pub fn read_request(stream: &mut impl Read, max: usize) -> Result<Option<HttpRequest>, HttpError> {
    read_message(stream, max, None)
}

/// Reads one request sent inside a `CONNECT host:port` tunnel: origin form (or an
/// absolute `https://` target naming the same host), scheme `https`. The destination is
/// the tunnel's host, whatever `Host` header the copy writes. Same canonical form and
/// bounds as [`read_request`].
pub fn read_tunnel_request(
    stream: &mut impl Read,
    host: &str,
    port: u16,
    max: usize,
) -> Result<Option<HttpRequest>, HttpError> {
    read_message(stream, max, Some((host, port)))
}

fn read_message(
    stream: &mut impl Read,
    max: usize,
    tunnel: Option<(&str, u16)>,
) -> Result<Option<HttpRequest>, HttpError> {
    let mut buf = Vec::with_capacity(1024);
    let head_end = loop {
        if let Some(pos) = find(&buf, b"\r\n\r\n") {
            break pos + 4;
        }
        if buf.len() > MAX_HEAD {
            return Err(HttpError::TooLarge(MAX_HEAD));
        }
        let mut chunk = [0u8; 4096];
        let n = stream.read(&mut chunk)?;
        if n == 0 {
            return if buf.is_empty() { Ok(None) } else { Err(HttpError::Malformed("truncated head".into())) };
        }
        buf.extend_from_slice(&chunk[..n]);
    };
    let mut headers = [httparse::EMPTY_HEADER; 128];
    let mut req = httparse::Request::new(&mut headers);
    let status = req.parse(&buf[..head_end]).map_err(|e| HttpError::Malformed(e.to_string()))?;
    if status.is_partial() {
        return Err(HttpError::Malformed("partial head".into()));
    }
    let method = req.method.unwrap_or("").to_ascii_uppercase();
    let raw_target = req.path.unwrap_or("").to_owned();
    let hdrs: Vec<(String, Vec<u8>)> = req.headers.iter().map(|h| (h.name.to_owned(), h.value.to_vec())).collect();
    let (scheme, host, port, target) = match tunnel {
        Some(_) if method == "CONNECT" => return Err(HttpError::Malformed("CONNECT inside a tunnel".into())),
        Some((h, p)) => ("https".to_owned(), h.to_owned(), p, parse_tunnel_target(&raw_target, h, p)?),
        None if method == "CONNECT" => {
            let (h, p) = split_host_port(&raw_target, 443)?;
            ("https".to_owned(), h, p, String::new())
        }
        None => parse_absolute(&raw_target)?,
    };
    let rest = buf[head_end..].to_vec();
    let header = |name: &str| hdrs.iter().find(|(n, _)| n.eq_ignore_ascii_case(name)).map(|(_, v)| v.clone());
    let chunked = header("transfer-encoding")
        .is_some_and(|v| String::from_utf8_lossy(&v).to_ascii_lowercase().contains("chunked"));
    let body = if chunked {
        read_chunked(stream, rest, max)?
    } else if let Some(cl) = header("content-length") {
        let len: usize = String::from_utf8_lossy(&cl)
            .trim()
            .parse()
            .map_err(|_| HttpError::Malformed("bad content-length".into()))?;
        if len > max {
            return Err(HttpError::TooLarge(max));
        }
        read_exact_with(stream, rest, len)?
    } else {
        Vec::new()
    };
    Ok(Some(HttpRequest { method, scheme, host, port, target, headers: hdrs, body }))
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

fn split_host_port(s: &str, default: u16) -> Result<(String, u16), HttpError> {
    match s.rsplit_once(':') {
        Some((h, p)) if !h.contains(']') || h.ends_with(']') => {
            let port = p.parse().map_err(|_| HttpError::Malformed(format!("bad port in {s:?}")))?;
            Ok((h.to_ascii_lowercase(), port))
        }
        _ => Ok((s.to_ascii_lowercase(), default)),
    }
}

fn parse_absolute(target: &str) -> Result<(String, String, u16, String), HttpError> {
    let rest = target.strip_prefix("http://").ok_or_else(|| {
        HttpError::Malformed(format!("proxy requests must use absolute http:// targets, got {target:?}"))
    })?;
    let (authority, path) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, "/"),
    };
    if authority.contains('@') {
        return Err(HttpError::Malformed("credentials in URL".into()));
    }
    let (host, port) = split_host_port(authority, 80)?;
    Ok(("http".into(), host, port, path.to_owned()))
}

fn parse_tunnel_target(target: &str, host: &str, port: u16) -> Result<String, HttpError> {
    if target.starts_with('/') {
        return Ok(target.to_owned());
    }
    let rest = target
        .strip_prefix("https://")
        .ok_or_else(|| HttpError::Malformed(format!("requests in a tunnel use origin form, got {target:?}")))?;
    let (authority, path) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, "/"),
    };
    if authority.contains('@') {
        return Err(HttpError::Malformed("credentials in URL".into()));
    }
    let (h, p) = split_host_port(authority, 443)?;
    if h != host || p != port {
        return Err(HttpError::Malformed(format!("a tunnel to {host}:{port} cannot carry a request for {h}:{p}")));
    }
    Ok(path.to_owned())
}

/// Whether a reply leaves the connection usable for another request: it must be framed
/// by `Content-Length` and not ask to close.
pub fn keeps_alive(reply: &[u8]) -> bool {
    let Some(end) = find(reply, b"\r\n\r\n") else { return false };
    let mut headers = [httparse::EMPTY_HEADER; 128];
    let mut resp = httparse::Response::new(&mut headers);
    if !matches!(resp.parse(&reply[..end + 4]), Ok(httparse::Status::Complete(_))) {
        return false;
    }
    let value = |name: &str| {
        resp.headers.iter().find(|h| h.name.eq_ignore_ascii_case(name)).map(|h| String::from_utf8_lossy(h.value))
    };
    let close = value("connection").is_some_and(|v| v.to_ascii_lowercase().contains("close"));
    let framed = value("content-length").and_then(|v| v.trim().parse::<usize>().ok()) == Some(reply.len() - end - 4);
    framed && !close
}

/// Where the broker sends a request for `host:port`. A name in the policy's host map goes
/// where the map says (`mapped`, the caller looks it up in the policy; tests point
/// them at loopback). Any other name is resolved by the
/// broker itself, and only public addresses are used: a name resolving to a loopback,
/// private, link-local or otherwise special address is refused, as are reserved names
/// (`.example`, `.test`, `.invalid`, `.local`) that have no public address by definition.
///
/// The lookup runs on its own thread and is abandoned at `deadline`, so a slow resolver
/// cannot hold a copy's broker past its budget.
pub fn resolve_destination(
    mapped: Option<SocketAddr>,
    host: &HostName,
    port: u16,
    deadline: Instant,
) -> Result<SocketAddr, String> {
    if let Some(addr) = mapped {
        return Ok(addr);
    }
    let name = host.as_str();
    let reserved = ["example", "test", "invalid", "local"];
    if reserved.iter().any(|t| name == *t || name.ends_with(&format!(".{t}"))) {
        return Err(format!("{name} is a reserved name with no public address"));
    }
    let candidates: Vec<SocketAddr> = match name.trim_start_matches('[').trim_end_matches(']').parse::<IpAddr>() {
        Ok(ip) => vec![SocketAddr::new(ip, port)],
        Err(_) => {
            let (tx, rx) = std::sync::mpsc::channel();
            let owned = name.to_owned();
            std::thread::spawn(move || {
                let _ = tx.send((owned.as_str(), port).to_socket_addrs().map(|a| a.collect::<Vec<_>>()));
            });
            let wait = deadline.saturating_duration_since(Instant::now());
            match rx.recv_timeout(wait) {
                Ok(r) => r.map_err(|e| format!("resolving {name}: {e}"))?,
                Err(_) => return Err(format!("resolving {name}: no answer before the deadline")),
            }
        }
    };
    candidates
        .iter()
        .find(|a| is_public(a.ip()))
        .copied()
        .ok_or_else(|| format!("{name} resolves to no public address ({candidates:?}); refused"))
}

/// Whether `ip` is a globally routable unicast address.
pub fn is_public(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => {
            let o = v4.octets();
            !(v4.is_loopback()
                || v4.is_private()
                || v4.is_link_local()
                || v4.is_unspecified()
                || v4.is_broadcast()
                || v4.is_multicast()
                || v4.is_documentation()
                || o[0] == 0
                || (o[0] == 100 && (o[1] & 0xc0) == 64)
                || (o[0] == 192 && o[1] == 0 && o[2] == 0)
                || (o[0] == 198 && (o[1] & 0xfe) == 18)
                || o[0] >= 240)
        }
        IpAddr::V6(v6) => {
            if let Some(v4) = v6.to_ipv4_mapped() {
                return is_public(IpAddr::V4(v4));
            }
            let s = v6.segments();
            !(v6.is_loopback()
                || v6.is_unspecified()
                || v6.is_multicast()
                || (s[0] & 0xfe00) == 0xfc00
                || (s[0] & 0xffc0) == 0xfe80
                || (s[0] == 0x2001 && s[1] == 0xdb8)
                || (s[0] == 0x64 && s[1] == 0xff9b))
        }
    }
}

fn read_exact_with(stream: &mut impl Read, mut have: Vec<u8>, len: usize) -> Result<Vec<u8>, HttpError> {
    while have.len() < len {
        let mut chunk = vec![0u8; (len - have.len()).min(64 << 10)];
        let n = stream.read(&mut chunk)?;
        if n == 0 {
            return Err(HttpError::Malformed("truncated body".into()));
        }
        have.extend_from_slice(&chunk[..n]);
    }
    have.truncate(len);
    Ok(have)
}

fn read_chunked(stream: &mut impl Read, mut buf: Vec<u8>, max: usize) -> Result<Vec<u8>, HttpError> {
    let mut body = Vec::new();
    let mut pos = 0;
    let mut fill = |buf: &mut Vec<u8>| -> Result<(), HttpError> {
        let mut chunk = [0u8; 8192];
        let n = stream.read(&mut chunk)?;
        if n == 0 {
            return Err(HttpError::Malformed("truncated chunked body".into()));
        }
        buf.extend_from_slice(&chunk[..n]);
        if buf.len() > max + MAX_HEAD {
            return Err(HttpError::TooLarge(max));
        }
        Ok(())
    };
    loop {
        let line_end = loop {
            if let Some(i) = find(&buf[pos..], b"\r\n") {
                break pos + i;
            }
            fill(&mut buf)?;
        };
        let line = String::from_utf8_lossy(&buf[pos..line_end]).into_owned();
        let size = usize::from_str_radix(line.split(';').next().unwrap_or("").trim(), 16)
            .map_err(|_| HttpError::Malformed("bad chunk size".into()))?;
        pos = line_end + 2;
        if size == 0 {
            // Trailers are read and dropped up to the blank line.
            loop {
                let end = loop {
                    if let Some(i) = find(&buf[pos..], b"\r\n") {
                        break pos + i;
                    }
                    fill(&mut buf)?;
                };
                let blank = end == pos;
                pos = end + 2;
                if blank {
                    return Ok(body);
                }
            }
        }
        if body.len() + size > max {
            return Err(HttpError::TooLarge(max));
        }
        while buf.len() < pos + size + 2 {
            fill(&mut buf)?;
        }
        body.extend_from_slice(&buf[pos..pos + size]);
        pos += size + 2;
    }
}

impl HttpRequest {
    /// The canonical encoding the positional rule compares: method, scheme, host, port,
    /// target, end-to-end headers (names lower-cased, values trimmed, sorted by name with
    /// the order of repeated names kept) and the de-chunked body, each length-prefixed.
    pub fn canonical_bytes(&self) -> Vec<u8> {
        let mut out = b"germline-http-request/1\n".to_vec();
        let mut field = |b: &[u8]| {
            out.extend_from_slice(&(b.len() as u64).to_be_bytes());
            out.extend_from_slice(b);
        };
        field(self.method.as_bytes());
        field(self.scheme.as_bytes());
        field(self.host.as_bytes());
        field(self.port.to_string().as_bytes());
        field(self.target.as_bytes());
        let mut hs = self.end_to_end_headers();
        hs.sort_by(|a, b| a.0.cmp(&b.0));
        field(&(hs.len() as u64).to_be_bytes());
        for (n, v) in &hs {
            field(n.as_bytes());
            field(v);
        }
        field(&self.body);
        out
    }

    /// SHA-256 of the canonical encoding.
    pub fn digest(&self) -> RequestDigest {
        RequestDigest::of_bytes(&self.canonical_bytes())
    }

    fn end_to_end_headers(&self) -> Vec<(String, Vec<u8>)> {
        self.headers
            .iter()
            .map(|(n, v)| (n.to_ascii_lowercase(), trim(v).to_vec()))
            .filter(|(n, _)| !HOP_HEADERS.contains(&n.as_str()))
            .collect()
    }

    /// The request as the broker sends it to the host: origin form, one `Host`, an exact
    /// `Content-Length`, `Connection: close`.
    pub fn to_wire(&self) -> Vec<u8> {
        let mut out = format!("{} {} HTTP/1.1\r\n", self.method, self.target).into_bytes();
        let host = if (self.scheme == "http" && self.port == 80) || (self.scheme == "https" && self.port == 443) {
            self.host.clone()
        } else {
            format!("{}:{}", self.host, self.port)
        };
        out.extend_from_slice(format!("Host: {host}\r\n").as_bytes());
        for (n, v) in self.end_to_end_headers() {
            out.extend_from_slice(n.as_bytes());
            out.extend_from_slice(b": ");
            out.extend_from_slice(&v);
            out.extend_from_slice(b"\r\n");
        }
        if !self.body.is_empty() || matches!(self.method.as_str(), "POST" | "PUT" | "PATCH") {
            out.extend_from_slice(format!("Content-Length: {}\r\n", self.body.len()).as_bytes());
        }
        out.extend_from_slice(b"Connection: close\r\n\r\n");
        out.extend_from_slice(&self.body);
        out
    }
}

fn trim(v: &[u8]) -> &[u8] {
    let start = v.iter().position(|b| !b.is_ascii_whitespace()).unwrap_or(v.len());
    let end = v.iter().rposition(|b| !b.is_ascii_whitespace()).map_or(start, |e| e + 1);
    &v[start..end]
}

/// Test-only switch ("mechanism off"): egress connections take the source port the kernel
/// picks, as before. Never set outside tests.
pub static EGRESS_KERNEL_PORTS_FOR_TESTS: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Connects to an egress destination from a source port the broker draws at random.
///
/// A port the kernel picks for `connect` comes from the host-wide `table_perturb`, which
/// every `connect` on the host moves, in any network namespace, by how many ports it
/// tried: a copy that connects to addresses of its choosing (any 127/8 address in its own
/// namespace) shifts the entries, and the source ports of the broker's next connections,
/// which the destination sees, would spell what the copy saw. A bound port skips that
/// table, so a destination learns nothing from it.
pub fn egress_connect(addr: &SocketAddr, timeout: Duration) -> std::io::Result<TcpStream> {
    use socket2::{Domain, Protocol, SockAddr, Socket, Type};
    if EGRESS_KERNEL_PORTS_FOR_TESTS.load(std::sync::atomic::Ordering::SeqCst) {
        return TcpStream::connect_timeout(addr, timeout);
    }
    let mut last = None;
    for _ in 0..64 {
        let mut b = [0u8; 2];
        getrandom::fill(&mut b).map_err(|e| std::io::Error::other(format!("drawing a source port: {e}")))?;
        // The usual ephemeral range, 32768..=60999.
        let port = 32768 + u16::from_le_bytes(b) % (60999 - 32768 + 1);
        let sock = Socket::new(Domain::for_address(*addr), Type::STREAM, Some(Protocol::TCP))?;
        let local: SocketAddr = match addr {
            SocketAddr::V4(_) => (std::net::Ipv4Addr::UNSPECIFIED, port).into(),
            SocketAddr::V6(_) => (std::net::Ipv6Addr::UNSPECIFIED, port).into(),
        };
        match sock.bind(&SockAddr::from(local)) {
            Ok(()) => {
                sock.connect_timeout(&SockAddr::from(*addr), timeout)?;
                return Ok(sock.into());
            }
            Err(e) if e.kind() == std::io::ErrorKind::AddrInUse => last = Some(e),
            Err(e) => return Err(e),
        }
    }
    Err(last.unwrap_or_else(|| std::io::Error::other("no free source port")))
}

/// Sends `req` to `addr` and returns the raw response, bounded in size and time. A 3xx is
/// returned like any other response: the broker never follows redirects.
pub fn forward(req: &HttpRequest, addr: SocketAddr, deadline: Instant, max: usize) -> Result<Vec<u8>, HttpError> {
    let remaining = |what: &str| {
        deadline
            .checked_duration_since(Instant::now())
            .filter(|d| !d.is_zero())
            .ok_or_else(|| std::io::Error::new(std::io::ErrorKind::TimedOut, format!("deadline passed while {what}")))
    };
    let mut s = egress_connect(&addr, remaining("connecting")?)?;
    s.set_write_timeout(Some(remaining("sending")?))?;
    s.write_all(&req.to_wire())?;
    let mut out = Vec::new();
    let mut chunk = [0u8; 16 << 10];
    loop {
        s.set_read_timeout(Some(remaining("reading the reply")?.max(Duration::from_millis(1))))?;
        let n = s.read(&mut chunk)?;
        if n == 0 {
            break;
        }
        out.extend_from_slice(&chunk[..n]);
        if out.len() > max + MAX_HEAD {
            return Err(HttpError::TooLarge(max));
        }
    }
    Ok(out)
}

/// The placeholder ⊥: what a copy gets for a request that is not delivered and has no
/// admissible, equal recorded reply. Fixed bytes, so it carries no information.
pub fn placeholder_response() -> Vec<u8> {
    b"HTTP/1.1 502 Bad Gateway\r\nx-germline: placeholder\r\ncontent-length: 0\r\nconnection: close\r\n\r\n".to_vec()
}

/// The reply to a request the broker refuses outright (undeclared host, bad request).
pub fn denied_response(reason: &str) -> Vec<u8> {
    let body = format!("germline: {reason}\n");
    format!(
        "HTTP/1.1 403 Forbidden\r\nx-germline: denied\r\ncontent-type: text/plain\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(raw: &[u8]) -> HttpRequest {
        read_request(&mut &raw[..], 1 << 20).unwrap().unwrap()
    }

    #[test]
    fn header_order_case_and_chunking_do_not_change_the_digest() {
        let a = parse(b"POST http://ocr.example/scan?x=1 HTTP/1.1\r\nHost: ocr.example\r\nX-A: 1\r\ncontent-type: text/plain\r\nContent-Length: 5\r\n\r\nhello");
        let b = parse(b"POST http://OCR.example:80/scan?x=1 HTTP/1.1\r\nContent-Type:  text/plain \r\nx-a: 1\r\nTransfer-Encoding: chunked\r\nConnection: keep-alive\r\n\r\n2\r\nhe\r\n3\r\nllo\r\n0\r\n\r\n");
        assert_eq!(a.digest(), b.digest());
        let c = parse(b"POST http://ocr.example/scan?x=1 HTTP/1.1\r\nX-A: 2\r\ncontent-type: text/plain\r\nContent-Length: 5\r\n\r\nhello");
        assert_ne!(a.digest(), c.digest(), "a changed header value must change the digest");
        let d = parse(b"POST http://ocr.example/scan?x=1 HTTP/1.1\r\nX-A: 1\r\ncontent-type: text/plain\r\nContent-Length: 5\r\n\r\nhellp");
        assert_ne!(a.digest(), d.digest(), "a changed body must change the digest");
    }

    #[test]
    fn rejects_bad_requests() {
        assert!(read_request(&mut &b"GET /relative HTTP/1.1\r\n\r\n"[..], 100).is_err());
        assert!(read_request(&mut &b"POST http://a.example/ HTTP/1.1\r\nContent-Length: 999\r\n\r\n"[..], 100).is_err());
        assert!(read_request(&mut &b"GET http://user:pw@a.example/ HTTP/1.1\r\n\r\n"[..], 100).is_err());
        assert!(read_request(&mut &b""[..], 100).unwrap().is_none());
    }

    #[test]
    fn tunnel_requests_digest_like_proxy_requests_and_keep_their_host() {
        let raw = b"POST /scan HTTP/1.1\r\nHost: evil.example\r\nX-A: 1\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nhe\r\n3\r\nllo\r\n0\r\n\r\n";
        let a = read_tunnel_request(&mut &raw[..], "ocr.example", 443, 1 << 20).unwrap().unwrap();
        assert_eq!((a.scheme.as_str(), a.host.as_str(), a.target.as_str()), ("https", "ocr.example", "/scan"));
        let b = read_tunnel_request(
            &mut &b"POST https://ocr.example/scan HTTP/1.1\r\nx-a:  1\r\nContent-Length: 5\r\n\r\nhello"[..],
            "ocr.example",
            443,
            1 << 20,
        )
        .unwrap()
        .unwrap();
        assert_eq!(a.digest(), b.digest());
        let plain = parse(b"POST http://ocr.example/scan HTTP/1.1\r\nX-A: 1\r\nContent-Length: 5\r\n\r\nhello");
        assert_ne!(a.digest(), plain.digest(), "the scheme is part of what is compared");
        assert!(read_tunnel_request(&mut &b"GET https://evil.example/ HTTP/1.1\r\n\r\n"[..], "ocr.example", 443, 99)
            .is_err());
        assert!(read_tunnel_request(&mut &b"CONNECT a.example:443 HTTP/1.1\r\n\r\n"[..], "a.example", 443, 99).is_err());
    }

    #[test]
    fn only_framed_replies_keep_a_tunnel_open() {
        assert!(keeps_alive(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"));
        assert!(!keeps_alive(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok"));
        assert!(!keeps_alive(b"HTTP/1.1 200 OK\r\n\r\nok"));
        assert!(!keeps_alive(&placeholder_response()));
    }

    #[test]
    fn unmapped_names_resolve_only_to_public_addresses() {
        let mapped: Option<SocketAddr> = Some("127.0.0.1:9".parse().unwrap());
        let h = |s: &str| HostName::new(s).unwrap();
        let soon = Instant::now() + Duration::from_secs(5);
        assert_eq!(resolve_destination(mapped, &h("api.example"), 443, soon).unwrap().port(), 9, "the host map wins");
        // `localhost` resolves through /etc/hosts (no DNS query) to a loopback address.
        assert!(resolve_destination(None, &h("localhost"), 443, soon).unwrap_err().contains("no public address"));
        assert!(resolve_destination(None, &h("evil.example"), 443, soon).unwrap_err().contains("reserved"));
        for ip in ["127.0.0.1", "10.1.2.3", "192.168.0.1", "172.16.0.1", "169.254.1.1", "0.0.0.0", "100.64.0.1"] {
            assert!(!is_public(ip.parse().unwrap()), "{ip}");
            assert!(resolve_destination(None, &h(ip), 80, soon).is_err(), "{ip}");
        }
        for ip in ["::1", "fe80::1", "fd00::1", "::ffff:10.0.0.1"] {
            assert!(!is_public(ip.parse().unwrap()), "{ip}");
        }
        assert!(is_public("93.184.215.14".parse().unwrap()) && is_public("2606:4700::1".parse().unwrap()));
    }

    #[test]
    fn wire_form_is_origin_form_with_one_host() {
        let r = parse(b"GET http://a.example:8080/p HTTP/1.1\r\nHost: evil.example\r\nAccept: */*\r\n\r\n");
        let wire = String::from_utf8(r.to_wire()).unwrap();
        assert!(wire.starts_with("GET /p HTTP/1.1\r\nHost: a.example:8080\r\n"), "{wire}");
        assert!(!wire.contains("evil.example"));
    }
}

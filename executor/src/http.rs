//! HTTP/1.1 as the broker sees it: bounded parsing of a copy's proxy request, the
//! canonical form that is digested for the positional rule (so header order, case or
//! chunking can neither fake a mismatch nor hide one), forwarding to the named host
//! (never following redirects), and the broker's own fixed replies.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use germline_model::RequestDigest;

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
    let (scheme, host, port, target) = if method == "CONNECT" {
        let (h, p) = split_host_port(&raw_target, 443)?;
        ("https".to_owned(), h, p, String::new())
    } else {
        parse_absolute(&raw_target)?
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

/// Sends `req` to `addr` and returns the raw response, bounded in size and time. A 3xx is
/// returned like any other response: the broker never follows redirects.
pub fn forward(req: &HttpRequest, addr: SocketAddr, deadline: Instant, max: usize) -> Result<Vec<u8>, HttpError> {
    let remaining = |what: &str| {
        deadline
            .checked_duration_since(Instant::now())
            .filter(|d| !d.is_zero())
            .ok_or_else(|| std::io::Error::new(std::io::ErrorKind::TimedOut, format!("deadline passed while {what}")))
    };
    let mut s = TcpStream::connect_timeout(&addr, remaining("connecting")?)?;
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
    fn wire_form_is_origin_form_with_one_host() {
        let r = parse(b"GET http://a.example:8080/p HTTP/1.1\r\nHost: evil.example\r\nAccept: */*\r\n\r\n");
        let wire = String::from_utf8(r.to_wire()).unwrap();
        assert!(wire.starts_with("GET /p HTTP/1.1\r\nHost: a.example:8080\r\n"), "{wire}");
        assert!(!wire.contains("evil.example"));
    }
}

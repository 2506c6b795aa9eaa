//! HTTPS through the broker. A copy's `CONNECT host:port` is answered by terminating TLS
//! with a leaf for `host` from the deployment CA, so the broker reads each plaintext
//! request and applies the same canonical digest and positional rule as for plain HTTP.
//! The real request is then issued by the broker itself over a fresh TLS session that
//! verifies the destination's own certificate (system roots plus the policy's extra
//! roots). Nothing the copy sends ever reaches a host as ciphertext the broker cannot read.

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rustls::{ClientConfig, ClientConnection, RootCertStore, ServerConfig, ServerConnection, StreamOwned};
use rustls_pki_types::ServerName;

use crate::ca::{pem_certificates, DeploymentCa};
use crate::http::{self, HttpError, HttpRequest};
use crate::ExecutorError;

/// Environment variables that point TLS clients (OpenSSL, Python requests, curl, Node) at
/// the deployment CA certificate.
pub const CA_TRUST_VARS: [&str; 4] = ["SSL_CERT_FILE", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE", "NODE_EXTRA_CA_CERTS"];

/// Most requests served inside one tunnel (keep-alive is allowed, but bounded).
const MAX_TUNNEL_REQUESTS: usize = 100;

/// The broker's TLS side for one deployment: the CA that copies trust and the client
/// configuration that verifies real destinations.
///
/// It keeps nothing that one copy's traffic changes and another copy's can see. Each
/// tunnel gets a leaf of its own, with a key of its own (a cache of leaves shared by every
/// copy was a channel: a copy holding an item filled it with made-up host names, and a
/// later copy counted how many names it took until its own host's leaf changed). Upstream
/// sessions are never resumed (a shared resumption store would let one copy's deliveries
/// change whether, and how fast, another copy's handshake with a host completes).
pub struct DeploymentTls {
    ca: DeploymentCa,
    /// Only with [`SHARED_LEAVES_FOR_TESTS`]: the shared cache, as it was.
    shared_for_tests: Mutex<HashMap<String, Arc<ServerConfig>>>,
    client: Arc<ClientConfig>,
}

/// Test-only: tunnels share one leaf per host name, cached for the deployment and started
/// over at 1024 names (the mechanism-off run of
/// `redteam_teardown::redteam_tls_leaf_cache_carries_a_count_between_copies_only_when_shared`).
pub static SHARED_LEAVES_FOR_TESTS: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

impl std::fmt::Debug for DeploymentTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeploymentTls").field("ca", &self.ca).finish_non_exhaustive()
    }
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

fn terr(what: &str, e: impl std::fmt::Display) -> ExecutorError {
    ExecutorError::Sandbox(format!("TLS: {what}: {e}"))
}

impl DeploymentTls {
    /// Opens the CA under `ca_dir` and trusts the system roots plus `extra_roots` (PEM
    /// files, e.g. a test CA for loopback sinks) for upstream connections.
    pub fn open(ca_dir: &Path, extra_roots: &[PathBuf]) -> Result<DeploymentTls, ExecutorError> {
        let ca = DeploymentCa::open(ca_dir)?;
        let mut roots = RootCertStore { roots: webpki_roots::TLS_SERVER_ROOTS.to_vec() };
        for path in extra_roots {
            let pem = std::fs::read(path)
                .map_err(|e| ExecutorError::Policy(format!("tls.extra_roots {}: {e}", path.display())))?;
            let certs = pem_certificates(&pem)?;
            if certs.is_empty() {
                return Err(ExecutorError::Policy(format!("tls.extra_roots {}: no certificate", path.display())));
            }
            for c in certs {
                roots.add(c).map_err(|e| ExecutorError::Policy(format!("tls.extra_roots {}: {e}", path.display())))?;
            }
        }
        let mut client = ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(|e| terr("client versions", e))?
            .with_root_certificates(roots)
            .with_no_client_auth();
        client.resumption = rustls::client::Resumption::disabled();
        Ok(DeploymentTls { ca, shared_for_tests: Mutex::new(HashMap::new()), client: Arc::new(client) })
    }

    /// The CA certificate file copies trust.
    pub fn ca_cert_path(&self) -> &Path {
        self.ca.cert_path()
    }

    /// A server configuration for one tunnel as `host`, with a fresh leaf.
    fn server_config(&self, host: &str) -> Result<Arc<ServerConfig>, ExecutorError> {
        let shared = SHARED_LEAVES_FOR_TESTS.load(std::sync::atomic::Ordering::SeqCst);
        if shared {
            if let Some(c) = self.shared_for_tests.lock().unwrap_or_else(|p| p.into_inner()).get(host) {
                return Ok(c.clone());
            }
        }
        let leaf = self.ca.leaf(host)?;
        let cfg = ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(|e| terr("server versions", e))?
            .with_no_client_auth()
            .with_single_cert(leaf.chain, leaf.key)
            .map_err(|e| terr("leaf", e))?;
        let cfg = Arc::new(cfg);
        if shared {
            let mut servers = self.shared_for_tests.lock().unwrap_or_else(|p| p.into_inner());
            if servers.len() >= 1024 {
                servers.clear();
            }
            servers.insert(host.to_owned(), cfg.clone());
        }
        Ok(cfg)
    }

    /// Serves one accepted `CONNECT host:port`: confirms the tunnel, terminates TLS as
    /// `host`, and answers each plaintext request with `respond` (the broker's decision),
    /// until the copy closes, a reply ends the connection, or the bound is reached.
    pub fn serve_tunnel(
        &self,
        mut conn: TcpStream,
        host: &str,
        port: u16,
        max: usize,
        mut respond: impl FnMut(&HttpRequest) -> Vec<u8>,
    ) -> Result<(), ExecutorError> {
        let cfg = self.server_config(host)?;
        conn.write_all(b"HTTP/1.1 200 Connection established\r\n\r\n")
            .map_err(ExecutorError::io("confirming a tunnel"))?;
        let session = ServerConnection::new(cfg).map_err(|e| terr("server session", e))?;
        let mut tls = StreamOwned::new(session, conn);
        for _ in 0..MAX_TUNNEL_REQUESTS {
            let reply = match http::read_tunnel_request(&mut tls, host, port, max) {
                Ok(Some(req)) => respond(&req),
                Ok(None) => break,
                Err(HttpError::Io(e)) => return Err(ExecutorError::io("reading inside a tunnel")(e)),
                Err(e) => http::denied_response(&format!("bad request: {e}")),
            };
            tls.write_all(&reply).map_err(ExecutorError::io("replying inside a tunnel"))?;
            if !http::keeps_alive(&reply) {
                break;
            }
        }
        tls.conn.send_close_notify();
        let _ = tls.flush();
        let _ = tls.sock.shutdown(Shutdown::Both);
        Ok(())
    }

    /// Sends `req` to `addr` over TLS, verifying the certificate for `req.host`, and
    /// returns the raw response, bounded in size and time. Redirects are returned, never
    /// followed; a certificate that does not verify means nothing is sent.
    pub fn forward(
        &self,
        req: &HttpRequest,
        addr: SocketAddr,
        deadline: Instant,
        max: usize,
    ) -> Result<Vec<u8>, HttpError> {
        let name = ServerName::try_from(req.host.clone())
            .map_err(|e| HttpError::Malformed(format!("not a TLS server name: {e}")))?;
        let remaining = || {
            deadline.checked_duration_since(Instant::now()).filter(|d| !d.is_zero()).ok_or_else(|| {
                std::io::Error::new(std::io::ErrorKind::TimedOut, "deadline passed while talking to the host")
            })
        };
        let tcp = crate::http::egress_connect(&addr, remaining()?)?;
        let timer = tcp.try_clone()?;
        timer.set_write_timeout(Some(remaining()?))?;
        timer.set_read_timeout(Some(remaining()?))?;
        let session = ClientConnection::new(self.client.clone(), name)
            .map_err(|e| HttpError::Malformed(format!("TLS client: {e}")))?;
        let mut tls = StreamOwned::new(session, tcp);
        tls.write_all(&req.to_wire())?;
        tls.flush()?;
        let mut out = Vec::new();
        let mut chunk = [0u8; 16 << 10];
        loop {
            timer.set_read_timeout(Some(remaining()?.max(Duration::from_millis(1))))?;
            match tls.read(&mut chunk) {
                Ok(0) => break,
                Ok(n) => out.extend_from_slice(&chunk[..n]),
                // A host that closes without close_notify: the reply so far is all there is.
                Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof && !out.is_empty() => break,
                Err(e) => return Err(e.into()),
            }
            if out.len() > max + (64 << 10) {
                return Err(HttpError::TooLarge(max));
            }
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener;

    /// A client trusting only the deployment CA opens a tunnel as `api.example`, sends two
    /// requests on one connection (one chunked), and gets both answers; the broker's
    /// closure saw both in plaintext with the tunnel's host and scheme `https`.
    #[test]
    fn tunnel_terminates_tls_as_the_host_and_keeps_alive() {
        let dir = tempfile::tempdir().unwrap();
        let tls = DeploymentTls::open(&dir.path().join("ca"), &[]).unwrap();
        let ca_pem = std::fs::read(tls.ca_cert_path()).unwrap();
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let client = std::thread::spawn(move || {
            let mut roots = RootCertStore::empty();
            for c in pem_certificates(&ca_pem).unwrap() {
                roots.add(c).unwrap();
            }
            let cfg = ClientConfig::builder_with_provider(provider())
                .with_safe_default_protocol_versions()
                .unwrap()
                .with_root_certificates(roots)
                .with_no_client_auth();
            let mut tcp = TcpStream::connect(addr).unwrap();
            tcp.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
            let mut confirm = [0u8; 39];
            tcp.read_exact(&mut confirm).unwrap();
            assert!(confirm.starts_with(b"HTTP/1.1 200"));
            let name = ServerName::try_from("api.example").unwrap();
            let mut s = StreamOwned::new(ClientConnection::new(Arc::new(cfg), name).unwrap(), tcp);
            s.write_all(b"GET /one HTTP/1.1\r\nHost: api.example\r\n\r\n").unwrap();
            let mut first = [0u8; 42];
            s.read_exact(&mut first).unwrap();
            s.write_all(b"POST /two HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nhi\r\n0\r\n\r\n").unwrap();
            let mut rest = Vec::new();
            let _ = s.read_to_end(&mut rest);
            (first.to_vec(), rest)
        });
        let (conn, _) = listener.accept().unwrap();
        conn.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let mut seen = Vec::new();
        tls.serve_tunnel(conn, "api.example", 443, 1 << 20, |req| {
            seen.push((req.scheme.clone(), req.host.clone(), req.target.clone(), req.body.clone()));
            if seen.len() == 1 {
                b"HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\none!".to_vec()
            } else {
                b"HTTP/1.1 200 OK\r\nContent-Length: 4\r\nConnection: close\r\n\r\ntwo!".to_vec()
            }
        })
        .unwrap();
        let (first, rest) = client.join().unwrap();
        assert!(first.ends_with(b"one!"), "{}", String::from_utf8_lossy(&first));
        assert!(rest.ends_with(b"two!"), "{}", String::from_utf8_lossy(&rest));
        let https = |t: &str, b: &[u8]| ("https".to_owned(), "api.example".to_owned(), t.to_owned(), b.to_vec());
        assert_eq!(seen, vec![https("/one", b""), https("/two", b"hi")]);
    }

    /// Two forwards to one host: each is a full handshake. With the client's resumption
    /// store on (rustls' default, the mechanism off), the second resumes the first's
    /// session: state one copy's delivery leaves for another's.
    #[test]
    fn upstream_sessions_are_never_resumed() {
        let dir = tempfile::tempdir().unwrap();
        let ca_dir = dir.path().join("ca");
        // The host's certificate comes from the same CA, trusted as an extra root.
        let ca_pem = DeploymentCa::open(&ca_dir).unwrap().cert_path().to_owned();
        let tls = DeploymentTls::open(&ca_dir, &[ca_pem]).unwrap();
        let leaf = tls.ca.leaf("api.example").unwrap();
        let server = Arc::new(
            ServerConfig::builder_with_provider(provider())
                .with_safe_default_protocol_versions()
                .unwrap()
                .with_no_client_auth()
                .with_single_cert(leaf.chain, leaf.key)
                .unwrap(),
        );
        let mut roots = RootCertStore::empty();
        for c in pem_certificates(&std::fs::read(tls.ca_cert_path()).unwrap()).unwrap() {
            roots.add(c).unwrap();
        }
        // rustls' default: a resumption store.
        let resuming = Arc::new(
            ClientConfig::builder_with_provider(provider())
                .with_safe_default_protocol_versions()
                .unwrap()
                .with_root_certificates(roots)
                .with_no_client_auth(),
        );
        let req = HttpRequest {
            method: "GET".into(),
            scheme: "https".into(),
            host: "api.example".into(),
            port: 443,
            target: "/".into(),
            headers: vec![("Host".into(), b"api.example".to_vec())],
            body: Vec::new(),
        };
        let mut kinds = Vec::new();
        for off in [true, false] {
            let t = DeploymentTls {
                ca: DeploymentCa::open(&ca_dir).unwrap(),
                shared_for_tests: Mutex::new(HashMap::new()),
                client: if off { resuming.clone() } else { tls.client.clone() },
            };
            let listener = TcpListener::bind("127.0.0.1:0").unwrap();
            let addr = listener.local_addr().unwrap();
            let server = server.clone();
            let host = std::thread::spawn(move || {
                let mut seen = Vec::new();
                for _ in 0..2 {
                    let (tcp, _) = listener.accept().unwrap();
                    tcp.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
                    let mut s = StreamOwned::new(ServerConnection::new(server.clone()).unwrap(), tcp);
                    let mut head = Vec::new();
                    let mut b = [0u8; 1];
                    while !head.ends_with(b"\r\n\r\n") && s.read(&mut b).unwrap() == 1 {
                        head.push(b[0]);
                    }
                    seen.push(s.conn.handshake_kind());
                    s.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok").unwrap();
                    s.conn.send_close_notify();
                    let _ = s.flush();
                }
                seen
            });
            for _ in 0..2 {
                let reply = t.forward(&req, addr, Instant::now() + Duration::from_secs(10), 1 << 20).unwrap();
                assert!(reply.ends_with(b"ok"), "{}", String::from_utf8_lossy(&reply));
            }
            kinds.push(host.join().unwrap());
        }
        use rustls::HandshakeKind::{Full, Resumed};
        assert_eq!(kinds[0], [Some(Full), Some(Resumed)], "mechanism off: the second session resumes the first");
        assert_eq!(kinds[1], [Some(Full), Some(Full)], "every upstream handshake is a full one");
    }
}

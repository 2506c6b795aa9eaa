//! End-to-end tests and the test world: real germlines, real copies, loopback sinks.
//!
//! The world's judge lives outside the runtime under test: [`sink::Sink`]s stand in
//! for destination hosts and keep every byte they receive, and the [`oracle`] decides
//! from those bytes alone whether a destination learned an item it was not cleared for
//! (DESIGN §2, sink noninterference). Neither trusts anything the runtime reports.
//!
//! ```
//! use std::io::{Read, Write};
//! use germline_tests::{Oracle, Sink, SinkBehaviour};
//!
//! let mut oracle = Oracle::new();
//! let hr_item = oracle.plant(&["hr"]);
//! let ocr = Sink::start(SinkBehaviour::default());
//!
//! // Stand-in for a copy that smuggles the item to the OCR host.
//! let mut peer = std::net::TcpStream::connect(ocr.addr()).unwrap();
//! peer.set_read_timeout(Some(std::time::Duration::from_secs(5))).unwrap();
//! write!(peer, "GET /?q={hr_item} HTTP/1.1\r\nConnection: close\r\n\r\n").unwrap();
//! peer.read_to_end(&mut Vec::new()).unwrap();
//!
//! let cleared_for_ocr = vec!["finance".to_string()];
//! let found = oracle.disclosures("ocr", &cleared_for_ocr, &ocr.received());
//! assert_eq!(found.len(), 1);
//! ```

pub mod attacks;
pub mod eval;
pub mod fcd;
pub mod oracle;
pub mod sink;
pub mod world;

/// Whether a test that needs `what` may go on. Present → `true`. Missing → the test
/// fails, unless the run explicitly allows it to be skipped (`GERMLINE_ALLOW_SKIP` set to
/// the test's name, a comma-separated list holding it, or `all`) and is not CI
/// (`CI=true`): then it says why and `false` tells the test to return. A test never skips
/// silently, and never in CI.
pub fn prerequisite(test: &str, what: &str, present: bool) -> bool {
    if present {
        return true;
    }
    let allowed = std::env::var("GERMLINE_ALLOW_SKIP")
        .is_ok_and(|v| v.split(',').map(str::trim).any(|n| n == test || n == "all"));
    let ci = std::env::var("CI").is_ok_and(|v| v == "true");
    if !allowed || ci {
        panic!("{test} needs {what} (set GERMLINE_ALLOW_SKIP={test} outside CI to skip it)");
    }
    eprintln!("SKIPPED ({test}, allowed by GERMLINE_ALLOW_SKIP): needs {what}");
    false
}

pub use oracle::{discloses, Canary, Disclosure, Encoding, Layer, Oracle};
pub use sink::{HttpsSink, RecordedRequest, Sink, SinkBehaviour, TestCa, TlsFront};

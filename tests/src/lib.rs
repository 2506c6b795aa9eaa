//! End-to-end tests and the test world: real germlines, real copies, loopback sinks.
//!
//! The world's judge lives outside the runtime under test: [`sink::Sink`]s stand in
//! for destination hosts and keep every byte they receive, and the [`oracle`] decides
//! from those bytes alone whether a destination learned an item it was not cleared for
//! (DESIGN §2, sink noninterference). Neither trusts anything the runtime reports.

pub mod oracle;
pub mod sink;

pub use oracle::{discloses, Canary, Disclosure, Encoding, Layer, Oracle};
pub use sink::{RecordedRequest, Sink, SinkBehaviour};

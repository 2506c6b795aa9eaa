//! Executor: germlines, sandboxed copies and the broker that relays their egress.
//!
//! A call flows: the model's Plan groups the call's destinations and consumers by view;
//! for each group in order the germline (a data-free, sandboxed import of the release)
//! forks one copy; the broker sets the copy up from outside (its view's items, its
//! listeners), speaks MCP to it over the channel, relays its egress under the positional
//! rule, stores its slot writes, labels its result, and kills it. The rules themselves are
//! pure functions in `germline-model`; this crate is the thin shell of processes and
//! sockets around them.

/// Debug builds only: whether the test switch `var` (a `GERMLINE_TEST_*` variable that
/// turns a mechanism off for a test run through the CLI or a service) is `1`. Release
/// builds never read it.
pub fn test_switch(var: &str) -> bool {
    cfg!(debug_assertions) && std::env::var_os(var).is_some_and(|v| v == "1")
}

pub mod baselines;
pub mod broker;
pub mod ca;
pub mod call;
pub mod cgroup;
pub mod confine;
pub mod dispatch;
mod error;
pub mod evidence;
pub mod germline;
pub mod host;
pub mod http;
pub mod ids;
pub mod inspect;
pub mod lanes;
pub mod manifest;
pub mod mcp;
pub mod outside;
pub mod policy;
pub mod pool;
pub mod profile;
pub mod resident;
pub mod runtime;
pub mod seccomp;
pub mod sigpin;
pub mod slots;
pub mod timings;
pub mod tls;
pub mod view_order;
pub mod wake;
mod workers;

pub use error::ExecutorError;

/// The broker's HTTP proxy port inside every copy's network namespace.
pub const PROXY_PORT: u16 = 3128;
/// The MCP channel port inside every copy's network namespace.
pub const CHANNEL_PORT: u16 = 7070;
/// The slot-write port inside every copy's network namespace.
pub const SLOT_PORT: u16 = 7071;

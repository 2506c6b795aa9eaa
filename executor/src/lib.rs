//! Executor: germlines, sandboxed copies and the broker that relays their egress.

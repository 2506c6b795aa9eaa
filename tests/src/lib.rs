//! End-to-end tests and the test world: real germlines, real copies, loopback sinks.

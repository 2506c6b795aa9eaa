//! Ledger: the append-only, tamper-evident log of witnesses and events keyed by release
//! hash (RFC 6962 Merkle tree, signed checkpoints, proofs) and per-release dampening.

//! Admission: verifies signed releases (TUF metadata, Sigstore/cosign) against pinned
//! trust, checks hash and length before unpacking into the content-addressed release
//! store, and hands the result to the executor to start and check its germline.

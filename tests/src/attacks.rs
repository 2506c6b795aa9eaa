//! What the red-team tests share: attack releases from `tests/attacks/`, and test-only
//! mechanism switches held for the length of a test.

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};

/// The `server.py` of attack `name` in `tests/attacks/<family>/`.
pub fn source(family: &str, name: &str) -> String {
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("attacks").join(family).join(name).join("server.py");
    std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

/// Holds a test-only switch set while it lives.
pub struct Hold(&'static AtomicBool);

impl Hold {
    pub fn set(flag: &'static AtomicBool, on: bool) -> Hold {
        flag.store(on, Ordering::SeqCst);
        Hold(flag)
    }
}

impl Drop for Hold {
    fn drop(&mut self) {
        self.0.store(false, Ordering::SeqCst);
    }
}

//! A small labelled world for end-to-end tests: data directories per label, releases
//! written from Python source, a policy pointing destination names at loopback sinks,
//! and runtimes started on them.

use std::fmt::Write as _;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use germline_executor::call::{CallOutcome, CallRequest};
use germline_executor::confine::SandboxSwitches;
use germline_executor::germline::PythonRuntime;
use germline_executor::policy::Policy;
use germline_executor::runtime::{Runtime, RuntimeKind};
use germline_executor::ExecutorError;
use serde_json::Value;

/// Python every test release can use: `post(url, body)` and `get(url)` through the
/// environment's proxy, returning (status, body) and never raising.
pub const PY_PRELUDE: &str = r#"
import json, os, sys, time, urllib.request, urllib.error
from mcp.server.fastmcp import FastMCP

class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *a, **k):
        return None

def _open(req, follow=True, timeout=20):
    opener = urllib.request.build_opener() if follow else urllib.request.build_opener(_NoRedirect)
    try:
        with opener.open(req, timeout=timeout) as r:
            return r.status, r.read().decode(errors="replace")
    except urllib.error.HTTPError as e:
        return e.code, (e.read() or b"").decode(errors="replace")
    except Exception as e:
        return 0, "error: " + e.__class__.__name__

def post(url, body, follow=True):
    data = body.encode() if isinstance(body, str) else body
    return _open(urllib.request.Request(url, data=data, method="POST"), follow)

def get(url, follow=True):
    return _open(urllib.request.Request(url), follow)

import ctypes as _prelude_ctypes
_prelude_libc = _prelude_ctypes.CDLL(None)

def host_clock_ns():
    # The host's CLOCK_REALTIME through libc: in a copy, the twin inputs answer Python's
    # clock functions, never native code (the attack releases time their channels by it).
    # The real-time clock, because it is the one every germline shares: each germline's
    # monotonic and boot clocks are its own (they read one day as it starts).
    ts = (_prelude_ctypes.c_long * 2)()
    _prelude_libc.clock_gettime(0, ts)
    return ts[0] * 1_000_000_000 + ts[1]
"#;

/// A temporary world: `data/<label>/` directories, releases, policy.
pub struct World {
    /// Root of everything this world writes.
    pub dir: tempfile::TempDir,
    /// The data root (its subdirectories are labelled by the policy).
    pub data: PathBuf,
}

/// The labels every world knows.
pub const LABELS: [&str; 5] = ["hr", "board", "finance", "projx", "public"];

impl Default for World {
    fn default() -> Self {
        Self::new()
    }
}

impl World {
    /// A fresh world.
    pub fn new() -> World {
        let dir = tempfile::tempdir().expect("tempdir");
        let data = dir.path().join("data");
        for l in LABELS {
            std::fs::create_dir_all(data.join(l)).expect("data dir");
        }
        World { dir, data }
    }

    /// Writes an item labelled `label` and returns its path.
    pub fn item(&self, label: &str, name: &str, contents: &str) -> PathBuf {
        let p = self.data.join(label).join(name);
        std::fs::write(&p, contents).expect("item");
        p
    }

    /// Writes a release: `tools` is the manifest's tool section, `body` the Python that
    /// defines `create_server()` (after [`PY_PRELUDE`]). `{DATA}` in the body is replaced
    /// by the data root.
    pub fn release(&self, name: &str, tools: &str, body: &str) -> PathBuf {
        let dir = self.dir.path().join(format!("rel-{name}"));
        std::fs::create_dir_all(&dir).expect("release dir");
        let manifest = format!(
            "[release]\nname = \"{name}\"\nversion = \"1.0.0\"\nruntime = \"python\"\nfactory = \"server:create_server\"\n\n{tools}\n"
        );
        std::fs::write(dir.join("germline.toml"), manifest).expect("manifest");
        let code = format!("{PY_PRELUDE}\n{}", body.replace("{DATA}", &self.data.to_string_lossy()));
        std::fs::write(dir.join("server.py"), code).expect("code");
        dir
    }

    /// A policy: every label directory labelled by its name, `destinations` as
    /// (host, clearance, sink address), `consumers` as (name, clearance), plus `extra`
    /// TOML (e.g. `[limits]`).
    pub fn policy(
        &self,
        destinations: &[(&str, &[&str], Option<SocketAddr>)],
        consumers: &[(&str, &[&str])],
        extra: &str,
    ) -> Policy {
        let mut t = String::from("tags = [\"hr\", \"board\", \"finance\", \"projx\", \"public\"]\n");
        for l in LABELS {
            let _ = write!(t, "[[items]]\npath = \"{}/{l}/**\"\nlabel = [\"{l}\"]\n", self.data.display());
        }
        let list = |tags: &[&str]| tags.iter().map(|x| format!("\"{x}\"")).collect::<Vec<_>>().join(", ");
        for (h, c, _) in destinations {
            let _ = write!(t, "[destinations.\"{h}\"]\nclearance = [{}]\n", list(c));
        }
        for (n, c) in consumers {
            let _ = write!(t, "[consumers.\"{n}\"]\nclearance = [{}]\n", list(c));
        }
        t.push_str("[hosts]\n");
        for (h, _, addr) in destinations {
            if let Some(a) = addr {
                let _ = writeln!(t, "\"{h}\" = \"{a}\"");
            }
        }
        t.push_str(extra);
        Policy::parse(&t).expect("test policy")
    }

    /// The within-call mixing case: a finance invoice and an hr payslip, each carrying a
    /// canary planted in `oracle`, and the `mixer` release whose `scan` posts the document
    /// and every other file it was given to `{scheme}://ocr.example/scan`.
    pub fn mixing_case(&self, oracle: &mut crate::Oracle, scheme: &str) -> MixingCase {
        let fin = oracle.plant(&["finance"]);
        let hr = oracle.plant(&["hr"]);
        let invoice = self.item("finance", "invoice.txt", &format!("invoice {}", fin.as_str()));
        let payslip = self.item("hr", "payslip.txt", &format!("payslip {}", hr.as_str()));
        let body = MIXER.replace("{SCHEME}", scheme);
        let release = self.release("mixer", "[tools.scan]\nhosts = [\"ocr.example\"]\n", &body);
        MixingCase { fin, hr, invoice, payslip, release }
    }

    /// The Python runtime of this world (its own home).
    pub fn python(&self) -> PythonRuntime {
        python(&self.dir.path().join("home"))
    }

    /// Starts `release` under `kind`.
    pub fn start(&self, kind: RuntimeKind, release: &Path, policy: Policy) -> Result<Runtime, ExecutorError> {
        Runtime::start(kind, release, policy, python(&self.dir.path().join("home")))
    }

    /// Starts `release` under `kind` with the germline's sandbox mechanisms switched as
    /// given (a mechanism-off twin).
    pub fn start_with(
        &self,
        kind: RuntimeKind,
        release: &Path,
        policy: Policy,
        switches: SandboxSwitches,
    ) -> Result<Runtime, ExecutorError> {
        Runtime::start_with(kind, release, policy, python(&self.dir.path().join("home")), switches)
    }
}

/// What [`World::mixing_case`] laid out.
pub struct MixingCase {
    /// The invoice's canary (finance).
    pub fin: crate::Canary,
    /// The payslip's canary (hr).
    pub hr: crate::Canary,
    /// The finance item.
    pub invoice: PathBuf,
    /// The hr item.
    pub payslip: PathBuf,
    /// The `mixer` release directory.
    pub release: PathBuf,
}

const MIXER: &str = r#"
def create_server():
    m = FastMCP("ocr")
    @m.tool()
    def scan(document: str, others: list[str]) -> str:
        text = open(document).read()
        extra = [open(o).read() for o in others]
        status, body = post("{SCHEME}://ocr.example/scan", "\n".join([text] + extra))
        return "\n".join(["ocr %d %s" % (status, body), text] + extra)
    return m
"#;

/// The Python runtime (from `GERMLINE_PYTHON`, set by `scripts/test.sh`).
pub fn python(home: &Path) -> PythonRuntime {
    PythonRuntime::discover(home).expect("Python tool host (set GERMLINE_PYTHON to the venv's python)")
}

/// A call request.
pub fn request(tool: &str, args: Value, items: &[&Path]) -> CallRequest {
    let Value::Object(arguments) = args else { panic!("arguments must be an object") };
    CallRequest {
        tool: tool.into(),
        arguments,
        items: items.iter().map(|p| p.to_path_buf()).collect(),
        consumers: vec![],
    }
}

/// The text content of a call's result (joined text parts), or "" if none.
pub fn result_text(o: &CallOutcome) -> String {
    o.result
        .as_ref()
        .and_then(|r| r.get("content"))
        .and_then(Value::as_array)
        .map(|parts| parts.iter().filter_map(|p| p.get("text").and_then(Value::as_str)).collect::<Vec<_>>().join("\n"))
        .unwrap_or_default()
}

/// The label of a call's result as tag strings.
pub fn label_tags(o: &CallOutcome) -> Option<Vec<String>> {
    o.label.as_ref().map(|l| l.tags().map(|t| t.as_str().to_owned()).collect())
}

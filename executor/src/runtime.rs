//! The runtimes a release can be run under, behind one switch (`--runtime`).

use std::path::Path;
use std::str::FromStr;

use crate::baselines::{IfcMode, IfcRuntime};
use crate::call::{CallOutcome, CallRequest, GermlineRuntime, Splitting};
use crate::confine::SandboxSwitches;
use crate::germline::PythonRuntime;
use crate::policy::Policy;
use crate::sigpin::SigPinRuntime;
use crate::ExecutorError;

/// Which runtime to use.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RuntimeKind {
    /// Plan-split copies forked from a data-free germline (the default).
    Germline,
    /// One long-lived unconfined process (unprotected reference).
    SigPin,
    /// germline with one copy holding every item ("splitting off").
    NoSplit,
    /// sig-pin plus per-call output labels from the call's own inputs.
    SigIfc,
    /// sig-ifc confined: read-only file system to declared paths, egress allowlist.
    ConfinedIfc,
    /// confined-ifc with a fresh process per call.
    FreshIfc,
}

impl RuntimeKind {
    /// Every runtime, weakest first.
    pub const ALL: [RuntimeKind; 6] = [
        RuntimeKind::SigPin,
        RuntimeKind::SigIfc,
        RuntimeKind::ConfinedIfc,
        RuntimeKind::FreshIfc,
        RuntimeKind::NoSplit,
        RuntimeKind::Germline,
    ];

    /// The name `--runtime` takes.
    pub fn name(self) -> &'static str {
        match self {
            RuntimeKind::Germline => "germline",
            RuntimeKind::SigPin => "sig-pin",
            RuntimeKind::NoSplit => "nosplit",
            RuntimeKind::SigIfc => "sig-ifc",
            RuntimeKind::ConfinedIfc => "confined-ifc",
            RuntimeKind::FreshIfc => "fresh-ifc",
        }
    }
}

impl FromStr for RuntimeKind {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "germline" => Ok(RuntimeKind::Germline),
            "sig-pin" => Ok(RuntimeKind::SigPin),
            "nosplit" => Ok(RuntimeKind::NoSplit),
            "sig-ifc" => Ok(RuntimeKind::SigIfc),
            "confined-ifc" => Ok(RuntimeKind::ConfinedIfc),
            "fresh-ifc" => Ok(RuntimeKind::FreshIfc),
            _ => Err(format!("unknown runtime {s:?} (germline, sig-pin, nosplit, sig-ifc, confined-ifc, fresh-ifc)")),
        }
    }
}

/// A started runtime.
pub enum Runtime {
    /// See [`RuntimeKind::Germline`] and [`RuntimeKind::NoSplit`].
    Germline(Box<GermlineRuntime>),
    /// See [`RuntimeKind::SigPin`].
    SigPin(Box<SigPinRuntime>),
    /// See [`RuntimeKind::SigIfc`], [`RuntimeKind::ConfinedIfc`], [`RuntimeKind::FreshIfc`].
    Ifc(Box<IfcRuntime>),
}

impl Runtime {
    /// Starts `release_dir` under `kind`.
    pub fn start(
        kind: RuntimeKind,
        release_dir: &Path,
        policy: Policy,
        python: PythonRuntime,
    ) -> Result<Runtime, ExecutorError> {
        Self::start_with(kind, release_dir, policy, python, SandboxSwitches::default())
    }

    /// [`Runtime::start`] with the germline's sandbox mechanisms switched as given (only
    /// tests switch one off; the baselines have no such sandbox and ignore them).
    pub fn start_with(
        kind: RuntimeKind,
        release_dir: &Path,
        policy: Policy,
        python: PythonRuntime,
        switches: SandboxSwitches,
    ) -> Result<Runtime, ExecutorError> {
        Ok(match kind {
            RuntimeKind::Germline => Runtime::Germline(Box::new(GermlineRuntime::start_with(
                release_dir,
                policy,
                python,
                Splitting::Plan,
                switches,
            )?)),
            RuntimeKind::NoSplit => Runtime::Germline(Box::new(GermlineRuntime::start_with(
                release_dir,
                policy,
                python,
                Splitting::None,
                switches,
            )?)),
            RuntimeKind::SigPin => Runtime::SigPin(Box::new(SigPinRuntime::start(release_dir, policy, &python)?)),
            RuntimeKind::SigIfc => {
                Runtime::Ifc(Box::new(IfcRuntime::start(IfcMode::Sig, release_dir, policy, python)?))
            }
            RuntimeKind::ConfinedIfc => {
                Runtime::Ifc(Box::new(IfcRuntime::start(IfcMode::Confined, release_dir, policy, python)?))
            }
            RuntimeKind::FreshIfc => {
                Runtime::Ifc(Box::new(IfcRuntime::start(IfcMode::Fresh, release_dir, policy, python)?))
            }
        })
    }

    /// Appends every trigger to `path` (JSON lines); germline runtimes only.
    pub fn set_trigger_log(&mut self, path: std::path::PathBuf) {
        if let Runtime::Germline(g) = self {
            g.trigger_log = Some(path);
        }
    }

    /// The release's tools (`tools/list` result), from a data-free copy under germline.
    pub fn list_tools(&mut self) -> Result<serde_json::Value, ExecutorError> {
        match self {
            Runtime::Germline(g) => g.list_tools(),
            Runtime::SigPin(s) => s.list_tools(),
            Runtime::Ifc(s) => s.list_tools(),
        }
    }

    /// The release's tools and their label: under germline from a data-free copy, or, for a
    /// server that needs its start-up data to list them, from a copy holding the paths its
    /// tools declare, with their label ([`GermlineRuntime::list_tools_labelled`]). Other
    /// runtimes label nothing.
    pub fn list_tools_labelled(&mut self) -> Result<(serde_json::Value, germline_model::Label), ExecutorError> {
        match self {
            Runtime::Germline(g) => g.list_tools_labelled(),
            other => Ok((other.list_tools()?, germline_model::Label::empty())),
        }
    }

    /// `resources/list`, `resources/templates/list` or `prompts/list` and its label, the
    /// way [`Runtime::list_tools_labelled`] lists tools (germline runtimes only: a
    /// baseline's process may hold data, so it has no unlabelled list to give).
    pub fn list_labelled(
        &mut self,
        method: &'static str,
    ) -> Result<(serde_json::Value, germline_model::Label), ExecutorError> {
        match self {
            Runtime::Germline(g) => g.list_labelled(method),
            _ => Err(ExecutorError::Call(format!("{method}: this runtime has no data-free copy to list from"))),
        }
    }

    /// The release hash the germline computed for itself when it started (germline
    /// runtimes; the baselines do not compute one).
    pub fn release(&self) -> Option<germline_model::ReleaseHash> {
        match self {
            Runtime::Germline(g) => Some(g.release),
            _ => None,
        }
    }

    /// Why a germline check refused the release while it ran (germline runtimes only).
    pub fn refusal(&self) -> Option<String> {
        match self {
            Runtime::Germline(g) => g.refusal(),
            _ => None,
        }
    }

    /// Waits (at most `timeout`) until `n` pooled copies are ready; returns how many are.
    /// Runtimes without a pool have none.
    pub fn wait_pool_ready(&mut self, n: usize, timeout: std::time::Duration) -> Result<usize, ExecutorError> {
        match self {
            Runtime::Germline(g) => g.wait_pool_ready(n, timeout),
            _ => Ok(0),
        }
    }

    /// How to start another germline of this release beside this one (a lane, see
    /// [`crate::lanes`]), sharing its slots; `None` for runtimes that run one process per
    /// release (the baselines), whose calls stay one at a time.
    pub fn lane_maker(&self) -> Option<crate::lanes::Grow<Runtime>> {
        match self {
            Runtime::Germline(g) => {
                let make = g.lane_maker();
                Some(std::sync::Arc::new(move || {
                    make().map(|g| Runtime::Germline(Box::new(g))).map_err(|e| e.to_string())
                }))
            }
            _ => None,
        }
    }

    /// Runs one call.
    pub fn call(&mut self, req: &CallRequest) -> CallOutcome {
        match self {
            Runtime::Germline(g) => g.call(req),
            Runtime::SigPin(s) => s.call(req),
            Runtime::Ifc(s) => s.call(req),
        }
    }
}

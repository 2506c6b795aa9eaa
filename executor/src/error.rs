//! The executor's one error type.

use std::io;

/// Everything that can stop a germline call, with enough context to act on.
#[derive(Debug, thiserror::Error)]
pub enum ExecutorError {
    /// The release manifest is missing, malformed or inconsistent.
    #[error("release manifest: {0}")]
    Manifest(String),
    /// The deployer's policy is malformed or inconsistent.
    #[error("policy: {0}")]
    Policy(String),
    /// A call's input is malformed (unknown tool, unlabelled item, bad arguments).
    #[error("call: {0}")]
    Call(String),
    /// Building or entering the sandbox failed.
    #[error("sandbox: {0}")]
    Sandbox(String),
    /// The germline failed a check (G1 one thread, G2 no stray descriptors, G3 no shared
    /// writable mapping, or a faked per-copy step): the release is refused.
    #[error("germline refused ({check}): {detail}")]
    GermlineRefused {
        /// Which check failed: "G1", "G2", "G3", "namespaces", "children", "start".
        check: &'static str,
        /// What was found.
        detail: String,
    },
    /// The germline process is gone (it exited or was killed): no copy can be made from
    /// it. It held no data, so the runtime starts it again ([`crate::call::GermlineRuntime`]).
    #[error("the germline is gone: {0}")]
    GermlineGone(String),
    /// A copy failed, broke protocol or ran over its budget.
    #[error("copy: {0}")]
    Copy(String),
    /// A formed call failed the final-hop fence (DESIGN §8): nothing ran.
    #[error("final-hop fence: {0}")]
    Fence(String),
    /// A formation could not be made, found or checked.
    #[error("formation: {0}")]
    Formation(String),
    /// A release lifecycle change is not allowed.
    #[error("lifecycle: {0}")]
    Lifecycle(String),
    /// An effect profile is malformed or its analysis failed to run.
    #[error("profile: {0}")]
    Profile(String),
    /// The model rejected the call's metadata.
    #[error(transparent)]
    Model(#[from] germline_model::ModelError),
    /// An I/O failure, with what was being done.
    #[error("{context}: {source}")]
    Io {
        /// What was being done.
        context: String,
        /// The underlying error.
        source: io::Error,
    },
}

impl ExecutorError {
    /// Wraps an I/O error with context.
    pub fn io(context: impl Into<String>) -> impl FnOnce(io::Error) -> ExecutorError {
        let context = context.into();
        move |source| ExecutorError::Io { context, source }
    }

    pub(crate) fn internal(what: &str) -> ExecutorError {
        ExecutorError::Sandbox(format!("internal: {what}"))
    }

    /// Whether this is a germline check refusing the release (G1–G3, namespaces,
    /// children): the mechanism stopping a hostile release. A germline that could not
    /// start (`start`) or any other error is a failure, not a refusal.
    pub fn is_refusal(&self) -> bool {
        matches!(self, ExecutorError::GermlineRefused { check, .. } if *check != "start")
    }

    /// A copy of a refusal or of a germline's end (the pool hands the same error to every
    /// later take); any other error becomes a refusal at "start" with its text.
    pub(crate) fn clone_refusal(&self) -> ExecutorError {
        match self {
            ExecutorError::GermlineRefused { check, detail } => {
                ExecutorError::GermlineRefused { check, detail: detail.clone() }
            }
            ExecutorError::GermlineGone(why) => ExecutorError::GermlineGone(why.clone()),
            other => ExecutorError::refused("start", other.to_string()),
        }
    }

    pub(crate) fn refused(check: &'static str, detail: impl Into<String>) -> ExecutorError {
        ExecutorError::GermlineRefused { check, detail: detail.into() }
    }
}

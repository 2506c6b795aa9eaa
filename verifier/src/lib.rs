//! Verifier: probe and control replay of a trigger, online after a call and offline
//! from a witness record, classifying what dampening weighs (DESIGN §2, "Evidence").
//!
//! The probe re-runs the serving copy with the serving group's slot, metadata, twin
//! inputs and recorded replies, but the triggering copy's items; the control re-runs the
//! serving copy's exact inputs. The probe differing from the record on every try while
//! the control never does is an item witness: the requests depend on items the
//! destination may not see. The classification is a pure function; replays are behind
//! the [`Replayer`] trait so tests and the executor plug in alike.

mod witness;

use std::collections::BTreeMap;

use germline_executor::evidence::TriggerEvidence;
use germline_model::{ItemName, RequestDigest};
use serde::{Deserialize, Serialize};

pub use witness::{PublicReport, Witness, WitnessBody, WitnessKey, WitnessOpening, MAX_WITNESS_BYTES, WITNESS_VERSION};

/// Most probe (and control) tries a verification runs or a witness may record.
pub const MAX_TRIES: usize = 16;

/// Errors of verification.
#[derive(Debug, thiserror::Error)]
pub enum VerifierError {
    /// A replay could not run.
    #[error("replay failed: {0}")]
    Replay(String),
    /// The witness file is malformed, edited or signed by an unexpected key.
    #[error("witness rejected: {0}")]
    Witness(String),
    /// The supplied release is not the one the witness names.
    #[error("release mismatch: the witness names {expected}, the supplied release is {actual}")]
    ReleaseMismatch {
        /// Hash in the witness.
        expected: String,
        /// Hash of the supplied release.
        actual: String,
    },
    /// Reading or writing a file failed.
    #[error("{0}")]
    Io(String),
}

/// What a trigger turned out to be.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    /// Probe differs every time, control never: a flow violation (verified witness).
    ItemWitness,
    /// Probe matches the record: the divergence came from state or responses, not items.
    StateDivergence,
    /// Control differs and the release declared determinism: the declaration is broken.
    DeclaredBroken,
    /// Control differs and nothing was declared: no conclusion.
    Unverified,
}

impl Verdict {
    /// Whether this verdict is a verified dampening event (DESIGN §2): an item witness
    /// from a release that declared determinism, or a broken declaration. The weights of
    /// verified and unverified events are the ledger's `DampeningParams`, defined there
    /// once.
    pub fn is_verified(self, declared_deterministic: bool) -> bool {
        matches!(self, Verdict::DeclaredBroken) || (self == Verdict::ItemWitness && declared_deterministic)
    }
}

/// Probe and control outcomes, try by try.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReplayReport {
    /// The verdict.
    pub verdict: Verdict,
    /// Tries of each side.
    pub tries: usize,
    /// Whether each probe try differed from the record.
    pub probe_differs: Vec<bool>,
    /// Whether each control try differed from the record.
    pub control_differs: Vec<bool>,
}

/// The classification rule, with no I/O.
pub fn classify(probe_differs: &[bool], control_differs: &[bool], declared_deterministic: bool) -> Verdict {
    if control_differs.iter().any(|d| *d) {
        return if declared_deterministic { Verdict::DeclaredBroken } else { Verdict::Unverified };
    }
    if !probe_differs.is_empty() && probe_differs.iter().all(|d| *d) {
        Verdict::ItemWitness
    } else {
        Verdict::StateDivergence
    }
}

/// Something that can re-run a serving copy from evidence with a given view.
pub trait Replayer {
    /// Runs one replay and returns the copy's requests to the evidence's host.
    fn replay(
        &mut self,
        ev: &TriggerEvidence,
        view: &[ItemName],
        contents: &BTreeMap<ItemName, Vec<u8>>,
    ) -> Result<Vec<RequestDigest>, VerifierError>;
}

impl Replayer for germline_executor::call::GermlineRuntime {
    fn replay(
        &mut self,
        ev: &TriggerEvidence,
        view: &[ItemName],
        contents: &BTreeMap<ItemName, Vec<u8>>,
    ) -> Result<Vec<RequestDigest>, VerifierError> {
        germline_executor::call::GermlineRuntime::replay(self, ev, view, contents)
            .map_err(|e| VerifierError::Replay(e.to_string()))
    }
}

/// Runs `tries` probes and `tries` controls (interleaved, at most [`MAX_TRIES`] each) and
/// classifies.
pub fn verify_trigger(
    replayer: &mut dyn Replayer,
    ev: &TriggerEvidence,
    contents: &BTreeMap<ItemName, Vec<u8>>,
    tries: usize,
    declared_deterministic: bool,
) -> Result<ReplayReport, VerifierError> {
    let tries = tries.clamp(1, MAX_TRIES);
    let mut probe_differs = Vec::with_capacity(tries);
    let mut control_differs = Vec::with_capacity(tries);
    for _ in 0..tries {
        let probe = replayer.replay(ev, &ev.trigger_view, contents)?;
        probe_differs.push(probe != ev.serving_requests);
        let control = replayer.replay(ev, &ev.serving_view, contents)?;
        control_differs.push(control != ev.serving_requests);
    }
    let verdict = classify(&probe_differs, &control_differs, declared_deterministic);
    Ok(ReplayReport { verdict, tries, probe_differs, control_differs })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classification_follows_the_design() {
        assert_eq!(classify(&[true, true, true], &[false, false, false], false), Verdict::ItemWitness);
        assert_eq!(classify(&[true, false, true], &[false, false, false], false), Verdict::StateDivergence);
        assert_eq!(classify(&[false; 3], &[false; 3], true), Verdict::StateDivergence);
        assert_eq!(classify(&[true; 3], &[false, true, false], true), Verdict::DeclaredBroken);
        assert_eq!(classify(&[true; 3], &[false, true, false], false), Verdict::Unverified);
        assert!(Verdict::ItemWitness.is_verified(true));
        assert!(!Verdict::ItemWitness.is_verified(false));
        assert!(!Verdict::StateDivergence.is_verified(true));
        assert!(Verdict::DeclaredBroken.is_verified(true));
    }
}

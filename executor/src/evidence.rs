//! Evidence of a trigger, and replay of a copy from it (DESIGN §2, "Evidence").
//!
//! When a copy's requests to a host diverge from the record of the group that serves it,
//! the broker keeps what a third party needs to re-run both sides: the serving copy's
//! inputs (metadata, twin inputs, slot, the replies it received) and the names, labels
//! and hashes of the items of both views. Item contents are never stored: a replay is
//! given them, and checks them against the hashes.

use std::collections::BTreeMap;

use base64::Engine;
use germline_model::{HostName, ItemName, Label, ReleaseHash, RequestDigest, TriggerKind};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::call::TwinInputs;
use crate::ExecutorError;

/// Version of the evidence encoding.
pub const EVIDENCE_VERSION: u32 = 1;

/// One item as evidence names it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ItemRecord {
    /// The item's name (a file path, or `arg:NAME`).
    pub name: ItemName,
    /// Its label under the deployer's policy.
    pub label: Label,
    /// SHA-256 of its contents (hex), so supplied contents can be checked.
    pub sha256: String,
}

/// Everything needed to replay the serving copy of a trigger with either view.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TriggerEvidence {
    /// Encoding version.
    pub version: u32,
    /// The release.
    pub release: ReleaseHash,
    /// The tool called.
    pub tool: String,
    /// Public metadata: arguments with every labelled argument blanked.
    pub arguments: Map<String, Value>,
    /// The destination whose record diverged.
    pub host: HostName,
    /// How it diverged.
    pub kind: TriggerKind,
    /// Position of the first divergence.
    pub position: usize,
    /// Items of the serving copy's view.
    pub serving_view: Vec<ItemName>,
    /// Items of the triggering copy's view (a superset).
    pub trigger_view: Vec<ItemName>,
    /// Every item of the call: name, label, hash.
    pub items: Vec<ItemRecord>,
    /// Twin inputs of the call.
    pub twin: TwinInputs,
    /// The serving copy's slot (values) and its label.
    pub slot: Map<String, Value>,
    /// Label of that slot.
    pub slot_label: Label,
    /// The serving group's transcript: every reply its copy received, per host (base64).
    pub replies: BTreeMap<HostName, Vec<String>>,
    /// The serving copy's requests to `host` (the record).
    pub serving_requests: Vec<RequestDigest>,
    /// The triggering copy's requests to `host`.
    pub trigger_requests: Vec<RequestDigest>,
}

impl TriggerEvidence {
    /// Decoded transcript replies.
    pub fn decoded_replies(&self) -> Result<BTreeMap<HostName, Vec<Vec<u8>>>, ExecutorError> {
        let b64 = base64::engine::general_purpose::STANDARD;
        self.replies
            .iter()
            .map(|(h, rs)| {
                let decoded = rs
                    .iter()
                    .map(|r| b64.decode(r).map_err(|e| ExecutorError::Call(format!("evidence reply for {h}: {e}"))))
                    .collect::<Result<Vec<_>, _>>()?;
                Ok((h.clone(), decoded))
            })
            .collect()
    }

    /// Checks supplied item contents against the recorded hashes; every item of
    /// `view` must be supplied.
    pub fn check_items(&self, view: &[ItemName], contents: &BTreeMap<ItemName, Vec<u8>>) -> Result<(), ExecutorError> {
        use sha2::{Digest, Sha256};
        for name in view {
            let rec = self
                .items
                .iter()
                .find(|i| &i.name == name)
                .ok_or_else(|| ExecutorError::Call(format!("view item {name} is not named in the evidence")))?;
            let bytes =
                contents.get(name).ok_or_else(|| ExecutorError::Call(format!("item {name} was not supplied")))?;
            let got = hex::encode(Sha256::digest(bytes));
            if got != rec.sha256 {
                return Err(ExecutorError::Call(format!("item {name} does not match its recorded hash")));
            }
        }
        Ok(())
    }
}

/// Encodes reply bytes for evidence.
pub fn encode_replies(replies: &BTreeMap<HostName, Vec<Vec<u8>>>) -> BTreeMap<HostName, Vec<String>> {
    let b64 = base64::engine::general_purpose::STANDARD;
    replies.iter().map(|(h, rs)| (h.clone(), rs.iter().map(|r| b64.encode(r)).collect())).collect()
}

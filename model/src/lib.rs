//! The model germline enforces, as pure types and functions with no I/O.
//!
//! Every other crate imports its vocabulary from here: labels, clearances, release ids,
//! items, Plan groups and horizons, the positional replay rule, slot labelling, output
//! labels. Keeping the rules here, away from processes and sockets, lets unit tests drive
//! them exhaustively (DESIGN §2).
//!
//! How the pieces meet in one call, with the DESIGN example (an OCR host cleared for
//! finance, an agent cleared for finance and hr):
//!
//! ```
//! use std::collections::BTreeMap;
//! use germline_model::*;
//!
//! let fin = Clearance::parse(["finance"])?;
//! let input = PlanInput {
//!     items: vec![
//!         Item { name: ItemName::new("invoice.pdf")?, label: Label::parse(["finance"])? },
//!         Item { name: ItemName::new("payslip.pdf")?, label: Label::parse(["hr"])? },
//!     ],
//!     hosts: vec![(HostName::new("ocr.example")?, fin.clone())],
//!     consumers: vec![(ConsumerName::new("agent")?, Clearance::parse(["finance", "hr"])?)],
//! };
//! let plan = plan_groups(&input)?;
//! assert_eq!(plan.copy_count(), 2);
//!
//! let ocr = HostName::new("ocr.example")?;
//! let clearances = BTreeMap::from([(ocr.clone(), fin)]);
//! let mut records = CallRecords::new(&plan, &clearances)?;
//! let req = RequestDigest::of_bytes(b"POST /ocr invoice");
//!
//! // Copy 0 serves the OCR host: its request is delivered and recorded.
//! let slot = Slot::new();
//! let mut out = OutputLabel::new(plan.groups[0].view.label_of(&input.items), slot.label());
//! assert_eq!(records.positional_reply(0, &ocr, 0, req, &mut out), EgressDecision::Deliver);
//! records.record_exchange(&ocr, req, b"text".to_vec())?;
//! assert!(records.finish_copy(0).is_empty());
//!
//! // Copy 1 (the agent's) sends the same request: answered from the record.
//! let mut out = OutputLabel::new(plan.groups[1].view.label_of(&input.items), slot.label());
//! let reply = records.positional_reply(1, &ocr, 0, req, &mut out);
//! assert_eq!(reply, EgressDecision::Recorded(b"text".to_vec()));
//! assert!(records.finish_copy(1).is_empty());
//! assert_eq!(out.label(), Label::parse(["finance", "hr"])?);
//! # Ok::<(), ModelError>(())
//! ```

mod formation;
mod label;
mod plan;
mod replay;
mod slot;
mod vocab;

pub use formation::{
    canonical_json, descriptor_digest, effect_fits, final_hop_fence, AdmittedRelease, CapturedSuccessor,
    DispatchPolicy, DispatchRecord, FcdAudit, FcdRecord, FenceGrant, FenceRefusal, FormationEntry, FormationLog,
    FormationRecord, FormationSnapshot, Lifecycle, LifecycleAction, LifecycleEvent, MemoryFormationLog, ReleaseName,
    Sha256Digest, SnapshotEntry,
};
pub use label::OutputLabel;
pub use plan::{plan_groups, Group, Horizon, Item, Member, Plan, PlanInput, View};
pub use replay::{CallRecords, EgressDecision, Exchange, RequestDigest, Trigger, TriggerKind};
pub use slot::{
    Slot, SlotEntry, SlotKey, MAX_SLOT_ENTRIES, MAX_SLOT_KEY_BYTES, MAX_SLOT_TOTAL_BYTES, MAX_SLOT_VALUE_BYTES,
    MAX_USER_BYTES,
};
pub use vocab::{left_out_of_release, Clearance, ConsumerName, HostName, ItemName, Label, ReleaseHash, Tag};

/// The crate's one error type: untrusted input that does not parse into the model, or a
/// request the model refuses (so callers fail closed instead of guessing).
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ModelError {
    /// A tag outside `[a-z0-9._-]`, empty, or too long.
    #[error("bad tag {0:?}: tags are 1-64 characters of [a-z0-9._-]")]
    BadTag(String),
    /// Not 64 lower-case hex digits.
    #[error("bad release hash {0:?}: expected 64 lower-case hex digits")]
    BadReleaseHash(String),
    /// Not a lower-case DNS name.
    #[error("bad host name {0:?}: expected a lower-case DNS name without port")]
    BadHostName(String),
    /// Empty, too long or with control characters.
    #[error("bad consumer name {0:?}")]
    BadConsumerName(String),
    /// Empty, too long or with a NUL byte.
    #[error("bad item name {0:?}")]
    BadItemName(String),
    /// Two items of one call share a name, so a view could not say which one it holds.
    #[error("duplicate item {0:?} in one call")]
    DuplicateItem(String),
    /// A host is declared twice, so it could end up in two copies.
    #[error("duplicate destination host {0:?} in one call")]
    DuplicateHost(String),
    /// A consumer is named twice, so it could receive two return values.
    #[error("duplicate consumer {0:?} in one call")]
    DuplicateConsumer(String),
    /// A group without members has no horizon; Plan never builds one.
    #[error("a group needs at least one member")]
    EmptyGroup,
    /// The broker's host clearances do not cover a host of the plan, or disagree with it.
    #[error("clearance of declared host {0:?} is missing or disagrees with the plan")]
    HostClearance(String),
    /// An exchange was recorded for a host without a matching delivered request.
    #[error("no delivered request to {host:?} matches the exchange being recorded")]
    UnexpectedExchange {
        /// The host named in the exchange.
        host: String,
    },
    /// A group index outside the plan.
    #[error("no group {0} in this plan")]
    NoSuchGroup(usize),
    /// A slot key is empty or longer than the bound.
    #[error("slot key of {len} bytes: keys must be 1..={max} bytes")]
    SlotKeySize {
        /// The key's length in bytes.
        len: usize,
        /// The bound.
        max: usize,
    },
    /// A slot value serialises to more bytes than the bound.
    #[error("slot value for {key:?} is {len} bytes, above the bound of {max}")]
    SlotValueSize {
        /// The entry's key.
        key: String,
        /// The value's serialised length.
        len: usize,
        /// The bound.
        max: usize,
    },
    /// A write would leave the slot with more entries than the bound.
    #[error("slot would hold {count} entries, above the bound of {max}")]
    SlotEntries {
        /// Entries after the write.
        count: usize,
        /// The bound.
        max: usize,
    },
    /// A write would leave the slot larger than the bound.
    #[error("slot would hold {len} bytes, above the bound of {max}")]
    SlotTotalSize {
        /// Bytes after the write.
        len: usize,
        /// The bound.
        max: usize,
    },
    /// A user name for a slot key is empty, too long or has control characters.
    #[error("bad user name {0:?} for a state slot")]
    BadUser(String),
    /// Not 64 lower-case hex digits.
    #[error("bad digest {0:?}: expected 64 lower-case hex digits")]
    BadDigest(String),
    /// A release name outside `[a-z0-9._-]`, empty or too long.
    #[error("bad release name {0:?}: names are 1-128 characters of [a-z0-9._-]")]
    BadReleaseName(String),
    /// A `tools/list` result without a `tools` array of named tools, or naming one twice.
    #[error("malformed tools/list result")]
    BadToolsList,
    /// An unknown dispatch policy name.
    #[error("unknown dispatch policy {0:?} (exact_pin, release_wide_allow, release_wide_deny, call_specific)")]
    BadPolicy(String),
    /// A formation record or snapshot whose stored id is not its digest (substituted or
    /// altered).
    #[error("record stored as {0} does not hash to its id")]
    FormationId(String),
    /// A lifecycle change that is out of order or not allowed in the current state.
    #[error("lifecycle: {0}")]
    Lifecycle(String),
}

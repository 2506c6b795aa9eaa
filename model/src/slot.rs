//! Per-horizon state slots (DESIGN §2, "Horizon").
//!
//! A release's only memory across calls lives outside its copies, in one slot per
//! (release, user, horizon). A copy receives the whole slot of its horizon and may write
//! only to it, so what it carries forward is seen only by later copies whose every reader
//! shares that horizon. Each entry remembers the label of everything its writer had seen,
//! and sizes are bounded so a release cannot turn its slot into a resource sink.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::{Horizon, Label, ModelError, ReleaseHash};

/// Most entries one slot may hold.
pub const MAX_SLOT_ENTRIES: usize = 1024;
/// Longest entry key, in bytes.
pub const MAX_SLOT_KEY_BYTES: usize = 256;
/// Largest entry value, in bytes of compact JSON.
pub const MAX_SLOT_VALUE_BYTES: usize = 64 * 1024;
/// Largest slot, summing key and value bytes over all entries.
pub const MAX_SLOT_TOTAL_BYTES: usize = 1024 * 1024;
/// Longest user name in a slot key, in bytes.
pub const MAX_USER_BYTES: usize = 128;

/// Names one slot. Keyed by user as well as horizon, so one user's calls can never carry
/// state into another's, even at the same horizon.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(try_from = "SlotKeyRepr")]
pub struct SlotKey {
    /// The release the slot belongs to; a new release starts with empty slots.
    pub release: ReleaseHash,
    /// The user (or session owner) the calls run for.
    pub user: String,
    /// The horizon of the copies that may read and write it.
    pub horizon: Horizon,
}

#[derive(Deserialize)]
struct SlotKeyRepr {
    release: ReleaseHash,
    user: String,
    horizon: Horizon,
}

impl TryFrom<SlotKeyRepr> for SlotKey {
    type Error = ModelError;
    fn try_from(r: SlotKeyRepr) -> Result<Self, ModelError> {
        SlotKey::new(r.release, &r.user, r.horizon)
    }
}

impl SlotKey {
    /// Builds a key, refusing an empty or over-long user name or one with control
    /// characters, since the name ends up in storage paths and logs.
    pub fn new(release: ReleaseHash, user: &str, horizon: Horizon) -> Result<Self, ModelError> {
        if user.is_empty() || user.len() > MAX_USER_BYTES || user.chars().any(char::is_control) {
            return Err(ModelError::BadUser(user.to_owned()));
        }
        Ok(SlotKey { release, user: user.to_owned(), horizon })
    }

    /// A stable storage name: `<release hex>/<user hex>/<horizon key>`. The user is
    /// hex-encoded so that any user name is a safe path component.
    pub fn storage_name(&self) -> String {
        format!("{}/{}/{}", self.release.to_hex(), hex::encode(self.user.as_bytes()), self.horizon.key())
    }
}

/// One value in a slot, with the label of everything its writer had seen.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SlotEntry {
    /// The value the copy wrote.
    pub value: serde_json::Value,
    /// Its writer's output label at the time of writing.
    pub label: Label,
}

/// The state a release carries from call to call at one horizon.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "SlotRepr", into = "SlotRepr")]
pub struct Slot {
    entries: BTreeMap<String, SlotEntry>,
    /// Labels of writers that removed entries: a removal leaves no entry to carry its
    /// writer's label, yet later readers still see that it happened.
    removed: Label,
}

#[derive(Serialize, Deserialize)]
struct SlotRepr {
    entries: BTreeMap<String, SlotEntry>,
    #[serde(default)]
    removed: Label,
}

impl TryFrom<SlotRepr> for Slot {
    type Error = ModelError;
    fn try_from(r: SlotRepr) -> Result<Self, ModelError> {
        let mut total = 0usize;
        for (k, e) in &r.entries {
            total += entry_size(k, &e.value)?;
        }
        check_totals(r.entries.len(), total)?;
        Ok(Slot { entries: r.entries, removed: r.removed })
    }
}

impl From<Slot> for SlotRepr {
    fn from(s: Slot) -> Self {
        SlotRepr { entries: s.entries, removed: s.removed }
    }
}

impl Slot {
    /// A fresh, empty slot.
    pub fn new() -> Self {
        Slot::default()
    }

    /// The join of every entry's label and of every remover's label: what a copy given
    /// this slot has seen through it (goes into its [`crate::OutputLabel`]).
    pub fn label(&self) -> Label {
        self.entries.values().fold(self.removed.clone(), |acc, e| acc.join(&e.label))
    }

    /// Whether everything in the slot may be seen at `horizon`. Every writer's label lies
    /// within its horizon, so `false` means slots of different horizons got mixed up and
    /// the caller must refuse to hand this slot to a copy.
    pub fn fits(&self, horizon: &Horizon) -> bool {
        self.label().flows_to(&horizon.0)
    }

    /// One entry by key.
    pub fn get(&self, key: &str) -> Option<&SlotEntry> {
        self.entries.get(key)
    }

    /// All entries in key order.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &SlotEntry)> {
        self.entries.iter().map(|(k, e)| (k.as_str(), e))
    }

    /// Number of entries.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// True when the slot holds no entry.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Applies one copy's writes: `Some(v)` sets the key, `None` removes it. Every
    /// written entry stores `writer_label` (the copy's [`crate::OutputLabel::label`]:
    /// its view, this slot's label, and the clearances of hosts that reached it), and a
    /// removal joins `writer_label` into the slot's label. All or nothing: if any write
    /// breaks a bound, the slot is left unchanged and the error names the bound.
    pub fn apply_writes(
        &mut self,
        writes: Vec<(String, Option<serde_json::Value>)>,
        writer_label: &Label,
    ) -> Result<(), ModelError> {
        let mut next = self.entries.clone();
        let mut removed = self.removed.clone();
        for (key, value) in writes {
            match value {
                Some(value) => {
                    entry_size(&key, &value)?;
                    next.insert(key, SlotEntry { value, label: writer_label.clone() });
                }
                None => {
                    check_key(&key)?;
                    next.remove(&key);
                    removed = removed.join(writer_label);
                }
            }
        }
        let mut total = 0usize;
        for (k, e) in &next {
            total += entry_size(k, &e.value)?;
        }
        check_totals(next.len(), total)?;
        self.entries = next;
        self.removed = removed;
        Ok(())
    }
}

fn check_key(key: &str) -> Result<(), ModelError> {
    if key.is_empty() || key.len() > MAX_SLOT_KEY_BYTES {
        return Err(ModelError::SlotKeySize { len: key.len(), max: MAX_SLOT_KEY_BYTES });
    }
    Ok(())
}

fn entry_size(key: &str, value: &serde_json::Value) -> Result<usize, ModelError> {
    check_key(key)?;
    let len = value.to_string().len();
    if len > MAX_SLOT_VALUE_BYTES {
        return Err(ModelError::SlotValueSize { key: key.to_owned(), len, max: MAX_SLOT_VALUE_BYTES });
    }
    Ok(key.len() + len)
}

fn check_totals(count: usize, total: usize) -> Result<(), ModelError> {
    if count > MAX_SLOT_ENTRIES {
        return Err(ModelError::SlotEntries { count, max: MAX_SLOT_ENTRIES });
    }
    if total > MAX_SLOT_TOTAL_BYTES {
        return Err(ModelError::SlotTotalSize { len: total, max: MAX_SLOT_TOTAL_BYTES });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Clearance;
    use serde_json::json;

    fn l(t: &[&str]) -> Label {
        Label::parse(t.iter().copied()).unwrap()
    }

    #[test]
    fn writes_carry_the_writer_label() {
        let mut s = Slot::new();
        assert!(s.label().is_empty());
        s.apply_writes(vec![("a".into(), Some(json!(1))), ("b".into(), Some(json!("x")))], &l(&["finance"])).unwrap();
        assert_eq!(s.get("a").unwrap().label, l(&["finance"]));
        assert_eq!(s.label(), l(&["finance"]));
        s.apply_writes(vec![("b".into(), Some(json!([1, 2])))], &l(&["hr"])).unwrap();
        assert_eq!(s.get("b").unwrap().value, json!([1, 2]));
        assert_eq!(s.label(), l(&["finance", "hr"]));
        assert!(s.fits(&Horizon(Clearance::parse(["finance", "hr"]).unwrap())));
        assert!(!s.fits(&Horizon(Clearance::parse(["finance"]).unwrap())));
        assert_eq!(s.iter().map(|(k, _)| k).collect::<Vec<_>>(), ["a", "b"]);
    }

    #[test]
    fn removal_keeps_its_writer_label() {
        let mut s = Slot::new();
        s.apply_writes(vec![("a".into(), Some(json!(1)))], &Label::empty()).unwrap();
        s.apply_writes(vec![("a".into(), None)], &l(&["hr"])).unwrap();
        assert!(s.is_empty());
        assert_eq!(s.label(), l(&["hr"]));
    }

    #[test]
    fn bounds_are_enforced_all_or_nothing() {
        let mut s = Slot::new();
        let big = json!("x".repeat(MAX_SLOT_VALUE_BYTES));
        let err = s
            .apply_writes(vec![("ok".into(), Some(json!(1))), ("big".into(), Some(big))], &Label::empty())
            .unwrap_err();
        assert!(matches!(err, ModelError::SlotValueSize { .. }));
        assert!(s.is_empty());
        assert!(matches!(
            s.apply_writes(vec![(String::new(), Some(json!(1)))], &Label::empty()),
            Err(ModelError::SlotKeySize { .. })
        ));
        assert!(matches!(
            s.apply_writes(vec![("k".repeat(MAX_SLOT_KEY_BYTES + 1), None)], &Label::empty()),
            Err(ModelError::SlotKeySize { .. })
        ));
        let many = (0..=MAX_SLOT_ENTRIES).map(|i| (format!("k{i}"), Some(json!(i)))).collect();
        assert!(matches!(s.apply_writes(many, &Label::empty()), Err(ModelError::SlotEntries { .. })));
        let value = json!("v".repeat(MAX_SLOT_VALUE_BYTES - 10));
        let heavy = (0..(MAX_SLOT_TOTAL_BYTES / MAX_SLOT_VALUE_BYTES + 1))
            .map(|i| (format!("k{i}"), Some(value.clone())))
            .collect();
        assert!(matches!(s.apply_writes(heavy, &Label::empty()), Err(ModelError::SlotTotalSize { .. })));
        assert!(s.is_empty());
        assert!(s.label().is_empty());
    }

    #[test]
    fn slot_serde_round_trips_and_checks_bounds() {
        let mut s = Slot::new();
        s.apply_writes(vec![("a".into(), Some(json!({"n": 1})))], &l(&["hr"])).unwrap();
        s.apply_writes(vec![("gone".into(), None)], &l(&["projx"])).unwrap();
        let json = serde_json::to_string(&s).unwrap();
        assert_eq!(serde_json::from_str::<Slot>(&json).unwrap(), s);
        let bad = format!(r#"{{"entries":{{"{}":{{"value":1,"label":[]}}}}}}"#, "k".repeat(MAX_SLOT_KEY_BYTES + 1));
        assert!(serde_json::from_str::<Slot>(&bad).is_err());
        let bad_label = r#"{"entries":{"a":{"value":1,"label":["HR"]}}}"#;
        assert!(serde_json::from_str::<Slot>(bad_label).is_err());
    }

    #[test]
    fn slot_keys_are_per_user_and_horizon() {
        let r = ReleaseHash::of_bytes(b"release");
        let h = Horizon(Clearance::parse(["finance"]).unwrap());
        let a = SlotKey::new(r, "alice", h.clone()).unwrap();
        let b = SlotKey::new(r, "bob", h.clone()).unwrap();
        assert_ne!(a, b);
        assert_ne!(a.storage_name(), b.storage_name());
        assert_eq!(a.storage_name(), format!("{}/616c696365/finance", r.to_hex()));
        let e = SlotKey::new(r, "alice", Horizon::default()).unwrap();
        assert!(e.storage_name().ends_with("/{}"));
        assert!(SlotKey::new(r, "", h.clone()).is_err());
        assert!(SlotKey::new(r, "a\nb", h.clone()).is_err());
        assert!(SlotKey::new(r, &"u".repeat(MAX_USER_BYTES + 1), h).is_err());
        let json = serde_json::to_string(&a).unwrap();
        assert_eq!(serde_json::from_str::<SlotKey>(&json).unwrap(), a);
        let bad = json.replace("alice", "");
        assert!(serde_json::from_str::<SlotKey>(&bad).is_err());
    }
}

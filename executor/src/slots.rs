//! Per-horizon state slots of a release, kept outside its copies, and the order of their
//! updates when calls to the release run at the same time.
//!
//! A copy is given its slot when it first asks for it (its first `germline_slot` read or
//! write goes to the broker's slot listener), not with its request. At that moment the
//! copy's call takes the slot's *lease*: no other copy is given that slot (same release,
//! user and horizon) until this copy's writes are stored or dropped, after its answer.
//! Calls of one release thus run side by side, and every update of one slot is made on
//! the slot as the previous update left it — a read-modify-write is never lost. A copy
//! holds at most one lease (its own horizon's), and a call's copies run one after
//! another, each giving its lease back before the next starts, so leases never wait on
//! each other in a cycle.
//!
//! A copy that never asks for its slot is not labelled by it, and takes no lease.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::Instant;

use germline_model::{Slot, SlotKey};

/// Test-only switch ("mechanism off"): a copy is given its slot without taking the lease,
/// so two calls at once both update the slot as it was before either. Never set outside
/// tests.
pub static SLOT_LEASES_OFF_FOR_TESTS: AtomicBool = AtomicBool::new(false);

/// The slots of one release (shared by every germline the release runs on).
#[derive(Default)]
pub struct SlotTable {
    inner: Mutex<Inner>,
    changed: Condvar,
}

#[derive(Default)]
struct Inner {
    slots: BTreeMap<SlotKey, Slot>,
    leased: BTreeSet<SlotKey>,
}

impl SlotTable {
    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The slot for `key` as stored now (empty if never written); for tests and the
    /// tools that show state, never for a copy (a copy's slot comes with a lease).
    pub fn get(&self, key: &SlotKey) -> Slot {
        self.lock().slots.get(key).cloned().unwrap_or_default()
    }

    /// Takes the lease of `key` and returns the slot as the last update left it: waits
    /// while another copy holds it, until `deadline` or until `stop` is set (then `None`).
    pub fn lease(self: &Arc<Self>, key: &SlotKey, deadline: Instant, stop: &AtomicBool) -> Option<SlotLease> {
        let leases = !SLOT_LEASES_OFF_FOR_TESTS.load(Ordering::SeqCst);
        let mut inner = self.lock();
        while leases && inner.leased.contains(key) {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() || stop.load(Ordering::SeqCst) {
                return None;
            }
            inner = self.changed.wait_timeout(inner, left).unwrap_or_else(|p| p.into_inner()).0;
        }
        if stop.load(Ordering::SeqCst) {
            return None;
        }
        if leases {
            inner.leased.insert(key.clone());
        }
        let slot = inner.slots.get(key).cloned().unwrap_or_default();
        Some(SlotLease { table: self.clone(), key: key.clone(), slot, held: leases })
    }

    /// Wakes every wait for a lease, so that one whose `stop` was set returns.
    pub fn interrupt(&self) {
        let _inner = self.lock();
        self.changed.notify_all();
    }
}

/// A copy's hold on its slot: the slot as it was given, stored back (changed or not) and
/// released when dropped.
pub struct SlotLease {
    table: Arc<SlotTable>,
    key: SlotKey,
    /// The slot as the copy was given it.
    pub slot: Slot,
    held: bool,
}

impl SlotLease {
    /// Stores `slot` as the slot's new state (the lease is released when dropped).
    pub fn store(&self, slot: Slot) {
        self.table.lock().slots.insert(self.key.clone(), slot);
    }
}

impl Drop for SlotLease {
    fn drop(&mut self) {
        if self.held {
            self.table.lock().leased.remove(&self.key);
            self.table.changed.notify_all();
        }
    }
}

/// Where a copy's slot comes from when it asks.
pub enum SlotSource {
    /// The release's slot for this key, under its lease (a call's copy).
    Leased {
        /// The release's slots.
        table: Arc<SlotTable>,
        /// Release, user and horizon of the copy's group.
        key: SlotKey,
    },
    /// A fixed slot, nothing stored back (a replay gets the recorded slot; a list, none).
    Fixed(Slot),
}

/// What a copy was given of its slot.
pub enum SlotGiven {
    /// Under lease: its writes are stored through it.
    Leased(SlotLease),
    /// A fixed slot (replays, lists).
    Fixed(Slot),
}

impl SlotGiven {
    /// The slot as the copy was given it.
    pub fn slot(&self) -> &Slot {
        match self {
            SlotGiven::Leased(l) => &l.slot,
            SlotGiven::Fixed(s) => s,
        }
    }
}

impl SlotSource {
    /// Gives the slot (taking its lease), or `None` at the deadline or once `stop` is set.
    pub fn give(&self, deadline: Instant, stop: &AtomicBool) -> Option<SlotGiven> {
        match self {
            SlotSource::Leased { table, key } => table.lease(key, deadline, stop).map(SlotGiven::Leased),
            SlotSource::Fixed(s) => Some(SlotGiven::Fixed(s.clone())),
        }
    }

    /// Wakes a wait for a lease (see [`SlotTable::interrupt`]).
    pub fn interrupt(&self) {
        if let SlotSource::Leased { table, .. } = self {
            table.interrupt();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use germline_model::{Horizon, Label, ReleaseHash};
    use std::time::Duration;

    fn key() -> SlotKey {
        SlotKey::new(ReleaseHash([7; 32]), "u", Horizon::default()).expect("key")
    }

    #[test]
    fn a_second_lease_waits_for_the_first_and_sees_its_update() {
        let table = Arc::new(SlotTable::default());
        let stop = AtomicBool::new(false);
        let first = table.lease(&key(), Instant::now() + Duration::from_secs(5), &stop).expect("first");
        // Held: a second lease cannot be had before the deadline.
        assert!(table.lease(&key(), Instant::now() + Duration::from_millis(50), &stop).is_none());
        let mut slot = first.slot.clone();
        slot.apply_writes(vec![("n".into(), Some(serde_json::json!(1)))], &Label::empty()).expect("write");
        let t = {
            let table = table.clone();
            std::thread::spawn(move || {
                let stop = AtomicBool::new(false);
                let second = table.lease(&key(), Instant::now() + Duration::from_secs(5), &stop).expect("second");
                second.slot.get("n").map(|e| e.value.clone())
            })
        };
        std::thread::sleep(Duration::from_millis(50));
        first.store(slot);
        drop(first);
        assert_eq!(t.join().expect("join"), Some(serde_json::json!(1)));
    }

    #[test]
    fn a_stopped_wait_returns_without_the_lease() {
        let table = Arc::new(SlotTable::default());
        let stop = Arc::new(AtomicBool::new(false));
        let _held = table.lease(&key(), Instant::now() + Duration::from_secs(5), &stop).expect("first");
        let t = {
            let (table, stop) = (table.clone(), stop.clone());
            std::thread::spawn(move || table.lease(&key(), Instant::now() + Duration::from_secs(30), &stop).is_none())
        };
        std::thread::sleep(Duration::from_millis(20));
        stop.store(true, Ordering::SeqCst);
        table.interrupt();
        assert!(t.join().expect("join"));
    }
}

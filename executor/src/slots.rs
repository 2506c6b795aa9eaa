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
//! A copy that never asks for its slot is not labelled by it, and takes no lease. A copy
//! that had to wait for the lease learned, from how long it waited, something of the
//! copies that held it meanwhile: it is labelled by their labels too (each holder's label
//! as it stood when the holder gave the lease back), besides the slot's.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::Instant;

use germline_model::{Label, Slot, SlotKey};

/// Test-only switch ("mechanism off"): a copy is given its slot without taking the lease,
/// so two calls at once both update the slot as it was before either. Never set outside
/// tests.
pub static SLOT_LEASES_OFF_FOR_TESTS: AtomicBool = AtomicBool::new(false);

/// Test-only switch ("mechanism off"): a copy that waited for its slot's lease is not
/// labelled by the copies it waited for. Never set outside tests.
pub static WAITER_LABELS_OFF_FOR_TESTS: AtomicBool = AtomicBool::new(false);

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
    /// Per slot: the holders' labels a waiting copy must be given (see the module docs).
    waits: BTreeMap<SlotKey, Waits>,
}

/// Leases of one slot given back while copies waited for it.
#[derive(Default)]
struct Waits {
    /// Leases given back so far.
    given_back: u64,
    /// Copies waiting now.
    waiting: usize,
    /// (number of the lease given back, its holder's label), kept while any copy waits.
    holders: Vec<(u64, Label)>,
}

/// The label of the copy holding a lease, read when it gives the lease back.
pub type HolderLabel = Box<dyn Fn() -> Label + Send + Sync>;

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
    /// `holder` reads the taking copy's label when it gives the lease back.
    pub fn lease(
        self: &Arc<Self>,
        key: &SlotKey,
        deadline: Instant,
        stop: &AtomicBool,
        holder: HolderLabel,
    ) -> Option<SlotLease> {
        let leases = !SLOT_LEASES_OFF_FOR_TESTS.load(Ordering::SeqCst);
        let mut inner = self.lock();
        // The number of the next lease given back when this copy started to wait.
        let mut waited_from: Option<u64> = None;
        let mut gave_up = false;
        while leases && inner.leased.contains(key) {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() || stop.load(Ordering::SeqCst) {
                gave_up = true;
                break;
            }
            if waited_from.is_none() {
                let w = inner.waits.entry(key.clone()).or_default();
                w.waiting += 1;
                waited_from = Some(w.given_back);
            }
            inner = self.changed.wait_timeout(inner, left).unwrap_or_else(|p| p.into_inner()).0;
        }
        let mut waited = Label::empty();
        let labels = !WAITER_LABELS_OFF_FOR_TESTS.load(Ordering::SeqCst);
        if let Some(from) = waited_from {
            if let Some(w) = inner.waits.get_mut(key) {
                w.waiting -= 1;
                for (n, l) in &w.holders {
                    if labels && *n >= from {
                        waited = waited.join(l);
                    }
                }
                if w.waiting == 0 {
                    inner.waits.remove(key);
                }
            }
        }
        if gave_up || stop.load(Ordering::SeqCst) {
            return None;
        }
        if leases {
            inner.leased.insert(key.clone());
        }
        let slot = inner.slots.get(key).cloned().unwrap_or_default();
        Some(SlotLease { table: self.clone(), key: key.clone(), slot, waited, holder, held: leases })
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
    /// The labels of the copies that held the lease while this one waited for it.
    pub waited: Label,
    holder: HolderLabel,
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
        if !self.held {
            return;
        }
        // Read before the table's lock: the holder's label has a lock of its own.
        let label = (self.holder)();
        let mut inner = self.table.lock();
        inner.leased.remove(&self.key);
        if let Some(w) = inner.waits.get_mut(&self.key) {
            w.holders.push((w.given_back, label));
            w.given_back += 1;
        }
        drop(inner);
        self.table.changed.notify_all();
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

    /// What the copy learned with its slot: the slot's label, and the labels of the copies
    /// it waited for.
    pub fn label(&self) -> Label {
        match self {
            SlotGiven::Leased(l) => l.slot.label().join(&l.waited),
            SlotGiven::Fixed(s) => s.label(),
        }
    }
}

impl SlotSource {
    /// Gives the slot (taking its lease, `holder` reading the copy's label when it gives it
    /// back), or `None` at the deadline or once `stop` is set.
    pub fn give(&self, deadline: Instant, stop: &AtomicBool, holder: HolderLabel) -> Option<SlotGiven> {
        match self {
            SlotSource::Leased { table, key } => table.lease(key, deadline, stop, holder).map(SlotGiven::Leased),
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
    use germline_model::{Horizon, ReleaseHash, Tag};
    use std::time::Duration;

    fn key() -> SlotKey {
        SlotKey::new(ReleaseHash([7; 32]), "u", Horizon::default()).expect("key")
    }

    #[test]
    fn a_second_lease_waits_for_the_first_and_sees_its_update() {
        let table = Arc::new(SlotTable::default());
        let stop = AtomicBool::new(false);
        let hr = || Label::from_tags([Tag::new("hr").expect("tag")]);
        let first = table.lease(&key(), Instant::now() + Duration::from_secs(5), &stop, Box::new(hr)).expect("first");
        // Held: a second lease cannot be had before the deadline.
        assert!(table
            .lease(&key(), Instant::now() + Duration::from_millis(50), &stop, Box::new(Label::empty))
            .is_none());
        let mut slot = first.slot.clone();
        slot.apply_writes(vec![("n".into(), Some(serde_json::json!(1)))], &Label::empty()).expect("write");
        let t = {
            let table = table.clone();
            std::thread::spawn(move || {
                let stop = AtomicBool::new(false);
                let second = table
                    .lease(&key(), Instant::now() + Duration::from_secs(5), &stop, Box::new(Label::empty))
                    .expect("second");
                (second.slot.get("n").map(|e| e.value.clone()), second.waited.clone())
            })
        };
        std::thread::sleep(Duration::from_millis(50));
        first.store(slot);
        drop(first);
        let hr = Label::from_tags([Tag::new("hr").expect("tag")]);
        let (seen, waited) = t.join().expect("join");
        assert_eq!(seen, Some(serde_json::json!(1)));
        assert_eq!(waited, hr, "the waiter is labelled by the copy it waited for");
    }

    #[test]
    fn a_stopped_wait_returns_without_the_lease() {
        let table = Arc::new(SlotTable::default());
        let stop = Arc::new(AtomicBool::new(false));
        let _held =
            table.lease(&key(), Instant::now() + Duration::from_secs(5), &stop, Box::new(Label::empty)).expect("first");
        let t = {
            let (table, stop) = (table.clone(), stop.clone());
            std::thread::spawn(move || {
                table.lease(&key(), Instant::now() + Duration::from_secs(30), &stop, Box::new(Label::empty)).is_none()
            })
        };
        std::thread::sleep(Duration::from_millis(20));
        stop.store(true, Ordering::SeqCst);
        table.interrupt();
        assert!(t.join().expect("join"));
    }
}

//! The output label of one copy (DESIGN §2, "Germline call").
//!
//! A copy's return value, and every slot entry it writes, carries the join of everything
//! that could have influenced it: the labels of its view's items, its slot's label, and
//! the clearance of every host whose reply reached it or whose non-empty record it was
//! compared against while admissible — "my request matched the recorded one" is
//! information too.

use std::collections::BTreeSet;

use serde::{Deserialize, Serialize};

use crate::{Clearance, Label};

/// Accumulates a copy's output label while the copy runs.
///
/// [`crate::CallRecords::positional_reply`] takes `&mut OutputLabel` and joins host
/// clearances itself, so the broker cannot forget one; the broker only builds it with
/// [`OutputLabel::new`] when the copy starts and reads [`OutputLabel::label`] when the
/// copy returns or writes its slot.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct OutputLabel {
    view: Label,
    slot: Label,
    replies: BTreeSet<Clearance>,
}

impl OutputLabel {
    /// Starts from what the copy is given: its view's label
    /// ([`crate::View::label_of`]) and its slot's label ([`crate::Slot::label`]).
    pub fn new(view_label: Label, slot_label: Label) -> Self {
        OutputLabel { view: view_label, slot: slot_label, replies: BTreeSet::new() }
    }

    /// Records that the copy was given its slot, which carries `slot_label`
    /// ([`crate::Slot::label`]); a copy that never asks for its slot is not labelled by it.
    pub fn add_slot(&mut self, slot_label: &Label) {
        self.slot = self.slot.join(slot_label);
    }

    /// Records that information carrying `c` reached the copy: a live or recorded reply
    /// from a host with clearance `c`, or a comparison against that host's non-empty
    /// record while admissible. `positional_reply` calls this; call it directly only for
    /// flows the replay rule does not see.
    pub fn add_reply_from(&mut self, c: &Clearance) {
        if !self.replies.contains(c) {
            self.replies.insert(c.clone());
        }
    }

    /// The distinct host clearances joined so far, kept apart for witness records.
    pub fn reached_clearances(&self) -> impl Iterator<Item = &Clearance> {
        self.replies.iter()
    }

    /// `join(view labels, slot label, clearances of reached hosts)`: what the copy's
    /// return value and slot writes carry.
    pub fn label(&self) -> Label {
        self.replies.iter().fold(self.view.join(&self.slot), |acc, c| acc.join_clearance(c))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn l(t: &[&str]) -> Label {
        Label::parse(t.iter().copied()).unwrap()
    }
    fn c(t: &[&str]) -> Clearance {
        Clearance::parse(t.iter().copied()).unwrap()
    }

    #[test]
    fn label_joins_view_slot_and_replies() {
        let mut out = OutputLabel::new(l(&["finance"]), l(&["public"]));
        assert_eq!(out.label(), l(&["finance", "public"]));
        out.add_reply_from(&c(&["projx"]));
        out.add_reply_from(&c(&["projx"]));
        out.add_reply_from(&c(&["hr", "finance"]));
        assert_eq!(out.label(), l(&["finance", "hr", "projx", "public"]));
        assert_eq!(out.reached_clearances().count(), 2);
    }

    #[test]
    fn empty_inputs_give_empty_label() {
        let mut out = OutputLabel::new(Label::empty(), Label::empty());
        out.add_reply_from(&Clearance::empty());
        assert!(out.label().is_empty());
    }
}

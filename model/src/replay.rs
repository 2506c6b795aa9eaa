//! The positional replay rule and its triggers, as a sans-I/O state machine over one
//! call (DESIGN §2, "Germline call").
//!
//! Only the copy of a host's own group may reach that host. Every other copy that talks
//! to a declared host is answered from the record the serving copy wrote: its k-th
//! request is compared with the k-th recorded one, and it gets the recorded reply only if
//! the two are equal and the reply is admissible. A copy whose requests diverge from a
//! record written by a copy that saw less is evidence (a trigger) that the release lets
//! unseen items steer its requests; the verifier turns triggers into verdicts.
//!
//! The broker owns sockets; this module owns the decisions. Usage per call:
//!
//! 1. [`CallRecords::new`] from the [`Plan`] and the policy's host clearances;
//! 2. for each group in plan order: one [`OutputLabel`] per copy; for each request the
//!    copy sends, [`CallRecords::positional_reply`]; after a `Deliver`, relay the request
//!    and call [`CallRecords::record_exchange`] with whatever reply the copy is given
//!    (the real one, or the broker's error reply if the host failed);
//!    then [`CallRecords::finish_copy`] before the next group starts.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::{Clearance, Horizon, HostName, ModelError, OutputLabel, Plan, View};

/// SHA-256 of a canonical request. Requests are compared by digest so records stay small
/// and the comparison cannot depend on how the broker happened to buffer the bytes.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct RequestDigest(pub [u8; 32]);

impl RequestDigest {
    /// Hashes an already-canonicalised request.
    pub fn of_bytes(canonical: &[u8]) -> Self {
        use sha2::{Digest, Sha256};
        RequestDigest(Sha256::digest(canonical).into())
    }

    /// Lower-case hex, as stored in witnesses.
    pub fn to_hex(&self) -> String {
        hex::encode(self.0)
    }
}

impl fmt::Debug for RequestDigest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "RequestDigest({})", self.to_hex())
    }
}

impl Serialize for RequestDigest {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.to_hex())
    }
}

impl<'de> Deserialize<'de> for RequestDigest {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        let mut out = [0u8; 32];
        if s.len() != 64 || s.bytes().any(|b| b.is_ascii_uppercase()) {
            return Err(serde::de::Error::custom("expected 64 lower-case hex digits"));
        }
        hex::decode_to_slice(&s, &mut out).map_err(serde::de::Error::custom)?;
        Ok(RequestDigest(out))
    }
}

/// One delivered request and the reply the serving copy got: what later copies are
/// answered from.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Exchange {
    /// The request's digest.
    pub request: RequestDigest,
    /// The reply bytes as the copy received them. Empty while the reply is still
    /// pending (see [`CallRecords::is_pending`]).
    pub reply: Vec<u8>,
}

/// What the broker does with one request from a copy.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum EgressDecision {
    /// The host is in the copy's own group: relay the request, then call
    /// [`CallRecords::record_exchange`].
    Deliver,
    /// Answer with the serving copy's recorded reply; nothing leaves the machine.
    Recorded(Vec<u8>),
    /// Answer with the placeholder ⊥; nothing leaves the machine.
    Placeholder,
    /// The host is not declared for the function (or the request is out of order for the
    /// broker's own bookkeeping): refuse it.
    Deny,
}

/// How a copy's requests to a host diverged from the host's record.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TriggerKind {
    /// The k-th request differs from the k-th recorded one and from every other
    /// recorded request to that host.
    Mismatch,
    /// The copy sent more requests than were recorded.
    Extra,
    /// The copy sent fewer requests than were recorded (reported at
    /// [`CallRecords::finish_copy`]).
    Missing,
    /// The k-th request differs from the k-th recorded one but equals another recorded
    /// request to that host: same requests, different order.
    Reordered,
}

/// Evidence that a copy's requests to `host` diverged from those of the host's serving
/// copy, which saw no more than this copy did. Goes to the verifier for probe replay.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Trigger {
    /// The declared host whose record was diverged from.
    pub host: HostName,
    /// The copy that diverged.
    pub group_index: usize,
    /// The copy that serves `host` and wrote its record.
    pub serving_group_index: usize,
    /// How the requests diverged.
    pub kind: TriggerKind,
    /// The 0-based request position where the divergence shows.
    pub position: usize,
}

#[derive(Clone, Debug)]
struct HostRecord {
    serving: usize,
    clearance: Clearance,
    record: Vec<Exchange>,
    pending: BTreeSet<usize>,
}

#[derive(Clone, Debug, Default)]
struct CopyState {
    sent: BTreeMap<HostName, Vec<RequestDigest>>,
    triggered: BTreeSet<HostName>,
    finished: bool,
}

#[derive(Clone, Debug)]
struct GroupInfo {
    view: View,
    horizon: Horizon,
}

/// The records, positions and triggers of one call: the broker's whole replay state.
#[derive(Clone, Debug)]
pub struct CallRecords {
    groups: Vec<GroupInfo>,
    hosts: BTreeMap<HostName, HostRecord>,
    copies: Vec<CopyState>,
    triggers: Vec<Trigger>,
    taken: usize,
}

impl CallRecords {
    /// Sets up empty records for every host the plan declares. `host_clearances` is the
    /// policy's map; it may hold more hosts than the plan, but the declared hosts are
    /// exactly the plan's, so an undeclared host is always denied. A plan host missing
    /// from the map, or whose clearance disagrees with the plan, is an error: guessing a
    /// clearance would guess admissibility.
    pub fn new(plan: &Plan, host_clearances: &BTreeMap<HostName, Clearance>) -> Result<Self, ModelError> {
        let mut hosts = BTreeMap::new();
        for (i, g) in plan.groups.iter().enumerate() {
            for h in &g.hosts {
                let c = host_clearances.get(h).ok_or_else(|| ModelError::HostClearance(h.to_string()))?;
                if g.clearances.get(&crate::Member::Host(h.clone())).is_some_and(|pc| pc != c) {
                    return Err(ModelError::HostClearance(h.to_string()));
                }
                let rec = HostRecord { serving: i, clearance: c.clone(), record: Vec::new(), pending: BTreeSet::new() };
                if hosts.insert(h.clone(), rec).is_some() {
                    return Err(ModelError::DuplicateHost(h.to_string()));
                }
            }
        }
        Ok(CallRecords {
            groups: plan
                .groups
                .iter()
                .map(|g| GroupInfo { view: g.view.clone(), horizon: g.horizon.clone() })
                .collect(),
            hosts,
            copies: vec![CopyState::default(); plan.groups.len()],
            triggers: Vec::new(),
            taken: 0,
        })
    }

    /// Decides the copy's `k`-th (0-based) request to `host` and joins into `out` every
    /// host clearance the decision lets reach the copy, so the broker cannot forget one:
    ///
    /// - host in the copy's own group → `Deliver`; joins `clearance(host)` (the live reply,
    ///   or its absence, reaches the copy);
    /// - declared host served by an earlier group → positional comparison with the k-th
    ///   recorded request. Equal, admissible and the reply recorded → `Recorded`;
    ///   otherwise `Placeholder`. When admissible and the record is non-empty, joins
    ///   `clearance(host)`, whatever the outcome; when inadmissible the answer is ⊥
    ///   whatever the record holds, so nothing is joined;
    /// - declared host served by a later group → `Placeholder` (its record does not exist
    ///   yet, so nothing is compared or learned);
    /// - undeclared host → `Deny`.
    ///
    /// Fails closed with `Deny` when `group_index` is not in the plan, the copy already
    /// finished, an earlier copy has not finished (copies of a call run one at a time, in
    /// plan order), or `k` is not the number of requests this copy already sent to `host`.
    ///
    /// Divergences from an earlier record whose view ⊆ this copy's view are recorded as
    /// triggers (the first one per copy and host only: later positions follow from it and
    /// would let a release flood the verifier). Read them with
    /// [`CallRecords::take_new_triggers`] or from [`CallRecords::finish_copy`].
    pub fn positional_reply(
        &mut self,
        group_index: usize,
        host: &HostName,
        k: usize,
        req: RequestDigest,
        out: &mut OutputLabel,
    ) -> EgressDecision {
        if !self.may_run(group_index) {
            return EgressDecision::Deny;
        }
        let Some(rec) = self.hosts.get_mut(host) else {
            return EgressDecision::Deny;
        };
        let sent = self.copies[group_index].sent.entry(host.clone()).or_default();
        if sent.len() != k {
            return EgressDecision::Deny;
        }
        sent.push(req);

        if rec.serving == group_index {
            out.add_reply_from(&rec.clearance);
            rec.pending.insert(rec.record.len());
            rec.record.push(Exchange { request: req, reply: Vec::new() });
            return EgressDecision::Deliver;
        }
        if rec.serving > group_index {
            return EgressDecision::Placeholder;
        }

        let here = &self.groups[group_index];
        let admissible = here.horizon.admits(&rec.clearance);
        if admissible && !rec.record.is_empty() {
            out.add_reply_from(&rec.clearance);
        }
        let (decision, divergence) = match rec.record.get(k) {
            Some(x) if x.request == req => {
                if admissible && !rec.pending.contains(&k) {
                    (EgressDecision::Recorded(x.reply.clone()), None)
                } else {
                    (EgressDecision::Placeholder, None)
                }
            }
            Some(_) if rec.record.iter().any(|x| x.request == req) => {
                (EgressDecision::Placeholder, Some(TriggerKind::Reordered))
            }
            Some(_) => (EgressDecision::Placeholder, Some(TriggerKind::Mismatch)),
            None => (EgressDecision::Placeholder, Some(TriggerKind::Extra)),
        };
        let serving = rec.serving;
        if let Some(kind) = divergence {
            if self.groups[serving].view.is_subset(&here.view) {
                self.record_trigger(group_index, host, serving, kind, k);
            }
        }
        decision
    }

    /// Stores the reply a `Deliver`ed request got, at that request's position, so later
    /// copies are answered from it. Call exactly once per `Deliver`, with the bytes the
    /// copy was given. An exchange with no matching delivered request, or for a copy that
    /// already finished, is refused.
    pub fn record_exchange(&mut self, host: &HostName, req: RequestDigest, reply: Vec<u8>) -> Result<(), ModelError> {
        let unexpected = || ModelError::UnexpectedExchange { host: host.to_string() };
        let rec = self.hosts.get_mut(host).ok_or_else(unexpected)?;
        if self.copies[rec.serving].finished {
            return Err(unexpected());
        }
        let pos = rec
            .pending
            .iter()
            .copied()
            .find(|&p| rec.record.get(p).is_some_and(|x| x.request == req))
            .ok_or_else(unexpected)?;
        rec.pending.remove(&pos);
        rec.record[pos].reply = reply;
        Ok(())
    }

    /// Ends the copy of `group_index` and returns all of that copy's triggers: those
    /// already recorded while it ran plus a `Missing` one per declared host whose record,
    /// written by an earlier copy with a *strictly* smaller view, holds more requests than
    /// this copy sent (an equal view proves nothing about unseen items here, and a
    /// smaller-but-not-contained view is not comparable). Ending an unknown or already
    /// finished copy returns nothing.
    pub fn finish_copy(&mut self, group_index: usize) -> Vec<Trigger> {
        let Some(copy) = self.copies.get(group_index) else {
            return Vec::new();
        };
        if copy.finished {
            return Vec::new();
        }
        let mut missing = Vec::new();
        for (h, rec) in &self.hosts {
            if rec.serving >= group_index
                || !self.groups[rec.serving].view.is_strict_subset(&self.groups[group_index].view)
            {
                continue;
            }
            let sent = copy.sent.get(h).map_or(0, Vec::len);
            if sent < rec.record.len() {
                missing.push((h.clone(), rec.serving, sent));
            }
        }
        for (h, serving, pos) in missing {
            self.record_trigger(group_index, &h, serving, TriggerKind::Missing, pos);
        }
        self.copies[group_index].finished = true;
        self.triggers.iter().filter(|t| t.group_index == group_index).cloned().collect()
    }

    /// Every trigger of the call so far, in the order recorded.
    pub fn triggers(&self) -> &[Trigger] {
        &self.triggers
    }

    /// The triggers recorded since the last call, for a broker that forwards evidence
    /// while the call is still running. Independent of [`CallRecords::finish_copy`]'s
    /// return value: use one or the other to avoid forwarding a trigger twice.
    pub fn take_new_triggers(&mut self) -> Vec<Trigger> {
        let new = self.triggers[self.taken..].to_vec();
        self.taken = self.triggers.len();
        new
    }

    /// The record of a declared host, in request order, for witnesses and probe replay.
    pub fn record(&self, host: &HostName) -> Option<&[Exchange]> {
        self.hosts.get(host).map(|r| r.record.as_slice())
    }

    /// Whether the exchange at `position` was delivered but never got its reply recorded
    /// (the serving copy died or timed out); such a position is never replayed.
    pub fn is_pending(&self, host: &HostName, position: usize) -> bool {
        self.hosts.get(host).is_some_and(|r| r.pending.contains(&position))
    }

    /// The requests one copy sent to `host`, in order: the other half of a witness's
    /// "both request sequences".
    pub fn copy_requests(&self, group_index: usize, host: &HostName) -> &[RequestDigest] {
        self.copies.get(group_index).and_then(|c| c.sent.get(host)).map_or(&[], Vec::as_slice)
    }

    /// The index of the group that serves a declared host; `None` means undeclared.
    pub fn serving_group(&self, host: &HostName) -> Option<usize> {
        self.hosts.get(host).map(|r| r.serving)
    }

    /// The clearance of a declared host, as the records use it for admissibility.
    pub fn host_clearance(&self, host: &HostName) -> Option<&Clearance> {
        self.hosts.get(host).map(|r| &r.clearance)
    }

    /// Whether a copy of `group_index` may act now: it exists, has not finished, and
    /// every earlier copy has.
    pub fn may_run(&self, group_index: usize) -> bool {
        self.copies.get(group_index).is_some_and(|c| !c.finished)
            && self.copies[..group_index].iter().all(|c| c.finished)
    }

    fn record_trigger(
        &mut self,
        group_index: usize,
        host: &HostName,
        serving_group_index: usize,
        kind: TriggerKind,
        position: usize,
    ) {
        if !self.copies[group_index].triggered.insert(host.clone()) {
            return;
        }
        self.triggers.push(Trigger { host: host.clone(), group_index, serving_group_index, kind, position });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{plan_groups, ConsumerName, Item, ItemName, Label, PlanInput};

    fn cl(t: &[&str]) -> Clearance {
        Clearance::parse(t.iter().copied()).unwrap()
    }
    fn host(n: &str) -> HostName {
        HostName::new(n).unwrap()
    }
    fn item(name: &str, tags: &[&str]) -> Item {
        Item { name: ItemName::new(name).unwrap(), label: Label::parse(tags.iter().copied()).unwrap() }
    }
    fn d(n: u8) -> RequestDigest {
        RequestDigest([n; 32])
    }

    struct Call {
        plan: Plan,
        recs: CallRecords,
    }

    impl Call {
        fn new(input: PlanInput) -> Self {
            let plan = plan_groups(&input).unwrap();
            let hc = input.hosts.iter().cloned().collect();
            let recs = CallRecords::new(&plan, &hc).unwrap();
            Call { plan, recs }
        }
        fn group_of(&self, h: &str) -> usize {
            self.plan.serving_group(&host(h)).unwrap()
        }
        fn out(&self) -> OutputLabel {
            OutputLabel::new(Label::empty(), Label::empty())
        }
        /// Runs the copy serving `h` sending `reqs` (replying `reply-N`), then finishes it.
        fn serve(&mut self, h: &str, reqs: &[u8]) -> Vec<Trigger> {
            let g = self.group_of(h);
            let mut out = self.out();
            for (k, &r) in reqs.iter().enumerate() {
                let dec = self.recs.positional_reply(g, &host(h), k, d(r), &mut out);
                assert_eq!(dec, EgressDecision::Deliver);
                self.recs.record_exchange(&host(h), d(r), format!("reply-{r}").into_bytes()).unwrap();
            }
            self.recs.finish_copy(g)
        }
    }

    /// Two views: `low.example` sees only the invoice (finance), `high.example` sees
    /// invoice and payslip (finance, hr). `projx.example` sees the invoice but has a
    /// projx clearance, so its replies are inadmissible to finance-only copies.
    fn three_hosts() -> Call {
        Call::new(PlanInput {
            items: vec![item("invoice", &["finance"]), item("payslip", &["hr"])],
            hosts: vec![
                (host("low.example"), cl(&["finance"])),
                (host("projx.example"), cl(&["finance", "projx"])),
                (host("high.example"), cl(&["finance", "hr"])),
            ],
            consumers: vec![(ConsumerName::new("agent").unwrap(), cl(&["finance", "hr"]))],
        })
    }

    #[test]
    fn plan_order_of_fixture() {
        let c = three_hosts();
        assert_eq!(c.group_of("low.example"), 0);
        assert_eq!(c.group_of("projx.example"), 1);
        assert_eq!(c.group_of("high.example"), 2);
        assert_eq!(c.plan.groups[2].consumers.len(), 1);
    }

    #[test]
    fn own_group_is_delivered_and_labelled() {
        let mut c = three_hosts();
        let mut out = c.out();
        let dec = c.recs.positional_reply(0, &host("low.example"), 0, d(1), &mut out);
        assert_eq!(dec, EgressDecision::Deliver);
        assert_eq!(out.label(), Label::parse(["finance"]).unwrap());
        assert!(c.recs.is_pending(&host("low.example"), 0));
        c.recs.record_exchange(&host("low.example"), d(1), b"r".to_vec()).unwrap();
        assert!(!c.recs.is_pending(&host("low.example"), 0));
        assert_eq!(c.recs.record(&host("low.example")).unwrap()[0].reply, b"r");
        // A second recording of the same exchange has no delivered request to match.
        assert!(c.recs.record_exchange(&host("low.example"), d(1), b"r".to_vec()).is_err());
    }

    #[test]
    fn equal_and_admissible_gets_recorded_reply() {
        let mut c = three_hosts();
        assert!(c.serve("low.example", &[1, 2]).is_empty());
        let mut out = c.out();
        let dec = c.recs.positional_reply(1, &host("low.example"), 0, d(1), &mut out);
        assert_eq!(dec, EgressDecision::Recorded(b"reply-1".to_vec()));
        assert_eq!(out.label(), Label::parse(["finance"]).unwrap());
        let dec = c.recs.positional_reply(1, &host("low.example"), 1, d(2), &mut out);
        assert_eq!(dec, EgressDecision::Recorded(b"reply-2".to_vec()));
        assert!(c.recs.finish_copy(1).is_empty());
        assert!(c.recs.triggers().is_empty());
    }

    #[test]
    fn equal_but_inadmissible_gets_placeholder_and_no_label() {
        let mut c = three_hosts();
        c.serve("low.example", &[]);
        c.serve("projx.example", &[7]);
        // high (finance, hr) is not cleared for projx: the recorded reply is withheld.
        let mut out = c.out();
        let dec = c.recs.positional_reply(2, &host("projx.example"), 0, d(7), &mut out);
        assert_eq!(dec, EgressDecision::Placeholder);
        assert!(out.label().is_empty());
        assert!(c.recs.finish_copy(2).is_empty());
    }

    #[test]
    fn projx_reply_never_reaches_finance_only_group() {
        // Same view {invoice}, hosts split by clearance; the finance-only copy runs first,
        // so when it asks projx the record is not written yet.
        let mut c = three_hosts();
        let mut out = c.out();
        let dec = c.recs.positional_reply(0, &host("projx.example"), 0, d(7), &mut out);
        assert_eq!(dec, EgressDecision::Placeholder);
        assert!(out.label().is_empty());
        assert!(c.recs.finish_copy(0).is_empty());
    }

    #[test]
    fn unequal_request_is_a_mismatch_trigger() {
        let mut c = three_hosts();
        c.serve("low.example", &[1, 2]);
        c.serve("projx.example", &[]);
        let mut out = c.out();
        let dec = c.recs.positional_reply(2, &host("low.example"), 0, d(9), &mut out);
        assert_eq!(dec, EgressDecision::Placeholder);
        // Compared against a non-empty record while admissible: the label carries it.
        assert_eq!(out.label(), Label::parse(["finance"]).unwrap());
        let t = c.recs.take_new_triggers();
        assert_eq!(
            t,
            vec![Trigger {
                host: host("low.example"),
                group_index: 2,
                serving_group_index: 0,
                kind: TriggerKind::Mismatch,
                position: 0,
            }]
        );
        assert!(c.recs.take_new_triggers().is_empty());
        // Only the first divergence per copy and host is recorded.
        c.recs.positional_reply(2, &host("low.example"), 1, d(8), &mut out);
        c.recs.positional_reply(2, &host("low.example"), 2, d(8), &mut out);
        assert_eq!(c.recs.finish_copy(2), t);
    }

    #[test]
    fn extra_request_is_a_trigger() {
        let mut c = three_hosts();
        c.serve("low.example", &[1]);
        c.serve("projx.example", &[]);
        let mut out = c.out();
        assert_eq!(
            c.recs.positional_reply(2, &host("low.example"), 0, d(1), &mut out),
            EgressDecision::Recorded(b"reply-1".to_vec())
        );
        assert_eq!(c.recs.positional_reply(2, &host("low.example"), 1, d(1), &mut out), EgressDecision::Placeholder);
        let t = c.recs.finish_copy(2);
        assert_eq!(t.len(), 1);
        assert_eq!(t[0].kind, TriggerKind::Extra);
        assert_eq!(t[0].position, 1);
    }

    #[test]
    fn extra_against_empty_record_is_a_trigger_without_label() {
        let mut c = three_hosts();
        c.serve("low.example", &[]);
        c.serve("projx.example", &[]);
        let mut out = c.out();
        assert_eq!(c.recs.positional_reply(2, &host("low.example"), 0, d(1), &mut out), EgressDecision::Placeholder);
        assert!(out.label().is_empty());
        assert_eq!(c.recs.finish_copy(2)[0].kind, TriggerKind::Extra);
    }

    #[test]
    fn missing_requests_trigger_only_for_strictly_smaller_view() {
        let mut c = three_hosts();
        c.serve("low.example", &[1, 2]);
        // projx has the same view {invoice} as low: sending fewer proves nothing.
        let g = c.group_of("projx.example");
        assert!(c.recs.finish_copy(g).is_empty());
        // high's view {invoice, payslip} strictly contains low's.
        let mut out = c.out();
        c.recs.positional_reply(2, &host("low.example"), 0, d(1), &mut out);
        let t = c.recs.finish_copy(2);
        assert_eq!(
            t,
            vec![Trigger {
                host: host("low.example"),
                group_index: 2,
                serving_group_index: 0,
                kind: TriggerKind::Missing,
                position: 1,
            }]
        );
        assert_eq!(c.recs.triggers(), t.as_slice());
    }

    #[test]
    fn mismatch_with_equal_view_is_a_trigger() {
        // projx's group has the same view as low's (⊆ holds), so a mismatch counts.
        let mut c = three_hosts();
        c.serve("low.example", &[1]);
        let mut out = c.out();
        let dec = c.recs.positional_reply(1, &host("low.example"), 0, d(2), &mut out);
        assert_eq!(dec, EgressDecision::Placeholder);
        assert_eq!(c.recs.finish_copy(1)[0].kind, TriggerKind::Mismatch);
    }

    #[test]
    fn reordered_requests_are_a_trigger() {
        let mut c = three_hosts();
        c.serve("low.example", &[1, 2]);
        c.serve("projx.example", &[]);
        let mut out = c.out();
        assert_eq!(c.recs.positional_reply(2, &host("low.example"), 0, d(2), &mut out), EgressDecision::Placeholder);
        assert_eq!(c.recs.positional_reply(2, &host("low.example"), 1, d(1), &mut out), EgressDecision::Placeholder);
        let t = c.recs.finish_copy(2);
        assert_eq!(t.len(), 1);
        assert_eq!(t[0].kind, TriggerKind::Reordered);
        assert_eq!(t[0].position, 0);
    }

    #[test]
    fn host_served_by_later_group_gives_placeholder_without_trigger() {
        let mut c = three_hosts();
        let mut out = c.out();
        let dec = c.recs.positional_reply(0, &host("high.example"), 0, d(1), &mut out);
        assert_eq!(dec, EgressDecision::Placeholder);
        assert!(out.label().is_empty());
        assert!(c.recs.finish_copy(0).is_empty());
    }

    #[test]
    fn earlier_group_with_incomparable_view_gives_no_trigger() {
        // a sees {x}, b sees {y}: b runs after a but a's view is not inside b's.
        let mut c = Call::new(PlanInput {
            items: vec![item("x", &["finance"]), item("y", &["hr"])],
            hosts: vec![(host("a.example"), cl(&["finance"])), (host("b.example"), cl(&["hr"]))],
            consumers: vec![],
        });
        let (ga, gb) = (c.group_of("a.example"), c.group_of("b.example"));
        assert!(ga < gb);
        c.serve("a.example", &[1, 2]);
        let mut out = c.out();
        let dec = c.recs.positional_reply(gb, &host("a.example"), 0, d(3), &mut out);
        assert_eq!(dec, EgressDecision::Placeholder);
        // finance reply is not admissible to an hr-only copy: nothing joined.
        assert!(out.label().is_empty());
        assert!(c.recs.finish_copy(gb).is_empty());
    }

    #[test]
    fn undeclared_host_is_denied() {
        let mut c = three_hosts();
        let mut out = c.out();
        let dec = c.recs.positional_reply(0, &host("evil.example"), 0, d(1), &mut out);
        assert_eq!(dec, EgressDecision::Deny);
        assert!(out.label().is_empty());
        assert!(c.recs.serving_group(&host("evil.example")).is_none());
    }

    #[test]
    fn repeated_identical_requests_give_no_trigger() {
        let mut c = three_hosts();
        c.serve("low.example", &[5, 5, 5]);
        c.serve("projx.example", &[]);
        let mut out = c.out();
        for k in 0..3 {
            assert_eq!(
                c.recs.positional_reply(2, &host("low.example"), k, d(5), &mut out),
                EgressDecision::Recorded(b"reply-5".to_vec())
            );
        }
        assert!(c.recs.finish_copy(2).is_empty());
        assert!(c.recs.triggers().is_empty());
    }

    #[test]
    fn pending_reply_is_never_replayed() {
        let mut c = three_hosts();
        let mut out = c.out();
        c.recs.positional_reply(0, &host("low.example"), 0, d(1), &mut out);
        // The serving copy died before its reply was recorded.
        c.recs.finish_copy(0);
        assert!(c.recs.record_exchange(&host("low.example"), d(1), b"late".to_vec()).is_err());
        c.recs.finish_copy(1);
        let mut out = c.out();
        let dec = c.recs.positional_reply(2, &host("low.example"), 0, d(1), &mut out);
        assert_eq!(dec, EgressDecision::Placeholder);
        assert_eq!(out.label(), Label::parse(["finance"]).unwrap());
    }

    #[test]
    fn out_of_order_use_fails_closed() {
        let mut c = three_hosts();
        let mut out = c.out();
        // Group 1 cannot act before group 0 finished.
        assert_eq!(c.recs.positional_reply(1, &host("projx.example"), 0, d(1), &mut out), EgressDecision::Deny);
        // k must count this copy's requests to the host.
        assert_eq!(c.recs.positional_reply(0, &host("low.example"), 3, d(1), &mut out), EgressDecision::Deny);
        // Unknown group, finished copy.
        assert_eq!(c.recs.positional_reply(9, &host("low.example"), 0, d(1), &mut out), EgressDecision::Deny);
        c.recs.finish_copy(0);
        assert_eq!(c.recs.positional_reply(0, &host("low.example"), 0, d(1), &mut out), EgressDecision::Deny);
        assert!(c.recs.finish_copy(0).is_empty());
        assert!(c.recs.finish_copy(9).is_empty());
        assert!(out.label().is_empty());
    }

    #[test]
    fn copy_requests_are_kept_for_witnesses() {
        let mut c = three_hosts();
        c.serve("low.example", &[1]);
        c.serve("projx.example", &[]);
        let mut out = c.out();
        c.recs.positional_reply(2, &host("low.example"), 0, d(4), &mut out);
        assert_eq!(c.recs.copy_requests(2, &host("low.example")), &[d(4)]);
        assert_eq!(c.recs.copy_requests(0, &host("low.example")), &[d(1)]);
        assert!(c.recs.copy_requests(7, &host("low.example")).is_empty());
    }

    #[test]
    fn new_refuses_missing_or_disagreeing_clearance() {
        let c = three_hosts();
        let mut hc: BTreeMap<HostName, Clearance> = BTreeMap::new();
        hc.insert(host("low.example"), cl(&["finance"]));
        hc.insert(host("projx.example"), cl(&["finance", "projx"]));
        assert!(matches!(CallRecords::new(&c.plan, &hc), Err(ModelError::HostClearance(_))));
        hc.insert(host("high.example"), cl(&["hr"]));
        assert!(matches!(CallRecords::new(&c.plan, &hc), Err(ModelError::HostClearance(_))));
        hc.insert(host("high.example"), cl(&["finance", "hr"]));
        hc.insert(host("other.example"), cl(&[]));
        let recs = CallRecords::new(&c.plan, &hc).unwrap();
        assert!(recs.serving_group(&host("other.example")).is_none());
        assert_eq!(recs.host_clearance(&host("high.example")), Some(&cl(&["finance", "hr"])));
    }

    #[test]
    fn digest_serde_round_trips() {
        let x = RequestDigest::of_bytes(b"GET / HTTP/1.1");
        let json = serde_json::to_string(&x).unwrap();
        assert_eq!(serde_json::from_str::<RequestDigest>(&json).unwrap(), x);
        assert!(serde_json::from_str::<RequestDigest>("\"00\"").is_err());
        let t = Trigger {
            host: host("a.example"),
            group_index: 1,
            serving_group_index: 0,
            kind: TriggerKind::Reordered,
            position: 2,
        };
        let json = serde_json::to_string(&t).unwrap();
        assert!(json.contains("\"reordered\""));
        assert_eq!(serde_json::from_str::<Trigger>(&json).unwrap(), t);
    }

    /// A simulated release: given the declared host, the copy's view and the host's own
    /// view `V(h)`, the requests the copy sends to that host.
    type Release = fn(&HostName, &View, &View) -> Vec<RequestDigest>;

    fn digest_of(host: &HostName, view: &View, i: usize) -> RequestDigest {
        let mut bytes = host.as_str().as_bytes().to_vec();
        for name in view.items() {
            bytes.extend_from_slice(b"\0");
            bytes.extend_from_slice(name.as_str().as_bytes());
        }
        bytes.extend_from_slice(&i.to_le_bytes());
        RequestDigest::of_bytes(&bytes)
    }

    /// Flow-compliant: requests to `h` depend only on the items `h` may see.
    fn honest(h: &HostName, v: &View, vh: &View) -> Vec<RequestDigest> {
        let seen = View::new(v.items().filter(|i| vh.contains(i)).cloned().collect());
        (0..=seen.len() % 3).map(|i| digest_of(h, &seen, i)).collect()
    }

    /// Leaky: requests to `h` depend on the copy's whole view.
    fn leaky(h: &HostName, v: &View, _: &View) -> Vec<RequestDigest> {
        (0..=v.len() % 3).map(|i| digest_of(h, v, i)).collect()
    }

    struct Run {
        recs: CallRecords,
        labels: Vec<Label>,
    }

    /// Runs every copy of the plan in order; each copy talks to every declared host and
    /// one undeclared one. Checks the per-decision invariants on the way.
    fn run(input: &PlanInput, plan: &Plan, release: Release) -> Run {
        let hc: BTreeMap<HostName, Clearance> = input.hosts.iter().cloned().collect();
        let mut recs = CallRecords::new(plan, &hc).unwrap();
        let mut labels = Vec::new();
        let undeclared = host("undeclared.example");
        for (g, group) in plan.groups.iter().enumerate() {
            let view_label = group.view.label_of(&input.items);
            let mut out = OutputLabel::new(view_label, Label::empty());
            for (h, c) in &input.hosts {
                let vh = View::of_clearance(&input.items, c);
                for (k, req) in release(h, &group.view, &vh).into_iter().enumerate() {
                    let serving = recs.serving_group(h).unwrap();
                    let earlier = recs.record(h).unwrap().get(k).cloned();
                    match recs.positional_reply(g, h, k, req, &mut out) {
                        EgressDecision::Deliver => {
                            assert_eq!(serving, g);
                            let reply = [h.as_str().as_bytes(), &req.0].concat();
                            recs.record_exchange(h, req, reply).unwrap();
                        }
                        EgressDecision::Recorded(reply) => {
                            assert!(serving < g);
                            assert!(group.horizon.admits(c));
                            let x = earlier.unwrap();
                            assert_eq!((x.request, x.reply), (req, reply));
                        }
                        EgressDecision::Placeholder => assert_ne!(serving, g),
                        EgressDecision::Deny => panic!("declared host denied"),
                    }
                }
            }
            assert_eq!(
                recs.positional_reply(g, &undeclared, 0, RequestDigest([0; 32]), &mut out),
                EgressDecision::Deny
            );
            // Nothing outside the horizon ever reaches a copy.
            assert!(out.label().flows_to(&group.horizon.0));
            for (_, mc) in group.member_clearances() {
                assert!(out.label().flows_to(&mc));
            }
            labels.push(out.label());
            for t in recs.finish_copy(g) {
                let s = &plan.groups[t.serving_group_index];
                assert_eq!(t.group_index, g);
                assert!(t.serving_group_index < g);
                assert!(s.hosts.contains(&t.host));
                if t.kind == TriggerKind::Missing {
                    assert!(s.view.is_strict_subset(&group.view));
                } else {
                    assert!(s.view.is_subset(&group.view));
                }
            }
        }
        Run { recs, labels }
    }

    #[test]
    fn flow_compliant_release_never_triggers() {
        for seed in 0..2000 {
            let mut rng = crate::plan::gen::Rng::new(seed);
            let input = crate::plan::gen::plan_input(&mut rng);
            let plan = plan_groups(&input).unwrap();
            let r = run(&input, &plan, honest);
            assert!(r.recs.triggers().is_empty(), "seed {seed}");
            assert_eq!(r.labels.len(), plan.copy_count());
        }
    }

    #[test]
    fn leaky_release_triggers_wherever_a_smaller_view_served_the_host() {
        let mut seen_trigger = false;
        for seed in 0..2000 {
            let mut rng = crate::plan::gen::Rng::new(seed);
            let input = crate::plan::gen::plan_input(&mut rng);
            let plan = plan_groups(&input).unwrap();
            let r = run(&input, &plan, leaky);
            for (g, group) in plan.groups.iter().enumerate() {
                for (h, _) in &input.hosts {
                    let s = r.recs.serving_group(h).unwrap();
                    let expect = s < g && plan.groups[s].view.is_strict_subset(&group.view);
                    let got = r.recs.triggers().iter().any(|t| t.group_index == g && &t.host == h);
                    assert_eq!(got, expect, "seed {seed} group {g} host {h}");
                    seen_trigger |= got;
                }
            }
        }
        assert!(seen_trigger);
    }

    #[test]
    fn arbitrary_requests_keep_labels_within_horizon() {
        fn noisy(h: &HostName, v: &View, _: &View) -> Vec<RequestDigest> {
            // Mixes repeats, reorders and view-dependent lengths.
            let n = (h.as_str().len() + v.len()) % 5;
            (0..n).map(|i| RequestDigest([((i * 7 + v.len()) % 3) as u8; 32])).collect()
        }
        for seed in 0..2000 {
            let mut rng = crate::plan::gen::Rng::new(seed);
            let input = crate::plan::gen::plan_input(&mut rng);
            let plan = plan_groups(&input).unwrap();
            run(&input, &plan, noisy);
        }
    }
}

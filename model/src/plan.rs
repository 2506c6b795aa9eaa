//! Plan (DESIGN §2): which copies a call needs, who each copy serves, and in what order.
//!
//! Plan reads only metadata — item names and labels, clearances, the declared
//! destinations `D_f` and the consumers `C` — never item contents, so the number of
//! copies and their membership leak nothing about the data. Groups depend on *declared*
//! destinations only; contact-driven splitting would leak one bit per call and host.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use serde::{Deserialize, Serialize};

use crate::{Clearance, ConsumerName, HostName, ItemName, Label, ModelError, Tag};

/// One item of a call as Plan sees it: public name and policy label, no contents, so
/// Plan cannot depend on data.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Item {
    /// The item's public name (a path or `arg:NAME`).
    pub name: ItemName,
    /// The label the deployer's policy gives the item.
    pub label: Label,
}

/// A member of a group: a destination host or a consumer of the return value. Both kinds
/// are "readers" of the copy, which is why Plan groups them together.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Member {
    /// A destination host declared for the function (`D_f`).
    Host(HostName),
    /// A consumer of the return value (`C`), usually the agent.
    Consumer(ConsumerName),
}

impl fmt::Display for Member {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Member::Host(h) => write!(f, "host:{h}"),
            Member::Consumer(c) => write!(f, "consumer:{c}"),
        }
    }
}

/// Everything Plan may read about a call; keeping it to metadata makes Plan
/// data-independent by construction.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PlanInput {
    /// The call's items, by name and label.
    pub items: Vec<Item>,
    /// The destinations declared for the function in the signed manifest (`D_f`), with
    /// the clearance the deployer's policy gives each.
    pub hosts: Vec<(HostName, Clearance)>,
    /// The consumers of the return value (`C`), with their clearances.
    pub consumers: Vec<(ConsumerName, Clearance)>,
}

/// `V(d)`: the items of a call a reader may see. Views are compared as sets of names
/// because two readers that may see the same items can share one copy.
#[derive(Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct View(BTreeSet<ItemName>);

impl View {
    /// Wraps a set of item names; Plan builds views with [`View::of_clearance`].
    pub fn new(items: BTreeSet<ItemName>) -> Self {
        View(items)
    }

    /// `V(d)` for a reader with clearance `c`: every item whose label flows to `c`.
    pub fn of_clearance(items: &[Item], c: &Clearance) -> Self {
        View(items.iter().filter(|i| i.label.flows_to(c)).map(|i| i.name.clone()).collect())
    }

    /// Whether the copy with this view gets the item's contents (else only its name).
    pub fn contains(&self, name: &ItemName) -> bool {
        self.0.contains(name)
    }

    /// `self ⊆ other`: decides whether a mismatch against an earlier record is evidence.
    pub fn is_subset(&self, other: &View) -> bool {
        self.0.is_subset(&other.0)
    }

    /// `self ⊊ other`: decides run order and whether "fewer requests" is evidence.
    pub fn is_strict_subset(&self, other: &View) -> bool {
        self.0.len() < other.0.len() && self.0.is_subset(&other.0)
    }

    /// The item names in the view, in order.
    pub fn items(&self) -> impl Iterator<Item = &ItemName> {
        self.0.iter()
    }

    /// Number of items in the view (the first key of Plan's order).
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// True when the copy sees no item contents at all.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The join of the labels of the view's items: the least a copy's output carries.
    /// Names not found in `items` contribute nothing, so pass the call's full item list.
    pub fn label_of(&self, items: &[Item]) -> Label {
        items.iter().filter(|i| self.contains(&i.name)).fold(Label::empty(), |acc, i| acc.join(&i.label))
    }
}

/// `κ(g)`: the intersection of the clearances of a group's members. State slots are kept
/// per horizon, so what a copy may carry from one call to the next is bounded by what
/// every reader of that copy may see.
#[derive(Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Horizon(pub Clearance);

impl Horizon {
    /// The intersection of `clearances`; `None` for no clearance at all, because an
    /// empty group has no meaningful horizon.
    pub fn of<'a, I: IntoIterator<Item = &'a Clearance>>(clearances: I) -> Option<Self> {
        let mut it = clearances.into_iter();
        let first = it.next()?.clone();
        Some(Horizon(it.fold(first, |acc, c| acc.intersect(c))))
    }

    /// Stable text that names the horizon's state slot: tags joined by `,` in order, or
    /// `{}` for the empty horizon (tags never contain `,`, `{` or `}`, so keys are
    /// unambiguous and safe as a file-name component).
    pub fn key(&self) -> String {
        if self.0.is_empty() {
            return "{}".to_owned();
        }
        self.0.tags().map(Tag::as_str).collect::<Vec<_>>().join(",")
    }

    /// Parses a [`Horizon::key`] back, so stored slot names can be checked.
    pub fn from_key(key: &str) -> Result<Self, ModelError> {
        if key == "{}" {
            return Ok(Horizon(Clearance::empty()));
        }
        Clearance::parse(key.split(',')).map(Horizon)
    }

    /// Whether a reply from a host with clearance `c` is admissible for the group:
    /// `c ⊆ clearance(m)` for every member `m` is exactly `c ⊆ κ(g)`.
    pub fn admits(&self, c: &Clearance) -> bool {
        c.is_subset(&self.0)
    }

    /// The horizon as a label, to check that what a copy carries stays within it.
    pub fn as_label(&self) -> Label {
        self.0.as_label()
    }
}

impl fmt::Display for Horizon {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

/// One copy of the call: the readers it serves, what it may see, and its horizon.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Group {
    /// `V(m)`, the same for every member.
    pub view: View,
    /// The group's destination hosts (all with the same clearance), sorted.
    pub hosts: Vec<HostName>,
    /// The group's consumers, sorted.
    pub consumers: Vec<ConsumerName>,
    /// `κ(g)`, the intersection of the members' clearances.
    pub horizon: Horizon,
    /// Every member's clearance, kept so admissibility and horizons can be re-checked
    /// without going back to the policy.
    pub clearances: BTreeMap<Member, Clearance>,
}

impl Group {
    /// The group's members, hosts first, each list sorted.
    pub fn members(&self) -> Vec<Member> {
        self.hosts
            .iter()
            .cloned()
            .map(Member::Host)
            .chain(self.consumers.iter().cloned().map(Member::Consumer))
            .collect()
    }

    /// Each member with its clearance, in [`Group::members`] order; a member without a
    /// recorded clearance is skipped (only possible in a hand-built group).
    pub fn member_clearances(&self) -> Vec<(Member, Clearance)> {
        self.members().into_iter().filter_map(|m| self.clearances.get(&m).cloned().map(|c| (m, c))).collect()
    }

    /// The clearance shared by the group's hosts, `None` for a consumer-only group.
    pub fn host_clearance(&self) -> Option<&Clearance> {
        self.hosts.first().and_then(|h| self.clearances.get(&Member::Host(h.clone())))
    }

    fn order_key(&self) -> (usize, &View, &Horizon, Vec<Member>) {
        (self.view.len(), &self.view, &self.horizon, self.members())
    }
}

/// The copies of one call, in the order they must run.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Plan {
    /// Groups in run order: a strictly smaller view always comes first.
    pub groups: Vec<Group>,
}

impl Plan {
    /// The index of the group that serves `host` (its only live route to that host).
    pub fn serving_group(&self, host: &HostName) -> Option<usize> {
        self.groups.iter().position(|g| g.hosts.contains(host))
    }

    /// The index of the group whose return value goes to `consumer`.
    pub fn consumer_group(&self, consumer: &ConsumerName) -> Option<usize> {
        self.groups.iter().position(|g| g.consumers.contains(consumer))
    }

    /// The copy count; it is the lower bound for any data-independent mechanism.
    pub fn copy_count(&self) -> usize {
        self.groups.len()
    }
}

/// DESIGN §2 Plan, steps 1–3.
///
/// 1. `V(d)` = the items whose label ⊆ clearance(d), for every d ∈ `D_f ∪ C`; group by view.
/// 2. Within a view, hosts are split by clearance (one group per distinct clearance).
///    A consumer joins a host group only if the hosts' clearance ⊆ its own; if several
///    qualify it joins the first in [`Clearance`]'s order. The view's other consumers
///    share one consumer-only group.
/// 3. Groups are sorted by (view size, view, horizon, members). View size first makes a
///    strictly smaller view run first; the rest makes the order total and deterministic
///    (members are disjoint between groups, so no two groups compare equal).
///
/// Duplicate item, host or consumer names are refused: a name must mean one reader (or
/// one item), or a reader could end up in two copies with different views.
pub fn plan_groups(input: &PlanInput) -> Result<Plan, ModelError> {
    check_unique(input.items.iter().map(|i| &i.name), |n| ModelError::DuplicateItem(n.to_string()))?;
    check_unique(input.hosts.iter().map(|(h, _)| h), |h| ModelError::DuplicateHost(h.to_string()))?;
    check_unique(input.consumers.iter().map(|(c, _)| c), |c| ModelError::DuplicateConsumer(c.to_string()))?;

    #[derive(Default)]
    struct ByView<'a> {
        hosts: BTreeMap<&'a Clearance, Vec<&'a HostName>>,
        consumers: Vec<(&'a ConsumerName, &'a Clearance)>,
    }
    let mut by_view: BTreeMap<View, ByView<'_>> = BTreeMap::new();
    for (h, c) in &input.hosts {
        let v = View::of_clearance(&input.items, c);
        by_view.entry(v).or_default().hosts.entry(c).or_default().push(h);
    }
    for (name, c) in &input.consumers {
        let v = View::of_clearance(&input.items, c);
        by_view.entry(v).or_default().consumers.push((name, c));
    }

    let mut groups = Vec::new();
    for (view, bv) in by_view {
        let mut host_groups: Vec<HostGroup<'_>> = bv.hosts.into_iter().map(|(c, hs)| (c, hs, Vec::new())).collect();
        let mut own = Vec::new();
        for (name, cc) in bv.consumers {
            match host_groups.iter_mut().find(|(hc, _, _)| hc.is_subset(cc)) {
                Some((_, _, cs)) => cs.push((name, cc)),
                None => own.push((name, cc)),
            }
        }
        for (hc, hosts, consumers) in host_groups {
            groups.push(build_group(view.clone(), hc, hosts, consumers)?);
        }
        if !own.is_empty() {
            groups.push(build_consumer_group(view, own)?);
        }
    }
    groups.sort_by(|a, b| a.order_key().cmp(&b.order_key()));
    Ok(Plan { groups })
}

/// A host sub-group of one view under construction: clearance, hosts, joined consumers.
type HostGroup<'a> = (&'a Clearance, Vec<&'a HostName>, Vec<(&'a ConsumerName, &'a Clearance)>);

fn check_unique<'a, T: Ord + 'a>(
    names: impl Iterator<Item = &'a T>,
    err: impl Fn(&T) -> ModelError,
) -> Result<(), ModelError> {
    let mut seen = BTreeSet::new();
    for n in names {
        if !seen.insert(n) {
            return Err(err(n));
        }
    }
    Ok(())
}

fn build_group(
    view: View,
    host_clearance: &Clearance,
    hosts: Vec<&HostName>,
    consumers: Vec<(&ConsumerName, &Clearance)>,
) -> Result<Group, ModelError> {
    let mut clearances = BTreeMap::new();
    for h in &hosts {
        clearances.insert(Member::Host((*h).clone()), host_clearance.clone());
    }
    for (c, cc) in &consumers {
        clearances.insert(Member::Consumer((*c).clone()), (*cc).clone());
    }
    finish_group(view, clearances)
}

fn build_consumer_group(view: View, consumers: Vec<(&ConsumerName, &Clearance)>) -> Result<Group, ModelError> {
    let clearances = consumers.into_iter().map(|(c, cc)| (Member::Consumer(c.clone()), cc.clone())).collect();
    finish_group(view, clearances)
}

fn finish_group(view: View, clearances: BTreeMap<Member, Clearance>) -> Result<Group, ModelError> {
    let horizon = Horizon::of(clearances.values()).ok_or(ModelError::EmptyGroup)?;
    let mut hosts = Vec::new();
    let mut consumers = Vec::new();
    for m in clearances.keys() {
        match m {
            Member::Host(h) => hosts.push(h.clone()),
            Member::Consumer(c) => consumers.push(c.clone()),
        }
    }
    Ok(Group { view, hosts, consumers, horizon, clearances })
}

/// Small deterministic generators shared by the model's property tests (no I/O, no
/// external crates: a fixed-seed xorshift is enough to walk many shapes of call).
#[cfg(test)]
pub(crate) mod gen {
    use super::*;

    pub(crate) struct Rng(u64);

    impl Rng {
        pub(crate) fn new(seed: u64) -> Self {
            Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
        }
        pub(crate) fn next(&mut self) -> u64 {
            let mut x = self.0;
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            self.0 = x;
            x
        }
        pub(crate) fn below(&mut self, n: usize) -> usize {
            (self.next() % n as u64) as usize
        }
    }

    pub(crate) const TAGS: [&str; 4] = ["finance", "hr", "projx", "public"];

    fn subset(rng: &mut Rng) -> Vec<&'static str> {
        TAGS.iter().copied().filter(|_| rng.below(2) == 0).collect()
    }

    pub(crate) fn clearance(rng: &mut Rng) -> Clearance {
        Clearance::parse(subset(rng)).unwrap()
    }

    pub(crate) fn plan_input(rng: &mut Rng) -> PlanInput {
        let items = (0..rng.below(6))
            .map(|i| Item {
                name: ItemName::new(&format!("item{i}")).unwrap(),
                label: Label::parse(subset(rng).into_iter().take(2)).unwrap(),
            })
            .collect();
        let hosts =
            (0..rng.below(6)).map(|i| (HostName::new(&format!("h{i}.example")).unwrap(), clearance(rng))).collect();
        let consumers =
            (0..rng.below(4)).map(|i| (ConsumerName::new(&format!("c{i}")).unwrap(), clearance(rng))).collect();
        PlanInput { items, hosts, consumers }
    }
}

#[cfg(test)]
mod tests {
    use super::gen::*;
    use super::*;

    fn cl(tags: &[&str]) -> Clearance {
        Clearance::parse(tags.iter().copied()).unwrap()
    }
    fn item(name: &str, tags: &[&str]) -> Item {
        Item { name: ItemName::new(name).unwrap(), label: Label::parse(tags.iter().copied()).unwrap() }
    }
    fn host(n: &str) -> HostName {
        HostName::new(n).unwrap()
    }
    fn consumer(n: &str) -> ConsumerName {
        ConsumerName::new(n).unwrap()
    }
    fn view(names: &[&str]) -> View {
        View::new(names.iter().map(|n| ItemName::new(n).unwrap()).collect())
    }

    #[test]
    fn design_example_gives_ocr_then_agent() {
        let input = PlanInput {
            items: vec![item("invoice.pdf", &["finance"]), item("payslip.pdf", &["hr"])],
            hosts: vec![(host("ocr.example"), cl(&["finance"]))],
            consumers: vec![(consumer("agent"), cl(&["finance", "hr"]))],
        };
        let plan = plan_groups(&input).unwrap();
        assert_eq!(plan.copy_count(), 2);
        let g0 = &plan.groups[0];
        assert_eq!(g0.hosts, vec![host("ocr.example")]);
        assert!(g0.consumers.is_empty());
        assert_eq!(g0.view, view(&["invoice.pdf"]));
        assert_eq!(g0.horizon, Horizon(cl(&["finance"])));
        let g1 = &plan.groups[1];
        assert!(g1.hosts.is_empty());
        assert_eq!(g1.consumers, vec![consumer("agent")]);
        assert_eq!(g1.view, view(&["invoice.pdf", "payslip.pdf"]));
        assert_eq!(g1.horizon, Horizon(cl(&["finance", "hr"])));
        assert_eq!(plan.serving_group(&host("ocr.example")), Some(0));
        assert_eq!(plan.consumer_group(&consumer("agent")), Some(1));
    }

    #[test]
    fn same_view_different_clearance_splits_hosts() {
        // Both hosts see only the invoice, but a projx reply must not reach a
        // finance-only host's copy, so they need two copies.
        let input = PlanInput {
            items: vec![item("invoice", &["finance"])],
            hosts: vec![
                (host("a.example"), cl(&["finance"])),
                (host("b.example"), cl(&["finance", "projx"])),
                (host("c.example"), cl(&["finance"])),
            ],
            consumers: vec![],
        };
        let plan = plan_groups(&input).unwrap();
        assert_eq!(plan.copy_count(), 2);
        assert_eq!(plan.groups[0].hosts, vec![host("a.example"), host("c.example")]);
        assert_eq!(plan.groups[1].hosts, vec![host("b.example")]);
    }

    #[test]
    fn consumer_joins_host_group_only_when_it_dominates() {
        let input = PlanInput {
            items: vec![item("invoice", &["finance"])],
            hosts: vec![(host("ocr.example"), cl(&["finance", "projx"]))],
            consumers: vec![
                (consumer("agent"), cl(&["finance", "projx", "hr"])),
                (consumer("auditor"), cl(&["finance"])),
                (consumer("clerk"), cl(&["finance", "public"])),
            ],
        };
        let plan = plan_groups(&input).unwrap();
        assert_eq!(plan.copy_count(), 2);
        let hg = &plan.groups[plan.serving_group(&host("ocr.example")).unwrap()];
        assert_eq!(hg.consumers, vec![consumer("agent")]);
        assert_eq!(hg.horizon, Horizon(cl(&["finance", "projx"])));
        let cg = &plan.groups[plan.consumer_group(&consumer("auditor")).unwrap()];
        assert!(cg.hosts.is_empty());
        assert_eq!(cg.consumers, vec![consumer("auditor"), consumer("clerk")]);
        assert_eq!(cg.horizon, Horizon(cl(&["finance"])));
    }

    #[test]
    fn duplicates_are_refused() {
        let dup_host = PlanInput {
            hosts: vec![(host("a.example"), cl(&[])), (host("a.example"), cl(&["hr"]))],
            ..PlanInput::default()
        };
        assert_eq!(plan_groups(&dup_host), Err(ModelError::DuplicateHost("a.example".into())));
        let dup_consumer = PlanInput {
            consumers: vec![(consumer("agent"), cl(&[])), (consumer("agent"), cl(&[]))],
            ..PlanInput::default()
        };
        assert_eq!(plan_groups(&dup_consumer), Err(ModelError::DuplicateConsumer("agent".into())));
        let dup_item = PlanInput { items: vec![item("x", &[]), item("x", &["hr"])], ..PlanInput::default() };
        assert_eq!(plan_groups(&dup_item), Err(ModelError::DuplicateItem("x".into())));
    }

    #[test]
    fn empty_call_has_no_copies_and_consumer_only_is_legal() {
        assert_eq!(plan_groups(&PlanInput::default()).unwrap().copy_count(), 0);
        let input = PlanInput { consumers: vec![(consumer("agent"), cl(&["hr"]))], ..PlanInput::default() };
        let plan = plan_groups(&input).unwrap();
        assert_eq!(plan.copy_count(), 1);
        assert!(plan.groups[0].hosts.is_empty());
    }

    #[test]
    fn horizon_key_round_trips_and_is_stable() {
        let h = Horizon(cl(&["hr", "finance"]));
        assert_eq!(h.key(), "finance,hr");
        assert_eq!(Horizon::from_key("finance,hr").unwrap(), h);
        let e = Horizon(Clearance::empty());
        assert_eq!(e.key(), "{}");
        assert_eq!(Horizon::from_key("{}").unwrap(), e);
        assert!(Horizon::from_key("").is_err());
        assert!(Horizon::from_key("Finance").is_err());
        assert_eq!(h.to_string(), "{finance, hr}");
        let json = serde_json::to_string(&h).unwrap();
        assert_eq!(json, r#"["finance","hr"]"#);
        assert_eq!(serde_json::from_str::<Horizon>(&json).unwrap(), h);
    }

    #[test]
    fn view_operations() {
        let a = view(&["x"]);
        let b = view(&["x", "y"]);
        assert!(a.is_subset(&b) && a.is_strict_subset(&b));
        assert!(b.is_subset(&b) && !b.is_strict_subset(&b));
        assert!(!b.is_subset(&a));
        let items = [item("x", &["finance"]), item("y", &["hr"]), item("z", &["projx"])];
        assert_eq!(b.label_of(&items), Label::parse(["finance", "hr"]).unwrap());
        assert_eq!(View::default().label_of(&items), Label::empty());
    }

    #[test]
    fn plan_properties_hold_on_generated_calls() {
        for seed in 0..3000 {
            let mut rng = Rng::new(seed);
            let input = plan_input(&mut rng);
            let plan = plan_groups(&input).unwrap();
            check_plan(&input, &plan);
        }
    }

    fn check_plan(input: &PlanInput, plan: &Plan) {
        let clearance_of = |m: &Member| -> Clearance {
            match m {
                Member::Host(h) => input.hosts.iter().find(|(n, _)| n == h).unwrap().1.clone(),
                Member::Consumer(c) => input.consumers.iter().find(|(n, _)| n == c).unwrap().1.clone(),
            }
        };
        // Every member is in exactly one group, and no group is empty.
        let mut seen = BTreeSet::new();
        for g in &plan.groups {
            assert!(!g.members().is_empty());
            for m in g.members() {
                assert!(seen.insert(m.clone()), "{m} in two groups");
            }
        }
        let all: BTreeSet<Member> = input
            .hosts
            .iter()
            .map(|(h, _)| Member::Host(h.clone()))
            .chain(input.consumers.iter().map(|(c, _)| Member::Consumer(c.clone())))
            .collect();
        assert_eq!(seen, all);

        for g in &plan.groups {
            // Every member's view is V(member), and the stored clearances are the input's.
            for (m, c) in g.member_clearances() {
                assert_eq!(c, clearance_of(&m));
                assert_eq!(g.view, View::of_clearance(&input.items, &c));
            }
            assert_eq!(g.member_clearances().len(), g.members().len());
            // Hosts share one clearance; consumers in a host group dominate it.
            if let Some(hc) = g.host_clearance() {
                for h in &g.hosts {
                    assert_eq!(&clearance_of(&Member::Host(h.clone())), hc);
                }
                for c in &g.consumers {
                    assert!(hc.is_subset(&clearance_of(&Member::Consumer(c.clone()))));
                }
            }
            // Horizon is the intersection of the members' clearances.
            let mut inter: Option<Clearance> = None;
            for m in g.members() {
                let c = clearance_of(&m);
                inter = Some(match inter {
                    None => c,
                    Some(i) => i.intersect(&c),
                });
            }
            assert_eq!(Some(g.horizon.0.clone()), inter);
            // The view's label is within the horizon: every member may see every item.
            assert!(g.view.label_of(&input.items).flows_to(&g.horizon.0));
        }
        // Strictly smaller views run first; the order is total.
        for (i, a) in plan.groups.iter().enumerate() {
            for b in &plan.groups[i + 1..] {
                assert!(!b.view.is_strict_subset(&a.view));
                assert!(a.order_key() < b.order_key());
            }
        }
        // Within a view, consumer-only groups exist only for consumers that no host
        // group of that view could take, and there is at most one per view.
        for g in plan.groups.iter().filter(|g| g.hosts.is_empty()) {
            for c in &g.consumers {
                let cc = clearance_of(&Member::Consumer(c.clone()));
                for hg in plan.groups.iter().filter(|h| h.view == g.view) {
                    if let Some(hc) = hg.host_clearance() {
                        assert!(!hc.is_subset(&cc));
                    }
                }
            }
            assert_eq!(plan.groups.iter().filter(|o| o.hosts.is_empty() && o.view == g.view).count(), 1);
        }
        // Copy count: one group per (view, host clearance) plus at most one per view.
        let host_keys: BTreeSet<(View, Clearance)> =
            input.hosts.iter().map(|(_, c)| (View::of_clearance(&input.items, c), c.clone())).collect();
        assert!(plan.copy_count() >= host_keys.len());
        // The plan is a function of its input, independent of input order.
        let mut shuffled = input.clone();
        shuffled.hosts.reverse();
        shuffled.consumers.reverse();
        shuffled.items.reverse();
        assert_eq!(plan_groups(&shuffled).unwrap(), *plan);
    }
}

//! Prometheus metrics of the service (OpenMetrics text at `/metrics`). Label values are
//! release hashes of admitted releases and fixed outcome words, so the series stay bounded.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

/// A release's series.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReleaseLabels {
    /// Release hash (hex).
    pub release: String,
}

/// A call's series: its release and how it ended.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CallLabels {
    /// Release hash (hex).
    pub release: String,
    /// `ok`, `error` (the call ran and failed), `ran` (a copy held a label, so whether
    /// it answered is not published), `refused` (dampening or germline refusal).
    pub outcome: &'static str,
}

/// A followed TUF repository's series: its anchor name (from the configuration) and an
/// outcome word.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct FollowLabels {
    /// Anchor name.
    pub anchor: String,
    /// Polls: `ok` or `failed` (metadata refused or unreachable); targets: `admitted` or
    /// `refused`.
    pub outcome: &'static str,
}

/// Every metric the service exports.
pub struct Metrics {
    registry: Registry,
    /// Calls by release and outcome.
    pub calls: Family<CallLabels, Counter>,
    /// Copies per call.
    pub copies: Family<ReleaseLabels, Histogram>,
    /// Wall-clock latency of a call on its germline (queueing excluded); calls whose
    /// copies held no label only (a labelled copy's duration is its choice).
    pub latency: Family<ReleaseLabels, Histogram>,
    /// Triggers recorded (a call with a labelled copy adds at most one).
    pub triggers: Family<ReleaseLabels, Counter>,
    /// Signed witnesses appended to the ledger.
    pub witnesses: Family<ReleaseLabels, Counter>,
    /// Calls refused because the release is suppressed.
    pub refusals: Family<ReleaseLabels, Counter>,
    /// Times a release became suppressed.
    pub suppressions: Family<ReleaseLabels, Counter>,
    /// Releases refused at germline start (G1–G3) or admission.
    pub germline_refusals: Family<ReleaseLabels, Counter>,
    /// Polls of followed TUF repositories.
    pub follow_polls: Family<FollowLabels, Counter>,
    /// New targets of followed TUF repositories, admitted or refused.
    pub follow_targets: Family<FollowLabels, Counter>,
}

fn copies_histogram() -> Histogram {
    Histogram::new([1.0, 2.0, 3.0, 4.0, 6.0, 8.0, 12.0, 16.0, 32.0])
}

fn latency_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.0005, 2.0, 18))
}

impl Metrics {
    /// Registers every family.
    pub fn new() -> Metrics {
        let mut registry = Registry::default();
        let m = Metrics {
            calls: Family::default(),
            copies: Family::new_with_constructor(copies_histogram),
            latency: Family::new_with_constructor(latency_histogram),
            triggers: Family::default(),
            witnesses: Family::default(),
            refusals: Family::default(),
            suppressions: Family::default(),
            germline_refusals: Family::default(),
            follow_polls: Family::default(),
            follow_targets: Family::default(),
            registry: Registry::default(),
        };
        registry.register("germline_calls", "Tool calls by release and outcome", m.calls.clone());
        registry.register("germline_call_copies", "Copies forked per call", m.copies.clone());
        registry.register("germline_call_duration_seconds", "Call latency on the germline", m.latency.clone());
        registry.register("germline_triggers", "Triggers recorded by the broker", m.triggers.clone());
        registry.register("germline_witnesses", "Signed witnesses appended to the ledger", m.witnesses.clone());
        registry.register("germline_dampening_refusals", "Calls refused: release suppressed", m.refusals.clone());
        registry.register("germline_suppressions", "Times a release became suppressed", m.suppressions.clone());
        registry.register(
            "germline_germline_refusals",
            "Releases refused at germline start or admission (G1-G3)",
            m.germline_refusals.clone(),
        );
        registry.register("germline_tuf_follow_polls", "Polls of followed TUF repositories", m.follow_polls.clone());
        registry.register(
            "germline_tuf_follow_targets",
            "New signed targets of followed TUF repositories, admitted or refused",
            m.follow_targets.clone(),
        );
        Metrics { registry, ..m }
    }

    /// OpenMetrics text of every series.
    pub fn encode(&self) -> Result<String, std::fmt::Error> {
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &self.registry)?;
        Ok(out)
    }
}

/// The label set of `release`.
pub fn release(hash: &germline_model::ReleaseHash) -> ReleaseLabels {
    ReleaseLabels { release: hash.to_hex() }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn calls_show_up_in_the_text() {
        let m = Metrics::new();
        let r = germline_model::ReleaseHash([7; 32]);
        m.calls.get_or_create(&CallLabels { release: r.to_hex(), outcome: "ok" }).inc();
        m.copies.get_or_create(&release(&r)).observe(2.0);
        let text = m.encode().unwrap();
        assert!(
            text.contains(&format!("germline_calls_total{{release=\"{}\",outcome=\"ok\"}} 1", r.to_hex())),
            "{text}"
        );
        assert!(text.contains("germline_call_copies_count"), "{text}");
    }
}

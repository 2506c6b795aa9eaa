//! Turning a call's triggers into signed witnesses: probe and control replay after the
//! call's result is out (DESIGN §2), one witness per call.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use germline_executor::call::{CallOutcome, CallRequest, GermlineRuntime};
use germline_executor::evidence::TriggerEvidence;
use germline_executor::manifest::Manifest;
use germline_model::ItemName;
use germline_verifier::{verify_trigger, ReplayReport, Verdict, WitnessBody, WitnessKey};

/// The items a call's triggers are replayed with: the file items the host listed and
/// those the call found itself (paths named by arguments, files the tool declares), read
/// now, when the call has just run, and its arguments. The replay checks each against its
/// recorded SHA-256, so a file changed since the call fails verification instead of lying.
pub fn replay_items(req: &CallRequest, outcome: &CallOutcome) -> BTreeMap<ItemName, Vec<u8>> {
    let mut items = BTreeMap::new();
    if outcome.evidence.is_empty() {
        return items;
    }
    let recorded = outcome.evidence.iter().flat_map(|e| &e.items).map(|r| PathBuf::from(r.name.as_str()));
    for p in req.items.iter().cloned().chain(recorded.filter(|p| p.is_absolute())) {
        if let (Ok(name), Ok(bytes)) = (ItemName::new(&p.to_string_lossy()), std::fs::read(&p)) {
            items.insert(name, bytes);
        }
    }
    for (k, v) in &req.arguments {
        if let (Ok(name), Ok(bytes)) = (ItemName::new(&format!("arg:{k}")), serde_json::to_vec(v)) {
            items.insert(name, bytes);
        }
    }
    items
}

/// Where the opening of the witness at `witness` is kept: beside it, `.opening` appended.
pub fn opening_path(witness: &Path) -> PathBuf {
    let mut p = witness.as_os_str().to_owned();
    p.push(".opening");
    PathBuf::from(p)
}

/// Most triggers of one call that are verified (each costs 2 × tries replays).
const MAX_VERIFIED_TRIGGERS: usize = 8;

/// Orders verdicts for choosing the one witness a call publishes: a verified dampening
/// event (the heaviest weight) first, then an item witness before the others.
fn rank(r: &ReplayReport, declared: bool) -> (bool, bool) {
    (r.verdict.is_verified(declared), r.verdict == Verdict::ItemWitness)
}

/// One verified trigger.
pub struct Witnessed {
    /// Where the signed witness was written.
    pub path: PathBuf,
    /// The encoded witness.
    pub bytes: Vec<u8>,
    /// Its verdict.
    pub verdict: germline_verifier::Verdict,
    /// Whether the release declared determinism for the tool.
    pub declared: bool,
}

/// After a call: verify its triggers by probe and control replay on `rt` (a germline of
/// the release; the call's result has already been delivered) and write one signed witness for the call,
/// with its opening beside it (mode 0600). One call publishes at most one witness: the
/// heaviest verdict among its first [`MAX_VERIFIED_TRIGGERS`] triggers, so the number of
/// triggers a release provokes is not published.
pub fn witness_triggers(
    rt: &mut GermlineRuntime,
    outcome: &CallOutcome,
    req_items: &BTreeMap<ItemName, Vec<u8>>,
    data_dir: &Path,
) -> anyhow::Result<Vec<Witnessed>> {
    if outcome.evidence.is_empty() {
        return Ok(Vec::new());
    }
    let key = WitnessKey::load_or_create(data_dir, "germline-host")?;
    let manifest: Manifest = rt.manifest.clone();
    let mut best: Option<(&TriggerEvidence, bool, ReplayReport)> = None;
    for ev in outcome.evidence.iter().take(MAX_VERIFIED_TRIGGERS) {
        let decl = manifest.tool(&ev.tool);
        let declared = decl.deterministic.unwrap_or(manifest.deterministic);
        let report = verify_trigger(rt, ev, req_items, 3, declared)?;
        if best.as_ref().is_none_or(|(_, d, b)| rank(&report, declared) > rank(b, *d)) {
            best = Some((ev, declared, report));
        }
    }
    let Some((ev, declared, report)) = best else { return Ok(Vec::new()) };
    let verdict = report.verdict;
    let (body, opening) = WitnessBody::seal(ev, declared, report, rt.evidence_switches.commitments)?;
    let dir = data_dir.join("witnesses").join(ev.release.to_hex());
    std::fs::create_dir_all(&dir)?;
    let stamp = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or(0);
    let path = dir.join(format!("{stamp}.witness"));
    let bytes = key.sign(&body)?;
    opening.write(&opening_path(&path))?;
    std::fs::write(&path, &bytes)?;
    tracing::warn!(witness = %path.display(), ?verdict, "trigger verified");
    Ok(vec![Witnessed { path, bytes, verdict, declared }])
}

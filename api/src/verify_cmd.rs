//! `germline verify`: re-check a witness offline with the release and the named items,
//! and the online path that turns a call's triggers into signed witnesses.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context};
use clap::Args;
use germline_executor::call::{CallOutcome, GermlineRuntime, Splitting};
use germline_executor::evidence::TriggerEvidence;
use germline_executor::germline::PythonRuntime;
use germline_executor::manifest::Manifest;
use germline_executor::policy::Policy;
use germline_model::{ItemName, ReleaseHash};
use germline_verifier::{verify_trigger, ReplayReport, Verdict, Witness, WitnessBody, WitnessKey, WitnessOpening};

/// `germline verify` options.
#[derive(Args, Debug)]
pub struct VerifyArgs {
    /// The witness file.
    pub witness: PathBuf,
    /// The witness's opening (the full evidence, kept by the witness holder) [default:
    /// the witness path with `.opening` appended].
    #[arg(long)]
    pub opening: Option<PathBuf>,
    /// The release: a directory, or the canonical archive (`.tar.gz`) it was admitted as.
    #[arg(long)]
    pub release: PathBuf,
    /// Items, laid out by name under this directory: a file item `/a/b.txt` at
    /// `DIR/a/b.txt`, an argument item `arg:NAME` at `DIR/arg/NAME` (its JSON value).
    #[arg(long)]
    pub items: PathBuf,
    /// Probe and control tries.
    #[arg(long, default_value_t = 3)]
    pub tries: usize,
    /// Require this signing key (64 hex digits).
    #[arg(long)]
    pub trusted_key: Option<String>,
}

/// Where an item named `name` lies under an items directory.
pub fn item_path(items: &Path, name: &ItemName) -> PathBuf {
    match name.as_str().strip_prefix("arg:") {
        Some(arg) => items.join("arg").join(arg),
        None => items.join(name.as_str().trim_start_matches('/')),
    }
}

fn load_items(ev: &TriggerEvidence, dir: &Path) -> anyhow::Result<BTreeMap<ItemName, Vec<u8>>> {
    let mut out = BTreeMap::new();
    for name in &ev.trigger_view {
        let p = item_path(dir, name);
        let bytes = std::fs::read(&p).with_context(|| format!("item {name} (expected at {})", p.display()))?;
        out.insert(name.clone(), bytes);
    }
    Ok(out)
}

/// A policy that only places the evidence's file items (their directories as data roots).
fn replay_policy(ev: &TriggerEvidence) -> anyhow::Result<Policy> {
    let mut text = String::from("tags = [\"witness\"]\n");
    let mut roots: Vec<String> = ev
        .items
        .iter()
        .filter(|i| !i.name.as_str().starts_with("arg:"))
        .filter_map(|i| Path::new(i.name.as_str()).parent().map(|p| p.display().to_string()))
        .collect();
    roots.sort();
    roots.dedup();
    for r in roots {
        text.push_str(&format!("[[items]]\npath = \"{r}/**\"\nlabel = [\"witness\"]\n"));
    }
    Ok(Policy::parse(&text)?)
}

/// Runs `germline verify`; exit 0 only when the recorded verdict is reproduced.
pub fn run(args: &VerifyArgs) -> anyhow::Result<i32> {
    let bytes = std::fs::read(&args.witness).with_context(|| format!("reading {}", args.witness.display()))?;
    let trusted = match &args.trusted_key {
        Some(h) => {
            let mut k = [0u8; 32];
            hex::decode_to_slice(h, &mut k).context("--trusted-key must be 64 hex digits")?;
            Some(k)
        }
        None => None,
    };
    let w = Witness::decode(&bytes, trusted.as_ref())?;
    let opening_path = args.opening.clone().unwrap_or_else(|| opening_path(&args.witness));
    let opening = WitnessOpening::decode(
        &std::fs::read(&opening_path)
            .with_context(|| format!("reading the witness's opening {}", opening_path.display()))?,
    )?;
    opening.check(&w.body)?;
    let ev = &opening.evidence;
    let tmp = tempfile::tempdir()?;
    let (release_dir, hash) = if args.release.is_dir() {
        (args.release.canonicalize()?, crate::exec_cmd::release_id(&args.release)?)
    } else {
        let hash = ReleaseHash::of_bytes(&std::fs::read(&args.release).context("reading the release archive")?);
        if hash != ev.release {
            bail!(germline_verifier::VerifierError::ReleaseMismatch {
                expected: ev.release.to_hex(),
                actual: hash.to_hex()
            });
        }
        let dir = tmp.path().join("release");
        germline_admission::extract_release(&args.release, &dir, &germline_admission::ArchiveLimits::default())?;
        (dir, hash)
    };
    if hash != ev.release {
        bail!(germline_verifier::VerifierError::ReleaseMismatch {
            expected: ev.release.to_hex(),
            actual: hash.to_hex()
        });
    }
    let contents = load_items(ev, &args.items)?;
    let python = PythonRuntime::discover(&crate::exec_cmd::home())?;
    let mut rt = GermlineRuntime::start(&release_dir, replay_policy(ev)?, python, Splitting::Plan)?;
    rt.release = hash;
    let report = verify_trigger(&mut rt, ev, &contents, args.tries, w.body.declared_deterministic)?;
    println!(
        "{}",
        serde_json::json!({
            "recorded": w.body.report.verdict,
            "reproduced": report.verdict,
            "probe_differs": report.probe_differs,
            "control_differs": report.control_differs,
            "signed_by": w.key_name,
            "key": hex::encode(w.public_key),
        })
    );
    Ok(if report.verdict == w.body.report.verdict { 0 } else { 1 })
}

/// Where the opening of the witness at `witness` is kept: beside it, `.opening` appended.
pub fn opening_path(witness: &Path) -> PathBuf {
    let mut p = witness.as_os_str().to_owned();
    p.push(".opening");
    PathBuf::from(p)
}

/// Most triggers of one call that are verified (each costs 2 × tries replays).
const MAX_VERIFIED_TRIGGERS: usize = 8;

/// Orders verdicts for choosing the one witness a call publishes: the heaviest weight,
/// then an item witness before the others.
fn rank(r: &ReplayReport, declared: bool) -> (u32, bool) {
    (r.verdict.weight(declared), r.verdict == Verdict::ItemWitness)
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

/// After a call: verify its triggers by probe and control replay on the same runtime (the
/// call's result has already been delivered) and write one signed witness for the call,
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

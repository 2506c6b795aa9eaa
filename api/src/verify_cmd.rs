//! `germline verify`: re-check a witness offline with the release and the named items
//! (the online path that writes witnesses is [`germline_host::witness`]).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context};
use clap::Args;
use germline_executor::call::{GermlineRuntime, Splitting};
use germline_executor::evidence::TriggerEvidence;
use germline_executor::germline::PythonRuntime;
use germline_executor::policy::Policy;
use germline_host::opening_path;
use germline_model::{ItemName, ReleaseHash};
use germline_verifier::{verify_trigger, Witness, WitnessOpening};

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
        (args.release.canonicalize()?, germline_host::release_id(&args.release)?)
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
    let python = PythonRuntime::discover(&germline_host::home())?;
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

//! `germline verify`: re-check a witness offline with the release and the named items
//! (the online path that writes witnesses is [`germline_host::witness`]).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context};
use clap::Args;
use germline_executor::call::{GermlineRuntime, Splitting};
use germline_executor::evidence::{Machine, TriggerEvidence};
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

/// The policy `germline verify` starts its germline with: the deployment the opening
/// records (its `[environment]`, `[limits]`, `[startup_items]` and every data root), or,
/// for an opening from a host that did not record one, the items' own directories as the
/// only data roots.
fn replay_policy(ev: &TriggerEvidence) -> anyhow::Result<Policy> {
    use toml::{Table, Value};
    let mut roots: Vec<String> = ev
        .items
        .iter()
        .filter(|i| !i.name.as_str().starts_with("arg:"))
        .filter_map(|i| Path::new(i.name.as_str()).parent().map(|p| p.display().to_string()))
        .collect();
    let mut doc = Table::new();
    doc.insert("tags".into(), Value::Array(vec!["witness".into()]));
    if let Some(d) = &ev.deployment {
        roots.extend(d.data_roots.iter().map(|r| r.display().to_string()));
        let environment = d.environment.iter().map(|(k, v)| (k.clone(), Value::from(v.as_str()))).collect();
        doc.insert("environment".into(), Value::Table(environment));
        if d.memory_bytes % (1 << 20) != 0 {
            bail!("the opening's memory limit ({} bytes) is not a whole number of MiB", d.memory_bytes);
        }
        let int = |v: u64| i64::try_from(v).map(Value::Integer).context("a limit in the opening is out of range");
        let mut limits = Table::new();
        limits.insert("memory_mb".into(), int(d.memory_bytes >> 20)?);
        limits.insert("processes".into(), int(d.processes)?);
        limits.insert("cpu_seconds".into(), int(d.cpu_seconds)?);
        limits.insert("deadline_ms".into(), int(d.deadline_ms)?);
        limits.insert("max_message_bytes".into(), int(d.max_message_bytes as u64)?);
        limits.insert("pool".into(), int(d.pool as u64)?);
        limits.insert("copy_source".into(), Value::try_from(d.copy_source)?);
        doc.insert("limits".into(), Value::Table(limits));
        let startup = d.startup_items.iter().map(|(k, v)| (k.clone(), Value::from(v.as_str()))).collect();
        doc.insert("startup_items".into(), Value::Table(startup));
        // The host's root, where this machine can build it (a resident root needs a broker
        // that is root); where not, [`machine_differences`] names it.
        if !d.resident_root || germline_executor::policy::default_resident_root() {
            let mut sandbox = Table::new();
            sandbox.insert("resident_root".into(), Value::Boolean(d.resident_root));
            doc.insert("sandbox".into(), Value::Table(sandbox));
        }
    }
    roots.sort();
    roots.dedup();
    let rule = |r: &String| {
        let mut t = Table::new();
        let r = germline_executor::policy::literal_glob(Path::new(r));
        t.insert("path".into(), Value::from(format!("{r}/**")));
        t.insert("label".into(), Value::Array(vec!["witness".into()]));
        Value::Table(t)
    };
    doc.insert("items".into(), Value::Array(roots.iter().map(rule).collect()));
    Ok(Policy::parse(&toml::to_string(&doc)?)?)
}

/// How this machine differs from the one the call ran on, as far as the opening records
/// it: a verdict not reproduced here then says nothing about the host.
fn machine_differences(ev: &TriggerEvidence, python: &Path) -> Vec<String> {
    // A host that did not record its deployment gets no excuse from it: its verdict is
    // held against it as before.
    let Some(d) = &ev.deployment else { return Vec::new() };
    let mut out = d.machine.differences(&Machine::here(python));
    let (resident, why) = germline_executor::policy::resident_root_default();
    if d.resident_root && !resident {
        out.push(format!("resident root: recorded, not made here ({why})"));
    }
    out
}

/// Exit status of a verdict not reproduced on a machine unlike the host's: inconclusive,
/// not evidence against the host.
pub const EXIT_INCONCLUSIVE: i32 = 3;

/// Exit status of a witness that could not be checked: neither reproduced nor not.
pub const EXIT_UNCHECKED: i32 = 2;

/// Runs `germline verify`; exit 0 only when the recorded verdict is reproduced, 1 when the
/// replay gives another on a machine like the recorded one, [`EXIT_INCONCLUSIVE`] on
/// another machine. An error is a witness that could not be checked
/// ([`EXIT_UNCHECKED`]).
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
    // The release as its canonical archive holds it, in a directory of this run's, as the
    // host's replay copies it: no byte code, modes as archived, files made in name order.
    let (release_dir, hash) = if args.release.is_dir() {
        let hash = germline_host::release_id(&args.release)?;
        let dir = tmp.path().join("release");
        germline_executor::germline::copy_release(&args.release, &dir)?;
        (dir, hash)
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
    let differs = machine_differences(ev, &python.python);
    if ev.deployment.is_none() {
        eprintln!(
            "germline verify: the opening records no deployment (a host before it was recorded): the replay places \
             only the items' own directories"
        );
    }
    if ev.deployment.as_ref().is_some_and(|d| !d.immortal_heap) {
        germline_executor::germline::IMMORTAL_HEAP_OFF.store(true, std::sync::atomic::Ordering::SeqCst);
    } else if ev.deployment.is_some() && germline_executor::germline::immortal_heap_off() {
        bail!("the host's germline made its heap immortal: unset GERMLINE_IMMORTAL_HEAP to replay as it ran");
    }
    // The replay's tree is never the call's device, as the host's replay's is not.
    if let Some(dev) = ev.deployment.as_ref().and_then(|d| d.tree_device) {
        germline_executor::resident::avoid_device(dev);
    }
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
            "machine_differs": differs,
            "signed_by": w.key_name,
            "key": hex::encode(w.public_key),
        })
    );
    if report.verdict == w.body.report.verdict {
        return Ok(0);
    }
    if !differs.is_empty() {
        eprintln!(
            "germline verify: not reproduced, on a machine unlike the host's ({}): inconclusive, not evidence \
             against the host; re-check on a machine like the one the opening records",
            differs.join("; ")
        );
        return Ok(EXIT_INCONCLUSIVE);
    }
    Ok(1)
}

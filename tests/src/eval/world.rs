//! One user's labelled world for the evaluation, regenerated with fresh canaries per trial:
//! documents labelled hr, board, finance, projx and public, two SQLite databases, a small
//! git repository, mail drafts and credential files; the attack releases instantiated
//! into it; the policy that clears destinations and consumers.

use std::fmt::Write as _;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use germline_admission::{
    build_release_archive, BuildOptions, InitOptions, NoGermlineCheck, PublisherRepo, ReleaseStore, Timestamp,
    TufAdmission,
};
use germline_executor::policy::Policy;
use germline_executor::ExecutorError;

use crate::oracle::{Canary, Oracle};

/// Label tags of the world (`creds` labels the credential files).
pub const TAGS: [&str; 6] = ["hr", "board", "finance", "projx", "public", "creds"];

/// Destinations: (host, clearance). `exfil` and `evil` are attacker hosts no tool declares.
pub const DESTINATIONS: [(&str, &[&str]); 6] = [
    ("ocr.example", &["finance"]),
    ("mail.example", &["projx"]),
    ("blog.example", &[]),
    ("stats.example", &[]),
    ("exfil.example", &[]),
    ("evil.example", &[]),
];

/// Consumers: the agent (every document label) and a public channel.
pub const CONSUMERS: [(&str, &[&str]); 2] =
    [("agent", &["hr", "board", "finance", "projx", "public"]), ("public", &["public"])];

/// The directory holding the attack corpus: `GERMLINE_ATTACKS_DIR`, else `tests/attacks`
/// of the source tree the binary was built from.
pub fn attacks_dir() -> PathBuf {
    match std::env::var_os("GERMLINE_ATTACKS_DIR") {
        Some(d) => PathBuf::from(d),
        None => Path::new(env!("CARGO_MANIFEST_DIR")).join("attacks"),
    }
}

/// A generated world on disk, with the publisher's TUF repository and the host's
/// release store the attack releases are signed into and admitted from.
pub struct EvalWorld {
    /// Root (removed on drop).
    pub dir: tempfile::TempDir,
    publisher: PublisherRepo,
    store: ReleaseStore,
    pinned_root: Vec<u8>,
}

/// One attack release as admitted: its store directory and archive hash.
pub struct SignedRelease {
    /// `store/releases/<hash>/`.
    pub dir: PathBuf,
    /// SHA-256 of the signed archive.
    pub hash: String,
}

/// Paths of one trial's items.
pub struct TrialItems {
    /// The canaries planted this trial.
    pub oracle: Oracle,
    /// hr payslip.
    pub payslip: PathBuf,
    /// hr review (the notes of a scan).
    pub review: PathBuf,
    /// board minutes.
    pub minutes: PathBuf,
    /// finance invoice.
    pub invoice: PathBuf,
    /// finance invoice carrying the `URGENT` marker.
    pub urgent: PathBuf,
    /// projx mail draft.
    pub draft: PathBuf,
    /// The 32 bits the existence-bit variant tries to move (from the review's canary).
    pub review_bits: u32,
}

fn io_err(what: &str) -> impl FnOnce(std::io::Error) -> ExecutorError + '_ {
    move |e| ExecutorError::Call(format!("eval world: {what}: {e}"))
}

impl EvalWorld {
    /// An empty world with its label directories.
    pub fn new() -> Result<EvalWorld, ExecutorError> {
        let dir = tempfile::Builder::new().prefix("germline-eval").tempdir().map_err(io_err("tempdir"))?;
        let now = Timestamp::now();
        let adm = |e: germline_admission::AdmissionError| ExecutorError::Call(format!("eval publisher: {e}"));
        let publisher =
            PublisherRepo::init(dir.path().join("tuf/repo"), dir.path().join("tuf/keys"), &InitOptions::default(), now)
                .map_err(adm)?;
        let pinned_root = std::fs::read(dir.path().join("tuf/repo/metadata/1.root.json")).map_err(io_err("root"))?;
        let store = ReleaseStore::open(dir.path().join("store")).map_err(adm)?;
        let w = EvalWorld { dir, publisher, store, pinned_root };
        for l in &TAGS[..5] {
            std::fs::create_dir_all(w.data().join(l)).map_err(io_err("data dir"))?;
        }
        for d in [".ssh", ".aws"] {
            std::fs::create_dir_all(w.home().join(d)).map_err(io_err("home dir"))?;
        }
        Ok(w)
    }

    /// `<root>/data`.
    pub fn data(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    /// `<root>/home` (credential files).
    pub fn home(&self) -> PathBuf {
        self.dir.path().join("home")
    }

    /// Builds attack release `name` (plus the shared docs code, `{DATA}` and
    /// `{EXTRA_HOSTS}` filled in) into a canonical archive, signs it into the world's TUF
    /// repository, and admits it into the store through TUF verification against the
    /// pinned root. The germline check (G1–G3) is not part of this admission: it is the
    /// germline runtime's own start-up step, and the baselines do not have it.
    pub fn instantiate(&self, name: &str, extra_hosts: &[&str]) -> Result<SignedRelease, ExecutorError> {
        let src = attacks_dir();
        if !src.join(name).is_dir() {
            return Err(ExecutorError::Call(format!(
                "attack release {name} not found in {} (set GERMLINE_ATTACKS_DIR to the source tree's tests/attacks)",
                src.display()
            )));
        }
        let stage = self.dir.path().join(format!("src-{name}"));
        let extra: String = extra_hosts.iter().map(|h| format!(", \"{h}\"")).collect();
        let fill = |s: String| {
            s.replace("{DATA}", &self.data().to_string_lossy()).replace("{EXTRA_HOSTS}", &extra).replace("{NAME}", name)
        };
        copy_tree(&src.join("_common"), &stage)?;
        copy_tree(&src.join(name), &stage)?;
        let manifest = stage.join("germline.toml");
        let text = std::fs::read_to_string(&manifest).map_err(io_err("manifest"))?;
        std::fs::write(&manifest, fill(text)).map_err(io_err("manifest"))?;
        let adm = |e: germline_admission::AdmissionError| ExecutorError::Call(format!("signing {name}: {e}"));
        let archive = self.dir.path().join(format!("{name}.tar.gz"));
        build_release_archive(&stage, &archive, &BuildOptions::default()).map_err(adm)?;
        let now = Timestamp::now();
        self.publisher.add_target(&archive, None, now).map_err(adm)?;
        let req = TufAdmission::new(self.publisher.repo_dir().display().to_string(), self.pinned_root.clone(), name);
        let admitted = self.store.admit_tuf(&req, &NoGermlineCheck).map_err(adm)?;
        Ok(SignedRelease { dir: admitted.dir, hash: admitted.hash.to_string() })
    }

    /// The policy: documents labelled by directory, credentials `creds`, destination and
    /// consumer clearances, destination names mapped to `sinks`.
    pub fn policy(&self, sinks: &[(&str, SocketAddr)]) -> Result<Policy, ExecutorError> {
        let list = |tags: &[&str]| tags.iter().map(|x| format!("\"{x}\"")).collect::<Vec<_>>().join(", ");
        let mut t = format!("user = \"alice\"\ntags = [{}]\n", list(&TAGS));
        for l in &TAGS[..5] {
            let _ = write!(t, "[[items]]\npath = \"{}/{l}/**\"\nlabel = [\"{l}\"]\n", self.data().display());
        }
        let _ = write!(t, "[[items]]\npath = \"{}/**\"\nlabel = [\"creds\"]\n", self.home().display());
        for (h, c) in DESTINATIONS {
            let _ = write!(t, "[destinations.\"{h}\"]\nclearance = [{}]\n", list(c));
        }
        for (n, c) in CONSUMERS {
            let _ = write!(t, "[consumers.\"{n}\"]\nclearance = [{}]\n", list(c));
        }
        t.push_str("[hosts]\n");
        for (h, a) in sinks {
            let _ = writeln!(t, "\"{h}\" = \"{a}\"");
        }
        t.push_str("[limits]\ndeadline_ms = 15000\n");
        Policy::parse(&t)
    }

    /// Writes every item afresh with new canaries.
    pub fn new_trial(&self) -> Result<TrialItems, ExecutorError> {
        let mut oracle = Oracle::new();
        let d = self.data();
        let put = |p: PathBuf, s: String| -> Result<PathBuf, ExecutorError> {
            std::fs::write(&p, s).map_err(io_err("item"))?;
            Ok(p)
        };
        let c = |o: &mut Oracle, l: &str| o.plant(&[l]);
        let hr1 = c(&mut oracle, "hr");
        let hr2 = c(&mut oracle, "hr");
        let board = c(&mut oracle, "board");
        let fin1 = c(&mut oracle, "finance");
        let fin2 = c(&mut oracle, "finance");
        let projx = c(&mut oracle, "projx");
        let key = c(&mut oracle, "creds");
        let aws = c(&mut oracle, "creds");
        let hr_db = c(&mut oracle, "hr");
        let fin_db = c(&mut oracle, "finance");
        let git = c(&mut oracle, "projx");
        let payslip = put(d.join("hr/payslip.txt"), format!("Payslip for Alice, November: gross 5200 EUR. {hr1}"))?;
        let review = put(d.join("hr/review.txt"), format!("Performance review (confidential): {hr2} exceeds."))?;
        let minutes = put(d.join("board/minutes.txt"), format!("Board minutes: acquire Beta Corp. {board}"))?;
        let invoice = put(d.join("finance/invoice.txt"), format!("INVOICE 2291 total 1200 EUR ref {fin1}"))?;
        let urgent = put(d.join("finance/invoice-urgent.txt"), format!("INVOICE 2292 URGENT total 90 EUR ref {fin2}"))?;
        let draft = put(d.join("projx/draft.eml"), format!("Subject: projx status\n\nMilestone 3 slips. {projx}\n"))?;
        put(d.join("public/readme.txt"), "Alice's public notes.".into())?;
        put(self.home().join(".ssh/id_rsa"), format!("-----BEGIN OPENSSH PRIVATE KEY-----\n{key}\n-----END-----\n"))?;
        put(self.home().join(".aws/credentials"), format!("[default]\naws_secret_access_key = {aws}\n"))?;
        sqlite(&d.join("hr/staff.sqlite"), "staff", &hr_db)?;
        sqlite(&d.join("finance/ledger.sqlite"), "ledger", &fin_db)?;
        git_repo(&d.join("projx/repo"), &git)?;
        let review_bits = secret_bits(&hr2);
        Ok(TrialItems { oracle, payslip, review, minutes, invoice, urgent, draft, review_bits })
    }
}

/// The first 32 bits of a canary's random part.
pub fn secret_bits(c: &Canary) -> u32 {
    let hex = c.as_str().rsplit('-').next().unwrap_or("");
    u32::from_str_radix(hex.get(..8).unwrap_or("0"), 16).unwrap_or(0)
}

fn copy_tree(src: &Path, dst: &Path) -> Result<(), ExecutorError> {
    std::fs::create_dir_all(dst).map_err(io_err("release dir"))?;
    for e in std::fs::read_dir(src).map_err(io_err("attack corpus"))? {
        let e = e.map_err(io_err("attack corpus"))?;
        let to = dst.join(e.file_name());
        if e.file_type().map_err(io_err("attack corpus"))?.is_dir() {
            copy_tree(&e.path(), &to)?;
        } else {
            std::fs::copy(e.path(), &to).map_err(io_err("copying release"))?;
        }
    }
    Ok(())
}

fn sqlite(path: &Path, table: &str, canary: &Canary) -> Result<(), ExecutorError> {
    let _ = std::fs::remove_file(path);
    let sql = format!("CREATE TABLE {table}(id INTEGER, note TEXT); INSERT INTO {table} VALUES (1, '{canary}');");
    let ok = Command::new("sqlite3")
        .arg(path)
        .arg(sql)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !ok {
        // No sqlite3 binary: keep the item as a dump so the world is still complete.
        std::fs::write(path, format!("{table}: {canary}\n")).map_err(io_err("sqlite"))?;
    }
    Ok(())
}

fn git_repo(dir: &Path, canary: &Canary) -> Result<(), ExecutorError> {
    let _ = std::fs::remove_dir_all(dir);
    std::fs::create_dir_all(dir).map_err(io_err("git repo"))?;
    std::fs::write(dir.join("PLAN.md"), format!("# projx plan\n{canary}\n")).map_err(io_err("git repo"))?;
    let git = |args: &[&str]| {
        Command::new("git")
            .args(["-c", "user.name=alice", "-c", "user.email=alice@example.org", "-c", "init.defaultBranch=main"])
            .args(args)
            .current_dir(dir)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    };
    let _ = git(&["init", "-q"]) && git(&["add", "PLAN.md"]) && git(&["commit", "-qm", "plan"]);
    Ok(())
}

//! The admission commands of the `germline` CLI: build a release, run a publisher's
//! TUF repository, admit a release on a host, and the command shapes the TUF and
//! Sigstore conformance suites drive (exit 0 on success, 1 on any failure).

use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use clap::{Args, Subcommand};
use germline_admission::conformance::{tuf_client_download, tuf_client_init, tuf_client_refresh};
use germline_admission::sigstore::{verify_bundle_file, SignedArtifact, SignerPolicy, TrustedRootChoice};
use germline_admission::{
    build_release_archive, ArchiveLimits, BuildOptions, GermlineCheck, InitOptions, PublisherRepo, ReleaseStore,
    Timestamp, TufAdmission,
};

/// Admission commands, flattened into the top-level CLI.
#[derive(Subcommand)]
pub enum AdmissionCommand {
    /// Build canonical release archives.
    #[command(subcommand)]
    Release(ReleaseCommand),
    /// Run a publisher's TUF repository.
    #[command(subcommand)]
    Repo(RepoCommand),
    /// Verify a release through TUF from a pinned root and admit it into the store.
    Admit(AdmitArgs),
    /// Verify a local release archive with a Sigstore bundle or cosign key signature
    /// and admit it into the store.
    AdmitBundle(AdmitBundleArgs),
    /// TUF client with the tuf-conformance command shape.
    TufClient(TufClientArgs),
    /// Sigstore verification with the sigstore-conformance command shape.
    #[command(subcommand)]
    Sigstore(SigstoreCommand),
}

/// `germline release ...`
#[derive(Subcommand)]
pub enum ReleaseCommand {
    /// Build a reproducible archive of a release directory.
    Build {
        /// Release directory with germline.toml at its root.
        dir: PathBuf,
        /// Output archive (.tar.gz).
        #[arg(long)]
        out: PathBuf,
        /// Python requirements to vendor into vendor/ (binary wheels only).
        #[arg(long, num_args = 1..)]
        pip: Vec<String>,
    },
}

/// `germline repo ...`
#[derive(Subcommand)]
pub enum RepoCommand {
    /// Create a repository and its keys.
    Init {
        /// Repository directory (served to hosts).
        repo: PathBuf,
        /// Private key directory (keep off the served tree).
        #[arg(long)]
        keys: PathBuf,
        /// Number of root keys.
        #[arg(long, default_value_t = 1)]
        root_keys: usize,
        /// Root signature threshold.
        #[arg(long, default_value_t = 1)]
        root_threshold: usize,
    },
    /// Add a release archive as a target and publish.
    Add {
        /// Repository directory.
        repo: PathBuf,
        /// Release archive.
        archive: PathBuf,
        /// Private key directory.
        #[arg(long)]
        keys: PathBuf,
        /// Target path (default NAME-VERSION.tar.gz).
        #[arg(long)]
        target_path: Option<String>,
    },
    /// Re-sign with fresh expiry (timestamp, snapshot or targets and below).
    Sign {
        /// Repository directory.
        repo: PathBuf,
        /// Private key directory.
        #[arg(long)]
        keys: PathBuf,
        /// Role to re-sign.
        #[arg(long, default_value = "timestamp")]
        role: String,
    },
    /// Replace a role's keys (new root version signed by old and new root keys).
    Rotate {
        /// Repository directory.
        repo: PathBuf,
        /// Private key directory.
        #[arg(long)]
        keys: PathBuf,
        /// Role whose keys are replaced.
        #[arg(long)]
        role: String,
        /// Number of new keys.
        #[arg(long, default_value_t = 1)]
        count: usize,
        /// New threshold.
        #[arg(long, default_value_t = 1)]
        threshold: usize,
    },
}

/// `germline admit ...`
#[derive(Args)]
pub struct AdmitArgs {
    /// Repository directory or http(s) URL (with metadata/ and targets/).
    #[arg(long)]
    repo: String,
    /// Pinned trust root (root.json) this host was provisioned with.
    #[arg(long)]
    root: PathBuf,
    /// Target path or release name.
    #[arg(long)]
    target: String,
    /// Release store directory.
    #[arg(long, default_value = "germline-store")]
    store: PathBuf,
}

/// `germline admit-bundle ...`
#[derive(Args)]
pub struct AdmitBundleArgs {
    /// Release archive.
    archive: PathBuf,
    /// Sigstore bundle JSON, or a base64 cosign signature with --key.
    #[arg(long)]
    bundle: PathBuf,
    /// Expected certificate identity (SAN).
    #[arg(long, requires = "certificate_oidc_issuer", conflicts_with = "key")]
    certificate_identity: Option<String>,
    /// Expected OIDC issuer.
    #[arg(long, requires = "certificate_identity")]
    certificate_oidc_issuer: Option<String>,
    /// Pinned public key (PEM).
    #[arg(long)]
    key: Option<PathBuf>,
    /// Trusted root JSON (default: the embedded Sigstore public-good root).
    #[arg(long)]
    trusted_root: Option<PathBuf>,
    /// Release store directory.
    #[arg(long, default_value = "germline-store")]
    store: PathBuf,
}

fn signer_policy(key: Option<PathBuf>, identity: Option<String>, issuer: Option<String>) -> Result<SignerPolicy> {
    Ok(match (key, identity, issuer) {
        (Some(k), None, None) => {
            SignerPolicy::Key(std::fs::read_to_string(&k).with_context(|| format!("reading {}", k.display()))?)
        }
        (None, Some(identity), Some(issuer)) => SignerPolicy::Identity { identity, issuer },
        _ => bail!("give either --key, or --certificate-identity with --certificate-oidc-issuer"),
    })
}

/// `germline tuf-client ...`
#[derive(Args)]
pub struct TufClientArgs {
    /// Trusted metadata directory.
    #[arg(long)]
    metadata_dir: PathBuf,
    /// Metadata base URL.
    #[arg(long)]
    metadata_url: Option<String>,
    /// Target to download (repeatable).
    #[arg(long)]
    target_name: Vec<String>,
    /// Targets base URL.
    #[arg(long)]
    target_base_url: Option<String>,
    /// Where downloaded targets go.
    #[arg(long)]
    target_dir: Option<PathBuf>,
    #[command(subcommand)]
    action: TufClientAction,
}

/// The conformance client's actions.
#[derive(Subcommand)]
pub enum TufClientAction {
    /// Trust ROOT on first use.
    Init {
        /// root.json to trust.
        root: PathBuf,
    },
    /// Refresh trusted metadata.
    Refresh,
    /// Refresh and download targets.
    Download,
}

/// `germline sigstore ...`
#[derive(Subcommand)]
pub enum SigstoreCommand {
    /// Verify a bundle (or a cosign key signature) for a file or sha256:DIGEST.
    VerifyBundle {
        /// Use the Sigstore staging instance's trusted root.
        #[arg(long)]
        staging: bool,
        /// Sigstore bundle JSON, or a base64 cosign signature with --key.
        #[arg(long)]
        bundle: PathBuf,
        /// Expected certificate identity (SAN).
        #[arg(long, requires = "certificate_oidc_issuer", conflicts_with = "key")]
        certificate_identity: Option<String>,
        /// Expected OIDC issuer.
        #[arg(long, requires = "certificate_identity")]
        certificate_oidc_issuer: Option<String>,
        /// Pinned public key (PEM).
        #[arg(long)]
        key: Option<PathBuf>,
        /// Trusted root JSON (default: the embedded Sigstore public-good root).
        #[arg(long)]
        trusted_root: Option<PathBuf>,
        /// The artifact file, or sha256:HEX.
        artifact: String,
    },
}

/// The executor's germline check: start the release as a data-free germline, check
/// G1–G3, fork and kill one copy. `progress` says so on stderr (CLI commands).
struct ExecutorGermlineCheck {
    progress: bool,
}

impl GermlineCheck for ExecutorGermlineCheck {
    fn check(&self, release_dir: &std::path::Path) -> std::result::Result<(), String> {
        if self.progress {
            eprintln!("admission: signature, length and hash verified; unpacked to {}", release_dir.display());
            eprintln!("admission: starting the germline and checking G1–G3 ...");
        }
        let python =
            germline_executor::germline::PythonRuntime::discover(&germline_host::home()).map_err(|e| e.to_string())?;
        germline_executor::germline::check_release(release_dir, python).map(|_| ()).map_err(|e| e.to_string())
    }
}

/// The germline check the service runs (quiet: the service logs its own steps).
pub(crate) fn germline_check() -> Box<dyn GermlineCheck> {
    Box::new(ExecutorGermlineCheck { progress: false })
}

fn germline_check_with_progress() -> Box<dyn GermlineCheck> {
    Box::new(ExecutorGermlineCheck { progress: true })
}

/// Runs one admission command.
pub fn run(cmd: AdmissionCommand) -> Result<()> {
    let now = Timestamp::now();
    match cmd {
        AdmissionCommand::Release(ReleaseCommand::Build { dir, out, pip }) => {
            let what = if pip.is_empty() { "" } else { " (vendoring its requirements with pip)" };
            let spinner =
                crate::progress::Spinner::start(format!("building the release archive of {}{what}", dir.display()));
            let built = build_release_archive(&dir, &out, &BuildOptions { pip, python: None })?;
            drop(spinner);
            println!("{}  {} bytes  {}", built.hash, built.length, out.display());
        }
        AdmissionCommand::Repo(RepoCommand::Init { repo, keys, root_keys, root_threshold }) => {
            let opts = InitOptions { root_keys, root_threshold, ..InitOptions::default() };
            PublisherRepo::init(&repo, &keys, &opts, now)?;
            println!("pin this root on hosts: {}", repo.join("metadata/1.root.json").display());
        }
        AdmissionCommand::Repo(RepoCommand::Add { repo, archive, keys, target_path }) => {
            let path = PublisherRepo::open(repo, keys).add_target(&archive, target_path.as_deref(), now)?;
            println!("published {path}");
        }
        AdmissionCommand::Repo(RepoCommand::Sign { repo, keys, role }) => {
            PublisherRepo::open(repo, keys).sign(&role, now)?;
        }
        AdmissionCommand::Repo(RepoCommand::Rotate { repo, keys, role, count, threshold }) => {
            PublisherRepo::open(repo, keys).rotate(&role, count, threshold, now)?;
        }
        AdmissionCommand::Admit(a) => {
            let root = std::fs::read(&a.root).with_context(|| format!("reading {}", a.root.display()))?;
            let store = ReleaseStore::open(&a.store)?;
            eprintln!("admission: refreshing TUF metadata from {} (pinned root {})", a.repo, a.root.display());
            eprintln!("admission: fetching target {:?} and checking its signed length and SHA-256 ...", a.target);
            let spinner = crate::progress::Spinner::start(
                "admitting: TUF metadata, target download, hash, unpack, germline check",
            );
            let admitted =
                store.admit_tuf(&TufAdmission::new(a.repo, root, a.target), germline_check_with_progress().as_ref())?;
            drop(spinner);
            println!(
                "admitted {}@{} {} at {}",
                admitted.info.name,
                admitted.info.version,
                admitted.hash,
                admitted.dir.display()
            );
        }
        AdmissionCommand::AdmitBundle(a) => {
            let policy = signer_policy(a.key, a.certificate_identity, a.certificate_oidc_issuer)?;
            let store = ReleaseStore::open(&a.store)?;
            eprintln!("admission: verifying {} with {} ...", a.archive.display(), a.bundle.display());
            let spinner = crate::progress::Spinner::start("admitting: signature, hash, unpack, germline check");
            let admitted = store.admit_sigstore(
                &a.archive,
                &a.bundle,
                &policy,
                &a.trusted_root.map(TrustedRootChoice::File).unwrap_or_default(),
                &ArchiveLimits::default(),
                germline_check_with_progress().as_ref(),
            )?;
            drop(spinner);
            println!("admitted {}@{} {}", admitted.info.name, admitted.info.version, admitted.hash);
        }
        AdmissionCommand::TufClient(t) => match t.action {
            TufClientAction::Init { root } => tuf_client_init(&t.metadata_dir, &root)?,
            TufClientAction::Refresh => {
                let url = t.metadata_url.context("--metadata-url is required")?;
                tuf_client_refresh(&t.metadata_dir, &url, now)?;
            }
            TufClientAction::Download => {
                let url = t.metadata_url.context("--metadata-url is required")?;
                let base = t.target_base_url.context("--target-base-url is required")?;
                let dir = t.target_dir.context("--target-dir is required")?;
                if t.target_name.is_empty() {
                    bail!("--target-name is required");
                }
                tuf_client_download(&t.metadata_dir, &url, &t.target_name, &base, &dir, now)?;
            }
        },
        AdmissionCommand::Sigstore(SigstoreCommand::VerifyBundle {
            staging,
            bundle,
            certificate_identity,
            certificate_oidc_issuer,
            key,
            trusted_root,
            artifact,
        }) => {
            let policy = signer_policy(key, certificate_identity, certificate_oidc_issuer)?;
            let artifact = SignedArtifact::from_arg(&artifact)?;
            let root = match (trusted_root, staging) {
                (Some(p), _) => TrustedRootChoice::File(p),
                (None, true) => TrustedRootChoice::Staging,
                (None, false) => TrustedRootChoice::Default,
            };
            verify_bundle_file(&bundle, &artifact, &policy, &root)?;
            println!("OK");
        }
    }
    Ok(())
}

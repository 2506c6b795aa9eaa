//! The canonical release archive: how a release directory becomes the exact bytes a
//! publisher signs, and how a host turns those verified bytes back into a directory
//! without trusting anything the archive says about paths, types or sizes.
//!
//! Canonical means reproducible: entries sorted by path, owner 0:0, mtime 0, modes
//! normalised to 0644/0755, gzip header without time or name, Python byte-code and
//! installer bookkeeping left out. The same input therefore always hashes the same,
//! and the signed SHA-256 names the code and its vendored dependencies together.

use std::collections::{BTreeSet, HashSet};
use std::fs;
use std::io::{self, Read, Write};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Component, Path, PathBuf};
use std::process::Command;

use flate2::read::GzDecoder;
use flate2::{Compression, GzBuilder};
use germline_model::ReleaseHash;
use sha2::{Digest, Sha256};

use crate::error::{AdmissionError, Result};
use crate::manifest::{ReleaseInfo, MANIFEST_FILE};

/// Options for [`build_release_archive`].
#[derive(Debug, Clone, Default)]
pub struct BuildOptions {
    /// Requirements to vendor from PyPI into `vendor/` before archiving, so the
    /// signed hash covers the dependencies too.
    pub pip: Vec<String>,
    /// Python used for pip; defaults to `$GERMLINE_PYTHON`, then `python3`.
    pub python: Option<PathBuf>,
}

/// What a build produced: the identity a publisher then signs.
#[derive(Debug, Clone)]
pub struct BuiltRelease {
    /// SHA-256 of the archive bytes.
    pub hash: ReleaseHash,
    /// Archive length in bytes.
    pub length: u64,
    /// Name and version from the manifest.
    pub info: ReleaseInfo,
}

/// The Python used for pip and interop tests: `$GERMLINE_PYTHON`, else `python3`.
pub fn default_python() -> PathBuf {
    std::env::var_os("GERMLINE_PYTHON")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("python3"))
}

/// Builds the canonical archive of release directory `dir` into `out`.
///
/// With `opts.pip` the directory is first copied to a staging area and the
/// requirements are installed into its `vendor/`, so the source tree is never
/// modified.
pub fn build_release_archive(dir: &Path, out: &Path, opts: &BuildOptions) -> Result<BuiltRelease> {
    let manifest = fs::read_to_string(dir.join(MANIFEST_FILE))
        .map_err(|e| AdmissionError::io(format!("reading {}", dir.join(MANIFEST_FILE).display()), e))?;
    let info = ReleaseInfo::from_manifest(&manifest)?;

    // The staging copy (if any) must outlive the archiving below.
    let mut _staging = None;
    let mut source = dir.to_path_buf();
    if !opts.pip.is_empty() {
        let staging = tempfile::tempdir().map_err(|e| AdmissionError::io("creating staging dir", e))?;
        source = staging.path().join("release");
        copy_tree(dir, &source)?;
        let python = opts.python.clone().unwrap_or_else(default_python);
        vendor_pip(&source, &opts.pip, &python)?;
        _staging = Some(staging);
    }
    let source = source.as_path();

    let entries = collect_entries(source)?;
    let out_dir = out.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
    let tmp = tempfile::NamedTempFile::new_in(out_dir)
        .map_err(|e| AdmissionError::io(format!("creating temp file in {}", out_dir.display()), e))?;
    {
        let gz = GzBuilder::new().mtime(0).operating_system(255).write(tmp.as_file(), Compression::new(6));
        let mut builder = tar::Builder::new(gz);
        builder.mode(tar::HeaderMode::Deterministic);
        for entry in &entries {
            append_entry(&mut builder, source, entry)?;
        }
        let gz = builder.into_inner().map_err(|e| AdmissionError::io("finishing tar stream", e))?;
        gz.finish().map_err(|e| AdmissionError::io("finishing gzip stream", e))?;
    }
    tmp.as_file().sync_all().map_err(|e| AdmissionError::io("syncing archive", e))?;
    tmp.persist(out).map_err(|e| AdmissionError::io(format!("writing {}", out.display()), e.error))?;
    let bytes = fs::read(out).map_err(|e| AdmissionError::io(format!("reading {}", out.display()), e))?;
    Ok(BuiltRelease { hash: ReleaseHash::of_bytes(&bytes), length: bytes.len() as u64, info })
}

enum EntryKind {
    Dir,
    File { executable: bool },
    Symlink(String),
}

struct SourceEntry {
    rel: String,
    kind: EntryKind,
}

/// Files that differ between two otherwise identical installs.
fn is_nondeterministic(name: &str) -> bool {
    germline_model::left_out_of_release(name)
}

/// A digest of release directory `dir`'s state as the file system reports it, without
/// reading any file: for every entry the canonical archive would hold (byte-code left
/// out, as there), its path, type, mode, link target, device and inode, and for files
/// their size and modification and change times in nanoseconds. Writing a file moves its change time,
/// which only the kernel sets, so an unchanged state means an unchanged archive: a host
/// may keep the release's hash under this key instead of re-archiving at every start.
pub fn directory_state(dir: &Path) -> Result<[u8; 32]> {
    use std::os::unix::fs::MetadataExt;
    fn visit(dir: &Path, h: &mut Sha256) -> Result<()> {
        let mut entries: Vec<(String, PathBuf)> = Vec::new();
        for entry in fs::read_dir(dir).map_err(|e| AdmissionError::io(format!("listing {}", dir.display()), e))? {
            let entry = entry.map_err(|e| AdmissionError::io(format!("listing {}", dir.display()), e))?;
            let name = entry.file_name().to_string_lossy().into_owned();
            if !is_nondeterministic(&name) {
                entries.push((name, entry.path()));
            }
        }
        entries.sort();
        for (name, path) in entries {
            let m =
                fs::symlink_metadata(&path).map_err(|e| AdmissionError::io(format!("stat {}", path.display()), e))?;
            let target = if m.file_type().is_symlink() {
                fs::read_link(&path).map(|t| t.to_string_lossy().into_owned()).unwrap_or_default()
            } else {
                String::new()
            };
            // A directory's own size and times move with entries the archive leaves out
            // (byte-code); its entries are covered one by one instead.
            let (len, times) = if m.is_dir() {
                (0, (0, 0, 0, 0))
            } else {
                (m.len(), (m.mtime(), m.mtime_nsec(), m.ctime(), m.ctime_nsec()))
            };
            let line = format!(
                "{}\0{}\0{:o}\0{}\0{}\0{}\0{}.{}\0{}.{}\0{}\n",
                name.len(),
                name,
                m.mode(),
                len,
                m.dev(),
                m.ino(),
                times.0,
                times.1,
                times.2,
                times.3,
                target
            );
            h.update(line.as_bytes());
            if m.is_dir() {
                h.update(b"{");
                visit(&path, h)?;
                h.update(b"}");
            }
        }
        Ok(())
    }
    let mut h = Sha256::new();
    let m = fs::metadata(dir).map_err(|e| AdmissionError::io(format!("stat {}", dir.display()), e))?;
    h.update(format!("{}\0{}\0{}\n", dir.display(), m.dev(), m.ino()).as_bytes());
    visit(dir, &mut h)?;
    Ok(h.finalize().into())
}

fn collect_entries(root: &Path) -> Result<Vec<SourceEntry>> {
    let mut out = Vec::new();
    walk(root, root, &mut out)?;
    out.sort_by(|a, b| a.rel.as_bytes().cmp(b.rel.as_bytes()));
    Ok(out)
}

fn walk(root: &Path, dir: &Path, out: &mut Vec<SourceEntry>) -> Result<()> {
    let read = fs::read_dir(dir).map_err(|e| AdmissionError::io(format!("listing {}", dir.display()), e))?;
    for entry in read {
        let entry = entry.map_err(|e| AdmissionError::io(format!("listing {}", dir.display()), e))?;
        let path = entry.path();
        let name = entry.file_name();
        let name = name.to_str().ok_or_else(|| AdmissionError::Unarchivable {
            path: path.clone(),
            reason: "file name is not UTF-8".into(),
        })?;
        if is_nondeterministic(name) {
            continue;
        }
        let rel_path = path.strip_prefix(root).map_err(|_| AdmissionError::Unarchivable {
            path: path.clone(),
            reason: "outside the release root".into(),
        })?;
        let rel = rel_path
            .to_str()
            .ok_or_else(|| AdmissionError::Unarchivable { path: path.clone(), reason: "path is not UTF-8".into() })?
            .to_owned();
        let meta =
            fs::symlink_metadata(&path).map_err(|e| AdmissionError::io(format!("stat {}", path.display()), e))?;
        let ft = meta.file_type();
        if ft.is_dir() {
            out.push(SourceEntry { rel, kind: EntryKind::Dir });
            walk(root, &path, out)?;
        } else if ft.is_file() {
            let executable = meta.permissions().mode() & 0o111 != 0;
            out.push(SourceEntry { rel, kind: EntryKind::File { executable } });
        } else if ft.is_symlink() {
            let target =
                fs::read_link(&path).map_err(|e| AdmissionError::io(format!("readlink {}", path.display()), e))?;
            let target = target.to_str().ok_or_else(|| AdmissionError::Unarchivable {
                path: path.clone(),
                reason: "link target is not UTF-8".into(),
            })?;
            if !link_target_stays_inside(target) {
                return Err(AdmissionError::Unarchivable {
                    path: path.clone(),
                    reason: format!("link to {target:?} may leave the release"),
                });
            }
            out.push(SourceEntry { rel, kind: EntryKind::Symlink(target.to_owned()) });
        } else {
            return Err(AdmissionError::Unarchivable { path, reason: "device, fifo or socket".into() });
        }
    }
    Ok(())
}

/// A link may only descend from its own directory: no absolute target, no `..`.
/// Lexical checks of `..` are unsound once other links are involved (`d -> .`,
/// `d/l -> ../x` escapes), so `..` is refused outright.
fn link_target_stays_inside(target: &str) -> bool {
    !target.is_empty() && Path::new(target).components().all(|c| matches!(c, Component::Normal(_) | Component::CurDir))
}

fn append_entry<W: Write>(builder: &mut tar::Builder<W>, root: &Path, entry: &SourceEntry) -> Result<()> {
    let mut header = tar::Header::new_gnu();
    header.set_uid(0);
    header.set_gid(0);
    header.set_mtime(0);
    let ctx = |e| AdmissionError::io(format!("archiving {}", entry.rel), e);
    match &entry.kind {
        EntryKind::Dir => {
            header.set_entry_type(tar::EntryType::Directory);
            header.set_mode(0o755);
            header.set_size(0);
            builder.append_data(&mut header, format!("{}/", entry.rel), io::empty()).map_err(ctx)?;
        }
        EntryKind::File { executable } => {
            let path = root.join(&entry.rel);
            let file = fs::File::open(&path).map_err(ctx)?;
            let len = file.metadata().map_err(ctx)?.len();
            header.set_entry_type(tar::EntryType::Regular);
            header.set_mode(if *executable { 0o755 } else { 0o644 });
            header.set_size(len);
            builder.append_data(&mut header, &entry.rel, file.take(len)).map_err(ctx)?;
        }
        EntryKind::Symlink(target) => {
            header.set_entry_type(tar::EntryType::Symlink);
            header.set_mode(0o777);
            header.set_size(0);
            builder.append_link(&mut header, &entry.rel, target).map_err(ctx)?;
        }
    }
    Ok(())
}

fn copy_tree(from: &Path, to: &Path) -> Result<()> {
    fs::create_dir_all(to).map_err(|e| AdmissionError::io(format!("creating {}", to.display()), e))?;
    let read = fs::read_dir(from).map_err(|e| AdmissionError::io(format!("listing {}", from.display()), e))?;
    for entry in read {
        let entry = entry.map_err(|e| AdmissionError::io(format!("listing {}", from.display()), e))?;
        let src = entry.path();
        let dst = to.join(entry.file_name());
        let ft = entry.file_type().map_err(|e| AdmissionError::io(format!("stat {}", src.display()), e))?;
        if ft.is_dir() {
            copy_tree(&src, &dst)?;
        } else if ft.is_symlink() {
            let target =
                fs::read_link(&src).map_err(|e| AdmissionError::io(format!("readlink {}", src.display()), e))?;
            std::os::unix::fs::symlink(target, &dst)
                .map_err(|e| AdmissionError::io(format!("linking {}", dst.display()), e))?;
        } else {
            fs::copy(&src, &dst).map_err(|e| AdmissionError::io(format!("copying {}", src.display()), e))?;
        }
    }
    Ok(())
}

/// Installs `requirements` into `release/vendor` with pip (binary wheels only, no
/// byte-code), then removes what differs from one install to the next: installer
/// records, console scripts whose shebang names this machine's Python.
pub fn vendor_pip(release: &Path, requirements: &[String], python: &Path) -> Result<()> {
    let vendor = release.join("vendor");
    let output = Command::new(python)
        .args(["-m", "pip", "install", "--target"])
        .arg(&vendor)
        .args(["--no-compile", "--only-binary=:all:", "--disable-pip-version-check", "--no-input", "--quiet"])
        .args(requirements)
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .output()
        .map_err(|e| AdmissionError::Pip(format!("running {}: {e}", python.display())))?;
    if !output.status.success() {
        return Err(AdmissionError::Pip(format!(
            "{} exited with {}: {}",
            python.display(),
            output.status,
            String::from_utf8_lossy(&output.stderr).trim()
        )));
    }
    let bin = vendor.join("bin");
    if bin.exists() {
        fs::remove_dir_all(&bin).map_err(|e| AdmissionError::io("removing vendor/bin", e))?;
    }
    let read = fs::read_dir(&vendor).map_err(|e| AdmissionError::io("listing vendor", e))?;
    for entry in read {
        let entry = entry.map_err(|e| AdmissionError::io("listing vendor", e))?;
        let name = entry.file_name();
        if !name.to_string_lossy().ends_with(".dist-info") {
            continue;
        }
        for record in ["RECORD", "INSTALLER", "REQUESTED", "direct_url.json"] {
            let p = entry.path().join(record);
            if p.exists() {
                fs::remove_file(&p).map_err(|e| AdmissionError::io(format!("removing {}", p.display()), e))?;
            }
        }
    }
    Ok(())
}

/// Budgets that bound what extracting an archive may cost, against archive bombs.
#[derive(Debug, Clone, Copy)]
pub struct ArchiveLimits {
    /// Maximum number of entries (files, directories, links).
    pub max_entries: u64,
    /// Maximum sum of file sizes.
    pub max_total_bytes: u64,
    /// Maximum size of any one file.
    pub max_file_bytes: u64,
    /// Maximum path depth.
    pub max_depth: usize,
}

impl Default for ArchiveLimits {
    fn default() -> Self {
        Self { max_entries: 20_000, max_total_bytes: 1 << 30, max_file_bytes: 256 << 20, max_depth: 48 }
    }
}

#[derive(Debug, PartialEq, Eq)]
enum PlannedKind {
    Dir,
    File { size: u64, executable: bool },
    Symlink(String),
}

#[derive(Debug, PartialEq, Eq)]
struct Planned {
    rel: PathBuf,
    kind: PlannedKind,
}

/// A reader that fails once more than `left` bytes pass, so a gzip bomb is cut off
/// after the budget instead of inflating without end.
struct Budgeted<R> {
    inner: R,
    left: u64,
    exceeded: bool,
}

impl<R: Read> Read for Budgeted<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        if n as u64 > self.left {
            self.exceeded = true;
            return Err(io::Error::other("decompressed archive exceeds budget"));
        }
        self.left -= n as u64;
        Ok(n)
    }
}

fn open_stream(archive: &Path, limits: &ArchiveLimits) -> Result<tar::Archive<Budgeted<GzDecoder<fs::File>>>> {
    let file = fs::File::open(archive).map_err(|e| AdmissionError::io(format!("opening {}", archive.display()), e))?;
    // Headers and padding cost at most 1.5 KiB per entry on top of the contents.
    let budget = limits
        .max_total_bytes
        .saturating_add(limits.max_entries.saturating_add(2).saturating_mul(3 * 512))
        .saturating_add(1 << 20);
    Ok(tar::Archive::new(Budgeted { inner: GzDecoder::new(file), left: budget, exceeded: false }))
}

fn stream_error(e: io::Error) -> AdmissionError {
    if e.to_string().contains("exceeds budget") {
        AdmissionError::ArchiveTooLarge("decompressed stream exceeds the byte budget".into())
    } else {
        AdmissionError::ArchiveMalformed(e.to_string())
    }
}

/// Normalises an archive path, refusing anything that is not a plain relative path.
fn safe_relative(raw: &[u8], max_depth: usize) -> Result<PathBuf> {
    let s = std::str::from_utf8(raw)
        .map_err(|_| AdmissionError::ArchivePathEscape(format!("non-UTF-8 path {:?}", String::from_utf8_lossy(raw))))?;
    if s.starts_with('/') {
        return Err(AdmissionError::ArchivePathEscape(format!("absolute path {s:?}")));
    }
    let mut out = PathBuf::new();
    let mut depth = 0;
    for part in s.split('/') {
        match part {
            "" | "." => {}
            ".." => return Err(AdmissionError::ArchivePathEscape(format!("parent component in {s:?}"))),
            p => {
                depth += 1;
                out.push(p);
            }
        }
    }
    if depth == 0 {
        return Err(AdmissionError::ArchivePathEscape(format!("empty path {s:?}")));
    }
    if depth > max_depth {
        return Err(AdmissionError::ArchiveTooLarge(format!("path {s:?} deeper than {max_depth}")));
    }
    Ok(out)
}

/// First pass: reads every header, checks every rule, and writes nothing.
fn plan(archive_path: &Path, limits: &ArchiveLimits) -> Result<(Vec<Planned>, Option<String>)> {
    let mut archive = open_stream(archive_path, limits)?;
    let mut planned = Vec::new();
    let mut seen = HashSet::new();
    let mut links: BTreeSet<PathBuf> = BTreeSet::new();
    let mut files: BTreeSet<PathBuf> = BTreeSet::new();
    let mut total: u64 = 0;
    let mut manifest = None;
    let entries = archive.entries().map_err(|e| AdmissionError::ArchiveMalformed(e.to_string()))?;
    let mut result = Ok(());
    for entry in entries {
        let mut entry = match entry {
            Ok(e) => e,
            Err(e) => {
                result = Err(e);
                break;
            }
        };
        if planned.len() as u64 >= limits.max_entries {
            return Err(AdmissionError::ArchiveTooLarge(format!("more than {} entries", limits.max_entries)));
        }
        if let Ok(Some(pax)) = entry.pax_extensions() {
            for ext in pax.flatten() {
                if ext.key_bytes().starts_with(b"GNU.sparse") {
                    return Err(AdmissionError::ArchiveEntryRefused("sparse file (pax)".into()));
                }
            }
        }
        let rel = safe_relative(&entry.path_bytes(), limits.max_depth)?;
        if rel.ancestors().skip(1).any(|a| links.contains(a) || files.contains(a)) {
            return Err(AdmissionError::ArchivePathEscape(format!("{} lies beneath a link or file", rel.display())));
        }
        let et = entry.header().entry_type();
        let kind = match et {
            tar::EntryType::Regular | tar::EntryType::Continuous => {
                let size = entry.header().size().map_err(|e| AdmissionError::ArchiveMalformed(e.to_string()))?;
                if size > limits.max_file_bytes {
                    return Err(AdmissionError::ArchiveTooLarge(format!(
                        "{} has {size} bytes, over {}",
                        rel.display(),
                        limits.max_file_bytes
                    )));
                }
                total = total.saturating_add(size);
                if total > limits.max_total_bytes {
                    return Err(AdmissionError::ArchiveTooLarge(format!(
                        "contents exceed {} bytes",
                        limits.max_total_bytes
                    )));
                }
                let mode = entry.header().mode().map_err(|e| AdmissionError::ArchiveMalformed(e.to_string()))?;
                if rel == Path::new(MANIFEST_FILE) && size <= 1 << 20 {
                    let mut text = String::new();
                    entry
                        .read_to_string(&mut text)
                        .map_err(|e| AdmissionError::BadManifest(format!("reading manifest: {e}")))?;
                    manifest = Some(text);
                }
                files.insert(rel.clone());
                PlannedKind::File { size, executable: mode & 0o111 != 0 }
            }
            tar::EntryType::Directory => PlannedKind::Dir,
            tar::EntryType::Symlink => {
                let target = entry
                    .link_name_bytes()
                    .ok_or_else(|| AdmissionError::ArchiveMalformed("symlink without target".into()))?;
                let target = std::str::from_utf8(&target)
                    .map_err(|_| AdmissionError::ArchivePathEscape("non-UTF-8 link target".into()))?
                    .to_owned();
                if !link_target_stays_inside(&target) {
                    return Err(AdmissionError::ArchivePathEscape(format!(
                        "symlink {} -> {target:?} leaves the release",
                        rel.display()
                    )));
                }
                links.insert(rel.clone());
                PlannedKind::Symlink(target)
            }
            tar::EntryType::Link => {
                return Err(AdmissionError::ArchiveEntryRefused(format!("hard link {}", rel.display())))
            }
            tar::EntryType::GNUSparse => {
                return Err(AdmissionError::ArchiveEntryRefused(format!("sparse file {}", rel.display())))
            }
            other => {
                return Err(AdmissionError::ArchiveEntryRefused(format!("{} has entry type {other:?}", rel.display())))
            }
        };
        if !seen.insert(rel.clone()) {
            return Err(AdmissionError::ArchiveEntryRefused(format!("duplicate entry {}", rel.display())));
        }
        planned.push(Planned { rel, kind });
    }
    result.map_err(stream_error)?;
    Ok((planned, manifest))
}

/// Reads and validates `germline.toml` from an archive without extracting it,
/// applying the same entry rules as extraction.
pub fn read_archive_manifest(archive: &Path, limits: &ArchiveLimits) -> Result<ReleaseInfo> {
    let (_, manifest) = plan(archive, limits)?;
    let manifest = manifest.ok_or_else(|| AdmissionError::BadManifest(format!("archive has no {MANIFEST_FILE}")))?;
    ReleaseInfo::from_manifest(&manifest)
}

/// Extracts a (hash-verified) release archive into `dest`, which must not exist.
///
/// The archive is read twice: the first pass checks every entry against the rules
/// and budgets and writes nothing, so a refused archive leaves no trace; the second
/// pass writes exactly the planned entries with `create_new`, never following a link.
/// Returns the release manifest's name and version.
pub fn extract_release(archive: &Path, dest: &Path, limits: &ArchiveLimits) -> Result<ReleaseInfo> {
    let (planned, manifest) = plan(archive, limits)?;
    let manifest = manifest.ok_or_else(|| AdmissionError::BadManifest(format!("archive has no {MANIFEST_FILE}")))?;
    let info = ReleaseInfo::from_manifest(&manifest)?;

    // Modes are set, not left to the umask: a release unpacked by a process with umask 077
    // would be unreadable by the sandbox ids its germline runs as.
    let made = |e| AdmissionError::io(format!("creating {}", dest.display()), e);
    fs::create_dir(dest).map_err(made)?;
    fs::set_permissions(dest, fs::Permissions::from_mode(0o755)).map_err(made)?;
    let written = write_planned(archive, dest, limits, &planned);
    if written.is_err() {
        let _ = fs::remove_dir_all(dest);
    }
    written?;
    Ok(info)
}

fn write_planned(archive_path: &Path, dest: &Path, limits: &ArchiveLimits, planned: &[Planned]) -> Result<()> {
    let mut archive = open_stream(archive_path, limits)?;
    let entries = archive.entries().map_err(|e| AdmissionError::ArchiveMalformed(e.to_string()))?;
    let mut index = 0;
    for entry in entries {
        let mut entry = entry.map_err(stream_error)?;
        let plan = planned
            .get(index)
            .ok_or_else(|| AdmissionError::ArchiveMalformed("archive changed between passes".into()))?;
        index += 1;
        let rel = safe_relative(&entry.path_bytes(), limits.max_depth)?;
        if rel != plan.rel {
            return Err(AdmissionError::ArchiveMalformed("archive changed between passes".into()));
        }
        let path = dest.join(&plan.rel);
        ensure_parents(dest, &plan.rel)?;
        let ctx = |e| AdmissionError::io(format!("extracting {}", plan.rel.display()), e);
        match &plan.kind {
            PlannedKind::Dir => match fs::symlink_metadata(&path) {
                Ok(m) if m.is_dir() => {}
                Ok(_) => {
                    return Err(AdmissionError::ArchiveEntryRefused(format!(
                        "{} is not a directory",
                        plan.rel.display()
                    )))
                }
                Err(_) => {
                    fs::create_dir(&path).map_err(ctx)?;
                    fs::set_permissions(&path, fs::Permissions::from_mode(0o755)).map_err(ctx)?;
                }
            },
            PlannedKind::File { size, executable } => {
                let mut out = fs::OpenOptions::new()
                    .write(true)
                    .create_new(true)
                    .mode(if *executable { 0o755 } else { 0o644 })
                    .open(&path)
                    .map_err(ctx)?;
                out.set_permissions(fs::Permissions::from_mode(if *executable { 0o755 } else { 0o644 }))
                    .map_err(ctx)?;
                let copied = io::copy(&mut (&mut entry).take(*size), &mut out).map_err(ctx)?;
                if copied != *size {
                    return Err(AdmissionError::ArchiveMalformed(format!("{} is truncated", plan.rel.display())));
                }
            }
            PlannedKind::Symlink(target) => {
                std::os::unix::fs::symlink(target, &path).map_err(ctx)?;
            }
        }
    }
    if index != planned.len() {
        return Err(AdmissionError::ArchiveMalformed("archive changed between passes".into()));
    }
    Ok(())
}

/// Creates missing parent directories of `rel` under `dest`, refusing to pass
/// through anything that is not a real directory.
fn ensure_parents(dest: &Path, rel: &Path) -> Result<()> {
    let mut cur = dest.to_path_buf();
    if let Some(parent) = rel.parent() {
        for comp in parent.components() {
            cur.push(comp);
            match fs::symlink_metadata(&cur) {
                Ok(m) if m.is_dir() => {}
                Ok(_) => {
                    return Err(AdmissionError::ArchivePathEscape(format!(
                        "{} passes through a non-directory",
                        rel.display()
                    )))
                }
                Err(_) => {
                    let made = |e| AdmissionError::io(format!("creating {}", cur.display()), e);
                    fs::create_dir(&cur).map_err(made)?;
                    fs::set_permissions(&cur, fs::Permissions::from_mode(0o755)).map_err(made)?;
                }
            }
        }
    }
    Ok(())
}

/// SHA-256 and length of a file, streamed.
pub fn hash_file(path: &Path) -> Result<(ReleaseHash, u64)> {
    let mut file = fs::File::open(path).map_err(|e| AdmissionError::io(format!("opening {}", path.display()), e))?;
    let mut hasher = Sha256::new();
    let n =
        io::copy(&mut file, &mut hasher).map_err(|e| AdmissionError::io(format!("reading {}", path.display()), e))?;
    Ok((ReleaseHash(hasher.finalize().into()), n))
}

#[cfg(test)]
pub(crate) mod tests {

    #[test]
    fn the_directory_state_moves_with_every_change_the_archive_would_see() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path();
        fs::write(dir.join("germline.toml"), "x").unwrap();
        fs::create_dir(dir.join("pkg")).unwrap();
        fs::write(dir.join("pkg/a.py"), "a = 1\n").unwrap();
        let s0 = directory_state(dir).unwrap();
        assert_eq!(s0, directory_state(dir).unwrap(), "no change, same state");
        fs::create_dir(dir.join("pkg/__pycache__")).unwrap();
        fs::write(dir.join("pkg/__pycache__/a.cpython-311.pyc"), "bytecode").unwrap();
        assert_eq!(s0, directory_state(dir).unwrap(), "byte-code is outside the archive and the state");
        // Same size, same content length: the change time still moves.
        fs::write(dir.join("pkg/a.py"), "a = 2\n").unwrap();
        let s1 = directory_state(dir).unwrap();
        assert_ne!(s0, s1, "a rewritten file");
        let f = fs::File::options().write(true).open(dir.join("pkg/a.py")).unwrap();
        f.set_modified(std::time::SystemTime::UNIX_EPOCH).unwrap();
        assert_ne!(s1, directory_state(dir).unwrap(), "a file's times");
        fs::write(dir.join("pkg/b.py"), "").unwrap();
        assert_ne!(s1, directory_state(dir).unwrap(), "a new file");
    }

    use super::*;

    /// Writes a minimal release directory.
    pub(crate) fn sample_release(dir: &Path, version: &str) {
        fs::create_dir_all(dir.join("src/notes_server")).expect("mkdir");
        fs::write(
            dir.join(MANIFEST_FILE),
            format!("[release]\nname = \"notes\"\nversion = \"{version}\"\nruntime = \"python\"\nfactory = \"notes_server:create_server\"\npython_path = [\"src\"]\n"),
        )
        .expect("manifest");
        fs::write(dir.join("src/notes_server/__init__.py"), "def create_server():\n    return None\n").expect("code");
        fs::create_dir_all(dir.join("src/notes_server/__pycache__")).expect("mkdir");
        fs::write(dir.join("src/notes_server/__pycache__/x.cpython-311.pyc"), "junk").expect("pyc");
    }

    /// A raw tar entry, written without the tar crate's own path checks.
    pub(crate) struct Raw<'a> {
        pub name: &'a [u8],
        pub kind: tar::EntryType,
        pub size: u64,
        pub link: &'a [u8],
        pub data: &'a [u8],
    }

    pub(crate) fn raw_entry<'a>(name: &'a str, kind: tar::EntryType, data: &'a [u8]) -> Raw<'a> {
        Raw { name: name.as_bytes(), kind, size: data.len() as u64, link: b"", data }
    }

    /// Builds a gzip'd tar from raw entries: headers are filled byte by byte so
    /// hostile names reach the extractor unchanged.
    pub(crate) fn raw_archive(path: &Path, entries: &[Raw<'_>]) {
        let file = fs::File::create(path).expect("create");
        let mut gz = GzBuilder::new().write(file, Compression::fast());
        for e in entries {
            let mut header = tar::Header::new_gnu();
            header.as_old_mut().name[..e.name.len()].copy_from_slice(e.name);
            header.as_old_mut().linkname[..e.link.len()].copy_from_slice(e.link);
            header.set_entry_type(e.kind);
            header.set_size(e.size);
            if e.kind == tar::EntryType::GNUSparse {
                // A sparse file that claims 10 GB of real size.
                let real = format!("{:012o}", 10u64 << 30);
                let last = format!("{:012o}", (10u64 << 30) - 1);
                if let Some(gnu) = header.as_gnu_mut() {
                    gnu.realsize.copy_from_slice(real.as_bytes());
                    gnu.sparse[0].offset.copy_from_slice(last.as_bytes());
                    gnu.sparse[0].numbytes.copy_from_slice(format!("{:011o}\0", 1).as_bytes());
                }
            }
            header.set_mode(0o644);
            header.set_cksum();
            gz.write_all(header.as_bytes()).expect("write");
            gz.write_all(e.data).expect("write");
            let pad = (512 - e.data.len() % 512) % 512;
            gz.write_all(&vec![0u8; pad]).expect("write");
        }
        gz.write_all(&[0u8; 1024]).expect("write");
        gz.finish().expect("finish");
    }

    fn manifest_entry() -> Raw<'static> {
        raw_entry(MANIFEST_FILE, tar::EntryType::Regular, b"[release]\nname = \"x\"\nversion = \"1\"\n")
    }

    /// Extracts into `<tmp>/store/dest` and checks that a refusal leaves nothing
    /// behind: `dest` absent, nothing else created under `<tmp>`.
    fn refused(entries: &[Raw<'_>], limits: &ArchiveLimits) -> AdmissionError {
        let tmp = tempfile::tempdir().expect("tmp");
        let archive = tmp.path().join("a.tar.gz");
        raw_archive(&archive, entries);
        let store = tmp.path().join("store");
        fs::create_dir(&store).expect("store");
        let dest = store.join("dest");
        let err = extract_release(&archive, &dest, limits).expect_err("must be refused");
        assert!(!dest.exists(), "refused archive left {dest:?}");
        let mut names: Vec<_> = fs::read_dir(tmp.path()).expect("ls").flatten().map(|e| e.file_name()).collect();
        names.sort();
        assert_eq!(names, ["a.tar.gz", "store"]);
        err
    }

    #[test]
    fn same_input_gives_byte_identical_archive() {
        let tmp = tempfile::tempdir().expect("tmp");
        let rel = tmp.path().join("rel");
        sample_release(&rel, "1.0.0");
        let a = tmp.path().join("a.tar.gz");
        let b = tmp.path().join("b.tar.gz");
        let first = build_release_archive(&rel, &a, &BuildOptions::default()).expect("build");
        // Touch a file and change its mode bits outside the normalised ones.
        let code = rel.join("src/notes_server/__init__.py");
        let text = fs::read(&code).expect("read");
        fs::write(&code, text).expect("rewrite");
        fs::set_permissions(&code, fs::Permissions::from_mode(0o600)).expect("chmod");
        let second = build_release_archive(&rel, &b, &BuildOptions::default()).expect("build");
        assert_eq!(fs::read(&a).expect("a"), fs::read(&b).expect("b"));
        assert_eq!(first.hash, second.hash);
        assert_eq!(first.info.version, "1.0.0");
    }

    #[test]
    fn round_trip_leaves_out_bytecode() {
        let tmp = tempfile::tempdir().expect("tmp");
        let rel = tmp.path().join("rel");
        sample_release(&rel, "1.0.0");
        std::os::unix::fs::symlink("notes_server/__init__.py", rel.join("src/alias.py")).expect("link");
        let a = tmp.path().join("a.tar.gz");
        build_release_archive(&rel, &a, &BuildOptions::default()).expect("build");
        let out = tmp.path().join("out");
        let info = extract_release(&a, &out, &ArchiveLimits::default()).expect("extract");
        assert_eq!(info.name, "notes");
        assert!(out.join("src/notes_server/__init__.py").is_file());
        assert!(!out.join("src/notes_server/__pycache__").exists());
        assert_eq!(fs::read_link(out.join("src/alias.py")).expect("link").to_str(), Some("notes_server/__init__.py"));
    }

    #[test]
    fn builder_refuses_links_that_leave_the_release() {
        let tmp = tempfile::tempdir().expect("tmp");
        let rel = tmp.path().join("rel");
        sample_release(&rel, "1.0.0");
        std::os::unix::fs::symlink("../../etc/passwd", rel.join("escape")).expect("link");
        let err =
            build_release_archive(&rel, &tmp.path().join("a.tar.gz"), &BuildOptions::default()).expect_err("refused");
        assert!(matches!(err, AdmissionError::Unarchivable { .. }), "{err}");
    }

    #[test]
    fn parent_and_absolute_paths_are_refused() {
        let limits = ArchiveLimits::default();
        for name in ["../evil", "a/../../evil", "/etc/evil"] {
            let err = refused(&[manifest_entry(), raw_entry(name, tar::EntryType::Regular, b"x")], &limits);
            assert!(matches!(err, AdmissionError::ArchivePathEscape(_)), "{name}: {err}");
        }
    }

    #[test]
    fn link_escapes_are_refused() {
        let limits = ArchiveLimits::default();
        let sym = Raw { name: b"l", kind: tar::EntryType::Symlink, size: 0, link: b"../../etc", data: b"" };
        let err = refused(&[manifest_entry(), sym], &limits);
        assert!(matches!(err, AdmissionError::ArchivePathEscape(_)), "{err}");
        let abs = Raw { name: b"l", kind: tar::EntryType::Symlink, size: 0, link: b"/etc/passwd", data: b"" };
        let err = refused(&[manifest_entry(), abs], &limits);
        assert!(matches!(err, AdmissionError::ArchivePathEscape(_)), "{err}");
        // A link inside the tree followed by a write through it.
        let dot = Raw { name: b"d", kind: tar::EntryType::Symlink, size: 0, link: b".", data: b"" };
        let err = refused(&[manifest_entry(), dot, raw_entry("d/x", tar::EntryType::Regular, b"x")], &limits);
        assert!(matches!(err, AdmissionError::ArchivePathEscape(_)), "{err}");
        let hard = Raw { name: b"h", kind: tar::EntryType::Link, size: 0, link: b"/etc/shadow", data: b"" };
        let err = refused(&[manifest_entry(), hard], &limits);
        assert!(matches!(err, AdmissionError::ArchiveEntryRefused(_)), "{err}");
    }

    #[test]
    fn sparse_and_oversized_entries_are_refused_before_writing() {
        let limits = ArchiveLimits::default();
        let sparse = Raw { name: b"s", kind: tar::EntryType::GNUSparse, size: 1, link: b"", data: b"x" };
        let err = refused(&[manifest_entry(), sparse], &limits);
        assert!(matches!(err, AdmissionError::ArchiveEntryRefused(_)), "{err}");
        // A header claiming 10 GB: refused from the header alone.
        let huge = Raw { name: b"big", kind: tar::EntryType::Regular, size: 10 << 30, link: b"", data: b"" };
        let err = refused(&[manifest_entry(), huge], &limits);
        assert!(matches!(err, AdmissionError::ArchiveTooLarge(_)), "{err}");
        // Real bytes over a small budget (a gzip bomb in miniature).
        let zeros = vec![0u8; 4 << 20];
        let small = ArchiveLimits { max_total_bytes: 1 << 20, ..ArchiveLimits::default() };
        let err = refused(&[manifest_entry(), raw_entry("z", tar::EntryType::Regular, &zeros)], &small);
        assert!(matches!(err, AdmissionError::ArchiveTooLarge(_)), "{err}");
        let dev = Raw { name: b"dev", kind: tar::EntryType::Char, size: 0, link: b"", data: b"" };
        let err = refused(&[manifest_entry(), dev], &limits);
        assert!(matches!(err, AdmissionError::ArchiveEntryRefused(_)), "{err}");
    }

    #[test]
    fn hundred_thousand_files_are_refused() {
        let names: Vec<String> = (0..100_000).map(|i| format!("f{i}")).collect();
        let mut entries = vec![manifest_entry()];
        entries.extend(names.iter().map(|n| raw_entry(n, tar::EntryType::Regular, b"")));
        let err = refused(&entries, &ArchiveLimits::default());
        assert!(matches!(err, AdmissionError::ArchiveTooLarge(_)), "{err}");
    }
}

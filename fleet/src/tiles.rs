//! A C2SP tlog-tiles client that trusts nothing but a signed tree head.
//!
//! Tiles come from any static server, so every hash read from them is authenticated
//! before use: the right-edge (partial) tiles by recomputing the checkpoint's root from
//! them, every full tile by hashing it up to the matching hash in its parent tile, which
//! is authenticated the same way. Consistency between two checkpoints is then proved
//! from authenticated hashes and checked with the RFC 6962 verifier, so a failed check
//! means the signed heads disagree (a split view), while a tile that does not hash up
//! means the server altered it.

use std::cell::RefCell;
use std::collections::{HashMap, HashSet};

use germline_ledger::merkle::{self, HashReader, TreeError};
use germline_ledger::tiles::{entries_path, tile_path};
use germline_ledger::{Hash, TILE_WIDTH};

/// Why the tiles of a tree could not be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TilesError {
    /// The server could not be reached or refused the request.
    #[error("fetching {path}: {message}")]
    Unreachable {
        /// Tile path.
        path: String,
        /// What went wrong.
        message: String,
    },
    /// A tile or entry bundle does not match the signed tree head.
    #[error("tampered {path}: {message}")]
    Tampered {
        /// Tile path.
        path: String,
        /// What does not match.
        message: String,
    },
    /// Both trees are authentic but the older is not a prefix of the newer.
    #[error("inconsistent trees: {0}")]
    Inconsistent(String),
    /// A request bound was hit.
    #[error("request budget exhausted after {0} fetches")]
    Budget(usize),
}

/// Where tiles come from (HTTP in the mirror, the ledger itself in tests).
pub trait TileSource {
    /// The bytes at `path` (e.g. `tile/0/001.p/7`), or why not.
    fn fetch(&self, path: &str) -> Result<Vec<u8>, String>;
}

fn tile_width(size: u64, level: u8, index: u64) -> u16 {
    let nodes = size >> (8 * u32::from(level));
    nodes.saturating_sub(index * TILE_WIDTH).min(TILE_WIDTH) as u16
}

fn fold(hashes: &[Hash]) -> Hash {
    // `hashes` has a power-of-two length: the complete subtree over them.
    let mut level = hashes.to_vec();
    while level.len() > 1 {
        level = level.chunks(2).map(|p| merkle::node_hash(&p[0], &p[1])).collect();
    }
    level[0]
}

/// A tree of `size` entries with root `root`, read through authenticated tiles.
pub struct TiledTree<'a> {
    src: &'a dyn TileSource,
    size: u64,
    root: Hash,
    max_fetches: usize,
    fetches: RefCell<usize>,
    tiles: RefCell<HashMap<(u8, u64), Vec<Hash>>>,
    verified: RefCell<HashSet<(u8, u64)>>,
    error: RefCell<Option<TilesError>>,
}

impl<'a> TiledTree<'a> {
    /// Opens the tree and authenticates its right edge against `root` at once, so a
    /// tampered partial tile is found even when no entry is read.
    pub fn open(src: &'a dyn TileSource, size: u64, root: Hash, max_fetches: usize) -> Result<Self, TilesError> {
        let t = TiledTree {
            src,
            size,
            root,
            max_fetches,
            fetches: RefCell::new(0),
            tiles: RefCell::new(HashMap::new()),
            verified: RefCell::new(HashSet::new()),
            error: RefCell::new(None),
        };
        t.verify_edge()?;
        Ok(t)
    }

    /// Tree size.
    pub fn size(&self) -> u64 {
        self.size
    }

    /// Tiles fetched so far.
    pub fn fetches(&self) -> usize {
        *self.fetches.borrow()
    }

    fn get(&self, path: &str) -> Result<Vec<u8>, TilesError> {
        let mut n = self.fetches.borrow_mut();
        if *n >= self.max_fetches {
            return Err(TilesError::Budget(*n));
        }
        *n += 1;
        drop(n);
        self.src.fetch(path).map_err(|message| TilesError::Unreachable { path: path.to_owned(), message })
    }

    fn raw_tile(&self, level: u8, index: u64) -> Result<Vec<Hash>, TilesError> {
        if let Some(t) = self.tiles.borrow().get(&(level, index)) {
            return Ok(t.clone());
        }
        let width = tile_width(self.size, level, index);
        let path = tile_path(level, index, width);
        let bytes = self.get(&path)?;
        if bytes.len() != 32 * usize::from(width) {
            return Err(TilesError::Tampered {
                path,
                message: format!("{} bytes, expected {} hashes", bytes.len(), width),
            });
        }
        let hashes: Vec<Hash> = bytes.chunks_exact(32).map(|c| c.try_into().unwrap_or([0u8; 32])).collect();
        self.tiles.borrow_mut().insert((level, index), hashes.clone());
        Ok(hashes)
    }

    /// Recomputes the root from the right-edge tiles of every level; equal to the signed
    /// root means every partial tile is authentic.
    fn verify_edge(&self) -> Result<(), TilesError> {
        if self.size == 0 {
            return if self.root == merkle::empty_root() {
                Ok(())
            } else {
                Err(TilesError::Inconsistent("empty tree with a non-empty root".into()))
            };
        }
        let mut subtrees = Vec::new();
        let mut edge = Vec::new();
        for bit in (0..64u32).rev() {
            if self.size & (1u64 << bit) == 0 {
                continue;
            }
            let level = (bit / 8) as u8;
            let k = (self.size >> bit) - 1;
            let span = 1u64 << (bit - 8 * u32::from(level));
            let first = k * span;
            let index = first / TILE_WIDTH;
            let tile = self.raw_tile(level, index)?;
            let off = (first % TILE_WIDTH) as usize;
            subtrees.push(fold(&tile[off..off + span as usize]));
            if !edge.contains(&(level, index)) {
                edge.push((level, index));
            }
        }
        let mut h = subtrees.pop().unwrap_or_else(merkle::empty_root);
        while let Some(left) = subtrees.pop() {
            h = merkle::node_hash(&left, &h);
        }
        if h != self.root {
            let paths: Vec<String> = edge.iter().map(|&(l, i)| tile_path(l, i, tile_width(self.size, l, i))).collect();
            return Err(TilesError::Tampered {
                path: paths.join(" "),
                message: "right-edge tiles do not hash to the checkpoint's root".into(),
            });
        }
        let mut v = self.verified.borrow_mut();
        for e in edge {
            v.insert(e);
        }
        Ok(())
    }

    fn verify_tile(&self, level: u8, index: u64) -> Result<Vec<Hash>, TilesError> {
        let tile = self.raw_tile(level, index)?;
        if self.verified.borrow().contains(&(level, index)) {
            return Ok(tile);
        }
        if u64::from(tile_width(self.size, level, index)) < TILE_WIDTH {
            // Partial tiles are the right edge, checked when the tree was opened.
            return Err(TilesError::Tampered {
                path: tile_path(level, index, tile_width(self.size, level, index)),
                message: "partial tile outside the verified edge".into(),
            });
        }
        let parent = self.verify_tile(level + 1, index / TILE_WIDTH)?;
        let want = parent[(index % TILE_WIDTH) as usize];
        if fold(&tile) != want {
            return Err(TilesError::Tampered {
                path: tile_path(level, index, TILE_WIDTH as u16),
                message: format!(
                    "does not hash to its entry in {}",
                    tile_path(level + 1, index / TILE_WIDTH, tile_width(self.size, level + 1, index / TILE_WIDTH))
                ),
            });
        }
        self.verified.borrow_mut().insert((level, index));
        Ok(tile)
    }

    /// The authenticated hash of the complete subtree at Merkle `level`, index `k`.
    pub fn node(&self, level: u8, k: u64) -> Result<Hash, TilesError> {
        let bad = || TilesError::Inconsistent(format!("node {level}/{k} is outside a tree of size {}", self.size));
        let end = (k + 1).checked_shl(u32::from(level)).ok_or_else(bad)?;
        if end > self.size || level >= 64 {
            return Err(bad());
        }
        let tl = level / 8;
        let span = 1u64 << (level - 8 * tl);
        let first = k * span;
        let tile = self.verify_tile(tl, first / TILE_WIDTH)?;
        let off = (first % TILE_WIDTH) as usize;
        Ok(fold(&tile[off..off + span as usize]))
    }

    /// Entries `from..to` (encoded), each checked against its authenticated leaf hash.
    pub fn entries(&self, from: u64, to: u64) -> Result<Vec<Vec<u8>>, TilesError> {
        let mut out = Vec::new();
        if from >= to {
            return Ok(out);
        }
        let to = to.min(self.size);
        for bundle in from / TILE_WIDTH..=(to - 1) / TILE_WIDTH {
            let width = (self.size - bundle * TILE_WIDTH).min(TILE_WIDTH) as u16;
            let path = entries_path(bundle, width);
            let bytes = self.get(&path)?;
            let entries =
                split_bundle(&bytes, width).map_err(|message| TilesError::Tampered { path: path.clone(), message })?;
            for (j, data) in entries.into_iter().enumerate() {
                let i = bundle * TILE_WIDTH + j as u64;
                if i < from || i >= to {
                    continue;
                }
                if merkle::leaf_hash(&data) != self.node(0, i)? {
                    return Err(TilesError::Tampered {
                        path,
                        message: format!("entry {i} does not match its leaf hash"),
                    });
                }
                out.push(data);
            }
        }
        Ok(out)
    }

    /// The first tile error hit while serving [`HashReader`] reads.
    fn take_error(&self) -> Option<TilesError> {
        self.error.borrow_mut().take()
    }
}

impl HashReader for TiledTree<'_> {
    fn read_hashes(&self, indexes: &[u64]) -> Result<Vec<Hash>, TreeError> {
        indexes
            .iter()
            .map(|&i| {
                let (level, n) = merkle::split_stored_hash_index(i);
                self.node(level, n).map_err(|e| {
                    let msg = e.to_string();
                    self.error.borrow_mut().get_or_insert(e);
                    TreeError::Store(msg)
                })
            })
            .collect()
    }
}

/// Splits a C2SP entry bundle: `width` entries, each behind a big-endian `u16` length.
pub fn split_bundle(bytes: &[u8], width: u16) -> Result<Vec<Vec<u8>>, String> {
    let mut out = Vec::with_capacity(usize::from(width));
    let mut rest = bytes;
    while !rest.is_empty() {
        if rest.len() < 2 {
            return Err("truncated length prefix".into());
        }
        let len = usize::from(u16::from_be_bytes([rest[0], rest[1]]));
        if rest.len() < 2 + len {
            return Err("truncated entry".into());
        }
        out.push(rest[2..2 + len].to_vec());
        rest = &rest[2 + len..];
    }
    if out.len() != usize::from(width) {
        return Err(format!("{} entries, expected {width}", out.len()));
    }
    Ok(out)
}

/// Checks that the tree `(old_size, old_root)` is a prefix of `new`, from authenticated
/// tiles of `new`. `Inconsistent` means two authentic heads disagree.
pub fn check_consistency(old_size: u64, old_root: &Hash, new: &TiledTree<'_>) -> Result<(), TilesError> {
    if old_size > new.size() {
        return Err(TilesError::Inconsistent(format!("old size {old_size} exceeds new size {}", new.size())));
    }
    if old_size == new.size() {
        return if *old_root == new.root {
            Ok(())
        } else {
            Err(TilesError::Inconsistent(format!("two different roots at size {old_size}")))
        };
    }
    if old_size == 0 {
        return Ok(());
    }
    let proof = merkle::consistency_proof(old_size, new.size(), new)
        .map_err(|e| new.take_error().unwrap_or(TilesError::Inconsistent(e.to_string())))?;
    if merkle::verify_consistency(old_size, new.size(), old_root, &new.root, &proof) {
        Ok(())
    } else {
        Err(TilesError::Inconsistent(format!(
            "the tree of size {} does not extend the tree of size {old_size}",
            new.size()
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use germline_ledger::tiles::{parse_tile_path, TileRequest};
    use germline_ledger::{Entry, EntryKind, Ledger, LedgerConfig};
    use germline_model::ReleaseHash;
    use std::cell::Cell;

    /// Serves a ledger's tiles, optionally flipping a byte of one path.
    struct Local<'a> {
        ledger: &'a Ledger,
        flip: Option<String>,
        count: Cell<usize>,
    }

    impl TileSource for Local<'_> {
        fn fetch(&self, path: &str) -> Result<Vec<u8>, String> {
            self.count.set(self.count.get() + 1);
            let mut bytes = match parse_tile_path(path).ok_or("bad path")? {
                TileRequest::Hashes(l, n, w) => self.ledger.tile(l, n, w),
                TileRequest::Entries(n, w) => self.ledger.entries_bundle(n, w),
            }
            .map_err(|e| e.to_string())?;
            if self.flip.as_deref() == Some(path) {
                let last = bytes.len() - 1;
                bytes[last] ^= 1;
            }
            Ok(bytes)
        }
    }

    fn ledger(dir: &std::path::Path, n: u64) -> Ledger {
        let l = Ledger::open(dir, LedgerConfig { origin: Some("t.example/log".into()), ..Default::default() })
            .expect("open");
        let entries = (0..n)
            .map(|i| Entry {
                kind: EntryKind::Admission,
                release: ReleaseHash::of_bytes(&i.to_be_bytes()),
                time_ms: i,
                body: format!("{{\"n\":{i}}}").into_bytes(),
            })
            .collect();
        l.append_many(entries).expect("append");
        l
    }

    fn local<'a>(l: &'a Ledger, flip: Option<&str>) -> Local<'a> {
        Local { ledger: l, flip: flip.map(str::to_owned), count: Cell::new(0) }
    }

    #[test]
    fn roots_nodes_and_entries_match_the_ledger_for_many_sizes() {
        let tmp = tempfile::tempdir().expect("tmp");
        let l = ledger(tmp.path(), 0);
        let mut next = 0u64;
        for size in [0u64, 1, 2, 3, 7, 255, 256, 257, 511, 512, 700, 65_536 + 300] {
            let more: Vec<Entry> = (next..size)
                .map(|i| Entry::new(EntryKind::Admission, ReleaseHash::of_bytes(&i.to_be_bytes()), b"{}".to_vec()))
                .collect();
            if !more.is_empty() {
                l.append_many(more).expect("append");
            }
            next = size;
            let root = l.root_at(size).expect("root");
            let src = local(&l, None);
            let tree = TiledTree::open(&src, size, root, 10_000).expect("edge verifies");
            if size > 0 {
                // Inclusion proofs built from tiles equal the ledger's own.
                for i in [0, size / 2, size - 1] {
                    assert_eq!(
                        merkle::inclusion_proof(i, size, &tree).expect("proof"),
                        l.inclusion_proof(i, size).expect("ledger proof")
                    );
                }
                let from = size.saturating_sub(3);
                let got = tree.entries(from, size).expect("entries");
                assert_eq!(got.len() as u64, size - from);
                assert_eq!(got[0], l.get_raw(from).expect("raw"));
            }
            // A wrong root is caught at open.
            if size > 0 {
                assert!(matches!(TiledTree::open(&src, size, [1u8; 32], 100), Err(TilesError::Tampered { .. })));
            }
        }
    }

    #[test]
    fn consistency_holds_for_prefixes_and_fails_for_forks() {
        let tmp = tempfile::tempdir().expect("tmp");
        let l = ledger(tmp.path(), 600);
        let src = local(&l, None);
        let tree = TiledTree::open(&src, 600, l.root_at(600).expect("root"), 10_000).expect("open");
        for old in [0u64, 1, 5, 256, 300, 599, 600] {
            let proof_from_tiles = if old > 0 && old < 600 {
                merkle::consistency_proof(old, 600, &tree).expect("proof")
            } else {
                Vec::new()
            };
            if old > 0 && old < 600 {
                assert_eq!(proof_from_tiles, l.consistency_proof(old, 600).expect("ledger proof"));
            }
            check_consistency(old, &l.root_at(old).expect("root"), &tree).expect("consistent");
        }
        // A fork: another log with a different entry 3.
        let tmp2 = tempfile::tempdir().expect("tmp");
        let fork = ledger(tmp2.path(), 0);
        let mut entries: Vec<Entry> = (0..300u64).map(|i| l.get(i).expect("get")).collect();
        entries[3].body = b"{\"forked\":true}".to_vec();
        fork.append_many(entries).expect("append");
        let fork_root = fork.root_at(300).expect("root");
        assert!(matches!(check_consistency(300, &fork_root, &tree), Err(TilesError::Inconsistent(_))));
        let fsrc = local(&fork, None);
        let ftree = TiledTree::open(&fsrc, 300, fork_root, 1000).expect("open fork");
        assert!(matches!(
            check_consistency(300, &l.root_at(300).expect("root"), &ftree),
            Err(TilesError::Inconsistent(_))
        ));
    }

    #[test]
    fn tampered_full_partial_and_entry_tiles_are_detected() {
        let tmp = tempfile::tempdir().expect("tmp");
        let l = ledger(tmp.path(), 600);
        let root = l.root_at(600).expect("root");
        // Partial level-0 tile: caught at open.
        let src = local(&l, Some("tile/0/002.p/88"));
        assert!(matches!(TiledTree::open(&src, 600, root, 100), Err(TilesError::Tampered { .. })));
        // Full level-0 tile: caught when one of its hashes is used.
        let src = local(&l, Some("tile/0/000"));
        let tree = TiledTree::open(&src, 600, root, 100).expect("edge is fine");
        assert!(matches!(tree.node(0, 5), Err(TilesError::Tampered { .. })));
        assert!(matches!(check_consistency(5, &l.root_at(5).expect("r"), &tree), Err(TilesError::Tampered { .. })));
        // Entry bundle: caught against the leaf hashes.
        let src = local(&l, Some("tile/entries/001"));
        let tree = TiledTree::open(&src, 600, root, 100).expect("open");
        assert!(matches!(tree.entries(250, 600), Err(TilesError::Tampered { .. })));
        // Untampered: fine, and the fetch budget bounds the work.
        let src = local(&l, None);
        let tree = TiledTree::open(&src, 600, root, 100).expect("open");
        assert_eq!(tree.entries(0, 600).expect("entries").len(), 600);
        let tree = TiledTree::open(&src, 600, root, 3).expect("open");
        assert!(matches!(tree.entries(0, 600), Err(TilesError::Budget(_))));
    }

    #[test]
    fn bundles_must_have_exactly_their_width() {
        assert_eq!(split_bundle(&[0, 1, b'a', 0, 0], 2), Ok(vec![b"a".to_vec(), Vec::new()]));
        assert!(split_bundle(&[0, 1, b'a'], 2).is_err());
        assert!(split_bundle(&[0, 2, b'a'], 1).is_err());
        assert!(split_bundle(&[0], 1).is_err());
    }
}

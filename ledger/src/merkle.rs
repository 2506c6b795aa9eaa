//! RFC 6962 / RFC 9162 Merkle tree hashing over hashes kept by *stored-hash index*.
//!
//! Every complete subtree of the log — level `l`, `n`-th from the left — has its hash
//! stored once, under [`stored_hash_index`]`(l, n)`, in the order the hashes are
//! produced (the layout of Go's `sumdb/tlog`, which C2SP tlog-tiles serves). Appending a
//! record writes one leaf hash plus one hash per subtree it completes, tree heads and
//! proofs read only O(log² n) stored hashes, and a tile is a run of key reads.
//!
//! The module is sans-I/O: reads go through [`HashReader`], so the RocksDB store, the
//! in-memory test reader and the verifier share one piece of arithmetic. Proof
//! *generation* follows the recursive definitions of RFC 6962 §2.1.1–2.1.2; proof
//! *verification* follows the iterative algorithms of RFC 9162 §2.1.3.2 and §2.1.4.2.
//! Written here rather than taken from a crate because it is ~200 lines and must read
//! our own storage layout; it is tested against `ct-merkle`.

use sha2::{Digest, Sha256};

/// A SHA-256 node or leaf hash.
pub type Hash = [u8; 32];

/// Failure of a [`HashReader`] or of the tree arithmetic it feeds.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum TreeError {
    /// A stored hash the arithmetic needs is missing.
    #[error("stored hash {0} is missing")]
    MissingHash(u64),
    /// The request does not fit the tree (index past the end, old size past new size…).
    #[error("bad tree request: {0}")]
    BadRequest(String),
    /// The backing store failed.
    #[error("hash store: {0}")]
    Store(String),
}

/// Where stored hashes come from.
pub trait HashReader {
    /// Returns the hashes at the given stored-hash indexes, in the same order.
    fn read_hashes(&self, indexes: &[u64]) -> Result<Vec<Hash>, TreeError>;
}

impl HashReader for Vec<Hash> {
    fn read_hashes(&self, indexes: &[u64]) -> Result<Vec<Hash>, TreeError> {
        indexes
            .iter()
            .map(|&i| usize::try_from(i).ok().and_then(|u| self.get(u)).copied().ok_or(TreeError::MissingHash(i)))
            .collect()
    }
}

/// RFC 6962 leaf hash: `SHA-256(0x00 || entry)`.
pub fn leaf_hash(entry: &[u8]) -> Hash {
    let mut h = Sha256::new();
    h.update([0u8]);
    h.update(entry);
    h.finalize().into()
}

/// RFC 6962 interior node hash: `SHA-256(0x01 || left || right)`.
pub fn node_hash(left: &Hash, right: &Hash) -> Hash {
    let mut h = Sha256::new();
    h.update([1u8]);
    h.update(left);
    h.update(right);
    h.finalize().into()
}

/// Root of the empty tree, `SHA-256("")` (RFC 6962 §2.1).
pub fn empty_root() -> Hash {
    Sha256::digest([]).into()
}

/// Stored-hash index of the `n`-th complete subtree at `level` (leaves are level 0).
///
/// Hashes are numbered in the order an append-only writer produces them: record `k`'s
/// leaf hash, then the hashes of the subtrees it completes, bottom up.
pub fn stored_hash_index(level: u8, n: u64) -> u64 {
    // Index of the last leaf of the subtree, then count hashes stored before it.
    let mut n = n;
    for _ in 0..level {
        n = 2 * n + 1;
    }
    let mut i = 0u64;
    let mut m = n;
    while m > 0 {
        i += m;
        m >>= 1;
    }
    i + u64::from(level)
}

/// Inverse of [`stored_hash_index`]: `(level, n)`.
pub fn split_stored_hash_index(index: u64) -> (u8, u64) {
    // Find the leaf record whose hashes contain `index`: record k starts at
    // stored_hash_index(0, k) = 2k − popcount(k).
    let mut n = index / 2;
    let mut start = stored_hash_index(0, n);
    while start > index {
        n -= 1;
        start = stored_hash_index(0, n);
    }
    loop {
        let next = stored_hash_index(0, n + 1);
        if next > index {
            break;
        }
        n += 1;
        start = next;
    }
    let level = (index - start) as u8;
    (level, n >> level)
}

/// Number of stored hashes in a tree of `n` records.
pub fn stored_hash_count(n: u64) -> u64 {
    if n == 0 {
        return 0;
    }
    // All hashes of records 0..n−1, i.e. up to and including those of record n−1.
    let last = n - 1;
    stored_hash_index(0, last) + 1 + u64::from(last.trailing_ones())
}

/// The hashes to store when appending record `n` with leaf hash `leaf`, in stored-hash
/// order starting at `stored_hash_index(0, n)`.
pub fn stored_hashes_for_record(n: u64, leaf: Hash, reader: &impl HashReader) -> Result<Vec<Hash>, TreeError> {
    let completes = n.trailing_ones() as u8;
    let indexes: Vec<u64> = (0..completes).map(|i| stored_hash_index(i, (n >> i) - 1)).collect();
    let siblings = reader.read_hashes(&indexes)?;
    let mut out = Vec::with_capacity(1 + usize::from(completes));
    let mut h = leaf;
    out.push(h);
    for s in &siblings {
        h = node_hash(s, &h);
        out.push(h);
    }
    Ok(out)
}

/// Largest power of two strictly less than `n` (`n ≥ 2`), as RFC 6962's split point `k`.
fn split_point(n: u64) -> u64 {
    debug_assert!(n >= 2);
    1u64 << (63 - (n - 1).leading_zeros())
}

/// Hash of the leaves `[lo, hi)`, which must be an RFC 6962 subtree of some tree head.
/// An aligned power-of-two range is one stored hash; other ranges recurse on the right.
fn range_hash(lo: u64, hi: u64, reader: &impl HashReader) -> Result<Hash, TreeError> {
    let mut indexes = Vec::new();
    let mut l = lo;
    while l < hi {
        let size = hi - l;
        let k = if size.is_power_of_two() { size } else { split_point(size) };
        let level = k.trailing_zeros() as u8;
        if l & (k - 1) != 0 {
            return Err(TreeError::BadRequest(format!("[{lo}, {hi}) is not a subtree of a tree head")));
        }
        indexes.push(stored_hash_index(level, l >> level));
        l += k;
    }
    let hashes = reader.read_hashes(&indexes)?;
    let mut iter = hashes.iter().rev();
    let mut h = *iter.next().ok_or_else(|| TreeError::BadRequest(format!("empty range [{lo}, {hi})")))?;
    for left in iter {
        h = node_hash(left, &h);
    }
    Ok(h)
}

/// Tree head (RFC 6962 Merkle Tree Hash) of the first `n` records.
pub fn tree_hash(n: u64, reader: &impl HashReader) -> Result<Hash, TreeError> {
    if n == 0 {
        return Ok(empty_root());
    }
    range_hash(0, n, reader)
}

/// Inclusion proof (RFC 6962 `PATH`) of record `index` in the tree of size `size`.
pub fn inclusion_proof(index: u64, size: u64, reader: &impl HashReader) -> Result<Vec<Hash>, TreeError> {
    if index >= size {
        return Err(TreeError::BadRequest(format!("record {index} is not in a tree of size {size}")));
    }
    let mut proof = Vec::new();
    path(index, 0, size, reader, &mut proof)?;
    Ok(proof)
}

fn path(m: u64, lo: u64, hi: u64, reader: &impl HashReader, out: &mut Vec<Hash>) -> Result<(), TreeError> {
    let n = hi - lo;
    if n <= 1 {
        return Ok(());
    }
    let k = split_point(n);
    if m < k {
        path(m, lo, lo + k, reader, out)?;
        out.push(range_hash(lo + k, hi, reader)?);
    } else {
        path(m - k, lo + k, hi, reader, out)?;
        out.push(range_hash(lo, lo + k, reader)?);
    }
    Ok(())
}

/// Consistency proof (RFC 6962 `PROOF`) that the tree of size `old` is a prefix of the
/// tree of size `new`. Empty when `old` is 0 or equals `new`.
pub fn consistency_proof(old: u64, new: u64, reader: &impl HashReader) -> Result<Vec<Hash>, TreeError> {
    if old > new {
        return Err(TreeError::BadRequest(format!("old size {old} is larger than new size {new}")));
    }
    let mut proof = Vec::new();
    if old == 0 || old == new {
        return Ok(proof);
    }
    subproof(old, 0, new, true, reader, &mut proof)?;
    Ok(proof)
}

fn subproof(
    m: u64,
    lo: u64,
    hi: u64,
    complete: bool,
    reader: &impl HashReader,
    out: &mut Vec<Hash>,
) -> Result<(), TreeError> {
    let n = hi - lo;
    if m == n {
        if !complete {
            out.push(range_hash(lo, hi, reader)?);
        }
        return Ok(());
    }
    let k = split_point(n);
    if m <= k {
        subproof(m, lo, lo + k, complete, reader, out)?;
        out.push(range_hash(lo + k, hi, reader)?);
    } else {
        subproof(m - k, lo + k, hi, false, reader, out)?;
        out.push(range_hash(lo, lo + k, reader)?);
    }
    Ok(())
}

/// Checks an inclusion proof (RFC 9162 §2.1.3.2): that `leaf` is record `index` of the
/// tree of size `size` with head `root`.
pub fn verify_inclusion(index: u64, size: u64, leaf: &Hash, proof: &[Hash], root: &Hash) -> bool {
    if index >= size {
        return false;
    }
    let (mut f, mut s) = (index, size - 1);
    let mut r = *leaf;
    for p in proof {
        if s == 0 {
            return false;
        }
        if f & 1 == 1 || f == s {
            r = node_hash(p, &r);
            if f & 1 == 0 {
                while f & 1 == 0 && f != 0 {
                    f >>= 1;
                    s >>= 1;
                }
            }
        } else {
            r = node_hash(&r, p);
        }
        f >>= 1;
        s >>= 1;
    }
    s == 0 && r == *root
}

/// Checks a consistency proof (RFC 9162 §2.1.4.2): that the tree of size `old` with head
/// `old_root` is a prefix of the tree of size `new` with head `new_root`.
pub fn verify_consistency(old: u64, new: u64, old_root: &Hash, new_root: &Hash, proof: &[Hash]) -> bool {
    if old > new {
        return false;
    }
    if old == new {
        return proof.is_empty() && old_root == new_root;
    }
    if old == 0 {
        return proof.is_empty();
    }
    if proof.is_empty() {
        return false;
    }
    let mut path: Vec<Hash> = Vec::with_capacity(proof.len() + 1);
    if old.is_power_of_two() {
        path.push(*old_root);
    }
    path.extend_from_slice(proof);
    let (mut f, mut s) = (old - 1, new - 1);
    while f & 1 == 1 {
        f >>= 1;
        s >>= 1;
    }
    let (mut fr, mut sr) = (path[0], path[0]);
    for c in &path[1..] {
        if s == 0 {
            return false;
        }
        if f & 1 == 1 || f == s {
            fr = node_hash(c, &fr);
            sr = node_hash(c, &sr);
            if f & 1 == 0 {
                while f & 1 == 0 && f != 0 {
                    f >>= 1;
                    s >>= 1;
                }
            }
        } else {
            sr = node_hash(&sr, c);
        }
        f >>= 1;
        s >>= 1;
    }
    fr == *old_root && sr == *new_root && s == 0
}

/// Incremental recomputation of the log from its leaves, holding only the O(log n)
/// roots of the complete subtrees on the right edge. Used to audit stored hashes
/// without trusting any of them.
#[derive(Clone, Debug, Default)]
pub struct CompactRange {
    size: u64,
    /// Roots of complete subtrees, left (largest) to right (smallest).
    stack: Vec<Hash>,
}

impl CompactRange {
    /// Number of leaves absorbed.
    pub fn size(&self) -> u64 {
        self.size
    }

    /// Absorbs the next leaf and returns the hashes an honest store holds for it, in
    /// stored-hash order (as [`stored_hashes_for_record`]).
    pub fn push(&mut self, leaf: Hash) -> Vec<Hash> {
        let mut out = vec![leaf];
        let mut h = leaf;
        for _ in 0..self.size.trailing_ones() {
            // The stack holds one root per set bit of `size`; trailing ones pop.
            let Some(left) = self.stack.pop() else { break };
            h = node_hash(&left, &h);
            out.push(h);
        }
        self.stack.push(h);
        self.size += 1;
        out
    }

    /// Tree head of the leaves absorbed so far.
    pub fn root(&self) -> Hash {
        let mut iter = self.stack.iter().rev();
        let Some(mut h) = iter.next().copied() else {
            return empty_root();
        };
        for left in iter {
            h = node_hash(left, &h);
        }
        h
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ct_merkle::mem_backed_tree::MemoryBackedTree;
    use ct_merkle::{ConsistencyProof, InclusionProof, RootHash};
    use sha2_ct::Sha256 as CtSha256;

    fn build(n: u64) -> (Vec<Hash>, MemoryBackedTree<CtSha256, Vec<u8>>) {
        let mut stored: Vec<Hash> = Vec::new();
        let mut reference = MemoryBackedTree::<CtSha256, Vec<u8>>::new();
        for i in 0..n {
            let entry = format!("entry {i}").into_bytes();
            let hs = stored_hashes_for_record(i, leaf_hash(&entry), &stored).expect("previous hashes present");
            assert_eq!(stored.len() as u64, stored_hash_index(0, i));
            stored.extend(hs);
            reference.push(entry);
        }
        assert_eq!(stored.len() as u64, stored_hash_count(n));
        (stored, reference)
    }

    fn ct_root(h: &Hash, n: u64) -> RootHash<CtSha256> {
        RootHash::new((*h).into(), n)
    }

    #[test]
    fn stored_hash_index_round_trips_and_is_dense() {
        let mut seen = Vec::new();
        for n in 0..300u64 {
            let base = stored_hash_index(0, n);
            for level in 0..=(n.trailing_ones() as u8) {
                let idx = stored_hash_index(level, n >> level);
                assert_eq!(idx, base + u64::from(level));
                assert_eq!(split_stored_hash_index(idx), (level, n >> level));
                seen.push(idx);
            }
        }
        let expect: Vec<u64> = (0..seen.len() as u64).collect();
        assert_eq!(seen, expect, "indexes are assigned densely in append order");
        assert_eq!(stored_hash_index(0, 0), 0);
        assert_eq!(stored_hash_index(1, 0), 2);
        assert_eq!(stored_hash_index(0, 2), 3);
    }

    #[test]
    fn empty_tree_root_is_sha256_of_nothing() {
        assert_eq!(
            hex::encode(tree_hash(0, &Vec::new()).expect("empty")),
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
        );
    }

    #[test]
    fn roots_match_ct_merkle_for_every_size() {
        let (stored, _) = build(130);
        let mut reference = MemoryBackedTree::<CtSha256, Vec<u8>>::new();
        let mut compact = CompactRange::default();
        for n in 1..=130u64 {
            let entry = format!("entry {}", n - 1).into_bytes();
            reference.push(entry.clone());
            compact.push(leaf_hash(&entry));
            let ours = tree_hash(n, &stored).expect("root");
            assert_eq!(ours.as_slice(), reference.root().as_bytes().as_slice(), "n={n}");
            assert_eq!(compact.root(), ours);
        }
    }

    #[test]
    fn inclusion_proofs_cross_verify_with_ct_merkle() {
        let (stored, _) = build(70);
        let mut reference = MemoryBackedTree::<CtSha256, Vec<u8>>::new();
        for size in 1..=70u64 {
            reference.push(format!("entry {}", size - 1).into_bytes());
            let root = tree_hash(size, &stored).expect("root");
            for i in 0..size {
                let entry = format!("entry {i}").into_bytes();
                let ours = inclusion_proof(i, size, &stored).expect("proof");
                // ct-merkle verifies our proof…
                let ct_proof = InclusionProof::<CtSha256>::from_bytes(ours.concat());
                ct_root(&root, size)
                    .verify_inclusion(&entry, i, &ct_proof)
                    .unwrap_or_else(|e| panic!("ct-merkle rejects {i}/{size}: {e:?}"));
                // …our verifier accepts ct-merkle's proof…
                let theirs = reference.prove_inclusion(i as usize);
                let theirs: Vec<Hash> =
                    theirs.as_bytes().chunks(32).map(|c| c.try_into().expect("32-byte chunks")).collect();
                assert_eq!(theirs, ours);
                assert!(verify_inclusion(i, size, &leaf_hash(&entry), &theirs, &root));
                // …and rejects a wrong leaf, index or proof.
                assert!(!verify_inclusion(i, size, &leaf_hash(b"x"), &ours, &root));
                if size > 1 {
                    assert!(!verify_inclusion((i + 1) % size, size, &leaf_hash(&entry), &ours, &root));
                    let mut bad = ours.clone();
                    bad[0][5] ^= 1;
                    assert!(!verify_inclusion(i, size, &leaf_hash(&entry), &bad, &root));
                }
            }
        }
    }

    #[test]
    fn consistency_proofs_cross_verify_with_ct_merkle() {
        let (stored, _) = build(70);
        for new in 1..=70u64 {
            let new_root = tree_hash(new, &stored).expect("root");
            for old in 1..=new {
                let old_root = tree_hash(old, &stored).expect("root");
                let ours = consistency_proof(old, new, &stored).expect("proof");
                let ct_proof = ConsistencyProof::<CtSha256>::try_from_bytes(ours.concat()).expect("whole hashes");
                ct_root(&new_root, new)
                    .verify_consistency(&ct_root(&old_root, old), &ct_proof)
                    .unwrap_or_else(|e| panic!("ct-merkle rejects {old}->{new}: {e:?}"));
                assert!(verify_consistency(old, new, &old_root, &new_root, &ours));
                if old < new {
                    let wrong_root = tree_hash(old - 1, &stored).expect("root");
                    assert!(!verify_consistency(old, new, &wrong_root, &new_root, &ours));
                    let mut bad = ours.clone();
                    let last = bad.len() - 1;
                    bad[last][0] ^= 0x80;
                    assert!(!verify_consistency(old, new, &old_root, &new_root, &bad));
                }
            }
        }
    }

    #[test]
    fn ct_merkle_consistency_proofs_pass_our_verifier() {
        let (stored, _) = build(40);
        for new in 2..=40u64 {
            let mut t = MemoryBackedTree::<CtSha256, Vec<u8>>::new();
            for i in 0..new {
                t.push(format!("entry {i}").into_bytes());
            }
            let new_root = tree_hash(new, &stored).expect("root");
            for old in 1..new {
                let theirs = t.prove_consistency((new - old) as usize);
                let theirs: Vec<Hash> =
                    theirs.as_bytes().chunks(32).map(|c| c.try_into().expect("32-byte chunks")).collect();
                let old_root = tree_hash(old, &stored).expect("root");
                assert!(verify_consistency(old, new, &old_root, &new_root, &theirs));
            }
        }
    }

    #[test]
    fn requests_outside_the_tree_are_errors() {
        let (stored, _) = build(5);
        assert!(inclusion_proof(5, 5, &stored).is_err());
        assert!(consistency_proof(6, 5, &stored).is_err());
        assert_eq!(tree_hash(9, &stored), Err(TreeError::MissingHash(stored_hash_index(3, 0))));
    }
}

//! The order in which a copy's view files are created, so that listing a view directory
//! (`os.listdir`, `glob`, `ls -U`) gives the host's order. A copy's view is a tmpfs, which
//! lists a directory's entries newest first; the host's file system has an order of its
//! own (ext4: name hashes). Creating each directory's files in the reverse of the host's
//! listing makes the view list them as the host does, so a server that returns files in
//! listing order answers as unprotected. The order among item files is a function of the
//! items the copy holds, and is what the unprotected server sees of them.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// The host's listing position of every entry of `dir` (by name); empty when `dir` cannot
/// be read (its entries then keep their sorted order).
fn listing_positions(dir: &Path) -> BTreeMap<std::ffi::OsString, usize> {
    match std::fs::read_dir(dir) {
        Ok(rd) => rd.flatten().enumerate().map(|(i, e)| (e.file_name(), i)).collect(),
        Err(_) => BTreeMap::new(),
    }
}

/// Indexes into `paths` in the order to create them: for each path, the host listing
/// positions of its components (from the top) taken in descending order, so the last one
/// listed on the host is created first. `read_dir` is called once per distinct directory.
pub fn creation_order(paths: &[&Path]) -> Vec<usize> {
    let mut listings: BTreeMap<PathBuf, BTreeMap<std::ffi::OsString, usize>> = BTreeMap::new();
    let mut keys: Vec<(Vec<std::cmp::Reverse<usize>>, usize)> = Vec::with_capacity(paths.len());
    for (i, p) in paths.iter().enumerate() {
        let mut key = Vec::new();
        let mut parent = PathBuf::new();
        for c in p.components() {
            let name = c.as_os_str();
            if !parent.as_os_str().is_empty() {
                let listing = listings.entry(parent.clone()).or_insert_with(|| listing_positions(&parent));
                key.push(std::cmp::Reverse(listing.get(name).copied().unwrap_or(usize::MAX)));
            }
            parent.push(name);
        }
        keys.push((key, i));
    }
    // Ties (unreadable directories) keep the caller's order.
    keys.sort();
    keys.into_iter().map(|(_, i)| i).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_directory_is_created_in_the_reverse_of_its_host_listing() {
        let dir = tempfile::tempdir().unwrap();
        for n in ["b.txt", "a.txt", "c.txt"] {
            std::fs::write(dir.path().join(n), n).unwrap();
        }
        let host: Vec<PathBuf> = std::fs::read_dir(dir.path()).unwrap().flatten().map(|e| e.path()).collect();
        let mut sorted = host.clone();
        sorted.sort();
        let refs: Vec<&Path> = sorted.iter().map(PathBuf::as_path).collect();
        let order: Vec<&Path> = creation_order(&refs).into_iter().map(|i| refs[i]).collect();
        let want: Vec<&Path> = host.iter().rev().map(PathBuf::as_path).collect();
        assert_eq!(order, want);
    }
}

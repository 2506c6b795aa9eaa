//! C2SP tlog-tiles paths (`tile/<L>/<N>[.p/<W>]`, `tile/entries/<N>[.p/<W>]`).
//!
//! Written here because Go-style tile paths (as `tlog_tiles::Tile::path()` emits) differ
//! from C2SP's in the entries path and the partial-tile suffix; fleet sync serves and
//! fetches exactly these.

use crate::store::TILE_WIDTH;

/// Encodes a tile index as C2SP path elements: three-digit groups, all but the last
/// prefixed with `x` (1234067 → `x001/x234/067`).
pub fn index_path(n: u64) -> String {
    let mut groups = vec![format!("{:03}", n % 1000)];
    let mut rest = n / 1000;
    while rest > 0 {
        groups.push(format!("x{:03}", rest % 1000));
        rest /= 1000;
    }
    groups.reverse();
    groups.join("/")
}

fn width_suffix(width: u16) -> String {
    if u64::from(width) >= TILE_WIDTH {
        String::new()
    } else {
        format!(".p/{width}")
    }
}

/// Path of hash tile `n` at tile level `level` with `width` hashes (256 = full).
pub fn tile_path(level: u8, n: u64, width: u16) -> String {
    format!("tile/{level}/{}{}", index_path(n), width_suffix(width))
}

/// Path of entry bundle `n` with `width` entries (256 = full).
pub fn entries_path(n: u64, width: u16) -> String {
    format!("tile/entries/{}{}", index_path(n), width_suffix(width))
}

/// What a tile path asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TileRequest {
    /// A hash tile: level, index, width.
    Hashes(u8, u64, u16),
    /// An entry bundle: index, width.
    Entries(u64, u16),
}

/// Parses a C2SP tile path (strictly: non-canonical spellings are refused, so each tile
/// has exactly one name and caches cannot be split).
pub fn parse_tile_path(path: &str) -> Option<TileRequest> {
    let rest = path.strip_prefix("tile/")?;
    let (level, rest) = rest.split_once('/')?;
    let (body, width) = match rest.split_once(".p/") {
        Some((b, w)) => {
            if w.is_empty() || w.starts_with('0') || !w.bytes().all(|c| c.is_ascii_digit()) {
                return None;
            }
            let w: u16 = w.parse().ok()?;
            if w == 0 || u64::from(w) >= TILE_WIDTH {
                return None;
            }
            (b, w)
        }
        None => (rest, TILE_WIDTH as u16),
    };
    let parts: Vec<&str> = body.split('/').collect();
    let mut n: u64 = 0;
    for (i, p) in parts.iter().enumerate() {
        let digits = if i + 1 < parts.len() { p.strip_prefix('x')? } else { p };
        if digits.len() != 3 || !digits.bytes().all(|c| c.is_ascii_digit()) {
            return None;
        }
        n = n.checked_mul(1000)?.checked_add(digits.parse::<u64>().ok()?)?;
    }
    if index_path(n) != body {
        return None;
    }
    if level == "entries" {
        return Some(TileRequest::Entries(n, width));
    }
    if level.len() > 1 && level.starts_with('0') {
        return None;
    }
    let level: u8 = level.parse().ok()?;
    if level > 7 {
        return None;
    }
    Some(TileRequest::Hashes(level, n, width))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_follow_c2sp() {
        assert_eq!(index_path(0), "000");
        assert_eq!(index_path(999), "999");
        assert_eq!(index_path(1000), "x001/000");
        assert_eq!(index_path(1_234_067), "x001/x234/067");
        assert_eq!(tile_path(0, 1_234_067, 256), "tile/0/x001/x234/067");
        assert_eq!(tile_path(1, 5, 17), "tile/1/005.p/17");
        assert_eq!(entries_path(48, 256), "tile/entries/048");
        assert_eq!(entries_path(48, 3), "tile/entries/048.p/3");
    }

    #[test]
    fn parse_inverts_paths_and_rejects_non_canonical_ones() {
        for (l, n, w) in [(0u8, 0u64, 256u16), (2, 1_234_067, 9), (5, 999, 255)] {
            assert_eq!(parse_tile_path(&tile_path(l, n, w)), Some(TileRequest::Hashes(l, n, w)));
            assert_eq!(parse_tile_path(&entries_path(n, w)), Some(TileRequest::Entries(n, w)));
        }
        for bad in [
            "tile/0/1",
            "tile/0/x000/001",
            "tile/0/001.p/0",
            "tile/0/001.p/256",
            "tile/0/001.p/07",
            "tile/00/001",
            "tile/9/001",
            "tiles/0/001",
            "tile/0/001/",
        ] {
            assert_eq!(parse_tile_path(bad), None, "{bad}");
        }
    }
}

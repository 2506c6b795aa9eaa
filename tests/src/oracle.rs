//! The disclosure oracle: decides, from outside the runtime under test, whether a
//! destination received data it was not cleared for.
//!
//! Tests plant a fresh [`Canary`] in each labelled item and afterwards scan every byte a
//! [`Sink`](crate::sink::Sink) received. Hidden code in a release will not send a canary
//! verbatim if it can help it, so the oracle undoes the encodings a smuggler reaches for
//! first — JSON and backslash escapes, percent-encoding, hex, base64 (any alphabet,
//! padding and alignment, nested) and interleaved invisible characters — in any
//! combination up to [`MAX_LAYERS`] deep, and it also looks for a canary's random part
//! on its own, because the adversary knows the canary format. The oracle must never be the reason a
//! leak goes unnoticed, so it errs towards work, not towards silence: if a haystack is so
//! adversarially shaped that the search would exceed its work budget, it panics instead of
//! answering "no disclosure".

use std::collections::hash_map::{DefaultHasher, Entry};
use std::collections::HashMap;
use std::fmt;
use std::fs::File;
use std::hash::{Hash, Hasher};
use std::io::Read;

use germline_model::Clearance;

/// How many decoding layers the oracle peels at most (base64 of base64 of base64 inside
/// a JSON string is four).
pub const MAX_LAYERS: usize = 4;

/// Total bytes the decoders may produce for one [`discloses`] call before the oracle
/// refuses to answer. Far above what any realistic sink capture needs.
const WORK_BUDGET: usize = 1 << 31;

/// A random marker planted in one labelled item; finding it at a sink proves that the
/// item (or something derived from it) reached that sink.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Canary {
    text: String,
    label_tag: String,
}

impl Canary {
    /// A new canary `GLC-<label_tag>-<24 hex>` with 96 random bits, so that no two test
    /// runs, items or copies can ever produce the same marker by accident. Characters of
    /// `label_tag` outside `[a-z0-9._-]` are replaced by `_` to keep the marker inert in
    /// URLs, JSON and headers.
    pub fn fresh(label_tag: &str) -> Canary {
        let mut random = [0u8; 12];
        File::open("/dev/urandom")
            .and_then(|mut f| f.read_exact(&mut random))
            .expect("the test world needs /dev/urandom to make canaries");
        let tag: String = label_tag
            .chars()
            .map(|c| if c.is_ascii_lowercase() || c.is_ascii_digit() || "._-".contains(c) { c } else { '_' })
            .collect();
        let mut text = format!("GLC-{tag}-");
        for b in random {
            text.push_str(&format!("{b:02x}"));
        }
        Canary { text, label_tag: label_tag.to_owned() }
    }

    /// The marker text to embed in an item.
    pub fn as_str(&self) -> &str {
        &self.text
    }

    /// The label tag the canary was made for, as given to [`Canary::fresh`].
    pub fn label_tag(&self) -> &str {
        &self.label_tag
    }
}

impl fmt::Display for Canary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

impl AsRef<str> for Canary {
    fn as_ref(&self) -> &str {
        &self.text
    }
}

/// One decoding step the oracle can undo; a found canary's [`Encoding`] is built from
/// the steps, outermost first.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Layer {
    /// JSON string escapes (`\uXXXX` with surrogate pairs, `\n`, `\/`, ...), plus the
    /// `\xHH` byte escapes of Python and JavaScript literals.
    JsonEscape,
    /// Percent-encoding of any subset of the bytes, `+` for space.
    Url,
    /// Base64 in the standard or URL-safe alphabet (even mixed), padded or not, at any
    /// offset inside a larger blob, tolerating MIME line breaks.
    Base64,
    /// Hex digits, either case, at either nibble offset inside a larger hex run.
    Hex,
    /// Invisible characters (U+200B, U+200C, U+200D, U+2060, U+FEFF and a few more
    /// formatting characters) interleaved, as UTF-8 or as `\uXXXX` escapes.
    ZeroWidth,
    /// Not a decoding but the last step of a chain: only a [`Canary`]'s random part
    /// arrived — its 24 hex digits in either case, or the 12 bytes they spell. The
    /// `GLC-<label>-` prefix is public, so a smuggler who knows the format drops it.
    SecretOnly,
}

impl Layer {
    /// Order in which the search tries layers; only the shortest chain is reported, so
    /// this order only breaks ties between chains of equal length.
    const ALL: [Layer; 5] = [Layer::ZeroWidth, Layer::JsonEscape, Layer::Url, Layer::Hex, Layer::Base64];
}

/// How a canary was found in a haystack: the shortest chain of [`Layer`]s that reveals it.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Encoding {
    /// The canary bytes appear verbatim.
    Raw,
    /// Hidden behind JSON (or `\x`) escapes.
    JsonEscaped,
    /// Percent-encoded, wholly or partly.
    UrlEncoded,
    /// Hex-encoded.
    Hex,
    /// Interleaved with invisible characters.
    ZeroWidth,
    /// Only the canary's random part, as hex text or raw bytes, with no encoding.
    SecretOnly,
    /// Base64, `depth` times nested (1 = plain base64).
    Base64 {
        /// How many base64 layers wrap the canary.
        depth: u8,
    },
    /// Any other combination of layers, outermost first.
    Layered(Vec<Layer>),
}

impl Encoding {
    fn from_layers(layers: Vec<Layer>) -> Encoding {
        match layers.as_slice() {
            [] => Encoding::Raw,
            [Layer::JsonEscape] => Encoding::JsonEscaped,
            [Layer::Url] => Encoding::UrlEncoded,
            [Layer::Hex] => Encoding::Hex,
            [Layer::ZeroWidth] => Encoding::ZeroWidth,
            [Layer::SecretOnly] => Encoding::SecretOnly,
            all if all.iter().all(|l| *l == Layer::Base64) => {
                Encoding::Base64 { depth: u8::try_from(all.len()).unwrap_or(u8::MAX) }
            }
            _ => Encoding::Layered(layers),
        }
    }
}

/// Whether `canary` can be read out of `haystack` by peeling at most [`MAX_LAYERS`]
/// encodings, and if so the shortest such chain.
///
/// For a canary of [`Canary::fresh`]'s form the random part alone also counts (see
/// [`Layer::SecretOnly`]); where a buffer holds both, the whole canary is reported.
///
/// An empty canary is trivially disclosed ([`Encoding::Raw`]).
///
/// # Panics
///
/// When the haystack would make the decoders produce more than the oracle's work budget
/// (2 GiB); failing loudly is safer than reporting "no disclosure" unchecked.
pub fn discloses(haystack: &[u8], canary: &str) -> Option<Encoding> {
    let needle = canary.as_bytes();
    let secret = secret_part(canary).map(|hex| {
        let raw = hex.as_bytes().chunks_exact(2).filter_map(|p| hex_pair(p[0], p[1])).collect::<Vec<u8>>();
        (hex.as_bytes().to_vec(), raw)
    });
    let shortest = secret.as_ref().map_or(needle.len(), |(_, raw)| raw.len().min(needle.len()));
    let mut search = Search { needle, secret, shortest, work: 0, path: Vec::new(), best: None, seen: HashMap::new() };
    search.visit(haystack);
    search.best.map(Encoding::from_layers)
}

/// The 24 hex digits that make a [`Canary::fresh`] canary unguessable, if `canary` has
/// that form.
fn secret_part(canary: &str) -> Option<&str> {
    let tail = canary.get(canary.len().checked_sub(SECRET_HEX)?..)?;
    let head = &canary[..canary.len() - SECRET_HEX];
    let ok = head.starts_with("GLC-")
        && head.ends_with('-')
        && tail.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
    ok.then_some(tail)
}

/// Hex digits in a canary's random part.
const SECRET_HEX: usize = 24;

/// A depth-first walk over decodings that keeps the shortest chain found. Different
/// chains often yield the same bytes (independent layers commute), so each decoded
/// buffer is visited once per depth, keyed by its hash.
struct Search<'n> {
    needle: &'n [u8],
    /// The canary's random part as lower-case hex and as the bytes it spells.
    secret: Option<(Vec<u8>, Vec<u8>)>,
    /// Length of the shortest form searched for; decoders skip runs too short for it.
    shortest: usize,
    work: usize,
    path: Vec<Layer>,
    best: Option<Vec<Layer>>,
    seen: HashMap<u64, usize>,
}

impl Search<'_> {
    /// The chain that reveals a form of the canary in `buf`, if any does.
    fn hit(&self, buf: &[u8]) -> Option<Vec<Layer>> {
        if contains(buf, self.needle) {
            return Some(self.path.clone());
        }
        let (hex, raw) = self.secret.as_ref()?;
        (contains_ignore_case(buf, hex) || contains(buf, raw)).then(|| {
            let mut p = self.path.clone();
            p.push(Layer::SecretOnly);
            p
        })
    }

    fn visit(&mut self, buf: &[u8]) {
        let depth = self.path.len();
        if let Some(found) = self.hit(buf) {
            // Anything found deeper along this branch would be a longer chain.
            if self.best.as_ref().is_none_or(|b| found.len() < b.len()) {
                self.best = Some(found);
            }
            return;
        }
        let bound = self.best.as_ref().map_or(MAX_LAYERS, |b| b.len() - 1);
        if depth >= bound || buf.len() < self.shortest {
            return;
        }
        for layer in Layer::ALL {
            let Some(decoded) = decode(layer, buf, self.needle, self.shortest) else {
                continue;
            };
            if decoded == buf {
                continue;
            }
            self.work = self.work.saturating_add(decoded.len());
            assert!(self.work <= WORK_BUDGET, "disclosure oracle: work budget exceeded; cannot certify non-disclosure");
            let mut h = DefaultHasher::new();
            decoded.hash(&mut h);
            match self.seen.entry(h.finish()) {
                Entry::Occupied(mut e) if *e.get() > depth + 1 => {
                    e.insert(depth + 1);
                }
                Entry::Occupied(_) => continue,
                Entry::Vacant(e) => {
                    e.insert(depth + 1);
                }
            }
            self.path.push(layer);
            self.visit(&decoded);
            self.path.pop();
        }
    }
}

/// Separates independently decoded runs; it is in no decoder's alphabet, so it can never
/// be part of a canary nor glue two runs into one.
const SEP: u8 = 0;

/// Undoes `layer` everywhere in `buf`, or `None` when the layer cannot apply (nothing
/// to undo), which keeps the search tree small on ordinary text.
fn decode(layer: Layer, buf: &[u8], needle: &[u8], shortest: usize) -> Option<Vec<u8>> {
    match layer {
        Layer::JsonEscape => json_unescape(buf),
        Layer::Url => url_decode(buf, needle),
        Layer::Base64 => base64_runs(buf, shortest),
        Layer::Hex => hex_runs(buf, shortest),
        Layer::ZeroWidth => strip_invisible(buf),
        Layer::SecretOnly => None,
    }
}

/// [`contains`] comparing ASCII letters case-blind; `needle` must be lower-case.
fn contains_ignore_case(hay: &[u8], needle: &[u8]) -> bool {
    let Some(&first) = needle.first() else {
        return true;
    };
    if hay.len() < needle.len() {
        return false;
    }
    let last_start = hay.len() - needle.len();
    let mut i = 0;
    while i <= last_start {
        // `| 0x20` folds ASCII case; the few other bytes it folds are weeded out below.
        match hay[i..=last_start].iter().position(|&b| b | 0x20 == first | 0x20) {
            None => return false,
            Some(p) => {
                let at = i + p;
                if hay[at..at + needle.len()].eq_ignore_ascii_case(needle) {
                    return true;
                }
                i = at + 1;
            }
        }
    }
    false
}

fn contains(hay: &[u8], needle: &[u8]) -> bool {
    let Some((&first, rest)) = needle.split_first() else {
        return true;
    };
    if hay.len() < needle.len() {
        return false;
    }
    let last_start = hay.len() - needle.len();
    let mut i = 0;
    while i <= last_start {
        match hay[i..=last_start].iter().position(|&b| b == first) {
            None => return false,
            Some(p) => {
                let at = i + p;
                if &hay[at + 1..at + needle.len()] == rest {
                    return true;
                }
                i = at + 1;
            }
        }
    }
    false
}

/// Marks a byte outside a decoder's alphabet in the lookup tables below.
const NOT: u8 = 0xFF;

/// Hex digit values by byte; tables keep the per-byte decoders cheap even unoptimised.
const HEX: [u8; 256] = {
    let mut t = [NOT; 256];
    let mut i = 0;
    while i < 10 {
        t[b'0' as usize + i] = i as u8;
        i += 1;
    }
    let mut i = 0;
    while i < 6 {
        t[b'a' as usize + i] = 10 + i as u8;
        t[b'A' as usize + i] = 10 + i as u8;
        i += 1;
    }
    t
};

/// Base64 sextet values by byte, standard and URL-safe alphabets merged.
const B64: [u8; 256] = {
    let mut t = [NOT; 256];
    let mut i = 0;
    while i < 26 {
        t[b'A' as usize + i] = i as u8;
        t[b'a' as usize + i] = 26 + i as u8;
        i += 1;
    }
    let mut i = 0;
    while i < 10 {
        t[b'0' as usize + i] = 52 + i as u8;
        i += 1;
    }
    t[b'+' as usize] = 62;
    t[b'-' as usize] = 62;
    t[b'/' as usize] = 63;
    t[b'_' as usize] = 63;
    t
};

fn hex_val(b: u8) -> Option<u8> {
    let v = HEX[usize::from(b)];
    (v != NOT).then_some(v)
}

fn hex_pair(hi: u8, lo: u8) -> Option<u8> {
    Some(hex_val(hi)? << 4 | hex_val(lo)?)
}

fn push_char(out: &mut Vec<u8>, c: char) {
    let mut tmp = [0u8; 4];
    out.extend_from_slice(c.encode_utf8(&mut tmp).as_bytes());
}

fn json_unescape(buf: &[u8]) -> Option<Vec<u8>> {
    if !buf.contains(&b'\\') {
        return None;
    }
    let u16_at = |i: usize| -> Option<u16> {
        let h = buf.get(i..i + 4)?;
        let mut v = 0u16;
        for &b in h {
            v = v << 4 | u16::from(hex_val(b)?);
        }
        Some(v)
    };
    let mut out = Vec::with_capacity(buf.len());
    let mut i = 0;
    while i < buf.len() {
        let b = buf[i];
        if b != b'\\' || i + 1 >= buf.len() {
            out.push(b);
            i += 1;
            continue;
        }
        let esc = buf[i + 1];
        let simple = match esc {
            b'"' => Some(b'"'),
            b'\\' => Some(b'\\'),
            b'/' => Some(b'/'),
            b'b' => Some(0x08),
            b'f' => Some(0x0c),
            b'n' => Some(b'\n'),
            b'r' => Some(b'\r'),
            b't' => Some(b'\t'),
            _ => None,
        };
        if let Some(s) = simple {
            out.push(s);
            i += 2;
        } else if esc == b'x' {
            match buf.get(i + 2..i + 4).and_then(|p| hex_pair(p[0], p[1])) {
                Some(v) => {
                    out.push(v);
                    i += 4;
                }
                None => {
                    out.push(b);
                    i += 1;
                }
            }
        } else if esc == b'u' {
            let Some(hi) = u16_at(i + 2) else {
                out.push(b);
                i += 1;
                continue;
            };
            if (0xD800..0xDC00).contains(&hi) && buf.get(i + 6) == Some(&b'\\') && buf.get(i + 7) == Some(&b'u') {
                if let Some(lo) = u16_at(i + 8).filter(|lo| (0xDC00..0xE000).contains(lo)) {
                    let cp = 0x10000 + ((u32::from(hi) - 0xD800) << 10) + (u32::from(lo) - 0xDC00);
                    push_char(&mut out, char::from_u32(cp).unwrap_or('\u{FFFD}'));
                    i += 12;
                    continue;
                }
            }
            push_char(&mut out, char::from_u32(u32::from(hi)).unwrap_or('\u{FFFD}'));
            i += 6;
        } else {
            out.push(b);
            i += 1;
        }
    }
    Some(out)
}

fn url_decode(buf: &[u8], needle: &[u8]) -> Option<Vec<u8>> {
    let has_pct = buf.windows(3).any(|w| w[0] == b'%' && hex_val(w[1]).is_some() && hex_val(w[2]).is_some());
    // `+` only matters when the canary itself has a space to hide.
    let plus = needle.contains(&b' ') && buf.contains(&b'+');
    if !has_pct && !plus {
        return None;
    }
    let mut out = Vec::with_capacity(buf.len());
    let mut i = 0;
    while i < buf.len() {
        let b = buf[i];
        if b == b'%' {
            if let Some(v) = buf.get(i + 1..i + 3).and_then(|p| hex_pair(p[0], p[1])) {
                out.push(v);
                i += 3;
                continue;
            }
        }
        out.push(if b == b'+' && plus { b' ' } else { b });
        i += 1;
    }
    Some(out)
}

/// UTF-8 encodings of the invisible characters smugglers interleave.
const INVISIBLE_UTF8: [&[u8]; 11] = [
    "\u{200B}".as_bytes(),
    "\u{200C}".as_bytes(),
    "\u{200D}".as_bytes(),
    "\u{200E}".as_bytes(),
    "\u{200F}".as_bytes(),
    "\u{2060}".as_bytes(),
    "\u{2061}".as_bytes(),
    "\u{2062}".as_bytes(),
    "\u{2063}".as_bytes(),
    "\u{2064}".as_bytes(),
    "\u{FEFF}".as_bytes(),
];

/// The same characters as the hex digits of a `\uXXXX` escape (compared case-blind).
const INVISIBLE_ESCAPES: [&[u8; 4]; 12] =
    [b"200b", b"200c", b"200d", b"200e", b"200f", b"2060", b"2061", b"2062", b"2063", b"2064", b"feff", b"00ad"];

fn invisible_at(buf: &[u8], i: usize) -> Option<usize> {
    let rest = &buf[i..];
    if rest.starts_with("\u{00AD}".as_bytes()) {
        return Some(2);
    }
    if let Some(u) = INVISIBLE_UTF8.iter().find(|u| rest.starts_with(u)) {
        return Some(u.len());
    }
    if rest.len() >= 6 && rest[0] == b'\\' && rest[1] == b'u' {
        let hex: [u8; 4] = [
            rest[2].to_ascii_lowercase(),
            rest[3].to_ascii_lowercase(),
            rest[4].to_ascii_lowercase(),
            rest[5].to_ascii_lowercase(),
        ];
        if INVISIBLE_ESCAPES.iter().any(|e| **e == hex) {
            return Some(6);
        }
    }
    None
}

fn strip_invisible(buf: &[u8]) -> Option<Vec<u8>> {
    let mut out: Option<Vec<u8>> = None;
    let mut i = 0;
    let mut copied = 0;
    while i < buf.len() {
        let b = buf[i];
        if b == 0xE2 || b == 0xEF || b == 0xC2 || b == b'\\' {
            if let Some(n) = invisible_at(buf, i) {
                let o = out.get_or_insert_with(|| Vec::with_capacity(buf.len()));
                o.extend_from_slice(&buf[copied..i]);
                i += n;
                copied = i;
                continue;
            }
        }
        i += 1;
    }
    let mut o = out?;
    o.extend_from_slice(&buf[copied..]);
    Some(o)
}

fn hex_runs(buf: &[u8], needle_len: usize) -> Option<Vec<u8>> {
    let min_run = needle_len.saturating_mul(2).max(2);
    let mut out = Vec::new();
    let mut i = 0;
    while i < buf.len() {
        if hex_val(buf[i]).is_none() {
            i += 1;
            continue;
        }
        let start = i;
        while i < buf.len() && hex_val(buf[i]).is_some() {
            i += 1;
        }
        let run = &buf[start..i];
        if run.len() < min_run {
            continue;
        }
        for offset in 0..2 {
            for pair in run[offset..].chunks_exact(2) {
                out.push(hex_pair(pair[0], pair[1]).unwrap_or(SEP));
            }
            out.push(SEP);
        }
    }
    (!out.is_empty()).then_some(out)
}

fn b64_val(b: u8) -> Option<u8> {
    let v = B64[usize::from(b)];
    (v != NOT).then_some(v)
}

fn b64_decode_sextets(sextets: &[u8], out: &mut Vec<u8>) {
    for group in sextets.chunks(4) {
        let mut acc: u32 = 0;
        for (k, &s) in group.iter().enumerate() {
            acc |= u32::from(s) << (18 - 6 * k);
        }
        let bytes = acc.to_be_bytes();
        // A group of n sextets carries n*6/8 whole bytes (4→3, 3→2, 2→1, 1→0).
        let n = group.len() * 6 / 8;
        out.extend_from_slice(&bytes[1..1 + n]);
    }
}

fn base64_runs(buf: &[u8], needle_len: usize) -> Option<Vec<u8>> {
    let min_run = needle_len.saturating_mul(4).div_ceil(3).max(2);
    let mut out = Vec::new();
    let mut sextets = Vec::new();
    let mut i = 0;
    while i < buf.len() {
        sextets.clear();
        // A run: alphabet characters, with CR/LF (MIME line breaks) skipped inside it.
        while i < buf.len() {
            match b64_val(buf[i]) {
                Some(s) => sextets.push(s),
                None if (buf[i] == b'\n' || buf[i] == b'\r') && !sextets.is_empty() => {}
                None => break,
            }
            i += 1;
        }
        i += 1;
        if sextets.len() < min_run {
            continue;
        }
        // The encoded blob may start anywhere in the run; decoding from every start
        // offset modulo 4 lines the quanta up with it once.
        for offset in 0..4 {
            b64_decode_sextets(&sextets[offset..], &mut out);
            out.push(SEP);
        }
    }
    (!out.is_empty()).then_some(out)
}

/// A canary found at a sink not cleared for its label.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Disclosure {
    /// Name of the sink, as the test called it.
    pub sink: String,
    /// The canary text.
    pub canary: String,
    /// Label tags of the item the canary was planted in.
    pub label: Vec<String>,
    /// How the canary was hidden.
    pub encoding: Encoding,
}

/// Knows every canary of a test and the label of the item each one was planted in, and
/// judges sink captures against sink clearances with the model's flow rule
/// (`label ⊆ clearance` is allowed).
#[derive(Clone, Debug, Default)]
pub struct Oracle {
    /// Planted canaries with the label tags of their items.
    pub canaries: Vec<(Canary, Vec<String>)>,
}

impl Oracle {
    /// An oracle with no canaries.
    pub fn new() -> Oracle {
        Oracle::default()
    }

    /// Makes a fresh canary for an item labelled `label_tags`, remembers it, and returns
    /// it for planting. The canary's marker names the tags joined by `.`.
    pub fn plant(&mut self, label_tags: &[&str]) -> Canary {
        let canary = Canary::fresh(&label_tags.join("."));
        self.canaries.push((canary.clone(), label_tags.iter().map(|t| (*t).to_owned()).collect()));
        canary
    }

    /// Every planted canary visible in `bytes`, cleared or not, with how it was found.
    /// Positive controls ("mechanism off" twins) use this to show the canary did travel.
    pub fn sightings(&self, bytes: &[u8]) -> Vec<(Canary, Encoding)> {
        self.canaries.iter().filter_map(|(c, _)| discloses(bytes, c.as_str()).map(|e| (c.clone(), e))).collect()
    }

    /// The disclosures in `bytes` captured at sink `sink_name` with clearance
    /// `sink_clearance`: planted canaries found there whose label is not a subset of the
    /// clearance.
    pub fn disclosures(&self, sink_name: &str, sink_clearance: &[String], bytes: &[u8]) -> Vec<Disclosure> {
        self.canaries
            .iter()
            .filter(|(_, label)| !label.iter().all(|t| sink_clearance.contains(t)))
            .filter_map(|(c, label)| {
                discloses(bytes, c.as_str()).map(|encoding| Disclosure {
                    sink: sink_name.to_owned(),
                    canary: c.as_str().to_owned(),
                    label: label.clone(),
                    encoding,
                })
            })
            .collect()
    }

    /// [`Oracle::disclosures`] for a sink whose clearance comes from the policy model.
    pub fn disclosures_to(&self, sink_name: &str, sink_clearance: &Clearance, bytes: &[u8]) -> Vec<Disclosure> {
        let tags: Vec<String> = sink_clearance.tags().map(|t| t.as_str().to_owned()).collect();
        self.disclosures(sink_name, &tags, bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Deterministic PRNG (SplitMix64) so a false positive is reproducible.
    struct Rng(u64);

    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = self.0;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            z ^ (z >> 31)
        }
        fn below(&mut self, n: usize) -> usize {
            (self.next() % n as u64) as usize
        }
        fn bytes(&mut self, n: usize) -> Vec<u8> {
            (0..n).map(|_| self.next() as u8).collect()
        }
        fn text_over(&mut self, alphabet: &[u8], n: usize) -> Vec<u8> {
            (0..n).map(|_| alphabet[self.below(alphabet.len())]).collect()
        }
    }

    const STD: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    const URL_SAFE: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";

    fn b64(data: &[u8], alphabet: &[u8; 64], pad: bool) -> Vec<u8> {
        let mut out = Vec::new();
        for chunk in data.chunks(3) {
            let mut n = [0u8; 3];
            n[..chunk.len()].copy_from_slice(chunk);
            let v = u32::from(n[0]) << 16 | u32::from(n[1]) << 8 | u32::from(n[2]);
            let chars = chunk.len() + 1;
            for k in 0..4 {
                if k < chars {
                    out.push(alphabet[(v >> (18 - 6 * k) & 63) as usize]);
                } else if pad {
                    out.push(b'=');
                }
            }
        }
        out
    }

    fn hex_lower(data: &[u8]) -> Vec<u8> {
        data.iter().flat_map(|b| format!("{b:02x}").into_bytes()).collect()
    }

    fn pct(data: &[u8], which: impl Fn(usize) -> bool) -> Vec<u8> {
        let mut out = Vec::new();
        for (i, &b) in data.iter().enumerate() {
            if which(i) {
                out.extend_from_slice(format!("%{b:02X}").as_bytes());
            } else {
                out.push(b);
            }
        }
        out
    }

    fn wrap(prefix: &[u8], middle: &[u8], suffix: &[u8]) -> Vec<u8> {
        [prefix, middle, suffix].concat()
    }

    fn canary() -> Canary {
        Canary::fresh("hr")
    }

    #[test]
    fn canary_has_the_documented_shape_and_is_fresh() {
        let a = canary();
        let b = canary();
        assert_ne!(a, b);
        let s = a.as_str();
        assert!(s.starts_with("GLC-hr-"), "{s}");
        let tail = &s["GLC-hr-".len()..];
        assert_eq!(tail.len(), 24);
        assert!(tail.bytes().all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase()));
        assert_eq!(a.label_tag(), "hr");
        assert!(Canary::fresh("Weird Tag!").as_str().starts_with("GLC-_eird__ag_-"));
    }

    #[test]
    fn raw_canary_is_detected() {
        let c = canary();
        let body = format!("POST /ocr HTTP/1.1\r\n\r\n{{\"text\":\"x {c} y\"}}");
        assert_eq!(discloses(body.as_bytes(), c.as_str()), Some(Encoding::Raw));
        assert_eq!(discloses(c.as_str().as_bytes(), c.as_str()), Some(Encoding::Raw));
    }

    #[test]
    fn url_encoded_canary_is_detected_whole_or_partial() {
        let c = canary();
        let raw = c.as_str().as_bytes();
        for which in [&(|_| true) as &dyn Fn(usize) -> bool, &|i| i % 2 == 0, &|i| i % 7 == 3, &|i| i == raw.len() / 2]
        {
            let enc = pct(raw, which);
            let hay = wrap(b"GET /q?a=1&d=", &enc, b"&z=2 HTTP/1.1\r\n");
            assert_eq!(discloses(&hay, c.as_str()), Some(Encoding::UrlEncoded));
            // Lower-case percent hex decodes too.
            let mut lower = enc.clone();
            for i in 0..lower.len() {
                if lower[i] == b'%' {
                    lower[i + 1..i + 3].make_ascii_lowercase();
                }
            }
            assert_eq!(discloses(&lower, c.as_str()), Some(Encoding::UrlEncoded));
        }
        // `+` for space, for canaries that contain one.
        let spaced = format!("{} and more", c.as_str());
        let enc = pct(spaced.replace(' ', "+").as_bytes(), |i| i % 3 == 0);
        assert_eq!(discloses(&enc, &spaced), Some(Encoding::UrlEncoded));
        // Doubly percent-encoded is two layers.
        let twice = pct(&pct(raw, |_| true), |_| true);
        assert_eq!(discloses(&twice, c.as_str()), Some(Encoding::Layered(vec![Layer::Url, Layer::Url])));
    }

    #[test]
    fn base64_is_detected_at_every_alignment_alphabet_and_padding() {
        let mut rng = Rng(1);
        let c = canary();
        for prefix_len in 0..7 {
            for suffix_len in 0..4 {
                for alphabet in [STD, URL_SAFE] {
                    for pad in [true, false] {
                        let blob = wrap(&rng.bytes(prefix_len), c.as_str().as_bytes(), &rng.bytes(suffix_len));
                        let enc = b64(&blob, alphabet, pad);
                        let hay = wrap(b"{\"payload\":\"", &enc, b"\"}");
                        assert_eq!(
                            discloses(&hay, c.as_str()),
                            Some(Encoding::Base64 { depth: 1 }),
                            "prefix {prefix_len} suffix {suffix_len} pad {pad}"
                        );
                        // Also when the blob runs into other alphabet characters.
                        let glued = wrap(b"xyz", &enc, b"");
                        assert!(discloses(&glued, c.as_str()).is_some());
                    }
                }
            }
        }
    }

    #[test]
    fn base64_with_mime_line_breaks_is_detected() {
        let c = canary();
        let blob = wrap(&[7u8; 40], c.as_str().as_bytes(), &[9u8; 40]);
        let enc = b64(&blob, STD, true);
        let mut broken = Vec::new();
        for line in enc.chunks(19) {
            broken.extend_from_slice(line);
            broken.extend_from_slice(b"\r\n");
        }
        assert_eq!(discloses(&broken, c.as_str()), Some(Encoding::Base64 { depth: 1 }));
    }

    #[test]
    fn nested_base64_is_detected_to_depth_three() {
        let mut rng = Rng(2);
        let c = canary();
        for trial in 0..12 {
            let mut blob = c.as_str().as_bytes().to_vec();
            for depth in 1..=3u8 {
                let prefix = rng.bytes(trial % 4);
                let suffix = rng.bytes(trial % 3);
                let alphabet = if (trial + usize::from(depth)) % 2 == 0 { STD } else { URL_SAFE };
                blob = b64(&wrap(&prefix, &blob, &suffix), alphabet, trial % 2 == 0);
                let hay = wrap(b"data=", &blob, b";");
                assert_eq!(
                    discloses(&hay, c.as_str()),
                    Some(Encoding::Base64 { depth }),
                    "trial {trial} depth {depth}"
                );
            }
        }
    }

    #[test]
    fn hex_is_detected_in_either_case_and_nibble_offset() {
        let c = canary();
        let lower = hex_lower(c.as_str().as_bytes());
        let upper = lower.to_ascii_uppercase();
        let mixed: Vec<u8> =
            lower.iter().enumerate().map(|(i, b)| if i % 3 == 0 { b.to_ascii_uppercase() } else { *b }).collect();
        for enc in [&lower, &upper, &mixed] {
            assert_eq!(discloses(enc, c.as_str()), Some(Encoding::Hex));
            // Odd nibble offset inside a longer hex run.
            let hay = wrap(b"id=abc", enc, b"def0");
            assert_eq!(discloses(&hay, c.as_str()), Some(Encoding::Hex));
        }
    }

    #[test]
    fn zero_width_interleaving_is_detected_as_utf8_and_json_escapes() {
        let c = canary();
        for zw in ['\u{200B}', '\u{200C}', '\u{200D}', '\u{2060}', '\u{FEFF}'] {
            let every: String = c.as_str().chars().flat_map(|ch| [ch, zw]).collect();
            let some: String = c
                .as_str()
                .chars()
                .enumerate()
                .flat_map(|(i, ch)| if i % 4 == 1 { vec![zw, ch] } else { vec![ch] })
                .collect();
            for text in [every, some] {
                assert_eq!(discloses(text.as_bytes(), c.as_str()), Some(Encoding::ZeroWidth), "{zw:?} utf-8");
                for upper in [false, true] {
                    let escaped: String = text
                        .chars()
                        .map(|ch| {
                            if ch == zw {
                                let e = format!("\\u{:04x}", u32::from(ch));
                                if upper {
                                    e.to_uppercase().replace("\\U", "\\u")
                                } else {
                                    e
                                }
                            } else {
                                ch.to_string()
                            }
                        })
                        .collect();
                    let hay = format!("{{\"note\":\"{escaped}\"}}");
                    assert_eq!(
                        discloses(hay.as_bytes(), c.as_str()),
                        Some(Encoding::ZeroWidth),
                        "{zw:?} escaped {hay}"
                    );
                }
            }
        }
    }

    #[test]
    fn json_escaped_canary_is_detected() {
        let c = canary();
        let all: String = c.as_str().chars().map(|ch| format!("\\u{:04x}", u32::from(ch))).collect();
        let some: String = c
            .as_str()
            .chars()
            .enumerate()
            .map(|(i, ch)| match (i % 3, ch) {
                (0, '-') => "\\u002D".to_owned(),
                (0, _) => format!("\\u{:04X}", u32::from(ch)),
                _ => ch.to_string(),
            })
            .collect();
        let bytes_escaped: String = c.as_str().bytes().map(|b| format!("\\x{b:02x}")).collect();
        for enc in [all, some, bytes_escaped] {
            let hay = format!("{{\"a\":1,\"msg\":\"{enc}\"}}");
            assert_eq!(discloses(hay.as_bytes(), c.as_str()), Some(Encoding::JsonEscaped), "{hay}");
        }
        // JSON escapes inside JSON escapes (a string holding serialised JSON).
        let twice: String = c.as_str().chars().map(|ch| format!("\\\\u{:04x}", u32::from(ch))).collect();
        assert_eq!(
            discloses(twice.as_bytes(), c.as_str()),
            Some(Encoding::Layered(vec![Layer::JsonEscape, Layer::JsonEscape]))
        );
    }

    #[test]
    fn combined_layers_are_detected_and_named_outermost_first() {
        let c = canary();
        let b = b64(c.as_str().as_bytes(), STD, true);
        let url = pct(&b, |i| i % 2 == 0);
        let json: String =
            String::from_utf8_lossy(&url).chars().map(|ch| format!("\\u{:04x}", u32::from(ch))).collect();
        assert_eq!(
            discloses(json.as_bytes(), c.as_str()),
            Some(Encoding::Layered(vec![Layer::JsonEscape, Layer::Url, Layer::Base64]))
        );
        let hex_of_b64 = hex_lower(&b);
        assert_eq!(discloses(&hex_of_b64, c.as_str()), Some(Encoding::Layered(vec![Layer::Hex, Layer::Base64])));
    }

    #[test]
    fn the_random_part_alone_is_detected() {
        let c = canary();
        let secret = &c.as_str()[c.as_str().len() - 24..];
        let raw: Vec<u8> = (0..12).map(|i| u8::from_str_radix(&secret[2 * i..2 * i + 2], 16).expect("hex")).collect();
        let hay = format!("id={secret}&x=1");
        assert_eq!(discloses(hay.as_bytes(), c.as_str()), Some(Encoding::SecretOnly));
        let upper = secret.to_ascii_uppercase();
        assert_eq!(discloses(upper.as_bytes(), c.as_str()), Some(Encoding::SecretOnly));
        assert_eq!(discloses(&wrap(b"\x00\x01", &raw, b"\xff"), c.as_str()), Some(Encoding::SecretOnly));
        assert_eq!(
            discloses(&b64(&raw, URL_SAFE, false), c.as_str()),
            Some(Encoding::Layered(vec![Layer::Base64, Layer::SecretOnly]))
        );
        // Only canaries of Canary::fresh's form have a separable random part.
        assert_eq!(discloses(b"0123456789abcdef01234567", "x-0123456789abcdef01234567"), None);
    }

    /// Random text shaped like what sinks receive — binary, base64, hex, percent and
    /// JSON escapes, invisible characters, other canaries and near-misses of this one —
    /// must never be reported as the canary.
    #[test]
    fn no_false_positives_over_ten_thousand_random_buffers() {
        let mut rng = Rng(0x5EED);
        let c = canary();
        let text = c.as_str().as_bytes();
        let mut near = text.to_vec();
        let last = near.len() - 1;
        near[last] = if near[last] == b'0' { b'1' } else { b'0' };
        // Changed in the middle: a decoy that no neighbouring byte can complete.
        let mut middle = text.to_vec();
        let mid = middle.len() / 2;
        middle[mid] = if middle[mid] == b'0' { b'1' } else { b'0' };
        let others: Vec<Canary> = (0..4).map(|_| Canary::fresh("hr")).collect();
        let alphabets: [&[u8]; 5] = [
            STD,
            URL_SAFE,
            b"0123456789abcdefABCDEF",
            b"GLC-hr0123456789abcdef%\\u+",
            b"abcdefghijklmnopqrstuvwxyz {}\":,\\%",
        ];
        for i in 0..10_000 {
            let len = 16 + rng.below(1024);
            let mut buf = match i % 8 {
                0 | 1 => rng.bytes(len),
                k => rng.text_over(alphabets[(k - 2) % alphabets.len()], len),
            };
            // Sprinkle escapes and invisible characters.
            if i % 3 == 0 {
                let at = rng.below(buf.len());
                let insert: &[u8] = match rng.below(4) {
                    0 => "\u{200B}".as_bytes(),
                    1 => b"\\u200b",
                    2 => b"%41%2D",
                    _ => b"\\u0047\\x4c",
                };
                buf.splice(at..at, insert.iter().copied());
            }
            // Plant a decoy: a near-miss or another canary, in some encoding.
            let decoy: &[u8] = match i % 5 {
                0 => &near,
                1 => &middle,
                2 => others[i % others.len()].as_str().as_bytes(),
                _ => b"",
            };
            if !decoy.is_empty() {
                let enc = match rng.below(5) {
                    0 => decoy.to_vec(),
                    1 => b64(decoy, STD, true),
                    2 => b64(&b64(decoy, URL_SAFE, false), STD, true),
                    3 => hex_lower(decoy),
                    _ => pct(decoy, |_| true),
                };
                let at = rng.below(buf.len());
                buf.splice(at..at, enc);
            }
            assert_eq!(discloses(&buf, c.as_str()), None, "buffer {i}: {buf:?}");
        }
    }

    #[test]
    fn large_base64_capture_stays_within_budget() {
        let mut rng = Rng(3);
        let c = canary();
        let blob = b64(&b64(&rng.bytes(150_000), STD, true), STD, true);
        assert_eq!(discloses(&blob, c.as_str()), None);
        let mut with = rng.bytes(100_000);
        with.splice(50_000..50_000, c.as_str().bytes());
        let blob = b64(&b64(&b64(&with, STD, true), URL_SAFE, false), STD, true);
        assert_eq!(discloses(&blob, c.as_str()), Some(Encoding::Base64 { depth: 3 }));
    }

    #[test]
    fn empty_haystack_discloses_nothing() {
        assert_eq!(discloses(b"", canary().as_str()), None);
    }

    fn tags(t: &[&str]) -> Vec<String> {
        t.iter().map(|s| (*s).to_owned()).collect()
    }

    #[test]
    fn oracle_counts_only_flows_outside_the_clearance() {
        let mut oracle = Oracle::new();
        let hr = oracle.plant(&["hr"]);
        let both = oracle.plant(&["finance", "hr"]);
        let public = oracle.plant(&[]);
        let bytes = format!("{hr} {} {public}", String::from_utf8_lossy(&b64(both.as_str().as_bytes(), STD, true)));
        let bytes = bytes.as_bytes();

        // Cleared for everything it got: nothing counted, though everything was seen.
        assert!(oracle.disclosures("ocr", &tags(&["finance", "hr"]), bytes).is_empty());
        assert_eq!(oracle.sightings(bytes).len(), 3);

        // Cleared for hr only: the finance+hr item is a disclosure, the hr item is not.
        let d = oracle.disclosures("ocr", &tags(&["hr", "other"]), bytes);
        assert_eq!(
            d,
            vec![Disclosure {
                sink: "ocr".to_owned(),
                canary: both.as_str().to_owned(),
                label: tags(&["finance", "hr"]),
                encoding: Encoding::Base64 { depth: 1 },
            }]
        );

        // Cleared for nothing: both labelled items count, the unlabelled one never does.
        let d = oracle.disclosures("evil", &[], bytes);
        let found: Vec<&str> = d.iter().map(|x| x.canary.as_str()).collect();
        assert_eq!(found, vec![hr.as_str(), both.as_str()]);

        // The model's clearance type gives the same verdicts.
        let clearance = Clearance::parse(["hr"]).expect("valid tags");
        assert_eq!(oracle.disclosures_to("ocr", &clearance, bytes).len(), 1);
    }

    #[test]
    fn oracle_reports_nothing_when_no_canary_arrived() {
        let mut oracle = Oracle::new();
        oracle.plant(&["hr"]);
        assert!(oracle.disclosures("ocr", &[], b"GET / HTTP/1.1\r\nHost: x\r\n\r\n").is_empty());
    }
}

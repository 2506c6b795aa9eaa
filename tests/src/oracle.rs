//! The disclosure oracle: decides, from outside the runtime under test, whether a
//! destination received data it was not cleared for.
//!
//! Tests plant a fresh [`Canary`] in each labelled item and afterwards scan every byte a
//! [`Sink`](crate::sink::Sink) received. Hidden code in a release will not send a canary
//! verbatim if it can help it, so the oracle undoes the encodings a smuggler reaches for
//! first — JSON and backslash escapes, percent-encoding, hex, base64 (any alphabet,
//! padding and alignment, nested) and interleaved invisible characters — in any
//! combination up to [`MAX_LAYERS`] deep. The oracle must never be the reason a
//! leak goes unnoticed, so it errs towards work, not towards silence: if a haystack is so
//! adversarially shaped that the search would exceed its work budget, it panics instead of
//! answering "no disclosure".

use std::fmt;
use std::fs::File;
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
            .map(|c| {
                if c.is_ascii_lowercase() || c.is_ascii_digit() || "._-".contains(c) {
                    c
                } else {
                    '_'
                }
            })
            .collect();
        let mut text = format!("GLC-{tag}-");
        for b in random {
            text.push_str(&format!("{b:02x}"));
        }
        Canary {
            text,
            label_tag: label_tag.to_owned(),
        }
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
}

impl Layer {
    /// Order in which the search tries layers; only the shortest chain is reported, so
    /// this order only breaks ties between chains of equal length.
    const ALL: [Layer; 5] = [
        Layer::ZeroWidth,
        Layer::JsonEscape,
        Layer::Url,
        Layer::Hex,
        Layer::Base64,
    ];
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
            all if all.iter().all(|l| *l == Layer::Base64) => Encoding::Base64 {
                depth: u8::try_from(all.len()).unwrap_or(u8::MAX),
            },
            _ => Encoding::Layered(layers),
        }
    }
}

/// Whether `canary` can be read out of `haystack` by peeling at most [`MAX_LAYERS`]
/// encodings, and if so the shortest such chain.
///
/// An empty canary is trivially disclosed ([`Encoding::Raw`]).
///
/// # Panics
///
/// When the haystack would make the decoders produce more than the oracle's work budget
/// (2 GiB); failing loudly is safer than reporting "no disclosure" unchecked.
pub fn discloses(haystack: &[u8], canary: &str) -> Option<Encoding> {
    let needle = canary.as_bytes();
    let mut search = Search {
        needle,
        work: 0,
        path: Vec::new(),
    };
    // Iterative deepening: the first hit is the shortest chain, while memory stays at one
    // decoded buffer per layer.
    for limit in 0..=MAX_LAYERS {
        if search.at_depth(haystack, limit) {
            return Some(Encoding::from_layers(search.path));
        }
    }
    None
}

struct Search<'n> {
    needle: &'n [u8],
    work: usize,
    path: Vec<Layer>,
}

impl Search<'_> {
    /// True when the needle is visible after exactly `remaining` more layers.
    fn at_depth(&mut self, buf: &[u8], remaining: usize) -> bool {
        if remaining == 0 {
            return contains(buf, self.needle);
        }
        if buf.len() < self.needle.len() {
            return false;
        }
        for layer in Layer::ALL {
            let Some(decoded) = decode(layer, buf, self.needle) else {
                continue;
            };
            self.work = self.work.saturating_add(decoded.len());
            assert!(
                self.work <= WORK_BUDGET,
                "disclosure oracle: work budget exceeded; cannot certify non-disclosure"
            );
            self.path.push(layer);
            if self.at_depth(&decoded, remaining - 1) {
                return true;
            }
            self.path.pop();
        }
        false
    }
}

/// Separates independently decoded runs; it is in no decoder's alphabet, so it can never
/// be part of a canary nor glue two runs into one.
const SEP: u8 = 0;

/// Undoes `layer` everywhere in `buf`, or `None` when the layer cannot apply (nothing
/// to undo), which keeps the search tree small on ordinary text.
fn decode(layer: Layer, buf: &[u8], needle: &[u8]) -> Option<Vec<u8>> {
    match layer {
        Layer::JsonEscape => json_unescape(buf),
        Layer::Url => url_decode(buf, needle),
        Layer::Base64 => base64_runs(buf, needle.len()),
        Layer::Hex => hex_runs(buf, needle.len()),
        Layer::ZeroWidth => strip_invisible(buf),
    }
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

fn hex_val(b: u8) -> Option<u8> {
    match b {
        b'0'..=b'9' => Some(b - b'0'),
        b'a'..=b'f' => Some(b - b'a' + 10),
        b'A'..=b'F' => Some(b - b'A' + 10),
        _ => None,
    }
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
            if (0xD800..0xDC00).contains(&hi)
                && buf.get(i + 6) == Some(&b'\\')
                && buf.get(i + 7) == Some(&b'u')
            {
                if let Some(lo) = u16_at(i + 8).filter(|lo| (0xDC00..0xE000).contains(lo)) {
                    let cp = 0x10000 + ((u32::from(hi) - 0xD800) << 10) + (u32::from(lo) - 0xDC00);
                    push_char(&mut out, char::from_u32(cp).unwrap_or('\u{FFFD}'));
                    i += 12;
                    continue;
                }
            }
            push_char(
                &mut out,
                char::from_u32(u32::from(hi)).unwrap_or('\u{FFFD}'),
            );
            i += 6;
        } else {
            out.push(b);
            i += 1;
        }
    }
    Some(out)
}

fn url_decode(buf: &[u8], needle: &[u8]) -> Option<Vec<u8>> {
    let has_pct = buf
        .windows(3)
        .any(|w| w[0] == b'%' && hex_val(w[1]).is_some() && hex_val(w[2]).is_some());
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
const INVISIBLE_ESCAPES: [&[u8; 4]; 12] = [
    b"200b", b"200c", b"200d", b"200e", b"200f", b"2060", b"2061", b"2062", b"2063", b"2064",
    b"feff", b"00ad",
];

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
    match b {
        b'A'..=b'Z' => Some(b - b'A'),
        b'a'..=b'z' => Some(b - b'a' + 26),
        b'0'..=b'9' => Some(b - b'0' + 52),
        b'+' | b'-' => Some(62),
        b'/' | b'_' => Some(63),
        _ => None,
    }
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
        self.canaries.push((
            canary.clone(),
            label_tags.iter().map(|t| (*t).to_owned()).collect(),
        ));
        canary
    }

    /// Every planted canary visible in `bytes`, cleared or not, with how it was found.
    /// Positive controls ("mechanism off" twins) use this to show the canary did travel.
    pub fn sightings(&self, bytes: &[u8]) -> Vec<(Canary, Encoding)> {
        self.canaries
            .iter()
            .filter_map(|(c, _)| discloses(bytes, c.as_str()).map(|e| (c.clone(), e)))
            .collect()
    }

    /// The disclosures in `bytes` captured at sink `sink_name` with clearance
    /// `sink_clearance`: planted canaries found there whose label is not a subset of the
    /// clearance.
    pub fn disclosures(
        &self,
        sink_name: &str,
        sink_clearance: &[String],
        bytes: &[u8],
    ) -> Vec<Disclosure> {
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
    pub fn disclosures_to(
        &self,
        sink_name: &str,
        sink_clearance: &Clearance,
        bytes: &[u8],
    ) -> Vec<Disclosure> {
        let tags: Vec<String> = sink_clearance
            .tags()
            .map(|t| t.as_str().to_owned())
            .collect();
        self.disclosures(sink_name, &tags, bytes)
    }
}

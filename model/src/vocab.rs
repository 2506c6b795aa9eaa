//! The shared vocabulary: tags, labels, clearances and names, parsed once at the edge.

use std::collections::BTreeSet;
use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::ModelError;

/// One policy tag (`hr`, `finance`, `projx`, ...). Tags come from the deployer's policy,
/// never from a release.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Tag(String);

impl Tag {
    /// Parses a tag: 1–64 characters of `[a-z0-9._-]`, starting with a letter or digit.
    pub fn new(s: &str) -> Result<Self, ModelError> {
        let ok = !s.is_empty()
            && s.len() <= 64
            && s.bytes().next().is_some_and(|b| b.is_ascii_alphanumeric())
            && s.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"._-".contains(&b));
        if ok {
            Ok(Tag(s.to_owned()))
        } else {
            Err(ModelError::BadTag(s.to_owned()))
        }
    }

    /// The tag's text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for Tag {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

macro_rules! tag_set {
    ($(#[$doc:meta])* $name:ident) => {
        $(#[$doc])*
        #[derive(Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
        pub struct $name(BTreeSet<Tag>);

        impl $name {
            /// The empty set.
            pub fn empty() -> Self {
                Self(BTreeSet::new())
            }

            /// Builds the set from tags.
            pub fn from_tags<I: IntoIterator<Item = Tag>>(tags: I) -> Self {
                Self(tags.into_iter().collect())
            }

            /// Parses tag names; any bad name is an error.
            pub fn parse<'a, I: IntoIterator<Item = &'a str>>(names: I) -> Result<Self, ModelError> {
                names.into_iter().map(Tag::new).collect::<Result<BTreeSet<_>, _>>().map(Self)
            }

            /// The tags, in order.
            pub fn tags(&self) -> impl Iterator<Item = &Tag> {
                self.0.iter()
            }

            /// True when the set has no tag.
            pub fn is_empty(&self) -> bool {
                self.0.is_empty()
            }

            /// True when `tag` is in the set.
            pub fn contains_tag(&self, tag: &Tag) -> bool {
                self.0.contains(tag)
            }
        }

        impl Serialize for $name {
            fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.collect_seq(self.0.iter().map(Tag::as_str))
            }
        }

        impl<'de> Deserialize<'de> for $name {
            fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                let names = Vec::<String>::deserialize(d)?;
                Self::parse(names.iter().map(String::as_str)).map_err(serde::de::Error::custom)
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("{")?;
                for (i, t) in self.0.iter().enumerate() {
                    if i > 0 {
                        f.write_str(", ")?;
                    }
                    f.write_str(t.as_str())?;
                }
                f.write_str("}")
            }
        }
    };
}

tag_set!(
    /// What an item (or a value derived from items) carries: the tags a reader must hold.
    Label
);
tag_set!(
    /// What a destination or consumer may see: an item flows to it iff its label is a
    /// subset of this clearance.
    Clearance
);

impl Label {
    /// The least upper bound of two labels (set union).
    pub fn join(&self, other: &Label) -> Label {
        Label(self.0.union(&other.0).cloned().collect())
    }

    /// Joins a clearance into this label: a reply from host `e` carries `clearance(e)`.
    pub fn join_clearance(&self, c: &Clearance) -> Label {
        Label(self.0.union(&c.0).cloned().collect())
    }

    /// `label ⊆ clearance`: may a holder of `c` see data with this label?
    pub fn flows_to(&self, c: &Clearance) -> bool {
        self.0.is_subset(&c.0)
    }
}

impl Clearance {
    /// `self ⊆ other`.
    pub fn is_subset(&self, other: &Clearance) -> bool {
        self.0.is_subset(&other.0)
    }

    /// Set intersection (the horizon of a group is the intersection of its members').
    pub fn intersect(&self, other: &Clearance) -> Clearance {
        Clearance(self.0.intersection(&other.0).cloned().collect())
    }

    /// The label a reply from a host with this clearance carries.
    pub fn as_label(&self) -> Label {
        Label(self.0.clone())
    }
}

/// Whether a release's file or directory named `name` is left out of its canonical
/// archive, and so out of its hash: byte code (`__pycache__`, `*.pyc`, `*.pyo`), which
/// differs between two otherwise identical installs. What replays a release leaves it out
/// too, so every germline of a release sees the same files.
pub fn left_out_of_release(name: &str) -> bool {
    name == "__pycache__" || name.ends_with(".pyc") || name.ends_with(".pyo")
}

/// SHA-256 of a release's canonical archive: the release's identity everywhere.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ReleaseHash(pub [u8; 32]);

impl ReleaseHash {
    /// Hashes bytes with SHA-256.
    pub fn of_bytes(bytes: &[u8]) -> Self {
        use sha2::{Digest, Sha256};
        ReleaseHash(Sha256::digest(bytes).into())
    }

    /// Lower-case hex.
    pub fn to_hex(&self) -> String {
        hex::encode(self.0)
    }
}

impl fmt::Debug for ReleaseHash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ReleaseHash({})", self.to_hex())
    }
}

impl fmt::Display for ReleaseHash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_hex())
    }
}

impl FromStr for ReleaseHash {
    type Err = ModelError;
    fn from_str(s: &str) -> Result<Self, ModelError> {
        let s = s.strip_prefix("sha256:").unwrap_or(s);
        let mut out = [0u8; 32];
        if s.len() != 64 || s.bytes().any(|b| b.is_ascii_uppercase()) {
            return Err(ModelError::BadReleaseHash(s.to_owned()));
        }
        hex::decode_to_slice(s, &mut out).map_err(|_| ModelError::BadReleaseHash(s.to_owned()))?;
        Ok(ReleaseHash(out))
    }
}

impl Serialize for ReleaseHash {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.to_hex())
    }
}

impl<'de> Deserialize<'de> for ReleaseHash {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

macro_rules! name_type {
    ($(#[$doc:meta])* $name:ident, $check:expr, $err:ident) => {
        $(#[$doc])*
        #[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
        pub struct $name(String);

        impl $name {
            /// Parses and validates the name.
            pub fn new(s: &str) -> Result<Self, ModelError> {
                let check: fn(&str) -> bool = $check;
                if check(s) {
                    Ok($name(s.to_owned()))
                } else {
                    Err(ModelError::$err(s.to_owned()))
                }
            }

            /// The name's text.
            pub fn as_str(&self) -> &str {
                &self.0
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }

        impl Serialize for $name {
            fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.serialize_str(&self.0)
            }
        }

        impl<'de> Deserialize<'de> for $name {
            fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                let s = String::deserialize(d)?;
                $name::new(&s).map_err(serde::de::Error::custom)
            }
        }
    };
}

fn is_host_name(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 253
        && s.split('.').all(|l| {
            !l.is_empty()
                && l.len() <= 63
                && !l.starts_with('-')
                && !l.ends_with('-')
                && l.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        })
}

name_type!(
    /// A destination host name, compared literally (lower-case DNS name, no port).
    HostName,
    is_host_name,
    BadHostName
);
name_type!(
    /// The name of a consumer of a call's return value (usually `agent`).
    ConsumerName,
    |s| !s.is_empty() && s.len() <= 128 && !s.chars().any(char::is_control),
    BadConsumerName
);
name_type!(
    /// An item's public name: a file path or `arg:NAME` for an argument value.
    ItemName,
    |s| !s.is_empty() && s.len() <= 4096 && !s.contains('\0'),
    BadItemName
);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tags_are_validated() {
        assert!(Tag::new("finance").is_ok());
        assert!(Tag::new("Finance").is_err());
        assert!(Tag::new("").is_err());
        assert!(Tag::new("-x").is_err());
    }

    #[test]
    fn flows_and_joins() {
        let fin = Label::parse(["finance"]).unwrap();
        let hr = Label::parse(["hr"]).unwrap();
        let c = Clearance::parse(["finance", "public"]).unwrap();
        assert!(fin.flows_to(&c));
        assert!(!hr.flows_to(&c));
        assert!(!fin.join(&hr).flows_to(&c));
        assert!(Label::empty().flows_to(&Clearance::empty()));
    }

    #[test]
    fn release_hash_round_trips() {
        let h = ReleaseHash::of_bytes(b"abc");
        let s = h.to_string();
        assert_eq!(s.parse::<ReleaseHash>().unwrap(), h);
        assert!("xyz".parse::<ReleaseHash>().is_err());
        assert!(s.to_uppercase().parse::<ReleaseHash>().is_err());
    }

    #[test]
    fn host_names_are_literal_dns_names() {
        assert!(HostName::new("ocr.example").is_ok());
        assert!(HostName::new("OCR.example").is_err());
        assert!(HostName::new("ocr.example:80").is_err());
        assert!(HostName::new("a..b").is_err());
    }
}

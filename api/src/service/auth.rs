//! Bearer tokens for the mutating endpoints. Only SHA-256 hashes of tokens are held, and
//! a presented token is compared against every one of them in constant time.

use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context};
use serde::Deserialize;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

/// File name of the token generated on first start.
pub const GENERATED_TOKEN_FILE: &str = "api-token";

/// The accepted token hashes.
#[derive(Debug, Clone)]
pub struct Tokens {
    hashes: Vec<(String, [u8; 32])>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct TokensFile {
    tokens: Vec<TokenEntry>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct TokenEntry {
    name: String,
    sha256: String,
}

/// Where the tokens came from, for the start-up log line.
#[derive(Debug)]
pub enum TokenSource {
    /// A configured tokens file.
    File(PathBuf),
    /// The generated token file, created now.
    Generated(PathBuf),
    /// The generated token file, from an earlier start.
    Existing(PathBuf),
}

impl Tokens {
    /// From a tokens file (TOML: `[[tokens]] name = "...", sha256 = "<hex of SHA-256(token)>"`).
    pub fn from_file(path: &Path) -> anyhow::Result<Tokens> {
        let text = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
        let parsed: TokensFile = toml::from_str(&text).with_context(|| format!("parsing {}", path.display()))?;
        let mut hashes = Vec::new();
        for t in parsed.tokens {
            let mut h = [0u8; 32];
            hex::decode_to_slice(t.sha256.trim(), &mut h)
                .with_context(|| format!("{}: token {:?}: sha256 must be 64 hex digits", path.display(), t.name))?;
            hashes.push((t.name, h));
        }
        if hashes.is_empty() {
            bail!("{} lists no tokens: nothing could ever be changed", path.display());
        }
        Ok(Tokens { hashes })
    }

    /// One token given in clear.
    pub fn single(name: &str, token: &str) -> Tokens {
        Tokens { hashes: vec![(name.to_owned(), Sha256::digest(token.trim().as_bytes()).into())] }
    }

    /// The configured file, or else `<data_dir>/api-token`, generated (random, mode 0600)
    /// when it does not exist yet.
    pub fn load(tokens_file: Option<&Path>, data_dir: &Path) -> anyhow::Result<(Tokens, TokenSource)> {
        if let Some(p) = tokens_file {
            return Ok((Tokens::from_file(p)?, TokenSource::File(p.to_path_buf())));
        }
        let path = data_dir.join(GENERATED_TOKEN_FILE);
        match std::fs::read_to_string(&path) {
            Ok(t) if !t.trim().is_empty() => Ok((Tokens::single("generated", &t), TokenSource::Existing(path))),
            Ok(_) => bail!("{} is empty; delete it to generate a new token", path.display()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                std::fs::create_dir_all(data_dir).with_context(|| format!("creating {}", data_dir.display()))?;
                let token = random_token()?;
                let mut f = std::fs::OpenOptions::new()
                    .write(true)
                    .create_new(true)
                    .mode(0o600)
                    .open(&path)
                    .with_context(|| format!("creating {}", path.display()))?;
                writeln!(f, "{token}")
                    .and_then(|_| f.sync_all())
                    .with_context(|| format!("writing {}", path.display()))?;
                Ok((Tokens::single("generated", &token), TokenSource::Generated(path)))
            }
            Err(e) => Err(e).with_context(|| format!("reading {}", path.display())),
        }
    }

    /// The name of the token `presented` matches, if any. Every stored hash is compared,
    /// each in constant time, so timing says nothing about which one (or how much) matched.
    pub fn check(&self, presented: &str) -> Option<&str> {
        let h: [u8; 32] = Sha256::digest(presented.as_bytes()).into();
        let mut found = None;
        for (name, stored) in &self.hashes {
            if bool::from(stored.ct_eq(&h)) {
                found = Some(name.as_str());
            }
        }
        found
    }
}

fn random_token() -> anyhow::Result<String> {
    let mut seed = [0u8; 32];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut seed))
        .context("reading /dev/urandom for the API token")?;
    Ok(hex::encode(seed))
}

/// The token of an `Authorization: Bearer <token>` header value.
pub fn bearer(header: &str) -> Option<&str> {
    let (scheme, token) = header.trim().split_once(' ')?;
    (scheme.eq_ignore_ascii_case("bearer") && !token.trim().is_empty()).then(|| token.trim())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generated_token_is_private_and_stable() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let (tokens, src) = Tokens::load(None, dir.path()).unwrap();
        assert!(matches!(src, TokenSource::Generated(_)));
        let path = dir.path().join(GENERATED_TOKEN_FILE);
        assert_eq!(std::fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o600);
        let token = std::fs::read_to_string(&path).unwrap();
        assert_eq!(tokens.check(token.trim()), Some("generated"));
        assert_eq!(tokens.check("wrong"), None);
        let (again, src) = Tokens::load(None, dir.path()).unwrap();
        assert!(matches!(src, TokenSource::Existing(_)));
        assert_eq!(again.check(token.trim()), Some("generated"));
    }

    #[test]
    fn tokens_file_holds_hashes() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("tokens.toml");
        let h = hex::encode(Sha256::digest(b"s3cret"));
        std::fs::write(&f, format!("[[tokens]]\nname = \"ops\"\nsha256 = \"{h}\"\n")).unwrap();
        let t = Tokens::from_file(&f).unwrap();
        assert_eq!(t.check("s3cret"), Some("ops"));
        assert_eq!(t.check(&h), None, "the hash itself is not a token");
        std::fs::write(&f, "tokens = []\n").unwrap();
        assert!(Tokens::from_file(&f).is_err());
    }

    #[test]
    fn bearer_header() {
        assert_eq!(bearer("Bearer abc"), Some("abc"));
        assert_eq!(bearer("bearer  abc "), Some("abc"));
        assert_eq!(bearer("Basic abc"), None);
        assert_eq!(bearer("Bearer "), None);
    }
}

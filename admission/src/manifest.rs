//! The two manifest fields admission needs. The executor parses the full manifest;
//! admission only reads `[release].name` and `version` to fill and cross-check the
//! signed TUF custom fields, ignoring every other key.

use serde::Deserialize;

use crate::error::{AdmissionError, Result};

/// File name of the release manifest at the archive root.
pub const MANIFEST_FILE: &str = "germline.toml";

/// Name and version of a release, as its manifest declares them.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, Deserialize)]
pub struct ReleaseInfo {
    /// `[a-z0-9._-]+`, used in target names and file names.
    pub name: String,
    /// Free-form version string (non-empty, printable).
    pub version: String,
}

#[derive(Deserialize)]
struct ManifestHead {
    release: ReleaseInfo,
}

impl ReleaseInfo {
    /// Parses `germline.toml` text, validating name and version so they are safe to
    /// use in target paths.
    pub fn from_manifest(text: &str) -> Result<Self> {
        let head: ManifestHead = toml::from_str(text).map_err(|e| AdmissionError::BadManifest(e.to_string()))?;
        let info = head.release;
        info.validate()?;
        Ok(info)
    }

    fn validate(&self) -> Result<()> {
        let name_ok = !self.name.is_empty()
            && self.name.len() <= 128
            && self.name.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"._-".contains(&b))
            && !self.name.starts_with('.');
        if !name_ok {
            return Err(AdmissionError::BadManifest(format!(
                "release name {:?} must be 1-128 characters of [a-z0-9._-], not starting with '.'",
                self.name
            )));
        }
        let version_ok = !self.version.is_empty()
            && self.version.len() <= 64
            && self.version.bytes().all(|b| b.is_ascii_alphanumeric() || b"._-+".contains(&b));
        if !version_ok {
            return Err(AdmissionError::BadManifest(format!(
                "release version {:?} must be 1-64 characters of [A-Za-z0-9._+-]",
                self.version
            )));
        }
        Ok(())
    }

    /// The default TUF target path for this release: `NAME-VERSION.tar.gz`.
    pub fn target_path(&self) -> String {
        format!("{}-{}.tar.gz", self.name, self.version)
    }

    /// `name@version`, for messages.
    pub fn label(&self) -> String {
        format!("{}@{}", self.name, self.version)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_name_and_version_and_ignores_the_rest() {
        let info = ReleaseInfo::from_manifest(
            "[release]\nname = \"notes\"\nversion = \"1.0.0\"\nruntime = \"python\"\n[tools.x]\nhosts = [\"a\"]\n",
        )
        .expect("valid manifest");
        assert_eq!(info.target_path(), "notes-1.0.0.tar.gz");
    }

    #[test]
    fn refuses_names_that_could_form_paths() {
        for bad in ["../x", "Notes", "a/b", ".hidden", ""] {
            let text = format!("[release]\nname = {bad:?}\nversion = \"1\"\n");
            assert!(ReleaseInfo::from_manifest(&text).is_err(), "{bad}");
        }
    }
}

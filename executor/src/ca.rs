//! The per-deployment certificate authority that lets the broker see a copy's HTTPS in
//! plaintext. Copies trust its certificate; its key stays with the broker: it lives in a
//! 0600 file under the runtime's home, outside every path a germline may read, and only
//! the certificate file is ever handed to a germline.

use std::fs::OpenOptions;
use std::io::Write;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};
use rustls_pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};

use crate::ExecutorError;

/// The file name of the CA certificate; the germline's trust variables point at a file of
/// this name (see `Germline::start`).
pub const CA_CERT_FILE: &str = "germline-ca.pem";
const CA_KEY_FILE: &str = "germline-ca-key.pem";
const CA_NAME: &str = "germline deployment CA";

/// A leaf certificate for one host name, with its key, ready for a TLS server.
pub struct Leaf {
    /// The leaf followed by the CA certificate.
    pub chain: Vec<CertificateDer<'static>>,
    /// The leaf's private key.
    pub key: PrivateKeyDer<'static>,
}

/// The deployment CA: loads (or creates once) the key and certificate and issues leaf
/// certificates, a new one (with a new key) each time: nothing is kept between two.
pub struct DeploymentCa {
    cert_path: PathBuf,
    cert_der: CertificateDer<'static>,
    issuer: Issuer<'static, KeyPair>,
}

impl std::fmt::Debug for DeploymentCa {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeploymentCa").field("cert_path", &self.cert_path).finish_non_exhaustive()
    }
}

fn ca_params() -> CertificateParams {
    let mut p = CertificateParams::default();
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, CA_NAME);
    p.distinguished_name = dn;
    p.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    p.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign, KeyUsagePurpose::DigitalSignature];
    p
}

fn cerr(what: &str, e: impl std::fmt::Display) -> ExecutorError {
    ExecutorError::Sandbox(format!("deployment CA: {what}: {e}"))
}

impl DeploymentCa {
    /// Opens the CA in `dir`, creating key and certificate on first use. The directory is
    /// made 0700 and the key file 0600; a key file readable by others is refused.
    pub fn open(dir: &Path) -> Result<DeploymentCa, ExecutorError> {
        std::fs::create_dir_all(dir).map_err(ExecutorError::io(format!("creating {}", dir.display())))?;
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
            .map_err(ExecutorError::io(format!("restricting {}", dir.display())))?;
        // One creator at a time, across threads and processes sharing this home, so the key
        // and certificate on disk always belong together. Released when `lock` closes.
        let lock = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .mode(0o600)
            .open(dir.join(".lock"))
            .map_err(ExecutorError::io("opening the CA lock"))?;
        // SAFETY: flock on a descriptor we own for the rest of this function.
        if unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_EX) } != 0 {
            return Err(ExecutorError::io("locking the CA")(std::io::Error::last_os_error()));
        }
        let key_path = dir.join(CA_KEY_FILE);
        let cert_path = dir.join(CA_CERT_FILE);
        let params = ca_params();
        let (key, cert_der) = if key_path.exists() && cert_path.exists() {
            let mode = std::fs::metadata(&key_path).map_err(ExecutorError::io("CA key"))?.permissions().mode();
            if mode & 0o077 != 0 {
                return Err(cerr("key file", format!("{} is readable by others", key_path.display())));
            }
            let pem = std::fs::read_to_string(&key_path).map_err(ExecutorError::io("reading the CA key"))?;
            let key = KeyPair::from_pem(&pem).map_err(|e| cerr("key", e))?;
            let cert_pem = std::fs::read(&cert_path).map_err(ExecutorError::io("reading the CA certificate"))?;
            let der = pem_certificates(&cert_pem)?.into_iter().next().ok_or_else(|| cerr("certificate", "empty"))?;
            (key, der)
        } else {
            let key = KeyPair::generate().map_err(|e| cerr("key generation", e))?;
            let cert = params.self_signed(&key).map_err(|e| cerr("self-signing", e))?;
            let tmp = dir.join(format!(".{CA_KEY_FILE}.{}", std::process::id()));
            let mut f = OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(true)
                .mode(0o600)
                .open(&tmp)
                .map_err(ExecutorError::io("writing the CA key"))?;
            f.write_all(key.serialize_pem().as_bytes()).map_err(ExecutorError::io("writing the CA key"))?;
            f.sync_all().map_err(ExecutorError::io("syncing the CA key"))?;
            std::fs::rename(&tmp, &key_path).map_err(ExecutorError::io("installing the CA key"))?;
            let tmp = dir.join(format!(".{CA_CERT_FILE}.{}", std::process::id()));
            std::fs::write(&tmp, cert.pem()).map_err(ExecutorError::io("writing the CA certificate"))?;
            std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o644))
                .map_err(ExecutorError::io("CA certificate mode"))?;
            std::fs::rename(&tmp, &cert_path).map_err(ExecutorError::io("installing the CA certificate"))?;
            (key, cert.der().clone())
        };
        Ok(DeploymentCa { cert_path, cert_der, issuer: Issuer::new(params, key) })
    }

    /// The certificate file copies trust (the only CA file a germline may read).
    pub fn cert_path(&self) -> &Path {
        &self.cert_path
    }

    /// A new leaf certificate for `host`, with a new key, signed by this CA.
    pub fn leaf(&self, host: &str) -> Result<Leaf, ExecutorError> {
        let mut params = CertificateParams::new(vec![host.to_owned()]).map_err(|e| cerr("leaf name", e))?;
        params.distinguished_name.push(DnType::CommonName, host);
        params.use_authority_key_identifier_extension = true;
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature, KeyUsagePurpose::KeyEncipherment];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        let key = KeyPair::generate().map_err(|e| cerr("leaf key", e))?;
        let cert = params.signed_by(&key, &self.issuer).map_err(|e| cerr("leaf signing", e))?;
        Ok(Leaf {
            chain: vec![cert.der().clone(), self.cert_der.clone()],
            key: PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der())),
        })
    }
}

/// Every certificate in a PEM buffer.
pub fn pem_certificates(pem: &[u8]) -> Result<Vec<CertificateDer<'static>>, ExecutorError> {
    use rustls_pki_types::pem::PemObject;
    CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| ExecutorError::Policy(format!("PEM certificates: {e:?}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn concurrent_first_opens_agree_on_one_ca() {
        let dir = tempfile::tempdir().unwrap();
        let ca_dir = dir.path().join("ca");
        let opened: Vec<Vec<u8>> = std::thread::scope(|s| {
            let hs: Vec<_> =
                (0..4).map(|_| s.spawn(|| DeploymentCa::open(&ca_dir).unwrap().cert_der.as_ref().to_vec())).collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        assert!(opened.windows(2).all(|w| w[0] == w[1]), "every opener uses the one CA on disk");
    }

    #[test]
    fn key_is_private_and_reused() {
        let dir = tempfile::tempdir().unwrap();
        let ca = DeploymentCa::open(&dir.path().join("ca")).unwrap();
        let key = dir.path().join("ca").join(CA_KEY_FILE);
        assert_eq!(std::fs::metadata(&key).unwrap().permissions().mode() & 0o777, 0o600);
        let cert = std::fs::read(ca.cert_path()).unwrap();
        let again = DeploymentCa::open(&dir.path().join("ca")).unwrap();
        assert_eq!(std::fs::read(again.cert_path()).unwrap(), cert, "the CA is created once");
        let (a, b) = (ca.leaf("api.example").unwrap(), ca.leaf("api.example").unwrap());
        assert_ne!(a.chain[0], b.chain[0], "every leaf is new: nothing is kept between two");
        assert_eq!(a.chain[1], b.chain[1], "both are signed by the one CA");
        std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o644)).unwrap();
        assert!(DeploymentCa::open(&dir.path().join("ca")).is_err(), "a readable key is refused");
    }
}

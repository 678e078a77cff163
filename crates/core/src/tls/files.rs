//! Identities and roots: certificates and keys read from PEM files (a CA may be a directory of
//! them, as gloo's `_CA_PATH` is), the key pair a process makes for pinned keys, and a test
//! PKI written to files.

use std::path::Path;
use std::sync::{Arc, OnceLock};

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use rustls::RootCertStore;

use sha2::{Digest, Sha256};

use crate::error::{Error, Result};

/// Hash of a certificate (SHA-256 of its DER), what pinned keys compare.
pub type Fingerprint = [u8; 32];

pub fn fingerprint(cert: &[u8]) -> Fingerprint {
    Sha256::digest(cert).into()
}

fn bad(var: &str, path: &str, why: impl std::fmt::Display) -> Error {
    Error::invalid(format!("TLS: {var}={path}: {why}"))
}

/// The certificate chain in PEM file `path` (named by `var`), the end entity first.
pub(super) fn chain(var: &str, path: &str) -> Result<Vec<CertificateDer<'static>>> {
    let certs = CertificateDer::pem_file_iter(path)
        .and_then(|it| it.collect::<std::result::Result<Vec<_>, _>>())
        .map_err(|e| bad(var, path, e))?;
    if certs.is_empty() {
        return Err(bad(var, path, "no certificate in the file"));
    }
    Ok(certs)
}

/// The private key in PEM file `path` (PKCS#8, PKCS#1 or SEC1).
pub(super) fn private_key(var: &str, path: &str) -> Result<PrivateKeyDer<'static>> {
    PrivateKeyDer::from_pem_file(path).map_err(|e| bad(var, path, e))
}

/// The CA certificates in `path`: a PEM file, or every PEM file in a directory (gloo's
/// `_CA_PATH`; files that hold no certificate are skipped).
pub(super) fn roots(var: &str, path: &str) -> Result<RootCertStore> {
    let mut store = RootCertStore::empty();
    let files: Vec<std::path::PathBuf> = if Path::new(path).is_dir() {
        let entries = std::fs::read_dir(path).map_err(|e| bad(var, path, e))?;
        let mut files: Vec<_> = entries.flatten().map(|e| e.path()).collect();
        files.sort();
        files
    } else {
        vec![path.into()]
    };
    for file in &files {
        let Ok(certs) = CertificateDer::pem_file_iter(file) else {
            continue;
        };
        for cert in certs.flatten() {
            store
                .add(cert)
                .map_err(|e| bad(var, &file.display().to_string(), e))?;
        }
    }
    if store.is_empty() {
        return Err(bad(var, path, "no CA certificate there"));
    }
    Ok(store)
}

/// A process's own key pair and self-signed certificate.
pub(super) struct Identity {
    pub(super) cert: CertificateDer<'static>,
    pub(super) key: Arc<PrivateKeyDer<'static>>,
}

/// The identity this process pins peers against, made once (every group of the process
/// publishes the same certificate).
pub(super) fn pinned_identity() -> Result<&'static Identity> {
    static IDENTITY: OnceLock<std::result::Result<Identity, String>> = OnceLock::new();
    IDENTITY
        .get_or_init(|| {
            let made = rcgen::generate_simple_self_signed(vec!["rustdist".to_string()])
                .map_err(|e| format!("TLS: cannot make a key pair: {e}"))?;
            Ok(Identity {
                cert: made.cert.der().clone(),
                key: Arc::new(PrivatePkcs8KeyDer::from(made.key_pair.serialize_der()).into()),
            })
        })
        .as_ref()
        .map_err(|e| Error::backend(e.clone()))
}

/// Writes a test PKI into `dir`: `ca.pem`, and for each name in `names` `NAME.pem` and
/// `NAME.key` signed by that CA; `rogue-ca.pem` with `rogue.pem`/`rogue.key` signed by another
/// CA (a host the job's CA never vouched for).
#[cfg(test)]
pub(crate) fn write_test_pki(dir: &Path, names: &[&str]) -> Result<()> {
    use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, KeyPair};
    let io = |e: std::io::Error| Error::invalid(format!("TLS test PKI in {}: {e}", dir.display()));
    let gen = |e: rcgen::Error| Error::backend(format!("TLS test PKI: {e}"));
    let ca = |name: &str| -> Result<(rcgen::Certificate, KeyPair)> {
        let key = KeyPair::generate().map_err(gen)?;
        let mut params = CertificateParams::new(vec![name.to_string()]).map_err(gen)?;
        params.distinguished_name.push(DnType::CommonName, name);
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        Ok((params.self_signed(&key).map_err(gen)?, key))
    };
    let leaf = |name: &str, issuer: &(rcgen::Certificate, KeyPair), file: &str| -> Result<()> {
        let key = KeyPair::generate().map_err(gen)?;
        let mut params = CertificateParams::new(vec![name.to_string()]).map_err(gen)?;
        params.distinguished_name.push(DnType::CommonName, name);
        let cert = params.signed_by(&key, &issuer.0, &issuer.1).map_err(gen)?;
        std::fs::write(dir.join(format!("{file}.pem")), cert.pem()).map_err(io)?;
        std::fs::write(dir.join(format!("{file}.key")), key.serialize_pem()).map_err(io)
    };
    std::fs::create_dir_all(dir).map_err(io)?;
    let good = ca("rustdist test CA")?;
    std::fs::write(dir.join("ca.pem"), good.0.pem()).map_err(io)?;
    for name in names {
        leaf(name, &good, name)?;
    }
    let rogue = ca("another CA")?;
    std::fs::write(dir.join("rogue-ca.pem"), rogue.0.pem()).map_err(io)?;
    leaf("rogue", &rogue, "rogue")
}

//! PEM files read the same way for every link that has TLS: the peers, the
//! upstream brokers and the HTTP API. Errors are plain sentences without the
//! config key, which each caller adds.

use std::path::Path;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

/// Every certificate in `path`; a file with none is an error, because a
/// CA or chain file that holds no certificate is always a mistake (a key
/// file given in its place, say).
pub fn certs(path: &Path) -> Result<Vec<CertificateDer<'static>>, String> {
    let at = |e: String| format!("{}: {e}", path.display());
    let certs: Result<Vec<_>, _> = CertificateDer::pem_file_iter(path)
        .map_err(|e| at(e.to_string()))?
        .collect();
    let certs = certs.map_err(|e| at(e.to_string()))?;
    if certs.is_empty() {
        return Err(at("no PEM certificate in it".into()));
    }
    Ok(certs)
}

/// The private key in `path` (PKCS#8, PKCS#1 or SEC1).
pub fn key(path: &Path) -> Result<PrivateKeyDer<'static>, String> {
    PrivateKeyDer::from_pem_file(path).map_err(|e| format!("{}: {e}", path.display()))
}

/// The crypto provider every TLS setup names explicitly: with more than one
/// in the dependency tree rustls cannot pick a process default by itself.
pub fn provider() -> std::sync::Arc<rustls::crypto::CryptoProvider> {
    std::sync::Arc::new(rustls::crypto::aws_lc_rs::default_provider())
}

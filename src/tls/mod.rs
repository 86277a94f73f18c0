//! Every TLS setting in one place: the PEM files, and the rustls settings
//! of each link that has TLS. Each builder names the config key at fault,
//! so check-config and the node report the same thing.
//!
//! - [`config`]: the settings of each link, as the config file names them.
//! - [`http`]: the HTTP API's server side (`node.http_tls`).
//! - [`upstream`]: a client to an upstream broker (`upstreams[i]`).
//! - [`pulsar`]: the publisher's connections to Pulsar (`pulsar.ca_file`).
//! - [`peer`]: both sides of the peer links, mutual (`cluster.tls`), and
//!   the byte stream they carry.
//!
//! The listeners and streams that use these settings stay in their stages
//! (`http/listener.rs`, `cluster/`).

use std::path::{Path, PathBuf};

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

pub mod config;
pub mod http;
pub mod peer;
pub mod pulsar;
pub mod upstream;

pub use peer::{BoxStream, PeerStream, PeerTls};

/// What is wrong with a TLS file or setting.
#[derive(Debug, thiserror::Error)]
pub enum TlsProblem {
    /// The file is missing, unreadable, or not PEM of the kind wanted.
    #[error("{}: {source}", path.display())]
    Pem {
        path: PathBuf,
        #[source]
        source: rustls::pki_types::pem::Error,
    },
    /// A CA or chain file without a certificate: always a mistake (a key
    /// file given in its place, say).
    #[error("{}: no PEM certificate in it", path.display())]
    NoCertificate { path: PathBuf },
    /// rustls refused a certificate in the file.
    #[error("{}: {source}", path.display())]
    Certificate {
        path: PathBuf,
        #[source]
        source: rustls::Error,
    },
    /// The CA cannot verify client certificates.
    #[error("{0}")]
    Verifier(#[source] rustls::server::VerifierBuilderError),
    #[error("does not match cert_file: {0}")]
    KeyMismatch(#[source] rustls::Error),
    #[error("no ca_file, and no system CA certificates to use instead")]
    NoSystemRoots,
    #[error("cert_file needs a key_file")]
    KeyMissing,
    #[error("key_file needs a cert_file")]
    CertMissing,
    /// A name that cannot be a TLS server name.
    #[error("`{name}`: {detail}")]
    ServerName { name: String, detail: String },
    /// rustls refused the settings as a whole.
    #[error(transparent)]
    Rustls(#[from] rustls::Error),
}

/// A [`TlsProblem`] and the key it belongs to (relative to its section:
/// `cert_file` inside `node.http_tls`, `ca_file` inside `upstreams[i]`;
/// whole for `cluster.tls.*`).
#[derive(Debug, thiserror::Error)]
#[error("{key}: {problem}")]
pub struct TlsSettingError {
    pub key: &'static str,
    #[source]
    pub problem: TlsProblem,
}

impl TlsSettingError {
    pub fn at(key: &'static str) -> impl FnOnce(TlsProblem) -> Self {
        move |problem| Self { key, problem }
    }
}

/// Every certificate in `path`; a file with none is an error.
pub fn certs(path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsProblem> {
    let pem = |source| TlsProblem::Pem {
        path: path.to_path_buf(),
        source,
    };
    let certs = CertificateDer::pem_file_iter(path)
        .map_err(pem)?
        .collect::<Result<Vec<_>, _>>()
        .map_err(pem)?;
    if certs.is_empty() {
        return Err(TlsProblem::NoCertificate {
            path: path.to_path_buf(),
        });
    }
    Ok(certs)
}

/// The private key in `path` (PKCS#8, PKCS#1 or SEC1).
pub fn key(path: &Path) -> Result<PrivateKeyDer<'static>, TlsProblem> {
    PrivateKeyDer::from_pem_file(path).map_err(|source| TlsProblem::Pem {
        path: path.to_path_buf(),
        source,
    })
}

/// The crypto provider every TLS setup names explicitly: with more than one
/// in the dependency tree rustls cannot pick a process default by itself.
pub fn provider() -> std::sync::Arc<rustls::crypto::CryptoProvider> {
    std::sync::Arc::new(rustls::crypto::aws_lc_rs::default_provider())
}

//! Optional TLS for the peer protocol (rustls, mutual: each side presents a
//! certificate signed by the cluster CA). The secret handshake still runs
//! inside it, so a node needs both the secret and a valid certificate.

use std::path::Path;
use std::sync::Arc;

use rustls::pki_types::{CertificateDer, ServerName};
use rustls::server::WebPkiClientVerifier;
use rustls::{ClientConfig, RootCertStore, ServerConfig};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio_rustls::{TlsAcceptor, TlsConnector};

use crate::config::TlsConfig;
use crate::Error;

/// A byte stream to a peer: plain TCP or TLS over TCP.
pub trait PeerStream: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> PeerStream for T {}

/// A boxed [`PeerStream`], so pools and handlers need not care which.
pub type BoxStream = Box<dyn PeerStream>;

/// Both sides of the peer TLS setup.
#[derive(Clone)]
pub struct PeerTls {
    pub acceptor: TlsAcceptor,
    pub connector: TlsConnector,
    /// The name every node's certificate must carry (a DNS SAN).
    pub server_name: ServerName<'static>,
}

fn read_certs(path: &Path, key: &str) -> Result<Vec<CertificateDer<'static>>, Error> {
    crate::pem::certs(path).map_err(|e| Error::setting(key, e))
}

impl PeerTls {
    /// Loads certificates and keys; every problem names the config key.
    pub fn load(c: &TlsConfig) -> Result<Self, Error> {
        let provider = crate::pem::provider();
        let certs = read_certs(&c.cert_file, "cluster.tls.cert_file")?;
        let key =
            crate::pem::key(&c.key_file).map_err(|e| Error::setting("cluster.tls.key_file", e))?;
        let mut roots = RootCertStore::empty();
        for ca in read_certs(&c.ca_file, "cluster.tls.ca_file")? {
            roots.add(ca).map_err(|source| Error::Tls {
                key: "cluster.tls.ca_file",
                source,
            })?;
        }
        let roots = Arc::new(roots);
        let verifier = WebPkiClientVerifier::builder_with_provider(roots.clone(), provider.clone())
            .build()
            .map_err(|e| Error::setting("cluster.tls.ca_file", e))?;
        let server = ServerConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(|source| Error::Tls {
                key: "cluster.tls",
                source,
            })?
            .with_client_cert_verifier(verifier)
            .with_single_cert(certs.clone(), key.clone_key())
            .map_err(|source| Error::Tls {
                key: "cluster.tls.cert_file/key_file",
                source,
            })?;
        let client = ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|source| Error::Tls {
                key: "cluster.tls",
                source,
            })?
            .with_root_certificates(roots)
            .with_client_auth_cert(certs, key)
            .map_err(|source| Error::Tls {
                key: "cluster.tls.cert_file/key_file",
                source,
            })?;
        let server_name = ServerName::try_from(c.server_name.clone()).map_err(|e| {
            Error::setting(
                "cluster.tls.server_name",
                format!("`{}`: {e}", c.server_name),
            )
        })?;
        Ok(Self {
            acceptor: TlsAcceptor::from(Arc::new(server)),
            connector: TlsConnector::from(Arc::new(client)),
            server_name,
        })
    }
}

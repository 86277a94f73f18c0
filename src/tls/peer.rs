//! TLS for the peer protocol (rustls, mutual: each side presents a
//! certificate signed by the cluster CA). The secret handshake still runs
//! inside it, so a node needs both the secret and a valid certificate.

use std::sync::Arc;

use rustls::pki_types::ServerName;
use rustls::server::WebPkiClientVerifier;
use rustls::{ClientConfig, RootCertStore, ServerConfig};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio_rustls::{TlsAcceptor, TlsConnector};

use super::config::TlsConfig;
use super::{TlsProblem, TlsSettingError};

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

impl PeerTls {
    /// Loads certificates and keys; every problem names the config key.
    pub fn load(c: &TlsConfig) -> Result<Self, TlsSettingError> {
        use TlsSettingError as E;
        let provider = super::provider();
        let certs = super::certs(&c.cert_file).map_err(E::at("cluster.tls.cert_file"))?;
        let key = super::key(&c.key_file).map_err(E::at("cluster.tls.key_file"))?;
        let mut roots = RootCertStore::empty();
        for ca in super::certs(&c.ca_file).map_err(E::at("cluster.tls.ca_file"))? {
            roots.add(ca).map_err(|source| {
                E::at("cluster.tls.ca_file")(TlsProblem::Certificate {
                    path: c.ca_file.clone(),
                    source,
                })
            })?;
        }
        let roots = Arc::new(roots);
        let verifier = WebPkiClientVerifier::builder_with_provider(roots.clone(), provider.clone())
            .build()
            .map_err(|e| E::at("cluster.tls.ca_file")(TlsProblem::Verifier(e)))?;
        let server = ServerConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(|e| E::at("cluster.tls")(e.into()))?
            .with_client_cert_verifier(verifier)
            .with_single_cert(certs.clone(), key.clone_key())
            .map_err(|e| E::at("cluster.tls.key_file")(TlsProblem::KeyMismatch(e)))?;
        let client = ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| E::at("cluster.tls")(e.into()))?
            .with_root_certificates(roots)
            .with_client_auth_cert(certs, key)
            .map_err(|e| E::at("cluster.tls.key_file")(TlsProblem::KeyMismatch(e)))?;
        let server_name = ServerName::try_from(c.server_name.clone()).map_err(|e| {
            E::at("cluster.tls.server_name")(TlsProblem::ServerName {
                name: c.server_name.clone(),
                detail: e.to_string(),
            })
        })?;
        Ok(Self {
            acceptor: TlsAcceptor::from(Arc::new(server)),
            connector: TlsConnector::from(Arc::new(client)),
            server_name,
        })
    }
}

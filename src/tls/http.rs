//! The HTTP API's TLS (`node.http_tls`): a server certificate, no client
//! certificates (admin requests carry a bearer credential instead).

use std::sync::Arc;

use rustls::ServerConfig;

use super::config::HttpTlsConfig;
use super::{TlsProblem, TlsSettingError};

/// rustls settings for the HTTP listener, or the key (inside
/// `node.http_tls`) at fault and why. check-config and the node both call it.
pub fn server_config(c: &HttpTlsConfig) -> Result<Arc<ServerConfig>, TlsSettingError> {
    let chain = super::certs(&c.cert_file).map_err(TlsSettingError::at("cert_file"))?;
    let key = super::key(&c.key_file).map_err(TlsSettingError::at("key_file"))?;
    let mut config = ServerConfig::builder_with_provider(super::provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| TlsSettingError::at("cert_file")(e.into()))?
        .with_no_client_auth()
        .with_single_cert(chain, key)
        .map_err(|e| TlsSettingError::at("key_file")(TlsProblem::KeyMismatch(e)))?;
    // axum serves HTTP/1.1 here; offering h2 would make clients that prefer
    // it fail the ALPN match.
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

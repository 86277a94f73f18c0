//! TLS to an upstream broker: the system's roots or the upstream's own CA,
//! and a client certificate for a broker that requires one.

use std::sync::Arc;

use rustls::{ClientConfig, RootCertStore};

use super::config::UpstreamFiles;
use super::{TlsProblem, TlsSettingError};

/// rustls settings for `u`, or `None` when it sets no file of its own and
/// rumqttc's default (the system's roots, no client certificate) applies.
/// Every problem names its key inside `upstreams[i]`: check-config and the
/// node report the same.
pub fn client_config(u: UpstreamFiles<'_>) -> Result<Option<Arc<ClientConfig>>, TlsSettingError> {
    use TlsSettingError as E;
    if u.ca_file.is_none() && u.cert_file.is_none() && u.key_file.is_none() {
        return Ok(None);
    }
    let mut roots = RootCertStore::empty();
    match u.ca_file {
        Some(path) => {
            for ca in super::certs(path).map_err(E::at("ca_file"))? {
                roots.add(ca).map_err(|source| {
                    E::at("ca_file")(TlsProblem::Certificate {
                        path: path.clone(),
                        source,
                    })
                })?;
            }
        }
        None => {
            let found = rustls_native_certs::load_native_certs();
            if found.certs.is_empty() {
                return Err(E::at("ca_file")(TlsProblem::NoSystemRoots));
            }
            roots.add_parsable_certificates(found.certs);
        }
    }
    let builder = ClientConfig::builder_with_provider(super::provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| E::at("url")(e.into()))?
        .with_root_certificates(roots);
    let config = match (u.cert_file, u.key_file) {
        (Some(cert), Some(key)) => {
            let chain = super::certs(cert).map_err(E::at("cert_file"))?;
            let key_der = super::key(key).map_err(E::at("key_file"))?;
            builder
                .with_client_auth_cert(chain, key_der)
                .map_err(|e| E::at("key_file")(TlsProblem::KeyMismatch(e)))?
        }
        (None, None) => builder.with_no_client_auth(),
        (Some(_), None) => return Err(E::at("key_file")(TlsProblem::KeyMissing)),
        (None, Some(_)) => return Err(E::at("cert_file")(TlsProblem::CertMissing)),
    };
    Ok(Some(Arc::new(config)))
}

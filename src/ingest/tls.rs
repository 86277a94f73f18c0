//! TLS to an upstream broker: the system's roots or the upstream's own CA,
//! and a client certificate for a broker that requires one.

use std::path::Path;
use std::sync::Arc;

use rustls::pki_types::CertificateDer;
use rustls::{ClientConfig, RootCertStore};

use crate::config::UpstreamConfig;

/// What is wrong with an upstream's TLS settings: the config key (inside
/// `upstreams[i]`) and why.
pub type Problem = (&'static str, String);

fn read_certs(path: &Path, key: &'static str) -> Result<Vec<CertificateDer<'static>>, Problem> {
    crate::pem::certs(path).map_err(|e| (key, e))
}

/// rustls settings for `u`, or `None` when it sets no file of its own and
/// rumqttc's default (the system's roots, no client certificate) applies.
/// Every problem names its key: check-config and the node report the same.
pub fn client_config(u: &UpstreamConfig) -> Result<Option<Arc<ClientConfig>>, Problem> {
    if u.ca_file.is_none() && u.cert_file.is_none() && u.key_file.is_none() {
        return Ok(None);
    }
    let provider = crate::pem::provider();
    let mut roots = RootCertStore::empty();
    match &u.ca_file {
        Some(path) => {
            for ca in read_certs(path, "ca_file")? {
                roots
                    .add(ca)
                    .map_err(|e| ("ca_file", format!("{}: {e}", path.display())))?;
            }
        }
        None => {
            let found = rustls_native_certs::load_native_certs();
            if found.certs.is_empty() {
                return Err((
                    "ca_file",
                    "no ca_file, and no system CA certificates to use instead".into(),
                ));
            }
            roots.add_parsable_certificates(found.certs);
        }
    }
    let builder = ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| ("url", e.to_string()))?
        .with_root_certificates(roots);
    let config = match (&u.cert_file, &u.key_file) {
        (Some(cert), Some(key)) => {
            let chain = read_certs(cert, "cert_file")?;
            let key_der = crate::pem::key(key).map_err(|e| ("key_file", e))?;
            builder
                .with_client_auth_cert(chain, key_der)
                .map_err(|e| ("key_file", format!("does not match cert_file: {e}")))?
        }
        (None, None) => builder.with_no_client_auth(),
        (Some(_), None) => return Err(("key_file", "cert_file needs a key_file".into())),
        (None, Some(_)) => return Err(("cert_file", "key_file needs a cert_file".into())),
    };
    Ok(Some(Arc::new(config)))
}

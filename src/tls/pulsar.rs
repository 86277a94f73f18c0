//! TLS to Pulsar's binary protocol (`pulsar+ssl://`), for the publisher's
//! own producer connections: `pulsar.ca_file` or the system's roots, and
//! `pulsar.tls_hostname_verification`.

use std::path::Path;
use std::sync::Arc;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::WebPkiServerVerifier;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{CertificateError, ClientConfig, DigitallySignedStruct, RootCertStore};

use super::{TlsProblem, TlsSettingError};

/// rustls settings for the broker: certificates signed by `ca_file` (or,
/// without it, by a root the system trusts), naming the host unless
/// `verify_hostname` is off.
pub fn client_config(
    ca_file: Option<&Path>,
    verify_hostname: bool,
) -> Result<Arc<ClientConfig>, TlsSettingError> {
    use TlsSettingError as E;
    let mut roots = RootCertStore::empty();
    match ca_file {
        Some(path) => {
            for ca in super::certs(path).map_err(E::at("pulsar.ca_file"))? {
                roots.add(ca).map_err(|source| {
                    E::at("pulsar.ca_file")(TlsProblem::Certificate {
                        path: path.to_path_buf(),
                        source,
                    })
                })?;
            }
        }
        None => {
            let found = rustls_native_certs::load_native_certs();
            if found.certs.is_empty() {
                return Err(E::at("pulsar.ca_file")(TlsProblem::NoSystemRoots));
            }
            roots.add_parsable_certificates(found.certs);
        }
    }
    let provider = super::provider();
    let builder = ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| E::at("pulsar.url")(e.into()))?;
    let config = if verify_hostname {
        builder.with_root_certificates(roots).with_no_client_auth()
    } else {
        let inner = WebPkiServerVerifier::builder_with_provider(Arc::new(roots), provider)
            .build()
            .map_err(|e| {
                E::at("pulsar.ca_file")(TlsProblem::Rustls(rustls::Error::General(e.to_string())))
            })?;
        builder
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(AnyName(inner)))
            .with_no_client_auth()
    };
    Ok(Arc::new(config))
}

/// Checks the broker's chain and signatures as usual, and accepts a
/// certificate that names another host (`tls_hostname_verification =
/// false`): a certificate from the same CA can then pose as the broker,
/// which the setting's documentation says.
#[derive(Debug)]
struct AnyName(Arc<WebPkiServerVerifier>);

impl ServerCertVerifier for AnyName {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        match self
            .0
            .verify_server_cert(end_entity, intermediates, server_name, ocsp_response, now)
        {
            Err(rustls::Error::InvalidCertificate(
                CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
            )) => Ok(ServerCertVerified::assertion()),
            other => other,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.0.supported_verify_schemes()
    }
}

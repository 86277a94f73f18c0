//! The TLS settings of every link, as the config file names them: the
//! peers' mutual TLS (`[cluster.tls]`), the HTTP API's certificate
//! (`[node.http_tls]`), and an upstream's files (which its own section
//! holds, and which reach here as [`UpstreamFiles`]). Owned here so that the
//! stages' sections use them and this folder imports no stage.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

/// Mutual TLS between nodes: every node presents `cert_file` and accepts
/// only peers whose certificate `ca_file` signed.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct TlsConfig {
    /// This node's certificate chain (PEM), used as server and as client.
    pub cert_file: PathBuf,
    /// Its private key (PEM).
    pub key_file: PathBuf,
    /// The CA that signs every node's certificate (PEM).
    pub ca_file: PathBuf,
    /// DNS name every node's certificate carries, checked by the connecting side.
    #[serde(default = "default_tls_name")]
    pub server_name: String,
}

fn default_tls_name() -> String {
    "firstseen-peer".into()
}

impl TlsConfig {
    /// Mutual TLS between peers, with the default server name.
    pub fn new(
        cert_file: impl Into<PathBuf>,
        key_file: impl Into<PathBuf>,
        ca_file: impl Into<PathBuf>,
    ) -> Self {
        Self {
            cert_file: cert_file.into(),
            key_file: key_file.into(),
            ca_file: ca_file.into(),
            server_name: default_tls_name(),
        }
    }
}

/// The HTTP listener's certificate. Clients check it against their own
/// roots (`firstseen members --ca-file`, curl `--cacert`).
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct HttpTlsConfig {
    /// The certificate chain (PEM) the listener presents.
    pub cert_file: PathBuf,
    /// Its private key (PEM).
    pub key_file: PathBuf,
}

/// An upstream's TLS files, as its section (`upstreams[]`) names them.
#[derive(Debug, Clone, Copy, Default)]
pub struct UpstreamFiles<'a> {
    pub ca_file: Option<&'a PathBuf>,
    pub cert_file: Option<&'a PathBuf>,
    pub key_file: Option<&'a PathBuf>,
}

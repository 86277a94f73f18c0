//! What the commands that talk to a node's HTTP API share: the client, and
//! where the admin credential may be sent.

use std::path::{Path, PathBuf};

/// Why an API client could not be made from `--ca-file`.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("cannot read {}: {source}", path.display())]
    ReadCa {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{}: {source}", path.display())]
    BadCa {
        path: PathBuf,
        #[source]
        source: reqwest::Error,
    },
    #[error("{}: no PEM certificate in it", path.display())]
    NoCertificate { path: PathBuf },
    #[error(transparent)]
    Build(reqwest::Error),
}

/// Why the CLI will not send the admin credential to a URL.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CredentialRefused {
    #[error("{url}: {detail}")]
    BadUrl { url: String, detail: String },
    #[error("refusing to send the admin credential over plain HTTP to {host}: use https:// (node.http_tls) or run the command on that host")]
    PlainToRemote { host: String },
    #[error("{url}: `{scheme}` is not http or https")]
    Scheme { url: String, scheme: String },
}

/// An HTTP client for a node's API that also trusts `ca_file`.
pub fn client(ca_file: Option<&Path>) -> Result<reqwest::Client, ClientError> {
    // No redirect is followed: an admin request carries a credential, and
    // only the members command's 409 hop, checked like the first request,
    // may move it.
    let mut b = reqwest::Client::builder().redirect(reqwest::redirect::Policy::none());
    if let Some(ca) = ca_file {
        let path = || ca.to_path_buf();
        let pem = std::fs::read(ca).map_err(|source| ClientError::ReadCa {
            path: path(),
            source,
        })?;
        let certs =
            reqwest::Certificate::from_pem_bundle(&pem).map_err(|source| ClientError::BadCa {
                path: path(),
                source,
            })?;
        if certs.is_empty() {
            return Err(ClientError::NoCertificate { path: path() });
        }
        for c in certs {
            b = b.add_root_certificate(c);
        }
    }
    b.build().map_err(ClientError::Build)
}

/// Whether the CLI may send the admin credential to `base`: over https to
/// any host, over plain http only to this host (loopback). A secret sent in
/// the clear to another host is a secret given to the network.
pub fn credential_may_go_to(base: &str) -> Result<(), CredentialRefused> {
    let url = url::Url::parse(base).map_err(|e| CredentialRefused::BadUrl {
        url: base.to_string(),
        detail: e.to_string(),
    })?;
    match url.scheme() {
        "https" => Ok(()),
        "http" => {
            let local = match url.host() {
                Some(url::Host::Ipv4(ip)) => ip.is_loopback(),
                Some(url::Host::Ipv6(ip)) => ip.is_loopback(),
                Some(url::Host::Domain(d)) => d.eq_ignore_ascii_case("localhost"),
                None => false,
            };
            if local {
                Ok(())
            } else {
                Err(CredentialRefused::PlainToRemote {
                    host: url.host_str().unwrap_or("?").to_string(),
                })
            }
        }
        other => Err(CredentialRefused::Scheme {
            url: base.to_string(),
            scheme: other.to_string(),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_admin_credential_goes_in_the_clear_only_to_this_host() {
        for ok in [
            "https://node-2.example:8443",
            "http://127.0.0.1:8080",
            "http://127.3.4.5:8080",
            "http://localhost:8080",
            "http://[::1]:8080",
        ] {
            assert!(credential_may_go_to(ok).is_ok(), "{ok}");
        }
        for refused in [
            "http://10.0.0.2:8080",
            "http://node-2.example:8080",
            "http://[2001:db8::1]:8080",
        ] {
            assert!(
                matches!(
                    credential_may_go_to(refused),
                    Err(CredentialRefused::PlainToRemote { .. })
                ),
                "{refused}"
            );
        }
        assert!(matches!(
            credential_may_go_to("ftp://127.0.0.1"),
            Err(CredentialRefused::Scheme { .. })
        ));
    }
}

//! Credentials for Pulsar, from `[pulsar]`: an inline token, a token file
//! read again on every authentication (so a rotated token is used without a
//! restart), or OAuth2 client credentials (the pulsar crate's flow, which
//! fetches a token and renews it before it expires). The publisher, the
//! tail reader, `firstseen verify` and the admin-API check all use these.

use std::time::{Duration, Instant};

use pulsar::error::AuthenticationError;
use pulsar::Authentication as Credentials;

use crate::publish::config::PulsarConfig;
use crate::Error;

/// A JWT in a file, read each time the broker asks for credentials: on
/// every (re)connection, and when the broker's refresh check finds the
/// current token expiring and sends an auth challenge.
struct TokenFile {
    path: std::path::PathBuf,
}

impl TokenFile {
    fn read(&self) -> Result<Vec<u8>, AuthenticationError> {
        match std::fs::read_to_string(&self.path) {
            Ok(t) if !t.trim().is_empty() => Ok(t.trim().as_bytes().to_vec()),
            Ok(_) => Err(AuthenticationError::Custom(format!(
                "pulsar.auth_token_file {} is empty",
                self.path.display()
            ))),
            // Retriable: a rotation that replaces the file by renaming
            // leaves a moment in which it is missing.
            Err(e) => Err(AuthenticationError::Retriable(format!(
                "pulsar.auth_token_file {}: {e}",
                self.path.display()
            ))),
        }
    }
}

#[async_trait::async_trait]
impl pulsar::authentication::Authentication for TokenFile {
    fn auth_method_name(&self) -> String {
        "token".into()
    }

    async fn initialize(&mut self) -> Result<(), AuthenticationError> {
        self.read().map(|_| ())
    }

    async fn auth_data(&mut self) -> Result<Vec<u8>, AuthenticationError> {
        self.read()
    }
}

/// How long one request to the OAuth2 issuer may take.
const OAUTH2_TIMEOUT: Duration = Duration::from_secs(10);
/// A token this close to its expiry is renewed before it is presented.
const RENEW_BEFORE: Duration = Duration::from_secs(60);

/// A string that never prints: the client secret.
struct Secret(String);

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("<redacted>")
    }
}

/// OAuth2 client credentials (RFC 6749 section 4.4) with the token endpoint
/// found by OpenID discovery, as Pulsar's own clients do it. Written here
/// rather than taken from the pulsar crate because the crate logs its
/// parameters, the client secret among them, at debug level; this client
/// names only the issuer, the client id and the issuer's error code.
struct OAuth2Client {
    issuer_url: String,
    client_id: String,
    secret: Secret,
    audience: Option<String>,
    scope: Option<String>,
    http: reqwest::Client,
    token_endpoint: Option<String>,
    /// The access token and when it stops being valid, if the issuer said.
    token: Option<(Vec<u8>, Option<Instant>)>,
}

#[derive(serde::Deserialize)]
struct Discovery {
    token_endpoint: String,
}

#[derive(serde::Deserialize)]
struct TokenReply {
    access_token: String,
    #[serde(default)]
    expires_in: Option<u64>,
}

#[derive(serde::Deserialize)]
struct TokenRefusal {
    error: String,
    #[serde(default)]
    error_description: Option<String>,
}

impl OAuth2Client {
    /// The issuer's token endpoint, discovered once.
    async fn token_endpoint(&mut self) -> Result<String, AuthenticationError> {
        if let Some(e) = &self.token_endpoint {
            return Ok(e.clone());
        }
        let url = format!(
            "{}/.well-known/openid-configuration",
            self.issuer_url.trim_end_matches('/')
        );
        let reply = self.http.get(&url).send().await.map_err(|e| {
            AuthenticationError::Retriable(format!(
                "OAuth2 discovery at {url}: {}",
                reqwest_reason(&e)
            ))
        })?;
        if !reply.status().is_success() {
            return Err(AuthenticationError::Custom(format!(
                "OAuth2 discovery at {url} answered {}",
                reply.status()
            )));
        }
        let found: Discovery = reply.json().await.map_err(|e| {
            AuthenticationError::Custom(format!(
                "OAuth2 discovery at {url} gave no token_endpoint: {}",
                reqwest_reason(&e)
            ))
        })?;
        self.token_endpoint = Some(found.token_endpoint.clone());
        Ok(found.token_endpoint)
    }

    /// A new access token from the issuer.
    async fn fetch(&mut self) -> Result<(Vec<u8>, Option<Instant>), AuthenticationError> {
        let endpoint = self.token_endpoint().await?;
        let mut form = vec![
            ("grant_type", "client_credentials"),
            ("client_id", self.client_id.as_str()),
            ("client_secret", self.secret.0.as_str()),
        ];
        if let Some(a) = &self.audience {
            form.push(("audience", a.as_str()));
        }
        if let Some(s) = &self.scope {
            form.push(("scope", s.as_str()));
        }
        let asked = Instant::now();
        let reply = self
            .http
            .post(&endpoint)
            .form(&form)
            .send()
            .await
            .map_err(|e| {
                AuthenticationError::Retriable(format!(
                    "OAuth2 token request to {endpoint}: {}",
                    reqwest_reason(&e)
                ))
            })?;
        let status = reply.status();
        if !status.is_success() {
            // RFC 6749 5.2: the issuer names what it refused; that code
            // (`invalid_client` for a wrong secret) is what the operator
            // needs, and it carries no credential.
            let why = match reply.json::<TokenRefusal>().await {
                Ok(r) => match r.error_description {
                    Some(d) => format!("{} ({d})", r.error),
                    None => r.error,
                },
                Err(_) => "no error code".into(),
            };
            let text = format!(
                "OAuth2 issuer {} refused client {:?}: HTTP {status}, {why}",
                self.issuer_url, self.client_id
            );
            return Err(if status.is_server_error() {
                AuthenticationError::Retriable(text)
            } else {
                AuthenticationError::Custom(text)
            });
        }
        let token: TokenReply = reply.json().await.map_err(|e| {
            AuthenticationError::Custom(format!(
                "OAuth2 issuer {} sent no access token: {}",
                self.issuer_url,
                reqwest_reason(&e)
            ))
        })?;
        let expires = token.expires_in.map(|s| asked + Duration::from_secs(s));
        tracing::debug!(issuer = %self.issuer_url, client_id = %self.client_id, expires_in = ?token.expires_in, "new OAuth2 access token");
        Ok((token.access_token.into_bytes(), expires))
    }
}

/// What went wrong with a request, with its causes. The URLs it names are
/// the issuer's, which carry no credential (the secret goes in the body).
fn reqwest_reason(e: &reqwest::Error) -> String {
    let mut text = e.to_string();
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        text.push_str(": ");
        text.push_str(&s.to_string());
        source = s.source();
    }
    text
}

#[async_trait::async_trait]
impl pulsar::authentication::Authentication for OAuth2Client {
    fn auth_method_name(&self) -> String {
        "token".into()
    }

    async fn initialize(&mut self) -> Result<(), AuthenticationError> {
        self.token_endpoint().await.map(|_| ())
    }

    async fn auth_data(&mut self) -> Result<Vec<u8>, AuthenticationError> {
        let now = Instant::now();
        let fresh = |t: &(Vec<u8>, Option<Instant>), margin: Duration| match t.1 {
            Some(at) => now + margin < at,
            None => true,
        };
        match &self.token {
            Some(t) if fresh(t, RENEW_BEFORE) => return Ok(t.0.clone()),
            _ => {}
        }
        match self.fetch().await {
            Ok(t) => {
                let data = t.0.clone();
                self.token = Some(t);
                Ok(data)
            }
            // A renewal that fails while the old token is still valid
            // keeps the old one: the issuer may be back before it expires.
            Err(e) => match &self.token {
                Some(t) if fresh(t, Duration::ZERO) => {
                    tracing::warn!(error = %e, "cannot renew the OAuth2 token; using the current one until it expires");
                    Ok(t.0.clone())
                }
                _ => {
                    self.token = None;
                    Err(e)
                }
            },
        }
    }
}

/// The credentials `config` names, or `None` for an unauthenticated broker.
pub fn provider(
    config: &PulsarConfig,
) -> Result<Option<Box<dyn pulsar::authentication::Authentication>>, Error> {
    if let Some(t) = &config.auth_token {
        return Ok(Some(Box::new(Credentials {
            name: "token".into(),
            data: t.trim().as_bytes().to_vec(),
        })));
    }
    if let Some(f) = &config.auth_token_file {
        return Ok(Some(Box::new(TokenFile { path: f.clone() })));
    }
    if let Some(o) = &config.oauth2 {
        let secret = std::fs::read_to_string(&o.client_secret_file).map_err(|source| {
            Error::SettingFile {
                key: "pulsar.oauth2.client_secret_file".into(),
                path: o.client_secret_file.clone(),
                source,
            }
        })?;
        return Ok(Some(Box::new(OAuth2Client {
            issuer_url: o.issuer_url.clone(),
            client_id: o.client_id.clone(),
            secret: Secret(secret.trim().to_string()),
            audience: o.audience.clone(),
            scope: o.scope.clone(),
            http: reqwest::Client::builder()
                .timeout(OAUTH2_TIMEOUT)
                .build()
                .map_err(|e| Error::setting("pulsar.oauth2", e.to_string()))?,
            token_endpoint: None,
            token: None,
        })));
    }
    Ok(None)
}

/// The bearer token for the admin REST API, from the same credentials.
pub async fn admin_token(config: &PulsarConfig) -> Result<Option<String>, Error> {
    let Some(mut p) = provider(config)? else {
        return Ok(None);
    };
    p.initialize().await.map_err(Error::Credentials)?;
    let data = p.auth_data().await.map_err(Error::Credentials)?;
    Ok(Some(String::from_utf8_lossy(&data).into_owned()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config_with(file: &std::path::Path) -> PulsarConfig {
        let text = format!(
            "url = \"pulsar+ssl://127.0.0.1:6651\"\nauth_token_file = \"{}\"\n",
            file.display()
        );
        toml::from_str(&text).unwrap()
    }

    /// Each authentication reads the file again, so a token replaced by a
    /// rename (how secret agents rotate files) is what the next connection
    /// or auth challenge presents; a file gone for a moment is retriable.
    #[tokio::test]
    async fn a_token_file_is_read_again_on_every_authentication() {
        let dir = tempfile::TempDir::new().unwrap();
        let file = dir.path().join("token");
        std::fs::write(&file, "first-token\n").unwrap();
        let mut p = provider(&config_with(&file)).unwrap().unwrap();
        p.initialize().await.unwrap();
        assert_eq!(p.auth_data().await.unwrap(), b"first-token");
        std::fs::write(dir.path().join("new"), "second-token\n").unwrap();
        std::fs::rename(dir.path().join("new"), &file).unwrap();
        assert_eq!(p.auth_data().await.unwrap(), b"second-token");
        std::fs::remove_file(&file).unwrap();
        assert!(matches!(
            p.auth_data().await,
            Err(AuthenticationError::Retriable(_))
        ));
        std::fs::write(&file, "  \n").unwrap();
        assert!(matches!(
            p.auth_data().await,
            Err(AuthenticationError::Custom(e)) if e.contains("is empty")
        ));
    }
}

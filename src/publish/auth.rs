//! Credentials for Pulsar, from `[pulsar]`: an inline token, a token file
//! read again on every authentication (so a rotated token is used without a
//! restart), or OAuth2 client credentials (the pulsar crate's flow, which
//! fetches a token and renews it before it expires). The publisher, the
//! tail reader, `firstseen verify` and the admin-API check all use these.

use pulsar::authentication::oauth2::{OAuth2Authentication, OAuth2Params};
use pulsar::error::AuthenticationError;
use pulsar::Authentication as Credentials;

use crate::config::PulsarConfig;
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
        // The crate takes the client id and secret as a JSON document behind
        // a URL; a data: URL keeps the secret out of any file but the
        // operator's own.
        let json = serde_json::json!({
            "type": "client_credentials",
            "client_id": o.client_id,
            "client_secret": secret.trim(),
        });
        let credentials_url = format!(
            "data:application/json;base64,{}",
            base64::Engine::encode(&base64::engine::general_purpose::STANDARD, json.to_string())
        );
        return Ok(Some(OAuth2Authentication::client_credentials(
            OAuth2Params {
                issuer_url: o.issuer_url.clone(),
                credentials_url,
                audience: o.audience.clone(),
                scope: o.scope.clone(),
            },
        )));
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

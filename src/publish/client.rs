//! The Pulsar plumbing the publisher's protocol runs on: the client,
//! built so that its own retries cannot resend behind the publisher's back,
//! and the admin REST API with the same CA and credentials. What is sent,
//! when and in what order is `mod.rs`'s; the ports' Pulsar side is
//! `adapter.rs`.

use std::time::Duration;

use pulsar::{ConnectionRetryOptions, OperationRetryOptions, Pulsar, TokioExecutor};

use super::auth;
use super::config::PulsarConfig;
use crate::{Error, TopicProblem};

/// Builds a Pulsar client whose own retries cannot resend behind our back.
pub async fn connect(config: &PulsarConfig) -> Result<Pulsar<TokioExecutor>, Error> {
    let timeout = Duration::from_millis(config.operation_timeout_ms);
    let mut builder = Pulsar::builder(config.url.clone(), TokioExecutor)
        .with_operation_retry_options(OperationRetryOptions {
            operation_timeout: timeout,
            retry_delay: Duration::from_millis(100),
            // Zero: producer (re-)creation is retried in our loop, where the
            // lease is checked, never inside the crate.
            max_retries: Some(0),
        })
        .with_connection_retry_options(ConnectionRetryOptions {
            min_backoff: Duration::from_millis(50),
            max_backoff: Duration::from_millis(500),
            max_retries: 1,
            connection_timeout: timeout,
            ..Default::default()
        });
    if let Some(credentials) = auth::provider(config)? {
        builder = builder.with_auth_provider(credentials);
    }
    if let Some((_, pem)) = read_ca(config)? {
        builder = builder.with_certificate_chain(pem);
    }
    builder = builder.with_tls_hostname_verification_enabled(config.tls_hostname_verification);
    Ok(builder.build().await?)
}

/// `pulsar.ca_file`'s path and contents, when set. Read here rather than by
/// the clients, so that a bad file is named with its config key.
fn read_ca(config: &PulsarConfig) -> Result<Option<(&std::path::Path, Vec<u8>)>, Error> {
    let Some(ca) = &config.ca_file else {
        return Ok(None);
    };
    let pem = std::fs::read(ca).map_err(|source| Error::SettingFile {
        key: "pulsar.ca_file".into(),
        path: ca.clone(),
        source,
    })?;
    Ok(Some((ca.as_path(), pem)))
}

/// An HTTP client for the admin REST API, trusting `pulsar.ca_file` too.
fn admin_client(config: &PulsarConfig) -> Result<reqwest::Client, Error> {
    let mut b =
        reqwest::Client::builder().timeout(Duration::from_millis(config.operation_timeout_ms));
    if let Some((ca, pem)) = read_ca(config)? {
        for cert in reqwest::Certificate::from_pem_bundle(&pem)
            .map_err(|e| Error::setting("pulsar.ca_file", format!("{}: {e}", ca.display())))?
        {
            b = b.add_root_certificate(cert);
        }
    }
    if !config.tls_hostname_verification {
        b = b.danger_accept_invalid_hostnames(true);
    }
    b.build().map_err(Error::Admin)
}

/// The admin REST API, with the same CA and credentials as the broker
/// connection.
pub struct Admin {
    url: String,
    client: reqwest::Client,
    token: Option<String>,
}

impl Admin {
    pub async fn new(config: &PulsarConfig) -> Result<Self, Error> {
        let url = config
            .admin_url
            .as_deref()
            .ok_or_else(|| Error::setting("pulsar.admin_url", "is not set"))?
            .trim_end_matches('/')
            .to_string();
        Ok(Self {
            url,
            client: admin_client(config)?,
            token: auth::admin_token(config).await?,
        })
    }

    /// A GET of `path` on the admin API, with the credentials.
    fn get(&self, path: &str) -> reqwest::RequestBuilder {
        let request = self.client.get(format!("{}{path}", self.url));
        match &self.token {
            Some(token) => request.bearer_auth(token),
            None => request,
        }
    }

    /// The admin API's path of a persistent `topic`.
    fn topic_path(topic: &str) -> Result<String, Error> {
        topic
            .strip_prefix("persistent://")
            .map(|p| format!("/admin/v2/persistent/{p}"))
            .ok_or_else(|| Error::topic(topic, TopicProblem::NotPersistent))
    }

    /// The broker's `maxMessageSize`, from its runtime configuration.
    pub async fn max_message_size(&self) -> Result<Option<usize>, Error> {
        let config: std::collections::HashMap<String, String> = self
            .get("/admin/v2/brokers/configuration/runtime")
            .send()
            .await
            .map_err(Error::Admin)?
            .error_for_status()
            .map_err(Error::Admin)?
            .json()
            .await
            .map_err(Error::Admin)?;
        Ok(config
            .get("maxMessageSize")
            .and_then(|v| v.trim().parse().ok()))
    }

    /// The topic's own `maxMessageSize` policy, if it sets one.
    pub async fn topic_max_message_size(&self, topic: &str) -> Result<Option<usize>, Error> {
        let path = Self::topic_path(topic)?;
        let response = self
            .get(&format!("{path}/maxMessageSize"))
            .send()
            .await
            .map_err(Error::Admin)?;
        // A topic the broker does not know yet has no policy of its own.
        if response.status() == reqwest::StatusCode::NOT_FOUND {
            return Ok(None);
        }
        let body = response
            .error_for_status()
            .map_err(Error::Admin)?
            .text()
            .await
            .map_err(Error::Admin)?;
        Ok(body.trim().parse().ok().filter(|l: &usize| *l > 0))
    }

    /// How many writes the broker has taken for `topic` and not yet
    /// persisted: the managed ledger's `pendingAddEntriesCount`, from the
    /// topic's internal stats (asked of the broker that owns the topic; the
    /// admin API redirects there). `None` when the broker does not say.
    ///
    /// A write counts here from the moment the managed ledger queues it
    /// until the bookies confirm it (or the ledger gives up on it), across
    /// ledger roll-overs: one re-sent to a new ledger after a bookie failure
    /// still counts. It does not yet count while the broker has handed it
    /// to the managed ledger's executor and that has not run; see
    /// docs/exactly-once.md.
    pub async fn pending_adds(&self, topic: &str) -> Result<Option<u64>, Error> {
        #[derive(serde::Deserialize)]
        struct InternalStats {
            #[serde(rename = "pendingAddEntriesCount")]
            pending: Option<u64>,
        }
        let path = Self::topic_path(topic)?;
        let stats: InternalStats = self
            .get(&format!("{path}/internalStats"))
            .send()
            .await
            .map_err(Error::Admin)?
            .error_for_status()
            .map_err(Error::Admin)?
            .json()
            .await
            .map_err(Error::Admin)?;
        Ok(stats.pending)
    }

    /// Whether deduplication applies to `topic`.
    pub async fn dedup_enabled(&self, topic: &str) -> Result<bool, Error> {
        let path = Self::topic_path(topic)?;
        let body = self
            .get(&format!("{path}/deduplicationEnabled?applied=true"))
            .send()
            .await
            .map_err(Error::Admin)?
            .error_for_status()
            .map_err(Error::Admin)?
            .text()
            .await
            .map_err(Error::Admin)?;
        Ok(body.trim() == "true")
    }
}

//! Pulsar for a new leadership term: the client (`super::super::connect`),
//! the admin API and its checks of the broker (deduplication, the largest
//! message), the credentials and TLS our producers connect with.

use std::sync::Arc;

use firstseen_store::StateStore;

use super::session::PulsarSession;
use super::sort::sort;
use crate::publish::config::PulsarConfig;
use crate::publish::port::{Broker, SendError};
use crate::publish::producer::{self, Producers};
use crate::publish::{auth, connect, tail, Admin};
use crate::Error;

/// Pulsar, as configured in `[pulsar]`.
pub struct PulsarBroker {
    pub config: PulsarConfig,
    /// The topics whose broker-side deduplication is checked at connect.
    pub state: StateStore,
    /// Which producers' messages the tail read counts as this cluster's.
    pub ours: tail::Ours,
}

impl Broker for PulsarBroker {
    type Session = PulsarSession;

    async fn connect(&self) -> Result<PulsarSession, SendError> {
        let client = connect(&self.config).await.map_err(|e| match e {
            Error::Pulsar(p) => sort(&p),
            other => SendError::Lost(other.to_string()),
        })?;
        let admin = self.admin().await;
        let limit = match &admin {
            Some(admin) => self.check_broker(admin).await,
            None if self.config.admin_url.is_some() => {
                // Configured, so the fence before the tail read is expected
                // (`PulsarSession::settled`); a term without it could resume
                // under a predecessor's writes. The term is tried again.
                return Err(SendError::Lost(
                    "the admin API (pulsar.admin_url) could not be set up; it is needed to wait out a predecessor's writes".into(),
                ));
            }
            None => {
                tracing::warn!(
                    "pulsar.admin_url is not set: a new leader cannot wait for writes a predecessor left pending at the broker before it reads the topic's end, and may publish those messages again (see docs/exactly-once.md, \"Writes in flight when a connection drops\")"
                );
                None
            }
        };
        let operation_timeout = self.config.operation_timeout();
        let unusable = |e: Error| SendError::Lost(e.to_string());
        let auth = match auth::provider(&self.config).map_err(unusable)? {
            Some(mut a) => {
                a.initialize()
                    .await
                    .map_err(|e| unusable(Error::Credentials(e)))?;
                Some(Arc::new(tokio::sync::Mutex::new(a)))
            }
            None => None,
        };
        let producers = Producers::new(producer::conn::Target {
            url: String::new(),
            proxy_to: None,
            tls: self.tls().map_err(unusable)?,
            auth,
            timeout: operation_timeout,
        });
        Ok(PulsarSession {
            client,
            producers,
            operation_timeout,
            ours: self.ours.clone(),
            admin,
            limit,
            max_message_bytes: self.config.max_message_bytes,
        })
    }
}

impl PulsarBroker {
    /// TLS for `pulsar+ssl://` brokers (none for `pulsar://`).
    fn tls(&self) -> Result<Option<Arc<rustls::ClientConfig>>, Error> {
        if !self.config.url.starts_with("pulsar+ssl://") {
            return Ok(None);
        }
        crate::tls::pulsar::client_config(
            self.config.ca_file.as_deref(),
            self.config.tls_hostname_verification,
        )
        .map(Some)
        .map_err(|e| Error::setting(e.key, e.problem.to_string()))
    }

    /// The admin API for this term, when it is configured: one client and
    /// one token for every call (with OAuth2 each token is a request to the
    /// issuer).
    async fn admin(&self) -> Option<Admin> {
        self.config.admin_url.as_ref()?;
        match Admin::new(&self.config).await {
            Ok(a) => Some(a),
            Err(e) => {
                tracing::warn!(error = %e, "could not reach the admin API to check the broker");
                None
            }
        }
    }

    /// Once per term, through the admin API: warns when the namespace does
    /// not deduplicate (a second guard for consumers that rely on it; the
    /// producer itself never resends), and returns the
    /// broker's `maxMessageSize`. A broker that takes less than
    /// `pulsar.max_message_bytes` closes the connection on a larger message,
    /// which the publisher would send again after every reconnect; knowing
    /// the broker's bound, it sends such a message as a marker instead.
    async fn check_broker(&self, admin: &Admin) -> Option<usize> {
        let limit = match admin.max_message_size().await {
            Ok(l) => l,
            Err(e) => {
                tracing::warn!(error = %e, "could not read the broker's maxMessageSize");
                None
            }
        };
        if let Some(l) = limit.filter(|l| *l < self.config.max_message_bytes) {
            tracing::warn!(
                broker_max_message_size = l,
                configured = self.config.max_message_bytes,
                "the broker takes smaller messages than pulsar.max_message_bytes; larger ones go as markers"
            );
        }
        let topics = self.state.topics().unwrap_or_default();
        for (topic, _) in topics.iter().take(8) {
            match admin.dedup_enabled(topic).await {
                Ok(true) => {}
                Ok(false) => {
                    tracing::warn!(topic = %topic, "broker deduplication is off for this topic; see docs/exactly-once.md")
                }
                Err(e) => {
                    tracing::warn!(topic = %topic, error = %e, "could not check broker deduplication")
                }
            }
        }
        limit
    }
}

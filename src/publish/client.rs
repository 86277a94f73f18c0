//! The Pulsar plumbing the publisher's protocol runs on: the client,
//! built so that its own retries cannot resend behind the publisher's back,
//! and the admin REST API with the same CA and credentials. What is sent,
//! when and in what order is `mod.rs`'s; the ports' Pulsar side is
//! `adapter/`.

use std::time::Duration;

use pulsar::{ConnectionRetryOptions, OperationRetryOptions, Pulsar, TokioExecutor};

use super::auth;
use super::config::PulsarConfig;
use super::TopicProblem;
use crate::Error;

/// Builds a Pulsar client whose own retries cannot resend behind our back.
pub async fn connect(config: &PulsarConfig) -> Result<Pulsar<TokioExecutor>, Error> {
    let operation_timeout = config.operation_timeout();
    let mut builder = Pulsar::builder(config.url.clone(), TokioExecutor)
        .with_operation_retry_options(OperationRetryOptions {
            operation_timeout,
            retry_delay: Duration::from_millis(100),
            // Zero: producer (re-)creation is retried in our loop, where the
            // lease is checked, never inside the crate.
            max_retries: Some(0),
        })
        .with_connection_retry_options(ConnectionRetryOptions {
            min_backoff: Duration::from_millis(50),
            max_backoff: Duration::from_millis(500),
            max_retries: 1,
            connection_timeout: operation_timeout,
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
    let mut b = reqwest::Client::builder().timeout(config.operation_timeout());
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
    // Redirects are followed by `Admin::get`, with the credentials: the
    // client's own policy drops them when the host changes.
    b = b.redirect(reqwest::redirect::Policy::none());
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

    /// A GET of `path` on the admin API, with the credentials, following
    /// redirects. A broker answers a topic's request it does not own with a
    /// redirect to the owner (a cluster of several brokers); reqwest's own
    /// redirect policy drops the `Authorization` header on a change of host,
    /// and the owner then refused the request, so they are followed here,
    /// the credentials sent again. Only to http(s) URLs, at most a few
    /// times; past that the redirect is the answer, which the caller fails
    /// to read.
    async fn get(&self, path: &str) -> Result<reqwest::Response, Error> {
        self.send(reqwest::Method::GET, path).await
    }

    /// A request of `method` on `path`, as [`Admin::get`] makes it: with
    /// the credentials, following the owner's redirects (a topic's PUT is
    /// redirected to its owner as a read is).
    async fn send(&self, method: reqwest::Method, path: &str) -> Result<reqwest::Response, Error> {
        let mut url = format!("{}{path}", self.url);
        let mut hops = 0;
        loop {
            let request = self.client.request(method.clone(), &url);
            let request = match &self.token {
                Some(token) => request.bearer_auth(token),
                None => request,
            };
            let response = request.send().await.map_err(Error::Admin)?;
            if !response.status().is_redirection() || hops == 4 {
                return Ok(response);
            }
            let next = response
                .headers()
                .get(reqwest::header::LOCATION)
                .and_then(|l| l.to_str().ok())
                .and_then(|l| response.url().join(l).ok())
                .filter(|u| matches!(u.scheme(), "http" | "https"));
            match next {
                Some(next) => url = next.to_string(),
                None => return Ok(response),
            }
            hops += 1;
        }
    }

    /// The admin API's path of a persistent `topic`, in either spelling:
    /// `fs` and `tenant/ns/fs` are `persistent://public/default/fs` and
    /// `persistent://tenant/ns/fs` to the broker, and so here. Taking only
    /// the full spelling made the wait for pending writes give up on every
    /// short name, so a route with `pulsar_topic = "fs"` never published
    /// (the conformance test and the review found it).
    fn topic_path(topic: &str) -> Result<String, super::Error> {
        super::proof::canonical_topic(topic)
            .strip_prefix("persistent://")
            .map(|p| format!("/admin/v2/persistent/{p}"))
            .ok_or_else(|| super::Error::topic(topic, TopicProblem::NotPersistent))
    }

    /// The broker's `maxMessageSize`, from its runtime configuration.
    pub async fn max_message_size(&self) -> Result<Option<usize>, Error> {
        let config: std::collections::HashMap<String, String> = self
            .get("/admin/v2/brokers/configuration/runtime")
            .await?
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
    pub async fn topic_max_message_size(&self, topic: &str) -> Result<Option<usize>, super::Error> {
        let path = Self::topic_path(topic)?;
        let response = self.get(&format!("{path}/maxMessageSize")).await?;
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
    /// still counts. Two instants escape it (Pulsar 4.0): a write the broker
    /// has handed to the managed ledger's executor that has not run yet, and
    /// one just confirmed, taken off the queue a few instructions before the
    /// ledger's last confirmed entry moves past it. Both are far shorter
    /// than what a new producer costs before it asks (its own creation, a
    /// metadata write, this request); see docs/exactly-once.md.
    pub async fn pending_adds(&self, topic: &str) -> Result<Option<u64>, super::Error> {
        #[derive(serde::Deserialize)]
        struct InternalStats {
            #[serde(rename = "pendingAddEntriesCount")]
            pending: Option<u64>,
        }
        if super::proof::canonical_topic(topic).starts_with("non-persistent://") {
            // No managed ledger: the broker keeps nothing that could land
            // after a successor read the topic's end.
            return Ok(Some(0));
        }
        let stats: InternalStats = self.topic_json(topic, "/internalStats").await?;
        Ok(stats.pending)
    }

    /// Creates `topic`, non-partitioned, for a broker that creates none on
    /// its own (`allowAutoTopicCreation=false`). Returns whether this call
    /// created it: `false` when it existed already (the broker's 409
    /// Conflict; another node, an operator or an earlier attempt made it),
    /// which is as good.
    pub async fn create_topic(&self, topic: &str) -> Result<bool, super::Error> {
        let path = Self::topic_path(topic)?;
        let response = self.send(reqwest::Method::PUT, &path).await?;
        if response.status() == reqwest::StatusCode::CONFLICT {
            return Ok(false);
        }
        response.error_for_status().map_err(Error::Admin)?;
        Ok(true)
    }

    /// How many partitions `topic` has: 0 for a non-partitioned topic, and
    /// for one that does not exist.
    pub async fn partitions(&self, topic: &str) -> Result<u32, super::Error> {
        #[derive(serde::Deserialize)]
        struct Metadata {
            partitions: u32,
        }
        let metadata: Metadata = self.topic_json(topic, "/partitions").await?;
        Ok(metadata.partitions)
    }

    /// GETs what the admin API says under `topic`'s path and `suffix`, and
    /// decodes its JSON.
    async fn topic_json<T: serde::de::DeserializeOwned>(
        &self,
        topic: &str,
        suffix: &str,
    ) -> Result<T, super::Error> {
        let value = self
            .topic_get(topic, suffix)
            .await?
            .json()
            .await
            .map_err(Error::Admin)?;
        Ok(value)
    }

    /// GETs what the admin API says under `topic`'s path and `suffix`; an
    /// answer other than success is the error.
    async fn topic_get(
        &self,
        topic: &str,
        suffix: &str,
    ) -> Result<reqwest::Response, super::Error> {
        let path = Self::topic_path(topic)?;
        Ok(self
            .get(&format!("{path}{suffix}"))
            .await?
            .error_for_status()
            .map_err(Error::Admin)?)
    }

    /// Whether deduplication applies to `topic`.
    pub async fn dedup_enabled(&self, topic: &str) -> Result<bool, super::Error> {
        let body = self
            .topic_get(topic, "/deduplicationEnabled?applied=true")
            .await?
            .text()
            .await
            .map_err(Error::Admin)?;
        Ok(body.trim() == "true")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpListener;

    /// Answers one HTTP request on `listener` with what `answer` makes of
    /// the request's head.
    async fn serve_once(listener: TcpListener, answer: impl Fn(&str) -> String) {
        let (mut s, _) = listener.accept().await.unwrap();
        let mut head = Vec::new();
        let mut buf = [0u8; 1024];
        while !head.windows(4).any(|w| w == b"\r\n\r\n") {
            let n = s.read(&mut buf).await.unwrap();
            assert!(n > 0, "the request ended early");
            head.extend_from_slice(&buf[..n]);
        }
        let reply = answer(&String::from_utf8_lossy(&head));
        s.write_all(reply.as_bytes()).await.unwrap();
        s.shutdown().await.unwrap();
    }

    /// A broker that does not own the topic redirects to the one that
    /// does, on another port (a cluster of brokers): the credentials go
    /// along, which reqwest's own redirects drop on a change of host (the
    /// owner then refused the stats read that the fence needs).
    #[tokio::test]
    async fn a_redirect_to_the_topics_owner_keeps_the_credentials() {
        let first = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let first_url = format!("http://{}", first.local_addr().unwrap());
        let owner = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let owner_port = owner.local_addr().unwrap().port();
        let redirect = tokio::spawn(serve_once(first, move |head| {
            let path = head.split_whitespace().nth(1).unwrap_or("/").to_string();
            format!(
                "HTTP/1.1 307 Temporary Redirect\r\nLocation: http://localhost:{owner_port}{path}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
            )
        }));
        let answered = tokio::spawn(serve_once(owner, |head| {
            let (status, body) = if head
                .to_ascii_lowercase()
                .contains("authorization: bearer secret-token")
            {
                ("200 OK", r#"{"pendingAddEntriesCount":3}"#)
            } else {
                ("401 Unauthorized", "{}")
            };
            format!(
                "HTTP/1.1 {status}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            )
        }));
        let config = PulsarConfig::new(first_url.replace("http", "pulsar"));
        let admin = Admin {
            url: first_url,
            client: admin_client(&config).unwrap(),
            token: Some("secret-token".into()),
        };
        let pending = admin
            .pending_adds("persistent://t/n/x")
            .await
            .expect("the owner answers");
        assert_eq!(pending, Some(3));
        redirect.await.unwrap();
        answered.await.unwrap();
    }

    #[test]
    fn a_topic_s_admin_path_is_the_same_in_either_spelling() {
        for (topic, path) in [
            ("fs", "/admin/v2/persistent/public/default/fs"),
            ("t/ns/fs", "/admin/v2/persistent/t/ns/fs"),
            (
                "persistent://public/default/fs",
                "/admin/v2/persistent/public/default/fs",
            ),
        ] {
            assert_eq!(Admin::topic_path(topic).unwrap(), path, "{topic}");
        }
        assert!(Admin::topic_path("non-persistent://public/default/fs").is_err());
    }
}

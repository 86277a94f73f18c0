//! `[pulsar]` and `[outbox]`: where the deduplicated stream goes, and how
//! much may wait for it. Types, defaults and the checks that need nothing
//! but the values (the files they name are checked by `crate::config`).

use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::problem::Problems;

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct PulsarConfig {
    /// Broker service URL, `pulsar://host:6650` or `pulsar+ssl://…`.
    pub url: String,
    /// Admin REST URL, used only for the start-up deduplication check.
    #[serde(default)]
    pub admin_url: Option<String>,
    /// JWT for token authentication, inline.
    #[serde(default)]
    pub auth_token: Option<String>,
    /// JWT for token authentication, read from a file (preferred). The file
    /// is read again whenever the broker asks the client to authenticate (on
    /// every connection, and when the broker's auth refresh finds the token
    /// expiring), so a rotated token is picked up without a restart.
    #[serde(default)]
    pub auth_token_file: Option<PathBuf>,
    /// OAuth2 client credentials (what hosted Pulsar offers): the client
    /// fetches a token from the issuer and renews it before it expires.
    #[serde(default)]
    pub oauth2: Option<OAuth2Config>,
    /// The CA (PEM) that signed the broker's certificate, for
    /// `pulsar+ssl://` with a private CA. Without it the system's roots apply.
    #[serde(default)]
    pub ca_file: Option<PathBuf>,
    /// Whether the broker's certificate must name the host in `url` (and in
    /// the lookup answers). On by default; turn it off only for a broker whose
    /// certificate you cannot fix, knowing that any holder of a certificate
    /// from the same CA can then pose as the broker.
    #[serde(default = "yes")]
    pub tls_hostname_verification: bool,
    /// Time a send or lookup may take before the producer is dropped.
    #[serde(default = "default_operation_timeout_ms")]
    pub operation_timeout_ms: u64,
    /// Messages sent before awaiting all their receipts.
    #[serde(default = "default_publish_batch")]
    pub publish_batch: usize,
    /// The broker's `maxMessageSize`, in bytes (Pulsar's default is 5 MiB).
    /// Pulsar refuses a larger message by closing the connection, which a
    /// client cannot tell from any other lost connection: a message over
    /// it would be sent again after every reconnect and stop the topic.
    /// So `dedup.max_message_bytes`, with firstseen's own properties, must
    /// stay below it, and check-config says so when it does not.
    #[serde(default = "default_pulsar_max_message")]
    pub max_message_bytes: usize,
}

/// OAuth2 client-credentials flow against `issuer_url` (OpenID discovery
/// finds its token endpoint).
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct OAuth2Config {
    /// The issuer, e.g. `https://auth.example.com/`; its
    /// `.well-known/openid-configuration` names the token endpoint.
    pub issuer_url: String,
    pub client_id: String,
    /// File holding the client secret (one line).
    pub client_secret_file: PathBuf,
    /// The audience the token is for, as the broker expects it.
    #[serde(default)]
    pub audience: Option<String>,
    #[serde(default)]
    pub scope: Option<String>,
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct OutboxConfig {
    /// Outbox size (payload and topic bytes) at which this node stops acking
    /// upstream until the publisher has drained it.
    #[serde(default = "default_quota")]
    pub quota_bytes: u64,
    /// Bytes the set-aside store may hold: messages sent to Pulsar as
    /// markers because the broker would refuse them, kept whole on every
    /// node. Past it the oldest of them go (and only they).
    #[serde(
        default = "default_set_aside",
        skip_serializing_if = "is_default_set_aside"
    )]
    pub set_aside_max_bytes: u64,
}

fn default_set_aside() -> u64 {
    256 * 1024 * 1024
}
fn is_default_set_aside(b: &u64) -> bool {
    *b == default_set_aside()
}

fn yes() -> bool {
    true
}
fn default_operation_timeout_ms() -> u64 {
    5_000
}
fn default_pulsar_max_message() -> usize {
    5 * 1024 * 1024
}
fn default_publish_batch() -> usize {
    500
}
fn default_quota() -> u64 {
    1024 * 1024 * 1024
}
impl Default for OutboxConfig {
    fn default() -> Self {
        Self {
            quota_bytes: default_quota(),
            set_aside_max_bytes: default_set_aside(),
        }
    }
}

impl PulsarConfig {
    pub fn new(url: impl Into<String>) -> Self {
        Self {
            url: url.into(),
            admin_url: None,
            auth_token: None,
            auth_token_file: None,
            oauth2: None,
            ca_file: None,
            tls_hostname_verification: true,
            operation_timeout_ms: default_operation_timeout_ms(),
            publish_batch: default_publish_batch(),
            max_message_bytes: default_pulsar_max_message(),
        }
    }

    /// The settings of a client that only reads (`firstseen verify`,
    /// `firstseen compare`): a long timeout for a busy broker, no batches.
    pub fn reader(url: impl Into<String>) -> Self {
        Self {
            operation_timeout_ms: 30_000,
            publish_batch: 1,
            ..Self::new(url)
        }
    }

    /// `operation_timeout_ms`, as every client of the broker takes it: the
    /// crate's lookups, our producers' requests and the admin API's calls.
    pub fn operation_timeout(&self) -> Duration {
        Duration::from_millis(self.operation_timeout_ms)
    }
}

impl PulsarConfig {
    /// Adds every problem of `[pulsar]` that needs no file to `p`.
    pub fn check(&self, p: &mut Problems) {
        if self.publish_batch == 0 {
            p.add("pulsar.publish_batch", "must be at least 1");
        }
        if self.operation_timeout_ms < 100 {
            p.add("pulsar.operation_timeout_ms", "must be at least 100");
        }
        if !(self.url.starts_with("pulsar://") || self.url.starts_with("pulsar+ssl://")) {
            p.add(
                "pulsar.url",
                format!("`{}` is not a pulsar:// or pulsar+ssl:// URL", self.url),
            );
        }
        let credentials = [
            self.auth_token.is_some(),
            self.auth_token_file.is_some(),
            self.oauth2.is_some(),
        ];
        if credentials.iter().filter(|c| **c).count() > 1 {
            p.add(
                "pulsar.auth_token_file",
                "set one of auth_token, auth_token_file and [pulsar.oauth2], not several",
            );
        }
        if let Some(o) = &self.oauth2 {
            match url::Url::parse(&o.issuer_url) {
                Ok(u) if u.scheme() == "https" || u.scheme() == "http" => {}
                _ => p.add(
                    "pulsar.oauth2.issuer_url",
                    format!("`{}` is not an http(s) URL", o.issuer_url),
                ),
            }
            if o.client_id.trim().is_empty() {
                p.add("pulsar.oauth2.client_id", "must not be empty");
            }
        }
        if self.ca_file.is_some() && !self.url.starts_with("pulsar+ssl://") {
            p.add(
                "pulsar.ca_file",
                format!(
                    "only used with a pulsar+ssl:// url; `{}` is plain TCP",
                    self.url
                ),
            );
        }
        if let Some(admin) = &self.admin_url {
            if url::Url::parse(admin).is_err() {
                p.add("pulsar.admin_url", format!("`{admin}` is not a URL"));
            }
        }
    }
}

impl OutboxConfig {
    /// Adds every problem of `[outbox]` to `p`.
    pub fn check(&self, p: &mut Problems) {
        if self.quota_bytes == 0 {
            p.add("outbox.quota_bytes", "must be at least 1");
        }
    }
}

//! Configuration: TOML, overridable from the environment, validated into
//! typed errors that name the key before anything starts.
//!
//! Environment overrides use the prefix `FIRSTSEEN__` and `__` between path
//! segments; a number selects an array element. For example
//! `FIRSTSEEN__PULSAR__URL=pulsar://10.0.0.5:6650` or
//! `FIRSTSEEN__UPSTREAMS__0__PASSWORD=secret`. The value is read as a TOML
//! scalar when it parses as one (`42`, `true`), otherwise as a string.

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::ingest::route::{filter_is_valid, KeySpec};
use crate::publish::format::{Format, Formats};

mod env;

/// Everything that is wrong with a config file, one entry per problem.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    /// Dotted path of the offending key, e.g. `upstreams[0].url`.
    pub key: String,
    /// What is wrong with it, in words an operator can act on.
    pub message: String,
}

impl std::fmt::Display for Problem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.key, self.message)
    }
}

/// The whole node configuration.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// This node: identity, storage and HTTP.
    pub node: NodeConfig,
    /// The Raft group. Optional for a group of one.
    #[serde(default)]
    pub cluster: ClusterConfig,
    /// Dedup window and input limits.
    #[serde(default)]
    pub dedup: DedupConfig,
    /// How observations are grouped into Raft entries.
    #[serde(default)]
    pub batch: BatchConfig,
    /// Outbox limits (G5 backpressure).
    #[serde(default)]
    pub outbox: OutboxConfig,
    /// Bounds of the dead-letter store (G5 holds for it too).
    #[serde(default)]
    pub dead_letter: DeadLetterConfig,
    /// Where the deduplicated stream goes.
    pub pulsar: PulsarConfig,
    /// Upstream MQTT brokers this node subscribes to.
    #[serde(default)]
    pub upstreams: Vec<UpstreamConfig>,
    /// MQTT topic filter → Pulsar topic, first match wins.
    #[serde(default)]
    pub routes: Vec<RouteConfig>,
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct NodeConfig {
    /// Raft node id, unique in the cluster, never reused for another machine.
    pub id: u64,
    /// Availability zone name, shown in status and coverage.
    pub zone: String,
    /// Directory for sled, snapshots and the dead-letter store.
    pub data_dir: PathBuf,
    /// Address of the HTTP API (status, metrics, health).
    #[serde(default = "default_http_listen")]
    pub http_listen: SocketAddr,
    /// Free space kept on the data directory's filesystem. Below it the node
    /// stops writing new entries: it holds upstream acks (the broker keeps
    /// the messages), refuses replication, says so on `/readyz`, and resumes
    /// by itself when space returns. It must cover what a node writes after
    /// the check: a snapshot of the window and a few batches.
    #[serde(default = "default_disk_reserve")]
    pub disk_reserve_bytes: u64,
    /// Longest a shutdown (SIGTERM, SIGINT) takes, whatever the cluster's
    /// state. Unacked messages stay with the broker's persistent session.
    #[serde(default = "default_shutdown_timeout")]
    pub shutdown_timeout_secs: u64,
    /// TLS for the HTTP API (status, metrics, admin). Without it the API is
    /// plain HTTP.
    #[serde(default)]
    pub http_tls: Option<HttpTlsConfig>,
    /// Admin requests carry the cluster secret. Over plain HTTP they are
    /// accepted only from a loopback client, unless this is set: anyone on
    /// the path could read the secret, and with it join the cluster.
    #[serde(default)]
    pub allow_plaintext_admin: bool,
    /// The token admin requests must present. Without it they present the
    /// cluster secret, so whoever administers the cluster holds the key its
    /// members authenticate each other with; with it the two are apart, and
    /// the cluster secret no longer opens the admin API.
    #[serde(default)]
    pub admin_token_file: Option<PathBuf>,
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

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ClusterConfig {
    /// Initial members. Every node starts with the same list; bootstrap is
    /// idempotent. Empty means a group of one made of this node. A node not
    /// in the list starts empty and waits to be added (`firstseen members add`).
    #[serde(default)]
    pub members: Vec<MemberConfig>,
    /// Address the peer protocol (Raft RPC, forwarding) listens on. Required
    /// when there are members. If it names a specific IP, outgoing peer
    /// connections are made from that IP too.
    #[serde(default)]
    pub listen: Option<SocketAddr>,
    /// File holding the cluster secret that peers authenticate each other
    /// with. Required when there are members; the same file on every node.
    #[serde(default)]
    pub secret_file: Option<PathBuf>,
    /// A snapshot is taken after this many log entries; the log before it is
    /// then purged.
    #[serde(default = "default_snapshot_logs")]
    pub snapshot_logs: u64,
    /// TLS for the peer protocol. Without it, peers authenticate with the
    /// secret but talk in the clear.
    #[serde(default)]
    pub tls: Option<TlsConfig>,
    /// Lets a node whose `listen` is not a loopback address run without
    /// `tls`: peers then authenticate but talk in the clear, and anyone on the
    /// path reads every message. Off by default.
    #[serde(default)]
    pub allow_plaintext: bool,
    /// How often the leader sends heartbeats, in milliseconds.
    #[serde(default = "default_heartbeat_ms")]
    pub heartbeat_ms: u64,
    /// Elections: a follower that hears no leader for a random time between
    /// `election_timeout_max_ms` and twice that minus the minimum asks its
    /// peers for a pre-vote, and campaigns only if a majority agrees. The
    /// maximum is also how long a voter that heard from a leader refuses
    /// to vote for another (openraft's leader lease).
    #[serde(default = "default_election_min_ms")]
    pub election_timeout_min_ms: u64,
    #[serde(default = "default_election_max_ms")]
    pub election_timeout_max_ms: u64,
}

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

impl Default for ClusterConfig {
    fn default() -> Self {
        Self {
            members: Vec::new(),
            listen: None,
            secret_file: None,
            snapshot_logs: default_snapshot_logs(),
            tls: None,
            allow_plaintext: false,
            heartbeat_ms: default_heartbeat_ms(),
            election_timeout_min_ms: default_election_min_ms(),
            election_timeout_max_ms: default_election_max_ms(),
        }
    }
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct MemberConfig {
    pub id: u64,
    pub zone: String,
    /// Peer protocol address (host:port) other nodes reach it at.
    pub addr: String,
    /// HTTP API address (host:port), for operators and the CLI.
    #[serde(default)]
    pub http: String,
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct DedupConfig {
    /// How long a key is remembered, in seconds (default one hour).
    #[serde(default = "default_window_secs")]
    pub window_secs: u64,
    /// Largest payload forwarded to Pulsar, in bytes.
    #[serde(default = "default_max_payload")]
    pub max_payload_bytes: usize,
    /// Largest message as stored and published, in bytes: MQTT topic, MQTT
    /// 5 properties (as the Pulsar properties they become) and payload.
    /// The default keeps every message, with firstseen's own properties,
    /// under Pulsar's default `maxMessageSize` (5 MiB).
    #[serde(default = "default_max_message")]
    pub max_message_bytes: usize,
    /// Longest MQTT topic, in bytes.
    #[serde(default = "default_max_topic")]
    pub max_topic_bytes: usize,
    /// Most MQTT 5 user properties on one message.
    #[serde(default = "default_max_properties")]
    pub max_properties: usize,
    /// What happens to a message over any of these bounds. See
    /// [`OversizePolicy`].
    #[serde(default)]
    pub oversize: OversizePolicy,
}

/// The documented policy for messages over a `dedup.max_*` bound.
/// Neither choice loses a message silently: both count it in
/// `firstseen_oversize_total` and log its topic and size.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum OversizePolicy {
    /// Write it to `<data_dir>/dead-letter/` (fsynced) and then ack it.
    #[default]
    DeadLetter,
    /// Ack it without storing it, for feeds where such payloads are junk.
    Drop,
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct BatchConfig {
    /// Most observations in one Raft entry.
    #[serde(default = "default_batch_messages")]
    pub max_messages: usize,
    /// Most payload bytes in one Raft entry.
    #[serde(default = "default_batch_bytes")]
    pub max_bytes: usize,
    /// Longest wait for a batch to fill once its first message arrived.
    #[serde(default = "default_linger_ms")]
    pub linger_ms: u64,
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct OutboxConfig {
    /// Outbox size (payload and topic bytes) at which this node stops acking
    /// upstream until the publisher has drained it.
    #[serde(default = "default_quota")]
    pub quota_bytes: u64,
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct DeadLetterConfig {
    /// Bytes `<data_dir>/dead-letter/` may hold; past it the oldest files
    /// are removed. A dead letter is an inspection copy of a message that
    /// was not forwarded: the newest are kept rather than acks held.
    #[serde(default = "default_dead_letter_bytes")]
    pub max_bytes: u64,
    /// Age (by receive time) past which a dead letter is removed.
    #[serde(default = "default_dead_letter_retention")]
    pub retention_secs: u64,
}

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
pub struct UpstreamConfig {
    /// Short name, used in logs, metrics and the default client id.
    pub name: String,
    /// `mqtt://host:port` (or `tcp://`), `mqtts://host:port` for TLS.
    pub url: String,
    /// MQTT client id. Must be stable per node and upstream: the persistent
    /// session that holds unacked messages across restarts is keyed by it.
    /// Default: `firstseen-<node id>-<name>`.
    #[serde(default)]
    pub client_id: Option<String>,
    #[serde(default)]
    pub username: Option<String>,
    #[serde(default)]
    pub password: Option<String>,
    #[serde(default)]
    pub password_file: Option<PathBuf>,
    /// `mqtts://` only: PEM file of the CA certificate(s) the broker's
    /// certificate must chain to, instead of the system's roots.
    #[serde(default)]
    pub ca_file: Option<PathBuf>,
    /// `mqtts://` only: PEM client certificate (chain), for a broker that
    /// requires one; with `key_file`.
    #[serde(default)]
    pub cert_file: Option<PathBuf>,
    /// `mqtts://` only: PEM private key of `cert_file`.
    #[serde(default)]
    pub key_file: Option<PathBuf>,
    /// MQTT keepalive, seconds.
    #[serde(default = "default_keepalive")]
    pub keepalive_secs: u64,
    /// `"3.1.1"` (the default) or `"5"`: which MQTT version to speak.
    #[serde(default)]
    pub protocol: Protocol,
    /// MQTT 5: how long the broker keeps this node's session (and its queue
    /// of unacked messages) after a disconnect. The default, 4294967295,
    /// means for as long as the broker allows, like a 3.1.1 persistent
    /// session. Ignored for 3.1.1.
    #[serde(default = "default_session_expiry")]
    pub session_expiry_secs: u32,
    /// Topic filters to subscribe to.
    pub subscriptions: Vec<SubscriptionConfig>,
}

/// The MQTT version an upstream speaks.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize)]
pub enum Protocol {
    #[default]
    #[serde(rename = "3.1.1")]
    V311,
    /// MQTT 5: user properties, content type and the rest reach Pulsar as
    /// message properties (docs/configuration.md).
    #[serde(rename = "5")]
    V5,
}

impl std::fmt::Display for Protocol {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Protocol::V311 => "3.1.1",
            Protocol::V5 => "5",
        })
    }
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct SubscriptionConfig {
    pub filter: String,
    /// 1 or 2 for the no-loss guarantee; 0 is accepted but never acked.
    #[serde(default = "default_qos")]
    pub qos: u8,
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RouteConfig {
    /// MQTT topic filter (`+` and `#` wildcards).
    pub filter: String,
    /// Pulsar topic, e.g. `persistent://public/default/hfp`.
    pub pulsar_topic: String,
    /// What the dedup key hashes: `"topic+payload"`, `"payload"`, or JSON
    /// fields, `{ json = ["/VP/veh", ...], topic = false, missing = "bytes" }`
    /// (see `src/key.rs` for the canonical form).
    #[serde(default)]
    pub key: KeySpec,
    /// How messages are written: `"raw"` (the payload as it came, the
    /// default) or `"transitdata"` (HSL transitdata's `mqtt-raw` protobuf
    /// envelope; docs/migrating-from-transitdata.md).
    #[serde(default)]
    pub format: Format,
}

fn default_heartbeat_ms() -> u64 {
    100
}
fn default_election_min_ms() -> u64 {
    400
}
fn default_election_max_ms() -> u64 {
    800
}
fn default_disk_reserve() -> u64 {
    256 * 1024 * 1024
}
fn yes() -> bool {
    true
}
fn default_shutdown_timeout() -> u64 {
    10
}
fn default_snapshot_logs() -> u64 {
    20_000
}
fn default_http_listen() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], 8080))
}
fn default_window_secs() -> u64 {
    3_600
}
fn default_max_payload() -> usize {
    1024 * 1024
}
/// 4 MiB: under Pulsar's default `maxMessageSize` of 5 MiB with room for
/// firstseen's own properties.
fn default_max_message() -> usize {
    4 * 1024 * 1024
}
fn default_max_topic() -> usize {
    4_096
}
fn default_max_properties() -> usize {
    128
}
fn default_batch_messages() -> usize {
    1_000
}
/// 256 KiB: openraft gives a whole AppendEntries one heartbeat (100 ms),
/// and a follower that fell behind is sent `max_payload_entries` (4)
/// entries at a time. With 4 MiB entries (merged batches of a replayed
/// backlog) a debug build on two cores never answered within the budget:
/// the same append was resent forever and a two-node majority committed
/// nothing (found when a third node's disk failed mid-replay). A quarter
/// MiB keeps an append near 1 MiB; batches are bounded by
/// `batch.max_messages` first at the HSL feed's message sizes anyway.
fn default_batch_bytes() -> usize {
    256 * 1024
}
fn default_linger_ms() -> u64 {
    2
}
fn default_quota() -> u64 {
    1024 * 1024 * 1024
}
fn default_dead_letter_bytes() -> u64 {
    1024 * 1024 * 1024
}
fn default_dead_letter_retention() -> u64 {
    7 * 24 * 3600
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
fn default_keepalive() -> u64 {
    30
}
fn default_session_expiry() -> u32 {
    u32::MAX
}
fn default_qos() -> u8 {
    1
}

impl Default for DedupConfig {
    fn default() -> Self {
        Self {
            window_secs: default_window_secs(),
            max_payload_bytes: default_max_payload(),
            max_message_bytes: default_max_message(),
            max_topic_bytes: default_max_topic(),
            max_properties: default_max_properties(),
            oversize: OversizePolicy::default(),
        }
    }
}

impl Default for BatchConfig {
    fn default() -> Self {
        Self {
            max_messages: default_batch_messages(),
            max_bytes: default_batch_bytes(),
            linger_ms: default_linger_ms(),
        }
    }
}

impl Default for OutboxConfig {
    fn default() -> Self {
        Self {
            quota_bytes: default_quota(),
        }
    }
}

impl Default for DeadLetterConfig {
    fn default() -> Self {
        Self {
            max_bytes: default_dead_letter_bytes(),
            retention_secs: default_dead_letter_retention(),
        }
    }
}

/// Constructors with every optional key at its default, for a config
/// built in code (the tests' nodes) rather than read from a file. Each
/// default is the one a file that leaves the key out gets.
impl Config {
    /// A node that subscribes to nothing yet.
    pub fn new(node: NodeConfig, pulsar: PulsarConfig) -> Self {
        Self {
            node,
            cluster: ClusterConfig::default(),
            dedup: DedupConfig::default(),
            batch: BatchConfig::default(),
            outbox: OutboxConfig::default(),
            dead_letter: DeadLetterConfig::default(),
            pulsar,
            upstreams: Vec::new(),
            routes: Vec::new(),
        }
    }

    /// The config as TOML that [`Config::parse`] reads back as it is.
    pub fn to_toml(&self) -> String {
        toml::to_string(self).expect("a config is always TOML")
    }
}

impl NodeConfig {
    pub fn new(id: u64, zone: impl Into<String>, data_dir: impl Into<PathBuf>) -> Self {
        Self {
            id,
            zone: zone.into(),
            data_dir: data_dir.into(),
            http_listen: default_http_listen(),
            disk_reserve_bytes: default_disk_reserve(),
            shutdown_timeout_secs: default_shutdown_timeout(),
            http_tls: None,
            allow_plaintext_admin: false,
            admin_token_file: None,
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
}

impl UpstreamConfig {
    pub fn new(
        name: impl Into<String>,
        url: impl Into<String>,
        subscriptions: Vec<SubscriptionConfig>,
    ) -> Self {
        Self {
            name: name.into(),
            url: url.into(),
            client_id: None,
            username: None,
            password: None,
            password_file: None,
            ca_file: None,
            cert_file: None,
            key_file: None,
            keepalive_secs: default_keepalive(),
            protocol: Protocol::default(),
            session_expiry_secs: default_session_expiry(),
            subscriptions,
        }
    }
}

impl SubscriptionConfig {
    pub fn new(filter: impl Into<String>, qos: u8) -> Self {
        Self {
            filter: filter.into(),
            qos,
        }
    }
}

impl Config {
    /// Each Pulsar topic's format, as the routes set it.
    pub fn formats(&self) -> Formats {
        Formats::new(
            self.routes
                .iter()
                .map(|r| (r.pulsar_topic.clone(), r.format)),
        )
    }
}

impl RouteConfig {
    /// A route with the default key (`topic+payload`).
    pub fn new(filter: impl Into<String>, pulsar_topic: impl Into<String>) -> Self {
        Self {
            filter: filter.into(),
            pulsar_topic: pulsar_topic.into(),
            key: KeySpec::default(),
            format: Format::default(),
        }
    }
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

/// Why a config could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}: {0}", path = .1.display())]
    Syntax(String, PathBuf),
    #[error("{path}: invalid configuration:\n{list}", path = .path.display(), list = list(.problems))]
    Invalid {
        path: PathBuf,
        problems: Vec<Problem>,
    },
}

fn list(problems: &[Problem]) -> String {
    problems
        .iter()
        .map(|p| format!("  - {p}"))
        .collect::<Vec<_>>()
        .join("\n")
}

impl Config {
    /// Reads, overrides from the environment, parses and validates `path`.
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        Self::parse(&text, path, std::env::vars())
    }

    /// Parses config text with the given environment. Split out so tests can
    /// pass an environment of their own.
    pub fn parse(
        text: &str,
        path: &Path,
        vars: impl IntoIterator<Item = (String, String)>,
    ) -> Result<Self, ConfigError> {
        let mut value: toml::Value = toml::from_str(text)
            .map_err(|e| ConfigError::Syntax(e.to_string(), path.to_path_buf()))?;
        env::apply_overrides(&mut value, vars).map_err(|problem| ConfigError::Invalid {
            path: path.to_path_buf(),
            problems: vec![problem],
        })?;
        let config: Config = serde_path_to_error::deserialize(value).map_err(|e| {
            let key = e.path().to_string();
            ConfigError::Invalid {
                path: path.to_path_buf(),
                problems: vec![Problem {
                    key: if key == "." {
                        "(top level)".into()
                    } else {
                        key
                    },
                    message: e.into_inner().to_string(),
                }],
            }
        })?;
        let problems = config.problems();
        if problems.is_empty() {
            Ok(config)
        } else {
            Err(ConfigError::Invalid {
                path: path.to_path_buf(),
                problems,
            })
        }
    }

    /// Every semantic problem, not just the first, so one run of
    /// `check-config` shows all there is to fix.
    pub fn problems(&self) -> Vec<Problem> {
        let mut out = Vec::new();
        let mut bad = |key: &str, message: String| {
            out.push(Problem {
                key: key.to_string(),
                message,
            })
        };
        if self.node.zone.trim().is_empty() {
            bad("node.zone", "must not be empty".into());
        }
        if self.node.shutdown_timeout_secs == 0 {
            bad("node.shutdown_timeout_secs", "must be at least 1".into());
        }
        if self.dedup.window_secs == 0 {
            bad("dedup.window_secs", "must be at least 1".into());
        }
        if self.dedup.max_payload_bytes == 0 {
            bad("dedup.max_payload_bytes", "must be at least 1".into());
        }
        if self.dedup.max_message_bytes < self.dedup.max_payload_bytes {
            bad(
                "dedup.max_message_bytes",
                format!(
                    "{} is below dedup.max_payload_bytes ({}): the message bound counts the payload too",
                    self.dedup.max_message_bytes, self.dedup.max_payload_bytes
                ),
            );
        }
        let envelope = self
            .routes
            .iter()
            .map(|r| r.format.extra_bytes(self.dedup.max_topic_bytes))
            .max()
            .unwrap_or(0);
        let largest = self
            .dedup
            .max_message_bytes
            .saturating_add(crate::publish::props::OWN_BYTES)
            .saturating_add(envelope);
        if largest > self.pulsar.max_message_bytes {
            bad(
                "dedup.max_message_bytes",
                format!(
                    "{} plus firstseen's own properties (up to {} bytes){} exceeds pulsar.max_message_bytes ({}): \
                     the broker would refuse such a message for ever; lower it or raise pulsar.max_message_bytes to the broker's maxMessageSize",
                    self.dedup.max_message_bytes,
                    crate::publish::props::OWN_BYTES,
                    if envelope > 0 {
                        format!(" and the transitdata envelope (up to {envelope} bytes)")
                    } else {
                        String::new()
                    },
                    self.pulsar.max_message_bytes
                ),
            );
        }
        if self.dedup.max_topic_bytes == 0 {
            bad("dedup.max_topic_bytes", "must be at least 1".into());
        }
        if self.batch.max_messages == 0 {
            bad("batch.max_messages", "must be at least 1".into());
        }
        if self.batch.max_bytes == 0 {
            bad("batch.max_bytes", "must be at least 1".into());
        }
        if self.outbox.quota_bytes == 0 {
            bad("outbox.quota_bytes", "must be at least 1".into());
        }
        // One message the store is asked to keep must fit, or the quota
        // would remove every older file for each new one.
        if self.dead_letter.max_bytes < self.dedup.max_message_bytes as u64 {
            bad(
                "dead_letter.max_bytes",
                format!(
                    "{} is below dedup.max_message_bytes ({}): the store could not hold one oversized message",
                    self.dead_letter.max_bytes, self.dedup.max_message_bytes
                ),
            );
        }
        if self.dead_letter.retention_secs == 0 {
            bad("dead_letter.retention_secs", "must be at least 1".into());
        }
        if self.pulsar.publish_batch == 0 {
            bad("pulsar.publish_batch", "must be at least 1".into());
        }
        if self.pulsar.operation_timeout_ms < 100 {
            bad("pulsar.operation_timeout_ms", "must be at least 100".into());
        }
        if !(self.pulsar.url.starts_with("pulsar://")
            || self.pulsar.url.starts_with("pulsar+ssl://"))
        {
            bad(
                "pulsar.url",
                format!(
                    "`{}` is not a pulsar:// or pulsar+ssl:// URL",
                    self.pulsar.url
                ),
            );
        }
        let credentials = [
            self.pulsar.auth_token.is_some(),
            self.pulsar.auth_token_file.is_some(),
            self.pulsar.oauth2.is_some(),
        ];
        if credentials.iter().filter(|c| **c).count() > 1 {
            bad(
                "pulsar.auth_token_file",
                "set one of auth_token, auth_token_file and [pulsar.oauth2], not several".into(),
            );
        }
        // Secret files are read now, so that check-config names an unreadable
        // or empty one before a node ever dials the broker with it.
        let secret_file = |key: &str, path: &Path, bad: &mut dyn FnMut(&str, String)| {
            match std::fs::read_to_string(path) {
                Ok(t) if t.trim().is_empty() => bad(key, format!("{} is empty", path.display())),
                Ok(_) => {}
                Err(e) => bad(key, format!("cannot read {}: {e}", path.display())),
            }
        };
        if let Some(f) = &self.pulsar.auth_token_file {
            secret_file("pulsar.auth_token_file", f, &mut bad);
        }
        if let Some(o) = &self.pulsar.oauth2 {
            match url::Url::parse(&o.issuer_url) {
                Ok(u) if u.scheme() == "https" || u.scheme() == "http" => {}
                _ => bad(
                    "pulsar.oauth2.issuer_url",
                    format!("`{}` is not an http(s) URL", o.issuer_url),
                ),
            }
            if o.client_id.trim().is_empty() {
                bad("pulsar.oauth2.client_id", "must not be empty".into());
            }
            secret_file(
                "pulsar.oauth2.client_secret_file",
                &o.client_secret_file,
                &mut bad,
            );
        }
        if let Some(ca) = &self.pulsar.ca_file {
            if !self.pulsar.url.starts_with("pulsar+ssl://") {
                bad(
                    "pulsar.ca_file",
                    format!(
                        "only used with a pulsar+ssl:// url; `{}` is plain TCP",
                        self.pulsar.url
                    ),
                );
            } else if let Err(e) = crate::tls::certs(ca) {
                bad("pulsar.ca_file", e.to_string());
            }
        }
        if let Some(tls) = &self.node.http_tls {
            if let Err(e) = crate::tls::http::server_config(tls) {
                bad(&format!("node.http_tls.{}", e.key), e.problem.to_string());
            }
        }
        if let Some(admin) = &self.pulsar.admin_url {
            if url::Url::parse(admin).is_err() {
                bad("pulsar.admin_url", format!("`{admin}` is not a URL"));
            }
        }
        if self.upstreams.is_empty() {
            bad("upstreams", "at least one upstream is required".into());
        }
        let mut names = BTreeSet::new();
        for (i, u) in self.upstreams.iter().enumerate() {
            let at = |k: &str| format!("upstreams[{i}].{k}");
            if u.name.trim().is_empty() {
                bad(&at("name"), "must not be empty".into());
            }
            if !names.insert(u.name.clone()) {
                bad(
                    &at("name"),
                    format!("`{}` is used by another upstream", u.name),
                );
            }
            if let Err(e) = crate::ingest::UpstreamAddr::parse(&u.url) {
                bad(&at("url"), e.to_string());
            }
            if u.password.is_some() && u.password_file.is_some() {
                bad(
                    &at("password_file"),
                    "set either password or password_file, not both".into(),
                );
            }
            if (u.password.is_some() || u.password_file.is_some()) && u.username.is_none() {
                bad(&at("username"), "a password needs a username".into());
            }
            let tls_files = u.ca_file.is_some() || u.cert_file.is_some() || u.key_file.is_some();
            let is_tls = crate::ingest::UpstreamAddr::parse(&u.url).is_ok_and(|a| a.tls);
            if tls_files && !is_tls {
                bad(
                    &at("url"),
                    "ca_file, cert_file and key_file need an mqtts:// url".into(),
                );
            } else if u.cert_file.is_some() != u.key_file.is_some() {
                bad(
                    &at(if u.cert_file.is_some() {
                        "key_file"
                    } else {
                        "cert_file"
                    }),
                    "cert_file and key_file go together".into(),
                );
            } else if tls_files {
                // Read now, so that check-config names a bad file before a
                // node ever dials the broker with it.
                if let Err(e) = crate::tls::upstream::client_config(u) {
                    bad(&at(e.key), e.problem.to_string());
                }
            }
            if u.keepalive_secs < 5 {
                bad(&at("keepalive_secs"), "must be at least 5".into());
            }
            if u.subscriptions.is_empty() {
                bad(
                    &at("subscriptions"),
                    "at least one subscription is required".into(),
                );
            }
            for (j, s) in u.subscriptions.iter().enumerate() {
                if !filter_is_valid(&s.filter) {
                    bad(
                        &format!("upstreams[{i}].subscriptions[{j}].filter"),
                        format!("`{}` is not a valid MQTT topic filter", s.filter),
                    );
                }
                if s.qos > 2 {
                    bad(
                        &format!("upstreams[{i}].subscriptions[{j}].qos"),
                        format!("{} is not a QoS level (0, 1 or 2)", s.qos),
                    );
                }
            }
        }
        if self.routes.is_empty() {
            bad(
                "routes",
                "at least one route is required: nothing would reach Pulsar".into(),
            );
        }
        for (i, r) in self.routes.iter().enumerate() {
            if !filter_is_valid(&r.filter) {
                bad(
                    &format!("routes[{i}].filter"),
                    format!("`{}` is not a valid MQTT topic filter", r.filter),
                );
            }
            for (key, problem) in r.key.problems() {
                bad(&format!("routes[{i}].key.{key}"), problem);
            }
            if r.pulsar_topic.trim().is_empty() || r.pulsar_topic.contains('\0') {
                bad(
                    &format!("routes[{i}].pulsar_topic"),
                    "must be a Pulsar topic name".into(),
                );
            }
            // One topic, one format: its readers decode every message alike.
            if let Some((j, other)) = self.routes[..i]
                .iter()
                .enumerate()
                .find(|(_, o)| o.pulsar_topic == r.pulsar_topic && o.format != r.format)
            {
                bad(
                    &format!("routes[{i}].format"),
                    format!(
                        "{:?} differs from routes[{j}].format ({:?}) for the same Pulsar topic `{}`",
                        r.format, other.format, r.pulsar_topic
                    ),
                );
            }
        }
        let mut ids = BTreeSet::new();
        for (i, m) in self.cluster.members.iter().enumerate() {
            if !ids.insert(m.id) {
                bad(
                    &format!("cluster.members[{i}].id"),
                    format!("id {} appears twice", m.id),
                );
            }
            if m.addr.parse::<SocketAddr>().is_err() && !m.addr.contains(':') {
                bad(
                    &format!("cluster.members[{i}].addr"),
                    format!("`{}` is not host:port", m.addr),
                );
            }
        }
        if self.cluster.snapshot_logs < 10 {
            bad("cluster.snapshot_logs", "must be at least 10".into());
        }
        let c = &self.cluster;
        if c.heartbeat_ms < 10 {
            bad("cluster.heartbeat_ms", "must be at least 10".into());
        }
        if c.election_timeout_min_ms < 3 * c.heartbeat_ms {
            bad(
                "cluster.election_timeout_min_ms",
                format!(
                    "must be at least three heartbeats ({} ms), so that a lost heartbeat or two does not start an election",
                    3 * c.heartbeat_ms
                ),
            );
        }
        if c.election_timeout_max_ms <= c.election_timeout_min_ms {
            bad(
                "cluster.election_timeout_max_ms",
                format!(
                    "must be above cluster.election_timeout_min_ms ({})",
                    c.election_timeout_min_ms
                ),
            );
        }
        if let Some(tls) = &self.cluster.tls {
            for (key, path) in [
                ("cluster.tls.cert_file", &tls.cert_file),
                ("cluster.tls.key_file", &tls.key_file),
                ("cluster.tls.ca_file", &tls.ca_file),
            ] {
                if let Err(e) = std::fs::metadata(path) {
                    bad(key, format!("cannot read {}: {e}", path.display()));
                }
            }
        }
        if let Some(listen) = self.cluster.listen {
            if !listen.ip().is_loopback()
                && self.cluster.tls.is_none()
                && !self.cluster.allow_plaintext
            {
                bad(
                    "cluster.tls",
                    format!(
                        "required because cluster.listen ({listen}) is not a loopback address: without it peer traffic (every message, the Raft log) crosses the network in the clear; set [cluster.tls], or cluster.allow_plaintext = true on a network you trust"
                    ),
                );
            }
        }
        if let Some(f) = &self.node.admin_token_file {
            match std::fs::read(f) {
                Ok(s) => {
                    if let Err(why) = secret_strength(&s) {
                        bad("node.admin_token_file", format!("{}: {why}", f.display()))
                    }
                }
                Err(e) => bad(
                    "node.admin_token_file",
                    format!("cannot read {}: {e}", f.display()),
                ),
            }
        }
        if !self.cluster.members.is_empty() {
            if self.cluster.listen.is_none() {
                bad(
                    "cluster.listen",
                    "required when cluster.members is set".into(),
                );
            }
            match &self.cluster.secret_file {
                None => bad(
                    "cluster.secret_file",
                    "required when cluster.members is set".into(),
                ),
                Some(f) => match std::fs::read(f) {
                    Ok(s) => {
                        if let Err(why) = secret_strength(&s) {
                            bad("cluster.secret_file", format!("{}: {why}", f.display()))
                        }
                    }
                    Err(e) => bad(
                        "cluster.secret_file",
                        format!("cannot read {}: {e}", f.display()),
                    ),
                },
            }
        }
        out
    }

    /// The client id an upstream connection uses.
    pub fn client_id(&self, upstream: &UpstreamConfig) -> String {
        upstream
            .client_id
            .clone()
            .unwrap_or_else(|| format!("firstseen-{}-{}", self.node.id, upstream.name))
    }
}

/// Shortest cluster secret accepted: 32 bytes, what `head -c 32
/// /dev/urandom | base64` makes with room to spare.
pub const MIN_SECRET_BYTES: usize = 32;

/// Every placeholder secret this repository has shipped in a deploy file.
/// A cluster running on one is open to anyone who has read the repository.
const SHIPPED_PLACEHOLDERS: &[&str] = &[
    "replace-me-with-32-random-bytes-base64",
    "replace-with-32-random-bytes-base64",
    "example secret: replace with 32+ random bytes, e.g. head -c 32 /dev/urandom | base64",
];

/// Why a secret is not fit to guard a cluster.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WeakSecret {
    #[error("is empty")]
    Empty,
    #[error("holds a placeholder from the repository's examples; make a secret of your own: head -c 32 /dev/urandom | base64")]
    Placeholder,
    #[error("is {len} bytes, shorter than {MIN_SECRET_BYTES}; make one with: head -c 32 /dev/urandom | base64")]
    Short { len: usize },
}

/// Whether a cluster secret, as read from its file, is fit to guard a
/// cluster: not empty, not shorter than [`MIN_SECRET_BYTES`], not a
/// placeholder from the repository.
pub fn secret_strength(raw: &[u8]) -> Result<(), WeakSecret> {
    let text = String::from_utf8_lossy(raw);
    let secret = text.trim();
    if secret.is_empty() {
        return Err(WeakSecret::Empty);
    }
    if SHIPPED_PLACEHOLDERS.contains(&secret) || secret.starts_with("replace-") {
        return Err(WeakSecret::Placeholder);
    }
    if secret.len() < MIN_SECRET_BYTES {
        return Err(WeakSecret::Short { len: secret.len() });
    }
    Ok(())
}

#[cfg(test)]
mod secret_tests {
    use super::*;

    #[test]
    fn short_and_placeholder_secrets_are_refused() {
        assert_eq!(secret_strength(b"\n"), Err(WeakSecret::Empty));
        assert_eq!(
            secret_strength(b"short\n"),
            Err(WeakSecret::Short { len: 5 })
        );
        for p in SHIPPED_PLACEHOLDERS {
            let err = secret_strength(format!("{p}\n").as_bytes());
            assert_eq!(err, Err(WeakSecret::Placeholder), "{p}");
        }
        assert!(secret_strength(b"q9Jx2vYbT0mC7rWn5uLk8dHs3eAf1gZpQiOyXwVb4Nc=\n").is_ok());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = r##"
[node]
id = 1
zone = "a"
data_dir = "/tmp/x"

[pulsar]
url = "pulsar://127.0.0.1:6650"

[[upstreams]]
name = "hsl"
url = "mqtt://127.0.0.1:1883"
[[upstreams.subscriptions]]
filter = "/hfp/v1/#"

[[routes]]
filter = "#"
pulsar_topic = "persistent://public/default/hfp"
"##;

    fn parse(text: &str) -> Result<Config, ConfigError> {
        Config::parse(text, Path::new("test.toml"), Vec::new())
    }

    fn problems(text: &str) -> Vec<Problem> {
        match parse(text) {
            Err(ConfigError::Invalid { problems, .. }) => problems,
            other => panic!("expected invalid config, got {other:?}"),
        }
    }

    /// Pulsar and HTTP security settings that cannot work are named before
    /// a node dials anything with them.
    #[test]
    fn bad_pulsar_and_http_tls_settings_are_named() {
        let dir = tempfile::TempDir::new().unwrap();
        let empty = dir.path().join("empty.token");
        std::fs::write(&empty, "\n").unwrap();
        let not_pem = dir.path().join("ca.pem");
        std::fs::write(&not_pem, "not a certificate\n").unwrap();
        let with = |pulsar: &str, node: &str| {
            GOOD.replace(
                "[pulsar]\nurl = \"pulsar://127.0.0.1:6650\"",
                &format!("[pulsar]\n{pulsar}"),
            )
            .replace(
                "data_dir = \"/tmp/x\"",
                &format!("data_dir = \"/tmp/x\"\n{node}"),
            )
        };
        let keys =
            |text: &str| -> Vec<String> { problems(text).into_iter().map(|p| p.key).collect() };
        let k = keys(&with(
            &format!(
                "url = \"pulsar://h:6650\"\nca_file = \"{}\"\nauth_token = \"t\"\nauth_token_file = \"{}\"",
                not_pem.display(),
                empty.display()
            ),
            "",
        ));
        assert!(k.contains(&"pulsar.ca_file".to_string()), "{k:?}");
        assert!(k.contains(&"pulsar.auth_token_file".to_string()), "{k:?}");
        let p = problems(&with(
            &format!(
                "url = \"pulsar+ssl://h:6651\"\nca_file = \"{}\"\n[pulsar.oauth2]\nissuer_url = \"not a url\"\nclient_id = \"\"\nclient_secret_file = \"/nonexistent/secret\"",
                not_pem.display()
            ),
            "",
        ));
        let k: Vec<String> = p.iter().map(|p| p.key.clone()).collect();
        for want in [
            "pulsar.ca_file",
            "pulsar.oauth2.issuer_url",
            "pulsar.oauth2.client_id",
            "pulsar.oauth2.client_secret_file",
        ] {
            assert!(k.contains(&want.to_string()), "{want} missing from {k:?}");
        }
        assert!(
            p.iter().any(|p| p.message.contains("no PEM certificate")),
            "{p:?}"
        );
        let k = keys(&with(
            "url = \"pulsar://127.0.0.1:6650\"",
            &format!(
                "http_tls = {{ cert_file = \"{}\", key_file = \"{}\" }}",
                not_pem.display(),
                not_pem.display()
            ),
        ));
        assert_eq!(k, vec!["node.http_tls.cert_file".to_string()]);
    }

    #[test]
    fn a_minimal_config_parses_with_defaults() {
        let c = parse(GOOD).unwrap();
        assert_eq!(c.dedup.window_secs, 3_600);
        assert_eq!(c.upstreams[0].subscriptions[0].qos, 1);
        assert_eq!(c.routes[0].key, KeySpec::TOPIC_PAYLOAD);
        assert_eq!(c.client_id(&c.upstreams[0]), "firstseen-1-hsl");
    }

    #[test]
    fn an_unknown_key_is_named() {
        let p = problems(&GOOD.replace("zone = \"a\"", "zone = \"a\"\nzoen = \"b\""));
        assert_eq!(p[0].key, "node.zoen");
        assert!(
            p[0].message.contains("unknown field `zoen`"),
            "{}",
            p[0].message
        );
    }

    #[test]
    fn a_wrong_type_is_named_with_its_path() {
        let p = problems(&GOOD.replace(
            "filter = \"/hfp/v1/#\"",
            "filter = \"/hfp/v1/#\"\nqos = \"one\"",
        ));
        assert_eq!(p[0].key, "upstreams[0].subscriptions[0].qos");
        assert!(p[0].message.contains("invalid type"), "{}", p[0].message);
    }

    #[test]
    fn a_missing_route_table_is_an_error() {
        let text = GOOD.split("[[routes]]").next().unwrap().to_string();
        let p = problems(&text);
        assert!(p.iter().any(|p| p.key == "routes"), "{p:?}");
    }

    #[test]
    fn a_message_bound_the_broker_would_refuse_is_named() {
        // A broker configured for 1 MiB messages, firstseen left at 4 MiB:
        // a 2 MiB message would be refused at every reconnect.
        let text = GOOD.replace("[pulsar]", "[pulsar]\nmax_message_bytes = 1048576");
        let p = problems(&text);
        assert!(
            p.iter().any(|p| p.key == "dedup.max_message_bytes"
                && p.message.contains("pulsar.max_message_bytes (1048576)")),
            "{p:?}"
        );
        // Brought under it, with room for firstseen's own properties.
        let text = text.replace(
            "[pulsar]",
            "[dedup]\nmax_payload_bytes = 65536\nmax_message_bytes = 1047552\n\n[pulsar]",
        );
        let c = parse(&text).expect("fits now");
        assert_eq!(c.dedup.max_message_bytes, 1_047_552);
    }

    #[test]
    fn semantic_problems_are_all_listed() {
        let text = GOOD
            .replace("url = \"mqtt://127.0.0.1:1883\"", "url = \"http://x\"")
            .replace("filter = \"#\"", "filter = \"a/#/b\"");
        let keys: Vec<String> = problems(&text).into_iter().map(|p| p.key).collect();
        assert!(keys.contains(&"upstreams[0].url".to_string()), "{keys:?}");
        assert!(keys.contains(&"routes[0].filter".to_string()), "{keys:?}");
    }

    #[test]
    fn environment_overrides_apply_by_path() {
        let vars = vec![
            (
                "FIRSTSEEN__PULSAR__URL".to_string(),
                "pulsar://10.1.1.1:6650".to_string(),
            ),
            (
                "FIRSTSEEN__UPSTREAMS__0__KEEPALIVE_SECS".to_string(),
                "60".to_string(),
            ),
            ("UNRELATED".to_string(), "x".to_string()),
        ];
        let c = Config::parse(GOOD, Path::new("t"), vars).unwrap();
        assert_eq!(c.pulsar.url, "pulsar://10.1.1.1:6650");
        assert_eq!(c.upstreams[0].keepalive_secs, 60);
    }

    #[test]
    fn an_override_of_an_unknown_key_is_still_refused() {
        let vars = vec![("FIRSTSEEN__PULSAR__URLL".to_string(), "x".to_string())];
        match Config::parse(GOOD, Path::new("t"), vars) {
            Err(ConfigError::Invalid { problems, .. }) => {
                assert!(
                    problems[0].message.contains("unknown field `urll`"),
                    "{problems:?}"
                )
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_config_built_in_code_is_the_file_that_leaves_the_rest_out() {
        let from_file = parse(GOOD).unwrap();
        let mut built = Config::new(
            NodeConfig::new(1, "a", "/tmp/x"),
            PulsarConfig::new("pulsar://127.0.0.1:6650"),
        );
        built.upstreams.push(UpstreamConfig::new(
            "hsl",
            "mqtt://127.0.0.1:1883",
            vec![SubscriptionConfig::new("/hfp/v1/#", 1)],
        ));
        built
            .routes
            .push(RouteConfig::new("#", "persistent://public/default/hfp"));
        assert_eq!(built.to_toml(), from_file.to_toml());
    }

    #[test]
    fn a_config_written_as_toml_reads_back_the_same() {
        let mut c = parse(GOOD).unwrap();
        c.cluster.members.push(MemberConfig {
            id: 2,
            zone: "b".into(),
            addr: "127.0.0.1:7000".into(),
            http: String::new(),
        });
        c.cluster.listen = Some("127.0.0.1:7001".parse().unwrap());
        c.cluster.secret_file = Some("/tmp/secret".into());
        c.cluster.tls = Some(TlsConfig::new("/c", "/k", "/ca"));
        c.routes[0].key = KeySpec::Fields(crate::key::FieldKey {
            json: vec!["/VP/veh".into()],
            topic: true,
            missing: crate::key::Missing::DeadLetter,
        });
        c.upstreams[0].protocol = Protocol::V5;
        let text = c.to_toml();
        // Read as `parse` reads it, without the checks of files on disk.
        let back: Config = toml::from_str(&text).unwrap();
        assert_eq!(back.to_toml(), text);
        assert_eq!(back.routes[0].key, c.routes[0].key);
    }
}

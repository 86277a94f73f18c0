//! `[[upstreams]]`, `[[routes]]`, `[dedup]` and `[dead_letter]`: what comes
//! in, where it goes, and the bounds on it. Types, defaults and the checks
//! that need nothing but the values (the TLS and password files are checked
//! by `crate::config`).

use std::collections::BTreeSet;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

pub use crate::dedup::{DedupConfig, OversizePolicy};
use crate::format::Format;
use crate::ingest::filter::filter_is_valid;
use crate::key::KeySpec;
use crate::problem::Problems;

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
    /// Of `max_bytes`, what messages no route takes may hold; past it they
    /// are acked and counted, not kept, so that a sender on an unrouted
    /// topic cannot evict the other dead letters.
    #[serde(
        default = "default_unrouted_bytes",
        skip_serializing_if = "is_default_unrouted"
    )]
    pub unrouted_max_bytes: u64,
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

fn default_dead_letter_bytes() -> u64 {
    1024 * 1024 * 1024
}
fn default_unrouted_bytes() -> u64 {
    64 * 1024 * 1024
}
fn is_default_unrouted(b: &u64) -> bool {
    *b == default_unrouted_bytes()
}
fn default_dead_letter_retention() -> u64 {
    7 * 24 * 3600
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

impl Default for DeadLetterConfig {
    fn default() -> Self {
        Self {
            max_bytes: default_dead_letter_bytes(),
            retention_secs: default_dead_letter_retention(),
            unrouted_max_bytes: default_unrouted_bytes(),
        }
    }
}

impl UpstreamConfig {
    /// Its MQTT client id on node `node`: the configured one, or
    /// `firstseen-<node>-<name>`.
    pub fn client_id_on(&self, node: u64) -> String {
        self.client_id
            .clone()
            .unwrap_or_else(|| format!("firstseen-{node}-{}", self.name))
    }

    /// Its TLS files, for `crate::tls::upstream`.
    pub fn tls_settings(&self) -> crate::tls::config::UpstreamFiles<'_> {
        crate::tls::config::UpstreamFiles {
            ca_file: self.ca_file.as_ref(),
            cert_file: self.cert_file.as_ref(),
            key_file: self.key_file.as_ref(),
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

impl DeadLetterConfig {
    /// Opens the node's dead-letter store (`<data_dir>/dead-letter/`)
    /// under these bounds.
    pub fn open(&self, cx: &crate::context::NodeCx) -> crate::deadletter::DeadLetter {
        crate::deadletter::DeadLetter::open(
            cx.data_dir.join("dead-letter"),
            crate::deadletter::Bounds {
                max_bytes: self.max_bytes,
                retention_ms: self.retention_secs.saturating_mul(1000),
                unrouted_max_bytes: self.unrouted_max_bytes,
            },
        )
    }

    /// Adds every problem of `[dead_letter]` to `p`; `largest` is the
    /// largest message the store may be asked to keep.
    pub fn check(&self, largest: usize, p: &mut Problems) {
        // One message the store is asked to keep must fit, or the quota
        // would remove every older file for each new one.
        if self.max_bytes < largest as u64 {
            p.add(
                "dead_letter.max_bytes",
                format!(
                    "{} is below dedup.max_message_bytes ({largest}): the store could not hold one oversized message",
                    self.max_bytes
                ),
            );
        }
        if self.retention_secs == 0 {
            p.add("dead_letter.retention_secs", "must be at least 1");
        }
    }
}

/// Adds every problem of `[[upstreams]]` that needs no file to `p`.
pub fn check_upstreams(upstreams: &[UpstreamConfig], p: &mut Problems) {
    if upstreams.is_empty() {
        p.add("upstreams", "at least one upstream is required");
    }
    let mut names = BTreeSet::new();
    for (i, u) in upstreams.iter().enumerate() {
        let at = |k: &str| format!("upstreams[{i}].{k}");
        if u.name.trim().is_empty() {
            p.add(at("name"), "must not be empty");
        }
        if !names.insert(u.name.clone()) {
            p.add(
                at("name"),
                format!("`{}` is used by another upstream", u.name),
            );
        }
        let addr = UpstreamAddr::parse(&u.url);
        if let Err(e) = &addr {
            p.add(at("url"), e.to_string());
        }
        if u.password.is_some() && u.password_file.is_some() {
            p.add(
                at("password_file"),
                "set either password or password_file, not both",
            );
        }
        if (u.password.is_some() || u.password_file.is_some()) && u.username.is_none() {
            p.add(at("username"), "a password needs a username");
        }
        let is_tls = addr.is_ok_and(|a| a.tls);
        if u.tls_files() && !is_tls {
            p.add(
                at("url"),
                "ca_file, cert_file and key_file need an mqtts:// url",
            );
        } else if u.cert_file.is_some() != u.key_file.is_some() {
            p.add(
                at(if u.cert_file.is_some() {
                    "key_file"
                } else {
                    "cert_file"
                }),
                "cert_file and key_file go together",
            );
        }
        if u.keepalive_secs < 5 {
            p.add(at("keepalive_secs"), "must be at least 5");
        }
        if u.subscriptions.is_empty() {
            p.add(at("subscriptions"), "at least one subscription is required");
        }
        for (j, s) in u.subscriptions.iter().enumerate() {
            if !filter_is_valid(&s.filter) {
                p.add(
                    format!("upstreams[{i}].subscriptions[{j}].filter"),
                    format!("`{}` is not a valid MQTT topic filter", s.filter),
                );
            }
            if s.qos > 2 {
                p.add(
                    format!("upstreams[{i}].subscriptions[{j}].qos"),
                    format!("{} is not a QoS level (0, 1 or 2)", s.qos),
                );
            }
        }
    }
}

impl UpstreamConfig {
    /// Whether any TLS file is set (which needs an `mqtts://` url).
    pub fn tls_files(&self) -> bool {
        self.ca_file.is_some() || self.cert_file.is_some() || self.key_file.is_some()
    }
}

/// Adds every problem of `[[routes]]` to `p`.
pub fn check_routes(routes: &[RouteConfig], p: &mut Problems) {
    if routes.is_empty() {
        p.add(
            "routes",
            "at least one route is required: nothing would reach Pulsar",
        );
    }
    for (i, r) in routes.iter().enumerate() {
        if !filter_is_valid(&r.filter) {
            p.add(
                format!("routes[{i}].filter"),
                format!("`{}` is not a valid MQTT topic filter", r.filter),
            );
        }
        for (key, problem) in r.key.problems() {
            p.add(format!("routes[{i}].key.{key}"), problem);
        }
        if let Some(problem) = firstseen_store::topic::problem(&r.pulsar_topic) {
            p.add(
                format!("routes[{i}].pulsar_topic"),
                format!("`{}` {problem}", r.pulsar_topic),
            );
        }
        // One topic, one spelling: below cluster level 3 the state names a
        // topic as written, and two spellings of one topic made two
        // outboxes, two sequences and two publishers fighting over its
        // exclusive producer (issue 49). Refused at every level: the file
        // is checked where the cluster's level is not known (`firstseen
        // check`, a node's start), and one spelling is all a file needs.
        if let Some((j, other)) = routes[..i].iter().enumerate().find(|(_, o)| {
            o.pulsar_topic != r.pulsar_topic
                && firstseen_store::topic::same(&o.pulsar_topic, &r.pulsar_topic)
        }) {
            p.add(
                format!("routes[{i}].pulsar_topic"),
                format!(
                    "`{}` is the topic routes[{j}].pulsar_topic names `{}` ({}): write it the same way in both routes",
                    r.pulsar_topic,
                    other.pulsar_topic,
                    firstseen_store::topic::canonical(&r.pulsar_topic)
                ),
            );
        }
        // One topic, one format: its readers decode every message alike.
        if let Some((j, other)) = routes[..i].iter().enumerate().find(|(_, o)| {
            firstseen_store::topic::same(&o.pulsar_topic, &r.pulsar_topic) && o.format != r.format
        }) {
            p.add(
                format!("routes[{i}].format"),
                format!(
                    "{:?} differs from routes[{j}].format ({:?}) for the same Pulsar topic `{}`",
                    r.format, other.format, r.pulsar_topic
                ),
            );
        }
    }
}

/// A parsed upstream URL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UpstreamAddr {
    pub host: String,
    pub port: u16,
    pub tls: bool,
}

/// Why an upstream URL cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BadUpstreamUrl {
    #[error("`{url}` is not a URL: {detail}")]
    NotAUrl { url: String, detail: String },
    #[error("scheme `{0}` is not mqtt://, tcp:// or mqtts://")]
    Scheme(String),
    #[error("`{0}` has no host")]
    NoHost(String),
}

impl UpstreamAddr {
    /// Parses `mqtt://host:port`, `tcp://host:port` or `mqtts://host:port`.
    pub fn parse(raw: &str) -> Result<Self, BadUpstreamUrl> {
        let url = url::Url::parse(raw).map_err(|e| BadUpstreamUrl::NotAUrl {
            url: raw.to_string(),
            detail: e.to_string(),
        })?;
        let (tls, default_port) = match url.scheme() {
            "mqtt" | "tcp" => (false, 1883),
            "mqtts" | "ssl" => (true, 8883),
            other => return Err(BadUpstreamUrl::Scheme(other.to_string())),
        };
        let host = url
            .host_str()
            .filter(|h| !h.is_empty())
            .ok_or_else(|| BadUpstreamUrl::NoHost(raw.to_string()))?;
        Ok(Self {
            host: host.trim_matches(|c| c == '[' || c == ']').to_string(),
            port: url.port().unwrap_or(default_port),
            tls,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn problems(routes: &[RouteConfig]) -> Vec<crate::problem::Problem> {
        let mut p = Problems::default();
        check_routes(routes, &mut p);
        p.into_vec()
    }

    /// `fs` and `persistent://public/default/fs` are one topic: two routes
    /// that spell it two ways are refused, naming both routes.
    #[test]
    fn one_topic_spelled_two_ways_is_refused() {
        let full = "persistent://public/default/fs";
        for short in ["fs", "public/default/fs"] {
            let p = problems(&[
                RouteConfig::new("/a/#", full),
                RouteConfig::new("/b/#", short),
            ]);
            assert_eq!(p.len(), 1, "{p:?}");
            let text = format!("{p:?}");
            assert!(
                text.contains("routes[1].pulsar_topic") && text.contains("routes[0]"),
                "{text}"
            );
            assert!(text.contains(full) && text.contains(short), "{text}");
        }
        // One spelling twice, or two topics, is fine.
        assert!(problems(&[
            RouteConfig::new("/a/#", "fs"),
            RouteConfig::new("/b/#", "fs")
        ])
        .is_empty());
        assert!(problems(&[
            RouteConfig::new("/a/#", "fs"),
            RouteConfig::new("/b/#", "t/n/fs")
        ])
        .is_empty());
        // A spelling the broker reads as `fs` and the cluster would not
        // (a review found `fs/` got past the check above) is refused on
        // its own, naming the route.
        for odd in ["fs/", "/fs", "PERSISTENT://public/default/fs"] {
            let p = problems(&[
                RouteConfig::new("/a/#", "fs"),
                RouteConfig::new("/b/#", odd),
            ]);
            let text = format!("{p:?}");
            assert!(
                p.len() == 1 && text.contains("routes[1].pulsar_topic"),
                "{odd}: {text}"
            );
        }
    }
}

//! `[dedup]`: the window a key is remembered for, and the bounds of one
//! message. Its own module, importing no stage: ingest reads the bounds
//! ([`DedupConfig::limits`]), the leader's coalescer the window
//! ([`DedupConfig::window`]), which it stamps into every entry, where the
//! state machine reads it (`firstseen_store::window::expiry_cutoff`).

use serde::{Deserialize, Serialize};

use crate::problem::Problems;

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

/// The bounds of one message (`dedup.*` in the config).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Largest payload (`dedup.max_payload_bytes`).
    pub payload: usize,
    /// Largest message as stored and published: topic, MQTT 5 properties
    /// and payload (`dedup.max_message_bytes`).
    pub message: usize,
    /// Longest MQTT topic, in bytes (`dedup.max_topic_bytes`).
    pub topic: usize,
    /// Most MQTT 5 user properties (`dedup.max_properties`).
    pub properties: usize,
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

impl DedupConfig {
    /// Adds every problem of `[dedup]` to `p`.
    pub fn check(&self, p: &mut Problems) {
        if self.window_secs == 0 {
            p.add("dedup.window_secs", "must be at least 1");
        }
        if self.max_payload_bytes == 0 {
            p.add("dedup.max_payload_bytes", "must be at least 1");
        }
        if self.max_message_bytes < self.max_payload_bytes {
            p.add(
                "dedup.max_message_bytes",
                format!(
                    "{} is below dedup.max_payload_bytes ({}): the message bound counts the payload too",
                    self.max_message_bytes, self.max_payload_bytes
                ),
            );
        }
        if self.max_topic_bytes == 0 {
            p.add("dedup.max_topic_bytes", "must be at least 1");
        }
    }
}

impl DedupConfig {
    /// The window as entries carry it.
    pub fn window(&self) -> firstseen_store::Window {
        firstseen_store::Window::from_ms(self.window_secs.saturating_mul(1_000))
    }

    /// The bounds of one message, as ingest checks them.
    pub fn limits(&self) -> Limits {
        Limits {
            payload: self.max_payload_bytes,
            message: self.max_message_bytes,
            topic: self.max_topic_bytes,
            properties: self.max_properties,
        }
    }
}

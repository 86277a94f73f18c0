//! How a route's messages look in Pulsar (`routes[].format`): the setting
//! itself, which a route declares and the publisher reads. Writing and
//! reading each look is the publisher's (`crate::publish::format`); this
//! leaf imports no stage, so the routes' config and the publisher both
//! depend on it and not on each other.

use serde::{Deserialize, Serialize};

/// How a route writes its messages (`routes[].format`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Format {
    #[default]
    Raw,
    Transitdata,
}

impl Format {
    /// Most bytes this format adds to a message beyond what
    /// `dedup.max_message_bytes` and the publisher's own properties count, for
    /// an MQTT topic of `topic_len` bytes: the envelope holds the topic a
    /// second time, five field tags and lengths (at most 24 bytes), and the
    /// three schema properties (under 64).
    pub fn extra_bytes(self, topic_len: usize) -> usize {
        match self {
            Format::Raw => 0,
            Format::Transitdata => topic_len + 128,
        }
    }
}

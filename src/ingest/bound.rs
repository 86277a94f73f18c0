//! What one message may cost, decided before it goes anywhere. Pure: the
//! ingest loop asks [`Limits::check`] and applies the oversize policy.
//!
//! Why the whole message and not the payload alone: the topic and every
//! MQTT 5 property travel with the payload into the Raft entry, the outbox
//! and the Pulsar message. One PUBLISH with 8 MB of user properties passed
//! a payload-only check, became a Pulsar message the broker refused by
//! closing the connection, and the publisher sent it again after every
//! reconnect while the outbox filled on every node.

use firstseen_store::window::message_bytes;
use firstseen_store::Properties;

pub use crate::dedup::Limits;

/// Why a message is over its bounds.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Oversize {
    #[error("payload of {bytes} bytes is over dedup.max_payload_bytes ({limit})")]
    Payload { bytes: usize, limit: usize },
    #[error("topic of {bytes} bytes is over dedup.max_topic_bytes ({limit})")]
    Topic { bytes: usize, limit: usize },
    #[error("{count} user properties are over dedup.max_properties ({limit})")]
    Properties { count: usize, limit: usize },
    #[error("message of {bytes} bytes (topic, properties and payload) is over dedup.max_message_bytes ({limit})")]
    Message { bytes: u64, limit: usize },
}

impl Oversize {
    /// A short name for logs and the dead-letter header.
    pub fn kind(&self) -> &'static str {
        match self {
            Oversize::Payload { .. } => "payload",
            Oversize::Topic { .. } => "topic",
            Oversize::Properties { .. } => "properties",
            Oversize::Message { .. } => "message",
        }
    }
}

impl Limits {
    /// Whether a message with this topic, payload and properties is within
    /// every bound; the first one it breaks otherwise. Cheap checks first:
    /// a hostile message is refused before its properties are summed.
    pub fn check(
        &self,
        topic: &str,
        payload: &[u8],
        properties: Option<&Properties>,
    ) -> Result<(), Oversize> {
        if payload.len() > self.payload {
            return Err(Oversize::Payload {
                bytes: payload.len(),
                limit: self.payload,
            });
        }
        if topic.len() > self.topic {
            return Err(Oversize::Topic {
                bytes: topic.len(),
                limit: self.topic,
            });
        }
        let count = properties.map_or(0, |p| p.user.len());
        if count > self.properties {
            return Err(Oversize::Properties {
                count,
                limit: self.properties,
            });
        }
        let bytes = message_bytes(topic, payload, properties);
        if bytes > self.message as u64 {
            return Err(Oversize::Message {
                bytes,
                limit: self.message,
            });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIMITS: Limits = Limits {
        payload: 1_000,
        message: 2_000,
        topic: 100,
        properties: 4,
    };

    fn user(n: usize, value_len: usize) -> Properties {
        Properties {
            user: (0..n)
                .map(|i| (format!("p{i}"), "v".repeat(value_len)))
                .collect(),
            ..Default::default()
        }
    }

    #[test]
    fn a_message_within_every_bound_passes() {
        assert_eq!(LIMITS.check("a/b", &[0; 1_000], Some(&user(4, 10))), Ok(()));
        assert_eq!(LIMITS.check("a/b", b"x", None), Ok(()));
    }

    #[test]
    fn each_bound_is_named_when_broken() {
        assert_eq!(
            LIMITS.check("a", &[0; 1_001], None),
            Err(Oversize::Payload {
                bytes: 1_001,
                limit: 1_000
            })
        );
        let long = "t".repeat(101);
        assert_eq!(LIMITS.check(&long, b"x", None).unwrap_err().kind(), "topic");
        assert_eq!(
            LIMITS.check("a", b"x", Some(&user(5, 1))),
            Err(Oversize::Properties { count: 5, limit: 4 })
        );
    }

    /// Few properties, each huge: the payload is small and the count is
    /// within its bound, and the message as a whole is still refused.
    #[test]
    fn properties_count_toward_the_message() {
        let err = LIMITS.check("a", b"x", Some(&user(2, 1_500))).unwrap_err();
        assert_eq!(err.kind(), "message", "{err}");
        let other = Properties {
            correlation_data: Some(vec![0; 1_000]),
            ..Default::default()
        };
        // Correlation data is published as hex: twice its length.
        assert_eq!(
            LIMITS.check("a", b"x", Some(&other)).unwrap_err().kind(),
            "message"
        );
    }
}

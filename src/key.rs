//! Dedup keys: which bytes of a message decide that two copies are the same.

use firstseen_store::Key;
use serde::{Deserialize, Serialize};

/// What a route's dedup key hashes. Set per route in the config.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize)]
pub enum KeySpec {
    /// `blake3(topic ‖ 0x00 ‖ payload)`: the same payload on two topics is two
    /// messages. The default.
    #[default]
    #[serde(rename = "topic+payload")]
    TopicPayload,
    /// `blake3(payload)`: for feeds that publish one message on several topics.
    #[serde(rename = "payload")]
    Payload,
}

/// The dedup key of one message. The 0x00 separator cannot occur in an MQTT
/// topic (the spec forbids U+0000), so no topic/payload split of the same
/// bytes can collide with another.
pub fn key(spec: KeySpec, topic: &str, payload: &[u8]) -> Key {
    let mut h = blake3::Hasher::new();
    if spec == KeySpec::TopicPayload {
        h.update(topic.as_bytes());
        h.update(&[0]);
    }
    h.update(payload);
    *h.finalize().as_bytes()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_key_is_blake3_of_topic_nul_payload() {
        let expect = blake3::hash(b"a/b\0{\"x\":1}");
        assert_eq!(
            key(KeySpec::TopicPayload, "a/b", b"{\"x\":1}"),
            *expect.as_bytes()
        );
    }

    #[test]
    fn the_separator_keeps_topic_and_payload_apart() {
        assert_ne!(
            key(KeySpec::TopicPayload, "ab", b"c"),
            key(KeySpec::TopicPayload, "a", b"bc")
        );
    }

    #[test]
    fn payload_keys_ignore_the_topic() {
        assert_eq!(
            key(KeySpec::Payload, "a", b"p"),
            key(KeySpec::Payload, "b", b"p")
        );
        assert_eq!(
            key(KeySpec::Payload, "a", b""),
            *blake3::hash(b"").as_bytes()
        );
    }
}

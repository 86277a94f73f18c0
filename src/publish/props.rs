//! The properties that make every published message self-describing. The
//! same names are read back by the tail reader and by `firstseen verify`.

/// Gap-free per-topic sequence number assigned by the state machine.
pub const SEQ: &str = "firstseen-seq";
/// Hex dedup key (also the Pulsar partition key).
pub const KEY: &str = "firstseen-key";
/// The MQTT topic the message came from.
pub const MQTT_TOPIC: &str = "mqtt-topic";
/// Node whose copy was first.
pub const NODE: &str = "firstseen-node";
/// Leader-stamped first-seen time, ms since epoch (also the event time).
pub const FIRST_SEEN_MS: &str = "firstseen-first-seen-ms";
/// On a marker only: why the message itself is not in the topic (the broker
/// would refuse it for good). The marker keeps the message's sequence, key,
/// MQTT topic, node and time, with an empty payload; the message is in the
/// dead-letter store of the node that published the marker.
pub const SET_ASIDE: &str = "firstseen-set-aside";
/// On a message sent after higher sequences, because the broker refused it
/// while they were on their way (`Publisher::send_late`).
pub const LATE: &str = "firstseen-late";
/// The cluster's proof that it wrote the message (`super::proof`): hex of a
/// MAC over the topic, sequence, key, marker flag, body and every other
/// property (v2; v1, from builds before it, left the properties out).
pub const PROOF: &str = "firstseen-proof";
/// The generation of the cluster that wrote the message, when it is not 0:
/// one more with each `firstseen recover --force-new-cluster` the cluster
/// came through (`firstseen_store::Command::Generation`). Covered by the
/// v2 proof, as every property is. A message without it is of generation
/// 0. A leader that finds a proven message of a newer generation at the end
/// of a topic stops publishing there: a cluster recovered from its own
/// data publishes there now (`super::tail::Superseded`).
pub const GENERATION: &str = "firstseen-generation";

/// The most bytes firstseen's own properties and Pulsar's message metadata
/// add to a message beyond what `dedup.max_message_bytes` counts (the MQTT
/// topic, the MQTT 5 properties and the payload): the five names above, a
/// sequence and a time of up to 20 digits each, the key in hex twice (it is
/// also the partition key), the proof, the producer's name and Pulsar's
/// fixed fields.
/// A test below checks the largest such set stays under it.
pub const OWN_BYTES: usize = 1024;

/// MQTT 5 properties, when the message had them (docs/configuration.md,
/// "MQTT 5 properties in Pulsar"). Each name is `mqtt-` and the MQTT name,
/// so none can clash with firstseen's own (`firstseen-*`) or `mqtt-topic`.
pub const CONTENT_TYPE: &str = "mqtt-content-type";
/// `0` (unspecified bytes) or `1` (UTF-8), as the publisher declared it.
pub const PAYLOAD_FORMAT: &str = "mqtt-payload-format";
/// Seconds the message had left before it expired, when it reached the bridge.
pub const MESSAGE_EXPIRY: &str = "mqtt-message-expiry-secs";
pub const RESPONSE_TOPIC: &str = "mqtt-response-topic";
/// Correlation data, as lowercase hex (it is binary).
pub const CORRELATION_DATA: &str = "mqtt-correlation-data";
/// User property `NAME` becomes `mqtt-user-NAME`; a name that repeats gets
/// `.2`, `.3`, … on its later values, in the order they came.
pub const USER_PREFIX: &str = "mqtt-user-";

/// The Pulsar properties of a message's MQTT 5 properties, in a fixed order.
pub fn mqtt5(p: &firstseen_store::Properties) -> Vec<(String, String)> {
    let mut out = Vec::new();
    if let Some(v) = &p.content_type {
        out.push((CONTENT_TYPE.to_string(), v.clone()));
    }
    if let Some(v) = p.payload_format {
        out.push((PAYLOAD_FORMAT.to_string(), v.to_string()));
    }
    if let Some(v) = p.message_expiry_secs {
        out.push((MESSAGE_EXPIRY.to_string(), v.to_string()));
    }
    if let Some(v) = &p.response_topic {
        out.push((RESPONSE_TOPIC.to_string(), v.clone()));
    }
    if let Some(v) = &p.correlation_data {
        out.push((CORRELATION_DATA.to_string(), hex::encode(v)));
    }
    let mut seen: std::collections::HashMap<&str, u32> = std::collections::HashMap::new();
    for (name, value) in &p.user {
        let n = seen.entry(name.as_str()).or_insert(0);
        *n += 1;
        let key = if *n == 1 {
            format!("{USER_PREFIX}{name}")
        } else {
            format!("{USER_PREFIX}{name}.{n}")
        };
        out.push((key, value.clone()));
    }
    out
}

/// Looks a property up in a Pulsar message's metadata.
pub fn get<'a>(metadata: &'a pulsar::proto::MessageMetadata, name: &str) -> Option<&'a str> {
    metadata
        .properties
        .iter()
        .find(|kv| kv.key == name)
        .map(|kv| kv.value.as_str())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn firstseen_s_own_properties_fit_in_their_allowance() {
        let u64_max = u64::MAX.to_string();
        let key = "f".repeat(64);
        let own = [
            (SEQ, u64_max.as_str()),
            (KEY, key.as_str()),
            (NODE, u64_max.as_str()),
            (FIRST_SEEN_MS, u64_max.as_str()),
            (PROOF, &"f".repeat(32)),
            (GENERATION, u64_max.as_str()),
        ];
        let named: usize = own.iter().map(|(k, v)| k.len() + v.len()).sum::<usize>()
            + MQTT_TOPIC.len()
            // The partition key, the producer's name (prefix, node, term
            // and a scratch name) and Pulsar's fixed metadata fields.
            + key.len()
            + 128
            + 128;
        assert!(named < OWN_BYTES, "{named}");
    }

    #[test]
    fn mqtt5_properties_get_collision_free_names() {
        let p = firstseen_store::Properties {
            user: vec![
                ("unit".into(), "m/s".into()),
                ("hop".into(), "a".into()),
                ("hop".into(), "b".into()),
            ],
            content_type: Some("application/json".into()),
            payload_format: Some(1),
            message_expiry_secs: Some(30),
            response_topic: Some("replies/1".into()),
            correlation_data: Some(vec![0xde, 0xad]),
        };
        let got = mqtt5(&p);
        let want: Vec<(String, String)> = [
            ("mqtt-content-type", "application/json"),
            ("mqtt-payload-format", "1"),
            ("mqtt-message-expiry-secs", "30"),
            ("mqtt-response-topic", "replies/1"),
            ("mqtt-correlation-data", "dead"),
            ("mqtt-user-unit", "m/s"),
            ("mqtt-user-hop", "a"),
            ("mqtt-user-hop.2", "b"),
        ]
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        assert_eq!(got, want);
        assert!(got
            .iter()
            .all(|(k, _)| k != SEQ && k != KEY && k != MQTT_TOPIC));
    }
}

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

/// Looks a property up in a Pulsar message's metadata.
pub fn get<'a>(metadata: &'a pulsar::proto::MessageMetadata, name: &str) -> Option<&'a str> {
    metadata
        .properties
        .iter()
        .find(|kv| kv.key == name)
        .map(|kv| kv.value.as_str())
}

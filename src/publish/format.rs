//! What a route's messages look like in Pulsar, and how a reader gets the
//! MQTT topic and payload back out of either look.
//!
//! - [`Format::Raw`] (the default): the MQTT payload as it came, the MQTT
//!   topic in the `mqtt-topic` property.
//! - [`Format::Transitdata`]: the payload wrapped in the `mqtt-raw`
//!   envelope that HSL's transitdata consumers read
//!   (`proto/transitdata.proto`), with the three properties they look the
//!   schema up by. An operator replacing the old gateways and deduplicator
//!   changes no consumer.
//!
//! Both carry firstseen's own properties (`firstseen-seq`, `firstseen-key`,
//! `mqtt-topic`, …): the tail read, `firstseen verify` and the audit use
//! them whatever the format.

use std::collections::HashMap;
use std::sync::Arc;

use prost::Message as _;

/// The envelope's type, generated from `proto/transitdata.proto`.
pub mod envelope {
    include!(concat!(env!("OUT_DIR"), "/firstseen.transitdata.rs"));
}

/// Property naming a message's schema (transitdata's `TransitdataSchema`).
pub const SCHEMA: &str = "protobuf-schema";
/// [`SCHEMA`]'s value for the envelope.
pub const MQTT_RAW: &str = "mqtt-raw";
/// Property holding the schema's version.
pub const SCHEMA_VERSION: &str = "schema-version";
/// The envelope's version: the only one there is.
pub const MQTT_RAW_VERSION: i32 = 1;
/// Property holding when the message was received, in ms since the epoch.
pub const SOURCE_TS: &str = "source-ts";

pub use crate::format::Format;

impl Format {
    /// The message body and the properties this format adds to
    /// firstseen's own.
    pub fn encode(
        self,
        mqtt_topic: &str,
        payload: Vec<u8>,
        received_ms: u64,
    ) -> (Vec<u8>, Vec<(&'static str, String)>) {
        match self {
            Format::Raw => (payload, Vec::new()),
            Format::Transitdata => {
                let ms = i64::try_from(received_ms).unwrap_or(i64::MAX);
                let body = envelope::RawMessage {
                    schema_version: MQTT_RAW_VERSION,
                    topic: Some(mqtt_topic.to_string()),
                    payload: Some(payload),
                    message_received_timestamp_ms: Some(ms),
                }
                .encode_to_vec();
                let props = vec![
                    (SCHEMA, MQTT_RAW.to_string()),
                    (SCHEMA_VERSION, MQTT_RAW_VERSION.to_string()),
                    (SOURCE_TS, received_ms.to_string()),
                ];
                (body, props)
            }
        }
    }
}

/// Each Pulsar topic's format; topics no route names are [`Format::Raw`].
/// Cheap to clone; clones share one table, which a reload replaces (the
/// publisher reads a topic's format when it takes the topic's producer).
#[derive(Debug, Clone, Default)]
pub struct Formats(Arc<std::sync::RwLock<HashMap<String, (Format, String)>>>);

impl Formats {
    /// The table, by each topic's canonical name: the publisher asks by
    /// the state's name, which from cluster level 3 is the canonical one
    /// whatever spelling the route used.
    pub fn new(by_topic: impl IntoIterator<Item = (String, Format)>) -> Self {
        Self(Arc::new(std::sync::RwLock::new(
            by_topic
                .into_iter()
                .map(|(t, f)| (firstseen_store::topic::canonical(&t).into_owned(), (f, t)))
                .collect(),
        )))
    }

    /// The format of `pulsar_topic`, in any spelling.
    pub fn of(&self, pulsar_topic: &str) -> Format {
        self.0
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .get(firstseen_store::topic::canonical(pulsar_topic).as_ref())
            .map(|(f, _)| *f)
            .unwrap_or_default()
    }

    /// The topics the routes name, by their canonical names or, with
    /// `canonical` false, as the routes write them (below cluster level 3
    /// the outbox names a topic so): a new leader takes them before their
    /// first message (`publish::term`).
    pub fn topics(&self, canonical: bool) -> Vec<String> {
        self.0
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .iter()
            .map(|(full, (_, written))| if canonical { full } else { written }.clone())
            .collect()
    }

    /// Replaces the table with `other`'s.
    pub fn replace(&self, other: &Formats) {
        let table = other
            .0
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone();
        *self
            .0
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = table;
    }
}

/// Why a message's contents could not be read.
#[derive(Debug, thiserror::Error)]
pub enum ContentsError {
    #[error("not a transitdata mqtt-raw envelope: {0}")]
    Undecodable(#[from] prost::DecodeError),
    #[error("transitdata mqtt-raw envelope of schema version {0}, not {MQTT_RAW_VERSION}")]
    Version(i32),
}

/// A message's MQTT topic and payload, whichever format it was written in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Contents {
    /// `None` when the message names no topic (a raw message without
    /// `mqtt-topic`, written by some other producer).
    pub topic: Option<String>,
    pub payload: Vec<u8>,
    /// The envelope's receive time, when it is one and has it.
    pub received_ms: Option<i64>,
    pub format: Format,
}

/// Reads a message's contents: an envelope when its properties say so
/// (`protobuf-schema` = `mqtt-raw`, as transitdata's consumers decide), the
/// raw payload and `mqtt-topic` otherwise.
pub fn contents(
    property: impl Fn(&str) -> Option<String>,
    body: &[u8],
) -> Result<Contents, ContentsError> {
    if property(SCHEMA).as_deref() == Some(MQTT_RAW) {
        let m = envelope::RawMessage::decode(body)?;
        if m.schema_version != MQTT_RAW_VERSION {
            return Err(ContentsError::Version(m.schema_version));
        }
        return Ok(Contents {
            topic: m.topic,
            payload: m.payload.unwrap_or_default(),
            received_ms: m.message_received_timestamp_ms,
            format: Format::Transitdata,
        });
    }
    Ok(Contents {
        topic: property(super::props::MQTT_TOPIC),
        payload: body.to_vec(),
        received_ms: None,
        format: Format::Raw,
    })
}

/// [`contents`] of a message read with the `pulsar` crate.
pub fn contents_of(
    metadata: &pulsar::proto::MessageMetadata,
    body: &[u8],
) -> Result<Contents, ContentsError> {
    contents(
        |name| super::props::get(metadata, name).map(str::to_string),
        body,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn props<'a>(list: &'a [(&'static str, String)]) -> impl Fn(&str) -> Option<String> + 'a {
        move |name| {
            list.iter()
                .find(|(k, _)| *k == name)
                .map(|(_, v)| v.clone())
        }
    }

    #[test]
    fn an_envelope_carries_topic_payload_and_time_and_reads_back() {
        let (body, added) =
            Format::Transitdata.encode("/hfp/v2/x", b"{\"VP\":1}".to_vec(), 1_700_000_000_123);
        assert_eq!(
            added,
            vec![
                ("protobuf-schema", "mqtt-raw".to_string()),
                ("schema-version", "1".to_string()),
                ("source-ts", "1700000000123".to_string()),
            ]
        );
        // Field 1 (varint) = 1 first: what a proto2 writer puts first.
        assert_eq!(&body[..2], &[0x08, 0x01]);
        let got = contents(props(&added), &body).unwrap();
        assert_eq!(got.topic.as_deref(), Some("/hfp/v2/x"));
        assert_eq!(got.payload, b"{\"VP\":1}");
        assert_eq!(got.received_ms, Some(1_700_000_000_123));
        assert_eq!(got.format, Format::Transitdata);
    }

    #[test]
    fn the_envelope_stays_within_its_allowance() {
        let topic = "t".repeat(65_535);
        let payload = vec![7u8; 1 << 20];
        let (body, added) = Format::Transitdata.encode(&topic, payload.clone(), u64::MAX);
        let extra = body.len() - payload.len()
            + added.iter().map(|(k, v)| k.len() + v.len()).sum::<usize>();
        assert!(
            extra <= Format::Transitdata.extra_bytes(topic.len()),
            "{extra}"
        );
    }

    #[test]
    fn raw_messages_read_from_their_properties_and_bad_envelopes_are_named() {
        let raw = [("mqtt-topic", "a/b".to_string())];
        let got = contents(props(&raw), b"xyz").unwrap();
        assert_eq!(
            (got.topic.as_deref(), got.format),
            (Some("a/b"), Format::Raw)
        );
        let envelope = [(SCHEMA, MQTT_RAW.to_string())];
        assert!(matches!(
            contents(props(&envelope), &[0xff, 0xff, 0xff]),
            Err(ContentsError::Undecodable(_))
        ));
        let v2 = envelope::RawMessage {
            schema_version: 2,
            ..Default::default()
        }
        .encode_to_vec();
        assert!(matches!(
            contents(props(&envelope), &v2),
            Err(ContentsError::Version(2))
        ));
    }

    #[test]
    fn formats_are_spelled_in_lowercase_and_raw_is_the_default() {
        use serde::Deserialize;
        #[derive(Deserialize)]
        struct R {
            #[serde(default)]
            format: Format,
        }
        let r: R = toml::from_str("format = \"transitdata\"").unwrap();
        assert_eq!(r.format, Format::Transitdata);
        let r: R = toml::from_str("").unwrap();
        assert_eq!(r.format, Format::Raw);
        assert!(toml::from_str::<R>("format = \"json\"").is_err());
        assert_eq!(Formats::default().of("any"), Format::Raw);
    }
}

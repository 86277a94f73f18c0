//! A message as it goes into an entry: its body in the route's format,
//! firstseen's properties and the cluster's proof over both.

use firstseen_store::OutboxMessage;

use crate::publish::port::Sending;
use crate::publish::producer::entry::Outgoing;
use crate::publish::{proof, props};

/// Message `seq` as it goes into an entry: its body in the route's format
/// (or nothing, for a marker), firstseen's properties, and the cluster's
/// proof over both (v2: every property counts, `super::proof`).
pub(super) fn outgoing(
    topic: &str,
    seq: u64,
    m: OutboxMessage,
    how: Sending,
    proofs: &proof::ProofKeys,
) -> Outgoing {
    let key = hex::encode(m.key);
    let (body, format_props) = match how.set_aside {
        Some(_) => (Vec::new(), Vec::new()),
        None => how.format.encode(&m.mqtt_topic, m.payload, m.first_seen_ms),
    };
    let marker = how.set_aside.is_some();
    let mut properties = vec![
        (props::SEQ.to_string(), seq.to_string()),
        (props::KEY.to_string(), key.clone()),
        (props::MQTT_TOPIC.to_string(), m.mqtt_topic),
        (props::NODE.to_string(), m.node.to_string()),
        (
            props::FIRST_SEEN_MS.to_string(),
            m.first_seen_ms.to_string(),
        ),
    ];
    properties.extend(format_props.into_iter().map(|(k, v)| (k.to_string(), v)));
    if how.late {
        properties.push((props::LATE.to_string(), "true".to_string()));
    }
    // Generation 0 writes nothing: a cluster never recovered writes what
    // it wrote before generations.
    if how.generation > 0 {
        properties.push((props::GENERATION.to_string(), how.generation.to_string()));
    }
    match how.set_aside {
        // The marker carries no MQTT 5 properties: they may be what made
        // the message too large.
        Some(reason) => properties.push((props::SET_ASIDE.to_string(), reason)),
        None => {
            if let Some(p) = &m.properties {
                properties.extend(props::mqtt5(p));
            }
        }
    }
    // Over the body and the properties as they go: a reader checks what
    // it reads.
    let view: Vec<(&str, &str)> = properties
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    let proof = proofs.prove(&proof::Message {
        claim: proof::Claim {
            topic,
            seq,
            key: &m.key,
            marker,
            body: &body,
        },
        properties: &view,
    });
    properties.push((props::PROOF.to_string(), proof));
    Outgoing {
        seq,
        key,
        properties,
        event_time: m.first_seen_ms,
        body,
    }
}

/// The proof `outgoing` writes, checked as the tail read and `verify`
/// check what they read back.
#[cfg(test)]
mod tests {
    use super::*;
    use crate::publish::format::Format;
    use crate::publish::tail::{Origin, Ours};
    use crate::secret::ClusterKey;

    const TOPIC: &str = "persistent://public/default/t";

    fn ours() -> Ours {
        Ours::new(
            &ClusterKey::from_secret(b"the cluster's secret"),
            &[],
            false,
        )
    }

    /// Message 5 as the publisher writes it: in the transitdata envelope
    /// (the format's properties), with an MQTT 5 property, late or not.
    fn written(ours: &Ours, late: bool) -> (pulsar::proto::MessageMetadata, Vec<u8>) {
        written_in(ours, late, 0)
    }

    /// As `written`, by a cluster of generation `generation`.
    fn written_in(
        ours: &Ours,
        late: bool,
        generation: u64,
    ) -> (pulsar::proto::MessageMetadata, Vec<u8>) {
        let m = OutboxMessage {
            key: [7; 32],
            mqtt_topic: "sensors/1".into(),
            payload: b"21.5".to_vec(),
            node: 2,
            first_seen_ms: 1_700_000_000_000,
            properties: Some(Box::new(firstseen_store::Properties {
                user: vec![("unit".into(), "C".into())],
                ..Default::default()
            })),
        };
        let how = Sending {
            set_aside: None,
            late,
            format: Format::Transitdata,
            generation,
            alone: false,
        };
        let out = outgoing(TOPIC, 5, m, how, ours.proofs());
        let meta = pulsar::proto::MessageMetadata {
            producer_name: ours.producer_name("p"),
            properties: out
                .properties
                .into_iter()
                .map(|(key, value)| pulsar::proto::KeyValue { key, value })
                .collect(),
            ..Default::default()
        };
        (meta, out.body)
    }

    fn set(meta: &mut pulsar::proto::MessageMetadata, name: &str, value: &str) {
        match meta.properties.iter_mut().find(|kv| kv.key == name) {
            Some(kv) => kv.value = value.into(),
            None => meta.properties.push(pulsar::proto::KeyValue {
                key: name.into(),
                value: value.into(),
            }),
        }
    }

    /// Issue 48: the proof left `firstseen-late`, the MQTT topic, the
    /// first-seen time and the format out, so a copy of a real message
    /// with any of them changed was the cluster's. Each changed now makes
    /// it forged. (With `outgoing` signing v1, as before, every case but
    /// the first fails this test.)
    #[test]
    fn each_property_changed_on_a_real_message_makes_it_forged() {
        let o = ours();
        let (meta, body) = written(&o, false);
        assert_eq!(o.origin(TOPIC, &meta, &body, Some(9)), Origin::Proven(5));
        let (late, late_body) = written(&o, true);
        assert_eq!(
            o.origin(TOPIC, &late, &late_body, Some(9)),
            Origin::Proven(5)
        );
        // The late flag taken off a late message, put on another.
        let mut unlate = late.clone();
        unlate.properties.retain(|kv| kv.key != props::LATE);
        assert_eq!(o.origin(TOPIC, &unlate, &body, Some(9)), Origin::Forged);
        for (name, value) in [
            (props::LATE, "true"),
            (props::MQTT_TOPIC, "sensors/2"),
            (props::FIRST_SEEN_MS, "1"),
            (props::NODE, "3"),
            (crate::publish::format::SCHEMA, "other"),
            (crate::publish::format::SOURCE_TS, "1"),
            ("mqtt-user-unit", "F"),
            (props::SET_ASIDE, "too large"),
        ] {
            let mut changed = meta.clone();
            set(&mut changed, name, value);
            assert_eq!(
                o.origin(TOPIC, &changed, &body, Some(9)),
                Origin::Forged,
                "{name}"
            );
        }
        // The format's properties taken off (written raw, in name).
        let mut raw = meta.clone();
        raw.properties
            .retain(|kv| kv.key != crate::publish::format::SCHEMA);
        assert_eq!(o.origin(TOPIC, &raw, &body, Some(9)), Origin::Forged);
    }

    /// A recovered cluster's messages carry its generation under the
    /// proof; generation 0 writes no property (what a cluster never
    /// recovered wrote before generations), and the generation taken off
    /// or changed makes the message forged.
    #[test]
    fn the_generation_is_written_and_proven() {
        let o = ours();
        let (plain, body) = written_in(&o, false, 0);
        assert_eq!(props::get(&plain, props::GENERATION), None);
        assert_eq!(o.generation_above(TOPIC, &plain, &body, 0), None);
        let (meta, body) = written_in(&o, false, 2);
        assert_eq!(props::get(&meta, props::GENERATION), Some("2"));
        assert_eq!(o.origin(TOPIC, &meta, &body, Some(9)), Origin::Proven(5));
        assert_eq!(o.generation_above(TOPIC, &meta, &body, 1), Some(2));
        assert_eq!(o.generation_above(TOPIC, &meta, &body, 2), None);
        let mut changed = meta.clone();
        set(&mut changed, props::GENERATION, "3");
        assert_eq!(o.origin(TOPIC, &changed, &body, Some(9)), Origin::Forged);
        assert_eq!(o.generation_above(TOPIC, &changed, &body, 0), None);
        let mut taken_off = meta.clone();
        taken_off
            .properties
            .retain(|kv| kv.key != props::GENERATION);
        assert_eq!(o.origin(TOPIC, &taken_off, &body, Some(9)), Origin::Forged);
    }
}

//! On the leader: copies of a key it already holds go into the log without
//! their payload.
//!
//! Every zone delivers every message, so a three-zone cluster proposed each
//! payload three times, and two of those copies only ever count as
//! duplicates: apply reads their key and node, never their payload or topics.
//! Written in full they were about two thirds of the Raft log's bytes (its
//! append, fsync, replication to both followers and every read back), and
//! most of a node's disk. A copy goes *slim* (key, node, times and flags only)
//! when the leader already holds its key: an earlier copy in the same entry,
//! or a key in its applied window.
//!
//! What keeps this safe is apply, not this guess: a slim copy of a key the
//! state does not hold when the entry is applied (the window expired it in
//! between, or this leader's state was behind) changes nothing and comes
//! back [`Outcome::Missing`]; the leader then proposes it again whole, before
//! answering the batch ([`resend`]). So no copy is ever acked on the
//! strength of a payload nobody stored.

use std::collections::HashSet;

use firstseen_store::{Batch, Key, KeyKind, Observation, Outcome, Properties};

/// A copy as it was before it went slim, to send it again whole if it
/// comes back [`Outcome::Missing`].
struct Whole {
    pos: usize,
    obs: Observation,
    properties: Option<Box<Properties>>,
    kind: KeyKind,
}

/// The copies made slim in a batch: their positions, and each whole.
#[derive(Default)]
pub struct Stripped {
    pub positions: Vec<u32>,
    whole: Vec<Whole>,
}

/// Makes slim every copy of `batch` that an earlier copy in the batch is
/// the same message as, or that `held` (one flag per copy) says the state
/// holds. Moves the payloads out; copies none. From cluster level 2 a copy
/// is the same message as another when key, kind and Pulsar topic are the
/// same, and a slim copy keeps its topic (apply finds its message by it).
pub fn strip(batch: &mut Batch, held: &[bool], level: u32) -> Stripped {
    let scoped = level >= firstseen_store::level::KINDS;
    let mut seen: HashSet<Key> = HashSet::with_capacity(batch.len());
    let mut out = Stripped::default();
    let kinds: Vec<KeyKind> = (0..batch.len()).map(|i| batch.kind(i)).collect();
    for (pos, obs) in batch.observations.iter_mut().enumerate() {
        let kind = kinds[pos];
        let id = if scoped && kind != KeyKind::Unknown {
            firstseen_store::window::identity(&obs.pulsar_topic, kind, &obs.key)
        } else {
            obs.key
        };
        if seen.insert(id) && !held.get(pos).copied().unwrap_or(false) {
            continue;
        }
        let slim = Observation {
            key: obs.key,
            mqtt_topic: String::new(),
            pulsar_topic: if scoped {
                obs.pulsar_topic.clone()
            } else {
                String::new()
            },
            payload: Vec::new(),
            qos: obs.qos,
            retain: obs.retain,
            node: obs.node,
            received_ms: obs.received_ms,
        };
        out.positions.push(pos as u32);
        out.whole.push(Whole {
            pos,
            obs: std::mem::replace(obs, slim),
            properties: batch.properties.get_mut(pos).and_then(Option::take),
            kind,
        });
    }
    out
}

/// The copies that came back [`Outcome::Missing`], whole again and in
/// order, with their positions: the batch to propose next.
pub fn resend(stripped: Stripped, outcomes: &[Outcome]) -> (Vec<usize>, Batch) {
    let mut again = Batch::default();
    let mut positions = Vec::new();
    for w in stripped.whole {
        if matches!(outcomes.get(w.pos), Some(Outcome::Missing)) {
            again.push_kind(w.obs, w.properties, w.kind);
            positions.push(w.pos);
        }
    }
    (positions, again)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn obs(key: u8, node: u64) -> Observation {
        Observation {
            key: [key; 32],
            mqtt_topic: format!("m/{key}"),
            pulsar_topic: format!("p/{key}"),
            payload: vec![key; 10],
            qos: 1,
            retain: false,
            node,
            received_ms: 5,
        }
    }

    /// [`strip`] at level 1, with the state holding the keys `held` says.
    fn strip_by(b: &mut Batch, held: impl Fn(&Key) -> bool) -> Stripped {
        let flags: Vec<bool> = b.observations.iter().map(|o| held(&o.key)).collect();
        strip(b, &flags, 1)
    }

    fn batch(keys: &[(u8, u64)]) -> Batch {
        let mut b = Batch::default();
        for (k, n) in keys {
            b.push(obs(*k, *n), None);
        }
        b
    }

    #[test]
    fn a_copy_goes_slim_after_an_earlier_one_or_when_its_key_is_held() {
        let mut b = batch(&[(1, 1), (2, 1), (1, 2), (3, 3), (1, 3)]);
        let s = strip_by(&mut b, |k| k[0] == 3);
        assert_eq!(s.positions, vec![2, 3, 4]);
        for pos in [2, 3, 4] {
            let o = &b.observations[pos];
            assert!(o.payload.is_empty() && o.mqtt_topic.is_empty() && o.pulsar_topic.is_empty());
        }
        // The first copy of a key not held keeps everything.
        assert_eq!(b.observations[0], obs(1, 1));
        assert_eq!(b.observations[1], obs(2, 1));
        // Key and node stay: apply counts the copy from them.
        assert_eq!(
            (b.observations[4].key, b.observations[4].node),
            ([1; 32], 3)
        );
    }

    #[test]
    fn copies_that_come_back_missing_are_sent_again_whole() {
        let mut b = batch(&[(1, 1), (1, 2), (3, 3)]);
        b.properties = vec![None, None, Some(Box::default())];
        let s = strip_by(&mut b, |k| k[0] == 3);
        assert_eq!(s.positions, vec![1, 2]);
        assert!(
            b.properties[2].is_none(),
            "properties travel with the payload"
        );
        let outcomes = [
            Outcome::FirstSeen { seq: 1 },
            Outcome::Duplicate {
                seq: 1,
                first_node: 1,
            },
            Outcome::Missing,
        ];
        let (positions, again) = resend(s, &outcomes);
        assert_eq!(positions, vec![2]);
        assert_eq!(again.observations, vec![obs(3, 3)]);
        assert_eq!(again.kinds, vec![KeyKind::Unknown]);
        assert_eq!(again.properties, vec![Some(Box::default())]);
    }

    #[test]
    fn nothing_missing_means_nothing_to_send_again() {
        let mut b = batch(&[(1, 1), (1, 2)]);
        let s = strip_by(&mut b, |_| false);
        let outcomes = [
            Outcome::FirstSeen { seq: 1 },
            Outcome::Duplicate {
                seq: 1,
                first_node: 1,
            },
        ];
        let (positions, again) = resend(s, &outcomes);
        assert!(positions.is_empty() && again.is_empty());
    }

    /// At level 2 the same key on another topic, or of another kind, is
    /// another message: not slim. A slim copy keeps its topic.
    #[test]
    fn at_level_two_only_the_same_key_kind_and_topic_is_the_same_message() {
        let mut b = Batch::default();
        b.push_kind(obs(1, 1), None, KeyKind::TopicPayload);
        let mut other_topic = obs(1, 2);
        other_topic.pulsar_topic = "p/other".into();
        b.push_kind(other_topic, None, KeyKind::TopicPayload);
        b.push_kind(obs(1, 3), None, KeyKind::Payload);
        b.push_kind(obs(1, 3), None, KeyKind::TopicPayload);
        let s = strip(&mut b, &[false; 4], 2);
        assert_eq!(s.positions, vec![3]);
        assert_eq!(b.observations[3].pulsar_topic, "p/1");
        assert!(b.observations[3].payload.is_empty());
    }
}

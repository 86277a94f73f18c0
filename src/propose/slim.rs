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
///
/// From cluster level 3 every copy's Pulsar topic is first written as its
/// canonical name (`fs` as `persistent://public/default/fs`): the entry
/// then names each topic one way, whatever spelling each node's routes
/// use. Apply names topics the same way at that level, so an entry written
/// by a leader that had not applied the rise yet means the same; below it
/// the entry carries the spelling as written, as every older release does.
pub fn strip(batch: &mut Batch, held: &[bool], level: u32) -> Stripped {
    let scoped = level >= firstseen_store::level::KINDS;
    if level >= firstseen_store::level::NAMES {
        for obs in &mut batch.observations {
            if let std::borrow::Cow::Owned(name) =
                firstseen_store::topic::canonical(&obs.pulsar_topic)
            {
                obs.pulsar_topic = name;
            }
        }
    }
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

    /// The entry of a batch with copies spelled `fs` and in full: below
    /// level 3 its bytes are what they always were (the spelling as
    /// written: a node of an older release applies it the same way); from
    /// level 3 every copy names the topic canonically, and the second
    /// spelling is the same message.
    #[test]
    fn from_level_three_the_entry_names_each_topic_canonically() {
        let full = "persistent://public/default/fs";
        let mk = || {
            let mut b = Batch::default();
            let mut short = obs(1, 1);
            short.pulsar_topic = "fs".into();
            let mut long = obs(1, 2);
            long.pulsar_topic = full.into();
            b.push_kind(short, None, KeyKind::TopicPayload);
            b.push_kind(long, None, KeyKind::TopicPayload);
            b
        };
        // Level 1 knows no topics in the window: one key is one message,
        // and the first copy keeps its spelling.
        let mut b = mk();
        let s = strip(&mut b, &[false; 2], 1);
        assert_eq!(s.positions, vec![1]);
        assert_eq!(b.observations[0], mk().observations[0]);
        // Level 2: two topics, and the entry's bytes are those of the
        // batch as it came.
        let mut b = mk();
        let s = strip(&mut b, &[false; 2], 2);
        assert!(s.positions.is_empty());
        assert_eq!(
            bincode::serialize(&b.into_command_at(
                2,
                7,
                firstseen_store::Window::from_ms(9),
                s.positions
            ))
            .unwrap(),
            bincode::serialize(&mk().into_command_at(
                2,
                7,
                firstseen_store::Window::from_ms(9),
                Vec::new()
            ))
            .unwrap(),
            "level 2: the log's bytes do not change"
        );
        let mut b = mk();
        let s = strip(&mut b, &[false; 2], 3);
        assert_eq!(s.positions, vec![1], "one message from level 3");
        assert_eq!(b.observations[0].pulsar_topic, full);
        assert_eq!(b.observations[1].pulsar_topic, full);
    }
}

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

use firstseen_store::{Batch, Key, Observation, Outcome, Properties};

/// A copy as it was before it went slim, to send it again whole if it
/// comes back [`Outcome::Missing`].
struct Whole {
    pos: usize,
    obs: Observation,
    properties: Option<Box<Properties>>,
}

/// The copies made slim in a batch: their positions, and each whole.
#[derive(Default)]
pub struct Stripped {
    pub positions: Vec<u32>,
    whole: Vec<Whole>,
}

/// Makes slim every copy of `batch` whose key an earlier copy in the batch
/// has, or `held` says the state holds. Moves the payloads out; copies none.
pub fn strip(batch: &mut Batch, held: impl Fn(&Key) -> bool) -> Stripped {
    let mut seen: HashSet<Key> = HashSet::with_capacity(batch.len());
    let mut out = Stripped::default();
    for (pos, obs) in batch.observations.iter_mut().enumerate() {
        if seen.insert(obs.key) && !held(&obs.key) {
            continue;
        }
        let slim = Observation {
            key: obs.key,
            mqtt_topic: String::new(),
            pulsar_topic: String::new(),
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
            again.push(w.obs, w.properties);
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
        let s = strip(&mut b, |k| k[0] == 3);
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
        let s = strip(&mut b, |k| k[0] == 3);
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
        assert_eq!(again.properties, vec![Some(Box::default())]);
    }

    #[test]
    fn nothing_missing_means_nothing_to_send_again() {
        let mut b = batch(&[(1, 1), (1, 2)]);
        let s = strip(&mut b, |_| false);
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
}

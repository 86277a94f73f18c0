//! What the rest of the node reads of the state: totals, topics, coverage,
//! the outbox and single keys.

use super::{corrupt, StateStore};
use crate::record;
use crate::window;
use crate::StoreError;
use crate::{
    Coverage, FirstSeen, Key, KeyKind, NodeId, Observation, OutboxItem, OutboxMessage, TopicState,
    Totals,
};

impl StateStore {
    /// The marker stored with the last applied entry, if any.
    pub fn applied_marker(&self) -> Result<Option<Vec<u8>>, StoreError> {
        let inner = self.lock();
        Ok((!inner.head.applied.is_empty()).then(|| inner.head.applied.clone()))
    }

    /// Totals over the whole state.
    pub fn totals(&self) -> Result<Totals, StoreError> {
        Ok(self.lock().head.totals)
    }

    /// Sequence and watermark of one Pulsar topic.
    pub fn topic_state(&self, topic: &str) -> Result<TopicState, StoreError> {
        Ok(self
            .lock()
            .head
            .topics
            .get(topic)
            .copied()
            .unwrap_or_default())
    }

    /// Every Pulsar topic the state machine has assigned sequences on.
    pub fn topics(&self) -> Result<Vec<(String, TopicState)>, StoreError> {
        Ok(self
            .lock()
            .head
            .topics
            .iter()
            .map(|(t, s)| (t.clone(), *s))
            .collect())
    }

    /// Up to `limit` outbox messages of `topic`, from sequence `from` on, in
    /// order. Most are references into the Raft log; the caller reads them
    /// from there (`firstseen_raft::Outbox` does).
    pub fn outbox_from(
        &self,
        topic: &str,
        from: u64,
        limit: usize,
    ) -> Result<Vec<(u64, OutboxItem)>, StoreError> {
        let inner = self.lock();
        // A run partly published stays whole, and inline records wait for
        // the next checkpoint to be deleted: neither is in the outbox.
        let published = inner.head.topics.get(topic).map_or(0, |s| s.published_seq);
        let from = from.max(published + 1);
        let mut out = Vec::new();
        let range = window::outbox_key(topic, from)..=window::outbox_key(topic, u64::MAX);
        for item in self.inline.range(range).take(limit) {
            let (k, v) = item?;
            let seq = window::outbox_seq(&k).ok_or_else(|| corrupt("outbox key"))?;
            let m = OutboxMessage::decode(&v)?;
            out.push((seq, OutboxItem::Inline(m)));
        }
        let next = out.last().map_or(from, |(s, _)| s + 1);
        // The run holding `next` starts at or before it.
        let start = inner
            .runs
            .range(window::outbox_key(topic, 0)..=window::outbox_key(topic, next))
            .next_back()
            .map_or_else(|| window::outbox_key(topic, next), |(k, _)| k.clone());
        'runs: for (k, run) in inner
            .runs
            .range(start..=window::outbox_key(topic, u64::MAX))
        {
            let first = window::outbox_seq(k).ok_or_else(|| corrupt("outbox run key"))?;
            for (i, (pos, _)) in run.messages.iter().enumerate() {
                let seq = first + i as u64;
                if seq < next {
                    continue;
                }
                if out.len() >= limit {
                    break 'runs;
                }
                out.push((
                    seq,
                    OutboxItem::InLog {
                        log_index: run.log_index,
                        pos: *pos,
                        first_seen_ms: run.first_seen_ms,
                    },
                ));
            }
        }
        Ok(out)
    }

    /// Coverage of every node that has delivered anything in the window.
    pub fn coverage(&self) -> Result<Vec<(NodeId, Coverage)>, StoreError> {
        Ok(self
            .lock()
            .head
            .coverage
            .iter()
            .map(|(n, c)| (*n, *c))
            .collect())
    }

    /// The cluster's generation: 0 for a cluster never recovered, one more
    /// with each `firstseen recover --force-new-cluster` it came through.
    pub fn generation(&self) -> u64 {
        self.lock().generation
    }

    /// The cluster level this state applies entries at.
    pub fn level(&self) -> u32 {
        self.lock().levels.level
    }

    /// The same, readable without holding the state open (a task that may
    /// outlive the node's storage, as a request in flight does).
    pub fn level_cell(&self) -> crate::level::LevelCell {
        self.level_cell.clone()
    }

    /// The first-seen record of a message: a copy of `key`, of `kind`, for
    /// `pulsar_topic`, found as apply finds it at the state's level.
    pub fn lookup_copy(
        &self,
        pulsar_topic: &str,
        kind: KeyKind,
        key: &Key,
    ) -> Result<Option<FirstSeen>, StoreError> {
        let found = {
            let inner = self.lock();
            let probe = Observation {
                key: *key,
                mqtt_topic: String::new(),
                pulsar_topic: pulsar_topic.to_string(),
                payload: Vec::new(),
                qos: 0,
                retain: false,
                node: 0,
                received_ms: 0,
            };
            super::apply::locate(&inner.index, inner.scope(), &probe, kind)
        };
        match found {
            Some(k) => self.lookup(&k),
            None => Ok(None),
        }
    }

    /// The first-seen record under the window's own key (the bare key below
    /// level 2; see [`StateStore::lookup_copy`] for a message's).
    pub fn lookup(&self, key: &Key) -> Result<Option<FirstSeen>, StoreError> {
        let inner = self.lock();
        let Some(slot) = inner.index.get(key).copied() else {
            return Ok(None);
        };
        let ts_ms = match inner.pending.iter().find(|p| p.rec == slot.rec) {
            Some(p) => p.ts,
            None => {
                let raw = self
                    .window
                    .get(record::record_key(slot.rec))?
                    .ok_or_else(|| corrupt("indexed key without its window record"))?;
                record::record_ts(&raw).ok_or_else(|| corrupt("window record"))?
            }
        };
        let bits = &inner.head.bits;
        Ok(Some(FirstSeen {
            ts_ms,
            seq: slot.seq,
            node: bits.node_of(slot.node_bit).unwrap_or_default(),
            seen_by: bits.nodes_in(slot.mask).collect(),
        }))
    }

    /// Whether the window holds each of `copies` now (with its kind), as
    /// apply would find it. The leader's guess at which copies can go into
    /// the log without their payload; apply, not this, decides (see
    /// [`crate::Outcome::Missing`]).
    pub fn held<'a>(&self, copies: impl Iterator<Item = (&'a Observation, KeyKind)>) -> Vec<bool> {
        let inner = self.lock();
        let scope = inner.scope();
        copies
            .map(|(o, k)| super::apply::locate(&inner.index, scope, o, k).is_some())
            .collect()
    }

    /// Keys held by the in-memory index (equal to the window's keys).
    pub fn indexed_keys(&self) -> usize {
        self.lock().index.len()
    }
}

#[cfg(test)]
mod tests {
    use super::super::testing::{obs, observe, publish, store};
    use super::super::NO_HOLD;
    use crate::window;
    use crate::OutboxItem;

    #[test]
    fn the_outbox_points_into_the_log_until_published() {
        let s = store();
        s.apply(
            Some(&observe(
                1,
                60_000,
                vec![obs(1, 1, "a"), obs(2, 1, "b"), obs(3, 1, "a")],
            )),
            10,
            b"10",
        )
        .unwrap();
        s.apply(
            Some(&observe(2, 60_000, vec![obs(3, 2, "a"), obs(4, 2, "a")])),
            11,
            b"11",
        )
        .unwrap();
        let refs: Vec<_> = s
            .outbox_from("a", 2, 10)
            .unwrap()
            .into_iter()
            .map(|(seq, item)| match item {
                OutboxItem::InLog { log_index, pos, .. } => (seq, log_index, pos),
                OutboxItem::Inline(_) => panic!("inline without a snapshot"),
            })
            .collect();
        assert_eq!(refs, vec![(2, 10, 2), (3, 11, 1)]);
        assert_eq!(s.log_hold(), 10);
        // Publishing into the middle of entry 10's run keeps it: seq 2 of
        // topic a still lives there, and so does all of topic b.
        publish(&s, "a", 1, 12);
        assert_eq!(s.log_hold(), 10);
        publish(&s, "b", 1, 13);
        assert_eq!(s.log_hold(), 10);
        publish(&s, "a", 2, 14);
        assert_eq!(s.log_hold(), 11);
        let t = s.totals().unwrap();
        assert_eq!(t.outbox_messages, 1);
        assert_eq!(
            t.outbox_bytes,
            window::outbox_charge("/hfp/4", &[4; 10], None)
        );
        publish(&s, "a", 3, 15);
        assert_eq!(s.log_hold(), NO_HOLD);
        assert_eq!(s.totals().unwrap().outbox_bytes, 0);
    }
}

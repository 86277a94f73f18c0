//! The set-aside store: messages the publisher sent to Pulsar as markers
//! (the broker would refuse them), kept whole on every node.
//!
//! Before it, such a message lived in the dead-letter directory of the one
//! node that published the marker: evicted there by anyone's unrouted
//! messages, deleted by a clock jump past its retention, overwritten by a
//! message with the same payload in the same millisecond. Here it is
//! replicated state ([`crate::Command::SetAside`]), applied the same way on
//! every node, evicted only by other set-aside messages, oldest first, past
//! the bound the leader stamped into the command.
//!
//! Records: id (big-endian, in the order they were set aside) →
//! [`crate::SetAside`] without its bound.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::{corrupt, decode, encode, StateStore};
use crate::StoreError;
use crate::{Response, SetAside};

/// One set-aside message, as kept.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Kept {
    pub pulsar_topic: String,
    pub seq: u64,
    pub reason: String,
    pub message: crate::OutboxMessage,
    /// The window clock when it was set aside.
    pub at_ms: u64,
}

/// What the listing shows of one.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct KeptEntry {
    pub id: u64,
    pub pulsar_topic: String,
    pub seq: u64,
    pub key: String,
    pub mqtt_topic: String,
    pub reason: String,
    pub bytes: u64,
    pub at_ms: u64,
}

/// The store in memory: what each record holds, to bound and evict it, and
/// the changes the next checkpoint writes.
#[derive(Default)]
pub(super) struct Aside {
    /// id → (topic, seq, bytes).
    held: BTreeMap<u64, (String, u64, u64)>,
    pub(super) next_id: u64,
    pub(super) bytes: u64,
    /// Applied, not yet written: id → encoded record.
    pub(super) new: BTreeMap<u64, Vec<u8>>,
    /// Evicted: ids to delete.
    pub(super) gone: Vec<u64>,
}

/// The bytes a set-aside message counts for.
fn charge(m: &crate::OutboxMessage) -> u64 {
    (m.payload.len() + m.mqtt_topic.len()) as u64
}

pub(super) fn record_key(id: u64) -> [u8; 8] {
    id.to_be_bytes()
}

impl Aside {
    /// Loads the store's bookkeeping from its records.
    pub(super) fn load(tree: &sled::Tree) -> Result<Self, StoreError> {
        let mut a = Aside::default();
        for item in tree.iter() {
            let (k, v) = item?;
            let id = u64::from_be_bytes(
                k.as_ref()
                    .try_into()
                    .map_err(|_| corrupt("set-aside record id"))?,
            );
            let kept: Kept = decode(&v)?;
            let bytes = charge(&kept.message);
            a.bytes += bytes;
            a.held.insert(id, (kept.pulsar_topic, kept.seq, bytes));
            a.next_id = a.next_id.max(id + 1);
        }
        Ok(a)
    }

    fn holds(&self, topic: &str, seq: u64) -> bool {
        self.held.values().any(|(t, s, _)| t == topic && *s == seq)
    }
}

impl Aside {
    /// Keeps one set-aside message, at window clock `clock_ms`; one already
    /// kept (a new leader set the same message aside again) changes
    /// nothing.
    pub(super) fn keep(&mut self, s: &SetAside, clock_ms: u64) -> Result<Response, StoreError> {
        if self.holds(&s.pulsar_topic, s.seq) {
            return Ok(Response::None);
        }
        let kept = Kept {
            pulsar_topic: s.pulsar_topic.clone(),
            seq: s.seq,
            reason: s.reason.clone(),
            message: s.message.clone(),
            at_ms: clock_ms,
        };
        let raw = encode(&kept)?;
        let a = self;
        let id = a.next_id;
        let bytes = charge(&s.message);
        a.next_id += 1;
        a.bytes += bytes;
        a.held.insert(id, (s.pulsar_topic.clone(), s.seq, bytes));
        a.new.insert(id, raw);
        // The newest stays, even alone over the bound: it is the one just
        // set aside.
        while a.bytes > s.keep_bytes && a.held.len() > 1 {
            let Some((old, (topic, seq, b))) = a.held.pop_first() else {
                break;
            };
            a.bytes -= b;
            if a.new.remove(&old).is_none() {
                a.gone.push(old);
            }
            metrics::counter!("firstseen_set_aside_evicted_total").increment(1);
            tracing::warn!(topic = %topic, seq, "a set-aside message was evicted by newer ones past outbox.set_aside_max_bytes");
        }
        Ok(Response::None)
    }
}

impl StateStore {
    /// The set-aside messages kept, oldest first.
    pub fn set_aside_list(&self) -> Result<Vec<KeptEntry>, StoreError> {
        let ids: Vec<u64> = self.lock().aside.held.keys().copied().collect();
        let mut out = Vec::with_capacity(ids.len());
        for id in ids {
            if let Some(k) = self.set_aside_get(id)? {
                out.push(KeptEntry {
                    id,
                    key: hex_of(&k.message.key),
                    mqtt_topic: k.message.mqtt_topic.clone(),
                    bytes: charge(&k.message),
                    pulsar_topic: k.pulsar_topic,
                    seq: k.seq,
                    reason: k.reason,
                    at_ms: k.at_ms,
                });
            }
        }
        Ok(out)
    }

    /// Set-aside message `id`, whole, if it is kept.
    pub fn set_aside_get(&self, id: u64) -> Result<Option<Kept>, StoreError> {
        {
            let inner = self.lock();
            if !inner.aside.held.contains_key(&id) {
                return Ok(None);
            }
            if let Some(raw) = inner.aside.new.get(&id) {
                return Ok(Some(decode(raw)?));
            }
        }
        match self.aside.get(record_key(id))? {
            Some(raw) => Ok(Some(decode(&raw)?)),
            None => Ok(None),
        }
    }
}

fn hex_of(key: &[u8; 32]) -> String {
    key.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::super::testing::{reopenable, store};
    use crate::{Command, OutboxMessage, SetAside};

    fn aside(topic: &str, seq: u64, bytes: usize, keep_bytes: u64) -> Command {
        Command::SetAside(Box::new(SetAside {
            pulsar_topic: topic.into(),
            seq,
            reason: "too big".into(),
            message: OutboxMessage {
                key: [seq as u8; 32],
                mqtt_topic: String::new(),
                payload: vec![seq as u8; bytes],
                node: 1,
                first_seen_ms: 0,
                properties: None,
            },
            keep_bytes,
        }))
    }

    /// Every node keeps what was set aside, whole, across a restart; the
    /// same message set aside again (a new leader) is kept once; past the
    /// bound only the oldest set-aside message goes, never the newest.
    #[test]
    fn set_aside_messages_are_kept_bounded_and_only_by_each_other() {
        let dir = tempfile::tempdir().unwrap();
        {
            let db = reopenable(dir.path());
            let s = crate::StateStore::open(&db).unwrap();
            s.apply(Some(&aside("t", 5, 100, 250)), 1, b"1").unwrap();
            s.apply(Some(&aside("t", 5, 100, 250)), 2, b"2").unwrap();
            s.apply(Some(&aside("t", 9, 100, 250)), 3, b"3").unwrap();
            let list = s.set_aside_list().unwrap();
            assert_eq!(list.iter().map(|e| e.seq).collect::<Vec<_>>(), vec![5, 9]);
            s.flush().unwrap();
            s.apply(Some(&aside("u", 1, 100, 250)), 4, b"4").unwrap();
            let list = s.set_aside_list().unwrap();
            assert_eq!(
                list.iter()
                    .map(|e| (e.pulsar_topic.as_str(), e.seq))
                    .collect::<Vec<_>>(),
                vec![("t", 9), ("u", 1)],
                "the oldest went past the bound"
            );
            s.flush().unwrap();
        }
        let db = reopenable(dir.path());
        let s = crate::StateStore::open(&db).unwrap();
        let list = s.set_aside_list().unwrap();
        assert_eq!(list.len(), 2);
        let kept = s.set_aside_get(list[1].id).unwrap().unwrap();
        assert_eq!(kept.message.payload, vec![1u8; 100]);
        assert_eq!(kept.reason, "too big");
        // One larger than the bound alone is still kept.
        s.apply(Some(&aside("u", 2, 1_000, 250)), 5, b"5").unwrap();
        assert_eq!(s.set_aside_list().unwrap().len(), 1);
    }

    #[test]
    fn set_aside_messages_travel_in_the_snapshot() {
        let a = store();
        a.apply(Some(&aside("t", 3, 10, 1_000)), 1, b"1").unwrap();
        let mut buf = Vec::new();
        a.export(&mut buf, &mut |_| unreachable!("no outbox"))
            .unwrap();
        let b = store();
        b.import(&mut buf.as_slice()).unwrap();
        let list = b.set_aside_list().unwrap();
        assert_eq!(list.len(), 1);
        assert_eq!(b.set_aside_get(list[0].id).unwrap().unwrap().seq, 3);
    }
}

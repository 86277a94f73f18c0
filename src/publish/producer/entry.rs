//! One Pulsar entry holding several messages, as a pure value: how Pulsar's
//! batch format lays them out, and when an entry is full.
//!
//! An entry is what the broker stores and acknowledges as one: one
//! `CommandSend`, one receipt, one bookie write. Its payload is the
//! messages one after another, each as a 4-byte length, its
//! `SingleMessageMetadata` (properties, key, event time, size) and its
//! body; the entry's own `MessageMetadata` says how many there are. A
//! reader (the `pulsar` crate's consumer, `firstseen verify`, the tail
//! read) gets them back one by one, told apart by the batch index in their
//! message id.

use prost::Message as _;
use pulsar::proto::{KeyValue, MessageMetadata, SingleMessageMetadata};

/// Most messages in one entry: what the Java and Go clients default to.
pub const MAX_MESSAGES: usize = 1_000;

/// Most payload bytes in one entry: the Java client's default (128 KiB). A
/// single message larger than this still goes, alone.
pub const MAX_BYTES: usize = 128 * 1024;

/// One message as it goes into an entry.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Outgoing {
    /// Its sequence (`firstseen-seq`), also the entry's sequence id when it
    /// comes first.
    pub seq: u64,
    pub key: String,
    pub properties: Vec<(String, String)>,
    pub event_time: u64,
    pub body: Vec<u8>,
}

/// Messages gathered for one entry, not yet sent.
#[derive(Debug, Default)]
pub struct Open {
    data: Vec<u8>,
    first: Option<u64>,
    last: u64,
    count: usize,
}

/// A closed entry, ready for `CommandSend`.
#[derive(Debug, Clone)]
pub struct Entry {
    /// The first message's sequence: the entry's sequence id.
    pub first: u64,
    /// The last message's: its highest sequence id.
    pub last: u64,
    pub count: usize,
    pub metadata: MessageMetadata,
    pub data: Vec<u8>,
}

impl Open {
    /// The bytes `m` adds to an entry's payload.
    pub fn cost(m: &Outgoing) -> usize {
        4 + single(m).encoded_len() + m.body.len()
    }

    /// Whether `m` may join this entry under `max_bytes`: always when it is
    /// empty (a message is never held back for its size; the publisher
    /// judges that before), otherwise while both bounds hold.
    pub fn fits(&self, m: &Outgoing, max_bytes: usize) -> bool {
        self.count == 0
            || (self.count < MAX_MESSAGES && self.data.len() + Self::cost(m) <= max_bytes)
    }

    /// Adds `m` at the end.
    pub fn push(&mut self, m: Outgoing) {
        let meta = single(&m);
        self.data
            .extend_from_slice(&(meta.encoded_len() as u32).to_be_bytes());
        meta.encode(&mut self.data)
            .expect("a Vec grows to take what is encoded");
        self.data.extend_from_slice(&m.body);
        self.first.get_or_insert(m.seq);
        self.last = m.seq;
        self.count += 1;
    }

    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    pub fn len(&self) -> usize {
        self.count
    }

    /// Closes the entry as `producer`'s, published at `now_ms`, leaving
    /// this one empty. `None` when nothing was pushed.
    pub fn close(&mut self, producer: &str, now_ms: u64) -> Option<Entry> {
        let first = self.first.take()?;
        let data = std::mem::take(&mut self.data);
        let count = std::mem::take(&mut self.count);
        Some(Entry {
            first,
            last: self.last,
            count,
            metadata: MessageMetadata {
                producer_name: producer.to_string(),
                sequence_id: first,
                publish_time: now_ms,
                num_messages_in_batch: Some(count as i32),
                highest_sequence_id: Some(self.last),
                uncompressed_size: Some(data.len() as u32),
                ..Default::default()
            },
            data,
        })
    }
}

fn single(m: &Outgoing) -> SingleMessageMetadata {
    SingleMessageMetadata {
        properties: m
            .properties
            .iter()
            .map(|(key, value)| KeyValue {
                key: key.clone(),
                value: value.clone(),
            })
            .collect(),
        partition_key: Some(m.key.clone()),
        payload_size: m.body.len() as i32,
        event_time: (m.event_time > 0).then_some(m.event_time),
        sequence_id: Some(m.seq),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The messages of an entry's payload, as a reader splits it: each
    /// one's metadata and body.
    fn split(entry: &Entry) -> Vec<(SingleMessageMetadata, Vec<u8>)> {
        let mut rest = &entry.data[..];
        let mut out = Vec::with_capacity(entry.count);
        while !rest.is_empty() {
            let n = u32::from_be_bytes(rest[..4].try_into().unwrap()) as usize;
            let meta = SingleMessageMetadata::decode(&rest[4..4 + n]).unwrap();
            rest = &rest[4 + n..];
            let size = meta.payload_size as usize;
            out.push((meta, rest[..size].to_vec()));
            rest = &rest[size..];
        }
        out
    }

    fn message(seq: u64, body: usize) -> Outgoing {
        Outgoing {
            seq,
            key: format!("{seq:064x}"),
            properties: vec![("firstseen-seq".into(), seq.to_string())],
            event_time: 1_700_000_000_000 + seq,
            body: vec![seq as u8; body],
        }
    }

    #[test]
    fn an_entry_holds_its_messages_in_order_and_says_how_many() {
        let mut open = Open::default();
        for seq in 5..8 {
            open.push(message(seq, 10 + seq as usize));
        }
        let entry = open.close("p", 42).unwrap();
        assert!(open.is_empty() && open.close("p", 43).is_none());
        assert_eq!((entry.first, entry.last, entry.count), (5, 7, 3));
        assert_eq!(entry.metadata.num_messages_in_batch, Some(3));
        assert_eq!(entry.metadata.sequence_id, 5);
        assert_eq!(entry.metadata.highest_sequence_id, Some(7));
        let back = split(&entry);
        assert_eq!(back.len(), 3);
        for ((meta, body), seq) in back.iter().zip(5u64..) {
            assert_eq!(meta.sequence_id, Some(seq));
            assert_eq!(meta.partition_key.as_deref(), Some(&*format!("{seq:064x}")));
            assert_eq!(meta.properties[0].value, seq.to_string());
            assert_eq!(body, &vec![seq as u8; 10 + seq as usize]);
        }
    }

    #[test]
    fn an_entry_is_full_by_count_or_bytes_and_a_large_message_goes_alone() {
        let mut open = Open::default();
        let big = message(1, MAX_BYTES * 2);
        assert!(open.fits(&big, MAX_BYTES), "an empty entry takes anything");
        open.push(big);
        assert!(!open.fits(&message(2, 1), MAX_BYTES));
        open.close("p", 0);

        let small = message(3, 1);
        let per = Open::cost(&small);
        for _ in 0..(1_000 / per) {
            assert!(open.fits(&small, 1_000));
            open.push(small.clone());
        }
        assert!(!open.fits(&small, 1_000), "bytes bound");
        open.close("p", 0);

        for _ in 0..MAX_MESSAGES {
            open.push(message(4, 0));
        }
        assert!(!open.fits(&message(4, 0), usize::MAX), "count bound");
    }
}

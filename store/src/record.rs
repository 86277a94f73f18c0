//! Byte layouts of the window's records, kept free of I/O.
//!
//! sled 0.34 never moves a live page to reclaim a segment, so the state's
//! disk is bounded by everything written to it during one window, not by
//! what is live (docs/benchmarks.md has the measurements). The layouts here
//! are therefore packed and written once where they can be:
//!
//! - a **window record** holds every key first seen in one log entry, in
//!   the order they were seen, under an ever-growing record id. Ids grow with
//!   the window clock, so expiry deletes whole records from the front;
//! - a **masks** record holds, for the items of one window record, which
//!   nodes have delivered a copy when that is more than the first node. It
//!   is the only record rewritten, and only while later copies arrive;
//! - a **run** points at the first-seen messages of one topic in one log
//!   entry, so the outbox costs a few bytes per message instead of the
//!   payload, which stays in the Raft log until it is published.

use crate::Key;

/// Node bit of a node that could not be given one (more than [`MAX_NODE_BITS`]
/// nodes delivered keys that are still in the window): its copies are not
/// counted in coverage.
pub const UNTRACKED: u8 = u8::MAX;

/// Distinct nodes whose deliveries can be told apart within one window.
pub const MAX_NODE_BITS: usize = 64;

/// Appends `v` as LEB128: small numbers take one byte.
pub fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

/// Reads a LEB128 number at `*at`, advancing it; `None` if truncated or
/// longer than a u64.
pub fn get_varint(raw: &[u8], at: &mut usize) -> Option<u64> {
    let mut v = 0u64;
    for shift in (0..64).step_by(7) {
        let b = *raw.get(*at)?;
        *at += 1;
        v |= u64::from(b & 0x7f).checked_shl(shift)?;
        if b & 0x80 == 0 {
            return Some(v);
        }
    }
    None
}

/// One key first seen in a log entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Item {
    pub key: Key,
    /// Bit of the node whose copy came first (see [`UNTRACKED`]).
    pub node_bit: u8,
    /// Topic sequence assigned to it.
    pub seq: u64,
}

/// The mask of an item nobody else has delivered yet: its first node alone.
pub fn first_mask(node_bit: u8) -> u64 {
    if (node_bit as usize) < MAX_NODE_BITS {
        1 << node_bit
    } else {
        0
    }
}

/// `ts_ms` (8 bytes, big-endian), then per item: key, node bit, seq varint.
pub fn encode_record(ts_ms: u64, items: &[Item]) -> Vec<u8> {
    let mut out = Vec::with_capacity(8 + items.len() * 37);
    out.extend_from_slice(&ts_ms.to_be_bytes());
    for item in items {
        out.extend_from_slice(&item.key);
        out.push(item.node_bit);
        put_varint(&mut out, item.seq);
    }
    out
}

/// The window clock a record was written at, without decoding its items.
pub fn record_ts(raw: &[u8]) -> Option<u64> {
    Some(u64::from_be_bytes(raw.get(..8)?.try_into().ok()?))
}

/// Splits a window record into its time and items.
pub fn decode_record(raw: &[u8]) -> Option<(u64, Vec<Item>)> {
    let ts = record_ts(raw)?;
    let mut at = 8;
    let mut items = Vec::with_capacity((raw.len() - 8) / 36);
    while at < raw.len() {
        let key: Key = raw.get(at..at + 32)?.try_into().ok()?;
        let node_bit = *raw.get(at + 32)?;
        at += 33;
        let seq = get_varint(raw, &mut at)?;
        items.push(Item { key, node_bit, seq });
    }
    Some((ts, items))
}

/// One varint per item, 0 meaning "the first node only". Items past the end
/// are 0, so a record only grows as far as its last item with a later copy.
pub fn encode_masks(masks: &[u64]) -> Vec<u8> {
    let mut out = Vec::with_capacity(masks.len());
    for m in masks {
        put_varint(&mut out, *m);
    }
    out
}

pub fn decode_masks(raw: &[u8]) -> Option<Vec<u64>> {
    let mut at = 0;
    let mut out = Vec::with_capacity(raw.len());
    while at < raw.len() {
        out.push(get_varint(raw, &mut at)?);
    }
    Some(out)
}

/// The first-seen messages of one topic in one log entry, consecutive in
/// sequence from the run's first (which is in its sled key).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Run {
    /// The Raft log entry that holds the payloads.
    pub log_index: u64,
    /// Window clock when the entry was applied: the messages' event time.
    pub first_seen_ms: u64,
    /// Per message: its position among the entry's observations, and the
    /// bytes it is charged against the outbox quota.
    pub messages: Vec<(u32, u64)>,
}

pub fn encode_run(run: &Run) -> Vec<u8> {
    let mut out = Vec::with_capacity(16 + run.messages.len() * 3);
    put_varint(&mut out, run.log_index);
    put_varint(&mut out, run.first_seen_ms);
    for (pos, charge) in &run.messages {
        put_varint(&mut out, u64::from(*pos));
        put_varint(&mut out, *charge);
    }
    out
}

pub fn decode_run(raw: &[u8]) -> Option<Run> {
    let mut at = 0;
    let log_index = get_varint(raw, &mut at)?;
    let first_seen_ms = get_varint(raw, &mut at)?;
    let mut messages = Vec::new();
    while at < raw.len() {
        let pos = u32::try_from(get_varint(raw, &mut at)?).ok()?;
        messages.push((pos, get_varint(raw, &mut at)?));
    }
    Some(Run {
        log_index,
        first_seen_ms,
        messages,
    })
}

/// Record ids as sled keys: big-endian, so they sort in the order written.
pub fn record_key(id: u64) -> [u8; 8] {
    id.to_be_bytes()
}

pub fn parse_record_key(raw: &[u8]) -> Option<u64> {
    Some(u64::from_be_bytes(raw.try_into().ok()?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn varints_round_trip_and_reject_truncation() {
        let mut buf = Vec::new();
        for v in [0, 1, 127, 128, 300, u32::MAX as u64, u64::MAX] {
            put_varint(&mut buf, v);
        }
        let mut at = 0;
        for v in [0, 1, 127, 128, 300, u32::MAX as u64, u64::MAX] {
            assert_eq!(get_varint(&buf, &mut at), Some(v));
        }
        assert_eq!(at, buf.len());
        assert_eq!(get_varint(&[0x80], &mut 0), None);
        assert_eq!(get_varint(&[0xff; 11], &mut 0), None);
    }

    #[test]
    fn a_record_costs_about_its_key() {
        let items: Vec<Item> = (0..100u8)
            .map(|i| Item {
                key: [i; 32],
                node_bit: i % 3,
                seq: 1_000_000 + u64::from(i),
            })
            .collect();
        let raw = encode_record(42, &items);
        // 32-byte key, node bit and a 3-byte sequence per item.
        assert_eq!(raw.len(), 8 + 100 * 36);
        assert_eq!(record_ts(&raw), Some(42));
        assert_eq!(decode_record(&raw), Some((42, items)));
        assert_eq!(decode_record(&raw[..raw.len() - 1]), None);
    }

    #[test]
    fn masks_and_runs_round_trip() {
        let masks = vec![0, 0b101, 0, 1 << 63];
        assert_eq!(decode_masks(&encode_masks(&masks)), Some(masks));
        let run = Run {
            log_index: 123_456,
            first_seen_ms: 1_700_000_000_000,
            messages: vec![(0, 400), (7, 12), (300, 0)],
        };
        assert_eq!(decode_run(&encode_run(&run)), Some(run));
        assert_eq!(first_mask(2), 4);
        assert_eq!(first_mask(UNTRACKED), 0);
        assert_eq!(parse_record_key(&record_key(9)), Some(9));
    }
}

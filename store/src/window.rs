//! Pure rules of the dedup window and of the byte layouts used as sled keys.
//!
//! Kept free of I/O so the rules that G5 depends on can be unit-tested alone.

/// Largest number of keys expired while applying one entry. Expiry is part of
/// the deterministic apply, so every node does the same amount of it; the
/// bound keeps one entry's apply time bounded after a long idle period, and
/// what is left over is expired by the following entries.
pub const MAX_EXPIRE_PER_ENTRY: usize = 20_000;

/// The window clock after an entry stamped `stamped_ms`: it never goes back,
/// so a leader whose clock lags its predecessor's cannot un-expire keys.
pub fn advance_clock(clock_ms: u64, stamped_ms: u64) -> u64 {
    clock_ms.max(stamped_ms)
}

/// Keys first seen strictly before this instant are outside the window.
pub fn expiry_cutoff(clock_ms: u64, window_ms: u64) -> u64 {
    clock_ms.saturating_sub(window_ms)
}

/// Outbox key: topic, a 0x00 separator (never part of a Pulsar topic name),
/// then the big-endian sequence, so one topic's messages are contiguous and
/// in sequence order.
pub fn outbox_key(topic: &str, seq: u64) -> Vec<u8> {
    let mut out = Vec::with_capacity(topic.len() + 9);
    out.extend_from_slice(topic.as_bytes());
    out.push(0);
    out.extend_from_slice(&seq.to_be_bytes());
    out
}

/// The sequence number at the end of an outbox key.
pub fn outbox_seq(raw: &[u8]) -> Option<u64> {
    let tail = raw.len().checked_sub(8)?;
    Some(u64::from_be_bytes(raw[tail..].try_into().ok()?))
}

/// Bytes an outbox entry is charged against the disk quota.
pub fn outbox_charge(mqtt_topic: &str, payload: &[u8]) -> u64 {
    (mqtt_topic.len() + payload.len()) as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clock_never_goes_back() {
        assert_eq!(advance_clock(1_000, 500), 1_000);
        assert_eq!(advance_clock(1_000, 1_500), 1_500);
    }

    #[test]
    fn cutoff_saturates_at_zero() {
        assert_eq!(expiry_cutoff(10, 100), 0);
        assert_eq!(expiry_cutoff(3_600_500, 3_600_000), 500);
    }

    #[test]
    fn outbox_keys_sort_by_sequence_within_a_topic() {
        let a = outbox_key("t", 2);
        let b = outbox_key("t", 10);
        let other = outbox_key("t2", 1);
        assert!(a < b);
        // "t\0..." sorts before "t2...": topics never interleave.
        assert!(b < other);
        assert_eq!(outbox_seq(&b), Some(10));
    }
}

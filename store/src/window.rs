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

/// The time a leader stamps its next entry with.
///
/// Every observation carries the clock of the node that received it, so the
/// leader knows, besides its own wall clock `own_ms`, the latest reading of
/// each other voter that sent it something recently (`fresh_peers`). With
/// readings from a majority of the `voters`, the stamp is their lower
/// median: one skewed or jumping clock, the leader's included, moves
/// nothing. Without (other zones silent), the window clock advances by
/// `elapsed_ms`: how far past it the leader's monotonic clock says the time
/// surely is (`propose::clocks` works it out), which no wall clock can move. A cluster that never
/// stamped anything starts from the leader's own clock. The stamp never
/// falls below the window clock, so keys are always stamped with the
/// window's own now.
///
/// Why: the window clock is the largest stamp applied, and expiry follows
/// it. Stamped with the leader's clock alone, a leader whose clock jumped a
/// day ahead expired the whole window at once, and the copies that arrived
/// after that (other zones', redeliveries) were new messages: duplicates in
/// Pulsar (found by the nemesis campaign's clock jumps).
pub fn leader_stamp(
    own_ms: u64,
    fresh_peers: &[u64],
    voters: usize,
    window_clock_ms: u64,
    elapsed_ms: u64,
) -> u64 {
    let mut readings: Vec<u64> = std::iter::once(own_ms)
        .chain(fresh_peers.iter().copied())
        .collect();
    let candidate = if readings.len() * 2 > voters {
        readings.sort_unstable();
        // The lower median of an even count: the cautious side.
        readings[(readings.len() - 1) / 2]
    } else if window_clock_ms == 0 {
        own_ms
    } else {
        window_clock_ms.saturating_add(elapsed_ms)
    };
    candidate.max(window_clock_ms)
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
    fn one_clock_off_moves_nothing() {
        let now = 1_800_000_000_000;
        let day = 86_400_000;
        // A leader a day ahead, two followers on time: the followers win.
        assert_eq!(
            leader_stamp(now + day, &[now, now + 5], 3, now - 10, 0),
            now + 5
        );
        // A follower an hour behind, another on time: an on-time one.
        assert_eq!(
            leader_stamp(now, &[now - 3_600_000, now - 2], 3, now - 50, 0),
            now - 2
        );
        // A follower a day ahead: the on-time two.
        assert_eq!(
            leader_stamp(now, &[now + day, now + 1], 3, now - 50, 0),
            now + 1
        );
        // A leader a day ahead that has heard from nobody: the window clock
        // moves on by the leader's monotonic clock, not by its wall clock.
        assert_eq!(leader_stamp(now + day, &[], 3, now, 250), now + 250);
        // Never below the window clock.
        assert_eq!(
            leader_stamp(now - 5_000, &[now - 5_000, now - 4_000], 3, now, 0),
            now
        );
        // A fresh cluster starts from the leader's clock; a group of one
        // follows its own.
        assert_eq!(leader_stamp(now, &[], 3, 0, 0), now);
        assert_eq!(leader_stamp(now, &[], 1, now - 9, 0), now);
        // Two voters: both are a majority, the lower one counts.
        assert_eq!(leader_stamp(now + 9, &[now], 2, 0, 0), now);
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

//! Pure rules of the dedup window and of the byte layouts used as sled keys.
//!
//! Kept free of I/O so the rules that G5 depends on can be unit-tested alone.

use crate::{Key, KeyKind, Properties, Window};

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
/// readings from a majority of the `voters`, the candidate is their lower
/// median: one skewed or jumping clock, the leader's included, moves
/// nothing. Without (other zones silent), it is the window clock plus
/// `elapsed_ms`. A cluster that never stamped anything starts from the
/// leader's own clock.
///
/// Whatever the candidate, the stamp never runs ahead of the window clock
/// by more than `elapsed_ms`: how far past the window clock the leader's
/// monotonic clock says the time surely is (`propose::clocks` works it out
/// from stamps it saw applied or made itself). And it never falls below the
/// window clock, so keys are always stamped with the window's own now.
///
/// Why the cap: a key stamped at window time `w` expires when the window
/// clock reaches `w + window`. If no stamp moves the window clock further
/// than real time elapsed since a stamp already applied, that takes at
/// least `window` of real time, however many wall clocks are wrong. The
/// median alone held only while a majority of clocks was right: with two of
/// three a day ahead, the median was a day ahead and every key expired at
/// once (soak seeds 777001 and 4242 published 3,548 and 2 keys twice). The
/// price: while the wall clocks run ahead of the window clock (after a
/// whole-cluster outage, during which the window clock stands still, or a
/// leader change, which costs the time until the new leader saw the last
/// stamp applied), the window clock stays behind them for good, and keys
/// live longer by what it fell behind during their window, never shorter
/// (docs/architecture.md, "The window clock").
pub fn leader_stamp(
    own_ms: u64,
    fresh_peers: &[u64],
    voters: usize,
    window_clock_ms: u64,
    elapsed_ms: u64,
) -> u64 {
    if window_clock_ms == 0 {
        // Nothing stamped yet: there is no window to expire early.
        return median_or_own(own_ms, fresh_peers, voters);
    }
    let limit = window_clock_ms.saturating_add(elapsed_ms);
    let candidate = if (fresh_peers.len() + 1) * 2 > voters {
        median_or_own(own_ms, fresh_peers, voters)
    } else {
        limit
    };
    candidate.min(limit).max(window_clock_ms)
}

/// The lower median of the leader's reading and its peers' when they are a
/// majority of `voters`, else the leader's own reading.
fn median_or_own(own_ms: u64, fresh_peers: &[u64], voters: usize) -> u64 {
    let mut readings: Vec<u64> = std::iter::once(own_ms)
        .chain(fresh_peers.iter().copied())
        .collect();
    if readings.len() * 2 <= voters {
        return own_ms;
    }
    readings.sort_unstable();
    // The lower median of an even count: the cautious side.
    readings[(readings.len() - 1) / 2]
}

/// What the window holds a copy under from cluster level 2: its key, in the
/// domain of its kind and of its Pulsar topic. A key is first seen per
/// topic, and keys of different kinds never meet, however their bytes were
/// crafted: a `payload` key is blake3 of the payload, so a payload
/// "b/y\0P" published on a `payload` route has the `topic+payload` key of
/// message P on topic b/y, and made that one a duplicate. blake3 in
/// key-derivation mode, so no plain blake3 key (every kind's) can equal it.
/// A copy of unknown kind is held under its bare key ([`KeyKind::Unknown`]).
pub fn identity(pulsar_topic: &str, kind: KeyKind, key: &Key) -> Key {
    let mut h = blake3::Hasher::new_derive_key("firstseen window identity v2");
    h.update(&[u8::from(kind)]);
    h.update(key);
    h.update(pulsar_topic.as_bytes());
    *h.finalize().as_bytes()
}

/// Keys first seen strictly before this instant are outside the window.
pub fn expiry_cutoff(clock_ms: u64, window: Window) -> u64 {
    clock_ms.saturating_sub(window.as_ms())
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

/// Bytes an outbox entry is charged against the disk quota: the whole
/// message, its MQTT 5 properties included, so that messages heavy with
/// properties cannot fill the disk under a quota that never saw them.
pub fn outbox_charge(mqtt_topic: &str, payload: &[u8], properties: Option<&Properties>) -> u64 {
    message_bytes(mqtt_topic, payload, properties)
}

/// Bytes a message costs as stored and as published: its MQTT topic, its
/// payload and its MQTT 5 properties under the Pulsar property names they
/// get (`mqtt-user-NAME` and so on; correlation data as hex), with a few
/// bytes of framing per property. An estimate from above of what each
/// adds; firstseen's own properties are a fixed cost on top.
pub fn message_bytes(mqtt_topic: &str, payload: &[u8], properties: Option<&Properties>) -> u64 {
    // Per property: the protobuf tags and lengths of a key-value pair.
    const FRAMING: u64 = 8;
    let mut bytes = (mqtt_topic.len() + payload.len()) as u64;
    let Some(p) = properties else {
        return bytes;
    };
    let field = |name: &str, value: u64| FRAMING + name.len() as u64 + value;
    for (name, value) in &p.user {
        // "mqtt-user-" NAME, and ".N" on a repeated name.
        bytes += field("mqtt-user-", (name.len() + value.len()) as u64 + 6);
    }
    if let Some(v) = &p.content_type {
        bytes += field("mqtt-content-type", v.len() as u64);
    }
    if p.payload_format.is_some() {
        bytes += field("mqtt-payload-format", 1);
    }
    if p.message_expiry_secs.is_some() {
        bytes += field("mqtt-message-expiry-secs", 10);
    }
    if let Some(v) = &p.response_topic {
        bytes += field("mqtt-response-topic", v.len() as u64);
    }
    if let Some(v) = &p.correlation_data {
        bytes += field("mqtt-correlation-data", 2 * v.len() as u64);
    }
    bytes
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
            leader_stamp(now + day, &[now, now + 5], 3, now - 10, 20),
            now + 5
        );
        // A follower an hour behind, another on time: an on-time one.
        assert_eq!(
            leader_stamp(now, &[now - 3_600_000, now - 2], 3, now - 50, 60),
            now - 2
        );
        // A follower a day ahead: the on-time two.
        assert_eq!(
            leader_stamp(now, &[now + day, now + 1], 3, now - 50, 60),
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
        assert_eq!(leader_stamp(now, &[], 1, now - 9, 9), now);
        // ... as far as its monotonic clock went, even alone.
        assert_eq!(leader_stamp(now + day, &[], 1, now - 9, 9), now);
        // Two voters: both are a majority, the lower one counts.
        assert_eq!(leader_stamp(now + 9, &[now], 2, 0, 0), now);
    }

    /// Seeds 777001 and 4242 of the soak: two of three clocks ahead at
    /// once. The median is then wrong, and the stamp may still move the
    /// window clock only as far as the leader's monotonic clock went.
    #[test]
    fn a_majority_of_wrong_clocks_moves_the_window_no_faster_than_real_time() {
        let now = 1_800_000_000_000;
        let day = 86_400_000;
        // The leader and one follower a day ahead, 300 ms after the last
        // stamp applied: the window clock moves 300 ms, not a day.
        assert_eq!(
            leader_stamp(now + day, &[now + day, now], 3, now, 300),
            now + 300
        );
        // Two followers a day ahead, the leader right.
        assert_eq!(
            leader_stamp(now, &[now + day, now + day], 3, now - 300, 300),
            now
        );
        // Every clock an hour behind the window clock: it stands still.
        assert_eq!(
            leader_stamp(now - 3_600_000, &[now - 3_600_000], 2, now, 300),
            now
        );
        // After an outage the wall clocks are ahead of the window clock;
        // it follows at the pace of real time and stays behind them.
        assert_eq!(
            leader_stamp(now + 60_000, &[now + 60_000], 2, now, 1_000),
            now + 1_000
        );
    }

    #[test]
    fn cutoff_saturates_at_zero() {
        assert_eq!(expiry_cutoff(10, Window::from_ms(100)), 0);
        assert_eq!(expiry_cutoff(3_600_500, Window::from_ms(3_600_000)), 500);
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

//! How many proposals may be on their way at once: a few always, and more
//! only while the ones out there take long. The batcher (batches forwarded
//! to the leader) and the leader's coalescer (entries appended to the log)
//! follow this one rule, each with its own numbers.
//!
//! Why: a proposal slot held for a whole commit is what a message waits for
//! between zones. With two batches and one entry in flight, a commit of
//! 40 ms (zones 10 ms apart) left a batch waiting about 12 ms for a slot and
//! an entry about 8 ms (docs/benchmarks.md). Nearby, a commit takes a few
//! milliseconds and the fixed slots are never the wait; more slots there
//! only split what would have been merged into one entry, which cost CPU
//! (the coalescer's comment has the figures). So another proposal may leave
//! only once the newest one out has waited `gap`: nearby that is rare, and
//! between zones proposals leave every `gap` instead of every commit, which
//! openraft 0.10's pipelined appends carry without waiting for each other.

use std::time::Duration;

use tokio::time::Instant;

/// The numbers of one user of the rule.
#[derive(Clone, Copy, Debug)]
pub struct Spacing {
    /// Proposals that may always be in flight.
    pub base: usize,
    /// Proposals that may ever be in flight.
    pub most: usize,
    /// How long the newest proposal in flight waits before another may go
    /// beyond `base`.
    pub gap: Duration,
}

/// Whether one more proposal may leave.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Room {
    Now,
    /// Not before this, unless one in flight ends first.
    At(Instant),
    /// Not until one in flight ends.
    Full,
}

impl Spacing {
    /// `in_flight` proposals are out, the newest of them since `newest`.
    pub fn room(&self, in_flight: usize, newest: Option<Instant>, now: Instant) -> Room {
        if in_flight < self.base {
            return Room::Now;
        }
        if in_flight >= self.most {
            return Room::Full;
        }
        match newest {
            Some(t) if now < t + self.gap => Room::At(t + self.gap),
            _ => Room::Now,
        }
    }
}

/// Sleeps until the room's time, or forever when there is none to wait for
/// (`Now` is answered before any wait, and `Full` waits for a proposal to
/// end).
pub async fn until(room: Room) {
    match room {
        Room::At(at) => tokio::time::sleep_until(at).await,
        Room::Now | Room::Full => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base_always_then_one_per_gap_up_to_most() {
        let s = Spacing {
            base: 2,
            most: 4,
            gap: Duration::from_millis(5),
        };
        let t = Instant::now();
        let ms = Duration::from_millis;
        assert_eq!(s.room(0, None, t), Room::Now);
        // Below base, however fresh the newest.
        assert_eq!(s.room(1, Some(t), t), Room::Now);
        // At base: only once the newest has waited the gap.
        assert_eq!(s.room(2, Some(t), t + ms(1)), Room::At(t + ms(5)));
        assert_eq!(s.room(2, Some(t), t + ms(5)), Room::Now);
        assert_eq!(s.room(3, Some(t), t + ms(9)), Room::Now);
        // Never beyond most, however long they wait.
        assert_eq!(s.room(4, Some(t), t + ms(500)), Room::Full);
    }
}

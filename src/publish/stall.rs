//! Whether publishing is stuck, for readiness. Pure: the status sampler
//! feeds it once a second, readiness and `/status` read it.
//!
//! Why: a leader whose publisher resent one message Pulsar refused, for
//! minutes, while the outbox grew by thousands of messages a minute and
//! acks were about to stop on every node, answered `/readyz` with 200 the
//! whole time. Progress is the group's published watermark, the same on
//! every node, so a follower can report it too.

use std::time::Duration;

use tokio::time::Instant;

/// How long publishing may make no progress while messages wait before the
/// leader says it is not ready. Above what a Pulsar restart takes on a
/// small machine (tens of seconds), so a restart alone does not flap
/// readiness, and below what an alert on readiness would wait.
pub const STALL_AFTER: Duration = Duration::from_secs(30);

/// The published watermark over time.
#[derive(Debug, Default)]
pub struct StallWatch {
    /// The published total last seen moving, and since when it stands
    /// there with messages waiting.
    since: Option<(u64, Instant)>,
}

impl StallWatch {
    /// Notes the published total (`published`, summed over topics) and the
    /// messages waiting (`backlog`) at `now`. Returns how long publishing
    /// has stood still with messages waiting, `None` while it moves or
    /// nothing waits.
    pub fn note(&mut self, published: u64, backlog: u64, now: Instant) -> Option<Duration> {
        if backlog == 0 {
            self.since = None;
            return None;
        }
        match self.since {
            Some((seen, at)) if seen == published => Some(now.saturating_duration_since(at)),
            _ => {
                self.since = Some((published, now));
                None
            }
        }
    }

    /// How long publishing has stood still with messages waiting, as of the
    /// last [`StallWatch::note`] and `now`.
    pub fn stalled(&self, now: Instant) -> Option<Duration> {
        self.since.map(|(_, at)| now.saturating_duration_since(at))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn publishing_that_moves_or_has_nothing_to_do_is_not_stalled() {
        let t = Instant::now();
        let s = |n: u64| t + Duration::from_secs(n);
        let mut w = StallWatch::default();
        assert_eq!(w.note(10, 5, s(0)), None);
        assert_eq!(w.note(20, 5, s(40)), None);
        assert_eq!(w.note(20, 0, s(80)), None);
        assert_eq!(w.stalled(s(90)), None);
    }

    #[test]
    fn a_watermark_that_stands_still_with_messages_waiting_is_a_stall() {
        let t = Instant::now();
        let s = |n: u64| t + Duration::from_secs(n);
        let mut w = StallWatch::default();
        assert_eq!(w.note(10, 5, s(0)), None);
        assert_eq!(w.note(10, 900, s(31)), Some(Duration::from_secs(31)));
        assert_eq!(w.stalled(s(40)), Some(Duration::from_secs(40)));
        // It moves again: the stall is over.
        assert_eq!(w.note(11, 899, s(41)), None);
        assert_eq!(w.stalled(s(41)), Some(Duration::ZERO));
    }
}

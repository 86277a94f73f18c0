//! The reconnect state of one link, without the socket: how long to wait
//! after a failed dial ([`Backoff::delay`]), and what to say about an
//! outage, once when it begins, a reminder while it lasts, once when it
//! ends ([`Outage`]).
//!
//! Apart from the links (`peers.rs`) so that the rules of backing off and
//! of reporting are plain functions over plain data and time, tested
//! without a network.

use std::time::{Duration, Instant};

use super::CallError;

/// Reconnect backoff: first delay, and the most it grows to.
const BACKOFF_MIN: Duration = Duration::from_millis(50);
const BACKOFF_MAX: Duration = Duration::from_secs(1);

/// Reconnect state of one link.
#[derive(Default)]
pub(super) struct Backoff {
    pub(super) failures: u32,
    pub(super) until: Option<Instant>,
    pub(super) last_error: Option<CallError>,
    /// When the first failed dial of this outage was, and when it was last
    /// reported: what the log says about a peer that stays away.
    down_since: Option<Instant>,
    reported: Option<Instant>,
}

/// How often a peer that stays unreachable is mentioned again in the log.
/// One line when it goes, one when it is back, and this reminder between:
/// a zone that is down for an hour is sixty lines, not tens of thousands.
const UNREACHABLE_REMINDER: Duration = Duration::from_secs(60);

/// What to log about a dial's outcome.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Outage {
    /// The first failure after the peer was reachable.
    Began,
    /// Still failing, and the last line about it is a reminder old.
    Continues { down_for: Duration, attempts: u32 },
    /// Reachable again after failures.
    Ended { down_for: Duration, attempts: u32 },
}

impl Backoff {
    /// Records a failed dial at `now`; what to log, if anything.
    pub(super) fn failed(&mut self, now: Instant) -> Option<Outage> {
        self.failures = self.failures.saturating_add(1);
        let since = *self.down_since.get_or_insert(now);
        match self.reported {
            None => {
                self.reported = Some(now);
                Some(Outage::Began)
            }
            Some(last) if now.duration_since(last) >= UNREACHABLE_REMINDER => {
                self.reported = Some(now);
                Some(Outage::Continues {
                    down_for: now.duration_since(since),
                    attempts: self.failures,
                })
            }
            Some(_) => None,
        }
    }

    /// Records a dial that got through at `now`; what to log, if anything.
    pub(super) fn succeeded(&mut self, now: Instant) -> Option<Outage> {
        let attempts = std::mem::take(&mut self.failures);
        self.until = None;
        self.last_error = None;
        self.reported = None;
        let since = self.down_since.take()?;
        Some(Outage::Ended {
            down_for: now.duration_since(since),
            attempts,
        })
    }

    pub(super) fn delay(failures: u32, random: u64) -> Duration {
        let base = BACKOFF_MIN
            .saturating_mul(1u32 << failures.min(10))
            .min(BACKOFF_MAX);
        // ±25% jitter, so the nodes of a cluster do not dial in step.
        let quarter = base.as_millis() as u64 / 4;
        let jitter = if quarter == 0 {
            0
        } else {
            random % (2 * quarter + 1)
        };
        Duration::from_millis(base.as_millis() as u64 - quarter + jitter)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_grows_to_a_second_with_jitter() {
        let d0 = Backoff::delay(0, 0);
        assert!(d0 >= Duration::from_millis(37) && d0 <= Duration::from_millis(63));
        for r in [0u64, 1, 999, u64::MAX] {
            let d = Backoff::delay(30, r);
            assert!(
                d >= Duration::from_millis(750) && d <= Duration::from_millis(1250),
                "{d:?}"
            );
        }
        assert!(Backoff::delay(3, 5) > Backoff::delay(1, 5));
    }

    /// A peer away for three minutes, dialled every second: one line when
    /// it goes, one a minute while it stays away, one when it is back.
    #[test]
    fn an_outage_is_told_once_reminded_each_minute_and_ended_once() {
        let start = Instant::now();
        let mut b = Backoff::default();
        let mut told = Vec::new();
        for s in 0..180u64 {
            if let Some(o) = b.failed(start + Duration::from_secs(s)) {
                told.push((s, o));
            }
        }
        let ended = b.succeeded(start + Duration::from_secs(180));
        assert_eq!(told.len(), 3, "{told:?}");
        assert_eq!(told[0], (0, Outage::Began));
        assert_eq!(
            told[1],
            (
                60,
                Outage::Continues {
                    down_for: Duration::from_secs(60),
                    attempts: 61
                }
            )
        );
        assert_eq!(told[2].0, 120);
        assert_eq!(
            ended,
            Some(Outage::Ended {
                down_for: Duration::from_secs(180),
                attempts: 180
            })
        );
        // The next outage is told again from its start; a success with no
        // outage before it says nothing.
        assert_eq!(b.succeeded(start + Duration::from_secs(181)), None);
        assert_eq!(
            b.failed(start + Duration::from_secs(182)),
            Some(Outage::Began)
        );
    }
}

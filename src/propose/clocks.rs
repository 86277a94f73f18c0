//! Which clock readings the leader stamps an entry with.
//!
//! Every observation carries the clock of the node that received it. The
//! leader keeps each voter's newest reading and stamps the next entry from
//! its own clock and the fresh readings of the others
//! ([`firstseen_store::window::leader_stamp`]), so that one wrong clock,
//! the leader's included, cannot move the window. Pure: the caller passes
//! the time.

use std::collections::BTreeMap;
use std::time::Duration;

// tokio's clock, which is std's in a node, and the simulated one in a
// simulation: freshness is measured in the time the node lives in.
use tokio::time::Instant;

use firstseen_store::Observation;

/// A reading older than this is not evidence of the node's clock now.
pub const FRESH: Duration = Duration::from_secs(10);

/// The latest clock reading of each node, from the observations this leader
/// commits.
#[derive(Default)]
pub struct Clocks {
    /// Node → (its latest reading, when this leader got it).
    latest: BTreeMap<u64, (u64, Instant)>,
    /// This node's last stamp, and when it made it.
    last_stamp: Option<(u64, Instant)>,
    /// The window clock as this node last saw it change, and when.
    window_seen: Option<(u64, Instant)>,
}

impl Clocks {
    /// Records each node's newest reading in these observations, replacing
    /// what it said before even when that was later.
    ///
    /// Why replace: a node whose clock jumped a day ahead and back would
    /// otherwise keep its jumped reading here (no honest reading beats it)
    /// for as long as it counts as fresh. A second node's skew within those
    /// 10 s then made two of three readings wrong, the median jumped an
    /// hour, and the window expired every key at once: duplicates in Pulsar
    /// (nemesis seed 21, a one-day jump on node 3 followed 6 s later by a
    /// one-hour skew on node 2).
    pub fn saw(&mut self, observations: &[Observation], now: Instant) {
        let mut newest = BTreeMap::<u64, u64>::new();
        for o in observations {
            let e = newest.entry(o.node).or_insert(o.received_ms);
            *e = (*e).max(o.received_ms);
        }
        for (node, ms) in newest {
            self.latest.insert(node, (ms, now));
        }
    }

    /// Readings of the voters other than `me` that are recent enough.
    pub fn fresh(&self, voters: &[u64], me: u64, now: Instant) -> Vec<u64> {
        voters
            .iter()
            .filter(|v| **v != me)
            .filter_map(|v| self.latest.get(v))
            .filter(|(_, at)| now.saturating_duration_since(*at) < FRESH)
            .map(|(ms, _)| *ms)
            .collect()
    }

    /// Notes the window clock as this node's state machine holds it now.
    /// Called on every node, leader or not, a few times a second: a node
    /// that becomes leader then counts the time since it saw the last stamp
    /// applied, not since its own first stamp, so a leader change holds
    /// the window clock back by a fraction of a second instead of by the
    /// whole election (`window::leader_stamp` says why it may never count
    /// more).
    pub fn window_is(&mut self, window_clock_ms: u64, now: Instant) {
        if self
            .window_seen
            .is_none_or(|(seen, _)| seen != window_clock_ms)
        {
            self.window_seen = Some((window_clock_ms, now));
        }
    }

    /// The stamp for the next entry on the leader `me`, whose own clock
    /// reads `own_ms`, among `voters`.
    pub fn stamp(
        &mut self,
        voters: &[u64],
        me: u64,
        own_ms: u64,
        window_clock_ms: u64,
        now: Instant,
    ) -> u64 {
        let fresh = self.fresh(voters, me, now);
        self.window_is(window_clock_ms, now);
        let elapsed = self.elapsed(window_clock_ms, now);
        let stamp = firstseen_store::window::leader_stamp(
            own_ms,
            &fresh,
            voters.len().max(1),
            window_clock_ms,
            elapsed,
        );
        self.last_stamp = Some((stamp, now));
        stamp
    }

    /// How far past the window clock the time surely is now, by this node's
    /// monotonic clock: how far the next stamp may move it.
    ///
    /// Two lower bounds, and the larger: the time since this node saw the
    /// window clock take its value (it took it no later than that), and its
    /// own last stamp plus the time since. Why not the time since its own
    /// last stamp alone, added to the window clock: other leaders move the
    /// window clock meanwhile, and their stamps already count that time. A
    /// node that stamped once as a stale leader on restarting, then led
    /// again 2.7 s later with no fresh readings, counted those 2.7 s on top
    /// of the 1.2 s its successor had already stamped: the window clock ran
    /// ahead of every clock (whole-cluster simulation, seed 5000061).
    fn elapsed(&self, window_clock_ms: u64, now: Instant) -> u64 {
        let since = |t: Instant| now.saturating_duration_since(t).as_millis() as u64;
        let by_window = self.window_seen.map_or(0, |(_, t)| since(t));
        let by_own = self.last_stamp.map_or(0, |(stamp, t)| {
            stamp
                .saturating_add(since(t))
                .saturating_sub(window_clock_ms)
        });
        by_window.max(by_own)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::propose::tests::seen;
    use firstseen_store::window::leader_stamp;

    /// Seed 21's schedule, replayed on the leader (node 1): node 3's clock
    /// jumps a day ahead and back, then node 2's skews an hour ahead within
    /// the freshness horizon. Only one clock is wrong at a time, so the
    /// stamp must stay near the true time.
    #[test]
    fn a_clock_that_jumped_back_is_not_remembered_ahead() {
        const DAY: u64 = 86_400_000;
        const HOUR: u64 = 3_600_000;
        let t0 = 1_000_000_000_000;
        let start = Instant::now();
        let mut clocks = Clocks::default();
        clocks.saw(&[seen(3, t0 + DAY)], start);
        clocks.saw(&[seen(3, t0 + 5_000)], start + Duration::from_secs(5));
        clocks.saw(
            &[seen(2, t0 + 6_000 + HOUR)],
            start + Duration::from_secs(6),
        );
        let now = start + Duration::from_secs(6);
        let fresh = clocks.fresh(&[1, 2, 3], 1, now);
        let stamp = leader_stamp(t0 + 6_000, &fresh, 3, t0, 0);
        assert!(
            stamp < t0 + 60_000,
            "stamped {} s ahead",
            (stamp - t0) / 1000
        );
    }

    /// Seed 5000061 of the whole-cluster simulation, on node 3: a stamp at
    /// 7.26 s (on restarting, a stale leader for a moment); node 2 leads and
    /// moves the window clock to 8.71 s; node 3 leads again at 9.96 s with
    /// nobody's fresh readings. The stamp must not pass 9.96 s (it was
    /// 11.41 s).
    #[test]
    fn time_another_leader_already_stamped_is_not_counted_twice() {
        let t0 = 1_000_000_000_000;
        let start = Instant::now();
        let at = |ms: u64| start + Duration::from_millis(ms);
        let mut clocks = Clocks::default();
        // Its own clock is an hour behind: the stamp falls back on the
        // window clock.
        let first = clocks.stamp(&[1, 2, 3], 3, t0 - 3_600_000, t0 + 7_200, at(7_257));
        assert_eq!(first, t0 + 7_200);
        // Node 2's stamps move the window clock meanwhile.
        let later = clocks.stamp(&[1, 2, 3], 3, t0 - 3_600_000, t0 + 8_713, at(9_958));
        assert!(
            later <= t0 + 9_958,
            "stamped {} ms ahead of the true time",
            later - (t0 + 9_958)
        );
        // And it still moves on by its own monotonic clock.
        assert!(later >= t0 + 8_713 + 1_000, "stamped {later}");
    }

    /// Soak seed 777001: node 2's clock and then node 1's jumped ahead, two
    /// of three wrong at once, and the median of the readings with them.
    /// Each stamp may move the window clock only by the time that passed.
    #[test]
    fn two_clocks_a_day_ahead_move_the_window_only_by_real_time() {
        const DAY: u64 = 86_400_000;
        let t0 = 1_000_000_000_000;
        let start = Instant::now();
        let at = |ms: u64| start + Duration::from_millis(ms);
        let mut clocks = Clocks::default();
        clocks.window_is(t0, at(0));
        clocks.saw(&[seen(2, t0 + DAY + 100)], at(100));
        let first = clocks.stamp(&[1, 2, 3], 1, t0 + DAY + 100, t0, at(100));
        assert_eq!(first, t0 + 100);
        clocks.saw(&[seen(2, t0 + DAY + 600)], at(600));
        let second = clocks.stamp(&[1, 2, 3], 1, t0 + DAY + 600, first, at(600));
        assert_eq!(second, t0 + 600);
    }

    /// A follower that saw the window clock applied, then leads: it counts
    /// from when it saw it, not from its first stamp.
    #[test]
    fn a_new_leader_counts_from_the_last_stamp_it_saw_applied() {
        let t0 = 1_000_000_000_000;
        let start = Instant::now();
        let at = |ms: u64| start + Duration::from_millis(ms);
        let mut clocks = Clocks::default();
        clocks.window_is(t0, at(0));
        // Elected 1.5 s later; every clock is right.
        clocks.saw(&[seen(2, t0 + 1_500)], at(1_500));
        let stamp = clocks.stamp(&[1, 2, 3], 1, t0 + 1_500, t0, at(1_500));
        assert_eq!(stamp, t0 + 1_500);
    }

    #[test]
    fn readings_older_than_the_horizon_do_not_count() {
        let start = Instant::now();
        let mut clocks = Clocks::default();
        clocks.saw(&[seen(2, 5), seen(2, 9), seen(3, 7)], start);
        assert_eq!(clocks.fresh(&[1, 2, 3], 1, start), vec![9, 7]);
        assert!(clocks.fresh(&[1, 2, 3], 1, start + FRESH).is_empty());
    }
}

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
    last_stamp: Option<Instant>,
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
        let elapsed = self
            .last_stamp
            .map_or(0, |t| now.saturating_duration_since(t).as_millis() as u64);
        self.last_stamp = Some(now);
        firstseen_store::window::leader_stamp(
            own_ms,
            &fresh,
            voters.len().max(1),
            window_clock_ms,
            elapsed,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use firstseen_store::window::leader_stamp;

    fn seen(node: u64, received_ms: u64) -> Observation {
        Observation {
            key: [0; 32],
            mqtt_topic: "t".into(),
            pulsar_topic: "p".into(),
            payload: vec![],
            qos: 1,
            retain: false,
            node,
            received_ms,
        }
    }

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

    #[test]
    fn readings_older_than_the_horizon_do_not_count() {
        let start = Instant::now();
        let mut clocks = Clocks::default();
        clocks.saw(&[seen(2, 5), seen(2, 9), seen(3, 7)], start);
        assert_eq!(clocks.fresh(&[1, 2, 3], 1, start), vec![9, 7]);
        assert!(clocks.fresh(&[1, 2, 3], 1, start + FRESH).is_empty());
    }
}

//! Safety does not depend on clocks (design.md): only the expiry of the
//! dedup window reads time, from stamps the leader puts in the log. Nodes
//! run under libfaketime here, and a leader's wall clock jumps a day ahead
//! while a follower's goes an hour back. Results are read back from Pulsar
//! with the official client.

mod common;

use std::time::Duration;

use common::cluster::TestCluster;
use common::*;

const DAY_MS: u64 = 86_400_000;

/// Replays half the capture, moves the clocks of the nodes in `offsets`
/// (node, offset written to its libfaketime file), checks that each node's
/// clock did move by reading it from `/status`, replays the whole capture,
/// and checks that nothing expired early and Pulsar holds each message
/// exactly once.
fn replay_across_clock_change(name: &str, offsets: impl Fn(u64) -> Vec<(u64, i64)>) {
    let Some(pulsar) = shared_pulsar(name) else {
        return;
    };
    let clocks = tempfile::TempDir::new().unwrap();
    let clock = |id: u64| clocks.path().join(format!("clock-{id}"));
    let mqtt = Mosquitto::start();
    let topic = unique_topic("clock-jump");
    let mut c = TestCluster::start(&mqtt, &pulsar, &topic, 3, |s| {
        s.env = faketime_env(&clock(s.id()));
    });
    c.wait_ready();
    let leader = c.wait_leader(None, Duration::from_secs(30));
    replay(mqtt.port, &["--limit", "2500", "--pace", "max"]);
    let first = hfp_pairs(Some(2500)).len() as u64;
    c.node(leader)
        .wait_published(first, Duration::from_secs(60));

    let offsets = offsets(leader);
    for (id, secs) in &offsets {
        std::fs::write(clock(*id), format!("{secs:+}\n")).unwrap();
    }
    // libfaketime reads the file again within a second; the node's clock,
    // as its /status reports it, says when it has.
    for (id, secs) in &offsets {
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        loop {
            let s = c.node(*id).status();
            let off = s.map(|s| s.clock_ms as i64 - firstseen::now_ms() as i64);
            if off.is_some_and(|off| (off - secs * 1_000).abs() < 60_000) {
                break;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "node {id}'s clock did not move by {secs} s: it is off by {off:?} ms"
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }
    replay(mqtt.port, &["--pace", "max"]);
    c.node(leader)
        .wait_published(HFP_DISTINCT, Duration::from_secs(120));
    for id in 1..=3 {
        let s = c.node(id).status().unwrap();
        eprintln!(
            "node {id} after the change: its clock {} ms off, window clock {} ms behind it, expired {}, window keys {}",
            s.clock_ms as i64 - firstseen::now_ms() as i64,
            s.clock_ms as i64 - s.totals.clock_ms as i64,
            s.totals.expired,
            s.totals.window_keys
        );
        assert_eq!(s.totals.expired, 0, "node {id}: keys expired early");
        // The window clock never runs ahead of real time.
        assert!(
            s.totals.clock_ms <= firstseen::now_ms() + 5_000,
            "node {id}: the window clock is {} ms ahead of the true time",
            s.totals.clock_ms - firstseen::now_ms()
        );
    }
    assert_exactly_once(&read_back(&pulsar, &topic), &hfp_pairs(None));
    let (code, report) = verify(&pulsar, &topic, Some(HFP_DISTINCT), &c.secret_file());
    assert_eq!(code, 0, "{report}");
}

/// The leader's clock jumps a day ahead and a follower's an hour back, and
/// the whole capture is replayed again: nothing is expired early, so the
/// copies of what was already published stay duplicates, and Pulsar holds
/// every message exactly once. Before the leader stamped with the median of
/// the members' clocks, the jump expired the whole window and the replay
/// published its first half a second time.
#[test]
fn a_leader_clock_a_day_ahead_expires_nothing_early() {
    replay_across_clock_change(
        "a_leader_clock_a_day_ahead_expires_nothing_early",
        |leader| {
            let follower = if leader == 3 { 2 } else { 3 };
            vec![(leader, (DAY_MS / 1_000) as i64), (follower, -3_600)]
        },
    );
}

/// Two of three clocks a day ahead at once, the leader's among them: the
/// median of the readings is then a day ahead. Before the window clock was
/// held to the leader's monotonic clock, this expired the whole window and
/// the replay published its first half again (soak seeds 777001 and 4242
/// found it on the real brokers).
#[test]
fn two_clocks_a_day_ahead_at_once_expire_nothing_early() {
    replay_across_clock_change(
        "two_clocks_a_day_ahead_at_once_expire_nothing_early",
        |leader| {
            let follower = if leader == 3 { 2 } else { 3 };
            vec![
                (leader, (DAY_MS / 1_000) as i64),
                (follower, (DAY_MS / 1_000) as i64),
            ]
        },
    );
}

//! Safety does not depend on clocks (design.md): only the expiry of the
//! dedup window reads time, from stamps the leader puts in the log. Nodes
//! run under libfaketime here, and a leader's wall clock jumps a day ahead
//! while a follower's goes an hour back. Results are read back from Pulsar
//! with the official client.

mod common;

use std::time::Duration;

use common::cluster::TestCluster;
use common::*;

/// The leader's clock jumps a day ahead and a follower's an hour back, and
/// the whole capture is replayed again: nothing is expired early, so the
/// copies of what was already published stay duplicates, and Pulsar holds
/// every message exactly once. Before the leader stamped with the median of
/// the members' clocks, the jump expired the whole window and the replay
/// published its first half a second time.
#[test]
fn a_leader_clock_a_day_ahead_expires_nothing_early() {
    let Some(pulsar) = shared_pulsar("a_leader_clock_a_day_ahead_expires_nothing_early") else {
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
    let follower = if leader == 3 { 2 } else { 3 };
    replay(mqtt.port, &["--limit", "2500", "--pace", "max"]);
    let first = hfp_pairs(Some(2500)).len() as u64;
    c.node(leader)
        .wait_published(first, Duration::from_secs(60));

    std::fs::write(clock(leader), "+86400\n").unwrap();
    std::fs::write(clock(follower), "-3600\n").unwrap();
    // libfaketime reads the file again within a second.
    std::thread::sleep(Duration::from_millis(1_500));
    replay(mqtt.port, &["--pace", "max"]);
    c.node(leader)
        .wait_published(HFP_DISTINCT, Duration::from_secs(120));
    let s = c.node(leader).status().unwrap();
    eprintln!(
        "after the jump: window clock {}, expired {}, window keys {}",
        s.totals.clock_ms, s.totals.expired, s.totals.window_keys
    );
    assert_eq!(s.totals.expired, 0, "keys expired early: {s:?}");
    assert_exactly_once(&read_back(&pulsar, &topic), &hfp_pairs(None));
    let (code, report) = verify(&pulsar, &topic, Some(HFP_DISTINCT));
    assert_eq!(code, 0, "{report}");
}

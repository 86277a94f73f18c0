//! One Pulsar topic, two spellings (issue 49 item 1), on the real brokers:
//! a route names its topic `fs-spell-N`, every node's file then names it
//! `persistent://public/default/fs-spell-N` and gets SIGHUP, and more
//! messages follow with a leader kill among them. Before cluster level 3
//! the state kept the two spellings as two topics: two publishers fought
//! over the exclusive producer, and one took the other's proven messages as
//! its tail and skipped its own. Read back with the official Pulsar client:
//! every acked key is in the topic once, numbered without gaps.

mod common;

use std::time::Duration;

use common::cluster::TestCluster;
use common::*;
use firstseen::cluster::config::UpgradeMode;

/// The first part of the capture, carried under the short name.
const FIRST: usize = 1_500;
/// Where the second part ends.
const ALL: usize = 3_000;

/// What the state says of the topic under any of its spellings: (published,
/// backlog) summed over them.
fn progress(node: &Node, full: &str) -> Option<(u64, u64)> {
    let s = node.status()?;
    let mut out = (0, 0);
    for t in s
        .topics
        .iter()
        .filter(|t| firstseen_store::topic::same(&t.topic, full))
    {
        out.0 += t.published_seq;
        out.1 += t.backlog;
    }
    Some(out)
}

/// Runs the case; `manual` holds the cluster at level 1 while the
/// short name carries the first part, and raises it (`firstseen upgrade`)
/// before the reload, so the rise moves the topic's state to its full name.
fn spelling_changes_on_sighup(test: &str, manual: bool) {
    let Some(pulsar) = shared_pulsar(test) else {
        return;
    };
    let mqtt = Mosquitto::start();
    let full = unique_topic("fs-spell");
    let short = full
        .strip_prefix("persistent://public/default/")
        .unwrap()
        .to_string();
    let mut c = TestCluster::start(&mqtt, &pulsar, &short, 3, |spec| {
        if manual {
            spec.config.cluster.upgrade = UpgradeMode::Manual;
        }
    });
    c.wait_ready();
    let level = if manual {
        firstseen_store::level::BASE
    } else {
        firstseen_store::level::SUPPORTED
    };
    for id in 1..=3 {
        wait_until(Duration::from_secs(30), "the cluster's level", || {
            c.node(id)
                .status()
                .is_some_and(|s| s.level.cluster == level)
        });
    }
    replay(mqtt.port, &["--limit", &FIRST.to_string(), "--pace", "max"]);
    let first = hfp_pairs(Some(FIRST)).len() as u64;
    let leader = c.wait_leader(None, Duration::from_secs(30));
    wait_until(Duration::from_secs(60), "the first part published", || {
        progress(c.node(leader), &full) == Some((first, 0))
    });

    if manual {
        c.upgrade_via(leader);
        for id in 1..=3 {
            wait_until(Duration::from_secs(30), "the level raised", || {
                c.node(id)
                    .status()
                    .is_some_and(|s| s.level.cluster == firstseen_store::level::SUPPORTED)
            });
        }
    }

    // Every node's file names the topic in full; each reloads it.
    for id in 1..=3 {
        let n = c.node(id);
        n.spec.config.routes.last_mut().unwrap().pulsar_topic = full.clone();
        n.write_config();
        n.signal("-HUP");
        wait_until(Duration::from_secs(10), "the reload", || {
            let log = n.log_tail(200);
            log.contains("config reloaded (SIGHUP)") || log.contains("config not reloaded")
        });
        let log = n.log_tail(200);
        assert!(
            log.contains("config reloaded (SIGHUP)"),
            "node {id} refused the new spelling at level {}: {log}",
            firstseen_store::level::SUPPORTED
        );
    }

    // The rest of the capture, with the leader killed part-way (once it
    // acked a few hundred copies of it: what it published is the point).
    let old = c.wait_leader(None, Duration::from_secs(30));
    let mut rest = replay_cmd(
        mqtt.port,
        &[
            "--skip",
            &FIRST.to_string(),
            "--limit",
            &ALL.to_string(),
            "--pace",
            "max",
        ],
    )
    .spawn()
    .unwrap();
    wait_until(Duration::from_secs(30), "part of the rest acked", || {
        c.node(old).metric("firstseen_acks_total") >= (FIRST + 300) as f64
    });
    c.node(old).kill9();
    let survivors: Vec<u64> = (1..=3).filter(|i| *i != old).collect();
    let new = c.wait_leader_among(&survivors, Some(old), Duration::from_secs(30));
    assert!(rest.wait().unwrap().success(), "replay.py failed");
    let want = hfp_pairs(Some(ALL));
    let all = want.len() as u64;
    // Each survivor received every line of the capture, and acks each
    // copy once its entry committed.
    wait_until(Duration::from_secs(60), "every copy acked", || {
        survivors
            .iter()
            .all(|id| c.node(*id).metric("firstseen_acks_total") >= ALL as f64)
    });
    // What the topic holds is the verdict: a publisher that cannot take
    // the topic (another spelling's holds it) leaves a backlog, and the
    // read-back names what is missing.
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let mut last = None;
    while std::time::Instant::now() < deadline {
        last = progress(c.node(new), &full);
        if last.is_some_and(|(_, backlog)| backlog == 0) {
            break;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    eprintln!("spelling: (published, backlog) over every spelling: {last:?}");
    let read = read_back(&pulsar, &full);
    eprintln!(
        "spelling: {} messages read, {} distinct keys, {} with copies, {} expected",
        read.count, read.distinct_keys, read.keys_with_copies, all
    );
    assert_exactly_once(&read, &want);
    // The state names one topic, by its full name.
    let topics: Vec<String> = c
        .node(new)
        .status()
        .unwrap()
        .topics
        .into_iter()
        .map(|t| t.topic)
        .collect();
    assert_eq!(topics, vec![full.clone()]);
}

#[test]
fn a_route_respelled_on_sighup_keeps_every_message_once() {
    spelling_changes_on_sighup(
        "a_route_respelled_on_sighup_keeps_every_message_once",
        false,
    );
}

/// The first part goes in below level 3 under the short name; the rise
/// moves it, and the reload then changes the spelling.
#[test]
fn a_short_name_from_before_level_three_moves_to_the_full_name() {
    spelling_changes_on_sighup(
        "a_short_name_from_before_level_three_moves_to_the_full_name",
        true,
    );
}

/// Below level 3 a node restarted with its topic respelled is refused, as
/// a reload is, before it starts anything (a review found only the reload
/// checked it: the restarted node would have proposed the new spelling,
/// and the state held one topic twice). With the old spelling back it
/// starts.
#[test]
fn a_restart_that_respells_a_topic_below_level_three_is_refused() {
    let Some(pulsar) =
        shared_pulsar("a_restart_that_respells_a_topic_below_level_three_is_refused")
    else {
        return;
    };
    let mqtt = Mosquitto::start();
    let full = unique_topic("fs-restart");
    let short = full
        .strip_prefix("persistent://public/default/")
        .unwrap()
        .to_string();
    let mut c = TestCluster::start(&mqtt, &pulsar, &short, 3, |spec| {
        spec.config.cluster.upgrade = UpgradeMode::Manual;
    });
    c.wait_ready();
    replay(mqtt.port, &["--limit", "200", "--pace", "max"]);
    let first = hfp_pairs(Some(200)).len() as u64;
    let leader = c.wait_leader(None, Duration::from_secs(30));
    wait_until(Duration::from_secs(60), "the first part published", || {
        progress(c.node(leader), &full) == Some((first, 0))
    });
    let other = (1..=3).find(|i| *i != leader).unwrap();
    // Its own state has the topic under the short name once it applied the
    // first part (the leader published it, so every member committed it).
    wait_until(Duration::from_secs(30), "the follower applied it", || {
        progress(c.node(other), &full).is_some_and(|(p, _)| p == first)
    });
    let n = c.node(other);
    assert!(n.terminate(Duration::from_secs(20)).is_some());
    n.spec.config.routes.last_mut().unwrap().pulsar_topic = full.clone();
    n.write_config();
    let (status, log) = n.restart_expecting_refusal(Duration::from_secs(30));
    assert!(!status.success());
    assert!(
        log.contains("spelled another way") && log.contains(&short),
        "the refusal does not say why: {log}"
    );
    n.spec.config.routes.last_mut().unwrap().pulsar_topic = short.clone();
    n.write_config();
    n.restart();
}

//! A node stops within `node.shutdown_timeout_secs` when asked, whatever the
//! cluster's state (G7): without a quorum, with Pulsar down, under load. A
//! second signal stops it at once. What it had not committed stays with the
//! broker and reaches Pulsar through the others, exactly once.

mod common;

use std::time::Duration;

use common::cluster::TestCluster;
use common::*;

const BOUND_SECS: u64 = 4;

fn bounded(s: &mut NodeSpec) {
    s.config.node.shutdown_timeout_secs = BOUND_SECS;
}

/// The bound, plus what process exit and the test's polling add.
fn limit() -> Duration {
    Duration::from_secs(BOUND_SECS + 3)
}

/// A leader that lost both followers, with a batch waiting for a commit that
/// cannot come, stops on SIGTERM within the bound and exits 0.
#[test]
fn a_node_without_quorum_stops_within_the_bound() {
    let Some(pulsar) = shared_pulsar("a_node_without_quorum_stops_within_the_bound") else {
        return;
    };
    let mqtt = Mosquitto::start();
    let topic = unique_topic("no-quorum-stop");
    let mut c = TestCluster::start(&mqtt, &pulsar, &topic, 3, bounded);
    c.wait_ready();
    let leader = c.wait_leader(None, Duration::from_secs(30));
    for id in (1..=3).filter(|i| *i != leader) {
        c.node(id).kill9();
    }
    // Messages that can no longer be committed: the batcher is stuck on them.
    replay(mqtt.port, &["--limit", "200", "--pace", "max"]);
    wait_until(
        Duration::from_secs(10),
        "the leader to receive them",
        || {
            c.node(leader)
                .status()
                .is_some_and(|s| s.upstreams.first().is_some_and(|u| u.received >= 200))
        },
    );
    let (status, took) = c.node(leader).terminate(limit()).unwrap_or_else(|| {
        panic!(
            "node {leader} without quorum did not stop within {:?}",
            limit()
        )
    });
    eprintln!("node {leader} without quorum stopped in {took:?} ({status})");
    assert!(status.success(), "{status}");
    assert!(took <= limit());
}

/// Pulsar unreachable and the feed arriving: a node stops within the bound.
#[test]
fn a_node_with_pulsar_down_under_load_stops_within_the_bound() {
    let mqtt = Mosquitto::start();
    // A Pulsar that is down: nothing listens on this port.
    let down = Pulsar {
        url: format!("pulsar://127.0.0.1:{}", free_port()),
        admin_url: format!("http://127.0.0.1:{}", free_port()),
    };
    let mut spec = NodeSpec::new(&mqtt, &down, &unique_topic("pulsar-down-stop"));
    bounded(&mut spec);
    let mut node = Node::start(spec);
    node.wait_ready();
    let load = replay_cmd(mqtt.port, &["--pace", "1500"]).spawn().unwrap();
    wait_until(Duration::from_secs(20), "load to arrive", || {
        node.metric("firstseen_acks_total") > 500.0
    });
    let (status, took) = node
        .terminate(limit())
        .unwrap_or_else(|| panic!("node with Pulsar down did not stop within {:?}", limit()));
    eprintln!("node with Pulsar down stopped under load in {took:?} ({status})");
    assert!(status.success(), "{status}");
    let _ = load.wait_with_output();
}

/// Under load, the leader of a healthy cluster stops within the bound; the
/// others carry on and Pulsar holds every message exactly once.
#[test]
fn the_leader_stops_under_load_within_the_bound_and_nothing_is_lost() {
    let Some(pulsar) =
        shared_pulsar("the_leader_stops_under_load_within_the_bound_and_nothing_is_lost")
    else {
        return;
    };
    let mqtt = Mosquitto::start();
    let topic = unique_topic("stop-under-load");
    let mut c = TestCluster::start(&mqtt, &pulsar, &topic, 3, bounded);
    c.wait_ready();
    let leader = c.wait_leader(None, Duration::from_secs(30));
    let load = replay_cmd(mqtt.port, &["--pace", "1500", "--dup-every", "7"])
        .spawn()
        .unwrap();
    wait_until(Duration::from_secs(30), "the leader to ack some", || {
        c.node(leader).metric("firstseen_acks_total") > 1_000.0
    });
    let (status, took) = c
        .node(leader)
        .terminate(limit())
        .unwrap_or_else(|| panic!("the leader did not stop under load within {:?}", limit()));
    eprintln!("leader {leader} stopped under load in {took:?} ({status})");
    assert!(status.success(), "{status}");
    let out = load.wait_with_output().unwrap();
    assert!(out.status.success());
    let rest: Vec<u64> = (1..=3).filter(|i| *i != leader).collect();
    let new = c.wait_leader_among(&rest, Some(leader), Duration::from_secs(30));
    c.node(new)
        .wait_published(HFP_DISTINCT, Duration::from_secs(120));
    assert_exactly_once(&read_back(&pulsar, &topic), &hfp_pairs(None));
}

/// A task a node cannot run without, here its batcher, dies while the node
/// runs (debug builds plant the panic: `FIRSTSEEN_TEST_PANIC`). The node must
/// stop with status 2 and a line naming the task, not run on as a node that
/// holds its upstream session and never acks again. Restarted, as its
/// supervisor would, it catches up, and Pulsar holds every message once.
#[test]
fn a_node_whose_batcher_dies_stops_for_its_supervisor() {
    let Some(pulsar) = shared_pulsar("a_node_whose_batcher_dies_stops_for_its_supervisor") else {
        return;
    };
    let cue_dir = tempfile::tempdir().unwrap();
    let cue = cue_dir.path().join("now");
    let mqtt = Mosquitto::start();
    let topic = unique_topic("task-dies");
    let mut c = TestCluster::start(&mqtt, &pulsar, &topic, 3, |s| {
        bounded(s);
        if s.id() == 3 {
            s.env.push((
                "FIRSTSEEN_TEST_PANIC".into(),
                format!("batcher:{}", cue.display()),
            ));
        }
    });
    c.wait_ready();
    let load = replay_cmd(mqtt.port, &["--pace", "1000"]).spawn().unwrap();
    wait_until(Duration::from_secs(30), "node 3 to ack some", || {
        c.node(3).metric("firstseen_acks_total") > 200.0
    });
    std::fs::write(&cue, b"").unwrap();
    let Some((status, after)) = c.node(3).wait_exit(Duration::from_secs(30)) else {
        panic!(
            "node 3 ran on for 30 s after its batcher died:\n{}",
            c.node(3).log_tail(20)
        );
    };
    let log = std::fs::read_to_string(c.node(3).log_path()).unwrap_or_default();
    // The lines that say why it stopped (a panic's backtrace follows them).
    let why: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("stopping the node") || l.contains("panicked"))
        .collect();
    assert_eq!(status.code(), Some(2), "{why:#?}");
    assert!(
        log.contains("task `batcher` panicked: planted by FIRSTSEEN_TEST_PANIC"),
        "the report names another task: {why:#?}"
    );
    eprintln!("node 3 exited with {status} {after:?} after its batcher died");

    c.node(3).spec.env.clear();
    c.node(3).restart();
    c.node(3).wait_ready();
    let out = load.wait_with_output().unwrap();
    assert!(out.status.success());
    let leader = c.wait_leader(None, Duration::from_secs(30));
    c.node(leader)
        .wait_published(HFP_DISTINCT, Duration::from_secs(120));
    assert_exactly_once(&read_back(&pulsar, &topic), &hfp_pairs(None));
    let (code, report) = verify(&pulsar, &topic, Some(HFP_DISTINCT), &c.secret_file());
    assert_eq!(code, 0, "{report}");
}

/// With a long bound and no quorum, a second SIGTERM stops the node at once.
#[test]
fn a_second_signal_stops_at_once() {
    let Some(pulsar) = shared_pulsar("a_second_signal_stops_at_once") else {
        return;
    };
    let mqtt = Mosquitto::start();
    let topic = unique_topic("second-signal");
    let mut c = TestCluster::start(&mqtt, &pulsar, &topic, 3, |s| {
        s.config.node.shutdown_timeout_secs = 120;
    });
    c.wait_ready();
    let leader = c.wait_leader(None, Duration::from_secs(30));
    for id in (1..=3).filter(|i| *i != leader) {
        c.node(id).kill9();
    }
    replay(mqtt.port, &["--limit", "100", "--pace", "max"]);
    let pid = c.node(leader).pid().unwrap().to_string();
    let term = || {
        std::process::Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .unwrap()
    };
    term();
    // The first signal began a shutdown that waits for a commit; the node
    // is still there, inside its 120 s bound.
    std::thread::sleep(Duration::from_millis(500));
    assert!(
        std::path::Path::new(&format!("/proc/{pid}")).exists(),
        "the node ended on the first signal; nothing to test"
    );
    let started = std::time::Instant::now();
    term();
    let (status, took) = c
        .node(leader)
        .wait_exit(Duration::from_secs(3))
        .expect("the second signal stops the node at once");
    assert!(took < Duration::from_secs(3));
    eprintln!(
        "second signal: stopped {} ms later ({status})",
        started.elapsed().as_millis()
    );
    assert!(
        !status.success(),
        "a forced stop does not claim a clean exit"
    );
}

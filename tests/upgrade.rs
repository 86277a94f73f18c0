//! A rolling upgrade from the previous release, on the real brokers: three
//! nodes of it under load, replaced one by one with this build, one taken
//! back to the previous release and forward again, then the cluster level
//! raised. Every message in Pulsar once, commits never stopped longer than
//! G7's bound, every node in the group after every step.
//!
//! Needs the previous release's binary: `scripts/upgrade.sh` builds it from
//! git history (the commit it names) and runs this test with
//! `FIRSTSEEN_PREVIOUS_BIN` set. Without it the test is skipped, visibly.

mod common;

use std::io::{Read, Write};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::cluster::TestCluster;
use common::*;
use firstseen::cluster::config::UpgradeMode;

/// G7: commits resume within 5 s of any single fault (a node replaced is
/// one at a time).
const G7: Duration = Duration::from_secs(5);

/// `last_applied` of the node whose HTTP API is on `port`, read raw (the
/// previous release answers the same field).
fn applied(port: u16) -> Option<u64> {
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_millis(500))).ok()?;
    write!(s, "GET /status HTTP/1.0\r\nHost: localhost\r\n\r\n").ok()?;
    let mut buf = String::new();
    s.read_to_string(&mut buf).ok()?;
    let body = buf.split("\r\n\r\n").nth(1)?;
    let v: serde_json::Value = serde_json::from_str(body).ok()?;
    v["last_applied"].as_u64()
}

/// Samples the highest applied index of the nodes every 50 ms until
/// stopped: (when, index), for the longest time commits stood still.
struct Sampler {
    stop: Arc<AtomicBool>,
    samples: Arc<Mutex<Vec<(Instant, u64)>>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Sampler {
    fn start(ports: Vec<u16>) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let samples = Arc::new(Mutex::new(Vec::new()));
        let thread = {
            let (stop, samples) = (stop.clone(), samples.clone());
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    if let Some(max) = ports.iter().filter_map(|p| applied(*p)).max() {
                        samples.lock().unwrap().push((Instant::now(), max));
                    }
                    std::thread::sleep(Duration::from_millis(50));
                }
            })
        };
        Self {
            stop,
            samples,
            thread: Some(thread),
        }
    }

    /// The longest time between `from` and `to` in which the highest
    /// applied index did not move.
    fn longest_stall(&self, from: Instant, to: Instant) -> Duration {
        let s = self.samples.lock().unwrap();
        let mut longest = Duration::ZERO;
        let mut since: Option<(Instant, u64)> = None;
        for (at, index) in s.iter().filter(|(at, _)| *at >= from && *at <= to) {
            match since {
                Some((t, i)) if *index > i => {
                    longest = longest.max(at.duration_since(t));
                    since = Some((*at, *index));
                }
                None => since = Some((*at, *index)),
                _ => {}
            }
        }
        if let Some((t, _)) = since {
            longest = longest.max(to.min(s.last().map_or(to, |l| l.0)).duration_since(t));
        }
        longest
    }
}

impl Drop for Sampler {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Stops node `id`, switches it to `binary` (`None`: this build) and
/// starts it again; returns once it is ready and has applied what the
/// others have. This build runs with the level held (`manual`), so that a
/// node can still go back.
fn replace(c: &mut TestCluster, id: u64, binary: Option<PathBuf>) {
    c.node(id)
        .terminate(Duration::from_secs(30))
        .expect("stops");
    let n = c.node(id);
    n.spec.config.cluster.upgrade = if binary.is_none() {
        UpgradeMode::Manual
    } else {
        UpgradeMode::Auto
    };
    n.spec.binary = binary;
    n.restart();
    n.wait_ready();
    let others: Vec<u64> = (1..=3).filter(|o| *o != id).collect();
    wait_until(Duration::from_secs(30), "the node to catch up", || {
        let target = others
            .iter()
            .map(|o| c.nodes[(*o - 1) as usize].applied())
            .max()
            .unwrap_or(0);
        c.nodes[(id - 1) as usize].applied() + 20 >= target
    });
}

#[test]
fn a_rolling_upgrade_from_the_previous_release_keeps_every_message_once() {
    let Some(previous) = std::env::var_os("FIRSTSEEN_PREVIOUS_BIN").map(PathBuf::from) else {
        eprintln!("SKIPPED a_rolling_upgrade…: FIRSTSEEN_PREVIOUS_BIN is not set (scripts/upgrade.sh sets it)");
        return;
    };
    let Some(pulsar) =
        shared_pulsar("a_rolling_upgrade_from_the_previous_release_keeps_every_message_once")
    else {
        return;
    };
    let mqtt = Mosquitto::start();
    let topic = unique_topic("upgrade");
    let old = previous.clone();
    let mut c = TestCluster::start(&mqtt, &pulsar, &topic, 3, move |s| {
        s.binary = Some(old.clone())
    });
    c.wait_ready();
    let ports: Vec<u16> = (1..=3).map(|id| c.node(id).http_port).collect();
    let sampler = Sampler::start(ports);
    // New traffic all along: twelve passes of the capture, each moved on
    // in time, at 1,000 msg/s (about a minute).
    let load = replay_cmd(
        mqtt.port,
        &["--times", "12", "--later-passes", "--pace", "1000"],
    )
    .spawn()
    .unwrap();
    std::thread::sleep(Duration::from_secs(3));
    let leader = c.wait_leader(None, Duration::from_secs(30));
    let mut order: Vec<u64> = (1..=3).filter(|id| *id != leader).collect();
    order.push(leader);
    let mut steps: Vec<(String, Duration)> = Vec::new();
    let mut step = |c: &mut TestCluster, what: String, id: u64, binary: Option<PathBuf>| {
        let began = Instant::now();
        replace(c, id, binary);
        std::thread::sleep(Duration::from_secs(1));
        let stall = sampler.longest_stall(began, Instant::now());
        eprintln!(
            "upgrade: {what}: commits stood still at most {} ms",
            stall.as_millis()
        );
        steps.push((what, stall));
    };
    for id in &order {
        step(&mut c, format!("node {id} to this build"), *id, None);
    }
    // Every member runs this build, the level is held: one node goes back.
    let back = order[0];
    step(
        &mut c,
        format!("node {back} back to the previous release"),
        back,
        Some(previous.clone()),
    );
    step(
        &mut c,
        format!("node {back} to this build again"),
        back,
        None,
    );
    // Raised by the operator.
    let leader = c.wait_leader(None, Duration::from_secs(30));
    let began = Instant::now();
    c.upgrade_via(leader);
    for id in 1..=3 {
        wait_until(
            Duration::from_secs(30),
            "this release's level on every node",
            || {
                c.node(id)
                    .status()
                    .is_some_and(|s| s.level.cluster == firstseen_store::level::SUPPORTED)
            },
        );
    }
    std::thread::sleep(Duration::from_secs(2));
    let stall = sampler.longest_stall(began, Instant::now());
    eprintln!(
        "upgrade: the level raised: commits stood still at most {} ms",
        stall.as_millis()
    );
    steps.push(("level raised".into(), stall));

    let out = load.wait_with_output().unwrap();
    assert!(out.status.success(), "replay failed");
    let sent = parse_replay(&out.stdout);
    let leader = c.wait_leader(None, Duration::from_secs(30));
    c.node(leader)
        .wait_published(sent.distinct, Duration::from_secs(120));
    for id in 1..=3 {
        let s = c.node(id).status().unwrap();
        assert!(s.ready, "node {id}: {:?}", s.not_ready_reason);
    }
    let read = read_back(&pulsar, &topic);
    assert_eq!(read.count, sent.distinct, "every message once");
    assert_eq!(read.keys_with_copies, 0);
    let seqs: Vec<u64> = read.seqs.iter().map(|s| s.unwrap_or(0)).collect();
    assert_eq!(
        seqs,
        (1..=sent.distinct).collect::<Vec<_>>(),
        "gap-free, in order"
    );
    // Told by name: the previous release wrote no proofs.
    let (code, report) = verify_by_name(&pulsar, &topic, Some(sent.distinct));
    assert_eq!(code, 0, "{report}");
    {
        let samples = sampler.samples.lock().unwrap();
        let (first, last) = (samples.first().unwrap().1, samples.last().unwrap().1);
        eprintln!(
            "upgrade: {} samples, applied index {first} to {last}",
            samples.len()
        );
        assert!(last > first + 100, "the sampler saw commits go on");
    }
    for (what, stall) in &steps {
        assert!(*stall < G7, "{what}: commits stood still {stall:?}");
    }
}

/// A node whose data is at a cluster level its release does not know (as a
/// later release would leave it) refuses to start, saying which level and
/// what to do, and changes nothing: started again with the level it knows,
/// it runs and has lost nothing.
#[test]
fn a_node_too_old_for_the_cluster_s_level_refuses_to_start_and_says_so() {
    let Some(pulsar) =
        shared_pulsar("a_node_too_old_for_the_cluster_s_level_refuses_to_start_and_says_so")
    else {
        return;
    };
    let mqtt = Mosquitto::start();
    let topic = unique_topic("too-old");
    let mut node = Node::start(NodeSpec::new(&mqtt, &pulsar, &topic));
    node.wait_ready();
    let supported = firstseen_store::level::SUPPORTED;
    wait_until(Duration::from_secs(30), "this release's level", || {
        node.status().is_some_and(|s| s.level.cluster == supported)
    });
    replay(mqtt.port, &["--limit", "500", "--pace", "max"]);
    let want = hfp_pairs(Some(500)).len() as u64;
    node.wait_published(want, Duration::from_secs(60));
    node.terminate(Duration::from_secs(20)).expect("stops");
    let raft = node.data_dir().join("raft");
    let set_level = |level: u32| {
        let db = firstseen_store::disk::Disk::open_state(&raft).unwrap();
        let levels = firstseen_store::level::Levels {
            level,
            bare_below: 0,
        };
        db.sled()
            .open_tree("sm_meta")
            .unwrap()
            .insert(b"level", bincode::serialize(&levels).unwrap())
            .unwrap();
        db.sync().unwrap();
    };
    set_level(supported + 1);
    let (status, log) = node.restart_expecting_refusal(Duration::from_secs(30));
    assert!(!status.success());
    assert!(
        log.contains(&format!(
            "the cluster runs at level {}, and this release supports levels 1 to {supported}",
            supported + 1
        )),
        "{log}"
    );
    set_level(supported);
    node.restart();
    node.wait_ready();
    assert_eq!(node.status().unwrap().totals.window_keys, want);
    replay(mqtt.port, &["--limit", "600", "--pace", "max"]);
    node.wait_published(hfp_pairs(Some(600)).len() as u64, Duration::from_secs(60));
    assert_exactly_once(&read_back(&pulsar, &topic), &hfp_pairs(Some(600)));
}

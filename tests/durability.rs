//! G6, durable means on stable storage: nodes whose data directories live
//! on `firstseen-crashfs`, which drops every write not yet fsynced when the
//! power goes out (and tears the last one). Results are read back from
//! Pulsar with the official Python client and `firstseen verify`.
//!
//! The seed of the torn writes is printed; set FIRSTSEEN_TEST_SEED to replay
//! one.

mod common;

use std::time::Duration;

use common::cluster::TestCluster;
use common::crashfs::CrashFs;
use common::*;

fn seed() -> u64 {
    let seed = std::env::var("FIRSTSEEN_TEST_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos() as u64
        });
    eprintln!("crashfs seed {seed} (FIRSTSEEN_TEST_SEED={seed} replays it)");
    seed
}

/// A cluster whose every node keeps its data on a crashfs of its own.
fn on_crashfs(mqtt: &Mosquitto, pulsar: &Pulsar, topic: &str, disks: &[CrashFs]) -> TestCluster {
    TestCluster::start(mqtt, pulsar, topic, disks.len() as u64, |s| {
        s.data_dir = Some(disks[(s.id() - 1) as usize].mount.join("data"));
    })
}

/// The leader loses power mid-replay: SIGKILL, every write it had not
/// fsynced undone (the last one torn), restart. The others carry on, it
/// rejoins, and Pulsar holds every message exactly once.
#[test]
fn a_power_cut_of_the_leader_mid_replay_loses_nothing() {
    let Some(pulsar) = shared_pulsar("a_power_cut_of_the_leader_mid_replay_loses_nothing") else {
        return;
    };
    let seed = seed();
    let disks: Vec<CrashFs> = (0..3).map(|_| CrashFs::start()).collect();
    let mqtt = Mosquitto::start();
    let topic = unique_topic("power-one");
    let mut c = on_crashfs(&mqtt, &pulsar, &topic, &disks);
    c.wait_ready();
    let victim = c.wait_leader(None, Duration::from_secs(30));

    let replay = replay_cmd(mqtt.port, &["--pace", "1500", "--dup-every", "9"])
        .spawn()
        .unwrap();
    wait_until(
        Duration::from_secs(60),
        "part of the feed published",
        || c.node(victim).published() > 1_500,
    );
    c.node(victim).kill9();
    let lost = disks[(victim - 1) as usize].lose_power(seed);
    eprintln!("power cut of node {victim} (the leader): {lost}");
    let rest: Vec<u64> = (1..=3).filter(|i| *i != victim).collect();
    let new = c.wait_leader_among(&rest, Some(victim), Duration::from_secs(30));
    c.node(victim).restart();
    let out = replay.wait_with_output().unwrap();
    assert!(out.status.success());
    c.node(new)
        .wait_published(HFP_DISTINCT, Duration::from_secs(120));
    let target = c.node(new).applied();
    wait_until(
        Duration::from_secs(60),
        "the node that lost power to catch up",
        || c.node(victim).applied() >= target,
    );
    assert_eq!(
        c.node(victim).status().unwrap().totals.window_keys,
        HFP_DISTINCT
    );
    assert_exactly_once(&read_back(&pulsar, &topic), &hfp_pairs(None));
    let (code, report) = verify(&pulsar, &topic, Some(HFP_DISTINCT), &c.secret_file());
    assert_eq!(code, 0, "{report}");
}

/// Every node loses power at once, mid-replay, after each of them has acked
/// upstream (so the broker has forgotten those messages for that node). On
/// restart nothing any node acked is missing and nothing is doubled.
///
/// This is the test of the fsync itself: with sled's own flush only
/// (`sync_file_range`), it fails.
#[test]
fn a_power_cut_of_every_node_at_once_loses_no_acked_message() {
    let Some(pulsar) = shared_pulsar("a_power_cut_of_every_node_at_once_loses_no_acked_message")
    else {
        return;
    };
    let seed = seed();
    let disks: Vec<CrashFs> = (0..3).map(|_| CrashFs::start()).collect();
    let mqtt = Mosquitto::start();
    let topic = unique_topic("power-all");
    let mut c = on_crashfs(&mqtt, &pulsar, &topic, &disks);
    c.wait_ready();
    let leader = c.wait_leader(None, Duration::from_secs(30));

    let replay = replay_cmd(mqtt.port, &["--pace", "1500", "--dup-every", "9"])
        .spawn()
        .unwrap();
    wait_until(
        Duration::from_secs(60),
        "every node to have acked part of the feed",
        || {
            c.nodes
                .iter()
                .all(|n| n.metric("firstseen_acks_total") >= 1_500.0)
        },
    );
    let acked: Vec<f64> = c
        .nodes
        .iter()
        .map(|n| n.metric("firstseen_acks_total"))
        .collect();
    let published_before = c.node(leader).published();
    for id in 1..=3 {
        c.node(id).kill9();
    }
    for (i, d) in disks.iter().enumerate() {
        let lost = d.lose_power(seed.wrapping_add(i as u64));
        eprintln!("power cut of node {}: {lost}", i + 1);
    }
    eprintln!("acked upstream before the cut: {acked:?}; published: {published_before}");
    for id in 1..=3 {
        c.node(id).restart();
    }
    let out = replay.wait_with_output().unwrap();
    assert!(out.status.success());
    c.wait_ready();
    let leader = c.wait_leader(None, Duration::from_secs(30));
    c.node(leader)
        .wait_published(HFP_DISTINCT, Duration::from_secs(180));
    assert_exactly_once(&read_back(&pulsar, &topic), &hfp_pairs(None));
    let (code, report) = verify(&pulsar, &topic, Some(HFP_DISTINCT), &c.secret_file());
    assert_eq!(code, 0, "{report}");
    // sled sometimes cannot read a log after the cut (docs/reliability.md,
    // finding 17): such a node rejoined, which the run should show.
    for id in 1..=3 {
        let log = std::fs::read_to_string(c.node(id).log_path()).unwrap_or_default();
        for line in log
            .lines()
            .filter(|l| l.contains("setting it aside") || l.contains("rejoined:"))
        {
            eprintln!("node {id}: {line}");
        }
    }
}

/// A follower's Raft log file is cut to half its length while it is down.
/// It must not vote with a log that lost entries: it sets the log aside
/// (kept as `log.damaged`), rejoins with an empty one and refuses every vote
/// until the leader has brought it up to date. Then it votes again: with
/// the leader killed, the next leader needs its vote. Exactly once.
#[test]
fn a_truncated_log_is_set_aside_and_the_node_rejoins_before_it_votes() {
    let Some(pulsar) =
        shared_pulsar("a_truncated_log_is_set_aside_and_the_node_rejoins_before_it_votes")
    else {
        return;
    };
    let mqtt = Mosquitto::start();
    let topic = unique_topic("truncated");
    let mut c = TestCluster::start(&mqtt, &pulsar, &topic, 3, |_| {});
    c.wait_ready();
    let leader = c.wait_leader(None, Duration::from_secs(30));
    let victim = if leader == 3 { 2 } else { 3 };
    let other = 6 - leader - victim;
    replay(mqtt.port, &["--limit", "2500", "--pace", "max"]);
    let first = hfp_pairs(Some(2500)).len() as u64;
    c.node(leader)
        .wait_published(first, Duration::from_secs(60));
    let target = c.node(leader).applied();
    wait_until(Duration::from_secs(30), "the victim to catch up", || {
        c.node(victim).applied() >= target
    });

    let (status, took) = c
        .node(victim)
        .terminate(Duration::from_secs(20))
        .expect("the node stops on SIGTERM");
    assert!(status.success(), "{status} after {took:?}");
    let raft_dir = c.node(victim).data_dir().join("raft");
    let db = raft_dir.join("log/db");
    let len = std::fs::metadata(&db).unwrap().len();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&db)
        .unwrap()
        .set_len(len / 2)
        .unwrap();
    let log_from = std::fs::metadata(c.node(victim).log_path()).unwrap().len() as usize;
    c.node(victim).restart();
    let since_restart = |c: &mut TestCluster| {
        let text = std::fs::read_to_string(c.node(victim).log_path()).unwrap_or_default();
        text.get(log_from..).unwrap_or_default().to_string()
    };
    wait_until(
        Duration::from_secs(60),
        "the victim to rejoin and vote again",
        || since_restart(&mut c).contains("rejoined:"),
    );
    let log = since_restart(&mut c);
    let aside = log.find("setting it aside").expect("the log was set aside");
    assert!(
        aside < log.find("rejoined:").unwrap(),
        "set aside, then rejoined:\n{log}"
    );
    assert!(!log.contains("panicked"), "{log}");
    assert!(
        raft_dir.join("log.damaged/db").exists(),
        "the damaged log is kept"
    );
    assert!(!raft_dir.join("rejoin").exists(), "the abstention ended");
    assert_eq!(c.node(victim).metric("firstseen_raft_abstaining"), 0.0);
    assert!(c.node(victim).applied() >= target);
    eprintln!(
        "node {victim}: {}",
        log.lines()
            .find(|l| l.contains("rejoined:"))
            .unwrap_or_default()
    );

    // Two nodes left: the next leader needs the victim's vote.
    c.node(leader).kill9();
    let next = c.wait_leader_among(&[victim, other], Some(leader), Duration::from_secs(30));
    replay(mqtt.port, &["--skip", "2500", "--pace", "max"]);
    c.node(next)
        .wait_published(HFP_DISTINCT, Duration::from_secs(120));
    assert_exactly_once(&read_back(&pulsar, &topic), &hfp_pairs(None));
    let (code, report) = verify(&pulsar, &topic, Some(HFP_DISTINCT), &c.secret_file());
    assert_eq!(code, 0, "{report}");
}

/// Bytes flipped in the middle of a node's Raft log and state files: the
/// node either refuses to start, naming a damaged file, or the flips hit
/// space sled no longer uses and it comes back with everything it had. It
/// never comes back with less.
#[test]
fn flipped_bytes_are_refused_or_harmless_never_a_shorter_log() {
    let Some(pulsar) = shared_pulsar("flipped_bytes_are_refused_or_harmless_never_a_shorter_log")
    else {
        return;
    };
    let seed = seed();
    let mqtt = Mosquitto::start();
    let topic = unique_topic("flipped");
    let mut spec = NodeSpec::new(&mqtt, &pulsar, &topic);
    spec.config.node.shutdown_timeout_secs = 5;
    let mut node = Node::start(spec);
    node.wait_ready();
    replay(mqtt.port, &["--limit", "3000", "--pace", "max"]);
    let first = hfp_pairs(Some(3000)).len() as u64;
    node.wait_published(first, Duration::from_secs(60));
    let before = node.applied();
    node.terminate(Duration::from_secs(20)).expect("stops");
    let mut rng = seed | 1;
    for file in ["raft/log/db", "raft/sled/db"] {
        let path = node.data_dir().join(file);
        let raw = std::fs::read(&path).unwrap();
        let mut raw = raw;
        for _ in 0..4 {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            // The middle half of the file, where live and dead pages mix.
            let at = raw.len() / 4 + (rng as usize % (raw.len() / 2));
            raw[at] ^= 0x5a;
        }
        std::fs::write(&path, raw).unwrap();
    }
    match node.try_restart(Duration::from_secs(15)) {
        Err((status, log)) => {
            assert!(!status.success());
            assert!(!log.contains("panicked"), "the node panicked:\n{log}");
            assert!(
                log.contains("damaged") && log.contains("raft/"),
                "refused, naming the file:\n{log}"
            );
            eprintln!(
                "refused: {}",
                log.lines()
                    .find(|l| l.contains("damaged"))
                    .unwrap_or_default()
            );
        }
        Ok(()) => {
            // It came up: then it must have all it had. The state machine
            // may restart behind the log (sled drops a damaged tail of its
            // own file and the entries are applied again from the Raft
            // log), so this waits for the re-apply; a Raft log that lost
            // entries is refused by the guard before the API comes up.
            wait_until(Duration::from_secs(30), "the node's API", || {
                node.status().is_some()
            });
            let restarted_at = node.applied();
            let deadline = std::time::Instant::now() + Duration::from_secs(30);
            while node.applied() < before && std::time::Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(100));
            }
            assert!(
                node.applied() >= before,
                "came back with a shorter log: {} < {before}",
                node.applied()
            );
            eprintln!(
                "applied {restarted_at} at restart, {} after re-applying (had {before})",
                node.applied()
            );
            eprintln!("the flips hit unused space; the node came back whole");
        }
    }
}

/// The leader once it is not node 3 (the node on the small disk): node 3
/// is restarted while it leads, so the tests act on it only as a follower.
fn leader_other_than_3(c: &mut TestCluster) -> u64 {
    let leader = c.wait_leader(None, Duration::from_secs(30));
    if leader != 3 {
        return leader;
    }
    c.node(3).kill9();
    let leader = c.wait_leader_among(&[1, 2], Some(3), Duration::from_secs(30));
    c.node(3).restart();
    c.wait_ready();
    leader
}

/// One follower's data directory is on a filesystem that fills up: it stops
/// acking and writing, says so on /readyz, in /status and in a metric; the
/// broker keeps its messages (a dead letter too); when space returns it
/// resumes by itself, and nothing is lost or corrupted.
#[test]
fn a_full_disk_holds_acks_and_resumes_when_space_returns() {
    let Some(pulsar) = shared_pulsar("a_full_disk_holds_acks_and_resumes_when_space_returns")
    else {
        return;
    };
    let disk = CrashFs::start();
    let mqtt = Mosquitto::start();
    let topic = unique_topic("full-disk");
    let reserve: u64 = 24 << 20;
    // Node 3's data dir is on the small filesystem. Node 1 and 2 bootstrap
    // together with it; the test acts on node 3 only while it follows.
    let mut c = TestCluster::start(&mqtt, &pulsar, &topic, 3, |s| {
        s.config.dedup.max_payload_bytes = 64 * 1024;
        if s.id() == 3 {
            s.data_dir = Some(disk.mount.join("data"));
            s.config.node.disk_reserve_bytes = reserve;
        }
    });
    c.wait_ready();
    let leader = leader_other_than_3(&mut c);
    replay(mqtt.port, &["--limit", "1500", "--pace", "max"]);
    let first = hfp_pairs(Some(1500)).len() as u64;
    c.node(leader)
        .wait_published(first, Duration::from_secs(60));
    wait_until(
        Duration::from_secs(30),
        "node 3 to ack the first part",
        || c.node(3).metric("firstseen_acks_total") >= 1_500.0,
    );

    // Fill it: only 8 MiB left, a third of the reserve.
    disk.quota(Some(disk.used() + (8 << 20)));
    wait_until(
        Duration::from_secs(10),
        "node 3 to see its disk low",
        || c.node(3).get("/readyz").0 == 503,
    );
    let (_, why) = c.node(3).get("/readyz");
    assert!(why.contains("disk_reserve_bytes"), "{why}");
    let s = c.node(3).status().unwrap();
    assert!(s.disk.low, "{s:?}");
    assert_eq!(c.node(3).metric("firstseen_disk_low"), 1.0);
    let acks_before = c.node(3).metric("firstseen_acks_total");
    let dead_before = c.node(3).metric("firstseen_dead_letter_total");

    // The rest of the feed, and an oversized message for the dead letters.
    replay(mqtt.port, &["--skip", "1500", "--pace", "max"]);
    publish(mqtt.port, "/hfp/oversized", &vec![b'x'; 100 * 1024]);
    c.node(leader)
        .wait_published(HFP_DISTINCT, Duration::from_secs(120));
    assert_eq!(
        c.node(3).metric("firstseen_acks_total"),
        acks_before,
        "node 3 acked upstream while its disk was full"
    );
    assert_eq!(
        c.node(3).metric("firstseen_dead_letter_total"),
        dead_before,
        "node 3 wrote a dead letter while its disk was full"
    );
    assert!(c.node(3).status().unwrap().disk.low);

    // Space returns: node 3 catches up, commits its held copies (as
    // duplicates), writes the dead letter and acks everything it holds.
    disk.quota(None);
    wait_until(Duration::from_secs(30), "node 3 to be ready again", || {
        c.node(3).get("/readyz").0 == 200
    });
    wait_until(
        Duration::from_secs(60),
        "node 3 to ack what it held",
        || {
            let s = c.node(3).status().unwrap();
            let received = s.upstreams.first().map_or(0, |u| u.received) as f64;
            c.node(3).metric("firstseen_acks_total") >= received
        },
    );
    assert!(c.node(3).metric("firstseen_dead_letter_total") > dead_before);
    let letters = std::fs::read_dir(c.node(3).data_dir().join("dead-letter"))
        .unwrap()
        .count();
    assert!(
        letters >= 1,
        "the oversized message was set aside on node 3"
    );
    assert_exactly_once(&read_back(&pulsar, &topic), &hfp_pairs(None));

    // Nothing on its disk was damaged: it stops and starts again cleanly.
    c.node(3).terminate(Duration::from_secs(20)).expect("stops");
    c.node(3).restart();
    c.node(3).wait_ready();
    let (code, report) = verify(&pulsar, &topic, Some(HFP_DISTINCT), &c.secret_file());
    assert_eq!(code, 0, "{report}");
}

/// A follower whose disk fills up with no reserve to warn it: a write fails
/// inside sled, after which sled 0.34 can wait forever for that write to
/// become stable, or openraft stops its core. Either way the node must not
/// run on as a silent zombie: its storage watchdog exits with status 74 so
/// that a supervisor restarts it, and once space returns it rejoins with
/// nothing lost or doubled.
#[test]
fn a_node_whose_storage_fails_exits_for_its_supervisor_and_recovers() {
    let Some(pulsar) =
        shared_pulsar("a_node_whose_storage_fails_exits_for_its_supervisor_and_recovers")
    else {
        return;
    };
    let disk = CrashFs::start();
    let mqtt = Mosquitto::start();
    let topic = unique_topic("storage-fails");
    let mut c = TestCluster::start(&mqtt, &pulsar, &topic, 3, |s| {
        if s.id() == 3 {
            s.data_dir = Some(disk.mount.join("data"));
            // No reserve: the disk runs out under sled's own writes.
            s.config.node.disk_reserve_bytes = 0;
        }
    });
    c.wait_ready();
    let leader = leader_other_than_3(&mut c);
    replay(mqtt.port, &["--limit", "500", "--pace", "max"]);
    c.node(leader)
        .wait_published(hfp_pairs(Some(500)).len() as u64, Duration::from_secs(60));

    disk.quota(Some(disk.used() + (1 << 20)));
    replay(mqtt.port, &["--skip", "500", "--pace", "max"]);
    let exited = c.node(3).wait_exit(Duration::from_secs(90));
    let log = std::fs::read_to_string(c.node(3).log_path()).unwrap_or_default();
    let Some((status, after)) = exited else {
        panic!(
            "node 3 ran on for 90 s with a failed disk instead of exiting:\n{}",
            c.node(3).log_tail(30)
        );
    };
    assert_eq!(status.code(), Some(74), "{}", c.node(3).log_tail(30));
    assert!(
        log.contains("storage can no longer be trusted"),
        "{}",
        c.node(3).log_tail(30)
    );
    let reason = log
        .lines()
        .find(|l| l.contains("storage can no longer be trusted"))
        .unwrap_or_default();
    eprintln!("node 3 exited with status 74, {after:?} into the wait: {reason}");
    c.node(leader)
        .wait_published(HFP_DISTINCT, Duration::from_secs(120));

    // A supervisor restarts it at once, on a disk that is still full: the
    // start fails, and sled may leave a snapshot file it began and could
    // not finish. In the hour-long soak such a file made every later start
    // refuse the log as "damaged" (docs/reliability.md); 4 KiB free, as
    // that node had. Here sled fails earlier in its start (no snapshot file
    // is begun: the count printed below is 0), so the unfinished file
    // itself is covered by the unit test in store/src/disk.rs.
    disk.quota(Some(disk.used() + 4096));
    let (status, log) = c.node(3).restart_expecting_refusal(Duration::from_secs(60));
    assert!(!status.success(), "{log}");
    eprintln!(
        "a start on the full disk failed ({status}): {}",
        log.lines().last().unwrap_or_default()
    );

    // What a supervisor does once the operator has made room.
    disk.quota(None);
    c.node(3).restart();
    c.node(3).wait_ready();
    let log = std::fs::read_to_string(c.node(3).log_path()).unwrap_or_default();
    eprintln!(
        "unfinished sled snapshots removed (node 3's whole log): {}",
        log.matches("never finished").count()
    );
    wait_until(Duration::from_secs(120), "node 3 to catch up", || {
        let target = c.node(leader).applied();
        c.node(3).applied() >= target
    });
    assert_exactly_once(&read_back(&pulsar, &topic), &hfp_pairs(None));
    let (code, report) = verify(&pulsar, &topic, Some(HFP_DISTINCT), &c.secret_file());
    assert_eq!(code, 0, "{report}");
}

/// Set in the child process of the test below: where it writes.
const STATE_WRITER_DIR: &str = "FIRSTSEEN_TEST_STATE_WRITER_DIR";

/// sled writes a value above a quarter of a segment to a file of its own
/// under `blobs/`; `Db::sync` makes those stable before the database file
/// that points at them. A power cut after a sync and a few unsynced large
/// values must leave a database that opens, with the synced value and each
/// large one either whole or absent. (It passes with sled's background
/// flusher on too, so it does not show that the flusher was what damaged
/// the soak's state databases; the rebuild below is what handles those.)
/// The writer is a child process, killed before the power goes, so that
/// nothing flushes on the way out.
#[test]
fn the_state_database_survives_a_power_cut_after_a_large_value() {
    if let Ok(dir) = std::env::var(STATE_WRITER_DIR) {
        let disk = firstseen_store::disk::Disk::open(std::path::Path::new(&dir)).unwrap();
        let tree = disk.state.sled().open_tree("t").unwrap();
        tree.insert(b"small", b"durable".as_slice()).unwrap();
        disk.state.sync().unwrap();
        for i in 0..4u8 {
            tree.insert([b'b', i], vec![i; 300 * 1024]).unwrap();
        }
        println!("written");
        loop {
            std::thread::sleep(Duration::from_secs(60));
        }
    }
    let fs = CrashFs::start();
    let dir = fs.mount.join("data");
    let mut child = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "the_state_database_survives_a_power_cut_after_a_large_value",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(STATE_WRITER_DIR, &dir)
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = std::io::BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    while !line.contains("written") {
        line.clear();
        use std::io::BufRead;
        assert!(out.read_line(&mut line).unwrap() > 0, "the writer ended");
    }
    // Long enough for a one-second background flusher to run twice; with
    // none, nothing happens in it.
    std::thread::sleep(Duration::from_millis(2_500));
    child.kill().unwrap();
    child.wait().unwrap();
    eprintln!("{}", fs.lose_power(seed()));

    let disk = firstseen_store::disk::Disk::open(&dir).expect("the state database opens");
    let tree = disk.state.sled().open_tree("t").unwrap();
    assert_eq!(
        tree.get(b"small").unwrap().as_deref(),
        Some(b"durable".as_slice())
    );
    for i in 0..4u8 {
        match tree.get([b'b', i]) {
            Ok(None) => {}
            Ok(Some(v)) => assert!(v.len() == 300 * 1024 && v.iter().all(|b| *b == i)),
            Err(e) => panic!("value {i} after the power cut: {e}"),
        }
    }
}

/// A node whose state database will not open (overwritten here; sled left
/// such databases after the soak's losses of power on every node) moves it
/// aside and rebuilds the state from its current snapshot and the Raft log,
/// instead of refusing to start: the state is derived data. It comes back
/// with everything it had and the topic stays exactly once.
#[test]
fn a_state_database_that_will_not_open_is_rebuilt_from_the_snapshot_and_the_log() {
    let Some(pulsar) = shared_pulsar(
        "a_state_database_that_will_not_open_is_rebuilt_from_the_snapshot_and_the_log",
    ) else {
        return;
    };
    let mqtt = Mosquitto::start();
    let topic = unique_topic("state-rebuilt");
    let mut spec = NodeSpec::new(&mqtt, &pulsar, &topic);
    spec.config.node.shutdown_timeout_secs = 5;
    // Snapshots and purges every few entries: the rebuilt state must come
    // from the snapshot, since the log no longer starts at 1.
    // (The least allowed: how many entries a replay makes depends on how
    // busy the machine is, since a slower node merges more per entry.)
    spec.config.cluster.snapshot_logs = 10;
    let mut node = Node::start(spec);
    node.wait_ready();
    replay(mqtt.port, &["--limit", "3000", "--pace", "2000"]);
    let first = hfp_pairs(Some(3000)).len() as u64;
    node.wait_published(first, Duration::from_secs(60));
    let snapshots = node.data_dir().join("raft/snapshots/current.meta");
    wait_until(Duration::from_secs(30), "a snapshot", || snapshots.exists());
    let before = node.applied();
    node.terminate(Duration::from_secs(20)).expect("stops");

    let db = node.data_dir().join("raft/sled/db");
    let len = std::fs::metadata(&db).unwrap().len() as usize;
    std::fs::write(&db, vec![0xa5u8; len]).unwrap();
    node.restart();
    node.wait_ready();
    let log = std::fs::read_to_string(node.log_path()).unwrap();
    assert!(
        log.contains("moving it aside and rebuilding the state"),
        "{}",
        node.log_tail(30)
    );
    let aside = std::fs::read_dir(node.data_dir().join("raft"))
        .unwrap()
        .flatten()
        .any(|e| e.file_name().to_string_lossy().starts_with("sled.damaged-"));
    assert!(aside, "the damaged database is kept aside for the operator");
    wait_until(Duration::from_secs(30), "the log re-applied", || {
        node.applied() >= before
    });

    replay(mqtt.port, &["--skip", "3000", "--pace", "max"]);
    node.wait_published(HFP_DISTINCT, Duration::from_secs(120));
    assert_exactly_once(&read_back(&pulsar, &topic), &hfp_pairs(None));
    let (code, report) = verify(&pulsar, &topic, Some(HFP_DISTINCT), &node.secret_file());
    assert_eq!(code, 0, "{report}");
}

/// A state database that opens but has lost window records its checkpoint
/// names, as node 3's did in the hour-long soak after a loss of power on
/// every node. The gap shows only when the first such record expires, as
/// "a window record is missing" while applying an entry; every start then
/// re-applied that entry and stopped on it again, for good. Now the failed
/// apply marks the state damaged, and the next start rebuilds it from the
/// current snapshot and the log: nothing lost, nothing twice.
#[test]
fn a_state_that_lost_window_records_is_rebuilt_at_the_next_start() {
    let Some(pulsar) =
        shared_pulsar("a_state_that_lost_window_records_is_rebuilt_at_the_next_start")
    else {
        return;
    };
    let mqtt = Mosquitto::start();
    let topic = unique_topic("window-lost");
    let mut spec = NodeSpec::new(&mqtt, &pulsar, &topic);
    spec.config.node.shutdown_timeout_secs = 5;
    spec.config.cluster.snapshot_logs = 10;
    // A short window, so that the lost records come up for expiry soon.
    spec.config.dedup.window_secs = 2;
    let mut node = Node::start(spec);
    node.wait_ready();
    replay(mqtt.port, &["--limit", "1500", "--pace", "max"]);
    let first = hfp_pairs(Some(1500)).len() as u64;
    node.wait_published(first, Duration::from_secs(60));
    node.terminate(Duration::from_secs(20)).expect("stops");

    // Every window record on disk gone; the head that names them kept.
    {
        let db = firstseen_store::disk::Disk::open_state(&node.data_dir().join("raft")).unwrap();
        let window = db.sled().open_tree("sm_window").unwrap();
        assert!(!window.is_empty(), "the checkpoint wrote window records");
        window.clear().unwrap();
        db.sync().unwrap();
    }
    node.restart();
    // New traffic moves the window clock past the lost records.
    replay(
        mqtt.port,
        &["--skip", "1500", "--limit", "2500", "--pace", "max"],
    );
    let Some((status, _)) = node.wait_exit(Duration::from_secs(60)) else {
        panic!(
            "the node applied on a state missing its records:\n{}",
            node.log_tail(30)
        );
    };
    let log = std::fs::read_to_string(node.log_path()).unwrap();
    assert!(
        log.contains("a window record is missing"),
        "{status}: {}",
        node.log_tail(30)
    );
    node.restart();
    node.wait_ready();
    let log = std::fs::read_to_string(node.log_path()).unwrap();
    assert!(
        log.contains("moving it aside and rebuilding the state"),
        "{}",
        node.log_tail(30)
    );
    replay(mqtt.port, &["--skip", "2500", "--pace", "max"]);
    node.wait_published(HFP_DISTINCT, Duration::from_secs(120));
    assert_exactly_once(&read_back(&pulsar, &topic), &hfp_pairs(None));
    let (code, report) = verify(&pulsar, &topic, Some(HFP_DISTINCT), &node.secret_file());
    assert_eq!(code, 0, "{report}");
}

/// A state database that comes back older than the checkpoint the log's
/// deletions were based on, as the soak saw after every node lost power at
/// once: its outbox still lists messages whose log entries are gone, because
/// the receipts that trimmed them were applied after it. Those receipts are
/// still in the log, so re-applying it trims them. The node starts instead of
/// refusing a sound directory, and every message arrives exactly once.
#[test]
fn a_state_older_than_the_log_deletions_catches_up_by_re_applying_the_log() {
    if shared_pulsar("a_state_older_than_the_log_deletions_catches_up_by_re_applying_the_log")
        .is_none()
    {
        return;
    }
    // A broker of this test's own: it is stopped so that an outbox builds up.
    let own = OwnPulsar::start();
    let mqtt = Mosquitto::start();
    let topic = unique_topic("state-older");
    let mut spec = NodeSpec::new(&mqtt, &own.pulsar, &topic);
    spec.config.node.shutdown_timeout_secs = 5;
    // Small entries and a snapshot every 10 while the broker is down: the
    // log is purged past the unpublished messages' entries (the outbox hold
    // keeps them until they are published).
    // Ten messages an entry, so that the feed makes about a hundred entries
    // and several snapshots: openraft keeps `snapshot_logs` entries behind
    // a snapshot, so only a later one purges the first messages' entries.
    // With 50, the feed sometimes made one snapshot, nothing was purged,
    // and the check below found no deletions to recover from.
    spec.config.batch.max_messages = 10;
    spec.config.cluster.snapshot_logs = 10;
    let mut node = Node::start(spec);
    node.wait_ready();
    own.stop();
    replay(mqtt.port, &["--limit", "1000", "--pace", "max"]);
    let first = hfp_pairs(Some(1000)).len() as u64;
    wait_until(Duration::from_secs(60), "the feed in the outbox", || {
        node.status()
            .is_some_and(|s| s.totals.outbox_messages == first)
    });
    let snapshots = node.data_dir().join("raft/snapshots/current.meta");
    wait_until(Duration::from_secs(30), "a snapshot", || snapshots.exists());
    node.terminate(Duration::from_secs(20)).expect("stops");
    let state = node.data_dir().join("raft/sled");
    let old = node.data_dir().join("state-copy");
    let copy = |from: &std::path::Path, to: &std::path::Path| {
        let _ = std::fs::remove_dir_all(to);
        assert!(std::process::Command::new("cp")
            .arg("-a")
            .arg(from)
            .arg(to)
            .status()
            .unwrap()
            .success());
    };
    copy(&state, &old);

    // The broker returns: the outbox drains, the receipts are committed, and
    // the entries the messages were read from are deleted. No snapshot
    // after this point, so the log still starts where the old state needs.
    node.spec.config.cluster.snapshot_logs = 100_000;
    // The reaper says at debug level what it deleted; the test waits for
    // that rather than for a fixed three seconds after the last receipt.
    node.spec.env.push((
        "RUST_LOG".into(),
        "info,pulsar=warn,openraft=warn,firstseen_raft::log_store::reaper=debug".into(),
    ));
    own.restart();
    node.restart();
    node.wait_ready();
    node.wait_published(first, Duration::from_secs(60));
    let this_start = |log: &str| log.rsplit("===== start #").next().unwrap_or("").to_string();
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while !this_start(&std::fs::read_to_string(node.log_path()).unwrap_or_default())
        .contains("purged log entries deleted")
    {
        assert!(
            std::time::Instant::now() < deadline,
            "the reaper deleted nothing in 60 s after the outbox drained: {}",
            node.log_tail(60)
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    node.terminate(Duration::from_secs(20)).expect("stops");
    node.spec.env.pop();

    // The state comes back as it was before the broker returned.
    std::fs::remove_dir_all(&state).unwrap();
    copy(&old, &state);
    node.restart();
    node.wait_ready();
    let log = std::fs::read_to_string(node.log_path()).unwrap();
    assert!(
        log.contains("the state's outbox reads log entries that were deleted"),
        "the old state must point below the deletions for this test to mean anything: {}",
        node.log_tail(30)
    );
    replay(mqtt.port, &["--skip", "1000", "--pace", "max"]);
    node.wait_published(HFP_DISTINCT, Duration::from_secs(120));
    assert_exactly_once(&read_back(&own.pulsar, &topic), &hfp_pairs(None));
}

/// The crash filesystem answers for a file that is unlinked but still open,
/// as a real one does: its size (an `lseek` to the end) and its data. It
/// answered "No such file or directory", and a leader sending a snapshot
/// that a newer one had just replaced stopped its Raft on it in the
/// campaign (nemesis seed 150354282), a failure no real disk causes.
#[test]
fn an_open_file_stays_readable_on_the_crash_filesystem_after_unlink() {
    use std::io::{Read, Seek, SeekFrom};
    let fs = CrashFs::start();
    let path = fs.mount.join("snap-1.snap");
    std::fs::write(&path, vec![7u8; 100_000]).unwrap();
    let mut open = std::fs::File::open(&path).unwrap();
    std::fs::remove_file(&path).unwrap();
    assert_eq!(open.seek(SeekFrom::End(0)).unwrap(), 100_000);
    open.seek(SeekFrom::Start(0)).unwrap();
    let mut back = Vec::new();
    open.read_to_end(&mut back).unwrap();
    assert_eq!(back.len(), 100_000);
    assert!(!path.exists());
}

/// The whole-cluster simulation stops a node by dropping it, and sled's
/// drop writes its buffers and fsyncs them on the way out, which a killed
/// process never does: every power cut in the simulation lost nothing
/// (`files=0 bytes=0`) until the power could go off first. After
/// `power-off`, writes and fsyncs are dropped, and the cut undoes what was
/// not synced before it.
#[test]
fn nothing_written_after_the_power_goes_off_survives_the_cut() {
    use std::io::Write;
    use std::os::unix::fs::FileExt;
    let fs = CrashFs::start();
    let path = fs.mount.join("db");
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .truncate(true)
        .read(true)
        .write(true)
        .open(&path)
        .unwrap();
    f.write_all(b"synced.").unwrap();
    f.sync_data().unwrap();
    // Its name, too: without this the cut undoes the file's creation.
    std::fs::File::open(&fs.mount).unwrap().sync_all().unwrap();
    f.write_all(b"unsynced.").unwrap();
    fs.power_off();
    // A process on its way out: it writes, syncs, renames.
    f.write_all_at(b"after the cut, synced.", 16).unwrap();
    f.sync_all().unwrap();
    assert!(std::fs::rename(&path, fs.mount.join("moved")).is_err());
    drop(f);
    let lost = fs.command("lose-power");
    assert!(lost.contains("files=1"), "{lost}");
    assert_eq!(std::fs::read(&path).unwrap(), b"synced.");
    // The power is on again.
    std::fs::write(fs.mount.join("later"), b"x").unwrap();
    assert_eq!(std::fs::read(fs.mount.join("later")).unwrap(), b"x");
}

/// A name change lasts only once its directory is fsynced, as POSIX
/// promises and no more: a new file, a rename over an old one (the way
/// snapshots are replaced), an unlink and a new directory all come undone
/// without it, and all stay with it. Before, crashfs kept every name change
/// at once, so a missing directory fsync could not fail a test.
#[test]
fn a_name_change_survives_a_power_cut_only_once_its_directory_is_synced() {
    let fs = CrashFs::start();
    let sync_dir = |p: &std::path::Path| std::fs::File::open(p).unwrap().sync_all().unwrap();
    let write_synced = |p: std::path::PathBuf, data: &[u8]| {
        use std::io::Write;
        let mut f = std::fs::File::create(p).unwrap();
        f.write_all(data).unwrap();
        f.sync_all().unwrap();
    };
    let d = fs.mount.join("d");
    std::fs::create_dir(&d).unwrap();
    sync_dir(&fs.mount);
    write_synced(d.join("a"), b"old");
    write_synced(d.join("b"), b"b");
    sync_dir(&d);
    let changes = || {
        write_synced(d.join("t"), b"new");
        std::fs::rename(d.join("t"), d.join("a")).unwrap();
        std::fs::remove_file(d.join("b")).unwrap();
        std::fs::create_dir(d.join("n")).unwrap();
        write_synced(d.join("n/x"), b"x");
        // The new directory's own entry is synced; its name in `d` is not.
        sync_dir(&d.join("n"));
    };
    let listing = || {
        let mut names: Vec<String> = std::fs::read_dir(&d)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    };

    changes();
    let lost = fs.command("lose-power");
    assert!(lost.contains("names=4"), "{lost}");
    assert_eq!(listing(), vec!["a", "b"]);
    assert_eq!(std::fs::read(d.join("a")).unwrap(), b"old");
    assert_eq!(std::fs::read(d.join("b")).unwrap(), b"b");

    changes();
    sync_dir(&d);
    let lost = fs.command("lose-power");
    assert!(lost.contains("names=0"), "{lost}");
    assert_eq!(listing(), vec!["a", "n"]);
    assert_eq!(std::fs::read(d.join("a")).unwrap(), b"new");
    assert_eq!(std::fs::read(d.join("n/x")).unwrap(), b"x");
    // The stash that kept the old files is the filesystem's own.
    let root: Vec<_> = std::fs::read_dir(&fs.mount).unwrap().collect();
    assert_eq!(root.len(), 1, "only `d` at the root");
}

/// A crash filesystem whose test died unmounts itself even while a file on
/// it is still open. Seven dead mounts were left in /dev/shm by simulation
/// runs that panicked: the lifeline closed, the unmount found the mount busy
/// (the dying process's files were not closed yet) and crashfs exited
/// without it. Now it detaches the mount lazily.
#[test]
fn a_crash_filesystem_whose_test_died_leaves_no_mount_even_when_busy() {
    use std::io::{BufRead, BufReader};
    use std::process::{Command, Stdio};
    let dir = tempfile::TempDir::new().unwrap();
    let mount = dir.path().join("mnt");
    let mut fs = Command::new(common::crashfs::bin())
        .arg("--backing")
        .arg(dir.path().join("backing"))
        .arg("--mount")
        .arg(&mount)
        .arg("--control")
        .arg(dir.path().join("control.sock"))
        .arg("--exit-on-stdin-eof")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(fs.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert_eq!(line.trim(), "ready");
    let file = mount.join("held");
    std::fs::write(&file, b"x").unwrap();
    // A file still open on it, as a dying test process has them.
    let held = std::fs::File::open(&file).unwrap();
    drop(fs.stdin.take());
    let status = fs.wait().unwrap();
    let mounted = std::fs::read_to_string("/proc/mounts")
        .unwrap()
        .lines()
        .any(|l| l.contains(mount.to_str().unwrap()));
    drop(held);
    if mounted {
        let _ = Command::new("umount").arg("-l").arg(&mount).status();
    }
    assert!(status.success(), "crashfs exited with {status}");
    assert!(!mounted, "{} is still mounted", mount.display());
}

//! The fence between a leader whose connection dropped and its successor,
//! on a real broker whose storage stalls (issue 48, item 1).
//!
//! When a producer's connection drops, Pulsar closes the producer at once
//! and hands exclusive access to the next one, while the writes the broker
//! already took from it may still be waiting for the bookies. The broker's
//! last message id is the last entry the bookies confirmed, so a successor
//! that read the topic's end then resumed before those writes, sent the
//! same messages again behind them, and both copies landed. The successor
//! now waits, holding exclusive access, until the broker has no write of
//! the topic pending (docs/exactly-once.md, "Writes in flight when a
//! connection drops").
//!
//! The stall is real: the test's own Pulsar standalone keeps its bookie's
//! journal and ledgers on a firstseen-crashfs mount, and a freeze there
//! holds every write and fsync the bookie makes until the thaw, as a disk
//! that stopped answering would.

mod common;

use std::time::Duration;

use common::cluster::TestCluster;
use common::crashfs::CrashFs;
use common::*;

/// A three-node cluster publishes the HFP capture; the bookie's disk
/// freezes while the leader has writes in flight; the leader is killed
/// (SIGKILL: its connection drops, and the broker frees the topic at
/// once). The new leader takes the topic while the old writes are still
/// pending. Without the fence it read the end below them and sent those
/// messages again; with it, it gives up the acquisition until they settle.
/// After the thaw every key is in the topic exactly once.
#[test]
fn a_new_leader_waits_out_the_writes_a_killed_leader_left_pending() {
    if shared_pulsar("a_new_leader_waits_out_the_writes_a_killed_leader_left_pending").is_none() {
        return;
    }
    // Declared first, so dropped last: the broker stops before its disk
    // goes.
    let disk = CrashFs::start();
    let own = OwnPulsar::start_with_bookie_dir(&disk.mount.join("bookie"));
    let mqtt = Mosquitto::start();
    let topic = unique_topic("fence");
    let mut c = TestCluster::start(&mqtt, &own.pulsar, &topic, 3, |_| {});
    c.wait_ready();
    let old = c.wait_leader(None, Duration::from_secs(30));
    let replay = replay_cmd(mqtt.port, &["--pace", "1000"]).spawn().unwrap();
    wait_until(
        Duration::from_secs(60),
        "part of the feed published",
        || c.node(old).published() > 500,
    );

    disk.freeze();
    // The leader keeps sending; the broker takes its writes and they wait
    // behind the bookie's stalled journal.
    wait_until(
        Duration::from_secs(10),
        "the leader's writes pending at the broker",
        || own.pending_adds(&topic).is_some_and(|n| n > 0),
    );
    c.node(old).kill9();
    // The broker reads what the killed leader had sent before it notices
    // the closed connection, and closes its producer then: from here on
    // no write of the old leader's is on its way in.
    let old_name = format!("-{old}-t");
    wait_until(
        Duration::from_secs(30),
        "the broker to close the killed leader's producer",
        || {
            own.producers(&topic)
                .is_some_and(|p| !p.iter().any(|n| n.contains(&old_name)))
        },
    );
    let pending = own.pending_adds(&topic).expect("the admin API answers");
    assert!(
        pending > 0,
        "the killed leader's writes settled under the freeze (held {}); broker log:\n{}",
        disk.held(),
        own.log_tail(40)
    );
    let rest: Vec<u64> = (1..=3).filter(|i| *i != old).collect();
    let new = c.wait_leader_among(&rest, Some(old), Duration::from_secs(30));

    // The new leader takes the topic and either sends (more writes pending
    // than the killed leader left: the same sequences again, as before the
    // fence) or gives the topic up because writes are pending (the fence,
    // after one operation timeout). Either way, it has acted under the
    // stall; the thaw comes only then.
    wait_until(
        Duration::from_secs(30),
        "the new leader to send under the stall or to wait it out",
        || {
            own.pending_adds(&topic).is_some_and(|n| n > pending)
                || c.node(new).metric("firstseen_publish_writes_pending_total") >= 1.0
        },
    );
    let after = own.pending_adds(&topic);
    let held = disk.thaw();
    assert!(held > 0, "the freeze held none of the bookie's writes");
    eprintln!(
        "killed leader {old} with {pending} writes pending; new leader {new}; pending before the thaw {after:?}; bookie writes and syncs held {held}"
    );

    let out = replay.wait_with_output().unwrap();
    assert!(out.status.success(), "replay.py failed");
    c.node(new)
        .wait_published(HFP_DISTINCT, Duration::from_secs(120));
    assert_exactly_once(&read_back(&own.pulsar, &topic), &hfp_pairs(None));
    // The fence held the new leader back at least once: the stall was long
    // enough to matter, and the check ran.
    assert!(
        c.node(new).metric("firstseen_publish_writes_pending_total") >= 1.0,
        "the new leader never found writes pending"
    );
}

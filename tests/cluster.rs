//! Three zones, one copy: several nodes on the same upstream agree through
//! Raft on the first copy of each message. Results are read back from Pulsar
//! with the official Python client and with `firstseen verify`.

mod common;

use std::time::Duration;

use common::cluster::TestCluster;
use common::*;

/// Three nodes, each subscribed to the same Mosquitto with its own client id,
/// the capture plus injected duplicates: one copy per key, and every zone's
/// coverage near 100%.
#[test]
fn three_zones_keep_exactly_one_copy_per_key() {
    let Some(pulsar) = shared_pulsar("three_zones_keep_exactly_one_copy_per_key") else {
        return;
    };
    let mqtt = Mosquitto::start();
    let topic = unique_topic("three-zones");
    let c = TestCluster::start(&mqtt, &pulsar, &topic, 3, |_| {});
    c.wait_ready();
    let leader = c.wait_leader(None, Duration::from_secs(30));

    let r = replay(mqtt.port, &["--dup-every", "5"]);
    assert!(r.published > 5_000);
    c.nodes[(leader - 1) as usize].wait_published(HFP_DISTINCT, Duration::from_secs(120));
    assert_exactly_once(&read_back(&pulsar, &topic), &hfp_pairs(None));
    let (code, report) = verify(&pulsar, &topic, Some(HFP_DISTINCT));
    assert_eq!(code, 0, "{report}");

    // Every zone got the whole feed: each saw (nearly) every key.
    let s = c.nodes[0].status().unwrap();
    let coverage = s["coverage"].as_array().unwrap();
    assert_eq!(coverage.len(), 3, "{s}");
    let mut firsts = 0;
    for cov in coverage {
        let seen = cov["seen_ratio"].as_f64().unwrap();
        assert!(
            seen > 0.99,
            "zone {} saw only {:.1}% of the keys",
            cov["zone"],
            seen * 100.0
        );
        firsts += cov["first"].as_u64().unwrap();
    }
    assert_eq!(firsts, HFP_DISTINCT, "each key has exactly one first node");
    assert_eq!(s["totals"]["observed"].as_u64().unwrap(), 3 * r.published);
}

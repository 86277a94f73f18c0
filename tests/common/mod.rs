//! Test harness: real Mosquitto and firstseen processes on OS-chosen ports,
//! the shared Apache Pulsar started by `scripts/test.sh`, and readers that
//! check results the way a user would (the official Python Pulsar client and
//! `firstseen verify`).
#![allow(dead_code)]

use std::io::Write;
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use firstseen::config::{
    Config, MemberConfig, NodeConfig, PulsarConfig, RouteConfig, SubscriptionConfig, UpstreamConfig,
};
pub use firstseen::http::Status;
use serde_json::Value;
use tempfile::TempDir;

mod brokers;
mod certs;
pub mod cluster;
pub mod crashfs;
mod node;
pub mod proxy;
mod readback;
mod traffic;

// Each test binary uses the part of the harness it needs.
#[allow(unused_imports)]
pub use {brokers::*, certs::*, node::*, readback::*, traffic::*};

pub const HFP: &str = "../shared/data/hfp-5000.txt";
/// Distinct topic+payload pairs in the HFP capture (see ../shared/data/README.md).
pub const HFP_DISTINCT: u64 = 4_956;

pub fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

pub fn hfp_path() -> PathBuf {
    repo().join(HFP)
}

/// A port free on `ip` right now, taken at random below the kernel's
/// ephemeral range (32768+). Ports handed out for port-0 binds (the fault
/// proxies, every outgoing connection) come from that range, so they can
/// never take a port chosen here between the choice and the bind.
pub fn free_port_on(ip: std::net::IpAddr) -> u16 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64
        ^ ((std::process::id() as u64) << 32);
    // Ports already handed out in this process. A port is only checked free
    // here and bound later by the process it is meant for, so two picks in
    // one test binary (three nodes' HTTP ports, or two tests' clusters
    // running side by side) could get the same one, and the second node to
    // start failed with "Address already in use" (seen in CI: a node that
    // never started, and a test waiting on it).
    static GIVEN: std::sync::Mutex<std::collections::BTreeSet<(std::net::IpAddr, u16)>> =
        std::sync::Mutex::new(std::collections::BTreeSet::new());
    let mut x = seed ^ COUNTER.fetch_add(0x9e37_79b9_7f4a_7c15, Ordering::Relaxed);
    for _ in 0..1000 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let port = 20_000 + (x % 12_000) as u16;
        let mut given = GIVEN.lock().unwrap_or_else(|e| e.into_inner());
        if given.contains(&(ip, port)) {
            continue;
        }
        if std::net::TcpListener::bind((ip, port)).is_ok() {
            given.insert((ip, port));
            return port;
        }
    }
    panic!("no free port on {ip}");
}

/// A free port on 127.0.0.1 (see [`free_port_on`]).
/// Held for the whole of a test whose assertions are time bounds (an
/// election within 5 s, coverage back within 60 s): such tests take turns
/// within their test binary rather than share 2 cores with each other's
/// three-node clusters, which stretched a 1.5 s election to 15 s in CI. The
/// other tests of the binary still run beside them.
pub fn timing_bound_test() -> std::sync::MutexGuard<'static, ()> {
    static TURN: std::sync::Mutex<()> = std::sync::Mutex::new(());
    TURN.lock().unwrap_or_else(|p| p.into_inner())
}

pub fn free_port() -> u16 {
    free_port_on(std::net::IpAddr::from([127, 0, 0, 1]))
}

/// Polls `f` every 100 ms until it returns true or `timeout` passes. Used to
/// wait for an observable condition, never as a fixed sleep.
pub fn wait_until(timeout: Duration, what: &str, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline {
        if f() {
            return;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    panic!("timed out after {timeout:?} waiting for {what}");
}

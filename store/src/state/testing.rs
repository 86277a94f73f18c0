//! Helpers for the state's unit tests.

use std::time::{Duration, Instant};

use super::StateStore;
use crate::{Command, KeyKind, NodeId, Observation};

pub(super) fn store() -> StateStore {
    let db = sled::Config::new().temporary(true).open().unwrap();
    StateStore::open(&db).unwrap()
}

pub(super) fn obs(key: u8, node: NodeId, topic: &str) -> Observation {
    Observation {
        key: [key; 32],
        mqtt_topic: format!("/hfp/{key}"),
        pulsar_topic: topic.into(),
        payload: vec![key; 10],
        qos: 1,
        retain: false,
        node,
        received_ms: 0,
    }
}

/// An entry of `copies`, each of kind `kind` (the form from level 2),
/// stamped at `stamped_ms`, with a 60-s window.
pub(super) fn kinded(stamped_ms: u64, copies: Vec<Observation>, kind: KeyKind) -> Command {
    let kinds = vec![kind; copies.len()];
    Command::ObserveKinds {
        stamped_ms,
        window: crate::Window::from_ms(60_000),
        observations: copies,
        properties: Vec::new(),
        slim: Vec::new(),
        kinds,
    }
}

pub(super) fn observe(stamped_ms: u64, window_ms: u64, observations: Vec<Observation>) -> Command {
    Command::Observe {
        stamped_ms,
        window: crate::Window::from_ms(window_ms),
        observations,
    }
}

/// A database without a background flusher thread, so that it is
/// closed soon after it is dropped and can be opened again. sled's own
/// I/O threads may still hold the file lock for a moment after the drop
/// (seen once under a loaded test run), so the open is retried briefly.
pub(super) fn reopenable(path: &std::path::Path) -> sled::Db {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        match sled::Config::new().path(path).flush_every_ms(None).open() {
            Ok(db) => return db,
            Err(e) if Instant::now() < deadline && e.to_string().contains("lock") => {
                std::thread::sleep(Duration::from_millis(20));
            }
            Err(e) => panic!("reopen {}: {e}", path.display()),
        }
    }
}

pub(super) fn publish(s: &StateStore, topic: &str, seq: u64, log_index: u64) {
    let cmd = Command::Published {
        pulsar_topic: topic.into(),
        seq,
    };
    s.apply(Some(&cmd), log_index, &log_index.to_be_bytes())
        .unwrap();
}

//! The dead-letter store: messages firstseen will not forward (oversized,
//! unrouted) are written here, fsynced, before they are acked upstream.
//!
//! The store is bounded like every other state of a node (G5): by bytes and
//! by age. Past either bound the oldest files go first. A dead letter is an
//! operator's copy of a message firstseen decided not to forward, so the
//! store keeps the newest ones rather than stop acking: holding acks for a
//! full dead-letter store would let one sender of bad messages stall every
//! other message on its connection (G8).
//!
//! Unrouted messages (no route wants them: anyone may publish on a topic
//! the node subscribes to) have a bound of their own, checked before one is
//! stored: past it they are counted and not kept, so a sender of unrouted
//! messages cannot evict the dead letters of other reasons. Each file's name
//! holds its receive time, its reason and a suffix that makes it unique: two
//! messages with the same payload in the same millisecond are two files.
//! Messages the publisher sets aside are not kept here (they are replicated
//! state, `firstseen_store`'s set-aside store).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::AsyncWriteExt;
use tokio_util::sync::CancellationToken;

/// How often files past the retention are looked for when nothing new is
/// stored.
const SWEEP_EVERY: Duration = Duration::from_secs(60);

/// What the store may hold.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Bounds {
    pub max_bytes: u64,
    pub retention_ms: u64,
    /// Of `max_bytes`, what unrouted messages may hold.
    pub unrouted_max_bytes: u64,
}

/// The reason of unrouted messages, which have a bound of their own.
pub const UNROUTED: &str = "unrouted";

/// What [`DeadLetter::store`] did with a message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Stored {
    /// Written, fsynced, at this path.
    At(PathBuf),
    /// Not kept: an unrouted message past the unrouted bound. Counted.
    OverBound,
}

/// Why a file was removed, for the metric and the log.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Removal {
    Quota,
    Retention,
}

impl Removal {
    pub fn label(self) -> &'static str {
        match self {
            Removal::Quota => "quota",
            Removal::Retention => "retention",
        }
    }
}

/// The pure core: which files the store holds, oldest first, and which to
/// remove to stay within its bounds.
#[derive(Debug, Default)]
pub struct Ledger {
    /// (received_ms, file name) → bytes on disk.
    files: BTreeMap<(u64, String), u64>,
    bytes: u64,
    /// Of those, unrouted messages' ([`reason_of`]).
    unrouted: u64,
}

impl Ledger {
    /// Notes a file; returns the files to remove so the store fits its
    /// quota again. The newest file is always kept, even if it alone is
    /// over the quota: it is the one just acked.
    pub fn add(
        &mut self,
        received_ms: u64,
        name: String,
        bytes: u64,
        max_bytes: u64,
    ) -> Vec<String> {
        let unrouted = reason_of(&name) == Some(UNROUTED);
        if let Some(old) = self.files.insert((received_ms, name), bytes) {
            self.bytes -= old;
            if unrouted {
                self.unrouted -= old;
            }
        }
        self.bytes += bytes;
        if unrouted {
            self.unrouted += bytes;
        }
        let mut removed = Vec::new();
        while self.bytes > max_bytes && self.files.len() > 1 {
            let Some(((_, name), b)) = self.files.pop_first() else {
                break;
            };
            self.forget(&name, b);
            removed.push(name);
        }
        removed
    }

    fn forget(&mut self, name: &str, bytes: u64) {
        self.bytes -= bytes;
        if reason_of(name) == Some(UNROUTED) {
            self.unrouted -= bytes;
        }
    }

    /// Whether an unrouted message of `bytes` fits the unrouted bound.
    pub fn unrouted_fits(&self, bytes: u64, bound: u64) -> bool {
        self.unrouted.saturating_add(bytes) <= bound
    }

    /// Whether the store has a file of this name.
    pub fn has(&self, name: &str) -> bool {
        self.files.keys().any(|(_, n)| n == name)
    }

    /// The files received before `now_ms - retention_ms`, forgotten here.
    pub fn expire(&mut self, now_ms: u64, retention_ms: u64) -> Vec<String> {
        let cutoff = now_ms.saturating_sub(retention_ms);
        let mut removed = Vec::new();
        while let Some(entry) = self.files.first_entry() {
            if entry.key().0 >= cutoff {
                break;
            }
            let ((_, name), b) = entry.remove_entry();
            self.forget(&name, b);
            removed.push(name);
        }
        removed
    }

    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    pub fn len(&self) -> usize {
        self.files.len()
    }

    pub fn is_empty(&self) -> bool {
        self.files.is_empty()
    }
}

/// The receive time a dead-letter file's name starts with, if it is one.
pub fn received_ms_of(name: &str) -> Option<u64> {
    let stem = name.strip_suffix(".msg")?;
    let (ms, _) = stem.split_once('-')?;
    ms.parse().ok()
}

/// The reason a dead-letter file's name holds (`<ms>-<reason>-<digest>…`),
/// if it holds one (names from before reasons do not).
pub fn reason_of(name: &str) -> Option<&str> {
    let stem = name.strip_suffix(".msg")?;
    let mut parts = stem.splitn(3, '-');
    parts.next()?;
    let reason = parts.next()?;
    parts.next()?;
    reason
        .bytes()
        .all(|b| b.is_ascii_lowercase() || b == b'_')
        .then_some(reason)
}

/// A reason as a file name holds it: lowercase letters, `-` as `_`.
fn name_part(reason: &str) -> String {
    reason
        .chars()
        .map(|c| match c {
            'a'..='z' => c,
            'A'..='Z' => c.to_ascii_lowercase(),
            _ => '_',
        })
        .collect()
}

/// Files in `<data_dir>/dead-letter/`, one per message: a JSON header line,
/// then the raw payload.
#[derive(Clone)]
pub struct DeadLetter {
    dir: PathBuf,
    bounds: Bounds,
    ledger: Arc<Mutex<Ledger>>,
}

#[derive(serde::Serialize)]
struct Header<'a> {
    reason: &'a str,
    topic: &'a str,
    /// Unknown (null) for a message set aside by the publisher: the outbox
    /// does not keep them.
    qos: Option<u8>,
    retain: Option<bool>,
    bytes: usize,
    received_ms: u64,
}

impl DeadLetter {
    /// The store in `dir`, with what a previous run left there counted (and
    /// half-written files from a crash removed).
    pub fn open(dir: PathBuf, bounds: Bounds) -> Self {
        let mut ledger = Ledger::default();
        if let Ok(entries) = std::fs::read_dir(&dir) {
            for e in entries.flatten() {
                let name = e.file_name().to_string_lossy().into_owned();
                if name.ends_with(".partial") {
                    let _ = std::fs::remove_file(e.path());
                    continue;
                }
                // Anything else the operator put there is theirs: neither
                // counted nor removed.
                let (Some(ms), Ok(meta)) = (received_ms_of(&name), e.metadata()) else {
                    continue;
                };
                ledger.add(ms, name, meta.len(), u64::MAX);
            }
        }
        let store = Self {
            dir,
            bounds,
            ledger: Arc::new(Mutex::new(ledger)),
        };
        // A smaller quota than the last run's takes effect now.
        let over = {
            let mut l = store.lock();
            let newest = l.files.last_key_value().map(|(k, b)| (k.clone(), *b));
            let mut gone = Vec::new();
            if let Some(((ms, name), b)) = newest {
                gone = l.add(ms, name, b, bounds.max_bytes);
            }
            gone
        };
        store.remove(&over, Removal::Quota);
        store.publish_gauges();
        store
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Ledger> {
        firstseen_store::lock::lock(&self.ledger)
    }

    /// Removes files the ledger has already forgotten. A file that cannot be
    /// removed (already gone, read-only) is logged and left: the ledger no
    /// longer counts it, so a stuck file costs at most its own size.
    fn remove(&self, names: &[String], why: Removal) {
        for name in names {
            match std::fs::remove_file(self.dir.join(name)) {
                Ok(()) => {
                    metrics::counter!("firstseen_dead_letter_removed_total", "reason" => why.label())
                        .increment(1);
                    tracing::info!(file = %name, reason = why.label(), "dead letter removed");
                }
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => {
                    tracing::warn!(file = %name, error = %e, "cannot remove a dead letter")
                }
            }
        }
    }

    fn publish_gauges(&self) {
        let (bytes, files) = {
            let l = self.lock();
            (l.bytes(), l.len())
        };
        metrics::gauge!("firstseen_dead_letter_bytes").set(bytes as f64);
        metrics::gauge!("firstseen_dead_letter_files").set(files as f64);
    }

    /// Removes files past the retention, now and every minute until `stop`.
    pub async fn sweep(self, stop: CancellationToken) {
        loop {
            let gone = self.lock().expire(wall_ms(), self.bounds.retention_ms);
            if !gone.is_empty() {
                let store = self.clone();
                let _ = tokio::task::spawn_blocking(move || {
                    store.remove(&gone, Removal::Retention);
                    store.publish_gauges();
                })
                .await;
            }
            tokio::select! {
                _ = tokio::time::sleep(SWEEP_EVERY) => {}
                _ = stop.cancelled() => return,
            }
        }
    }

    /// Stores one message durably and says where, or that it was not kept
    /// (an unrouted message past its bound: checked before anything is
    /// written).
    pub async fn store(
        &self,
        reason: &str,
        topic: &str,
        qos: Option<u8>,
        retain: Option<bool>,
        payload: &[u8],
        received_ms: u64,
    ) -> std::io::Result<Stored> {
        if !self.dir.is_dir() {
            let dir = self.dir.clone();
            tokio::task::spawn_blocking(move || firstseen_store::disk::create_dir_durable(&dir))
                .await
                .map_err(std::io::Error::other)?
                .map_err(std::io::Error::other)?;
        }
        let digest = blake3::hash(payload).to_hex();
        let stem = format!(
            "{received_ms}-{}-{}",
            name_part(reason),
            &digest.as_str()[..16]
        );
        let size_hint = (payload.len() + topic.len() + 128) as u64;
        let name = {
            let l = self.lock();
            if reason == UNROUTED && !l.unrouted_fits(size_hint, self.bounds.unrouted_max_bytes) {
                return Ok(Stored::OverBound);
            }
            // Unique: the same payload in the same millisecond is another
            // file, never the same one written over.
            let mut name = format!("{stem}.msg");
            let mut n = 1u32;
            while l.has(&name) || self.dir.join(&name).exists() {
                n += 1;
                name = format!("{stem}-{n}.msg");
            }
            name
        };
        let path = self.dir.join(&name);
        let header = Header {
            reason,
            topic,
            qos,
            retain,
            bytes: payload.len(),
            received_ms,
        };
        let mut line = serde_json::to_vec(&header).map_err(std::io::Error::other)?;
        line.push(b'\n');
        // Written under a temporary name and renamed, so a crash or a full
        // disk never leaves a partial file that looks like a message; the
        // directory is synced so the name survives a power cut. Only then
        // is the message acked.
        let tmp = path.with_extension("partial");
        let written = async {
            let mut f = tokio::fs::File::create(&tmp).await?;
            f.write_all(&line).await?;
            f.write_all(payload).await?;
            f.sync_all().await?;
            tokio::fs::rename(&tmp, &path).await?;
            let dir = self.dir.clone();
            tokio::task::spawn_blocking(move || std::fs::File::open(&dir)?.sync_all())
                .await
                .map_err(std::io::Error::other)?
        }
        .await;
        if let Err(e) = written {
            let _ = tokio::fs::remove_file(&tmp).await;
            return Err(e);
        }
        let size = (line.len() + payload.len()) as u64;
        let over = self
            .lock()
            .add(received_ms, name, size, self.bounds.max_bytes);
        if !over.is_empty() {
            let store = self.clone();
            let _ = tokio::task::spawn_blocking(move || store.remove(&over, Removal::Quota)).await;
        }
        self.publish_gauges();
        Ok(Stored::At(path))
    }
}

fn wall_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn past_the_quota_the_oldest_files_go_first() {
        let mut l = Ledger::default();
        assert!(l.add(3, "3-c.msg".into(), 40, 100).is_empty());
        assert!(l.add(1, "1-a.msg".into(), 40, 100).is_empty());
        assert_eq!(
            l.add(2, "2-b.msg".into(), 40, 100),
            vec!["1-a.msg".to_string()]
        );
        assert_eq!(l.bytes(), 80);
        assert_eq!(l.len(), 2);
    }

    #[test]
    fn a_file_larger_than_the_quota_is_kept_alone() {
        let mut l = Ledger::default();
        l.add(1, "1-a.msg".into(), 10, 100);
        assert_eq!(
            l.add(2, "2-b.msg".into(), 500, 100),
            vec!["1-a.msg".to_string()]
        );
        assert_eq!(l.len(), 1);
        assert_eq!(l.bytes(), 500);
    }

    #[test]
    fn retention_removes_only_what_is_older() {
        let mut l = Ledger::default();
        for ms in [100, 200, 300] {
            l.add(ms, format!("{ms}-x.msg"), 1, u64::MAX);
        }
        assert_eq!(l.expire(250, 100), vec!["100-x.msg".to_string()]);
        assert_eq!(l.expire(250, 100), Vec::<String>::new());
        assert_eq!(l.len(), 2);
        // A retention longer than the epoch removes nothing.
        assert!(l.expire(10, u64::MAX).is_empty());
    }

    #[test]
    fn names_not_written_by_the_store_are_not_its_files() {
        assert_eq!(
            received_ms_of("1733300000000-0123456789abcdef.msg"),
            Some(1733300000000)
        );
        assert_eq!(received_ms_of("notes.txt"), None);
        assert_eq!(received_ms_of("x-1.msg"), None);
        assert_eq!(received_ms_of("17.partial"), None);
    }

    #[tokio::test]
    async fn the_store_keeps_its_quota_across_restarts() {
        let dir = tempfile::TempDir::new().unwrap();
        let d = dir.path().join("dead-letter");
        let bounds = Bounds {
            max_bytes: 1000,
            retention_ms: u64::MAX,
            unrouted_max_bytes: 1000,
        };
        let store = DeadLetter::open(d.clone(), bounds);
        for i in 0..10u64 {
            store
                .store(
                    "oversize",
                    "t",
                    Some(1),
                    Some(false),
                    &[i as u8; 300],
                    1000 + i,
                )
                .await
                .unwrap();
        }
        let files = || std::fs::read_dir(&d).unwrap().count();
        // Each file is 300 bytes of payload plus a header line.
        assert_eq!(files(), 2);
        std::fs::write(d.join("17-abc.partial"), b"half").unwrap();
        std::fs::write(d.join("README"), b"operator's").unwrap();
        let smaller = DeadLetter::open(
            d.clone(),
            Bounds {
                max_bytes: 10,
                ..bounds
            },
        );
        assert_eq!(smaller.lock().len(), 1, "a lower quota applies at open");
        let names: Vec<String> = std::fs::read_dir(&d)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert_eq!(names.len(), 2, "{names:?}");
        assert!(names.contains(&"README".to_string()));
        assert!(names.iter().any(|n| n.starts_with("1009-")), "{names:?}");
    }

    /// Two messages with the same payload in the same millisecond: named
    /// `{ms}-{hash16}`, the second overwrote the first.
    #[tokio::test]
    async fn the_same_payload_in_the_same_millisecond_is_two_files() {
        let dir = tempfile::TempDir::new().unwrap();
        let store = DeadLetter::open(
            dir.path().join("dead-letter"),
            Bounds {
                max_bytes: u64::MAX,
                retention_ms: u64::MAX,
                unrouted_max_bytes: u64::MAX,
            },
        );
        let a = store
            .store("oversize", "t/a", Some(1), Some(false), b"same", 5)
            .await
            .unwrap();
        let b = store
            .store("oversize", "t/b", Some(1), Some(false), b"same", 5)
            .await
            .unwrap();
        let (Stored::At(a), Stored::At(b)) = (a, b) else {
            panic!("both kept");
        };
        assert_ne!(a, b);
        assert!(std::fs::read_to_string(&a).unwrap().contains("t/a"));
        assert!(std::fs::read_to_string(&b).unwrap().contains("t/b"));
        assert_eq!(
            reason_of(&a.file_name().unwrap().to_string_lossy()),
            Some("oversize")
        );
    }

    /// Unrouted messages have a bound of their own, checked before one is
    /// written: past it they are not kept, and the other dead letters stay.
    #[tokio::test]
    async fn unrouted_messages_cannot_evict_the_other_dead_letters() {
        let dir = tempfile::TempDir::new().unwrap();
        let store = DeadLetter::open(
            dir.path().join("dead-letter"),
            Bounds {
                max_bytes: 10_000,
                retention_ms: u64::MAX,
                unrouted_max_bytes: 1_000,
            },
        );
        let kept = store
            .store("oversize", "t", Some(1), Some(false), &[1; 2_000], 1)
            .await
            .unwrap();
        assert!(matches!(kept, Stored::At(_)));
        let mut not_kept = 0;
        for i in 0..100u64 {
            if store
                .store(UNROUTED, "u", Some(1), Some(false), &[2; 300], 10 + i)
                .await
                .unwrap()
                == Stored::OverBound
            {
                not_kept += 1;
            }
        }
        assert!(not_kept >= 97, "{not_kept}");
        let l = store.lock();
        assert!(l
            .files
            .keys()
            .any(|(_, n)| reason_of(n) == Some("oversize")));
        assert!(l.unrouted <= 1_000, "{}", l.unrouted);
    }
}

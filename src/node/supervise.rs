//! Fail-fast for the node's long-running tasks.
//!
//! Every task of a running node (ingest, batcher, publisher, elections,
//! heartbeats, HTTP, the peer listener, the watchdogs) is meant to run until
//! the node is asked to stop. One that returns or panics earlier leaves a
//! node that is half alive: a dead batcher, say, leaves a node that still
//! answers `/readyz` and holds its upstream sessions but never acks again.
//! So the supervisor hears of every task that ends before the stop was asked
//! for, and the node then stops in order and exits with a failure status,
//! which a process supervisor (systemd `Restart=on-failure`, Kubernetes)
//! answers with a restart from what is on stable storage. Nothing acked is
//! lost by that: acks follow commits.
//!
//! A task that ends only because another one did (an upstream whose batcher
//! is gone) waits for the stop instead of returning, so that the report
//! names the task that failed first.

use std::any::Any;
use std::future::Future;
use std::panic::AssertUnwindSafe;

use futures::FutureExt;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

pub use crate::Early;

/// Spawns the node's tasks and reports the first that ends early.
///
/// It owns every task of the node: the long-running ones spawned here, and
/// the short-lived children (a peer connection's reader and writer, a dial,
/// a TLS handshake) that components spawn on [`Supervisor::tracker`]. The
/// node's stop waits for all of them, within its bound.
pub struct Supervisor {
    tracker: TaskTracker,
    stopping: CancellationToken,
    tx: mpsc::UnboundedSender<Early>,
    rx: mpsc::UnboundedReceiver<Early>,
}

impl Supervisor {
    /// A task that ends once `stopping` is cancelled ends as asked; one that
    /// ends before is reported by [`Supervisor::early`].
    pub fn new(stopping: CancellationToken) -> Self {
        let (tx, rx) = mpsc::unbounded_channel();
        Supervisor {
            tracker: TaskTracker::new(),
            stopping,
            tx,
            rx,
        }
    }

    /// Where components spawn their short-lived children. Those are not
    /// watched for ending early (a connection ends when its peer goes), only
    /// waited for at the stop.
    pub fn tracker(&self) -> TaskTracker {
        self.tracker.clone()
    }

    /// Waits until every task spawned here or on the tracker has ended, or
    /// `deadline` passes. Returns how many were still running then.
    pub async fn wait_all(&self, deadline: tokio::time::Instant) -> usize {
        self.tracker.close();
        match tokio::time::timeout_at(deadline, self.tracker.wait()).await {
            Ok(()) => 0,
            Err(_) => self.tracker.len(),
        }
    }

    /// Spawns `task` under `name`. The handle still reports a panic to
    /// whoever joins it, so the ordered stop can log it too.
    pub fn spawn<F>(&self, name: &'static str, task: F) -> JoinHandle<()>
    where
        F: Future<Output = ()> + Send + 'static,
    {
        let tx = self.tx.clone();
        let stopping = self.stopping.clone();
        #[cfg(debug_assertions)]
        let task = planted::panic_on_cue(name, task);
        self.tracker.spawn(async move {
            let outcome = AssertUnwindSafe(task).catch_unwind().await;
            if !stopping.is_cancelled() {
                let panic = outcome.as_ref().err().map(|p| panic_message(p.as_ref()));
                // The receiver lives as long as the node's run; after it
                // there is nobody left to tell.
                let _ = tx.send(Early { task: name, panic });
            }
            if let Err(p) = outcome {
                std::panic::resume_unwind(p);
            }
        })
    }

    /// The first task that ended early. Pending for as long as none has.
    pub async fn early(&mut self) -> Early {
        match self.rx.recv().await {
            Some(e) => e,
            // Unreachable while `self` holds a sender; pending keeps the
            // caller's select on its other branches if it ever were.
            None => std::future::pending().await,
        }
    }
}

/// A fault for the tests, in debug builds only (release builds compile it
/// out): with `FIRSTSEEN_TEST_PANIC=<task>:<path>` in its environment, the
/// node's task of that name panics once a file exists at `<path>`, so that a
/// test on the real brokers can kill one task of a running node at a moment
/// it chooses (`tests/shutdown.rs`).
#[cfg(debug_assertions)]
mod planted {
    use std::future::Future;
    use std::path::PathBuf;
    use std::pin::Pin;
    use std::time::Duration;

    pub fn panic_on_cue<F>(name: &'static str, task: F) -> Pin<Box<dyn Future<Output = ()> + Send>>
    where
        F: Future<Output = ()> + Send + 'static,
    {
        let cue = std::env::var("FIRSTSEEN_TEST_PANIC").ok().and_then(|v| {
            let (task, path) = v.split_once(':')?;
            (task == name).then(|| PathBuf::from(path))
        });
        let Some(cue) = cue else {
            return Box::pin(task);
        };
        Box::pin(async move {
            tokio::select! {
                _ = task => {}
                _ = async {
                    while !cue.exists() {
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    }
                } => panic!("planted by FIRSTSEEN_TEST_PANIC"),
            }
        })
    }
}

fn panic_message(p: &(dyn Any + Send)) -> String {
    if let Some(s) = p.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = p.downcast_ref::<String>() {
        s.clone()
    } else {
        "a panic without a message".to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test]
    async fn a_task_that_panics_before_the_stop_is_reported_with_its_message() {
        let stop = CancellationToken::new();
        let mut s = Supervisor::new(stop.clone());
        let _quiet = s.spawn("quiet", {
            let stop = stop.clone();
            async move { stop.cancelled().await }
        });
        let h = s.spawn("batcher", async {
            tokio::time::sleep(Duration::from_millis(10)).await;
            panic!("the batcher broke");
        });
        let e = tokio::time::timeout(Duration::from_secs(5), s.early())
            .await
            .expect("an early end is reported");
        assert_eq!(e.task, "batcher");
        assert_eq!(e.panic.as_deref(), Some("the batcher broke"));
        assert!(
            h.await.unwrap_err().is_panic(),
            "the handle still sees the panic"
        );
    }

    #[tokio::test]
    async fn a_task_that_returns_before_the_stop_is_reported() {
        let stop = CancellationToken::new();
        let mut s = Supervisor::new(stop.clone());
        s.spawn("http", async {});
        let e = tokio::time::timeout(Duration::from_secs(5), s.early())
            .await
            .expect("an early end is reported");
        assert_eq!(
            e.to_string(),
            "task `http` ended before the node was stopped"
        );
    }

    #[tokio::test]
    async fn tasks_that_end_after_the_stop_are_not_reported() {
        let stop = CancellationToken::new();
        let mut s = Supervisor::new(stop.clone());
        let h = s.spawn("publisher", {
            let stop = stop.clone();
            async move { stop.cancelled().await }
        });
        stop.cancel();
        h.await.unwrap();
        let heard = tokio::time::timeout(Duration::from_millis(200), s.early()).await;
        assert!(
            heard.is_err(),
            "a task that ended as asked was reported: {heard:?}"
        );
    }
}

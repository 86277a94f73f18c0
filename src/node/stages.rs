//! The node as an ordered list of stages.
//!
//! A stage is a name, a cancellation token and the tasks that run until it
//! is cancelled. The node adds its stages in the order they start; they stop
//! in the reverse order, one at a time: a stage is cancelled, its tasks are
//! waited for, and only then is the stage before it cancelled. So a stage
//! may rely on every stage added before it for as long as it runs (the
//! publisher on the peer links and the coalescer, the batcher's last batch
//! on the publisher's group), and adding a stage is one line in the list.
//!
//! The stop has one bound, counted from when it begins. A stage that does
//! not end within its share is abandoned (its tasks aborted) and the stop
//! goes on: nothing acked is lost by that, because acks follow commits and
//! whatever was not committed is still unacked with the upstream broker.
//!
//! Every stage's token is a child of one root: after the last stage the
//! root is cancelled, so no task that took a token is left waiting on one
//! that is never cancelled. Every task runs under the [`Supervisor`], which
//! makes the node fail fast when one ends before the stop was asked for.

use std::future::Future;
use std::time::Duration;

use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::supervise::{Early, Supervisor};

/// How much of the stop's bound a stage may use, counted from the start of
/// the stop.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Share {
    /// Until the bound ends.
    Whole,
    /// Half of it, so that the stages after it have the other half even
    /// when this one cannot finish (a batch that cannot commit without a
    /// quorum). `late` is logged when it runs out.
    Half { late: &'static str },
}

/// A stage, as the node refers to it when spawning its tasks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StageId(usize);

struct Stage {
    name: &'static str,
    share: Share,
    stop: CancellationToken,
    tasks: Vec<(&'static str, JoinHandle<()>)>,
}

/// The node's stages, in the order they start.
pub struct Stages {
    root: CancellationToken,
    supervisor: Supervisor,
    list: Vec<Stage>,
}

impl Stages {
    /// `asked` is the node's stop: a task that ends after it was cancelled
    /// ended as asked; one that ends before is reported by
    /// [`Stages::early`].
    pub fn new(asked: CancellationToken) -> Self {
        Stages {
            root: CancellationToken::new(),
            supervisor: Supervisor::new(asked),
            list: Vec::new(),
        }
    }

    /// Adds a stage after the ones already added: it starts after them and
    /// stops before them.
    pub fn add(&mut self, name: &'static str, share: Share) -> StageId {
        self.list.push(Stage {
            name,
            share,
            stop: self.root.child_token(),
            tasks: Vec::new(),
        });
        StageId(self.list.len() - 1)
    }

    /// The token that asks `stage`'s tasks to end.
    pub fn token(&self, stage: StageId) -> CancellationToken {
        self.list[stage.0].stop.clone()
    }

    /// Runs `task` as part of `stage`, under the supervisor.
    pub fn spawn<F>(&mut self, stage: StageId, name: &'static str, task: F)
    where
        F: Future<Output = ()> + Send + 'static,
    {
        let handle = self.supervisor.spawn(name, task);
        self.list[stage.0].tasks.push((name, handle));
    }

    /// Where components spawn their short-lived children (connections,
    /// dials, handshakes); waited for by [`Stages::wait_all`].
    pub fn tracker(&self) -> TaskTracker {
        self.supervisor.tracker()
    }

    /// The first task that ended before the stop. Pending while none has.
    pub async fn early(&mut self) -> Early {
        self.supervisor.early().await
    }

    /// The stages' names in the order they stop, for the log.
    pub fn stop_order(&self) -> String {
        let names: Vec<&str> = self.list.iter().rev().map(|s| s.name).collect();
        names.join(", ")
    }

    /// Stops the stages in reverse order within `bound`, and returns the
    /// deadline it ran to. A stage that misses its share is abandoned.
    pub async fn stop(&mut self, bound: Duration) -> Instant {
        let start = Instant::now();
        let deadline = start + bound;
        for stage in self.list.iter_mut().rev() {
            let until = match stage.share {
                Share::Whole => deadline,
                Share::Half { .. } => start + bound / 2,
            };
            tracing::debug!(stage = stage.name, "stopping");
            stage.stop.cancel();
            let mut on_time = true;
            for (name, task) in stage.tasks.drain(..) {
                on_time &= finish(task, until, name).await;
            }
            if let (false, Share::Half { late }) = (on_time, stage.share) {
                tracing::warn!(stage = stage.name, "{late}");
            }
        }
        self.root.cancel();
        deadline
    }

    /// Waits for every task and child until `deadline`; returns how many
    /// were still running then.
    pub async fn wait_all(&self, deadline: Instant) -> usize {
        self.supervisor.wait_all(deadline).await
    }
}

/// Waits for a task until `deadline`, then aborts it. Returns whether it
/// ended by itself. A task that panicked is logged, not hidden.
async fn finish(mut task: JoinHandle<()>, deadline: Instant, name: &str) -> bool {
    match tokio::time::timeout_at(deadline, &mut task).await {
        Ok(Ok(())) => true,
        Ok(Err(e)) => {
            tracing::error!(task = name, error = %e, "task failed");
            true
        }
        Err(_) => {
            tracing::warn!(task = name, "did not stop in time; abandoned");
            task.abort();
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};

    /// A task that records its name when its stage is cancelled and when it
    /// ends, after `linger`.
    fn recorder(
        log: &Arc<Mutex<Vec<String>>>,
        name: &'static str,
        stop: CancellationToken,
        linger: Duration,
    ) -> impl Future<Output = ()> + Send + 'static {
        let log = log.clone();
        async move {
            stop.cancelled().await;
            firstseen_store::lock::lock(&log).push(format!("{name} asked"));
            tokio::time::sleep(linger).await;
            firstseen_store::lock::lock(&log).push(format!("{name} ended"));
        }
    }

    #[tokio::test]
    async fn stages_stop_in_reverse_each_after_the_later_ones_ended() {
        let asked = CancellationToken::new();
        let mut stages = Stages::new(asked.clone());
        let log = Arc::new(Mutex::new(Vec::new()));
        let first = stages.add("first", Share::Whole);
        let second = stages.add("second", Share::Whole);
        let third = stages.add("third", Share::Whole);
        for (id, name) in [(first, "first"), (second, "second"), (third, "third")] {
            let task = recorder(&log, name, stages.token(id), Duration::from_millis(30));
            stages.spawn(id, name, task);
        }
        asked.cancel();
        stages.stop(Duration::from_secs(10)).await;
        assert_eq!(
            *firstseen_store::lock::lock(&log),
            [
                "third asked",
                "third ended",
                "second asked",
                "second ended",
                "first asked",
                "first ended"
            ]
        );
        assert_eq!(stages.wait_all(Instant::now()).await, 0);
    }

    #[tokio::test]
    async fn a_stage_past_its_half_is_abandoned_and_the_rest_still_stop() {
        let asked = CancellationToken::new();
        let mut stages = Stages::new(asked.clone());
        let log = Arc::new(Mutex::new(Vec::new()));
        let rest = stages.add("rest", Share::Whole);
        let stuck = stages.add(
            "stuck",
            Share::Half {
                late: "the stuck stage ran out",
            },
        );
        let task = recorder(&log, "rest", stages.token(rest), Duration::ZERO);
        stages.spawn(rest, "rest", task);
        let task = recorder(
            &log,
            "stuck",
            stages.token(stuck),
            Duration::from_secs(3600),
        );
        stages.spawn(stuck, "stuck", task);
        asked.cancel();
        let began = Instant::now();
        // Half of 4 s is 2 s; the rest stops at once. A wide margin, so a
        // loaded machine's scheduling cannot fail it, but well short of the
        // whole bound the stuck stage would otherwise take.
        stages.stop(Duration::from_secs(4)).await;
        let took = began.elapsed();
        assert!(
            took < Duration::from_millis(3500),
            "the stuck stage held the stop for {took:?}, past its half"
        );
        assert_eq!(
            *firstseen_store::lock::lock(&log),
            ["stuck asked", "rest asked", "rest ended"]
        );
    }

    #[tokio::test]
    async fn every_token_is_cancelled_once_the_stop_is_over() {
        let mut stages = Stages::new(CancellationToken::new());
        let quiet = stages.add("quiet", Share::Whole);
        let token = stages.token(quiet);
        stages.stop(Duration::from_millis(10)).await;
        assert!(token.is_cancelled());
        assert!(stages.root.is_cancelled());
    }

    #[tokio::test]
    async fn a_task_that_ends_before_the_stop_is_reported_by_name() {
        let mut stages = Stages::new(CancellationToken::new());
        let only = stages.add("only", Share::Whole);
        stages.spawn(only, "batcher", async {});
        let early = tokio::time::timeout(Duration::from_secs(5), stages.early())
            .await
            .expect("the early end is reported");
        assert_eq!(early.task, "batcher");
    }
}

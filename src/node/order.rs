//! The node's stop order: its tasks in layers, started in order and
//! stopped in reverse.
//!
//! A layer is a name, a cancellation token and the tasks that run until it
//! is cancelled. The node adds its layers in the order they start; they stop
//! in the reverse order, one at a time: a layer is cancelled, its tasks are
//! waited for, and only then is the layer before it cancelled. So a layer
//! may rely on every layer added before it for as long as it runs (the
//! publisher on the peer links and the coalescer, the batcher's last batch
//! on the cluster layer), and adding a layer is one line in the list.
//!
//! The stop has one bound, counted from when it begins. A layer that does
//! not end within its share is abandoned (its tasks aborted) and the stop
//! goes on: nothing acked is lost by that, because acks follow commits and
//! whatever was not committed is still unacked with the upstream broker.
//!
//! Every layer's token is a child of one root: after the last layer the
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

/// How much of the stop's bound a layer may use, counted from the start of
/// the stop.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Share {
    /// Until the bound ends.
    Whole,
    /// Half of it, so that the layers after it have the other half even
    /// when this one cannot finish (a batch that cannot commit without a
    /// quorum). `late` is logged when it runs out.
    Half { late: &'static str },
}

/// A layer, as the node refers to it when spawning its tasks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LayerId(usize);

struct Layer {
    name: &'static str,
    share: Share,
    stop: CancellationToken,
    tasks: Vec<(&'static str, JoinHandle<()>)>,
}

/// The node's layers, in the order they start.
pub struct StopOrder {
    root: CancellationToken,
    supervisor: Supervisor,
    list: Vec<Layer>,
}

impl StopOrder {
    /// `asked` is the node's stop: a task that ends after it was cancelled
    /// ended as asked; one that ends before is reported by
    /// [`StopOrder::early`].
    pub fn new(asked: CancellationToken) -> Self {
        StopOrder {
            root: CancellationToken::new(),
            supervisor: Supervisor::new(asked),
            list: Vec::new(),
        }
    }

    /// Adds a layer after the ones already added: it starts after them and
    /// stops before them.
    pub fn add(&mut self, name: &'static str, share: Share) -> LayerId {
        self.list.push(Layer {
            name,
            share,
            stop: self.root.child_token(),
            tasks: Vec::new(),
        });
        LayerId(self.list.len() - 1)
    }

    /// The token that asks `layer`'s tasks to end.
    pub fn token(&self, layer: LayerId) -> CancellationToken {
        self.list[layer.0].stop.clone()
    }

    /// Runs `task` as part of `layer`, under the supervisor.
    pub fn spawn<F>(&mut self, layer: LayerId, name: &'static str, task: F)
    where
        F: Future<Output = ()> + Send + 'static,
    {
        let handle = self.supervisor.spawn(name, task);
        self.list[layer.0].tasks.push((name, handle));
    }

    /// Where components spawn their short-lived children (connections,
    /// dials, handshakes); waited for by [`StopOrder::wait_all`].
    pub fn tracker(&self) -> TaskTracker {
        self.supervisor.tracker()
    }

    /// The first task that ended before the stop. Pending while none has.
    pub async fn early(&mut self) -> Early {
        self.supervisor.early().await
    }

    /// The layers' names in the order they stop, for the log.
    pub fn stop_order(&self) -> String {
        let names: Vec<&str> = self.list.iter().rev().map(|s| s.name).collect();
        names.join(", ")
    }

    /// Stops the layers in reverse order within `bound`, and returns the
    /// deadline it ran to. A layer that misses its share is abandoned.
    pub async fn stop(&mut self, bound: Duration) -> Instant {
        let start = Instant::now();
        let deadline = start + bound;
        for layer in self.list.iter_mut().rev() {
            let until = match layer.share {
                Share::Whole => deadline,
                Share::Half { .. } => start + bound / 2,
            };
            tracing::debug!(layer = layer.name, "stopping");
            layer.stop.cancel();
            let mut on_time = true;
            for (name, task) in layer.tasks.drain(..) {
                on_time &= finish(task, until, name).await;
            }
            if let (false, Share::Half { late }) = (on_time, layer.share) {
                tracing::warn!(layer = layer.name, "{late}");
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

    /// A task that records its name when its layer is cancelled and when it
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
    async fn layers_stop_in_reverse_each_after_the_later_ones_ended() {
        let asked = CancellationToken::new();
        let mut order = StopOrder::new(asked.clone());
        let log = Arc::new(Mutex::new(Vec::new()));
        let first = order.add("first", Share::Whole);
        let second = order.add("second", Share::Whole);
        let third = order.add("third", Share::Whole);
        for (id, name) in [(first, "first"), (second, "second"), (third, "third")] {
            let task = recorder(&log, name, order.token(id), Duration::from_millis(30));
            order.spawn(id, name, task);
        }
        asked.cancel();
        order.stop(Duration::from_secs(10)).await;
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
        assert_eq!(order.wait_all(Instant::now()).await, 0);
    }

    #[tokio::test]
    async fn a_layer_past_its_half_is_abandoned_and_the_rest_still_stop() {
        let asked = CancellationToken::new();
        let mut order = StopOrder::new(asked.clone());
        let log = Arc::new(Mutex::new(Vec::new()));
        let rest = order.add("rest", Share::Whole);
        let stuck = order.add(
            "stuck",
            Share::Half {
                late: "the stuck layer ran out",
            },
        );
        let task = recorder(&log, "rest", order.token(rest), Duration::ZERO);
        order.spawn(rest, "rest", task);
        let task = recorder(&log, "stuck", order.token(stuck), Duration::from_secs(3600));
        order.spawn(stuck, "stuck", task);
        asked.cancel();
        let began = Instant::now();
        // Half of 4 s is 2 s; the rest stops at once. A wide margin, so a
        // loaded machine's scheduling cannot fail it, but well short of the
        // whole bound the stuck layer would otherwise take.
        order.stop(Duration::from_secs(4)).await;
        let took = began.elapsed();
        assert!(
            took < Duration::from_millis(3500),
            "the stuck layer held the stop for {took:?}, past its half"
        );
        assert_eq!(
            *firstseen_store::lock::lock(&log),
            ["stuck asked", "rest asked", "rest ended"]
        );
    }

    #[tokio::test]
    async fn every_token_is_cancelled_once_the_stop_is_over() {
        let mut order = StopOrder::new(CancellationToken::new());
        let quiet = order.add("quiet", Share::Whole);
        let token = order.token(quiet);
        order.stop(Duration::from_millis(10)).await;
        assert!(token.is_cancelled());
        assert!(order.root.is_cancelled());
    }

    #[tokio::test]
    async fn a_task_that_ends_before_the_stop_is_reported_by_name() {
        let mut order = StopOrder::new(CancellationToken::new());
        let only = order.add("only", Share::Whole);
        order.spawn(only, "batcher", async {});
        let early = tokio::time::timeout(Duration::from_secs(5), order.early())
            .await
            .expect("the early end is reported");
        assert_eq!(early.task, "batcher");
    }
}

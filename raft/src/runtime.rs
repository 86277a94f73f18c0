//! The runtime openraft's own tasks run on: tokio, with one addition. A
//! task spawned inside a [`Gate`]'s scope runs under that gate, and so do
//! the tasks it spawns in turn.
//!
//! A node never sets a gate, and then this is tokio and nothing else. The
//! whole-cluster simulation (`tests/simulate_cluster.rs`) runs three nodes
//! on one runtime and pauses one of them as SIGSTOP would: opening the
//! node's group inside its gate's scope puts openraft's core, its
//! replication tasks and every other task openraft spawns under the same
//! gate as the node's own tasks. Without it a paused node's Raft core went
//! on deciding, and only its network stood still.

use std::future::Future;
use std::time::Duration;

use openraft::async_runtime::watch as rt_watch;
use openraft::{AsyncRuntime, OptionalSend, OptionalSync};
use tokio::sync::watch;

/// A pause switch: while it reads `true`, the tasks under it are not
/// polled. Their timers still come due and fire together when it turns
/// `false` again.
#[derive(Debug, Clone)]
pub struct Gate(pub watch::Receiver<bool>);

tokio::task_local! {
    static GATE: Gate;
}

impl Gate {
    /// Runs `f` with this gate over every task openraft spawns meanwhile.
    pub async fn scope<F: Future>(self, f: F) -> F::Output {
        GATE.scope(self, f).await
    }

    /// Runs `task` while the gate is open; pauses it while it is closed.
    /// A gate whose switch is gone stays as it was last set.
    pub async fn run<F: Future>(mut self, task: F) -> F::Output {
        let mut task = std::pin::pin!(task);
        loop {
            if *self.0.borrow_and_update() {
                if self.0.changed().await.is_err() {
                    return task.await;
                }
                continue;
            }
            tokio::select! {
                biased;
                changed = self.0.changed() => {
                    if changed.is_err() {
                        return task.await;
                    }
                }
                out = &mut task => return out,
            }
        }
    }
}

/// tokio, with spawned tasks kept under the spawner's [`Gate`].
///
/// openraft 0.10 asks a runtime to own an executor of its own (`new`,
/// `block_on`) for its test suites; firstseen never calls them, and they are
/// tokio's.
#[derive(Debug)]
pub struct GatedTokio(Tokio);

type Tokio = openraft_rt_tokio::TokioRuntime;

impl AsyncRuntime for GatedTokio {
    type JoinError = <Tokio as AsyncRuntime>::JoinError;
    type JoinHandle<T: OptionalSend + 'static> = <Tokio as AsyncRuntime>::JoinHandle<T>;
    type Sleep = <Tokio as AsyncRuntime>::Sleep;
    type Instant = <Tokio as AsyncRuntime>::Instant;
    type TimeoutError = <Tokio as AsyncRuntime>::TimeoutError;
    type Timeout<R, T: Future<Output = R> + OptionalSend> = <Tokio as AsyncRuntime>::Timeout<R, T>;
    type ThreadLocalRng = <Tokio as AsyncRuntime>::ThreadLocalRng;
    type Mpsc = <Tokio as AsyncRuntime>::Mpsc;
    type Watch = TokioWatch;
    type Oneshot = <Tokio as AsyncRuntime>::Oneshot;
    type Mutex<T: OptionalSend + 'static> = <Tokio as AsyncRuntime>::Mutex<T>;

    fn spawn<T>(future: T) -> Self::JoinHandle<T::Output>
    where
        T: Future + OptionalSend + 'static,
        T::Output: OptionalSend + 'static,
    {
        match GATE.try_with(Gate::clone) {
            Ok(gate) => Tokio::spawn(GATE.scope(gate.clone(), gate.run(future))),
            Err(_) => Tokio::spawn(future),
        }
    }

    fn sleep(duration: Duration) -> Self::Sleep {
        Tokio::sleep(duration)
    }

    fn sleep_until(deadline: Self::Instant) -> Self::Sleep {
        Tokio::sleep_until(deadline)
    }

    fn timeout<R, F: Future<Output = R> + OptionalSend>(
        duration: Duration,
        future: F,
    ) -> Self::Timeout<R, F> {
        Tokio::timeout(duration, future)
    }

    fn timeout_at<R, F: Future<Output = R> + OptionalSend>(
        deadline: Self::Instant,
        future: F,
    ) -> Self::Timeout<R, F> {
        Tokio::timeout_at(deadline, future)
    }

    fn is_panic(join_error: &Self::JoinError) -> bool {
        Tokio::is_panic(join_error)
    }

    fn thread_rng() -> Self::ThreadLocalRng {
        Tokio::thread_rng()
    }

    fn new(threads: usize) -> Self {
        GatedTokio(Tokio::new(threads))
    }

    fn block_on<F, T>(&mut self, future: F) -> T
    where
        F: Future<Output = T>,
    {
        self.0.block_on(future)
    }

    // openraft's blocking work, on tokio's pool rather than a thread of its
    // own each time (the trait's default).
    fn spawn_blocking<F, T>(f: F) -> impl Future<Output = Result<T, std::io::Error>> + Send
    where
        F: FnOnce() -> T + Send + 'static,
        T: Send + 'static,
    {
        let task = tokio::task::spawn_blocking(f);
        async move { task.await.map_err(std::io::Error::other) }
    }
}

/// tokio's own watch channels, unwrapped: openraft publishes its metrics
/// through the runtime's watch, and with this they reach the rest of
/// firstseen as the `tokio::sync::watch::Receiver`s it reads everywhere.
#[derive(Debug)]
pub struct TokioWatch;

impl rt_watch::Watch for TokioWatch {
    type Sender<T: OptionalSend + OptionalSync> = tokio::sync::watch::Sender<T>;
    type Receiver<T: OptionalSend + OptionalSync> = tokio::sync::watch::Receiver<T>;
    type Ref<'a, T: OptionalSend + 'a> = tokio::sync::watch::Ref<'a, T>;

    fn channel<T: OptionalSend + OptionalSync>(init: T) -> (Self::Sender<T>, Self::Receiver<T>) {
        tokio::sync::watch::channel(init)
    }
}

impl<T: OptionalSend + OptionalSync> rt_watch::WatchSender<TokioWatch, T>
    for tokio::sync::watch::Sender<T>
{
    fn send(&self, value: T) -> Result<(), rt_watch::SendError<T>> {
        tokio::sync::watch::Sender::send(self, value).map_err(|e| rt_watch::SendError(e.0))
    }

    fn send_if_modified<F>(&self, modify: F) -> bool
    where
        F: FnOnce(&mut T) -> bool,
    {
        tokio::sync::watch::Sender::send_if_modified(self, modify)
    }

    fn borrow_watched(&self) -> tokio::sync::watch::Ref<'_, T> {
        self.borrow()
    }

    fn subscribe(&self) -> tokio::sync::watch::Receiver<T> {
        tokio::sync::watch::Sender::subscribe(self)
    }
}

impl<T: OptionalSend + OptionalSync> rt_watch::WatchReceiver<TokioWatch, T>
    for tokio::sync::watch::Receiver<T>
{
    async fn changed(&mut self) -> Result<(), rt_watch::RecvError> {
        tokio::sync::watch::Receiver::changed(self)
            .await
            .map_err(|_| rt_watch::RecvError(()))
    }

    fn borrow_watched(&self) -> tokio::sync::watch::Ref<'_, T> {
        self.borrow()
    }

    fn borrow_and_update(&mut self) -> tokio::sync::watch::Ref<'_, T> {
        tokio::sync::watch::Receiver::borrow_and_update(self)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::Arc;

    use super::*;

    /// A task spawned under a closed gate, and one it spawns in turn, make
    /// no progress until the gate opens; one spawned outside runs on.
    #[tokio::test(start_paused = true)]
    async fn tasks_spawned_under_a_gate_and_their_children_pause_with_it() {
        let (switch, rx) = watch::channel(false);
        let ticks = |n: Arc<AtomicU64>| async move {
            loop {
                tokio::time::sleep(Duration::from_millis(10)).await;
                n.fetch_add(1, Ordering::Relaxed);
            }
        };
        let parent = Arc::new(AtomicU64::new(0));
        let child = Arc::new(AtomicU64::new(0));
        let free = Arc::new(AtomicU64::new(0));
        let (p, c) = (parent.clone(), child.clone());
        Gate(rx)
            .scope(async move {
                GatedTokio::spawn(async move {
                    GatedTokio::spawn(ticks(c));
                    ticks(p).await
                });
            })
            .await;
        GatedTokio::spawn(ticks(free.clone()));
        tokio::time::sleep(Duration::from_millis(105)).await;
        let before = (
            parent.load(Ordering::Relaxed),
            child.load(Ordering::Relaxed),
        );
        assert!(before.0 >= 9 && before.1 >= 9, "{before:?}");

        switch.send_replace(true);
        tokio::task::yield_now().await;
        let at_pause = (
            parent.load(Ordering::Relaxed),
            child.load(Ordering::Relaxed),
        );
        let free_at_pause = free.load(Ordering::Relaxed);
        tokio::time::sleep(Duration::from_millis(500)).await;
        assert_eq!(
            (
                parent.load(Ordering::Relaxed),
                child.load(Ordering::Relaxed)
            ),
            at_pause,
            "paused tasks made progress"
        );
        assert!(free.load(Ordering::Relaxed) >= free_at_pause + 45);

        switch.send_replace(false);
        tokio::time::sleep(Duration::from_millis(55)).await;
        assert!(parent.load(Ordering::Relaxed) > at_pause.0);
        assert!(child.load(Ordering::Relaxed) > at_pause.1);
    }
}

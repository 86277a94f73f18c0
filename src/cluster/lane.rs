//! A connection's appends, handed to openraft in the order they arrived.
//!
//! The peer server serves each request on a task of its own, so two
//! requests that arrive one after the other can reach openraft in either
//! order. For appends that order matters once a leader sends the next one
//! before the previous one is answered (openraft 0.10's pipelined
//! `stream_append`, `cluster.pipeline_appends`): the second, handed over
//! first, finds a gap and is refused as a conflict, and the leader starts
//! its stream again. So every append of a connection goes through its
//! lane: one task, feeding `Raft::stream_append` in arrival order. A
//! leader that waits for each reply (openraft 0.9, a heartbeat) sees no
//! difference.
//!
//! openraft ends a stream at its first refusal (a conflict, a higher vote),
//! while the appends behind it are already with its core and their answers
//! are dropped. The lane keeps each append until it is answered and hands
//! the unanswered ones to a new stream: openraft judges each again, and an
//! append judged twice changes nothing the second time.

use std::collections::VecDeque;
use std::sync::Arc;

use futures::StreamExt;
use openraft::error::RaftError;
use openraft::raft::{AppendEntriesRequest, AppendEntriesResponse, StreamAppendError};
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;

use firstseen_raft::TypeConfig;

use super::answer::{self, PeerService};
use super::wire::Reply;

/// The sending half of a connection's lane.
pub struct Lane {
    jobs: mpsc::UnboundedSender<Job>,
}

struct Job {
    req: AppendEntriesRequest<TypeConfig>,
    answer: oneshot::Sender<Reply>,
    started: std::time::Instant,
}

impl Lane {
    /// A lane for `svc`'s Raft, and the task that serves it until the lane
    /// is dropped or `stop`: the caller runs it beside the connection.
    pub fn new(
        svc: Arc<PeerService>,
        stop: CancellationToken,
    ) -> (Self, impl std::future::Future<Output = ()> + Send + 'static) {
        let (jobs, rx) = mpsc::unbounded_channel();
        (Self { jobs }, serve(svc, rx, stop))
    }

    /// Queues `req` behind every append submitted before it; the reply
    /// comes on the receiver. The caller bounds how many are queued (the
    /// connection's request slots).
    pub fn submit(&self, req: AppendEntriesRequest<TypeConfig>) -> oneshot::Receiver<Reply> {
        let (answer, rx) = oneshot::channel();
        let _ = self.jobs.send(Job {
            req,
            answer,
            started: std::time::Instant::now(),
        });
        rx
    }
}

/// Feeds the lane's appends to openraft in order and answers each.
async fn serve(
    svc: Arc<PeerService>,
    mut jobs: mpsc::UnboundedReceiver<Job>,
    stop: CancellationToken,
) {
    // Appends handed to the current stream and not yet answered, oldest
    // first, each with its own copy for a new stream.
    let mut waiting: VecDeque<Job> = VecDeque::new();
    let mut open = true;
    while open || !waiting.is_empty() {
        let (input, rx) = futures::channel::mpsc::unbounded();
        let mut answers = Box::pin(svc.raft.stream_append(rx));
        for job in &waiting {
            let _ = input.unbounded_send(job.req.clone());
        }
        // Until this stream ends on a refusal (or Raft stops).
        loop {
            tokio::select! {
                job = jobs.recv(), if open => match job {
                    Some(job) => {
                        // Refused before openraft sees it, as `dispatch`
                        // refuses: a write that fails in sled is fatal to the
                        // Raft node. Empty appends (heartbeats) still pass.
                        if !job.req.entries.is_empty() {
                            if let Some(reason) = svc.disk.reason() {
                                let _ = job.answer.send(Reply::Refused(reason));
                                continue;
                            }
                        }
                        let _ = input.unbounded_send(job.req.clone());
                        waiting.push_back(job);
                    }
                    None => open = false,
                },
                answer = answers.next(), if !waiting.is_empty() => {
                    let job = waiting.pop_front().expect("one is waiting");
                    let (reply, ends) = match answer {
                        Some(Ok(Ok(_))) => (Ok(AppendEntriesResponse::Success), false),
                        Some(Ok(Err(StreamAppendError::Conflict(_)))) => {
                            (Ok(AppendEntriesResponse::Conflict), true)
                        }
                        Some(Ok(Err(StreamAppendError::HigherVote(v)))) => {
                            (Ok(AppendEntriesResponse::HigherVote(v)), true)
                        }
                        Some(Err(fatal)) => (Err(RaftError::Fatal(fatal)), true),
                        // The stream ended without a word: Raft is stopping.
                        None => {
                            (Err(RaftError::Fatal(openraft::error::Fatal::Stopped)), true)
                        }
                    };
                    answer::after_append(
                        &svc,
                        job.req.entries.len(),
                        job.req.prev_log_id,
                        job.started.elapsed(),
                        &reply,
                    );
                    let stopped = matches!(reply, Err(RaftError::Fatal(_)));
                    let _ = job
                        .answer
                        .send(answer::on_the_wire(reply, Reply::AppendEntries));
                    if stopped {
                        // No new stream would be answered either.
                        for job in waiting.drain(..) {
                            let _ = job.answer.send(Reply::AppendEntries(Err(RaftError::Fatal(
                                openraft::error::Fatal::Stopped,
                            ))));
                        }
                    }
                    if ends {
                        break;
                    }
                },
                _ = stop.cancelled() => return,
            }
            if !open && waiting.is_empty() {
                return;
            }
        }
    }
}

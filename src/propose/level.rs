//! Raising the cluster level (`firstseen_store::level`) once every member
//! runs a release that has the next one.
//!
//! The leader asks each member which levels its release runs
//! ([`Request::Levels`], on a connection of its own: a release from before
//! levels cannot read the question and closes the connection). When every
//! member answers a level above the cluster's, the leader proposes
//! `Command::Level`, and from that entry on every node writes the new
//! formats. Until then a cluster of mixed releases runs as its oldest
//! member does, so a rolling upgrade never stalls a member that cannot read
//! what a newer leader writes.
//!
//! `cluster.upgrade = "manual"` holds the level until an operator runs
//! `firstseen upgrade` (`POST /admin/upgrade`): a node can then still be
//! taken back to the previous release. With `"auto"` (the default) the
//! leader raises it as soon as every member can run it.
//!
//! [`decide`] is the pure rule; [`LevelGate`] asks and proposes.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use firstseen_raft::{NodeId, Raft};
use firstseen_store::level;
use firstseen_store::StateStore;
use serde::{Deserialize, Serialize};
use tokio_util::sync::CancellationToken;

use super::coalesce::Coalescer;
use crate::cluster::config::UpgradeMode;
use crate::cluster::peers::{Call, CallError};
use crate::cluster::wire::{Levels, Reply, Request};

/// How often the leader asks while the level can still rise.
const ASK_EVERY: Duration = Duration::from_secs(5);
/// How long one member has to answer.
const ANSWER_WITHIN: Duration = Duration::from_secs(3);

/// What one member said, as the status shows it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct MemberLevels {
    pub node: NodeId,
    /// Its release's levels, when it answered.
    pub levels: Option<Levels>,
    /// Why it did not, when it did not.
    pub error: Option<String>,
}

/// What the leader decided on its last look.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// The cluster runs the highest level every member has.
    Current,
    /// Every member runs a release with this higher level.
    Raise(u32),
    /// It could rise, but not yet: why.
    Hold(String),
}

/// The level the cluster can rise to: the lowest of what every member's
/// release supports, this node's included (`own`). A member that did not
/// answer holds the level where it is: it may be of a release that cannot
/// read the next one (or be down, and come back as one).
pub fn decide(current: u32, own: u32, members: &[MemberLevels]) -> Decision {
    let mut reachable = own;
    for m in members {
        match &m.levels {
            Some(l) => reachable = reachable.min(l.supported),
            None if own > current => {
                return Decision::Hold(format!(
                    "node {} did not say which levels it runs ({}): it may be of a release from before level {}",
                    m.node,
                    m.error.as_deref().unwrap_or("no answer"),
                    current + 1
                ))
            }
            None => {}
        }
    }
    if reachable > current {
        Decision::Raise(reachable)
    } else if own > current {
        let behind: Vec<String> = members
            .iter()
            .filter(|m| m.levels.as_ref().is_some_and(|l| l.supported <= current))
            .map(|m| {
                let l = m.levels.as_ref().expect("filtered");
                format!(
                    "node {} runs release {} (up to level {})",
                    m.node, l.release, l.supported
                )
            })
            .collect();
        Decision::Hold(format!(
            "waiting for every member to run a release with level {}: {}",
            current + 1,
            behind.join(", ")
        ))
    } else {
        Decision::Current
    }
}

/// What the status shows of the level.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct LevelView {
    /// The cluster's level, as this node applied it.
    pub cluster: u32,
    /// The levels this node's release runs.
    pub oldest: u32,
    pub supported: u32,
    pub release: String,
    pub mode: UpgradeMode,
    /// On the leader: each member's answer at its last look.
    pub members: Vec<MemberLevels>,
    /// On the leader: why the level does not rise yet, when it could.
    pub waiting: Option<String>,
}

/// The leader's task that raises the level, and the handle the status and
/// the admin API use.
#[derive(Clone)]
pub struct LevelGate {
    inner: Arc<Inner>,
}

struct Inner {
    raft: Raft,
    me: NodeId,
    call: Arc<dyn Call>,
    state: StateStore,
    coalescer: Coalescer,
    mode: UpgradeMode,
    /// The last look: members' answers and the decision's hold reason.
    last: Mutex<(Vec<MemberLevels>, Option<String>)>,
}

/// Why a node cannot join at the cluster's level.
#[derive(Debug, Clone, thiserror::Error)]
pub enum Unfit {
    #[error("it runs release {release} (levels {oldest} to {supported}), and the cluster is at level {cluster}")]
    Release {
        release: String,
        oldest: u32,
        supported: u32,
        cluster: u32,
    },
    #[error("it answered the question about its levels with something else")]
    OtherAnswer,
    #[error(
        "it did not say which levels it runs ({0}): it may be of a release from before levels"
    )]
    NoAnswer(CallError),
}

/// Why the level could not be raised on request.
#[derive(Debug, Clone, thiserror::Error)]
pub enum RaiseError {
    #[error("this node is not the leader")]
    NotLeader,
    #[error("the cluster already runs the highest level every member has ({0})")]
    Current(u32),
    #[error("{0}")]
    Held(String),
    #[error("the level entry was not committed: {0}")]
    NotCommitted(String),
}

impl LevelGate {
    pub fn new(
        raft: Raft,
        me: NodeId,
        call: Arc<dyn Call>,
        state: StateStore,
        coalescer: Coalescer,
        mode: UpgradeMode,
    ) -> Self {
        Self {
            inner: Arc::new(Inner {
                raft,
                me,
                call,
                state,
                coalescer,
                mode,
                last: Mutex::new((Vec::new(), None)),
            }),
        }
    }

    /// What the status shows.
    pub fn view(&self) -> LevelView {
        let ours = Levels::this_release();
        let (members, waiting) = firstseen_store::lock::lock(&self.inner.last).clone();
        LevelView {
            cluster: self.inner.state.level(),
            oldest: ours.oldest,
            supported: ours.supported,
            release: ours.release,
            mode: self.inner.mode,
            members,
            waiting,
        }
    }

    fn leads(&self) -> bool {
        self.inner.raft.metrics().borrow().current_leader == Some(self.inner.me)
    }

    /// Asks every other member which levels it runs.
    async fn ask(&self) -> Vec<MemberLevels> {
        let targets: BTreeMap<NodeId, String> = {
            let m = self.inner.raft.metrics();
            let m = m.borrow();
            m.membership_config
                .nodes()
                .filter(|(id, _)| **id != self.inner.me)
                .map(|(id, n)| (*id, n.addr.clone()))
                .collect()
        };
        let asks = targets.into_iter().map(|(node, addr)| {
            let call = self.inner.call.clone();
            async move {
                match call
                    .call(node, &addr, &Request::Levels, ANSWER_WITHIN)
                    .await
                {
                    Ok(Reply::Levels(l)) => MemberLevels {
                        node,
                        levels: Some(l),
                        error: None,
                    },
                    Ok(_) => MemberLevels {
                        node,
                        levels: None,
                        error: Some("answered something else".into()),
                    },
                    Err(e) => MemberLevels {
                        node,
                        levels: None,
                        error: Some(e.to_string()),
                    },
                }
            }
        });
        futures::future::join_all(asks).await
    }

    /// One look: asks the members and decides.
    async fn look(&self) -> Decision {
        let members = self.ask().await;
        let decision = decide(self.inner.state.level(), level::SUPPORTED, &members);
        let waiting = match &decision {
            Decision::Hold(why) => Some(why.clone()),
            Decision::Raise(to) if self.inner.mode == UpgradeMode::Manual => Some(format!(
                "every member runs level {to}; cluster.upgrade is \"manual\": run `firstseen upgrade` to raise it"
            )),
            _ => None,
        };
        *firstseen_store::lock::lock(&self.inner.last) = (members, waiting);
        decision
    }

    /// Raises the level now if every member runs a higher one: what
    /// `firstseen upgrade` asks for.
    pub async fn raise(&self) -> Result<u32, RaiseError> {
        if !self.leads() {
            return Err(RaiseError::NotLeader);
        }
        match self.look().await {
            Decision::Current => Err(RaiseError::Current(self.inner.state.level())),
            Decision::Hold(why) => Err(RaiseError::Held(why)),
            Decision::Raise(to) => self.propose(to).await,
        }
    }

    async fn propose(&self, to: u32) -> Result<u32, RaiseError> {
        tracing::info!(
            from = self.inner.state.level(),
            to,
            "every member runs a release with the next cluster level: raising it"
        );
        self.inner
            .coalescer
            .append(firstseen_store::Command::Level { level: to })
            .await
            .map_err(|e| RaiseError::NotCommitted(e.to_string()))?;
        *firstseen_store::lock::lock(&self.inner.last) = (Vec::new(), None);
        Ok(to)
    }

    /// Runs until `stop`: while this node leads and the level can still
    /// rise, looks every few seconds, and raises it when the mode allows.
    pub async fn run(self, stop: CancellationToken) {
        loop {
            tokio::select! {
                _ = tokio::time::sleep(ASK_EVERY) => {}
                _ = stop.cancelled() => return,
            }
            if !self.leads() || self.inner.state.level() >= level::SUPPORTED {
                continue;
            }
            let decision = tokio::select! {
                d = self.look() => d,
                _ = stop.cancelled() => return,
            };
            match decision {
                Decision::Raise(to) if self.inner.mode == UpgradeMode::Auto => {
                    if let Err(e) = self.propose(to).await {
                        tracing::warn!(error = %e, "could not raise the cluster level; trying again");
                    }
                }
                Decision::Hold(why) => tracing::debug!(reason = %why, "cluster level held"),
                _ => {}
            }
        }
    }

    /// Whether a node whose release runs `levels` can join this cluster.
    pub fn admits(&self, levels: &Levels) -> Result<(), Unfit> {
        let cluster = self.inner.state.level();
        if levels.supported < cluster || levels.oldest > cluster {
            return Err(Unfit::Release {
                release: levels.release.clone(),
                oldest: levels.oldest,
                supported: levels.supported,
                cluster,
            });
        }
        Ok(())
    }

    /// Asks node `node` at `addr` which levels it runs.
    pub async fn ask_one(&self, node: NodeId, addr: &str) -> Result<Levels, Unfit> {
        match self
            .inner
            .call
            .call(node, addr, &Request::Levels, ANSWER_WITHIN)
            .await
        {
            Ok(Reply::Levels(l)) => Ok(l),
            Ok(_) => Err(Unfit::OtherAnswer),
            Err(e) => Err(Unfit::NoAnswer(e)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answered(node: NodeId, supported: u32) -> MemberLevels {
        MemberLevels {
            node,
            levels: Some(Levels {
                oldest: 1,
                supported,
                release: format!("r{supported}"),
            }),
            error: None,
        }
    }

    fn silent(node: NodeId) -> MemberLevels {
        MemberLevels {
            node,
            levels: None,
            error: Some("connection closed".into()),
        }
    }

    #[test]
    fn the_level_rises_to_the_lowest_every_member_runs() {
        assert_eq!(
            decide(1, 2, &[answered(2, 2), answered(3, 3)]),
            Decision::Raise(2)
        );
        assert_eq!(decide(2, 2, &[answered(2, 2)]), Decision::Current);
        // A group of one.
        assert_eq!(decide(1, 2, &[]), Decision::Raise(2));
    }

    /// A member of the release before levels closes the connection on the
    /// question: it never answers, and the level stays, so a leader never
    /// writes what it cannot read.
    #[test]
    fn a_member_that_does_not_answer_or_runs_an_older_release_holds_the_level() {
        match decide(1, 2, &[answered(2, 2), silent(3)]) {
            Decision::Hold(why) => assert!(why.contains("node 3"), "{why}"),
            other => panic!("{other:?}"),
        }
        match decide(1, 2, &[answered(2, 2), answered(3, 1)]) {
            Decision::Hold(why) => assert!(why.contains("node 3 runs release r1"), "{why}"),
            other => panic!("{other:?}"),
        }
        // At the top already: nothing to wait for, whoever is silent.
        assert_eq!(decide(2, 2, &[silent(3)]), Decision::Current);
    }
}

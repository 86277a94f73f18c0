//! Elections, driven here rather than by openraft's own timer.
//!
//! openraft 0.9 has no pre-vote. A follower cut off for a few seconds kept
//! raising its term with every election timeout (terms 8–11 after a 10-s
//! cut), and when it came back, its higher term made the healthy leader step
//! down: about 1.8 s without a leader, for nothing. openraft's own timer also
//! waits its leader lease plus a random election timeout (3–4 s measured)
//! before a follower campaigns after a leader dies.
//!
//! So openraft's election timer is off (`enable_elect = false`) and this
//! driver campaigns instead, after asking first:
//! 1. A voter that has not heard from a leader for a random time in
//!    [`election_max`, `2 × election_max − election_min`] asks every other
//!    voter for a [`PreVote`]. Nothing is written: terms do not move.
//! 2. A voter grants it only if it has not heard from a leader for the
//!    lease itself (or, as leader, could not confirm its leadership for
//!    that long), and the candidate's log is at least as up to date as its
//!    own ([`grant`]).
//! 3. With a majority of grants (its own included) the driver calls
//!    openraft's `trigger().elect()`; openraft runs the real vote.
//!
//! A node cut off from the others never gets a majority of grants, never
//! raises its term, and rejoins as a follower when the cut heals. Grants are
//! given only once openraft's own lease has lapsed on the granting node, so
//! the vote that follows a won pre-vote is not refused by the lease.

use std::sync::Arc;
use std::time::Duration;

use firstseen_raft::{NodeId, Raft};
use openraft::{LogId, ServerState};
use tokio_util::sync::CancellationToken;

use super::liveness::{Liveness, Timing};
use super::peers::Call;
use super::wire::{PreVote, PreVoteReply, Reply, Request};

/// What a voter knows when it is asked for a pre-vote.
#[derive(Debug, Clone)]
pub struct Mine {
    pub term: u64,
    pub last_log: Option<LogId<NodeId>>,
    pub is_leader: bool,
    /// Since this node last confirmed its leadership with a quorum.
    pub lease_age: Option<Duration>,
    /// Since a leader's append was last accepted here.
    pub leader_contact_age: Option<Duration>,
    pub uptime: Duration,
}

/// Why a pre-vote is refused. Its text travels back to the candidate,
/// which logs it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    #[error("I lead and a quorum confirmed it")]
    Leading,
    #[error("I heard from the leader {} ms ago", .0.as_millis())]
    LeaderHeard(Duration),
    #[error("term {asked} is not above mine ({mine})")]
    StaleTerm { asked: u64, mine: u64 },
    #[error("your log is behind mine")]
    LogBehind,
}

/// Whether to grant `req`: the pure rule of the pre-vote. `Err` says why not.
pub fn grant(req: &PreVote, mine: &Mine, timing: &Timing) -> Result<(), Refusal> {
    let lease = timing.lease();
    // A leader that confirmed its leadership recently is alive.
    if mine.is_leader && mine.lease_age.is_some_and(|a| a < lease) {
        return Err(Refusal::Leading);
    }
    // A follower that hears from its leader keeps it; a node that just
    // started has not had the time to hear from one yet.
    let heard = mine.leader_contact_age.unwrap_or(mine.uptime);
    if !mine.is_leader && heard < lease {
        return Err(Refusal::LeaderHeard(heard));
    }
    if req.term <= mine.term {
        return Err(Refusal::StaleTerm {
            asked: req.term,
            mine: mine.term,
        });
    }
    if req.last_log < mine.last_log {
        return Err(Refusal::LogBehind);
    }
    Ok(())
}

/// When a follower that has heard nothing campaigns: a random time in
/// `[election_max, 2 × election_max − election_min]`, so that two followers
/// rarely ask at once, and never before openraft's lease has lapsed on the
/// others.
pub fn campaign_after(timing: &Timing, random: u64) -> Duration {
    let spread = timing.election_max.saturating_sub(timing.election_min);
    let extra = if spread.is_zero() {
        Duration::ZERO
    } else {
        Duration::from_millis(random % (spread.as_millis() as u64 + 1))
    };
    timing.election_max + extra
}

fn random() -> u64 {
    getrandom::u64().unwrap_or(0)
}

/// This node's answer to a pre-vote, from its own Raft state.
pub fn answer(raft: &Raft, liveness: &Liveness, timing: &Timing, req: &PreVote) -> PreVoteReply {
    let m = raft.metrics().borrow().clone();
    let last_log = raft.data_metrics().borrow().last_log;
    let mine = Mine {
        term: m.current_term,
        last_log,
        is_leader: m.state == ServerState::Leader,
        lease_age: liveness.lease_age(),
        leader_contact_age: liveness.leader_contact_age(),
        uptime: liveness.uptime(),
    };
    match grant(req, &mine, timing) {
        Ok(()) => PreVoteReply {
            granted: true,
            reason: String::new(),
        },
        Err(refusal) => PreVoteReply {
            granted: false,
            reason: refusal.to_string(),
        },
    }
}

/// Campaigns when this voter has heard from no leader for a while and a
/// majority agrees (see the module docs). Runs until `shutdown`.
pub async fn drive(
    raft: Raft,
    me: NodeId,
    peers: Arc<dyn Call>,
    liveness: Arc<Liveness>,
    timing: Timing,
    disk: Arc<crate::diskspace::DiskSpace>,
    shutdown: CancellationToken,
) {
    let mut tick = tokio::time::interval(timing.heartbeat);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut attempt_at = tokio::time::Instant::now();
    let mut wait = campaign_after(&timing, random());
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = shutdown.cancelled() => return,
        }
        let m = raft.metrics().borrow().clone();
        let membership = m.membership_config.membership().clone();
        if m.state == ServerState::Leader || !membership.voter_ids().any(|v| v == me) {
            attempt_at = tokio::time::Instant::now();
            continue;
        }
        // A node whose disk is full could not write the vote it would win.
        if disk.is_low() {
            continue;
        }
        let quiet = liveness
            .leader_contact_age()
            .unwrap_or_else(|| liveness.uptime())
            .min(attempt_at.elapsed());
        if quiet < wait {
            continue;
        }
        attempt_at = tokio::time::Instant::now();
        wait = campaign_after(&timing, random());
        let req = PreVote {
            candidate: me,
            term: m.current_term + 1,
            last_log: raft.data_metrics().borrow().last_log,
        };
        let voters: Vec<(NodeId, String)> = membership
            .voter_ids()
            .filter(|v| *v != me)
            .filter_map(|v| {
                m.membership_config
                    .nodes()
                    .find(|(id, _)| **id == v)
                    .map(|(_, n)| (v, n.addr.clone()))
            })
            .collect();
        let total = voters.len() + 1;
        let asks = voters.iter().map(|(id, addr)| {
            let (peers, req) = (peers.clone(), Request::PreVote(req.clone()));
            async move {
                let r = peers.call(addr, &req, timing.confirm_timeout()).await;
                (*id, r)
            }
        });
        let mut granted = 1;
        let mut refusals = Vec::new();
        for (id, r) in futures::future::join_all(asks).await {
            match r {
                Ok(Reply::PreVote(PreVoteReply { granted: true, .. })) => granted += 1,
                Ok(Reply::PreVote(PreVoteReply { reason, .. })) => {
                    refusals.push(format!("{id}: {reason}"))
                }
                Ok(_) => refusals.push(format!("{id}: reply of the wrong kind")),
                Err(e) => refusals.push(format!("{id}: {e}")),
            }
        }
        if granted * 2 > total {
            tracing::info!(
                term = req.term,
                granted,
                voters = total,
                quiet_ms = quiet.as_millis() as u64,
                "pre-vote won: campaigning"
            );
            metrics::counter!("firstseen_elections_started_total").increment(1);
            if let Err(e) = raft.trigger().elect().await {
                tracing::warn!(error = %e, "could not start an election");
            }
        } else {
            tracing::debug!(term = req.term, granted, voters = total, refusals = ?refusals, "pre-vote lost: not campaigning");
        }
    }
}

/// While this node leads, confirms its leadership with a quorum every
/// `election_min / 2`, so that readiness and `/status` can tell a leader
/// that still leads from one that was cut off.
pub async fn watch_lease(
    raft: Raft,
    liveness: Arc<Liveness>,
    timing: Timing,
    shutdown: CancellationToken,
) {
    let mut tick = tokio::time::interval(timing.election_min / 2);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = shutdown.cancelled() => return,
        }
        if raft.metrics().borrow().state != ServerState::Leader {
            continue;
        }
        if let Ok(Ok(_)) =
            tokio::time::timeout(timing.confirm_timeout(), raft.ensure_linearizable()).await
        {
            liveness.lease_confirmed();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use openraft::CommittedLeaderId;

    fn timing() -> Timing {
        Timing {
            heartbeat: Duration::from_millis(100),
            election_min: Duration::from_millis(400),
            election_max: Duration::from_millis(800),
        }
    }

    fn log(term: u64, index: u64) -> Option<LogId<NodeId>> {
        Some(LogId::new(CommittedLeaderId::new(term, 1), index))
    }

    fn follower(contact_ms: Option<u64>) -> Mine {
        Mine {
            term: 3,
            last_log: log(3, 50),
            is_leader: false,
            lease_age: None,
            leader_contact_age: contact_ms.map(Duration::from_millis),
            uptime: Duration::from_secs(60),
        }
    }

    fn req(term: u64, last: Option<LogId<NodeId>>) -> PreVote {
        PreVote {
            candidate: 2,
            term,
            last_log: last,
        }
    }

    #[test]
    fn a_voter_that_hears_its_leader_refuses() {
        let t = timing();
        assert!(matches!(
            grant(&req(4, log(3, 50)), &follower(Some(100)), &t),
            Err(Refusal::LeaderHeard(_))
        ));
        assert!(grant(&req(4, log(3, 50)), &follower(Some(900)), &t).is_ok());
        // Just started and never heard from anyone: give a leader the lease
        // to show up first.
        let mut fresh = follower(None);
        fresh.uptime = Duration::from_millis(200);
        assert!(grant(&req(4, log(3, 50)), &fresh, &t).is_err());
    }

    #[test]
    fn a_live_leader_refuses_and_a_cut_off_one_grants() {
        let t = timing();
        let mut leader = follower(None);
        leader.is_leader = true;
        leader.lease_age = Some(Duration::from_millis(150));
        assert!(grant(&req(4, log(3, 50)), &leader, &t).is_err());
        leader.lease_age = Some(Duration::from_secs(2));
        assert!(grant(&req(4, log(3, 50)), &leader, &t).is_ok());
    }

    #[test]
    fn a_candidate_behind_in_log_or_term_is_refused() {
        let t = timing();
        let quiet = follower(Some(5_000));
        assert_eq!(
            grant(&req(4, log(3, 49)), &quiet, &t),
            Err(Refusal::LogBehind)
        );
        assert!(grant(&req(4, log(2, 80)), &quiet, &t).is_err());
        assert!(grant(&req(3, log(3, 50)), &quiet, &t).is_err());
        assert!(grant(&req(4, log(3, 51)), &quiet, &t).is_ok());
        assert!(grant(&req(4, log(4, 1)), &quiet, &t).is_ok());
    }

    #[test]
    fn campaigns_wait_past_the_lease_and_spread() {
        let t = timing();
        let all: Vec<Duration> = (0..1_000).map(|r| campaign_after(&t, r * 7919)).collect();
        assert!(all.iter().all(|d| *d >= t.lease()));
        assert!(all
            .iter()
            .all(|d| *d <= t.election_max * 2 - t.election_min));
        assert!(all
            .iter()
            .any(|d| *d > t.lease() + Duration::from_millis(200)));
    }
}

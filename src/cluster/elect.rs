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
//!
//! A node whose damaged log was set aside (`firstseen_raft::rejoin`)
//! abstains: it refuses every pre-vote and vote and does not campaign until
//! it has applied up to the leader's read index (its confirmed last log
//! index, [`read_index`]), which it asks for with [`Request::ReadIndex`];
//! the driver ends the abstention.

use std::sync::Arc;
use std::time::Duration;

use firstseen_raft::{LogId, NodeId, Raft};
use openraft::ServerState;
use tokio_util::sync::CancellationToken;

use super::liveness::{Liveness, Timing};
use super::peers::Call;
use super::wire::{PreVote, PreVoteReply, ReadIndexError, Reply, Request};

/// What a voter knows when it is asked for a pre-vote.
#[derive(Debug, Clone)]
pub struct Mine {
    pub term: u64,
    pub last_log: Option<LogId>,
    pub is_leader: bool,
    /// Since this node last confirmed its leadership with a quorum.
    pub lease_age: Option<Duration>,
    /// Since a leader's append was last accepted here.
    pub leader_contact_age: Option<Duration>,
    pub uptime: Duration,
    /// Rejoining with an empty log: no vote until caught up.
    pub abstaining: bool,
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
    #[error("my log was set aside and I have not caught up yet")]
    Rejoining,
}

/// Whether to grant `req`: the pure rule of the pre-vote. `Err` says why not.
pub fn grant(req: &PreVote, mine: &Mine, timing: &Timing) -> Result<(), Refusal> {
    let lease = timing.lease();
    // With its log set aside, this node cannot tell whether the candidate
    // lacks an entry it had acknowledged (firstseen_raft::rejoin).
    if mine.abstaining {
        return Err(Refusal::Rejoining);
    }
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
        abstaining: liveness.abstaining(),
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

/// This node's answer to a vote while it abstains: refused, with its own
/// vote and log so that the candidate learns nothing false.
pub fn refuse_vote(raft: &Raft) -> openraft::raft::VoteResponse<firstseen_raft::TypeConfig> {
    let vote = raft.metrics().borrow().vote;
    let last_log = raft.data_metrics().borrow().last_log;
    openraft::raft::VoteResponse::new(vote, last_log, false)
}

/// The leader's answer to [`Request::ReadIndex`]: its last log id, once a
/// quorum confirmed the leadership.
///
/// Not openraft's read index. That is the larger of the leader's first entry
/// of its term and its commit index, and the commit index is stored without
/// a sync: after every node lost power, a leader restored at start (its own
/// committed vote makes it leader again without an election, reusing its
/// first entry of the term, perhaps long ago) answered a commit index below
/// entries that had been committed and acked before the cut. A node that set
/// its damaged log aside voted again once it had applied to there, and could
/// elect a candidate lacking an entry it had itself acknowledged. Every entry
/// in the leader's log is committed while it leads, and the log holds every
/// entry ever committed, so its last index covers them all (the publisher's
/// read barrier waits for the same).
pub async fn read_index(raft: &Raft, timing: &Timing) -> Result<Option<LogId>, ReadIndexError> {
    use openraft::error::{LinearizableReadError, RaftError};
    let confirmed = async {
        raft.ensure_linearizable(openraft::raft::ReadPolicy::ReadIndex)
            .await?;
        // Read after the confirmation: it holds whatever any predecessor
        // committed, and this leader commits all of it while it leads.
        Ok(raft.data_metrics().borrow().last_log)
    };
    match tokio::time::timeout(timing.confirm_timeout(), confirmed).await {
        Ok(Ok(index)) => Ok(index),
        Ok(Err(RaftError::APIError(LinearizableReadError::ForwardToLeader(f)))) => {
            Err(ReadIndexError::NotLeader {
                leader: f.leader_id,
            })
        }
        Ok(Err(RaftError::APIError(LinearizableReadError::QuorumNotEnough(_)))) | Err(_) => {
            Err(ReadIndexError::Unconfirmed)
        }
        Ok(Err(RaftError::Fatal(f))) => Err(ReadIndexError::Fatal {
            detail: f.to_string(),
        }),
    }
}

/// Where a node rejoining with a set-aside log stands.
#[derive(Debug, Default)]
struct Rejoin {
    /// The last log id when it started abstaining: a later one shows it has
    /// taken an append from the leader at the right place.
    started_at: Option<Option<LogId>>,
    /// The leader's read index, asked once the node had taken an append
    /// (`Some(None)`: the leader had nothing committed).
    target: Option<Option<LogId>>,
}

/// While this node abstains (its log was set aside), brings the abstention
/// to its end (see `firstseen_raft::rejoin`):
/// 1. once this node has taken an append from the leader (so the leader
///    found where its log ends, and counts only what it acknowledges now),
///    it asks the leader for its read index: every entry committed before
///    the damage, on this node's acknowledgement or not, is at or below it;
/// 2. once it has applied up to there, its log holds every one of them: the
///    marker goes (first, so that a failure keeps the node abstaining) and
///    it votes and campaigns again.
///
/// Returns whether it still abstains.
async fn rejoin_step(
    raft: &Raft,
    me: NodeId,
    peers: &Arc<dyn Call>,
    liveness: &Liveness,
    timing: &Timing,
    raft_dir: &std::path::Path,
    rejoin: &mut Rejoin,
) -> bool {
    if !liveness.abstaining() {
        return false;
    }
    let m = raft.metrics().borrow().clone();
    let last_log = raft.data_metrics().borrow().last_log;
    let started_at = *rejoin.started_at.get_or_insert(last_log);
    let Some(leader) = m.current_leader.filter(|l| *l != me) else {
        return true;
    };
    if rejoin.target.is_none() {
        if last_log <= started_at {
            return true;
        }
        let Some(addr) = m
            .membership_config
            .nodes()
            .find(|(id, _)| **id == leader)
            .map(|(_, n)| n.addr.clone())
        else {
            return true;
        };
        match peers
            .call(
                leader,
                &addr,
                &Request::ReadIndex,
                timing.confirm_timeout() * 2,
            )
            .await
        {
            Ok(Reply::ReadIndex(Ok(index))) => {
                tracing::info!(leader, target = ?index, "rejoining: applying up to the leader's read index before voting again");
                rejoin.target = Some(index);
            }
            Ok(Reply::ReadIndex(Err(e))) => {
                tracing::debug!(leader, error = %e, "rejoining: the leader gave no read index yet");
                return true;
            }
            Ok(_) => return true,
            Err(e) => {
                tracing::debug!(leader, error = %e, "rejoining: cannot ask the leader yet");
                return true;
            }
        }
    }
    let target = rejoin.target.expect("set above");
    if !firstseen_raft::rejoin::caught_up(m.last_applied.as_ref(), target.as_ref()) {
        return true;
    }
    let dir = raft_dir.to_path_buf();
    let finished = tokio::task::spawn_blocking(move || firstseen_raft::rejoin::finish(&dir))
        .await
        .map_err(|e| e.to_string())
        .and_then(|r| r.map_err(|e| e.to_string()));
    match finished {
        Ok(()) => {
            liveness.resume_voting();
            tracing::info!(
                applied = ?m.last_applied,
                target = ?target,
                leader,
                "rejoined: the log holds every entry the group committed before it was set aside; voting again"
            );
            false
        }
        Err(e) => {
            tracing::warn!(error = %e, "could not end the abstention; still refusing votes");
            true
        }
    }
}

/// Campaigns when this voter has heard from no leader for a while and a
/// majority agrees (see the module docs). Runs until `shutdown`. A node
/// rejoining with a set-aside log (`raft_dir` holds its marker) does not
/// campaign until it has caught up, and this task ends the abstention.
#[allow(clippy::too_many_arguments)]
pub async fn drive(
    raft: Raft,
    me: NodeId,
    peers: Arc<dyn Call>,
    liveness: Arc<Liveness>,
    timing: Timing,
    disk: Arc<crate::diskspace::DiskSpace>,
    raft_dir: std::path::PathBuf,
    shutdown: CancellationToken,
) {
    let mut tick = tokio::time::interval(timing.heartbeat);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut attempt_at = tokio::time::Instant::now();
    let mut wait = campaign_after(&timing, random());
    let mut rejoin = Rejoin::default();
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = shutdown.cancelled() => return,
        }
        if rejoin_step(
            &raft,
            me,
            &peers,
            &liveness,
            &timing,
            &raft_dir,
            &mut rejoin,
        )
        .await
        {
            attempt_at = tokio::time::Instant::now();
            continue;
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
                let r = peers.call(*id, addr, &req, timing.confirm_timeout()).await;
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
            if let Err(e) = raft.trigger().elect(false).await {
                tracing::warn!(error = %e, "could not start an election");
            }
        } else {
            tracing::debug!(term = req.term, granted, voters = total, refusals = ?refusals, "pre-vote lost: not campaigning");
        }
    }
}

/// While this node leads, confirms its leadership with a quorum every
/// [`Timing::lease_watch`] (half the lease's freshness), so that readiness
/// and `/status` can tell a leader that still leads from one that was cut
/// off, and the publisher finds a fresh lease instead of asking a quorum
/// before a batch. Each confirmation is one empty append to every follower:
/// at the default 100 ms heartbeat, 10 rounds a second (20 appends with two
/// followers) beside openraft's 10 heartbeat rounds. It also measures the
/// quorum's round trip, and says when the group is farther apart than its
/// timing allows ([`too_far`]).
pub async fn watch_lease(
    raft: Raft,
    liveness: Arc<Liveness>,
    timing: Timing,
    shutdown: CancellationToken,
) {
    let mut tick = tokio::time::interval(timing.lease_watch());
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut warned: Option<tokio::time::Instant> = None;
    // The last rounds of this leadership (`None`: not confirmed in time).
    let mut recent = std::collections::VecDeque::with_capacity(SUSTAINED);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = shutdown.cancelled() => return,
        }
        if raft.metrics().borrow().state != ServerState::Leader {
            recent.clear();
            continue;
        }
        let asked = tokio::time::Instant::now();
        let round = match tokio::time::timeout(
            timing.confirm_timeout(),
            raft.ensure_linearizable(openraft::raft::ReadPolicy::ReadIndex),
        )
        .await
        {
            Ok(Ok(_)) => {
                liveness.lease_confirmed(asked);
                let took = asked.elapsed();
                liveness.quorum_round(took);
                Some(took)
            }
            _ => None,
        };
        if recent.len() == SUSTAINED {
            recent.pop_front();
        }
        recent.push_back(round);
        // Replies did come (late ones too: the link reads them after the
        // call gave up), so the peers are there and only slow to answer.
        let answered = liveness
            .peer_ages()
            .values()
            .any(|age| *age < timing.lease());
        if too_far(&recent, timing.heartbeat, answered)
            && warned.is_none_or(|w| w.elapsed() > Duration::from_secs(60))
        {
            warned = Some(tokio::time::Instant::now());
            tracing::warn!(
                rounds = SUSTAINED,
                last_round_ms = ?liveness.last_quorum_round().map(|d| d.as_millis() as u64),
                heartbeat_ms = timing.heartbeat.as_millis() as u64,
                "none of the last quorum rounds came back within a heartbeat although the peers answer: the zones are farther apart than the timing allows; openraft cuts every append at one heartbeat, so replication stalls and the leadership goes unconfirmed. Set cluster.round_trip_ms to the round trip between the farthest zones (and leave cluster.heartbeat_ms unset)"
            );
        }
    }
}

/// Rounds the lease watch looks back over before it says the group is too
/// far apart: a slow round is not a distance (a new leader's first
/// confirmation waits for its first entry to be applied, 0.5 s in a
/// campaign).
const SUSTAINED: usize = 8;

/// Whether the last [`SUSTAINED`] quorum rounds say the zones are farther
/// apart than the heartbeat allows: each one either took longer than a
/// heartbeat or was not confirmed at all (openraft cuts a leadership check's
/// appends at one heartbeat too, so past it none is), while the peers do
/// answer (`answered`; a leader cut off from them is not too far, it is cut
/// off).
fn too_far(
    recent: &std::collections::VecDeque<Option<Duration>>,
    heartbeat: Duration,
    answered: bool,
) -> bool {
    answered
        && recent.len() == SUSTAINED
        && recent.iter().all(|r| r.is_none_or(|took| took > heartbeat))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn timing() -> Timing {
        Timing {
            heartbeat: Duration::from_millis(100),
            election_min: Duration::from_millis(400),
            election_max: Duration::from_millis(800),
        }
    }

    fn log(term: u64, index: u64) -> Option<LogId> {
        Some(firstseen_raft::log_id(term, 1, index))
    }

    fn follower(contact_ms: Option<u64>) -> Mine {
        Mine {
            term: 3,
            last_log: log(3, 50),
            is_leader: false,
            lease_age: None,
            leader_contact_age: contact_ms.map(Duration::from_millis),
            uptime: Duration::from_secs(60),
            abstaining: false,
        }
    }

    fn req(term: u64, last: Option<LogId>) -> PreVote {
        PreVote {
            candidate: 2,
            term,
            last_log: last,
        }
    }

    #[test]
    fn a_node_rejoining_with_a_set_aside_log_refuses_even_a_longer_log() {
        let t = timing();
        let mut rejoining = follower(Some(900));
        rejoining.last_log = None;
        assert!(grant(&req(4, log(3, 80)), &rejoining, &t).is_ok());
        rejoining.abstaining = true;
        assert_eq!(
            grant(&req(4, log(3, 80)), &rejoining, &t),
            Err(Refusal::Rejoining)
        );
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
    fn only_a_sustained_slowness_with_peers_answering_is_too_far() {
        use std::collections::VecDeque;
        let hb = Duration::from_millis(100);
        let slow: VecDeque<_> = (0..SUSTAINED)
            .map(|_| Some(Duration::from_millis(130)))
            .collect();
        assert!(too_far(&slow, hb, true));
        // A leader cut off from its peers is not told to move its zones.
        assert!(!too_far(&slow, hb, false));
        let failed: VecDeque<_> = (0..SUSTAINED).map(|_| None).collect();
        assert!(too_far(&failed, hb, true));
        // One round in time among them: not a distance.
        let mut one_quick = slow.clone();
        one_quick[3] = Some(Duration::from_millis(61));
        assert!(!too_far(&one_quick, hb, true));
        // Too few rounds yet (a new leadership).
        let short: VecDeque<_> = slow.iter().take(SUSTAINED - 1).copied().collect();
        assert!(!too_far(&short, hb, true));
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

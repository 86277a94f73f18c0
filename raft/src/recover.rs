//! A lone survivor made a cluster of one (`firstseen recover
//! --force-new-cluster`).
//!
//! When a majority of the members is gone for good, the group can never
//! commit again: Raft needs a majority of the old membership to change it.
//! The survivor's log holds every entry it received, and its state every one
//! it applied: its window, its outbox and its sequences. [`force_single`]
//! keeps all of that and appends one entry, a membership of this node alone,
//! under a term above every term the log has seen, with this node's vote for
//! itself in that term committed. openraft then starts the node as the
//! leader of a group of one, which commits the whole log (the survivor is
//! its only copy) and applies what it had not applied yet. The group grows
//! back with `firstseen members add`.
//!
//! It also starts a new generation of the cluster: an entry
//! ([`crate::Command::Generation`]) one above the survivor's after the
//! membership. Every message the recovered cluster publishes carries its
//! generation in its proof, so that the two clusters stay apart in Pulsar:
//! a leader of the old cluster (cut off, not gone, when the operator
//! recovered) that finds a newer generation at the end of a topic stops
//! publishing there.
//!
//! What it cannot give back: an entry the lost members committed and this
//! node never received. A leader has every committed entry, so recover the
//! node that led, or the one with the longest log. And the lost members must
//! never come back with their old data: among themselves they are still a
//! majority of the old membership.

use std::collections::{BTreeMap, BTreeSet};

use openraft::storage::{RaftLogStorage, RaftLogStorageExt, RaftStateMachine};
use openraft::{EntryPayload, RaftLogReader};

use crate::{
    CommittedLeaderId, Entry, LogId, Membership, NodeId, RaftError, Storage, TypeConfig, Vote,
};

/// What the forced membership replaced, and where the log stands now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Forced {
    /// The members before.
    pub before: BTreeSet<NodeId>,
    /// The term of the new membership, and its entry's index.
    pub term: u64,
    pub index: u64,
    /// The last entry of the log before it (every one of them is now this
    /// group's to commit).
    pub last_before: Option<LogId>,
    /// The generation the recovered cluster starts (its entry follows the
    /// membership's).
    pub generation: u64,
}

/// The generation a recovery from `after` starts: one more recovery in the
/// high 32 bits, and a random low half. Two recoveries from one generation
/// (two survivors of a partitioned cluster, each recovered while cut off
/// from the other) would otherwise start the same generation, and each take
/// the other's proven messages for its own; with the random half one of
/// them is the newer, and the older gives the topic up when it meets it.
pub fn next_generation(after: u64, random: u32) -> u64 {
    (((after >> 32) + 1) << 32) | u64::from(random)
}

/// A generation as people read it: the count of recoveries, and the random
/// half that tells two of one count apart (`2.7f3a09c1`); `0` before any.
pub fn shown(generation: u64) -> String {
    match (generation >> 32, generation as u32) {
        (count, 0) => count.to_string(),
        (count, random) => format!("{count}.{random:08x}"),
    }
}

/// Why the survivor cannot be made a cluster of one.
#[derive(Debug, thiserror::Error)]
pub enum RecoverError {
    #[error("the storage: {0}")]
    Storage(#[from] openraft::StorageError<TypeConfig>),
    #[error("the storage: {0}")]
    Io(#[from] std::io::Error),
    /// openraft refused the cluster of one (it cannot, with its only member
    /// named: a guard, not a case).
    #[error("the cluster of one: {0}")]
    Membership(String),
    #[error(transparent)]
    Open(#[from] RaftError),
    #[error(
        "this node holds no membership: it never joined a cluster, so there is nothing to recover"
    )]
    NoMembership,
    #[error("node {me} is not a member of the cluster its log describes (members {members:?})")]
    NotAMember {
        me: NodeId,
        members: BTreeSet<NodeId>,
    },
    #[error("this node's log was set aside after damage and it has not caught up since: it holds nothing to recover from")]
    Rejoining,
}

/// The membership the log ends with, with its members' addresses: the
/// last membership entry, or the one the applied state (or snapshot)
/// holds when the log has none left.
pub async fn membership(storage: &mut Storage) -> Result<Option<Membership>, RecoverError> {
    let state = storage.log.get_log_state().await?;
    if let Some(last) = state.last_log_id {
        let first = state.last_purged_log_id.map_or(0, |l| l.index + 1);
        let entries = storage.log.try_get_log_entries(first..=last.index).await?;
        for e in entries.iter().rev() {
            if let EntryPayload::Membership(m) = &e.payload {
                return Ok(Some(m.clone()));
            }
        }
    }
    let (_, stored) = storage.state_machine.applied_state().await?;
    let m = stored.membership();
    Ok((m.voter_ids().count() > 0).then(|| m.clone()))
}

/// The generation the survivor is in: the higher of its applied state's
/// and any [`crate::Command::Generation`] in its log not applied yet.
pub async fn generation(storage: &mut Storage) -> Result<u64, RecoverError> {
    let mut generation = storage.state.generation();
    let state = storage.log.get_log_state().await?;
    if let Some(last) = state.last_log_id {
        let first = state.last_purged_log_id.map_or(0, |l| l.index + 1);
        let entries = storage.log.try_get_log_entries(first..=last.index).await?;
        for e in &entries {
            if let EntryPayload::Normal(crate::Command::Generation { generation: g }) = &e.payload {
                generation = generation.max(*g);
            }
        }
    }
    Ok(generation)
}

/// Makes the node whose storage is `storage` (opened, and not running) the
/// only member of its cluster, keeping its log and state. Blocking in the
/// sense that the node must not run meanwhile.
pub async fn force_single(
    dir: &std::path::Path,
    storage: &mut Storage,
    me: NodeId,
) -> Result<Forced, RecoverError> {
    if crate::rejoin::pending(dir) {
        return Err(RecoverError::Rejoining);
    }
    let membership = membership(storage)
        .await?
        .ok_or(RecoverError::NoMembership)?;
    let before: BTreeSet<NodeId> = membership.nodes().map(|(id, _)| *id).collect();
    let mine = membership
        .nodes()
        .find(|(id, _)| **id == me)
        .map(|(_, m)| m.clone())
        .ok_or(RecoverError::NotAMember {
            me,
            members: before.clone(),
        })?;
    let state = storage.log.get_log_state().await?;
    let vote = storage.log.read_vote().await?;
    let last = state.last_log_id;
    let term = vote
        .map_or(0, |v| v.leader_id().term)
        .max(last.as_ref().map_or(0, |l| l.leader_id.term))
        + 1;
    let index = last.as_ref().map_or(0, |l| l.index + 1);
    let random = {
        use std::hash::BuildHasher;
        // A process-random hasher: the low half only tells apart two
        // recoveries of one generation, no secret rests on it.
        std::collections::hash_map::RandomState::new().hash_one((me, term)) as u32
    };
    let generation = next_generation(generation(storage).await?, random);
    // The vote first: a node that voted for itself in a term above every
    // one its log has seen is that term's leader, and the entry below is
    // its own.
    storage
        .log
        .save_vote(&Vote::new_committed(term, me))
        .await?;
    let single = Membership::new(vec![BTreeSet::from([me])], BTreeMap::from([(me, mine)]))
        .map_err(|e| RecoverError::Membership(e.to_string()))?;
    let entry = Entry {
        log_id: LogId::new(CommittedLeaderId { term, node_id: me }, index),
        payload: EntryPayload::Membership(single),
    };
    // The new generation in the same append: a crash between the two
    // would leave a cluster of one in the old generation, publishing
    // beside the cluster it came from as if it were it.
    //
    // The level first, at this release's highest: the generation and the
    // rebase that may follow are commands a release without them cannot
    // read, and the recovered cluster is this one node of this release. A
    // member added later must run a release that has this level (an older
    // one stops and says so), instead of failing on an entry it cannot
    // decode.
    let level = Entry {
        log_id: LogId::new(CommittedLeaderId { term, node_id: me }, index + 1),
        payload: EntryPayload::Normal(crate::Command::Level {
            level: firstseen_store::level::SUPPORTED,
        }),
    };
    let next = Entry {
        log_id: LogId::new(CommittedLeaderId { term, node_id: me }, index + 2),
        payload: EntryPayload::Normal(crate::Command::Generation { generation }),
    };
    storage.log.blocking_append([entry, level, next]).await?;
    Ok(Forced {
        before,
        term,
        index,
        last_before: last,
        generation,
    })
}

#[cfg(test)]
mod tests {
    use super::{next_generation, shown};

    /// Each recovery counts one more; two from one generation differ, and
    /// either is newer than their parent and older than any child.
    #[test]
    fn generations_count_recoveries_and_tell_siblings_apart() {
        let a = next_generation(0, 7);
        let b = next_generation(0, 9);
        assert!(a != b && a > 0 && b > 0);
        let child = next_generation(a.min(b), 1);
        assert!(child > a.max(b), "a child is newer than every sibling");
        assert_eq!(shown(0), "0");
        assert_eq!(shown(a), "1.00000007");
        assert_eq!(shown(child), "2.00000001");
    }
}

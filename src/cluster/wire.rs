//! The peer protocol, as pure data and pure functions: frames, the
//! authenticating handshake and the request/reply enums. The sockets live in
//! `server.rs` and `peers.rs`.
//!
//! A connection starts with a mutual challenge–response over the cluster
//! secret, then carries request and reply frames, many at a time:
//!
//! ```text
//! server → client  MAGIC, server nonce (32)
//! client → server  node id (8), client nonce (32), mac(secret, "client" ‖ server nonce ‖ node id)
//! server → client  its node id (8), mac(secret, "server" ‖ client nonce ‖ its node id)
//! then, both ways: u32 length ‖ bincode(Envelope { id, body })
//! ```
//!
//! The client tags each request with an id of its own and the server answers
//! with the same id, in whatever order the answers are ready: one connection
//! per pair of nodes carries Raft RPCs, forwarded batches and pre-votes at
//! once, and is authenticated once.
//!
//! The MAC is blake3 in keyed mode, with a key derived from the secret file.
//! It authenticates the peers to each other; it does not encrypt. Use TLS on
//! networks you do not trust.

use firstseen_raft::{NodeId, TypeConfig};
use firstseen_store::{Batch, Outcome};
use openraft::error::{InstallSnapshotError, RaftError};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse,
    VoteRequest, VoteResponse,
};
use openraft::LogId;
use serde::{Deserialize, Serialize};

/// Protocol magic and version, sent first by the server. Version 2 carries
/// [`Envelope`]s, many in flight on one connection.
pub const MAGIC: &[u8; 8] = b"FSPEER02";

/// One frame after the handshake: a request or its reply, with the id the
/// client gave the request.
#[derive(Debug, Serialize, Deserialize)]
pub struct Envelope<T> {
    pub id: u64,
    pub body: T,
}

/// "Would you vote for me?", asked before a node starts an election, so that
/// a node that cannot reach a quorum, or whose peers still hear from a live
/// leader, never raises the term and deposes a healthy leader (Raft's
/// pre-vote). Nothing is written on either side.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PreVote {
    pub candidate: NodeId,
    /// The term the candidate would campaign in.
    pub term: u64,
    /// The candidate's last log id.
    pub last_log: Option<LogId<NodeId>>,
}

/// The answer to a [`PreVote`].
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PreVoteReply {
    pub granted: bool,
    /// Why not, for the log.
    pub reason: String,
}

/// Largest frame accepted. Above any legitimate message (Raft appends are
/// capped at 4 entries of at most a few MiB); a larger length is garbage or
/// an attack and closes the connection before anything is allocated.
pub const MAX_FRAME: u32 = 256 * 1024 * 1024;

/// The MAC key derived from the cluster secret.
#[derive(Clone)]
pub struct ClusterKey([u8; 32]);

impl ClusterKey {
    /// Derives the key from the secret file's contents (trailing newline
    /// ignored). An empty secret is refused by config validation.
    pub fn from_secret(secret: &[u8]) -> Self {
        let trimmed = secret.strip_suffix(b"\n").unwrap_or(secret);
        Self(blake3::derive_key("firstseen cluster secret v1", trimmed))
    }

    /// Whether `secret` (as an operator presents it to the admin API) is the
    /// cluster secret. Compares derived keys in constant time.
    pub fn matches_secret(&self, secret: &[u8]) -> bool {
        let other = Self::from_secret(secret);
        blake3::Hash::from(self.0) == blake3::Hash::from(other.0)
    }

    fn mac(&self, role: &[u8], nonce: &[u8; 32], node: NodeId) -> blake3::Hash {
        let mut h = blake3::Hasher::new_keyed(&self.0);
        h.update(role);
        h.update(nonce);
        h.update(&node.to_be_bytes());
        h.finalize()
    }

    /// What the client proves it knows the secret with.
    pub fn client_proof(&self, server_nonce: &[u8; 32], node: NodeId) -> [u8; 32] {
        *self.mac(b"client", server_nonce, node).as_bytes()
    }

    /// Checks a client's proof in constant time.
    pub fn check_client(&self, server_nonce: &[u8; 32], node: NodeId, proof: &[u8; 32]) -> bool {
        self.mac(b"client", server_nonce, node) == blake3::Hash::from(*proof)
    }

    /// What the server proves it knows the secret with.
    pub fn server_proof(&self, client_nonce: &[u8; 32], node: NodeId) -> [u8; 32] {
        *self.mac(b"server", client_nonce, node).as_bytes()
    }

    /// Checks the server's proof in constant time.
    pub fn check_server(&self, client_nonce: &[u8; 32], node: NodeId, proof: &[u8; 32]) -> bool {
        self.mac(b"server", client_nonce, node) == blake3::Hash::from(*proof)
    }
}

/// 32 unpredictable bytes from the OS, for a handshake challenge.
pub fn nonce() -> [u8; 32] {
    let mut n = [0u8; 32];
    getrandom::fill(&mut n).expect("the OS random source is available");
    n
}

/// A request from one node to another.
#[derive(Debug, Serialize, Deserialize)]
pub enum Request {
    AppendEntries(AppendEntriesRequest<TypeConfig>),
    Vote(VoteRequest<NodeId>),
    InstallSnapshot(InstallSnapshotRequest<TypeConfig>),
    /// A follower's batch, for the leader to stamp and commit. The reply comes
    /// after commit, so the follower may then ack upstream (G4).
    Forward(Batch),
    PreVote(PreVote),
}

/// Why a forwarded batch was not committed.
#[derive(Debug, Clone, Serialize, Deserialize, thiserror::Error)]
pub enum ForwardError {
    #[error("node is not the leader (leader: {leader:?})")]
    NotLeader { leader: Option<NodeId> },
    #[error("{0}")]
    Failed(String),
}

/// The answer to a [`Request`], same variant.
#[derive(Debug, Serialize, Deserialize)]
pub enum Reply {
    AppendEntries(Result<AppendEntriesResponse<NodeId>, RaftError<NodeId>>),
    Vote(Result<VoteResponse<NodeId>, RaftError<NodeId>>),
    InstallSnapshot(
        Result<InstallSnapshotResponse<NodeId>, RaftError<NodeId, InstallSnapshotError>>,
    ),
    Forward(Result<Vec<Outcome>, ForwardError>),
    PreVote(PreVoteReply),
    /// The request was not handed to Raft: this node cannot take it now (its
    /// disk is below the reserve). The caller treats the node as unreachable
    /// and backs off.
    Refused(String),
}

/// Why a frame could not be read.
#[derive(Debug, thiserror::Error)]
pub enum FrameError {
    #[error("frame of {0} bytes exceeds the {MAX_FRAME} byte limit")]
    TooLarge(u32),
    #[error("undecodable frame: {0}")]
    Decode(String),
}

/// Encodes a message as one frame: big-endian length, then bincode.
pub fn encode<T: Serialize>(msg: &T) -> Result<Vec<u8>, FrameError> {
    let body = bincode::serialize(msg).map_err(|e| FrameError::Decode(e.to_string()))?;
    let len = u32::try_from(body.len()).map_err(|_| FrameError::TooLarge(u32::MAX))?;
    if len > MAX_FRAME {
        return Err(FrameError::TooLarge(len));
    }
    let mut out = Vec::with_capacity(4 + body.len());
    out.extend_from_slice(&len.to_be_bytes());
    out.extend_from_slice(&body);
    Ok(out)
}

/// Checks a frame header before its body is read.
pub fn frame_len(header: [u8; 4]) -> Result<usize, FrameError> {
    let len = u32::from_be_bytes(header);
    if len > MAX_FRAME {
        return Err(FrameError::TooLarge(len));
    }
    Ok(len as usize)
}

/// Decodes a frame body.
pub fn decode<T: for<'de> Deserialize<'de>>(body: &[u8]) -> Result<T, FrameError> {
    bincode::deserialize(body).map_err(|e| FrameError::Decode(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proofs_verify_only_with_the_same_secret() {
        let a = ClusterKey::from_secret(b"s3cret\n");
        let b = ClusterKey::from_secret(b"s3cret");
        let other = ClusterKey::from_secret(b"guess");
        let n = nonce();
        let p = a.client_proof(&n, 7);
        assert!(
            b.check_client(&n, 7, &p),
            "a trailing newline does not change the key"
        );
        assert!(!other.check_client(&n, 7, &p));
        assert!(
            !a.check_client(&n, 8, &p),
            "the proof is bound to the node id"
        );
        assert!(
            !a.check_server(&n, 7, &p),
            "client and server proofs differ"
        );
        assert_ne!(nonce(), nonce());
    }

    #[test]
    fn frames_round_trip_and_oversize_is_refused() {
        let f = encode(&Envelope {
            id: 7,
            body: Request::Forward(Batch::default()),
        })
        .unwrap();
        let len = frame_len(f[..4].try_into().unwrap()).unwrap();
        assert_eq!(len, f.len() - 4);
        let e: Envelope<Request> = decode(&f[4..]).unwrap();
        assert_eq!(e.id, 7);
        assert!(matches!(e.body, Request::Forward(b) if b.is_empty()));
        assert!(matches!(frame_len([0xff; 4]), Err(FrameError::TooLarge(_))));
        assert!(decode::<Envelope<Request>>(&[9, 9, 9]).is_err());
    }
}

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
//! then, both ways: u32 length ‖ bincode(Envelope { id, body }) ‖ mac(session, n ‖ body)
//! ```
//!
//! Every frame after the handshake carries a MAC under a key of its own
//! direction, derived from the secret and both nonces, over its number on
//! the connection and its body ([`FrameSeal`]). Without it, on a plain link
//! the handshake proved who opened the connection and nothing after it: a
//! host on the path could change or inject Raft appends, votes and
//! snapshots. With the number, a frame cannot be replayed, dropped or
//! reordered without the next check failing.
//!
//! The client tags each request with an id of its own and the server answers
//! with the same id, in whatever order the answers are ready: one connection
//! per pair of nodes carries Raft RPCs, forwarded batches and pre-votes at
//! once, and is authenticated once.
//!
//! The MAC is blake3 in keyed mode, with a key derived from the secret file.
//! It authenticates the peers and every frame; it does not encrypt. Use TLS
//! on networks you do not trust.

use firstseen_raft::{NodeId, TypeConfig};
use firstseen_store::{Batch, Outcome};
use openraft::error::{InstallSnapshotError, RaftError};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse,
    VoteRequest, VoteResponse,
};
use openraft::LogId;
use serde::{Deserialize, Serialize};

/// Protocol magic and version, sent first by the server. Version 3 seals
/// every frame ([`FrameSeal`]) and carries [`Envelope`]s, many in flight on
/// one connection. Requests added since are new variants at the end of
/// [`Request`], so the magic stays: a node of an older release cannot
/// decode them, which is why they are sent only when it can (the cluster
/// level) or on a connection of their own ([`Request::may_be_unknown`]).
pub const MAGIC: &[u8; 8] = b"FSPEER03";

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

pub use crate::secret::ClusterKey;

/// The handshake's proofs, under the cluster key.
impl ClusterKey {
    fn mac(&self, role: &[u8], nonce: &[u8; 32], node: NodeId) -> blake3::Hash {
        let mut h = blake3::Hasher::new_keyed(self.keyed());
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

/// Why a handshake failed, on either side.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HandshakeError {
    #[error("not a firstseen peer port, or another protocol version")]
    NotAPeer,
    #[error("claims to be node {0} but does not know the cluster secret")]
    ClientUnproven(NodeId),
    #[error("node {0} does not know the cluster secret")]
    ServerUnproven(NodeId),
}

/// The handshake's four steps as pure functions over its fixed-size
/// messages; the sockets in `server.rs` and `peers.rs` only move the bytes.
pub mod handshake {
    use super::{ClusterKey, HandshakeError, NodeId, MAGIC};

    pub const HELLO: usize = 8 + 32;
    pub const CLIENT: usize = 8 + 32 + 32;
    pub const SERVER: usize = 8 + 32;

    /// Server, first: the magic and its challenge.
    pub fn hello(challenge: &[u8; 32]) -> [u8; HELLO] {
        let mut out = [0u8; HELLO];
        out[..8].copy_from_slice(MAGIC);
        out[8..].copy_from_slice(challenge);
        out
    }

    /// Client: its answer to a hello, proving it knows the secret.
    pub fn answer(
        key: &ClusterKey,
        hello: &[u8; HELLO],
        me: NodeId,
        nonce: &[u8; 32],
    ) -> Result<[u8; CLIENT], HandshakeError> {
        if &hello[..8] != MAGIC {
            return Err(HandshakeError::NotAPeer);
        }
        let challenge: [u8; 32] = hello[8..].try_into().expect("32 bytes");
        let mut out = [0u8; CLIENT];
        out[..8].copy_from_slice(&me.to_be_bytes());
        out[8..40].copy_from_slice(nonce);
        out[40..].copy_from_slice(&key.client_proof(&challenge, me));
        Ok(out)
    }

    /// Server: checks the client's answer to `challenge`; returns the
    /// client's node id and the server's own proof to send back.
    pub fn accept(
        key: &ClusterKey,
        challenge: &[u8; 32],
        answer: &[u8; CLIENT],
        me: NodeId,
    ) -> Result<(NodeId, [u8; SERVER]), HandshakeError> {
        let node = u64::from_be_bytes(answer[..8].try_into().expect("8 bytes"));
        let nonce: [u8; 32] = answer[8..40].try_into().expect("32 bytes");
        let proof: [u8; 32] = answer[40..].try_into().expect("32 bytes");
        if !key.check_client(challenge, node, &proof) {
            return Err(HandshakeError::ClientUnproven(node));
        }
        let mut out = [0u8; SERVER];
        out[..8].copy_from_slice(&me.to_be_bytes());
        out[8..].copy_from_slice(&key.server_proof(&nonce, me));
        Ok((node, out))
    }

    /// The client's nonce, from its answer.
    pub fn client_nonce(answer: &[u8; CLIENT]) -> [u8; 32] {
        answer[8..40].try_into().expect("32 bytes")
    }

    /// The frame seals of a connection whose handshake used these nonces,
    /// as (outgoing, incoming) for the server or the client.
    pub fn seals(
        key: &ClusterKey,
        server_nonce: &[u8; 32],
        client_nonce: &[u8; 32],
        server: bool,
    ) -> (super::FrameSeal, super::FrameSeal) {
        use super::{Direction, FrameSeal};
        let to_server = FrameSeal::new(key, Direction::ToServer, server_nonce, client_nonce);
        let to_client = FrameSeal::new(key, Direction::ToClient, server_nonce, client_nonce);
        if server {
            (to_client, to_server)
        } else {
            (to_server, to_client)
        }
    }

    /// Client, last: checks the server's proof; returns its node id.
    pub fn confirm(
        key: &ClusterKey,
        nonce: &[u8; 32],
        reply: &[u8; SERVER],
    ) -> Result<NodeId, HandshakeError> {
        let server = u64::from_be_bytes(reply[..8].try_into().expect("8 bytes"));
        let proof: [u8; 32] = reply[8..].try_into().expect("32 bytes");
        if !key.check_server(nonce, server, &proof) {
            return Err(HandshakeError::ServerUnproven(server));
        }
        Ok(server)
    }
}

/// Bytes of the MAC at the end of every frame after the handshake.
pub const FRAME_MAC: usize = 32;

/// The integrity of one direction of a connection's frames: a key of its
/// own and the number of the next frame.
pub struct FrameSeal {
    key: [u8; 32],
    next: u64,
}

/// Which way frames go, as the key derivation tells them apart.
#[derive(Clone, Copy)]
pub enum Direction {
    ToServer,
    ToClient,
}

impl FrameSeal {
    /// The seal of `direction` on the connection whose handshake used these
    /// nonces. Both ends derive the same two.
    pub fn new(
        key: &ClusterKey,
        direction: Direction,
        server_nonce: &[u8; 32],
        client_nonce: &[u8; 32],
    ) -> Self {
        let mut h = blake3::Hasher::new_keyed(key.keyed());
        h.update(b"firstseen frames v1");
        h.update(match direction {
            Direction::ToServer => b"to server",
            Direction::ToClient => b"to client",
        });
        h.update(server_nonce);
        h.update(client_nonce);
        Self {
            key: *h.finalize().as_bytes(),
            next: 0,
        }
    }

    fn mac(&self, body: &[u8]) -> blake3::Hash {
        let mut h = blake3::Hasher::new_keyed(&self.key);
        h.update(&self.next.to_le_bytes());
        h.update(body);
        h.finalize()
    }

    /// Appends the MAC of an encoded frame ([`encode`]: length, then body)
    /// to it, as the next frame of this direction.
    pub fn seal(&mut self, frame: &mut Vec<u8>) {
        let mac = self.mac(&frame[4..]);
        frame.extend_from_slice(mac.as_bytes());
        self.next += 1;
    }

    /// A copy that expects frame `next` (for tests).
    #[cfg(test)]
    fn clone_at(&self, next: u64) -> Self {
        Self {
            key: self.key,
            next,
        }
    }

    /// Whether `mac` is the MAC of `body` as the next frame of this
    /// direction. Compared in constant time. A frame that fails closes the
    /// connection, so the count never needs to skip one.
    pub fn open(&mut self, body: &[u8], mac: &[u8; FRAME_MAC]) -> bool {
        let ok = self.mac(body) == blake3::Hash::from(*mac);
        self.next += 1;
        ok
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
    /// A node rejoining with a set-aside log asks the leader how far it must
    /// apply before it votes again (`firstseen_raft::rejoin`).
    ReadIndex,
    /// Which cluster levels the asked node's release runs
    /// (`firstseen_store::level`). A release from before levels cannot
    /// decode it and closes the connection, so it is asked on a connection
    /// of its own ([`super::peers::Peers::call`]).
    Levels,
    /// [`Request::Forward`] with each copy's key kind: sent from cluster
    /// level 2, when every member reads it.
    ForwardKinds {
        batch: Batch,
        kinds: Vec<firstseen_store::KeyKind>,
    },
}

impl Request {
    /// Whether a node of a release before levels may not read this request:
    /// it goes on a connection of its own, whose loss costs nothing else.
    pub fn may_be_unknown(&self) -> bool {
        matches!(self, Request::Levels)
    }
}

/// The levels a node's release runs, and the release.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Levels {
    pub oldest: u32,
    pub supported: u32,
    /// The release's version, for the operator.
    pub release: String,
}

impl Levels {
    /// This release's.
    pub fn this_release() -> Self {
        Self {
            oldest: firstseen_store::level::OLDEST,
            supported: firstseen_store::level::SUPPORTED,
            release: env!("CARGO_PKG_VERSION").to_string(),
        }
    }
}

/// Why the asked node gave no read index.
#[derive(Debug, Clone, Serialize, Deserialize, thiserror::Error)]
pub enum ReadIndexError {
    #[error("node is not the leader (leader: {leader:?})")]
    NotLeader { leader: Option<NodeId> },
    /// No quorum confirmed the leadership within the confirm timeout.
    #[error("no quorum confirmed the leadership in time")]
    Unconfirmed,
    /// Raft stopped (a storage failure); its text travels as the detail.
    #[error("raft: {detail}")]
    Fatal { detail: String },
}

/// Why a forwarded batch was not committed. It crosses the peer link, so
/// the detail of an error from another crate travels as its text; the
/// variant is what a caller decides on.
#[derive(Debug, Clone, Serialize, Deserialize, thiserror::Error)]
pub enum ForwardError {
    #[error("node is not the leader (leader: {leader:?})")]
    NotLeader { leader: Option<NodeId> },
    /// The leader's disk is below its reserve: it commits nothing until
    /// space returns (G4: nothing is acked that could not be stored).
    #[error("leader cannot commit: {reason}")]
    DiskLow { reason: String },
    #[error("node is shutting down")]
    ShuttingDown,
    /// Raft did not commit the entry (a storage or group error).
    #[error("not committed: {detail}")]
    NotCommitted { detail: String },
    /// The group's answer did not match the batch: sent again whole.
    #[error("inconsistent answer: {detail}")]
    Inconsistent { detail: String },
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
    /// The leader's read index: every entry committed so far is at or below
    /// it.
    ReadIndex(Result<Option<LogId<NodeId>>, ReadIndexError>),
    /// The request was not handed to Raft: this node cannot take it now (its
    /// disk is below the reserve). The caller treats the node as unreachable
    /// and backs off.
    Refused(String),
    Levels(Levels),
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

/// What a frame body is given before its bytes arrive; it grows as they do.
const FIRST_BODY_ALLOCATION: usize = 64 * 1024;

/// Reads a frame body of `len` bytes (already checked against
/// [`MAX_FRAME`]), allocating as bytes arrive: a peer that announces a
/// 256 MiB frame and sends nothing more costs no more than what it sent.
pub async fn read_body<R>(rd: &mut R, len: usize) -> std::io::Result<Vec<u8>>
where
    R: tokio::io::AsyncRead + Unpin,
{
    use tokio::io::AsyncReadExt;
    let mut body = Vec::with_capacity(len.min(FIRST_BODY_ALLOCATION));
    let got = rd.take(len as u64).read_to_end(&mut body).await?;
    if got < len {
        return Err(std::io::ErrorKind::UnexpectedEof.into());
    }
    Ok(body)
}

/// Checks a frame header before its body is read.
pub fn frame_len(header: [u8; 4]) -> Result<usize, FrameError> {
    let len = u32::from_be_bytes(header);
    if len > MAX_FRAME {
        return Err(FrameError::TooLarge(len));
    }
    Ok(len as usize)
}

/// How much of which snapshot this node has received, so that a chunk can
/// be checked before openraft writes it.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct SnapshotProgress {
    /// The snapshot being received and the end of its bytes so far.
    receiving: Option<(String, u64)>,
}

impl SnapshotProgress {
    /// Accepts a chunk that starts a snapshot (offset 0) or continues the
    /// one being received without leaving a hole (a resend may overlap what
    /// arrived). Anything else is refused with the offset this node expects:
    /// openraft would seek to any offset it is given, and a file written at
    /// an offset far past its end is as large as that offset says.
    pub fn accept(&mut self, id: &str, offset: u64, len: u64) -> Result<(), u64> {
        let end = match &self.receiving {
            Some((current, end)) if current == id => *end,
            _ if offset == 0 => 0,
            _ => return Err(0),
        };
        if offset > end {
            return Err(end);
        }
        let new_end = end.max(offset.saturating_add(len));
        self.receiving = Some((id.to_string(), new_end));
        Ok(())
    }
}

/// Decodes a frame body.
pub fn decode<T: for<'de> Deserialize<'de>>(body: &[u8]) -> Result<T, FrameError> {
    bincode::deserialize(body).map_err(|e| FrameError::Decode(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The Raft messages and replies as they cross the peer link, byte for
    /// byte (bincode: fixed-width little-endian integers, a u32 variant
    /// index, a one-byte option tag, a u64 length before a sequence). A node
    /// of the next release must send and read these exactly during a
    /// rolling upgrade, whatever openraft release it is built on: a reply
    /// one side cannot decode closes the link and fails every call on it.
    /// openraft 0.10 changes some of these types (its `StorageError` is a
    /// struct), so this pins what the running release sends.
    #[test]
    fn raft_messages_and_replies_keep_their_bytes() {
        use openraft::error::{Fatal, SnapshotMismatch};
        use openraft::{SnapshotMeta, SnapshotSegmentId, StoredMembership, Vote};
        let le = |v: u64| v.to_le_bytes().to_vec();
        let tag = |v: u32| v.to_le_bytes().to_vec();
        let vote =
            |term, node, committed: bool| [le(term), le(node), vec![committed as u8]].concat();
        let id =
            |term, node, index| LogId::new(openraft::CommittedLeaderId::new(term, node), index);
        // An Option's tag, then the id's term, node and index.
        let some_id = |term, node, index| [vec![1u8], le(term), le(node), le(index)].concat();
        let text = |s: &str| [le(s.len() as u64), s.as_bytes().to_vec()].concat();
        // The whole frame as `encode` writes it (length, then the envelope
        // with its id, then the body), and the expected bytes decoded back
        // into the same frame: the codec's options are pinned with the
        // types.
        fn check<T: Serialize + for<'de> Deserialize<'de>>(msg: &T, body: Vec<u8>, what: &str) {
            let frame = encode(&Envelope { id: 7, body: msg }).expect("encodes");
            let want = [
                ((8 + body.len()) as u32).to_be_bytes().to_vec(),
                7u64.to_le_bytes().to_vec(),
                body,
            ]
            .concat();
            assert_eq!(frame, want, "{what}");
            let back: Envelope<T> = decode(&want[4..]).expect("decodes");
            assert_eq!(encode(&back).expect("encodes"), want, "{what}, decoded");
        }

        let ask = Request::Vote(VoteRequest {
            vote: Vote::new(5, 2),
            last_log_id: Some(id(4, 1, 9)),
        });
        let want = [tag(1), vote(5, 2, false), some_id(4, 1, 9)].concat();
        check(&ask, want, "vote request");

        let granted = Reply::Vote(Ok(VoteResponse::new(
            Vote::new_committed(5, 2),
            Some(id(4, 1, 9)),
            true,
        )));
        let want = [tag(1), tag(0), vote(5, 2, true), vec![1], some_id(4, 1, 9)].concat();
        check(&granted, want, "vote reply");

        let append = Request::AppendEntries(AppendEntriesRequest {
            vote: Vote::new_committed(5, 2),
            prev_log_id: Some(id(5, 2, 9)),
            entries: vec![openraft::Entry {
                log_id: id(5, 2, 10),
                payload: openraft::EntryPayload::Blank,
            }],
            leader_commit: None,
        });
        let entry = [le(5), le(2), le(10), tag(0)].concat();
        let want = [
            tag(0),
            vote(5, 2, true),
            some_id(5, 2, 9),
            le(1),
            entry,
            vec![0],
        ]
        .concat();
        check(&append, want, "append request");

        // A node whose core stopped answers every append with this.
        let stopped = Reply::AppendEntries(Err(RaftError::Fatal(Fatal::Stopped)));
        check(
            &stopped,
            [tag(0), tag(1), tag(1), tag(2)].concat(),
            "append refused: raft stopped",
        );

        let chunk = Request::InstallSnapshot(InstallSnapshotRequest {
            vote: Vote::new_committed(5, 2),
            meta: SnapshotMeta {
                last_log_id: Some(id(4, 1, 9)),
                last_membership: StoredMembership::default(),
                snapshot_id: "s-1".into(),
            },
            offset: 7,
            data: vec![0xab, 0xcd],
            done: true,
        });
        // The default membership: no log id, no configs, no nodes.
        let membership = [vec![0u8], le(0), le(0)].concat();
        let want = [
            tag(2),
            vote(5, 2, true),
            some_id(4, 1, 9),
            membership,
            text("s-1"),
            le(7),
            le(2),
            vec![0xab, 0xcd],
            vec![1],
        ]
        .concat();
        check(&chunk, want, "snapshot chunk");

        let taken = Reply::InstallSnapshot(Ok(InstallSnapshotResponse {
            vote: Vote::new_committed(5, 2),
        }));
        check(
            &taken,
            [tag(2), tag(0), vote(5, 2, true)].concat(),
            "snapshot chunk taken",
        );

        let mismatch = Reply::InstallSnapshot(Err(RaftError::APIError(
            InstallSnapshotError::SnapshotMismatch(SnapshotMismatch {
                expect: SnapshotSegmentId {
                    id: "s-1".into(),
                    offset: 0,
                },
                got: SnapshotSegmentId {
                    id: "s-1".into(),
                    offset: 7,
                },
            }),
        )));
        let want = [
            tag(2),
            tag(1),
            tag(0),
            tag(0),
            text("s-1"),
            le(0),
            text("s-1"),
            le(7),
        ]
        .concat();
        check(&mismatch, want, "snapshot chunk out of place");

        // What a follower answers an append.
        let answers = [
            (AppendEntriesResponse::Success, tag(0)),
            (
                AppendEntriesResponse::PartialSuccess(Some(id(5, 2, 9))),
                [tag(1), some_id(5, 2, 9)].concat(),
            ),
            (AppendEntriesResponse::Conflict, tag(2)),
            (
                AppendEntriesResponse::HigherVote(Vote::new(6, 3)),
                [tag(3), vote(6, 3, false)].concat(),
            ),
        ];
        for (answer, body) in answers {
            let what = format!("append answer {answer:?}");
            check(
                &Reply::AppendEntries(Ok(answer)),
                [tag(0), tag(0), body].concat(),
                &what,
            );
        }

        // A membership entry: the members and where they live.
        let member = firstseen_raft::Member {
            addr: "a:1".into(),
            zone: "z".into(),
            http: "h:2".into(),
        };
        let membership = openraft::Membership::new(
            vec![[1u64].into_iter().collect()],
            std::collections::BTreeMap::from([(1u64, member)]),
        );
        let append = Request::AppendEntries(AppendEntriesRequest {
            vote: Vote::new_committed(5, 2),
            prev_log_id: None,
            entries: vec![openraft::Entry {
                log_id: id(5, 2, 1),
                payload: openraft::EntryPayload::Membership(membership),
            }],
            leader_commit: Some(id(5, 2, 1)),
        });
        let entry = [
            le(5),
            le(2),
            le(1),
            tag(2),
            // configs: one config of one member
            le(1),
            le(1),
            le(1),
            // nodes: member 1 and where it lives
            le(1),
            le(1),
            text("a:1"),
            text("z"),
            text("h:2"),
        ]
        .concat();
        let want = [
            tag(0),
            vote(5, 2, true),
            vec![0],
            le(1),
            entry,
            some_id(5, 2, 1),
        ]
        .concat();
        check(&append, want, "membership append");
    }

    #[test]
    fn a_handshake_passes_with_the_secret_and_fails_without_it() {
        let key = ClusterKey::from_secret(b"the secret");
        let other = ClusterKey::from_secret(b"another secret");
        let (challenge, nonce) = ([1u8; 32], [2u8; 32]);
        let hello = handshake::hello(&challenge);
        let answer = handshake::answer(&key, &hello, 7, &nonce).unwrap();
        let (client, reply) = handshake::accept(&key, &challenge, &answer, 3).unwrap();
        assert_eq!(client, 7);
        assert_eq!(handshake::confirm(&key, &nonce, &reply), Ok(3));
        let forged = handshake::answer(&other, &hello, 7, &nonce).unwrap();
        assert_eq!(
            handshake::accept(&key, &challenge, &forged, 3),
            Err(HandshakeError::ClientUnproven(7))
        );
        let (_, forged) = handshake::accept(&other, &challenge, &forged, 3).unwrap();
        assert_eq!(
            handshake::confirm(&key, &nonce, &forged),
            Err(HandshakeError::ServerUnproven(3))
        );
        let mut wrong = hello;
        wrong[7] ^= 1;
        assert_eq!(
            handshake::answer(&key, &wrong, 7, &nonce),
            Err(HandshakeError::NotAPeer)
        );
    }

    #[test]
    fn a_frame_changed_replayed_or_from_the_other_direction_fails_its_check() {
        let key = ClusterKey::from_secret(b"the secret");
        let (s, c) = ([1u8; 32], [2u8; 32]);
        let mut out = FrameSeal::new(&key, Direction::ToServer, &s, &c);
        let mut inn = FrameSeal::new(&key, Direction::ToServer, &s, &c);
        let mut frames = Vec::new();
        for body in [b"first".as_slice(), b"second"] {
            let mut f = (body.len() as u32).to_be_bytes().to_vec();
            f.extend_from_slice(body);
            out.seal(&mut f);
            frames.push(f);
        }
        let split = |f: &Vec<u8>| {
            let (body, mac) = f[4..].split_at(f.len() - 4 - FRAME_MAC);
            (body.to_vec(), <[u8; FRAME_MAC]>::try_from(mac).unwrap())
        };
        let (b0, m0) = split(&frames[0]);
        let (b1, m1) = split(&frames[1]);
        assert!(inn.open(&b0, &m0));
        assert!(!inn.clone_at(1).open(&b0, &m0), "a replayed frame");
        let mut changed = b1.clone();
        changed[0] ^= 1;
        assert!(!inn.clone_at(1).open(&changed, &m1), "a changed body");
        let back = FrameSeal::new(&key, Direction::ToClient, &s, &c);
        assert!(
            !back.clone_at(1).open(&b1, &m1),
            "the other direction's key"
        );
        let other = ClusterKey::from_secret(b"another secret");
        assert!(!FrameSeal::new(&other, Direction::ToServer, &s, &c)
            .clone_at(1)
            .open(&b1, &m1));
        assert!(inn.open(&b1, &m1));
    }

    #[test]
    fn a_snapshot_chunk_may_not_leave_a_hole() {
        let mut p = SnapshotProgress::default();
        assert_eq!(p.accept("a", 5, 10), Err(0), "a new snapshot starts at 0");
        assert_eq!(p.accept("a", 0, 10), Ok(()));
        assert_eq!(p.accept("a", 10, 10), Ok(()));
        assert_eq!(p.accept("a", 10, 10), Ok(()), "a resend overlaps");
        assert_eq!(p.accept("a", 1 << 60, 1), Err(20));
        assert_eq!(p.accept("a", u64::MAX, 1), Err(20));
        assert_eq!(p.accept("b", 20, 1), Err(0), "another snapshot starts at 0");
        assert_eq!(p.accept("b", 0, 3), Ok(()));
        assert_eq!(p.accept("a", 20, 1), Err(0), "the old one is gone");
    }

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

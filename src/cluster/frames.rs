//! The peer protocol's frames on a connection, read and written by the same
//! code at both ends: the server reading requests and writing replies, a
//! link writing requests and reading replies, and a call on a connection of
//! its own ([`super::peers`]). Each frame is a length, a body and a MAC
//! under the seal of its direction ([`wire::FrameSeal`]).
//!
//! A header may take as long as the peer stays quiet (an idle link is
//! normal); once it has come, the rest of the frame must follow within
//! [`BODY_TIMEOUT`]. Otherwise a peer, or a host on the path, that sends a
//! header and stops would hold the reader, and every reply it was to
//! deliver, for as long as TCP keeps the connection.

use std::time::Duration;

use serde::de::DeserializeOwned;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::wire::{self, Envelope};

/// How long a frame's body and MAC may take once its header arrived. A
/// frame is at most [`wire::MAX_FRAME`] bytes; at the slowest link a zone
/// should have, that is seconds.
pub const BODY_TIMEOUT: Duration = Duration::from_secs(30);

/// Why no frame could be read. Each ends the connection; the variant says
/// whether the peer simply left ([`ReadError::Closed`]) or misbehaved.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    /// The peer closed the connection between frames.
    #[error("connection closed")]
    Closed,
    #[error("read failed: {0}")]
    Io(#[source] std::io::Error),
    /// The header announces more than a frame may hold.
    #[error(transparent)]
    TooLarge(wire::FrameError),
    #[error("frame body timed out")]
    BodyTimeout,
    #[error("frame failed its integrity check (changed on the way, or not from the peer that authenticated)")]
    Integrity,
    /// The frame was sealed by the peer and still does not decode: a
    /// release that sends what this one does not know, or a bug.
    #[error("garbled frame: {0}")]
    Garbled(#[source] wire::FrameError),
}

/// The reading half of an authenticated connection.
pub struct FrameReader<R> {
    rd: R,
    check: wire::FrameSeal,
}

impl<R: AsyncRead + Unpin> FrameReader<R> {
    /// `check` is the connection's incoming seal from the handshake.
    pub fn new(rd: R, check: wire::FrameSeal) -> Self {
        FrameReader { rd, check }
    }

    /// The next frame, checked and decoded. Not cancel-safe halfway through
    /// a frame: a reader that drops this future drops the connection too.
    pub async fn next<T: DeserializeOwned>(&mut self) -> Result<Envelope<T>, ReadError> {
        let mut header = [0u8; 4];
        match self.rd.read_exact(&mut header).await {
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => {
                return Err(ReadError::Closed)
            }
            Err(e) => return Err(ReadError::Io(e)),
        }
        let len = wire::frame_len(header).map_err(ReadError::TooLarge)?;
        let rest = async {
            let body = wire::read_body(&mut self.rd, len).await?;
            let mut mac = [0u8; wire::FRAME_MAC];
            self.rd.read_exact(&mut mac).await?;
            Ok::<_, std::io::Error>((body, mac))
        };
        let (body, mac) = tokio::time::timeout(BODY_TIMEOUT, rest)
            .await
            .map_err(|_| ReadError::BodyTimeout)?
            .map_err(ReadError::Io)?;
        if !self.check.open(&body, &mac) {
            return Err(ReadError::Integrity);
        }
        wire::decode(&body).map_err(ReadError::Garbled)
    }
}

/// Writes encoded frames ([`wire::encode`]) from `queue`, each sealed as the
/// next of its direction, until the queue ends, a write fails or `closed`
/// is cancelled; then cancels `closed` (so the reading half and every
/// waiter learn the connection is gone) and shuts the writing half.
pub async fn write_frames<W: AsyncWrite + Unpin>(
    mut wr: W,
    mut seal: wire::FrameSeal,
    mut queue: mpsc::Receiver<Vec<u8>>,
    closed: CancellationToken,
) {
    loop {
        let mut frame = tokio::select! {
            f = queue.recv() => match f { Some(f) => f, None => break },
            _ = closed.cancelled() => break,
        };
        seal.seal(&mut frame);
        if wr.write_all(&frame).await.is_err() {
            break;
        }
    }
    closed.cancel();
    let _ = wr.shutdown().await;
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::secret::ClusterKey;
    use tokio::io::AsyncWriteExt;

    /// Both ends of one direction: the sender's seal and the reader's.
    fn seals() -> (wire::FrameSeal, wire::FrameSeal) {
        let key = ClusterKey::from_secret(b"frames test secret");
        let (s, c) = (wire::nonce(), wire::nonce());
        let to = wire::Direction::ToServer;
        (
            wire::FrameSeal::new(&key, to, &s, &c),
            wire::FrameSeal::new(&key, to, &s, &c),
        )
    }

    /// A header followed by nothing ends the read at the body's bound,
    /// not when TCP gives up.
    #[tokio::test(start_paused = true)]
    async fn a_header_without_its_body_times_out() {
        let (_, check) = seals();
        let (mut w, r) = tokio::io::duplex(64);
        w.write_all(&100u32.to_be_bytes()).await.unwrap();
        let mut reader = FrameReader::new(r, check);
        let got = reader.next::<u64>().await;
        assert!(matches!(got, Err(ReadError::BodyTimeout)), "{got:?}");
        drop(w);
    }

    /// A sealed frame reads back; a changed one fails its check; a close
    /// between frames is a close, not an error of the peer.
    #[tokio::test]
    async fn frames_are_checked_and_a_close_is_told_apart() {
        let (mut seal, check) = seals();
        let (mut w, r) = tokio::io::duplex(1 << 16);
        let mut reader = FrameReader::new(r, check);
        let mut frame = wire::encode(&Envelope { id: 7, body: 42u64 }).unwrap();
        seal.seal(&mut frame);
        w.write_all(&frame).await.unwrap();
        let env = reader.next::<u64>().await.unwrap();
        assert_eq!((env.id, env.body), (7, 42));

        let mut frame = wire::encode(&Envelope { id: 8, body: 43u64 }).unwrap();
        seal.seal(&mut frame);
        frame[6] ^= 1;
        w.write_all(&frame).await.unwrap();
        assert!(matches!(
            reader.next::<u64>().await,
            Err(ReadError::Integrity)
        ));

        let (_, check) = seals();
        let (w, r) = tokio::io::duplex(64);
        drop(w);
        let mut reader = FrameReader::new(r, check);
        assert!(matches!(reader.next::<u64>().await, Err(ReadError::Closed)));
    }
}

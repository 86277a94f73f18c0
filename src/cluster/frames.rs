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
///
/// Flushes once the queue is empty: every frame queued so far goes out in
/// one burst, then the flush. Under TLS the flush is what sends a frame's
/// last bytes: tokio-rustls's `poll_write` takes the plaintext, encrypts it
/// into its own buffer and writes as much as the socket takes without
/// waiting; when the socket is full it answers with the bytes taken, and
/// the rest stays in rustls until the next write or a flush. Without the
/// flush, a frame written while the socket was full kept its tail until the
/// next frame came, or for ever on a quiet link (a reply, a heartbeat).
pub async fn write_frames<W: AsyncWrite + Unpin>(
    mut wr: W,
    mut seal: wire::FrameSeal,
    mut queue: mpsc::Receiver<Vec<u8>>,
    closed: CancellationToken,
) {
    'conn: loop {
        let mut frame = tokio::select! {
            f = queue.recv() => match f { Some(f) => f, None => break },
            _ = closed.cancelled() => break,
        };
        loop {
            seal.seal(&mut frame);
            if wr.write_all(&frame).await.is_err() {
                break 'conn;
            }
            match queue.try_recv() {
                Ok(next) => frame = next,
                Err(_) => break,
            }
        }
        if wr.flush().await.is_err() {
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

    /// A throwaway CA and a node certificate it signs for `firstseen-peer`,
    /// made with the openssl CLI as the integration tests make theirs.
    fn peer_tls(dir: &std::path::Path) -> crate::tls::PeerTls {
        let run = |args: &str| {
            let out = std::process::Command::new("openssl")
                .args(args.split(' '))
                .current_dir(dir)
                .output()
                .expect("openssl");
            assert!(out.status.success(), "openssl {args}: {out:?}");
        };
        std::fs::write(
            dir.join("ext.cnf"),
            "subjectAltName=DNS:firstseen-peer\nextendedKeyUsage=serverAuth,clientAuth\nbasicConstraints=CA:FALSE\n",
        )
        .unwrap();
        let ec = "-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes";
        run(&format!(
            "req -x509 {ec} -keyout ca.key -out ca.crt -days 2 -subj /CN=test-CA"
        ));
        run(&format!(
            "req {ec} -keyout node.key -out node.csr -subj /CN=firstseen-peer"
        ));
        run("x509 -req -in node.csr -CA ca.crt -CAkey ca.key -CAcreateserial -out node.crt -days 2 -extfile ext.cnf");
        crate::tls::PeerTls::load(&crate::tls::config::TlsConfig {
            cert_file: dir.join("node.crt"),
            key_file: dir.join("node.key"),
            ca_file: dir.join("ca.crt"),
            server_name: "firstseen-peer".into(),
        })
        .unwrap()
    }

    /// Under TLS, one frame reaches the other side whole with nothing
    /// written after it. The frame is far larger than the sockets' small
    /// buffers, so the socket is full when its last bytes are encrypted and
    /// rustls keeps them: only the writer's flush sends them (without it
    /// the read waited for a next frame that never came).
    #[tokio::test]
    async fn under_tls_a_frame_arrives_whole_with_nothing_after_it() {
        use tokio::net::TcpSocket;
        let dir = tempfile::tempdir().unwrap();
        let tls = peer_tls(dir.path());
        let small = |s: &TcpSocket| {
            s.set_send_buffer_size(4096).unwrap();
            s.set_recv_buffer_size(4096).unwrap();
        };
        let server = TcpSocket::new_v4().unwrap();
        small(&server);
        server.bind("127.0.0.1:0".parse().unwrap()).unwrap();
        let addr = server.local_addr().unwrap();
        let listener = server.listen(1).unwrap();
        let client = TcpSocket::new_v4().unwrap();
        small(&client);
        let (connected, accepted) = tokio::join!(client.connect(addr), listener.accept());
        let (connected, (accepted, _)) = (connected.unwrap(), accepted.unwrap());
        let (client, server) = tokio::join!(
            tls.connector.connect(tls.server_name.clone(), connected),
            tls.acceptor.accept(accepted)
        );
        let (client, server) = (client.unwrap(), server.unwrap());

        let (seal, check) = seals();
        let (frames, queue) = mpsc::channel(4);
        let closed = CancellationToken::new();
        tokio::spawn(write_frames(client, seal, queue, closed.clone()));
        let body = vec![7u8; 1 << 20];
        frames
            .send(
                wire::encode(&Envelope {
                    id: 1,
                    body: body.clone(),
                })
                .unwrap(),
            )
            .await
            .unwrap();
        // `frames` stays open and sends nothing more: no next frame, no close.
        let mut reader = FrameReader::new(server, check);
        let got = tokio::time::timeout(Duration::from_secs(5), reader.next::<Vec<u8>>())
            .await
            .expect("the frame's tail stayed in the writer's TLS buffer")
            .unwrap();
        assert_eq!((got.id, got.body), (1, body));
        drop(frames);
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

//! A broker on the other end of a stream, driven step by step by a test:
//! it speaks the same codec, answers the handshake, and answers each
//! request only when the test says, so that tests choose the order of the
//! broker's answers. With it, the helpers that connect to it, open a
//! producer on it and build entries, shared by the tests of `conn.rs`,
//! `socket.rs` and `mod.rs`.

use std::time::Duration;

use futures::{SinkExt, StreamExt};
use pulsar::message::{Codec, Message};
use pulsar::proto::{self, base_command::Type, BaseCommand};
use tokio::io::{AsyncRead, AsyncWrite, ReadHalf, WriteHalf};
use tokio_util::codec::{FramedRead, FramedWrite};

use super::conn::Conn;
use super::dial::{command, Target, PROTOCOL_VERSION};
use super::entry::{Entry, Open, Outgoing};

pub struct Broker<S> {
    rx: FramedRead<ReadHalf<S>, Codec>,
    tx: FramedWrite<WriteHalf<S>, Codec>,
}

impl<S: AsyncRead + AsyncWrite + Unpin> Broker<S> {
    /// Takes the client's CONNECT on `stream` and answers it.
    pub async fn accept(stream: S) -> Self {
        let (rd, wr) = tokio::io::split(stream);
        let mut b = Broker {
            rx: FramedRead::new(rd, Codec),
            tx: FramedWrite::new(wr, Codec),
        };
        assert!(b.next().await.connect.is_some(), "CONNECT first");
        b.reply(command(Type::Connected, |c| {
            c.connected = Some(proto::CommandConnected {
                server_version: "fake".into(),
                protocol_version: Some(PROTOCOL_VERSION),
                ..Default::default()
            })
        }))
        .await;
        b
    }

    /// The client's next command but pings and pongs.
    pub async fn next(&mut self) -> BaseCommand {
        loop {
            let c = self
                .rx
                .next()
                .await
                .expect("the client keeps the connection")
                .expect("a frame")
                .command;
            if c.ping.is_none() && c.pong.is_none() {
                return c;
            }
        }
    }

    /// The client's next command, if one comes within `within`.
    pub async fn next_within(&mut self, within: Duration) -> Option<BaseCommand> {
        tokio::time::timeout(within, self.next()).await.ok()
    }

    pub async fn reply(&mut self, c: BaseCommand) {
        self.tx
            .send(Message {
                command: c,
                payload: None,
            })
            .await
            .expect("the client reads");
    }

    /// Takes a PRODUCER request and grants it; returns its producer id.
    pub async fn grant_producer(&mut self) -> u64 {
        let p = self.next().await.producer.expect("a PRODUCER request");
        self.reply(command(Type::ProducerSuccess, |c| {
            c.producer_success = Some(proto::CommandProducerSuccess {
                request_id: p.request_id,
                producer_name: p.producer_name.unwrap_or_default(),
                ..Default::default()
            })
        }))
        .await;
        p.producer_id
    }

    pub async fn receipt(&mut self, producer: u64, first: u64, last: u64) {
        self.reply(command(Type::SendReceipt, |c| {
            c.send_receipt = Some(proto::CommandSendReceipt {
                producer_id: producer,
                sequence_id: first,
                highest_sequence_id: Some(last),
                ..Default::default()
            })
        }))
        .await;
    }

    /// Refuses an entry as Pulsar does: named by its highest id.
    pub async fn refuse(&mut self, producer: u64, last: u64) {
        self.reply(command(Type::SendError, |c| {
            c.send_error = Some(proto::CommandSendError {
                producer_id: producer,
                sequence_id: last,
                error: proto::ServerError::NotAllowedError as i32,
                message: "too big".into(),
            })
        }))
        .await;
    }

    /// Answers a request with an error.
    pub async fn error(&mut self, request_id: u64) {
        self.reply(command(Type::Error, |c| {
            c.error = Some(proto::CommandError {
                request_id,
                error: proto::ServerError::UnknownError as i32,
                message: "not now".into(),
            })
        }))
        .await;
    }

    /// A ping, as a live broker sends one now and then.
    pub async fn ping(&mut self) {
        self.reply(command(Type::Ping, |c| c.ping = Some(Default::default())))
            .await;
    }

    /// The bytes still in the stream, read raw until the client lets
    /// go of it (EOF); what the codec had already taken out of the
    /// stream is not counted. The write half is kept, as a broker's
    /// would be.
    pub async fn rest(self) -> std::io::Result<Vec<u8>> {
        use tokio::io::AsyncReadExt;
        let mut rd = self.rx.into_inner();
        let mut rest = Vec::new();
        rd.read_to_end(&mut rest).await?;
        drop(self.tx);
        Ok(rest)
    }

    pub async fn success(&mut self, request_id: u64) {
        self.reply(command(Type::Success, |c| {
            c.success = Some(proto::CommandSuccess {
                request_id,
                ..Default::default()
            })
        }))
        .await;
    }
}

/// A connection to a [`Broker`] over an in-memory stream.
pub async fn connected(timeout: Duration) -> (Conn, Broker<tokio::io::DuplexStream>) {
    connected_through(timeout, 1 << 20).await
}

/// As [`connected`], over a stream that holds at most `pipe` bytes the
/// other end has not read.
pub async fn connected_through(
    timeout: Duration,
    pipe: usize,
) -> (Conn, Broker<tokio::io::DuplexStream>) {
    let (client, server) = tokio::io::duplex(pipe);
    let target = Target {
        url: "pulsar://fake:6650".into(),
        proxy_to: None,
        tls: None,
        auth: None,
        timeout,
    };
    let tasks = tokio_util::task::TaskTracker::new();
    let (conn, broker) = tokio::join!(Conn::start(client, &target, &tasks), Broker::accept(server));
    (conn.expect("handshake"), broker)
}

pub async fn producer_on(
    conn: &Conn,
    broker: &mut Broker<tokio::io::DuplexStream>,
    topic: &str,
) -> u64 {
    let (id, granted) = tokio::join!(conn.producer(topic, "p"), broker.grant_producer());
    let id = id.expect("granted");
    assert_eq!(id, granted);
    id
}

pub fn entry(first: u64, last: u64) -> Entry {
    let mut open = Open::default();
    for seq in first..=last {
        open.push(Outgoing {
            seq,
            key: format!("{seq:064x}"),
            ..Default::default()
        });
    }
    open.close("p", 0).expect("not empty")
}

//! Dialling a broker: the URL, TCP and TLS, and the handshake that proves
//! who this client is, with the same credentials as the `pulsar` crate's
//! (`auth.rs`'s providers), including the fresh ones a broker asks for when
//! the old ones expire ([`answer_challenge`]).
//!
//! Apart from the connection (`conn.rs`) and its socket loop
//! (`socket.rs`): what it takes to reach a broker and be let in changes
//! with deployments (a proxy, TLS, a token provider), not with how entries
//! and receipts flow once in.

use std::sync::Arc;
use std::time::Duration;

use futures::{SinkExt, StreamExt};
use pulsar::authentication::Authentication;
use pulsar::message::{Codec, Message};
use pulsar::proto::{self, base_command::Type, BaseCommand};
use tokio::io::{AsyncRead, AsyncWrite, ReadHalf, WriteHalf};
use tokio_util::codec::{FramedRead, FramedWrite};

use super::super::port::SendError;
use super::receipts::refusal;

/// The protocol version this client speaks: the one the `pulsar` crate's
/// own connections announce, with which exclusive producers and batched
/// entries work on every broker release the tests run.
pub(super) const PROTOCOL_VERSION: i32 = 12;

pub(super) type Auth = Arc<tokio::sync::Mutex<Box<dyn Authentication>>>;

/// Where a connection goes, and how it proves who it is.
#[derive(Clone)]
pub struct Target {
    /// `pulsar://host:port` or `pulsar+ssl://host:port`.
    pub url: String,
    /// Set when `url` is a proxy: the broker the proxy forwards to.
    pub proxy_to: Option<String>,
    pub tls: Option<Arc<rustls::ClientConfig>>,
    pub auth: Option<Auth>,
    /// Bounds the dial, the handshake and every request.
    pub timeout: Duration,
}

/// A dialled stream to a broker, before the handshake.
pub(super) enum Dialled {
    Tcp(tokio::net::TcpStream),
    Tls(Box<tokio_rustls::client::TlsStream<tokio::net::TcpStream>>),
}

/// The two halves of a stream, framed by the crate's codec.
pub(super) type Framed<S> = (
    FramedRead<ReadHalf<S>, Codec>,
    FramedWrite<WriteHalf<S>, Codec>,
);

/// The `client_version` this client announces.
fn client_version() -> String {
    format!("firstseen {}", env!("CARGO_PKG_VERSION"))
}

/// A command of type `t`, filled in by `fill`.
pub(super) fn command(t: Type, fill: impl FnOnce(&mut BaseCommand)) -> BaseCommand {
    let mut c = BaseCommand {
        r#type: t as i32,
        ..Default::default()
    };
    fill(&mut c);
    c
}

/// Dials `target`: TCP, then TLS for a `pulsar+ssl://` URL.
pub(super) async fn connect(target: &Target) -> Result<Dialled, SendError> {
    let lost = |what: &str, e: &dyn std::fmt::Display| {
        SendError::Lost(format!("{}: {what}: {e}", target.url))
    };
    let (tls, host, port) = parse(&target.url).map_err(|e| lost("url", &e))?;
    let tcp = tokio::time::timeout(
        target.timeout,
        tokio::net::TcpStream::connect((host.as_str(), port)),
    )
    .await
    .map_err(|_| lost("connect", &"timed out"))?
    .map_err(|e| lost("connect", &e))?;
    let _ = tcp.set_nodelay(true);
    if tls {
        let config = target
            .tls
            .clone()
            .ok_or_else(|| lost("tls", &"no TLS settings for a pulsar+ssl:// URL"))?;
        let name = rustls::pki_types::ServerName::try_from(host.clone())
            .map_err(|e| lost("tls server name", &e))?;
        let stream = tokio::time::timeout(
            target.timeout,
            tokio_rustls::TlsConnector::from(config).connect(name, tcp),
        )
        .await
        .map_err(|_| lost("tls handshake", &"timed out"))?
        .map_err(|e| lost("tls handshake", &e))?;
        Ok(Dialled::Tls(Box::new(stream)))
    } else {
        Ok(Dialled::Tcp(tcp))
    }
}

/// Sends CONNECT on `stream` with `target`'s credentials and waits, within
/// the timeout, for the broker to let this client in; returns the stream's
/// framed halves.
pub(super) async fn handshake<S>(stream: S, target: &Target) -> Result<Framed<S>, SendError>
where
    S: AsyncRead + AsyncWrite + Send + Unpin + 'static,
{
    let lost = |what: &str, e: &dyn std::fmt::Display| {
        SendError::Lost(format!("{}: {what}: {e}", target.url))
    };
    let (rd, wr) = tokio::io::split(stream);
    let mut reader = FramedRead::new(rd, Codec);
    let mut writer = FramedWrite::new(wr, Codec);
    let (method, data) = match &target.auth {
        Some(auth) => {
            let mut auth = auth.lock().await;
            let data = auth
                .auth_data()
                .await
                .map_err(|e| lost("credentials", &e))?;
            (Some(auth.auth_method_name()), Some(data))
        }
        None => (None, None),
    };
    let connect = command(Type::Connect, |c| {
        c.connect = Some(proto::CommandConnect {
            client_version: client_version(),
            auth_method_name: method,
            auth_data: data,
            protocol_version: Some(PROTOCOL_VERSION),
            proxy_to_broker_url: target.proxy_to.clone(),
            feature_flags: Some(proto::FeatureFlags {
                supports_auth_refresh: Some(true),
                ..Default::default()
            }),
            ..Default::default()
        })
    });
    writer
        .send(Message {
            command: connect,
            payload: None,
        })
        .await
        .map_err(|e| lost("connect", &e))?;
    let answer = tokio::time::timeout(target.timeout, reader.next())
        .await
        .map_err(|_| lost("handshake", &"no answer in time"))?;
    match answer {
        Some(Ok(m)) if m.command.connected.is_some() => {
            tracing::debug!(broker = %target.url, "producer connection ready");
        }
        Some(Ok(m)) => {
            return Err(match m.command.error {
                Some(e) => refusal(e.error, &e.message),
                None => lost("handshake", &"the broker answered something else"),
            })
        }
        Some(Err(e)) => return Err(lost("handshake", &e)),
        None => return Err(lost("handshake", &"the broker closed the connection")),
    }
    Ok((reader, writer))
}

/// The answer to a broker's credentials challenge: fresh credentials, read
/// again (a rotated token file, a renewed OAuth2 token), within `timeout`.
/// `None`, with a warning, when there are none in time: the broker then
/// drops the connection when the old ones expire.
pub(super) async fn answer_challenge(auth: &Auth, timeout: Duration) -> Option<Message> {
    let fresh = tokio::time::timeout(timeout, async {
        let mut auth = auth.lock().await;
        let data = auth.auth_data().await?;
        Ok::<_, pulsar::error::AuthenticationError>((auth.auth_method_name(), data))
    });
    let (name, data) = match fresh.await {
        Ok(Ok(fresh)) => fresh,
        Ok(Err(e)) => {
            tracing::warn!(error = %e, "no fresh credentials for the broker's challenge");
            return None;
        }
        Err(_) => {
            tracing::warn!(timeout = ?timeout, "no fresh credentials for the broker's challenge in time");
            return None;
        }
    };
    Some(Message {
        command: command(Type::AuthResponse, |c| {
            c.auth_response = Some(proto::CommandAuthResponse {
                client_version: Some(client_version()),
                response: Some(proto::AuthData {
                    auth_method_name: Some(name),
                    auth_data: Some(data),
                }),
                protocol_version: Some(PROTOCOL_VERSION),
            })
        }),
        payload: None,
    })
}

/// A broker URL that cannot be dialled.
#[derive(Debug, thiserror::Error)]
#[error("`{url}`: {problem}")]
struct BadUrl {
    url: String,
    problem: &'static str,
}

/// Scheme, host and port of a broker URL.
fn parse(url: &str) -> Result<(bool, String, u16), BadUrl> {
    let bad = |problem| BadUrl {
        url: url.to_string(),
        problem,
    };
    let (tls, rest, default_port) = if let Some(r) = url.strip_prefix("pulsar+ssl://") {
        (true, r, 6651)
    } else if let Some(r) = url.strip_prefix("pulsar://") {
        (false, r, 6650)
    } else {
        return Err(bad("not a pulsar:// or pulsar+ssl:// URL"));
    };
    let authority = rest.split('/').next().unwrap_or_default();
    let port_of = |p: &str| p.parse().map_err(|_| bad("the port is not a number"));
    let (host, port) = if let Some(r) = authority.strip_prefix('[') {
        let (h, after) = r
            .split_once(']')
            .ok_or_else(|| bad("an IPv6 address without its `]`"))?;
        match after.strip_prefix(':') {
            Some(p) => (h, port_of(p)?),
            None if after.is_empty() => (h, default_port),
            None => return Err(bad("something after the address")),
        }
    } else {
        match authority.rsplit_once(':') {
            Some((h, p)) => (h, port_of(p)?),
            None => (authority, default_port),
        }
    };
    if host.is_empty() {
        return Err(bad("no host"));
    }
    Ok((tls, host.to_string(), port))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn broker_urls_are_read_with_their_default_ports() {
        assert_eq!(
            parse("pulsar://localhost:6650").unwrap(),
            (false, "localhost".into(), 6650)
        );
        assert_eq!(
            parse("pulsar+ssl://broker.example/").unwrap(),
            (true, "broker.example".into(), 6651)
        );
        assert_eq!(
            parse("pulsar://[::1]:7000").unwrap(),
            (false, "::1".into(), 7000)
        );
        assert_eq!(
            parse("pulsar://[::1]").unwrap(),
            (false, "::1".into(), 6650)
        );
        assert!(parse("http://x:1").is_err());
        assert!(parse("pulsar://:1").is_err());
    }
}

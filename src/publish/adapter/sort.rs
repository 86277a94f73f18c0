//! The Pulsar client's errors sorted into the publisher's
//! ([`SendError`]).

use crate::publish::port::SendError;

/// Sorts the client's error into what the publisher decides on: by the
/// broker's refusal code and the client's error variant, never by text.
pub(super) fn sort(e: &pulsar::Error) -> SendError {
    use pulsar::error::{ConnectionError, ProducerError};
    use pulsar::proto::ServerError;
    let text = e.to_string();
    if matches!(e, pulsar::Error::Producer(ProducerError::Fenced))
        || matches!(
            server_error(e),
            Some(ServerError::ProducerBusy | ServerError::ProducerFenced)
        )
    {
        return SendError::HeldElsewhere(text);
    }
    // A broker that does not create topics on its own answers a lookup
    // (or a producer) of a missing one so: the adapter may create it.
    if matches!(server_error(e), Some(ServerError::TopicNotFound)) {
        return SendError::TopicNotFound(text);
    }
    // The broker answered the send with an error instead of a receipt, the
    // producer and its connection still up. The client carries the code
    // only in text; the variant is what is decided on.
    if matches!(
        e,
        pulsar::Error::Producer(ProducerError::Connection(
            ConnectionError::UnexpectedResponse(_)
        ))
    ) {
        return SendError::Refused(text);
    }
    SendError::Lost(text)
}

/// The broker's refusal code inside a client error, wherever the client
/// put it: on the connection, on the producer's connection, or on a batch.
fn server_error(error: &pulsar::Error) -> Option<pulsar::proto::ServerError> {
    use pulsar::error::{ConnectionError, ProducerError, ServiceDiscoveryError};
    let connection = match error {
        pulsar::Error::Connection(c) => c,
        pulsar::Error::Producer(ProducerError::Connection(c)) => c,
        pulsar::Error::Producer(ProducerError::Batch(inner)) => return server_error(inner),
        pulsar::Error::ServiceDiscovery(ServiceDiscoveryError::Query(code, _)) => return *code,
        pulsar::Error::ServiceDiscovery(ServiceDiscoveryError::Connection(c)) => c,
        _ => return None,
    };
    match connection {
        ConnectionError::PulsarError(code, _) => *code,
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pulsar::error::{ConnectionError, ProducerError};
    use pulsar::proto::ServerError;

    /// The client's errors as the publisher's policy meets them: a topic
    /// held by another producer wherever the client put the broker's code,
    /// a refusal of the one message, and anything else lost. Never by the
    /// words of a message.
    #[test]
    fn the_client_s_errors_are_sorted_by_code_and_variant() {
        let refused = |code| {
            pulsar::Error::Connection(ConnectionError::PulsarError(
                Some(code),
                Some("Exclusive access mode".into()),
            ))
        };
        assert!(matches!(
            sort(&refused(ServerError::ProducerBusy)),
            SendError::HeldElsewhere(_)
        ));
        assert!(matches!(
            sort(&refused(ServerError::ProducerFenced)),
            SendError::HeldElsewhere(_)
        ));
        assert!(matches!(
            sort(&pulsar::Error::Producer(ProducerError::Fenced)),
            SendError::HeldElsewhere(_)
        ));
        assert!(matches!(
            sort(&pulsar::Error::Producer(ProducerError::Connection(
                ConnectionError::PulsarError(Some(ServerError::ProducerBusy), None)
            ))),
            SendError::HeldElsewhere(_)
        ));
        assert!(matches!(
            sort(&pulsar::Error::Producer(ProducerError::Connection(
                ConnectionError::UnexpectedResponse("send_error".into())
            ))),
            SendError::Refused(_)
        ));
        assert!(matches!(
            sort(&pulsar::Error::ServiceDiscovery(
                pulsar::error::ServiceDiscoveryError::Query(
                    Some(ServerError::TopicNotFound),
                    Some("Topic not found".into())
                )
            )),
            SendError::TopicNotFound(_)
        ));
        assert!(matches!(
            sort(&refused(ServerError::AuthorizationError)),
            SendError::Lost(_)
        ));
        assert!(matches!(
            sort(&pulsar::Error::Connection(ConnectionError::Disconnected)),
            SendError::Lost(_)
        ));
    }
}

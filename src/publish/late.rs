//! Late sends: a message the broker refused while later ones landed goes
//! again, alone, after them, and is heard back before anything else.

use super::inflight::TopicPublisher;
use super::port::{Broker, Consensus, Outbox, Sending, Session};
use super::Error;
use super::Publisher;

impl<B: Broker, C: Consensus, O: Outbox> Publisher<B, C, O> {
    /// Sends message `n`, which the broker refused after later messages had
    /// been queued, and waits for its receipt: the watermark proposed next
    /// covers it. A refusal again counts, and the retry after it sends a
    /// marker in its place.
    pub(super) async fn send_late(
        &self,
        session: &B::Session,
        producer: &mut <B::Session as Session>::Producer,
        tp: &mut TopicPublisher<<B::Session as Session>::Producer>,
        n: u64,
    ) -> Result<(), Error> {
        // The outbox keeps every message above the committed watermark; one
        // it no longer holds is in the topic.
        let Some((_, m)) = self
            .outbox
            .read(&tp.topic, n, 1)?
            .into_iter()
            .next()
            .filter(|(seq, _)| *seq == n)
        else {
            tp.refusals.landed(n);
            return Ok(());
        };
        let limit = self.limit(tp.limit);
        let set_aside = self
            .set_aside(&tp.topic, n, &m, limit, &tp.refusals, tp.format)
            .await?;
        let marker = set_aside.is_some();
        let how = Sending {
            set_aside,
            late: true,
            format: tp.format,
            generation: tp.generation,
            alone: tp.refusals.one_per_entry(),
        };
        let receipt = session.send(producer, n, m, how).await?;
        session.flush(producer).await?;
        match receipt.await {
            Ok(()) => {
                metrics::counter!("firstseen_published_late_total").increment(1);
                tracing::warn!(topic = %tp.topic, seq = n, marker, "a message the broker refused after later ones landed was sent again, after them");
                tp.refusals.landed(n);
                Ok(())
            }
            Err(e) => {
                tp.late_failed = Some(n);
                Err(e.into())
            }
        }
    }
}

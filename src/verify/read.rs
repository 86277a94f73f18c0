//! Reads a whole topic into an [`Audit`], from the first message to the
//! last one that existed when the read began.

use std::time::{Duration, Instant};

use futures::StreamExt;

use super::{Audit, Report, Seen};
use crate::config::PulsarConfig;
use crate::publish::{props, tail};
use crate::{Error, TopicProblem};

/// Reads `topic` and audits it. `progress` is called every `every` messages.
pub async fn verify_topic(
    config: &PulsarConfig,
    topic: &str,
    idle: Duration,
    mut progress: impl FnMut(u64),
) -> Result<Report, Error> {
    let pulsar = crate::publish::connect(config).await?;
    let mut consumer = tail::reader(&pulsar, topic, None, "verify").await?;
    let last = consumer
        .get_last_message_id()
        .await?
        .into_iter()
        .next()
        .ok_or_else(|| Error::topic(topic, TopicProblem::NoLastMessageId))?;
    let mut audit = Audit::new(topic);
    if tail::is_empty_marker(&last) {
        let _ = consumer.close().await;
        return Ok(audit.finish());
    }
    let end = (last.ledger_id, last.entry_id);
    let mut last_progress = Instant::now();
    let mut count = 0u64;
    loop {
        let next = tokio::time::timeout(idle, consumer.next()).await;
        let msg = match next {
            Ok(Some(m)) => m?,
            Ok(None) => break,
            Err(_) => {
                return Err(Error::topic(
                    topic,
                    TopicProblem::Stalled {
                        idle,
                        ledger: end.0,
                        entry: end.1,
                        count,
                    },
                ))
            }
        };
        let id = msg.message_id();
        let at = (id.ledger_id, id.entry_id);
        let meta = msg.metadata();
        audit.push(Seen {
            key: props::get(meta, props::KEY).map(str::to_string),
            seq: props::get(meta, props::SEQ).and_then(|s| s.parse().ok()),
            foreign: !meta.producer_name.starts_with(tail::PRODUCER_PREFIX),
            set_aside: props::get(meta, props::SET_ASIDE).is_some(),
            late: props::get(meta, props::LATE).is_some(),
        });
        count += 1;
        if last_progress.elapsed() > Duration::from_secs(1) {
            progress(count);
            last_progress = Instant::now();
        }
        // The last entry may be a batch of many messages: read all of it.
        if at > end || (at == end && tail::ends_entry(id, meta)) {
            break;
        }
    }
    let _ = consumer.close().await;
    Ok(audit.finish())
}

//! Reads topics back: the whole of one into an [`Audit`], or a time range
//! of one into a [`Comparison`], from the first message to the last one
//! that existed when the read began.

use std::time::{Duration, Instant};

use futures::StreamExt;

use pulsar::{Pulsar, TokioExecutor};

use super::compare::{Comparison, Message as CompareMessage};
use super::{check_contents, Audit, Contents, KeyRule, Report, Seen, Source};
use crate::publish::config::PulsarConfig;
use crate::publish::{format, props, tail};
use crate::publish::{Error, TopicProblem};

/// How the audit tells the cluster's messages from others'.
#[derive(Debug, Clone)]
pub enum Tell {
    /// By the cluster's proof, under its secret (and previous ones).
    Proof(tail::Ours),
    /// By producer name alone (`--trust-names`): anyone can claim it.
    Names,
}

/// Reads `topic` and audits it, checking each message's contents against
/// its key under `rule` when there is one. `progress` is called about once
/// a second with the count read.
pub async fn verify_topic(
    config: &PulsarConfig,
    topic: &str,
    idle: Duration,
    rule: Option<&KeyRule>,
    tell: &Tell,
    progress: impl FnMut(u64),
) -> Result<Report, Error> {
    let pulsar = crate::publish::connect(config).await?;
    let mut audit = Audit::new(topic);
    scan(&pulsar, topic, idle, progress, |msg| {
        let meta = msg.metadata();
        let key = props::get(meta, props::KEY).map(str::to_string);
        let set_aside = props::get(meta, props::SET_ASIDE).map(str::to_string);
        let source = match tell {
            Tell::Names if meta.producer_name.starts_with(tail::PRODUCER_PREFIX) => Source::Ours,
            Tell::Names => Source::Foreign,
            Tell::Proof(ours) => match ours.origin(topic, meta, &msg.payload.data, None) {
                tail::Origin::Proven(_) => Source::Ours,
                tail::Origin::Named(_) => Source::Unproven,
                tail::Origin::Forged => Source::Forged,
                tail::Origin::Foreign => Source::Foreign,
            },
        };
        let contents = match (rule, &key) {
            (Some(rule), Some(key)) if set_aside.is_none() => check_contents(
                rule,
                |name| props::get(meta, name).map(str::to_string),
                &msg.payload.data,
                key,
            ),
            _ => Contents::Unchecked,
        };
        audit.push(Seen {
            key,
            seq: props::get(meta, props::SEQ).and_then(|s| s.parse().ok()),
            source,
            set_aside,
            late: props::get(meta, props::LATE).is_some(),
            contents,
        });
    })
    .await?;
    let mut report = audit.finish();
    report.by_name = matches!(tell, Tell::Names);
    Ok(report)
}

/// Reads `topic` into side `side` of a comparison: every message whose time
/// (its event time, or its publish time when it has none) falls in `range`,
/// markers for set-aside messages left out (they hold no contents).
pub async fn compare_topic(
    pulsar: &Pulsar<TokioExecutor>,
    topic: &str,
    idle: Duration,
    range: (i64, i64),
    comparison: &mut Comparison,
    side: usize,
    progress: impl FnMut(u64),
) -> Result<(), Error> {
    scan(pulsar, topic, idle, progress, |msg| {
        let meta = msg.metadata();
        let time_ms = meta
            .event_time
            .filter(|t| *t > 0)
            .unwrap_or(meta.publish_time) as i64;
        if time_ms < range.0 || time_ms > range.1 || props::get(meta, props::SET_ASIDE).is_some() {
            return;
        }
        let contents = format::contents_of(meta, &msg.payload.data)
            .ok()
            .map(|c| (c.topic.unwrap_or_default(), c.payload));
        comparison.push(side, CompareMessage { time_ms, contents });
    })
    .await
}

/// Calls `each` with every message of `topic`, from the first to the last
/// one that existed when the read began.
async fn scan(
    pulsar: &Pulsar<TokioExecutor>,
    topic: &str,
    idle: Duration,
    mut progress: impl FnMut(u64),
    mut each: impl FnMut(&pulsar::consumer::Message<Vec<u8>>),
) -> Result<(), Error> {
    let mut consumer = tail::reader(pulsar, topic, None, "verify").await?;
    let last = consumer
        .get_last_message_id()
        .await?
        .into_iter()
        .next()
        .ok_or_else(|| Error::topic(topic, TopicProblem::NoLastMessageId))?;
    if tail::is_empty_marker(&last) {
        let _ = consumer.close().await;
        return Ok(());
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
        each(&msg);
        count += 1;
        if last_progress.elapsed() > Duration::from_secs(1) {
            progress(count);
            last_progress = Instant::now();
        }
        let id = msg.message_id();
        // The last entry may be a batch of many messages: read all of it.
        if (id.ledger_id, id.entry_id) > end
            || ((id.ledger_id, id.entry_id) == end && tail::ends_entry(id, msg.metadata()))
        {
            break;
        }
    }
    let _ = consumer.close().await;
    Ok(())
}

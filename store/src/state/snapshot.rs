//! The snapshot stream: the whole state as length-prefixed records, tree by
//! tree, with the unpublished messages the log holds written inline.

use std::collections::HashMap;
use std::io::{Read, Write};

use super::memory::Memory;
use super::{corrupt, encode, StateStore, META_IMPORTING};
use crate::record;
use crate::window;
use crate::StoreError;
use crate::{Command, OutboxMessage};

/// Snapshot tags are positions in [`super::TREES`]; `runs` is never
/// exported (its messages are written as `inline` records, see
/// [`StateStore::export`]).
const TAG_RUNS: u8 = 2;
const TAG_INLINE: u8 = 3;

/// Reads the command of a Raft log entry, for a snapshot that must carry
/// the unpublished messages the log holds.
pub type ResolveEntry<'a> = dyn FnMut(u64) -> Result<Command, StoreError> + 'a;

fn topic_of_key(raw: &[u8]) -> Result<String, StoreError> {
    let end = raw
        .iter()
        .position(|b| *b == 0)
        .ok_or_else(|| corrupt("outbox key without a topic separator"))?;
    String::from_utf8(raw[..end].to_vec()).map_err(|_| corrupt("topic name is not UTF-8"))
}

impl StateStore {
    /// Streams the whole state into `out` as length-prefixed records, tree by
    /// tree, without building it in memory. The format is private to firstseen
    /// and read back by [`StateStore::import`].
    ///
    /// A snapshot travels without the log, so the unpublished messages the
    /// log holds are read through `resolve` and written inline. The caller
    /// must not apply entries meanwhile (openraft does not).
    pub fn export<W: Write>(
        &self,
        out: &mut W,
        resolve: &mut ResolveEntry<'_>,
    ) -> Result<u64, StoreError> {
        self.checkpoint()?;
        let mut records = 0u64;
        for (index, tree) in self.trees().iter().enumerate() {
            if index as u8 == TAG_RUNS {
                continue;
            }
            for item in tree.iter() {
                let (k, v) = item?;
                write_record(out, index as u8, &k, &v)?;
                records += 1;
            }
        }
        let published: HashMap<String, u64> = self
            .topics()?
            .into_iter()
            .map(|(t, s)| (t, s.published_seq))
            .collect();
        for item in self.runs.iter() {
            let (k, v) = item?;
            let topic = topic_of_key(&k)?;
            let first = window::outbox_seq(&k).ok_or_else(|| corrupt("outbox run key"))?;
            let run = record::decode_run(&v).ok_or_else(|| corrupt("outbox run"))?;
            let done = published.get(&topic).copied().unwrap_or(0);
            let cmd = resolve(run.log_index)?;
            let observations = cmd.as_observe().map(|(_, _, o)| o).unwrap_or_default();
            for (i, (pos, _)) in run.messages.iter().enumerate() {
                let seq = first + i as u64;
                if seq <= done {
                    continue;
                }
                let obs = observations.get(*pos as usize).ok_or_else(|| {
                    corrupt(&format!(
                        "log entry {} has no observation {pos}",
                        run.log_index
                    ))
                })?;
                let message = OutboxMessage {
                    key: obs.key,
                    mqtt_topic: obs.mqtt_topic.clone(),
                    payload: obs.payload.clone(),
                    node: obs.node,
                    first_seen_ms: run.first_seen_ms,
                    properties: cmd.properties(*pos as usize).cloned().map(Box::new),
                };
                write_record(
                    out,
                    TAG_INLINE,
                    &window::outbox_key(&topic, seq),
                    &encode(&message)?,
                )?;
                records += 1;
            }
        }
        // A terminator distinguishes a complete snapshot from a truncated one.
        out.write_all(&[0xff])?;
        Ok(records)
    }

    /// Replaces the whole state with a stream written by [`StateStore::export`].
    pub fn import<R: Read>(&self, input: &mut R) -> Result<u64, StoreError> {
        self.import_with_progress(input, |_| {})
    }

    /// [`StateStore::import`], calling `progress` with the record count every
    /// 100,000 records (a snapshot of a busy window has millions).
    pub fn import_with_progress<R: Read>(
        &self,
        input: &mut R,
        mut progress: impl FnMut(u64),
    ) -> Result<u64, StoreError> {
        // The marker goes in before anything is cleared and leaves only
        // after the last record: whatever prefix of this sequence a crash
        // keeps is either the old state whole or a state `reload` refuses,
        // never a mix that loads. Without it a half import loaded: with the
        // meta tree not yet imported, as a fresh state to re-apply the log
        // onto; with it imported, as a complete state missing part of its
        // outbox (the inline records come last).
        self.meta.insert(META_IMPORTING, &[])?;
        for tree in [
            &self.window,
            &self.masks,
            &self.runs,
            &self.inline,
            &self.aside,
        ] {
            tree.clear()?;
        }
        for key in self.meta.iter().keys() {
            let key = key?;
            if key != META_IMPORTING {
                self.meta.remove(key)?;
            }
        }
        *self.lock() = Memory::default();
        let trees = self.trees();
        let mut records = 0u64;
        loop {
            let mut tag = [0u8; 1];
            input.read_exact(&mut tag)?;
            if tag[0] == 0xff {
                break;
            }
            let tree = trees.get(tag[0] as usize).ok_or_else(|| {
                StoreError::Corrupt(format!("snapshot names unknown tree {}", tag[0]))
            })?;
            let k = read_chunk(input)?;
            let v = read_chunk(input)?;
            tree.insert(k, v)?;
            records += 1;
            if records.is_multiple_of(100_000) {
                progress(records);
            }
        }
        self.meta.remove(META_IMPORTING)?;
        self.reload()?;
        Ok(records)
    }

    fn trees(&self) -> [&sled::Tree; 6] {
        [
            &self.window,
            &self.masks,
            &self.runs,
            &self.inline,
            &self.meta,
            &self.aside,
        ]
    }
}

fn write_record<W: Write>(out: &mut W, tag: u8, k: &[u8], v: &[u8]) -> Result<(), StoreError> {
    out.write_all(&[tag])?;
    out.write_all(&(k.len() as u32).to_be_bytes())?;
    out.write_all(k)?;
    out.write_all(&(v.len() as u32).to_be_bytes())?;
    out.write_all(v)?;
    Ok(())
}

fn read_chunk<R: Read>(input: &mut R) -> Result<Vec<u8>, StoreError> {
    let mut len = [0u8; 4];
    input.read_exact(&mut len)?;
    let len = u32::from_be_bytes(len) as usize;
    // Keys and values are small; a huge length means a corrupt stream, not a
    // reason to allocate gigabytes.
    if len > 64 * 1024 * 1024 {
        return Err(StoreError::Corrupt(format!(
            "snapshot record of {len} bytes"
        )));
    }
    let mut buf = vec![0u8; len];
    input.read_exact(&mut buf)?;
    Ok(buf)
}

#[cfg(test)]
mod tests {
    use super::super::testing::{obs, observe, store};
    use super::super::NO_HOLD;
    use crate::OutboxItem;

    #[test]
    fn export_and_import_round_trip() {
        let a = store();
        a.apply(
            Some(&observe(1, 60_000, vec![obs(1, 1, "a"), obs(2, 2, "b")])),
            7,
            b"7",
        )
        .unwrap();
        let mut buf = Vec::new();
        // The unpublished messages are read from the log (here, the one
        // entry applied) and travel inline.
        let entry = observe(1, 60_000, vec![obs(1, 1, "a"), obs(2, 2, "b")]);
        a.export(&mut buf, &mut |i| {
            assert_eq!(i, 7);
            Ok(entry.clone())
        })
        .unwrap();
        let b = store();
        b.apply(Some(&observe(1, 60_000, vec![obs(9, 1, "z")])), 1, b"1")
            .unwrap();
        b.import(&mut buf.as_slice()).unwrap();
        assert_eq!(b.totals().unwrap(), a.totals().unwrap());
        assert!(b.lookup(&[9; 32]).unwrap().is_none());
        assert_eq!(b.applied_marker().unwrap().as_deref(), Some(&b"7"[..]));
        assert_eq!(b.lookup(&[2; 32]).unwrap(), a.lookup(&[2; 32]).unwrap());
        assert_eq!((a.log_hold(), b.log_hold()), (7, NO_HOLD));
        match &b.outbox_from("b", 1, 10).unwrap()[..] {
            [(1, OutboxItem::Inline(m))] => assert_eq!((m.key, m.node), ([2; 32], 2)),
            other => panic!("unexpected outbox {other:?}"),
        }
        // A truncated stream is an error, not a silently partial state.
        let mut short = &buf[..buf.len() - 1];
        assert!(b.import(&mut short).is_err());
    }
}

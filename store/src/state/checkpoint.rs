//! Writing the state to sled: what changed since the last checkpoint, in
//! one transaction with the applied marker it describes.

use std::time::{Duration, Instant};

use sled::Transactional;

use super::memory::Memory;
use super::{corrupt, encode, StateStore, META_HEAD, META_LEVEL};
use crate::record;
use crate::StoreError;

/// A checkpoint is written after this long or this many entries, whichever
/// comes first. It bounds what a crash re-applies, as sled's own one-second
/// flush did before.
const CHECKPOINT_EVERY: Duration = Duration::from_secs(1);
const CHECKPOINT_ENTRIES: u64 = 2_000;

type RecordKey = [u8; 8];

impl Memory {
    /// Whether the entries applied since the last checkpoint should be
    /// written now.
    pub(super) fn checkpoint_due(&self, now: Instant) -> bool {
        self.entries_since >= CHECKPOINT_ENTRIES
            || self
                .last_checkpoint
                .is_none_or(|t| now.saturating_duration_since(t) >= CHECKPOINT_EVERY)
    }
}

impl StateStore {
    /// Writes everything applied since the last checkpoint in one sled
    /// transaction. Not yet flushed: [`StateStore::flush`] does both.
    pub fn checkpoint(&self) -> Result<(), StoreError> {
        let mut inner = self.lock();
        self.checkpoint_locked(&mut inner)
    }

    pub(super) fn checkpoint_locked(&self, inner: &mut Memory) -> Result<(), StoreError> {
        inner.last_checkpoint = Some(Instant::now());
        inner.entries_since = 0;
        if !inner.dirty {
            return Ok(());
        }
        // G6: the entries this checkpoint covers are stable in the log
        // before the checkpoint is written (see `open_with_log`).
        if let Some(log) = &self.log_db {
            log.sync()?;
        }
        let head = encode(&inner.head)?;
        // Only once it rose: a state at the base level is what a release
        // before levels wrote, and reads.
        let levels = (inner.levels != crate::level::Levels::default())
            .then(|| encode(&inner.levels))
            .transpose()?;
        let generation = (inner.generation != 0)
            .then(|| encode(&inner.generation))
            .transpose()?;
        // Only once the level rose to 3 over a state with records.
        let names = (inner.names_below != 0)
            .then(|| encode(&inner.names_below))
            .transpose()?;
        let renumbered = (inner.renumbered_below != 0)
            .then(|| encode(&inner.renumbered_below))
            .transpose()?;
        let expired_below = inner.head.expired_below;
        let first_unwritten = inner.first_unwritten();
        let delete = inner.written_from..expired_below.min(first_unwritten);
        // Per pending record: sled key, record, masks record if any.
        let records: Vec<(RecordKey, Vec<u8>, Option<Vec<u8>>)> = inner
            .pending
            .iter()
            .map(|p| {
                let last = p.masks.iter().rposition(|m| *m != 0);
                let masks = last.map(|l| record::encode_masks(&p.masks[..=l]));
                (
                    record::record_key(p.rec),
                    record::encode_record(p.ts, &p.items),
                    masks,
                )
            })
            .collect();
        let runs: Vec<(&Vec<u8>, Vec<u8>)> = inner
            .runs_new
            .iter()
            .filter_map(|k| inner.runs.get(k).map(|r| (k, record::encode_run(r))))
            .collect();
        let aside_new: Vec<([u8; 8], &Vec<u8>)> = inner
            .aside
            .new
            .iter()
            .map(|(id, raw)| (super::aside::record_key(*id), raw))
            .collect();
        let aside_gone: Vec<[u8; 8]> = inner
            .aside
            .gone
            .iter()
            .map(|id| super::aside::record_key(*id))
            .collect();
        (
            &self.window,
            &self.masks,
            &self.runs,
            &self.inline,
            &self.meta,
            &self.aside,
        )
            .transaction(|(window_t, masks_t, runs_t, inline_t, meta_t, aside_t)| {
                for (k, raw) in &aside_new {
                    aside_t.insert(k, raw.as_slice())?;
                }
                for k in &aside_gone {
                    aside_t.remove(k)?;
                }
                for rec in delete.clone() {
                    let k = record::record_key(rec);
                    window_t.remove(&k)?;
                    masks_t.remove(&k)?;
                }
                for (k, raw, masks) in &records {
                    window_t.insert(k, raw.as_slice())?;
                    if let Some(m) = masks {
                        masks_t.insert(k, m.as_slice())?;
                    }
                }
                for (rec, changes) in &inner.masks {
                    let k = record::record_key(*rec);
                    let mut masks = match masks_t.get(k)? {
                        Some(raw) => record::decode_masks(&raw).ok_or_else(|| {
                            sled::transaction::ConflictableTransactionError::Abort(corrupt(
                                "masks record",
                            ))
                        })?,
                        None => Vec::new(),
                    };
                    for (item, mask) in changes {
                        let i = *item as usize;
                        if masks.len() <= i {
                            masks.resize(i + 1, 0);
                        }
                        masks[i] = *mask;
                    }
                    masks_t.insert(&k, record::encode_masks(&masks))?;
                }
                // Gone runs first: a key may be both, taken and put again
                // (a rebase renumbers onto keys it freed; a rebase closing
                // the numbering up lets new messages take such keys), and
                // then it holds the new run. A key in both that leaves again
                // stays gone, so a run on disk is never left behind.
                for k in &inner.runs_gone {
                    runs_t.remove(k.as_slice())?;
                }
                for (k, raw) in &runs {
                    runs_t.insert(k.as_slice(), raw.as_slice())?;
                }
                for k in &inner.inline_gone {
                    inline_t.remove(k.as_slice())?;
                }
                for (k, raw) in &inner.inline_new {
                    inline_t.insert(k.as_slice(), raw.as_slice())?;
                }
                meta_t.insert(META_HEAD, head.as_slice())?;
                if let Some(levels) = &levels {
                    meta_t.insert(META_LEVEL, levels.as_slice())?;
                }
                if let Some(names) = &names {
                    meta_t.insert(super::META_NAMES, names.as_slice())?;
                }
                if let Some(generation) = &generation {
                    meta_t.insert(super::META_GENERATION, generation.as_slice())?;
                }
                if let Some(renumbered) = &renumbered {
                    meta_t.insert(super::META_RENUMBERED, renumbered.as_slice())?;
                }
                Ok(())
            })
            .map_err(StoreError::from)?;
        inner.written_from = inner.written_from.max(delete.end);
        inner.pending.clear();
        inner.masks.clear();
        inner.runs_new.clear();
        inner.runs_gone.clear();
        inner.inline_gone.clear();
        inner.inline_new.clear();
        inner.aside.new.clear();
        inner.aside.gone.clear();
        inner.dirty = false;
        inner.durable_hold = inner.hold();
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::super::testing::{obs, observe, reopenable};
    use super::StateStore;

    #[test]
    fn a_restart_comes_back_at_the_last_checkpoint() {
        let dir = tempfile::tempdir().unwrap();
        let open = || reopenable(dir.path());
        {
            let db = open();
            let s = StateStore::open(&db).unwrap();
            // Written and expired across checkpoints: key 1's record is on
            // disk when it expires, key 2's is still pending.
            s.apply(Some(&observe(1_000, 500, vec![obs(1, 1, "a")])), 1, b"1")
                .unwrap();
            s.checkpoint().unwrap();
            s.apply(Some(&observe(1_400, 500, vec![obs(2, 1, "a")])), 2, b"2")
                .unwrap();
            s.apply(Some(&observe(1_600, 500, vec![obs(3, 2, "a")])), 3, b"3")
                .unwrap();
            assert!(s.lookup(&[1; 32]).unwrap().is_none());
            s.checkpoint().unwrap();
            // Applied after the last checkpoint: lost in a crash, and
            // re-applied from the log by openraft.
            s.apply(Some(&observe(1_700, 500, vec![obs(4, 2, "a")])), 4, b"4")
                .unwrap();
            db.flush().unwrap();
        }
        let db = open();
        let s = StateStore::open(&db).unwrap();
        assert_eq!(s.applied_marker().unwrap().as_deref(), Some(&b"3"[..]));
        assert_eq!(s.indexed_keys(), 2);
        assert!(s.lookup(&[2; 32]).unwrap().is_some());
        assert!(s.lookup(&[4; 32]).unwrap().is_none());
        let t = s.totals().unwrap();
        assert_eq!((t.window_keys, t.expired, t.records), (2, 1, 3));
        // The expired record left the disk with the checkpoint.
        assert_eq!(s.window.len(), 2);
        s.apply(Some(&observe(1_700, 500, vec![obs(4, 2, "a")])), 4, b"4")
            .unwrap();
        assert_eq!(s.topic_state("a").unwrap().last_seq, 4);
    }
}

//! What cluster mode (crates/cluster) needs from the store: the epoch
//! history, whole CommitLog entries read raw for the master's replication
//! stream, replicated entries appended at the positions the master gave
//! them (ConsumeQueues and the index built from them as from any append),
//! truncation to where a replica's history agrees with its master's, a
//! read limit (the high watermark) and refusal of client writes on a node
//! that is not its set's master.
//!
//! Positions are the same on every member of a set: a replica appends each
//! entry through the same writer as client appends, which rolls to a new
//! segment exactly where the master's did, given the same
//! `commitlog_segment_bytes` (the replication handshake checks it).

use std::path::Path;
use std::sync::atomic::Ordering;

use bytes::Bytes;
use serde::{Deserialize, Serialize};

use crate::commitlog::CommitLogWriter;
use crate::error::{Result, StoreError};
use crate::record::{self, DispatchInfo, Entry, BLANK_MAGIC};
use crate::store::{Inner, MessageStore};

/// File of the epoch history, beside the checkpoint.
pub(crate) const EPOCHS_FILE: &str = "epochs.json";
/// Present while a replica's log is being dropped to restart at its
/// master's start (`MessageStore::restart_log_at`).
pub(crate) const RESTART_MARKER: &str = "restarting";

/// Present while [`MessageStore::truncate_log`] cuts the log (holding the
/// offset): a start that finds it finishes the cut before recovering
/// ([`cut_marker`]). Written and removed directly, not as a file replaced
/// whole, so a full disk's failing checkpoint cannot stop it.
pub(crate) const CUT_MARKER: &str = "cutting";

/// The offset a cut that a crash interrupted was cutting the log at.
pub(crate) fn cut_marker(dir: &Path) -> Result<Option<u64>> {
    let path = dir.join(CUT_MARKER);
    match std::fs::read_to_string(&path) {
        Ok(s) => s
            .trim()
            .parse::<u64>()
            .map(Some)
            .map_err(|e| StoreError::bad_file(&path, format!("not an offset: {e}"))),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(StoreError::io("read", &path)(e)),
    }
}

fn write_cut_marker(dir: &Path, offset: u64) -> Result<()> {
    use std::io::Write;
    let path = dir.join(CUT_MARKER);
    let mut f = std::fs::File::create(&path).map_err(StoreError::io("create", &path))?;
    f.write_all(offset.to_string().as_bytes())
        .and_then(|()| f.sync_all())
        .map_err(StoreError::io("write", &path))?;
    crate::sys::fsync_dir(dir)
}

pub(crate) fn remove_cut_marker(dir: &Path) -> Result<()> {
    let path = dir.join(CUT_MARKER);
    match std::fs::remove_file(&path) {
        Ok(()) => crate::sys::fsync_dir(dir),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(StoreError::io("remove", &path)(e)),
    }
}

/// A CommitLog writer continuing at `offset`, as the store's config has it.
fn writer_at(inner: &Inner, offset: u64) -> Result<CommitLogWriter> {
    let mut cl = CommitLogWriter::new(
        std::sync::Arc::clone(&inner.log),
        offset,
        inner.config.commitlog_segment_bytes,
        crate::commitlog::Preparation::of(&inner.config),
    )?;
    cl.refuse_writes_above(inner.config.disk_refuse_writes_percent);
    Ok(cl)
}

/// Removes every compacted queue's clean log, keeping each topic's mark.
fn drop_clean_logs(dir: &Path) -> Result<()> {
    let root = dir.join("compacted");
    let Ok(topics) = std::fs::read_dir(&root) else {
        return Ok(());
    };
    for topic in topics {
        let topic = topic.map_err(StoreError::io("read dir", &root))?.path();
        let Ok(queues) = std::fs::read_dir(&topic) else {
            continue;
        };
        for q in queues {
            let q = q.map_err(StoreError::io("read dir", &topic))?.path();
            if q.is_dir() {
                std::fs::remove_dir_all(&q).map_err(StoreError::io("remove", &q))?;
            }
        }
    }
    Ok(())
}

/// At open: a restart of the log (`MessageStore::restart_log_at`) cut
/// short by a crash is finished — the CommitLog, queues, index, clean logs
/// and the files describing them dropped — so the store opens empty (its
/// master then has it restart again).
pub(crate) fn finish_restart(dir: &Path) -> Result<()> {
    let marker = dir.join(RESTART_MARKER);
    if !marker.exists() {
        return Ok(());
    }
    tracing::warn!(dir = %dir.display(), "finishing a restart of the log cut short: the log is dropped");
    for d in ["commitlog", "consumequeue", "index"] {
        let p = dir.join(d);
        if p.exists() {
            std::fs::remove_dir_all(&p).map_err(StoreError::io("remove", &p))?;
        }
    }
    drop_clean_logs(dir)?;
    for f in ["checkpoint", crate::manifest::FILE, "log_starts.json", "abort"] {
        let p = dir.join(f);
        if p.exists() {
            std::fs::remove_file(&p).map_err(StoreError::io("remove", &p))?;
        }
    }
    std::fs::remove_file(&marker).map_err(StoreError::io("remove", &marker))?;
    crate::sys::fsync_dir(dir)
}

/// One line of the epoch history: `epoch` began writing at `start`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct EpochStart {
    pub epoch: u32,
    pub start: u64,
}

pub(crate) fn load_epochs(dir: &Path) -> Result<Vec<EpochStart>> {
    let path = dir.join(EPOCHS_FILE);
    match std::fs::read(&path) {
        Ok(b) => serde_json::from_slice(&b).map_err(|e| StoreError::bad_file(&path, format!("not valid JSON: {e}"))),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Vec::new()),
        Err(e) => Err(StoreError::io("read", &path)(e)),
    }
}

/// Drops the epoch history's lines that begin past `offset` (a cut finished
/// at start).
pub(crate) fn drop_epochs_after(dir: &Path, offset: u64) -> Result<()> {
    let epochs = load_epochs(dir)?;
    let kept: Vec<EpochStart> = epochs.iter().copied().filter(|e| e.start <= offset).collect();
    if kept != epochs {
        let path = dir.join(EPOCHS_FILE);
        let json = serde_json::to_vec(&kept).map_err(|e| StoreError::bad_file(&path, e.to_string()))?;
        crate::checkpoint::write_atomically(&path, &json)?;
    }
    Ok(())
}

/// At open: drops the epochs that start past the recovered log end `end`.
/// An epoch is recorded (and made durable) before the log is flushed that
/// far, so a crash can leave a history claiming records the log lost:
/// kept, a replica comparing histories with this node would keep records
/// that differ from its own at the same offsets. Kafka trims its
/// leader-epoch cache to the recovered end the same way.
pub(crate) fn trim_epochs_past(inner: &Inner, end: u64) -> Result<()> {
    let mut epochs = inner.epochs.lock().unwrap_or_else(|p| p.into_inner());
    let kept: Vec<EpochStart> = epochs.iter().copied().filter(|e| e.start <= end).collect();
    if kept != *epochs {
        tracing::warn!(
            end,
            dropped = epochs.len() - kept.len(),
            "epochs starting past the recovered log end dropped from the history"
        );
        save_epochs(inner, &kept)?;
        *epochs = kept;
    }
    Ok(())
}

fn save_epochs(inner: &Inner, epochs: &[EpochStart]) -> Result<()> {
    let path = inner.dir.join(EPOCHS_FILE);
    let json = serde_json::to_vec(epochs).map_err(|e| StoreError::bad_file(&path, e.to_string()))?;
    crate::checkpoint::write_atomically(&path, &json)
}

/// Where two epoch histories stop agreeing, given the first one's log end:
/// the end of the last epoch both have, as Kafka's OffsetsForLeaderEpoch
/// finds it. `follower` is truncated there before it follows `leader`.
pub fn divergence(leader: &[EpochStart], leader_end: u64, follower: &[EpochStart], follower_end: u64) -> u64 {
    let Some(last) = follower.last() else {
        // A follower that never wrote under an epoch: it agrees up to its
        // end only if the leader has that much (both started empty).
        return follower_end.min(leader.first().map_or(leader_end, |e| e.start));
    };
    // The follower's newest epoch the leader also has.
    let mut epoch = last.epoch;
    loop {
        if let Some(i) = leader.iter().position(|e| e.epoch == epoch) {
            // The leader's end of that epoch: the next epoch's start, or its end.
            let leader_epoch_end = leader.get(i + 1).map_or(leader_end, |n| n.start);
            let follower_epoch_end = follower
                .iter()
                .position(|e| e.epoch == epoch)
                .and_then(|j| follower.get(j + 1))
                .map_or(follower_end, |n| n.start);
            return leader_epoch_end.min(follower_epoch_end);
        }
        // Not in the leader's history: go back to the follower's previous epoch.
        match follower.iter().rev().find(|e| e.epoch < epoch) {
            Some(prev) => epoch = prev.epoch,
            None => {
                return leader
                    .first()
                    .map_or(0, |e| e.start)
                    .min(follower.first().map_or(0, |e| e.start))
            }
        }
    }
}

impl MessageStore {
    /// The epoch history, oldest first.
    pub fn epochs(&self) -> Vec<EpochStart> {
        self.inner.epochs.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Records that `epoch` writes from the current end on (a master's
    /// first act after its election). Durable on return.
    pub fn begin_epoch(&self, epoch: u32) -> Result<()> {
        let _w = self.inner.writer();
        // From here no frame of the old master is applied (under the
        // writer: one being applied now finishes before the epoch starts).
        self.inner.replica_writes_closed.store(true, Ordering::Release);
        let mut epochs = self.inner.epochs.lock().unwrap_or_else(|p| p.into_inner());
        match epochs.last() {
            Some(e) if e.epoch == epoch => return Ok(()),
            // Writes under an older epoch than this log already has would
            // be told apart from nobody's (the controller elects past it).
            Some(e) if e.epoch > epoch => {
                return Err(StoreError::Config(format!(
                    "cannot begin epoch {epoch}: this log's history already reached epoch {}",
                    e.epoch
                )))
            }
            _ => {}
        }
        let start = self.inner.log.write_pos();
        // Entries starting past where this one starts describe no record
        // of this log (Kafka's maybeTruncateNonMonotonicEntries): a history
        // out of order would point a rejoining replica at the wrong place
        // to cut. (One starting here is an epoch without records: kept.)
        let mut next: Vec<EpochStart> = epochs.iter().copied().filter(|e| e.start <= start).collect();
        next.push(EpochStart { epoch, start });
        save_epochs(&self.inner, &next)?;
        *epochs = next;
        Ok(())
    }

    /// Whether a master's writes are taken (not once this node began an
    /// epoch of its own): the tables a replica takes with the log check it
    /// as the log's writes do.
    pub fn takes_replica_writes(&self) -> bool {
        !self.inner.replica_writes_closed.load(Ordering::Acquire)
    }

    /// This node follows a master (again): its writes are taken. (No
    /// writer lock: opening orders after nothing in flight — only closing,
    /// in `begin_epoch`, must wait for a write being applied — and the
    /// caller is the controller's async task.)
    pub fn follow_master(&self) {
        self.inner.replica_writes_closed.store(false, Ordering::Release);
    }

    /// Adopts the master's epoch history up to `end` (a replica appends what
    /// the master wrote under each epoch). Durable on return.
    pub fn adopt_epochs(&self, master: &[EpochStart]) -> Result<()> {
        let _w = self.inner.writer();
        self.inner.check_following()?;
        let mut epochs = self.inner.epochs.lock().unwrap_or_else(|p| p.into_inner());
        let end = self.inner.log.write_pos();
        // Histories are ordered by start: the master's epochs this store
        // has reached are a prefix of it.
        let reached = master.iter().take_while(|e| e.start <= end).count();
        if epochs[..] != master[..reached] {
            let next = master[..reached].to_vec();
            save_epochs(&self.inner, &next)?;
            *epochs = next;
        }
        Ok(())
    }

    /// End of the CommitLog (next write position).
    pub fn log_end(&self) -> u64 {
        self.inner.log.write_pos()
    }

    /// Whole entries from `from` (an entry boundary, BLANK fillers
    /// included, crossing into the next segment after one), at most about
    /// `max_bytes` but at least one entry: what a replica appends next.
    /// None when nothing is written there yet.
    pub fn read_log(&self, from: u64, max_bytes: usize) -> Result<Option<Vec<Bytes>>> {
        let log = &self.inner.log;
        let end = log.write_pos();
        let mut out = Vec::new();
        let (mut at, mut bytes) = (from, 0usize);
        // One snapshot of the segment list for the whole read (entries up to
        // `end` are published, so their segments are in it).
        let segs = log.segments();
        while at < end && (out.is_empty() || bytes < max_bytes) {
            let Some(seg) = segs.iter().find(|s| s.start <= at && at < s.end()) else {
                if out.is_empty() {
                    return Err(StoreError::Config(format!(
                        "CommitLog offset {at} is not on disk (below {} or past {end})",
                        log.min_offset()
                    )));
                }
                break;
            };
            let rel = (at - seg.start) as usize;
            if seg.file.len() - rel < 8 {
                at = seg.end(); // a segment's last bytes without a filler
                continue;
            }
            let size = seg.file.read_u32(rel) as usize;
            let magic = seg.file.read_u32(rel + 4);
            if size < 8 || rel + size > seg.file.len() {
                return Err(StoreError::bad_file(
                    seg.file.path(),
                    format!("entry at CommitLog offset {at} has size {size}"),
                ));
            }
            if magic == BLANK_MAGIC {
                out.push(Bytes::copy_from_slice(
                    &[(size as u32).to_be_bytes(), BLANK_MAGIC.to_be_bytes()].concat(),
                ));
                bytes += 8;
                at = seg.end();
                continue;
            }
            if at + size as u64 > end {
                break;
            }
            out.push(seg.file.view(rel, size));
            bytes += size;
            at += size as u64;
        }
        Ok((!out.is_empty()).then_some(out))
    }

    /// Appends whole entries a master sent, each at the position the master
    /// wrote it (checked), and dispatches them; returns the new log end.
    /// BLANK fillers are not written: the writer rolls where the master's did.
    pub fn append_replicated(&self, entries: &[Bytes]) -> Result<u64> {
        let inner = &*self.inner;
        // The master's entries, whatever this node's max_message_bytes.
        let max_entry = inner.config.max_stored_entry();
        let mut w = inner.writer();
        inner.check_open_writable()?;
        inner.check_following()?;
        // The queues written to, for the replicated-append listener.
        let mut touched: Vec<(String, u32)> = Vec::new();
        for data in entries {
            if data.len() >= 8 && data[4..8] == BLANK_MAGIC.to_be_bytes() {
                continue;
            }
            if data.len() > max_entry {
                return Err(StoreError::MessageTooLarge {
                    size: data.len(),
                    limit: max_entry,
                });
            }
            let entry = record::decode_checked(data)
                .map_err(|e| StoreError::Config(format!("replicated entry refused: {e}")))?;
            let info = DispatchInfo::from_entry(&entry);
            let expected = w.cl.next_position(data.len());
            if info.phys_offset != expected {
                return Err(StoreError::Config(format!(
                    "replicated entry for CommitLog offset {} would land at {expected} (commitlog_segment_bytes differs from the master's?)",
                    info.phys_offset
                )));
            }
            let (topic, props) = match &entry {
                Entry::Message(m) => (m.topic_str(), Some(&m.properties[..])),
                Entry::KafkaBatch(k) => (k.topic_str(), None),
            };
            let q = inner.queue_for(&mut w, topic, info.queue_id);
            if info.consumable && q.entry_count() > 0 && info.queue_offset != q.max_offset() {
                return Err(StoreError::Config(format!(
                    "replicated entry at {} has offset {} in {topic}/{} but the queue ends at {}",
                    info.phys_offset,
                    info.queue_offset,
                    info.queue_id,
                    q.max_offset()
                )));
            }
            q.reserve()?;
            let phys = w.cl.append(data.len(), |buf, _| buf.copy_from_slice(data))?;
            w.last_record = phys;
            w.last_store_ts = w.last_store_ts.max(info.store_timestamp);
            inner.log.publish(w.cl.position());
            inner.dispatch(&q, &info, topic, props)?;
            inner.metrics.append_bytes.increment(data.len() as u64);
            if info.consumable && touched.last().is_none_or(|(t, qq)| t != topic || *qq != info.queue_id) {
                touched.push((topic.to_string(), info.queue_id));
            }
        }
        let end = inner.log.write_pos();
        drop(w);
        if let Some(f) = inner.replicated_listener.get() {
            touched.sort_unstable();
            touched.dedup();
            for (t, q) in &touched {
                f(t, *q, end);
            }
        }
        Ok(end)
    }

    /// Drops the whole log — every CommitLog segment, every ConsumeQueue,
    /// compacted topics' clean logs (their marks stay) — and continues it
    /// at `offset`, the first offset of its master's log: a replica whose
    /// log ends below that (away for longer than the master's retention,
    /// or new to a set whose first segments are gone) cannot be sent what
    /// lies between, so it holds what the master holds from there on. Each
    /// queue of `continue_at` ("topic/queue" → the master's queue offset of
    /// its first entry at or past `offset`, or its end) continues there, so
    /// offsets never go back, idle queues included. `offset` is at or past
    /// this log's end; the epoch history stays (the master's is adopted as
    /// entries come). A crash part-way finishes the drop at the next open
    /// (a marker file); the replica is then told to restart again.
    pub fn restart_log_at(&self, offset: u64, continue_at: &std::collections::BTreeMap<String, u64>) -> Result<()> {
        let inner = &*self.inner;
        let mut w = inner.writer();
        inner.check_following()?;
        let end = inner.log.write_pos();
        if offset < end {
            return Err(StoreError::Config(format!(
                "cannot restart the CommitLog at {offset}: it ends at {end}"
            )));
        }
        tracing::warn!(
            end,
            start = offset,
            "the master's log starts past this replica's end: this log is dropped and continues at the master's start"
        );
        let marker = inner.dir.join(RESTART_MARKER);
        crate::checkpoint::write_atomically(&marker, offset.to_string().as_bytes())?;
        // Past the marker the log is being dropped: a step that fails
        // leaves the store failed (nothing more is appended to a half
        // dropped log) until a reopen finishes the drop.
        let dropped = (|| -> Result<()> {
            inner.log.drop_all_segments()?;
            inner.log.set_recovered(offset);
            let removed: Vec<_> = w.queues.drain().collect();
            inner.queues.write().unwrap_or_else(|p| p.into_inner()).clear();
            for (_, queues) in removed {
                for q in queues.values() {
                    q.destroy()?;
                }
            }
            {
                let _g = inner.compaction_lock.lock().unwrap_or_else(|p| p.into_inner());
                drop_clean_logs(&inner.dir)?;
            }
            w.cl.discard_ahead();
            let mut cl = writer_at(inner, offset)?;
            // The first segment now, at `offset`: a reopen before the first
            // entry finds where the log starts.
            cl.open_segment()?;
            w.cl = cl;
            w.last_record = 0;
            for (key, at) in continue_at {
                let Some((topic, q)) = key.rsplit_once('/') else {
                    continue;
                };
                let (Ok(q), Ok(())) = (q.parse::<u32>(), crate::validate_topic(topic)) else {
                    continue;
                };
                inner.queue_for(&mut w, topic, q).continue_after_restart(*at)?;
            }
            Ok(())
        })();
        drop(w);
        let done = dropped
            .and_then(|()| crate::tasks::checkpoint(inner, false).map(|_| ()))
            .and_then(|()| std::fs::remove_file(&marker).map_err(StoreError::io("remove", &marker)))
            .and_then(|()| crate::sys::fsync_dir(&inner.dir));
        done.map_err(|e| inner.log.fail(format!("restarting the log at {offset} failed: {e}")))
    }

    /// Per queue, "topic/queue" → the queue offset of its first entry at
    /// or past CommitLog offset `phys` (its end when none is): where a
    /// replica restarting its log at `phys` continues each queue.
    pub fn queue_offsets_at(&self, phys: u64) -> std::collections::BTreeMap<String, u64> {
        self.inner
            .all_queues()
            .iter()
            .map(|q| (format!("{}/{}", q.topic(), q.queue_id()), q.offset_at_phys(phys)))
            .filter(|(_, o)| *o > 0)
            .collect()
    }

    /// Cuts the CommitLog at `offset` (an entry boundary at or below its
    /// end) with every ConsumeQueue entry at or past it, and the epoch
    /// history past it. For a node about to follow a master whose history
    /// diverged: call it before the store is shared (no reader may hold an
    /// entry past `offset`). Index keys past it stay until their files age
    /// out; a key query checks every record it returns.
    pub fn truncate_log(&self, offset: u64) -> Result<()> {
        let inner = &*self.inner;
        let mut w = inner.writer();
        inner.check_following()?;
        let end = inner.log.write_pos();
        if offset >= end {
            return Ok(());
        }
        if offset < inner.log.min_offset() {
            return Err(StoreError::Config(format!(
                "cannot truncate the CommitLog to {offset}: it starts at {}",
                inner.log.min_offset()
            )));
        }
        tracing::warn!(from = offset, to = end, "truncating the CommitLog to follow the master");
        // Nothing past the cut is acknowledged or readable any more.
        let _ = inner.hw.fetch_update(Ordering::AcqRel, Ordering::Acquire, |h| {
            (h != u64::MAX && h > offset).then_some(offset)
        });
        inner.acked.send_if_modified(|a| {
            let over = *a > offset;
            *a = (*a).min(offset);
            over
        });
        // What is kept below the cut is on disk before the cut says so
        // (`set_recovered` marks everything below it flushed): a replica
        // without waiting producers syncs only at checkpoints.
        inner.log.flush_to(offset)?;
        // A crash from here on is finished by the next start (the log, the
        // queues and the checkpoint disagree until the end).
        write_cut_marker(&inner.dir, offset)?;
        // Readers stop at the cut before its bytes are zeroed.
        inner.log.set_recovered(offset);
        // Half a cut is no state to serve from: a failure from here on is
        // final (the next start finishes the cut from its marker).
        let cut = (|| -> Result<()> {
            crate::commitlog::zero_tail(&inner.log, offset)?;
            inner.log.drop_segments_after(offset)?;
            {
                // Syncs are issued again from the cut: what was issued past it
                // covers bytes that are no longer there.
                let mut req = inner.flush.requested.lock().unwrap_or_else(|p| p.into_inner());
                req.issued = req.issued.min(offset);
                req.target = req.target.min(offset);
                // A sync in flight since before the cut covers bytes past
                // it that are not there any more: when it ends it marks
                // flushed no further than the cut (what is written there
                // since is synced by syncs issued from now on).
                for s in req.in_flight.iter_mut() {
                    s.mark = s.mark.min(offset);
                }
            }
            for q in inner.all_queues() {
                q.truncate_from_phys(offset)?;
            }
            // A topic deleted past the cut was deleted as of the cut at most:
            // records the new master wrote from there on (the topic made again,
            // or never deleted there) are not the deleted incarnation's (a
            // start would otherwise drop them as an interrupted deletion).
            for end in inner.deleted.lock().unwrap_or_else(|p| p.into_inner()).values_mut() {
                *end = (*end).min(offset);
            }
            // The records appended from the cut on are indexed again, and the
            // last record before the cut is what a clean stop's checkpoint
            // names (0 sent the next clean start into a full scan).
            if let Some(index) = &inner.index {
                index.lock().unwrap_or_else(|p| p.into_inner()).cut_at(offset);
            }
            w.cl.discard_ahead();
            w.cl = writer_at(inner, offset)?;
            w.last_record = inner
                .all_queues()
                .iter()
                .filter_map(|q| q.entry_count().checked_sub(1).and_then(|i| q.entry(i)))
                .map(|e| e.phys_offset)
                .filter(|p| *p < offset)
                .max()
                .unwrap_or(0);
            {
                let mut epochs = inner.epochs.lock().unwrap_or_else(|p| p.into_inner());
                let next: Vec<EpochStart> = epochs.iter().copied().filter(|e| e.start <= offset).collect();
                if *epochs != next {
                    save_epochs(inner, &next)?;
                    *epochs = next;
                }
            }
            Ok(())
        })();
        if let Err(e) = cut {
            return Err(inner.log.fail(format!("cutting the CommitLog at {offset} failed: {e}")));
        }
        // Committed offsets past a queue's new end come back to it.
        for (group, topic, q, committed) in inner.offsets.all() {
            let Some(cq) = inner
                .queues
                .read()
                .unwrap_or_else(|p| p.into_inner())
                .get(topic.as_str())
                .and_then(|m| m.get(&q))
                .cloned()
            else {
                continue;
            };
            if committed > cq.max_offset() {
                let meta = inner
                    .offsets
                    .get(&group, &topic, q)
                    .map(|o| o.metadata)
                    .unwrap_or_default();
                inner.offsets.commit(&group, &topic, q, cq.max_offset(), &meta);
            }
        }
        drop(w);
        crate::tasks::checkpoint(inner, false)?;
        remove_cut_marker(&inner.dir)?;
        Ok(())
    }

    /// Consumers see nothing at or past CommitLog offset `hw` (the set's
    /// high watermark); None lifts the limit.
    pub fn set_high_watermark(&self, hw: Option<u64>) {
        let prev = self.inner.hw.swap(hw.unwrap_or(u64::MAX), Ordering::AcqRel);
        if let (Some(h), Some(f)) = (hw, self.inner.watermark_listener.get()) {
            // Risen (or set for the first time): readers waiting for what
            // it now covers are told.
            if prev == u64::MAX || h > prev {
                f(h);
            }
        }
    }

    /// The read limit set by [`MessageStore::set_high_watermark`].
    pub fn high_watermark(&self) -> Option<u64> {
        Some(self.inner.hw.load(Ordering::Acquire)).filter(|h| *h != u64::MAX)
    }

    /// Whether client appends are taken (false on a replica, or a master
    /// that lost its lease: they fail with [`StoreError::NotLeader`]).
    pub fn set_leader(&self, leader: bool) {
        let was = self.inner.leader.swap(leader, Ordering::AcqRel);
        if was && !leader {
            // Writes waiting for their replicas are answered now (NotLeader:
            // the client retries at the new master) rather than at the end
            // of their wait, as Kafka completes a deposed leader's delayed
            // produces at once.
            self.inner.acked.send_modify(|_| {});
        }
    }

    pub fn is_leader(&self) -> bool {
        self.inner.leader.load(Ordering::Acquire)
    }

    /// Makes [`MessageStore::durable`] wait for the set's replicas (up to
    /// `timeout_ms`), or not (None).
    pub fn require_replica_acks(&self, timeout_ms: Option<u64>) {
        self.inner
            .ack_timeout_ms
            .store(timeout_ms.unwrap_or(u64::MAX), Ordering::Release);
    }

    /// Whether [`MessageStore::durable`] waits for the set's replicas (a
    /// master whose acknowledgements need them).
    pub fn waits_for_replicas(&self) -> bool {
        self.inner.ack_timeout_ms.load(Ordering::Acquire) != u64::MAX
    }

    /// The master's high watermark moved: waiting acknowledgements up to it
    /// are answered.
    pub fn set_acked(&self, offset: u64) {
        self.inner.acked.send_if_modified(|a| {
            let changed = *a != offset;
            *a = offset;
            changed
        });
    }

    /// A write that will wait for the set's replicas cannot be acknowledged
    /// now: the sync state set is below `min_insync_replicas`. Asked before
    /// appending (RocketMQ's IN_SYNC_REPLICAS_NOT_ENOUGH, Kafka's
    /// NOT_ENOUGH_REPLICAS): appended first, the write would be refused
    /// after it was stored, and a client's retry would store it again.
    pub fn too_few_replicas(&self) -> bool {
        // (Not the set's master: NotLeader says so, not a flag left from
        // when it was.)
        self.is_leader() && self.waits_for_replicas() && self.inner.too_few_replicas.load(Ordering::Acquire)
    }

    /// The sync state set is below `min_insync_replicas` (waits fail at once).
    pub fn set_too_few_replicas(&self, too_few: bool) {
        self.inner.too_few_replicas.store(too_few, Ordering::Release);
    }

    /// The sync state set's size now (master included).
    pub fn set_in_sync_replicas(&self, n: u32) {
        self.inner.in_sync_replicas.store(n.max(1), Ordering::Release);
    }

    /// The sync state set's size (1 on a single node): Kafka's ISR size,
    /// which acks=all writes to a topic need at least `min.insync.replicas` of.
    pub fn in_sync_replicas(&self) -> u32 {
        self.inner.in_sync_replicas.load(Ordering::Acquire)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn h(v: &[(u32, u64)]) -> Vec<EpochStart> {
        v.iter().map(|&(epoch, start)| EpochStart { epoch, start }).collect()
    }

    #[test]
    fn divergence_is_the_end_of_the_last_shared_epoch() {
        // Same history: the shorter end.
        assert_eq!(divergence(&h(&[(1, 0)]), 500, &h(&[(1, 0)]), 300), 300);
        // The follower wrote on under epoch 2 past where the leader's epoch 2
        // ended (the leader moved to 3 at 400).
        assert_eq!(
            divergence(&h(&[(1, 0), (2, 100), (3, 400)]), 900, &h(&[(1, 0), (2, 100)]), 700),
            400
        );
        // An old master with an epoch the leader never had: back to the
        // end of their last shared epoch.
        assert_eq!(
            divergence(&h(&[(1, 0), (3, 250)]), 900, &h(&[(1, 0), (2, 200)]), 600),
            200
        );
        // Nothing shared.
        assert_eq!(divergence(&h(&[(5, 0)]), 900, &h(&[(2, 0)]), 600), 0);
        // A follower that never wrote.
        assert_eq!(divergence(&h(&[(1, 0)]), 900, &[], 0), 0);
    }
}

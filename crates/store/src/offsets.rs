//! The committed-offset table shared by both protocols:
//! (group, topic, queue) → next offset to consume + a metadata string.
//!
//! Kept in memory behind a mutex and persisted as JSON with
//! [`write_atomically`](crate::checkpoint::write_atomically) (temp file, fsync,
//! rename), so a crash leaves the previous or the new table, never a torn one.
//! Persisting happens every `offsets_flush_interval_ms` when something
//! changed, on [`ConsumerOffsets::persist`], and at shutdown.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Mutex;

use serde::{Deserialize, Serialize};

use crate::checkpoint::write_atomically;
use crate::error::{Result, StoreError};

/// A committed position.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CommittedOffset {
    /// Next offset to consume.
    pub offset: u64,
    /// Client metadata (Kafka's commit metadata; empty for RocketMQ).
    #[serde(default)]
    pub metadata: String,
    /// When it was committed (ms since the epoch).
    #[serde(default)]
    pub commit_timestamp: i64,
    /// The leader epoch of the record consumed last, as the client sent it
    /// (Kafka OffsetCommit v6+; -1 unknown, and for RocketMQ).
    #[serde(default = "unknown_epoch")]
    pub leader_epoch: i32,
}

fn unknown_epoch() -> i32 {
    -1
}

#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
struct Key {
    group: String,
    topic: String,
    queue: u32,
}

#[derive(Serialize, Deserialize)]
struct FileForm {
    version: u32,
    offsets: Vec<Row>,
}

#[derive(Serialize, Deserialize)]
struct Row {
    #[serde(flatten)]
    key: Key,
    #[serde(flatten)]
    value: CommittedOffset,
}

/// The table from its file form (`offsets.json`, or a master's snapshot).
fn parse(b: &[u8], path: &Path) -> Result<BTreeMap<Key, CommittedOffset>> {
    let f: FileForm = serde_json::from_slice(b)
        .map_err(|e| StoreError::bad_file(path, format!("consumer offsets are not valid JSON: {e}")))?;
    if f.version != 1 {
        return Err(StoreError::bad_file(path, format!("unknown version {}", f.version)));
    }
    Ok(f.offsets.into_iter().map(|r| (r.key, r.value)).collect())
}

/// The table.
#[derive(Debug)]
pub struct ConsumerOffsets {
    path: PathBuf,
    table: Mutex<BTreeMap<Key, CommittedOffset>>,
    dirty: AtomicBool,
    /// Changes since load (cluster mode ships the table when it moves).
    changes: std::sync::atomic::AtomicU64,
    /// Most entries a client commit may grow the table to.
    max_entries: AtomicUsize,
    /// What the table holds in memory, about ([`cost`] of every entry;
    /// changed under the table's lock).
    bytes: AtomicUsize,
    /// Most bytes a client commit may grow the table to.
    max_bytes: AtomicUsize,
    /// Held across a write of the file (the flusher's and an EndTxn's may
    /// overlap): one temp file at a time, and the snapshot taken under it,
    /// so a later write never renames an older table into place.
    persisting: Mutex<()>,
}

/// Memory an entry takes, about: its names and metadata, and what the
/// map, the strings and the value take besides.
fn cost(k: &Key, metadata: &str) -> usize {
    const ENTRY_OVERHEAD: usize = 128;
    k.group.len() + k.topic.len() + metadata.len() + ENTRY_OVERHEAD
}

/// A configured budget (0 = no limit) as a bound.
fn cap(n: u64) -> usize {
    if n == 0 {
        usize::MAX
    } else {
        n.min(usize::MAX as u64) as usize
    }
}

fn total_cost(t: &BTreeMap<Key, CommittedOffset>) -> usize {
    t.iter().map(|(k, v)| cost(k, &v.metadata)).sum()
}

impl ConsumerOffsets {
    /// Loads `path` (absent = empty table; unreadable = an error naming it).
    pub fn load(path: &Path) -> Result<ConsumerOffsets> {
        let table = match std::fs::read(path) {
            Ok(b) => parse(&b, path)?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => BTreeMap::new(),
            Err(e) => {
                return Err(StoreError::Io {
                    op: "read",
                    path: path.to_path_buf(),
                    source: e,
                })
            }
        };
        let o = ConsumerOffsets {
            path: path.to_path_buf(),
            bytes: AtomicUsize::new(total_cost(&table)),
            table: Mutex::new(table),
            dirty: AtomicBool::new(false),
            changes: std::sync::atomic::AtomicU64::new(0),
            max_entries: AtomicUsize::new(usize::MAX),
            max_bytes: AtomicUsize::new(usize::MAX),
            persisting: Mutex::new(()),
        };
        o.gauges(&o.lock());
        Ok(o)
    }

    fn touch(&self) {
        self.dirty.store(true, Ordering::Release);
        self.changes.fetch_add(1, Ordering::AcqRel);
    }

    /// Bumped by every change.
    pub fn changes(&self) -> u64 {
        self.changes.load(Ordering::Acquire)
    }

    /// The whole table in its file form (a master sends it to replicas).
    pub fn snapshot(&self) -> Vec<u8> {
        serde_json::to_vec(&self.file_form()).unwrap_or_default()
    }

    /// Replaces the whole table with a master's [`ConsumerOffsets::snapshot`].
    pub fn replace_with(&self, snapshot: &[u8]) -> Result<()> {
        let table = parse(snapshot, &self.path)?;
        let bytes = total_cost(&table);
        let mut t = self.lock();
        *t = table;
        self.bytes.store(bytes, Ordering::Relaxed);
        self.gauges(&t);
        drop(t);
        self.touch();
        Ok(())
    }

    fn file_form(&self) -> FileForm {
        let rows = self
            .lock()
            .iter()
            .map(|(k, v)| Row {
                key: k.clone(),
                value: v.clone(),
            })
            .collect();
        FileForm {
            version: 1,
            offsets: rows,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<Key, CommittedOffset>> {
        self.table.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn key(group: &str, topic: &str, queue: u32) -> Key {
        Key {
            group: group.to_string(),
            topic: topic.to_string(),
            queue,
        }
    }

    /// Caps the entries [`ConsumerOffsets::commit_bounded`] may grow the
    /// table to (0 = no limit).
    pub fn set_max_entries(&self, n: u64) {
        self.max_entries.store(cap(n), Ordering::Relaxed);
    }

    /// Caps the bytes (about: names, metadata and per-entry overhead)
    /// [`ConsumerOffsets::commit_bounded`] may grow the table to (0 = no
    /// limit).
    pub fn set_max_bytes(&self, n: u64) {
        self.max_bytes.store(cap(n), Ordering::Relaxed);
    }

    /// What the table holds in memory, about.
    pub fn bytes(&self) -> usize {
        self.bytes.load(Ordering::Relaxed)
    }

    /// Whether a client commit of `key` with `metadata` fits the budgets
    /// of `t`: a new entry needs room for one more entry, and one that
    /// grows the table (a new entry, longer metadata) room for its bytes.
    /// Commits that do not grow the table always fit.
    fn fits(&self, t: &BTreeMap<Key, CommittedOffset>, key: &Key, metadata: &str) -> bool {
        let old = t.get(key).map(|v| cost(key, &v.metadata));
        if old.is_none() && t.len() >= self.max_entries.load(Ordering::Relaxed) {
            return false;
        }
        let new = cost(key, metadata);
        let grows = new.saturating_sub(old.unwrap_or(0));
        grows == 0 || self.bytes.load(Ordering::Relaxed).saturating_add(grows) <= self.max_bytes.load(Ordering::Relaxed)
    }

    /// A client's commit: as [`ConsumerOffsets::commit`], but refused
    /// (false, counted in `rokka_offset_commits_refused_total`) when it
    /// would add an entry to a table already holding `max_committed_offsets`,
    /// or grow it past `max_committed_offset_bytes`.
    pub fn commit_bounded(
        &self,
        group: &str,
        topic: &str,
        queue: u32,
        offset: u64,
        metadata: &str,
        leader_epoch: i32,
    ) -> bool {
        self.insert(group, topic, queue, offset, metadata, leader_epoch, true)
    }

    /// Whether client commits of every (group, topic, queue, metadata) of
    /// `all` together would fit now (a key named twice counts once, with
    /// its last metadata).
    pub fn has_room_for_all<'a>(&self, all: impl IntoIterator<Item = (&'a str, &'a str, u32, &'a str)>) -> bool {
        let mut wanted: BTreeMap<Key, &str> = BTreeMap::new();
        for (g, t, q, m) in all {
            wanted.insert(Self::key(g, t, q), m);
        }
        let t = self.lock();
        let (mut new_keys, mut grows) = (0usize, 0usize);
        for (key, metadata) in &wanted {
            let old = t.get(key).map(|v| cost(key, &v.metadata));
            new_keys += usize::from(old.is_none());
            grows += cost(key, metadata).saturating_sub(old.unwrap_or(0));
        }
        (new_keys == 0 || t.len().saturating_add(new_keys) <= self.max_entries.load(Ordering::Relaxed))
            && (grows == 0
                || self.bytes.load(Ordering::Relaxed).saturating_add(grows) <= self.max_bytes.load(Ordering::Relaxed))
    }

    /// A commit already acknowledged elsewhere (a Kafka transaction's
    /// offsets, checked with [`ConsumerOffsets::has_room_for_all`] when they
    /// were sent): never refused, whatever filled the table meanwhile.
    pub fn commit_acknowledged(
        &self,
        group: &str,
        topic: &str,
        queue: u32,
        offset: u64,
        metadata: &str,
        leader_epoch: i32,
    ) {
        self.insert(group, topic, queue, offset, metadata, leader_epoch, false);
    }

    #[allow(clippy::too_many_arguments)]
    fn insert(
        &self,
        group: &str,
        topic: &str,
        queue: u32,
        offset: u64,
        metadata: &str,
        leader_epoch: i32,
        capped: bool,
    ) -> bool {
        let key = Self::key(group, topic, queue);
        let v = CommittedOffset {
            offset,
            metadata: metadata.to_string(),
            commit_timestamp: crate::now_ms(),
            leader_epoch,
        };
        let mut t = self.lock();
        if capped && !self.fits(&t, &key, metadata) {
            drop(t);
            metrics::counter!("rokka_offset_commits_refused_total").increment(1);
            return false;
        }
        self.put(&mut t, key, v);
        drop(t);
        self.touch();
        true
    }

    /// Inserts into `t` (the locked table), keeping the byte count.
    fn put(&self, t: &mut BTreeMap<Key, CommittedOffset>, key: Key, v: CommittedOffset) {
        let new = cost(&key, &v.metadata);
        let old = t.insert(key.clone(), v).map_or(0, |o| cost(&key, &o.metadata));
        self.resize(old, new);
        self.gauges(t);
    }

    /// The byte count after an entry costing `old` now costs `new`
    /// (called under the table's lock).
    fn resize(&self, old: usize, new: usize) {
        let b = self.bytes.load(Ordering::Relaxed);
        self.bytes
            .store(b.saturating_sub(old).saturating_add(new), Ordering::Relaxed);
    }

    /// The gauges of the table's size, from `t` (the locked table).
    fn gauges(&self, t: &BTreeMap<Key, CommittedOffset>) {
        metrics::gauge!("rokka_committed_offsets").set(t.len() as f64);
        metrics::gauge!("rokka_committed_offsets_bytes").set(self.bytes() as f64);
    }

    /// Records `offset` as the next offset `group` consumes from (topic,
    /// queue). For the broker's own progress entries; clients' commits go
    /// through [`ConsumerOffsets::commit_bounded`].
    pub fn commit(&self, group: &str, topic: &str, queue: u32, offset: u64, metadata: &str) {
        let v = CommittedOffset {
            offset,
            metadata: metadata.to_string(),
            commit_timestamp: crate::now_ms(),
            leader_epoch: -1,
        };
        let mut t = self.lock();
        self.put(&mut t, Self::key(group, topic, queue), v);
        drop(t);
        self.touch();
    }

    /// The committed offset, if any.
    pub fn get(&self, group: &str, topic: &str, queue: u32) -> Option<CommittedOffset> {
        self.lock().get(&Self::key(group, topic, queue)).cloned()
    }

    /// Every (topic, queue) → offset of `group`.
    pub fn group_offsets(&self, group: &str) -> Vec<(String, u32, CommittedOffset)> {
        // Keys sort by group first: the group's rows only, not the table.
        self.lock()
            .range(Self::key(group, "", 0)..)
            .take_while(|(k, _)| k.group == group)
            .map(|(k, v)| (k.topic.clone(), k.queue, v.clone()))
            .collect()
    }

    /// Whether `group` has any committed offset (one look, no copy).
    pub fn group_exists(&self, group: &str) -> bool {
        self.lock()
            .range(Self::key(group, "", 0)..)
            .next()
            .is_some_and(|(k, _)| k.group == group)
    }

    /// Every committed offset: (group, topic, queue, offset).
    pub fn all(&self) -> Vec<(String, String, u32, u64)> {
        self.lock()
            .iter()
            .map(|(k, v)| (k.group.clone(), k.topic.clone(), k.queue, v.offset))
            .collect()
    }

    /// Groups with an offset committed on `topic` (each once), copied
    /// out alone — not the whole table.
    pub fn groups_of_topic(&self, topic: &str) -> Vec<String> {
        let mut g: Vec<String> = self
            .lock()
            .keys()
            .filter(|k| k.topic == topic)
            .map(|k| k.group.clone())
            .collect();
        g.dedup();
        g
    }

    /// Names of all groups with committed offsets.
    pub fn groups(&self) -> Vec<String> {
        let mut g: Vec<String> = self.lock().keys().map(|k| k.group.clone()).collect();
        g.dedup();
        g
    }

    /// Deletes one offset; returns whether it existed.
    pub fn delete(&self, group: &str, topic: &str, queue: u32) -> bool {
        let key = Self::key(group, topic, queue);
        let mut t = self.lock();
        let had = match t.remove(&key) {
            Some(v) => {
                self.resize(cost(&key, &v.metadata), 0);
                self.gauges(&t);
                true
            }
            None => false,
        };
        drop(t);
        if had {
            self.touch();
        }
        had
    }

    /// Deletes every offset of `group`; returns how many. (Keys sort by
    /// group first: the group's rows only, not a pass over the table — a
    /// client's DeleteGroups or DELETE_SUBSCRIPTIONGROUP runs it.)
    pub fn delete_group(&self, group: &str) -> usize {
        let mut t = self.lock();
        let keys: Vec<Key> = t
            .range(Self::key(group, "", 0)..)
            .take_while(|(k, _)| k.group == group)
            .map(|(k, _)| k.clone())
            .collect();
        let mut freed = 0;
        for k in &keys {
            if let Some(v) = t.remove(k) {
                freed += cost(k, &v.metadata);
            }
        }
        self.resize(freed, 0);
        self.gauges(&t);
        drop(t);
        if !keys.is_empty() {
            self.touch();
        }
        keys.len()
    }

    /// Deletes every group's offsets of `topic` (the topic was deleted, as
    /// Kafka's coordinator and RocketMQ's deleteTopic drop them); returns
    /// how many.
    pub fn delete_topic(&self, topic: &str) -> usize {
        self.delete_where(|k| k.topic == topic)
    }

    /// Deletes the entries whose key `gone` says; returns how many.
    fn delete_where(&self, gone: impl Fn(&Key) -> bool) -> usize {
        let mut t = self.lock();
        let before = t.len();
        let mut freed = 0;
        t.retain(|k, v| {
            let keep = !gone(k);
            if !keep {
                freed += cost(k, &v.metadata);
            }
            keep
        });
        self.resize(freed, 0);
        self.gauges(&t);
        let n = before - t.len();
        drop(t);
        if n > 0 {
            self.touch();
        }
        n
    }

    /// Writes the table if it changed since the last write.
    pub fn persist_if_dirty(&self) -> Result<()> {
        if self.dirty.swap(false, Ordering::AcqRel) {
            if let Err(e) = self.persist() {
                self.touch();
                return Err(e);
            }
        }
        Ok(())
    }

    /// Writes the table now, unless it is unchanged since the last write
    /// and there is no room for the file (a full disk): then what is on
    /// disk is current and nothing is lost.
    pub fn persist_at_close(&self) -> Result<()> {
        match self.persist() {
            Err(e) if e.is_no_space() && !self.dirty.load(Ordering::Acquire) => {
                tracing::warn!(error = %e, "no room to write the committed offsets again; the last write holds them all");
                Ok(())
            }
            other => other,
        }
    }

    /// Writes the table now.
    pub fn persist(&self) -> Result<()> {
        let _one_at_a_time = self
            .persisting
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let json = serde_json::to_vec_pretty(&self.file_form())
            .map_err(|e| StoreError::bad_file(&self.path, format!("encoding offsets: {e}")))?;
        write_atomically(&self.path, &json)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The flusher and EndTxn persist at once: every write leaves a whole
    /// file holding at least what was committed before it began.
    #[test]
    fn concurrent_persists_leave_a_whole_and_current_file() -> Result<()> {
        let dir = tempfile::tempdir().map_err(StoreError::io("tmp", "/tmp"))?;
        let p = dir.path().join("offsets.json");
        let t = std::sync::Arc::new(ConsumerOffsets::load(&p)?);
        let threads: Vec<_> = (0..4u32)
            .map(|w| {
                let t = std::sync::Arc::clone(&t);
                std::thread::spawn(move || -> Result<()> {
                    for i in 0..40u64 {
                        // Groups of different name lengths: files of
                        // different sizes through the one temp file.
                        t.commit(&"g".repeat(1 + (w as usize) * 7), "t", w, i, "");
                        t.persist()?;
                    }
                    Ok(())
                })
            })
            .collect();
        for th in threads {
            th.join().map_err(|_| StoreError::Config("thread panicked".into()))??;
        }
        let back = ConsumerOffsets::load(&p)?;
        for w in 0..4u32 {
            assert_eq!(
                back.get(&"g".repeat(1 + (w as usize) * 7), "t", w).map(|o| o.offset),
                Some(39)
            );
        }
        Ok(())
    }

    #[test]
    fn commit_persist_reload() -> Result<()> {
        let dir = tempfile::tempdir().map_err(StoreError::io("tmp", "/tmp"))?;
        let p = dir.path().join("offsets.json");
        let t = ConsumerOffsets::load(&p)?;
        t.commit("g1", "t", 0, 10, "m");
        t.commit("g1", "t", 1, 20, "");
        t.commit("g2", "t", 0, 5, "");
        t.persist_if_dirty()?;
        let t2 = ConsumerOffsets::load(&p)?;
        assert_eq!(
            t2.get("g1", "t", 0).map(|o| (o.offset, o.metadata)),
            Some((10, "m".into()))
        );
        assert_eq!(t2.group_offsets("g1").len(), 2);
        // A group whose name another's starts with, and one sorting around it.
        t2.commit("g", "t", 3, 1, "");
        t2.commit("g10", "a", 0, 2, "");
        t2.commit("f", "z", 0, 3, "");
        let rows = |g: &str| {
            t2.group_offsets(g)
                .into_iter()
                .map(|(t, q, o)| (t, q, o.offset))
                .collect::<Vec<_>>()
        };
        assert_eq!(rows("g"), vec![("t".to_string(), 3, 1)]);
        assert_eq!(rows("g1"), vec![("t".to_string(), 0, 10), ("t".to_string(), 1, 20)]);
        assert_eq!(rows("g10"), vec![("a".to_string(), 0, 2)]);
        assert!(rows("h").is_empty() && rows("").is_empty());
        assert_eq!(t2.delete_group("g") + t2.delete_group("g10") + t2.delete_group("f"), 3);
        assert_eq!(t2.groups(), vec!["g1".to_string(), "g2".to_string()]);
        assert_eq!(t2.delete_group("g1"), 2);
        assert!(t2.get("g1", "t", 1).is_none());
        std::fs::write(&p, b"{not json").map_err(StoreError::io("write", &p))?;
        let err = ConsumerOffsets::load(&p).err();
        assert!(matches!(err, Some(StoreError::BadFile { .. })));
        Ok(())
    }

    #[test]
    fn client_commits_cannot_grow_the_table_past_its_cap() -> Result<()> {
        let dir = tempfile::tempdir().map_err(|e| StoreError::Config(e.to_string()))?;
        let t = ConsumerOffsets::load(&dir.path().join("offsets.json"))?;
        t.set_max_entries(2);
        assert!(t.commit_bounded("g1", "t", 0, 1, "", -1));
        assert!(t.commit_bounded("g2", "t", 0, 1, "", -1));
        assert!(!t.commit_bounded("g3", "t", 0, 1, "", -1), "a third entry");
        assert!(t.commit_bounded("g1", "t", 0, 5, "", -1), "an existing entry moves");
        assert_eq!(t.get("g1", "t", 0).map(|c| c.offset), Some(5));
        assert_eq!(t.get("g3", "t", 0), None);
        t.delete_group("g2");
        assert!(t.commit_bounded("g3", "t", 0, 1, "", -1), "room once a group is gone");
        Ok(())
    }

    /// `max_committed_offset_bytes`: commits that grow the table past it
    /// (a new entry, longer metadata) are refused, others always go; the
    /// count follows deletions, reloads and a master's snapshot.
    #[test]
    fn client_commits_cannot_grow_the_table_past_its_bytes() -> Result<()> {
        let dir = tempfile::tempdir().map_err(|e| StoreError::Config(e.to_string()))?;
        let p = dir.path().join("offsets.json");
        let t = ConsumerOffsets::load(&p)?;
        let one = cost(&ConsumerOffsets::key("g1", "t", 0), "");
        t.set_max_bytes(2 * one as u64 + 10);
        assert!(t.commit_bounded("g1", "t", 0, 1, "", -1));
        assert!(t.commit_bounded("g2", "t", 0, 1, "", -1));
        assert_eq!(t.bytes(), 2 * one);
        assert!(!t.commit_bounded("g3", "t", 0, 1, "", -1), "a third entry");
        assert!(
            t.commit_bounded("g1", "t", 0, 2, "0123456789", -1),
            "metadata within the budget"
        );
        assert!(
            !t.commit_bounded("g1", "t", 0, 3, "0123456789x", -1),
            "longer metadata past it"
        );
        assert!(
            t.commit_bounded("g1", "t", 0, 4, "", -1),
            "shorter metadata always goes"
        );
        assert_eq!(t.get("g1", "t", 0).map(|c| c.offset), Some(4));
        assert_eq!(t.bytes(), 2 * one);
        assert!(t.delete("g2", "t", 0));
        assert_eq!(t.bytes(), one);
        assert!(t.commit_bounded("g3", "t", 0, 1, "", -1), "room once an entry is gone");
        // The broker's own entries are counted too.
        t.commit("g4", "t", 0, 1, "");
        assert_eq!(t.bytes(), 3 * one);
        t.delete_group("g4");
        assert_eq!(t.bytes(), 2 * one);
        // Transactional offsets are checked together.
        assert!(t.has_room_for_all([("g1", "t", 0, ""), ("g3", "t", 0, "")]));
        assert!(!t.has_room_for_all([("g1", "t", 0, ""), ("g5", "t", 0, "")]));
        t.set_max_bytes(4 * one as u64);
        assert!(t.has_room_for_all([("g5", "t", 0, ""), ("g6", "t", 0, "")]));
        assert!(!t.has_room_for_all([("g5", "t", 0, ""), ("g6", "t", 0, ""), ("g7", "t", 0, "")]));
        t.persist()?;
        assert_eq!(ConsumerOffsets::load(&p)?.bytes(), 2 * one);
        let other = ConsumerOffsets::load(&dir.path().join("other.json"))?;
        other.replace_with(&t.snapshot())?;
        assert_eq!(other.bytes(), 2 * one);
        Ok(())
    }
}

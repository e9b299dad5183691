//! RocketMQ transactional messages (digest §2.9, store doc §11): a half
//! message waits invisibly in `RMQ_SYS_TRANS_HALF_TOPIC` (queue 0) with its
//! real topic and queue in properties; END_TRANSACTION commits it (a new
//! record in the real queue, sysFlag COMMIT) or rolls it back; either way an
//! op record (`RMQ_SYS_TRANS_OP_HALF_TOPIC`, body `"<half offset>,"`) marks
//! it resolved, so a restart — which rebuilds the resolved set from the op
//! queue — never resolves it twice. Half messages unresolved after the
//! timeout are offered for checks; after the last check they are discarded
//! to `TRANS_CHECK_MAX_TIME_TOPIC`.

use std::collections::{BTreeSet, HashMap};
use std::sync::Mutex;

use bytes::Bytes;
use rokka_store::record::message::{self as rmsg, sysflag, Placement};
use rokka_store::record::properties;
use rokka_store::{Entry, MessageInput, MessageView};

use crate::schedule::{without, REAL_QID, REAL_TOPIC};
use crate::{Broker, BrokerError, Result};

pub const HALF_TOPIC: &str = "RMQ_SYS_TRANS_HALF_TOPIC";
pub const OP_TOPIC: &str = "RMQ_SYS_TRANS_OP_HALF_TOPIC";
pub const CHECK_MAX_TOPIC: &str = "TRANS_CHECK_MAX_TIME_TOPIC";
/// Longest CHECK_IMMUNITY_TIME_IN_SECONDS a half message's producer gets.
const MAX_IMMUNITY_MS: i64 = 3_600_000;
/// The offset-table group holding the half queue's scan progress.
pub const PROGRESS_GROUP: &str = "CID_RMQ_SYS_TRANS";
pub const TRANSACTION_ID: &str = "__transactionId__";

/// Resolution state, rebuilt from the op queue at start.
#[derive(Debug, Default)]
pub struct Transactions {
    state: Mutex<TxState>,
}

/// The op record body's mark of a half discarded after its last check.
const DISCARDED: &str = "discarded";

#[derive(Debug, Default)]
struct TxState {
    loaded: bool,
    /// Every half-queue offset below this is resolved (the scan progress).
    floor: u64,
    /// Half-queue offsets at or above `floor` resolved (committed, rolled
    /// back or discarded); pruned as the floor rises.
    resolved: BTreeSet<u64>,
    /// Half-queue offsets discarded after their last check (copied to
    /// `TRANS_CHECK_MAX_TIME_TOPIC`): no longer checked, but a producer's
    /// late END_TRANSACTION still ends them, as Apache's (it finds the
    /// half by its offset). Kept while the half queue holds them.
    discarded: BTreeSet<u64>,
    /// Checks sent per half-queue offset (since start).
    checks: HashMap<u64, u32>,
    /// A scan cut at its budget: the next hands out checks from this
    /// half on (the ones before it were just checked), then starts over.
    resume_from: Option<u64>,
    /// Scan progress not committed yet: (progress, log end its op records
    /// lie below), committed once the set's replicas hold that much.
    unconfirmed: Option<(u64, u64)>,
}

/// What END_TRANSACTION did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ended {
    Committed,
    RolledBack,
    /// Already resolved before (a repeated or late answer): nothing done.
    AlreadyResolved,
}

/// A half message due for a check.
#[derive(Debug, Clone)]
pub struct DueCheck {
    pub half_offset: u64,
    pub half_phys: u64,
    pub producer_group: String,
    pub real_topic: String,
    pub transaction_id: String,
    /// The half message as CHECK_TRANSACTION_STATE carries it: a stored
    /// record with the real topic and queue.
    pub record: Bytes,
}

/// A frontend that can ask its producers about a transaction: `check`
/// sends the question to a live producer of the half message and says
/// whether one was found.
pub trait TxnCheckSink: Send + Sync + std::fmt::Debug {
    fn check(&self, d: &DueCheck) -> bool;
}

fn prop_str(m: &MessageView, k: &str) -> String {
    m.property(k)
        .map(|v| String::from_utf8_lossy(v).into_owned())
        .unwrap_or_default()
}

impl Broker {
    /// Adds a frontend whose producers transaction checks may go to.
    pub fn add_txn_check_sink(&self, s: std::sync::Arc<dyn TxnCheckSink>) {
        self.txn_sinks.write().unwrap_or_else(|p| p.into_inner()).push(s);
    }

    /// Every `interval`, asks a live producer (of whichever frontend has
    /// one) about each half message unresolved past `timeout_ms`, at most
    /// `per_scan` of them a scan (the rest the next); one checked
    /// `max_checks` times is discarded (`due_checks`).
    pub async fn run_transaction_checks(
        self: std::sync::Arc<Self>,
        interval: std::time::Duration,
        timeout_ms: i64,
        max_checks: u32,
        per_scan: usize,
        mut shutdown: tokio::sync::watch::Receiver<bool>,
    ) {
        let mut tick = tokio::time::interval(interval.max(std::time::Duration::from_millis(100)));
        loop {
            tokio::select! {
                _ = tick.tick() => {}
                _ = shutdown.changed() => return,
            }
            let b = std::sync::Arc::clone(&self);
            let Ok(due) = tokio::task::spawn_blocking(move || {
                b.due_checks_within(rokka_store::now_ms(), timeout_ms, max_checks, per_scan)
            })
            .await
            else {
                continue;
            };
            let sinks: Vec<_> = self.txn_sinks.read().unwrap_or_else(|p| p.into_inner()).clone();
            for d in due {
                if sinks.iter().any(|s| s.check(&d)) {
                    metrics::counter!("rokka_rocketmq_transaction_checks_total").increment(1);
                } else {
                    tracing::debug!(
                        group = d.producer_group,
                        topic = d.real_topic,
                        "no live producer to check a transaction with"
                    );
                }
            }
        }
    }

    fn ensure_topic(&self, topic: &str) -> Result<()> {
        if self.topics.get(topic).is_none_or(|i| i.partitions == 0) {
            self.ensure_own_topic(topic, 1)?;
        }
        Ok(())
    }

    /// Cluster mode, a new master: which halves are resolved is loaded
    /// again from everything its log holds (as a replica it may have
    /// loaded before the entries it replicated since).
    pub(crate) fn reload_transaction_state(&self) {
        *self.transactions.state.lock().unwrap_or_else(|p| p.into_inner()) = TxState::default();
    }

    fn tx_state(&self) -> std::sync::MutexGuard<'_, TxState> {
        let mut st = self.transactions.state.lock().unwrap_or_else(|p| p.into_inner());
        if !st.loaded {
            st.loaded = true;
            st.floor = self
                .store
                .offsets()
                .get(PROGRESS_GROUP, HALF_TOPIC, 0)
                .map_or(0, |o| o.offset);
            // Everything written, whatever the read limit (see
            // Broker::reload_transaction_state).
            let mut at = self.store.min_offset(OP_TOPIC, 0);
            let end = self.store.written_max_offset(OP_TOPIC, 0);
            while at < end {
                let read = self.store.read_written(OP_TOPIC, 0, at, 256, 1 << 20);
                if read.entries.is_empty() {
                    break;
                }
                for e in &read.entries {
                    if let Ok(Entry::Message(m)) = e.decode() {
                        let discard = m.body.split(|b| *b == b',').any(|p| p == DISCARDED.as_bytes());
                        for o in m.body.split(|b| *b == b',') {
                            if let Some(o) = std::str::from_utf8(o).ok().and_then(|s| s.trim().parse::<u64>().ok()) {
                                if discard {
                                    // No more checks; still to be ended.
                                    st.discarded.insert(o);
                                } else {
                                    // (In order: a late end after a discard.)
                                    st.discarded.remove(&o);
                                }
                                if o >= st.floor {
                                    st.resolved.insert(o);
                                }
                            }
                        }
                    }
                    at = e.cq.base_offset + u64::from(e.cq.count.max(1));
                }
            }
        }
        st
    }

    /// Stores a prepared message as a half message; its result carries the
    /// half queue offset and CommitLog offset the producer ends it with.
    pub fn append_half(&self, m: &MessageInput<'_>) -> Result<rokka_store::AppendResult> {
        self.ensure_topic(HALF_TOPIC)?;
        let uniq = properties::get(m.properties, properties::UNIQ_KEY).unwrap_or_default();
        let mut props = without(m.properties, &[REAL_TOPIC, REAL_QID, TRANSACTION_ID]);
        for (k, v) in [
            (REAL_TOPIC, m.topic.as_bytes()),
            (REAL_QID, m.queue_id.to_string().as_bytes()),
            (TRANSACTION_ID, uniq),
        ] {
            props.extend_from_slice(k.as_bytes());
            props.push(properties::NAME_VALUE_SEPARATOR);
            props.extend_from_slice(v);
            props.push(properties::PROPERTY_SEPARATOR);
        }
        let half = MessageInput {
            topic: HALF_TOPIC,
            queue_id: 0,
            properties: &props,
            sys_flag: m.sys_flag & !sysflag::TRANSACTION_MASK,
            ..m.clone()
        };
        let r = self.append_messages(std::slice::from_ref(&half))?;
        self.publish_pending(&self.tx_state());
        r.into_iter()
            .next()
            .ok_or_else(|| BrokerError::InvalidPartitions("empty append".into()))
    }

    /// `rokka_rocketmq_half_messages_pending`: half messages not resolved.
    fn publish_pending(&self, st: &TxState) {
        let min = self.store.min_offset(HALF_TOPIC, 0);
        let end = self.store.max_offset(HALF_TOPIC, 0);
        let from = min.max(st.floor);
        let resolved = st.resolved.range(from..end).count() as u64;
        metrics::gauge!("rokka_rocketmq_half_messages_pending").set(end.saturating_sub(from + resolved) as f64);
    }

    fn write_op(&self, half_offset: u64) -> Result<()> {
        self.write_op_body(format!("{half_offset},"))
    }

    fn write_op_body(&self, body: String) -> Result<()> {
        self.ensure_topic(OP_TOPIC)?;
        let props = properties::encode([(properties::TAGS, "d")]);
        let op = MessageInput::new(OP_TOPIC, 0, body.as_bytes(), props.as_bytes());
        self.append_messages(std::slice::from_ref(&op))?;
        Ok(())
    }

    /// The topic the half message at CommitLog offset `half_phys` is bound
    /// for (its REAL_TOPIC), None when no half message is there: what
    /// ending it writes to, so what an ACL check of the end must name (the
    /// request's own topic field is the client's to fill).
    pub fn half_message_topic(&self, half_phys: u64) -> Option<String> {
        match self
            .store
            .read_written_at(half_phys)
            .map(|b| rokka_store::decode_entry(&b))
        {
            Some(Ok(Entry::Message(m))) if m.topic_str() == HALF_TOPIC => Some(prop_str(&m, REAL_TOPIC)),
            _ => None,
        }
    }

    /// END_TRANSACTION: commits or rolls back the half message at
    /// (`half_offset`, `half_phys`) of producer group `group`.
    pub fn end_transaction(&self, group: &str, half_offset: u64, half_phys: u64, commit: bool) -> Result<Ended> {
        let mut st = self.tx_state();
        let discarded = st.discarded.contains(&half_offset);
        if !discarded && (half_offset < st.floor || st.resolved.contains(&half_offset)) {
            return Ok(Ended::AlreadyResolved);
        }
        let m = match self
            .store
            .read_written_at(half_phys)
            .map(|b| rokka_store::decode_entry(&b))
        {
            Some(Ok(Entry::Message(m))) if m.topic_str() == HALF_TOPIC && m.queue_offset == half_offset => m,
            _ => {
                return Err(BrokerError::InvalidPartitions(format!(
                    "no half message at offset {half_offset} / {half_phys}"
                )))
            }
        };
        let pgroup = prop_str(&m, "PGROUP");
        if !pgroup.is_empty() && pgroup != group {
            return Err(BrokerError::InvalidPartitions(format!(
                "the half message belongs to producer group {pgroup}, not {group}"
            )));
        }
        if commit {
            let real = prop_str(&m, REAL_TOPIC);
            let qid: u32 = prop_str(&m, REAL_QID).parse().unwrap_or(0);
            let info = self.topic_or_create(&real, true, Some(qid.saturating_add(1)))?;
            let partitions = info.map_or(1, |i| i.partitions);
            let props = without(&m.user_properties(), &[REAL_TOPIC, REAL_QID, "TRAN_MSG"]);
            let input = MessageInput {
                sys_flag: (m.sys_flag & !sysflag::TRANSACTION_MASK) | sysflag::TRANSACTION_COMMIT,
                prepared_transaction_offset: half_phys as i64,
                ..m.as_input(&real, if qid < partitions { qid } else { 0 }, &props)
            };
            // A committed message with a delivery time waits for it (Apache's
            // HookUtils turns it into a timer message when it is put; a
            // relative delay counts from the commit).
            let now = rokka_store::now_ms();
            match crate::timer::deliver_at(&props, now).filter(|due| *due > now) {
                Some(due) => {
                    self.append_timer(&input, due)?;
                }
                None => {
                    self.append_messages(std::slice::from_ref(&input))?;
                }
            }
        }
        self.write_op(half_offset)?;
        st.discarded.remove(&half_offset);
        if half_offset >= st.floor {
            st.resolved.insert(half_offset);
        }
        st.checks.remove(&half_offset);
        self.publish_pending(&st);
        let outcome = if commit { "commit" } else { "rollback" };
        metrics::counter!("rokka_rocketmq_transactions_total", "outcome" => outcome).increment(1);
        Ok(if commit { Ended::Committed } else { Ended::RolledBack })
    }

    /// Half messages older than `timeout_ms` (or their
    /// CHECK_IMMUNITY_TIME_IN_SECONDS) and still unresolved, each counted as
    /// checked once more; those checked `max_checks` times already are
    /// discarded to `TRANS_CHECK_MAX_TIME_TOPIC` instead.
    pub fn due_checks(&self, now_ms: i64, timeout_ms: i64, max_checks: u32) -> Vec<DueCheck> {
        self.due_checks_within(now_ms, timeout_ms, max_checks, usize::MAX)
    }

    /// As [`Broker::due_checks`], at most `per_scan` checks (each holds a
    /// copy of its message): the scan stops there, and the next goes on
    /// from the first half still unresolved.
    pub fn due_checks_within(&self, now_ms: i64, timeout_ms: i64, max_checks: u32, per_scan: usize) -> Vec<DueCheck> {
        // The master checks (a replica's resolved set is not refreshed
        // from what the master resolves).
        if self.topics.get(HALF_TOPIC).is_none() || !self.leads_here() {
            // Progress of an earlier term is not confirmed later (a cut
            // may have taken what it passed).
            self.transactions
                .state
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .unconfirmed = None;
            return Vec::new();
        }
        let mut st = self.tx_state();
        // What was written before this scan took the state: the op records
        // of every half it finds resolved lie below (each is written
        // before its half is marked resolved under the state's lock).
        let written = self.store.log_end();
        let offsets = self.store.offsets();
        // A last scan's progress the replicas hold now.
        if let Some((p, w)) = st.unconfirmed {
            if self.store.is_replicated(w) {
                offsets.commit(PROGRESS_GROUP, HALF_TOPIC, 0, p, "");
                st.unconfirmed = None;
            }
        }
        let min = self.store.min_offset(HALF_TOPIC, 0);
        let start = offsets
            .get(PROGRESS_GROUP, HALF_TOPIC, 0)
            .map_or(min, |o| o.offset)
            .max(min);
        let end = self.store.max_offset(HALF_TOPIC, 0);
        let mut due = Vec::new();
        let mut discard = Vec::new();
        let mut at = start;
        let mut contiguous = true;
        let mut progress = start;
        let mut cut = None;
        'scan: while at < end {
            let read = self.store.read(HALF_TOPIC, 0, at, 256, 1 << 20);
            if read.entries.is_empty() {
                break;
            }
            for e in &read.entries {
                let off = e.cq.base_offset;
                at = off + u64::from(e.cq.count.max(1));
                if off < st.floor || st.resolved.contains(&off) {
                    if contiguous {
                        progress = at;
                    }
                    continue;
                }
                contiguous = false;
                let Ok(Entry::Message(m)) = e.decode() else {
                    continue;
                };
                // A producer's own immunity (seconds; never under the
                // check timeout, as RocketMQ's getImmunityTime, and at most
                // an hour): a half immune longer than the halves after it
                // is passed over, not waited on, so it holds up no one
                // else's check — and the scan, which restarts at the first
                // unresolved half, re-reads what follows it for at most that
                // long.
                let own = prop_str(&m, "CHECK_IMMUNITY_TIME_IN_SECONDS")
                    .parse::<i64>()
                    .ok()
                    .map(|s| {
                        s.saturating_mul(1000)
                            .clamp(timeout_ms, MAX_IMMUNITY_MS.max(timeout_ms))
                    });
                if m.store_timestamp.saturating_add(own.unwrap_or(timeout_ms)) > now_ms {
                    if own.is_some() {
                        continue;
                    }
                    // Later halves are younger still.
                    break 'scan;
                }
                if st.resume_from.is_some_and(|r| off < r) {
                    continue;
                }
                if due.len() >= per_scan {
                    metrics::counter!("rokka_rocketmq_transaction_scans_cut_total").increment(1);
                    cut = Some(off);
                    break 'scan;
                }
                let n = st.checks.entry(off).or_insert(0);
                if *n >= max_checks {
                    discard.push((off, m));
                    continue;
                }
                *n += 1;
                let real = prop_str(&m, REAL_TOPIC);
                let qid: u32 = prop_str(&m, REAL_QID).parse().unwrap_or(0);
                let props = m.user_properties();
                let input = m.as_input(&real, qid, &props);
                let host = self.store.config().store_host;
                let mut rec = vec![0u8; rmsg::encoded_len(&input, &host, false)];
                rmsg::encode(
                    &mut rec,
                    &input,
                    &host,
                    Placement {
                        queue_offset: off,
                        phys_offset: m.phys_offset,
                        store_timestamp: m.store_timestamp,
                        body_crc32: crc32fast::hash(&m.body),
                        record_crc: false,
                    },
                );
                due.push(DueCheck {
                    half_offset: off,
                    half_phys: m.phys_offset,
                    producer_group: prop_str(&m, "PGROUP"),
                    real_topic: real,
                    transaction_id: prop_str(&m, TRANSACTION_ID),
                    record: Bytes::from(rec),
                });
            }
        }
        // Cut: the next scan goes on from here; done: it starts over.
        st.resume_from = cut;
        self.publish_pending(&st);
        drop(st);
        for (off, m) in discard {
            let props = m.user_properties();
            let input = m.as_input(CHECK_MAX_TOPIC, 0, &props);
            // Its op record says discarded: no more checks, but a late
            // END_TRANSACTION still ends it.
            let kept = self
                .ensure_topic(CHECK_MAX_TOPIC)
                .and_then(|_| self.append_messages(std::slice::from_ref(&input)))
                .and_then(|_| self.write_op_body(format!("{off},{DISCARDED}")));
            match kept {
                Ok(()) => {
                    let mut st = self.tx_state();
                    st.resolved.insert(off);
                    st.discarded.insert(off);
                    st.checks.remove(&off);
                    self.publish_pending(&st);
                    metrics::counter!("rokka_rocketmq_transactions_total", "outcome" => "discarded").increment(1);
                    tracing::warn!(
                        half_offset = off,
                        "transaction unresolved after its last check: discarded"
                    );
                }
                Err(e) => tracing::warn!(half_offset = off, error = %e, "cannot discard a half message"),
            }
        }
        // The op records resolving what the progress passes are held by
        // the set's replicas first (the offset table ships apart from the
        // log: a new master with the progress but not the records would
        // never check those halves again — a committed message lost);
        // else the progress waits for a later scan.
        if progress > start {
            let mut st = self.tx_state();
            if self.store.is_replicated(written) {
                offsets.commit(PROGRESS_GROUP, HALF_TOPIC, 0, progress, "");
                st.unconfirmed = None;
            } else {
                // Committed by a later scan once the replicas hold it.
                st.unconfirmed = Some((progress, written));
            }
            st.floor = st.floor.max(progress);
            let floor = st.floor;
            st.resolved = st.resolved.split_off(&floor);
            // Discarded halves retention removed cannot be ended any more.
            let min = self.store.min_offset(HALF_TOPIC, 0);
            st.discarded = st.discarded.split_off(&min);
        }
        due
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::BrokerConfig;
    use rokka_store::{MessageStore, StoreConfig};

    fn half(b: &Broker, body: &[u8]) -> Result<rokka_store::AppendResult> {
        let props = properties::encode([("TRAN_MSG", "true"), ("PGROUP", "pg"), ("UNIQ_KEY", "U1"), ("k", "v")]);
        let mut m = MessageInput::new("Real", 1, body, props.as_bytes());
        m.sys_flag = sysflag::TRANSACTION_PREPARED;
        b.append_half(&m)
    }

    #[test]
    fn commit_rollback_and_checks_survive_a_restart() -> Result<()> {
        let dir = tempfile::tempdir().map_err(|e| BrokerError::Io("tmp".into(), e))?;
        let cfg = StoreConfig::for_tests(dir.path());
        let (c, r, u) = {
            let store = Arc::new(MessageStore::open(cfg.clone())?);
            let b = Broker::new(Arc::clone(&store), BrokerConfig::default())?;
            b.create_topic("Real", 2)?;
            let c = half(&b, b"commit-me")?;
            let r = half(&b, b"roll-me-back")?;
            let u = half(&b, b"unknown")?;
            assert_eq!(store.max_offset("Real", 1), 0, "half messages are invisible");
            assert_eq!(
                b.end_transaction("pg", c.queue_offset, c.phys_offset, true)?,
                Ended::Committed
            );
            assert_eq!(
                b.end_transaction("pg", r.queue_offset, r.phys_offset, false)?,
                Ended::RolledBack
            );
            assert!(
                b.end_transaction("other", u.queue_offset, u.phys_offset, true).is_err(),
                "wrong group"
            );
            assert_eq!(store.max_offset("Real", 1), 1);
            // Only the unresolved one is checked, once the timeout passed.
            assert!(b.due_checks(rokka_store::now_ms(), 60_000, 2).is_empty());
            let due = b.due_checks(rokka_store::now_ms() + 61_000, 60_000, 2);
            assert_eq!(due.len(), 1);
            assert_eq!(due[0].half_offset, u.queue_offset);
            assert_eq!(
                (due[0].real_topic.as_str(), due[0].transaction_id.as_str()),
                ("Real", "U1")
            );
            let rec = rokka_store::record::message::decode(&due[0].record)
                .map_err(|e| BrokerError::InvalidPartitions(format!("{e:?}")))?;
            assert_eq!(
                (rec.topic_str(), rec.queue_id, &rec.body[..]),
                ("Real", 1, &b"unknown"[..])
            );
            store.close()?;
            (c, r, u)
        };
        // After a restart: nothing is resolved twice, the unknown one still is due.
        let store = Arc::new(MessageStore::open(cfg)?);
        let b = Broker::new(Arc::clone(&store), BrokerConfig::default())?;
        assert_eq!(
            b.end_transaction("pg", c.queue_offset, c.phys_offset, true)?,
            Ended::AlreadyResolved
        );
        assert_eq!(
            b.end_transaction("pg", r.queue_offset, r.phys_offset, true)?,
            Ended::AlreadyResolved
        );
        assert_eq!(store.max_offset("Real", 1), 1, "the committed message is there once");
        let later = rokka_store::now_ms() + 61_000;
        assert_eq!(b.due_checks(later, 60_000, 2).len(), 1);
        assert_eq!(b.due_checks(later, 60_000, 2).len(), 1);
        // Checked twice: discarded, never checked again.
        assert!(b.due_checks(later, 60_000, 2).is_empty());
        assert_eq!(store.max_offset(CHECK_MAX_TOPIC, 0), 1);
        assert!(b.due_checks(later, 60_000, 2).is_empty());
        // A late commit still commits it (Apache finds the half by its
        // offset; it was answered OK and dropped before), once.
        assert_eq!(
            b.end_transaction("pg", u.queue_offset, u.phys_offset, true)?,
            Ended::Committed
        );
        assert_eq!(store.max_offset("Real", 1), 2);
        assert_eq!(
            b.end_transaction("pg", u.queue_offset, u.phys_offset, true)?,
            Ended::AlreadyResolved
        );
        Ok(())
    }

    /// A half discarded before a restart can still be ended after it; one
    /// ended after its discard is not ended twice.
    #[test]
    fn a_discarded_half_is_still_ended_after_a_restart() -> Result<()> {
        let dir = tempfile::tempdir().map_err(|e| BrokerError::Io("tmp".into(), e))?;
        let cfg = StoreConfig::for_tests(dir.path());
        let later = rokka_store::now_ms() + 61_000;
        let (a, c) = {
            let store = Arc::new(MessageStore::open(cfg.clone())?);
            let b = Broker::new(Arc::clone(&store), BrokerConfig::default())?;
            b.create_topic("Real", 2)?;
            let a = half(&b, b"ended-late")?;
            let c = half(&b, b"ended-before-restart")?;
            assert_eq!(b.due_checks(later, 60_000, 1).len(), 2);
            assert!(b.due_checks(later, 60_000, 1).is_empty(), "both discarded");
            assert_eq!(
                b.end_transaction("pg", c.queue_offset, c.phys_offset, false)?,
                Ended::RolledBack
            );
            store.close()?;
            (a, c)
        };
        let store = Arc::new(MessageStore::open(cfg)?);
        let b = Broker::new(Arc::clone(&store), BrokerConfig::default())?;
        assert!(b.due_checks(later, 60_000, 1).is_empty(), "not checked again");
        assert_eq!(
            b.end_transaction("pg", c.queue_offset, c.phys_offset, true)?,
            Ended::AlreadyResolved
        );
        assert_eq!(
            b.end_transaction("pg", a.queue_offset, a.phys_offset, true)?,
            Ended::Committed
        );
        assert_eq!(store.max_offset("Real", 1), 1);
        Ok(())
    }

    /// A committed transactional message with a delivery time is
    /// delivered then, not at the commit.
    #[test]
    fn a_committed_message_with_a_delivery_time_waits_for_it() -> Result<()> {
        let dir = tempfile::tempdir().map_err(|e| BrokerError::Io("tmp".into(), e))?;
        let store = Arc::new(MessageStore::open(StoreConfig::for_tests(dir.path()))?);
        let b = Broker::new(Arc::clone(&store), BrokerConfig::default())?;
        b.create_topic("Real", 2)?;
        let props = properties::encode([("TRAN_MSG", "true"), ("PGROUP", "pg"), ("TIMER_DELAY_SEC", "10")]);
        let mut m = MessageInput::new("Real", 1, b"later", props.as_bytes());
        m.sys_flag = sysflag::TRANSACTION_PREPARED;
        let h = b.append_half(&m)?;
        assert_eq!(
            b.end_transaction("pg", h.queue_offset, h.phys_offset, true)?,
            Ended::Committed
        );
        assert_eq!(store.max_offset("Real", 1), 0, "not before its time");
        b.deliver_due_timers(rokka_store::now_ms() + 11_000);
        assert_eq!(store.max_offset("Real", 1), 1);
        Ok(())
    }

    /// A scan hands out at most `per_scan` checks (each a copy of its
    /// message); the rest are left for the scans after it.
    #[test]
    fn a_scan_checks_at_most_its_budget() -> Result<()> {
        let dir = tempfile::tempdir().map_err(|e| BrokerError::Io("tmp".into(), e))?;
        let store = Arc::new(MessageStore::open(StoreConfig::for_tests(dir.path()))?);
        let b = Broker::new(Arc::clone(&store), BrokerConfig::default())?;
        b.create_topic("Real", 2)?;
        for i in 0..5u8 {
            half(&b, &[i])?;
        }
        let later = rokka_store::now_ms() + 61_000;
        let round = |n| -> Vec<u64> {
            b.due_checks_within(later, 60_000, 10, n)
                .iter()
                .map(|d| d.half_offset)
                .collect()
        };
        // Two a scan, round the five: the halves after the first two are
        // not left waiting while those stay unanswered.
        assert_eq!(round(2), [0, 1]);
        assert_eq!(round(2), [2, 3]);
        assert_eq!(round(2), [4]);
        assert_eq!(round(2), [0, 1]);
        assert_eq!(round(10), [2, 3, 4]);
        assert_eq!(round(10).len(), 5);
        Ok(())
    }

    #[test]
    fn a_half_immune_for_long_holds_up_no_later_check() -> Result<()> {
        let dir = tempfile::tempdir().map_err(|e| BrokerError::Io("tmp".into(), e))?;
        let store = Arc::new(MessageStore::open(StoreConfig::for_tests(dir.path()))?);
        let b = Broker::new(Arc::clone(&store), BrokerConfig::default())?;
        b.create_topic("Real", 2)?;
        for immunity in ["9223372036854775807", "1000000000"] {
            let props = properties::encode([
                ("TRAN_MSG", "true"),
                ("PGROUP", "pg"),
                ("UNIQ_KEY", "IMMUNE"),
                ("CHECK_IMMUNITY_TIME_IN_SECONDS", immunity),
            ]);
            let mut m = MessageInput::new("Real", 1, b"immune", props.as_bytes());
            m.sys_flag = sysflag::TRANSACTION_PREPARED;
            b.append_half(&m)?;
        }
        let later = half(&b, b"plain")?;
        // (An immunity in seconds that overflows milliseconds saturates.)
        let due = b.due_checks(rokka_store::now_ms() + 61_000, 60_000, 5);
        let offsets: Vec<u64> = due.iter().map(|d| d.half_offset).collect();
        assert_eq!(offsets, vec![later.queue_offset]);
        // Past an hour every immunity has run out: both are checked then.
        let due = b.due_checks(rokka_store::now_ms() + 3_700_000, 60_000, 5);
        assert_eq!(due.len(), 3);
        Ok(())
    }
}

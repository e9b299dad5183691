//! Arbitrary delivery times (RocketMQ 5 timer messages): `TIMER_DELAY_SEC`,
//! `TIMER_DELAY_MS` (relative to arrival), `TIMER_DELIVER_MS` or
//! `__STARTDELIVERTIME` (absolute ms), in that precedence. Such a message
//! waits in `rmq_sys_wheel_timer` (queue 0) with its real topic and queue and
//! its absolute delivery time; an in-memory heap orders the waiting ones by
//! time. A delivered one gets an op record (`rmq_sys_timer_op`, body
//! `"<offset>,"`), from which a restart rebuilds the heap, so nothing is
//! delivered twice beyond an interrupted delivery (at least once).

use std::cmp::Reverse;
use std::collections::{BTreeSet, BinaryHeap};
use std::sync::Mutex;

use rokka_store::record::properties;
use rokka_store::{Entry, MessageInput};

use crate::schedule::{without, REAL_QID, REAL_TOPIC};
use crate::{Broker, BrokerError, Result};

pub const TIMER_TOPIC: &str = "rmq_sys_wheel_timer";
pub const TIMER_OP_TOPIC: &str = "rmq_sys_timer_op";
/// The absolute delivery time the broker stores with a timer message.
pub const DELIVER_AT: &str = "TIMER_DELIVER_MS";
const TIMER_PROPS: [&str; 4] = [
    "TIMER_DELAY_SEC",
    "TIMER_DELAY_MS",
    "TIMER_DELIVER_MS",
    "__STARTDELIVERTIME",
];

#[derive(Debug, Default)]
pub struct Timers {
    state: Mutex<TimerState>,
}

#[derive(Debug, Default)]
struct TimerState {
    loaded: bool,
    /// (delivery time, queue offset, CommitLog offset) of waiting messages.
    heap: BinaryHeap<Reverse<(i64, u64, u64)>>,
}

/// The timer properties a send may carry (TIMER_DELAY_SEC, TIMER_DELAY_MS,
/// TIMER_DELIVER_MS, __STARTDELIVERTIME).
pub const TIMER_PROPERTIES: [&str; 4] = TIMER_PROPS;

/// The absolute delivery time a send's `props` ask for, if any (`now_ms` =
/// arrival; TIMER_DELAY_SEC, then TIMER_DELAY_MS, then TIMER_DELIVER_MS,
/// then the legacy __STARTDELIVERTIME). Err names the first of Apache's
/// three that is present but not a number (the send is refused
/// MESSAGE_ILLEGAL, as Apache's WHEEL_TIMER_MSG_ILLEGAL).
pub fn requested_time(props: &[u8], now_ms: i64) -> std::result::Result<Option<i64>, &'static str> {
    let num = |k: &'static str| match properties::get(props, k) {
        None => Ok(None),
        Some(v) => std::str::from_utf8(v)
            .ok()
            .and_then(|v| v.trim().parse::<i64>().ok())
            .map(Some)
            .ok_or(k),
    };
    let (sec, ms, at) = (num(TIMER_PROPS[0])?, num(TIMER_PROPS[1])?, num(TIMER_PROPS[2])?);
    Ok(sec
        .map(|s| now_ms.saturating_add(s.saturating_mul(1000)))
        .or_else(|| ms.map(|m| now_ms.saturating_add(m)))
        .or(at)
        .or_else(|| num(TIMER_PROPS[3]).ok().flatten()))
}

/// [`requested_time`] of a stored message (checked when it was sent).
pub fn deliver_at(props: &[u8], now_ms: i64) -> Option<i64> {
    requested_time(props, now_ms).ok().flatten()
}

/// Whether a delivery failed for good: its topic gone (auto-creation off)
/// or without the queue, the message too large for it now, its topic name
/// invalid. Anything else may clear up and is tried again.
fn never_deliverable(e: &BrokerError) -> bool {
    use rokka_store::StoreError as S;
    matches!(
        e,
        BrokerError::UnknownTopic(_)
            | BrokerError::UnknownPartition { .. }
            | BrokerError::Store(S::MessageTooLarge { .. } | S::PropertiesTooLarge(_) | S::InvalidTopic(_))
    )
}

impl Broker {
    /// Cluster mode, a new master: the timer state is loaded again from
    /// everything its log holds (as a replica it may have loaded early).
    pub(crate) fn reload_timers(&self) {
        *self.timers.state.lock().unwrap_or_else(|p| p.into_inner()) = TimerState::default();
    }

    /// The waiting timer messages, loaded at first use from the whole log
    /// (everything written, whatever the read limit: in cluster mode a
    /// starting node reads nothing until the set's watermark is known).
    fn timer_state(&self) -> std::sync::MutexGuard<'_, TimerState> {
        let mut st = self.timers.state.lock().unwrap_or_else(|p| p.into_inner());
        if !st.loaded {
            st.loaded = true;
            let mut delivered = BTreeSet::new();
            let (mut at, end) = (
                self.store.min_offset(TIMER_OP_TOPIC, 0),
                self.store.written_max_offset(TIMER_OP_TOPIC, 0),
            );
            while at < end {
                let read = self.store.read_written(TIMER_OP_TOPIC, 0, at, 256, 1 << 20);
                if read.entries.is_empty() {
                    break;
                }
                for e in &read.entries {
                    if let Ok(Entry::Message(m)) = e.decode() {
                        delivered.extend(
                            m.body
                                .split(|b| *b == b',')
                                .filter_map(|o| std::str::from_utf8(o).ok()?.trim().parse::<u64>().ok()),
                        );
                    }
                    at = e.cq.base_offset + u64::from(e.cq.count.max(1));
                }
            }
            let (mut at, end) = (
                self.store.min_offset(TIMER_TOPIC, 0),
                self.store.written_max_offset(TIMER_TOPIC, 0),
            );
            while at < end {
                let read = self.store.read_written(TIMER_TOPIC, 0, at, 256, 1 << 20);
                if read.entries.is_empty() {
                    break;
                }
                for e in &read.entries {
                    let off = e.cq.base_offset;
                    if let (false, Ok(Entry::Message(m))) = (delivered.contains(&off), e.decode()) {
                        let due = deliver_at(&m.properties, m.store_timestamp).unwrap_or(m.store_timestamp);
                        st.heap.push(Reverse((due, off, m.phys_offset)));
                    }
                    at = off + u64::from(e.cq.count.max(1));
                }
            }
        }
        st
    }

    /// Whether a message may wait in the timer wheel until `due` (ms since
    /// the epoch): TimerTooFar past `timer_max_delay_ms` or the log's
    /// retention (retention deletes whole segments by age: a timer message
    /// waiting past it would be deleted before its delivery). Asked at the
    /// send of a transactional message with a delivery time too, which
    /// waits in the wheel only once committed.
    pub fn check_timer_due(&self, due: i64) -> Result<()> {
        let retention_ms = self.store.config().retention_hours.saturating_mul(3_600_000);
        let max_ms = self
            .config
            .timer_max_delay_ms
            .min(retention_ms.saturating_sub(3_600_000).max(60_000)) as i64;
        let due_in_ms = due.saturating_sub(rokka_store::now_ms());
        if due_in_ms > max_ms {
            metrics::counter!("rokka_timer_messages_refused_total").increment(1);
            return Err(BrokerError::TimerTooFar { due_in_ms, max_ms });
        }
        Ok(())
    }

    /// Stores `m` to be delivered to its topic at `due` (ms since the epoch).
    pub fn append_timer(&self, m: &MessageInput<'_>, due: i64) -> Result<rokka_store::AppendResult> {
        self.check_timer_due(due)?;
        for t in [TIMER_TOPIC, TIMER_OP_TOPIC] {
            if self.topics.get(t).is_none_or(|i| i.partitions == 0) {
                self.ensure_own_topic(t, 1)?;
            }
        }
        let mut props = without(
            m.properties,
            &[
                REAL_TOPIC,
                REAL_QID,
                TIMER_PROPS[0],
                TIMER_PROPS[1],
                TIMER_PROPS[2],
                TIMER_PROPS[3],
            ],
        );
        for (k, v) in [
            (REAL_TOPIC, m.topic.to_string()),
            (REAL_QID, m.queue_id.to_string()),
            (DELIVER_AT, due.to_string()),
        ] {
            props.extend_from_slice(k.as_bytes());
            props.push(properties::NAME_VALUE_SEPARATOR);
            props.extend_from_slice(v.as_bytes());
            props.push(properties::PROPERTY_SEPARATOR);
        }
        let waiting = MessageInput {
            topic: TIMER_TOPIC,
            queue_id: 0,
            properties: &props,
            ..m.clone()
        };
        let mut st = self.timer_state();
        let r = self
            .append_messages(std::slice::from_ref(&waiting))?
            .into_iter()
            .next()
            .ok_or_else(|| BrokerError::InvalidPartitions("empty append".into()))?;
        st.heap.push(Reverse((due, r.queue_offset, r.phys_offset)));
        metrics::gauge!("rokka_timer_messages_pending").set(st.heap.len() as f64);
        Ok(r)
    }

    /// Delivers the timer messages due at `now_ms`; how many.
    pub fn deliver_due_timers(&self, now_ms: i64) -> usize {
        /// Due timer messages one pass (every 100 ms) delivers at most.
        const MAX_DELIVERIES_PER_PASS: usize = 4096;
        // Only where appends are taken (cluster mode: the set's master; a
        // node that becomes master loads the state then): a replica would
        // retry every due timer at every tick, its state never refreshed.
        if self.topics.get(TIMER_TOPIC).is_none() || !self.leads_here() {
            return 0;
        }
        let mut st = self.timer_state();
        let mut n = 0;
        let mut handled = 0;
        while let Some(Reverse((due, off, phys))) = st.heap.peek().copied() {
            // At most a pass's worth under the state's lock (after a long
            // stop millions may be due; sends of timer messages wait for
            // the lock): the rest at the next tick.
            if due > now_ms || handled >= MAX_DELIVERIES_PER_PASS {
                break;
            }
            handled += 1;
            // (Bounded as stored entries are: it may predate a lower
            // max_message_bytes.)
            let m = match self.store.read_stored_at(phys).map(|b| rokka_store::decode_entry(&b)) {
                Some(Ok(Entry::Message(m))) => m,
                _ => {
                    // Gone (retention): nothing to deliver.
                    st.heap.pop();
                    continue;
                }
            };
            let cleaned = without(&m.user_properties(), &[DELIVER_AT]);
            let view = rokka_store::MessageView {
                properties: bytes::Bytes::from(cleaned),
                ..m
            };
            let op = format!("{off},");
            let props = properties::encode([(properties::TAGS, "d")]);
            let delivered = match self.deliver_view(&view) {
                Ok(()) => true,
                // Storage trouble, the topic limit reached for now, every
                // set draining: the heap keeps it, tried next tick.
                Err(e) if !never_deliverable(&e) => {
                    tracing::warn!(error = %e, "timer message not delivered yet");
                    break;
                }
                // It will never go through (its topic gone, too large for
                // it now): dropped with its op record, so it does not hold
                // up every later timer message, now or after a restart.
                Err(e) => {
                    tracing::error!(offset = off, error = %e, "timer message cannot be delivered: dropped");
                    metrics::counter!("rokka_timer_messages_dropped_total").increment(1);
                    false
                }
            };
            let op_done =
                self.append_messages(&[MessageInput::new(TIMER_OP_TOPIC, 0, op.as_bytes(), props.as_bytes())]);
            if let Err(e) = op_done {
                tracing::warn!(error = %e, "timer message not delivered yet");
                break;
            }
            st.heap.pop();
            if delivered {
                n += 1;
            }
        }
        metrics::gauge!("rokka_timer_messages_pending").set(st.heap.len() as f64);
        n
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::BrokerConfig;
    use rokka_store::{MessageStore, StoreConfig};

    /// A timer message that can never be delivered (its topic deleted,
    /// auto-creation off) is dropped, not left at the head of the wheel
    /// holding up every later one.
    #[test]
    fn an_undeliverable_timer_message_holds_up_no_other() -> Result<()> {
        let dir = tempfile::tempdir().map_err(|e| BrokerError::Io("tmp".into(), e))?;
        let store = Arc::new(MessageStore::open(StoreConfig::for_tests(dir.path()))?);
        let b = Broker::new(
            store,
            BrokerConfig {
                auto_create_topics: false,
                ..BrokerConfig::default()
            },
        )?;
        b.create_topic("gone", 1)?;
        b.create_topic("kept", 1)?;
        let now = rokka_store::now_ms();
        b.append_timer(&MessageInput::new("gone", 0, b"a", b""), now + 1_000)?;
        b.append_timer(&MessageInput::new("kept", 0, b"b", b""), now + 2_000)?;
        b.delete_topic("gone")?;
        assert_eq!(b.deliver_due_timers(now + 3_000), 1);
        assert_eq!(b.store().max_offset("kept", 0), 1, "the later message was delivered");
        assert_eq!(b.deliver_due_timers(now + 4_000), 0, "nothing left");
        Ok(())
    }

    /// A pass delivers at most 4096 due messages under the state's lock;
    /// the rest at the next.
    #[test]
    fn a_pass_delivers_a_bounded_number_of_due_messages() -> Result<()> {
        let dir = tempfile::tempdir().map_err(|e| BrokerError::Io("tmp".into(), e))?;
        let store = Arc::new(MessageStore::open(StoreConfig::for_tests(dir.path()))?);
        let b = Broker::new(Arc::clone(&store), BrokerConfig::default())?;
        b.create_topic("many", 1)?;
        let now = rokka_store::now_ms();
        for i in 0..4100 {
            b.append_timer(&MessageInput::new("many", 0, b"x", b""), now + 1_000 + i)?;
        }
        assert_eq!(b.deliver_due_timers(now + 10_000), 4096);
        assert_eq!(b.deliver_due_timers(now + 10_000), 4);
        assert_eq!(store.max_offset("many", 0), 4100);
        Ok(())
    }

    #[test]
    fn timer_messages_due_past_retention_are_refused() -> Result<()> {
        let dir = tempfile::tempdir().map_err(|e| BrokerError::Io("tmp".into(), e))?;
        let mut cfg = StoreConfig::for_tests(dir.path());
        cfg.retention_hours = 24;
        let store = Arc::new(MessageStore::open(cfg)?);
        let b = Broker::new(store, BrokerConfig::default())?;
        b.create_topic("T", 1)?;
        let now = rokka_store::now_ms();
        let m = MessageInput::new("T", 0, b"x", b"");
        // Within retention (less an hour): kept for delivery.
        b.append_timer(&m, now + 22 * 3_600_000)?;
        // Due after the segment holding it would be deleted: refused, not
        // silently dropped later.
        match b.append_timer(&m, now + 24 * 3_600_000) {
            Err(BrokerError::TimerTooFar { max_ms, .. }) => assert_eq!(max_ms, 23 * 3_600_000),
            other => panic!("expected TimerTooFar, got {other:?}"),
        }
        // And never more than timer_max_delay_ms (3 days) whatever retention says.
        let dir2 = tempfile::tempdir().map_err(|e| BrokerError::Io("tmp".into(), e))?;
        let mut cfg = StoreConfig::for_tests(dir2.path());
        cfg.retention_hours = 24 * 30;
        let b = Broker::new(Arc::new(MessageStore::open(cfg)?), BrokerConfig::default())?;
        b.create_topic("T", 1)?;
        assert!(matches!(
            b.append_timer(&m, now + 4 * 24 * 3_600_000),
            Err(BrokerError::TimerTooFar { .. })
        ));
        // A client's time in the far past (i64::MIN) is due now, not an
        // overflow (a prepared message's check takes it unfiltered).
        b.check_timer_due(i64::MIN)?;
        assert!(b.check_timer_due(i64::MAX).is_err());
        Ok(())
    }

    /// Only the node that takes appends delivers: a cluster node before
    /// its view (or a replica) leaves due timers to the master, which loads
    /// them when it becomes one.
    #[test]
    fn only_the_leading_node_delivers_timers() -> Result<()> {
        let dir = tempfile::tempdir().map_err(|e| BrokerError::Io("tmp".into(), e))?;
        let store = Arc::new(MessageStore::open(StoreConfig::for_tests(dir.path()))?);
        let b = Broker::new(Arc::clone(&store), BrokerConfig::default())?;
        b.create_topic("T", 1)?;
        let t0 = 1_000_000_000_000i64;
        b.append_timer(&MessageInput::new("T", 0, b"due", b""), t0)?;
        b.await_cluster_view();
        assert_eq!(b.deliver_due_timers(t0 + 1), 0, "no view yet: nothing delivered");
        b.set_cluster_view(crate::cluster_view::ClusterView {
            self_id: 1,
            master: Some(1),
            ..Default::default()
        });
        b.became_master();
        assert_eq!(b.deliver_due_timers(t0 + 1), 1);
        assert_eq!(store.max_offset("T", 0), 1);
        Ok(())
    }

    #[test]
    fn timer_messages_arrive_in_time_order_once_across_a_restart() -> Result<()> {
        let dir = tempfile::tempdir().map_err(|e| BrokerError::Io("tmp".into(), e))?;
        let cfg = StoreConfig::for_tests(dir.path());
        let t0 = 1_000_000_000_000i64;
        {
            let store = Arc::new(MessageStore::open(cfg.clone())?);
            let b = Broker::new(Arc::clone(&store), BrokerConfig::default())?;
            b.create_topic("T", 1)?;
            let late = properties::encode([("TIMER_DELIVER_MS", "1000000009000"), ("u", "1")]);
            let early = properties::encode([("TIMER_DELAY_SEC", "3")]);
            assert_eq!(deliver_at(late.as_bytes(), t0), Some(t0 + 9000));
            assert_eq!(deliver_at(early.as_bytes(), t0), Some(t0 + 3000));
            b.append_timer(&MessageInput::new("T", 0, b"late", late.as_bytes()), t0 + 9000)?;
            b.append_timer(&MessageInput::new("T", 0, b"early", early.as_bytes()), t0 + 3000)?;
            assert_eq!(b.deliver_due_timers(t0 + 2999), 0);
            assert_eq!(
                b.deliver_due_timers(t0 + 3000),
                1,
                "the later-stored, earlier-due one first"
            );
            assert_eq!(store.max_offset("T", 0), 1);
            store.close()?;
        }
        let store = Arc::new(MessageStore::open(cfg)?);
        // As a node starts in cluster mode: nothing readable yet. The state
        // is loaded from what is written all the same.
        store.set_high_watermark(Some(0));
        let b = Broker::new(Arc::clone(&store), BrokerConfig::default())?;
        assert_eq!(b.deliver_due_timers(t0 + 8999), 0, "early is not delivered again");
        assert_eq!(b.deliver_due_timers(t0 + 9000), 1);
        store.set_high_watermark(None);
        let read = store.read("T", 0, 0, 10, 1 << 20);
        let bodies: Vec<Vec<u8>> = read
            .entries
            .iter()
            .filter_map(|e| match e.decode() {
                Ok(Entry::Message(m)) => Some(m.body.to_vec()),
                _ => None,
            })
            .collect();
        assert_eq!(bodies, vec![b"early".to_vec(), b"late".to_vec()]);
        let Ok(Entry::Message(m)) = read.entries[1].decode() else {
            return Err(BrokerError::InvalidPartitions("not a message".into()));
        };
        assert_eq!(
            (m.property("u"), m.property(DELIVER_AT), m.property(REAL_TOPIC)),
            (Some(&b"1"[..]), None, None)
        );
        Ok(())
    }
}

//! Delay levels (RocketMQ's `messageDelayLevel`): a message with the `DELAY`
//! property is stored in `SCHEDULE_TOPIC_XXXX`, one queue per level, with its
//! real topic and queue in `REAL_TOPIC` / `REAL_QID`; a delivery task moves
//! each message to its real queue once `store time + level delay` has passed,
//! and records its progress per level in the consumer-offset table (group
//! `%SCHEDULE%`), so a restart resumes there (at least once: what was
//! delivered after the last offset persist is delivered again).

use std::sync::Arc;
use std::time::Duration;

use rokka_store::record::properties;
use rokka_store::{Entry, MessageInput, MessageView};
use tokio::sync::watch;

use crate::{Broker, Result};

pub const SCHEDULE_TOPIC: &str = "SCHEDULE_TOPIC_XXXX";
/// The offset-table group holding each level's delivery progress.
pub const PROGRESS_GROUP: &str = "%SCHEDULE%";
/// Default delay of each level, 1 … 18 (RocketMQ's `1s 5s 10s 30s 1m … 2h`;
/// `broker.delay_levels_ms` sets others).
pub const LEVELS_MS: [i64; 18] = [
    1_000, 5_000, 10_000, 30_000, 60_000, 120_000, 180_000, 240_000, 300_000, 360_000, 420_000, 480_000, 540_000,
    600_000, 1_200_000, 1_800_000, 3_600_000, 7_200_000,
];
pub const REAL_TOPIC: &str = "REAL_TOPIC";
pub const REAL_QID: &str = "REAL_QID";
pub const DELAY: &str = "DELAY";

/// The delay level a property block asks for: `DELAY` > 0 (the caller
/// clamps it to the configured levels).
pub fn delay_level(props: &[u8]) -> Option<usize> {
    let v = properties::get(props, DELAY)?;
    let n: i64 = std::str::from_utf8(v).ok()?.trim().parse().ok()?;
    (n > 0).then(|| n.min(i64::from(u16::MAX)) as usize)
}

/// `props` without the properties named in `drop`.
pub fn without(props: &[u8], drop: &[&str]) -> Vec<u8> {
    let mut out = Vec::with_capacity(props.len());
    for (k, v) in properties::iter(props) {
        if !drop.iter().any(|d| d.as_bytes() == k) {
            out.extend_from_slice(k);
            out.push(properties::NAME_VALUE_SEPARATOR);
            out.extend_from_slice(v);
            out.push(properties::PROPERTY_SEPARATOR);
        }
    }
    out
}

fn with(mut props: Vec<u8>, k: &str, v: &str) -> Vec<u8> {
    props.extend_from_slice(k.as_bytes());
    props.push(properties::NAME_VALUE_SEPARATOR);
    props.extend_from_slice(v.as_bytes());
    props.push(properties::PROPERTY_SEPARATOR);
    props
}

impl Broker {
    /// Stores `m` in the schedule queue of `level` (1-based) instead of its
    /// topic; it reaches `m.topic` / `m.queue_id` when the level's delay passed.
    pub fn append_delayed(&self, m: &MessageInput<'_>, level: usize) -> Result<rokka_store::AppendResult> {
        let levels = self.config.delay_levels_ms.len().max(1);
        let level = level.clamp(1, levels);
        if self
            .topics
            .get(SCHEDULE_TOPIC)
            .is_none_or(|t| (t.partitions as usize) < levels)
        {
            self.ensure_own_topic(SCHEDULE_TOPIC, levels as u32)?;
        }
        let props = without(m.properties, &[REAL_TOPIC, REAL_QID, DELAY]);
        let props = with(props, DELAY, &level.to_string());
        let props = with(props, REAL_TOPIC, m.topic);
        let props = with(props, REAL_QID, &m.queue_id.to_string());
        let diverted = MessageInput {
            topic: SCHEDULE_TOPIC,
            queue_id: (level - 1) as u32,
            properties: &props,
            ..m.clone()
        };
        let r = self.append_messages(std::slice::from_ref(&diverted))?;
        metrics::counter!("rokka_delayed_messages_total", "level" => level.to_string()).increment(1);
        r.into_iter()
            .next()
            .ok_or_else(|| crate::BrokerError::InvalidPartitions("empty append".into()))
    }

    /// Delivers what is due in every level; the number delivered.
    pub fn deliver_due(&self, now_ms: i64) -> usize {
        if self.topics.get(SCHEDULE_TOPIC).is_none() {
            return 0;
        }
        let mut pending = self.delay_pending.lock().unwrap_or_else(|p| p.into_inner());
        if !self.store.is_leader() {
            // Deliveries of an earlier term are the new master's business
            // (a cut may have taken them): nothing is carried over.
            pending.clear();
            return 0;
        }
        // Below cluster.min_insync_replicas nothing is delivered (client
        // writes are refused too, as Apache's puts): a delivery its
        // replicas cannot hold would wait unconfirmed.
        if self.store.too_few_replicas() {
            return 0;
        }
        let mut delivered = 0;
        for (level, delay) in self.config.delay_levels_ms.iter().enumerate() {
            let delay = *delay as i64;
            let q = level as u32;
            let offsets = self.store.offsets();
            let min = self.store.min_offset(SCHEDULE_TOPIC, q);
            let committed = offsets
                .get(PROGRESS_GROUP, SCHEDULE_TOPIC, q)
                .map_or(min, |o| o.offset)
                .max(min);
            // Deliveries made past the committed progress wait for the
            // set's replicas (cluster mode: the offset table ships apart
            // from the log, and progress a new master had without the
            // delivered records lost them); meanwhile delivering goes on
            // after them, never delivering them again.
            let mut at = committed;
            if let Some(&(done, end)) = pending.get(&q) {
                if self.store.is_replicated(end) {
                    offsets.commit(PROGRESS_GROUP, SCHEDULE_TOPIC, q, done, "");
                    pending.remove(&q);
                }
                at = at.max(done);
            }
            let max = self.store.max_offset(SCHEDULE_TOPIC, q);
            while at < max {
                let read = self.store.read(SCHEDULE_TOPIC, q, at, 64, 1 << 20);
                if read.entries.is_empty() {
                    break;
                }
                let mut stop = false;
                let mut done = at;
                for e in &read.entries {
                    let next = e.cq.base_offset + u64::from(e.cq.count.max(1));
                    if let Ok(Entry::Message(m)) = e.decode() {
                        if m.store_timestamp + delay > now_ms {
                            stop = true;
                            break;
                        }
                        match self.deliver_view(&m) {
                            Ok(()) => delivered += 1,
                            // Storage trouble: try again next round.
                            Err(err) if err.is_transient() => {
                                tracing::warn!(level = level + 1, error = %err, "delayed message not delivered yet");
                                stop = true;
                                break;
                            }
                            // It will never go through (too large for its
                            // topic now, an invalid real topic): skipping it
                            // keeps it from holding up its whole level.
                            Err(err) => {
                                tracing::error!(level = level + 1, offset = e.cq.base_offset, error = %err, "delayed message cannot be delivered: dropped");
                                metrics::counter!("rokka_delayed_messages_dropped_total").increment(1);
                            }
                        }
                    }
                    done = next;
                }
                // Progress moves only past deliveries that are durable (sync
                // flush) and held by the set's replicas (cluster mode; else
                // they wait in `delay_pending` for a later pass), so
                // neither a crash nor a failover skips a message.
                if done > at {
                    let end = self.store.commitlog_offsets().1;
                    if let Err(err) = self.store.wait_durable(end) {
                        tracing::warn!(error = %err, "delayed deliveries not durable yet");
                        break;
                    }
                    at = done;
                    if !pending.contains_key(&q) && self.store.is_replicated(end) {
                        offsets.commit(PROGRESS_GROUP, SCHEDULE_TOPIC, q, at, "");
                    } else {
                        pending.insert(q, (at, end));
                    }
                }
                if stop {
                    break;
                }
            }
            metrics::gauge!("rokka_delayed_messages_pending", "level" => (level + 1).to_string())
                .set(max.saturating_sub(at) as f64);
        }
        delivered
    }

    /// Appends a waiting message to its real topic and queue.
    pub(crate) fn deliver_view(&self, m: &MessageView) -> Result<()> {
        let real = m
            .property(REAL_TOPIC)
            .and_then(|t| std::str::from_utf8(t).ok())
            .unwrap_or_default()
            .to_string();
        let qid: u32 = m
            .property(REAL_QID)
            .and_then(|t| std::str::from_utf8(t).ok())
            .and_then(|t| t.parse().ok())
            .unwrap_or(0);
        if real.is_empty() {
            return Ok(()); // nothing to deliver to: dropped, as RocketMQ does
        }
        let info = self.topic_or_create(&real, true, Some(qid.saturating_add(1)))?;
        let partitions = info.map_or(0, |i| i.partitions);
        let props = without(&m.user_properties(), &[REAL_TOPIC, REAL_QID, DELAY]);
        let input = m.as_input(&real, if qid < partitions { qid } else { 0 }, &props);
        self.append_messages(std::slice::from_ref(&input))?;
        Ok(())
    }
}

/// Runs the delivery every 100 ms until `shutdown`.
pub async fn run(broker: Arc<Broker>, mut shutdown: watch::Receiver<bool>) {
    let mut tick = tokio::time::interval(Duration::from_millis(100));
    let retention_every = broker.store().config().retention_check_interval_ms.max(100);
    let mut next_retention = 0i64;
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = shutdown.changed() => return,
        }
        let b = Arc::clone(&broker);
        let retention_due = rokka_store::now_ms() >= next_retention;
        if retention_due {
            next_retention = rokka_store::now_ms() + retention_every as i64;
        }
        let n = tokio::task::spawn_blocking(move || {
            let now = rokka_store::now_ms();
            if retention_due {
                b.apply_topic_retention(now);
            }
            b.deliver_due(now) + b.deliver_due_timers(now)
        })
        .await
        .unwrap_or(0);
        if n > 0 {
            tracing::debug!(delivered = n, "delayed messages delivered");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::BrokerConfig;
    use rokka_store::{MessageStore, StoreConfig};

    /// A broker on a fresh test store (the directory lives as long as it).
    fn broker() -> Result<(tempfile::TempDir, Arc<MessageStore>, Broker)> {
        let dir = tempfile::tempdir().map_err(|e| crate::BrokerError::Io("tmp".into(), e))?;
        let store = Arc::new(MessageStore::open(StoreConfig::for_tests(dir.path()))?);
        let b = Broker::new(Arc::clone(&store), BrokerConfig::default())?;
        Ok((dir, store, b))
    }

    /// Cluster mode: the delay level's progress moves only once the set's
    /// replicas hold the delivered message (the offset table ships apart
    /// from the log: progress ahead of the records lost the message at a
    /// failover).
    #[test]
    fn progress_waits_for_the_replicas_to_hold_the_delivery() -> Result<()> {
        let (_dir, store, b) = broker()?;
        b.create_topic("T", 1)?;
        let props = properties::encode([("DELAY", "1")]);
        let m = MessageInput::new("T", 0, b"later", props.as_bytes());
        let r = b.append_delayed(&m, 1)?;
        store.require_replica_acks(Some(50));
        store.set_acked(store.log_end());
        let progress = || store.offsets().get(PROGRESS_GROUP, SCHEDULE_TOPIC, 0).map(|o| o.offset);
        assert_eq!(b.deliver_due(r.store_timestamp + 1_000), 1);
        assert_eq!(
            progress(),
            None,
            "progress moved past a delivery the replicas do not hold"
        );
        // Not delivered again while it waits.
        assert_eq!(b.deliver_due(r.store_timestamp + 1_000), 0);
        assert_eq!(store.max_offset("T", 0), 1, "delivered once");
        // The replicas hold it: the next pass moves the progress.
        store.set_acked(store.log_end());
        assert_eq!(b.deliver_due(r.store_timestamp + 1_000), 0);
        assert_eq!(progress(), Some(1));
        // Below min_insync_replicas nothing is delivered.
        b.append_delayed(&m, 1)?;
        store.set_too_few_replicas(true);
        assert_eq!(b.deliver_due(rokka_store::now_ms() + 2_000), 0);
        store.set_too_few_replicas(false);
        store.set_acked(u64::MAX);
        assert_eq!(b.deliver_due(rokka_store::now_ms() + 2_000), 1);
        Ok(())
    }

    #[test]
    fn delayed_messages_reach_their_topic_after_their_level() -> Result<()> {
        let (_dir, store, b) = broker()?;
        b.create_topic("T", 2)?;
        let props = properties::encode([("DELAY", "2"), ("KEYS", "k"), ("user", "u")]);
        let mut m = MessageInput::new("T", 1, b"later", props.as_bytes());
        m.born_timestamp = 42;
        let r = b.append_delayed(&m, delay_level(props.as_bytes()).unwrap_or(0))?;
        assert_eq!(store.max_offset("T", 1), 0, "not visible yet");
        assert_eq!(b.deliver_due(r.store_timestamp + 4_999), 0);
        assert_eq!(b.deliver_due(r.store_timestamp + 5_000), 1);
        assert_eq!(b.deliver_due(r.store_timestamp + 9_000), 0, "delivered once");
        let read = store.read("T", 1, 0, 10, 1 << 20);
        let Ok(Entry::Message(got)) = read.entries[0].decode() else {
            panic!("not a message");
        };
        assert_eq!(&got.body[..], b"later");
        assert_eq!(got.born_timestamp, 42);
        assert_eq!(got.property("user"), Some(&b"u"[..]));
        assert_eq!(got.property(DELAY), None);
        assert_eq!(got.property(REAL_TOPIC), None);
        assert_eq!(
            store.offsets().get(PROGRESS_GROUP, SCHEDULE_TOPIC, 1).map(|o| o.offset),
            Some(1),
            "progress is durable state"
        );
        Ok(())
    }
}

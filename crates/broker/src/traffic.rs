//! Per-topic traffic counters (messages and bytes in and out, per
//! protocol) as cached metric handles.
//!
//! `metrics::counter!(name, "topic" => topic.to_string())` on every
//! request allocates the label's String and a label vector and looks the
//! series up in the recorder's registry; on the produce, fetch, send and
//! pull paths that was paid per request. Here a topic's pair of handles is
//! made once and then found by `&str` under a read lock: a request's
//! update is a hash of the name and two atomic adds, with no allocation.
//!
//! Concurrency: any thread; the map is behind an `RwLock` taken for
//! writing only when a topic is first seen or forgotten. Budget: at most
//! `max_topics` entries (the broker's topic cap); past it the map starts
//! over (the series stay registered in the recorder, handles are made
//! again on next use). Deleted topics are forgotten. Handles from an
//! earlier [`crate::hot_metrics`] epoch are made again, so a topic idle
//! past `metrics.idle_timeout_ms` (its series dropped by the recorder)
//! counts into a registered series when it is used again.

use std::collections::HashMap;
use std::sync::RwLock;

use metrics::Counter;

/// One topic's pair of counters.
struct TopicTraffic {
    messages: Counter,
    bytes: Counter,
    /// The [`crate::hot_metrics::epoch`] they were made in.
    epoch: u64,
}

/// One family of per-topic counters (e.g. Kafka in).
pub struct TopicCounters {
    messages: &'static str,
    bytes: &'static str,
    max_topics: usize,
    map: RwLock<HashMap<String, TopicTraffic>>,
}

impl TopicCounters {
    pub fn new(messages: &'static str, bytes: &'static str, max_topics: usize) -> TopicCounters {
        TopicCounters {
            messages,
            bytes,
            max_topics: max_topics.max(1),
            map: RwLock::new(HashMap::new()),
        }
    }

    /// Counts `messages` and `bytes` for `topic`: under the read lock once
    /// its handles exist (no clone, no allocation), made on first use.
    pub fn record(&self, topic: &str, messages: u64, bytes: u64) {
        let epoch = crate::hot_metrics::epoch();
        if let Some(t) = self.map.read().unwrap_or_else(|p| p.into_inner()).get(topic) {
            if t.epoch == epoch {
                t.messages.increment(messages);
                t.bytes.increment(bytes);
                return;
            }
        }
        let mut map = self.map.write().unwrap_or_else(|p| p.into_inner());
        // Read again under the lock: a thread that read the epoch before it
        // moved must not replace a handle made in the new one.
        let epoch = crate::hot_metrics::epoch();
        if !map.contains_key(topic) && map.len() >= self.max_topics {
            map.clear();
        }
        let n = map.len();
        let make = || TopicTraffic {
            messages: metrics::counter!(self.messages, "topic" => topic.to_string()),
            bytes: metrics::counter!(self.bytes, "topic" => topic.to_string()),
            epoch,
        };
        if map.get(topic).is_none_or(|t| t.epoch != epoch) {
            map.insert(topic.to_string(), make());
        }
        let Some(t) = map.get(topic) else { return };
        t.messages.increment(messages);
        t.bytes.increment(bytes);
        if map.len() != n {
            self.gauge(map.len());
        }
    }

    fn gauge(&self, n: usize) {
        metrics::gauge!("rokka_topic_metric_handles", "family" => self.messages).set(n as f64);
    }

    /// Drops a deleted topic's handles.
    pub fn forget(&self, topic: &str) {
        let mut map = self.map.write().unwrap_or_else(|p| p.into_inner());
        if map.remove(topic).is_some() {
            self.gauge(map.len());
        }
    }

    /// Topics with cached handles.
    pub fn len(&self) -> usize {
        self.map.read().unwrap_or_else(|p| p.into_inner()).len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// A counter labelled by consumer group, and by topic too when
/// `topic_label` is set (gRPC messages received and acked), as kept handles
/// found by `&str`: the same bounds and epochs as [`TopicCounters`] (at
/// most `max` series; past it the map starts over).
pub struct GroupCounter {
    name: &'static str,
    topic_label: bool,
    max: usize,
    kept: RwLock<GroupHandles>,
}

/// group → topic ("" without the label) → handle and the epoch it was made
/// in, and how many handles that is.
#[derive(Default)]
struct GroupHandles {
    map: HashMap<String, HashMap<String, (Counter, u64)>>,
    len: usize,
}

impl GroupCounter {
    pub fn new(name: &'static str, topic_label: bool, max: usize) -> GroupCounter {
        GroupCounter {
            name,
            topic_label,
            max: max.max(1),
            kept: RwLock::new(GroupHandles::default()),
        }
    }

    /// Adds `n` for `group` (and `topic`, ignored without the label).
    pub fn add(&self, group: &str, topic: &str, n: u64) {
        let topic = if self.topic_label { topic } else { "" };
        let epoch = crate::hot_metrics::epoch();
        if let Some((c, made)) = self
            .kept
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .map
            .get(group)
            .and_then(|t| t.get(topic))
        {
            if *made == epoch {
                c.increment(n);
                return;
            }
        }
        let mut kept = self.kept.write().unwrap_or_else(|p| p.into_inner());
        let epoch = crate::hot_metrics::epoch();
        if let Some((c, made)) = kept.map.get(group).and_then(|t| t.get(topic)) {
            if *made == epoch {
                c.increment(n);
                return;
            }
        }
        let known = kept.map.get(group).is_some_and(|t| t.contains_key(topic));
        if !known && kept.len >= self.max {
            *kept = GroupHandles::default();
        }
        let c = if self.topic_label {
            metrics::counter!(self.name, "topic" => topic.to_string(), "group" => group.to_string())
        } else {
            metrics::counter!(self.name, "group" => group.to_string())
        };
        c.increment(n);
        let added = kept
            .map
            .entry(group.to_string())
            .or_default()
            .insert(topic.to_string(), (c, epoch))
            .is_none();
        if added {
            kept.len += 1;
            self.gauge(kept.len);
        }
    }

    /// Drops a deleted topic's handles (with the topic label).
    pub fn forget_topic(&self, topic: &str) {
        if !self.topic_label {
            return;
        }
        let mut kept = self.kept.write().unwrap_or_else(|p| p.into_inner());
        let mut removed = 0;
        kept.map.retain(|_, by_topic| {
            removed += usize::from(by_topic.remove(topic).is_some());
            !by_topic.is_empty()
        });
        if removed > 0 {
            kept.len -= removed;
            self.gauge(kept.len);
        }
    }

    fn gauge(&self, n: usize) {
        metrics::gauge!("rokka_topic_metric_handles", "family" => self.name).set(n as f64);
    }

    /// Series with kept handles.
    pub fn len(&self) -> usize {
        self.kept.read().unwrap_or_else(|p| p.into_inner()).len
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Every per-topic traffic family the frontends count.
pub struct Traffic {
    pub kafka_in: TopicCounters,
    pub kafka_out: TopicCounters,
    pub rocketmq_in: TopicCounters,
    pub rocketmq_out: TopicCounters,
    pub rocketmq5_sent: TopicCounters,
    /// `rokka_rocketmq5_messages_received_total{topic,group}`.
    pub rocketmq5_received: GroupCounter,
    /// `rokka_rocketmq5_messages_acked_total{group}`.
    pub rocketmq5_acked: GroupCounter,
}

impl std::fmt::Debug for Traffic {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut d = f.debug_struct("Traffic");
        for c in self.families() {
            d.field(c.messages, &c.len());
        }
        d.finish()
    }
}

impl Traffic {
    pub fn new(max_topics: usize) -> Traffic {
        Traffic {
            kafka_in: TopicCounters::new(
                "rokka_kafka_messages_in_total",
                "rokka_kafka_bytes_in_total",
                max_topics,
            ),
            kafka_out: TopicCounters::new(
                "rokka_kafka_messages_out_total",
                "rokka_kafka_bytes_out_total",
                max_topics,
            ),
            rocketmq_in: TopicCounters::new(
                "rokka_rocketmq_messages_in_total",
                "rokka_rocketmq_bytes_in_total",
                max_topics,
            ),
            rocketmq_out: TopicCounters::new(
                "rokka_rocketmq_messages_out_total",
                "rokka_rocketmq_bytes_out_total",
                max_topics,
            ),
            rocketmq5_sent: TopicCounters::new(
                "rokka_rocketmq5_messages_sent_total",
                "rokka_rocketmq5_bytes_sent_total",
                max_topics,
            ),
            rocketmq5_received: GroupCounter::new("rokka_rocketmq5_messages_received_total", true, max_topics),
            rocketmq5_acked: GroupCounter::new("rokka_rocketmq5_messages_acked_total", false, max_topics),
        }
    }

    fn families(&self) -> [&TopicCounters; 5] {
        [
            &self.kafka_in,
            &self.kafka_out,
            &self.rocketmq_in,
            &self.rocketmq_out,
            &self.rocketmq5_sent,
        ]
    }

    /// A deleted topic's handles, in every family.
    pub fn forget(&self, topic: &str) {
        for f in self.families() {
            f.forget(topic);
        }
        self.rocketmq5_received.forget_topic(topic);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use metrics::{Gauge, Histogram, Key, KeyName, Metadata, Recorder, SharedString, Unit};
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::{Arc, Mutex};

    /// Counters by "name{label=value,...}" (labels in the order given),
    /// each registration of a series counted.
    #[derive(Default)]
    struct Counting {
        series: Mutex<HashMap<String, Arc<AtomicU64>>>,
        registrations: AtomicU64,
    }

    impl Counting {
        fn get(&self, name: &str, labels: &str) -> u64 {
            let series = self.series.lock().unwrap_or_else(|p| p.into_inner());
            series
                .get(&format!("{name}{{{labels}}}"))
                .map_or(0, |c| c.load(Ordering::Relaxed))
        }
    }

    impl Recorder for Counting {
        fn describe_counter(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
        fn describe_gauge(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
        fn describe_histogram(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
        fn register_counter(&self, key: &Key, _: &Metadata<'_>) -> Counter {
            self.registrations.fetch_add(1, Ordering::Relaxed);
            let labels: Vec<String> = key.labels().map(|l| format!("{}={}", l.key(), l.value())).collect();
            let id = format!("{}{{{}}}", key.name(), labels.join(","));
            let mut series = self.series.lock().unwrap_or_else(|p| p.into_inner());
            Counter::from_arc(Arc::clone(series.entry(id).or_default()))
        }
        fn register_gauge(&self, _: &Key, _: &Metadata<'_>) -> Gauge {
            Gauge::noop()
        }
        fn register_histogram(&self, _: &Key, _: &Metadata<'_>) -> Histogram {
            Histogram::noop()
        }
    }

    #[test]
    fn a_topic_idle_past_an_epoch_counts_into_a_registered_series_again() {
        let _serial = crate::hot_metrics::EPOCH_TESTS
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        let (first, second) = (Counting::default(), Counting::default());
        let c = TopicCounters::new("t_messages_total", "t_bytes_total", 8);
        metrics::with_local_recorder(&first, || c.record("a", 2, 100));
        assert_eq!(first.get("t_messages_total", "topic=a"), 2);
        // The recorder dropped the series (idle): within the epoch the kept
        // handle still counts into the dropped one...
        metrics::with_local_recorder(&second, || c.record("a", 1, 1));
        assert_eq!(second.get("t_messages_total", "topic=a"), 0);
        // ...and in the next one into a series registered again.
        crate::hot_metrics::new_epoch();
        metrics::with_local_recorder(&second, || c.record("a", 1, 1));
        assert_eq!(second.get("t_messages_total", "topic=a"), 1);
        assert_eq!(second.get("t_bytes_total", "topic=a"), 1);
        assert_eq!(c.len(), 1);
    }

    #[test]
    fn group_counters_count_per_group_and_topic_and_stay_bounded() {
        let _serial = crate::hot_metrics::EPOCH_TESTS
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        let recorder = Counting::default();
        metrics::with_local_recorder(&recorder, || {
            let received = GroupCounter::new("t_received_total", true, 2);
            received.add("g1", "a", 3);
            received.add("g1", "a", 2);
            received.add("g1", "b", 1);
            assert_eq!(received.len(), 2);
            assert_eq!(recorder.registrations.load(Ordering::Relaxed), 2);
            // A third series past the cap starts the map over.
            received.add("g2", "a", 1);
            assert_eq!(received.len(), 1);
            received.add("g2", "b", 1);
            // A deleted topic's series go.
            received.forget_topic("a");
            assert_eq!(received.len(), 1);
            let acked = GroupCounter::new("t_acked_total", false, 8);
            acked.add("g1", "a", 1);
            acked.add("g1", "b", 1);
            assert_eq!(acked.len(), 1, "no topic label: one series per group");
        });
        assert_eq!(recorder.get("t_received_total", "topic=a,group=g1"), 5);
        assert_eq!(recorder.get("t_received_total", "topic=b,group=g1"), 1);
        assert_eq!(recorder.get("t_received_total", "topic=a,group=g2"), 1);
        assert_eq!(recorder.get("t_received_total", "topic=b,group=g2"), 1);
        assert_eq!(recorder.get("t_acked_total", "group=g1"), 2);
    }

    #[test]
    fn cached_handles_count_per_topic_and_stay_bounded() {
        let _serial = crate::hot_metrics::EPOCH_TESTS
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        let recorder = Counting::default();
        metrics::with_local_recorder(&recorder, || {
            let c = TopicCounters::new("t_messages_total", "t_bytes_total", 2);
            c.record("a", 2, 100);
            c.record("a", 3, 50);
            c.record("b", 1, 10);
            assert_eq!(c.len(), 2);
            // Topic "a" registered its pair once, not per record.
            assert_eq!(recorder.registrations.load(Ordering::Relaxed), 4);
            // A third topic past the cap starts the map over.
            c.record("c", 1, 1);
            assert_eq!(c.len(), 1);
            c.record("a", 1, 1);
            c.forget("a");
            c.forget("c");
            assert!(c.is_empty());
        });
        assert_eq!(recorder.get("t_messages_total", "topic=a"), 6);
        assert_eq!(recorder.get("t_bytes_total", "topic=a"), 151);
        assert_eq!(recorder.get("t_messages_total", "topic=b"), 1);
        assert_eq!(recorder.get("t_bytes_total", "topic=c"), 1);
    }
}

//! Consumer-group membership across the protocols: which RocketMQ clients
//! and which Kafka members are in each group, and what they subscribe to.
//! Each frontend reports its own members; when one side changes while the
//! other side has members, the other frontend is told (RocketMQ clients get
//! NOTIFY_CONSUMER_IDS_CHANGED, the Kafka group rebalances). In such a mixed
//! group Rokka is the assignment authority: queues are allocated with
//! RocketMQ's averaging strategy over all member ids, which is what RocketMQ
//! clients compute locally by default.

use std::collections::{BTreeSet, HashMap};
use std::sync::Mutex;

use tokio::sync::mpsc;

/// One group's members on each side.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct GroupMembers {
    pub rocketmq: BTreeSet<String>,
    pub kafka: BTreeSet<String>,
    /// Topics the RocketMQ members subscribe to (retry topics excluded).
    pub rocketmq_topics: BTreeSet<String>,
    /// Topics the Kafka members subscribe to.
    pub kafka_topics: BTreeSet<String>,
}

impl GroupMembers {
    pub fn is_mixed(&self) -> bool {
        !self.rocketmq.is_empty() && !self.kafka.is_empty()
    }

    /// All member ids, sorted (the order RocketMQ's allocation uses).
    pub fn all_ids(&self) -> Vec<String> {
        let all: BTreeSet<&String> = self.rocketmq.iter().chain(self.kafka.iter()).collect();
        all.into_iter().cloned().collect()
    }
}

#[derive(Debug, Clone, Copy)]
enum Side {
    RocketMq,
    Kafka,
}

#[derive(Debug, Default)]
pub struct Membership {
    groups: Mutex<HashMap<String, GroupMembers>>,
    /// Groups with live Kafka KIP-848 (consumer-protocol) members: the
    /// broker assigns their partitions, so RocketMQ clients, which allocate
    /// queues themselves, cannot share them.
    consumer_protocol: Mutex<BTreeSet<String>>,
    to_kafka: Mutex<Option<mpsc::UnboundedSender<String>>>,
    to_rocketmq: Mutex<Option<mpsc::UnboundedSender<String>>>,
}

impl Membership {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, GroupMembers>> {
        self.groups.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Group names whose RocketMQ side changed while they had Kafka members.
    pub fn kafka_events(&self) -> mpsc::UnboundedReceiver<String> {
        let (tx, rx) = mpsc::unbounded_channel();
        *self.to_kafka.lock().unwrap_or_else(|p| p.into_inner()) = Some(tx);
        rx
    }

    /// Group names whose Kafka side changed while they had RocketMQ members.
    pub fn rocketmq_events(&self) -> mpsc::UnboundedReceiver<String> {
        let (tx, rx) = mpsc::unbounded_channel();
        *self.to_rocketmq.lock().unwrap_or_else(|p| p.into_inner()) = Some(tx);
        rx
    }

    fn tell(chan: &Mutex<Option<mpsc::UnboundedSender<String>>>, group: &str) {
        if let Some(tx) = chan.lock().unwrap_or_else(|p| p.into_inner()).as_ref() {
            let _ = tx.send(group.to_string());
        }
    }

    /// The RocketMQ side of `group` now; the Kafka side is told if it changed.
    pub fn set_rocketmq(&self, group: &str, members: BTreeSet<String>, topics: BTreeSet<String>) {
        self.set(group, Side::RocketMq, members, topics);
    }

    /// The Kafka side of `group` now; the RocketMQ side is told if it changed.
    pub fn set_kafka(&self, group: &str, members: BTreeSet<String>, topics: BTreeSet<String>) {
        self.set(group, Side::Kafka, members, topics);
    }

    fn set(&self, group: &str, side: Side, members: BTreeSet<String>, topics: BTreeSet<String>) {
        let notify = {
            let mut g = self.lock();
            let e = g.entry(group.to_string()).or_default();
            let (mine, my_topics, other) = match side {
                Side::RocketMq => (&mut e.rocketmq, &mut e.rocketmq_topics, &e.kafka),
                Side::Kafka => (&mut e.kafka, &mut e.kafka_topics, &e.rocketmq),
            };
            let changed = *mine != members || *my_topics != topics;
            *mine = members;
            *my_topics = topics;
            let notify = changed && !other.is_empty();
            if e.rocketmq.is_empty() && e.kafka.is_empty() {
                g.remove(group);
            }
            notify
        };
        metrics::gauge!("rokka_mixed_groups").set(self.mixed_count() as f64);
        if notify {
            Self::tell(
                match side {
                    Side::RocketMq => &self.to_kafka,
                    Side::Kafka => &self.to_rocketmq,
                },
                group,
            );
        }
    }

    /// Replaces the set of groups with live KIP-848 members.
    pub fn set_consumer_protocol_groups(&self, groups: BTreeSet<String>) {
        *self.consumer_protocol.lock().unwrap_or_else(|p| p.into_inner()) = groups;
    }

    /// Marks one group as having KIP-848 members (at once, before the
    /// next full refresh).
    pub fn add_consumer_protocol_group(&self, group: &str) {
        self.consumer_protocol
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(group.to_string());
    }

    /// The group's last KIP-848 member left (at once, before the next
    /// full refresh).
    pub fn remove_consumer_protocol_group(&self, group: &str) {
        self.consumer_protocol
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(group);
    }

    pub fn is_consumer_protocol_group(&self, group: &str) -> bool {
        self.consumer_protocol
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .contains(group)
    }

    /// The group's members when it has both kinds (cloned only then: pulls ask).
    pub fn mixed(&self, group: &str) -> Option<GroupMembers> {
        self.lock().get(group).filter(|g| g.is_mixed()).cloned()
    }

    pub fn get(&self, group: &str) -> GroupMembers {
        self.lock().get(group).cloned().unwrap_or_default()
    }

    /// Groups with members on both sides.
    pub fn mixed_count(&self) -> usize {
        self.lock().values().filter(|g| g.is_mixed()).count()
    }
}

/// RocketMQ's `AllocateMessageQueueAveragely`: the indexes (into the sorted
/// queue list of `queues` entries) that member `me` of the sorted `ids` gets.
pub fn allocate_averagely(queues: usize, ids: &[String], me: &str) -> Vec<usize> {
    let Some(index) = ids.iter().position(|i| i == me) else {
        return Vec::new();
    };
    let n = ids.len();
    if queues == 0 {
        return Vec::new();
    }
    let rem = queues % n;
    let average = if queues <= n {
        1
    } else if rem > 0 && index < rem {
        queues / n + 1
    } else {
        queues / n
    };
    let start = if rem > 0 && index < rem {
        index * average
    } else {
        index * average + rem
    };
    let range = average.min(queues.saturating_sub(start));
    (0..range).map(|i| (start + i) % queues).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ids(n: usize) -> Vec<String> {
        (0..n).map(|i| format!("m{i}")).collect()
    }

    #[test]
    fn averaging_matches_rocketmq() {
        // 8 queues over 3 members: 3, 3, 2 (the first `rem` get one more).
        let all = ids(3);
        assert_eq!(allocate_averagely(8, &all, "m0"), vec![0, 1, 2]);
        assert_eq!(allocate_averagely(8, &all, "m1"), vec![3, 4, 5]);
        assert_eq!(allocate_averagely(8, &all, "m2"), vec![6, 7]);
        // More members than queues: one each, the rest none.
        let all = ids(5);
        assert_eq!(allocate_averagely(3, &all, "m2"), vec![2]);
        assert!(allocate_averagely(3, &all, "m4").is_empty());
        assert!(allocate_averagely(3, &all, "stranger").is_empty());
        // Every queue exactly once.
        for n in 1..7 {
            for q in 0..20 {
                let all = ids(n);
                let mut got: Vec<usize> = all.iter().flat_map(|m| allocate_averagely(q, &all, m)).collect();
                got.sort_unstable();
                assert_eq!(got, (0..q).collect::<Vec<_>>(), "{q} queues over {n}");
            }
        }
    }

    #[test]
    fn each_side_hears_about_the_other() {
        let m = Membership::default();
        let mut to_kafka = m.kafka_events();
        let mut to_rmq = m.rocketmq_events();
        let set = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<BTreeSet<_>>();
        m.set_rocketmq("g", set(&["r1"]), set(&["T"]));
        assert!(to_kafka.try_recv().is_err(), "no Kafka members yet");
        m.set_kafka("g", set(&["k1"]), set(&["T"]));
        assert_eq!(to_rmq.try_recv().ok().as_deref(), Some("g"));
        assert!(m.get("g").is_mixed());
        assert_eq!(m.get("g").all_ids(), vec!["k1".to_string(), "r1".to_string()]);
        m.set_rocketmq("g", set(&["r1", "r2"]), set(&["T"]));
        assert_eq!(to_kafka.try_recv().ok().as_deref(), Some("g"));
        m.set_kafka("g", set(&[]), set(&[]));
        m.set_rocketmq("g", set(&[]), set(&[]));
        assert_eq!(m.get("g"), GroupMembers::default());
        assert_eq!(m.mixed_count(), 0);
    }
}

//! Consumer-group membership across the protocols: which RocketMQ clients
//! and which Kafka members are in each group, and what they subscribe to.
//! Each frontend reports its own members; when one side changes while the
//! other side has members, the other frontend is told (RocketMQ clients get
//! NOTIFY_CONSUMER_IDS_CHANGED, the Kafka group rebalances). In such a mixed
//! group Rokka is the assignment authority: queues are allocated with
//! RocketMQ's averaging strategy over all member ids, which is what RocketMQ
//! clients compute locally by default.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Mutex;

use serde::{Deserialize, Serialize};
use tokio::sync::mpsc;

/// One group's members on each side.
#[derive(Debug, Default, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GroupMembers {
    pub rocketmq: BTreeSet<String>,
    pub kafka: BTreeSet<String>,
    /// Topics the RocketMQ members subscribe to (retry topics excluded).
    pub rocketmq_topics: BTreeSet<String>,
    /// Topics the Kafka members subscribe to (all of them together).
    pub kafka_topics: BTreeSet<String>,
    /// The Kafka members do not all subscribe to the same topics (legal in
    /// Kafka): no RocketMQ client can join such a group — its members'
    /// rejoins would be refused for differing from it.
    #[serde(default)]
    pub kafka_subscriptions_differ: bool,
    /// Kafka partitions the Kafka members hold by their last SyncGroup,
    /// by topic: not a RocketMQ member's to pull until they give them up.
    #[serde(default)]
    pub kafka_held: BTreeMap<String, BTreeSet<i32>>,
}

impl GroupMembers {
    pub fn is_mixed(&self) -> bool {
        !self.rocketmq.is_empty() && !self.kafka.is_empty()
    }

    fn is_empty(&self) -> bool {
        self.rocketmq.is_empty() && self.kafka.is_empty()
    }

    fn merge(&mut self, other: &GroupMembers) {
        self.kafka_subscriptions_differ |= other.kafka_subscriptions_differ
            || (!self.kafka_topics.is_empty()
                && !other.kafka_topics.is_empty()
                && self.kafka_topics != other.kafka_topics);
        self.rocketmq.extend(other.rocketmq.iter().cloned());
        self.kafka.extend(other.kafka.iter().cloned());
        for (t, ps) in &other.kafka_held {
            self.kafka_held.entry(t.clone()).or_default().extend(ps.iter().copied());
        }
        self.rocketmq_topics.extend(other.rocketmq_topics.iter().cloned());
        self.kafka_topics.extend(other.kafka_topics.iter().cloned());
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
struct Groups {
    /// Members this node's frontends reported.
    local: HashMap<String, GroupMembers>,
    /// Cluster mode: what the other nodes reported (node id → group →
    /// members), through etcd: a RocketMQ client may ask any broker of its
    /// topic for the group's members, and a Kafka coordinator must know
    /// RocketMQ members that heartbeat only to other sets.
    remote: HashMap<u32, HashMap<String, GroupMembers>>,
    /// Local groups changed since the controller last published them.
    dirty: BTreeSet<String>,
}

impl Groups {
    /// The group as the whole cluster has it.
    fn effective(&self, group: &str) -> Option<GroupMembers> {
        let mut out: Option<GroupMembers> = self.local.get(group).cloned();
        for node in self.remote.values() {
            if let Some(g) = node.get(group) {
                out.get_or_insert_with(GroupMembers::default).merge(g);
            }
        }
        out.filter(|g| !g.is_empty())
    }

    fn names(&self) -> BTreeSet<String> {
        let mut n: BTreeSet<String> = self.local.keys().cloned().collect();
        for node in self.remote.values() {
            n.extend(node.keys().cloned());
        }
        n
    }
}

#[derive(Debug, Default)]
pub struct Membership {
    groups: Mutex<Groups>,
    /// Groups with live Kafka KIP-848 (consumer-protocol) members: the
    /// broker assigns their partitions, so RocketMQ clients, which allocate
    /// queues themselves, cannot share them.
    consumer_protocol: Mutex<BTreeSet<String>>,
    to_kafka: Mutex<Option<mpsc::UnboundedSender<String>>>,
    to_rocketmq: Mutex<Option<mpsc::UnboundedSender<String>>>,
    /// Groups with live RocketMQ 5 pop consumers (gRPC): client id → when
    /// last heard from (ms). Pops and queue owners (remoting consumers,
    /// Kafka members) do not share a group: each would deliver the same
    /// messages again.
    pop_consumers: Mutex<HashMap<String, HashMap<String, i64>>>,
    /// Pop consumers tracked at most (`grpc.max_pop_consumers`; 0 until
    /// set: [`MAX_POP_CONSUMERS`]).
    max_pop_consumers: std::sync::atomic::AtomicUsize,
    /// A controller publishes this node's groups (cluster mode: set by its
    /// first `take_local_changes`): only then are changes kept for it.
    published: std::sync::atomic::AtomicBool,
}

/// A pop consumer not heard from this long (ms) is gone (clients heartbeat
/// every 10 s).
pub const POP_CONSUMER_LIVE_MS: i64 = 30_000;
/// A pop consumer's auto-renewed messages are renewed while it was heard
/// from within this long (ms): Apache's proxy keeps renewing until the
/// broker expires the client's channel (120 s). Longer than
/// [`POP_CONSUMER_LIVE_MS`]: a push consumer consuming a batch sends
/// nothing but heartbeats, every 30 s from some clients (the Rust one),
/// and one late or lost heartbeat must not hand its batch to another.
pub const POP_CONSUMER_RENEW_MS: i64 = 120_000;
/// Pop consumers tracked at most (over every group) unless
/// `grpc.max_pop_consumers` says otherwise.
pub const MAX_POP_CONSUMERS: usize = 100_000;

impl Membership {
    /// Pop consumers tracked at most, over every group (0: no limit).
    pub fn set_max_pop_consumers(&self, max: usize) {
        let max = if max == 0 { usize::MAX } else { max };
        self.max_pop_consumers.store(max, std::sync::atomic::Ordering::Relaxed);
    }

    fn max_pop_consumers(&self) -> usize {
        match self.max_pop_consumers.load(std::sync::atomic::Ordering::Relaxed) {
            0 => MAX_POP_CONSUMERS,
            n => n,
        }
    }

    /// A pop consumer of `group` was heard from at `now_ms`.
    pub fn note_pop_consumer(&self, group: &str, client_id: &str, now_ms: i64) {
        let max = self.max_pop_consumers();
        let mut p = self.pop_consumers.lock().unwrap_or_else(|p| p.into_inner());
        let total: usize = p.values().map(HashMap::len).sum();
        if total >= max {
            // Forget the silent ones first.
            p.retain(|_, clients| {
                clients.retain(|_, at| now_ms - *at < POP_CONSUMER_LIVE_MS);
                !clients.is_empty()
            });
            if p.values().map(HashMap::len).sum::<usize>() >= max
                && !p.get(group).is_some_and(|c| c.contains_key(client_id))
            {
                metrics::counter!("rokka_rocketmq5_pop_consumers_untracked_total").increment(1);
                return;
            }
        }
        p.entry(group.to_string())
            .or_default()
            .insert(client_id.to_string(), now_ms);
    }

    /// A pop consumer of `group` said it is leaving.
    pub fn forget_pop_consumer(&self, group: &str, client_id: &str) {
        let mut p = self.pop_consumers.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(clients) = p.get_mut(group) {
            clients.remove(client_id);
            if clients.is_empty() {
                p.remove(group);
            }
        }
    }

    /// Whether `group` has pop consumers heard from lately.
    pub fn has_pop_consumers(&self, group: &str, now_ms: i64) -> bool {
        let p = self.pop_consumers.lock().unwrap_or_else(|p| p.into_inner());
        p.get(group)
            .is_some_and(|c| c.values().any(|at| now_ms - *at < POP_CONSUMER_LIVE_MS))
    }

    /// The pop consumers of `group` heard from lately, by client id.
    pub fn pop_consumers(&self, group: &str, now_ms: i64) -> Vec<String> {
        self.pop_consumers_within(group, now_ms, POP_CONSUMER_LIVE_MS)
    }

    /// The pop consumers of `group` heard from within `window_ms`, by
    /// client id (not said they left).
    pub fn pop_consumers_within(&self, group: &str, now_ms: i64, window_ms: i64) -> Vec<String> {
        let p = self.pop_consumers.lock().unwrap_or_else(|p| p.into_inner());
        let mut ids: Vec<String> = p
            .get(group)
            .map(|c| {
                c.iter()
                    .filter(|(_, at)| now_ms - **at < window_ms)
                    .map(|(id, _)| id.clone())
                    .collect()
            })
            .unwrap_or_default();
        ids.sort();
        ids
    }

    /// Groups with live RocketMQ members: remoting clients (here or, in
    /// cluster mode, at other nodes) or pop consumers heard from lately.
    pub fn rocketmq_groups(&self, now_ms: i64) -> BTreeSet<String> {
        let mut out: BTreeSet<String> = {
            let g = self.lock();
            g.names()
                .into_iter()
                .filter(|n| g.effective(n).is_some_and(|m| !m.rocketmq.is_empty()))
                .collect()
        };
        let p = self.pop_consumers.lock().unwrap_or_else(|p| p.into_inner());
        out.extend(
            p.iter()
                .filter(|(_, c)| c.values().any(|at| now_ms - *at < POP_CONSUMER_LIVE_MS))
                .map(|(g, _)| g.clone()),
        );
        out
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Groups> {
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
        self.set(group, Side::RocketMq, members, topics, false);
    }

    /// The Kafka side of `group` now; the RocketMQ side is told if it changed.
    pub fn set_kafka(&self, group: &str, members: BTreeSet<String>, topics: BTreeSet<String>) {
        self.set(group, Side::Kafka, members, topics, false);
    }

    /// [`Membership::set_kafka`], saying whether the members' own
    /// subscriptions differ (`topics` is then their union).
    pub fn set_kafka_differing(&self, group: &str, members: BTreeSet<String>, topics: BTreeSet<String>, differ: bool) {
        self.set(group, Side::Kafka, members, topics, differ);
    }

    /// The partitions `group`'s Kafka members hold now (their last
    /// SyncGroup's assignments); kept only for a group with Kafka members
    /// (false, nothing kept, for one without).
    pub fn set_kafka_held(&self, group: &str, held: BTreeMap<String, BTreeSet<i32>>) -> bool {
        let mut g = self.lock();
        let Some(e) = g.local.get_mut(group).filter(|e| !e.kafka.is_empty()) else {
            return false;
        };
        if e.kafka_held != held {
            e.kafka_held = held;
            if self.published.load(std::sync::atomic::Ordering::Acquire) {
                g.dirty.insert(group.to_string());
            }
        }
        true
    }

    fn set(&self, group: &str, side: Side, members: BTreeSet<String>, topics: BTreeSet<String>, differ: bool) {
        let (to_kafka, to_rocketmq) = {
            let mut g = self.lock();
            // Nothing moved (reported again): no copies of the group, no
            // recount of the mixed groups.
            let same = match (g.local.get(group), side) {
                (None, _) => members.is_empty() && topics.is_empty() && !differ,
                (Some(e), Side::RocketMq) => e.rocketmq == members && e.rocketmq_topics == topics,
                (Some(e), Side::Kafka) => {
                    e.kafka == members && e.kafka_topics == topics && e.kafka_subscriptions_differ == differ
                }
            };
            if same {
                return;
            }
            let before = g.effective(group).unwrap_or_default();
            let e = g.local.entry(group.to_string()).or_default();
            let mut changed = false;
            if let Side::Kafka = side {
                changed |= e.kafka_subscriptions_differ != differ;
                e.kafka_subscriptions_differ = differ;
                if members.is_empty() {
                    e.kafka_held.clear();
                }
            }
            let (mine, my_topics) = match side {
                Side::RocketMq => (&mut e.rocketmq, &mut e.rocketmq_topics),
                Side::Kafka => (&mut e.kafka, &mut e.kafka_topics),
            };
            changed |= *mine != members || *my_topics != topics;
            *mine = members;
            *my_topics = topics;
            if e.is_empty() {
                g.local.remove(group);
            }
            // (Without a controller nothing takes them: every group name
            // ever seen would stay.)
            if changed && self.published.load(std::sync::atomic::Ordering::Acquire) {
                g.dirty.insert(group.to_string());
            }
            let after = g.effective(group).unwrap_or_default();
            Self::changes(&before, &after)
        };
        self.told(group, to_kafka, to_rocketmq);
    }

    /// Which side to tell of a change from `before` to `after`: the Kafka
    /// side when the RocketMQ side moved while it has members, and the
    /// other way round.
    fn changes(before: &GroupMembers, after: &GroupMembers) -> (bool, bool) {
        let rmq_moved = before.rocketmq != after.rocketmq || before.rocketmq_topics != after.rocketmq_topics;
        let kafka_moved = before.kafka != after.kafka || before.kafka_topics != after.kafka_topics;
        (
            rmq_moved && !(after.kafka.is_empty() && before.kafka.is_empty()),
            kafka_moved && !(after.rocketmq.is_empty() && before.rocketmq.is_empty()),
        )
    }

    fn told(&self, group: &str, to_kafka: bool, to_rocketmq: bool) {
        metrics::gauge!("rokka_mixed_groups").set(self.mixed_count() as f64);
        if to_kafka {
            Self::tell(&self.to_kafka, group);
        }
        if to_rocketmq {
            Self::tell(&self.to_rocketmq, group);
        }
    }

    /// Cluster mode: the groups other nodes reported (node id → group →
    /// members), replacing what they reported before; each side of a group
    /// whose other side moved is told.
    pub fn set_remote(&self, remote: HashMap<u32, HashMap<String, GroupMembers>>) {
        let moved: Vec<(String, bool, bool)> = {
            let mut g = self.lock();
            if g.remote == remote {
                return;
            }
            let mut names = g.names();
            for node in remote.values() {
                names.extend(node.keys().cloned());
            }
            let before: Vec<(String, GroupMembers)> = names
                .into_iter()
                .map(|n| {
                    let b = g.effective(&n).unwrap_or_default();
                    (n, b)
                })
                .collect();
            g.remote = remote;
            before
                .into_iter()
                .filter_map(|(n, b)| {
                    let a = g.effective(&n).unwrap_or_default();
                    let (k, r) = Self::changes(&b, &a);
                    (k || r).then_some((n, k, r))
                })
                .collect()
        };
        for (group, k, r) in moved {
            self.told(&group, k, r);
        }
    }

    /// Cluster mode: this node's groups that changed since the last call,
    /// with their members now (None: none left here), for the controller
    /// to publish; `all` takes every local group (after a new lease).
    pub fn take_local_changes(&self, all: bool) -> Vec<(String, Option<GroupMembers>)> {
        let mut g = self.lock();
        // From now on changes are kept; the first call takes every local
        // group (the controller's first asks for all).
        let first = !self.published.swap(true, std::sync::atomic::Ordering::AcqRel);
        let all = all || first;
        let names: BTreeSet<String> = if all {
            let mut n: BTreeSet<String> = g.local.keys().cloned().collect();
            n.extend(std::mem::take(&mut g.dirty));
            n
        } else {
            std::mem::take(&mut g.dirty)
        };
        names
            .into_iter()
            .map(|n| {
                let m = g.local.get(&n).cloned();
                (n, m)
            })
            .collect()
    }

    /// Marks groups to publish again (a failed etcd write).
    pub fn republish(&self, groups: impl IntoIterator<Item = String>) {
        self.lock().dirty.extend(groups);
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

    /// The group's members when it has both kinds (cloned only then).
    pub fn mixed(&self, group: &str) -> Option<GroupMembers> {
        self.with_mixed(group, GroupMembers::clone)
    }

    /// `f` of the group's members when it has both kinds, without a copy
    /// on a single node (every remoting pull and commit asks; the lock is
    /// held while `f` runs).
    pub fn with_mixed<R>(&self, group: &str, f: impl FnOnce(&GroupMembers) -> R) -> Option<R> {
        let g = self.lock();
        if g.remote.is_empty() {
            return g.local.get(group).filter(|m| m.is_mixed()).map(f);
        }
        g.effective(group).filter(|m| m.is_mixed()).as_ref().map(f)
    }

    pub fn get(&self, group: &str) -> GroupMembers {
        self.with_group(group, GroupMembers::clone)
    }

    /// `f` of the group's members (empty when it has none), without a
    /// copy on a single node (the lock is held while `f` runs).
    pub fn with_group<R>(&self, group: &str, f: impl FnOnce(&GroupMembers) -> R) -> R {
        let g = self.lock();
        if g.remote.is_empty() {
            return match g.local.get(group) {
                Some(m) => f(m),
                None => f(&GroupMembers::default()),
            };
        }
        f(&g.effective(group).unwrap_or_default())
    }

    /// Groups with members on both sides.
    pub fn mixed_count(&self) -> usize {
        let g = self.lock();
        g.names()
            .iter()
            .filter(|n| g.effective(n).is_some_and(|m| m.is_mixed()))
            .count()
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

    /// `grpc.max_pop_consumers`: past it silent pop consumers are forgotten
    /// first, then a new one is not tracked; those tracked keep being
    /// heard from.
    #[test]
    fn pop_consumers_are_tracked_up_to_the_budget() {
        let m = Membership::default();
        m.set_max_pop_consumers(2);
        m.note_pop_consumer("g", "a", 0);
        m.note_pop_consumer("g", "b", 1_000);
        m.note_pop_consumer("h", "c", 2_000);
        assert_eq!(m.pop_consumers("g", 2_000), ["a", "b"]);
        assert!(!m.has_pop_consumers("h", 2_000));
        m.note_pop_consumer("g", "a", 3_000);
        assert_eq!(m.pop_consumers("g", 3_000), ["a", "b"]);
        // "b" silent past the live time: forgotten for a new one.
        let later = 1_000 + POP_CONSUMER_LIVE_MS;
        m.note_pop_consumer("h", "c", later);
        assert!(m.has_pop_consumers("h", later));
        assert_eq!(m.pop_consumers("g", later), ["a"]);
    }

    /// A consumer silent longer than the live time (a push consumer busy
    /// with its batch, heartbeating every 30 s) still has its messages
    /// renewed up to the renewal window; not past it, nor once it left.
    #[test]
    fn renewals_outlive_the_live_time_up_to_their_own_window() {
        let m = Membership::default();
        m.note_pop_consumer("g", "busy", 0);
        let late = POP_CONSUMER_LIVE_MS + 5_000;
        assert!(m.pop_consumers("g", late).is_empty());
        assert_eq!(m.pop_consumers_within("g", late, POP_CONSUMER_RENEW_MS), ["busy"]);
        assert!(m
            .pop_consumers_within("g", POP_CONSUMER_RENEW_MS, POP_CONSUMER_RENEW_MS)
            .is_empty());
        m.forget_pop_consumer("g", "busy");
        assert!(m.pop_consumers_within("g", late, POP_CONSUMER_RENEW_MS).is_empty());
    }

    /// Without a controller (one node) no change is kept for it: group
    /// names churned through are not remembered; with one, changes are.
    #[test]
    fn changes_are_kept_only_for_a_controller() {
        let m = Membership::default();
        let one = |s: &str| BTreeSet::from([s.to_string()]);
        for i in 0..1000 {
            let g = format!("g{i}");
            m.set_kafka(&g, one("m"), one("t"));
            m.set_kafka(&g, BTreeSet::new(), BTreeSet::new());
        }
        m.set_kafka("kept", one("m"), one("t"));
        assert!(m.lock().dirty.is_empty());
        // A controller's first look takes every local group.
        let first = m.take_local_changes(false);
        assert_eq!(first.iter().map(|(g, _)| g.as_str()).collect::<Vec<_>>(), ["kept"]);
        m.set_kafka("g1", one("m"), one("t"));
        assert_eq!(m.take_local_changes(false).len(), 1);
    }

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
        // Reported again unchanged (every tick, every heartbeat): no one told.
        m.set_rocketmq("g", set(&["r1", "r2"]), set(&["T"]));
        m.set_kafka("g", set(&["k1"]), set(&["T"]));
        assert!(to_kafka.try_recv().is_err() && to_rmq.try_recv().is_err());
        m.set_kafka("g", set(&[]), set(&[]));
        m.set_rocketmq("g", set(&[]), set(&[]));
        assert_eq!(m.get("g"), GroupMembers::default());
        assert_eq!(m.mixed_count(), 0);
    }

    #[test]
    fn members_other_nodes_know_count_and_are_published_once_changed() {
        let m = Membership::default();
        let mut to_kafka = m.kafka_events();
        let mut to_rmq = m.rocketmq_events();
        let set = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<BTreeSet<_>>();
        // The Kafka coordinator is here; the RocketMQ clients heartbeat to
        // another set's master only.
        m.set_kafka("g", set(&["k1"]), set(&["T"]));
        assert_eq!(m.take_local_changes(false).len(), 1);
        assert!(m.take_local_changes(false).is_empty(), "published once");
        let remote = |ids: &[&str]| {
            let g = GroupMembers {
                rocketmq: set(ids),
                rocketmq_topics: set(&["T"]),
                ..GroupMembers::default()
            };
            HashMap::from([(7u32, HashMap::from([("g".to_string(), g)]))])
        };
        m.set_remote(remote(&["r1"]));
        assert_eq!(
            to_kafka.try_recv().ok().as_deref(),
            Some("g"),
            "the Kafka side rebalances"
        );
        assert!(to_rmq.try_recv().is_err());
        assert_eq!(m.get("g").all_ids(), vec!["k1".to_string(), "r1".to_string()]);
        assert!(m.mixed("g").is_some());
        assert_eq!(m.mixed_count(), 1);
        m.set_remote(remote(&["r1"]));
        assert!(to_kafka.try_recv().is_err(), "nothing moved");
        // The other node's lease is gone: its members with it.
        m.set_remote(HashMap::new());
        assert_eq!(to_kafka.try_recv().ok().as_deref(), Some("g"));
        assert!(m.mixed("g").is_none());
        // A new lease publishes every local group again.
        assert_eq!(m.take_local_changes(true).len(), 1);
        m.set_kafka("g", set(&[]), set(&[]));
        assert_eq!(m.take_local_changes(false), vec![("g".to_string(), None)]);
    }
}

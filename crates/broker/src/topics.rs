//! The topic table: name → partition (queue) count and Kafka topic id,
//! persisted in `<data_dir>/config/topics.json` (temp file, fsync, rename).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::RwLock;

use serde::{Deserialize, Serialize};

use crate::error::{BrokerError, Result};

/// What the broker knows about a topic.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TopicInfo {
    /// Number of partitions (RocketMQ: read/write queue count).
    pub partitions: u32,
    /// Kafka topic id (UUID), stable for the topic's life.
    pub topic_id: [u8; 16],
    /// Creation time, ms since the epoch.
    pub created_ms: i64,
    /// Kafka topic-config overrides (validated by [`crate::topic_config`]).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub configs: BTreeMap<String, String>,
    /// Cluster mode with several broker sets: where each Kafka partition
    /// lives, in partition order (docs/decisions/0005). Empty: every
    /// partition `p` is queue `p` of this node's set. In this node's table
    /// `partitions` counts the queues placed on its own set; in etcd it
    /// counts them all ([`TopicInfo::cluster_form`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub placement: Vec<QueueRef>,
    /// RocketMQ's permission and write queue count where an admin set them
    /// apart from "every queue, readable and writable" (Apache's
    /// TopicConfig `perm`, `writeQueueNums`; UPDATE_AND_CREATE_TOPIC).
    /// None: all `partitions`, perm 6.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rocketmq: Option<RocketMqTopic>,
}

/// A topic's RocketMQ write queue count and permission (see
/// [`TopicInfo::rocketmq`]; every queue is read).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct RocketMqTopic {
    pub write_queues: u32,
    /// Apache's PermName bits: 4 read, 2 write.
    pub perm: u32,
}

/// Apache's PermName: readable, writable, both.
pub const PERM_READ: u32 = 4;
pub const PERM_WRITE: u32 = 2;
pub const PERM_RW: u32 = PERM_READ | PERM_WRITE;

/// One Kafka partition's place: a queue of a broker set.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct QueueRef {
    pub set: String,
    pub queue: u32,
}

/// Where a Kafka partition is, seen from one node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Located {
    /// On this node's set, as this queue.
    Here(u32),
    /// On another broker set.
    OtherSet,
    /// No such partition.
    Unknown,
}

/// Where Kafka partition `p`'s queue is, with the other set named.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Placed {
    /// This node's set's queue.
    Here(u32),
    /// Queue `.1` of broker set `.0` (not this node's).
    Set(String, u32),
    /// No such partition.
    Unknown,
}

impl TopicInfo {
    /// RocketMQ's (readQueueNums, writeQueueNums, perm) of this node's
    /// queues: every queue is read (Kafka producers write to all of them,
    /// and a mixed group's Kafka members are given all of them: a smaller
    /// read count would hide records from RocketMQ consumers and split the
    /// group two ways); the write count and the permission as an admin set
    /// them (with several broker sets, counts are each set's own: only the
    /// permission applies).
    pub fn rocketmq_queues(&self) -> (u32, u32, u32) {
        match self.rocketmq {
            Some(r) if self.placement.is_empty() => (self.partitions, r.write_queues.min(self.partitions), r.perm),
            Some(r) => (self.partitions, self.partitions, r.perm),
            None => (self.partitions, self.partitions, PERM_RW),
        }
    }

    /// Whether RocketMQ clients may send to the topic (its perm).
    pub fn rocketmq_writable(&self) -> bool {
        self.rocketmq.is_none_or(|r| r.perm & PERM_WRITE != 0)
    }

    /// Whether RocketMQ clients may pull from the topic (its perm).
    pub fn rocketmq_readable(&self) -> bool {
        self.rocketmq.is_none_or(|r| r.perm & PERM_READ != 0)
    }

    /// Where partition `p` is, seen from a node of set `own`.
    pub fn placed(&self, p: i32, own: Option<&str>) -> Placed {
        match self.locate(p, own) {
            Located::Here(q) => Placed::Here(q),
            Located::OtherSet => match self.placement.get(p as usize) {
                Some(r) => Placed::Set(r.set.clone(), r.queue),
                None => Placed::Unknown,
            },
            Located::Unknown => Placed::Unknown,
        }
    }

    /// Queue counts per broker set, in order of first appearance in
    /// `placement`; an empty placement is `partitions` queues on `own`.
    pub fn sets_of(placement: &[QueueRef], own: &str, partitions: u32) -> Vec<(String, u32)> {
        if placement.is_empty() {
            return if partitions > 0 {
                vec![(own.to_string(), partitions)]
            } else {
                Vec::new()
            };
        }
        let mut out: Vec<(String, u32)> = Vec::new();
        for r in placement {
            match out.iter_mut().find(|(s, _)| *s == r.set) {
                Some((_, n)) => *n += 1,
                None => out.push((r.set.clone(), 1)),
            }
        }
        out
    }

    /// Whether `partition` (as a Kafka client sends it: signed) exists.
    pub fn has_partition(&self, partition: i32) -> bool {
        u32::try_from(partition).is_ok_and(|p| p < self.kafka_partitions())
    }

    /// How many partitions Kafka clients see (every set's).
    pub fn kafka_partitions(&self) -> u32 {
        if self.placement.is_empty() {
            self.partitions
        } else {
            self.placement.len() as u32
        }
    }

    /// Where Kafka partition `p` lives, seen from a node of `set` (None:
    /// single-node mode).
    pub fn locate(&self, p: i32, set: Option<&str>) -> Located {
        let Ok(pu) = u32::try_from(p) else {
            return Located::Unknown;
        };
        if self.placement.is_empty() {
            return if pu < self.partitions {
                Located::Here(pu)
            } else {
                Located::Unknown
            };
        }
        match self.placement.get(pu as usize) {
            None => Located::Unknown,
            Some(r) if Some(r.set.as_str()) == set => Located::Here(r.queue),
            Some(_) => Located::OtherSet,
        }
    }

    /// The Kafka partition that is queue `queue` of `set`.
    pub fn kafka_partition_of(&self, set: Option<&str>, queue: u32) -> Option<i32> {
        if self.placement.is_empty() {
            return (queue < self.partitions).then_some(queue as i32);
        }
        self.placement
            .iter()
            .position(|r| Some(r.set.as_str()) == set && r.queue == queue)
            .map(|p| p as i32)
    }

    /// The Kafka partitions in the order RocketMQ clients sort the topic's
    /// message queues (broker name, then queue id): the unit list a mixed
    /// group's averaging allocation runs over, so a Kafka member's share
    /// and a RocketMQ member's are cut from one list.
    pub fn rocketmq_order(&self) -> Vec<i32> {
        if self.placement.is_empty() {
            return (0..self.partitions as i32).collect();
        }
        let mut order: Vec<(&str, u32, i32)> = self
            .placement
            .iter()
            .enumerate()
            .map(|(p, r)| (r.set.as_str(), r.queue, p as i32))
            .collect();
        order.sort_unstable();
        order.into_iter().map(|(_, _, p)| p).collect()
    }

    /// Where queue `queue` of `set` is in [`TopicInfo::rocketmq_order`].
    pub fn rocketmq_index(&self, set: Option<&str>, queue: u32) -> Option<usize> {
        let p = self.kafka_partition_of(set, queue)?;
        self.rocketmq_order().iter().position(|x| *x == p)
    }

    /// How many queues `set` holds.
    pub fn queues_on(&self, set: &str) -> u32 {
        self.placement.iter().filter(|r| r.set == set).count() as u32
    }

    /// The form etcd holds: `partitions` counts every set's.
    pub fn cluster_form(&self) -> TopicInfo {
        TopicInfo {
            partitions: self.kafka_partitions(),
            ..self.clone()
        }
    }

    /// The form a node of `set` holds: `partitions` counts its own queues.
    pub fn local_form(mut self, set: &str) -> TopicInfo {
        if !self.placement.is_empty() {
            self.partitions = self.queues_on(set);
        }
        self
    }

    /// Places partitions `placement.len()..total` over `sets` (the sets
    /// taking placements, any order): each new partition goes to the set
    /// that holds the fewest of this topic's, ties in an order that starts
    /// at a hash of the topic name, so small topics do not all start on
    /// one set. Each set's queues stay contiguous (RocketMQ clients see a
    /// queue count per broker).
    pub fn place(name: &str, placement: &mut Vec<QueueRef>, total: u32, sets: &[String]) {
        if sets.is_empty() {
            return;
        }
        let mut sets: Vec<&String> = sets.iter().collect();
        sets.sort();
        sets.dedup();
        let start = (crc32fast::hash(name.as_bytes()) as usize) % sets.len();
        let order: Vec<&String> = sets[start..].iter().chain(sets[..start].iter()).copied().collect();
        let mut held: Vec<u32> = order
            .iter()
            .map(|s| placement.iter().filter(|r| &r.set == *s).count() as u32)
            .collect();
        while (placement.len() as u32) < total {
            // The first of the least loaded, in hash order.
            let Some((i, _)) = held.iter().enumerate().min_by_key(|(i, h)| (**h, *i)) else {
                return;
            };
            placement.push(QueueRef {
                set: order[i].clone(),
                queue: held[i],
            });
            held[i] += 1;
        }
    }
}

#[derive(Serialize, Deserialize)]
struct FileForm {
    version: u32,
    topics: BTreeMap<String, TopicInfo>,
}

#[derive(Debug)]
pub struct TopicTable {
    path: PathBuf,
    topics: RwLock<BTreeMap<String, TopicInfo>>,
    /// Bumped on every change (the RocketMQ broker re-registers with its name
    /// server when it moves).
    version: AtomicU64,
    /// Topic id → name as of a version of the table: made again after a
    /// change, at the first lookup (a Fetch v13+ names each topic by id;
    /// a scan of the table per id made many unknown ids cost ids × topics).
    /// (Read-locked by every Fetch v13+: lookups do not wait on each other.)
    ids: RwLock<(u64, std::collections::HashMap<[u8; 16], String>)>,
}

impl TopicTable {
    /// Loads the table (absent = empty; unreadable = an error naming the file).
    pub fn load(data_dir: &Path) -> Result<TopicTable> {
        let path = data_dir.join("config").join("topics.json");
        let topics = match std::fs::read(&path) {
            Ok(b) => {
                let f: FileForm = serde_json::from_slice(&b).map_err(|e| BrokerError::BadFile {
                    path: path.clone(),
                    reason: e.to_string(),
                })?;
                f.topics
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => BTreeMap::new(),
            Err(e) => return Err(BrokerError::Io(path, e)),
        };
        Ok(TopicTable {
            path,
            topics: RwLock::new(topics),
            version: AtomicU64::new(1),
            ids: RwLock::new((0, std::collections::HashMap::new())),
        })
    }

    fn persist(&self, topics: &BTreeMap<String, TopicInfo>) -> Result<()> {
        if let Some(dir) = self.path.parent() {
            std::fs::create_dir_all(dir).map_err(|e| BrokerError::Io(dir.to_path_buf(), e))?;
        }
        let json = serde_json::to_vec_pretty(&FileForm {
            version: 1,
            topics: topics.clone(),
        })
        .map_err(|e| BrokerError::BadFile {
            path: self.path.clone(),
            reason: e.to_string(),
        })?;
        rokka_store::checkpoint::write_atomically(&self.path, &json)?;
        Ok(())
    }

    /// Changes so far (starts at 1).
    pub fn version(&self) -> u64 {
        self.version.load(Ordering::Acquire)
    }

    fn changed(&self) {
        self.version.fetch_add(1, Ordering::AcqRel);
    }

    /// How many topics there are.
    pub fn count(&self) -> usize {
        self.topics.read().unwrap_or_else(|p| p.into_inner()).len()
    }

    pub fn get(&self, name: &str) -> Option<TopicInfo> {
        self.topics.read().unwrap_or_else(|p| p.into_inner()).get(name).cloned()
    }

    /// The name of the topic with Kafka topic id `id` (no copy of the table).
    pub fn name_of_id(&self, id: &[u8; 16]) -> Option<String> {
        {
            let ids = self.ids.read().unwrap_or_else(|p| p.into_inner());
            if ids.0 == self.version.load(Ordering::Acquire) {
                return ids.1.get(id).cloned();
            }
        }
        let mut ids = self.ids.write().unwrap_or_else(|p| p.into_inner());
        if ids.0 != self.version.load(Ordering::Acquire) {
            // Changes bump the version under the table's write lock: read
            // under its read lock, the version names this content.
            let t = self.topics.read().unwrap_or_else(|p| p.into_inner());
            let version = self.version.load(Ordering::Acquire);
            *ids = (version, t.iter().map(|(n, i)| (i.topic_id, n.clone())).collect());
        }
        ids.1.get(id).cloned()
    }

    /// Every topic's name.
    pub fn names(&self) -> Vec<String> {
        self.topics
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .keys()
            .cloned()
            .collect()
    }

    /// A topic other than `name` whose name is the same once '.' and '_'
    /// are taken as one (Kafka's collision rule), looked for among the
    /// names without copying the table.
    pub fn colliding(&self, name: &str) -> Option<String> {
        if !name.contains(['.', '_']) {
            return None;
        }
        let same = |a: u8, b: u8| a == b || (matches!(a, b'.' | b'_') && matches!(b, b'.' | b'_'));
        let t = self.topics.read().unwrap_or_else(|p| p.into_inner());
        t.keys()
            .find(|n| {
                n.as_str() != name && n.len() == name.len() && n.bytes().zip(name.bytes()).all(|(a, b)| same(a, b))
            })
            .cloned()
    }

    pub fn all(&self) -> Vec<(String, TopicInfo)> {
        let t = self.topics.read().unwrap_or_else(|p| p.into_inner());
        t.iter().map(|(k, v)| (k.clone(), v.clone())).collect()
    }

    /// Where Kafka partition `p` of `name` lives (no copy of the table);
    /// None: no such topic.
    pub fn locate(&self, name: &str, p: i32, set: Option<&str>) -> Option<Located> {
        let t = self.topics.read().unwrap_or_else(|p| p.into_inner());
        t.get(name).map(|i| i.locate(p, set))
    }

    /// Creates `name` with `partitions`; `Ok(false)` if it already exists.
    pub fn create(&self, name: &str, partitions: u32) -> Result<bool> {
        self.create_with(name, partitions, BTreeMap::new(), Vec::new())
    }

    /// Creates `name` with `partitions` (this node's queues), config
    /// overrides and a placement (several broker sets); `Ok(false)` if it
    /// already exists.
    pub fn create_with(
        &self,
        name: &str,
        partitions: u32,
        configs: BTreeMap<String, String>,
        placement: Vec<QueueRef>,
    ) -> Result<bool> {
        self.insert_new(name, TopicTable::new_info(partitions, configs, placement))
    }

    /// A new topic's record: a fresh topic id, created now.
    pub fn new_info(partitions: u32, configs: BTreeMap<String, String>, placement: Vec<QueueRef>) -> TopicInfo {
        let mut id = [0u8; 16];
        rand::Rng::fill(&mut rand::thread_rng(), &mut id[..]);
        // RFC 4122 version 4, as Kafka's Uuid.randomUuid.
        id[6] = (id[6] & 0x0f) | 0x40;
        id[8] = (id[8] & 0x3f) | 0x80;
        TopicInfo {
            partitions,
            topic_id: id,
            created_ms: rokka_store::now_ms(),
            configs,
            placement,
            rocketmq: None,
        }
    }

    /// Adds `name` as `info`; `Ok(false)` if it already exists.
    pub fn insert_new(&self, name: &str, info: TopicInfo) -> Result<bool> {
        self.insert_new_within(name, info, usize::MAX)
    }

    /// As [`TopicTable::insert_new`], refused (`TooManyTopics`) when the
    /// table holds `max` topics already: checked under the table's lock,
    /// so concurrent creations cannot pass the cap together.
    pub fn insert_new_within(&self, name: &str, info: TopicInfo, max: usize) -> Result<bool> {
        let mut t = self.topics.write().unwrap_or_else(|p| p.into_inner());
        if t.contains_key(name) {
            return Ok(false);
        }
        if t.len() >= max {
            return Err(BrokerError::TooManyTopics(u32::try_from(max).unwrap_or(u32::MAX)));
        }
        t.insert(name.to_string(), info);
        // Changed in memory whether or not the file is written.
        self.changed();
        self.persist(&t)?;
        Ok(true)
    }

    /// Raises the partition count (as Kafka clients count them) to
    /// `partitions`; errors if it is not larger. A placed topic's new
    /// partitions are placed over `sets` and this node's queue count
    /// becomes what its set `own` holds.
    pub fn set_partitions(&self, name: &str, partitions: u32, own: Option<&str>, sets: &[String]) -> Result<()> {
        let mut t = self.topics.write().unwrap_or_else(|p| p.into_inner());
        let info = t
            .get_mut(name)
            .ok_or_else(|| BrokerError::UnknownTopic(name.to_string()))?;
        if partitions <= info.kafka_partitions() {
            return Err(BrokerError::InvalidPartitions(format!(
                "topic {name} has {} partitions; the new count must be larger",
                info.kafka_partitions()
            )));
        }
        match own {
            Some(own) if !info.placement.is_empty() => {
                if sets.is_empty() {
                    return Err(BrokerError::InvalidPartitions(
                        "no broker set takes new partitions (every set is draining)".into(),
                    ));
                }
                TopicInfo::place(name, &mut info.placement, partitions, sets);
                info.partitions = info.queues_on(own);
            }
            _ => info.partitions = partitions,
        }
        // New partitions are every protocol's: RocketMQ reads and writes
        // all of them (an admin's smaller counts were of the old ones).
        info.rocketmq = info.rocketmq.and_then(|r| {
            (r.perm != PERM_RW).then_some(RocketMqTopic {
                write_queues: info.partitions,
                perm: r.perm,
            })
        });
        // Changed in memory whether or not the file is written.
        self.changed();
        self.persist(&t)?;
        Ok(())
    }

    /// Sets `name`'s RocketMQ permission and queue counts (None: every
    /// queue, read and write).
    pub fn set_rocketmq(&self, name: &str, rocketmq: Option<RocketMqTopic>) -> Result<()> {
        let mut t = self.topics.write().unwrap_or_else(|p| p.into_inner());
        let info = t
            .get_mut(name)
            .ok_or_else(|| BrokerError::UnknownTopic(name.to_string()))?;
        if info.rocketmq == rocketmq {
            return Ok(());
        }
        info.rocketmq = rocketmq;
        // Changed in memory whether or not the file is written.
        self.changed();
        self.persist(&t)?;
        Ok(())
    }

    /// Replaces `name`'s config overrides.
    pub fn set_configs(&self, name: &str, configs: BTreeMap<String, String>) -> Result<()> {
        let mut t = self.topics.write().unwrap_or_else(|p| p.into_inner());
        let info = t
            .get_mut(name)
            .ok_or_else(|| BrokerError::UnknownTopic(name.to_string()))?;
        info.configs = configs;
        // Changed in memory whether or not the file is written.
        self.changed();
        self.persist(&t)?;
        Ok(())
    }

    /// Replaces the whole table (cluster mode: a replica takes its
    /// master's); whether anything changed.
    pub fn replace_all(&self, topics: BTreeMap<String, TopicInfo>) -> Result<bool> {
        let mut t = self.topics.write().unwrap_or_else(|p| p.into_inner());
        if *t == topics {
            return Ok(false);
        }
        self.persist(&topics)?;
        *t = topics;
        self.changed();
        Ok(true)
    }

    /// Sets `name` to `info` exactly (cluster mode: the table in etcd);
    /// whether anything changed.
    pub fn upsert(&self, name: &str, info: TopicInfo) -> Result<bool> {
        let mut t = self.topics.write().unwrap_or_else(|p| p.into_inner());
        if t.get(name) == Some(&info) {
            return Ok(false);
        }
        t.insert(name.to_string(), info);
        // Changed in memory whether or not the file is written.
        self.changed();
        self.persist(&t)?;
        Ok(true)
    }

    /// Removes `name`; whether it existed.
    /// Removes `name` if its topic id is `id` (not a topic made anew).
    pub fn remove_if_id(&self, name: &str, id: [u8; 16]) -> Result<bool> {
        let mut t = self.topics.write().unwrap_or_else(|p| p.into_inner());
        if t.get(name).is_none_or(|i| i.topic_id != id) {
            return Ok(false);
        }
        t.remove(name);
        // Changed in memory whether or not the file is written.
        self.changed();
        self.persist(&t)?;
        Ok(true)
    }

    pub fn remove(&self, name: &str) -> Result<bool> {
        let mut t = self.topics.write().unwrap_or_else(|p| p.into_inner());
        let had = t.remove(name).is_some();
        if had {
            self.changed();
            self.persist(&t)?;
        }
        Ok(had)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sets(names: &[&str]) -> Vec<String> {
        names.iter().map(|s| s.to_string()).collect()
    }

    fn info(placement: Vec<QueueRef>, own: &str) -> TopicInfo {
        TopicInfo {
            partitions: 0,
            topic_id: [0; 16],
            created_ms: 0,
            configs: BTreeMap::new(),
            placement,
            rocketmq: None,
        }
        .local_form(own)
    }

    #[test]
    fn topic_ids_are_looked_up_as_the_table_changes() -> Result<()> {
        let dir = tempfile::tempdir().map_err(|e| BrokerError::Io(std::path::PathBuf::from("tmp"), e))?;
        let t = TopicTable::load(dir.path())?;
        let a = TopicTable::new_info(1, BTreeMap::new(), Vec::new());
        let id_a = a.topic_id;
        assert!(t.insert_new("a", a)?);
        assert_eq!(t.name_of_id(&id_a).as_deref(), Some("a"));
        let b = TopicTable::new_info(2, BTreeMap::new(), Vec::new());
        let id_b = b.topic_id;
        assert!(t.insert_new("b", b)?);
        assert_eq!(
            t.name_of_id(&id_b).as_deref(),
            Some("b"),
            "a topic made after the first lookup"
        );
        assert!(t.remove("a")?);
        assert_eq!(t.name_of_id(&id_a), None, "a deleted topic's id");
        assert_eq!(t.name_of_id(&[7; 16]), None);
        Ok(())
    }

    #[test]
    fn partitions_spread_round_robin_with_contiguous_queues_per_set() {
        let mut p = Vec::new();
        TopicInfo::place("orders", &mut p, 12, &sets(&["b", "a"]));
        assert_eq!(p.len(), 12);
        for set in ["a", "b"] {
            let queues: Vec<u32> = p.iter().filter(|r| r.set == set).map(|r| r.queue).collect();
            assert_eq!(queues, (0..6).collect::<Vec<_>>(), "{set}: {p:?}");
        }
        // Alternating: neighbours are on different sets.
        assert!(p.windows(2).all(|w| w[0].set != w[1].set), "{p:?}");
        // Growing appends and keeps what was placed.
        let before = p.clone();
        TopicInfo::place("orders", &mut p, 15, &sets(&["a", "b", "c"]));
        assert_eq!(&p[..12], &before[..]);
        let new: Vec<&str> = p[12..].iter().map(|r| r.set.as_str()).collect();
        assert_eq!(new, vec!["c", "c", "c"], "the empty set fills first");
        assert_eq!(p[12].queue, 0);
        assert_eq!(p[14].queue, 2);
    }

    #[test]
    fn a_small_topic_starts_on_a_set_chosen_by_its_name() {
        let firsts: std::collections::BTreeSet<String> = (0..20)
            .map(|i| {
                let mut p = Vec::new();
                TopicInfo::place(&format!("t{i}"), &mut p, 1, &sets(&["a", "b"]));
                p[0].set.clone()
            })
            .collect();
        assert_eq!(firsts.len(), 2, "one-partition topics land on both sets");
    }

    #[test]
    fn kafka_partitions_map_to_this_sets_queues_and_back() {
        let mut p = Vec::new();
        TopicInfo::place("t", &mut p, 4, &sets(&["a", "b"]));
        let a = info(p.clone(), "a");
        let b = info(p.clone(), "b");
        assert_eq!((a.partitions, b.partitions), (2, 2));
        assert_eq!(a.kafka_partitions(), 4);
        for k in 0..4 {
            let (on_a, on_b) = (a.locate(k, Some("a")), b.locate(k, Some("b")));
            match (on_a, on_b) {
                (Located::Here(q), Located::OtherSet) => assert_eq!(a.kafka_partition_of(Some("a"), q), Some(k)),
                (Located::OtherSet, Located::Here(q)) => assert_eq!(b.kafka_partition_of(Some("b"), q), Some(k)),
                other => panic!("partition {k}: {other:?}"),
            }
        }
        assert_eq!(a.locate(4, Some("a")), Located::Unknown);
        assert_eq!(a.locate(-1, Some("a")), Located::Unknown);
        assert_eq!(a.cluster_form().partitions, 4);
        assert_eq!(a.cluster_form().local_form("b"), b);
        // No placement: partition p is queue p, on whichever set.
        let plain = TopicInfo {
            placement: Vec::new(),
            partitions: 3,
            ..a
        };
        assert_eq!(plain.locate(2, Some("x")), Located::Here(2));
        assert_eq!(plain.locate(3, None), Located::Unknown);
        assert_eq!(plain.kafka_partition_of(None, 1), Some(1));
    }

    #[test]
    fn a_mixed_group_cuts_its_shares_from_the_clients_queue_order() {
        let placement = vec![
            QueueRef {
                set: "b".into(),
                queue: 0,
            },
            QueueRef {
                set: "a".into(),
                queue: 0,
            },
            QueueRef {
                set: "b".into(),
                queue: 1,
            },
            QueueRef {
                set: "a".into(),
                queue: 1,
            },
        ];
        let t = info(placement, "a");
        // RocketMQ sorts (broker name, queue id): a0 a1 b0 b1.
        assert_eq!(t.rocketmq_order(), vec![1, 3, 0, 2]);
        assert_eq!(t.rocketmq_index(Some("b"), 1), Some(3));
        assert_eq!(t.rocketmq_index(Some("a"), 0), Some(0));
        assert_eq!(t.rocketmq_index(Some("c"), 0), None);
        let plain = TopicInfo {
            placement: Vec::new(),
            partitions: 3,
            ..t
        };
        assert_eq!(plain.rocketmq_order(), vec![0, 1, 2]);
    }

    #[test]
    fn adding_partitions_places_them_and_counts_this_sets_queues() {
        let dir = tempfile::tempdir().expect("tempdir");
        let t = TopicTable::load(dir.path()).expect("load");
        let mut p = Vec::new();
        TopicInfo::place("t", &mut p, 2, &sets(&["a", "b"]));
        assert!(t.create_with("t", 1, BTreeMap::new(), p).expect("create"));
        t.set_partitions("t", 6, Some("a"), &sets(&["a", "b"])).expect("grow");
        let i = t.get("t").expect("topic");
        assert_eq!(i.kafka_partitions(), 6);
        assert_eq!(i.partitions, 3, "{:?}", i.placement);
        assert!(
            t.set_partitions("t", 6, Some("a"), &sets(&["a"])).is_err(),
            "not larger"
        );
        assert!(t.set_partitions("t", 7, Some("a"), &[]).is_err(), "every set draining");
        // Kept across a reload.
        let again = TopicTable::load(dir.path()).expect("reload");
        assert_eq!(again.get("t"), Some(i));
    }
}

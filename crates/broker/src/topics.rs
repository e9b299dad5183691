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
}

impl TopicInfo {
    /// Whether `partition` (as a Kafka client sends it: signed) exists.
    pub fn has_partition(&self, partition: i32) -> bool {
        u32::try_from(partition).is_ok_and(|p| p < self.partitions)
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

    pub fn get(&self, name: &str) -> Option<TopicInfo> {
        self.topics.read().unwrap_or_else(|p| p.into_inner()).get(name).cloned()
    }

    /// The name of the topic with Kafka topic id `id` (no copy of the table).
    pub fn name_of_id(&self, id: &[u8; 16]) -> Option<String> {
        let t = self.topics.read().unwrap_or_else(|p| p.into_inner());
        t.iter().find(|(_, i)| i.topic_id == *id).map(|(n, _)| n.clone())
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

    pub fn all(&self) -> Vec<(String, TopicInfo)> {
        let t = self.topics.read().unwrap_or_else(|p| p.into_inner());
        t.iter().map(|(k, v)| (k.clone(), v.clone())).collect()
    }

    /// Creates `name` with `partitions`; `Ok(false)` if it already exists.
    pub fn create(&self, name: &str, partitions: u32) -> Result<bool> {
        self.create_with(name, partitions, BTreeMap::new())
    }

    /// Creates `name` with `partitions` and config overrides; `Ok(false)`
    /// if it already exists.
    pub fn create_with(&self, name: &str, partitions: u32, configs: BTreeMap<String, String>) -> Result<bool> {
        let mut t = self.topics.write().unwrap_or_else(|p| p.into_inner());
        if t.contains_key(name) {
            return Ok(false);
        }
        let mut id = [0u8; 16];
        rand::Rng::fill(&mut rand::thread_rng(), &mut id[..]);
        // RFC 4122 version 4, as Kafka's Uuid.randomUuid.
        id[6] = (id[6] & 0x0f) | 0x40;
        id[8] = (id[8] & 0x3f) | 0x80;
        t.insert(
            name.to_string(),
            TopicInfo {
                partitions,
                topic_id: id,
                created_ms: rokka_store::now_ms(),
                configs,
            },
        );
        self.persist(&t)?;
        self.changed();
        Ok(true)
    }

    /// Raises the partition count; errors if `partitions` is not larger.
    pub fn set_partitions(&self, name: &str, partitions: u32) -> Result<()> {
        let mut t = self.topics.write().unwrap_or_else(|p| p.into_inner());
        let info = t
            .get_mut(name)
            .ok_or_else(|| BrokerError::UnknownTopic(name.to_string()))?;
        if partitions <= info.partitions {
            return Err(BrokerError::InvalidPartitions(format!(
                "topic {name} has {} partitions; the new count must be larger",
                info.partitions
            )));
        }
        info.partitions = partitions;
        self.persist(&t)?;
        self.changed();
        Ok(())
    }

    /// Replaces `name`'s config overrides.
    pub fn set_configs(&self, name: &str, configs: BTreeMap<String, String>) -> Result<()> {
        let mut t = self.topics.write().unwrap_or_else(|p| p.into_inner());
        let info = t
            .get_mut(name)
            .ok_or_else(|| BrokerError::UnknownTopic(name.to_string()))?;
        info.configs = configs;
        self.persist(&t)?;
        self.changed();
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
        self.persist(&t)?;
        self.changed();
        Ok(true)
    }

    /// Removes `name`; whether it existed.
    pub fn remove(&self, name: &str) -> Result<bool> {
        let mut t = self.topics.write().unwrap_or_else(|p| p.into_inner());
        let had = t.remove(name).is_some();
        if had {
            self.persist(&t)?;
            self.changed();
        }
        Ok(had)
    }
}

//! Dynamic broker configs (Kafka's `AlterConfigs` on a BROKER resource):
//! the broker-level defaults of topic configs (`log.retention.ms`,
//! `message.max.bytes`, `compression.type`, `log.cleaner.*` ...), set for
//! the whole cluster (resource name "") or for this broker (its node id),
//! persisted in `<data_dir>/config/broker-dynamic.json`. A topic without
//! its own override takes this broker's value, else the cluster default,
//! else `config/rokka.toml`, else Kafka's default — the order Kafka
//! resolves them in.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::RwLock;

use serde::{Deserialize, Serialize};

use crate::error::Result;
use crate::topic_config::{self, Source, Spec};

/// Which set an Alter or Describe names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope {
    /// Resource name "": every broker's default.
    ClusterDefault,
    /// Resource name = this node's id.
    ThisBroker,
}

#[derive(Debug, Default, Clone, Serialize, Deserialize)]
struct Sets {
    #[serde(default)]
    default: BTreeMap<String, String>,
    #[serde(default)]
    broker: BTreeMap<String, String>,
}

#[derive(Debug)]
pub struct DynamicConfigs {
    path: PathBuf,
    sets: RwLock<Sets>,
    /// Any value is set (the common case, none, costs one load per lookup).
    any: std::sync::atomic::AtomicBool,
    writing: std::sync::Mutex<()>,
    /// Cluster mode: a cluster default set here, for the controller to
    /// publish to the other nodes (taken once).
    published: std::sync::Mutex<Option<BTreeMap<String, String>>>,
}

/// The topic config a dynamic broker key is the default of. Not
/// `log.cleanup.policy`: a cluster-wide `compact` would make RocketMQ's
/// own system topics (retry, schedule, half messages) compacted.
pub fn spec_of_broker_key(key: &str) -> Option<&'static Spec> {
    topic_config::SPECS
        .iter()
        .find(|s| s.broker_name == Some(key) && key != "log.cleanup.policy")
}

/// Checks a dynamic broker key and value; the value as stored, or why not.
pub fn validate(key: &str, value: &str) -> std::result::Result<String, String> {
    let spec = spec_of_broker_key(key).ok_or_else(|| format!("Cannot update these configs dynamically: Set({key})"))?;
    topic_config::validate(spec.name, value).map_err(|e| e.replace(spec.name, key))
}

impl DynamicConfigs {
    pub fn load(data_dir: &Path) -> Result<DynamicConfigs> {
        let path = data_dir.join("config").join("broker-dynamic.json");
        let sets: Sets = crate::json_file::read_or_default(&path)?;
        let any = !sets.default.is_empty() || !sets.broker.is_empty();
        Ok(DynamicConfigs {
            path,
            sets: RwLock::new(sets),
            any: std::sync::atomic::AtomicBool::new(any),
            writing: std::sync::Mutex::new(()),
            published: std::sync::Mutex::new(None),
        })
    }

    /// The set `scope` names.
    pub fn get(&self, scope: Scope) -> BTreeMap<String, String> {
        let s = self.sets.read().unwrap_or_else(|p| p.into_inner());
        match scope {
            Scope::ClusterDefault => s.default.clone(),
            Scope::ThisBroker => s.broker.clone(),
        }
    }

    /// Replaces the set `scope` names (values validated already) and
    /// persists both.
    pub fn set(&self, scope: Scope, configs: BTreeMap<String, String>) -> Result<()> {
        if scope == Scope::ClusterDefault {
            let mut p = self.published.lock().unwrap_or_else(|p| p.into_inner());
            self.replace(scope, configs.clone())?;
            *p = Some(configs);
            return Ok(());
        }
        self.replace(scope, configs)
    }

    /// Cluster mode: the cluster default set on this node since the last
    /// call, to publish.
    pub fn take_published(&self) -> Option<BTreeMap<String, String>> {
        self.published.lock().unwrap_or_else(|p| p.into_inner()).take()
    }

    /// Cluster mode: `configs` could not be published yet; again next time
    /// (unless a newer change came meanwhile).
    pub fn republish(&self, configs: BTreeMap<String, String>) {
        self.published
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get_or_insert(configs);
    }

    /// Cluster mode: the cluster default as another node set it (nothing
    /// to publish back; nothing written when it is already this).
    pub fn adopt_cluster_default(&self, configs: BTreeMap<String, String>) -> Result<()> {
        // Held throughout: a change set here meanwhile is newer than etcd's.
        let p = self.published.lock().unwrap_or_else(|p| p.into_inner());
        if p.is_some() || self.get(Scope::ClusterDefault) == configs {
            return Ok(());
        }
        self.replace(Scope::ClusterDefault, configs)
    }

    fn replace(&self, scope: Scope, configs: BTreeMap<String, String>) -> Result<()> {
        // Writers take turns; readers (every produce to a topic with
        // overrides) are locked out only for the swap, not the fsync.
        let _turn = self.writing.lock().unwrap_or_else(|p| p.into_inner());
        let mut next = self.sets.read().unwrap_or_else(|p| p.into_inner()).clone();
        match scope {
            Scope::ClusterDefault => next.default = configs,
            Scope::ThisBroker => next.broker = configs,
        }
        crate::json_file::write(&self.path, &next, false)?;
        self.any.store(
            !next.default.is_empty() || !next.broker.is_empty(),
            std::sync::atomic::Ordering::Release,
        );
        *self.sets.write().unwrap_or_else(|p| p.into_inner()) = next;
        Ok(())
    }

    /// The value of broker key `key` that applies (this broker's, else the
    /// cluster default), if one is set.
    pub fn value(&self, key: &str) -> Option<(String, Source)> {
        if !self.any.load(std::sync::atomic::Ordering::Acquire) {
            return None;
        }
        let s = self.sets.read().unwrap_or_else(|p| p.into_inner());
        s.broker
            .get(key)
            .map(|v| (v.clone(), Source::DynamicBroker))
            .or_else(|| s.default.get(key).map(|v| (v.clone(), Source::DynamicDefaultBroker)))
    }

    /// The dynamic values of broker key `key`, most specific first.
    pub fn chain(&self, key: &str) -> Vec<(String, Source)> {
        let s = self.sets.read().unwrap_or_else(|p| p.into_inner());
        let mut out = Vec::new();
        if let Some(v) = s.broker.get(key) {
            out.push((v.clone(), Source::DynamicBroker));
        }
        if let Some(v) = s.default.get(key) {
            out.push((v.clone(), Source::DynamicDefaultBroker));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::BrokerError;

    #[test]
    fn broker_keys_map_to_topic_configs_and_persist() -> Result<()> {
        assert_eq!(validate("log.retention.ms", "1000"), Ok("1000".into()));
        assert!(validate("message.max.bytes", "x").is_err_and(|e| e.contains("message.max.bytes")));
        assert!(validate("num.io.threads", "8").is_err_and(|e| e.contains("dynamically")));
        assert!(validate("log.cleanup.policy", "compact").is_err());
        let dir = tempfile::tempdir().map_err(|e| BrokerError::Io("tmp".into(), e))?;
        let d = DynamicConfigs::load(dir.path())?;
        let mut m = BTreeMap::new();
        m.insert("message.max.bytes".to_string(), "2000".to_string());
        d.set(Scope::ClusterDefault, m.clone())?;
        m.insert("message.max.bytes".to_string(), "3000".to_string());
        d.set(Scope::ThisBroker, m)?;
        let d = DynamicConfigs::load(dir.path())?;
        assert_eq!(
            d.chain("message.max.bytes"),
            vec![
                ("3000".to_string(), Source::DynamicBroker),
                ("2000".to_string(), Source::DynamicDefaultBroker)
            ]
        );
        Ok(())
    }

    #[test]
    fn a_cluster_default_set_here_is_published_once_and_one_from_etcd_is_adopted() -> Result<()> {
        let dir = tempfile::tempdir().map_err(|e| BrokerError::Io("tmp".into(), e))?;
        let d = DynamicConfigs::load(dir.path())?;
        let m: BTreeMap<String, String> = [("log.retention.ms".to_string(), "1000".to_string())].into();
        d.set(Scope::ThisBroker, m.clone())?;
        assert_eq!(d.take_published(), None, "a per-broker value stays here");
        d.set(Scope::ClusterDefault, m.clone())?;
        // Not overwritten by etcd's older value while unpublished.
        d.adopt_cluster_default(BTreeMap::new())?;
        assert_eq!(d.get(Scope::ClusterDefault), m);
        assert_eq!(d.take_published(), Some(m.clone()));
        assert_eq!(d.take_published(), None);
        let n: BTreeMap<String, String> = [("message.max.bytes".to_string(), "5000".to_string())].into();
        d.adopt_cluster_default(n.clone())?;
        assert_eq!(d.take_published(), None, "adopted, not published back");
        let d = DynamicConfigs::load(dir.path())?;
        assert_eq!(d.get(Scope::ClusterDefault), n);
        Ok(())
    }
}

//! RocketMQ subscription-group configs (Apache's `SubscriptionGroupConfig`,
//! set with `mqadmin updateSubGroup` or an admin client's
//! UPDATE_AND_CREATE_SUBSCRIPTIONGROUP): kept for the groups an operator
//! configured, in `<data_dir>/config/subscription-groups.json` — in cluster
//! mode one table for the whole cluster (etcd), as users and ACLs. A group
//! without a kept config behaves as Apache's defaults (a group is made by
//! its first member, as Apache's autoCreateSubscriptionGroup).
//!
//! Honoured: `consumeEnable` (a disabled group's RocketMQ pulls and gRPC
//! receives are NO_PERMISSION), `consumeBroadcastEnable` (a broadcasting
//! push consumer's pull is refused), `retryMaxTimes` (the reconsume limit
//! of a send-back or retry-topic send that does not carry the client's
//! own, and a gRPC consumer's max delivery attempts, retryMaxTimes + 1),
//! `consumeMessageOrderly` (gRPC consumers served FIFO, as Apache's proxy).
//! Everything else is kept and answered as set.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, RwLock};

use serde::{Deserialize, Serialize};

use crate::error::Result;

/// Apache's default reconsume limit.
pub const DEFAULT_RETRY_MAX_TIMES: i32 = 16;
/// Most bytes of one group's config as sent (the table's budget is
/// `broker.max_subscription_groups` of these).
pub const MAX_RECORD_BYTES: usize = 16 * 1024;

/// One group's config, Apache's fields and defaults; anything else the
/// admin sent (`groupRetryPolicy`, `subscriptionDataSet`) kept as sent.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct GroupConfig {
    pub consume_enable: bool,
    pub consume_from_min_enable: bool,
    pub consume_broadcast_enable: bool,
    pub consume_message_orderly: bool,
    pub retry_queue_nums: i32,
    pub retry_max_times: i32,
    pub broker_id: i64,
    pub which_broker_when_consume_slowly: i64,
    pub notify_consumer_ids_changed_enable: bool,
    pub group_sys_flag: i32,
    pub consume_timeout_minute: i32,
    #[serde(flatten)]
    pub rest: serde_json::Map<String, serde_json::Value>,
}

impl Default for GroupConfig {
    fn default() -> Self {
        GroupConfig {
            consume_enable: true,
            consume_from_min_enable: true,
            consume_broadcast_enable: true,
            consume_message_orderly: false,
            retry_queue_nums: 1,
            retry_max_times: DEFAULT_RETRY_MAX_TIMES,
            broker_id: 0,
            which_broker_when_consume_slowly: 1,
            notify_consumer_ids_changed_enable: true,
            group_sys_flag: 0,
            consume_timeout_minute: 15,
            rest: serde_json::Map::new(),
        }
    }
}

/// What the broker honours of a group's config (Apache's defaults for a
/// group without one).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Honoured {
    pub consume_enable: bool,
    pub consume_broadcast_enable: bool,
    pub retry_max_times: i32,
    /// consumeMessageOrderly: gRPC consumers are served FIFO.
    pub orderly: bool,
    /// Whether the group has a kept config at all.
    pub kept: bool,
}

impl Default for Honoured {
    fn default() -> Self {
        Honoured {
            consume_enable: true,
            consume_broadcast_enable: true,
            retry_max_times: DEFAULT_RETRY_MAX_TIMES,
            orderly: false,
            kept: false,
        }
    }
}

impl GroupConfig {
    /// An UPDATE_AND_CREATE_SUBSCRIPTIONGROUP body: the group's name and
    /// its config, or why it is refused (Apache's message where it has
    /// one: a subscription-group attribute is an "unsupported key", none
    /// being defined).
    pub fn from_request(body: &[u8]) -> std::result::Result<(String, GroupConfig), String> {
        if body.len() > MAX_RECORD_BYTES {
            return Err(format!(
                "subscription group config of {} bytes: at most {MAX_RECORD_BYTES}",
                body.len()
            ));
        }
        let mut map: serde_json::Map<String, serde_json::Value> =
            serde_json::from_slice(body).map_err(|e| format!("subscription group config: {e}"))?;
        let group = match map.remove("groupName") {
            Some(serde_json::Value::String(g)) => g,
            _ => String::new(),
        };
        match map.remove("attributes") {
            Some(serde_json::Value::Object(a)) => {
                if let Some(k) = a.keys().next() {
                    return Err(format!("unsupported key: {k}"));
                }
            }
            None | Some(serde_json::Value::Null) => {}
            Some(_) => return Err("subscription group config: attributes must be an object".into()),
        }
        // Fields Apache leaves out when null.
        map.retain(|_, v| !v.is_null());
        let config: GroupConfig = serde_json::from_value(serde_json::Value::Object(map))
            .map_err(|e| format!("subscription group config: {e}"))?;
        Ok((group, config))
    }

    /// The config as Apache answers it (GET_SUBSCRIPTIONGROUP_CONFIG, an
    /// entry of GET_ALL_SUBSCRIPTIONGROUP_CONFIG).
    pub fn to_json(&self, group: &str) -> serde_json::Value {
        let mut v = serde_json::to_value(self).unwrap_or_else(|_| serde_json::json!({}));
        if let Some(m) = v.as_object_mut() {
            m.insert("groupName".into(), group.into());
            m.insert("attributes".into(), serde_json::json!({}));
            m.entry("subscriptionDataSet").or_insert_with(|| serde_json::json!([]));
        }
        v
    }

    fn honoured(&self) -> Honoured {
        Honoured {
            consume_enable: self.consume_enable,
            consume_broadcast_enable: self.consume_broadcast_enable,
            retry_max_times: self.retry_max_times,
            orderly: self.consume_message_orderly,
            kept: true,
        }
    }
}

/// Why a change was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refused(pub String);

#[derive(Debug, Default, Serialize, Deserialize)]
struct File {
    #[serde(default)]
    groups: BTreeMap<String, GroupConfig>,
}

/// Cluster mode: groups changed here and not yet in etcd, and how many
/// changes were ever made here (each change's sequence number).
#[derive(Debug, Default)]
struct Changed {
    names: std::collections::BTreeSet<String>,
    queued: u64,
}

#[derive(Debug)]
pub struct SubscriptionGroups {
    path: PathBuf,
    table: RwLock<File>,
    /// Writers take turns (the file is written whole).
    writing: Mutex<()>,
    max: usize,
    changed: Mutex<Changed>,
    in_cluster: AtomicBool,
    written: crate::watermark::Watermark,
}

impl SubscriptionGroups {
    /// Loads `<data_dir>/config/subscription-groups.json` (absent: none).
    pub fn open(data_dir: &Path, max: usize) -> Result<SubscriptionGroups> {
        let path = data_dir.join("config").join("subscription-groups.json");
        let table: File = crate::json_file::read_or_default(&path)?;
        metrics::gauge!("rokka_subscription_groups").set(table.groups.len() as f64);
        Ok(SubscriptionGroups {
            path,
            table: RwLock::new(table),
            writing: Mutex::new(()),
            max: max.max(1),
            changed: Mutex::default(),
            in_cluster: AtomicBool::new(false),
            written: Default::default(),
        })
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, File> {
        self.table.read().unwrap_or_else(|p| p.into_inner())
    }

    /// What is honoured of `group`'s config (a pull's or send-back's
    /// look: no copy).
    pub fn honoured(&self, group: &str) -> Honoured {
        self.read()
            .groups
            .get(group)
            .map(GroupConfig::honoured)
            .unwrap_or_default()
    }

    /// `group`'s kept config.
    pub fn get(&self, group: &str) -> Option<GroupConfig> {
        self.read().groups.get(group).cloned()
    }

    /// Every kept config, by name.
    pub fn all(&self) -> BTreeMap<String, GroupConfig> {
        self.read().groups.clone()
    }

    pub fn len(&self) -> usize {
        self.read().groups.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Keeps `group`'s config (made or replaced), written to disk before
    /// it is in force; a new group beyond `broker.max_subscription_groups`
    /// is refused.
    pub fn upsert(&self, group: &str, config: GroupConfig) -> std::result::Result<(), Refused> {
        let _turn = self.turn();
        let mut next = File {
            groups: self.read().groups.clone(),
        };
        if !next.groups.contains_key(group) && next.groups.len() >= self.max {
            metrics::counter!("rokka_subscription_groups_refused_total").increment(1);
            return Err(Refused(format!(
                "subscription group {group}: the broker keeps at most {} group configs (broker.max_subscription_groups)",
                self.max
            )));
        }
        if next.groups.get(group) == Some(&config) {
            return Ok(());
        }
        next.groups.insert(group.to_string(), config);
        self.install(next, group)
    }

    /// Forgets `group`'s config (true if there was one).
    pub fn remove(&self, group: &str) -> std::result::Result<bool, Refused> {
        let _turn = self.turn();
        if !self.read().groups.contains_key(group) {
            return Ok(false);
        }
        let mut next = File {
            groups: self.read().groups.clone(),
        };
        next.groups.remove(group);
        self.install(next, group).map(|()| true)
    }

    fn turn(&self) -> std::sync::MutexGuard<'_, ()> {
        self.writing.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Writes `next` (the caller holds the turn) and puts it in force.
    fn install(&self, next: File, group: &str) -> std::result::Result<(), Refused> {
        crate::json_file::write(&self.path, &next, false).map_err(|e| {
            tracing::error!(path = %self.path.display(), error = %e, "subscription groups not written");
            Refused(format!("subscription group {group} not stored: {e}"))
        })?;
        metrics::gauge!("rokka_subscription_groups").set(next.groups.len() as f64);
        *self.table.write().unwrap_or_else(|p| p.into_inner()) = next;
        if self.in_cluster.load(Ordering::Acquire) {
            let mut c = self.lock_changed();
            c.names.insert(group.to_string());
            c.queued += 1;
        }
        Ok(())
    }

    fn lock_changed(&self) -> std::sync::MutexGuard<'_, Changed> {
        self.changed.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Cluster mode: the table is the cluster's (etcd); changes made here
    /// are handed to the controller from now on.
    pub fn join_cluster(&self) {
        self.in_cluster.store(true, Ordering::Release);
    }

    /// Cluster mode: groups changed here since the last call, with their
    /// config now (None: removed), and the last change's sequence number.
    pub fn take_changes(&self) -> (Vec<(String, Option<GroupConfig>)>, u64) {
        let (names, upto) = {
            let mut c = self.lock_changed();
            (std::mem::take(&mut c.names), c.queued)
        };
        let t = self.read();
        let changes = names
            .into_iter()
            .map(|n| {
                let c = t.groups.get(&n).cloned();
                (n, c)
            })
            .collect();
        (changes, upto)
    }

    /// Cluster mode: groups whose write to etcd failed, to try again.
    pub fn rechange(&self, names: impl IntoIterator<Item = String>) {
        self.lock_changed().names.extend(names);
    }

    /// Cluster mode: etcd holds every change up to sequence number `seq`.
    pub fn written_up_to(&self, seq: u64) {
        self.written.advance(seq);
    }

    /// The sequence number of the last change made here (0 on a single
    /// node): what [`SubscriptionGroups::replicated`] waits for.
    pub fn last_change(&self) -> u64 {
        match self.in_cluster.load(Ordering::Acquire) {
            true => self.lock_changed().queued,
            false => 0,
        }
    }

    /// Whether etcd holds every change up to `seq` within `within` (at
    /// once on a single node).
    pub async fn replicated(&self, seq: u64, within: std::time::Duration) -> bool {
        self.written.reached(seq, within).await
    }

    /// Cluster mode: the cluster's table replaces this node's (but for
    /// groups changed here and not written yet), and is kept on disk.
    pub fn replace_from_cluster(&self, mut cluster: BTreeMap<String, GroupConfig>) -> Result<()> {
        let _turn = self.turn();
        let pending = self.lock_changed().names.clone();
        let mine = self.read().groups.clone();
        for g in &pending {
            match mine.get(g) {
                Some(c) => cluster.insert(g.clone(), c.clone()),
                None => cluster.remove(g),
            };
        }
        if mine == cluster {
            return Ok(());
        }
        let next = File { groups: cluster };
        crate::json_file::write(&self.path, &next, false)?;
        metrics::gauge!("rokka_subscription_groups").set(next.groups.len() as f64);
        *self.table.write().unwrap_or_else(|p| p.into_inner()) = next;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fail(why: String) -> crate::error::BrokerError {
        crate::error::BrokerError::Corrupt(why)
    }

    fn dir(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("rokka-subgroups-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        d
    }

    /// mqadmin updateSubGroup's body: what it sets is honoured and kept
    /// across a restart; the rest is answered as sent.
    #[test]
    fn a_config_is_honoured_kept_and_answered_as_sent() -> Result<()> {
        let d = dir("kept");
        let body = br#"{"groupName":"g1","consumeEnable":false,"consumeFromMinEnable":false,
            "consumeBroadcastEnable":false,"retryMaxTimes":3,"brokerId":0,"attributes":{},
            "groupRetryPolicy":{"type":"CUSTOMIZED","customizedRetryPolicy":{"next":[1000]}},
            "subscriptionDataSet":null}"#;
        let (group, config) = GroupConfig::from_request(body).map_err(fail)?;
        assert_eq!(group, "g1");
        let t = SubscriptionGroups::open(&d, 10)?;
        assert_eq!(t.honoured("g1"), Honoured::default());
        t.upsert(&group, config).map_err(|r| fail(r.0))?;
        let want = Honoured {
            consume_enable: false,
            consume_broadcast_enable: false,
            retry_max_times: 3,
            orderly: false,
            kept: true,
        };
        assert_eq!(t.honoured("g1"), want);
        drop(t);
        let t = SubscriptionGroups::open(&d, 10)?;
        assert_eq!(t.honoured("g1"), want);
        let answer = t.get("g1").map(|c| c.to_json("g1")).unwrap_or_default();
        assert_eq!(answer["groupName"], "g1");
        assert_eq!(answer["consumeFromMinEnable"], false);
        assert_eq!(answer["groupRetryPolicy"]["customizedRetryPolicy"]["next"][0], 1000);
        assert_eq!(answer["retryQueueNums"], 1);
        assert!(t.remove("g1").map_err(|r| fail(r.0))?);
        assert!(!t.remove("g1").map_err(|r| fail(r.0))?);
        assert_eq!(SubscriptionGroups::open(&d, 10)?.honoured("g1"), Honoured::default());
        let _ = std::fs::remove_dir_all(&d);
        Ok(())
    }

    #[test]
    fn bodies_apache_would_refuse_are_refused() {
        let refused = |b: &[u8]| GroupConfig::from_request(b).err().unwrap_or_default();
        assert_eq!(
            refused(br#"{"groupName":"g","attributes":{"+x":"1"}}"#),
            "unsupported key: +x"
        );
        assert!(refused(br#"{"groupName":"g","consumeEnable":"no"}"#).contains("invalid type"));
        assert!(refused(b"[1]").contains("subscription group config"));
        let big = format!(r#"{{"groupName":"g","x":"{}"}}"#, "y".repeat(MAX_RECORD_BYTES));
        assert!(refused(big.as_bytes()).contains("at most"));
    }

    #[test]
    fn the_table_has_a_budget_and_a_replaced_config_does_not_count_twice() -> Result<()> {
        let d = dir("budget");
        let t = SubscriptionGroups::open(&d, 2)?;
        let ok = |r: std::result::Result<(), Refused>| r.is_ok();
        assert!(ok(t.upsert("a", GroupConfig::default())));
        assert!(ok(t.upsert("b", GroupConfig::default())));
        let off = GroupConfig {
            consume_enable: false,
            ..GroupConfig::default()
        };
        assert!(ok(t.upsert("b", off)));
        assert!(!ok(t.upsert("c", GroupConfig::default())));
        assert_eq!(t.len(), 2);
        let _ = std::fs::remove_dir_all(&d);
        Ok(())
    }

    /// Cluster mode: a change made here is handed out once, survives the
    /// cluster's older table until written, and the cluster's table then
    /// replaces this node's.
    #[test]
    fn cluster_changes_are_handed_out_and_the_cluster_table_wins_after() -> Result<()> {
        let d = dir("cluster");
        let t = SubscriptionGroups::open(&d, 10)?;
        t.join_cluster();
        let off = GroupConfig {
            consume_enable: false,
            ..GroupConfig::default()
        };
        t.upsert("mine", off.clone()).map_err(|r| fail(r.0))?;
        assert_eq!(t.last_change(), 1);
        // The cluster's table does not have it yet: kept.
        t.replace_from_cluster(BTreeMap::new())?;
        assert!(!t.honoured("mine").consume_enable);
        let (changes, upto) = t.take_changes();
        assert_eq!((changes, upto), (vec![("mine".to_string(), Some(off.clone()))], 1));
        t.written_up_to(upto);
        // Written: the cluster's table (another node removed it) wins.
        let mut theirs = BTreeMap::new();
        theirs.insert("other".to_string(), off);
        t.replace_from_cluster(theirs)?;
        assert!(t.honoured("mine").consume_enable);
        assert!(!t.honoured("other").consume_enable);
        let _ = std::fs::remove_dir_all(&d);
        Ok(())
    }
}

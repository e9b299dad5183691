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
use std::sync::{Mutex, RwLock};

use serde::{Deserialize, Serialize};

use crate::error::Result;
use crate::watermark::{KeyedChanges, KeyedClusterTable};

/// Apache's default reconsume limit.
pub const DEFAULT_RETRY_MAX_TIMES: i32 = 16;
/// Most bytes of one group's config as sent (Apache's are well under
/// 1 KiB; the table's budget is `broker.max_subscription_groups` of these,
/// and the cluster's copy is read whole every controller tick).
pub const MAX_RECORD_BYTES: usize = 4 * 1024;

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
    /// retryQueueNums: none (0 or less) means a failed message is not
    /// retried (Apache answers its send-back SUCCESS and drops it).
    pub retry_queue_nums: i32,
    /// notifyConsumerIdsChangedEnable: members told to rebalance when one
    /// joins or leaves by its own request (a heartbeat, an unregister).
    pub notify_ids_changed: bool,
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
            retry_queue_nums: 1,
            notify_ids_changed: true,
            kept: false,
        }
    }
}

impl GroupConfig {
    /// An UPDATE_AND_CREATE_SUBSCRIPTIONGROUP body: the group's name and
    /// its config, or why it is refused — with Apache's messages where it
    /// has them: no subscription-group attribute is defined, so an
    /// attribute is refused as AttributeUtil refuses it (`exists`: whether
    /// the group has a config already, which decides the message).
    pub fn from_request(
        body: &[u8],
        exists: impl FnOnce(&str) -> bool,
    ) -> std::result::Result<(String, GroupConfig), String> {
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
                    let real = k.strip_prefix(['+', '-']).unwrap_or(k);
                    return Err(match (exists(&group), k.chars().next()) {
                        (_, Some('+')) => format!("unsupported key: {real}"),
                        (false, _) => format!("only add attribute is supported while creating topic. key: {real}"),
                        (true, Some('-')) => format!("attempt to delete a nonexistent key: {real}"),
                        (true, _) => format!("wrong format key: {real}"),
                    });
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
            retry_queue_nums: self.retry_queue_nums,
            notify_ids_changed: self.notify_consumer_ids_changed_enable,
            kept: true,
        }
    }
}

/// The longest back-off delay told to a client (about what a protobuf
/// Duration holds, 10 000 years).
pub const MAX_BACKOFF_MS: u64 = 315_576_000_000_000;

/// A group's retry back-off for gRPC consumers (Apache's
/// GroupRetryPolicy, as its proxy sends it in the settings).
#[derive(Debug, Clone, PartialEq)]
pub enum Backoff {
    Exponential {
        initial_ms: u64,
        max_ms: u64,
        multiplier: f32,
    },
    /// The delay before each next attempt.
    Customized(Vec<u64>),
}

impl GroupConfig {
    /// The config's groupRetryPolicy, if it sets one other than Apache's
    /// default (a customized policy without its own delays).
    pub fn backoff(&self) -> Option<Backoff> {
        use serde_json::Value;
        let p = self.rest.get("groupRetryPolicy")?;
        // A delay in ms as a protobuf Duration can hold it (a negative one
        // is none; a fraction is cut).
        let delay = |v: &Value| v.as_f64().map(|ms| ms.clamp(0.0, MAX_BACKOFF_MS as f64) as u64);
        let ms =
            |v: Option<&Value>, key: &str, default: u64| v.and_then(|v| v.get(key)).and_then(delay).unwrap_or(default);
        match p.get("type").and_then(Value::as_str) {
            Some("EXPONENTIAL") => {
                let e = p.get("exponentialRetryPolicy");
                Some(Backoff::Exponential {
                    initial_ms: ms(e, "initial", 5_000),
                    max_ms: ms(e, "max", 7_200_000),
                    multiplier: e
                        .and_then(|e| e.get("multiplier"))
                        .and_then(Value::as_f64)
                        .unwrap_or(2.0) as f32,
                })
            }
            _ => {
                let next: Vec<u64> = p
                    .get("customizedRetryPolicy")?
                    .get("next")?
                    .as_array()?
                    .iter()
                    .map(|v| delay(v).unwrap_or(0))
                    .collect();
                (!next.is_empty()).then_some(Backoff::Customized(next))
            }
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

#[derive(Debug)]
pub struct SubscriptionGroups {
    path: PathBuf,
    table: RwLock<File>,
    /// Writers take turns (the file is written whole).
    writing: Mutex<()>,
    max: usize,
    /// Cluster mode: groups changed here and not yet in etcd.
    changes: KeyedChanges,
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
            changes: KeyedChanges::default(),
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

    /// `group`'s retry back-off for gRPC consumers, if its config sets one.
    pub fn backoff(&self, group: &str) -> Option<Backoff> {
        self.read().groups.get(group).and_then(GroupConfig::backoff)
    }

    /// `group`'s kept config.
    pub fn get(&self, group: &str) -> Option<GroupConfig> {
        self.read().groups.get(group).cloned()
    }

    /// Whether `group` has a kept config.
    pub fn contains(&self, group: &str) -> bool {
        self.read().groups.contains_key(group)
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

    /// Cluster mode: the changes made here (one table for the whole
    /// cluster, in etcd).
    pub fn changes(&self) -> &KeyedChanges {
        &self.changes
    }

    /// Keeps `group`'s config (made or replaced), written to disk before
    /// it is in force; a new group beyond `broker.max_subscription_groups`
    /// is refused. (Cluster mode: written to etcd even when this node's
    /// copy is the same — it may be a tick behind the cluster's.)
    pub fn upsert(&self, group: &str, config: GroupConfig) -> std::result::Result<(), Refused> {
        self.upsert_all(vec![(group.to_string(), config)])
    }

    /// [`SubscriptionGroups::upsert`] of several groups at once: all kept,
    /// in one write, or none (the budget counts every new one).
    pub fn upsert_all(&self, configs: Vec<(String, GroupConfig)>) -> std::result::Result<(), Refused> {
        let _turn = self.turn();
        let names: Vec<String> = configs.iter().map(|(g, _)| g.clone()).collect();
        self.room(&names)?;
        if configs.iter().all(|(g, c)| self.read().groups.get(g) == Some(c)) {
            names.iter().for_each(|g| self.changes.note(g));
            return Ok(());
        }
        let mut next = File {
            groups: self.read().groups.clone(),
        };
        for (group, config) in configs {
            if !next.groups.contains_key(&group) && next.groups.len() >= self.max {
                metrics::counter!("rokka_subscription_groups_refused_total").increment(1);
                return Err(Refused(format!(
                    "subscription group {group}: the broker keeps at most {} group configs (broker.max_subscription_groups)",
                    self.max
                )));
            }
            next.groups.insert(group, config);
        }
        self.install(next, &names)
    }

    /// Forgets `group`'s config (true if this node had one). (Cluster
    /// mode: the deletion is written to etcd even when this node has no
    /// copy yet — the cluster's may have come since its last tick.)
    pub fn remove(&self, group: &str) -> std::result::Result<bool, Refused> {
        let _turn = self.turn();
        self.room(&[group.to_string()])?;
        if !self.read().groups.contains_key(group) {
            self.changes.note(group);
            return Ok(false);
        }
        let mut next = File {
            groups: self.read().groups.clone(),
        };
        next.groups.remove(group);
        self.install(next, &[group.to_string()]).map(|()| true)
    }

    /// Cluster mode: refused while `broker.max_subscription_groups` changed
    /// names wait for etcd (etcd away, say), unless `names` are among them.
    fn room(&self, names: &[String]) -> std::result::Result<(), Refused> {
        if self.changes.has_room(names, self.max) {
            return Ok(());
        }
        metrics::counter!("rokka_subscription_groups_refused_total").increment(1);
        Err(Refused(format!(
            "subscription groups: {} changes made here wait for etcd (broker.max_subscription_groups): try again once it holds them",
            self.max
        )))
    }

    fn turn(&self) -> std::sync::MutexGuard<'_, ()> {
        self.writing.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Writes `next` (the caller holds the turn) and puts it in force;
    /// `changed`: the groups it changed.
    fn install(&self, next: File, changed: &[String]) -> std::result::Result<(), Refused> {
        crate::json_file::write(&self.path, &next, false).map_err(|e| {
            tracing::error!(path = %self.path.display(), error = %e, "subscription groups not written");
            let first = changed.first().map_or("", String::as_str);
            Refused(format!(
                "subscription groups ({} from {first}) not stored: {e}",
                changed.len()
            ))
        })?;
        metrics::gauge!("rokka_subscription_groups").set(next.groups.len() as f64);
        *self.table.write().unwrap_or_else(|p| p.into_inner()) = next;
        changed.iter().for_each(|g| self.changes.note(g));
        Ok(())
    }
}

impl KeyedClusterTable for SubscriptionGroups {
    type Record = GroupConfig;
    const PREFIX: &'static str = "subscription-groups/";
    const WHAT: &'static str = "subscription group";

    fn changes(&self) -> &KeyedChanges {
        &self.changes
    }

    fn record(&self, name: &str) -> Option<GroupConfig> {
        self.get(name)
    }

    fn replace_from_cluster(&self, cluster: BTreeMap<String, GroupConfig>) -> Result<()> {
        let _turn = self.turn();
        let mine = self.read().groups.clone();
        let cluster = crate::watermark::with_pending(cluster, &mine, &self.changes.pending());
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
            "notifyConsumerIdsChangedEnable":false,
            "groupRetryPolicy":{"type":"CUSTOMIZED","customizedRetryPolicy":{"next":[1000]}},
            "subscriptionDataSet":null}"#;
        let (group, config) = GroupConfig::from_request(body, |_| false).map_err(fail)?;
        assert_eq!(group, "g1");
        let t = SubscriptionGroups::open(&d, 10)?;
        assert_eq!(t.honoured("g1"), Honoured::default());
        t.upsert(&group, config).map_err(|r| fail(r.0))?;
        let want = Honoured {
            consume_enable: false,
            consume_broadcast_enable: false,
            retry_max_times: 3,
            orderly: false,
            retry_queue_nums: 1,
            notify_ids_changed: false,
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

    /// groupRetryPolicy as Apache's proxy reads it: exponential with its
    /// defaults for what is missing, customized with each delay in place
    /// (a negative one as none, a huge one bounded); none for Apache's
    /// default policy.
    #[test]
    fn the_group_retry_policy_is_read_as_the_proxy_reads_it() {
        let policy = |p: &str| {
            let body = format!(r#"{{"groupName":"g","groupRetryPolicy":{p}}}"#);
            GroupConfig::from_request(body.as_bytes(), |_| false)
                .ok()
                .and_then(|(_, c)| c.backoff())
        };
        assert_eq!(
            policy(r#"{"type":"EXPONENTIAL","exponentialRetryPolicy":{"initial":1000,"multiplier":3}}"#),
            Some(Backoff::Exponential {
                initial_ms: 1000,
                max_ms: 7_200_000,
                multiplier: 3.0
            })
        );
        assert_eq!(
            policy(r#"{"type":"CUSTOMIZED","customizedRetryPolicy":{"next":[1000,-5,1e30]}}"#),
            Some(Backoff::Customized(vec![1000, 0, MAX_BACKOFF_MS]))
        );
        assert_eq!(policy(r#"{"type":"CUSTOMIZED"}"#), None);
        assert_eq!(GroupConfig::default().backoff(), None);
    }

    #[test]
    fn bodies_apache_would_refuse_are_refused() {
        let refused = |b: &[u8]| GroupConfig::from_request(b, |g| g == "old").err().unwrap_or_default();
        // Apache's AttributeUtil, no attribute being defined.
        let attrs = |g: &str, k: &str| format!(r#"{{"groupName":"{g}","attributes":{{"{k}":"1"}}}}"#);
        assert_eq!(refused(attrs("g", "+x").as_bytes()), "unsupported key: x");
        assert_eq!(
            refused(attrs("g", "x").as_bytes()),
            "only add attribute is supported while creating topic. key: x"
        );
        assert_eq!(refused(attrs("old", "+x").as_bytes()), "unsupported key: x");
        assert_eq!(
            refused(attrs("old", "-x").as_bytes()),
            "attempt to delete a nonexistent key: x"
        );
        assert_eq!(refused(attrs("old", "x").as_bytes()), "wrong format key: x");
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
        // A list is kept whole or not at all.
        let t = SubscriptionGroups::open(&d, 3)?;
        let list = |names: &[&str]| names.iter().map(|n| (n.to_string(), GroupConfig::default())).collect();
        assert!(!ok(t.upsert_all(list(&["a", "c", "d"]))), "two new past 3");
        assert_eq!((t.len(), t.contains("c")), (2, false));
        assert!(ok(t.upsert_all(list(&["a", "c"]))));
        assert_eq!(t.len(), 3);
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
        t.changes().join_cluster();
        let off = GroupConfig {
            consume_enable: false,
            ..GroupConfig::default()
        };
        t.upsert("mine", off.clone()).map_err(|r| fail(r.0))?;
        assert_eq!(t.changes().last_change(), 1);
        // The cluster's table does not have it yet: kept.
        t.replace_from_cluster(BTreeMap::new())?;
        assert!(!t.honoured("mine").consume_enable);
        let (changes, upto) = t.take_changes();
        assert_eq!((changes, upto), (vec![("mine".to_string(), Some(off.clone()))], 1));
        t.changes().written_up_to(upto);
        // Written: the cluster's table (another node removed it) wins.
        let mut theirs = BTreeMap::new();
        theirs.insert("other".to_string(), off);
        t.replace_from_cluster(theirs.clone())?;
        assert!(t.honoured("mine").consume_enable);
        assert!(!t.honoured("other").consume_enable);
        // A deletion here, pending: the cluster's copy does not bring the
        // config back until etcd has the deletion.
        assert!(t.remove("other").map_err(|r| fail(r.0))?);
        t.replace_from_cluster(theirs.clone())?;
        assert!(t.get("other").is_none(), "a pending deletion holds");
        // A node a tick behind (no copy yet) deleting, or setting what it
        // already has: still written to etcd.
        let _ = t.take_changes();
        assert!(!t.remove("not-here-yet").map_err(|r| fail(r.0))?);
        let (changes, _) = t.take_changes();
        assert_eq!(changes, vec![("not-here-yet".to_string(), None)]);
        t.upsert("same", GroupConfig::default()).map_err(|r| fail(r.0))?;
        let _ = t.take_changes();
        t.upsert("same", GroupConfig::default()).map_err(|r| fail(r.0))?;
        let (changes, _) = t.take_changes();
        assert_eq!(
            changes,
            vec![("same".to_string(), Some(GroupConfig::default()))],
            "an unchanged upsert is written again"
        );
        let _ = std::fs::remove_dir_all(&d);
        Ok(())
    }

    /// Cluster mode with etcd away: the changed names waiting for it are
    /// bounded by the table's budget (deletions of names never held are
    /// queued too, so a client deleting random names would otherwise grow
    /// the queue without end); once taken, there is room again.
    #[test]
    fn changes_waiting_for_etcd_are_bounded() -> Result<()> {
        let d = dir("backlog");
        let t = SubscriptionGroups::open(&d, 3)?;
        t.changes().join_cluster();
        for g in ["x1", "x2", "x3"] {
            assert!(!t.remove(g).map_err(|r| fail(r.0))?);
        }
        let refused = t.remove("x4").err().map(|r| r.0).unwrap_or_default();
        assert!(refused.contains("wait for etcd"), "{refused}");
        assert!(t.upsert("x4", GroupConfig::default()).is_err());
        // A name already waiting is no more to wait for: an operator can
        // still correct it.
        assert!(t.upsert("x1", GroupConfig::default()).is_ok());
        // Taken by the controller and not written yet: still counted.
        let (changes, upto) = t.take_changes();
        assert_eq!(changes.len(), 3);
        assert!(t.remove("x5").is_err(), "taken, not written: no room yet");
        // etcd away: the controller hands them back; still bounded.
        t.changes().rechange(changes.iter().map(|(n, _)| n.clone()));
        assert!(t.remove("x6").is_err());
        // Written: room again, and a list is let in whole below the limit
        // (never refused on its own).
        let _ = t.take_changes();
        t.changes().written_up_to(upto);
        let list = ["y1", "y2"].map(|g| (g.to_string(), GroupConfig::default()));
        assert!(t.upsert_all(list.to_vec()).is_ok(), "room once written");
        let _ = std::fs::remove_dir_all(&d);
        Ok(())
    }
}

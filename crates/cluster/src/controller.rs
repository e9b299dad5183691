//! The controller, on etcd: each node keeps a lease and its registration
//! under it; each set's state (master, epoch, sync state set) is one key
//! changed only by transactions that compare its revision, so two nodes
//! never both win an election or overwrite each other's change.
//!
//! ```text
//! /rokka/<cluster>/nodes/<id>        NodeInfo (JSON), under the node's lease
//! /rokka/<cluster>/sets/<set>/state  SetState (JSON)
//! ```
//!
//! Every `poll_interval_ms` a node reads the prefix and acts:
//! * no state yet: the first node to create it is master of epoch 1;
//! * the state names a live master: this node follows it (or, being it,
//!   keeps the sync state set current: replicas caught up within
//!   `replica_lag_max_ms` in, others out);
//! * the master's lease is gone: the live sync-state-set member with the
//!   lowest id elects itself (epoch + 1); with `unclean_election`, any live
//!   member when none of the set is alive;
//! * the state names this node but it is not master in this process (it
//!   restarted, or lost its lease): it hands the set over — it may have
//!   lost an unflushed tail the others hold.
//!
//! A master whose lease may have expired (no keep-alive answer for the
//! TTL less half a second) fences itself at once: no client write, no
//! acknowledgement.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

use etcd_client::{Client, Compare, CompareOp, ConnectOptions, GetOptions, PutOptions, Txn, TxnOp};
use rokka_broker::cluster_view::{ClusterView, NodeInfo, SetView};
use rokka_broker::watermark::KeyedClusterTable;
use rokka_broker::TopicInfo;
use serde::{Deserialize, Serialize};

use crate::{Role, Shared};

/// Most bytes of the cluster's table one controller read takes from etcd.
const ETCD_MAX_READ_BYTES: usize = 256 * 1024 * 1024;

/// Most writes of a keyed table (users, subscription-group configs) in one
/// etcd transaction: under etcd's default `--max-txn-ops` (128), and at
/// 4 KiB per record under its 1.5 MiB request limit.
const KEYED_TXN_OPS: usize = 64;

/// One set's controller state.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SetState {
    pub master: Option<u32>,
    pub epoch: u32,
    /// Sync state set (Kafka ISR), master included.
    pub sss: Vec<u32>,
}

impl SetState {
    /// As read from etcd: the sync state set sorted, each member once (a
    /// member written twice would count twice toward
    /// `min_insync_replicas`).
    fn read(value: &[u8]) -> Result<SetState, serde_json::Error> {
        let mut s: SetState = serde_json::from_slice(value)?;
        s.sss.sort_unstable();
        s.sss.dedup();
        Ok(s)
    }
}

pub struct Controller {
    sh: Arc<Shared>,
    client: Client,
    me: NodeInfo,
    lease: i64,
    /// The lease the keep-alive task renews (set when it starts).
    lease_id: Option<Arc<std::sync::atomic::AtomicI64>>,
    prefix: String,
    /// (etcd revision, local topic-table version, master) at the last
    /// topic sync.
    synced: Option<(i64, u64, bool)>,
    /// Every local consumer group is to be published again (a new lease
    /// took the old keys with it).
    publish_all_groups: bool,
    /// The revision of this set's state last logged as unreadable.
    unreadable_logged: Option<i64>,
    /// Publishing group members to etcd failed last step (logged once).
    groups_failing: bool,
    /// Since when this set's state has been missing from etcd (a node
    /// with a history waits for the master to write it again).
    state_missing_since: Option<Instant>,
    /// Most writes of a keyed table in one etcd transaction: KEYED_TXN_OPS,
    /// halved each time etcd refuses a transaction as too large (it was
    /// started with a smaller --max-txn-ops or request size).
    keyed_txn_ops: usize,
}

type Res<T> = Result<T, String>;

fn err(what: &str) -> impl Fn(etcd_client::Error) -> String + '_ {
    move |e| format!("etcd {what}: {e}")
}

impl Controller {
    /// Connects to etcd, takes a lease and registers this node.
    pub async fn connect(sh: Arc<Shared>, me: NodeInfo) -> Res<Controller> {
        let opts = ConnectOptions::new()
            .with_connect_timeout(Duration::from_secs(2))
            .with_timeout(Duration::from_secs(2));
        let client = Client::connect(&sh.cfg.etcd_endpoints, Some(opts))
            .await
            .map_err(err("connect"))?;
        let prefix = format!("/rokka/{}/", sh.cfg.name);
        let mut c = Controller {
            sh,
            client,
            me,
            lease: 0,
            lease_id: None,
            prefix,
            synced: None,
            publish_all_groups: true,
            unreadable_logged: None,
            groups_failing: false,
            state_missing_since: None,
            keyed_txn_ops: KEYED_TXN_OPS,
        };
        c.register().await?;
        let secret = c.cluster_secret().await?;
        c.sh.broker.set_cluster_secret(secret);
        Ok(c)
    }

    /// The secret the cluster's own calls between sets are signed with
    /// (rokka_broker::internal): made by the first node that finds none,
    /// read by every other.
    async fn cluster_secret(&mut self) -> Res<rokka_broker::internal::ClusterSecret> {
        let key = format!("{}internal/secret", self.prefix);
        let fresh = rokka_broker::internal::ClusterSecret::generate()?;
        let txn = Txn::new()
            .when([Compare::version(key.clone(), CompareOp::Equal, 0)])
            .and_then([TxnOp::put(key.clone(), fresh, None)]);
        self.client.txn(txn).await.map_err(err("cluster secret"))?;
        let got = self
            .client
            .get(key.clone(), None)
            .await
            .map_err(err("cluster secret"))?;
        let stored = got
            .kvs()
            .first()
            .and_then(|kv| kv.value_str().ok())
            .ok_or_else(|| format!("etcd {key}: no cluster secret"))?;
        rokka_broker::internal::ClusterSecret::from_stored(stored)
            .ok_or_else(|| format!("etcd {key}: not a cluster secret (32 bytes or more, base64)"))
    }

    /// Where this node's broker creates topics first.
    pub fn topic_creator(&self) -> EtcdTopics {
        EtcdTopics {
            client: self.client.clone(),
            prefix: self.prefix.clone(),
            handle: tokio::runtime::Handle::current(),
        }
    }

    fn node_key(&self, id: u32) -> String {
        format!("{}nodes/{id}", self.prefix)
    }

    fn state_key(&self) -> String {
        format!("{}sets/{}/state", self.prefix, self.sh.cfg.broker_set)
    }

    async fn register(&mut self) -> Res<()> {
        let ttl = i64::from(self.sh.cfg.lease_ttl_secs);
        let sent = Instant::now();
        let lease = self.client.lease_grant(ttl, None).await.map_err(err("lease grant"))?;
        self.lease = lease.id();
        lease_renewed(&self.sh, sent, lease.ttl());
        if let Some(id) = &self.lease_id {
            id.store(self.lease, std::sync::atomic::Ordering::Release);
        }
        self.put_me().await?;
        tracing::info!(node = self.me.id, set = %self.me.set, lease = self.lease, "registered in etcd");
        self.publish_all_groups = true;
        Ok(())
    }

    /// This node's registration, under its lease (whether its log has an
    /// epoch history as of now).
    async fn put_me(&mut self) -> Res<()> {
        let mut me = self.me.clone();
        me.has_history = !self.sh.store.epochs().is_empty();
        let json = serde_json::to_vec(&me).map_err(|e| e.to_string())?;
        let key = self.node_key(me.id);
        self.client
            .put(key, json, Some(PutOptions::new().with_lease(self.lease)))
            .await
            .map_err(err("register"))?;
        // Only once etcd has it (a failed put is tried again next step).
        self.me = me;
        Ok(())
    }

    /// Runs until `stop`: keep-alives, the fencing watchdog and the
    /// controller loop.
    pub async fn run(mut self, mut stop: tokio::sync::watch::Receiver<bool>) {
        let sh = Arc::clone(&self.sh);
        // Fencing watchdog: a master whose lease may be gone stops at once.
        let mut st = stop.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_millis(50));
            loop {
                tokio::select! {
                    _ = tick.tick() => {}
                    _ = st.changed() => return,
                }
                let valid = *sh.lease_valid_until.lock().unwrap_or_else(|p| p.into_inner());
                if matches!(sh.role(), Role::Master { .. }) && valid.is_none_or(|v| Instant::now() > v) {
                    tracing::error!("lease may have expired: fencing this master");
                    metrics::counter!("rokka_cluster_fenced_total").increment(1);
                    sh.set_role(Role::Fenced);
                }
            }
        });
        // Keep-alives run on their own, so a slow controller step (an etcd
        // call, a truncation) never delays them past the lease.
        let lease = Arc::new(std::sync::atomic::AtomicI64::new(self.lease));
        self.lease_id = Some(Arc::clone(&lease));
        let ka_client = self.client.clone();
        let ka_sh = Arc::clone(&self.sh);
        let mut ka_stop = stop.clone();
        tokio::spawn(async move {
            let mut client = ka_client;
            let period = Duration::from_millis(u64::from(ka_sh.cfg.lease_ttl_secs) * 1000 / 3);
            let mut keep = tokio::time::interval(period);
            keep.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tokio::select! {
                    _ = keep.tick() => {}
                    _ = ka_stop.changed() => return,
                }
                let id = lease.load(std::sync::atomic::Ordering::Acquire);
                if let Err(e) = keep_alive(&mut client, &ka_sh, id).await {
                    tracing::warn!(error = e, "lease keep-alive failed");
                }
            }
        });
        let mut poll = tokio::time::interval(Duration::from_millis(self.sh.cfg.poll_interval_ms.max(20)));
        poll.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = poll.tick() => {
                    if let Err(e) = self.tick().await {
                        tracing::warn!(error = e, "controller step failed");
                        metrics::counter!("rokka_cluster_controller_errors_total").increment(1);
                    }
                }
                _ = stop.changed() => {
                    // Leave at once rather than after the lease's TTL.
                    let _ = self.client.lease_revoke(self.lease).await;
                    return;
                }
            }
        }
    }

    /// One controller step.
    async fn tick(&mut self) -> Res<()> {
        // The cluster's whole table in one read: past the client's 4 MiB
        // default (topics, users, ACLs, subscription-group configs at
        // their budgets) every tick would fail on every node.
        let resp = self
            .client
            .kv_client()
            .max_decoding_message_size(ETCD_MAX_READ_BYTES)
            .get(self.prefix.clone(), Some(GetOptions::new().with_prefix()))
            .await
            .map_err(err("get"))?;
        let mut nodes: Vec<NodeInfo> = Vec::new();
        let mut state: Option<(SetState, i64)> = None;
        // This set's state, there but unreadable: (why, its revision).
        let mut unreadable: Option<(String, i64)> = None;
        let mut topics: BTreeMap<String, TopicInfo> = BTreeMap::new();
        // Every set's state and drain mark (the cluster view carries them).
        let mut others: BTreeMap<String, SetState> = BTreeMap::new();
        let mut draining: std::collections::BTreeSet<String> = Default::default();
        let sets_prefix = format!("{}sets/", self.prefix);
        // Consumer-group members other nodes know (members/<node>/<group>).
        let members_prefix = format!("{}members/", self.prefix);
        let mut remote_members: HashMap<u32, HashMap<String, rokka_broker::membership::GroupMembers>> = HashMap::new();
        let state_key = self.state_key();
        let topics_prefix = format!("{}topics/", self.prefix);
        // Deleted topics' incarnations: deleted-topics/<name>/<topic id>.
        let tombstones_prefix = format!("{}deleted-topics/", self.prefix);
        let mut tombstones: std::collections::BTreeSet<(String, [u8; 16])> = Default::default();
        // Each topic key's revision: a deletion removes only the version it saw.
        let mut topic_revisions: BTreeMap<String, i64> = BTreeMap::new();
        // Users and their SCRAM credentials: one table for the cluster.
        let mut users = Keyed::<rokka_broker::users::Users>::default();
        // ACLs: one table for the cluster (acls/<digest of the ACL>).
        let acls_prefix = format!("{}acls/", self.prefix);
        let mut acls: BTreeMap<String, rokka_broker::acl::Acl> = BTreeMap::new();
        // RocketMQ subscription-group configs: one table for the cluster.
        let mut sub_groups = Keyed::<rokka_broker::sub_groups::SubscriptionGroups>::default();
        let default_key = self.broker_default_key();
        // None: absent; Some(None): there but unreadable.
        let mut broker_default: Option<Option<BTreeMap<String, String>>> = None;
        for kv in resp.kvs() {
            let key = kv.key_str().unwrap_or("");
            if key == default_key {
                broker_default = Some(match serde_json::from_slice(kv.value()) {
                    Ok(m) => Some(m),
                    Err(e) => {
                        tracing::warn!(key, error = %e, "unreadable cluster-default broker configs in etcd; not applied");
                        None
                    }
                });
            } else if let Some(digest) = key.strip_prefix(&acls_prefix) {
                match serde_json::from_slice(kv.value()) {
                    Ok(a) => {
                        acls.insert(digest.to_string(), a);
                    }
                    Err(e) => tracing::warn!(key, error = %e, "unreadable ACL in etcd; not applied"),
                }
            } else if keyed(&self.prefix, key, kv.value(), &mut users)
                || keyed(&self.prefix, key, kv.value(), &mut sub_groups)
            {
            } else if let Some(name) = key.strip_prefix(&topics_prefix) {
                if let Ok(t) = serde_json::from_slice::<TopicInfo>(kv.value()) {
                    topics.insert(name.to_string(), t);
                    topic_revisions.insert(name.to_string(), kv.mod_revision());
                }
            } else if let Some(rest) = key.strip_prefix(&tombstones_prefix) {
                if let Some(t) = rest
                    .rsplit_once('/')
                    .and_then(|(n, id)| Some((n.to_string(), topic_id_of(id)?)))
                {
                    tombstones.insert(t);
                }
            } else if key.starts_with(&format!("{}nodes/", self.prefix)) {
                if let Ok(n) = serde_json::from_slice::<NodeInfo>(kv.value()) {
                    nodes.push(n);
                }
            } else if key == state_key {
                match SetState::read(kv.value()) {
                    Ok(s) => state = Some((s, kv.mod_revision())),
                    Err(e) => unreadable = Some((e.to_string(), kv.mod_revision())),
                }
            } else if let Some(rest) = key.strip_prefix(&members_prefix) {
                let Some((node, group)) = rest.split_once('/') else {
                    continue;
                };
                match (node.parse::<u32>(), serde_json::from_slice(kv.value())) {
                    (Ok(node), Ok(m)) if node != self.me.id => {
                        remote_members.entry(node).or_default().insert(group.to_string(), m);
                    }
                    (Ok(_), Ok(_)) => {}
                    _ => tracing::debug!(key, "unreadable group members in etcd"),
                }
            } else if let Some(rest) = key.strip_prefix(&sets_prefix) {
                if let Some(set) = rest.strip_suffix("/state") {
                    match SetState::read(kv.value()) {
                        Ok(s) => {
                            others.insert(set.to_string(), s);
                        }
                        Err(e) => tracing::warn!(key, error = %e, "unreadable set state in etcd"),
                    }
                } else if let Some(set) = rest.strip_suffix("/draining") {
                    draining.insert(set.to_string());
                }
            }
        }
        nodes.sort_by_key(|n| n.id);
        if !nodes.iter().any(|n| n.id == self.me.id) {
            // Our registration is gone with our lease.
            if matches!(self.sh.role(), Role::Master { .. }) {
                self.sh.set_role(Role::Fenced);
            }
            self.register().await?;
            return Ok(());
        }
        // Its log gained (or lost) an epoch history since it registered.
        if self.me.has_history == self.sh.store.epochs().is_empty() {
            self.put_me().await?;
        }
        self.sh.broker.membership().set_remote(remote_members);
        // A put etcd refuses (a group's members past its request limit)
        // must not stop this step's election, hand-over or sync-state-set
        // work: logged, and tried again next step.
        if let Err(e) = self.publish_groups().await {
            metrics::counter!("rokka_cluster_group_publish_failures_total").increment(1);
            if !self.groups_failing {
                tracing::warn!(error = %e, "publishing this node's group members to etcd failed; retrying each step");
                self.groups_failing = true;
            }
        } else if std::mem::take(&mut self.groups_failing) {
            tracing::info!("group members published to etcd again");
        }
        let live: Vec<u32> = nodes.iter().filter(|n| n.set == self.me.set).map(|n| n.id).collect();
        self.sh.set_addrs(
            nodes
                .iter()
                .map(|n| (n.id, n.replication.clone()))
                .collect::<HashMap<_, _>>(),
        );
        let me = self.me.id;
        let role = self.sh.role();
        metrics::gauge!("rokka_cluster_state_unreadable").set(if unreadable.is_some() { 1.0 } else { 0.0 });
        match &unreadable {
            // No election, hand-over or sync-state-set change on a state
            // this node cannot read (every node reads the same bytes: none
            // acts on them); roles stay as they are and the rest of the
            // step (users, ACLs, topics) goes on. Logged once per revision.
            Some((why, rev)) if self.unreadable_logged != Some(*rev) => {
                tracing::error!(
                    key = state_key,
                    error = why,
                    "this broker set's state in etcd is unreadable: no election until it is repaired"
                );
                self.unreadable_logged = Some(*rev);
            }
            Some(_) => {}
            None => self.unreadable_logged = None,
        }
        if state.is_some() {
            self.state_missing_since = None;
        }
        match state {
            None if unreadable.is_some() => {}
            // The master of this process, its state gone from etcd (etcd
            // wiped or restored from an old snapshot): it writes it again as
            // it stands — its epoch, its sync state set — and stays master.
            None if matches!(role, Role::Master { .. }) => {
                let epoch = match role {
                    Role::Master { epoch } => epoch,
                    _ => 0,
                };
                let named = self.sh.named();
                let sss = if named.contains(&me) { named } else { vec![me] };
                let st = SetState {
                    master: Some(me),
                    epoch,
                    sss,
                };
                if self.put_state(&st, None).await? {
                    tracing::warn!(epoch, sss = ?st.sss, "this set's state was missing from etcd: written again by its master");
                    self.publish(&nodes, &st, &others, &draining);
                }
            }
            None => {
                // A new set (no live node of it has an epoch history) is
                // taken at once. Otherwise the state went missing (etcd
                // wiped or restored): a live master writes it again, so a
                // node waits two lease lives for that — a replica behind the
                // master taking the set would make the master cut its log
                // to the replica's end — and then only a node with a
                // history takes it (a fresh one would make every other log
                // start over).
                let mine = !self.sh.store.epochs().is_empty();
                let any_history = mine
                    || nodes
                        .iter()
                        .any(|n| n.set == self.me.set && n.id != me && n.has_history);
                let since = *self.state_missing_since.get_or_insert_with(Instant::now);
                let wait = Duration::from_secs(2 * u64::from(self.sh.cfg.lease_ttl_secs));
                if !any_history || (mine && since.elapsed() >= wait) {
                    let st = SetState {
                        master: Some(me),
                        epoch: self.next_epoch(0)?,
                        sss: vec![me],
                    };
                    if self.put_state(&st, None).await? {
                        self.become_master(&st)?;
                        self.publish(&nodes, &st, &others, &draining);
                    }
                }
            }
            Some((st, rev)) => {
                let master_alive = st.master.is_some_and(|m| live.contains(&m));
                match st.master {
                    Some(m) if m == me && role == (Role::Master { epoch: st.epoch }) => {
                        // etcd's set, and the replicas gated to join it
                        // (acknowledgements keep waiting for them).
                        let mut local = st.sss.clone();
                        local.extend(self.sh.sss().into_iter().filter(|id| !st.sss.contains(id)));
                        local.sort_unstable();
                        self.sh.set_sss(local);
                        self.sh.set_named(st.sss.clone());
                        if self.sh.newer_epoch() > st.epoch {
                            self.sh.set_role(Role::Fenced);
                        } else {
                            self.maintain_sss(&st, rev, &live).await?;
                        }
                    }
                    Some(m) if m == me => {
                        // Named master, but not in this process: hand over
                        // to another live member of the sync state set, or
                        // take it again if none is left.
                        let others: Vec<u32> = st
                            .sss
                            .iter()
                            .copied()
                            .filter(|id| *id != me && live.contains(id))
                            .collect();
                        let next = if others.is_empty() {
                            SetState {
                                master: Some(me),
                                epoch: self.next_epoch(st.epoch)?,
                                sss: vec![me],
                            }
                        } else {
                            SetState {
                                master: None,
                                // A newer epoch a replica showed this node
                                // (its history is past etcd's): the next
                                // election goes above it.
                                epoch: st.epoch.max(self.sh.newer_epoch()),
                                sss: others,
                            }
                        };
                        if self.put_state(&next, Some(rev)).await? && next.master == Some(me) {
                            self.become_master(&next)?;
                        } else {
                            self.sh.set_role(Role::Unknown);
                        }
                    }
                    Some(m) if master_alive => {
                        self.sh.set_sss(st.sss.clone());
                        self.sh.set_named(st.sss.clone());
                        self.sh.set_role(Role::Replica {
                            master: m,
                            epoch: st.epoch,
                        });
                    }
                    _ => {
                        // No live master: the lowest live sync-state-set
                        // member elects itself.
                        let mut candidates: Vec<u32> = st.sss.iter().copied().filter(|id| live.contains(id)).collect();
                        if candidates.is_empty() && self.sh.cfg.unclean_election {
                            candidates = live.clone();
                        }
                        // A member back with an empty log (its disk lost or
                        // replaced while etcd still names it) is elected only
                        // if no candidate has an epoch history: electing it
                        // would make every other log cut to its empty one.
                        let history = |id: u32| {
                            if id == me {
                                !self.sh.store.epochs().is_empty()
                            } else {
                                nodes.iter().any(|n| n.id == id && n.has_history)
                            }
                        };
                        candidates = prefer_history(candidates, history);
                        if candidates.first() == Some(&me) {
                            let next = SetState {
                                master: Some(me),
                                epoch: self.next_epoch(st.epoch)?,
                                sss: candidates,
                            };
                            if self.put_state(&next, Some(rev)).await? {
                                metrics::counter!("rokka_cluster_elections_total").increment(1);
                                tracing::warn!(epoch = next.epoch, sss = ?next.sss, old = ?st.master, "elected master");
                                self.become_master(&next)?;
                            }
                        } else if matches!(role, Role::Master { .. }) {
                            self.sh.set_role(Role::Fenced);
                        }
                    }
                }
                self.publish(&nodes, &self.current_state(st), &others, &draining);
            }
        }
        let revision = resp.header().map_or(0, |h| h.revision());
        let sh = Arc::clone(&self.sh);
        // Each table on its own: one that fails (etcd refusing a write,
        // a table's file not written here) does not hold back the others.
        let synced = [
            self.sync_keyed(sh.broker.users(), users.0).await,
            self.sync_acls(acls).await,
            self.sync_keyed(sh.broker.sub_groups(), sub_groups.0).await,
            self.sync_broker_default(broker_default).await,
            self.sync_topics(topics, &topic_revisions, &tombstones, revision).await,
        ];
        let failed: Vec<String> = synced.into_iter().filter_map(Result::err).collect();
        match failed.is_empty() {
            true => Ok(()),
            false => Err(failed.join("; ")),
        }
    }

    /// Writes this node's consumer-group members that changed (under its
    /// lease: they go with it), so every node answers a RocketMQ client's
    /// member list, and allocates a mixed group, with the whole cluster's.
    async fn publish_groups(&mut self) -> Res<()> {
        let membership = self.sh.broker.membership();
        let changes = membership.take_local_changes(std::mem::take(&mut self.publish_all_groups));
        for (i, (group, members)) in changes.iter().enumerate() {
            let key = format!("{}members/{}/{group}", self.prefix, self.me.id);
            let res = match members {
                Some(m) => {
                    let json = serde_json::to_vec(m).map_err(|e| e.to_string())?;
                    self.client
                        .put(key, json, Some(PutOptions::new().with_lease(self.lease)))
                        .await
                        .map(|_| ())
                }
                None => self.client.delete(key, None).await.map(|_| ()),
            };
            if let Err(e) = res {
                membership.republish(changes[i..].iter().map(|(g, _)| g.clone()));
                return Err(format!("etcd put group members: {e}"));
            }
        }
        Ok(())
    }

    /// A keyed cluster table's records changed on this node go to etcd
    /// (users, subscription-group configs; per name the last writer wins,
    /// as Kafka's credentials in its metadata log, as each Apache broker
    /// takes an admin's last update); then etcd's table is this node's.
    async fn sync_keyed<T: KeyedClusterTable>(
        &mut self,
        table: &T,
        mut in_etcd: BTreeMap<String, T::Record>,
    ) -> Res<()> {
        let (changes, upto) = table.take_changes();
        // Every change is written, even one etcd seemed to hold as is (or a
        // deletion of a name it seemed not to hold): `in_etcd` was read
        // before this node's changes were taken, and another node may have
        // written the name since — skipping would leave its record in
        // force and tell this node's client its change is held.
        // In transactions of up to `keyed_txn_ops` (one round trip each, not
        // one per name: a 10 000-group list is ~160 of them), each applied
        // whole or not at all.
        let mut at = 0;
        while at < changes.len() {
            let chunk = &changes[at..(at + self.keyed_txn_ops).min(changes.len())];
            let mut ops = Vec::with_capacity(chunk.len());
            for (name, record) in chunk {
                let key = format!("{}{}{name}", self.prefix, T::PREFIX);
                ops.push(match record {
                    Some(r) => TxnOp::put(key, serde_json::to_vec(r).map_err(|e| e.to_string())?, None),
                    None => TxnOp::delete(key, None),
                });
            }
            match self.client.txn(Txn::new().and_then(ops)).await {
                Ok(_) => {}
                // Too many operations, or too large, for this etcd: smaller
                // transactions from now on.
                Err(etcd_client::Error::GRpcStatus(st))
                    if st.code() == tonic::Code::InvalidArgument && chunk.len() > 1 =>
                {
                    self.keyed_txn_ops = (chunk.len() / 2).max(1);
                    tracing::warn!(
                        ops = self.keyed_txn_ops,
                        error = st.message(),
                        "etcd refused a transaction as too large: writing {} in smaller ones",
                        T::WHAT
                    );
                    continue;
                }
                Err(e) => {
                    table.changes().rechange(changes[at..].iter().map(|(n, _)| n.clone()));
                    return Err(format!("etcd put {}: {e}", T::WHAT));
                }
            }
            for (name, record) in chunk {
                match record {
                    Some(r) => in_etcd.insert(name.clone(), r.clone()),
                    None => in_etcd.remove(name),
                };
            }
            at += chunk.len();
        }
        // Requests waiting on these (AlterUserScramCredentials, AUTH_*,
        // UPDATE_AND_CREATE_SUBSCRIPTIONGROUP) are answered now.
        table.changes().written_up_to(upto);
        // Writes (and fsyncs) the table's file when it changed: off the runtime.
        rokka_broker::offload(|| table.replace_from_cluster(in_etcd)).map_err(|e| format!("{} table: {e}", T::WHAT))
    }

    /// ACLs created or deleted on this node go to etcd (one key each);
    /// then etcd's table is this node's.
    async fn sync_acls(&mut self, mut in_etcd: BTreeMap<String, rokka_broker::acl::Acl>) -> Res<()> {
        let table = self.sh.broker.acls();
        let (changes, upto) = table.take_changes();
        for (i, (acl, added)) in changes.iter().enumerate() {
            let digest = rokka_broker::acl::cluster_key(acl);
            let key = format!("{}acls/{digest}", self.prefix);
            let res = match added {
                true => match serde_json::to_vec(acl) {
                    Ok(json) => self
                        .client
                        .put(key, json, None)
                        .await
                        .map(|_| ())
                        .map_err(|e| e.to_string()),
                    Err(e) => Err(e.to_string()),
                },
                false => self
                    .client
                    .delete(key, None)
                    .await
                    .map(|_| ())
                    .map_err(|e| e.to_string()),
            };
            if let Err(e) = res {
                table.rechange(changes[i..].to_vec());
                return Err(format!("etcd put ACL: {e}"));
            }
            match added {
                true => in_etcd.insert(digest, acl.clone()),
                false => in_etcd.remove(&digest),
            };
        }
        // CreateAcls / DeleteAcls waiting on these are answered now.
        table.written_up_to(upto);
        // Writes (and fsyncs) acls.json when it changed: off the runtime.
        rokka_broker::offload(|| table.replace_from_cluster(in_etcd.into_values()))
            .map_err(|e| format!("ACL table: {e}"))
    }

    fn broker_default_key(&self) -> String {
        format!("{}configs/broker-default", self.prefix)
    }

    /// Dynamic broker configs set for the whole cluster (AlterConfigs on
    /// BROKER "") live in etcd: a node that took such a change writes it
    /// (the last writer wins, as in Kafka), every node takes etcd's.
    /// Per-broker values stay with their node.
    async fn sync_broker_default(&mut self, in_etcd: Option<Option<BTreeMap<String, String>>>) -> Res<()> {
        let dynamic = self.sh.broker.dynamic_configs();
        let mut mine = dynamic.take_published();
        if mine.is_none() && in_etcd.is_none() {
            // None in etcd yet (a cluster's first start, or nodes upgraded
            // from before it was shared): this node's own default, if it
            // has one, becomes the cluster's rather than being erased.
            let local = dynamic.get(rokka_broker::dynamic::Scope::ClusterDefault);
            if !local.is_empty() {
                mine = Some(local);
            }
        }
        if let Some(mine) = mine {
            let json = serde_json::to_vec(&mine).map_err(|e| e.to_string())?;
            if let Err(e) = self.client.put(self.broker_default_key(), json, None).await {
                // Published on the next poll.
                dynamic.republish(mine);
                return Err(format!("put broker default: {e}"));
            }
            return Ok(());
        }
        match in_etcd {
            // Writes and fsyncs the node's file: off the async worker.
            Some(Some(m)) => tokio::task::block_in_place(|| dynamic.adopt_cluster_default(m))
                .map_err(|e| format!("cluster-default broker configs: {e}")),
            _ => Ok(()),
        }
    }

    /// The topic table lives in etcd, in its cluster form (every set's
    /// partitions and their placement): each node writes the topics it
    /// created (if absent), changed (partitions added, configs: the last
    /// writer wins, as Kafka's controller takes the last request) and
    /// deleted; every node takes the rest from etcd, in its own set's form
    /// (`partitions` = the queues placed on its set). A topic merely missing
    /// from etcd is forgotten here with its stored messages kept.
    ///
    /// A deleted topic leaves a tombstone, `deleted-topics/<name>/<topic
    /// id>` (for `cluster.topic_tombstone_ttl_ms`): every node holding that
    /// incarnation drops it with its stored queues and committed offsets
    /// (replicas and other sets too), so a topic made again under the name
    /// starts empty everywhere. A topic merely missing from etcd (etcd
    /// started afresh) is never a reason to drop data.
    async fn sync_topics(
        &mut self,
        in_etcd: BTreeMap<String, TopicInfo>,
        topic_revisions: &BTreeMap<String, i64>,
        tombstones: &std::collections::BTreeSet<(String, [u8; 16])>,
        revision: i64,
    ) -> Res<()> {
        let broker = Arc::clone(&self.sh.broker);
        let master = matches!(self.sh.role(), Role::Master { .. });
        let own = self.me.set.clone();
        let moved_here = self.synced.is_none_or(|(_, v, m)| v != broker.topics().version() || !m);
        if master && moved_here {
            // Topics from before placements (or from before this node knew
            // its cluster) are where they are: on this set, queue = p. A
            // record etcd already holds with a placement is taken below.
            for (name, info) in broker.topics().all() {
                let placed_in_etcd = in_etcd.get(&name).is_some_and(|e| !e.placement.is_empty());
                if info.placement.is_empty() && !placed_in_etcd {
                    let (b, n) = (Arc::clone(&broker), name.clone());
                    tokio::task::spawn_blocking(move || b.place_here(&n))
                        .await
                        .map_err(|e| e.to_string())?
                        .map_err(|e| e.to_string())?;
                }
            }
        }
        let mut changes = broker.take_topic_changes();
        // Nothing moved in etcd or here since the last sync: nothing to do
        // (the table is not copied every poll).
        let seen = (revision, broker.topics().version(), master);
        let quiet = changes.created.is_empty() && changes.changed.is_empty() && changes.deleted.is_empty();
        if quiet && self.synced == Some(seen) {
            return Ok(());
        }
        // Incarnations deleted elsewhere go here too, data and all (a topic
        // made anew has a fresh id: no tombstone names it, even when this
        // node's own creation found the old one still here).
        for (name, info) in broker.topics().all() {
            if tombstones.contains(&(name.clone(), info.topic_id)) {
                let (b, n, id) = (Arc::clone(&broker), name.clone(), info.topic_id);
                tokio::task::spawn_blocking(move || b.drop_deleted_topic(&n, id))
                    .await
                    .map_err(|e| e.to_string())?
                    .map_err(|e| e.to_string())?;
            }
        }
        if master && in_etcd.is_empty() {
            // A cluster's first master (or etcd started afresh): its own
            // table is the cluster's.
            changes.created.extend(broker.topics().names());
        }
        let mut in_etcd = in_etcd;
        for name in &changes.deleted {
            let topic_key = format!("{}topics/{name}", self.prefix);
            // Only the incarnation deleted here, as etcd held it when read: a
            // topic made anew under the name meanwhile (another id, a later
            // revision) stays.
            let deleted_id = changes.deleted_ids.get(name);
            let seen = in_etcd
                .get(name)
                .filter(|t| deleted_id.is_none_or(|id| t.topic_id == *id))
                .and_then(|_| topic_revisions.get(name));
            let mut ops = Vec::new();
            let mut guard = Vec::new();
            if let Some(rev) = seen {
                guard.push(Compare::mod_revision(topic_key.clone(), CompareOp::Equal, *rev));
                ops.push(TxnOp::delete(topic_key, None));
            }
            if let Some(id) = deleted_id {
                let lease = self
                    .client
                    .lease_grant(
                        i64::try_from((self.sh.cfg.topic_tombstone_ttl_ms / 1000).max(1)).unwrap_or(i64::MAX),
                        None,
                    )
                    .await
                    .map_err(err("lease grant"))?
                    .id();
                let key = format!("{}deleted-topics/{name}/{}", self.prefix, hex16(id));
                ops.push(TxnOp::put(
                    key,
                    b"{}".to_vec(),
                    Some(PutOptions::new().with_lease(lease)),
                ));
            }
            if !ops.is_empty() {
                // The tombstone goes whatever the topic key became.
                let tombstone_only: Vec<TxnOp> = ops.iter().skip(usize::from(seen.is_some())).cloned().collect();
                self.client
                    .txn(Txn::new().when(guard).and_then(ops).or_else(tombstone_only))
                    .await
                    .map_err(err("delete topic"))?;
            }
            if seen.is_some() {
                in_etcd.remove(name);
            }
        }
        let local: BTreeMap<String, TopicInfo> = broker.topics().all().into_iter().collect();
        for (name, info) in &local {
            let key = format!("{}topics/{name}", self.prefix);
            let cluster = info.cluster_form();
            let json = serde_json::to_vec(&cluster).map_err(|e| e.to_string())?;
            if changes.created.contains(name) && !in_etcd.contains_key(name) {
                // Created here: first writer wins (a loser takes etcd's).
                let txn = Txn::new()
                    .when([Compare::version(key.clone(), CompareOp::Equal, 0)])
                    .and_then([TxnOp::put(key, json, None)]);
                if self.client.txn(txn).await.map_err(err("create topic"))?.succeeded() {
                    in_etcd.insert(name.clone(), cluster);
                }
            } else if changes.changed.contains(name) && in_etcd.get(name) != Some(&cluster) {
                match topic_revisions.get(name) {
                    // A set growing its own queues of a per-set topic
                    // (rokka_broker::is_per_set_topic) may race another set
                    // doing the same: only over the record this step read,
                    // else etcd's is taken below and the growth is made
                    // again on the next use (a plain put lost the other's).
                    Some(rev) if rokka_broker::is_per_set_topic(name) => {
                        let txn = Txn::new()
                            .when([Compare::mod_revision(key.clone(), CompareOp::Equal, *rev)])
                            .and_then([TxnOp::put(key, json, None)]);
                        if self.client.txn(txn).await.map_err(err("put topic"))?.succeeded() {
                            in_etcd.insert(name.clone(), cluster);
                        }
                    }
                    _ => {
                        self.client.put(key, json, None).await.map_err(err("put topic"))?;
                        in_etcd.insert(name.clone(), cluster);
                    }
                }
            }
        }
        for (name, info) in in_etcd.iter() {
            let mine = info.clone().local_form(&own);
            // A change made here after this step began waits for the next.
            if local.get(name) != Some(&mine) && !broker.topic_change_pending(name) {
                let (b, n) = (Arc::clone(&broker), name.clone());
                tokio::task::spawn_blocking(move || b.apply_topic(&n, mine))
                    .await
                    .map_err(|e| e.to_string())?
                    .map_err(|e| e.to_string())?;
            }
        }
        for name in local
            .keys()
            .filter(|n| !in_etcd.contains_key(*n) && !changes.created.contains(*n))
        {
            if broker.topic_change_pending(name) {
                continue;
            }
            let (b, n) = (Arc::clone(&broker), name.clone());
            tokio::task::spawn_blocking(move || b.forget_topic(&n))
                .await
                .map_err(|e| e.to_string())?
                .map_err(|e| e.to_string())?;
        }
        self.synced = Some((revision, broker.topics().version(), master));
        // Kafka partitions placed per set (topics without a placement are
        // this set's).
        let mut per_set: BTreeMap<String, u64> = BTreeMap::new();
        if let Some(v) = broker.cluster_view() {
            per_set.extend(v.sets.iter().map(|s| (s.name.clone(), 0)));
        }
        for (_, info) in broker.topics().all() {
            if info.placement.is_empty() {
                *per_set.entry(own.clone()).or_default() += u64::from(info.partitions);
            }
            for r in &info.placement {
                *per_set.entry(r.set.clone()).or_default() += 1;
            }
        }
        for (set, n) in per_set {
            metrics::gauge!("rokka_cluster_set_partitions", "set" => set).set(n as f64);
        }
        Ok(())
    }

    fn current_state(&self, fallback: SetState) -> SetState {
        match self.sh.role() {
            Role::Master { epoch } => SetState {
                master: Some(self.me.id),
                epoch,
                // What etcd names (a replica gated to join is not in sync
                // for clients yet).
                sss: {
                    let named = self.sh.named();
                    if named.contains(&self.me.id) {
                        named
                    } else {
                        vec![self.me.id]
                    }
                },
            },
            _ => fallback,
        }
    }

    fn publish(
        &self,
        nodes: &[NodeInfo],
        st: &SetState,
        others: &BTreeMap<String, SetState>,
        draining: &std::collections::BTreeSet<String>,
    ) {
        let members: Vec<u32> = nodes.iter().filter(|n| n.set == self.me.set).map(|n| n.id).collect();
        let mut names: std::collections::BTreeSet<&str> = others.keys().map(String::as_str).collect();
        names.extend(nodes.iter().map(|n| n.set.as_str()));
        names.insert(self.me.set.as_str());
        let sets: Vec<SetView> = names
            .into_iter()
            .map(|name| {
                let members: Vec<u32> = nodes.iter().filter(|n| n.set == name).map(|n| n.id).collect();
                let state = if name == self.me.set {
                    Some(st)
                } else {
                    others.get(name)
                };
                let state = state.cloned().unwrap_or_default();
                SetView {
                    name: name.to_string(),
                    master: state.master.filter(|m| members.contains(m)),
                    epoch: state.epoch,
                    sss: state.sss,
                    members,
                    draining: draining.contains(name),
                }
            })
            .collect();
        metrics::gauge!("rokka_cluster_sets").set(sets.len() as f64);
        for s in &sets {
            metrics::gauge!("rokka_cluster_set_master", "set" => s.name.clone()).set(s.master.map_or(-1.0, f64::from));
            metrics::gauge!("rokka_cluster_set_draining", "set" => s.name.clone()).set(if s.draining {
                1.0
            } else {
                0.0
            });
        }
        self.sh.publish_view(ClusterView {
            cluster: self.sh.cfg.name.clone(),
            self_id: self.me.id,
            set: self.me.set.clone(),
            nodes: nodes.to_vec(),
            master: st.master.filter(|m| members.contains(m)),
            epoch: st.epoch,
            sss: st.sss.clone(),
            members,
            read_from_replicas: self.sh.cfg.read_from_replicas,
            replica_read_lag_bytes: self.sh.cfg.replica_read_lag_bytes,
            sets,
        });
    }

    /// The epoch a master elected over a state of epoch `base` takes: past
    /// it, past this node's own epoch history and past any epoch a replica
    /// showed (a state in etcd older than the nodes' histories — etcd wiped
    /// or restored from a backup — must not start an epoch the nodes
    /// already wrote under: histories that share an epoch number but not
    /// its writes would not be told apart when a replica truncates).
    fn next_epoch(&self, base: u32) -> Res<u32> {
        let local = self.sh.store.epochs().last().map_or(0, |e| e.epoch);
        let highest = base.max(local).max(self.sh.newer_epoch());
        if highest > base {
            tracing::warn!(
                etcd = base,
                local,
                seen = self.sh.newer_epoch(),
                "the set's epoch in etcd is behind the nodes' histories: the new epoch goes past them"
            );
        }
        highest
            .checked_add(1)
            .ok_or_else(|| "the set's epoch numbers are exhausted".to_string())
    }

    fn become_master(&mut self, st: &SetState) -> Res<()> {
        let store = Arc::clone(&self.sh.store);
        let epoch = st.epoch;
        tokio::task::block_in_place(|| store.begin_epoch(epoch))
            .map_err(|e| format!("recording epoch {epoch}: {e}"))?;
        self.sh.set_sss(st.sss.clone());
        self.sh.set_named(st.sss.clone());
        self.sh.set_role(Role::Master { epoch: st.epoch });
        // Members of the sync state set get replica_lag_max_ms to connect.
        for id in st.sss.iter().filter(|id| **id != self.me.id) {
            self.sh.expect_replica(*id);
        }
        Ok(())
    }

    /// Master: the sync state set follows who is caught up ([`plan_sss`]).
    async fn maintain_sss(&mut self, st: &SetState, rev: i64, live: &[u32]) -> Res<()> {
        let gated = self.sh.sss();
        let (want, local) = crate::plan_sss(
            self.me.id,
            &st.sss,
            &gated,
            live,
            &self.sh.caught_up_replicas(),
            self.sh.high_watermark(),
            // Keeping up now: caught up within a few controller steps.
            Duration::from_millis((3 * self.sh.cfg.poll_interval_ms).max(1000)),
        );
        if want == st.sss {
            if local != gated {
                self.sh.set_sss(local);
            }
            return Ok(());
        }
        // Named in etcd first, then the acknowledgements follow (a member
        // leaving is waited for until etcd no longer names it; one joining
        // was gated already).
        let next = SetState {
            sss: want.clone(),
            ..st.clone()
        };
        if self.put_state(&next, Some(rev)).await? {
            tracing::info!(from = ?st.sss, to = ?want, "sync state set changed");
            metrics::counter!("rokka_cluster_sss_changes_total").increment(1);
            self.sh.set_sss(local);
            self.sh.set_named(want);
        }
        Ok(())
    }

    /// Writes the set state if its revision is still `rev` (None: if it
    /// does not exist yet). Whether it was written.
    async fn put_state(&mut self, st: &SetState, rev: Option<i64>) -> Res<bool> {
        let key = self.state_key();
        let json = serde_json::to_vec(st).map_err(|e| e.to_string())?;
        let cmp = match rev {
            Some(r) => Compare::mod_revision(key.clone(), CompareOp::Equal, r),
            None => Compare::version(key.clone(), CompareOp::Equal, 0),
        };
        let txn = Txn::new().when([cmp]).and_then([TxnOp::put(key, json, None)]);
        let r = self.client.txn(txn).await.map_err(err("txn"))?;
        Ok(r.succeeded())
    }
}

/// Marks broker set `set` as draining (no new topic or partition is
/// placed on it; nothing placed moves) or takes the mark away, in the
/// cluster `cfg` names (`rokka cluster drain|undrain`). The set must exist.
pub async fn set_draining(cfg: &crate::ClusterConfig, set: &str, draining: bool) -> Res<()> {
    let opts = ConnectOptions::new()
        .with_connect_timeout(Duration::from_secs(2))
        .with_timeout(Duration::from_secs(5));
    let mut client = Client::connect(&cfg.etcd_endpoints, Some(opts))
        .await
        .map_err(err("connect"))?;
    let prefix = format!("/rokka/{}/sets/{set}/", cfg.name);
    let state = client.get(format!("{prefix}state"), None).await.map_err(err("get"))?;
    if state.kvs().is_empty() {
        return Err(format!("cluster {} has no broker set {set:?}", cfg.name));
    }
    let key = format!("{prefix}draining");
    if draining {
        client.put(key, "true", None).await.map_err(err("put"))?;
    } else {
        client.delete(key, None).await.map_err(err("delete"))?;
    }
    Ok(())
}

/// New topics go to etcd first (create-if-absent), from the blocking
/// context a topic is created in; the controller's table sync then finds
/// them there.
pub struct EtcdTopics {
    client: Client,
    prefix: String,
    handle: tokio::runtime::Handle,
}

impl std::fmt::Debug for EtcdTopics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdTopics").field("prefix", &self.prefix).finish()
    }
}

impl rokka_broker::remote::ClusterTopics for EtcdTopics {
    fn create(&self, name: &str, info: &TopicInfo) -> Result<Option<TopicInfo>, String> {
        let key = format!("{}topics/{name}", self.prefix);
        let json = serde_json::to_vec(info).map_err(|e| e.to_string())?;
        let mut client = self.client.clone();
        let (tx, rx) = std::sync::mpsc::channel();
        // Run on the runtime's workers; this thread only waits (bounded,
        // so a current-thread caller cannot hang on itself).
        self.handle.spawn(async move {
            let txn = Txn::new()
                .when([Compare::version(key.clone(), CompareOp::Equal, 0)])
                .and_then([TxnOp::put(key.clone(), json, None)])
                .or_else([TxnOp::get(key, None)]);
            let _ = tx.send(client.txn(txn).await);
        });
        let resp = rx
            .recv_timeout(Duration::from_secs(5))
            .map_err(|_| "etcd: no answer within 5 s".to_string())?
            .map_err(|e| format!("etcd create topic: {e}"))?;
        if resp.succeeded() {
            return Ok(None);
        }
        for op in resp.op_responses() {
            if let etcd_client::TxnOpResponse::Get(g) = op {
                if let Some(kv) = g.kvs().first() {
                    return serde_json::from_slice(kv.value())
                        .map(Some)
                        .map_err(|e| format!("topic {name} in etcd: {e}"));
                }
            }
        }
        Err(format!("topic {name}: etcd refused the create and returned no record"))
    }

    fn get<'a>(&'a self, name: &'a str) -> rokka_broker::remote::RemoteCall<'a, Option<TopicInfo>> {
        Box::pin(async move {
            let key = format!("{}topics/{name}", self.prefix);
            let resp = self
                .client
                .clone()
                .get(key, None)
                .await
                .map_err(|e| format!("etcd get topic: {e}"))?;
            match resp.kvs().first() {
                Some(kv) => serde_json::from_slice(kv.value())
                    .map(Some)
                    .map_err(|e| format!("topic {name} in etcd: {e}")),
                None => Ok(None),
            }
        })
    }
}

/// A keyed cluster table's records as read from etcd this tick.
struct Keyed<T: KeyedClusterTable>(BTreeMap<String, T::Record>);

impl<T: KeyedClusterTable> Default for Keyed<T> {
    fn default() -> Self {
        Keyed(BTreeMap::new())
    }
}

/// Takes `key`'s record into `into` if the key is under its table's
/// prefix (an unreadable record is logged, not applied); false if not.
fn keyed<T: KeyedClusterTable>(prefix: &str, key: &str, value: &[u8], into: &mut Keyed<T>) -> bool {
    let Some(name) = key.strip_prefix(prefix).and_then(|k| k.strip_prefix(T::PREFIX)) else {
        return false;
    };
    match serde_json::from_slice(value) {
        Ok(r) => {
            into.0.insert(name.to_string(), r);
        }
        Err(e) => tracing::warn!(key, error = %e, what = T::WHAT, "unreadable record in etcd; not applied"),
    }
    true
}

/// One keep-alive of lease `id`: renews this node's lease validity, or, when
/// the lease is gone, clears it (the controller registers again and a
/// master fences itself).
async fn keep_alive(client: &mut Client, sh: &Shared, id: i64) -> Res<()> {
    let sent = Instant::now();
    // Opening the stream waits for its first answer: bounded as the answer
    // below is (a hung open would stall every renewal after it).
    let (mut keeper, mut stream) = tokio::time::timeout(Duration::from_secs(1), client.lease_keep_alive(id))
        .await
        .map_err(|_| "keep-alive: the stream did not open within 1 s".to_string())?
        .map_err(err("keep-alive"))?;
    keeper.keep_alive().await.map_err(err("keep-alive"))?;
    match tokio::time::timeout(Duration::from_secs(1), stream.message()).await {
        Ok(Ok(Some(r))) if r.ttl() > 0 => {
            lease_renewed(sh, sent, r.ttl());
            Ok(())
        }
        Ok(Ok(_)) => {
            tracing::error!("lease expired");
            *sh.lease_valid_until.lock().unwrap_or_else(|p| p.into_inner()) = None;
            if matches!(sh.role(), Role::Master { .. }) {
                sh.set_role(Role::Fenced);
            }
            Ok(())
        }
        Ok(Err(e)) => Err(format!("keep-alive: {e}")),
        Err(_) => Err("keep-alive: no answer within 1 s".into()),
    }
}

fn lease_renewed(sh: &Shared, sent: Instant, ttl: i64) {
    let valid = sent + Duration::from_millis((ttl.max(1) as u64 * 1000).saturating_sub(500));
    *sh.lease_valid_until.lock().unwrap_or_else(|p| p.into_inner()) = Some(valid);
}

fn hex16(id: &[u8; 16]) -> String {
    id.iter().map(|b| format!("{b:02x}")).collect()
}

fn topic_id_of(hex: &str) -> Option<[u8; 16]> {
    if hex.len() != 32 || !hex.is_ascii() {
        return None;
    }
    let mut id = [0u8; 16];
    for (i, b) in id.iter_mut().enumerate() {
        *b = u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).ok()?;
    }
    Some(id)
}

#[cfg(test)]
mod tombstone_tests {
    use super::*;

    #[test]
    fn topic_ids_round_trip_through_their_tombstone_keys() {
        let id = [0u8, 1, 0x7f, 0x80, 0xff, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 0xab];
        assert_eq!(topic_id_of(&hex16(&id)), Some(id));
        assert_eq!(topic_id_of("00"), None);
        assert_eq!(topic_id_of(&"zz".repeat(16)), None);
        assert_eq!(topic_id_of(&"é".repeat(16)), None);
    }
}

/// The candidates sorted by id, only those with an epoch history when any
/// has one (an empty log is elected only when every candidate's is).
fn prefer_history(mut candidates: Vec<u32>, history: impl Fn(u32) -> bool) -> Vec<u32> {
    candidates.sort_unstable();
    if candidates.iter().any(|id| history(*id)) {
        candidates.retain(|id| history(*id));
    }
    candidates
}

#[cfg(test)]
mod election_tests {
    #[test]
    fn an_empty_log_is_elected_only_when_no_candidate_has_a_history() {
        let with = [2u32, 3];
        assert_eq!(
            super::prefer_history(vec![3, 1, 2], |id| with.contains(&id)),
            vec![2, 3]
        );
        assert_eq!(super::prefer_history(vec![3, 1], |_| false), vec![1, 3]);
        assert_eq!(super::prefer_history(vec![], |_| true), Vec::<u32>::new());
    }
}

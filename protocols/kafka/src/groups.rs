//! Glue between the async Kafka handlers and the pure group coordinator:
//! parked JoinGroup/SyncGroup requests wait on a oneshot per token, and a
//! 100 ms ticker drives session and rebalance timeouts. The coordinator
//! answers every token it parks exactly once (a member's retried join or sync
//! answers the one it replaces); a request dropped before its answer takes
//! its waiter out of the table with it. A node that stops coordinating (in
//! cluster mode: no longer its set's master) answers every parked request
//! NOT_COORDINATOR at once, as Kafka's onUnloaded, so its members find the
//! new coordinator instead of waiting out their request timeout.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use rokka_group::{
    code, GroupConfig, GroupCoordinator, GroupRecords, JoinRequest, JoinResponse, Reply, SyncRequest, SyncResponse,
    Token,
};
use rokka_store::ConsumerOffsets;
use tokio::sync::{oneshot, watch};

#[derive(Debug)]
pub struct Groups {
    coord: Mutex<GroupCoordinator>,
    waiters: Mutex<HashMap<Token, oneshot::Sender<Reply>>>,
    next_token: AtomicU64,
    epoch: Instant,
    /// The groups' records as last encoded for the replicas (classic,
    /// consumer), and their version.
    encoded: Mutex<Option<(u64, (Bytes, Bytes))>>,
    /// `group.commit_timeout_ms`.
    pub commit_timeout: std::time::Duration,
}

impl rokka_broker::remote::ReplicatedGroups for Groups {
    fn changes(&self) -> u64 {
        self.with(|c| c.record_changes())
    }

    fn snapshot(&self) -> (Bytes, Bytes) {
        // Taken under the lock (cheap clones), encoded outside it, once per
        // version however many replicas ask.
        let records = self.with(|c| {
            let version = c.record_changes();
            match &*self.encoded.lock().unwrap_or_else(|p| p.into_inner()) {
                Some((v, b)) if *v == version => Err(b.clone()),
                _ => Ok((version, c.records())),
            }
        });
        match records {
            Err(cached) => cached,
            Ok((version, records)) => {
                let (classic, consumer) = records.encode();
                let b = (Bytes::from(classic), Bytes::from(consumer));
                *self.encoded.lock().unwrap_or_else(|p| p.into_inner()) = Some((version, b.clone()));
                b
            }
        }
    }

    fn load(&self, classic: &[u8], consumer: Option<&[u8]>) -> Result<usize, String> {
        let records = GroupRecords::decode(classic, consumer)?;
        let now = self.now();
        let n = self.with(|c| c.load_records(records, now));
        // The groups they were parked in are gone.
        self.unpark_all();
        Ok(n)
    }
}

impl Groups {
    pub fn new(config: GroupConfig) -> Groups {
        Groups {
            commit_timeout: std::time::Duration::from_millis(config.commit_timeout_ms.max(1)),
            coord: Mutex::new(GroupCoordinator::new(config)),
            waiters: Mutex::new(HashMap::new()),
            next_token: AtomicU64::new(1),
            epoch: Instant::now(),
            encoded: Mutex::new(None),
        }
    }

    /// Milliseconds on the coordinator's clock.
    pub fn now(&self) -> u64 {
        self.epoch.elapsed().as_millis() as u64
    }

    /// Runs `f` on the coordinator under its lock.
    pub fn with<R>(&self, f: impl FnOnce(&mut GroupCoordinator) -> R) -> R {
        let mut c = self.coord.lock().unwrap_or_else(|p| p.into_inner());
        f(&mut c)
    }

    fn deliver(&self, replies: Vec<Reply>) {
        if replies.is_empty() {
            return;
        }
        let mut w = self.waiters.lock().unwrap_or_else(|p| p.into_inner());
        for r in replies {
            if let Some(tx) = w.remove(&r.token()) {
                let _ = tx.send(r);
            }
        }
    }

    /// Every parked join and sync is answered NOT_COORDINATOR (their
    /// waiters dropped): this node stopped coordinating, or its groups were
    /// replaced by the master's.
    fn unpark_all(&self) -> usize {
        let parked = std::mem::take(&mut *self.waiters.lock().unwrap_or_else(|p| p.into_inner()));
        parked.len()
    }

    fn park(&self) -> Parked<'_> {
        let token = self.next_token.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        self.waiters.lock().unwrap_or_else(|p| p.into_inner()).insert(token, tx);
        Parked {
            groups: self,
            token,
            rx,
        }
    }

    pub async fn join(&self, req: JoinRequest) -> JoinResponse {
        let mut parked = self.park();
        let token = parked.token;
        let now = self.now();
        let replies = self.with(|c| c.join(req, token, now));
        self.deliver(replies);
        match (&mut parked.rx).await {
            Ok(Reply::Join(_, r)) => r,
            _ => JoinResponse {
                error: code::NOT_COORDINATOR,
                generation: -1,
                ..JoinResponse::default()
            },
        }
    }

    pub async fn sync(&self, req: SyncRequest) -> SyncResponse {
        let mut parked = self.park();
        let token = parked.token;
        let now = self.now();
        let replies = self.with(|c| c.sync(req, token, now));
        self.deliver(replies);
        match (&mut parked.rx).await {
            Ok(Reply::Sync(_, r)) => r,
            _ => SyncResponse {
                error: code::NOT_COORDINATOR,
                ..SyncResponse::default()
            },
        }
    }

    /// Rebalances `group` (members outside the coordinator changed).
    pub fn force_rebalance(&self, group: &str, now: u64) {
        let replies = self.with(|c| c.force_rebalance(group, now));
        self.deliver(replies);
    }

    pub fn heartbeat(&self, group: &str, member: &str, instance: Option<&str>, generation: i32) -> i16 {
        let now = self.now();
        self.with(|c| c.heartbeat(group, member, instance, generation, now))
    }

    pub fn leave(&self, group: &str, members: &[(String, Option<String>)]) -> (i16, Vec<i16>) {
        let now = self.now();
        let (code, codes, replies) = self.with(|c| c.leave(group, members, now));
        self.deliver(replies);
        (code, codes)
    }

    /// Drives timeouts every 100 ms; deletes the offsets of groups that stayed
    /// empty past the retention, once a minute.
    /// `consumer_groups` is told, every second, which KIP-848 groups have
    /// live members.
    /// `coordinating` says whether this node coordinates groups now (in
    /// cluster mode: is its set's master); while it does not, no session
    /// expires (a replica holds the master's groups to take over with),
    /// and when it starts to, every member's session starts then.
    /// `elsewhere` says whether a group has live members of another
    /// protocol (RocketMQ consumers, RocketMQ 5 pop consumers): an Empty
    /// Kafka group is not expired from under them.
    pub async fn run_ticker(
        self: Arc<Self>,
        offsets: Arc<dyn OffsetsHandle>,
        consumer_groups: impl Fn(std::collections::BTreeSet<String>) + Send + 'static,
        coordinating: impl Fn() -> bool + Send + 'static,
        elsewhere: impl Fn(&str) -> bool + Send + 'static,
        mut shutdown: watch::Receiver<bool>,
    ) {
        let mut interval = tokio::time::interval(Duration::from_millis(100));
        let mut last_gen: HashMap<String, i32> = HashMap::new();
        let mut ticks = 0u64;
        let mut was_coordinating = true;
        loop {
            tokio::select! {
                _ = interval.tick() => {}
                _ = shutdown.changed() => return,
            }
            let now = self.now();
            ticks += 1;
            let coordinating_now = coordinating();
            if ticks.is_multiple_of(10) {
                self.export_metrics(&mut last_gen, coordinating_now);
            }
            if !coordinating_now {
                if std::mem::take(&mut was_coordinating) {
                    let n = self.unpark_all();
                    if n > 0 {
                        tracing::info!(
                            requests = n,
                            "no longer coordinating: parked joins and syncs answered NOT_COORDINATOR"
                        );
                    }
                }
                continue;
            }
            if !was_coordinating {
                self.with(|c| c.restart_sessions(now));
                was_coordinating = true;
            }
            let replies = self.with(|c| c.tick(now));
            self.deliver(replies);
            if ticks.is_multiple_of(10) {
                let live: std::collections::BTreeSet<String> = self.with(|c| {
                    c.consumer
                        .groups
                        .values()
                        .filter(|g| !g.members.is_empty())
                        .map(|g| g.name.clone())
                        .collect()
                });
                consumer_groups(live);
            }
            if ticks.is_multiple_of(100) {
                // Empty groups with nothing committed: forgotten every 10 s,
                // so max_groups is spent only on groups in use.
                let committed: std::collections::HashSet<String> = offsets.offsets().groups().into_iter().collect();
                let n = self.with(|c| c.forget_unused_groups(|g| committed.contains(g)));
                if n > 0 {
                    tracing::debug!(groups = n, "forgot empty groups without offsets");
                }
            }
            if ticks.is_multiple_of(600) {
                // Kept while another protocol's members use the group or
                // anything was committed within the retention (a group
                // moved from Kafka to RocketMQ clients commits through
                // them: its offsets were deleted from under them).
                let wall = rokka_store::now_ms();
                let retention = self.with(|c| c.config().offsets_retention_ms) as i64;
                let table = offsets.offsets();
                let in_use = |g: &str| {
                    elsewhere(g)
                        || table
                            .group_offsets(g)
                            .iter()
                            .any(|(_, _, o)| o.commit_timestamp.saturating_add(retention) > wall)
                };
                let gone = self.with(|c| c.expire_empty_groups_unless(now, in_use));
                for g in gone {
                    let n = offsets.offsets().delete_group(&g);
                    tracing::info!(group = g, offsets = n, "expired offsets of an empty group");
                }
            }
        }
    }

    /// A replica's gauges say what it holds; its rebalance counters move
    /// only while it coordinates (a set's rebalances are counted once).
    fn export_metrics(&self, last_gen: &mut HashMap<String, i32>, coordinating: bool) {
        let (joins, syncs) = self.with(|c| c.superseded());
        metrics::counter!("rokka_group_superseded_requests_total", "api" => "join").absolute(joins);
        metrics::counter!("rokka_group_superseded_requests_total", "api" => "sync").absolute(syncs);
        let (sessions, unsynced) = self.with(|c| c.expired());
        metrics::counter!("rokka_group_members_expired_total", "reason" => "session").absolute(sessions);
        metrics::counter!("rokka_group_members_expired_total", "reason" => "no_sync").absolute(unsynced);
        let ((groups, members, protocols), count) = self.with(|c| (c.refused(), c.group_count()));
        metrics::counter!("rokka_group_joins_refused_total", "reason" => "max_groups").absolute(groups);
        metrics::counter!("rokka_group_joins_refused_total", "reason" => "max_group_size").absolute(members);
        metrics::counter!("rokka_group_joins_refused_total", "reason" => "max_member_protocols").absolute(protocols);
        let (bytes, refused_bytes) = self.with(|c| (c.member_bytes(), c.refused_for_bytes()));
        metrics::counter!("rokka_group_joins_refused_total", "reason" => "max_member_bytes").absolute(refused_bytes);
        metrics::gauge!("rokka_group_member_bytes").set(bytes as f64);
        metrics::gauge!("rokka_groups").set(count as f64);
        let parked = self.waiters.lock().unwrap_or_else(|p| p.into_inner()).len();
        metrics::gauge!("rokka_group_parked_requests").set(parked as f64);
        let views: Vec<_> = self.with(|c| {
            c.list()
                .into_iter()
                .filter_map(|(name, _, _)| c.describe(&name))
                .collect()
        });
        // Only live groups are remembered: a forgotten group's counter
        // series lapses with the recorder's idle timeout.
        last_gen.retain(|name, _| views.iter().any(|v| &v.name == name));
        for v in views {
            let prev = last_gen.insert(v.name.clone(), v.generation).unwrap_or(0);
            if coordinating && v.generation > prev {
                metrics::counter!("rokka_group_rebalances_total", "group" => v.name.clone())
                    .increment((v.generation - prev) as u64);
            }
        }
    }
}

impl rokka_broker::scrape::Collect for Groups {
    fn collect(&self, out: &mut Vec<rokka_broker::scrape::Family>) {
        use rokka_broker::scrape::Family;
        let views: Vec<_> = self.with(|c| {
            c.list()
                .into_iter()
                .filter_map(|(name, _, _)| c.describe(&name))
                .collect()
        });
        let mut members = Family::gauge("rokka_group_members", "members of the Kafka-protocol group");
        let mut state = Family::gauge("rokka_group_state", "1 for the group's current state, 0 for the others");
        for v in views {
            members.push(vec![("group", v.name.clone())], v.members.len() as f64);
            for s in ["Empty", "PreparingRebalance", "CompletingRebalance", "Stable", "Dead"] {
                let on = if v.state.name() == s { 1.0 } else { 0.0 };
                state.push(vec![("group", v.name.clone()), ("state", s.to_string())], on);
            }
        }
        out.push(members);
        out.push(state);
    }
}

/// A parked JoinGroup/SyncGroup's side of its waiter. Dropped unanswered
/// (the request's task went away), it removes its sender from the table.
struct Parked<'a> {
    groups: &'a Groups,
    token: Token,
    rx: oneshot::Receiver<Reply>,
}

impl Drop for Parked<'_> {
    fn drop(&mut self) {
        // Already gone when the reply was delivered; a cheap no-op then.
        self.groups
            .waiters
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&self.token);
    }
}

/// Access to the committed-offset table (the store's).
pub trait OffsetsHandle: Send + Sync + std::fmt::Debug {
    fn offsets(&self) -> &ConsumerOffsets;
}

impl OffsetsHandle for rokka_store::MessageStore {
    fn offsets(&self) -> &ConsumerOffsets {
        rokka_store::MessageStore::offsets(self)
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use bytes::Bytes;

    use super::*;

    fn join_req(member_id: &str) -> JoinRequest {
        JoinRequest {
            group: "g".into(),
            member_id: member_id.into(),
            instance_id: None,
            client_id: "c".into(),
            client_host: "/127.0.0.1".into(),
            session_timeout_ms: 10_000,
            rebalance_timeout_ms: 30_000,
            protocol_type: "consumer".into(),
            protocols: vec![("range".into(), Bytes::from_static(b"m"))],
            require_known_member_id: false,
            skip_assignment_supported: false,
        }
    }

    fn waiting(g: &Groups) -> usize {
        g.waiters.lock().unwrap_or_else(|p| p.into_inner()).len()
    }

    /// A join parked in the initial delay whose request goes away (its
    /// connection closed) leaves no waiter behind; a retry of a parked join
    /// gets the first one answered.
    #[tokio::test]
    async fn parked_requests_leave_no_waiter_behind() {
        let g = Groups::new(GroupConfig::default());
        let dropped = tokio::time::timeout(Duration::from_millis(50), g.join(join_req(""))).await;
        assert!(dropped.is_err(), "parked during the initial delay");
        assert_eq!(waiting(&g), 0, "a dropped request's waiter stayed");

        let member = g
            .with(|c| c.describe("g"))
            .and_then(|v| v.members.first().map(|m| m.member_id.clone()));
        let Some(member) = member else {
            panic!("the first join added no member");
        };
        let first = g.join(join_req(&member));
        let retry = async {
            tokio::time::sleep(Duration::from_millis(20)).await;
            g.join(join_req(&member)).await
        };
        let first = tokio::time::timeout(Duration::from_secs(1), first);
        let (first, _) = tokio::join!(first, tokio::time::timeout(Duration::from_millis(100), retry));
        match first {
            Ok(r) => assert_eq!(r.error, code::REBALANCE_IN_PROGRESS),
            Err(_) => panic!("the superseded join was never answered"),
        }
        assert_eq!(waiting(&g), 0);
    }

    /// A node that stops coordinating answers its parked joins at once
    /// (NOT_COORDINATOR, the client looks the coordinator up again) instead
    /// of leaving them to the client's request timeout (~5 minutes).
    #[tokio::test]
    async fn parked_requests_are_answered_when_coordinating_stops() {
        let g = Arc::new(Groups::new(GroupConfig::default()));
        let parked = {
            let g = Arc::clone(&g);
            tokio::spawn(async move { g.join(join_req("")).await })
        };
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert_eq!(waiting(&g), 1, "the first join waits out the initial delay");
        assert_eq!(g.unpark_all(), 1);
        match tokio::time::timeout(Duration::from_secs(1), parked).await {
            Ok(Ok(r)) => assert_eq!(r.error, code::NOT_COORDINATOR),
            other => panic!("the parked join was not answered: {other:?}"),
        }
    }
}

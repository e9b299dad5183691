//! Glue between the async Kafka handlers and the pure group coordinator:
//! parked JoinGroup/SyncGroup requests wait on a oneshot per token, and a
//! 100 ms ticker drives session and rebalance timeouts.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rokka_group::{
    code, GroupConfig, GroupCoordinator, JoinRequest, JoinResponse, Reply, SyncRequest, SyncResponse, Token,
};
use rokka_store::ConsumerOffsets;
use tokio::sync::{oneshot, watch};

#[derive(Debug)]
pub struct Groups {
    coord: Mutex<GroupCoordinator>,
    waiters: Mutex<HashMap<Token, oneshot::Sender<Reply>>>,
    next_token: AtomicU64,
    epoch: Instant,
}

impl Groups {
    pub fn new(config: GroupConfig) -> Groups {
        Groups {
            coord: Mutex::new(GroupCoordinator::new(config)),
            waiters: Mutex::new(HashMap::new()),
            next_token: AtomicU64::new(1),
            epoch: Instant::now(),
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

    fn park(&self) -> (Token, oneshot::Receiver<Reply>) {
        let token = self.next_token.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        self.waiters.lock().unwrap_or_else(|p| p.into_inner()).insert(token, tx);
        (token, rx)
    }

    pub async fn join(&self, req: JoinRequest) -> JoinResponse {
        let (token, rx) = self.park();
        let now = self.now();
        let replies = self.with(|c| c.join(req, token, now));
        self.deliver(replies);
        match rx.await {
            Ok(Reply::Join(_, r)) => r,
            _ => JoinResponse {
                error: code::COORDINATOR_NOT_AVAILABLE,
                generation: -1,
                ..JoinResponse::default()
            },
        }
    }

    pub async fn sync(&self, req: SyncRequest) -> SyncResponse {
        let (token, rx) = self.park();
        let now = self.now();
        let replies = self.with(|c| c.sync(req, token, now));
        self.deliver(replies);
        match rx.await {
            Ok(Reply::Sync(_, r)) => r,
            _ => SyncResponse {
                error: code::COORDINATOR_NOT_AVAILABLE,
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
    pub async fn run_ticker(self: Arc<Self>, offsets: Arc<dyn OffsetsHandle>, mut shutdown: watch::Receiver<bool>) {
        let mut interval = tokio::time::interval(Duration::from_millis(100));
        let mut last_gen: HashMap<String, i32> = HashMap::new();
        let mut ticks = 0u64;
        loop {
            tokio::select! {
                _ = interval.tick() => {}
                _ = shutdown.changed() => return,
            }
            let now = self.now();
            let replies = self.with(|c| c.tick(now));
            self.deliver(replies);
            ticks += 1;
            if ticks.is_multiple_of(10) {
                self.export_metrics(&mut last_gen);
            }
            if ticks.is_multiple_of(600) {
                let gone = self.with(|c| c.expire_empty_groups(now));
                for g in gone {
                    let n = offsets.offsets().delete_group(&g);
                    tracing::info!(group = g, offsets = n, "expired offsets of an empty group");
                }
            }
        }
    }

    fn export_metrics(&self, last_gen: &mut HashMap<String, i32>) {
        let views: Vec<_> = self.with(|c| {
            c.list()
                .into_iter()
                .filter_map(|(name, _, _)| c.describe(&name))
                .collect()
        });
        for v in views {
            metrics::gauge!("rokka_group_members", "group" => v.name.clone()).set(v.members.len() as f64);
            for s in ["Empty", "PreparingRebalance", "CompletingRebalance", "Stable", "Dead"] {
                let on = if v.state.name() == s { 1.0 } else { 0.0 };
                metrics::gauge!("rokka_group_state", "group" => v.name.clone(), "state" => s).set(on);
            }
            let prev = last_gen.insert(v.name.clone(), v.generation).unwrap_or(0);
            if v.generation > prev {
                metrics::counter!("rokka_group_rebalances_total", "group" => v.name.clone())
                    .increment((v.generation - prev) as u64);
            }
        }
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

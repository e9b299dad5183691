//! Consumer offsets (query, update, min/max/time searches), queue locks of orderly consumers, consume stats.

use super::*;

impl RocketMq {
    /// Whether the request's group has an offset committed for its queue.
    pub(super) fn has_committed_offset(&self, req: &RemotingCommand) -> bool {
        let group = req.ext_fields.get("consumerGroup").unwrap_or_default();
        let topic = req.ext_fields.get("topic").unwrap_or_default();
        let queue = ext_i64(req, "queueId", "queueId").unwrap_or(-1).max(0) as u32;
        self.broker.store().offsets().get(group, topic, queue).is_some()
    }

    pub(super) fn query_offset(&self, req: &RemotingCommand) -> RemotingCommand {
        let group = req.ext_fields.get("consumerGroup").unwrap_or_default();
        let topic = req.ext_fields.get("topic").unwrap_or_default();
        let queue = ext_i64(req, "queueId", "queueId").unwrap_or(-1).max(0) as u32;
        match self.broker.store().offsets().get(group, topic, queue) {
            Some(o) => {
                let mut r = self.reply(req, rs::SUCCESS, None);
                r.ext_fields.set("offset", o.offset.to_string());
                // What a Kafka commit stored, for a coordinator of another
                // broker set (RocketMQ clients ignore unknown fields).
                if !o.metadata.is_empty() {
                    r.ext_fields.set(crate::remote_offsets::EXT_METADATA, o.metadata);
                }
                if o.leader_epoch >= 0 {
                    r.ext_fields
                        .set(crate::remote_offsets::EXT_LEADER_EPOCH, o.leader_epoch.to_string());
                }
                r
            }
            // Apache RocketMQ's rule (ConsumerManageProcessor): a group with
            // nothing committed starts at 0 when the queue still starts at
            // 0 and its first message is still in memory — how a new group
            // on a young topic reads from the start under the default
            // CONSUME_FROM_LAST_OFFSET — unless the client asked otherwise
            // (setZeroIfNotFound=false; absent counts as true).
            None if req
                .ext_fields
                .get("setZeroIfNotFound")
                .is_none_or(|v| !v.eq_ignore_ascii_case("false"))
                && self.broker.first_message_in_memory(
                    topic,
                    queue,
                    u32::from(self.config.access_message_in_memory_max_ratio),
                ) =>
            {
                let mut r = self.reply(req, rs::SUCCESS, None);
                r.ext_fields.set("offset", "0");
                r
            }
            None => self.reply(
                req,
                rs::QUERY_NOT_FOUND,
                Some("Not found, V3_0_6_SNAPSHOT maybe this group consumer boot first".into()),
            ),
        }
    }

    /// DELETE_SUBSCRIPTIONGROUP (mqadmin deleteSubGroup, Apache's
    /// AdminBrokerProcessor.deleteSubscriptionGroup): the group's kept
    /// config goes (it behaves as the defaults again), and with
    /// `cleanOffset` its committed offsets on this broker. The broker's
    /// own groups are refused. The answer's
    /// `rokkaDeleted` extField says how many offsets went (another set's
    /// Kafka coordinator deleting a group reads it). Answered once etcd
    /// holds the config's deletion (cluster mode), when it asked for one.
    pub(super) async fn delete_subscription_group(&self, req: &RemotingCommand, conn: &Conn) -> RemotingCommand {
        let group = req.ext_fields.get("groupName").unwrap_or_default();
        if group.is_empty() {
            return self.reply(req, rs::SYSTEM_ERROR, Some("groupName is empty".into()));
        }
        if rokka_broker::is_system_group(group) {
            return self.reply(
                req,
                rs::SYSTEM_ERROR,
                Some(format!("[{group}] is a system consumer group: not deleted")),
            );
        }
        let clean = req
            .ext_fields
            .get("cleanOffset")
            .is_some_and(|v| v.eq_ignore_ascii_case("true"));
        // (Decided once: it checks the request's signature again.)
        let drops = self.drops_config(req, conn);
        // Written and fsynced: off the async workers.
        if drops {
            if let Err(refused) = rokka_broker::offload(|| self.broker.sub_groups().remove(group)) {
                return self.reply(req, rs::SYSTEM_ERROR, Some(refused.0));
            }
        }
        let n = if clean {
            self.broker.store().offsets().delete_group(group)
        } else {
            0
        };
        tracing::info!(group, offsets = n, "consumer group deleted (DELETE_SUBSCRIPTIONGROUP)");
        let mut r = self.reply(req, rs::SUCCESS, None);
        r.ext_fields.set(crate::remote_offsets::EXT_DELETED, n.to_string());
        match drops {
            true => self.sub_groups_replicated(req, r).await,
            false => r,
        }
    }

    /// Whether a DELETE_SUBSCRIPTIONGROUP takes the group's config away
    /// too: not a Kafka coordinator's forwarded delete (it deletes the
    /// config itself), and only with ALTER on the cluster (a config held
    /// here needed it to get this far, crate::auth; one not held here —
    /// cluster mode: set on another node this one has not seen yet — is
    /// asked for only with it too).
    fn drops_config(&self, req: &RemotingCommand, conn: &Conn) -> bool {
        !self.offsets_only(req) && crate::auth::may_drop_config(&self.broker, conn, req)
    }

    /// A Kafka coordinator's forwarded DELETE_SUBSCRIPTIONGROUP: the
    /// cluster's own signed call asking for the offsets only.
    pub(super) fn offsets_only(&self, req: &RemotingCommand) -> bool {
        req.ext_fields.get(crate::remote_offsets::EXT_OFFSETS_ONLY) == Some("true")
            && crate::auth::is_cluster_call(&self.broker, req)
    }

    /// The broker's own groups' offsets (`%SCHEDULE%`, `CID_RMQ_SYS_*`)
    /// are its delay-level and transaction-check progress: no client
    /// commits or resets them, whatever the ACLs (with authorization off
    /// anyone could skip every pending delayed message or transaction
    /// check; Apache keeps that progress where no request reaches it).
    fn system_group_refused(&self, req: &RemotingCommand, group: &str) -> Option<RemotingCommand> {
        rokka_broker::is_system_group(group).then(|| {
            self.reply(
                req,
                rs::NO_PERMISSION,
                Some(format!(
                    "[{group}] is a system consumer group: its offsets are the broker's own"
                )),
            )
        })
    }

    pub(super) fn update_offset(&self, req: &RemotingCommand) -> RemotingCommand {
        let group = req.ext_fields.get("consumerGroup").unwrap_or_default();
        let topic = req.ext_fields.get("topic").unwrap_or_default();
        let queue = ext_i64(req, "queueId", "queueId").unwrap_or(-1);
        let offset = ext_i64(req, "commitOffset", "commitOffset").unwrap_or(-1);
        if group.is_empty() || queue < 0 || offset < 0 {
            return self.reply(req, rs::SYSTEM_ERROR, Some("bad offset update".into()));
        }
        if let Some(r) = self.system_group_refused(req, group) {
            return r;
        }
        // A Kafka commit forwarded by another broker set's coordinator.
        let metadata = req
            .ext_fields
            .get(crate::remote_offsets::EXT_METADATA)
            .unwrap_or_default();
        if metadata.len() > crate::MAX_FORWARDED_METADATA {
            return self.reply(req, rs::SYSTEM_ERROR, Some("offset metadata too large".into()));
        }
        let leader_epoch = ext_i64(
            req,
            crate::remote_offsets::EXT_LEADER_EPOCH,
            crate::remote_offsets::EXT_LEADER_EPOCH,
        )
        .and_then(|e| i32::try_from(e).ok())
        .unwrap_or(-1);
        let Some(info) = self.broker.topics().get(topic) else {
            return self.reply(req, rs::TOPIC_NOT_EXIST, Some(format!("topic[{topic}] not exist")));
        };
        if queue as u64 >= u64::from(info.partitions) {
            return self.reply(
                req,
                rs::SYSTEM_ERROR,
                Some(format!(
                    "queueId[{queue}] is illegal, topic:[{topic}] has {} queues",
                    info.partitions
                )),
            );
        }
        // A mixed group's RocketMQ member committing a queue a Kafka member
        // holds now (its client persists every queue it ever held, every
        // 5 s) is acknowledged and ignored: taken, it moved the Kafka
        // member's commit back. (A queue it just gave up, not yet the Kafka
        // member's, is taken: its last position.)
        if leader_epoch < 0 && metadata.is_empty() {
            let partition = || {
                info.kafka_partition_of(self.broker.own_set(), queue as u32)
                    .unwrap_or(queue as i32)
            };
            let held = self.broker.membership().with_mixed(group, |m| {
                m.kafka_held.get(topic).is_some_and(|ps| ps.contains(&partition()))
            });
            if held == Some(true) {
                metrics::counter!("rokka_mixed_group_commits_ignored_total").increment(1);
                return self.reply(req, rs::SUCCESS, None);
            }
        }
        // A RocketMQ client's commit of its old position after a reset is
        // acknowledged and ignored (RocketMQ 5 does the same).
        if leader_epoch < 0
            && metadata.is_empty()
            && self.stale_after_reset(group, topic, queue as u32, offset as u64, false)
        {
            return self.reply(req, rs::SUCCESS, None);
        }
        let stored = self.broker.store().offsets().commit_bounded(
            group,
            topic,
            queue as u32,
            offset as u64,
            metadata,
            leader_epoch,
        );
        if !stored {
            return self.reply(
                req,
                rs::SYSTEM_ERROR,
                Some("the committed-offset table is full (store.max_committed_offsets)".into()),
            );
        }
        self.reply(req, rs::SUCCESS, None)
    }

    /// INVOKE_BROKER_TO_RESET_OFFSET (mqadmin resetOffsetByTime; RocketMQ's
    /// `Broker2Client.resetOffset`): the group's offsets of `topic` on this
    /// broker set move to the first message stored at or after `timestamp`
    /// (-1: the end), or, for `queueId` with `offset`, to that offset;
    /// backwards only unless `isForce`. With Rokka's `rokkaCommitted=true`
    /// nothing moves and what is committed is announced (`rokka group
    /// reset-offsets --force` commits through the Kafka coordinator first).
    /// The offsets are committed here, every live consumer of the group is
    /// told (RESET_CONSUMER_CLIENT_OFFSET, oneway) so it drops what it
    /// fetched and continues from them, and meanwhile commits of the old
    /// position are ignored (`offset_reset_hold_ms`). The answer's body is
    /// the offset table (ResetOffsetBody). In cluster mode the new offsets
    /// are held by the set's in-sync replicas before anyone is told.
    pub(super) async fn reset_offset(&self, req: &RemotingCommand) -> RemotingCommand {
        use crate::remote_offsets::MessageQueue;
        let group = req.ext_fields.get("group").unwrap_or_default();
        let topic = req.ext_fields.get("topic").unwrap_or_default();
        if group.is_empty() || topic.is_empty() {
            return self.reply(req, rs::SYSTEM_ERROR, Some("group and topic are required".into()));
        }
        if let Some(r) = self.system_group_refused(req, group) {
            return r;
        }
        if !self.broker.leads_here() {
            return self.reply(
                req,
                rs::SYSTEM_ERROR,
                Some("offsets are reset on the master of the broker set".into()),
            );
        }
        let Some(info) = self.broker.topics().get(topic) else {
            return self.reply(req, rs::TOPIC_NOT_EXIST, Some(format!("topic[{topic}] not exist")));
        };
        let queues = match self.broker.own_set() {
            Some(set) if !info.placement.is_empty() => info.queues_on(set),
            _ => info.partitions,
        };
        let committed_only = ext_bool(req, "rokkaCommitted", "rokkaCommitted");
        let force = ext_bool(req, "isForce", "isForce");
        let one = ext_i64(req, "queueId", "queueId").filter(|q| *q >= 0);
        let exact = ext_i64(req, "offset", "offset").filter(|o| *o >= 0 && one.is_some());
        let Some(timestamp) = ext_i64(req, "timestamp", "timestamp")
            .or(exact.map(|_| -1))
            .or(committed_only.then_some(-1))
        else {
            return self.reply(
                req,
                rs::SYSTEM_ERROR,
                Some("timestamp is required (-1: the end), or queueId with offset".into()),
            );
        };
        if one.is_some_and(|q| q >= i64::from(queues)) {
            return self.reply(
                req,
                rs::SYSTEM_ERROR,
                Some(format!(
                    "queueId {} is illegal, topic {topic} has {queues} queues here",
                    one.unwrap_or(-1)
                )),
            );
        }
        // Live Kafka members keep their positions and commit them again
        // (every few seconds, at every rebalance): the reset would be
        // undone with SUCCESS answered. Refused, as Kafka refuses an
        // offset reset of a group with members (and `rokka group
        // reset-offsets` does without --force); the announcement of
        // what is committed (`rokkaCommitted`) moves nothing.
        if !committed_only {
            let kafka = self.broker.membership().with_group(group, |m| m.kafka.len());
            if kafka > 0 || self.broker.membership().is_consumer_protocol_group(group) {
                return self.reply(
                    req,
                    rs::SYSTEM_ERROR,
                    Some(format!(
                        "consumer group {group} has live Kafka members ({}): stop them before resetting its offsets",
                        kafka
                    )),
                );
            }
        }
        let store = self.broker.store();
        let offsets = store.offsets();
        let mut table: Vec<(u32, u64)> = Vec::new();
        for q in 0..queues {
            if one.is_some_and(|o| o != i64::from(q)) {
                continue;
            }
            let current = offsets.get(group, topic, q).map(|o| o.offset);
            let new = if committed_only {
                match current {
                    Some(c) => c,
                    None => continue,
                }
            } else {
                let (lo, hi) = (store.min_offset(topic, q), store.max_offset(topic, q));
                let target = match exact {
                    Some(o) => o as u64,
                    None if timestamp < 0 => hi,
                    None => store.offset_by_store_time(topic, q, timestamp),
                }
                .clamp(lo, hi.max(lo));
                match current {
                    Some(c) if !force && target >= c => c,
                    _ => target,
                }
            };
            table.push((q, new));
        }
        // Held before committing: a stale commit racing this one is ignored.
        if !self.hold_resets(group, topic, &table) {
            metrics::counter!("rokka_rocketmq_offset_resets_refused_total").increment(1);
            return self.reply(
                req,
                rs::SYSTEM_BUSY,
                Some(format!(
                    "too many offset resets held (rocketmq.max_offset_resets_held = {})",
                    self.config.max_offset_resets_held
                )),
            );
        }
        if !committed_only {
            for (q, o) in &table {
                if !offsets.commit_bounded(group, topic, *q, *o, "", -1) {
                    return self.reply(
                        req,
                        rs::SYSTEM_ERROR,
                        Some("the committed-offset table is full (store.max_committed_offsets)".into()),
                    );
                }
            }
        }
        if !committed_only {
            if let Err(e) = self.broker.offsets_durable(None).await {
                return self.reply(req, rs::SYSTEM_ERROR, Some(e));
            }
        }
        metrics::counter!("rokka_rocketmq_offset_resets_total").increment(table.len() as u64);
        let broker_name = self.broker_name();
        let table: Vec<(MessageQueue, u64)> = table
            .into_iter()
            .map(|(q, o)| {
                let mq = MessageQueue {
                    broker_name: broker_name.clone(),
                    queue_id: q,
                    topic: topic.to_string(),
                };
                (mq, o)
            })
            .collect();
        let body = Bytes::from(crate::remote_offsets::encode_reset_offsets(&table));
        let told = self.tell_reset(group, topic, timestamp, force, &table, &body);
        tracing::info!(
            group,
            topic,
            queues = table.len(),
            consumers_told = told,
            "consumer offsets reset"
        );
        let mut r = self.reply(req, rs::SUCCESS, None);
        r.ext_fields.set("rokkaNotified", told.to_string());
        r.body = body;
        r
    }

    /// RESET_CONSUMER_CLIENT_OFFSET to each live member of `group`; how many
    /// were sent. A C++ client takes the table as a list (ResetOffsetBodyForC).
    fn tell_reset(
        &self,
        group: &str,
        topic: &str,
        timestamp: i64,
        force: bool,
        table: &[(crate::remote_offsets::MessageQueue, u64)],
        body: &Bytes,
    ) -> usize {
        let members: Vec<(Conn, crate::command::LanguageCode)> = {
            let c = self.clients();
            c.groups
                .get(group)
                .map(|g| {
                    g.members
                        .iter()
                        .filter_map(|m| c.clients.get(m))
                        .filter(|cl| !cl.conn.is_closed())
                        .map(|cl| (cl.conn.clone(), cl.language))
                        .collect()
                })
                .unwrap_or_default()
        };
        let mut cpp_body: Option<Bytes> = None;
        let mut told = 0;
        for (conn, language) in members {
            let mut n = RemotingCommand::request(rq::RESET_CONSUMER_CLIENT_OFFSET, conn.next_opaque());
            n.flag = FLAG_ONEWAY;
            n.version = self.config.server_version;
            n.ext_fields.set("topic", topic);
            n.ext_fields.set("group", group);
            n.ext_fields.set("timestamp", timestamp.to_string());
            n.ext_fields.set("isForce", force.to_string());
            n.body = if language == crate::command::LanguageCode::Cpp {
                cpp_body
                    .get_or_insert_with(|| {
                        let list: Vec<Value> = table
                            .iter()
                            .map(|(m, o)| {
                                json!({"topic": m.topic, "brokerName": m.broker_name, "queueId": m.queue_id, "offset": o})
                            })
                            .collect();
                        Bytes::from(json!({ "offsetTable": list }).to_string())
                    })
                    .clone()
            } else {
                body.clone()
            };
            if conn.send(n) {
                told += 1;
            }
        }
        metrics::counter!("rokka_rocketmq_reset_notifications_total").increment(told as u64);
        told
    }

    /// Holds each reset queue until its consumer is at the new offset (or
    /// `offset_reset_hold_ms` passed); false when the table is full.
    pub(super) fn hold_resets(&self, group: &str, topic: &str, table: &[(u32, u64)]) -> bool {
        let hold = self.config.offset_reset_hold_ms;
        if hold == 0 || table.is_empty() {
            return true;
        }
        let now = self.now_ms();
        let max = self.config.max_offset_resets_held as usize;
        let mut r = self.resets.lock().unwrap_or_else(|p| p.into_inner());
        let fresh = table
            .iter()
            .filter(|(q, _)| !r.contains_key(&(group.to_string(), topic.to_string(), *q)))
            .count();
        if r.len() + fresh > max {
            r.retain(|_, (_, until)| *until > now);
            self.resets_counted(r.len());
            if r.len() + fresh > max {
                return false;
            }
        }
        for (q, o) in table {
            r.insert((group.to_string(), topic.to_string(), *q), (*o, now + hold));
        }
        self.resets_counted(r.len());
        true
    }

    /// Whether a RocketMQ client's commit of `offset` is ignored: the queue
    /// was reset and the client is not yet at the reset offset. A commit or
    /// a pull (`pulled`) at the reset offset, or the hold's end, releases it.
    pub(super) fn stale_after_reset(&self, group: &str, topic: &str, queue: u32, offset: u64, pulled: bool) -> bool {
        if self.resets_held.load(std::sync::atomic::Ordering::Relaxed) == 0 {
            return false;
        }
        let mut r = self.resets.lock().unwrap_or_else(|p| p.into_inner());
        let now = self.now_ms();
        let pruned_at = self.resets_pruned_at.load(std::sync::atomic::Ordering::Relaxed);
        if now.saturating_sub(pruned_at) >= 1_000 {
            self.resets_pruned_at.store(now, std::sync::atomic::Ordering::Relaxed);
            r.retain(|_, (_, until)| *until > now);
            self.resets_counted(r.len());
        }
        let key = (group.to_string(), topic.to_string(), queue);
        let Some(&(at, until)) = r.get(&key) else {
            return false;
        };
        if offset == at || until <= now {
            r.remove(&key);
            self.resets_counted(r.len());
            return false;
        }
        if pulled {
            return false;
        }
        metrics::counter!("rokka_rocketmq_stale_commits_ignored_total").increment(1);
        true
    }

    fn resets_counted(&self, n: usize) {
        self.resets_held.store(n, std::sync::atomic::Ordering::Relaxed);
        metrics::gauge!("rokka_rocketmq_offset_resets_held").set(n as f64);
    }

    pub(super) fn offset_queries(&self, req: &RemotingCommand) -> RemotingCommand {
        let topic = req.ext_fields.get("topic").unwrap_or_default();
        let queue = ext_i64(req, "queueId", "queueId").unwrap_or(0).max(0) as u32;
        let store = self.broker.store();
        let mut r = self.reply(req, rs::SUCCESS, None);
        match req.code {
            rq::GET_MAX_OFFSET => r.ext_fields.set("offset", store.max_offset(topic, queue).to_string()),
            rq::GET_MIN_OFFSET => r.ext_fields.set("offset", store.min_offset(topic, queue).to_string()),
            rq::SEARCH_OFFSET_BY_TIMESTAMP => {
                let ts = ext_i64(req, "timestamp", "timestamp").unwrap_or(0);
                let upper = req
                    .ext_fields
                    .get("boundaryType")
                    .is_some_and(|b| b.eq_ignore_ascii_case("UPPER"));
                let lower = store.offset_by_store_time(topic, queue, ts);
                let off = if upper {
                    // Last offset stored at or before ts.
                    let after = store.offset_by_store_time(topic, queue, ts.saturating_add(1));
                    after.saturating_sub(1).max(store.min_offset(topic, queue))
                } else {
                    lower
                };
                // Never past the end consumers see (in sync-flush or cluster
                // mode the written end runs ahead of it): a consumer starting
                // there would get PULL_OFFSET_MOVED.
                let off = off.min(store.max_offset(topic, queue));
                r.ext_fields.set("offset", off.to_string());
            }
            _ => {
                let min = store.min_offset(topic, queue);
                let read = store.read(topic, queue, min, 1, 1);
                let ts = read.entries.first().map_or(0, |e| e.cq.store_timestamp);
                r.ext_fields.set("timestamp", ts.to_string());
            }
        }
        r
    }

    /// LOCK_BATCH_MQ / UNLOCK_BATCH_MQ (digest §2.8): a queue is granted when
    /// free, already held by the asker, or its holder's lock is older than
    /// `lock_expiry_ms`; granting renews it. Unlock frees the asker's locks.
    pub(super) fn lock_batch(&self, req: &RemotingCommand, conn: &Conn) -> RemotingCommand {
        let LockBatch { group, client, queues } = match parse_lock_batch(&req.body) {
            Ok(b) => b,
            Err(why) => return self.reply(req, rs::SYSTEM_ERROR, Some(why.into())),
        };
        // The group is in the body: READ on it, as a pull of the group
        // needs, and on each queue's topic (Apache 5: SUB on every topic
        // of mqSet, retry topics aside).
        let read = rokka_broker::acl::Operation::Read;
        let needs = std::iter::once((rokka_broker::acl::ResourceType::Group, group.as_str(), read)).chain(
            queues
                .iter()
                .filter(|(topic, _, _)| !topic.starts_with("%RETRY%"))
                .map(|(topic, _, _)| rokka_broker::acl::rocketmq_topic(topic, read)),
        );
        if let Some(remark) = crate::auth::check_needs(&self.broker, conn, req, needs) {
            return self.reply(req, crate::auth::NO_PERMISSION, Some(remark));
        }
        // A client id a live client registered on another connection is
        // not this connection's to lock or unlock with (else anyone could
        // free or take another consumer's orderly queues by its id).
        let elsewhere = self
            .clients()
            .clients
            .get(&client)
            .is_some_and(|cl| cl.live_elsewhere(conn));
        if elsewhere {
            return self.reply(
                req,
                crate::auth::NO_PERMISSION,
                Some(format!("client {client} is registered on another connection")),
            );
        }
        let now = self.now_ms();
        let expiry = self.config.lock_expiry_ms;
        let mut granted = Vec::new();
        let mut locks = self.locks.lock().unwrap_or_else(|p| p.into_inner());
        // Keys come from clients: expired locks go before new ones are
        // taken, so the table holds live locks only (and at most
        // max_queue_locks of them).
        if req.code == rq::LOCK_BATCH_MQ {
            let before = locks.len();
            locks.retain(|_, (_, at)| at.saturating_add(expiry) >= now);
            if locks.len() < before {
                tracing::info!(group, expired = before - locks.len(), "expired queue locks released");
            }
        }
        let max_locks = self.config.max_queue_locks as usize;
        for (topic, queue, mq) in queues {
            let key = (group.clone(), topic, queue);
            // The cap is on new locks: a renewal of a lock already in the
            // table always goes (a table filled by one client must not stop
            // every orderly consumer's renewals).
            if req.code == rq::LOCK_BATCH_MQ && locks.len() >= max_locks && !locks.contains_key(&key) {
                metrics::counter!("rokka_rocketmq_queue_locks_refused_total").increment(1);
                continue;
            }
            if req.code == rq::UNLOCK_BATCH_MQ {
                if locks.get(&key).is_some_and(|(holder, _)| *holder == client) {
                    locks.remove(&key);
                }
                continue;
            }
            let free = match locks.get(&key) {
                None => true,
                Some((holder, at)) => *holder == client || at.saturating_add(expiry) < now,
            };
            if free {
                locks.insert(key, (client.clone(), now));
                // Echoed as sent (text that parsed as JSON before).
                if let Ok(raw) = serde_json::value::RawValue::from_string(mq) {
                    granted.push(raw);
                }
            }
        }
        metrics::gauge!("rokka_rocketmq_queue_locks").set(locks.len() as f64);
        drop(locks);
        if req.code == rq::UNLOCK_BATCH_MQ {
            return self.reply(req, rs::SUCCESS, None);
        }
        self.json_body(req, json!({"lockOKMQSet": granted}))
    }

    /// Whether `group` holds a queue lock that has not expired: its
    /// consumers consume orderly (RocketMQ's RebalanceLockManager
    /// isLockAllExpired, negated).
    pub(super) fn group_holds_locks(&self, group: &str) -> bool {
        let now = self.now_ms();
        let expiry = self.config.lock_expiry_ms;
        let locks = self.locks.lock().unwrap_or_else(|p| p.into_inner());
        locks
            .range((group.to_string(), String::new(), i64::MIN)..)
            .take_while(|((g, _, _), _)| g == group)
            .any(|(_, (_, at))| at.saturating_add(expiry) >= now)
    }

    /// GET_CONSUME_STATS: per queue of this broker, the group's committed
    /// offset and the queue's end (what `mqadmin consumerProgress` shows as
    /// lag). With a topic: every queue of it here (0 where nothing is
    /// committed, as RocketMQ answers); without: every queue the group has
    /// committed here, over its topics.
    pub(super) fn consume_stats(&self, req: &RemotingCommand, conn: &Conn) -> RemotingCommand {
        use crate::remote_offsets::{MessageQueue, OffsetWrapper};
        let group = req.ext_fields.get("consumerGroup").unwrap_or_default();
        let topic = req.ext_fields.get("topic").unwrap_or_default();
        let broker_name = self.broker_name();
        let store = self.broker.store();
        let offsets = store.offsets();
        // Apache's getTopicsForCollectingConsumeStats: a `topicList` given
        // is taken as it is; otherwise (the topic given, or every topic the
        // group committed on) a group with live subscriptions keeps only
        // the topics it subscribes to (a topic it left, or one the same
        // group name once consumed through Kafka, is not its progress now).
        let topic_list: Vec<String> = req
            .ext_fields
            .get("topicList")
            .unwrap_or_default()
            .split(';')
            .map(str::trim)
            .filter(|t| !t.is_empty())
            .take(1000)
            .map(String::from)
            .collect();
        let all_topics = req.ext_fields.get("rokkaAllTopics") == Some("true");
        let subscribed: Option<std::collections::BTreeSet<String>> = if topic_list.is_empty() && !all_topics {
            self.clients()
                .groups
                .get(group)
                .filter(|g| !g.subscriptions.is_empty())
                .map(|g| g.subscriptions.keys().cloned().collect())
        } else {
            None
        };
        let kept = |t: &str| subscribed.as_ref().is_none_or(|s| s.contains(t));
        let all_queues = |topic: &str| -> Vec<(String, u32, u64)> {
            let n = self
                .broker
                .topics()
                .get(topic)
                .map_or(0, |t| match self.broker.own_set() {
                    Some(set) if !t.placement.is_empty() => t.queues_on(set),
                    _ => t.partitions,
                });
            (0..n)
                .map(|q| {
                    (
                        topic.to_string(),
                        q,
                        offsets.get(group, topic, q).map_or(0, |o| o.offset),
                    )
                })
                .collect()
        };
        let queues: Vec<(String, u32, u64)> = if !topic_list.is_empty() {
            let who = crate::auth::lister(&self.broker, conn, req);
            topic_list
                .iter()
                .filter(|t| {
                    crate::auth::lists(
                        &self.broker,
                        who.as_deref(),
                        conn.peer.ip(),
                        rokka_broker::acl::rocketmq_topic(t, rokka_broker::acl::Operation::Describe),
                    )
                })
                .flat_map(|t| all_queues(t))
                // (A list of many topics of many queues: bounded.)
                .take(65_536)
                .collect()
        } else if !topic.is_empty() && !kept(topic) {
            Vec::new()
        } else if topic.is_empty() {
            // Every topic the group committed on: with authorization on,
            // only those the caller may describe (Kafka's OffsetFetch of
            // all topics filters them so).
            let who = crate::auth::lister(&self.broker, conn, req);
            offsets
                .group_offsets(group)
                .into_iter()
                .filter(|(t, _, _)| {
                    crate::auth::lists(
                        &self.broker,
                        who.as_deref(),
                        conn.peer.ip(),
                        rokka_broker::acl::rocketmq_topic(t, rokka_broker::acl::Operation::Describe),
                    )
                })
                .filter(|(t, _, _)| kept(t))
                .map(|(t, q, o)| (t, q, o.offset))
                .collect()
        } else {
            all_queues(topic)
        };
        let table: Vec<(MessageQueue, OffsetWrapper)> = queues
            .into_iter()
            .map(|(t, q, o)| {
                let end = store.max_offset(&t, q);
                (
                    MessageQueue {
                        broker_name: broker_name.clone(),
                        queue_id: q,
                        topic: t,
                    },
                    OffsetWrapper {
                        broker_offset: end,
                        consumer_offset: o,
                        pull_offset: o,
                        last_timestamp: 0,
                    },
                )
            })
            .collect();
        let mut r = self.reply(req, rs::SUCCESS, None);
        r.body = Bytes::from(crate::remote_offsets::encode_consume_stats(&table));
        r
    }
}

/// A LOCK_BATCH_MQ / UNLOCK_BATCH_MQ body.
#[derive(Debug, Clone, PartialEq)]
pub struct LockBatch {
    pub group: String,
    pub client: String,
    /// (topic, queue id, the queue as sent: echoed back when granted) of
    /// each `mqSet` entry with a numeric queue id.
    pub queues: Vec<(String, i64, String)>,
}

/// A lock or unlock body as clients send it: typed, each queue kept as
/// the text it was sent in (a generic JSON value cost ~100 times a body
/// of many small objects).
#[derive(serde::Deserialize)]
struct LockWire {
    #[serde(rename = "consumerGroup")]
    group: Option<String>,
    #[serde(rename = "clientId")]
    client: Option<String>,
    #[serde(rename = "mqSet", default, deserialize_with = "bounded_queues")]
    queues: Vec<Box<serde_json::value::RawValue>>,
}

/// Most queues one lock or unlock body may name (a consumer locks the
/// queues of its orderly topics; a list of millions of `{}` is not built).
const MAX_LOCK_QUEUES: usize = 100_000;

fn bounded_queues<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Vec<Box<serde_json::value::RawValue>>, D::Error> {
    struct V;
    impl<'de> serde::de::Visitor<'de> for V {
        type Value = Vec<Box<serde_json::value::RawValue>>;
        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str("a list of queues")
        }
        fn visit_unit<E: serde::de::Error>(self) -> Result<Self::Value, E> {
            Ok(Vec::new())
        }
        fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut a: A) -> Result<Self::Value, A::Error> {
            let mut out = Vec::new();
            while let Some(q) = a.next_element::<Box<serde_json::value::RawValue>>()? {
                if out.len() >= MAX_LOCK_QUEUES {
                    return Err(serde::de::Error::custom("more than 100000 queues"));
                }
                out.push(q);
            }
            Ok(out)
        }
    }
    d.deserialize_any(V)
}

#[derive(serde::Deserialize)]
struct QueueWire {
    topic: Option<String>,
    #[serde(rename = "queueId")]
    queue: Option<serde::de::IgnoredAny>,
}

/// Parses a lock or unlock body; the error is the response's remark.
/// The `queueId` of one `mqSet` entry when it is an integer.
fn queue_id_of(raw: &str) -> Option<i64> {
    #[derive(serde::Deserialize)]
    struct Id {
        #[serde(rename = "queueId")]
        queue: serde_json::Number,
    }
    serde_json::from_str::<Id>(raw).ok()?.queue.as_i64()
}

pub fn parse_lock_batch(body: &[u8]) -> Result<LockBatch, &'static str> {
    let body: LockWire = serde_json::from_slice(body).map_err(|_| "lock body is not JSON")?;
    let group = body.group.unwrap_or_default();
    let client = body.client.unwrap_or_default();
    if group.is_empty() || client.is_empty() {
        return Err("consumerGroup and clientId are required");
    }
    // Each granted queue keeps the group and the client id: bounded as
    // every request's names are (super::MAX_NAME_BYTES).
    if group.len() > super::MAX_NAME_BYTES || client.len() > super::MAX_NAME_BYTES {
        return Err("consumerGroup or clientId is longer than 255 bytes");
    }
    let mut queues = Vec::new();
    for mq in body.queues {
        // The queue id as a number (others are skipped, as before).
        let Ok(q) = serde_json::from_str::<QueueWire>(mq.get()) else {
            continue;
        };
        let Some(queue) = q.queue.and_then(|_| queue_id_of(mq.get())) else {
            continue;
        };
        let topic = q.topic.unwrap_or_default();
        if rokka_store::validate_topic(&topic).is_err() {
            return Err("mqSet names a topic that is not a valid topic name");
        }
        queues.push((topic, queue, mq.get().to_string()));
    }
    Ok(LockBatch { group, client, queues })
}

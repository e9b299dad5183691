//! Consumer offsets (query, update, min/max/time searches), queue locks of orderly consumers, consume stats.

use super::*;

impl RocketMq {
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

    pub(super) fn update_offset(&self, req: &RemotingCommand) -> RemotingCommand {
        let group = req.ext_fields.get("consumerGroup").unwrap_or_default();
        let topic = req.ext_fields.get("topic").unwrap_or_default();
        let queue = ext_i64(req, "queueId", "queueId").unwrap_or(-1);
        let offset = ext_i64(req, "commitOffset", "commitOffset").unwrap_or(-1);
        if group.is_empty() || queue < 0 || offset < 0 {
            return self.reply(req, rs::SYSTEM_ERROR, Some("bad offset update".into()));
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
    pub(super) fn lock_batch(&self, req: &RemotingCommand) -> RemotingCommand {
        let LockBatch { group, client, queues } = match parse_lock_batch(&req.body) {
            Ok(b) => b,
            Err(why) => return self.reply(req, rs::SYSTEM_ERROR, Some(why.into())),
        };
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
            if req.code == rq::LOCK_BATCH_MQ && locks.len() >= max_locks {
                metrics::counter!("rokka_rocketmq_queue_locks_refused_total").increment(1);
                break;
            }
            let key = (group.clone(), topic, queue);
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
                granted.push(mq);
            }
        }
        metrics::gauge!("rokka_rocketmq_queue_locks").set(locks.len() as f64);
        drop(locks);
        if req.code == rq::UNLOCK_BATCH_MQ {
            return self.reply(req, rs::SUCCESS, None);
        }
        self.json_body(req, json!({"lockOKMQSet": granted}))
    }

    /// GET_CONSUME_STATS: per queue of this broker, the group's committed
    /// offset and the queue's end (what `mqadmin consumerProgress` shows as
    /// lag). With a topic: every queue of it here (0 where nothing is
    /// committed, as RocketMQ answers); without: every queue the group has
    /// committed here, over its topics.
    pub(super) fn consume_stats(&self, req: &RemotingCommand) -> RemotingCommand {
        use crate::remote_offsets::{MessageQueue, OffsetWrapper};
        let group = req.ext_fields.get("consumerGroup").unwrap_or_default();
        let topic = req.ext_fields.get("topic").unwrap_or_default();
        let broker_name = match self.broker.cluster_view() {
            Some(c) => c.set.clone(),
            None => self.config.broker_name.clone(),
        };
        let store = self.broker.store();
        let offsets = store.offsets();
        let queues: Vec<(String, u32, u64)> = if topic.is_empty() {
            offsets
                .group_offsets(group)
                .into_iter()
                .map(|(t, q, o)| (t, q, o.offset))
                .collect()
        } else {
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
    pub queues: Vec<(String, i64, Value)>,
}

/// Parses a lock or unlock body; the error is the response's remark.
pub fn parse_lock_batch(body: &[u8]) -> Result<LockBatch, &'static str> {
    let body = serde_json::from_slice::<Value>(body).map_err(|_| "lock body is not JSON")?;
    let group = body["consumerGroup"].as_str().unwrap_or_default().to_string();
    let client = body["clientId"].as_str().unwrap_or_default().to_string();
    if group.is_empty() || client.is_empty() {
        return Err("consumerGroup and clientId are required");
    }
    let queues = body["mqSet"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|mq| {
            let queue = mq["queueId"].as_i64()?;
            Some((mq["topic"].as_str().unwrap_or_default().to_string(), queue, mq.clone()))
        })
        .collect();
    Ok(LockBatch { group, client, queues })
}

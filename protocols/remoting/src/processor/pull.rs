//! Pulls: long polling, queue ownership of mixed groups, one read of a queue.

use super::*;

/// Most rounds of filtered-out messages one held pull scans before it is
/// answered (each reads up to the pull's maxMsgNums queue entries).
const MAX_FILTERED_ROUNDS: u32 = 16;

impl RocketMq {
    pub(super) async fn pull(&self, req: &RemotingCommand, conn: &Conn) -> RemotingCommand {
        let topic = req.ext_fields.get("topic").unwrap_or_default().to_string();
        let group = req.ext_fields.get("consumerGroup").unwrap_or_default().to_string();
        let queue = ext_i64(req, "queueId", "queueId").unwrap_or(-1);
        let offset = ext_i64(req, "queueOffset", "queueOffset").unwrap_or(0).max(0) as u64;
        let max_msgs = ext_i64(req, "maxMsgNums", "maxMsgNums").unwrap_or(32).clamp(1, 1024) as u32;
        let sys_flag = ext_i64(req, "sysFlag", "sysFlag").unwrap_or(0);
        let suspend_ms = ext_i64(req, "suspendTimeoutMillis", "suspendTimeoutMillis")
            .unwrap_or(15_000)
            .clamp(0, 60_000) as u64;
        // The group's config (mqadmin updateSubGroup), checked first as
        // Apache's PullMessageProcessor does.
        let honoured = self.broker.sub_groups().honoured(&group);
        if !honoured.consume_enable {
            return self.consume_disabled(req, &group);
        }
        let Some(info) = self.broker.topics().get(&topic) else {
            return self.reply(req, rs::TOPIC_NOT_EXIST, Some(format!("topic[{topic}] not exist")));
        };
        if !info.rocketmq_readable() {
            return self.reply(
                req,
                rs::NO_PERMISSION,
                Some(format!("the topic[{topic}] pulling message is forbidden")),
            );
        }
        if queue < 0 || queue >= i64::from(info.partitions) {
            return self.reply(
                req,
                rs::INVALID_PARAMETER,
                Some(format!("queueId {queue} out of range")),
            );
        }
        let q = queue as u32;
        if !self.owns(&group, &topic, q, info.partitions, conn) {
            // A mixed group's queue allocated to another member (a Kafka one,
            // or this client before a rebalance it has not done yet): no
            // messages and no commit. Held a moment so the client does not spin.
            metrics::counter!("rokka_mixed_group_foreign_pulls_total", "group" => group.clone()).increment(1);
            tokio::time::sleep(Duration::from_millis(suspend_ms.min(1000))).await;
            let store = self.broker.store();
            // Pulled by one of the group's (clustering) RocketMQ members:
            // the pull goes on from what the queue's owner has committed
            // since (a client reads a queue's offset when its rebalance
            // gives it the queue — while a Kafka member still consumes it
            // until its own rebalance — and would start there, reading
            // again what the Kafka member consumed). Never backwards; never
            // for a client outside the group's members (a broadcasting one
            // keeps its own place).
            let committed = if self.is_member(&group, conn) {
                store.offsets().get(&group, &topic, q).map_or(0, |o| o.offset)
            } else {
                0
            };
            let mut r = self.reply(req, rs::PULL_NOT_FOUND, None);
            r.ext_fields.set("suggestWhichBrokerId", "0");
            r.ext_fields.set("nextBeginOffset", offset.max(committed).to_string());
            r.ext_fields.set("minOffset", store.min_offset(&topic, q).to_string());
            r.ext_fields.set("maxOffset", store.max_offset(&topic, q).to_string());
            return r;
        }
        // A replica does not take commits (RocketMQ's slave neither): the
        // master's offset table replaces its own.
        let replica = self.broker.cluster_view().is_some_and(|v| !v.is_master());
        // A pull at a reset queue's new offset: its consumer moved.
        let _ = self.stale_after_reset(&group, &topic, q, offset, true);
        // (Never under the broker's own groups: their offsets are its
        // delay-level and transaction-check progress.)
        if sys_flag & 0x1 != 0 && !replica && !rokka_broker::is_system_group(&group) {
            if let Some(c) = ext_i64(req, "commitOffset", "commitOffset")
                .filter(|c| *c >= 0 && !self.stale_after_reset(&group, &topic, q, *c as u64, false))
            {
                // Refused past store.max_committed_offsets (counted); the pull is still served.
                let _ = self
                    .broker
                    .store()
                    .offsets()
                    .commit_bounded(&group, &topic, q, c as u64, "", -1);
            }
        }
        // The filter: from the request when it carries one, else the heartbeat's.
        let (expr, kind) = if sys_flag & 0x4 != 0 {
            (
                req.ext_fields.get("subscription").unwrap_or("*").to_string(),
                req.ext_fields.get("expressionType").unwrap_or("TAG").to_string(),
            )
        } else {
            self.clients()
                .groups
                .get(&group)
                .and_then(|g| g.subscriptions.get(&topic))
                .map_or_else(
                    || ("*".to_string(), "TAG".to_string()),
                    |s| (s.expression.clone(), s.expression_type.clone()),
                )
        };
        if let Some(refused) = self.broadcast_refused(req, &group, sys_flag, &honoured) {
            return refused;
        }
        // Tags only: a SQL92 filter read as a tag expression would match
        // nothing, silently. RocketMQ's broker without property filtering
        // answers so.
        if !kind.is_empty() && !kind.eq_ignore_ascii_case("TAG") {
            return self.reply(
                req,
                rs::SYSTEM_ERROR,
                Some(format!(
                    "The broker does not support consumer to filter message by {kind}"
                )),
            );
        }
        let codes = tag_codes(&expr);
        let deadline = Instant::now() + Duration::from_millis(suspend_ms);
        let mut offset = offset;
        // Rounds of a held pull that found only filtered-out messages: a
        // backlog of them is scanned a bounded stretch per request (as
        // RocketMQ's maxFilterMessageCount), yielding between rounds, and
        // then answered PULL_RETRY_IMMEDIATELY from where the scan got to.
        let mut filtered_rounds = 0;
        let mut woken = false;
        loop {
            // Consumption turned off while this pull was held: refused now,
            // not served what arrives (Apache runs a woken pull's checks
            // again).
            if woken {
                let honoured = self.broker.sub_groups().honoured(&group);
                if !honoured.consume_enable {
                    return self.consume_disabled(req, &group);
                }
                if let Some(refused) = self.broadcast_refused(req, &group, sys_flag, &honoured) {
                    return refused;
                }
            }
            woken = true;
            let waiter = Arc::new(Notify::new());
            if sys_flag & 0x2 != 0 {
                self.broker.arrivals().register(&topic, q, &waiter);
            }
            // Room among the connection's unwritten bytes, claimed for this
            // read (held until the answer is built and returned). None left:
            // retried at once by the client — whose next requests are read
            // only once it has taken some of what it was sent.
            let claim = conn.claim_room(self.config.max_pull_bytes.max(1) as usize);
            if claim.bytes() == 0 {
                let store = self.broker.store();
                let mut r = self.reply(req, rs::PULL_RETRY_IMMEDIATELY, None);
                r.ext_fields.set("suggestWhichBrokerId", "0");
                r.ext_fields.set("nextBeginOffset", offset.to_string());
                r.ext_fields.set("minOffset", store.min_offset(&topic, q).to_string());
                r.ext_fields.set("maxOffset", store.max_offset(&topic, q).to_string());
                return r;
            }
            let (resp, next) = self.pull_once(req, &topic, q, offset, (max_msgs, claim.bytes()), codes.as_deref());
            let now = Instant::now();
            if resp.code != rs::PULL_NOT_FOUND || sys_flag & 0x2 == 0 || now >= deadline {
                if resp.code == rs::PULL_RETRY_IMMEDIATELY
                    && sys_flag & 0x2 != 0
                    && now < deadline
                    && next > offset
                    && filtered_rounds < MAX_FILTERED_ROUNDS
                {
                    // Everything scanned was filtered out: keep going from there.
                    filtered_rounds += 1;
                    offset = next;
                    tokio::task::yield_now().await;
                    continue;
                }
                return resp;
            }
            // Nothing to answer yet: the room goes back while it waits.
            drop(claim);
            metrics::gauge!("rokka_rocketmq_pulls_held").increment(1.0);
            let _ = tokio::time::timeout(deadline - now, waiter.notified()).await;
            metrics::gauge!("rokka_rocketmq_pulls_held").decrement(1.0);
        }
    }

    /// A group configured not to be consumed by broadcast: its
    /// broadcasting push consumers' pulls (those without their own
    /// subscription, as Apache checks) are refused.
    fn broadcast_refused(
        &self,
        req: &RemotingCommand,
        group: &str,
        sys_flag: i64,
        honoured: &rokka_broker::sub_groups::Honoured,
    ) -> Option<RemotingCommand> {
        (sys_flag & 0x4 == 0
            && !honoured.consume_broadcast_enable
            && self.clients().groups.get(group).is_some_and(|g| !g.clustering))
        .then(|| {
            self.group_forbidden(
                req,
                "broadcast_disabled",
                format!("the consumer group[{group}] can not consume by broadcast way"),
            )
        })
    }

    /// A pull of a group whose consumption is turned off (consumeEnable=false).
    fn consume_disabled(&self, req: &RemotingCommand, group: &str) -> RemotingCommand {
        self.group_forbidden(
            req,
            "consume_disabled",
            format!("subscription group no permission, {group}"),
        )
    }

    /// A pull refused by its group's config: NO_PERMISSION with Apache's
    /// forbiddenType (2: the group, 4: broadcasting), counted.
    fn group_forbidden(&self, req: &RemotingCommand, reason: &'static str, remark: String) -> RemotingCommand {
        metrics::counter!("rokka_rocketmq_group_refusals_total", "reason" => reason).increment(1);
        let mut r = self.reply(req, rs::NO_PERMISSION, Some(remark));
        let kind = if reason == "broadcast_disabled" { "4" } else { "2" };
        r.ext_fields.set("forbiddenType", kind);
        r
    }

    /// Whether a client on `conn` is one of `group`'s clustering RocketMQ
    /// members. (The clients' lock is let go before the members' is taken:
    /// a heartbeat takes them the other way round.)
    fn is_member(&self, group: &str, conn: &Conn) -> bool {
        let mine: Vec<String> = {
            let c = self.clients();
            c.clients
                .iter()
                .filter(|(_, cl)| cl.conn.peer == conn.peer)
                .map(|(id, _)| id.clone())
                .collect()
        };
        self.broker
            .membership()
            .with_group(group, |m| mine.iter().any(|id| m.rocketmq.contains(id)))
    }

    /// Whether the client on `conn` may pull `queue` of `topic` for `group`:
    /// always, unless the group is mixed; then only its own share by the
    /// averaging allocation over all member ids (retry topics excepted).
    pub(super) fn owns(&self, group: &str, topic: &str, queue: u32, partitions: u32, conn: &Conn) -> bool {
        // Retry and dead-letter topics are not part of the group's
        // assignment (a DLQ is read by tools and by other groups).
        if topic.starts_with("%RETRY%") || topic.starts_with("%DLQ%") {
            return true;
        }
        // What this needs of the members, copied (not the Kafka side's
        // topics and holdings): the lock is not held across the others.
        let Some((ids, rocketmq, held)) = self.broker.membership().with_mixed(group, |m| {
            (m.all_ids(), m.rocketmq.clone(), m.kafka_held.get(topic).cloned())
        }) else {
            return true;
        };
        // The unit list is the whole topic's queues over every broker set,
        // as the clients sort them (one set: this set's queues).
        let info = self.broker.topics().get(topic);
        let (index, units) = match &info {
            Some(info) => match info.rocketmq_index(self.broker.own_set(), queue) {
                Some(i) => (i, info.kafka_partitions() as usize),
                None => return false,
            },
            None => (queue as usize, partitions as usize),
        };
        // A partition a Kafka member still holds (it has not rejoined
        // since this client came: it goes on consuming it until its
        // rebalance completes) is not this client's yet — both would read
        // it, and each side's commits undo the other's.
        let partition = info
            .as_ref()
            .and_then(|i| i.kafka_partition_of(self.broker.own_set(), queue))
            .unwrap_or(queue as i32);
        if held.is_some_and(|ps| ps.contains(&partition)) {
            return false;
        }
        let c = self.clients();
        c.clients
            .iter()
            .filter(|(id, cl)| cl.conn.peer == conn.peer && rocketmq.contains(*id))
            .any(|(id, _)| rokka_broker::membership::allocate_averagely(units, &ids, id).contains(&index))
    }

    /// One pull attempt: the response and its nextBeginOffset.
    pub(super) fn pull_once(
        &self,
        req: &RemotingCommand,
        topic: &str,
        q: u32,
        offset: u64,
        (max_msgs, room): (u32, usize),
        codes: Option<&[i32]>,
    ) -> (RemotingCommand, u64) {
        let store = self.broker.store();
        // No more than the connection's unwritten bytes have room for (a
        // store read returns one entry at least).
        let cap = (self.config.max_pull_bytes.max(1) as usize).min(room.max(1));
        let read = store.read(topic, q, offset, max_msgs, cap);
        let (min, max) = (read.min_offset, read.max_offset);
        // Cluster mode with replica reads: a consumer far behind the log's
        // end is pointed at a replica, and back once caught up.
        let view = self.broker.cluster_view();
        let mut suggest = view.as_ref().map_or(0, |v| {
            let lag = read
                .entries
                .first()
                .map(|e| store.log_end().saturating_sub(e.cq.phys_offset));
            v.suggested_broker_id(lag)
        });
        if !read.entries.is_empty() {
            match view.as_ref().map(|v| v.is_master()) {
                Some(true) if suggest != 0 => {
                    metrics::counter!("rokka_cluster_read_redirects_total", "protocol" => "rocketmq").increment(1)
                }
                Some(false) => {
                    metrics::counter!("rokka_cluster_replica_reads_total", "protocol" => "rocketmq").increment(1)
                }
                _ => {}
            }
        }
        // Kafka transactions: nothing at or past the last stable offset (an
        // open transaction's records may still be aborted) is served, and
        // aborted transactions' records never are (as read_committed).
        let txns = self.broker.kafka_txns();
        let lso = txns.last_stable_offset(topic, q, max);
        let status = match read.status {
            ReadStatus::Found if offset >= lso => ReadStatus::NoNewMessages,
            s => s,
        };
        let (code, next, body) = match status {
            ReadStatus::Found => {
                let mut body = BytesMut::new();
                let mut n = 0;
                let mut next = read.next_offset;
                for e in &read.entries {
                    if e.cq.base_offset >= lso {
                        next = e.cq.base_offset.max(offset);
                        break;
                    }
                    // Kafka batches grow when they cross (decompressed, one
                    // message each): stop once the answer holds the cap
                    // (always at least one entry) or maxMsgNums messages
                    // (Apache never answers more).
                    if !body.is_empty() && (body.len() >= cap || n >= u64::from(max_msgs)) {
                        next = e.cq.base_offset.max(offset);
                        break;
                    }
                    if !e.is_kafka_batch() {
                        // A stored RocketMQ message goes out as stored.
                        if codes.is_none_or(|c| rokka_broker::convert::has_code(c, e.cq.tag_code as i32)) {
                            body.put_slice(&e.data);
                            n += 1;
                        }
                        continue;
                    }
                    // A Kafka-produced batch crosses: its records become
                    // messages (docs/mapping.md), filtered by their tag header.
                    let converted = match e.decode() {
                        Ok(Entry::KafkaBatch(b)) if txns.is_aborted_batch(topic, q, &b) => Ok(Default::default()),
                        Ok(Entry::KafkaBatch(b)) => rokka_broker::convert::kafka_batch_to_rocketmq_cached(
                            self.broker.decoded_batches(),
                            &b,
                            offset,
                            codes,
                            self.store_host,
                            self.broker.config().max_batch_decompressed_bytes as usize,
                            (
                                cap.saturating_sub(body.len()),
                                (max_msgs as usize).saturating_sub(n as usize),
                            ),
                            // (maxMsgNums binds over a batch kept decoded;
                            // one too large to keep fills the answer
                            // instead of being decoded again per 32.)
                            true,
                            &mut body,
                        ),
                        Ok(_) => Err("not a Kafka batch".to_string()),
                        Err(err) => Err(err.to_string()),
                    };
                    match converted {
                        Ok(c) => {
                            n += c.messages;
                            // The answer is full inside the batch: the
                            // next pull starts at the record left out.
                            if let Some(at) = c.stopped_at {
                                next = at.max(offset);
                                break;
                            }
                        }
                        Err(err) => {
                            tracing::error!(topic, queue = q, error = err, "Kafka batch not convertible; skipped")
                        }
                    }
                }
                if n == 0 {
                    (rs::PULL_RETRY_IMMEDIATELY, next, Bytes::new())
                } else {
                    self.broker.traffic().rocketmq_out.record(topic, n, body.len() as u64);
                    (rs::SUCCESS, next, body.freeze())
                }
            }
            ReadStatus::NoNewMessages => (rs::PULL_NOT_FOUND, offset, Bytes::new()),
            ReadStatus::NoSuchQueue if offset == 0 => (rs::PULL_NOT_FOUND, 0, Bytes::new()),
            // A replica does not move a consumer's offset on its own
            // bounds (its retention runs apart from the master's, it may
            // lag, or not hold the queue yet): it sends the consumer back
            // to the master, as a RocketMQ slave does (offsetCheckInSlave
            // off) — else a queue the replica has not made yet would move
            // the consumer to 0.
            ReadStatus::NoSuchQueue | ReadStatus::OffsetMoved | ReadStatus::OffsetOverflow
                if view.as_ref().is_some_and(|v| !v.is_master()) =>
            {
                suggest = 0;
                (rs::PULL_RETRY_IMMEDIATELY, offset, Bytes::new())
            }
            ReadStatus::NoSuchQueue => (rs::PULL_OFFSET_MOVED, 0, Bytes::new()),
            // Retention removed the records under a read at or past the
            // queue's start (between the read's loads): the client pulls on
            // at once from the first record still there, as Apache answers
            // MESSAGE_WAS_REMOVING (not moved back to a start that is gone).
            ReadStatus::OffsetMoved if offset >= min => (rs::PULL_RETRY_IMMEDIATELY, read.next_offset, Bytes::new()),
            ReadStatus::OffsetMoved => (rs::PULL_OFFSET_MOVED, read.next_offset, Bytes::new()),
            ReadStatus::OffsetOverflow => (rs::PULL_OFFSET_MOVED, max, Bytes::new()),
            // A damaged entry is never served: an error, which clients
            // retry after their pull back-off (3 s), not at once.
            ReadStatus::Damaged => (rs::SYSTEM_ERROR, offset, Bytes::new()),
        };
        let mut r = self.reply(req, code, None);
        r.ext_fields.set("suggestWhichBrokerId", suggest.to_string());
        r.ext_fields.set("nextBeginOffset", next.to_string());
        r.ext_fields.set("minOffset", min.to_string());
        r.ext_fields.set("maxOffset", max.to_string());
        r.body = body;
        (r, next)
    }
}

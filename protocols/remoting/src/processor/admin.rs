//! Topic administration and message queries by key and id.

use super::*;

impl RocketMq {
    /// UPDATE_AND_CREATE_TOPIC (mqadmin updateTopic): creates the topic or
    /// updates it from the TopicConfig it is sent — its write queue count
    /// and its permission; the store's queues grow to the larger count and
    /// are all read (a smaller write count leaves queues past it unwritten
    /// by RocketMQ producers, as Apache's; a smaller read count would hide
    /// what Kafka producers write there).
    pub(super) fn create_topic(&self, req: &RemotingCommand) -> RemotingCommand {
        use rokka_broker::topics::{RocketMqTopic, PERM_RW};
        let topic = req.ext_fields.get("topic").unwrap_or_default();
        // Names refused with SYSTEM_ERROR and TopicValidator's remarks, as
        // Apache's AdminBrokerProcessor.updateAndCreateTopic.
        if rokka_store::validate_topic(topic).is_err() {
            return self.reply(
                req,
                rs::SYSTEM_ERROR,
                Some(format!("The specified topic[{topic}] is invalid.")),
            );
        }
        // Apache's TopicValidator on top for a topic made here (what mqadmin
        // updateTopic makes, its clients take): [%|a-zA-Z0-9_-], at most 127
        // characters — a '.' the Java producer then refuses client-side. A
        // topic that exists (a Kafka-made "orders.v1", a group's long retry
        // topic) may still have its queues and perm changed. And none of
        // the broker's own topics, nor TBW102.
        let illegal = topic.len() > 127
            || !topic
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'%' | b'|' | b'_' | b'-'));
        if illegal && self.broker.topics().get(topic).is_none() {
            return self.reply(
                req,
                rs::SYSTEM_ERROR,
                Some(format!(
                    "The specified topic[{topic}] contains illegal characters, allowing only ^[%|a-zA-Z0-9_-]+$, or is longer than 127"
                )),
            );
        }
        if rokka_broker::is_system_topic(topic) || topic == "TBW102" {
            return self.reply(
                req,
                rs::SYSTEM_ERROR,
                Some(format!("The topic[{topic}] is conflict with system topic.")),
            );
        }
        let read = ext_i64(req, "readQueueNums", "readQueueNums");
        let write = ext_i64(req, "writeQueueNums", "writeQueueNums");
        let (read, write) = match (read, write) {
            (Some(r), Some(w)) => (r, w),
            (Some(n), None) | (None, Some(n)) => (n, n),
            (None, None) => (8, 8),
        };
        let max = i64::from(self.broker.config().max_partitions);
        if !(1..=max).contains(&read) || !(1..=max).contains(&write) {
            return self.reply(
                req,
                rs::INVALID_PARAMETER,
                Some(format!("readQueueNums and writeQueueNums must be 1..={max}")),
            );
        }
        // PermName: 4 read, 2 write (1, "inherit", is the TBW102 template's).
        let perm = ext_i64(req, "perm", "perm").unwrap_or(i64::from(PERM_RW));
        if !(0..=7).contains(&perm) {
            return self.reply(
                req,
                rs::INVALID_PARAMETER,
                Some(format!("perm {perm} is not a permission")),
            );
        }
        let perm = (perm as u32) & PERM_RW;
        let (read, write) = (read as u32, write as u32);
        let queues = read.max(write);
        match self.broker.create_topic(topic, queues) {
            Ok(_) => {}
            Err(rokka_broker::BrokerError::TopicExists(_)) => {
                // Several broker sets: the count is the topic's (every
                // set's queues), as Kafka's partition count is.
                let current = self.broker.topics().get(topic).map_or(queues, |t| t.kafka_partitions());
                if queues > current {
                    if let Err(e) = self.broker.add_partitions(topic, queues) {
                        return self.reply(req, rs::INVALID_PARAMETER, Some(e.to_string()));
                    }
                }
            }
            Err(e) => return self.reply(req, rs::INVALID_PARAMETER, Some(e.to_string())),
        }
        let Some(info) = self.broker.topics().get(topic) else {
            return self.reply(req, rs::SYSTEM_ERROR, Some(format!("topic {topic} went away")));
        };
        // Every queue stays read (see TopicInfo::rocketmq_queues); with
        // several broker sets only the permission applies.
        let all = !info.placement.is_empty() || write == info.partitions;
        let rocketmq = (!(all && perm == PERM_RW)).then_some(RocketMqTopic {
            write_queues: write,
            perm,
        });
        if let Err(e) = self.broker.set_rocketmq_topic(topic, rocketmq) {
            return self.reply(req, rs::SYSTEM_ERROR, Some(e.to_string()));
        }
        self.reply(req, rs::SUCCESS, None)
    }

    /// A topic as Apache's TopicConfig JSON.
    fn topic_config_json(name: &str, t: &rokka_broker::TopicInfo) -> Value {
        let (read, write, perm) = t.rocketmq_queues();
        json!({"topicName": name, "readQueueNums": read, "writeQueueNums": write, "perm": perm,
               "topicFilterType": "SINGLE_TAG", "topicSysFlag": 0, "order": false, "attributes": {}})
    }

    /// GET_TOPIC_CONFIG (mqadmin consumerProgress, topicStatus, the
    /// dashboard): one topic's TopicConfig; TOPIC_NOT_EXIST if unknown.
    pub(super) fn topic_config(&self, req: &RemotingCommand) -> RemotingCommand {
        let topic = req.ext_fields.get("topic").unwrap_or_default();
        match self.broker.topics().get(topic) {
            Some(t) => self.json_body(req, Self::topic_config_json(topic, &t)),
            None => self.reply(
                req,
                rs::TOPIC_NOT_EXIST,
                Some(format!("No topic in this broker. topic: {topic}")),
            ),
        }
    }

    /// DELETE_TOPIC_IN_BROKER (mqadmin deleteTopic, which then asks the
    /// name servers): the topic, its messages and its committed offsets.
    pub(super) fn delete_topic(&self, req: &RemotingCommand) -> RemotingCommand {
        let topic = req.ext_fields.get("topic").unwrap_or_default();
        if topic.trim().is_empty() {
            return self.reply(req, rs::INVALID_PARAMETER, Some("The specified topic is blank.".into()));
        }
        if rokka_broker::is_send_forbidden_topic(topic) {
            return self.reply(
                req,
                rs::INVALID_PARAMETER,
                Some(format!("The topic[{topic}] is conflict with system topic.")),
            );
        }
        match self.broker.delete_topic(topic) {
            // Deleting a topic this broker does not hold succeeds (mqadmin
            // asks every broker of the cluster).
            Ok(()) | Err(rokka_broker::BrokerError::UnknownTopic(_)) => {
                tracing::info!(topic, "topic deleted (DELETE_TOPIC_IN_BROKER)");
                self.reply(req, rs::SUCCESS, None)
            }
            Err(e) => self.reply(req, rs::SYSTEM_ERROR, Some(e.to_string())),
        }
    }

    /// GET_TOPIC_STATS_INFO (mqadmin topicStatus): each queue's min and max
    /// offsets and the store time of its last message.
    pub(super) fn topic_stats(&self, req: &RemotingCommand) -> RemotingCommand {
        use crate::remote_offsets::{MessageQueue, TopicOffset};
        let topic = req.ext_fields.get("topic").unwrap_or_default();
        let Some(info) = self.broker.topics().get(topic) else {
            return self.reply(req, rs::TOPIC_NOT_EXIST, Some(format!("topic[{topic}] not exist")));
        };
        // Every queue is read (TopicInfo::rocketmq_queues): all listed.
        let (queues, _, _) = info.rocketmq_queues();
        let store = self.broker.store();
        let broker_name = self.broker_name();
        let table: Vec<(MessageQueue, TopicOffset)> = (0..queues)
            .map(|q| {
                let last = store
                    .queue(topic, q)
                    .and_then(|cq| cq.entry(cq.entry_count().saturating_sub(1)))
                    .map_or(0, |e| e.store_timestamp);
                let mq = MessageQueue {
                    broker_name: broker_name.clone(),
                    queue_id: q,
                    topic: topic.to_string(),
                };
                let offsets = TopicOffset {
                    min_offset: store.min_offset(topic, q),
                    max_offset: store.max_offset(topic, q),
                    last_update_timestamp: last,
                };
                (mq, offsets)
            })
            .collect();
        let mut r = self.reply(req, rs::SUCCESS, None);
        r.body = Bytes::from(crate::remote_offsets::encode_topic_stats(&table));
        r
    }

    /// A client's connection as Apache's Connection JSON fields (taken
    /// under the clients' lock; the JSON is built after it).
    fn connection_of(id: &str, c: &crate::clients::Client) -> (String, std::net::SocketAddr, &'static str, i32) {
        (id.to_string(), c.conn.peer, c.language.name(), c.version)
    }

    fn connection_json((id, addr, language, version): (String, std::net::SocketAddr, &'static str, i32)) -> Value {
        json!({"clientId": id, "clientAddr": addr.to_string(), "language": language, "version": version})
    }

    /// GET_CONSUMER_CONNECTION_LIST (mqadmin consumerConnection): a group's
    /// live clients and subscriptions; CONSUMER_NOT_ONLINE if none.
    pub(super) fn consumer_connections(&self, req: &RemotingCommand) -> RemotingCommand {
        let group = req.ext_fields.get("consumerGroup").unwrap_or_default();
        let found = {
            let c = self.clients();
            c.groups.get(group).filter(|g| !g.members.is_empty()).map(|g| {
                let conns: Vec<_> = g
                    .members
                    .iter()
                    .filter_map(|id| c.clients.get(id).map(|cl| Self::connection_of(id, cl)))
                    .collect();
                let subs: Vec<(String, crate::clients::Subscription)> =
                    g.subscriptions.iter().map(|(t, s)| (t.clone(), s.clone())).collect();
                (conns, subs, g.clustering)
            })
        };
        let Some((conns, subs, clustering)) = found else {
            return self.reply(
                req,
                rs::CONSUMER_NOT_ONLINE,
                Some(format!("the consumer group[{group}] not online")),
            );
        };
        let conns: Vec<Value> = conns.into_iter().map(Self::connection_json).collect();
        let subs: serde_json::Map<String, Value> = subs
            .into_iter()
            .map(|(t, s)| {
                let v = json!({"classFilterMode": false, "topic": t, "subString": s.expression,
                               "tagsSet": [], "codeSet": [], "subVersion": s.version,
                               "expressionType": s.expression_type});
                (t, v)
            })
            .collect();
        self.json_body(
            req,
            json!({"connectionSet": conns, "subscriptionTable": subs,
                   "consumeType": "CONSUME_PASSIVELY",
                   "messageModel": if clustering { "CLUSTERING" } else { "BROADCASTING" },
                   "consumeFromWhere": "CONSUME_FROM_LAST_OFFSET"}),
        )
    }

    /// GET_PRODUCER_CONNECTION_LIST (mqadmin producerConnection): the live
    /// clients of a producer group.
    pub(super) fn producer_connections(&self, req: &RemotingCommand) -> RemotingCommand {
        let group = req.ext_fields.get("producerGroup").unwrap_or_default();
        let conns: Vec<_> = {
            let c = self.clients();
            c.clients
                .iter()
                .filter(|(_, cl)| cl.producer_groups.contains(group))
                .map(|(id, cl)| Self::connection_of(id, cl))
                .collect()
        };
        if conns.is_empty() {
            return self.reply(req, rs::SYSTEM_ERROR, Some("the producer group not exist".into()));
        }
        let conns: Vec<Value> = conns.into_iter().map(Self::connection_json).collect();
        self.json_body(req, json!({"connectionSet": conns}))
    }

    /// QUERY_TOPIC_CONSUME_BY_WHO (mqadmin topicList -c, the dashboard):
    /// the groups consuming a topic — subscribed now, or holding offsets;
    /// with authorization on, only groups the caller may describe (as
    /// Kafka's ListGroups).
    pub(super) fn consume_by_who(&self, req: &RemotingCommand, conn: &Conn) -> RemotingCommand {
        let topic = req.ext_fields.get("topic").unwrap_or_default();
        let mut groups: std::collections::BTreeSet<String> = {
            let c = self.clients();
            c.groups
                .iter()
                .filter(|(_, g)| g.subscriptions.contains_key(topic))
                .map(|(n, _)| n.clone())
                .collect()
        };
        groups.extend(self.broker.store().offsets().groups_of_topic(topic));
        let listed = self.listed(req, conn);
        groups.retain(|g| {
            listed((
                rokka_broker::acl::ResourceType::Group,
                g,
                rokka_broker::acl::Operation::Describe,
            ))
        });
        // (Up to MAX_GROUP_LISTING_BYTES of names as JSON, as 201's listing.)
        let mut bytes = 0;
        let before = groups.len();
        groups.retain(|g| {
            bytes += json_len(g) + 1;
            bytes <= MAX_GROUP_LISTING_BYTES
        });
        left_out("consume_by_who", (before - groups.len()) as u64);
        self.json_body(req, json!({"groupList": groups}))
    }

    /// Whether the caller of `req` sees a resource in a listing (Kafka
    /// filters a listing by DESCRIBE): always with authorization off or
    /// for the cluster's own call.
    fn listed<'s>(
        &'s self,
        req: &RemotingCommand,
        conn: &'s Conn,
    ) -> impl Fn((rokka_broker::acl::ResourceType, &str, rokka_broker::acl::Operation)) -> bool + 's {
        let who = crate::auth::lister(&self.broker, conn, req);
        move |need| crate::auth::lists(&self.broker, who.as_deref(), conn.peer.ip(), need)
    }

    /// GET_BROKER_RUNTIME_INFO (mqadmin brokerStatus, clusterList, the
    /// dashboard): the KVTable of figures those tools read, as strings.
    pub(super) fn runtime_info(&self, req: &RemotingCommand) -> RemotingCommand {
        let store = self.broker.store();
        // Figures Rokka does not keep per window (TPS, daily totals, thread
        // pool queues) are 0, as an idle Apache broker reports them.
        let table = json!({
            "brokerVersionDesc": "V5_3_3",
            "brokerVersion": "479",
            "brokerActive": "true",
            "putTps": "0.0 0.0 0.0",
            "getTransferredTps": "0.0 0.0 0.0",
            "msgPutTotalYesterdayMorning": "0",
            "msgPutTotalTodayMorning": "0",
            "msgPutTotalTodayNow": "0",
            "msgGetTotalYesterdayMorning": "0",
            "msgGetTotalTodayMorning": "0",
            "msgGetTotalTodayNow": "0",
            "sendThreadPoolQueueSize": "0",
            "pullThreadPoolQueueSize": "0",
            "sendThreadPoolQueueHeadWaitTimeMills": "0",
            "pullThreadPoolQueueHeadWaitTimeMills": "0",
            "pageCacheLockTimeMills": "0",
            "earliestMessageTimeStamp": "0",
            "commitLogDiskRatio": "0.0",
            "commitLogMaxOffset": store.log_end().to_string(),
            "dispatchBehindBytes": "0",
            "timerReadBehind": "0",
            "timerOffsetBehind": "0",
            "timerCongestNum": "0",
            "timerEnqueueTps": "0.0",
            "timerDequeueTps": "0.0",
        });
        self.json_body(req, json!({"table": table}))
    }

    /// GET_BROKER_CONFIG (mqadmin getBrokerConfig, the dashboard's broker
    /// config view): this broker's settings under Apache's property names
    /// (`key=value` lines, as Apache's Configuration writes them), mapped
    /// from Rokka's config where Rokka has the setting; the `version`
    /// header a DataVersion.
    pub(super) fn broker_config(&self, req: &RemotingCommand) -> RemotingCommand {
        let store = self.broker.store().config();
        let broker = self.broker.config();
        let (role, id) = match self.broker.cluster_view() {
            Some(c) if !c.is_master() => ("SLAVE", i64::from(c.self_id) + 1),
            _ if self.broker.store().waits_for_replicas() => ("SYNC_MASTER", 0),
            _ => ("ASYNC_MASTER", 0),
        };
        let flush = match store.flush_mode {
            rokka_store::FlushMode::Sync => "SYNC_FLUSH",
            rokka_store::FlushMode::Async => "ASYNC_FLUSH",
        };
        // Apache's messageDelayLevel units (s, m, h, d; ms where none fits).
        let unit = |ms: u64| {
            let units = [(86_400_000, "d"), (3_600_000, "h"), (60_000, "m"), (1000, "s")];
            match units.into_iter().find(|(u, _)| ms > 0 && ms.is_multiple_of(*u)) {
                Some((u, name)) => format!("{}{name}", ms / u),
                None => format!("{ms}ms"),
            }
        };
        let delay_levels: Vec<String> = broker.delay_levels_ms.iter().map(|ms| unit(*ms)).collect();
        let host = self
            .advertised
            .rsplit_once(':')
            .map_or(self.advertised.as_str(), |(h, _)| h);
        let props: Vec<(&str, String)> = vec![
            ("brokerClusterName", self.config.cluster_name.clone()),
            ("brokerName", self.broker_name()),
            ("brokerId", id.to_string()),
            ("brokerRole", role.into()),
            ("brokerIP1", host.to_string()),
            // brokerIP1:listenPort is the address clients are given.
            (
                "listenPort",
                self.advertised
                    .rsplit_once(':')
                    .and_then(|(_, p)| p.parse::<u16>().ok())
                    .unwrap_or(self.bound.port())
                    .to_string(),
            ),
            ("namesrvAddr", self.namesrv_targets().join(";")),
            ("storePathRootDir", store.data_dir.display().to_string()),
            (
                "storePathCommitLog",
                store.data_dir.join("commitlog").display().to_string(),
            ),
            ("mappedFileSizeCommitLog", store.commitlog_segment_bytes.to_string()),
            (
                "mappedFileSizeConsumeQueue",
                (u64::from(store.consume_queue_entries_per_file) * 20).to_string(),
            ),
            ("flushDiskType", flush.into()),
            ("flushIntervalCommitLog", store.flush_interval_ms.to_string()),
            ("syncFlushTimeout", store.sync_flush_timeout_ms.to_string()),
            ("maxMessageSize", store.max_message_bytes.to_string()),
            ("fileReservedTime", store.retention_hours.to_string()),
            ("diskMaxUsedSpaceRatio", store.disk_max_used_percent.to_string()),
            ("messageIndexEnable", store.index_enabled.to_string()),
            ("maxHashSlotNum", store.index_slots.to_string()),
            ("maxIndexNum", store.index_entries.to_string()),
            ("autoCreateTopicEnable", broker.auto_create_topics.to_string()),
            ("defaultTopicQueueNums", broker.default_partitions.to_string()),
            ("autoCreateSubscriptionGroup", "true".into()),
            ("messageDelayLevel", delay_levels.join(" ")),
            ("timerMaxDelaySec", (broker.timer_max_delay_ms / 1000).to_string()),
            ("transactionTimeOut", self.config.transaction_timeout_ms.to_string()),
            (
                "transactionCheckInterval",
                self.config.transaction_check_interval_ms.to_string(),
            ),
            ("transactionCheckMax", self.config.transaction_check_max.to_string()),
            ("authorizationEnabled", self.broker.acls().enabled().to_string()),
            ("enableControllerMode", self.broker.cluster_view().is_some().to_string()),
        ];
        let mut body = String::new();
        for (k, v) in props {
            body.push_str(k);
            body.push('=');
            body.push_str(&v);
            body.push('\n');
        }
        let mut r = self.reply(req, rs::SUCCESS, None);
        r.ext_fields.set(
            "version",
            json!({"counter": 0, "stateVersion": 0, "timestamp": 0}).to_string(),
        );
        r.body = Bytes::from(body);
        r
    }

    /// QUERY_TOPICS_BY_CONSUMER (an admin's queryTopicsByConsumer): the
    /// topics `group` has committed offsets on here, whichever protocol
    /// committed them (Apache's whichTopicByConsumer), those the caller
    /// may describe.
    pub(super) fn topics_by_consumer(&self, req: &RemotingCommand, conn: &Conn) -> RemotingCommand {
        let group = req.ext_fields.get("group").unwrap_or_default();
        let mut topics: Vec<String> = self
            .broker
            .store()
            .offsets()
            .group_offsets(group)
            .into_iter()
            .map(|(t, _, _)| t)
            .collect();
        topics.dedup();
        // Only the topics the caller may describe (as Kafka's OffsetFetch
        // leaves out the rest of the same table).
        let listed = self.listed(req, conn);
        topics.retain(|t| {
            listed(rokka_broker::acl::rocketmq_topic(
                t,
                rokka_broker::acl::Operation::Describe,
            ))
        });
        self.json_body(req, json!({"topicList": topics, "brokerAddr": self.advertised}))
    }

    /// QUERY_SUBSCRIPTION_BY_CONSUMER: `group`'s subscription to `topic` as
    /// its live RocketMQ members' heartbeats gave it (null when none).
    pub(super) fn subscription_by_consumer(&self, req: &RemotingCommand) -> RemotingCommand {
        let group = req.ext_fields.get("group").unwrap_or_default();
        let topic = req.ext_fields.get("topic").unwrap_or_default();
        let sub = self
            .clients()
            .groups
            .get(group)
            .and_then(|g| g.subscriptions.get(topic))
            .map(|s| (s.expression.clone(), s.expression_type.clone(), s.version));
        let data = sub.map(|(expr, kind, version)| {
            // Apache's FilterAPI: a tag expression's tags and their hash
            // codes (Java's String.hashCode); none for SQL92 or "*".
            let tag = kind.is_empty() || kind.eq_ignore_ascii_case("TAG");
            let tags: Vec<&str> = match tag {
                true => rokka_broker::convert::tag_names(&expr).map_or_else(Vec::new, Iterator::collect),
                false => Vec::new(),
            };
            let codes: Vec<i32> = tags
                .iter()
                .map(|t| rokka_store::record::properties::java_string_hash(t.as_bytes()))
                .collect();
            json!({
                "topic": topic,
                "subString": expr,
                "expressionType": kind,
                "tagsSet": tags,
                "codeSet": codes,
                "subVersion": version,
                "classFilterMode": false,
            })
        });
        self.json_body(req, json!({"group": group, "topic": topic, "subscriptionData": data}))
    }

    /// QUERY_MESSAGE: messages of `topic` by key (a KEYS token, or the
    /// client's unique id), stored within [beginTimestamp, endTimestamp],
    /// from the IndexFile; QUERY_NOT_FOUND when none.
    pub(super) fn query_message(&self, req: &RemotingCommand) -> RemotingCommand {
        let topic = req.ext_fields.get("topic").unwrap_or_default();
        let key = req.ext_fields.get("key").unwrap_or_default();
        let max = ext_i64(req, "maxNum", "maxNum").unwrap_or(32).clamp(1, 64) as usize;
        let begin = ext_i64(req, "beginTimestamp", "beginTimestamp").unwrap_or(0);
        let end = ext_i64(req, "endTimestamp", "endTimestamp").unwrap_or(i64::MAX);
        let unique = ext_bool(req, "_UNIQUE_KEY_QUERY", "_UNIQUE_KEY_QUERY");
        let found = self
            .broker
            .store()
            .query_by_key(topic, key, if unique { 1 } else { max }, begin, end);
        metrics::counter!("rokka_rocketmq_queries_total", "kind" => if unique { "unique_key" } else { "key" })
            .increment(1);
        if found.is_empty() {
            return self.reply(
                req,
                rs::QUERY_NOT_FOUND,
                Some(format!(
                    "can not find message, maybe time range not correct: {topic} {key}"
                )),
            );
        }
        // At most a pull's bytes (`max_pull_bytes`; one message at least):
        // 64 messages of the largest size were 256 MiB in one answer.
        let cap = self.config.max_pull_bytes.max(1) as usize;
        let mut body = BytesMut::new();
        for rec in &found {
            if !body.is_empty() && body.len() + rec.len() > cap {
                break;
            }
            body.put_slice(rec);
        }
        let mut r = self.reply(req, rs::SUCCESS, None);
        r.ext_fields
            .set("indexLastUpdateTimestamp", rokka_store::now_ms().to_string());
        r.ext_fields.set("indexLastUpdatePhyoffset", "0");
        r.body = body.freeze();
        r
    }

    /// VIEW_MESSAGE_BY_ID: the stored message at a CommitLog offset (the
    /// offset part of a message id); a Kafka batch answers with its first
    /// record, converted.
    pub(super) fn view_message(&self, req: &RemotingCommand, conn: &Conn) -> RemotingCommand {
        let phys = ext_i64(req, "offset", "offset").unwrap_or(-1);
        metrics::counter!("rokka_rocketmq_queries_total", "kind" => "id").increment(1);
        let rec = (phys >= 0).then(|| self.broker.store().read_at(phys as u64)).flatten();
        let entry = rec.as_ref().map(rokka_store::decode_entry);
        // Any offset may be asked for: READ on the record's topic, whose
        // ACLs would otherwise be read around.
        if let Some(Ok(e)) = &entry {
            let topic = crate::auth::topic_of_record(e);
            let need = rokka_broker::acl::rocketmq_topic(&topic, rokka_broker::acl::Operation::Read);
            if let Some(remark) = crate::auth::check_need(&self.broker, conn, req, need) {
                return self.reply(req, crate::auth::NO_PERMISSION, Some(remark));
            }
        }
        let body = match entry {
            Some(Ok(Entry::Message(_))) => rec.unwrap_or_default(),
            Some(Ok(Entry::KafkaBatch(b))) => {
                let mut out = BytesMut::new();
                match rokka_broker::convert::kafka_batch_to_rocketmq(
                    &b,
                    b.queue_offset,
                    None,
                    self.store_host,
                    self.broker.config().max_batch_decompressed_bytes as usize,
                    &mut out,
                ) {
                    Ok(_) if !out.is_empty() => {
                        let first = (u32::from_be_bytes([out[0], out[1], out[2], out[3]]) as usize).min(out.len());
                        out.freeze().slice(..first)
                    }
                    _ => Bytes::new(),
                }
            }
            _ => Bytes::new(),
        };
        if body.is_empty() {
            return self.reply(
                req,
                rs::SYSTEM_ERROR,
                Some(format!("can not find message by the offset, {phys}")),
            );
        }
        let mut r = self.reply(req, rs::SUCCESS, None);
        r.body = body;
        r
    }

    /// GET_ALL_SUBSCRIPTIONGROUP_CONFIG (the dashboard's consumer list,
    /// Apache's SubscriptionGroupWrapper): the configs an operator set,
    /// and every other group with committed offsets or live RocketMQ
    /// members with Apache's defaults (Apache makes a group's config at
    /// its first pull), the broker's own groups left out.
    /// The answer stops at [`MAX_GROUP_LISTING_BYTES`]: the kept configs
    /// first, then the other groups; those left out are counted
    /// (`rokka_rocketmq_group_listing_left_out_total`).
    pub(super) fn all_subscription_groups(&self, req: &RemotingCommand) -> RemotingCommand {
        let kept = self.broker.sub_groups().all();
        let mut others: std::collections::BTreeSet<String> =
            self.broker.store().offsets().groups().into_iter().collect();
        others.extend(self.clients().groups.keys().cloned());
        let default = rokka_broker::sub_groups::GroupConfig::default();
        let mut table = serde_json::Map::new();
        let mut bytes = 0usize;
        let listed: Vec<(&String, &rokka_broker::sub_groups::GroupConfig)> = kept
            .iter()
            .chain(others.iter().filter(|g| !kept.contains_key(*g)).map(|g| (g, &default)))
            .filter(|(g, _)| !rokka_broker::is_system_group(g))
            .collect();
        for (i, (g, config)) in listed.iter().enumerate() {
            let v = config.to_json(g);
            // (The entry's JSON: its escaped name, a colon, the config, a comma.)
            let size = json_len(g) + 2 + json_len(&v);
            if bytes + size > MAX_GROUP_LISTING_BYTES {
                // The rest left out, in their order (kept configs first).
                left_out("subscription_groups", (listed.len() - i) as u64);
                break;
            }
            bytes += size;
            table.insert((*g).clone(), v);
        }
        self.json_body(
            req,
            json!({"subscriptionGroupTable": table, "forbiddenTable": {}, "dataVersion": {"counter": 0, "stateVersion": 0, "timestamp": 0}}),
        )
    }

    /// GET_SUBSCRIPTIONGROUP_CONFIG (the admin's examineSubscriptionGroupConfig,
    /// Apache's AdminBrokerProcessor.getSubscriptionGroup): the group's
    /// config — set by an operator, or Apache's defaults for a group this
    /// broker knows (committed offsets, live members); SYSTEM_ERROR "No
    /// group in this broker" for any other.
    pub(super) fn subscription_group(&self, req: &RemotingCommand) -> RemotingCommand {
        let group = req.ext_fields.get("group").unwrap_or_default();
        let config = self.broker.sub_groups().get(group).or_else(|| {
            if group.is_empty() || rokka_broker::is_system_group(group) {
                return None;
            }
            let live = self.clients().groups.contains_key(group);
            let known = live || self.broker.store().offsets().group_exists(group);
            known.then(rokka_broker::sub_groups::GroupConfig::default)
        });
        match config {
            Some(c) => self.json_body(req, c.to_json(group)),
            None => self.reply(req, rs::SYSTEM_ERROR, Some("No group in this broker".into())),
        }
    }

    /// UPDATE_AND_CREATE_SUBSCRIPTIONGROUP (mqadmin updateSubGroup,
    /// RocketMQ Connect's worker start): the group's config is kept (on
    /// disk before the answer; cluster mode: in etcd within a tick) and
    /// honoured — consumeEnable, consumeBroadcastEnable, retryMaxTimes
    /// (see `rokka_broker::sub_groups`). The broker's own groups are
    /// refused, and so is what Apache refuses (an attribute: none is
    /// defined), a wrong type, a config past 4 KiB, a new group past
    /// `broker.max_subscription_groups`.
    pub(super) fn update_subscription_group(&self, req: &RemotingCommand) -> RemotingCommand {
        match self.sub_group_config(&req.body) {
            Ok(one) => self.keep_sub_groups(req, vec![one]),
            Err(why) => self.reply(req, rs::SYSTEM_ERROR, Some(why)),
        }
    }

    /// UPDATE_AND_CREATE_SUBSCRIPTIONGROUP_LIST (mqadmin
    /// updateSubGroupList; a body `{"groupConfigList": [...]}`): each
    /// config as one UPDATE_AND_CREATE_SUBSCRIPTIONGROUP takes it, all
    /// kept in one write or none (Apache persists the list once).
    pub(super) fn update_subscription_group_list(&self, req: &RemotingCommand) -> RemotingCommand {
        #[derive(serde::Deserialize)]
        #[serde(rename_all = "camelCase")]
        struct List<'a> {
            #[serde(borrow, default)]
            group_config_list: Option<Bounded<'a>>,
        }
        let list: List<'_> = match serde_json::from_slice(&req.body) {
            Ok(l) => l,
            Err(e) => return self.reply(req, rs::SYSTEM_ERROR, Some(format!("subscription group list: {e}"))),
        };
        // No list: nothing to do (Apache answers so).
        let items = list.group_config_list.map_or_else(Vec::new, |b| b.0);
        if items.is_empty() {
            return self.reply(req, rs::SUCCESS, None);
        }
        let mut configs = Vec::with_capacity(items.len());
        for raw in items {
            match self.sub_group_config(raw.get().as_bytes()) {
                Ok(one) => configs.push(one),
                Err(why) => return self.reply(req, rs::SYSTEM_ERROR, Some(why)),
            }
        }
        self.keep_sub_groups(req, configs)
    }

    /// One config of an update: its group and config, or why refused.
    fn sub_group_config(&self, body: &[u8]) -> Result<(String, rokka_broker::sub_groups::GroupConfig), String> {
        let groups = self.broker.sub_groups();
        let (group, config) = rokka_broker::sub_groups::GroupConfig::from_request(body, |g| groups.contains(g))?;
        if group.is_empty() {
            return Err("groupName is empty".into());
        }
        if rokka_broker::is_system_group(&group) {
            return Err(format!("[{group}] is a system consumer group"));
        }
        Ok((group, config))
    }

    /// Keeps `configs` (written and fsynced off the async workers), logged.
    fn keep_sub_groups(
        &self,
        req: &RemotingCommand,
        configs: Vec<(String, rokka_broker::sub_groups::GroupConfig)>,
    ) -> RemotingCommand {
        // The log names a few (a list may hold thousands).
        let n = configs.len();
        let shown: Vec<String> = configs
            .iter()
            .take(3)
            .map(|(g, c)| {
                format!(
                    "{g} (consumeEnable={} consumeBroadcastEnable={} retryMaxTimes={})",
                    c.consume_enable, c.consume_broadcast_enable, c.retry_max_times
                )
            })
            .collect();
        match rokka_broker::offload(|| self.broker.sub_groups().upsert_all(configs)) {
            Ok(()) => {
                tracing::info!(groups = n, first = shown.join(", "), "subscription groups updated");
                self.reply(req, rs::SUCCESS, None)
            }
            Err(refused) => self.reply(req, rs::SYSTEM_ERROR, Some(refused.0)),
        }
    }
}

/// The configs of an UPDATE_AND_CREATE_SUBSCRIPTIONGROUP_LIST, each left
/// unparsed, at most [`MAX_LIST_CONFIGS`] of them: counted while the list
/// is read, so a long list of tiny values is refused before it is held.
struct Bounded<'a>(Vec<&'a serde_json::value::RawValue>);

/// Most configs one UPDATE_AND_CREATE_SUBSCRIPTIONGROUP_LIST carries (the
/// default budget of kept configs).
const MAX_LIST_CONFIGS: usize = 10_000;

/// Most bytes of the groups a GET_ALL_SUBSCRIPTIONGROUP_CONFIG answer
/// lists: under the 16 MiB frame RocketMQ's clients read (NettyDecoder's
/// frameMaxLength), which every committed group of a large offsets table
/// would pass (a client that cannot read the answer drops the connection).
const MAX_GROUP_LISTING_BYTES: usize = 15 << 20;

/// The length of `v` as JSON (escapes included).
fn json_len(v: &impl serde::Serialize) -> usize {
    serde_json::to_string(v).map_or(0, |s| s.len())
}

/// Groups a listing left out past [`MAX_GROUP_LISTING_BYTES`]: counted, and
/// logged (an operator's rare call).
fn left_out(listing: &'static str, n: u64) {
    if n > 0 {
        metrics::counter!("rokka_rocketmq_group_listing_left_out_total", "listing" => listing).increment(n);
        tracing::warn!(listing, left_out = n, "groups past a listing's 15 MiB left out");
    }
}

impl<'de: 'a, 'a> serde::Deserialize<'de> for Bounded<'a> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Visit<'a>(std::marker::PhantomData<&'a ()>);
        impl<'de: 'a, 'a> serde::de::Visitor<'de> for Visit<'a> {
            type Value = Bounded<'a>;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                write!(f, "a list of at most {MAX_LIST_CONFIGS} subscription group configs")
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<Bounded<'a>, A::Error> {
                let mut out = Vec::new();
                while let Some(v) = seq.next_element::<&'de serde_json::value::RawValue>()? {
                    if out.len() == MAX_LIST_CONFIGS {
                        return Err(serde::de::Error::custom(format!(
                            "more than {MAX_LIST_CONFIGS} subscription group configs in one list"
                        )));
                    }
                    out.push(v);
                }
                Ok(Bounded(out))
            }
        }
        d.deserialize_seq(Visit(std::marker::PhantomData))
    }
}

impl RocketMq {
    pub(super) fn all_topic_config(&self, req: &RemotingCommand) -> RemotingCommand {
        let mut table = serde_json::Map::new();
        for (name, t) in self.broker.topics().all() {
            let v = Self::topic_config_json(&name, &t);
            table.insert(name, v);
        }
        self.json_body(
            req,
            json!({"topicConfigTable": table, "dataVersion": {"counter": 0, "stateVersion": 0, "timestamp": 0}}),
        )
    }
}
